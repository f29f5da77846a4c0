//! Topology scoring: how well a set of devices on one node can talk to each other, and what an
//! allocation leaves behind for later, larger requests.
//!
//! Everything here reads the *published* device attributes only — `nvlinkIsland`,
//! `nvlinkBandwidthGBps` (in the `gpu.tessera.dev` domain) and the standard
//! `resource.kubernetes.io/pcieRoot` and `resource.kubernetes.io/numaNode` (else the older
//! `gpu.tessera.dev/numaNode` of devices published before the standard name) — because a
//! controller sees nothing but ResourceSlices.
//!
//! # The score
//!
//! A [`TopologyScore`] is compared lexicographically, lower is better:
//!
//! 1. `comm_cost` — the sum over every unordered pair of distinct devices in the allocation of
//!    [`pair_cost`]: both in one NVLink island → `10 × 900 / min(bandwidth GB/s)` clamped to
//!    10‥30 (20 when a bandwidth is not published); else same PCIe root → 40; else same NUMA node
//!    → 60; else (other socket, or unknown) → 100. A single device costs 0.
//! 2. `numa_crossings` — under [`NumaPolicy::Align`] (the default), the NUMA nodes the allocation
//!    spans beyond the first; 0 under [`NumaPolicy::Pack`]. It comes right after communication
//!    cost and ahead of fragmentation: on NVSwitch nodes every GPU pair costs the same, so best
//!    fit alone would fill a fragmented node and split a 4-GPU claim across sockets, while CPU
//!    threads, host memory and NICs sit on one socket. A claim that fits one socket therefore lands
//!    on one NUMA node whenever some eligible node offers such a set; `Pack` keeps the older order
//!    (fragmentation first, alignment only as the last tie-break), for clusters that prefer fewer
//!    partly used nodes.
//! 3. fragmentation, best fit:
//!    `nvlink_stranded` — devices in an NVLink island that the allocation gives no NVLink peer
//!    (a single GPU on an NVSwitch node wastes NVLink a multi-GPU claim could use);
//!    `islands_broken` — NVLink islands that were entirely free before and are not after;
//!    `nodes_broken` — 1 if every device of the node was free before;
//!    `group_leftover` — free devices left in the groups the allocation touches (a group is the
//!    device's NVLink island, else its NUMA node, else the node), so partly used groups fill first;
//!    `node_leftover` — free devices left on the node, so partly used nodes fill first.
//! 4. `numa_nodes_spanned` — distinct NUMA nodes the allocation spans (alignment; the only NUMA
//!    term under `Pack`).

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::Device;
use serde::Serialize;
use tessera_api::names::{DRIVER_NAME, attr};

use crate::attribute::lookup_attribute;

/// NVLink bandwidth (GB/s) at which a pair costs [`NVLINK_BASE_COST`]: NVLink 4 (H100) aggregate.
pub const NVLINK_REFERENCE_GBPS: u64 = 900;
/// Pair cost of two devices in one NVLink island at the reference bandwidth.
pub const NVLINK_BASE_COST: u64 = 10;
/// Highest pair cost of an NVLink pair (slow links), still below [`SAME_PCIE_ROOT_COST`].
pub const NVLINK_MAX_COST: u64 = 30;
/// Pair cost of an NVLink pair whose bandwidth is not published.
pub const NVLINK_UNKNOWN_BANDWIDTH_COST: u64 = 20;
/// Pair cost of two devices behind one PCIe root complex.
pub const SAME_PCIE_ROOT_COST: u64 = 40;
/// Pair cost of two devices on one NUMA node (same socket).
pub const SAME_NUMA_COST: u64 = 60;
/// Pair cost of two devices on different sockets, or whose placement is unknown.
pub const CROSS_SOCKET_COST: u64 = 100;

/// How the score weighs NUMA alignment against fragmentation (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NumaPolicy {
    /// One NUMA node for a claim that fits one, ahead of fragmentation.
    #[default]
    Align,
    /// Fragmentation first (partly used nodes and groups fill first); NUMA only breaks ties.
    Pack,
}

impl fmt::Display for NumaPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NumaPolicy::Align => "align",
            NumaPolicy::Pack => "pack",
        })
    }
}

/// A NUMA policy name that is neither `align` nor `pack`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "NUMA policy `{0}` is not one: expected `align` (one NUMA node for a claim that fits one, the default) or `pack` (fill partly used nodes first)"
)]
pub struct NumaPolicyError(pub String);

