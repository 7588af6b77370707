//! Checks of Kubernetes manifests against k8s-openapi's types: a document
//! must deserialise as its type and serialise back to itself, so a field
//! k8s-openapi does not know (a misspelling) or of the wrong type fails;
//! and against the upstream schemas (`kubernetes-validate`) and Helm itself
//! (helm-sdkpy, [`Helm`]).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The YAML documents of `file` as JSON values (empty documents skipped).
pub fn yaml_docs(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    yaml_text_docs(&text, &file.display().to_string())
}

/// The YAML documents of `text` (from `what`) as JSON values (empty
/// documents skipped).
pub fn yaml_text_docs(text: &str, what: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .enumerate()
        .map(|(i, de)| {
            serde_json::to_value(
                serde_yaml::Value::deserialize(de).unwrap_or_else(|e| panic!("{what} #{i}: {e}")),
            )
            .unwrap()
        })
        .filter(|d| !d.is_null())
        .collect()
}

/// Drops nulls, so that an absent optional field and `null` compare equal.
pub fn normalize(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, normalize(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(normalize).collect()),
        v => v,
    }
}

/// Deserialises `doc` as `T` and checks that serialising it back gives the
/// same document: k8s-openapi ignores unknown fields, this does not.
pub fn typed<T: DeserializeOwned + Serialize>(doc: &Value, what: &str) -> T {
    let t: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let back = normalize(serde_json::to_value(&t).unwrap());
    let want = normalize(doc.clone());
    assert_eq!(
        back,
        want,
        "{what}: fields k8s-openapi does not know (or of the wrong type):\n{}",
        serde_json::to_string_pretty(&want).unwrap()
    );
    t
}

/// `kubernetes-validate` (PyPI; it ships the upstream OpenAPI schemas):
/// `$KUBERNETES_VALIDATE`, else on PATH.
pub fn kubernetes_validate() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KUBERNETES_VALIDATE") {
        return Some(PathBuf::from(p));
    }
    on_path("kubernetes-validate")
}

/// What a test that needs `kubernetes-validate` tells
/// [`crate::precondition`] when it is missing.
pub const KUBERNETES_VALIDATE_MISSING: &str =
    "kubernetes-validate not found (pip install kubernetes-validate, or set $KUBERNETES_VALIDATE)";

/// Helm (helm-sdkpy) and `kubernetes-validate` for `test`, or `None` once
/// [`crate::precondition`] has had its verdict on the one that is missing.
pub fn helm_and_validator(test: &str) -> Option<(Helm, PathBuf)> {
    let helm = Helm::find();
    let tool = kubernetes_validate();
    let unmet = match (&helm, &tool) {
        (Err(e), _) => Some(e.clone()),
        (_, None) => Some(KUBERNETES_VALIDATE_MISSING.to_string()),
        _ => None,
    };
    crate::precondition(test, unmet).then(|| (helm.unwrap(), tool.unwrap()))
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// Validates `files` against the Kubernetes 1.36 schemas, strictly
/// (unknown fields are errors); the tool's output on failure.
pub fn validate(tool: &Path, files: &[PathBuf]) -> Result<(), String> {
    let out = Command::new(tool)
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

/// The `hostPath.type` values the API server accepts; the OpenAPI schemas
/// leave the field a free string.
const HOST_PATH_TYPES: [&str; 8] = [
    "",
    "DirectoryOrCreate",
    "Directory",
    "FileOrCreate",
    "File",
    "Socket",
    "CharDevice",
    "BlockDevice",
];

/// Every `hostPath.type` in `v` that the API server would refuse.
fn bad_host_path_types(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(t) = m.get("hostPath").and_then(|h| h.get("type")) {
                if !t.as_str().is_some_and(|t| HOST_PATH_TYPES.contains(&t)) {
                    out.push(format!("hostPath type {t} (one of {HOST_PATH_TYPES:?})"));
                }
            }
            m.values().for_each(|c| bad_host_path_types(c, out));
        }
        Value::Array(a) => a.iter().for_each(|c| bad_host_path_types(c, out)),
        _ => {}
    }
}

/// [`validate`] of objects, each written to a file of its own (named by
/// its kind and name, which the tool's messages show), and of what the
/// schemas leave out: `hostPath.type`'s values.
pub fn validate_objects(tool: &Path, objects: &[Value]) -> Result<(), String> {
    let mut bad = Vec::new();
    for o in objects {
        bad_host_path_types(o, &mut bad);
    }
    if !bad.is_empty() {
        return Err(bad.join("; "));
    }
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = objects
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let f = dir.path().join(format!(
                "{i}-{}-{}.json",
                o["kind"].as_str().unwrap_or("unknown"),
                o["metadata"]["name"].as_str().unwrap_or("unnamed")
            ));
            std::fs::write(&f, serde_json::to_vec_pretty(o).unwrap()).unwrap();
            f
        })
        .collect();
    validate(tool, &files)
}

/// Helm itself, through helm-sdkpy (PyPI; its wheel carries Helm's Go
/// library) and scripts/helm_chart.py.
pub struct Helm {
    python: PathBuf,
    script: PathBuf,
}

/// What Helm made of a chart: the manifest it rendered and the objects it
/// sent to the API server (with its own labels and annotations).
pub struct Rendered {
    pub manifest: String,
    pub created: Vec<Value>,
}

