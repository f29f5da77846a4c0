//! Gangs placed by the Tessera controller (issue 18's done-when), in one scenario `gang`:
//!
//! - three GPU nodes are made topology-managed and labelled with racks: the first by name alone
//!   in rack `e2e-r0`, the other two in `e2e-r1`; 4 GPUs are held on each dgx-h100 node so that
//!   every node has room for one 4-GPU pod;
//! - a 2-pod gang × 4 GPUs named by an upstream PodGroup (`spec.schedulingGroup.podGroupName`)
//!   lands on the two nodes of rack `e2e-r1`, not on the node first in name order (per-pod first
//!   fit would take it);
//! - a second gang of the same shape, named by the fallback label and annotation, does not fit
//!   while the first runs: it waits (`GroupUnsatisfiable`, condition and event) with no claim
//!   allocated, and runs once the first is deleted, on the same rack;
//! - a gang whose `minCount` cannot be met (3 × 8 GPUs, a PodGroup) never gets a claim allocated.
//!
//! Both ways of naming a gang are covered: the PodGroup API where the cluster serves
//! `scheduling.k8s.io/v1beta1` (the local cluster does: feature gate `GenericWorkload`), the
//! label fallback always. On a cluster without the PodGroup API every gang is named by the
//! label, and the scenario reports itself skipped after passing, saying what was not covered.
//!
//! The labels the scenario added are removed afterwards, whatever happened, and it waits until
//! the nodes it made managed publish untainted devices again.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use tessera_api::names::{
    GROUP_LABEL, GROUP_MIN_COUNT_ANNOTATION, RACK_LABEL, TOPOLOGY_MANAGED_LABEL,
    TOPOLOGY_MANAGED_TAINT,
};

use super::outcome::ScenarioOutcome;
use super::slices::is_dgx_h100;
use crate::context::Ctx;
use crate::objects::{PlacedBy, create_claim_and_pod, create_namespace, gpu_claim, gpu_pod};
use crate::steps::{pod_events, pod_summary, wait_allocated, wait_running};
use crate::wait::{Progress, holds_for, until};

const NAMESPACE: &str = "tessera-e2e-gang";
const CONDITION: &str = "gpu.tessera.dev/TopologyAwarePlacement";

/// How a gang's pods name their group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Naming {
    /// An upstream PodGroup (`scheduling.k8s.io/v1beta1`) with a gang policy, named in each
    /// pod's `spec.schedulingGroup.podGroupName`.
    PodGroup,
    /// Tessera's fallback: the label `gpu.tessera.dev/group` and the `minCount` annotation.
    Label,
}

/// The nodes: `elsewhere` (first by name, rack e2e-r0), `pair` (rack e2e-r1), the dgx-h100 ones
/// among all three (where 4 GPUs are held).
struct Layout {
    elsewhere: String,
    pair: [String; 2],
    dgx: Vec<String>,
}

/// Two dgx-h100 nodes and a third node with 4 to 7 whole GPUs (one 4-GPU pod each once the dgx
/// nodes are half held).
fn pick(ctx_published: &crate::devices::Published) -> Option<Layout> {
    let nodes = ctx_published.nodes();
    let dgx: Vec<String> = nodes
        .iter()
        .filter(|n| is_dgx_h100(&ctx_published.whole_gpus(n)))
        .take(2)
        .cloned()
        .collect();
    if dgx.len() < 2 {
        return None;
    }
    let third = nodes.iter().find(|n| {
        let whole = ctx_published.whole_gpus(n).len();
        !dgx.contains(n) && (4..8).contains(&whole)
    })?;
    let mut all = [dgx[0].clone(), dgx[1].clone(), third.clone()];
    all.sort();
    Some(Layout {
        elsewhere: all[0].clone(),
        pair: [all[1].clone(), all[2].clone()],
        dgx,
    })
}

