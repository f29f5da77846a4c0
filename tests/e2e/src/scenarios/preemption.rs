//! Preemption for devices on the one topology-managed dgx-h100 node (8 H100s, one NVLink
//! island, gpu-0..3 on NUMA 0 and gpu-4..7 on NUMA 1), filled by pods pinned to their GPUs:
//!
//! - `preempt-pods`: `a` (gpu-0,1), `b` (gpu-2,3) and `c` (gpu-4,5) of priority 0, `d` (gpu-6,7)
//!   of priority 1000. A priority-1000 pod asks for four GPUs of one island and NUMA node: the
//!   only set it may free is `a` and `b` (NUMA 1 would need `d`, of equal priority). Both are
//!   evicted, each with a `Preempted` event naming the preemptor, which gets a `Preempting` event
//!   naming them and lands on gpu-0..3; `c` and `d` keep running.
//! - `preempt-pdb`: the same, with a PodDisruptionBudget allowing 0 disruptions of `a` and `b`:
//!   nothing is evicted for a while, and the preemptor's event and `tessera explain --pod` name
//!   the budget.
//! - `preempt-gang`: gang `low` (priority 0, two pods on gpu-0,1 and gpu-2,3), a priority-2000
//!   pod on gpu-4,5, gpu-6,7 free. Gang `high` (priority 1000, two 2-GPU pods) would fit by
//!   evicting one member of `low`; it evicts both (a gang is a unit) and both its pods are placed.

use std::collections::BTreeSet;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, PostParams};
use serde_json::json;
use tessera_api::names::PREEMPTED_BY_ANNOTATION;

use super::outcome::ScenarioOutcome;
use super::priority::{
    GpuPod, QUIET, check_one_socket, clean_up, create_classes, explain_pod, keeps_waiting,
    one_managed_dgx, wait_condition, wait_event,
};
use crate::context::Ctx;
use crate::objects::create_namespace;
use crate::steps::{pod_events, wait_allocated, wait_running};
use crate::wait::{Progress, holds_for, until};

const PODS_NAMESPACE: &str = "tessera-e2e-preempt-pods";
const PDB_NAMESPACE: &str = "tessera-e2e-preempt-pdb";
const GANG_NAMESPACE: &str = "tessera-e2e-preempt-gang";
const PREEMPTOR: &str = "preemptor";
const HIGH: i32 = 1000;
const HOLD: i32 = 2000;
/// The label of the pods a budget covers.
const VICTIM_LABEL: (&str, &str) = ("tessera-e2e/role", "victim");

/// A 2-GPU pod pinned to gpu-`first` and the next one.
fn pair<'a>(namespace: &'a str, name: &'a str, first: u32, priority: Option<i32>) -> GpuPod<'a> {
    GpuPod {
        namespace,
        name,
        gpus: 2,
        minors: Some((first, first + 1)),
        priority,
        one_socket: false,
        group: None,
        labels: &[],
    }
}

/// Runs `steps` on the managed dgx-h100 node in a fresh `namespace` with the PriorityClasses
/// of `classes`, cleaning both up afterwards whatever happened.
async fn on_managed_node<F>(
    ctx: &Ctx,
    namespace: &str,
    classes: &[i32],
    steps: F,
) -> anyhow::Result<ScenarioOutcome>
where
    F: AsyncFnOnce(&Ctx, &str) -> anyhow::Result<()>,
{
    let node = match one_managed_dgx(ctx).await? {
        Ok(node) => node,
        Err(why) => return Ok(ScenarioOutcome::Skipped(why)),
    };
    ctx.fresh_namespace(namespace).await?;
    create_namespace(&ctx.client, namespace).await?;
    create_classes(ctx, classes).await?;
    let result = steps(ctx, &node).await;
    let cleaned = clean_up(ctx, namespace, classes).await;
    result?;
    cleaned?;
    Ok(ScenarioOutcome::Passed)
}

/// Fills the node: `a`, `b`, `c` of priority 0 (`a` and `b` labelled as victims), `d` of
/// priority 1000; waits until all four run.
async fn fill(ctx: &Ctx, namespace: &str) -> anyhow::Result<()> {
    let victims = [VICTIM_LABEL];
    for (name, first, priority) in [("a", 0, None), ("b", 2, None), ("c", 4, None)] {
        let mut pod = pair(namespace, name, first, priority);
        if name != "c" {
            pod.labels = &victims;
        }
        pod.create(ctx).await?;
    }
    pair(namespace, "d", 6, Some(HIGH)).create(ctx).await?;
    for name in ["a", "b", "c", "d"] {
        wait_running(ctx, namespace, name).await?;
    }
    ctx.say(
        "full: a (gpu-0,1), b (gpu-2,3), c (gpu-4,5) of priority 0, d (gpu-6,7) of priority 1000",
    );
    Ok(())
}

