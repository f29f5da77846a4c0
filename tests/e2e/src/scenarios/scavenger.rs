//! `scavenger`: deploy/examples/scavenger — preemptible batch pods (priority -10,
//! `preemptionPolicy: Never`) fill every free topology-managed GPU, one each; then a production
//! pod of priority 1000 asks for four GPUs (production/train.yaml). The controller evicts batch
//! pods for it through the Eviction API — each victim gets a `Preempted` event naming the
//! production pod — and places it on four GPUs of one NVLink island and NUMA node once their
//! claims are released. The Deployment's replacements wait, gated, and come back when the
//! production pod is deleted.

use std::collections::BTreeSet;

use anyhow::{Context, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tessera_api::names::{TOPOLOGY_AWARE_GATE, TOPOLOGY_MANAGED_TAINT};

use super::outcome::ScenarioOutcome;
use crate::context::Ctx;
use crate::manifest::Manifest;
use crate::steps::{pod_events, wait_allocated, wait_running};
use crate::wait::{Progress, until};

const EXAMPLE: &str = "scavenger";
const NAMESPACE: &str = "tessera-example-scavenger";
const PRODUCTION: &str = "train";
const BATCH_SELECTOR: &str = "app=scavenger-batch";
/// The controller's pod condition.
const CONDITION: &str = "gpu.tessera.dev/TopologyAwarePlacement";

pub async fn scavenger(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    if ctx.managed_nodes().await?.is_empty() {
        return Ok(ScenarioOutcome::Skipped(
            "no node is labelled gpu.tessera.dev/topology-managed=true".to_owned(),
        ));
    }
    let published = ctx.published().await?;
    let managed_gpus = published
        .nodes()
        .iter()
        .flat_map(|node| published.on_node(node))
        .filter(|d| d.is_whole_gpu() && d.has_taint(TOPOLOGY_MANAGED_TAINT))
        .count();
    ensure!(
        managed_gpus >= 4,
        "the managed nodes publish {managed_gpus} whole GPUs; the scenario needs four"
    );
    ctx.fresh_namespace(NAMESPACE).await?;
    let dir = ctx.examples_dir.join(EXAMPLE);
    Manifest::read_dir(&dir)?.apply(&ctx.client).await?;
    scale_batch(ctx, managed_gpus).await?;
    let before = wait_batch_settled(ctx, managed_gpus).await?;
    ctx.say(format!(
        "batch: {before} of {managed_gpus} pods Running on managed GPUs"
    ));
    ensure!(
        before >= 4,
        "only {before} batch pods run: fewer than four managed GPUs were free"
    );

    Manifest::read_dir(&dir.join("production"))?
        .apply(&ctx.client)
        .await?;
    let claims = wait_allocated(ctx, NAMESPACE, PRODUCTION).await?;
    let claim = claims.first().context("the production pod has no claim")?;
    let devices = claim.devices(&published)?;
    ensure!(devices.len() == 4, "{} devices, expected 4", devices.len());
    let islands: BTreeSet<Option<&str>> = devices.iter().map(|d| d.island()).collect();
    let numa: BTreeSet<Option<i64>> = devices.iter().map(|d| d.numa_node()).collect();
    ensure!(
        islands.len() == 1 && numa.len() == 1,
        "the production pod's GPUs span NVLink islands {islands:?} / NUMA nodes {numa:?}"
    );
    ctx.say(claim.describe(&published));
    wait_running(ctx, NAMESPACE, PRODUCTION).await?;
    let victims = check_victim_events(ctx).await?;
    ctx.say(format!("preempted: {}", victims.join(", ")));

    // The replacements wait while the production pod runs, then come back.
    let during = running_batch(ctx).await?;
    ensure!(
        during + victims.len() <= before,
        "{during} batch pods run next to the production pod; {before} ran before and {} were evicted",
        victims.len()
    );
    Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE)
        .delete(PRODUCTION, &DeleteParams::default())
        .await?;
    let after = wait_batch_settled(ctx, before).await?;
    ctx.say(format!("batch back: {after} pods Running"));
    ctx.delete_namespace(NAMESPACE).await?;
    Ok(ScenarioOutcome::Passed)
}

