//! `tessera explain --pod`: what tessera-controller does with a pod, decided by
//! `tessera_placement` (the controller's own decision) over the objects read from files.

use std::io::Write;
use std::sync::Arc;

use anyhow::bail;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use tessera_allocator::{AllocateOptions, PlacementMode};
use tessera_placement::ClusterObjects;
use tessera_placement::claims::allocation;
use tessera_placement::protocol::{is_bound, is_terminal, object_key};
use tessera_placement::resolve::{Resolution, resolve_claims};
use tessera_placement::{Action, Placement, PodPlan, PodReason, PodVerdict, Ruling, Settings};

use super::claim::{ClaimAccount, accounts, result_line};
use crate::objects::Objects;
use crate::output::OutputFormat;

/// What `-o json` prints for a pod.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct PodReport {
    pod: String,
    /// `Place`, `Release`, `LeaveToScheduler`, `CannotPlace`, `Nothing`, `NotCandidate`,
    /// `WaitingForClaims`, `WaitingBehindGroup` or `InvalidClaims`.
    action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    /// The allocations the controller writes, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    claims: Vec<ClaimReport>,
    /// The controller's own earlier allocations it clears first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    undo: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    score: Option<String>,
    /// The condition's reason when the pod cannot be placed.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<PodReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    /// The claim kube-scheduler made for the pod's extended resources
    /// (`status.extendedResourceClaimStatus`), as NAMESPACE/NAME: `--claim` explains it.
    #[serde(skip_serializing_if = "Option::is_none")]
    extended_resource_claim: Option<String>,
    /// A pending pod the controller leaves to kube-scheduler: its unallocated claims as
    /// `--claim` explains them (first fit, as kube-scheduler allocates).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    scheduler_claims: Vec<ClaimAccount>,
}

#[derive(Debug, Serialize)]
struct ClaimReport {
    claim: String,
    allocation: AllocationResult,
}

fn names(claims: &[Arc<ResourceClaim>]) -> Vec<String> {
    claims.iter().map(|c| object_key(&c.metadata)).collect()
}

fn report(pod: &str, verdict: PodVerdict) -> PodReport {
    let mut report = PodReport {
        pod: pod.to_owned(),
        ..PodReport::default()
    };
    let decision = match verdict {
        PodVerdict::NotCandidate(why) => {
            report.action = "NotCandidate";
            report.message = Some(why);
            return report;
        }
        PodVerdict::HeldBack { message, .. } => {
            report.action = PodReason::WaitingBehindGroup.as_str();
            report.reason = Some(PodReason::WaitingBehindGroup);
            report.message = Some(message);
            return report;
        }
        PodVerdict::WaitingForClaims(why) => {
            report.action = PodReason::WaitingForClaims.as_str();
            report.message = Some(why);
            return report;
        }
        PodVerdict::InvalidClaims(why) => {
            report.action = "InvalidClaims";
            report.reason = Some(PodReason::InvalidInput);
            report.message = Some(why);
            return report;
        }
        PodVerdict::Decided(PodPlan { action, .. }) => action,
    };
    match decision {
        Action::Place(Placement {
            node,
            undo,
            writes,
            score,
            truncated,
        }) => {
            report.action = "Place";
            report.node = Some(node);
            report.undo = names(&undo);
            report.score = Some(score.to_string());
            report.claims = writes
                .into_iter()
                .map(|w| ClaimReport {
                    claim: object_key(&w.claim.metadata),
                    allocation: w.allocation,
                })
                .collect();
            if truncated {
                report.message = Some(
                    "the search stopped at its step budget; a better placement may exist".into(),
                );
            }
        }
        Action::Release { node } => {
            report.action = "Release";
            report.node = node;
        }
        Action::LeaveToScheduler { message } => {
            report.action = "LeaveToScheduler";
            report.message = Some(message);
        }
        Action::CannotPlace {
            failure,
            message,
            undo,
        } => {
            report.action = "CannotPlace";
            report.reason = Some(failure.reason());
            report.message = Some(message);
            report.undo = names(&undo);
        }
        Action::Nothing => report.action = "Nothing",
    }
    report
}

pub fn explain(
    objects: &Objects,
    wanted: &str,
    settings: &Settings,
    output: OutputFormat,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let cluster = &objects.cluster;
    let (namespace, name) = wanted.split_once('/').unwrap_or(("default", wanted));
    let Some(pod) = cluster.pod(namespace, name) else {
        let known: Vec<String> = cluster
            .pods
            .iter()
            .map(|p| object_key(&p.metadata))
            .collect();
        bail!(
            "pod {wanted} is not among the objects (pods found: {}); {}",
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            },
            objects.missing_hint("pod")
        );
    };
    if cluster.nodes.is_empty() {
        bail!(
            "explaining a pod needs the cluster's Nodes (the controller filters them by cordon, \
             selectors, taints and resources): {}",
            if objects.live {
                "the cluster listed none (the CLI needs list on nodes)"
            } else {
                "add them to --objects (kubectl get nodes -o yaml)"
            }
        );
    }
    let verdict = match cluster.decide(pod, &objects.pod_groups, settings, Timestamp::now()) {
        Ruling::Group(verdict) => return super::group::explain(verdict, wanted, output, out),
        Ruling::Pod(verdict) => verdict,
    };
    let mut report = report(wanted, verdict);
    report.extended_resource_claim = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .map(|s| format!("{namespace}/{}", s.resource_claim_name));
    if report.action == "NotCandidate" && is_pending(pod) {
        let claims = unallocated_claims(cluster, pod)?;
        let options = AllocateOptions {
            mode: PlacementMode::FirstFit,
            step_budget: settings.options.step_budget,
            explain: true,
            numa: Default::default(),
        };
        report.scheduler_claims = accounts(cluster, &claims, &options)?;
    }
    match output {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &report)?;
            writeln!(out)?;
        }
        OutputFormat::Text => {
            for skipped in &objects.skipped {
                writeln!(out, "note: skipped {skipped}")?;
            }
            write_text(out, &report, settings)?;
        }
    }
    Ok(())
}

