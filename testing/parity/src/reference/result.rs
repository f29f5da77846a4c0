//! A found assignment as each claim's `status.allocation`: the devices in the order they were
//! chosen (with the request or `request/subrequest` name, admin access, the request's
//! tolerations, the device's binding conditions, a share ID and the consumed capacity for a
//! share); the configuration (each class's once, for the requests of that class, then the
//! claim's that apply to what was chosen, and a configuration that applies to every request lists
//! none); and where the claim can be used (the node, for node-local devices; else the slices'
//! node selectors together; else anywhere).

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult,
};

use super::request::ClaimPlan;
use super::search::Search;
use super::stop::NodeStop;

/// One allocation per claim.
pub fn allocations(search: &Search<'_, '_>, node: &str) -> Result<Vec<AllocationResult>, NodeStop> {
    search
        .plans
        .iter()
        .enumerate()
        .map(|(c, plan)| {
            let results = search
                .chosen
                .iter()
                .filter(|e| e.claim == c)
                .map(|e| {
                    let alt = &plan.requests[e.request].alternatives[e.alt];
                    let cand = &search.view.candidates[e.cand];
                    DeviceRequestAllocationResult {
                        request: alt.name(),
                        driver: cand.key.driver.clone(),
                        pool: cand.key.pool.clone(),
                        device: cand.key.device.clone(),
                        admin_access: alt.admin.then_some(true),
                        tolerations: (!alt.tolerations.is_empty())
                            .then(|| alt.tolerations.to_vec()),
                        binding_conditions: cand.device.binding_conditions.clone(),
                        binding_failure_conditions: cand.device.binding_failure_conditions.clone(),
                        share_id: e.multi.then(|| format!("share-{c}-{}", e.cand)),
                        consumed_capacity: (!e.consumed.is_empty()).then(|| {
                            e.consumed
                                .iter()
                                .map(|(name, n)| (name.clone(), n.to_quantity()))
                                .collect()
                        }),
                        ..Default::default()
                    }
                })
                .collect();
            let chosen_subs: Vec<String> = plan
                .requests
                .iter()
                .zip(&search.picks[c])
                .map(|(r, &a)| r.alternatives[a].name())
                .collect();
            Ok(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: Some(configuration(plan, &chosen_subs)),
                }),
                node_selector: node_selector(search, c, node)?,
                allocation_timestamp: None,
            })
        })
        .collect()
}

/// `chosen[i]`: the name results of request `i` carry.
fn configuration(plan: &ClaimPlan<'_>, chosen: &[String]) -> Vec<DeviceAllocationConfiguration> {
    let mut out: Vec<DeviceAllocationConfiguration> = Vec::new();
    let mut class_ranges: Vec<(&str, usize, usize)> = Vec::new();
    for (request, name) in plan.requests.iter().zip(chosen) {
        let alt = request
            .alternatives
            .iter()
            .find(|a| a.name() == *name)
            .expect("the chosen alternative");
        let class = alt.class.metadata.name.as_deref().unwrap_or_default();
        if let Some(&(_, from, to)) = class_ranges.iter().find(|(n, _, _)| *n == class) {
            for config in &mut out[from..to] {
                config
                    .requests
                    .get_or_insert_with(Vec::new)
                    .push(name.clone());
            }
            continue;
        }
        let from = out.len();
        let class_configs = alt.class.spec.as_ref().and_then(|s| s.config.as_ref());
        for config in class_configs.into_iter().flatten() {
            out.push(DeviceAllocationConfiguration {
                source: "FromClass".into(),
                requests: Some(vec![name.clone()]),
                opaque: config.opaque.clone(),
            });
        }
        class_ranges.push((class, from, out.len()));
    }
    let claim_configs = plan
        .claim
        .spec
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.config.as_ref());
    for config in claim_configs.into_iter().flatten() {
        let listed = config.requests.as_deref().unwrap_or_default();
        let applies = listed.is_empty()
            || plan
                .requests
                .iter()
                .zip(chosen)
                .any(|(r, name)| listed.iter().any(|l| l == r.name || l == name));
        if applies {
            out.push(DeviceAllocationConfiguration {
                source: "FromClaim".into(),
                requests: config.requests.clone(),
                opaque: config.opaque.clone(),
            });
        }
    }
    for config in &mut out {
        let listed = config.requests.as_deref().unwrap_or_default();
        let every = !listed.is_empty()
            && plan
                .requests
                .iter()
                .zip(chosen)
                .all(|(r, name)| listed.iter().any(|l| l == r.name || l == name));
        if every {
            config.requests = None;
        }
    }
    out
}

/// Where claim `c`'s devices can be used.
fn node_selector(
    search: &Search<'_, '_>,
    c: usize,
    node: &str,
) -> Result<Option<NodeSelector>, NodeStop> {
    let mut fields: Vec<NodeSelectorRequirement> = Vec::new();
    let mut expressions: Vec<NodeSelectorRequirement> = Vec::new();
    for e in search.chosen.iter().filter(|e| e.claim == c) {
        let cand = &search.view.candidates[e.cand];
        let spec = &cand.slice.spec;
        let (name, selector) = if spec.per_device_node_selection == Some(true) {
            (&cand.device.node_name, &cand.device.node_selector)
        } else {
            (&spec.node_name, &spec.node_selector)
        };
        if name.is_some() || cand.device.binds_to_node == Some(true) {
            return Ok(Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec![node.to_owned()]),
                    }]),
                    match_expressions: None,
                }],
            }));
        }
        let Some(selector) = selector else {
            continue;
        };
        match selector.node_selector_terms.as_slice() {
            [] => {}
            [term] => {
                add_new(
                    &mut fields,
                    term.match_fields.as_deref().unwrap_or_default(),
                );
                add_new(
                    &mut expressions,
                    term.match_expressions.as_deref().unwrap_or_default(),
                );
            }
            _ => return Err(NodeStop::Error("node-selector")),
        }
    }
    if fields.is_empty() && expressions.is_empty() {
        return Ok(None);
    }
    Ok(Some(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: (!fields.is_empty()).then_some(fields),
            match_expressions: (!expressions.is_empty()).then_some(expressions),
        }],
    }))
}

/// Appends the requirements not already there (same key, operator and set of values).
fn add_new(to: &mut Vec<NodeSelectorRequirement>, from: &[NodeSelectorRequirement]) {
    let values = |r: &NodeSelectorRequirement| {
        let mut v = r.values.clone().unwrap_or_default();
        v.sort();
        v.dedup();
        v
    };
    for r in from {
        if !to
            .iter()
            .any(|t| t.key == r.key && t.operator == r.operator && values(t) == values(r))
        {
            to.push(r.clone());
        }
    }
}
