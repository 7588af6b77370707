//! The container state an OCI runtime hands a hook on stdin (runtime-spec
//! `state.md`: `ociVersion`, `id`, `status`, `pid`, `bundle`), as the CDI
//! hooks of gpuslice read it.

use crate::{CdiError, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// What a hook needs of the container's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerState {
    /// The runtime's id: it names root's record of what the hook did, so
    /// it is checked to be a plain file name.
    pub id: String,
    /// The container's process in the host's PID namespace (absent after
    /// it ended: `poststop`).
    pub pid: Option<u32>,
    /// The bundle directory (its `config.json` names the root file system).
    pub bundle: Option<PathBuf>,
}

impl ContainerState {
    pub fn parse(json: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(json)
            .map_err(|e| CdiError::input("container state on stdin", e))?;
        let id = v["id"]
            .as_str()
            .ok_or_else(|| CdiError::input("the container state", "no id"))?;
        if id.is_empty()
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            || id.starts_with('.')
        {
            return Err(CdiError::input(
                format!("container id {id:?}"),
                "not a runtime's id (A-Z a-z 0-9 - _ .)",
            ));
        }
        Ok(ContainerState {
            id: id.to_string(),
            pid: v["pid"].as_u64().filter(|p| *p > 0).map(|p| p as u32),
            bundle: v["bundle"].as_str().map(PathBuf::from),
        })
    }
}

/// Goes over a hook's records in `state_dir`, one file a container named
/// by its id: `read` gives what a file holds (None: left alone), and
/// `reap` undoes what the hook did for a container that is gone, saying
/// whether its record can go (false: still running, or not undone yet).
pub(crate) fn reap_records<T>(
    state_dir: &Path,
    read: impl Fn(&Path) -> Option<T>,
    reap: impl Fn(T) -> bool,
) {
    for e in std::fs::read_dir(state_dir).into_iter().flatten().flatten() {
        let file = e.path();
        if read(&file).is_some_and(&reap) {
            let _ = std::fs::remove_file(&file);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_s_id_names_a_file_of_root_s_directory_and_nothing_else() {
        let s = ContainerState::parse(r#"{"id":"abc-1.2_x","pid":42,"bundle":"/b"}"#).unwrap();
        assert_eq!(
            (s.id.as_str(), s.pid, s.bundle),
            ("abc-1.2_x", Some(42), Some(PathBuf::from("/b")))
        );
        assert_eq!(
            ContainerState::parse(r#"{"id":"c","pid":0}"#).unwrap().pid,
            None
        );
        for bad in ["../x", "a/b", "", ".hidden"] {
            let e = ContainerState::parse(&format!(r#"{{"id":{bad:?}}}"#)).unwrap_err();
            assert!(e.to_string().contains("container id"), "{e}");
        }
        let e = ContainerState::parse(r#"{"pid":1}"#).unwrap_err();
        assert!(e.to_string().contains("no id"), "{e}");
    }
}