impl std::str::FromStr for NumaPolicy {
    type Err = NumaPolicyError;

    fn from_str(s: &str) -> Result<NumaPolicy, NumaPolicyError> {
        match s.trim() {
            "align" => Ok(NumaPolicy::Align),
            "pack" => Ok(NumaPolicy::Pack),
            _ => Err(NumaPolicyError(s.to_owned())),
        }
    }
}

/// The topology attributes of one device, as published.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopologyAttributes {
    /// `gpu.tessera.dev/nvlinkIsland`.
    pub nvlink_island: Option<Arc<str>>,
    /// `gpu.tessera.dev/nvlinkBandwidthGBps`.
    pub nvlink_bandwidth_gbps: Option<i64>,
    /// `resource.kubernetes.io/pcieRoot`.
    pub pcie_root: Option<Arc<str>>,
    /// `resource.kubernetes.io/numaNode` (else the older `gpu.tessera.dev/numaNode`).
    pub numa_node: Option<i64>,
}

impl TopologyAttributes {
    /// Reads the attributes of a device published by `driver`.
    pub fn from_device(driver: &str, device: &Device) -> TopologyAttributes {
        let get = |name: &str| lookup_attribute(driver, device, name);
        let tessera = |id: &str| get(&format!("{DRIVER_NAME}/{id}"));
        TopologyAttributes {
            nvlink_island: tessera(attr::NVLINK_ISLAND)
                .and_then(|a| a.string.as_deref())
                .map(Arc::from),
            nvlink_bandwidth_gbps: tessera(attr::NVLINK_BANDWIDTH_GBPS).and_then(|a| a.int),
            pcie_root: get(attr::PCIE_ROOT)
                .and_then(|a| a.string.as_deref())
                .map(Arc::from),
            numa_node: get(attr::NUMA_NODE)
                .or_else(|| tessera(attr::LEGACY_NUMA_NODE))
                .and_then(|a| a.int),
        }
    }
}

/// The communication cost between two distinct devices of one node (see the module docs).
pub fn pair_cost(a: &TopologyAttributes, b: &TopologyAttributes) -> u64 {
    if let (Some(x), Some(y)) = (&a.nvlink_island, &b.nvlink_island)
        && x == y
    {
        return match (a.nvlink_bandwidth_gbps, b.nvlink_bandwidth_gbps) {
            (Some(x), Some(y)) if x.min(y) > 0 => {
                let bw = u64::try_from(x.min(y)).unwrap_or(1);
                (NVLINK_BASE_COST * NVLINK_REFERENCE_GBPS)
                    .div_ceil(bw)
                    .clamp(NVLINK_BASE_COST, NVLINK_MAX_COST)
            }
            _ => NVLINK_UNKNOWN_BANDWIDTH_COST,
        };
    }
    if let (Some(x), Some(y)) = (&a.pcie_root, &b.pcie_root)
        && x == y
    {
        return SAME_PCIE_ROOT_COST;
    }
    if let (Some(x), Some(y)) = (a.numa_node, b.numa_node)
        && x == y
    {
        return SAME_NUMA_COST;
    }
    CROSS_SOCKET_COST
}

/// The communication cost of a set of devices: the sum of [`pair_cost`] over unordered pairs.
/// Repeated entries (one device shared by two requests) cost nothing between themselves.
pub fn comm_cost<'a>(devices: impl IntoIterator<Item = (usize, &'a TopologyAttributes)>) -> u64 {
    let devices: Vec<_> = devices.into_iter().collect();
    let mut cost = 0;
    for (i, (ia, a)) in devices.iter().enumerate() {
        for (ib, b) in &devices[i + 1..] {
            if ia != ib {
                cost += pair_cost(a, b);
            }
        }
    }
    cost
}

/// How good a placement is, lower is better; compared lexicographically in field order (see the
/// module documentation for each field's definition).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologyScore {
    /// Sum of pair costs of the allocated devices.
    pub comm_cost: u64,
    /// NUMA nodes spanned beyond the first, under [`NumaPolicy::Align`]; 0 under `Pack`.
    pub numa_crossings: u32,
    /// Allocated devices in an NVLink island with no other allocated device in that island.
    pub nvlink_stranded: u32,
    /// NVLink islands that were entirely free before the allocation and are not after it.
    pub islands_broken: u32,
    /// 1 if the node was entirely free before the allocation.
    pub nodes_broken: u32,
    /// Free devices left in the islands / NUMA nodes the allocation touches.
    pub group_leftover: u32,
    /// Free devices left on the node.
    pub node_leftover: u32,
    /// Distinct NUMA nodes the allocation spans.
    pub numa_nodes_spanned: u32,
}

