use super::*;
use crate::check::check_against;
use fakegpu::FakeHost;
use gpuslice_core::discover::{discover, DiscoverOptions};
use gpuslice_core::{HostRoot, Inventory};
use serde_json::{json, Value};
use std::fs;

const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";

/// Driver files as the NVIDIA installer lays them: versioned files and
/// soname links.
fn add_driver_files(host: &FakeHost) {
    let ver = fakegpu::kernel::DRIVER_VERSION;
    let dir = host.root().join(LIB_DIR);
    fs::create_dir_all(&dir).unwrap();
    for (stem, soname) in [
        ("libcuda", "libcuda.so.1"),
        ("libnvidia-ml", "libnvidia-ml.so.1"),
        ("libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1"),
        ("libnvcuvid", "libnvcuvid.so.1"),
    ] {
        let file = format!("{stem}.so.{ver}");
        fs::write(dir.join(&file), b"\x7fELF").unwrap();
        std::os::unix::fs::symlink(&file, dir.join(soname)).unwrap();
    }
    let bin = host.root().join("usr/bin");
    fs::create_dir_all(&bin).unwrap();
    fs::write(bin.join("nvidia-smi"), b"#!/bin/sh\n").unwrap();
}

fn inventory(host: &FakeHost) -> Inventory {
    let mut inv = discover(
        &HostRoot::new(host.root()),
        &DiscoverOptions {
            use_nvml: false,
            ..DiscoverOptions::default()
        },
    )
    .unwrap();
    // What NVML adds: memory sizes and MIG UUIDs.
    for g in &mut inv.gpus {
        g.memory_bytes = Some(fakegpu::kernel::GPU_MEMORY_BYTES);
        for m in &mut g.migs {
            m.uuid = Some(fakegpu::kernel::mig_uuid(g.index, m.gpu_instance));
        }
    }
    inv
}

fn options(_host: &FakeHost, spec_dir: &Path) -> Options {
    let shim = spec_dir.join("libgpuslice.so");
    fs::write(&shim, b"shim").unwrap();
    Options {
        shim: Some(shim),
        hook: Some(std::env::current_exe().unwrap()),
        spec_dir: spec_dir.to_path_buf(),
        use_nvml: false,
        ..Options::default()
    }
}

fn device<'a>(spec: &'a Value, name: &str) -> &'a Value {
    spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("no device {name}"))
}