/// The priority-1000 pod asking for four GPUs of one island and NUMA node.
fn preemptor(namespace: &str) -> GpuPod<'_> {
    GpuPod {
        namespace,
        name: PREEMPTOR,
        gpus: 4,
        minors: None,
        priority: Some(HIGH),
        one_socket: true,
        group: None,
        labels: &[],
    }
}

pub async fn preempt_pods(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    on_managed_node(ctx, PODS_NAMESPACE, &[HIGH], preempt_pods_steps).await
}

async fn preempt_pods_steps(ctx: &Ctx, node: &str) -> anyhow::Result<()> {
    let ns = PODS_NAMESPACE;
    fill(ctx, ns).await?;
    preemptor(ns).create(ctx).await?;
    let claims = wait_allocated(ctx, ns, PREEMPTOR).await?;
    let claim = claims.first().context("the preemptor has no claim")?;
    let names = check_one_socket(claim, &ctx.published().await?, node, 4)?;
    ensure!(
        names == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
        "the preemptor got {names:?}; only evicting a and b frees four GPUs of one NUMA node"
    );
    ctx.say(format!(
        "{ns}/{PREEMPTOR} (priority {HIGH}) placed on {names:?}"
    ));

    let named = format!("{ns}/{PREEMPTOR} (priority {HIGH})");
    for victim in ["a", "b"] {
        let message = wait_event(ctx, (ns, victim), "Preempted", &[&named]).await?;
        ctx.say(format!("{victim}: Preempted: {message}"));
        wait_gone(ctx, ns, victim).await?;
    }
    let (a, b) = (format!("{ns}/a"), format!("{ns}/b"));
    let message = wait_event(ctx, (ns, PREEMPTOR), "Preempting", &[&a, &b]).await?;
    ctx.say(format!("{PREEMPTOR}: Preempting: {message}"));
    for bystander in ["c", "d"] {
        ensure_untouched(ctx, ns, bystander).await?;
    }
    wait_running(ctx, ns, PREEMPTOR).await?;
    ctx.say("c and d keep running, untouched");
    Ok(())
}

/// Waits until `pod` is deleted (an evicted bare pod goes away).
async fn wait_gone(ctx: &Ctx, namespace: &str, pod: &str) -> anyhow::Result<()> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace);
    until(
        &format!("pod {namespace}/{pod} to be gone"),
        ctx.timeouts.delete,
        || async {
            Ok(match pods.get_opt(pod).await? {
                None => Progress::Done(()),
                Some(p) => Progress::Waiting(format!(
                    "still there, deletionTimestamp {:?}",
                    p.metadata.deletion_timestamp
                )),
            })
        },
    )
    .await
}

/// Why `pod` is not untouched: not Running, being deleted, marked as preempted, or with a
/// `Preempted` event.
async fn touched(ctx: &Ctx, namespace: &str, pod: &str) -> anyhow::Result<Option<String>> {
    let current = Api::<Pod>::namespaced(ctx.client.clone(), namespace)
        .get(pod)
        .await?;
    let phase = current.status.as_ref().and_then(|s| s.phase.clone());
    let marked = current
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PREEMPTED_BY_ANNOTATION).cloned());
    let events = pod_events(ctx, namespace, pod).await?;
    let preempted = events
        .iter()
        .any(|e| e.reason.as_deref() == Some("Preempted"));
    Ok(
        if phase.as_deref() != Some("Running")
            || current.metadata.deletion_timestamp.is_some()
            || marked.is_some()
            || preempted
        {
            Some(format!(
                "pod {namespace}/{pod}: phase {phase:?}, deletionTimestamp {:?}, {PREEMPTED_BY_ANNOTATION} {marked:?}, Preempted event: {preempted}",
                current.metadata.deletion_timestamp
            ))
        } else {
            None
        },
    )
}

async fn ensure_untouched(ctx: &Ctx, namespace: &str, pod: &str) -> anyhow::Result<()> {
    match touched(ctx, namespace, pod).await? {
        None => Ok(()),
        Some(why) => anyhow::bail!("{why}; it should be untouched"),
    }
}

pub async fn preempt_pdb(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    on_managed_node(ctx, PDB_NAMESPACE, &[HIGH], preempt_pdb_steps).await
}

async fn preempt_pdb_steps(ctx: &Ctx, _node: &str) -> anyhow::Result<()> {
    let ns = PDB_NAMESPACE;
    fill(ctx, ns).await?;
    create_budget(ctx, ns).await?;
    preemptor(ns).create(ctx).await?;
    let budget = format!("PodDisruptionBudget {ns}/victims");
    let message = wait_condition(ctx, ns, PREEMPTOR, "PreemptionBlocked").await?;
    ctx.say(format!(
        "{PREEMPTOR}: condition PreemptionBlocked: {message}"
    ));
    // The event's note holds 1 KiB: the budget must be named before the account of each node.
    let event = wait_event(ctx, (ns, PREEMPTOR), "PreemptionBlocked", &[&budget]).await?;
    ctx.say(format!("{PREEMPTOR}: event {event}"));
    nothing_evicted(ctx, ns).await?;
    keeps_waiting(ctx, ns, PREEMPTOR).await?;
    let report = explain_pod(ctx, ns, PREEMPTOR)?;
    let said = report["message"].as_str().unwrap_or_default();
    ensure!(
        said.contains(&budget),
        "explain --pod {ns}/{PREEMPTOR} does not name {budget}: {report}"
    );
    ctx.say(format!("explain --pod {ns}/{PREEMPTOR}: {said}"));
    Ok(())
}

