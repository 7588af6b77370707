//! GPU selectors (`--gpus`): `3`, `0-3`, `GPU-<uuid>` (unique prefix),
//! `0000:3b:00.0` or `3b:00.0`, `MIG-<uuid>`, `<gpu>:<mig>`, `all`, `none`,
//! in a comma list.

use crate::model::{Gpu, Inventory};
use serde::Serialize;
use thiserror::Error;

/// What a selector resolved to. Both lists are sorted and free of duplicates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Selection {
    /// Indices of whole GPUs.
    pub gpus: Vec<u32>,
    /// `(gpu index, mig index)` of MIG devices whose parent is not selected whole.
    pub migs: Vec<(u32, u32)>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SelectorError {
    #[error(
        "empty GPU selector: use an index (0), a range (0-3), a UUID, a PCI bus id, all or none"
    )]
    Empty,
    #[error("malformed GPU selector item {item:?}: {why}")]
    Malformed { item: String, why: String },
    #[error("no GPU matches {item:?}; this host has: {available}")]
    NotFound { item: String, available: String },
    #[error("{item:?} is ambiguous, it matches {matches}; give more characters")]
    Ambiguous { item: String, matches: String },
}

impl Selection {
    pub fn gpus(indices: impl IntoIterator<Item = u32>) -> Self {
        let mut s = Self {
            gpus: indices.into_iter().collect(),
            migs: vec![],
        };
        s.normalize();
        s
    }

    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty() && self.migs.is_empty()
    }

    /// Resolve `spec` against the inventory.
    pub fn parse(spec: &str, inv: &Inventory) -> Result<Self, SelectorError> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err(SelectorError::Empty);
        }
        let mut sel = Selection::default();
        for item in spec.split(',').map(str::trim) {
            if item.is_empty() {
                return Err(malformed(item, "empty item between commas"));
            }
            resolve_item(item, inv, &mut sel)?;
        }
        sel.normalize();
        Ok(sel)
    }

    fn normalize(&mut self) {
        self.gpus.sort_unstable();
        self.gpus.dedup();
        let whole = self.gpus.clone();
        self.migs.retain(|(g, _)| !whole.contains(g));
        self.migs.sort_unstable();
        self.migs.dedup();
    }

    /// The values of `CUDA_VISIBLE_DEVICES`/`NVIDIA_VISIBLE_DEVICES`: GPU
    /// UUIDs, MIG UUIDs for MIG devices (or `MIG-<gpu uuid>/<gi>/<ci>`, the
    /// form older drivers take, when NVML gave no MIG UUID).
    pub fn visible_devices(&self, inv: &Inventory) -> String {
        let mut out: Vec<String> = Vec::new();
        for gpu in inv.gpus.iter().filter(|g| self.gpus.contains(&g.index)) {
            out.push(gpu.uuid.clone());
        }
        for (g, m) in &self.migs {
            let gpu = &inv.gpus[*g as usize];
            if let Some(mig) = gpu.migs.iter().find(|d| d.index == *m) {
                out.push(mig.uuid.clone().unwrap_or_else(|| {
                    format!(
                        "MIG-{}/{}/{}",
                        gpu.uuid, mig.gpu_instance, mig.compute_instance
                    )
                }));
            }
        }
        out.join(",")
    }
}

fn malformed(item: &str, why: &str) -> SelectorError {
    SelectorError::Malformed {
        item: item.to_string(),
        why: why.to_string(),
    }
}