pub async fn gang(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let published = ctx.published().await?;
    let Some(layout) = pick(&published) else {
        return Ok(ScenarioOutcome::Skipped(format!(
            "needs two dgx-h100 nodes and a third node with 4 to 7 whole GPUs; publishing: {:?}",
            published.nodes()
        )));
    };
    let managed_before = ctx.managed_nodes().await?;
    let nodes: Vec<String> = std::iter::once(layout.elsewhere.clone())
        .chain(layout.pair.iter().cloned())
        .collect();
    let made_managed: Vec<String> = nodes
        .iter()
        .filter(|n| !managed_before.contains(n))
        .cloned()
        .collect();
    ctx.say(format!(
        "rack e2e-r0: {}; rack e2e-r1: {} and {}; made topology-managed for the scenario: {made_managed:?}",
        layout.elsewhere, layout.pair[0], layout.pair[1]
    ));
    let result = run(ctx, &layout, &nodes).await;
    let restored = restore(ctx, &nodes, &made_managed).await;
    let outcome = result?;
    restored?;
    Ok(outcome)
}

async fn label(ctx: &Ctx, node: &str, labels: serde_json::Value) -> anyhow::Result<()> {
    Api::<Node>::all(ctx.client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": labels}})),
        )
        .await
        .with_context(|| format!("cannot label node {node}"))?;
    Ok(())
}

/// Waits until every device of `nodes` does (or does not) carry the managed taint.
async fn wait_tainted(ctx: &Ctx, nodes: &[String], tainted: bool) -> anyhow::Result<()> {
    until(
        &format!("the devices of {nodes:?} to be published with tainted={tainted}"),
        ctx.timeouts.allocate,
        || async {
            let published = ctx.published().await?;
            let wrong: Vec<String> = nodes
                .iter()
                .flat_map(|n| published.on_node(n))
                .filter(|d| d.has_taint(TOPOLOGY_MANAGED_TAINT) != tainted)
                .map(|d| format!("{}/{}", d.node, d.name))
                .collect();
            Ok(if wrong.is_empty() {
                Progress::Done(())
            } else {
                Progress::Waiting(format!("not yet: {wrong:?}"))
            })
        },
    )
    .await
}

async fn restore(ctx: &Ctx, nodes: &[String], made_managed: &[String]) -> anyhow::Result<()> {
    ctx.delete_namespace(NAMESPACE).await?;
    for node in nodes {
        let mut labels = serde_json::json!({ RACK_LABEL: null });
        if made_managed.contains(node) {
            labels[TOPOLOGY_MANAGED_LABEL] = serde_json::Value::Null;
        }
        label(ctx, node, labels).await?;
    }
    wait_tainted(ctx, made_managed, false).await
}

/// A gated group member with its own claim of `gpus` GPUs.
fn member(
    group: &str,
    index: usize,
    (naming, min_count): (Naming, u32),
    gpus: u32,
) -> anyhow::Result<(ResourceClaim, Pod)> {
    let name = format!("{group}-{index}");
    let claim = gpu_claim(NAMESPACE, &name, gpus, None)?;
    let mut pod = gpu_pod(NAMESPACE, &name, &name, PlacedBy::TopologyAware)?;
    match naming {
        Naming::PodGroup => {
            let spec = pod.spec.get_or_insert_default();
            spec.scheduling_group = Some(serde_json::from_value(
                serde_json::json!({ "podGroupName": group }),
            )?);
        }
        Naming::Label => {
            pod.metadata
                .labels
                .get_or_insert_default()
                .insert(GROUP_LABEL.into(), group.into());
            pod.metadata
                .annotations
                .get_or_insert_default()
                .insert(GROUP_MIN_COUNT_ANNOTATION.into(), min_count.to_string());
        }
    }
    Ok((claim, pod))
}

/// Whether the cluster serves the PodGroup API (a list in the scenario's namespace answers 404
/// when it does not).
async fn serves_pod_groups(ctx: &Ctx) -> anyhow::Result<bool> {
    let api = Api::<PodGroup>::namespaced(ctx.client.clone(), NAMESPACE);
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(error).context("cannot list scheduling.k8s.io/v1beta1 PodGroups"),
    }
}

