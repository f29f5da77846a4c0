//! Topology-aware placement by the Tessera controller (issue 6's done-when):
//!
//! - `topology-aware`: deploy/examples/topology-aware as it is — a gated pod with a 4-GPU claim
//!   lands on a managed node, on four GPUs of one NVLink island and one NUMA node.
//! - `topology-fragmented`: the managed dgx-h100 node is fragmented first (gpu-0 and gpu-1
//!   held), then a gated pod asks for four GPUs: the controller must pick gpu-4..7 (one socket),
//!   not the first four free ones. The same claim through the default scheduler on an unmanaged
//!   dgx-h100 node, fragmented the same way, shows what first fit gives.

use std::collections::BTreeSet;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Pod;
use tessera_api::names::TOPOLOGY_MANAGED_TAINT;

use super::example::run_example;
use super::outcome::ScenarioOutcome;
use super::slices::is_dgx_h100;
use crate::compare::{Side, side_by_side};
use crate::context::Ctx;
use crate::devices::{Published, PublishedDevice};
use crate::objects::{PlacedBy, create_claim_and_pod, create_namespace, gpu_claim, gpu_pod};
use crate::steps::{
    AllocatedClaim, check_containers, check_prepared, check_unprepared, wait_allocated,
    wait_running,
};

const NAMESPACE: &str = "tessera-e2e-topology";

pub async fn topology_aware(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let managed = ctx.managed_nodes().await?;
    if managed.is_empty() {
        return Ok(ScenarioOutcome::Skipped(
            "no node is labelled gpu.tessera.dev/topology-managed=true".to_owned(),
        ));
    }
    run_example(ctx, "topology-aware", |run| {
        let claim = run.single_claim()?;
        let node = claim.node()?;
        ensure!(
            managed.iter().any(|m| m == node),
            "the claim was allocated on {node}, which is not topology-managed ({managed:?})"
        );
        let devices = claim.devices(&run.published)?;
        ensure!(devices.len() == 4, "{} devices, expected 4", devices.len());
        check_controller_allocation(&claim, &devices)?;
        check_one_socket(&devices)
    })
    .await
}

/// Devices the controller allocated: all carry the managed taint (it allocates nothing else)
/// and share one NVLink island.
fn check_controller_allocation(
    claim: &AllocatedClaim,
    devices: &[&PublishedDevice],
) -> anyhow::Result<()> {
    for device in devices {
        ensure!(
            device.has_taint(TOPOLOGY_MANAGED_TAINT),
            "claim {} got {}/{}, which lacks the {TOPOLOGY_MANAGED_TAINT} taint: the controller allocates only managed devices",
            claim.name(),
            device.node,
            device.name
        );
    }
    let islands: BTreeSet<Option<&str>> = devices.iter().map(|d| d.island()).collect();
    ensure!(
        islands.len() == 1 && !islands.contains(&None),
        "claim {}: the devices span NVLink islands {islands:?}",
        claim.name()
    );
    Ok(())
}

fn check_one_socket(devices: &[&PublishedDevice]) -> anyhow::Result<()> {
    let numa: BTreeSet<Option<i64>> = devices.iter().map(|d| d.numa_node()).collect();
    ensure!(
        numa.len() == 1,
        "the four GPUs span NUMA nodes {numa:?}; a free socket had four GPUs"
    );
    Ok(())
}

/// The nodes the fragmented scenario needs: a managed and an unmanaged dgx-h100 node.
fn pick_nodes(published: &Published, managed: &[String]) -> Option<(String, String)> {
    let dgx: Vec<String> = published
        .nodes()
        .into_iter()
        .filter(|n| is_dgx_h100(&published.whole_gpus(n)))
        .collect();
    let managed_node = dgx.iter().find(|n| managed.contains(n))?.clone();
    let unmanaged_node = dgx.iter().find(|n| !managed.contains(n))?.clone();
    Some((managed_node, unmanaged_node))
}

/// Which GPUs of a node a CEL selector pins a holder claim to.
fn minor_is(minor: u32) -> String {
    format!("device.attributes[\"gpu.tessera.dev\"].minor == {minor}")
}

pub async fn topology_fragmented(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let published = ctx.published().await?;
    let managed = ctx.managed_nodes().await?;
    let Some((managed_node, unmanaged_node)) = pick_nodes(&published, &managed) else {
        return Ok(ScenarioOutcome::Skipped(format!(
            "needs a topology-managed and an unmanaged dgx-h100 node (8 H100s each); managed: {managed:?}, publishing: {:?}",
            published.nodes()
        )));
    };
    ctx.fresh_namespace(NAMESPACE).await?;
    create_namespace(&ctx.client, NAMESPACE).await?;
    ctx.say(format!(
        "managed node {managed_node} (controller), unmanaged node {unmanaged_node} (default scheduler)"
    ));

    // 1. Fragment both nodes the same way: gpu-0 and gpu-1 held by other pods.
    let mut all_claims = fragment(ctx, &managed_node, &unmanaged_node).await?;

    // 2. The same 4-GPU claim, once through the controller and once through the scheduler.
    let (tessera, first_fit) = (TESSERA_POD, FIRST_FIT_POD);
    let (placed, fitted) = four_gpus_both_ways(ctx, &unmanaged_node).await?;
    let published = ctx.published().await?;
    let nodes = (managed_node.as_str(), unmanaged_node.as_str());
    compare_placements(ctx, &published, nodes, &placed, &fitted)?;

    // 3. Both pods run with what they were allocated.
    for (pod_name, claims) in [(tessera, &placed), (first_fit, &fitted)] {
        let pod = wait_running(ctx, NAMESPACE, pod_name).await?;
        ensure_ungated(&pod)?;
        check_containers(ctx, &pod, claims, &published).await?;
    }
    all_claims.extend(placed);
    all_claims.extend(fitted);
    check_prepared(ctx, &all_claims).await?;

    // 4. Clean up: everything unprepared.
    ctx.delete_namespace(NAMESPACE).await?;
    check_unprepared(ctx, &all_claims).await?;
    Ok(ScenarioOutcome::Passed)
}

