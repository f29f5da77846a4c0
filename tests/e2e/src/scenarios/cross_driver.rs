//! deploy/examples/gpu-nic-aligned: a GPU and another driver's NIC lined up by kube-scheduler on
//! the standard attributes `resource.kubernetes.io/pcieRoot` and `resource.kubernetes.io/numaNode`.
//! The NIC driver is a stand-in: the example's DeviceClass and ResourceSlice, and on the local
//! cluster a kubelet plugin per node (crate::stand_in) that prepares its half of each claim with no
//! device. The scenario checks the real scheduler's allocation, then that the pod runs with its
//! GPUs (the kubelet prepared each claim with both drivers, the stand-in recorded its calls) and
//! that both drivers unprepare the claims when the pod goes. Elsewhere (kind), with no NIC plugin,
//! it checks instead that the kubelet names the missing driver rather than starting the pod.

use std::collections::BTreeSet;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams};
use tessera_api::names::{DRIVER_NAME, attr};

use super::outcome::ScenarioOutcome;
use crate::context::Ctx;
use crate::devices::PublishedAttribute;
use crate::manifest::{Manifest, Object};
use crate::stand_in::StandInPlugins;
use crate::steps::{
    AllocatedClaim, check_containers, check_prepared, delete_pods_and_check_unprepared,
    wait_allocated, wait_running,
};
use crate::wait::{Progress, until};

const EXAMPLE: &str = "gpu-nic-aligned";
const NIC_DRIVER: &str = "nic.example.com";

/// The attribute each claim of the example lines up on.
const ALIGNED_ON: [(&str, &str); 2] = [
    ("same-root", attr::PCIE_ROOT),
    ("same-numa-node", attr::NUMA_NODE),
];

/// An attribute of the stand-in NIC `device`, from the example's own slice.
fn nic_attribute(slices: &[ResourceSlice], device: &str, name: &str) -> Option<PublishedAttribute> {
    let found = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .find(|d| d.name == device)?;
    let value = found.attributes.as_ref()?.get(name)?;
    value
        .int
        .map(PublishedAttribute::Int)
        .or_else(|| value.string.clone().map(PublishedAttribute::String))
}

pub async fn gpu_nic_aligned(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let dir = ctx.examples_dir.join(EXAMPLE);
    let manifest = Manifest::read_dir(&dir)?;
    let nic_slices: Vec<ResourceSlice> = manifest
        .objects
        .iter()
        .filter_map(|o| match o {
            Object::ResourceSlice(s) => Some(s.clone()),
            _ => None,
        })
        .collect();
    let published = ctx.published().await?;
    let roots: Vec<PublishedAttribute> = nic_slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter_map(|d| nic_attribute(&nic_slices, &d.name, attr::PCIE_ROOT))
        .collect();
    let unmanaged_match = published.nodes().into_iter().any(|node| {
        published.on_node(&node).any(|d| {
            !d.has_taint(tessera_api::names::TOPOLOGY_MANAGED_TAINT)
                && d.attribute(attr::PCIE_ROOT)
                    .is_some_and(|r| roots.contains(r))
        })
    });
    if !unmanaged_match {
        return Ok(ScenarioOutcome::Skipped(
            "no unmanaged node has a GPU on the stand-in NICs' PCIe roots (the dgx-h100 mock topology)"
                .into(),
        ));
    }
    // The stand-in NIC driver's kubelet plugin on every node (the local cluster only: it needs
    // the kubelets' directories).
    let stand_ins = match ctx.observer.local() {
        Some(local) => {
            let plugins = StandInPlugins::start(NIC_DRIVER, local, ctx.timeouts.restart).await?;
            ctx.say(format!(
                "stand-in {NIC_DRIVER} kubelet plugin registered on {}",
                plugins.nodes().join(", ")
            ));
            Some(plugins)
        }
        None => None,
    };
    let namespace = format!("tessera-example-{EXAMPLE}");
    ctx.fresh_namespace(&namespace).await?;
    manifest.apply(&ctx.client).await?;
    ctx.say(format!(
        "applied {} ({} objects)",
        dir.display(),
        manifest.objects.len()
    ));
    let result = check(ctx, &namespace, &nic_slices, stand_ins.as_ref()).await;
    // Cleanup whatever the check said: the namespace, the stand-in driver's objects, then its
    // plugins (after the pod is gone, so that the kubelet could unprepare the claims with them).
    let cleanup = async {
        ctx.delete_namespace(&namespace).await?;
        for slice in &nic_slices {
            let name = slice.metadata.name.as_deref().unwrap_or_default();
            Api::<ResourceSlice>::all(ctx.client.clone())
                .delete(name, &DeleteParams::default())
                .await
                .with_context(|| format!("cannot delete ResourceSlice {name}"))?;
        }
        Api::<DeviceClass>::all(ctx.client.clone())
            .delete(NIC_DRIVER, &DeleteParams::default())
            .await
            .context("cannot delete DeviceClass nic.example.com")?;
        if let Some(plugins) = stand_ins {
            plugins.stop().await?;
        }
        anyhow::Ok(())
    };
    let cleaned = cleanup.await;
    result?;
    cleaned?;
    Ok(ScenarioOutcome::Passed)
}