/// Creates a gang of `size` gated pods named `group-0`…, each with its own claim; for
/// [`Naming::PodGroup`] the PodGroup with a gang policy first, and each pod is checked to have
/// kept `spec.schedulingGroup` (the API server drops it while `GenericWorkload` is off).
async fn create_group(
    ctx: &Ctx,
    group: &str,
    (size, min_count): (usize, u32),
    gpus: u32,
    naming: Naming,
) -> anyhow::Result<Vec<String>> {
    if naming == Naming::PodGroup {
        let pod_group: PodGroup = serde_json::from_value(serde_json::json!({
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "PodGroup",
            "metadata": {"namespace": NAMESPACE, "name": group},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}},
        }))?;
        Api::<PodGroup>::namespaced(ctx.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &pod_group)
            .await
            .with_context(|| format!("cannot create PodGroup {NAMESPACE}/{group}"))?;
    }
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE);
    let mut names = Vec::new();
    for i in 0..size {
        let (claim, pod) = member(group, i, (naming, min_count), gpus)?;
        create_claim_and_pod(&ctx.client, &claim, &pod).await?;
        let name = format!("{group}-{i}");
        if naming == Naming::PodGroup {
            let created = pods.get(&name).await?;
            let named = created
                .spec
                .as_ref()
                .and_then(|s| s.scheduling_group.as_ref())
                .and_then(|g| g.pod_group_name.as_deref());
            ensure!(
                named == Some(group),
                "pod {NAMESPACE}/{name} was stored with spec.schedulingGroup.podGroupName {named:?}, \
                 not {group:?}: the API server drops the field unless the GenericWorkload feature gate is on"
            );
        }
        names.push(name);
    }
    Ok(names)
}

/// The controller's condition reason on a pod.
fn reason(pod: &Pod) -> Option<(String, String)> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION)
        .map(|c| {
            (
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

async fn wait_reason(ctx: &Ctx, pod: &str, expected: &str) -> anyhow::Result<String> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE);
    until(
        &format!("pod {NAMESPACE}/{pod} to carry condition reason {expected}"),
        ctx.timeouts.allocate,
        || async {
            let current = pods.get(pod).await?;
            Ok(match reason(&current) {
                Some((r, message)) if r == expected => Progress::Done(message),
                _ => Progress::Waiting(pod_summary(&current)),
            })
        },
    )
    .await
}

/// Waits for an event of `reason` about `pod`; returns its message.
async fn wait_event(ctx: &Ctx, pod: &str, reason: &str) -> anyhow::Result<String> {
    until(
        &format!("an event {reason} about pod {NAMESPACE}/{pod}"),
        ctx.timeouts.event,
        || async {
            let events = pod_events(ctx, NAMESPACE, pod).await?;
            Ok(
                match events
                    .iter()
                    .rev()
                    .find(|e| e.reason.as_deref() == Some(reason))
                {
                    Some(event) => Progress::Done(event.message.clone().unwrap_or_default()),
                    None => Progress::Waiting(format!(
                        "events so far: {:?}",
                        events.iter().map(|e| e.reason.clone()).collect::<Vec<_>>()
                    )),
                },
            )
        },
    )
    .await
}

/// Holds: no claim of `pods` is allocated and every one of them is still gated.
async fn nothing_allocated(ctx: &Ctx, pods: &[String], period: Duration) -> anyhow::Result<()> {
    let claims = Api::<ResourceClaim>::namespaced(ctx.client.clone(), NAMESPACE);
    let pod_api = Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE);
    holds_for(
        &format!("no claim of {pods:?} allocated and every pod gated"),
        period,
        || async {
            for pod in pods {
                let claim = claims.get(pod).await?;
                if claim
                    .status
                    .as_ref()
                    .and_then(|s| s.allocation.as_ref())
                    .is_some()
                {
                    return Ok(Err(format!("claim {pod} is allocated")));
                }
                let current = pod_api.get(pod).await?;
                let gates = current
                    .spec
                    .as_ref()
                    .and_then(|s| s.scheduling_gates.as_ref())
                    .map_or(0, |g| g.len());
                if gates == 0 {
                    return Ok(Err(format!(
                        "pod {pod} was released: {}",
                        pod_summary(&current)
                    )));
                }
            }
            Ok(Ok(()))
        },
    )
    .await
}

