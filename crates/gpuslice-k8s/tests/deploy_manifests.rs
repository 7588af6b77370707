//! deploy/: the plain manifests are valid Kubernetes objects (k8s-openapi
//! types, and nothing they drop: a misspelt field fails), the Helm chart's
//! files parse and every `.Values` path its templates use exists, Helm
//! itself (helm-sdkpy) lints and renders it into objects the upstream 1.36
//! schemas accept (kubernetes-validate), and the
//! Grafana dashboard queries only series the exporter emits.

use gpuslice_k8s::plugin::config::Config;
use gpuslice_testkit::manifests::{
    checked_host_paths, helm_and_validator, typed, validate_objects,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn plain_manifests_are_kubernetes_objects() {
    let dir = deploy().join("kubernetes");
    let mut kinds = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for file in files {
        let text = read(&file);
        for (i, de) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let doc = serde_json::to_value(
                serde_yaml::Value::deserialize(de)
                    .unwrap_or_else(|e| panic!("{} #{i}: {e}", file.display())),
            )
            .unwrap();
            if doc.is_null() {
                continue;
            }
            let what = format!("{} #{i}", file.display());
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            match kind.as_str() {
                "Namespace" => {
                    typed::<Namespace>(&doc, &what);
                }
                "ConfigMap" => {
                    let cm: ConfigMap = typed(&doc, &what);
                    let cfg = &cm.data.unwrap()["config.yaml"];
                    Config::parse(cfg).unwrap_or_else(|e| panic!("{what}: config: {e:#}"));
                }
                "DaemonSet" => check_daemonset(&typed::<DaemonSet>(&doc, &what)),
                "Service" => {
                    let s: Service = typed(&doc, &what);
                    let ports = s.spec.unwrap().ports.unwrap();
                    assert!(ports.iter().any(|p| p.port == 9400));
                }
                other => panic!("{what}: kind {other:?} not checked by this test"),
            }
            kinds.push(kind);
        }
    }
    for k in ["Namespace", "ConfigMap", "DaemonSet", "Service"] {
        assert!(kinds.iter().any(|x| x == k), "no {k} in {kinds:?}");
    }
}

/// `gpuslice_dra::checkpoint::DEFAULT_DIR`, where the exporter looks by
/// default (gpuslice-k8s does not depend on gpuslice-dra).
fn gpuslice_dra_state_dir() -> &'static str {
    "/var/lib/gpuslice/dra"
}

fn check_daemonset(ds: &DaemonSet) {
    check_daemonset_on(ds, 9400);
}

/// The device plugin's DaemonSet, its exporter on `port`.
fn check_daemonset_on(ds: &DaemonSet, port: i32) {
    let tmpl = &ds.spec.as_ref().unwrap().template;
    let ann = tmpl.metadata.as_ref().unwrap().annotations.clone().unwrap();
    assert_eq!(ann["prometheus.io/scrape"], "true");
    assert_eq!(ann["prometheus.io/port"], port.to_string());
    let pod = tmpl.spec.as_ref().unwrap();
    let host_paths = checked_host_paths(pod);
    for want in [
        "/var/lib/kubelet/device-plugins",
        "/dev",
        "/proc/driver/nvidia",
        "/etc/kubernetes/node-feature-discovery/features.d",
        "/run/gpuslice",
        "/var/lib/kubelet/pod-resources",
    ] {
        assert!(host_paths.contains(want), "no hostPath {want}");
    }
    let plugin = pod
        .containers
        .iter()
        .find(|c| c.name == "device-plugin")
        .unwrap();
    // The ledger sweep asks the kubelet's PodResources API and checks the
    // host's processes.
    assert!(
        plugin
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == "/var/lib/kubelet/pod-resources"),
        "the plugin has no PodResources socket"
    );
    // The exporter reads the DRA plugin's checkpoint (the claims' labels)
    // where `gpuslice exporter` looks by default.
    if let Some(exporter) = pod.containers.iter().find(|c| c.name == "exporter") {
        assert!(
            exporter
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| { m.mount_path == gpuslice_dra_state_dir() && m.read_only == Some(true) }),
            "the exporter has no DRA checkpoint"
        );
    }
    assert_eq!(pod.host_pid, Some(true));
    let command = |c: &k8s_openapi::api::core::v1::Container| c.command.clone().unwrap().join(" ");
    let cmd = command(plugin);
    assert!(
        cmd.contains("device-plugin --config /etc/gpuslice/config.yaml"),
        "{cmd}"
    );
    assert_eq!(
        plugin.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
    let exporter = pod
        .containers
        .iter()
        .find(|c| c.name == "exporter")
        .unwrap();
    assert!(command(exporter).contains("exporter"));
    assert!(exporter
        .ports
        .iter()
        .flatten()
        .any(|p| p.container_port == port));
    let labels = pod
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == "labels")
        .unwrap();
    assert!(command(labels).contains("labels --config"));
}