/// The pods of the same 4-GPU claim through the controller and through the default scheduler.
const TESSERA_POD: &str = "four-gpus-tessera";
const FIRST_FIT_POD: &str = "four-gpus-first-fit";

/// gpu-0 and gpu-1 of both nodes held by other pods (the managed node's through the controller).
/// Returns the holders' claims.
async fn fragment(
    ctx: &Ctx,
    managed_node: &str,
    unmanaged_node: &str,
) -> anyhow::Result<Vec<AllocatedClaim>> {
    let mut holders = Vec::new();
    for minor in [0, 1] {
        for (side, placement) in [
            ("managed", PlacedBy::TopologyAware),
            ("unmanaged", PlacedBy::SchedulerOn(unmanaged_node)),
        ] {
            let name = format!("hold-{side}-gpu-{minor}");
            let claim = gpu_claim(NAMESPACE, &name, 1, Some(&minor_is(minor)))?;
            let pod = gpu_pod(NAMESPACE, &name, &name, placement)?;
            create_claim_and_pod(&ctx.client, &claim, &pod).await?;
            holders.push(name);
        }
    }
    let mut all_claims = Vec::new();
    for name in &holders {
        let claims = wait_allocated(ctx, NAMESPACE, name).await?;
        let claim = claims.first().context("holder pod without a claim")?;
        let expected_node = if name.contains("unmanaged") {
            unmanaged_node
        } else {
            managed_node
        };
        ensure!(
            claim.node()? == expected_node,
            "holder {name} was allocated on {}, expected {expected_node}",
            claim.node()?
        );
        all_claims.extend(claims);
    }
    ctx.say("fragmented: gpu-0 and gpu-1 held on both nodes");
    Ok(all_claims)
}

/// The same 4-GPU claim twice: gated for the controller, and pinned to the unmanaged node for the
/// default scheduler. Returns each pod's claims once allocated.
async fn four_gpus_both_ways(
    ctx: &Ctx,
    unmanaged_node: &str,
) -> anyhow::Result<(Vec<AllocatedClaim>, Vec<AllocatedClaim>)> {
    let (tessera, first_fit) = (TESSERA_POD, FIRST_FIT_POD);
    create_claim_and_pod(
        &ctx.client,
        &gpu_claim(NAMESPACE, tessera, 4, None)?,
        &gpu_pod(NAMESPACE, tessera, tessera, PlacedBy::TopologyAware)?,
    )
    .await?;
    create_claim_and_pod(
        &ctx.client,
        &gpu_claim(NAMESPACE, first_fit, 4, None)?,
        &gpu_pod(
            NAMESPACE,
            first_fit,
            first_fit,
            PlacedBy::SchedulerOn(unmanaged_node),
        )?,
    )
    .await?;
    let placed = wait_allocated(ctx, NAMESPACE, tessera).await?;
    let fitted = wait_allocated(ctx, NAMESPACE, first_fit).await?;
    Ok((placed, fitted))
}

/// Shows both allocations side by side; the controller's must be gpu-4..7 of the managed node
/// (the best-connected free set), the scheduler's four GPUs of the unmanaged node.
fn compare_placements(
    ctx: &Ctx,
    published: &Published,
    (managed_node, unmanaged_node): (&str, &str),
    placed: &[AllocatedClaim],
    fitted: &[AllocatedClaim],
) -> anyhow::Result<()> {
    let placed_claim = placed.first().context("no claim")?;
    let fitted_claim = fitted.first().context("no claim")?;
    let placed_devices = placed_claim.devices(published)?;
    let fitted_devices = fitted_claim.devices(published)?;
    ctx.say(format!(
        "the same 4-GPU claim, gpu-0 and gpu-1 held on both nodes:\n{}",
        side_by_side(
            &Side {
                title: format!(
                    "Tessera controller, {} (managed)",
                    placed_claim.node().unwrap_or("<no node>")
                ),
                devices: placed_devices.clone(),
            },
            &Side {
                title: format!(
                    "default scheduler, first fit, {} (unmanaged)",
                    fitted_claim.node().unwrap_or("<no node>")
                ),
                devices: fitted_devices.clone(),
            },
        )
    ));

    ensure!(
        placed_claim.node()? == managed_node,
        "the gated pod's claim was allocated on {}, expected the managed node {managed_node}",
        placed_claim.node()?
    );
    check_controller_allocation(placed_claim, &placed_devices)?;
    let names = placed_claim.allocation.device_names();
    ensure!(
        names == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"],
        "the controller chose {names:?}; with gpu-0 and gpu-1 held, the best-connected free set is gpu-4..7 (one socket)"
    );
    ensure!(
        fitted_claim.node()? == unmanaged_node && fitted_devices.len() == 4,
        "the scheduler's claim: {} devices on {}, expected 4 on {unmanaged_node}",
        fitted_devices.len(),
        fitted_claim.node()?
    );
    Ok(())
}

fn ensure_ungated(pod: &Pod) -> anyhow::Result<()> {
    let gates = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .map(|g| g.len())
        .unwrap_or(0);
    ensure!(
        gates == 0,
        "pod {} runs but still lists {gates} scheduling gates",
        pod.metadata.name.as_deref().unwrap_or_default()
    );
    Ok(())
}
