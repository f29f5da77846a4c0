//! A DaemonSet rollout of the plugin while pods with claims come and go on its node: with surge
//! (the chart's default) the new plugin pod serves beside the old one, so no prepare fails and
//! none waits for a restart.
//!
//! Tessera installed by the chart: two loops create a claim and a pod on one unmanaged node,
//! wait until it runs, delete it and wait until it is gone (the kubelet prepares and unprepares
//! the claim), while the plugin's DaemonSet is rolled out on that node. The judge is the kubelet:
//! its `dra_operations_duration_seconds` histogram (read through the API server's node proxy
//! before and after) counts every prepare and unprepare of a pod's claims with its duration and
//! whether it failed. Between the two readings no operation may have failed and no prepare may
//! have taken more than 2 s; the pods report no `FailedPrepareDynamicResources` event.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, ListParams};

use super::outcome::ScenarioOutcome;
use crate::context::Ctx;
use crate::objects::{PlacedBy, create_claim_and_pod, create_namespace, gpu_claim, gpu_pod};
use crate::scrape::samples;
use crate::steps::wait_running;
use crate::wait::{Progress, until};

const NAMESPACE: &str = "tessera-e2e-plugin-rollout";
const LOOPS: usize = 2;
/// The longest a prepare may take during the rollout (a bucket bound of the kubelet's
/// histogram: 0.1 × 400^(7/14)).
const MOST_A_PREPARE_MAY_TAKE: f64 = 2.0;
const HISTOGRAM: &str = "dra_operations_duration_seconds";

pub async fn plugin_rollout(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    if ctx.plugins.namespace().is_none() {
        return Ok(ScenarioOutcome::Skipped(
            "needs Tessera installed by helm (a DaemonSet to roll out)".into(),
        ));
    }
    let published = ctx.published().await?;
    let managed = ctx.managed_nodes().await?;
    let Some(node) = published
        .nodes()
        .into_iter()
        .find(|n| !managed.contains(n) && published.whole_gpus(n).len() >= LOOPS)
    else {
        return Ok(ScenarioOutcome::Skipped(format!(
            "needs an unmanaged node with {LOOPS} whole GPUs"
        )));
    };
    ctx.fresh_namespace(NAMESPACE).await?;
    create_namespace(&ctx.client, NAMESPACE).await?;
    let before = kubelet_operations(ctx, &node).await?;
    let stop = AtomicBool::new(false);
    let loops = futures::future::try_join_all(
        (0..LOOPS).map(|i| pods_coming_and_going(ctx, &node, i, &stop)),
    );
    let rollout = async {
        // Let the loops get going, roll out, and keep them going a little past the handover.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let rolled = ctx
            .plugins
            .rollout_restart(&node, ctx.timeouts.restart)
            .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop.store(true, Ordering::SeqCst);
        rolled
    };
    let (cycles, rolled) = tokio::join!(loops, rollout);
    ctx.say(rolled?);
    let cycles: usize = cycles?.iter().sum();
    let after = kubelet_operations(ctx, &node).await?;
    let during = after.since(&before);
    ctx.say(format!(
        "{cycles} pods ran and went on {node} during the rollout; the kubelet counted {} prepare(s) \
         ({} over {MOST_A_PREPARE_MAY_TAKE} s, {} failed) and {} unprepare(s) ({} failed)",
        during.prepares, during.slow_prepares, during.failed_prepares, during.unprepares, during.failed_unprepares
    ));
    ensure!(
        during.prepares >= cycles as u64,
        "the kubelet counted {} prepares for {cycles} pods",
        during.prepares
    );
    ensure!(
        during.failed_prepares == 0 && during.failed_unprepares == 0,
        "{during:?}"
    );
    ensure!(
        during.slow_prepares == 0,
        "{} prepare(s) took more than {MOST_A_PREPARE_MAY_TAKE} s: {during:?}",
        during.slow_prepares
    );
    let failed_events = failed_prepare_events(ctx).await?;
    ensure!(failed_events.is_empty(), "{failed_events:?}");
    ctx.delete_namespace(NAMESPACE).await?;
    Ok(ScenarioOutcome::Passed)
}

/// Loop `index`: a claim and a pod on `node`, Running, then deleted and gone, until `stop`.
/// Returns how many pods ran.
async fn pods_coming_and_going(
    ctx: &Ctx,
    node: &str,
    index: usize,
    stop: &AtomicBool,
) -> anyhow::Result<usize> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE);
    let claims = Api::<ResourceClaim>::namespaced(ctx.client.clone(), NAMESPACE);
    let mut cycles = 0;
    while !stop.load(Ordering::SeqCst) {
        let name = format!("rollout-{index}-{cycles}");
        let claim = gpu_claim(NAMESPACE, &name, 1, None)?;
        let pod = gpu_pod(NAMESPACE, &name, &name, PlacedBy::SchedulerOn(node))?;
        create_claim_and_pod(&ctx.client, &claim, &pod).await?;
        wait_running(ctx, NAMESPACE, &name).await?;
        pods.delete(&name, &DeleteParams::default()).await?;
        until(
            &format!("pod {NAMESPACE}/{name} to be gone"),
            ctx.timeouts.delete,
            || async {
                Ok(match pods.get_opt(&name).await? {
                    None => Progress::Done(()),
                    Some(_) => Progress::Waiting("still there".to_owned()),
                })
            },
        )
        .await?;
        claims.delete(&name, &DeleteParams::default()).await?;
        cycles += 1;
    }
    Ok(cycles)
}