/// Waits until each pod's claim is allocated; returns the nodes, in pod order.
async fn nodes_of(ctx: &Ctx, pods: &[String]) -> anyhow::Result<Vec<String>> {
    let mut nodes = Vec::new();
    for pod in pods {
        let claims = wait_allocated(ctx, NAMESPACE, pod).await?;
        let claim = claims.first().context("a gang pod without a claim")?;
        nodes.push(claim.node()?.to_owned());
    }
    Ok(nodes)
}

fn ensure_on_pair(what: &str, nodes: &[String], layout: &Layout) -> anyhow::Result<()> {
    let got: BTreeSet<&str> = nodes.iter().map(String::as_str).collect();
    let want: BTreeSet<&str> = layout.pair.iter().map(String::as_str).collect();
    ensure!(
        got == want,
        "{what} landed on {nodes:?}; expected one pod on each node of rack e2e-r1 {:?}, not on {} (rack e2e-r0), though it comes first by name",
        layout.pair,
        layout.elsewhere
    );
    Ok(())
}

async fn run(ctx: &Ctx, layout: &Layout, nodes: &[String]) -> anyhow::Result<ScenarioOutcome> {
    label_racks(ctx, layout, nodes).await?;
    hold_half_of_each_node(ctx, layout).await?;
    // Gangs are named by a PodGroup where the cluster serves them, else by the label.
    let served = serves_pod_groups(ctx).await?;
    let upstream = if served {
        Naming::PodGroup
    } else {
        ctx.say(
            "the cluster does not serve scheduling.k8s.io/v1beta1 PodGroups (GenericWorkload off): \
             every gang is named by the label",
        );
        Naming::Label
    };
    let first = first_gang(ctx, layout, upstream).await?;
    let (second, huge) = waiting_gangs(ctx, upstream).await?;
    second_after_first(ctx, layout, &first, &second, &huge).await?;
    Ok(if served {
        ScenarioOutcome::Passed
    } else {
        ScenarioOutcome::Skipped(
            "passed with every gang named by the label; the PodGroup API part needs \
             scheduling.k8s.io/v1beta1 served (feature gate GenericWorkload, runtime config)"
                .to_owned(),
        )
    })
}

/// 1. Every node managed, with racks: the one named first by itself in rack e2e-r0, the others
///    in e2e-r1; then a fresh namespace.
async fn label_racks(ctx: &Ctx, layout: &Layout, nodes: &[String]) -> anyhow::Result<()> {
    for node in nodes {
        let rack = if *node == layout.elsewhere {
            "e2e-r0"
        } else {
            "e2e-r1"
        };
        label(
            ctx,
            node,
            serde_json::json!({ TOPOLOGY_MANAGED_LABEL: "true", RACK_LABEL: rack }),
        )
        .await?;
    }
    wait_tainted(ctx, nodes, true).await?;
    ctx.fresh_namespace(NAMESPACE).await?;
    create_namespace(&ctx.client, NAMESPACE).await?;
    Ok(())
}

/// 2. Half of each dgx-h100 node held, so that each node has room for one 4-GPU pod.
async fn hold_half_of_each_node(ctx: &Ctx, layout: &Layout) -> anyhow::Result<()> {
    for node in &layout.dgx {
        let name = format!("hold-{node}");
        let claim = gpu_claim(NAMESPACE, &name, 4, None)?;
        let mut pod = gpu_pod(NAMESPACE, &name, &name, PlacedBy::TopologyAware)?;
        pod.spec.get_or_insert_default().node_selector =
            Some([("kubernetes.io/hostname".to_owned(), node.clone())].into());
        create_claim_and_pod(&ctx.client, &claim, &pod).await?;
        let held = wait_allocated(ctx, NAMESPACE, &name).await?;
        let on = held.first().context("holder without a claim")?.node()?;
        ensure!(
            on == node,
            "holder {name} was placed on {on}, expected {node}"
        );
    }
    Ok(())
}

