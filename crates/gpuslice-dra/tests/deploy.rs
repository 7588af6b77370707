//! deploy/dra/: every manifest is a Kubernetes object of its type
//! (k8s-openapi 1.36, nothing it would drop), the DeviceClasses select the
//! device types the driver publishes, RBAC allows what the driver calls,
//! and the DaemonSet gives the plugin the kubelet's directories.

use gpuslice_dra::publish::{devices, SharedPolicy};
use gpuslice_testkit::manifests::{
    chart_values, checked_host_paths, helm_and_validator, kubernetes_validate, typed, validate,
    validate_objects, yaml_docs, KUBERNETES_VALIDATE_MISSING,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, PodSpec, PodTemplateSpec, ServiceAccount};
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

impl Objects {
    /// The pod template of the plugin's one DaemonSet.
    fn plugin_template(&self) -> &PodTemplateSpec {
        &self.daemonsets[0].spec.as_ref().unwrap().template
    }

    /// The pod spec of the plugin's one DaemonSet.
    fn plugin_pod(&self) -> &PodSpec {
        self.plugin_template().spec.as_ref().unwrap()
    }
}

/// The inventory of a fake host of `gpus` GPUs, GPU `mig.0` in MIG mode
/// with `mig.1` instances, as the plugin discovers it (through NVML).
fn inventory_of(gpus: u32, mig: (u32, u32)) -> gpuslice_core::Inventory {
    let host = fakegpu::FakeHost::builder()
        .gpus(gpus)
        .mig(mig.0, mig.1)
        .build()
        .unwrap();
    let _nvml = gpuslice_testkit::fakenvml::serve(host.root());
    gpuslice_testkit::fakenvml::discover(&host)
}

fn objects() -> Objects {
    let mut docs = Vec::new();
    for file in files() {
        for (i, doc) in yaml_docs(&file).into_iter().enumerate() {
            docs.push((doc, format!("{} #{i}", file.display())));
        }
    }
    sort(docs)
}

fn sort(docs: Vec<(serde_json::Value, String)>) -> Objects {
    let mut o = Objects::default();
    for (doc, what) in docs {
        match doc["kind"].as_str().unwrap_or_default() {
            "DeviceClass" => o.classes.push(typed(&doc, &what)),
            "Namespace" => {
                typed::<Namespace>(&doc, &what);
            }
            "ServiceAccount" => o.accounts.push(typed(&doc, &what)),
            "ClusterRole" => o.roles.push(typed(&doc, &what)),
            "ClusterRoleBinding" => o.bindings.push(typed(&doc, &what)),
            "DaemonSet" => o.daemonsets.push(typed(&doc, &what)),
            other => panic!("{what}: kind {other:?} not checked by this test"),
        }
    }
    o
}

#[test]
fn device_classes_select_the_published_types() {
    check_device_classes(&objects());
}

/// The DeviceClass of each device type, by name. Whole GPUs and shares
/// select the same device per GPU (one device per GPU: the scheduler
/// never places a whole GPU beside a share of it).
const CLASSES: [(&str, &str); 3] = [
    ("gpu.gpuslice.io", "gpu"),
    ("gpu-shared.gpuslice.io", "gpu"),
    ("mig.gpuslice.io", "mig"),
];