impl TopologyScore {
    /// How well the allocated devices are connected, packing aside (communication cost, NUMA
    /// crossings, devices without an NVLink peer, NUMA nodes spanned), lower is better: what
    /// tells one NVLink island and one NUMA node from a spread, whatever is left free around.
    pub fn connectivity(&self) -> (u64, u32, u32, u32) {
        (
            self.comm_cost,
            self.numa_crossings,
            self.nvlink_stranded,
            self.numa_nodes_spanned,
        )
    }

    fn key(&self) -> (u64, u32, u32, u32, u32, u32, u32, u32) {
        (
            self.comm_cost,
            self.numa_crossings,
            self.nvlink_stranded,
            self.islands_broken,
            self.nodes_broken,
            self.group_leftover,
            self.node_leftover,
            self.numa_nodes_spanned,
        )
    }
}

impl Ord for TopologyScore {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

impl PartialOrd for TopologyScore {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for TopologyScore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "communication cost {}, NUMA crossings {}, devices without NVLink peer {}, NVLink \
             islands broken {}, whole nodes broken {}, free devices left in touched groups {}, \
             free devices left on the node {}, NUMA nodes spanned {}",
            self.comm_cost,
            self.numa_crossings,
            self.nvlink_stranded,
            self.islands_broken,
            self.nodes_broken,
            self.group_leftover,
            self.node_leftover,
            self.numa_nodes_spanned
        )
    }
}

/// The grouping of one node's candidate devices, for the fragmentation terms.
#[derive(Debug, Default)]
pub(crate) struct NodeTopology {
    /// Per candidate: index of its NVLink island in this node, if it has one.
    pub island: Vec<Option<u32>>,
    /// Per candidate: index of its leftover group (island, else NUMA node, else the node).
    pub group: Vec<u32>,
    /// Per candidate: NUMA node.
    pub numa: Vec<Option<i64>>,
    pub island_count: usize,
    pub group_count: usize,
}

