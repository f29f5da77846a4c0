//! Queues and device-plugin pods (issue 28's done-when):
//!
//! - `foreign-gate`: a gated 4-GPU pod that also carries another component's gate
//!   (`example.com/hold`) gets no allocation while that gate is there (the controller's condition
//!   says `WaitingForGates`, naming it); once the gate is removed the controller places it on one
//!   NVLink island and it runs.
//! - `kueue-quota` (needs `tests/e2e/local-up --kueue`): a ClusterQueue with 4 GPUs of quota
//!   (`nvidia.com/gpu`, which Kueue maps to Tessera's class `gpu.tessera.dev`). A batch/v1 Job of
//!   one 4-GPU pod is admitted by Kueue and placed by the controller on one island; a plain pod
//!   asking 4 GPUs more waits with Kueue's gate, its claim never allocated, until the Job is
//!   deleted; then Kueue admits it and the controller places it.
//! - `device-plugin-conversion`: an unchanged `limits: {nvidia.com/gpu: 4}` pod in a namespace
//!   labelled for the conversion is converted at creation (a claim from the template
//!   `tessera-gpu-4`, which the controller creates, and the gate) and lands on one NVLink island
//!   and NUMA node; the same pod in an unlabelled namespace is stored as written and runs as today.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::json;
use tessera_api::names::{DEVICE_PLUGIN_CONVERSION_LABEL, GPU_DEVICE_CLASS, TOPOLOGY_AWARE_GATE};

use super::outcome::ScenarioOutcome;
use crate::context::Ctx;
use crate::devices::PublishedDevice;
use crate::objects::{PRINT_GPU_ENV, PlacedBy, create_claim_and_pod, gpu_claim, gpu_pod};
use crate::steps::{AllocatedClaim, pod_summary, wait_allocated, wait_running};
use crate::wait::{Progress, holds_for, until};

const CONDITION: &str = "gpu.tessera.dev/TopologyAwarePlacement";
/// Kueue's gate on the plain pods it manages.
const KUEUE_GATE: &str = "kueue.x-k8s.io/admission";
/// The label tests/e2e/install-kueue.sh restricts Kueue to.
pub(super) const KUEUE_MANAGED_LABEL: &str = "tessera.dev/kueue-managed";
/// The release's webhook configuration (chart: `<release>-webhook`, release `tessera`).
const WEBHOOK_CONFIGURATION: &str = "tessera-webhook";
/// How long a held pod is watched for an allocation it must not get.
const HELD: Duration = Duration::from_secs(15);

/// A namespace labelled as the suite's, plus `labels`.
pub(super) async fn labelled_namespace(
    ctx: &Ctx,
    name: &str,
    labels: &[(&str, &str)],
) -> anyhow::Result<()> {
    ctx.fresh_namespace(name).await?;
    let mut all = serde_json::Map::new();
    all.insert("app.kubernetes.io/part-of".into(), "tessera-e2e".into());
    for (key, value) in labels {
        all.insert((*key).into(), (*value).into());
    }
    let object: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": all},
    }))?;
    Api::<Namespace>::all(ctx.client.clone())
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("cannot create namespace {name}"))?;
    Ok(())
}

/// The controller's condition (reason, message) on a pod.
fn condition(pod: &Pod) -> Option<(String, String)> {
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

fn gates(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .into_iter()
        .flatten()
        .map(|g| g.name.clone())
        .collect()
}

/// Waits until `pod` carries the controller's condition with `reason`; returns its message.
async fn wait_reason(
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

/// Checks for [`HELD`] that `pod` keeps gate `gate` and no claim of it is allocated.
async fn stays_held(ctx: &Ctx, namespace: &str, pod: &str, gate: &str) -> anyhow::Result<()> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace);
    holds_for(
        &format!("pod {namespace}/{pod} to keep gate {gate} with no claim allocated"),
        HELD,
        || async {
            let current = pods.get(pod).await?;
            if !gates(&current).iter().any(|g| g == gate) {
                return Ok(Err(format!(
                    "gate {gate} is gone: {}",
                    pod_summary(&current)
                )));
            }
            for entry in crate::claims::pod_claims(&current) {
                let Some(name) = entry.claim_name else {
                    continue;
                };
                let claim = crate::claims::get_claim(&ctx.client, namespace, &name).await?;
                if claim.status.and_then(|s| s.allocation).is_some() {
                    return Ok(Err(format!("claim {name} was allocated")));
                }
            }
            Ok(Ok(()))
        },
    )
    .await
}