fn check_device_classes(o: &Objects) {
    let names: BTreeSet<&str> = o
        .classes
        .iter()
        .map(|c| c.metadata.name.as_deref().unwrap())
        .collect();
    assert_eq!(names, BTreeSet::from(CLASSES.map(|(n, _)| n)));
    // What the driver publishes on a host with whole, shared and MIG devices.
    let inv = inventory_of(2, (1, 1));
    let published: BTreeSet<String> = devices(&inv, &SharedPolicy::default())
        .iter()
        .map(|d| {
            d.attributes.as_ref().unwrap()["type"]
                .string
                .clone()
                .unwrap()
        })
        .collect();
    assert_eq!(published, BTreeSet::from(["gpu", "mig"].map(String::from)));
    for c in &o.classes {
        let name = c.metadata.name.as_deref().unwrap();
        let ty = CLASSES.iter().find(|(n, _)| *n == name).unwrap().1;
        // Pods asking for the extended resource get whole GPUs.
        assert_eq!(
            c.spec.extended_resource_name.as_deref(),
            (name == "gpu.gpuslice.io").then_some("gpu.gpuslice.io/gpu"),
            "{name}"
        );
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
    check_rbac(&objects());
}

fn check_rbac(o: &Objects) {
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
    assert!(allows("resource.k8s.io", "resourceclaims/status", "patch"));
    assert!(!allows("resource.k8s.io", "resourceclaims", "patch"));
    assert!(allows("", "nodes", "get"));
    assert!(allows("", "pods", "get"));
    assert!(!allows("", "pods", "list"));
    assert!(allows("events.k8s.io", "events", "create"));

    let ds = &o.daemonsets[0];
    let pod = o.plugin_pod();
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
    check_daemonset(&objects(), "/var/lib/kubelet", "/var/run/cdi");
}

/// The DaemonSet mounts the kubelet's directories below `kubelet` at
/// their host paths (the plugin names its socket to the kubelet by path)
/// and the runtime's CDI directory `cdi`.
fn check_daemonset(o: &Objects, kubelet: &str, cdi: &str) {
    assert_eq!(o.daemonsets.len(), 1);
    let pod = o.plugin_pod();
    let host_paths = checked_host_paths(pod);
    for want in [
        format!("{kubelet}/plugins"),
        format!("{kubelet}/plugins_registry"),
        cdi.to_string(),
    ] {
        assert!(host_paths.contains(&want), "no hostPath {want}");
    }
    let plugin = pod.containers.iter().find(|c| c.name == "plugin").unwrap();
    let cmd = plugin.command.clone().unwrap();
    assert!(cmd.contains(&"dra".to_string()), "{cmd:?}");
    // The claims' slice directories are tmpfs mounts the plugin makes,
    // which the host (the runtime) must see: Bidirectional, below /host.
    assert!(
        host_paths.contains("/run/gpuslice/claims"),
        "{host_paths:?}"
    );
    let claims = plugin
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == format!("/host/{}", gpuslice_dra::claimfs::CLAIMS_DIR))
        .expect("the claims' slice directories mounted at /host/run/gpuslice/claims");
    assert_eq!(claims.mount_propagation.as_deref(), Some("Bidirectional"));
    assert_ne!(claims.read_only, Some(true));
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
    // Claims' ledgers hold container pids, which resolve from the host's.
    assert_eq!(pod.host_pid, Some(true));
    // Its name is the RBAC's subject: check_rbac.
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
        format!("{kubelet}/plugins"),
        format!("{kubelet}/plugins_registry"),
    ] {
        assert!(mounts.contains(want.as_str()), "{want}");
    }
    // Where the plugin's state is, the exporter and `gpuslice slices` look.
    assert!(
        plugin.volume_mounts.iter().flatten().any(|m| {
            m.mount_path == gpuslice_dra::checkpoint::DEFAULT_DIR && m.read_only != Some(true)
        }),
        "no writable {}",
        gpuslice_dra::checkpoint::DEFAULT_DIR
    );
}

