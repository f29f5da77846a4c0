//! Consumable shares (issue 13, item 3): separate claims allocated one GPU by the real
//! kube-scheduler, each consuming part of it.
//!
//! Both scenarios switch the unmanaged dgx-h100 node's plugin to a consumable-shares mode with
//! `helm upgrade` (that node group's `sharing.consumableShares`), and switch it back afterwards,
//! whether they passed or not, so the other scenarios see exclusive GPUs:
//!
//! - `shares-memory` (`memory` mode): three replicas of a Deployment whose claim template asks
//!   for 20Gi each share one 80 GB H100 (81559Mi); a fourth pod whose claim asks for no memory
//!   gets the whole of another GPU (an unset request takes all of it in this mode). (An H100
//!   80GB has 81559Mi, less than 80Gi, so a claim for 80Gi fits no H100 at all; "the whole GPU"
//!   is the request that must not fit next to the replicas.)
//! - `shares-replicas` (`4`): pods whose claims ask for one GPU (pinned to `gpu-0`) and nothing
//!   else get one of 4 shares each: four run on gpu-0, the fifth waits Pending
//!   (`Unschedulable`: the scheduler cannot allocate its claim), and runs once one of the four is
//!   deleted.
//!
//! Every container must see its device and be told its part (`TESSERA_GPU_MEMORY_LIMIT`,
//! `TESSERA_GPU_SHARES`/`_TOTAL`); every claim is prepared and, after deletion, unprepared.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tessera_api::names::{DRIVER_NAME, GPU_DEVICE_CLASS};
use tessera_api::shares::{ENV_MEMORY_LIMIT, ENV_SHARES, ENV_SHARES_TOTAL};

use super::outcome::ScenarioOutcome;
use super::slices::is_dgx_h100;
use crate::context::Ctx;
use crate::devices::parse_quantity;
use crate::local::HelmRelease;
use crate::objects::{PRINT_GPU_ENV, create_namespace};
use crate::observer::RuntimeObserver;
use crate::steps::{
    AllocatedClaim, check_containers, check_prepared, check_unprepared, pod_summary,
    wait_allocated, wait_running,
};
use crate::wait::{Progress, holds_for, until};

const MEMORY_NAMESPACE: &str = "tessera-e2e-shares-memory";
const REPLICAS_NAMESPACE: &str = "tessera-e2e-shares-replicas";
/// The node label local-up's node groups select on.
const TEST_NODE_LABEL: &str = "tessera.dev/test-node";
pub(super) const GIB: u128 = 1 << 30;

pub async fn shares_memory(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    with_sharing(ctx, "memory", |node| {
        memory_body(ctx, node, MEMORY_NAMESPACE)
    })
    .await
}

pub async fn shares_replicas(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    with_sharing(ctx, "4", |node| {
        replicas_body(ctx, node, REPLICAS_NAMESPACE, 4)
    })
    .await
}

/// Which unmanaged node a sharing scenario switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedNode {
    /// The dgx-h100 node (8 whole H100s).
    DgxH100,
    /// A node publishing MIG devices (hgx-a100-mig: static MIG instances on GPUs 0-3).
    Mig,
}

/// Switches the unmanaged dgx-h100 node to `mode`, runs `body` on it, and switches it back
/// (also when `body` failed; a failure to switch back is reported after `body`'s own).
pub async fn with_sharing<'a, F, Fut>(
    ctx: &'a Ctx,
    mode: &str,
    body: F,
) -> anyhow::Result<ScenarioOutcome>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + 'a,
{
    with_sharing_on(ctx, SharedNode::DgxH100, mode, body).await
}

