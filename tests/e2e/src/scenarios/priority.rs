//! Priorities on the topology path, on the one topology-managed dgx-h100 node (8 H100s, one
//! NVLink island, gpu-0..3 on NUMA 0 and gpu-4..7 on NUMA 1), in scenario `priority-order`:
//!
//! - gpu-4..7 are held by a pod of priority 2000 (nobody here may preempt it), gpu-0..3 by a
//!   blocker of the same priority;
//! - a 4-GPU pod of priority 100 arrives first, one of priority 500 second: both wait
//!   (`Unsatisfiable`), and `tessera explain --pod` puts the second one ahead of the first;
//! - the blocker goes: the priority-500 pod gets gpu-0..3 (one island, one NUMA node), the
//!   priority-100 one keeps waiting, now first in line.
//!
//! The helpers below (PriorityClasses, pods pinned to GPUs by minor, conditions, events and
//! `explain`) serve the preemption scenarios too ([`super::preemption`]).

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use tessera_api::names::{GROUP_LABEL, GROUP_MIN_COUNT_ANNOTATION, TOPOLOGY_AWARE_GATE};

use super::outcome::ScenarioOutcome;
use super::slices::is_dgx_h100;
use crate::context::Ctx;
use crate::devices::Published;
use crate::objects::{PlacedBy, create_claim_and_pod, create_namespace, gpu_claim, gpu_pod};
use crate::steps::{AllocatedClaim, pod_events, pod_summary, wait_allocated, wait_running};
use crate::wait::{Progress, holds_for, until};

const NAMESPACE: &str = "tessera-e2e-priority-order";
/// The controller's pod condition.
const CONDITION: &str = "gpu.tessera.dev/TopologyAwarePlacement";
/// How long "nothing happens" is checked for (the controller decides within a second).
pub(super) const QUIET: Duration = Duration::from_secs(15);

/// A PriorityClass the scenarios create (and delete afterwards): `tessera-e2e-priority-VALUE`.
pub(super) fn class_name(value: i32) -> String {
    format!("tessera-e2e-priority-{value}")
}

/// Creates the PriorityClasses of `values` (one left by an earlier run is kept: the name
/// fixes the value).
pub(super) async fn create_classes(ctx: &Ctx, values: &[i32]) -> anyhow::Result<()> {
    let api = Api::<PriorityClass>::all(ctx.client.clone());
    for &value in values {
        let class: PriorityClass = serde_json::from_value(json!({
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": class_name(value), "labels": {"app.kubernetes.io/part-of": "tessera-e2e"}},
            "value": value,
            "preemptionPolicy": "PreemptLowerPriority",
        }))?;
        match api.create(&PostParams::default(), &class).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(e).context(format!("cannot create {}", class_name(value))),
        }
    }
    Ok(())
}

/// Deletes `namespace`, then the PriorityClasses of `values`.
pub(super) async fn clean_up(ctx: &Ctx, namespace: &str, values: &[i32]) -> anyhow::Result<()> {
    ctx.delete_namespace(namespace).await?;
    let api = Api::<PriorityClass>::all(ctx.client.clone());
    for &value in values {
        match api
            .delete(&class_name(value), &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e).context(format!("cannot delete {}", class_name(value))),
        }
    }
    Ok(())
}

/// The one topology-managed node, if it is a dgx-h100 (the scenarios fill it GPU by GPU, so a
/// second managed node would give the waiting pods room).
pub(super) async fn one_managed_dgx(ctx: &Ctx) -> anyhow::Result<Result<String, String>> {
    let managed = ctx.managed_nodes().await?;
    let published = ctx.published().await?;
    Ok(match managed.as_slice() {
        [node] if is_dgx_h100(&published.whole_gpus(node)) => Ok(node.clone()),
        _ => Err(format!(
            "needs exactly one topology-managed node, a dgx-h100 (8 H100s); managed: {managed:?}"
        )),
    })
}