#[test]
fn upstream_1_36_schemas_accept_the_manifests_and_the_published_slices() {
    let tool = kubernetes_validate();
    let unmet = tool
        .is_none()
        .then(|| KUBERNETES_VALIDATE_MISSING.to_string());
    if !gpuslice_testkit::precondition(
        "upstream_1_36_schemas_accept_the_manifests_and_the_published_slices",
        unmet,
    ) {
        return;
    }
    let tool = tool.unwrap();
    validate(&tool, &files()).unwrap_or_else(|e| panic!("deploy/dra: {e}"));

    // What the publisher writes, on a host with whole, shared and MIG devices.
    let inv = inventory_of(3, (2, 2));
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
    // And the node unable to enforce its slices: every device carries the
    // unenforced taint too (two taints on GPUs 0 and 2).
    let unenforced = gpuslice_dra::publish::Sick {
        why: "the shim is missing".into(),
        since: k8s_openapi::jiff::Timestamp::from_second(1_780_000_100).unwrap(),
    };
    let tainted = gpuslice_dra::publish::pool_devices(
        &inv,
        &SharedPolicy::default(),
        &sick,
        Some(&unenforced),
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

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/gpuslice")
}

/// The chart's DRA driver (`dra.enabled`), rendered and linted by Helm,
/// with default and other values: what deploy/dra/ has, objects the
/// upstream 1.36 schemas accept, and a DaemonSet that reaches the API
/// server with its service account (no proxy sidecar).
#[test]
fn helm_chart_renders_the_dra_driver_as_deploy_dra_does() {
    let Some((helm, tool)) =
        helm_and_validator("helm_chart_renders_the_dra_driver_as_deploy_dra_does")
    else {
        return;
    };
    let plain = objects();
    let cases = [
        (
            serde_json::json!({"dra": {"enabled": true}, "devicePlugin": {"enabled": false}}),
            "/var/lib/kubelet",
            "/var/run/cdi",
        ),
        // A distribution with the kubelet elsewhere, the runtime reading
        // /etc/cdi, other shared-device defaults, a RuntimeClass, and the
        // device plugin kept on other nodes.
        (
            serde_json::json!({
                "runtimeClassName": "nvidia",
                "image": {"tag": "0.1.0", "pullPolicy": "Always"},
                "dra": {
                    "enabled": true,
                    "kubeletDir": "/var/lib/k0s/kubelet",
                    "cdiDir": "/etc/cdi",
                    "stateDir": "/srv/gpuslice/dra",
                    "shared": {"memoryStep": "256MiB"},
                    "refuseUnenforceable": true,
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "gpuslice.dev/mode", "operator": "In", "values": ["dra"]}]}]}},
                },
            }),
            "/var/lib/k0s/kubelet",
            "/etc/cdi",
        ),
    ];
    for (values, kubelet, cdi) in cases {
        let r = helm.lint_and_render(&chart(), "gs", "gpuslice-system", &values);
        validate_objects(&tool, &r.created).unwrap_or_else(|e| panic!("{values}: {e}"));
        let dra: Vec<_> = r
            .created
            .iter()
            .filter(|o| {
                o["metadata"]["labels"]["app.kubernetes.io/component"] == "dra-kubelet-plugin"
            })
            .map(|o| {
                (
                    o.clone(),
                    format!("{} {}", o["kind"], o["metadata"]["name"]),
                )
            })
            .collect();
        let o = sort(dra);
        check_device_classes(&o);
        check_rbac(&o);
        check_daemonset(&o, kubelet, cdi);
        // The same classes and rules as deploy/dra/.
        let specs = |o: &Objects| {
            o.classes
                .iter()
                .map(|c| {
                    (
                        c.metadata.name.clone(),
                        serde_json::to_value(&c.spec).unwrap(),
                    )
                })
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        assert_eq!(specs(&o), specs(&plain));
        assert_eq!(o.roles[0].rules, plain.roles[0].rules);
        // The plugin alone, with its service account's token and no API
        // server flag: it uses the in-cluster credentials.
        let pod = o.plugin_pod();
        let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["plugin"]);
        assert_eq!(pod.automount_service_account_token, Some(true));
        assert_ne!(o.accounts[0].automount_service_account_token, Some(false));
        let cmd = pod.containers[0].command.clone().unwrap();
        assert!(
            !cmd.iter().any(|a| a.starts_with("--api-server")),
            "{cmd:?}"
        );
        let flag = |f: &str| cmd.iter().skip_while(|a| *a != f).nth(1).cloned();
        let shared = &chart_values(&chart(), &values)["dra"]["shared"];
        assert_eq!(
            flag("--memory-step").as_deref(),
            shared["memoryStep"].as_str()
        );
        assert_eq!(
            cmd.contains(&"--refuse-unenforceable".to_string()),
            chart_values(&chart(), &values)["dra"]["refuseUnenforceable"] == true,
            "{cmd:?}"
        );
        assert!(
            !cmd.iter().any(|a| a.ends_with("-default")),
            "no default flags: a request naming no capacity is the whole GPU: {cmd:?}"
        );
        assert_eq!(flag("--cdi-dir"), Some(format!("/host{cdi}")));
        // Its pods are its own: the device plugin's DaemonSet and the
        // metrics Service do not select them.
        let labels = o
            .plugin_template()
            .metadata
            .clone()
            .unwrap()
            .labels
            .unwrap();
        for other in r.created.iter().filter(|x| {
            x["kind"] == "Service" || (x["kind"] == "DaemonSet" && x["metadata"]["name"] == "gs")
        }) {
            let sel = other["spec"]["selector"]
                .get("matchLabels")
                .unwrap_or(&other["spec"]["selector"]);
            let selects = sel
                .as_object()
                .unwrap()
                .iter()
                .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
            assert!(
                !selects,
                "{} {} selects the DRA plugin's pods",
                other["kind"], other["metadata"]["name"]
            );
        }
    }
}

