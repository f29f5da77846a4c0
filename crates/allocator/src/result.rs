//! Turning a [`Solution`] into `ResourceClaim.status.allocation` objects: device results, the
//! configuration (class configs first, then claim configs), and the node selector.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, ResourceClaim,
};

use crate::cluster::Cluster;
use crate::error::AllocateError;
use crate::node::NODE_NAME_FIELD;
use crate::pools::NodePools;
use crate::request::{ClaimPlan, Plan, Slot};
use crate::search::{Pick, Solution};

/// The allocation results for every claim of a solution, in claim order.
pub(crate) fn allocation_results(
    inv: &Cluster,
    np: &NodePools,
    plan: &Plan<'_>,
    solution: &Solution,
) -> Result<Vec<AllocationResult>, AllocateError> {
    plan.claims
        .iter()
        .enumerate()
        .map(|(ci, claim)| {
            let picks = &solution.picks[ci];
            let results = picks
                .iter()
                .enumerate()
                .map(|(i, pick)| device_result(inv, np, plan, claim.claim, i, pick))
                .collect();
            let config = configs(inv, plan, claim, &solution.selected[ci]);
            Ok(AllocationResult {
                allocation_timestamp: None,
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: (!config.is_empty()).then_some(config),
                }),
                node_selector: node_selector(inv, np, picks)?,
            })
        })
        .collect()
}

fn device_result(
    inv: &Cluster,
    np: &NodePools,
    plan: &Plan<'_>,
    claim: &ResourceClaim,
    index: usize,
    pick: &Pick,
) -> DeviceRequestAllocationResult {
    let dev = &inv.devices[np.candidates[pick.pos]];
    let slot = &plan.slots[pick.slot];
    DeviceRequestAllocationResult {
        request: slot.full_name.clone(),
        driver: dev.id.driver().to_owned(),
        pool: dev.id.pool().to_owned(),
        device: dev.id.device().to_owned(),
        admin_access: slot.admin_access.then_some(true),
        tolerations: (!slot.tolerations.is_empty()).then(|| slot.tolerations.clone()),
        share_id: pick
            .shared
            .as_ref()
            .map(|_| share_id(claim, index, &dev.id.to_string())),
        consumed_capacity: pick.shared.as_ref().filter(|c| !c.is_empty()).map(|c| {
            c.iter()
                .map(|(name, _, q)| (name.clone(), q.clone()))
                .collect::<BTreeMap<_, _>>()
        }),
        binding_conditions: dev.device.binding_conditions.clone(),
        binding_failure_conditions: dev.device.binding_failure_conditions.clone(),
        skip_node_operations: None,
    }
}

/// A share id unique per (claim, result, device), derived deterministically so that the same
/// input always yields the same allocation. Formatted as a UUID (version 8, "custom").
pub(crate) fn share_id(claim: &ResourceClaim, index: usize, device: &str) -> String {
    let identity = match &claim.metadata.uid {
        Some(uid) if !uid.is_empty() => uid.clone(),
        _ => crate::request::claim_name(claim),
    };
    let text = format!("{identity}\u{0}{index}\u{0}{device}");
    let hi = fnv1a(text.as_bytes(), 0xcbf2_9ce4_8422_2325);
    let lo = fnv1a(text.as_bytes(), 0x6c62_272e_07bb_0142);
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&hi.to_be_bytes());
    bytes[8..].copy_from_slice(&lo.to_be_bytes());
    uuid::Builder::from_custom_bytes(bytes)
        .into_uuid()
        .to_string()
}