/// The devices of `claims` all share one NVLink island (and, with `numa`, one NUMA node).
pub(super) async fn one_island(
    ctx: &Ctx,
    claims: &[AllocatedClaim],
    numa: bool,
) -> anyhow::Result<()> {
    let published = ctx.published().await?;
    for claim in claims {
        let devices: Vec<&PublishedDevice> = claim.devices(&published)?;
        let islands: BTreeSet<Option<&str>> = devices.iter().map(|d| d.island()).collect();
        ensure!(
            islands.len() == 1 && !islands.contains(&None),
            "claim {}: the devices span NVLink islands {islands:?}",
            claim.name()
        );
        let nodes: BTreeSet<Option<i64>> = devices.iter().map(|d| d.numa_node()).collect();
        ensure!(
            !numa || nodes.len() == 1,
            "claim {}: the devices span NUMA nodes {nodes:?}",
            claim.name()
        );
    }
    Ok(())
}

/// Skipped unless some node is topology-managed (the controller places only there).
pub(super) async fn needs_managed_nodes(ctx: &Ctx) -> anyhow::Result<Option<ScenarioOutcome>> {
    Ok(ctx.managed_nodes().await?.is_empty().then(|| {
        ScenarioOutcome::Skipped(
            "no node is labelled gpu.tessera.dev/topology-managed=true".to_owned(),
        )
    }))
}

pub async fn foreign_gate(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    const NAMESPACE: &str = "tessera-e2e-foreign-gate";
    const HOLD: &str = "example.com/hold";
    if let Some(skipped) = needs_managed_nodes(ctx).await? {
        return Ok(skipped);
    }
    labelled_namespace(ctx, NAMESPACE, &[]).await?;
    let claim = gpu_claim(NAMESPACE, "held", 4, None)?;
    let mut pod = gpu_pod(NAMESPACE, "held", "held", PlacedBy::TopologyAware)?;
    pod.spec
        .get_or_insert_default()
        .scheduling_gates
        .get_or_insert_default()
        .push(serde_json::from_value(json!({"name": HOLD}))?);
    create_claim_and_pod(&ctx.client, &claim, &pod).await?;

    let message = wait_reason(ctx, NAMESPACE, "held", "WaitingForGates").await?;
    ensure!(
        message.contains(HOLD),
        "the condition does not name {HOLD}: {message}"
    );
    stays_held(ctx, NAMESPACE, "held", HOLD).await?;

    // Whoever holds the pod lets it go: only its own gate leaves.
    Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE)
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"schedulingGates": [{"name": TOPOLOGY_AWARE_GATE}]}})),
        )
        .await
        .context("cannot remove the gate example.com/hold")?;
    let claims = wait_allocated(ctx, NAMESPACE, "held").await?;
    one_island(ctx, &claims, false).await?;
    wait_reason(ctx, NAMESPACE, "held", "Allocated").await?;
    wait_running(ctx, NAMESPACE, "held").await?;
    ctx.delete_namespace(NAMESPACE).await?;
    Ok(ScenarioOutcome::Passed)
}

/// Kueue's API resource `kind` (`kueue.x-k8s.io/v1beta2`).
pub(super) fn kueue_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "kueue.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: "kueue.x-k8s.io/v1beta2".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Whether the cluster serves Kueue's ClusterQueues (local-up --kueue installs Kueue).
pub(super) async fn serves_kueue(ctx: &Ctx) -> anyhow::Result<bool> {
    let resource = kueue_resource("ClusterQueue", "clusterqueues");
    let api = Api::<DynamicObject>::all_with(ctx.client.clone(), &resource);
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(error).context("cannot list kueue.x-k8s.io/v1beta2 ClusterQueues"),
    }
}

