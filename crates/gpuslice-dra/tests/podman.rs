//! A prepared DRA claim consumed by a real container runtime: the claim
//! (30 GiB and 30 % of GPU 2, as kube-scheduler writes it) is prepared,
//! podman + runc runs a container from the returned CDI device ID on the
//! fake GPU host, and inside it the slice's limits record holds exactly
//! the consumed capacity, read-only, with only that GPU's node; two
//! containers of the claim share one slice directory (one ledger), bounded
//! in size; after Unprepare the device no longer resolves and the
//! directory is gone. Needs root, podman, runc and
//! busybox-static (scripts/test.sh installs them).

use crate::common::{claim_ref, driver_options, NODE};
use fakegpu::FakeHost;
use gpuslice_cdi::{limits_record_path, PRELOAD_FILE};
use gpuslice_core::HostRoot;
use gpuslice_dra::apiserver::KubeApi;
use gpuslice_dra::driver::{spec_path, Driver, Options};
use gpuslice_ledger::limits::{ComputeShare, MemorySize, SliceLimits};
use gpuslice_testkit::fakeapi::{shared_claim, FakeApiServer};
use gpuslice_testkit::podman::{nvidia_nodes, Image};
use std::path::Path;
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podman_runs_a_prepared_claim_with_exactly_its_caps() {
    let host = FakeHost::builder().gpus(4).build().unwrap();
    let _nvml = gpuslice_testkit::fakenvml::serve(host.root());
    let tmp = tempfile::tempdir().unwrap();
    let shim = tmp.path().join("libgpuslice.so");
    std::fs::write(&shim, b"not a real shim: busybox is static").unwrap();
    // podman reads specs from /etc/cdi and /var/run/cdi only.
    let cdi_dir = Path::new("/var/run/cdi");
    let uid = format!("e2e-{}", std::process::id());
    let mut image = Image::busybox(tmp.path(), "gpuslice-dra-test");
    image.files = vec![
        spec_path(cdi_dir, &uid),
        limits_record_path(cdi_dir, &format!("{uid}-0")),
        cdi_dir.join(PRELOAD_FILE),
    ];

    let api = FakeApiServer::start().await;
    api.put_claim(shared_claim("ns", "e2e", &uid, NODE, 2, "30Gi", "30"));
    let inventory = gpuslice_testkit::fakenvml::discover(&host);
    let driver = Driver::new(
        Options {
            cdi_dir: cdi_dir.into(),
            shim: Some(shim),
            ..driver_options(HostRoot::new(host.root()), inventory, tmp.path())
        },
        Arc::new(KubeApi::new(&api.url, None).unwrap()),
    )
    .unwrap();
    let claim = claim_ref("e2e", &uid);
    let granted = driver.prepare(std::slice::from_ref(&claim)).await;
    let granted = granted[&uid].as_ref().unwrap();
    let id = &granted[0].cdi_device_id;
    assert_eq!(id, &format!("gpuslice.dev/claim={uid}-0"));

    // Its GPU's board writable, nothing else of the host's boards
    // directory (no entry made there: the squatting attack).
    let board = gpuslice_ledger::board::board_path(
        Path::new("/run/gpuslice/gpus"),
        &fakegpu::kernel::gpu_uuid(2),
    );
    let out = image.run(
        id,
        &format!(
            "ls /dev; echo ---; cat /run/gpuslice/slice/limits; echo ---; \
             (echo x >> /run/gpuslice/slice/limits) 2>/dev/null || echo limits-read-only; \
             cat /etc/ld.so.preload; test -f /usr/local/gpuslice/libgpuslice.so && echo shim-present; \
             (echo 10000 > /run/gpuslice/gpus/shares/forged) 2>/dev/null || echo shares-read-only; \
             (exec 3<>{b}) && echo own-board-writable; \
             (: > /run/gpuslice/gpus/planted-$$) 2>/dev/null && echo boards-dir-writable; env",
            b = board.display()
        ),
    );
    assert!(out.status.success(), "{out:?}");
    let t = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut parts = t.splitn(3, "---\n");
    let (dev, record, rest) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    assert_eq!(
        nvidia_nodes(dev),
        [
            "nvidia-modeset",
            "nvidia-uvm",
            "nvidia-uvm-tools",
            "nvidia2",
            "nvidiactl"
        ],
        "GPU 2's node and no other GPU's"
    );
    let limits = SliceLimits::parse(record, Path::new("/run/gpuslice/slice/limits")).unwrap();
    assert_eq!(limits.devices.len(), 1);
    assert_eq!(limits.devices[0].uuid, fakegpu::kernel::gpu_uuid(2));
    assert_eq!(limits.devices[0].memory, Some(MemorySize(30 << 30)));
    assert_eq!(
        limits.devices[0].compute,
        ComputeShare::from_basis_points(3000)
    );
    assert!(rest.contains("limits-read-only"), "{rest}");
    assert!(
        rest.contains("/usr/local/gpuslice/libgpuslice.so\n"),
        "{rest}"
    );
    assert!(rest.contains("shim-present"), "{rest}");
    // The GPUs' boards are there to take turns on; root's share records
    // in them cannot be forged from the container (root in it or not).
    assert!(rest.contains("own-board-writable"), "{rest}");
    assert!(!rest.contains("boards-dir-writable"), "{rest}");
    assert!(rest.contains("shares-read-only"), "{rest}");
    let host_shares = gpuslice_ledger::board::shares_dir(&host.root().join("run/gpuslice/gpus"));
    assert!(!host_shares.join("forged").exists());

    // Two containers of the claim (two of a pod, or two pods sharing it)
    // find one slice directory, so one usage ledger and the cap in sum: a
    // file the first leaves is the second's to read. Bounded: 2 MiB do not
    // fit.
    let first = image.run(
        id,
        "echo from-the-first > /run/gpuslice/slice/usage-probe && echo wrote;          (dd if=/dev/zero of=/run/gpuslice/slice/fill bs=1M count=2 2>/dev/null && echo unbounded)          || echo bounded; rm -f /run/gpuslice/slice/fill",
    );
    let t1 = String::from_utf8_lossy(&first.stdout).into_owned();
    assert!(t1.contains("wrote") && t1.contains("bounded"), "{first:?}");
    assert!(!t1.contains("unbounded"), "{t1}");
    let second = image.run(id, "cat /run/gpuslice/slice/usage-probe");
    assert_eq!(
        String::from_utf8_lossy(&second.stdout),
        "from-the-first\n",
        "{second:?}"
    );

    let done = driver.unprepare(&[claim]).await;
    assert!(done[&uid].is_ok(), "{:?}", done[&uid]);
    assert!(!spec_path(cdi_dir, &uid).exists());
    assert!(!limits_record_path(cdi_dir, &format!("{uid}-0")).exists());
    assert!(
        !host
            .root()
            .join(gpuslice_dra::claimfs::CLAIMS_DIR)
            .join(format!("{uid}-0"))
            .exists(),
        "the claim's slice directory outlived it"
    );
    let gone = image.run(id, "true");
    assert!(!gone.status.success());
    let err = String::from_utf8_lossy(&gone.stderr);
    assert!(err.contains("unresolvable CDI devices"), "{err}");
}
