//! `scavenger`: deploy/examples/scavenger — preemptible batch pods (priority -10,
//! `preemptionPolicy: Never`) fill every free topology-managed GPU, one each; then a production
//! gang of priority 1000 arrives (production/train.yaml: pods `train-0` and `train-1`, four GPUs
//! of one NVLink island and NUMA node each, named a gang by the label fallback). The controller
//! evicts batch pods for the gang as one unit through the Eviction API — each victim gets a
//! `Preempted` event naming a production pod — and places both pods once the victims' claims are
//! released: on a dgx-h100 node the gang takes the node's NVLink island, one socket per pod. The
//! Deployment's replacements wait, gated, and all come back when the gang is deleted.

use std::collections::BTreeSet;

use anyhow::{Context, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tessera_api::names::{TOPOLOGY_AWARE_GATE, TOPOLOGY_MANAGED_TAINT};

use super::outcome::ScenarioOutcome;
use crate::context::Ctx;
use crate::devices::Published;
use crate::manifest::Manifest;
use crate::steps::{pod_events, wait_allocated, wait_running};
use crate::wait::{Progress, until};

const EXAMPLE: &str = "scavenger";
const NAMESPACE: &str = "tessera-example-scavenger";
/// The production gang's pods.
const PRODUCTION: [&str; 2] = ["train-0", "train-1"];
const BATCH_SELECTOR: &str = "app=scavenger-batch";
/// The example's PriorityClasses.
const CLASSES: [&str; 2] = [
    "tessera-example-scavenger-batch",
    "tessera-example-scavenger-production",
];
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
        managed_gpus >= 8,
        "the managed nodes publish {managed_gpus} whole GPUs; the scenario needs eight"
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
        before >= 8,
        "only {before} batch pods run: fewer than eight managed GPUs were free"
    );

    Manifest::read_dir(&dir.join("production"))?
        .apply(&ctx.client)
        .await?;
    check_gang_placed(ctx, &published).await?;
    let victims = check_victim_events(ctx).await?;
    ctx.say(format!("preempted: {}", victims.join(", ")));

    // The replacements wait while the production gang runs, then all come back.
    let during = running_batch(ctx).await?;
    ensure!(
        during + victims.len() <= before,
        "{during} batch pods run next to the production gang; {before} ran before and {} were evicted",
        victims.len()
    );
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE);
    for pod in PRODUCTION {
        pods.delete(pod, &DeleteParams::default()).await?;
    }
    wait_batch_running(ctx, before).await?;
    ctx.say(format!("batch back: {before} pods Running"));
    ctx.delete_namespace(NAMESPACE).await?;
    delete_classes(ctx).await?;
    Ok(ScenarioOutcome::Passed)
}

/// Both production pods allocated, each on four GPUs of one NVLink island and NUMA node, and
/// running.
async fn check_gang_placed(ctx: &Ctx, published: &Published) -> anyhow::Result<()> {
    for pod in PRODUCTION {
        let claims = wait_allocated(ctx, NAMESPACE, pod).await?;
        let claim = claims.first().context("a production pod has no claim")?;
        let devices = claim.devices(published)?;
        ensure!(
            devices.len() == 4,
            "{pod}: {} devices, expected 4",
            devices.len()
        );
        let islands: BTreeSet<Option<&str>> = devices.iter().map(|d| d.island()).collect();
        let numa: BTreeSet<Option<i64>> = devices.iter().map(|d| d.numa_node()).collect();
        ensure!(
            islands.len() == 1 && numa.len() == 1,
            "{pod}'s GPUs span NVLink islands {islands:?} / NUMA nodes {numa:?}"
        );
        ctx.say(format!("{pod}: {}", claim.describe(published)));
    }
    for pod in PRODUCTION {
        wait_running(ctx, NAMESPACE, pod).await?;
    }
    Ok(())
}

/// Deletes the example's PriorityClasses (cluster-scoped: the namespace does not take them).
async fn delete_classes(ctx: &Ctx) -> anyhow::Result<()> {
    let api = Api::<PriorityClass>::all(ctx.client.clone());
    for class in CLASSES {
        match api.delete(class, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e).context(format!("cannot delete PriorityClass {class}")),
        }
    }
    Ok(())
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

/// Waits until `wanted` batch pods run (the GPUs the gang gave back are theirs again).
async fn wait_batch_running(ctx: &Ctx, wanted: usize) -> anyhow::Result<()> {
    until(
        &format!("{wanted} batch pods to run again"),
        ctx.timeouts.run,
        || async {
            let running = running_batch(ctx).await?;
            Ok(if running >= wanted {
                Progress::Done(())
            } else {
                Progress::Waiting(format!("{running} Running"))
            })
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

/// The batch pods with a `Preempted` event naming a production pod (eight: the gang takes the
/// eight GPUs of a node, one batch pod each); none of them may still run.
async fn check_victim_events(ctx: &Ctx) -> anyhow::Result<Vec<String>> {
    let named = |m: &str| {
        PRODUCTION
            .iter()
            .any(|p| m.contains(&format!("{NAMESPACE}/{p} (priority 1000)")))
    };
    let events =
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(ctx.client.clone(), NAMESPACE)
            .list(&ListParams::default().fields("reason=Preempted"))
            .await?
            .items;
    let mut victims: Vec<String> = events
        .iter()
        .filter(|e| e.message.as_deref().is_some_and(named))
        .filter_map(|e| e.involved_object.name.clone())
        .collect();
    victims.sort();
    victims.dedup();
    ensure!(
        victims.len() == 8,
        "{} batch pods have a Preempted event naming {PRODUCTION:?}, expected 8: {victims:?}",
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