/// Creates (or replaces a leftover of) a Kueue object from its JSON.
pub(super) async fn create_kueue_object(
    ctx: &Ctx,
    resource: &ApiResource,
    namespace: Option<&str>,
    object: serde_json::Value,
) -> anyhow::Result<()> {
    let object: DynamicObject = serde_json::from_value(object)?;
    let name = object.metadata.name.clone().unwrap_or_default();
    let api = match namespace {
        Some(ns) => Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, resource),
        None => Api::<DynamicObject>::all_with(ctx.client.clone(), resource),
    };
    if api.get_opt(&name).await?.is_some() {
        api.delete(&name, &DeleteParams::default()).await?;
        until(
            &format!(
                "{} {name} left by an earlier run to be deleted",
                resource.kind
            ),
            ctx.timeouts.delete,
            || async {
                Ok(match api.get_opt(&name).await? {
                    None => Progress::Done(()),
                    Some(_) => Progress::Waiting("still there".into()),
                })
            },
        )
        .await?;
    }
    api.create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("cannot create {} {name}", resource.kind))?;
    Ok(())
}

/// Deletes a cluster-scoped Kueue object, if it exists.
pub(super) async fn delete_kueue_object(
    ctx: &Ctx,
    resource: &ApiResource,
    name: &str,
) -> anyhow::Result<()> {
    let api = Api::<DynamicObject>::all_with(ctx.client.clone(), resource);
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error).with_context(|| format!("cannot delete {} {name}", resource.kind)),
    }
}

const KUEUE_NAMESPACE: &str = "tessera-e2e-kueue";
const FLAVOR: &str = "tessera-e2e-gpus";
const CLUSTER_QUEUE: &str = "tessera-e2e-gpus";
const LOCAL_QUEUE: &str = "gpus";
const FOUR_GPUS: &str = "four-gpus";

/// The ResourceFlavor, the ClusterQueue with 4 GPUs of quota for the scenario's namespace, its
/// LocalQueue, and the 4-GPU template Kueue counts.
async fn create_queues(ctx: &Ctx) -> anyhow::Result<()> {
    let flavors = kueue_resource("ResourceFlavor", "resourceflavors");
    create_kueue_object(
        ctx,
        &flavors,
        None,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
               "metadata": {"name": FLAVOR}, "spec": {}}),
    )
    .await?;
    let queues = kueue_resource("ClusterQueue", "clusterqueues");
    create_kueue_object(ctx, &queues, None, json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": CLUSTER_QUEUE},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": KUEUE_NAMESPACE}},
            "resourceGroups": [{
                "coveredResources": ["nvidia.com/gpu"],
                "flavors": [{"name": FLAVOR, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]}],
            }],
        },
    }))
    .await?;
    let local = kueue_resource("LocalQueue", "localqueues");
    create_kueue_object(
        ctx,
        &local,
        Some(KUEUE_NAMESPACE),
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": KUEUE_NAMESPACE},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        }),
    )
    .await?;
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": FOUR_GPUS, "namespace": KUEUE_NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": GPU_DEVICE_CLASS, "count": 4}}
        ]}}},
    }))?;
    Api::<ResourceClaimTemplate>::namespaced(ctx.client.clone(), KUEUE_NAMESPACE)
        .create(&PostParams::default(), &template)
        .await
        .context("cannot create the 4-GPU ResourceClaimTemplate")?;
    Ok(())
}

/// A pod spec (as JSON) with Tessera's gate and a claim from the 4-GPU template.
pub(super) fn queued_pod_spec() -> serde_json::Value {
    json!({
        "terminationGracePeriodSeconds": 5,
        "schedulingGates": [{"name": TOPOLOGY_AWARE_GATE}],
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": FOUR_GPUS}],
        "containers": [{
            "name": "ctr",
            "image": "busybox:1.37",
            "command": ["sh", "-c", PRINT_GPU_ENV],
            "resources": {"claims": [{"name": "gpus"}]},
        }],
    })
}

/// The Job's one pod, once the Job controller made it.
async fn job_pod(ctx: &Ctx, job: &str) -> anyhow::Result<String> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), KUEUE_NAMESPACE);
    until(
        &format!("Job {KUEUE_NAMESPACE}/{job} to have a pod"),
        ctx.timeouts.allocate,
        || async {
            let list = pods
                .list(&ListParams::default().labels(&format!("job-name={job}")))
                .await?;
            Ok(match list.items.into_iter().find_map(|p| p.metadata.name) {
                Some(name) => Progress::Done(name),
                None => Progress::Waiting("no pod yet (Kueue has not admitted the Job?)".into()),
            })
        },
    )
    .await
}

