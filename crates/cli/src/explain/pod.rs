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
use tessera_placement::claims::allocation;
use tessera_placement::preemption::nomination::Nomination;
use tessera_placement::preemption::pod_priority;
use tessera_placement::protocol::{is_bound, is_terminal, object_key};
use tessera_placement::resolve::{Resolution, resolve_claims};
use tessera_placement::{
    Action, ClusterObjects, Placement, PodPlan, PodReason, PodVerdict, Ruling, Settings,
};

use super::claim::{ClaimAccount, accounts, result_line};
use crate::objects::Objects;
use crate::output::OutputFormat;

/// What `-o json` prints for a pod.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct PodReport {
    pod: String,
    /// `Place`, `Release`, `LeaveToScheduler`, `CannotPlace`, `Nothing`, `NotCandidate`,
    /// `WaitingForClaims`, `WaitingForGates`, `WaitingBehindGroup`, `InvalidClaims` or `Preempting`
    /// (the pod fits once pods of lower priority are evicted: the plan, or the nomination that
    /// stands).
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
    /// Other components' scheduling gates that still hold the pod (`WaitingForGates`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    gates: Vec<String>,
    /// The claim kube-scheduler made for the pod's extended resources
    /// (`status.extendedResourceClaimStatus`), as NAMESPACE/NAME: `--claim` explains it.
    #[serde(skip_serializing_if = "Option::is_none")]
    extended_resource_claim: Option<String>,
    /// A gated pod's place in the controller's queue: the gated pods decided before it
    /// (higher priority, or the same priority and created earlier), first in line first.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue: Option<QueueReport>,
    /// A pending pod the controller leaves to kube-scheduler: its unallocated claims as
    /// `--claim` explains them (first fit, as kube-scheduler allocates).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    scheduler_claims: Vec<ClaimAccount>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct QueueReport {
    priority: i32,
    /// 1: first in line.
    position: usize,
    /// Up to [`AHEAD_SHOWN`] of the pods ahead, as `namespace/name (priority p)`.
    ahead: Vec<String>,
}

/// How many pods ahead in line explain names.
const AHEAD_SHOWN: usize = 5;

#[derive(Debug, Serialize)]
struct ClaimReport {
    claim: String,
    allocation: AllocationResult,
}

fn names(claims: &[Arc<ResourceClaim>]) -> Vec<String> {
    claims.iter().map(|c| object_key(&c.metadata)).collect()
}

/// The report of a pod that preempts: the plan made now, or the nomination that stands.
fn preempting_report(mut report: PodReport, verdict: PodVerdict) -> PodReport {
    let PodVerdict::Preempting {
        nomination,
        preemption,
        ..
    } = verdict
    else {
        return report;
    };
    report.action = PodReason::Preempting.as_str();
    report.reason = Some(PodReason::Preempting);
    report.node = Some(nomination.node.clone());
    report.message = Some(match preemption {
        Some(plan) => plan.message,
        None => standing_message(&nomination),
    });
    report
}

/// What a nomination that stands says: the devices, until when, the victims.
fn standing_message(nomination: &Nomination) -> String {
    let victims: Vec<&str> = nomination.victims.iter().map(|v| v.pod.as_str()).collect();
    let devices: Vec<&str> = nomination
        .devices
        .iter()
        .map(|d| d.device.as_str())
        .collect();
    format!(
        "{} of node {} are nominated for it (until {}); preempted for it: {}",
        devices.join(", "),
        nomination.node,
        nomination.expires,
        victims.join(", ")
    )
}

fn report(pod: &str, verdict: PodVerdict) -> PodReport {
    let mut report = PodReport {
        pod: pod.to_owned(),
        ..PodReport::default()
    };
    let decision = match verdict {
        PodVerdict::Decided(PodPlan { action, .. }) => action,
        PodVerdict::NotCandidate(why) => return undecided(report, "NotCandidate", None, why),
        PodVerdict::WaitingForGates { gates, message } => {
            report.gates = gates;
            let reason = PodReason::WaitingForGates;
            return undecided(report, reason.as_str(), Some(reason), message);
        }
        PodVerdict::HeldBack { message, .. } => {
            let reason = PodReason::WaitingBehindGroup;
            return undecided(report, reason.as_str(), Some(reason), message);
        }
        PodVerdict::WaitingForClaims(why) => {
            let action = PodReason::WaitingForClaims.as_str();
            return undecided(report, action, None, why);
        }
        PodVerdict::InvalidClaims(why) => {
            let reason = Some(PodReason::InvalidInput);
            return undecided(report, "InvalidClaims", reason, why);
        }
        preempting @ PodVerdict::Preempting { .. } => return preempting_report(report, preempting),
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

/// `report` for a pod the planner did not decide: why it is left alone or waits.
fn undecided(
    mut report: PodReport,
    action: &'static str,
    reason: Option<PodReason>,
    message: String,
) -> PodReport {
    report.action = action;
    report.reason = reason;
    report.message = Some(message);
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
    report.queue = queue_report(cluster, pod, settings);
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
            write_report(out, &report, settings)?;
            if let Some(queue) = &report.queue {
                write_queue(out, queue)?;
            }
        }
    }
    Ok(())
}

/// A gated pod's place in line.
fn queue_report(cluster: &ClusterObjects, pod: &Pod, settings: &Settings) -> Option<QueueReport> {
    if !tessera_placement::protocol::is_gated(pod, &settings.gate) {
        return None;
    }
    let ahead = cluster.ahead_of(pod, &settings.gate);
    Some(QueueReport {
        priority: pod_priority(pod),
        position: ahead.len() + 1,
        ahead: ahead
            .iter()
            .take(AHEAD_SHOWN)
            .map(|p| format!("{} (priority {})", object_key(&p.metadata), pod_priority(p)))
            .collect(),
    })
}

/// The text report; a preempting pod's in one line.
fn write_report(out: &mut impl Write, r: &PodReport, settings: &Settings) -> anyhow::Result<()> {
    if r.action != PodReason::Preempting.as_str() {
        return write_text(out, r, settings);
    }
    writeln!(
        out,
        "pod {} fits on no free devices but does once pods of lower priority are gone: {}",
        r.pod,
        r.message.as_deref().unwrap_or_default()
    )?;
    Ok(())
}

fn write_queue(out: &mut impl Write, queue: &QueueReport) -> anyhow::Result<()> {
    if queue.position == 1 {
        writeln!(
            out,
            "  queue: first in line (priority {}): no gated pod is decided before it",
            queue.priority
        )?;
        return Ok(());
    }
    let more = queue.position - 1 - queue.ahead.len();
    writeln!(
        out,
        "  queue: position {} (priority {}); decided before it: {}{}",
        queue.position,
        queue.priority,
        queue.ahead.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    )?;
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
        Resolution::Waiting(_) | Resolution::Invalid(_) | Resolution::MissingTemplate { .. } => {
            Ok(Vec::new())
        }
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
        "Place" => write_placement(out, r, settings)?,
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
        action if action == PodReason::WaitingForGates.as_str() => writeln!(
            out,
            "pod {pod} waits for other scheduling gates ({}): {message}",
            r.gates.join(", ")
        )?,
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

/// The text for a pod the controller places: node, claims with their devices, score.
fn write_placement(out: &mut impl Write, r: &PodReport, settings: &Settings) -> anyhow::Result<()> {
    let pod = &r.pod;
    let message = r.message.as_deref().unwrap_or_default();
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
    Ok(())
}