fn resolve_item(item: &str, inv: &Inventory, sel: &mut Selection) -> Result<(), SelectorError> {
    let lower = item.to_ascii_lowercase();
    match lower.as_str() {
        "all" => {
            sel.gpus.extend(inv.gpus.iter().map(|g| g.index));
            return Ok(());
        }
        "none" => return Ok(()),
        _ => {}
    }
    if lower.starts_with("gpu-") {
        let gpu = unique(
            item,
            inv.gpus
                .iter()
                .filter(|g| g.uuid.to_ascii_lowercase().starts_with(&lower)),
            |g| g.uuid.clone(),
            inv,
        )?;
        sel.gpus.push(gpu.index);
    } else if lower.starts_with("mig-") {
        let found: Vec<(u32, u32, String)> = inv
            .gpus
            .iter()
            .flat_map(|g| g.migs.iter().map(move |m| (g.index, m)))
            .filter_map(|(g, m)| m.uuid.as_ref().map(|u| (g, m.index, u.clone())))
            .filter(|(_, _, u)| u.to_ascii_lowercase().starts_with(&lower))
            .collect();
        match found.as_slice() {
            [(g, m, _)] => sel.migs.push((*g, *m)),
            [] => return Err(not_found(item, inv)),
            many => {
                return Err(SelectorError::Ambiguous {
                    item: item.into(),
                    matches: many
                        .iter()
                        .map(|(_, _, u)| u.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                })
            }
        }
    } else if lower.contains('.') {
        let want = canonical_bus_id(&lower)
            .ok_or_else(|| malformed(item, "a PCI bus id looks like 0000:3b:00.0 or 3b:00.0"))?;
        let gpu = inv
            .gpus
            .iter()
            .find(|g| g.pci_bus_id == want)
            .ok_or_else(|| not_found(item, inv))?;
        sel.gpus.push(gpu.index);
    } else if let Some((g, m)) = lower.split_once(':') {
        let g = index(item, g)?;
        let m = index(item, m)?;
        let gpu = inv
            .gpus
            .get(g as usize)
            .ok_or_else(|| not_found(item, inv))?;
        if !gpu.migs.iter().any(|d| d.index == m) {
            return Err(not_found(item, inv));
        }
        sel.migs.push((g, m));
    } else if let Some((a, b)) = lower.split_once('-') {
        let (a, b) = (index(item, a)?, index(item, b)?);
        if a > b {
            return Err(malformed(item, "a range goes from low to high, like 0-3"));
        }
        for i in a..=b {
            inv.gpus
                .get(i as usize)
                .ok_or_else(|| not_found(item, inv))?;
            sel.gpus.push(i);
        }
    } else {
        let i = index(item, &lower)?;
        inv.gpus
            .get(i as usize)
            .ok_or_else(|| not_found(item, inv))?;
        sel.gpus.push(i);
    }
    Ok(())
}

fn index(item: &str, s: &str) -> Result<u32, SelectorError> {
    s.parse().map_err(|_| {
        malformed(
            item,
            "expected an index (3), a range (0-3), <gpu>:<mig>, GPU-<uuid>, MIG-<uuid>, a PCI bus id, all or none",
        )
    })
}

fn unique<'a>(
    item: &str,
    mut it: impl Iterator<Item = &'a Gpu>,
    name: impl Fn(&Gpu) -> String,
    inv: &Inventory,
) -> Result<&'a Gpu, SelectorError> {
    let first = it.next().ok_or_else(|| not_found(item, inv))?;
    let rest: Vec<&Gpu> = it.collect();
    if rest.is_empty() {
        return Ok(first);
    }
    let matches = std::iter::once(first)
        .chain(rest)
        .map(name)
        .collect::<Vec<_>>()
        .join(", ");
    Err(SelectorError::Ambiguous {
        item: item.into(),
        matches,
    })
}

/// `3b:00.0` → `0000:3b:00.0`; accepts upper case and NVML's 8-digit domain.
pub fn canonical_bus_id(s: &str) -> Option<String> {
    let s = s.trim().to_ascii_lowercase();
    let parts: Vec<&str> = s.split(':').collect();
    let (domain, bus, devfn) = match parts.as_slice() {
        [bus, devfn] => (0u32, *bus, *devfn),
        [dom, bus, devfn] => (u32::from_str_radix(dom, 16).ok()?, *bus, *devfn),
        _ => return None,
    };
    let (dev, func) = devfn.split_once('.')?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let dev = u8::from_str_radix(dev, 16).ok()?;
    let func = u8::from_str_radix(func, 16).ok()?;
    if dev > 0x1f || func > 7 || domain > 0xffff {
        return None;
    }
    Some(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func}"))
}