/// [`with_sharing`] on the unmanaged node of kind `which`.
pub async fn with_sharing_on<'a, F, Fut>(
    ctx: &'a Ctx,
    which: SharedNode,
    mode: &str,
    body: F,
) -> anyhow::Result<ScenarioOutcome>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + 'a,
{
    let RuntimeObserver::Local { local, .. } = &ctx.observer else {
        return Ok(ScenarioOutcome::Skipped(
            "switching a node's consumable shares needs the local cluster's helm release".into(),
        ));
    };
    let Some(release) = local.helm.clone() else {
        return Ok(ScenarioOutcome::Skipped(
            "Tessera is not installed by helm here (or by a local-up that does not record it)"
                .into(),
        ));
    };
    let published = ctx.published().await?;
    let managed = ctx.managed_nodes().await?;
    let fits = |n: &String| match which {
        SharedNode::DgxH100 => is_dgx_h100(&published.whole_gpus(n)),
        SharedNode::Mig => published.on_node(n).any(|d| d.is_mig()),
    };
    let Some(node) = published
        .nodes()
        .into_iter()
        .find(|n| !managed.contains(n) && fits(n))
    else {
        return Ok(ScenarioOutcome::Skipped(format!(
            "needs an unmanaged {} node; publishing: {:?}",
            match which {
                SharedNode::DgxH100 => "dgx-h100",
                SharedNode::Mig => "MIG",
            },
            published.nodes()
        )));
    };
    let shared_values = local.state_dir.join("tessera/values-sharing.yaml");
    write_values_with_sharing(&release.values, &shared_values, &node, mode)?;
    ctx.say(format!(
        "helm upgrade: node {node} publishes with consumable shares `{mode}`"
    ));
    let kubeconfig = local.kubeconfig.clone();
    helm_upgrade(&release, &kubeconfig, &shared_values).await?;
    wait_shared(ctx, &node, true).await?;
    let result = body(node.clone()).await;
    ctx.say(format!("helm upgrade: node {node} back to exclusive GPUs"));
    let restored = async {
        helm_upgrade(&release, &kubeconfig, &release.values).await?;
        wait_shared(ctx, &node, false).await
    }
    .await;
    std::fs::remove_file(&shared_values).ok();
    result?;
    restored?;
    Ok(ScenarioOutcome::Passed)
}

/// `values` with the node group of `node` set to consumable shares `mode`, written to `out`.
fn write_values_with_sharing(
    values: &Path,
    out: &Path,
    node: &str,
    mode: &str,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(values)
        .with_context(|| format!("cannot read {}", values.display()))?;
    let mut doc: serde_yaml::Value =
        serde_yaml::from_str(&text).with_context(|| format!("{} is not YAML", values.display()))?;
    let groups = doc
        .get_mut("kubeletPlugin")
        .and_then(|p| p.get_mut("nodeGroups"))
        .and_then(serde_yaml::Value::as_sequence_mut)
        .with_context(|| format!("{} has no kubeletPlugin.nodeGroups", values.display()))?;
    let group = groups
        .iter_mut()
        .find(|g| {
            g.get("nodeSelector")
                .and_then(|s| s.get(TEST_NODE_LABEL))
                .and_then(serde_yaml::Value::as_str)
                == Some(node)
        })
        .with_context(|| format!("{}: no node group selects {node}", values.display()))?;
    let mapping = group
        .as_mapping_mut()
        .context("a node group is not a mapping")?;
    let mut sharing = serde_yaml::Mapping::new();
    sharing.insert("consumableShares".into(), mode.into());
    mapping.insert("sharing".into(), serde_yaml::Value::Mapping(sharing));
    std::fs::write(out, serde_yaml::to_string(&doc)?)
        .with_context(|| format!("cannot write {}", out.display()))
}

