//! `tessera explain --claim` for an IMEX domain (a claim of class `imex.gpu.tessera.dev`): besides
//! the claim as kube-scheduler sees it, the pods that share it, its channel, every clique's
//! channels in use and by which domains, and — when the controller places its pods — the
//! controller's own word on why they wait (its decision for the first gated pod).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::Timestamp;
use tessera_api::imex::{DAEMON_CONDITION, IMEX_DEVICE_CLASS, clique_of_pool};
use tessera_api::names::DRIVER_NAME;
use tessera_placement::group::GroupOutcome;
use tessera_placement::imex::{channel_clique, holders};
use tessera_placement::protocol::{is_gated, object_key};
use tessera_placement::{Action, ClusterObjects, GroupVerdict, PodVerdict, Ruling, Settings};

/// The pods (in `namespace`) whose `spec.resourceClaims` name claim `name`.
fn sharing_pods<'c>(cluster: &'c ClusterObjects, namespace: &str, name: &str) -> Vec<&'c Pod> {
    cluster
        .pods
        .iter()
        .filter(|p| p.metadata.namespace.as_deref().unwrap_or("default") == namespace)
        .filter(|p| {
            p.spec
                .iter()
                .flat_map(|s| s.resource_claims.iter().flatten())
                .any(|c| c.resource_claim_name.as_deref() == Some(name))
        })
        .collect()
}

/// Per clique: channels published, and the domains holding one.
fn cliques(cluster: &ClusterObjects) -> BTreeMap<String, (usize, Vec<String>)> {
    let mut by_clique: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
    for slice in cluster
        .slices
        .iter()
        .filter(|s| s.spec.driver == DRIVER_NAME)
    {
        if let Some(clique) = clique_of_pool(&slice.spec.pool.name) {
            by_clique.entry(clique.to_owned()).or_default().0 +=
                slice.spec.devices.as_ref().map_or(0, Vec::len);
        }
    }
    for (clique, (_, held)) in &mut by_clique {
        *held = holders(&cluster.claims, clique);
    }
    by_clique
}

/// What the nodes' IMEX daemons say, from the conditions each node writes on the domain's claim
/// (`<node>/IMEXDaemonReady` on the channel's `status.devices` entry): one line per node whose
/// daemon is not ready, with its answer, and one for the nodes whose daemon is.
fn daemon_lines(claim: &ResourceClaim) -> Vec<String> {
    let suffix = format!("/{DAEMON_CONDITION}");
    let mut ready = Vec::new();
    let mut lines = Vec::new();
    let conditions = claim
        .status
        .iter()
        .flat_map(|s| s.devices.iter().flatten())
        .filter(|d| d.driver == DRIVER_NAME)
        .flat_map(|d| d.conditions.iter().flatten());
    for c in conditions {
        let Some(node) = c.type_.strip_suffix(&suffix) else {
            continue;
        };
        if c.status == "True" {
            ready.push(node.to_owned());
        } else {
            lines.push(format!(
                "IMEX daemon not ready on node {node} since {}: {} (its pods there do not start until it is; `kubectl describe pod` on the node's daemon pod shows why)",
                c.last_transition_time.0, c.message
            ));
        }
    }
    if !ready.is_empty() {
        ready.sort();
        lines.insert(
            0,
            format!("IMEX daemon ready on node(s) {}", ready.join(", ")),
        );
    }
    lines
}

/// What the controller says of a pod it decides: placed, or why it waits.
fn ruling_message(ruling: &Ruling) -> Option<String> {
    match ruling {
        Ruling::Group(GroupVerdict::Decided { plan, .. }) => Some(match &plan.outcome {
            GroupOutcome::Place { domain, .. } => format!("places the group in {domain} now"),
            GroupOutcome::Wait { message, .. } => message.clone(),
        }),
        Ruling::Group(
            GroupVerdict::HeldBack { message, .. }
            | GroupVerdict::Preempting { message, .. }
            | GroupVerdict::MissingPodGroup { message, .. },
        )
        | Ruling::Pod(PodVerdict::HeldBack { message, .. })
        | Ruling::Pod(PodVerdict::WaitingForGates { message, .. }) => Some(message.clone()),
        Ruling::Group(GroupVerdict::Invalid(why))
        | Ruling::Pod(
            PodVerdict::WaitingForClaims(why)
            | PodVerdict::InvalidClaims(why)
            | PodVerdict::NotCandidate(why),
        ) => Some(why.clone()),
        Ruling::Pod(PodVerdict::Decided(plan) | PodVerdict::Preempting { plan, .. }) => {
            match &plan.action {
                Action::Place(p) => Some(format!("places the pod on node {} now", p.node)),
                Action::CannotPlace { message, .. } | Action::LeaveToScheduler { message } => {
                    Some(message.clone())
                }
                Action::Release { .. } | Action::Nothing => None,
            }
        }
    }
}

/// The lines `explain --claim` adds for domain `claim` (none for another claim).
pub(super) fn notes(cluster: &ClusterObjects, claim: &ResourceClaim, gate: &str) -> Vec<String> {
    if !tessera_placement::imex::is_domain_claim(claim) {
        return Vec::new();
    }
    let key = object_key(&claim.metadata);
    let (namespace, name) = key.split_once('/').unwrap_or(("default", &key));
    let pods = sharing_pods(cluster, namespace, name);
    let names: Vec<String> = pods
        .iter()
        .map(|p| {
            let gated = if is_gated(p, gate) { " (gated)" } else { "" };
            format!("{}{gated}", object_key(&p.metadata))
        })
        .collect();
    let mut lines = vec![format!(
        "claim {key} is an IMEX domain (class {IMEX_DEVICE_CLASS}): its pods share one channel of one fabric clique; pods: {}",
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    )];
    if let Some(clique) = channel_clique(claim) {
        lines.push(format!("its channel is in clique {clique}"));
    }
    lines.extend(daemon_lines(claim));
    for (clique, (total, held)) in cliques(cluster) {
        let by = if held.is_empty() {
            String::new()
        } else {
            format!(" ({})", held.join(", "))
        };
        lines.push(format!(
            "clique {clique}: {} of {total} channels in use{by}",
            held.len()
        ));
    }
    if let Some(pod) = pods.iter().find(|p| is_gated(p, gate)) {
        let ruling = cluster.decide(pod, &[], &Settings::new(gate), Timestamp::now());
        if let Some(message) = ruling_message(&ruling) {
            lines.push(format!(
                "the controller, deciding pod {}: {message}",
                object_key(&pod.metadata)
            ));
        }
    }
    lines
}