/// The kubelet's counts of DRA operations on one node (cumulative).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct KubeletOperations {
    prepares: u64,
    failed_prepares: u64,
    /// Successful prepares that took longer than [`MOST_A_PREPARE_MAY_TAKE`].
    slow_prepares: u64,
    unprepares: u64,
    failed_unprepares: u64,
}

impl KubeletOperations {
    /// What the kubelet's `/metrics` text says.
    fn read(text: &str) -> Self {
        let mut counts = KubeletOperations::default();
        let total = |operation: &str, failed: &str| -> u64 {
            samples(text, &format!("{HISTOGRAM}_count"))
                .iter()
                .filter(|(l, _)| l["operation_name"] == operation && l["is_error"] == failed)
                .map(|(_, v)| *v as u64)
                .sum()
        };
        counts.prepares = total("PrepareResources", "false") + total("PrepareResources", "true");
        counts.failed_prepares = total("PrepareResources", "true");
        counts.unprepares =
            total("UnprepareResources", "false") + total("UnprepareResources", "true");
        counts.failed_unprepares = total("UnprepareResources", "true");
        // The bucket with the largest bound not over the limit (floating point: 1.9999…).
        let within: u64 = samples(text, &format!("{HISTOGRAM}_bucket"))
            .iter()
            .filter(|(l, _)| l["operation_name"] == "PrepareResources" && l["is_error"] == "false")
            .filter_map(|(l, v)| Some((l.get("le")?.parse::<f64>().ok()?, *v as u64)))
            .filter(|(le, _)| *le <= MOST_A_PREPARE_MAY_TAKE + 1e-9)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map_or(0, |(_, count)| count);
        counts.slow_prepares = total("PrepareResources", "false") - within;
        counts
    }

    /// The operations counted since `earlier`.
    fn since(self, earlier: &Self) -> Self {
        KubeletOperations {
            prepares: self.prepares - earlier.prepares,
            failed_prepares: self.failed_prepares - earlier.failed_prepares,
            slow_prepares: self.slow_prepares - earlier.slow_prepares,
            unprepares: self.unprepares - earlier.unprepares,
            failed_unprepares: self.failed_unprepares - earlier.failed_unprepares,
        }
    }
}

/// The kubelet's DRA operation counts on `node`, through the API server's node proxy.
async fn kubelet_operations(ctx: &Ctx, node: &str) -> anyhow::Result<KubeletOperations> {
    let path = format!("/api/v1/nodes/{node}/proxy/metrics");
    let request = http::Request::get(&path).body(Vec::new())?;
    let text = ctx
        .client
        .request_text(request)
        .await
        .with_context(|| format!("GET {path} (the kubelet's metrics)"))?;
    Ok(KubeletOperations::read(&text))
}

/// `FailedPrepareDynamicResources` events of the scenario's pods.
async fn failed_prepare_events(ctx: &Ctx) -> anyhow::Result<Vec<String>> {
    let events = Api::<Event>::namespaced(ctx.client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await?;
    Ok(events
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedPrepareDynamicResources"))
        .map(|e| {
            format!(
                "{}: {}",
                e.involved_object.name.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelets_histogram_is_read_with_its_slow_and_failed_operations() {
        let line = |op: &str, err: &str, suffix: &str, value: u64| {
            format!("{HISTOGRAM}_{suffix}{{is_error=\"{err}\",operation_name=\"{op}\"}} {value}\n")
        };
        let bucket = |le: &str, value: u64| {
            format!(
                "{HISTOGRAM}_bucket{{is_error=\"false\",operation_name=\"PrepareResources\",le=\"{le}\"}} {value}\n"
            )
        };
        let text = [
            bucket("1.3049019306808558", 5),
            bucket("2.0000000000000004", 6),
            bucket("1.9999999999999998", 6),
            bucket("3.0649537426959426", 7),
            bucket("+Inf", 8),
            line("PrepareResources", "false", "count", 8),
            line("PrepareResources", "true", "count", 1),
            line("UnprepareResources", "false", "count", 4),
        ]
        .concat();
        let read = KubeletOperations::read(&text);
        assert_eq!(
            read,
            KubeletOperations {
                prepares: 9,
                failed_prepares: 1,
                slow_prepares: 2,
                unprepares: 4,
                failed_unprepares: 0,
            }
        );
        assert_eq!(read.since(&read), KubeletOperations::default());
    }
}