fn node_paths(edits: &Value) -> Vec<String> {
    edits["deviceNodes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|n| n["path"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn env(edits: &Value) -> Vec<String> {
    edits["env"]
        .as_array()
        .map(|a| a.iter().map(|n| n.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn spec_validates_and_names_every_device() {
    let host = FakeHost::builder().gpus(4).mig(3, 2).build().unwrap();
    add_driver_files(&host);
    let dir = tempfile::tempdir().unwrap();
    let root = HostRoot::new(host.root());
    let g = generate_for(&root, &inventory(&host), &options(&host, dir.path())).unwrap();
    validate(&g.spec).unwrap();
    let v = serde_json::to_value(&g.spec).unwrap();
    assert_eq!(v["kind"], "gpuslice.dev/gpu");
    // podman 4.x reads CDI specs up to 0.5: the version is the oldest that fits.
    assert_eq!(v["cdiVersion"], "0.5.0", "{v:#}");
    let inv = inventory(&host);
    let mut want: Vec<String> = vec!["all".into(), "3:0".into(), "3:1".into()];
    for gpu in &inv.gpus {
        want.push(gpu.index.to_string());
        want.push(gpu.uuid.clone());
        want.push(format!("{}-shared-2", gpu.index));
        want.push(format!("{}-shared-4", gpu.index));
        want.extend(gpu.migs.iter().filter_map(|m| m.uuid.clone()));
    }
    let mut names: Vec<String> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    want.sort();
    assert_eq!(names, want);

    let one = &device(&v, "1")["containerEdits"];
    assert_eq!(node_paths(one), ["/dev/nvidia1"]);
    assert_eq!(
        one["deviceNodes"][0]["hostPath"],
        host.root().join("dev/nvidia1").display().to_string()
    );
    assert_eq!(one["deviceNodes"][0]["major"], 195);
    assert_eq!(device(&v, &inv.gpus[1].uuid)["containerEdits"], *one);
    let all = node_paths(&device(&v, "all")["containerEdits"]);
    for i in 0..4 {
        assert!(all.contains(&format!("/dev/nvidia{i}")), "{all:?}");
    }
    // A MIG device: its parent's node and its own two access caps.
    let mig = node_paths(&device(&v, "3:1")["containerEdits"]);
    assert_eq!(mig.len(), 3, "{mig:?}");
    assert_eq!(mig[0], "/dev/nvidia3");
    assert!(mig[1].starts_with("/dev/nvidia-caps/nvidia-cap"));
    let mig_uuid = inv.gpus[3].migs[1].uuid.clone().unwrap();
    assert_eq!(
        device(&v, &mig_uuid)["containerEdits"],
        device(&v, "3:1")["containerEdits"]
    );

    let common = &v["containerEdits"];
    assert_eq!(
        node_paths(common),
        [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-modeset"
        ]
    );
    let e = env(common);
    assert!(
        e.contains(&"NVIDIA_DRIVER_CAPABILITIES=compute,utility".to_string()),
        "{e:?}"
    );
    assert!(e.contains(&format!("LD_LIBRARY_PATH={CONTAINER_LIB_DIR}")));
    let mounts: Vec<(String, String)> = common["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["hostPath"].as_str().unwrap().to_string(),
                m["containerPath"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let ver = fakegpu::kernel::DRIVER_VERSION;
    let libcuda = host
        .root()
        .join(LIB_DIR)
        .join(format!("libcuda.so.{ver}"))
        .display()
        .to_string();
    for name in [
        format!("libcuda.so.{ver}"),
        "libcuda.so.1".into(),
        "libcuda.so".into(),
    ] {
        assert!(
            mounts.contains(&(libcuda.clone(), format!("{CONTAINER_LIB_DIR}/{name}"))),
            "{mounts:?}"
        );
    }
    assert!(mounts
        .iter()
        .any(|(_, c)| c.ends_with("/libnvidia-ml.so.1")));
    assert!(mounts.iter().any(|(_, c)| c == "/usr/bin/nvidia-smi"));
    assert!(
        mounts.iter().all(|(_, c)| !c.contains("libnvcuvid")),
        "video is not asked for"
    );
    for m in common["mounts"].as_array().unwrap() {
        assert!(m["options"].as_array().unwrap().contains(&json!("ro")));
    }
    // The params overlay: a side file with ModifyDeviceFiles: 0, laid by the hook.
    let params = dir.path().join(PARAMS_FILE);
    let (_, content) = g.side_files.iter().find(|(p, _)| *p == params).unwrap();
    assert!(content.contains("ModifyDeviceFiles: 0"), "{content}");
    let hook = &common["hooks"][0];
    assert_eq!(hook["hookName"], "createContainer");
    assert_eq!(
        hook["args"].as_array().unwrap().last().unwrap(),
        &json!(params.display().to_string())
    );
    // Every host path exists (or is a side file written with the spec).
    for p in host_paths(&g.spec) {
        let p = PathBuf::from(p);
        assert!(
            p.exists() || g.side_files.iter().any(|(f, _)| *f == p),
            "{}",
            p.display()
        );
    }
}

/// With the board directory given, a capped slice binds it read-write
/// (its slices take turns on the GPU) and root's share records in it
/// read-only over it; nothing else of the host is writable.
#[test]
fn capped_slices_bind_the_boards_with_root_s_shares_read_only() {
    let host = FakeHost::builder().gpus(1).build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let boards = dir.path().join("run/gpuslice/gpus");
    gpuslice_ledger::board::prepare_dir(&boards).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(fs::metadata(&boards).unwrap().mode() & 0o7777, 0o1777);
    let shares = gpuslice_ledger::board::shares_dir(&boards);
    let m = fs::metadata(&shares).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o755));
    let opts = Options {
        boards: Some(boards.clone()),
        ..options(&host, dir.path())
    };
    let g = generate_for(&HostRoot::new(host.root()), &inventory(&host), &opts).unwrap();
    let v = serde_json::to_value(&g.spec).unwrap();
    let mounts = device(&v, "0-shared-2")["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .clone();
    let at = |t: &str| {
        mounts
            .iter()
            .position(|m| m["containerPath"] == t)
            .unwrap_or_else(|| panic!("no mount at {t}: {mounts:?}"))
    };
    // The directory read-only, the GPU's own board (made by root here)
    // writable over it: the container can add or remove nothing there.
    let uuid = &host.gpus()[0].uuid;
    let board = gpuslice_ledger::board::board_path(&boards, uuid);
    let inside = gpuslice_ledger::board::board_path(Path::new("/run/gpuslice/gpus"), uuid);
    let (b, f, sh) = (
        at("/run/gpuslice/gpus"),
        at(&inside.display().to_string()),
        at("/run/gpuslice/gpus/shares"),
    );
    assert_eq!(mounts[b]["hostPath"], boards.display().to_string());
    assert_eq!(mounts[f]["hostPath"], board.display().to_string());
    assert_eq!(mounts[sh]["hostPath"], shares.display().to_string());
    assert!(
        b < f && b < sh,
        "the board and shares are bound over the directory, after it"
    );
    let ro = |m: &Value| m["options"].as_array().unwrap().contains(&"ro".into());
    assert!(ro(&mounts[sh]) && ro(&mounts[b]) && !ro(&mounts[f]));
    let m = fs::symlink_metadata(&board).unwrap();
    assert_eq!(
        (m.uid(), m.len()),
        (0, gpuslice_ledger::board::BOARD_SIZE as u64)
    );
    for (i, m) in mounts.iter().enumerate() {
        assert!(
            m["type"] == "tmpfs" || ro(m) || i == f,
            "writable host mount {m}"
        );
    }
    // A whole GPU has no shim, so no board either.
    let whole = device(&v, "0")["containerEdits"].to_string();
    assert!(!whole.contains("/run/gpuslice/gpus"), "{whole}");
    // A shares directory someone else made first (the board directory is
    // world-writable) is replaced by root's, never used (it made
    // every `run --compute` fail).
    let foreign = dir.path().join("other");
    let planted = gpuslice_ledger::board::shares_dir(&foreign);
    fs::create_dir_all(planted.join("GPU-x")).unwrap();
    std::os::unix::fs::chown(&planted, Some(65534), None).unwrap();
    gpuslice_ledger::board::prepare_dir(&foreign).unwrap();
    let m = fs::symlink_metadata(&planted).unwrap();
    assert_eq!((m.is_dir(), m.uid(), m.mode() & 0o777), (true, 0, 0o755));
    assert!(!planted.join("GPU-x").exists());
}

#[test]
fn shared_variant_mounts_the_shim_and_sets_the_caps() {
    let host = FakeHost::builder().gpus(2).build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = options(&host, dir.path());
    let g = generate_for(&HostRoot::new(host.root()), &inventory(&host), &opts).unwrap();
    let v = serde_json::to_value(&g.spec).unwrap();
    let e = &device(&v, "1-shared-4")["containerEdits"];
    assert_eq!(node_paths(e), ["/dev/nvidia1"]);
    let env = env(e);
    let quarter = fakegpu::kernel::GPU_MEMORY_BYTES / 4;
    // What the environment says is for show: the shim reads the record.
    assert!(
        env.contains(&format!("GPUSLICE_MEMORY_LIMIT_0={quarter}")),
        "{env:?}"
    );
    assert!(
        env.contains(&"GPUSLICE_COMPUTE_LIMIT=25".to_string()),
        "{env:?}"
    );
    // The slice's processes are told of its GPU as `run`'s and a device
    // plugin replica's are: one environment for every capped slice.
    let uuid = &inventory(&host).gpus[1].uuid;
    for kv in [
        format!("CUDA_VISIBLE_DEVICES={uuid}"),
        format!("NVIDIA_VISIBLE_DEVICES={uuid}"),
        "CUDA_DEVICE_ORDER=PCI_BUS_ID".to_string(),
        "GPUSLICE_SLICE=1-shared-4".to_string(),
    ] {
        assert!(env.contains(&kv), "{kv} not in {env:?}");
    }
    let mounts = e["mounts"].as_array().unwrap();
    let by_target = |t: &str| mounts.iter().find(|m| m["containerPath"] == t).unwrap();
    assert_eq!(
        by_target(CONTAINER_SHIM)["hostPath"],
        opts.shim.unwrap().display().to_string()
    );
    let preload = by_target("/etc/ld.so.preload")["hostPath"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, content) = g
        .side_files
        .iter()
        .find(|(p, _)| p.display().to_string() == preload)
        .unwrap();
    assert_eq!(content.trim(), CONTAINER_SHIM);
    // The container's own tmpfs at the fixed place, and root's record of
    // the limits bound read-only into it.
    let slice_dir = by_target(gpuslice_ledger::limits::SLICE_DIR);
    assert_eq!(slice_dir["type"], "tmpfs");
    let record = by_target("/run/gpuslice/slice/limits");
    assert!(record["options"].as_array().unwrap().contains(&"ro".into()));
    let (_, text) = g
        .side_files
        .iter()
        .find(|(p, _)| p.display().to_string() == record["hostPath"].as_str().unwrap())
        .unwrap();
    let limits =
        gpuslice_ledger::limits::SliceLimits::parse(text, std::path::Path::new("x")).unwrap();
    assert_eq!(limits.devices[0].memory.unwrap().0, quarter);
    assert_eq!(limits.devices[0].share_bp(), 2500);
    // Nothing of the host is writable but the container's own tmpfs.
    for m in mounts {
        let opts = m["options"].as_array().unwrap();
        assert!(
            m["type"] == "tmpfs" || opts.contains(&"ro".into()),
            "writable host mount {m}"
        );
    }
    let half = &device(&v, "0-shared-2")["containerEdits"];
    assert!(env_has(half, "GPUSLICE_COMPUTE_LIMIT=50"));

    // Without the shim (or without memory sizes) there is no shared variant, and a warning says why.
    let g = generate_for(
        &HostRoot::new(host.root()),
        &inventory(&host),
        &Options {
            shim: None,
            ..options(&host, dir.path())
        },
    )
    .unwrap();
    let v = serde_json::to_value(&g.spec).unwrap();
    assert!(!v.to_string().contains("-shared-"));
    assert!(
        g.warnings.iter().any(|w| w.contains("libgpuslice.so")),
        "{:?}",
        g.warnings
    );
}

fn env_has(edits: &Value, kv: &str) -> bool {
    env(edits).iter().any(|e| e == kv)
}

#[test]
fn yaml_and_json_round_trip_and_write_atomically() {
    let host = FakeHost::builder().gpus(2).build().unwrap();
    add_driver_files(&host);
    let dir = tempfile::tempdir().unwrap();
    let g = generate_for(
        &HostRoot::new(host.root()),
        &inventory(&host),
        &options(&host, dir.path()),
    )
    .unwrap();
    for (format, name) in [
        (Format::Yaml, "gpuslice.yaml"),
        (Format::Json, "gpuslice.json"),
    ] {
        let out = dir.path().join(name);
        fs::write(&out, "old content").unwrap();
        write_atomically(&g, &out, format).unwrap();
        let text = fs::read_to_string(&out).unwrap();
        if format == Format::Json {
            serde_json::from_str::<Value>(&text).unwrap();
        } else {
            assert!(text.starts_with("cdiVersion:"), "{text}");
        }
        let back = parse(&text).unwrap();
        assert_eq!(back, g.spec);
        validate(&back).unwrap();
        assert_eq!(Format::for_path(&out), format);
    }
    // Nothing half-written is left behind: no temporary files.
    let left: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(dir.path().join(PARAMS_FILE).is_file());
    assert!(dir.path().join(PRELOAD_FILE).is_file());
    // A file that cannot be renamed into place leaves the old one alone.
    let blocked = dir.path().join("sub");
    fs::create_dir(&blocked).unwrap();
    fs::write(blocked.join("x"), "").unwrap();
    assert!(gpuslice_core::atomic_file::write_atomic(&blocked, b"new", 0o644).is_err());
    assert!(blocked.join("x").exists());
}

#[test]
fn check_detects_a_stale_spec() {
    let host = FakeHost::builder().gpus(2).build().unwrap();
    add_driver_files(&host);
    let dir = tempfile::tempdir().unwrap();
    let root = HostRoot::new(host.root());
    let opts = options(&host, dir.path());
    let g = generate_for(&root, &inventory(&host), &opts).unwrap();
    let out = dir.path().join("gpuslice.yaml");
    write_atomically(&g, &out, Format::Yaml).unwrap();
    let spec = parse(&fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(
        check_against(&root, &inventory(&host), &spec, &opts).unwrap(),
        CheckResult::Current
    );
    // The public entry point (no NVML here: the spec above has memory sizes NVML gave).
    let plain = Options {
        shared: vec![],
        ..opts.clone()
    };
    let g2 = generate_for(&root, &inventory(&host), &plain).unwrap();
    let out2 = dir.path().join("plain.yaml");
    write_atomically(&g2, &out2, Format::Yaml).unwrap();
    assert_eq!(check(&root, &out2, &plain).unwrap(), CheckResult::Current);

    // A library that went away.
    let smi = host.root().join("usr/bin/nvidia-smi");
    fs::remove_file(&smi).unwrap();
    match check_against(&root, &inventory(&host), &spec, &opts).unwrap() {
        CheckResult::Stale(why) => assert!(
            why.starts_with("stale: ") && why.contains("mounts"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    fs::write(&smi, "").unwrap();

    // The params side file edited by hand.
    fs::write(dir.path().join(PARAMS_FILE), "ModifyDeviceFiles: 1\n").unwrap();
    match check_against(&root, &inventory(&host), &spec, &opts).unwrap() {
        CheckResult::Stale(why) => assert!(why.contains(PARAMS_FILE), "{why}"),
        other => panic!("{other:?}"),
    }

    // A driver upgrade.
    let version = host.root().join("proc/driver/nvidia/version");
    let text = fs::read_to_string(&version).unwrap();
    fs::write(
        &version,
        text.replace(fakegpu::kernel::DRIVER_VERSION, "590.10.01"),
    )
    .unwrap();
    let why = match check_against(&root, &inventory(&host), &spec, &opts).unwrap() {
        CheckResult::Stale(why) => why,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        why,
        format!(
            "stale: driver {} in spec, 590.10.01 loaded; run gpuslice cdi generate",
            fakegpu::kernel::DRIVER_VERSION
        )
    );
    assert!(!why.contains('\n'));
}

#[test]
fn a_gpu_that_went_away_makes_the_spec_stale() {
    let host = FakeHost::builder().gpus(2).build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = HostRoot::new(host.root());
    let opts = options(&host, dir.path());
    let g = generate_for(&root, &inventory(&host), &opts).unwrap();
    let mut inv = inventory(&host);
    inv.gpus.truncate(1);
    match check_against(&root, &inv, &g.spec, &opts).unwrap() {
        CheckResult::Stale(why) => assert!(why.contains("gone from host: [1 "), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn capabilities_and_shared_counts_parse() {
    assert_eq!(
        Capability::parse_list("utility,compute").unwrap(),
        [Capability::Compute, Capability::Utility]
    );
    assert_eq!(Capability::parse_list("all").unwrap().len(), 4);
    assert!(Capability::parse_list("compute,display").is_err());
    assert_eq!(parse_shared("4,2,4").unwrap(), [2, 4]);
    assert!(parse_shared("1").is_err());
    assert!(parse_shared("").unwrap().is_empty());
}

#[test]
fn strip_host_root_writes_host_paths() {
    let host = FakeHost::builder().gpus(1).build().unwrap();
    add_driver_files(&host);
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        strip_host_root: true,
        ..options(&host, dir.path())
    };
    let g = generate_for(&HostRoot::new(host.root()), &inventory(&host), &opts).unwrap();
    let paths = host_paths(&g.spec);
    assert!(paths.contains(&"/dev/nvidia0".to_string()), "{paths:?}");
    let ver = fakegpu::kernel::DRIVER_VERSION;
    assert!(
        paths.contains(&format!("/usr/lib/x86_64-linux-gnu/libcuda.so.{ver}")),
        "{paths:?}"
    );
}

#[test]
fn the_built_in_schema_is_enforced_without_remote_resolving() {
    // vendor/container-device-interface builds jsonschema without its
    // HTTP/file resolvers: the built-in schema must still compile and
    // reject what it forbids (here: deviceNodes entries without a path).
    use container_device_interface::schema::validate_builtin;
    let good = "cdiVersion: 0.5.0\nkind: gpuslice.dev/gpu\ndevices:\n- name: '0'\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n";
    validate_builtin(good.as_bytes()).expect("a valid spec");
    let bad = good.replace("- path: /dev/nvidia0", "- major: 195");
    let err = validate_builtin(bad.as_bytes()).unwrap_err();
    assert!(format!("{err:#}").contains("path"), "{err:#}");
}

/// The hook's overlay: the file bound over the target, read-only (a write
/// through it is refused), the target's own file untouched.
#[test]
fn bind_ro_lays_a_read_only_copy_over_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    fs::write(&src, "ModifyDeviceFiles: 0\n").unwrap();
    fs::write(&dst, "ModifyDeviceFiles: 1\n").unwrap();
    crate::params::bind_ro(&src, &dst).unwrap();
    let seen = fs::read_to_string(&dst);
    let write = fs::OpenOptions::new().write(true).open(&dst).map(|_| ());
    rustix::mount::unmount(&dst, rustix::mount::UnmountFlags::DETACH).unwrap();
    assert_eq!(seen.unwrap(), "ModifyDeviceFiles: 0\n");
    assert_eq!(write.unwrap_err().raw_os_error(), Some(libc::EROFS));
    assert_eq!(fs::read_to_string(&dst).unwrap(), "ModifyDeviceFiles: 1\n");
}