/// A gated pod of the scenarios and its own claim of `gpus` whole GPUs.
pub(super) struct GpuPod<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub gpus: u32,
    /// The GPU minors its claim may take (`first..=last`), to lay out a node exactly.
    pub minors: Option<(u32, u32)>,
    /// Its PriorityClass value ([`class_name`]); none: priority 0.
    pub priority: Option<i32>,
    /// Whether the claim requires one NVLink island and one NUMA node (`matchAttribute`).
    pub one_socket: bool,
    /// The gang it belongs to (the label fallback) and the gang's size.
    pub group: Option<(&'a str, u32)>,
    /// Extra labels.
    pub labels: &'a [(&'a str, &'a str)],
}

impl GpuPod<'_> {
    pub(super) fn objects(&self) -> anyhow::Result<(ResourceClaim, Pod)> {
        let selector = self.minors.map(|(first, last)| {
            let minor = "device.attributes[\"gpu.tessera.dev\"].minor";
            format!("{minor} >= {first} && {minor} <= {last}")
        });
        let mut claim = serde_json::to_value(gpu_claim(
            self.namespace,
            self.name,
            self.gpus,
            selector.as_deref(),
        )?)?;
        if self.one_socket {
            claim["spec"]["devices"]["constraints"] = json!([
                {"requests": ["gpus"], "matchAttribute": "gpu.tessera.dev/nvlinkIsland"},
                {"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/numaNode"},
            ]);
        }
        let mut pod = serde_json::to_value(gpu_pod(
            self.namespace,
            self.name,
            self.name,
            PlacedBy::TopologyAware,
        )?)?;
        if let Some(value) = self.priority {
            pod["spec"]["priorityClassName"] = json!(class_name(value));
        }
        for (key, value) in self.labels {
            pod["metadata"]["labels"][key] = json!(value);
        }
        if let Some((group, size)) = self.group {
            pod["metadata"]["labels"][GROUP_LABEL] = json!(group);
            pod["metadata"]["annotations"][GROUP_MIN_COUNT_ANNOTATION] = json!(size.to_string());
        }
        Ok((serde_json::from_value(claim)?, serde_json::from_value(pod)?))
    }

    pub(super) async fn create(&self, ctx: &Ctx) -> anyhow::Result<()> {
        let (claim, pod) = self.objects()?;
        create_claim_and_pod(&ctx.client, &claim, &pod).await
    }
}

/// A plain 4-GPU pod of `priority` in this scenario's namespace.
fn four_gpus(name: &str, priority: i32, minors: Option<(u32, u32)>) -> GpuPod<'_> {
    GpuPod {
        namespace: NAMESPACE,
        name,
        gpus: 4,
        minors,
        priority: Some(priority),
        one_socket: minors.is_none(),
        group: None,
        labels: &[],
    }
}

/// The controller's condition on a pod: (reason, message).
pub(super) fn condition(pod: &Pod) -> Option<(String, String)> {
    let found = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION)?;
    Some((
        found.reason.clone().unwrap_or_default(),
        found.message.clone().unwrap_or_default(),
    ))
}

/// Waits until the pod's condition has `reason`; returns its message.
pub(super) async fn wait_condition(
    ctx: &Ctx,
    namespace: &str,
    pod: &str,
    reason: &str,
) -> anyhow::Result<String> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace);
    until(
        &format!("pod {namespace}/{pod} to carry condition reason {reason}"),
        ctx.timeouts.allocate,
        || async {
            let current = pods.get(pod).await?;
            Ok(match condition(&current) {
                Some((r, message)) if r == reason => Progress::Done(message),
                _ => Progress::Waiting(pod_summary(&current)),
            })
        },
    )
    .await
}

