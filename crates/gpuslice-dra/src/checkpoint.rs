//! The prepared claims, on disk: a restarted plugin still knows what it
//! prepared, so Prepare stays idempotent and Unprepare still removes it.
//!
//! One JSON file, `{"version": 1, "claims": {uid: PreparedClaim}}`,
//! replaced atomically (a temporary file in the same directory, fsynced,
//! renamed) with mode 0600. A file of another version is refused, not
//! guessed at.

use crate::claim::Allocated;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use thiserror::Error;

pub const VERSION: u32 = 1;
pub const FILE: &str = "checkpoint.json";
/// Where `gpuslice dra` keeps it unless told otherwise (`--state-dir`).
pub const DEFAULT_DIR: &str = "/var/lib/gpuslice/dra";

/// Below the state directory: root's records of each claim slice's
/// enforcement (`<dir>/<slice>/enforcement`: the kills of root's enforcer,
/// `gpuslice_ledger::enforcer::record_kill`), root's alone (a claim's own
/// slice directory is the pods'), removed with the claim.
pub const ENFORCEMENT_DIR: &str = "enforcement";

/// The records directory of claim slice `slice` in state directory `dir`.
pub fn enforcement_dir(dir: &Path, slice: &str) -> PathBuf {
    dir.join(ENFORCEMENT_DIR).join(slice)
}

#[derive(Debug, Error)]
pub enum CheckpointError {
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("{0}: not a gpuslice DRA checkpoint: {1}")]
    Corrupt(PathBuf, String),
    #[error("{0}: checkpoint version {1}, this plugin reads version {VERSION} (move it away to start empty; prepared claims are then forgotten)")]
    Version(PathBuf, u32),
    #[error("writing {0}: {1}")]
    Write(PathBuf, String),
}

/// A prepared claim: what the kubelet asked for, what it was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The claim's resourceVersion when it was read.
    pub resource_version: Option<String>,
    pub devices: Vec<PreparedDevice>,
    /// The claim's CDI spec file.
    pub cdi_spec: PathBuf,
    /// The limits records of its capped slices (beside the spec) and
    /// root's records of their shares on the boards, removed with it.
    #[serde(default)]
    pub records: Vec<PathBuf>,
    /// The slice directories of its capped slices (`crate::claimfs`: one
    /// ledger for all the claim's containers), unmounted and removed with it.
    #[serde(default)]
    pub slice_dirs: Vec<PathBuf>,
    /// What its pods may do that its caps cannot hold against
    /// (`crate::podcheck`); empty when nothing was seen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unenforceable: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    #[serde(flatten)]
    pub allocated: Allocated,
    /// `gpuslice.dev/claim=<name>`.
    pub cdi_device_id: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct OnDisk {
    version: u32,
    claims: BTreeMap<String, PreparedClaim>,
}

#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    pub claims: BTreeMap<String, PreparedClaim>,
}

impl Checkpoint {
    /// Loads `<dir>/checkpoint.json`; none yet is an empty checkpoint.
    pub fn load(dir: &Path) -> Result<Self, CheckpointError> {
        let path = dir.join(FILE);
        let claims = match std::fs::read(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(CheckpointError::Io(path, e)),
            Ok(bytes) => {
                let version: serde_json::Value = serde_json::from_slice(&bytes)
                    .map_err(|e| CheckpointError::Corrupt(path.clone(), e.to_string()))?;
                let v = version["version"].as_u64().unwrap_or(0) as u32;
                if v != VERSION {
                    return Err(CheckpointError::Version(path, v));
                }
                let d: OnDisk = serde_json::from_slice(&bytes)
                    .map_err(|e| CheckpointError::Corrupt(path.clone(), e.to_string()))?;
                d.claims
            }
        };
        Ok(Checkpoint { path, claims })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory it lives in (the plugin's state directory).
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("/"))
    }

    /// Writes the claims (atomically, 0600).
    pub fn save(&self) -> Result<(), CheckpointError> {
        let d = OnDisk {
            version: VERSION,
            claims: self.claims.clone(),
        };
        let data = serde_json::to_vec_pretty(&d)
            .map_err(|e| CheckpointError::Write(self.path.clone(), e.to_string()))?;
        gpuslice_core::atomic_file::write_atomic(&self.path, &data, 0o600)
            .map_err(|e| CheckpointError::Write(self.path.clone(), format!("{e:#}")))
    }
}

/// One slice of a prepared claim, as `gpuslice slices` and the exporter
/// show it: the exporter's own form.
pub use gpuslice_metrics::dra::ClaimSlice;

impl PreparedDevice {
    /// Its slice's name: the CDI device name (`<uid>-<n>`).
    pub fn slice(&self) -> &str {
        self.cdi_device_id
            .rsplit_once('=')
            .map_or(self.cdi_device_id.as_str(), |(_, n)| n)
    }
}

impl PreparedClaim {
    /// The claim's slices, one per device (where their enforcement
    /// records are, the checkpoint's directory tells: [`prepared_slices`]).
    pub fn slices(&self) -> Vec<ClaimSlice> {
        self.devices
            .iter()
            .map(|d| ClaimSlice {
                slice: d.slice().to_string(),
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                uid: self.uid.clone(),
                device: d.allocated.device.clone(),
                gpu: d.allocated.kind.gpu(),
                caps: d.allocated.caps,
                unenforceable: self.unenforceable.clone(),
                record: self
                    .records
                    .iter()
                    .find(|r| {
                        r.file_name()
                            == gpuslice_cdi::limits_record_path(Path::new(""), d.slice())
                                .file_name()
                    })
                    .cloned(),
                enforcement: None,
            })
            .collect()
    }
}

/// The slices of every claim prepared in `dir`'s checkpoint (none when
/// there is no checkpoint).
pub fn prepared_slices(dir: &Path) -> Result<Vec<ClaimSlice>, CheckpointError> {
    Ok(Checkpoint::load(dir)?
        .claims
        .values()
        .flat_map(PreparedClaim::slices)
        .map(|s| ClaimSlice {
            enforcement: Some(enforcement_dir(dir, &s.slice)),
            ..s
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_versions_and_garbage_are_refused() {
        let t = tempfile::tempdir().unwrap();
        assert!(Checkpoint::load(t.path()).unwrap().claims.is_empty());
        std::fs::write(t.path().join(FILE), r#"{"version": 2, "claims": {}}"#).unwrap();
        let e = Checkpoint::load(t.path()).unwrap_err().to_string();
        assert!(e.contains("version 2"), "{e}");
        std::fs::write(t.path().join(FILE), "{not json").unwrap();
        assert!(matches!(
            Checkpoint::load(t.path()),
            Err(CheckpointError::Corrupt(..))
        ));
    }

    #[test]
    fn saves_atomically_and_reloads() {
        let t = tempfile::tempdir().unwrap();
        let mut c = Checkpoint::load(t.path()).unwrap();
        c.claims.insert(
            "u1".into(),
            PreparedClaim {
                namespace: "ns".into(),
                name: "c".into(),
                uid: "u1".into(),
                resource_version: Some("7".into()),
                devices: vec![],
                cdi_spec: "/x.json".into(),
                records: vec!["/gpuslice-limits-u1-0".into()],
                slice_dirs: vec![],
                unenforceable: vec![],
            },
        );
        c.save().unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(c.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = Checkpoint::load(t.path()).unwrap();
        assert_eq!(again.claims, c.claims);
        // Nothing but the checkpoint is left in the directory.
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 1);
    }
}
