//! GetPreferredAllocation: which of the available devices to give.
//!
//! Whole GPUs: greedy growth from `must_include`, each step adding the GPU
//! with the best links to those already chosen (an NVLink peer 100 per
//! link direction, the same NUMA node 10, the same PCIe root complex (bus
//! domain and upper bus nibble) 1); ties go to the lowest index, so the
//! answer is deterministic. Replicas: packed onto the fewest GPUs (the GPUs
//! already used first, then the GPU with the most free replicas), or with
//! `spread` onto as many GPUs as possible.

use super::resources::{BadRequest, Entry, Kind, Resource};
use gpuslice_core::{Gpu, Inventory};
use std::collections::{BTreeMap, HashSet};

pub fn preferred(
    inv: &Inventory,
    res: &Resource,
    available: &[String],
    must: &[String],
    size: usize,
    spread: bool,
) -> Result<Vec<String>, BadRequest> {
    let lookup = |id: &String| {
        res.entry(id)
            .ok_or_else(|| BadRequest(format!("{}: unknown device ID {id:?}", res.name)))
    };
    let avail: Vec<&Entry> = available.iter().map(lookup).collect::<Result<_, _>>()?;
    let mut chosen: Vec<&Entry> = must.iter().map(lookup).collect::<Result<_, _>>()?;
    let mut seen = HashSet::new();
    chosen.retain(|e| seen.insert(e.id.clone()));
    if chosen.len() > size {
        return Err(BadRequest(format!(
            "{}: {} must-include devices for an allocation of {size}",
            res.name,
            chosen.len()
        )));
    }
    let mut pool: Vec<&Entry> = avail
        .into_iter()
        .filter(|e| !seen.contains(&e.id))
        .collect();
    pool.dedup_by(|a, b| a.id == b.id);
    if chosen.len() + pool.len() < size {
        return Err(BadRequest(format!(
            "{}: {size} devices asked for, {} available",
            res.name,
            chosen.len() + pool.len()
        )));
    }
    match res.kind {
        Kind::Shared { .. } => pack(&mut chosen, pool, size, spread),
        _ => topology(inv, &mut chosen, pool, size),
    }
    Ok(chosen.into_iter().map(|e| e.id.clone()).collect())
}

fn gpu_of(inv: &Inventory, i: u32) -> Option<&Gpu> {
    inv.gpus.iter().find(|g| g.index == i)
}

/// Link score of two GPUs.
fn pair_score(a: Option<&Gpu>, b: Option<&Gpu>) -> i64 {
    let (Some(a), Some(b)) = (a, b) else { return 0 };
    if a.index == b.index {
        return 1000; // two MIG devices of one GPU
    }
    let mut s = 0;
    s += 100
        * a.nvlink_peers
            .iter()
            .filter(|p| **p == b.pci_bus_id || **p == b.uuid)
            .count() as i64;
    s += 100
        * b.nvlink_peers
            .iter()
            .filter(|p| **p == a.pci_bus_id || **p == a.uuid)
            .count() as i64;
    if a.numa_node.is_some() && a.numa_node == b.numa_node {
        s += 10;
    }
    let root = |g: &Gpu| g.pci_bus_id.get(..6).map(str::to_string);
    if root(a).is_some() && root(a) == root(b) {
        s += 1;
    }
    s
}

fn topology<'a>(
    inv: &Inventory,
    chosen: &mut Vec<&'a Entry>,
    mut pool: Vec<&'a Entry>,
    size: usize,
) {
    pool.sort_by_key(|e| (e.gpu, e.mig));
    while chosen.len() < size && !pool.is_empty() {
        let best = pool
            .iter()
            .enumerate()
            .max_by_key(|(i, e)| {
                let s: i64 = chosen
                    .iter()
                    .map(|c| pair_score(gpu_of(inv, c.gpu), gpu_of(inv, e.gpu)))
                    .sum();
                // With nothing chosen yet, prefer a GPU with many good
                // partners among the pool (the start of a well-linked set).
                let potential: i64 = if chosen.is_empty() {
                    pool.iter()
                        .map(|o| pair_score(gpu_of(inv, o.gpu), gpu_of(inv, e.gpu)))
                        .sum()
                } else {
                    0
                };
                (s, potential, -(*i as i64))
            })
            .map(|(i, _)| i)
            .unwrap_or(0);
        chosen.push(pool.remove(best));
    }
}

fn pack<'a>(chosen: &mut Vec<&'a Entry>, pool: Vec<&'a Entry>, size: usize, spread: bool) {
    let mut free: BTreeMap<u32, Vec<&'a Entry>> = BTreeMap::new();
    for e in pool {
        free.entry(e.gpu).or_default().push(e);
    }
    while chosen.len() < size {
        let used = |g: u32| chosen.iter().filter(|c| c.gpu == g).count();
        let pick = free
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .max_by_key(|(g, v)| {
                let u = used(**g) as i64;
                let key = if spread { -u } else { u };
                (key, v.len() as i64, -(**g as i64))
            })
            .map(|(g, _)| *g);
        let Some(g) = pick else { break };
        let v = free.get_mut(&g).expect("picked from the map");
        chosen.push(v.remove(0));
    }
}
