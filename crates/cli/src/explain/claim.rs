//! `tessera explain --claim`: a claim as written, as kube-scheduler's allocator sees it, device by
//! device.

use std::io::Write;

use anyhow::bail;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::Serialize;
use tessera_allocator::{
    AllocateOptions, AllocatedState, Allocation, DeviceIndex, Outcome, PlacementMode,
    Unsatisfiable, claim_name,
};
use tessera_placement::ClusterObjects;
use tessera_placement::extended::extended_resource_claim_owner;

use crate::objects::Objects;
use crate::output::OutputFormat;

/// What `-o json` prints.
#[derive(Debug, Serialize)]
struct JsonReport<'a> {
    node: Option<&'a str>,
    allocation: Option<&'a k8s_openapi::api::resource::v1::AllocationResult>,
    unsatisfiable: Vec<JsonNode>,
}

#[derive(Debug, Serialize)]
struct JsonNode {
    node: String,
    reasons: Vec<String>,
}

fn qualified(claim: &ResourceClaim) -> String {
    let name = claim_name(claim);
    if name.contains('/') {
        name
    } else {
        format!("default/{name}")
    }
}

/// Explains claim `wanted` of `objects`: allocated as written with `options`, on `node` or on the
/// node the mode picks, the other claims' allocations counting as in use.
pub(super) fn explain(
    objects: Objects,
    wanted: &str,
    options: &AllocateOptions,
    node: Option<&str>,
    gate: &str,
    format: OutputFormat,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let hint = objects.missing_hint("claim");
    let cluster = objects.cluster;
    let Some(target) = cluster.claims.iter().find(|c| qualified(c) == wanted) else {
        let known: Vec<String> = cluster.claims.iter().map(qualified).collect();
        bail!(
            "claim {wanted} is not among the objects (claims found: {}); {}",
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            },
            hint
        );
    };
    let domain_notes = super::domain::notes(&cluster, target, gate);
    let mut target = target.clone();
    let previous = target.status.as_mut().and_then(|s| s.allocation.take());
    let state =
        AllocatedState::from_claims(cluster.claims.iter().filter(|c| qualified(c) != wanted))?;
    let inventory = DeviceIndex::from_nodes(cluster.slices, cluster.classes, &cluster.nodes);
    let outcome = inventory.allocate(std::slice::from_ref(&target), &state, node, options)?;
    match format {
        OutputFormat::Json => write_json(out, &outcome),
        OutputFormat::Text => {
            if let Some(pod) = extended_resource_claim_owner(&target) {
                writeln!(
                    out,
                    "note: claim {wanted} is the one kube-scheduler made for the extended resources of pod {pod} \
                     (its requests are the pod's containers' resources, its class the one naming each resource)"
                )?;
            }
            if previous.is_some() {
                writeln!(
                    out,
                    "note: claim {wanted} is already allocated; explaining a fresh allocation"
                )?;
            }
            for skipped in &objects.skipped {
                writeln!(out, "note: skipped {skipped}")?;
            }
            for line in &domain_notes {
                writeln!(out, "note: {line}")?;
            }
            match &outcome {
                Outcome::Allocated(a) => write_allocation(out, wanted, options.mode, a),
                Outcome::Unsatisfiable(u) => write_unsatisfiable(out, wanted, options.mode, u),
            }
        }
    }
}

fn write_json(out: &mut impl Write, outcome: &Outcome) -> anyhow::Result<()> {
    let report = match outcome {
        Outcome::Allocated(a) => JsonReport {
            node: Some(&a.node),
            allocation: Some(&a.claims[0].result),
            unsatisfiable: Vec::new(),
        },
        Outcome::Unsatisfiable(u) => JsonReport {
            node: None,
            allocation: None,
            unsatisfiable: u
                .nodes
                .iter()
                .map(|n| JsonNode {
                    node: n.node.clone(),
                    reasons: n.reason_lines(),
                })
                .collect(),
        },
    };
    serde_json::to_writer_pretty(&mut *out, &report)?;
    writeln!(out)?;
    Ok(())
}

