//! NVLink islands: sets of GPUs of one node that are pairwise NVLink-connected.
//!
//! Two GPUs are *connected* when an active link of either one reaches the other directly (a
//! direct link or an NVLink bridge), or when both have an active link to an NVSwitch: the
//! NVSwitches of a node form one fabric, so every NVSwitch-attached GPU reaches every other.
//!
//! Islands partition the GPUs that have at least one active NVLink. Where the connection graph is
//! not transitive (a ring of bridged cards, say) the partition is built from maximal cliques,
//! chosen deterministically: repeatedly take the largest clique of the GPUs not yet placed, ties
//! broken by the lexicographically smallest sorted list of member UUIDs. A GPU with NVLink whose
//! partners are all taken forms an island of its own.
//!
//! The island id is derived from the sorted member UUIDs only (`nvl-` + 16 hex digits of an
//! FNV-1a 64 hash), so it does not change across restarts or GPU enumeration order, and it is a
//! valid string attribute (20 characters).

use std::collections::BTreeSet;

use crate::model::{Gpu, GpuInventory, LinkPeer};

/// One NVLink island.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvlinkIsland {
    /// Stable id, e.g. `nvl-3f2a9c0d17b4e861`.
    pub id: String,
    /// Member GPU UUIDs, sorted.
    pub members: Vec<String>,
}

impl GpuInventory {
    /// The NVLink islands of this node, ordered by their smallest member UUID.
    pub fn nvlink_islands(&self) -> Vec<NvlinkIsland> {
        let graph = ConnectionGraph::new(self);
        let mut remaining: BTreeSet<usize> = (0..graph.uuids.len())
            .filter(|&v| graph.has_nvlink[v])
            .collect();
        let mut islands = Vec::new();
        while !remaining.is_empty() {
            let clique = graph.best_clique(&remaining);
            for v in &clique {
                remaining.remove(v);
            }
            let mut members: Vec<String> = clique.iter().map(|&v| graph.uuids[v].clone()).collect();
            members.sort();
            islands.push(NvlinkIsland {
                id: island_id(&members),
                members,
            });
        }
        islands.sort_by(|a, b| a.members.cmp(&b.members));
        islands
    }
}

/// The island of the GPU with this UUID among `islands`, if it has NVLink.
pub fn island_of<'a>(islands: &'a [NvlinkIsland], gpu_uuid: &str) -> Option<&'a NvlinkIsland> {
    islands
        .iter()
        .find(|i| i.members.iter().any(|m| m == gpu_uuid))
}

/// The id of an island with these (sorted) member UUIDs.
pub fn island_id(sorted_members: &[String]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, member) in sorted_members.iter().enumerate() {
        if i > 0 {
            hash = fnv1a_step(hash, b',');
        }
        for &b in member.as_bytes() {
            hash = fnv1a_step(hash, b);
        }
    }
    format!("nvl-{hash:016x}")
}

fn fnv1a_step(hash: u64, byte: u8) -> u64 {
    (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
}

/// GPUs as vertices sorted by UUID, with the pairwise NVLink connection relation.
struct ConnectionGraph {
    uuids: Vec<String>,
    has_nvlink: Vec<bool>,
    adjacent: Vec<Vec<bool>>,
}

impl ConnectionGraph {
    fn new(inventory: &GpuInventory) -> Self {
        let mut gpus: Vec<&Gpu> = inventory.gpus.iter().collect();
        gpus.sort_by(|a, b| a.uuid.cmp(&b.uuid));
        let n = gpus.len();
        let position = |uuid: &str| gpus.iter().position(|g| g.uuid == uuid);
        let mut adjacent = vec![vec![false; n]; n];
        let mut on_switch = vec![false; n];
        let mut has_nvlink = vec![false; n];
        for (v, gpu) in gpus.iter().enumerate() {
            for link in gpu.active_nvlinks() {
                has_nvlink[v] = true;
                match inventory.link_peer(link) {
                    LinkPeer::Gpu(peer) => {
                        if let Some(w) = position(&peer.uuid).filter(|&w| w != v) {
                            adjacent[v][w] = true;
                            adjacent[w][v] = true;
                        }
                    }
                    LinkPeer::NvSwitch(_) => on_switch[v] = true,
                    LinkPeer::Other(_) => {}
                }
            }
        }
        for v in 0..n {
            for w in 0..n {
                if v != w && on_switch[v] && on_switch[w] {
                    adjacent[v][w] = true;
                }
            }
        }
        ConnectionGraph {
            uuids: gpus.iter().map(|g| g.uuid.clone()).collect(),
            has_nvlink,
            adjacent,
        }
    }

    /// The largest clique within `candidates`; among equally large ones the lexicographically
    /// smallest vertex list, i.e. the smallest sorted UUID list (vertices are in UUID order).
    fn best_clique(&self, candidates: &BTreeSet<usize>) -> Vec<usize> {
        let mut best = Vec::new();
        let mut current = Vec::new();
        let pool: Vec<usize> = candidates.iter().copied().collect();
        self.extend_clique(&pool, 0, &mut current, &mut best);
        best
    }

    /// Depth-first search over cliques in lexicographic order; a clique replaces `best` only when
    /// strictly larger, so the first maximum found (the lexicographically smallest) is kept.
    fn extend_clique(
        &self,
        pool: &[usize],
        from: usize,
        current: &mut Vec<usize>,
        best: &mut Vec<usize>,
    ) {
        if current.len() > best.len() {
            best.clone_from(current);
        }
        for i in from..pool.len() {
            // Not enough vertices left to beat the best clique found so far.
            if current.len() + (pool.len() - i) <= best.len() {
                return;
            }
            let v = pool[i];
            if current.iter().all(|&u| self.adjacent[u][v]) {
                current.push(v);
                self.extend_clique(pool, i + 1, current, best);
                current.pop();
            }
        }
    }
}