/// A budget allowing no disruption of `a` and `b` (`minAvailable: 2`: bare pods have no
/// controller to count `maxUnavailable` against); waits until the disruption controller has
/// counted them.
async fn create_budget(ctx: &Ctx, namespace: &str) -> anyhow::Result<()> {
    let api = Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), namespace);
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"namespace": namespace, "name": "victims"},
        "spec": {
            "minAvailable": 2,
            "selector": {"matchLabels": {VICTIM_LABEL.0: VICTIM_LABEL.1}},
        },
    }))?;
    api.create(&PostParams::default(), &pdb).await?;
    until(
        "PodDisruptionBudget victims to count two healthy pods",
        ctx.timeouts.event,
        || async {
            let status = api.get("victims").await?.status.unwrap_or_default();
            Ok(
                if status.current_healthy == Some(2) && status.disruptions_allowed == Some(0) {
                    Progress::Done(())
                } else {
                    Progress::Waiting(format!("{status:?}"))
                },
            )
        },
    )
    .await?;
    ctx.say("PodDisruptionBudget victims: a and b, 0 disruptions allowed");
    Ok(())
}

/// Holds for [`QUIET`]: none of the four pods filling the node is evicted or marked.
async fn nothing_evicted(ctx: &Ctx, namespace: &str) -> anyhow::Result<()> {
    holds_for(
        "a, b, c and d to keep running, untouched",
        QUIET,
        || async {
            for pod in ["a", "b", "c", "d"] {
                if let Some(why) = touched(ctx, namespace, pod).await? {
                    return Ok(Err(why));
                }
            }
            Ok(Ok(()))
        },
    )
    .await
}

pub async fn preempt_gang(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    on_managed_node(ctx, GANG_NAMESPACE, &[HIGH, HOLD], preempt_gang_steps).await
}

/// A member of a 2-pod gang with 2 GPUs.
fn member<'a>(name: &'a str, group: &'a str, priority: Option<i32>) -> GpuPod<'a> {
    GpuPod {
        namespace: GANG_NAMESPACE,
        name,
        gpus: 2,
        minors: None,
        priority,
        one_socket: false,
        group: Some((group, 2)),
        labels: &[],
    }
}

async fn preempt_gang_steps(ctx: &Ctx, node: &str) -> anyhow::Result<()> {
    let ns = GANG_NAMESPACE;
    pair(ns, "hold", 4, Some(HOLD)).create(ctx).await?;
    for (name, first) in [("low-0", 0), ("low-1", 2)] {
        GpuPod {
            minors: Some((first, first + 1)),
            ..member(name, "low", None)
        }
        .create(ctx)
        .await?;
    }
    for name in ["hold", "low-0", "low-1"] {
        wait_running(ctx, ns, name).await?;
    }
    ctx.say(format!(
        "{node}: gang low (priority 0) on gpu-0..3, hold (priority {HOLD}) on gpu-4,5, gpu-6,7 free"
    ));
    for name in ["high-0", "high-1"] {
        member(name, "high", Some(HIGH)).create(ctx).await?;
    }
    let published = ctx.published().await?;
    let mut taken = BTreeSet::new();
    for name in ["high-0", "high-1"] {
        let claims = wait_allocated(ctx, ns, name).await?;
        let claim = claims.first().context("a gang member without a claim")?;
        ensure!(
            claim.node()? == node && claim.allocation.device_names().len() == 2,
            "{name}: {}",
            claim.describe(&published)
        );
        taken.extend(claim.allocation.device_names());
    }
    ensure!(taken.len() == 4, "the gang's pods share GPUs: {taken:?}");
    ctx.say(format!("gang high placed on {taken:?}"));
    for victim in ["low-0", "low-1"] {
        let message = wait_event(
            ctx,
            (ns, victim),
            "Preempted",
            &[&format!("{ns}/high-"), "(priority 1000)"],
        )
        .await?;
        ctx.say(format!("{victim}: Preempted: {message}"));
    }
    for victim in ["low-0", "low-1"] {
        wait_gone(ctx, ns, victim).await?;
    }
    ensure_untouched(ctx, ns, "hold").await?;
    for name in ["high-0", "high-1"] {
        wait_running(ctx, ns, name).await?;
    }
    ctx.say("gang low evicted whole (both members), hold untouched, gang high runs");
    Ok(())
}