fn write_allocation(
    out: &mut impl Write,
    claim: &str,
    mode: PlacementMode,
    a: &Allocation,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "claim {claim} can be allocated on node {} ({mode}):",
        a.node
    )?;
    let result = &a.claims[0].result;
    let devices = result.devices.as_ref();
    for r in devices
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default()
    {
        writeln!(out, "  {}", result_line(r))?;
    }
    for c in devices
        .and_then(|d| d.config.as_deref())
        .unwrap_or_default()
    {
        let requests = c
            .requests
            .as_deref()
            .map(|r| r.join(", "))
            .unwrap_or_else(|| "all requests".into());
        let driver = c.opaque.as_ref().map(|o| o.driver.as_str()).unwrap_or("?");
        writeln!(
            out,
            "  config {} for {requests} (driver {driver})",
            c.source
        )?;
    }
    writeln!(out, "  score: {}", a.score)?;
    if a.truncated {
        writeln!(
            out,
            "  note: the search stopped at its step budget; a better placement may exist"
        )?;
    }
    Ok(())
}

fn write_unsatisfiable(
    out: &mut impl Write,
    claim: &str,
    mode: PlacementMode,
    u: &Unsatisfiable,
) -> anyhow::Result<()> {
    writeln!(out, "claim {claim} cannot be allocated ({mode}):")?;
    write!(out, "{u}")?;
    Ok(())
}

pub(crate) fn result_line(
    r: &k8s_openapi::api::resource::v1::DeviceRequestAllocationResult,
) -> String {
    let mut extras = Vec::new();
    if r.admin_access == Some(true) {
        extras.push("admin access".to_owned());
    }
    if let Some(share) = &r.share_id {
        extras.push(format!("share {share}"));
    }
    for (name, q) in r.consumed_capacity.iter().flatten() {
        extras.push(format!("{name}={}", q.0));
    }
    let extras = if extras.is_empty() {
        String::new()
    } else {
        format!(" ({})", extras.join(", "))
    };
    format!(
        "request {} -> {}/{}/{}{extras}",
        r.request, r.driver, r.pool, r.device
    )
}

/// One claim of a pod as `--claim` explains it: where it can be allocated, or why not on each
/// node.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ClaimAccount {
    pub claim: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocatable_on: Option<String>,
    /// Why not, node by node (`NODE: reason`), when it cannot be allocated.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

/// Accounts for `claims` (keys `namespace/name` of `cluster`'s claims), each allocated alone
/// with `options`, the other claims' allocations counting as in use.
pub(super) fn accounts(
    cluster: &ClusterObjects,
    claims: &[String],
    options: &AllocateOptions,
) -> anyhow::Result<Vec<ClaimAccount>> {
    let inventory = DeviceIndex::from_nodes(
        cluster.slices.clone(),
        cluster.classes.clone(),
        &cluster.nodes,
    );
    let mut accounts = Vec::new();
    for wanted in claims {
        let Some(target) = cluster.claims.iter().find(|c| qualified(c) == *wanted) else {
            continue;
        };
        let state =
            AllocatedState::from_claims(cluster.claims.iter().filter(|c| qualified(c) != *wanted))?;
        let outcome = inventory.allocate(std::slice::from_ref(target), &state, None, options)?;
        accounts.push(match outcome {
            Outcome::Allocated(a) => ClaimAccount {
                claim: wanted.clone(),
                allocatable_on: Some(a.node.clone()),
                reasons: Vec::new(),
            },
            Outcome::Unsatisfiable(u) => ClaimAccount {
                claim: wanted.clone(),
                allocatable_on: None,
                reasons: match &u.claim_problem {
                    Some(problem) => vec![problem.to_string()],
                    None => u
                        .nodes
                        .iter()
                        .flat_map(|n| {
                            n.reason_lines()
                                .into_iter()
                                .map(move |line| format!("{}: {line}", n.node))
                        })
                        .collect(),
                },
            },
        });
    }
    Ok(accounts)
}