/// The device plugin and the DRA driver on the same nodes would hand out
/// each GPU twice: the chart refuses to render that, saying how to fix it.
#[test]
fn helm_chart_refuses_the_device_plugin_and_dra_on_the_same_nodes() {
    let Some((helm, _)) =
        helm_and_validator("helm_chart_refuses_the_device_plugin_and_dra_on_the_same_nodes")
    else {
        return;
    };
    let e = helm
        .render(
            &chart(),
            "gs",
            "gpuslice-system",
            &serde_json::json!({"dra": {"enabled": true}}),
        )
        .err()
        .expect("rendered the device plugin and the DRA driver on the same nodes");
    assert!(e.contains("hand out each GPU twice"), "{e}");
    assert!(e.contains("dra.nodeAffinity"), "{e}");
}

/// DRA values the plugin would refuse at start, or a misspelt key that
/// Helm would ignore, are refused when rendering (values.schema.json),
/// naming the value.
#[test]
fn helm_chart_refuses_bad_dra_values() {
    let Some((helm, _)) = helm_and_validator("helm_chart_refuses_bad_dra_values") else {
        return;
    };
    let on = |dra: serde_json::Value| {
        let mut v = serde_json::json!({"devicePlugin": {"enabled": false}, "dra": dra});
        v["dra"]["enabled"] = true.into();
        v
    };
    for (values, names) in [
        (
            on(serde_json::json!({"shared": {"computeDefault": 50}})),
            "computeDefault",
        ),
        (
            on(serde_json::json!({"shared": {"memoryStep": "0MiB"}})),
            "memoryStep",
        ),
        (
            on(serde_json::json!({"shared": {"memoryStep": "1.5 gigs"}})),
            "memoryStep",
        ),
        (
            on(serde_json::json!({"kubeletDir": "var/lib/kubelet"})),
            "kubeletDir",
        ),
        (on(serde_json::json!({"cdidir": "/etc/cdi"})), "cdidir"),
        (serde_json::json!({"dra": {"enabled": "yes"}}), "enabled"),
    ] {
        let e = helm
            .render(&chart(), "gs", "gpuslice-system", &values)
            .err()
            .unwrap_or_else(|| panic!("rendered {values}"));
        assert!(e.contains("schema") && e.contains(names), "{values}: {e}");
    }
}