fn fnv1a(bytes: &[u8], seed: u64) -> u64 {
    bytes.iter().fold(seed, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Class configs (once per class, listing the requests that use it), then claim configs that
/// apply to an allocated request or subrequest; a config covering every request lists none.
fn configs(
    inv: &Cluster,
    plan: &Plan<'_>,
    claim: &ClaimPlan<'_>,
    selected: &[usize],
) -> Vec<DeviceAllocationConfiguration> {
    let chosen_slot = |ri: usize| &plan.slots[claim.requests[ri].slots[selected[ri]]];
    let covers = |requests: &[String], ri: usize| {
        requests.contains(&claim.requests[ri].name)
            || (claim.requests[ri].first_available && requests.contains(&chosen_slot(ri).full_name))
    };
    let mut out = class_configs(inv, (0..claim.requests.len()).map(chosen_slot));
    let claim_configs = claim
        .claim
        .spec
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.config.as_deref())
        .unwrap_or_default();
    for config in claim_configs {
        let requests = config.requests.as_deref().unwrap_or_default();
        if requests.is_empty() || (0..claim.requests.len()).any(|ri| covers(requests, ri)) {
            out.push(DeviceAllocationConfiguration {
                source: "FromClaim".into(),
                requests: config.requests.clone().filter(|r| !r.is_empty()),
                opaque: config.opaque.clone(),
            });
        }
    }
    for config in &mut out {
        if config
            .requests
            .as_deref()
            .is_some_and(|requests| (0..claim.requests.len()).all(|ri| covers(requests, ri)))
        {
            config.requests = None;
        }
    }
    out
}

/// The configs of the classes of the chosen slots, each class once, listing its requests.
fn class_configs<'p>(
    inv: &Cluster,
    slots: impl Iterator<Item = &'p Slot>,
) -> Vec<DeviceAllocationConfiguration> {
    let mut out: Vec<DeviceAllocationConfiguration> = Vec::new();
    let mut class_ranges: HashMap<&str, (usize, usize)> = HashMap::new();
    for slot in slots {
        if let Some(&(start, end)) = class_ranges.get(slot.class.as_str()) {
            for config in &mut out[start..end] {
                config
                    .requests
                    .get_or_insert_with(Vec::new)
                    .push(slot.full_name.clone());
            }
            continue;
        }
        let start = out.len();
        let class = &inv.classes[&slot.class].class;
        for config in class.spec.iter().flat_map(|s| s.config.iter().flatten()) {
            out.push(DeviceAllocationConfiguration {
                source: "FromClass".into(),
                requests: Some(vec![slot.full_name.clone()]),
                opaque: config.opaque.clone(),
            });
        }
        class_ranges.insert(slot.class.as_str(), (start, out.len()));
    }
    out
}

/// `createNodeSelector` upstream: any node-local or node-binding device pins the allocation to the
/// node; otherwise the union of the devices' slice (or per-device) node selectors; none for
/// devices available everywhere.
fn node_selector(
    inv: &Cluster,
    np: &NodePools,
    picks: &[Pick],
) -> Result<Option<NodeSelector>, AllocateError> {
    let mut fields: Vec<NodeSelectorRequirement> = Vec::new();
    let mut expressions: Vec<NodeSelectorRequirement> = Vec::new();
    for pick in picks {
        let dev = &inv.devices[np.candidates[pick.pos]];
        let slice = &inv.slices[dev.slice];
        let (node_name, selector) = if slice.per_device_node_selection {
            (
                dev.device.node_name.as_deref().filter(|n| !n.is_empty()),
                dev.device.node_selector.as_ref(),
            )
        } else {
            (slice.node_name.as_deref(), slice.node_selector.as_ref())
        };
        if node_name.is_some() || dev.binds_to_node() {
            return Ok(Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: None,
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: NODE_NAME_FIELD.into(),
                        operator: "In".into(),
                        values: Some(vec![np.node.name.clone()]),
                    }]),
                }],
            }));
        }
        let Some(selector) = selector else { continue };
        match selector.node_selector_terms.as_slice() {
            [] => {}
            [term] => {
                merge(
                    &mut fields,
                    term.match_fields.as_deref().unwrap_or_default(),
                );
                merge(
                    &mut expressions,
                    term.match_expressions.as_deref().unwrap_or_default(),
                );
            }
            terms => {
                return Err(AllocateError::UnsupportedNodeSelector {
                    slice: slice.name.clone(),
                    terms: terms.len(),
                });
            }
        }
    }
    if fields.is_empty() && expressions.is_empty() {
        return Ok(None);
    }
    Ok(Some(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: (!expressions.is_empty()).then_some(expressions),
            match_fields: (!fields.is_empty()).then_some(fields),
        }],
    }))
}

fn merge(into: &mut Vec<NodeSelectorRequirement>, from: &[NodeSelectorRequirement]) {
    let same = |a: &NodeSelectorRequirement, b: &NodeSelectorRequirement| {
        let set = |r: &NodeSelectorRequirement| {
            let mut v = r.values.clone().unwrap_or_default();
            v.sort();
            v.dedup();
            v
        };
        a.key == b.key && a.operator == b.operator && set(a) == set(b)
    };
    for r in from {
        if !into.iter().any(|x| same(x, r)) {
            into.push(r.clone());
        }
    }
}