/// Whether the dotted `path` leads somewhere in `v`.
fn has_path(v: &serde_yaml::Value, path: &[&str]) -> bool {
    match path.split_first() {
        None => true,
        Some((k, rest)) => v.get(*k).is_some_and(|c| has_path(c, rest)),
    }
}

#[test]
fn helm_chart_values_cover_templates() {
    let chart = deploy().join("helm/gpuslice");
    let meta: serde_yaml::Value = serde_yaml::from_str(&read(&chart.join("Chart.yaml"))).unwrap();
    assert_eq!(meta["apiVersion"].as_str(), Some("v2"));
    assert_eq!(meta["name"].as_str(), Some("gpuslice"));
    assert!(meta["version"].as_str().is_some());
    let values: serde_yaml::Value =
        serde_yaml::from_str(&read(&chart.join("values.yaml"))).unwrap();
    // The config the chart passes through is one the plugin accepts.
    let cfg = serde_yaml::to_string(&values["config"]).unwrap();
    Config::parse(&cfg).unwrap_or_else(|e| panic!("values.yaml config: {e:#}"));
    assert!(values["serviceMonitor"]["enabled"].is_bool());

    let re = regex::Regex::new(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)").unwrap();
    let mut seen = 0;
    let mut templates = std::fs::read_dir(chart.join("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect::<Vec<_>>();
    templates.sort();
    let mut names = Vec::new();
    for t in &templates {
        let text = read(t);
        names.push(t.file_name().unwrap().to_string_lossy().to_string());
        // Balanced actions.
        assert_eq!(
            text.matches("{{").count(),
            text.matches("}}").count(),
            "{}",
            t.display()
        );
        for c in re.captures_iter(&text) {
            let path: Vec<&str> = c[1].trim_start_matches('.').split('.').collect();
            assert!(
                has_path(&values, &path),
                "{}: .Values.{} is not in values.yaml",
                t.display(),
                path.join(".")
            );
            seen += 1;
        }
    }
    assert!(seen > 10, "{seen}");
    for want in [
        "daemonset.yaml",
        "configmap.yaml",
        "service.yaml",
        "servicemonitor.yaml",
    ] {
        assert!(names.iter().any(|n| n == want), "no template {want}");
    }
}

/// The series names the exporter emits (counters with `_total`).
fn emitted() -> BTreeSet<String> {
    use gpuslice_metrics::sample::{Kind, ALL, PREFIX};
    ALL.iter()
        .map(|m| match m.kind {
            Kind::Gauge => format!("{PREFIX}_{}", m.name),
            Kind::Counter => format!("{PREFIX}_{}_total", m.name),
        })
        .collect()
}

fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                match (k.as_str(), c) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    ("query", Value::String(s)) => out.push(s.clone()),
                    ("query", Value::Object(q)) => {
                        if let Some(Value::String(s)) = q.get("query") {
                            out.push(s.clone());
                        }
                    }
                    _ => exprs(c, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|c| exprs(c, out)),
        _ => {}
    }
}

#[test]
fn grafana_dashboard_uses_emitted_metrics() {
    let d: Value = serde_json::from_str(&read(&deploy().join("grafana/gpuslice.json"))).unwrap();
    assert!(d["schemaVersion"].as_u64().unwrap() >= 36);
    let vars = d["templating"]["list"].as_array().unwrap();
    let var = |n: &str| vars.iter().find(|v| v["name"] == n).cloned();
    assert_eq!(var("datasource").unwrap()["type"], "datasource");
    assert_eq!(var("datasource").unwrap()["query"], "prometheus");
    assert_eq!(var("gpu").unwrap()["type"], "query");

    let mut ex = Vec::new();
    exprs(&d["panels"], &mut ex);
    exprs(&d["templating"], &mut ex);
    assert!(ex.len() >= 10, "{ex:?}");
    let emitted = emitted();
    let re = regex::Regex::new(r"\bgpuslice_[a-z0-9_]+").unwrap();
    let mut used = BTreeSet::new();
    for e in &ex {
        for m in re.find_iter(e) {
            assert!(
                emitted.contains(m.as_str()),
                "{:?} in {e:?} is not a series the exporter emits",
                m.as_str()
            );
            used.insert(m.as_str().to_string());
        }
    }
    for want in [
        "gpuslice_gpu_utilization_ratio",
        "gpuslice_gpu_memory_used_bytes",
        "gpuslice_gpu_power_watts",
        "gpuslice_slice_memory_cap_bytes",
        "gpuslice_slice_compute_throttled_seconds_total",
    ] {
        assert!(used.contains(want), "dashboard lacks {want}");
    }
    // Every panel queries through the datasource variable.
    fn panels(v: &Value, out: &mut Vec<Value>) {
        for p in v.as_array().into_iter().flatten() {
            out.push(p.clone());
            panels(&p["panels"], out);
        }
    }
    let mut all = Vec::new();
    panels(&d["panels"], &mut all);
    for p in all.iter().filter(|p| p["type"] != "row") {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
    }
}