/// 3. The first gang (named `upstream`'s way): placed together on rack e2e-r1 and Running;
///    returns its pods.
async fn first_gang(ctx: &Ctx, layout: &Layout, upstream: Naming) -> anyhow::Result<Vec<String>> {
    let first = create_group(ctx, "first", (2, 2), 4, upstream).await?;
    let first_nodes = nodes_of(ctx, &first).await?;
    ctx.say(format!(
        "gang `first` (2 × 4 GPUs, {upstream:?}) placed on {first_nodes:?}"
    ));
    ensure_on_pair("gang `first`", &first_nodes, layout)?;
    let message = wait_reason(ctx, &first[0], "Allocated").await?;
    let key = match upstream {
        Naming::PodGroup => format!("PodGroup {NAMESPACE}/first"),
        Naming::Label => format!("group {NAMESPACE}/first"),
    };
    ensure!(
        message.contains(&key) && message.contains(&format!("{RACK_LABEL}=e2e-r1")),
        "pod {}: the condition does not say that {key} was placed together in rack e2e-r1: {message}",
        first[0]
    );
    for pod in &first {
        wait_running(ctx, NAMESPACE, pod).await?;
    }
    Ok(first)
}

/// 4. A second gang (the label) does not fit while the first runs; a gang that can never fit
///    (named `upstream`'s way) waits too. Neither gets a claim allocated. Returns their pods.
async fn waiting_gangs(ctx: &Ctx, upstream: Naming) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let second = create_group(ctx, "second", (2, 2), 4, Naming::Label).await?;
    let huge = create_group(ctx, "huge", (3, 3), 8, upstream).await?;
    for pod in second.iter().chain(&huge) {
        let message = wait_reason(ctx, pod, "GroupUnsatisfiable").await?;
        ensure!(
            message.contains("placed together"),
            "pod {pod}: the condition does not say what the gang waits for: {message}"
        );
    }
    let event = wait_event(ctx, &second[0], "GroupUnsatisfiable").await?;
    ensure!(
        event.contains(&format!("group {NAMESPACE}/second")) && event.contains("placed together"),
        "pod {}: the GroupUnsatisfiable event does not say what the gang waits for: {event}",
        second[0]
    );
    let waiting: Vec<String> = second.iter().chain(&huge).cloned().collect();
    nothing_allocated(ctx, &waiting, Duration::from_secs(5)).await?;
    ctx.say(format!(
        "gangs `second` (label) and `huge` ({upstream:?}) wait with no claim allocated; event: {event}"
    ));
    Ok((second, huge))
}

/// 5. The first gang finishes: the second runs, on the same rack; the huge one still waits.
async fn second_after_first(
    ctx: &Ctx,
    layout: &Layout,
    first: &[String],
    second: &[String],
    huge: &[String],
) -> anyhow::Result<()> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE);
    let claims = Api::<ResourceClaim>::namespaced(ctx.client.clone(), NAMESPACE);
    for pod in first {
        pods.delete(pod, &DeleteParams::default()).await?;
        claims.delete(pod, &DeleteParams::default()).await?;
    }
    let second_nodes = nodes_of(ctx, second).await?;
    ctx.say(format!(
        "gang `second` placed on {second_nodes:?} once `first` was deleted"
    ));
    ensure_on_pair("gang `second`", &second_nodes, layout)?;
    for pod in second {
        wait_running(ctx, NAMESPACE, pod).await?;
    }
    nothing_allocated(ctx, huge, Duration::from_secs(3)).await?;
    Ok(())
}