impl NodeTopology {
    pub fn new<'a>(attrs: impl Iterator<Item = &'a TopologyAttributes>) -> NodeTopology {
        let mut islands: Vec<Arc<str>> = Vec::new();
        let mut groups: Vec<(u8, String)> = Vec::new();
        let mut topo = NodeTopology::default();
        for a in attrs {
            let island = a.nvlink_island.as_ref().map(|name| {
                let idx = islands.iter().position(|i| i == name).unwrap_or_else(|| {
                    islands.push(name.clone());
                    islands.len() - 1
                });
                u32::try_from(idx).unwrap_or(u32::MAX)
            });
            let key = match (&a.nvlink_island, a.numa_node) {
                (Some(i), _) => (0u8, i.to_string()),
                (None, Some(n)) => (1, n.to_string()),
                (None, None) => (2, String::new()),
            };
            let group = groups.iter().position(|g| *g == key).unwrap_or_else(|| {
                groups.push(key);
                groups.len() - 1
            });
            topo.island.push(island);
            topo.group.push(u32::try_from(group).unwrap_or(u32::MAX));
            topo.numa.push(a.numa_node);
        }
        topo.island_count = islands.len();
        topo.group_count = groups.len();
        topo
    }

    /// Scores taking the candidates `chosen` (positions, may repeat) given which candidates were
    /// free before, with `comm_cost` already computed, weighing NUMA alignment by `numa`.
    pub fn score(
        &self,
        free_before: &[bool],
        chosen: &[usize],
        comm_cost: u64,
        numa: NumaPolicy,
    ) -> TopologyScore {
        let mut taken = vec![false; free_before.len()];
        let mut island_taken = vec![0u32; self.island_count];
        for &c in chosen {
            if !taken[c]
                && let Some(isl) = self.island[c]
            {
                island_taken[isl as usize] += 1;
            }
            taken[c] = true;
        }
        let nvlink_stranded = island_taken.iter().filter(|n| **n == 1).count();
        let free_after = |i: usize| free_before[i] && !taken[i];
        let mut island_free_before = vec![true; self.island_count];
        let mut island_free_after = vec![true; self.island_count];
        let mut group_left = vec![0u32; self.group_count];
        let mut group_touched = vec![false; self.group_count];
        let mut node_left = 0u32;
        for i in 0..free_before.len() {
            if let Some(isl) = self.island[i] {
                island_free_before[isl as usize] &= free_before[i];
                island_free_after[isl as usize] &= free_after(i);
            }
            if free_after(i) {
                group_left[self.group[i] as usize] += 1;
                node_left += 1;
            }
            if taken[i] {
                group_touched[self.group[i] as usize] = true;
            }
        }
        let islands_broken = island_free_before
            .iter()
            .zip(&island_free_after)
            .filter(|(before, after)| **before && !**after)
            .count();
        let mut numas: Vec<i64> = chosen.iter().filter_map(|&c| self.numa[c]).collect();
        numas.sort_unstable();
        numas.dedup();
        let spanned = u32::try_from(numas.len()).unwrap_or(u32::MAX);
        TopologyScore {
            comm_cost,
            numa_crossings: match numa {
                NumaPolicy::Align => spanned.saturating_sub(1),
                NumaPolicy::Pack => 0,
            },
            nvlink_stranded: u32::try_from(nvlink_stranded).unwrap_or(u32::MAX),
            islands_broken: u32::try_from(islands_broken).unwrap_or(u32::MAX),
            nodes_broken: u32::from(!chosen.is_empty() && free_before.iter().all(|f| *f)),
            group_leftover: group_left
                .iter()
                .zip(&group_touched)
                .filter(|(_, t)| **t)
                .map(|(l, _)| *l)
                .sum(),
            node_leftover: node_left,
            numa_nodes_spanned: spanned,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(
        island: Option<&str>,
        bw: Option<i64>,
        root: Option<&str>,
        numa: Option<i64>,
    ) -> TopologyAttributes {
        TopologyAttributes {
            nvlink_island: island.map(Arc::from),
            nvlink_bandwidth_gbps: bw,
            pcie_root: root.map(Arc::from),
            numa_node: numa,
        }
    }

    #[test]
    fn the_numa_node_is_read_from_the_standard_name_else_the_old_one() {
        use std::collections::BTreeMap;

        use k8s_openapi::api::resource::v1::DeviceAttribute;

        let device = |attributes: &[(&str, i64)]| Device {
            name: "gpu-0".to_owned(),
            attributes: Some(
                attributes
                    .iter()
                    .map(|(name, value)| {
                        (
                            (*name).to_owned(),
                            DeviceAttribute {
                                int: Some(*value),
                                ..DeviceAttribute::default()
                            },
                        )
                    })
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Device::default()
        };
        let numa = |d: &Device| TopologyAttributes::from_device(DRIVER_NAME, d).numa_node;
        // What the plugin publishes now: both names; the standard one counts.
        assert_eq!(
            numa(&device(&[
                ("resource.kubernetes.io/numaNode", 1),
                ("numaNode", 7)
            ])),
            Some(1)
        );
        // A device published by an older plugin: only the driver's own name.
        assert_eq!(numa(&device(&[("numaNode", 3)])), Some(3));
        // Another driver's device (a NIC) with the standard name only.
        assert_eq!(
            TopologyAttributes::from_device(
                "nic.example.com",
                &device(&[("resource.kubernetes.io/numaNode", 0)])
            )
            .numa_node,
            Some(0)
        );
        assert_eq!(numa(&device(&[])), None);
    }

    #[test]
    fn pair_costs_order_island_root_numa_socket() {
        let h100 = |root, numa| gpu(Some("i0"), Some(900), Some(root), Some(numa));
        assert_eq!(pair_cost(&h100("r0", 0), &h100("r1", 1)), 10);
        let a100 = gpu(Some("i0"), Some(600), None, None);
        assert_eq!(pair_cost(&a100, &a100.clone()), 15);
        let slow = gpu(Some("i0"), Some(50), None, None);
        assert_eq!(pair_cost(&slow, &slow.clone()), NVLINK_MAX_COST);
        let unknown_bw = gpu(Some("i0"), None, None, None);
        assert_eq!(pair_cost(&unknown_bw, &unknown_bw.clone()), 20);
        let l40s = |root, numa| gpu(None, None, Some(root), Some(numa));
        assert_eq!(
            pair_cost(&l40s("r0", 0), &l40s("r0", 0)),
            SAME_PCIE_ROOT_COST
        );
        assert_eq!(pair_cost(&l40s("r0", 0), &l40s("r1", 0)), SAME_NUMA_COST);
        assert_eq!(pair_cost(&l40s("r0", 0), &l40s("r1", 1)), CROSS_SOCKET_COST);
        assert_eq!(
            pair_cost(&gpu(None, None, None, None), &gpu(None, None, None, None)),
            100
        );
    }

    #[test]
    fn comm_cost_sums_pairs_and_ignores_repeats() {
        let a = gpu(None, None, Some("r0"), Some(0));
        let b = gpu(None, None, Some("r1"), Some(1));
        assert_eq!(comm_cost([(0, &a)]), 0);
        assert_eq!(comm_cost([(0, &a), (0, &a)]), 0);
        assert_eq!(comm_cost([(0, &a), (1, &b), (2, &a)]), 100 + 40 + 100);
    }

    #[test]
    fn fragmentation_prefers_partly_used_groups() {
        // Two islands of two devices; island 0 has one device in use.
        let attrs = [
            gpu(Some("a"), Some(900), None, Some(0)),
            gpu(Some("a"), Some(900), None, Some(0)),
            gpu(Some("b"), Some(900), None, Some(1)),
            gpu(Some("b"), Some(900), None, Some(1)),
        ];
        let topo = NodeTopology::new(attrs.iter());
        let free = [false, true, true, true];
        let in_used_island = topo.score(&free, &[1], 0, NumaPolicy::Align);
        let in_whole_island = topo.score(&free, &[2], 0, NumaPolicy::Align);
        assert_eq!(in_used_island.islands_broken, 0);
        assert_eq!(
            in_used_island.nvlink_stranded, 1,
            "its island peer is not part of the allocation"
        );
        assert_eq!(
            topo.score(&free, &[2, 3], 10, NumaPolicy::Align)
                .nvlink_stranded,
            0
        );
        assert_eq!(in_whole_island.islands_broken, 1);
        assert!(in_used_island < in_whole_island);
        assert_eq!(in_used_island.node_leftover, 2);
        assert_eq!(in_used_island.numa_nodes_spanned, 1);
        let all_free = [true; 4];
        assert_eq!(
            topo.score(&all_free, &[0], 0, NumaPolicy::Align)
                .nodes_broken,
            1
        );
    }

    #[test]
    fn alignment_comes_before_fragmentation_unless_packing() {
        // dgx-h100-like nodes: one NVSwitch island of eight GPUs, four per NUMA node.
        let attrs: Vec<_> = (0..8)
            .map(|i| gpu(Some("i"), Some(900), None, Some(i / 4)))
            .collect();
        let topo = NodeTopology::new(attrs.iter());
        let cost = 60; // six NVLink pairs at 10
        // A fragmented node whose only free four GPUs straddle the sockets (2, 3 | 4, 5) ...
        let mut fragmented = [false; 8];
        fragmented[2..6].fill(true);
        // ... and a free node, where four GPUs of one socket can be had.
        let free = [true; 8];
        for (policy, crossings) in [(NumaPolicy::Align, 1), (NumaPolicy::Pack, 0)] {
            let split = topo.score(&fragmented, &[2, 3, 4, 5], cost, policy);
            let aligned = topo.score(&free, &[0, 1, 2, 3], cost, policy);
            assert_eq!(
                (split.numa_crossings, aligned.numa_crossings),
                (crossings, 0)
            );
            assert_eq!(
                (split.numa_nodes_spanned, aligned.numa_nodes_spanned),
                (2, 1)
            );
            // Best fit alone prefers the fragmented node: it breaks no whole node.
            assert_eq!((split.nodes_broken, aligned.nodes_broken), (0, 1));
            match policy {
                NumaPolicy::Align => assert!(aligned < split, "{aligned} vs {split}"),
                NumaPolicy::Pack => assert!(split < aligned, "{split} vs {aligned}"),
            }
        }
        // Communication cost still comes first.
        let cheaper = topo.score(&fragmented, &[2, 3, 4, 5], cost - 1, NumaPolicy::Align);
        let aligned = topo.score(&free, &[0, 1, 2, 3], cost, NumaPolicy::Align);
        assert!(cheaper < aligned);
        assert_eq!("pack".parse::<NumaPolicy>(), Ok(NumaPolicy::Pack));
        assert_eq!(NumaPolicy::default().to_string(), "align");
        let error = "packed".parse::<NumaPolicy>().unwrap_err().to_string();
        assert!(
            error.contains("`packed`") && error.contains("`align`"),
            "{error}"
        );
    }
}