fn chart() -> PathBuf {
    deploy().join("helm/gpuslice")
}

/// Helm itself (helm-sdkpy) lints the chart and renders it, with default
/// and with other values; every object it would create is one the
/// upstream 1.36 schemas accept and k8s-openapi types in full, and the
/// device plugin's objects pass the plain manifests' checks.
#[test]
fn helm_lints_and_renders_the_chart_into_valid_objects() {
    let test = "helm_lints_and_renders_the_chart_into_valid_objects";
    let Some((helm, tool)) = helm_and_validator(test) else {
        return;
    };
    let cases = [
        (serde_json::json!({}), 9400, false),
        // Another exporter port and interval, a ServiceMonitor, shared
        // GPUs with CDI, a RuntimeClass, and the DRA driver on other nodes.
        (
            serde_json::json!({
                "runtimeClassName": "nvidia",
                "image": {"repository": "registry.example/gpuslice", "tag": "0.1.0"},
                "config": {
                    "roles": [{"gpus": [0], "role": "whole"}, {"gpus": "others", "role": "shared", "replicas": 4}],
                    "strategies": {"cdi": true},
                },
                "exporter": {"port": 9500, "interval": "15s"},
                "serviceMonitor": {"enabled": true, "additionalLabels": {"release": "prometheus"}},
                "dra": {"enabled": true, "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "gpuslice.dev/mode", "operator": "In", "values": ["dra"]}]}]}}},
            }),
            9500,
            true,
        ),
    ];
    for (values, port, monitor) in cases {
        let r = helm.lint_and_render(&chart(), "gpuslice", "gpuslice", &values);
        // ServiceMonitor is prometheus-operator's CRD: no upstream schema.
        let (crds, core): (Vec<_>, Vec<_>) = r
            .created
            .iter()
            .cloned()
            .partition(|o| o["kind"] == "ServiceMonitor");
        validate_objects(&tool, &core).unwrap_or_else(|e| panic!("{values}: {e}"));
        assert_eq!(crds.len(), usize::from(monitor), "{values}");
        for m in &crds {
            assert_eq!(m["spec"]["endpoints"][0]["port"], "metrics");
            assert_eq!(m["metadata"]["labels"]["release"], "prometheus");
        }
        let mut kinds = BTreeSet::new();
        for o in &core {
            let what = format!("{} {} ({values})", o["kind"], o["metadata"]["name"]);
            kinds.insert(o["kind"].as_str().unwrap().to_string());
            match o["kind"].as_str().unwrap() {
                "ConfigMap" => {
                    let cm: ConfigMap = typed(o, &what);
                    Config::parse(&cm.data.unwrap()["config.yaml"])
                        .unwrap_or_else(|e| panic!("{what}: config: {e:#}"));
                }
                "Service" => {
                    let s: Service = typed(o, &what);
                    assert!(s
                        .spec
                        .unwrap()
                        .ports
                        .unwrap()
                        .iter()
                        .any(|p| p.port == port));
                }
                "DaemonSet" if o["metadata"]["name"] == "gpuslice" => {
                    check_daemonset_on(&typed(o, &what), port)
                }
                // The DRA driver's objects: gpuslice-dra's tests/deploy.rs.
                _ => {}
            }
        }
        for k in ["ConfigMap", "DaemonSet", "Service"] {
            assert!(kinds.contains(k), "no {k} rendered with {values}");
        }
    }

    // Both checks can fail: a chart whose values lack what its templates
    // use does not lint, and an object 1.36 does not know is refused.
    let lint = helm
        .lint(&chart(), Some(&serde_json::json!({"image": {"tag": "x"}})))
        .unwrap();
    assert!(lint.iter().any(|(sev, _)| sev == "ERROR"), "{lint:?}");
    let bad = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "x"},
        "spec": {"selector": {}, "template": {"spec": {"containers": [], "gpuPolicy": "shared"}}},
    });
    let e = validate_objects(&tool, &[bad]).unwrap_err();
    assert!(e.contains("gpuPolicy"), "{e}");
    let typo = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
        "spec": {"containers": [{"name": "c", "image": "i"}],
                 "volumes": [{"name": "v", "hostPath": {"path": "/x", "type": "Directroy"}}]},
    });
    let e = validate_objects(&tool, &[typo]).unwrap_err();
    assert!(e.contains("Directroy"), "{e}");
}

#[test]
fn a_misspelt_field_is_caught() {
    let doc = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 9400, "targetPrt": "metrics"}]},
    });
    let r = std::panic::catch_unwind(|| typed::<Service>(&doc, "typo"));
    assert!(r.is_err());
    let ok = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 9400, "targetPort": "metrics"}]},
    });
    typed::<Service>(&ok, "ok");
}