/// Waits for an event of `reason` about `pod` whose message contains every one of `words`;
/// returns the message.
pub(super) async fn wait_event(
    ctx: &Ctx,
    (namespace, pod): (&str, &str),
    reason: &str,
    words: &[&str],
) -> anyhow::Result<String> {
    until(
        &format!("an event {reason} about pod {namespace}/{pod} naming {words:?}"),
        ctx.timeouts.event,
        || async {
            let events = pod_events(ctx, namespace, pod).await?;
            let found = events.iter().rev().find_map(|e| {
                let message = e.message.as_deref().unwrap_or_default();
                (e.reason.as_deref() == Some(reason) && words.iter().all(|w| message.contains(w)))
                    .then(|| message.to_owned())
            });
            Ok(match found {
                Some(message) => Progress::Done(message),
                None => Progress::Waiting(format!(
                    "events so far: {:?}",
                    events
                        .iter()
                        .map(|e| (e.reason.clone(), e.message.clone()))
                        .collect::<Vec<_>>()
                )),
            })
        },
    )
    .await
}

/// `tessera explain --pod NAMESPACE/POD -o json` on the live cluster (the CLI built next to
/// this binary; tests/e2e/run builds both).
pub(super) fn explain_pod(ctx: &Ctx, namespace: &str, pod: &str) -> anyhow::Result<Value> {
    let cli = std::env::current_exe()?.with_file_name("tessera");
    ensure!(
        cli.is_file(),
        "{} is missing: build the CLI too (cargo build --bin tessera)",
        cli.display()
    );
    let key = format!("{namespace}/{pod}");
    let mut command = Command::new(&cli);
    command.args(["explain", "--pod", &key, "-o", "json"]);
    if let Some(kubeconfig) = &ctx.kubeconfig {
        command.arg("--kubeconfig").arg(kubeconfig);
    }
    let out = command.output()?;
    if !out.status.success() {
        bail!(
            "tessera explain --pod {key} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("explain --pod {key}: not JSON"))
}

/// One allocated claim's devices: on `node`, `count` of them, one NVLink island and NUMA node;
/// returns their names.
pub(super) fn check_one_socket(
    claim: &AllocatedClaim,
    published: &Published,
    node: &str,
    count: usize,
) -> anyhow::Result<Vec<String>> {
    let devices = claim.devices(published)?;
    let islands: BTreeSet<Option<&str>> = devices.iter().map(|d| d.island()).collect();
    let numa: BTreeSet<Option<i64>> = devices.iter().map(|d| d.numa_node()).collect();
    ensure!(
        claim.node()? == node && devices.len() == count,
        "claim {}: {} devices on {}, expected {count} on {node}",
        claim.name(),
        devices.len(),
        claim.node()?
    );
    ensure!(
        islands.len() == 1 && !islands.contains(&None) && numa.len() == 1,
        "claim {}: the GPUs span NVLink islands {islands:?} / NUMA nodes {numa:?}",
        claim.name()
    );
    Ok(claim.allocation.device_names())
}

/// Whether the pod is gated by the controller and none of its claims is allocated.
async fn waits_unallocated(ctx: &Ctx, namespace: &str, pod: &str) -> anyhow::Result<bool> {
    let current = Api::<Pod>::namespaced(ctx.client.clone(), namespace)
        .get(pod)
        .await?;
    let gated = current
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == TOPOLOGY_AWARE_GATE));
    let claim = Api::<ResourceClaim>::namespaced(ctx.client.clone(), namespace)
        .get(pod)
        .await?;
    let allocated = claim.status.and_then(|s| s.allocation).is_some();
    Ok(gated && !allocated)
}

/// Holds for [`QUIET`]: `pod` stays gated with its claim unallocated.
pub(super) async fn keeps_waiting(ctx: &Ctx, namespace: &str, pod: &str) -> anyhow::Result<()> {
    holds_for(
        &format!("pod {namespace}/{pod} to stay gated, its claim unallocated"),
        QUIET,
        || async {
            Ok(if waits_unallocated(ctx, namespace, pod).await? {
                Ok(())
            } else {
                Err("it was placed".to_owned())
            })
        },
    )
    .await
}

