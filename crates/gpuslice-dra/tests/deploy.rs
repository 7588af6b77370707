//! deploy/dra/: every manifest is a Kubernetes object of its type
//! (k8s-openapi 1.36, nothing it would drop), the DeviceClasses select the
//! device types the driver publishes, RBAC allows what the driver calls,
//! and the DaemonSet gives the plugin the kubelet's directories.

use gpuslice_dra::publish::{devices, SharedPolicy};
use gpuslice_testkit::manifests::{typed, yaml_docs};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::DeviceClass;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/dra");
    let mut f: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    f.sort();
    f
}

#[derive(Default)]
struct Objects {
    classes: Vec<DeviceClass>,
    roles: Vec<ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    accounts: Vec<ServiceAccount>,
    daemonsets: Vec<DaemonSet>,
}

fn objects() -> Objects {
    let mut o = Objects::default();
    for file in files() {
        for (i, doc) in yaml_docs(&file).iter().enumerate() {
            let what = format!("{} #{i}", file.display());
            match doc["kind"].as_str().unwrap_or_default() {
                "DeviceClass" => o.classes.push(typed(doc, &what)),
                "Namespace" => {
                    typed::<Namespace>(doc, &what);
                }
                "ServiceAccount" => o.accounts.push(typed(doc, &what)),
                "ClusterRole" => o.roles.push(typed(doc, &what)),
                "ClusterRoleBinding" => o.bindings.push(typed(doc, &what)),
                "DaemonSet" => o.daemonsets.push(typed(doc, &what)),
                other => panic!("{what}: kind {other:?} not checked by this test"),
            }
        }
    }
    o
}

#[test]
fn device_classes_select_the_published_types() {
    let o = objects();
    let names: Vec<&str> = o
        .classes
        .iter()
        .map(|c| c.metadata.name.as_deref().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "gpu.gpuslice.io",
            "gpu-shared.gpuslice.io",
            "mig.gpuslice.io"
        ]
    );
    // What the driver publishes on a host with whole, shared and MIG devices.
    let host = fakegpu::FakeHost::builder()
        .gpus(2)
        .mig(1, 1)
        .build()
        .unwrap();
    std::env::set_var("FAKEGPU_ROOT", host.root());
    let inv = gpuslice_core::discover::discover(
        &gpuslice_core::HostRoot::new(host.root()),
        &gpuslice_core::discover::DiscoverOptions {
            nvml_lib: Some(host.nvml_lib()),
            ..Default::default()
        },
    )
    .unwrap();
    let published: BTreeSet<String> = devices(&inv, &SharedPolicy::default())
        .iter()
        .map(|d| {
            d.attributes.as_ref().unwrap()["type"]
                .string
                .clone()
                .unwrap()
        })
        .collect();
    assert_eq!(
        published,
        BTreeSet::from(["gpu", "shared", "mig"].map(String::from))
    );
    for (c, ty) in o.classes.iter().zip(["gpu", "shared", "mig"]) {
        let sel = c.spec.selectors.as_ref().unwrap();
        assert_eq!(sel.len(), 1);
        let cel = &sel[0].cel.as_ref().unwrap().expression;
        assert!(
            cel.contains(&format!(
                "device.driver == \"{}\"",
                gpuslice_dra::DRIVER_NAME
            )),
            "{cel}"
        );
        assert!(
            cel.contains(&format!(
                "device.attributes[\"{}\"].type == \"{ty}\"",
                gpuslice_dra::DRIVER_NAME
            )),
            "{cel}"
        );
    }
}

#[test]
fn rbac_allows_what_the_driver_calls_and_binds_the_daemonsets_account() {
    let o = objects();
    assert_eq!(o.roles.len(), 1);
    let rules = o.roles[0].rules.as_ref().unwrap();
    let allows = |group: &str, resource: &str, verb: &str| {
        rules.iter().any(|r| {
            r.api_groups.iter().flatten().any(|g| g == group)
                && r.resources.iter().flatten().any(|x| x == resource)
                && r.verbs.iter().any(|v| v == verb)
        })
    };
    for verb in ["list", "watch", "create", "update", "delete"] {
        assert!(allows("resource.k8s.io", "resourceslices", verb), "{verb}");
    }
    assert!(allows("resource.k8s.io", "resourceclaims", "get"));
    assert!(!allows("resource.k8s.io", "resourceclaims", "update"));
    assert!(allows("", "nodes", "get"));

    let ds = &o.daemonsets[0];
    let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let sa = pod.service_account_name.as_deref().unwrap();
    let ns = ds.metadata.namespace.as_deref().unwrap();
    assert!(o
        .accounts
        .iter()
        .any(|a| a.metadata.name.as_deref() == Some(sa)
            && a.metadata.namespace.as_deref() == Some(ns)));
    let b = &o.bindings[0];
    assert_eq!(b.role_ref.name, o.roles[0].metadata.name.clone().unwrap());
    assert!(b
        .subjects
        .iter()
        .flatten()
        .any(|s| s.kind == "ServiceAccount" && s.name == sa && s.namespace.as_deref() == Some(ns)));
}