/// Not bound, finished or being deleted: kube-scheduler still has to place it.
fn is_pending(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && !is_bound(pod) && !is_terminal(pod)
}

/// The pod's claims (`namespace/name`) that are not allocated yet.
fn unallocated_claims(cluster: &ClusterObjects, pod: &Pod) -> anyhow::Result<Vec<String>> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let lookup = |name: &str| {
        cluster
            .claims
            .iter()
            .find(|c| {
                c.metadata.namespace.as_deref().unwrap_or("default") == namespace
                    && c.metadata.name.as_deref() == Some(name)
            })
            .map(|c| Arc::new(c.clone()))
    };
    let template_exists = |name: &str| {
        cluster.templates.iter().any(|t| {
            t.metadata.namespace.as_deref().unwrap_or("default") == namespace
                && t.metadata.name.as_deref() == Some(name)
        })
    };
    match resolve_claims(pod, lookup, template_exists) {
        Resolution::Resolved(claims) => Ok(claims
            .iter()
            .filter(|c| allocation(&c.claim).is_none())
            .map(|c| object_key(&c.claim.metadata))
            .collect()),
        Resolution::Waiting(_) | Resolution::Invalid(_) => Ok(Vec::new()),
    }
}

fn write_scheduler_claims(out: &mut impl Write, r: &PodReport) -> anyhow::Result<()> {
    for account in &r.scheduler_claims {
        match &account.allocatable_on {
            Some(node) => writeln!(
                out,
                "  claim {}: kube-scheduler can allocate it (first fit: node {node})",
                account.claim
            )?,
            None => {
                writeln!(
                    out,
                    "  claim {}: cannot be allocated on any node (tessera explain --claim {} explains it):",
                    account.claim, account.claim
                )?;
                for reason in &account.reasons {
                    writeln!(out, "    {reason}")?;
                }
            }
        }
    }
    Ok(())
}

fn write_text(out: &mut impl Write, r: &PodReport, settings: &Settings) -> anyhow::Result<()> {
    let pod = &r.pod;
    let message = r.message.as_deref().unwrap_or_default();
    match r.action {
        "Place" => {
            writeln!(
                out,
                "pod {pod}: the controller places its claims on node {} ({}):",
                r.node.as_deref().unwrap_or_default(),
                settings.options.mode
            )?;
            if !r.undo.is_empty() {
                writeln!(
                    out,
                    "  first clearing its own earlier allocations of {}",
                    r.undo.join(", ")
                )?;
            }
            for claim in &r.claims {
                writeln!(out, "  claim {}:", claim.claim)?;
                let results = claim.allocation.devices.as_ref();
                for result in results
                    .and_then(|d| d.results.as_deref())
                    .unwrap_or_default()
                {
                    writeln!(out, "    {}", result_line(result))?;
                }
            }
            writeln!(out, "  score: {}", r.score.as_deref().unwrap_or_default())?;
            if !message.is_empty() {
                writeln!(out, "  note: {message}")?;
            }
        }
        "Release" => match &r.node {
            Some(node) => writeln!(
                out,
                "pod {pod}: every claim is allocated (node {node}); the controller removes its gate"
            )?,
            None => writeln!(
                out,
                "pod {pod}: every claim is allocated; the controller removes its gate"
            )?,
        },
        "LeaveToScheduler" => writeln!(
            out,
            "pod {pod}: the controller leaves it to kube-scheduler: {message}"
        )?,
        "CannotPlace" | "InvalidClaims" => {
            writeln!(
                out,
                "pod {pod} cannot be placed now ({}): {message}",
                r.reason.map(PodReason::as_str).unwrap_or_default()
            )?;
            if !r.undo.is_empty() {
                writeln!(
                    out,
                    "  the controller clears its own partial allocations of {}",
                    r.undo.join(", ")
                )?;
            }
        }
        action if action == PodReason::WaitingForClaims.as_str() => {
            writeln!(out, "pod {pod} waits for its claims: {message}")?
        }
        "Nothing" => writeln!(
            out,
            "pod {pod}: nothing to do (released, every claim allocated)"
        )?,
        _ => writeln!(out, "{message}")?,
    }
    write_scheduler_claims(out, r)?;
    if let Some(claim) = &r.extended_resource_claim {
        writeln!(
            out,
            "  its extended resources are in claim {claim}, made and allocated by kube-scheduler \
             (tessera explain --claim {claim} explains it)"
        )?;
    }
    Ok(())
}