/// `explain --pod`'s queue report of a gated pod: (position, the pods ahead).
fn queue(ctx: &Ctx, pod: &str) -> anyhow::Result<(u64, Vec<String>)> {
    let report = explain_pod(ctx, NAMESPACE, pod)?;
    let queue = &report["queue"];
    let position = queue["position"]
        .as_u64()
        .with_context(|| format!("explain --pod {NAMESPACE}/{pod} shows no queue: {report}"))?;
    let ahead = queue["ahead"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    Ok((position, ahead))
}

const HOLD: i32 = 2000;
const HIGH: i32 = 500;
const LOW: i32 = 100;

pub async fn priority_order(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let node = match one_managed_dgx(ctx).await? {
        Ok(node) => node,
        Err(why) => return Ok(ScenarioOutcome::Skipped(why)),
    };
    ctx.fresh_namespace(NAMESPACE).await?;
    create_namespace(&ctx.client, NAMESPACE).await?;
    create_classes(ctx, &[HOLD, HIGH, LOW]).await?;
    let result = order(ctx, &node).await;
    let cleaned = clean_up(ctx, NAMESPACE, &[HOLD, HIGH, LOW]).await;
    result?;
    cleaned?;
    Ok(ScenarioOutcome::Passed)
}

async fn order(ctx: &Ctx, node: &str) -> anyhow::Result<()> {
    four_gpus("hold", HOLD, Some((4, 7))).create(ctx).await?;
    four_gpus("blocker", HOLD, Some((0, 3))).create(ctx).await?;
    for pod in ["hold", "blocker"] {
        wait_running(ctx, NAMESPACE, pod).await?;
    }
    ctx.say(format!(
        "{node}: gpu-4..7 held by `hold`, gpu-0..3 by `blocker` (priority {HOLD})"
    ));
    four_gpus("low", LOW, None).create(ctx).await?;
    wait_condition(ctx, NAMESPACE, "low", "Unsatisfiable").await?;
    // Arrival is the creation time, in seconds: the second pod arrives strictly later.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    four_gpus("high", HIGH, None).create(ctx).await?;
    let why = wait_condition(ctx, NAMESPACE, "high", "Unsatisfiable").await?;
    ctx.say(format!("both wait; `high`: {why}"));

    let (position, ahead) = queue(ctx, "low")?;
    let high_key = format!("{NAMESPACE}/high (priority {HIGH})");
    ensure!(
        position == 2 && ahead.first() == Some(&high_key),
        "explain --pod {NAMESPACE}/low: position {position}, ahead {ahead:?}; expected 2, behind {high_key}"
    );
    let (position, _) = queue(ctx, "high")?;
    ensure!(position == 1, "explain: `high` is at position {position}");
    ctx.say(format!(
        "explain: `low` is second in line, behind {high_key}"
    ));

    let pods = Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE);
    let claims = Api::<ResourceClaim>::namespaced(ctx.client.clone(), NAMESPACE);
    pods.delete("blocker", &DeleteParams::default()).await?;
    claims.delete("blocker", &DeleteParams::default()).await?;
    let placed = wait_allocated(ctx, NAMESPACE, "high").await?;
    let claim = placed.first().context("`high` has no claim")?;
    let names = check_one_socket(claim, &ctx.published().await?, node, 4)?;
    ensure!(
        names == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
        "`high` got {names:?}; the blocker freed gpu-0..3"
    );
    ctx.say(format!(
        "blocker gone: `high` (priority {HIGH}, arrived second) got {names:?}"
    ));
    keeps_waiting(ctx, NAMESPACE, "low").await?;
    let (position, _) = queue(ctx, "low")?;
    ensure!(position == 1, "explain: `low` is at position {position}");
    wait_running(ctx, NAMESPACE, "high").await?;
    ctx.say("`low` keeps waiting, now first in line");
    Ok(())
}