pub async fn kueue_quota(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    if !serves_kueue(ctx).await? {
        return Ok(ScenarioOutcome::Skipped(
            "Kueue is not installed (tests/e2e/local-up --kueue installs it)".to_owned(),
        ));
    }
    if let Some(skipped) = needs_managed_nodes(ctx).await? {
        return Ok(skipped);
    }
    labelled_namespace(ctx, KUEUE_NAMESPACE, &[(KUEUE_MANAGED_LABEL, "true")]).await?;
    let result = run_kueue_quota(ctx).await;
    ctx.delete_namespace(KUEUE_NAMESPACE).await?;
    for (kind, plural, name) in [
        ("ClusterQueue", "clusterqueues", CLUSTER_QUEUE),
        ("ResourceFlavor", "resourceflavors", FLAVOR),
    ] {
        delete_kueue_object(ctx, &kueue_resource(kind, plural), name).await?;
    }
    result
}

async fn run_kueue_quota(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    create_queues(ctx).await?;
    let labels = json!({
        "kueue.x-k8s.io/queue-name": LOCAL_QUEUE,
        "app.kubernetes.io/part-of": "tessera-e2e",
    });

    // 1. A Job of one 4-GPU pod: Kueue suspends it at creation and admits it within the quota;
    //    its pod carries only Tessera's gate, and the controller places it.
    let mut spec = queued_pod_spec();
    spec["restartPolicy"] = json!("Never");
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "first", "namespace": KUEUE_NAMESPACE, "labels": labels},
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/part-of": "tessera-e2e"}},
                "spec": spec,
            },
        },
    }))?;
    let jobs = Api::<Job>::namespaced(ctx.client.clone(), KUEUE_NAMESPACE);
    jobs.create(&PostParams::default(), &job)
        .await
        .context("cannot create the Job")?;
    let first = job_pod(ctx, "first").await?;
    let claims = wait_allocated(ctx, KUEUE_NAMESPACE, &first).await?;
    one_island(ctx, &claims, false).await?;
    wait_running(ctx, KUEUE_NAMESPACE, &first).await?;
    ctx.say(format!(
        "Job first admitted by Kueue, its pod {first} placed and running"
    ));

    // 2. A plain pod asking 4 GPUs more: over the quota, Kueue keeps its gate on it and the
    //    controller allocates nothing.
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "second", "namespace": KUEUE_NAMESPACE, "labels": labels},
        "spec": queued_pod_spec(),
    }))?;
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), KUEUE_NAMESPACE);
    pods.create(&PostParams::default(), &pod)
        .await
        .context("cannot create the plain pod")?;
    let created = pods.get("second").await?;
    ensure!(
        gates(&created).iter().any(|g| g == KUEUE_GATE),
        "Kueue's webhook did not add its gate {KUEUE_GATE}: {}",
        pod_summary(&created)
    );
    let message = wait_reason(ctx, KUEUE_NAMESPACE, "second", "WaitingForGates").await?;
    ensure!(
        message.contains(KUEUE_GATE),
        "the condition does not name {KUEUE_GATE}: {message}"
    );
    stays_held(ctx, KUEUE_NAMESPACE, "second", KUEUE_GATE).await?;

    // 3. The Job goes: its quota is free, Kueue admits the pod, the controller places it.
    jobs.delete("first", &DeleteParams::foreground())
        .await
        .context("cannot delete the Job")?;
    let claims = wait_allocated(ctx, KUEUE_NAMESPACE, "second").await?;
    one_island(ctx, &claims, false).await?;
    wait_running(ctx, KUEUE_NAMESPACE, "second").await?;
    Ok(ScenarioOutcome::Passed)
}

/// Whether the release's conversion webhook is installed (chart value
/// controller.devicePluginConversion.enabled).
async fn conversion_installed(ctx: &Ctx) -> anyhow::Result<bool> {
    let api = Api::<MutatingWebhookConfiguration>::all(ctx.client.clone());
    Ok(api.get_opt(WEBHOOK_CONFIGURATION).await?.is_some())
}