async fn helm_upgrade(
    release: &HelmRelease,
    kubeconfig: &Path,
    values: &Path,
) -> anyhow::Result<()> {
    let release = release.clone();
    let values: PathBuf = values.to_owned();
    let kubeconfig: PathBuf = kubeconfig.to_owned();
    tokio::task::spawn_blocking(move || {
        let output = std::process::Command::new(&release.helm)
            .args(["upgrade", "tessera"])
            .arg(&release.chart)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--namespace", &release.namespace, "--values"])
            .arg(&values)
            .args(["--wait", "--timeout", "180s"])
            .output()
            .with_context(|| format!("cannot run {}", release.helm.display()))?;
        ensure!(
            output.status.success(),
            "helm upgrade with {} failed: {}{}",
            values.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    })
    .await?
}

/// Waits until every device `node` publishes that can be shared is multi-allocatable (`shared`),
/// or none is. Devices that consume counters (GPUs partitionable by dynamic MIG) are never
/// published shareable.
async fn wait_shared(ctx: &Ctx, node: &str, shared: bool) -> anyhow::Result<()> {
    let slices = Api::<ResourceSlice>::all(ctx.client.clone());
    let selector = format!("spec.nodeName={node},spec.driver={DRIVER_NAME}");
    until(
        &format!(
            "{node}'s devices to be published {}",
            if shared {
                "multi-allocatable"
            } else {
                "exclusive"
            }
        ),
        ctx.timeouts.restart,
        || async {
            let list = slices
                .list(&ListParams::default().fields(&selector))
                .await?;
            let flags: Vec<bool> = list
                .items
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .filter(|d| d.consumes_counters.as_ref().is_none_or(Vec::is_empty))
                .map(|d| d.allow_multiple_allocations == Some(true))
                .collect();
            Ok(if !flags.is_empty() && flags.iter().all(|&f| f == shared) {
                Progress::Done(())
            } else {
                Progress::Waiting(format!("allowMultipleAllocations per device: {flags:?}"))
            })
        },
    )
    .await
}

/// A claim template for one GPU of `node`'s class, asking for `memory` (or nothing), optionally
/// narrowed by a CEL selector.
pub(super) fn template(
    namespace: &str,
    name: &str,
    memory: Option<&str>,
    selector: Option<&str>,
) -> anyhow::Result<ResourceClaimTemplate> {
    let mut exactly = serde_json::json!({"deviceClassName": GPU_DEVICE_CLASS});
    if let Some(memory) = memory {
        exactly["capacity"] = serde_json::json!({"requests": {"memory": memory}});
    }
    if let Some(expression) = selector {
        exactly["selectors"] = serde_json::json!([{"cel": {"expression": expression}}]);
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }))
    .context("building a ResourceClaimTemplate")
}

/// The pod spec every pod here uses: one container with a claim from `template`, on `node`.
pub(super) fn pod_spec(node: &str, template: &str) -> serde_json::Value {
    serde_json::json!({
        "terminationGracePeriodSeconds": 5,
        "nodeSelector": {"kubernetes.io/hostname": node},
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        "containers": [{
            "name": "ctr",
            "image": "busybox:1.37",
            "command": ["sh", "-c", PRINT_GPU_ENV],
            "resources": {"claims": [{"name": "gpu"}]},
        }],
    })
}

pub(super) fn pod(namespace: &str, name: &str, node: &str, template: &str) -> anyhow::Result<Pod> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name,
                     "labels": {"app.kubernetes.io/part-of": "tessera-e2e"}},
        "spec": pod_spec(node, template),
    }))
    .context("building a Pod")
}

pub(super) async fn create<K>(ctx: &Ctx, namespace: &str, object: &K) -> anyhow::Result<()>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::namespaced(ctx.client.clone(), namespace)
        .create(&PostParams::default(), object)
        .await
        .with_context(|| {
            format!(
                "cannot create {namespace}/{}",
                object.meta().name.as_deref().unwrap_or_default()
            )
        })?;
    Ok(())
}

/// The one device of a pod's one claim, with its share.
pub(super) struct Share {
    pub pod: String,
    pub claim: AllocatedClaim,
    pub device: String,
    pub share_id: String,
    pub consumed: BTreeMap<String, String>,
}

pub(super) async fn share_of(ctx: &Ctx, namespace: &str, pod: &str) -> anyhow::Result<Share> {
    let claims = wait_allocated(ctx, namespace, pod).await?;
    let claim = claims.into_iter().next().context("the pod has no claim")?;
    let device = claim
        .allocation
        .ours()
        .next()
        .with_context(|| format!("claim {} holds no Tessera device", claim.name()))?
        .clone();
    let share_id = device.share_id.clone().with_context(|| {
        format!(
            "claim {} got {} without a shareID: the device was not allocated as shared",
            claim.name(),
            device.device
        )
    })?;
    Ok(Share {
        pod: pod.to_owned(),
        device: device.device,
        share_id,
        consumed: device.consumed,
        claim,
    })
}

