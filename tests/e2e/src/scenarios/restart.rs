//! A plugin killed while pods are being prepared, then started again: everything converges.
//!
//! Wave 1 (three single-GPU pods) is created; the plugin is SIGKILLed as soon as the first of
//! them is bound to the node, i.e. while the kubelet is preparing. Wave 2 (three more) is
//! created while the plugin is down, so the kubelet's prepare calls fail and are retried. Then
//! the plugin starts again. Expected: all six pods Running with their own GPU, the node's
//! devices still published, every claim prepared exactly once, and after deletion nothing left
//! (no CDI spec, no checkpoint entry).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::outcome::ScenarioOutcome;
use crate::context::Ctx;
use crate::objects::{PlacedBy, create_claim_and_pod, create_namespace, gpu_claim, gpu_pod};
use crate::steps::{
    AllocatedClaim, check_containers, check_prepared, check_unprepared, pod_events, wait_allocated,
    wait_running,
};
use crate::wait::{Progress, until};

const NAMESPACE: &str = "tessera-e2e-plugin-restart";
const WAVE: usize = 3;
/// How long the plugin stays down, so the kubelet's calls for wave 2 fail at least once.
const DOWN_FOR: Duration = Duration::from_secs(3);

pub async fn plugin_restart(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let published = ctx.published().await?;
    let managed = ctx.managed_nodes().await?;
    let Some(node) = published
        .nodes()
        .into_iter()
        .find(|n| !managed.contains(n) && published.whole_gpus(n).len() >= 2 * WAVE)
    else {
        return Ok(ScenarioOutcome::Skipped(format!(
            "needs an unmanaged node with {} whole GPUs",
            2 * WAVE
        )));
    };
    let devices_before = published.on_node(&node).count();
    ctx.fresh_namespace(NAMESPACE).await?;
    create_namespace(&ctx.client, NAMESPACE).await?;

    let names: Vec<String> = (1..=2 * WAVE).map(|i| format!("gpu-pod-{i}")).collect();
    let (wave_1, wave_2) = names.split_at(WAVE);
    kill_during_wave_1(ctx, &node, wave_1).await?;
    wave_2_while_down(ctx, &node, wave_2).await?;
    let claims = all_running(ctx, &names).await?;
    check_prepared(ctx, &claims).await?;
    let devices_after = ctx.published().await?.on_node(&node).count();
    ensure!(
        devices_after == devices_before,
        "{node} published {devices_before} devices before the restart and {devices_after} after"
    );

    ctx.delete_namespace(NAMESPACE).await?;
    check_unprepared(ctx, &claims).await?;
    Ok(ScenarioOutcome::Passed)
}

/// Wave 1 created on `node`; the plugin killed once one of its pods is bound.
async fn kill_during_wave_1(ctx: &Ctx, node: &str, wave_1: &[String]) -> anyhow::Result<()> {
    for name in wave_1 {
        create(ctx, name, node).await?;
    }
    ctx.say(format!("created {} on {node}", wave_1.join(", ")));

    let pods = Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE);
    until(
        &format!("a pod of wave 1 to be bound to {node}"),
        ctx.timeouts.allocate,
        || async {
            let list = pods.list(&ListParams::default()).await?;
            let bound = list
                .items
                .iter()
                .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
                .count();
            Ok(if bound > 0 {
                Progress::Done(())
            } else {
                Progress::Waiting("no pod bound yet".to_owned())
            })
        },
    )
    .await?;
    let killed = ctx.plugins.kill(node).await?;
    let running_at_kill = running_count(&pods).await?;
    ctx.say(format!(
        "killed {killed} while {running_at_kill} of {WAVE} pods were Running"
    ));
    Ok(())
}

/// Wave 2 created while the plugin is down; the plugin started again after [`DOWN_FOR`].
async fn wave_2_while_down(ctx: &Ctx, node: &str, wave_2: &[String]) -> anyhow::Result<()> {
    for name in wave_2 {
        create(ctx, name, node).await?;
    }
    ctx.say(format!(
        "created {} while the plugin is down",
        wave_2.join(", ")
    ));
    tokio::time::sleep(DOWN_FOR).await;
    ctx.plugins.start(node, ctx.timeouts.restart).await?;
    ctx.say(format!("restarted the plugin on {node}"));
    Ok(())
}

/// Every pod Running with what its containers need, each on a device of its own. Returns their
/// claims.
async fn all_running(ctx: &Ctx, names: &[String]) -> anyhow::Result<Vec<AllocatedClaim>> {
    let mut claims = Vec::new();
    let mut failed_prepares = 0;
    for name in names {
        let pod_claims = wait_allocated(ctx, NAMESPACE, name).await?;
        let pod = wait_running(ctx, NAMESPACE, name).await?;
        let published = ctx.published().await?;
        check_containers(ctx, &pod, &pod_claims, &published).await?;
        failed_prepares += pod_events(ctx, NAMESPACE, name)
            .await?
            .iter()
            .filter(|e| e.reason.as_deref() == Some("FailedPrepareDynamicResources"))
            .count();
        claims.extend(pod_claims);
    }
    ctx.say(format!(
        "all {} pods Running; the kubelet reported {failed_prepares} failed prepare(s) while the plugin was down",
        names.len()
    ));
    let devices: BTreeSet<String> = claims
        .iter()
        .flat_map(|c| c.allocation.device_names())
        .collect();
    ensure!(
        devices.len() == names.len(),
        "the {} claims hold {} distinct devices: {devices:?}",
        names.len(),
        devices.len()
    );
    Ok(claims)
}

async fn create(ctx: &Ctx, name: &str, node: &str) -> anyhow::Result<()> {
    create_claim_and_pod(
        &ctx.client,
        &gpu_claim(NAMESPACE, name, 1, None)?,
        &gpu_pod(NAMESPACE, name, name, PlacedBy::SchedulerOn(node))?,
    )
    .await
    .with_context(|| format!("creating {name}"))
}

async fn running_count(pods: &Api<Pod>) -> anyhow::Result<usize> {
    Ok(pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count())
}