/// `limits: {nvidia.com/gpu: 4}`, no claims, no gate: a pod written for the device plugin.
fn device_plugin_pod(namespace: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "four-gpus", "namespace": namespace,
                     "labels": {"app.kubernetes.io/part-of": "tessera-e2e"}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "ctr",
                "image": "busybox:1.37",
                "command": ["sh", "-c", PRINT_GPU_ENV],
                "resources": {"limits": {"nvidia.com/gpu": "4"}},
            }],
        },
    }))?)
}

pub async fn device_plugin_conversion(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    const CONVERTED: &str = "tessera-e2e-converted";
    const UNCHANGED: &str = "tessera-e2e-unconverted";
    if !conversion_installed(ctx).await? {
        return Ok(ScenarioOutcome::Skipped(format!(
            "no MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION}: the chart was installed without controller.devicePluginConversion.enabled"
        )));
    }
    if let Some(skipped) = needs_managed_nodes(ctx).await? {
        return Ok(skipped);
    }
    labelled_namespace(
        ctx,
        CONVERTED,
        &[(DEVICE_PLUGIN_CONVERSION_LABEL, "enabled")],
    )
    .await?;
    labelled_namespace(ctx, UNCHANGED, &[]).await?;

    // 1. Converted at creation: a claim from tessera-gpu-4, the container's claim entry, no
    //    limit, Tessera's gate.
    let created = Api::<Pod>::namespaced(ctx.client.clone(), CONVERTED)
        .create(&PostParams::default(), &device_plugin_pod(CONVERTED)?)
        .await
        .context("cannot create the device-plugin pod in the opted-in namespace")?;
    check_converted(&created)?;

    // 2. The controller creates the template; kube-controller-manager the claim; the controller
    //    places it on one island and NUMA node.
    let claims = wait_allocated(ctx, CONVERTED, "four-gpus").await?;
    let managed = ctx.managed_nodes().await?;
    for claim in &claims {
        let node = claim.node()?;
        ensure!(
            managed.iter().any(|m| m == node),
            "claim {} was allocated on {node}, which is not topology-managed",
            claim.name()
        );
    }
    one_island(ctx, &claims, true).await?;
    wait_running(ctx, CONVERTED, "four-gpus").await?;
    unchanged_elsewhere(ctx, UNCHANGED).await?;
    ctx.delete_namespace(CONVERTED).await?;
    ctx.delete_namespace(UNCHANGED).await?;
    Ok(ScenarioOutcome::Passed)
}

/// The same pod in `namespace`, which did not opt in: stored as written, it runs as today
/// (kube-scheduler makes the claim for the extended resource).
async fn unchanged_elsewhere(ctx: &Ctx, namespace: &str) -> anyhow::Result<()> {
    let unchanged = Api::<Pod>::namespaced(ctx.client.clone(), namespace)
        .create(&PostParams::default(), &device_plugin_pod(namespace)?)
        .await
        .context("cannot create the device-plugin pod in the other namespace")?;
    let spec = unchanged.spec.clone().unwrap_or_default();
    ensure!(
        spec.resource_claims.is_none() && spec.scheduling_gates.is_none(),
        "a pod outside opted-in namespaces was changed: {}",
        pod_summary(&unchanged)
    );
    wait_running(ctx, namespace, "four-gpus").await?;
    Ok(())
}

/// What the webhook made of the pod: a claim from tessera-gpu-4, no limit, Tessera's gate.
fn check_converted(created: &Pod) -> anyhow::Result<()> {
    let spec = created.spec.clone().unwrap_or_default();
    let templates: Vec<String> = spec
        .resource_claims
        .iter()
        .flatten()
        .filter_map(|c| c.resource_claim_template_name.clone())
        .collect();
    ensure!(
        templates == ["tessera-gpu-4"],
        "the pod was not converted to a claim from tessera-gpu-4 (is the webhook reachable?): {}",
        serde_json::to_string(&spec.resource_claims)?
    );
    let limits = spec.containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    ensure!(
        !limits.contains_key("nvidia.com/gpu"),
        "the converted container still asks nvidia.com/gpu: {limits:?}"
    );
    ensure!(
        gates(created).iter().any(|g| g == TOPOLOGY_AWARE_GATE),
        "the converted pod lacks the gate {TOPOLOGY_AWARE_GATE}"
    );

    Ok(())
}
