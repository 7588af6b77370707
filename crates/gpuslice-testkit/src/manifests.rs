//! Checks of Kubernetes manifests against k8s-openapi's types: a document
//! must deserialise as its type and serialise back to itself, so a field
//! k8s-openapi does not know (a misspelling) or of the wrong type fails.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;

/// The YAML documents of `file` as JSON values (empty documents skipped).
pub fn yaml_docs(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    serde_yaml::Deserializer::from_str(&text)
        .enumerate()
        .map(|(i, de)| {
            serde_json::to_value(
                serde_yaml::Value::deserialize(de)
                    .unwrap_or_else(|e| panic!("{} #{i}: {e}", file.display())),
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