/// Sets the batch Deployment's replicas to `replicas` (a merge patch: an apply by the suite's
/// field manager would drop the rest of what it applied).
async fn scale_batch(ctx: &Ctx, replicas: usize) -> anyhow::Result<()> {
    Api::<Deployment>::namespaced(ctx.client.clone(), NAMESPACE)
        .patch(
            "batch",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .context("cannot scale the batch Deployment")?;
    Ok(())
}

/// The batch pods, not being deleted.
async fn batch_pods(ctx: &Ctx) -> anyhow::Result<Vec<Pod>> {
    Ok(Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE)
        .list(&ListParams::default().labels(BATCH_SELECTOR))
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

async fn running_batch(ctx: &Ctx) -> anyhow::Result<usize> {
    Ok(batch_pods(ctx)
        .await?
        .iter()
        .filter(|p| is_running(p))
        .count())
}

fn is_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Waits until at least `wanted` batch pods exist and each either runs or waits gated for
/// GPUs (the controller found no room: `Unsatisfiable`); returns how many run.
async fn wait_batch_settled(ctx: &Ctx, wanted: usize) -> anyhow::Result<usize> {
    until(
        &format!("{wanted} batch pods to run or wait for GPUs"),
        ctx.timeouts.run,
        || async {
            let pods = batch_pods(ctx).await?;
            let running = pods.iter().filter(|p| is_running(p)).count();
            let waiting = pods.iter().filter(|p| waits_for_gpus(p)).count();
            Ok(
                if pods.len() >= wanted && running + waiting == pods.len() && running > 0 {
                    Progress::Done(running)
                } else {
                    Progress::Waiting(format!(
                        "{} pods: {running} Running, {waiting} waiting for GPUs",
                        pods.len()
                    ))
                },
            )
        },
    )
    .await
}

/// A gated pod whose placement condition says no room (no preemption for its priority).
fn waits_for_gpus(pod: &Pod) -> bool {
    let gated = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == TOPOLOGY_AWARE_GATE));
    let unsatisfiable = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == CONDITION && c.reason.as_deref() == Some("Unsatisfiable"))
        });
    gated && unsatisfiable
}

/// The batch pods with a `Preempted` event naming the production pod (at least one, at most
/// four: one GPU each); none of them may still run.
async fn check_victim_events(ctx: &Ctx) -> anyhow::Result<Vec<String>> {
    let preemptor = format!("{NAMESPACE}/{PRODUCTION} (priority 1000)");
    let events =
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(ctx.client.clone(), NAMESPACE)
            .list(&ListParams::default().fields("reason=Preempted"))
            .await?
            .items;
    let mut victims: Vec<String> = events
        .iter()
        .filter(|e| e.message.as_deref().is_some_and(|m| m.contains(&preemptor)))
        .filter_map(|e| e.involved_object.name.clone())
        .collect();
    victims.sort();
    victims.dedup();
    ensure!(
        (1..=4).contains(&victims.len()),
        "{} batch pods have a Preempted event naming {preemptor}: {victims:?}",
        victims.len()
    );
    for victim in &victims {
        let seen = pod_events(ctx, NAMESPACE, victim).await?;
        ensure!(
            seen.iter()
                .any(|e| e.reason.as_deref() == Some("Preempted")),
            "pod {victim}: no Preempted event among its own"
        );
    }
    let still: Vec<String> = batch_pods(ctx)
        .await?
        .into_iter()
        .filter(is_running)
        .filter_map(|p| p.metadata.name)
        .filter(|n| victims.contains(n))
        .collect();
    ensure!(still.is_empty(), "evicted batch pods still run: {still:?}");
    Ok(victims)
}