async fn check(
    ctx: &Ctx,
    namespace: &str,
    nic_slices: &[ResourceSlice],
    stand_ins: Option<&StandInPlugins>,
) -> anyhow::Result<()> {
    let claims = wait_allocated(ctx, namespace, "pod").await?;
    let published = ctx.published().await?;
    ensure!(
        claims.len() == 2,
        "expected 2 claims, found {}",
        claims.len()
    );
    let mut nodes = Vec::new();
    for (claim_name, attribute) in ALIGNED_ON {
        let claim = claims
            .iter()
            .find(|c| c.name() == claim_name)
            .with_context(|| format!("the pod has no claim {claim_name}"))?;
        let devices = &claim.allocation.devices;
        let gpu = devices
            .iter()
            .find(|d| d.driver == DRIVER_NAME)
            .with_context(|| format!("claim {claim_name} got no {DRIVER_NAME} device"))?;
        let nic = devices
            .iter()
            .find(|d| d.driver == NIC_DRIVER)
            .with_context(|| format!("claim {claim_name} got no {NIC_DRIVER} device"))?;
        ensure!(
            devices.len() == 2,
            "claim {claim_name}: {} results",
            devices.len()
        );
        let gpu_device = published.get(&gpu.pool, &gpu.device).with_context(|| {
            format!(
                "claim {claim_name}: GPU {}/{} is not published",
                gpu.pool, gpu.device
            )
        })?;
        let gpu_value = gpu_device.attribute(attribute).cloned();
        let nic_value = nic_attribute(nic_slices, &nic.device, attribute);
        ensure!(
            gpu_value.is_some() && gpu_value == nic_value,
            "claim {claim_name}: {} has {attribute} {gpu_value:?} but {} has {nic_value:?}",
            gpu.device,
            nic.device
        );
        ensure!(
            !gpu_device.has_taint(tessera_api::names::TOPOLOGY_MANAGED_TAINT),
            "claim {claim_name}: kube-scheduler was given {} on a managed node",
            gpu.device
        );
        ctx.say(format!(
            "{claim_name}: {} ({}) and {} on {attribute} {}",
            gpu.device,
            gpu_device.node,
            nic.device,
            gpu_value.map(|v| v.to_string()).unwrap_or_default()
        ));
        nodes.push(gpu_device.node.clone());
    }
    ensure!(
        nodes[0] == nodes[1],
        "the pod's two claims got GPUs on different nodes: {nodes:?}"
    );
    match stand_ins {
        Some(plugins) => runs_with_both_drivers(ctx, namespace, &claims, &nodes[0], plugins).await,
        None => names_the_missing_driver(ctx, namespace, &nodes[0]).await,
    }
}

/// With the stand-in plugin: the pod runs with its GPUs, the kubelet prepared both claims with
/// both drivers, and unprepares them with both when the pod is deleted.
async fn runs_with_both_drivers(
    ctx: &Ctx,
    namespace: &str,
    claims: &[AllocatedClaim],
    node: &str,
    plugins: &StandInPlugins,
) -> anyhow::Result<()> {
    let pod = wait_running(ctx, namespace, "pod").await?;
    check_containers(ctx, &pod, claims, &ctx.published().await?).await?;
    check_prepared(ctx, claims).await?;
    let uids: BTreeSet<String> = claims.iter().map(|c| c.uid().to_owned()).collect();
    let prepared = plugins.claims(node, true);
    ensure!(
        prepared.is_superset(&uids),
        "the pod runs on {node}, but the kubelet prepared only {prepared:?} of its claims {uids:?} \
         with the stand-in {NIC_DRIVER} plugin"
    );
    ctx.say(format!(
        "pod Running on {node}; the kubelet prepared both claims with {DRIVER_NAME} and {NIC_DRIVER}"
    ));
    delete_pods_and_check_unprepared(ctx, namespace, &["pod".to_owned()], claims).await?;
    until(
        &format!(
            "the kubelet of {node} to unprepare the claims with the stand-in {NIC_DRIVER} plugin"
        ),
        ctx.timeouts.delete,
        || {
            let unprepared = plugins.claims(node, false);
            let uids = &uids;
            async move {
                Ok(if unprepared.is_superset(uids) {
                    Progress::Done(())
                } else {
                    Progress::Waiting(format!("unprepared {unprepared:?} of {uids:?}"))
                })
            }
        },
    )
    .await?;
    ctx.say(format!("both claims unprepared by {NIC_DRIVER} too"));
    Ok(())
}

/// Without a NIC plugin: kube-scheduler binds the pod to the node of its allocations, and the
/// kubelet refuses to prepare the claims, naming the driver that has no plugin.
async fn names_the_missing_driver(ctx: &Ctx, namespace: &str, node: &str) -> anyhow::Result<()> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace);
    let events = Api::<Event>::namespaced(ctx.client.clone(), namespace);
    until(
        "the pod to be bound and the kubelet to name the missing NIC driver",
        ctx.timeouts.event.max(ctx.timeouts.run),
        || async {
            let pod = pods.get("pod").await.context("cannot read the pod")?;
            let bound = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            if bound.as_deref() != Some(node) {
                return Ok(Progress::Waiting(format!(
                    "pod bound to {bound:?}, allocations on {node}"
                )));
            }
            let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            if running {
                // A cluster with a real nic.example.com plugin runs the pod: also fine.
                return Ok(Progress::Done(()));
            }
            let named = events
                .list(&ListParams::default().fields("involvedObject.name=pod"))
                .await
                .context("cannot list events")?
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("FailedPrepareDynamicResources"))
                .filter_map(|e| e.message)
                .find(|m| m.contains(NIC_DRIVER));
            Ok(match named {
                Some(message) => {
                    ctx.say(format!("kubelet: {message}"));
                    Progress::Done(())
                }
                None => Progress::Waiting(
                    "no FailedPrepareDynamicResources event naming nic.example.com yet".into(),
                ),
            })
        },
    )
    .await
}