#[test]
fn the_daemonset_gives_the_plugin_the_kubelets_directories() {
    let o = objects();
    assert_eq!(o.daemonsets.len(), 1);
    let pod = o.daemonsets[0]
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .clone()
        .unwrap();
    let host_paths: BTreeSet<String> = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.host_path.as_ref().map(|h| h.path.clone()))
        .collect();
    for want in [
        "/var/lib/kubelet/plugins",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        "/var/lib/gpuslice/dra",
    ] {
        assert!(host_paths.contains(want), "no hostPath {want}");
    }
    let volumes: BTreeSet<&str> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect();
    for c in pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
    {
        for m in c.volume_mounts.iter().flatten() {
            assert!(
                volumes.contains(m.name.as_str()),
                "{}: no volume {}",
                c.name,
                m.name
            );
        }
    }
    let plugin = pod.containers.iter().find(|c| c.name == "plugin").unwrap();
    let cmd = plugin.command.clone().unwrap();
    assert!(cmd.contains(&"dra".to_string()), "{cmd:?}");
    // The plugin talks to the API server as its own service account: no
    // proxy on the node (any process there could use its rights), no
    // --api-server pointing at one.
    assert!(
        !cmd.iter().any(|a| a.starts_with("--api-server")),
        "{cmd:?}"
    );
    assert_eq!(
        pod.containers
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["plugin"],
        "no sidecars"
    );
    assert_eq!(pod.automount_service_account_token, Some(true));
    assert_eq!(pod.service_account_name.as_deref(), Some("gpuslice-dra"));
    let node = plugin
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .expect("NODE_NAME");
    assert_eq!(
        node.value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "spec.nodeName"
    );
    // The kubelet's directories at the paths it uses.
    let mounts: BTreeSet<&str> = plugin
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    for want in [
        "/var/lib/kubelet/plugins",
        "/var/lib/kubelet/plugins_registry",
    ] {
        assert!(mounts.contains(want), "{want}");
    }
}

/// `kubernetes-validate` (PyPI; it ships the upstream OpenAPI schemas):
/// `$KUBERNETES_VALIDATE`, else on PATH.
fn kubernetes_validate() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KUBERNETES_VALIDATE") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("kubernetes-validate"))
            .find(|p| p.is_file())
    })
}

/// Validates `files` against the Kubernetes 1.36 schemas, strictly
/// (unknown fields are errors); the tool's output on failure.
fn validate(tool: &Path, files: &[PathBuf]) -> Result<(), String> {
    let out = std::process::Command::new(tool)
        .args(["-k", "1.36.0", "--strict", "--quiet"])
        .args(files)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", tool.display()));
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[test]
fn upstream_1_36_schemas_accept_the_manifests_and_the_published_slices() {
    let tool = kubernetes_validate();
    let unmet = tool
        .is_none()
        .then(|| "kubernetes-validate not found (pip install kubernetes-validate, or set $KUBERNETES_VALIDATE)".to_string());
    if !gpuslice_testkit::precondition(
        "upstream_1_36_schemas_accept_the_manifests_and_the_published_slices",
        unmet,
    ) {
        return;
    }
    let tool = tool.unwrap();
    validate(&tool, &files()).unwrap_or_else(|e| panic!("deploy/dra: {e}"));

    // What the publisher writes, on a host with whole, shared and MIG devices.
    let host = fakegpu::FakeHost::builder()
        .gpus(3)
        .mig(2, 2)
        .build()
        .unwrap();
    std::env::set_var("FAKEGPU_ROOT", host.root());
    let inv = gpuslice_core::discover::discover(
        &gpuslice_core::HostRoot::new(host.root()),
        &gpuslice_core::discover::DiscoverOptions {
            nvml_lib: Some(host.nvml_lib()),
            ..Default::default()
        },
    )
    .unwrap();
    let d = devices(&inv, &SharedPolicy::default());
    // And with GPUs 0 (whole and shared) and 2 (MIG) tainted unhealthy.
    let sick = std::collections::BTreeMap::from([0, 2].map(|g| {
        (
            g,
            gpuslice_dra::publish::Sick {
                why: "XID 79".into(),
                since: k8s_openapi::jiff::Timestamp::from_second(1_780_000_000).unwrap(),
            },
        )
    }));
    let tainted = gpuslice_dra::publish::pool_devices(
        &inv,
        &SharedPolicy::default(),
        &sick,
        gpuslice_dra::publish::Unhealthy::Taint,
    );
    let dir = tempfile::tempdir().unwrap();
    let mut written = Vec::new();
    let all = [&d, &tainted]
        .into_iter()
        .flat_map(|d| gpuslice_dra::publish::slices(gpuslice_dra::DRIVER_NAME, "node-a", 1, d));
    for (i, s) in all.enumerate() {
        let f = dir.path().join(format!("slice-{i}.json"));
        std::fs::write(&f, serde_json::to_vec_pretty(&s).unwrap()).unwrap();
        written.push(f);
    }
    validate(&tool, &written).unwrap_or_else(|e| panic!("published ResourceSlice: {e}"));

    // The check can fail: a field 1.36 does not have is refused.
    let mut bad: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&written[0]).unwrap()).unwrap();
    bad["spec"]["devices"][0]["sharable"] = true.into();
    let f = dir.path().join("bad.json");
    std::fs::write(&f, bad.to_string()).unwrap();
    let e = validate(&tool, &[f]).unwrap_err();
    assert!(e.contains("sharable"), "{e}");
}