pub(super) fn consumed_bytes(share: &Share, capacity: &str) -> anyhow::Result<u128> {
    let text = share.consumed.get(capacity).with_context(|| {
        format!(
            "pod {}: consumedCapacity has no {capacity}: {:?}",
            share.pod, share.consumed
        )
    })?;
    parse_quantity(text).with_context(|| format!("consumed {capacity} `{text}` is no quantity"))
}

/// Runs the checks every running pod gets, and returns the environment its container printed.
pub(super) async fn check_running(
    ctx: &Ctx,
    namespace: &str,
    share: &Share,
) -> anyhow::Result<BTreeMap<String, String>> {
    let pod = wait_running(ctx, namespace, &share.pod).await?;
    let published = ctx.published().await?;
    check_containers(ctx, &pod, std::slice::from_ref(&share.claim), &published).await?;
    let view = ctx
        .observer
        .container_view(&pod, "ctr")
        .await?
        .with_context(|| format!("no output of {}/ctr", share.pod))?;
    Ok(view.env)
}

pub(super) fn ensure_env(
    env: &BTreeMap<String, String>,
    pod: &str,
    name: &str,
    want: &str,
) -> anyhow::Result<()> {
    ensure!(
        env.get(name).map(String::as_str) == Some(want),
        "pod {pod}: {name}={:?}, expected {want}",
        env.get(name)
    );
    Ok(())
}

pub(super) async fn pods_of(ctx: &Ctx, namespace: &str, app: &str) -> anyhow::Result<Vec<String>> {
    let list = Api::<Pod>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect())
}

async fn memory_body(ctx: &Ctx, node: String, namespace: &str) -> anyhow::Result<()> {
    ctx.fresh_namespace(namespace).await?;
    create_namespace(&ctx.client, namespace).await?;
    let shares = three_replicas_share_a_gpu(ctx, &node, namespace).await?;
    let whole = whole_gpu_apart(ctx, &node, namespace, &shares[0].device).await?;
    for share in shares.iter().chain([&whole]) {
        let env = check_running(ctx, namespace, share).await?;
        let memory = consumed_bytes(share, "memory")?.to_string();
        ensure_env(&env, &share.pod, ENV_MEMORY_LIMIT, &memory)?;
    }
    let claims: Vec<AllocatedClaim> = shares
        .iter()
        .chain([&whole])
        .map(|s| s.claim.clone())
        .collect();
    check_prepared(ctx, &claims).await?;
    ctx.delete_namespace(namespace).await?;
    check_unprepared(ctx, &claims).await
}

/// A Deployment of three replicas asking 20Gi each: one GPU of `node` shared, each with its own
/// share id. Returns their shares.
async fn three_replicas_share_a_gpu(
    ctx: &Ctx,
    node: &str,
    namespace: &str,
) -> anyhow::Result<Vec<Share>> {
    create(
        ctx,
        namespace,
        &template(namespace, "gpu-20gi", Some("20Gi"), None)?,
    )
    .await?;
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"namespace": namespace, "name": "inference"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "inference"}},
            "template": {
                "metadata": {"labels": {"app": "inference", "app.kubernetes.io/part-of": "tessera-e2e"}},
                "spec": pod_spec(node, "gpu-20gi"),
            },
        },
    }))?;
    create(ctx, namespace, &deployment).await?;
    let replicas = until(
        "the Deployment's three pods",
        ctx.timeouts.allocate,
        || async {
            let pods = pods_of(ctx, namespace, "inference").await?;
            Ok(if pods.len() == 3 {
                Progress::Done(pods)
            } else {
                Progress::Waiting(format!("pods: {pods:?}"))
            })
        },
    )
    .await?;
    let mut shares = Vec::new();
    for pod in &replicas {
        shares.push(share_of(ctx, namespace, pod).await?);
    }
    let devices: BTreeSet<&str> = shares.iter().map(|s| s.device.as_str()).collect();
    ensure!(
        devices.len() == 1,
        "the three 20Gi replicas were allocated {devices:?}; 60Gi fit one 81559Mi H100"
    );
    let ids: BTreeSet<&str> = shares.iter().map(|s| s.share_id.as_str()).collect();
    ensure!(ids.len() == 3, "share ids must differ: {ids:?}");
    for share in &shares {
        ensure!(
            share.claim.node()? == node,
            "claim {} allocated on {}, not {node}",
            share.claim.name(),
            share.claim.node()?
        );
        ensure!(
            consumed_bytes(share, "memory")? == 20 * GIB,
            "pod {}: consumed {:?}, expected memory 20Gi",
            share.pod,
            share.consumed
        );
    }
    let shared_device = shares[0].device.clone();
    ctx.say(format!(
        "three replicas share {node}/{shared_device}, 20Gi each (share ids {ids:?})"
    ));
    Ok(shares)
}