impl Helm {
    /// The Python that imports helm_sdkpy: `$HELM_SDKPY_PYTHON`, else
    /// `python3` on PATH if it does; else why not, for
    /// [`crate::precondition`].
    pub fn find() -> Result<Helm, String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/helm_chart.py");
        let python = match std::env::var_os("HELM_SDKPY_PYTHON") {
            Some(p) => PathBuf::from(p),
            None => on_path("python3").ok_or("no python3 on PATH for helm-sdkpy")?,
        };
        let imports = Command::new(&python)
            .args(["-c", "import helm_sdkpy"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !imports {
            return Err(format!(
                "{} cannot import helm_sdkpy (pip install --ignore-requires-python helm-sdkpy, or set $HELM_SDKPY_PYTHON to a Python that has it)",
                python.display()
            ));
        }
        Ok(Helm { python, script })
    }

    fn run(&self, args: &[&std::ffi::OsStr]) -> Result<Value, String> {
        let out = Command::new(&self.python)
            .arg(&self.script)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", self.python.display()));
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "helm_chart.py printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        }))
    }

    /// Helm's lint of `chart`, with `values` (complete values, see
    /// [`chart_values`]) in place of its values.yaml when given: the
    /// messages as (severity, file), or the error.
    pub fn lint(
        &self,
        chart: &Path,
        values: Option<&Value>,
    ) -> Result<Vec<(String, String)>, String> {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec![std::ffi::OsStr::new("lint"), chart.as_os_str()];
        let file = dir.path().join("values.json");
        if let Some(v) = values {
            std::fs::write(&file, v.to_string()).unwrap();
            args.push(file.as_os_str());
        }
        let out = self.run(&args)?;
        Ok(out["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["severity"].as_str().unwrap().to_string(),
                    m["path"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect())
    }

    /// Helm's install of `chart` as `release` in `namespace` with `values`
    /// (over the chart's), against scripts/helm_chart.py's API double.
    pub fn render(
        &self,
        chart: &Path,
        release: &str,
        namespace: &str,
        values: &Value,
    ) -> Result<Rendered, String> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("values.json");
        std::fs::write(&file, values.to_string()).unwrap();
        let out = self.run(&[
            "render".as_ref(),
            chart.as_os_str(),
            release.as_ref(),
            namespace.as_ref(),
            file.as_os_str(),
        ])?;
        Ok(Rendered {
            manifest: out["manifest"].as_str().unwrap().to_string(),
            created: out["created"].as_array().unwrap().clone(),
        })
    }
}

impl Helm {
    /// [`Helm::lint`] with `over` merged into the chart's values (only
    /// INFO messages allowed: Helm's one is Chart.yaml's missing icon),
    /// then [`Helm::render`]; asserts Helm created exactly the objects it
    /// rendered. Panics naming `over` on any failure.
    pub fn lint_and_render(
        &self,
        chart: &Path,
        release: &str,
        namespace: &str,
        over: &Value,
    ) -> Rendered {
        let lint = self
            .lint(chart, Some(&chart_values(chart, over)))
            .unwrap_or_else(|e| panic!("{over}: {e}"));
        assert!(
            lint.iter().all(|(sev, _)| sev == "INFO"),
            "helm lint with {over}: {lint:?}"
        );
        let r = self
            .render(chart, release, namespace, over)
            .unwrap_or_else(|e| panic!("{over}: {e}"));
        assert_eq!(
            yaml_text_docs(&r.manifest, "the rendered chart").len(),
            r.created.len(),
            "Helm created other objects than it rendered ({over})"
        );
        r
    }
}

/// `chart`'s values.yaml with `over` merged in as Helm merges values
/// (maps key by key, anything else replaced).
pub fn chart_values(chart: &Path, over: &Value) -> Value {
    let text = std::fs::read_to_string(chart.join("values.yaml")).unwrap();
    let base: Value =
        serde_json::to_value(serde_yaml::from_str::<serde_yaml::Value>(&text).unwrap()).unwrap();
    merge(base, over)
}

fn merge(base: Value, over: &Value) -> Value {
    match (base, over) {
        (Value::Object(mut b), Value::Object(o)) => {
            for (k, v) in o {
                let merged = merge(b.remove(k).unwrap_or(Value::Null), v);
                b.insert(k.clone(), merged);
            }
            Value::Object(b)
        }
        (_, o) => o.clone(),
    }
}

/// The paths of `pod`'s hostPath volumes, once every mount of its
/// containers and init containers has been checked to name one of its
/// volumes (a mount of no volume is refused by the API server).
pub fn checked_host_paths(pod: &k8s_openapi::api::core::v1::PodSpec) -> BTreeSet<String> {
    let volumes = pod.volumes.iter().flatten();
    let names: BTreeSet<&str> = volumes.clone().map(|v| v.name.as_str()).collect();
    for c in pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
    {
        for m in c.volume_mounts.iter().flatten() {
            assert!(
                names.contains(m.name.as_str()),
                "{}: no volume {}",
                c.name,
                m.name
            );
        }
    }
    volumes
        .filter_map(|v| v.host_path.as_ref().map(|h| h.path.clone()))
        .collect()
}