fn not_found(item: &str, inv: &Inventory) -> SelectorError {
    let mut available: Vec<String> = inv
        .gpus
        .iter()
        .map(|g| format!("{} ({} {})", g.index, g.uuid, g.pci_bus_id))
        .collect();
    for g in &inv.gpus {
        for m in &g.migs {
            available.push(format!(
                "{}:{}{}",
                g.index,
                m.index,
                m.uuid
                    .as_ref()
                    .map(|u| format!(" ({u})"))
                    .unwrap_or_default()
            ));
        }
    }
    SelectorError::NotFound {
        item: item.into(),
        available: if available.is_empty() {
            "no GPUs".into()
        } else {
            available.join(", ")
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MigDevice;

    fn inv() -> Inventory {
        let gpus = (0..4u32)
            .map(|i| Gpu {
                index: i,
                minor: i,
                uuid: format!(
                    "GPU-{}a{i}00000-0000-4000-8000-00000000000{i}",
                    if i == 3 { "b" } else { "a" }
                ),
                pci_bus_id: format!("0000:{:02x}:00.0", 0x18 + i * 0x10),
                migs: if i == 2 {
                    vec![MigDevice {
                        index: 0,
                        uuid: Some("MIG-1111-2222".into()),
                        ..Default::default()
                    }]
                } else {
                    vec![]
                },
                ..Default::default()
            })
            .collect();
        Inventory {
            gpus,
            ..Default::default()
        }
    }

    fn p(s: &str) -> Result<Selection, SelectorError> {
        Selection::parse(s, &inv())
    }

    #[test]
    fn indices_ranges_all_none() {
        assert_eq!(p("3").unwrap().gpus, vec![3]);
        assert_eq!(p("0-2").unwrap().gpus, vec![0, 1, 2]);
        assert_eq!(p("2,0,2").unwrap().gpus, vec![0, 2]);
        assert_eq!(p("all").unwrap().gpus, vec![0, 1, 2, 3]);
        assert!(p("none").unwrap().is_empty());
        assert!(p("NONE").unwrap().is_empty());
    }

    #[test]
    fn uuid_prefix_bus_id_and_mig() {
        assert_eq!(p("GPU-aa1").unwrap().gpus, vec![1]);
        assert_eq!(p("gpu-b").unwrap().gpus, vec![3]);
        assert_eq!(p("0000:28:00.0").unwrap().gpus, vec![1]);
        assert_eq!(p("38:00.0").unwrap().gpus, vec![2]);
        assert_eq!(p("MIG-1111").unwrap().migs, vec![(2, 0)]);
        assert_eq!(p("2:0").unwrap().migs, vec![(2, 0)]);
        // A MIG of a GPU selected whole is folded into the GPU.
        let s = p("2,2:0").unwrap();
        assert_eq!((s.gpus, s.migs), (vec![2], vec![]));
    }

    #[test]
    fn errors_name_the_item_and_list_what_exists() {
        let e = p("7").unwrap_err().to_string();
        assert!(
            e.contains("\"7\"") && e.contains("0 (GPU-aa0") && e.contains("2:0 (MIG-1111-2222)"),
            "{e}"
        );
        assert!(matches!(p("GPU-a"), Err(SelectorError::Ambiguous { .. })));
        assert!(matches!(p("x"), Err(SelectorError::Malformed { .. })));
        assert!(matches!(p("3-1"), Err(SelectorError::Malformed { .. })));
        assert!(matches!(p("1,,2"), Err(SelectorError::Malformed { .. })));
        assert!(matches!(p(""), Err(SelectorError::Empty)));
        assert!(matches!(p("zz:00.0"), Err(SelectorError::Malformed { .. })));
        assert!(matches!(p("1:0"), Err(SelectorError::NotFound { .. })));
        assert!(!e.contains('\n'));
    }

    #[test]
    fn canonical_bus_ids() {
        assert_eq!(canonical_bus_id("3B:00.0").as_deref(), Some("0000:3b:00.0"));
        assert_eq!(
            canonical_bus_id("00000000:3b:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(canonical_bus_id("3b:20.0"), None);
        assert_eq!(canonical_bus_id("nope"), None);
    }

    #[test]
    fn visible_devices_lists_uuids() {
        let i = inv();
        assert_eq!(
            p("1,2:0").unwrap().visible_devices(&i),
            format!("{},MIG-1111-2222", i.gpus[1].uuid)
        );
    }
}