/// The fourth claim asks for no memory, which in `memory` mode is all of it: a GPU other than
/// `shared_device`, all its memory consumed. Returns its share.
async fn whole_gpu_apart(
    ctx: &Ctx,
    node: &str,
    namespace: &str,
    shared_device: &str,
) -> anyhow::Result<Share> {
    create(
        ctx,
        namespace,
        &template(namespace, "gpu-whole", None, None)?,
    )
    .await?;
    create(ctx, namespace, &pod(namespace, "whole", node, "gpu-whole")?).await?;
    let whole = share_of(ctx, namespace, "whole").await?;
    ensure!(
        whole.device != shared_device,
        "the whole-GPU claim got {}, which the three replicas share",
        whole.device
    );
    let published = ctx.published().await?;
    let capacity = published
        .get(node, &whole.device)
        .and_then(|d| d.capacity_bytes("memory"))
        .context("the whole-GPU claim's device publishes no memory")?;
    ensure!(
        consumed_bytes(&whole, "memory")? == capacity,
        "the claim that asked for nothing consumed {:?}, expected all {capacity} bytes",
        whole.consumed
    );
    ctx.say(format!(
        "the fourth claim (no memory asked: the whole GPU) got {node}/{}",
        whole.device
    ));
    Ok(whole)
}

async fn replicas_body(ctx: &Ctx, node: String, namespace: &str, n: usize) -> anyhow::Result<()> {
    ctx.fresh_namespace(namespace).await?;
    create_namespace(&ctx.client, namespace).await?;
    let shares = n_pods_share_gpu_0(ctx, &node, namespace, n).await?;
    let extra = format!("replica-{n}");
    extra_pod_waits(ctx, &node, namespace, &extra).await?;
    let last = freeing_a_share_runs(ctx, &node, namespace, &shares[0], &extra).await?;
    let claims: Vec<AllocatedClaim> = shares
        .iter()
        .skip(1)
        .chain([&last])
        .map(|s| s.claim.clone())
        .collect();
    check_prepared(ctx, &claims).await?;
    ctx.delete_namespace(namespace).await?;
    let mut all = claims;
    all.push(shares[0].claim.clone());
    check_unprepared(ctx, &all).await
}

/// `n` one-share pods on gpu-0 of `node`, each Running with its share. Returns their shares.
async fn n_pods_share_gpu_0(
    ctx: &Ctx,
    node: &str,
    namespace: &str,
    n: usize,
) -> anyhow::Result<Vec<Share>> {
    let on_gpu_0 = format!("device.attributes[\"{DRIVER_NAME}\"].minor == 0");
    create(
        ctx,
        namespace,
        &template(namespace, "one-share", None, Some(&on_gpu_0))?,
    )
    .await?;
    let mut shares = Vec::new();
    for i in 0..n {
        let name = format!("replica-{i}");
        create(ctx, namespace, &pod(namespace, &name, node, "one-share")?).await?;
        shares.push(share_of(ctx, namespace, &name).await?);
    }
    for share in &shares {
        ensure!(
            share.device == "gpu-0" && share.claim.node()? == node,
            "pod {} got {} on {}, expected {node}/gpu-0",
            share.pod,
            share.device,
            share.claim.node()?
        );
        ensure!(
            consumed_bytes(share, "shares")? == 1,
            "pod {}: consumed {:?}, expected one share",
            share.pod,
            share.consumed
        );
        let env = check_running(ctx, namespace, share).await?;
        ensure_env(&env, &share.pod, ENV_SHARES, "1")?;
        ensure_env(&env, &share.pod, ENV_SHARES_TOTAL, &n.to_string())?;
    }
    let ids: BTreeSet<&str> = shares.iter().map(|s| s.share_id.as_str()).collect();
    ensure!(ids.len() == n, "share ids must differ: {ids:?}");
    ctx.say(format!("{n} pods run on {node}/gpu-0, one share each"));
    Ok(shares)
}

