//! GetPreferredAllocation: which of the available devices to give.
//!
//! Whole GPUs: greedy growth from `must_include`, each step adding the GPU
//! with the best links to those already chosen (an NVLink peer 100 per
//! link direction, the same NUMA node 10, the same PCIe root complex (bus
//! domain and upper bus nibble) 1); ties go to the lowest index, so the
//! answer is deterministic. Replicas (`pack`): packed, filling the
//! fullest GPU that still has room, or with `spread` onto as many GPUs as
//! possible, emptiest first.
//!
//! This is a preference only: the kubelet may ignore it (it does when the
//! Topology Manager decides, and it always passes `available` minus what
//! it has handed out), and two pods admitted at once each see the same
//! `available`. It cannot guarantee packing; a GPU's role guarantees that
//! no GPU is in two resources.

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

/// Replicas, one at a time: a GPU this allocation already uses while it
/// has room; else, packing, the fullest GPU (fewest free replicas) that
/// still has room for all that is left, or, when none has, the GPU with
/// the most free replicas (the fewest GPUs); spreading, the GPU this
/// allocation uses least, emptiest first. Ties go to the lowest index.
fn pack<'a>(chosen: &mut Vec<&'a Entry>, pool: Vec<&'a Entry>, size: usize, spread: bool) {
    let mut free: BTreeMap<u32, Vec<&'a Entry>> = BTreeMap::new();
    for e in pool {
        free.entry(e.gpu).or_default().push(e);
    }
    while chosen.len() < size {
        let need = size - chosen.len();
        let used = |g: u32| chosen.iter().filter(|c| c.gpu == g).count();
        let room = free.iter().filter(|(_, v)| !v.is_empty());
        let pick = if spread {
            room.min_by_key(|(g, v)| (used(**g), std::cmp::Reverse(v.len()), **g))
        } else if let Some(own) = room.clone().find(|(g, _)| used(**g) > 0) {
            Some(own)
        } else if let Some(fits) = room
            .clone()
            .filter(|(_, v)| v.len() >= need)
            .min_by_key(|(g, v)| (v.len(), **g))
        {
            Some(fits)
        } else {
            room.min_by_key(|(g, v)| (std::cmp::Reverse(v.len()), **g))
        };
        let Some(g) = pick.map(|(g, _)| *g) else {
            break;
        };
        let v = free.get_mut(&g).expect("picked from the map");
        chosen.push(v.remove(0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPU g with `free` of its 4 replicas available: `g::r` for the last ones.
    fn pool(free: &[(u32, usize)]) -> Vec<Entry> {
        free.iter()
            .flat_map(|&(g, n)| {
                (4 - n..4).map(move |r| Entry {
                    id: format!("G{g}::{r}"),
                    gpu: g,
                    mig: None,
                    numa: None,
                })
            })
            .collect()
    }

    fn gpus_of(free: &[(u32, usize)], must: &[&str], size: usize, spread: bool) -> Vec<u32> {
        let p = pool(free);
        let mut chosen: Vec<&Entry> = must
            .iter()
            .map(|m| p.iter().find(|e| e.id == *m).unwrap())
            .collect();
        let rest = p
            .iter()
            .filter(|e| !must.contains(&e.id.as_str()))
            .collect();
        pack(&mut chosen, rest, size, spread);
        chosen.iter().map(|e| e.gpu).collect()
    }

    /// (free replicas per GPU, must_include, size, the GPUs picked in order)
    type Case<'a> = (&'a [(u32, usize)], &'a [&'a str], usize, &'a [u32]);

    fn expect_picks(spread: bool, cases: &[Case]) {
        for &(free, must, size, want) in cases {
            let got = gpus_of(free, must, size, spread);
            assert_eq!(got, want, "{size} of {free:?}, must include {must:?}");
        }
    }

    /// GPU 0 holds one replica already (3 free), GPUs 1 and 2 none.
    const HOST: &[(u32, usize)] = &[(0, 3), (1, 4), (2, 4)];

    #[test]
    fn packing_fills_the_fullest_gpu_that_has_room() {
        let fuller_later: &[(u32, usize)] = &[(0, 4), (1, 1), (2, 2)];
        expect_picks(
            false,
            &[
                (HOST, &[], 1, &[0]),
                (HOST, &[], 3, &[0, 0, 0]),
                // Four do not fit on GPU 0: the fullest that fits them all.
                (HOST, &[], 4, &[1, 1, 1, 1]),
                // Fullest first even at a higher index.
                (fuller_later, &[], 1, &[1]),
                (fuller_later, &[], 2, &[2, 2]),
                // Nothing holds five: the most free first, then the fullest with room.
                (HOST, &[], 5, &[1, 1, 1, 1, 0]),
                // must_include pulls the rest onto its GPU while it has room.
                (HOST, &["G2::0"], 3, &[2, 2, 2]),
            ],
        );
    }

    #[test]
    fn spreading_takes_the_emptiest_gpus_one_each() {
        expect_picks(
            true,
            &[
                (HOST, &[], 1, &[1]),
                (HOST, &[], 3, &[1, 2, 0]),
                (HOST, &[], 4, &[1, 2, 0, 1]),
            ],
        );
    }
}