/// The N+1th pod `extra` waits: Pending, unschedulable because its claim cannot be allocated.
async fn extra_pod_waits(
    ctx: &Ctx,
    node: &str,
    namespace: &str,
    extra: &str,
) -> anyhow::Result<()> {
    create(ctx, namespace, &pod(namespace, extra, node, "one-share")?).await?;
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace);
    let message = until(
        &format!("pod {extra} to be reported unschedulable"),
        ctx.timeouts.allocate,
        || async {
            let current = pods.get(extra).await?;
            let scheduled = current
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
                .cloned();
            Ok(match scheduled {
                Some(c) if c.status == "False" && c.reason.as_deref() == Some("Unschedulable") => {
                    Progress::Done(c.message.unwrap_or_default())
                }
                Some(c) if c.status == "True" => {
                    bail!("pod {extra} was scheduled: {}", pod_summary(&current))
                }
                _ => Progress::Waiting(pod_summary(&current)),
            })
        },
    )
    .await?;
    ensure!(
        message.contains("cannot allocate all claims"),
        "pod {extra} is unschedulable, but not for its claim: {message}"
    );
    holds_for(
        &format!("pod {extra} to stay Pending"),
        Duration::from_secs(5),
        || async {
            let current = pods.get(extra).await?;
            let phase = current.status.as_ref().and_then(|s| s.phase.clone());
            let node_name = current.spec.as_ref().and_then(|s| s.node_name.clone());
            Ok(
                if phase.as_deref() == Some("Pending") && node_name.is_none() {
                    Ok(())
                } else {
                    Err(pod_summary(&current))
                },
            )
        },
    )
    .await?;
    ctx.say(format!(
        "pod {extra} waits (PodScheduled=False, Unschedulable): {message}"
    ));
    Ok(())
}

/// Deleting the pod of `freed` lets `extra` run, on gpu-0. Returns its share.
async fn freeing_a_share_runs(
    ctx: &Ctx,
    node: &str,
    namespace: &str,
    freed: &Share,
    extra: &str,
) -> anyhow::Result<Share> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace);
    pods.delete(&freed.pod, &DeleteParams::default())
        .await
        .with_context(|| format!("cannot delete pod {}", freed.pod))?;
    let last = share_of(ctx, namespace, extra).await?;
    ensure!(
        last.device == "gpu-0",
        "pod {extra} got {} once a share was free, expected gpu-0",
        last.device
    );
    check_running(ctx, namespace, &last).await?;
    ctx.say(format!("one pod deleted: {extra} runs on {node}/gpu-0"));
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_values_gain_the_sharing_of_one_node_group() {
        let dir = tempfile::tempdir().unwrap();
        let values = dir.path().join("values.yaml");
        std::fs::write(
            &values,
            [
                "kubeletPlugin:",
                "  backend: mock",
                "  nodeGroups:",
                "  - name: node-1",
                "    nodeSelector: {tessera.dev/test-node: tessera-node-1}",
                "  - name: node-2",
                "    nodeSelector: {tessera.dev/test-node: tessera-node-2}",
            ]
            .join("\n"),
        )
        .unwrap();
        let out = dir.path().join("out.yaml");
        write_values_with_sharing(&values, &out, "tessera-node-2", "4").unwrap();
        let doc: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let groups = doc["kubeletPlugin"]["nodeGroups"].as_sequence().unwrap();
        assert!(groups[0].get("sharing").is_none());
        assert_eq!(groups[1]["sharing"]["consumableShares"].as_str(), Some("4"));
        assert_eq!(doc["kubeletPlugin"]["backend"].as_str(), Some("mock"));
        assert!(write_values_with_sharing(&values, &out, "tessera-node-9", "4").is_err());
    }
}
