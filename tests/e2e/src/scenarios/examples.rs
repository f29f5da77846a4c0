//! The deploy/examples manifests, applied as they are and checked: what was allocated (per
//! example), every pod Running, what each container received, prepared on the node, and
//! unprepared when the pods are deleted.

use std::collections::BTreeSet;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams};
use tessera_api::names::TOPOLOGY_MANAGED_TAINT;

use super::example::{ExampleRun, run_example, run_example_with};
use super::outcome::ScenarioOutcome;
use crate::claims::EXTENDED_RESOURCES_ENTRY;
use crate::context::Ctx;
use crate::steps::{
    AllocatedClaim, check_containers, check_prepared, check_unclaimed_pod,
    delete_pods_and_check_unprepared, wait_allocated, wait_running,
};
use crate::wait::{Progress, until};

/// Devices the default scheduler allocated must not carry the managed-node taint.
fn untainted(run: &ExampleRun, claim: &AllocatedClaim) -> anyhow::Result<()> {
    for device in claim.devices(&run.published)? {
        ensure!(
            !device.has_taint(TOPOLOGY_MANAGED_TAINT),
            "claim {} got {} on {}, which carries the {TOPOLOGY_MANAGED_TAINT} taint: only the controller may allocate it",
            claim.name(),
            device.name,
            device.node
        );
    }
    Ok(())
}

fn count(claim: &AllocatedClaim, expected: usize) -> anyhow::Result<()> {
    let found = claim.allocation.ours().count();
    ensure!(
        found == expected,
        "claim {} has {found} {} devices, expected {expected}",
        claim.name(),
        tessera_api::names::DRIVER_NAME
    );
    Ok(())
}

pub async fn single_gpu(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let expect = |run: &ExampleRun| {
        let claim = run.single_claim()?;
        count(&claim, 1)?;
        untainted(run, &claim)?;
        let device = &claim.devices(&run.published)?[0];
        ensure!(device.is_whole_gpu(), "{} is not a whole GPU", device.name);
        Ok(())
    };
    // While it runs, the plugin has told the claim which GPU it is (status.devices), and
    // `kubectl tessera` shows it (top) and explains it as from files (explain).
    let outcome = run_example_with(
        ctx,
        "single-gpu",
        expect,
        Some(super::live::single_gpu_live),
    )
    .await?;
    if ctx.observer.expects_checker() {
        // The other side: a pod without a claim, on a node with GPUs and a driver, sees none.
        let published = ctx.published().await?;
        let node = published
            .nodes()
            .into_iter()
            .next()
            .context("no node publishes devices")?;
        check_unclaimed_pod(ctx, &node).await?;
    }
    Ok(outcome)
}

pub async fn nvlink_pair(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    run_example(ctx, "nvlink-pair", |run| {
        let claim = run.single_claim()?;
        count(&claim, 2)?;
        untainted(run, &claim)?;
        let devices = claim.devices(&run.published)?;
        let islands: BTreeSet<Option<&str>> = devices.iter().map(|d| d.island()).collect();
        ensure!(
            islands.len() == 1 && !islands.contains(&None),
            "the two GPUs must share one nvlinkIsland, found {islands:?}"
        );
        ensure!(devices[0].name != devices[1].name, "the same device twice");
        Ok(())
    })
    .await
}

pub async fn mig_slice(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let published = ctx.published().await?;
    let has_mig = published
        .nodes()
        .iter()
        .any(|n| published.on_node(n).any(|d| d.is_mig()));
    if !has_mig {
        return Ok(ScenarioOutcome::Skipped(
            "no node publishes MIG devices (the local cluster runs hgx-a100-mig on one node)"
                .to_owned(),
        ));
    }
    run_example(ctx, "mig-slice", |run| {
        let claim = run.single_claim()?;
        count(&claim, 1)?;
        untainted(run, &claim)?;
        let device = &claim.devices(&run.published)?[0];
        ensure!(device.is_mig(), "{} is not a MIG device", device.name);
        let profile = device.profile().unwrap_or_default();
        ensure!(
            profile.starts_with("1g."),
            "{} has profile `{profile}`, the selector asks for 1g.*",
            device.name
        );
        Ok(())
    })
    .await
}

pub async fn cel_selectors(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    run_example(ctx, "cel-selectors", |run| {
        let claim = run.single_claim()?;
        count(&claim, 1)?;
        untainted(run, &claim)?;
        let device = &claim.devices(&run.published)?[0];
        let product = device.product().unwrap_or_default();
        ensure!(
            product.contains("H100"),
            "{} is a `{product}`, not an H100",
            device.name
        );
        let memory = device
            .capacity_bytes("memory")
            .with_context(|| format!("{} publishes no parsable memory capacity", device.name))?;
        ensure!(
            memory >= 40 << 30,
            "{} has {memory} bytes of memory, the selector asks for at least 40Gi",
            device.name
        );
        let driver = device
            .driver_major()
            .with_context(|| format!("{} publishes no driverVersion", device.name))?;
        ensure!(
            driver >= 535,
            "{} has driver {driver}, the selector asks for >= 535",
            device.name
        );
        Ok(())
    })
    .await
}

pub async fn shared_claim(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    run_example(ctx, "shared-claim", |run| {
        let claim = run.single_claim()?;
        count(&claim, 1)?;
        untainted(run, &claim)?;
        ensure!(
            run.pods.len() == 2,
            "expected two pods, found {}",
            run.pods.len()
        );
        Ok(())
    })
    .await
}

/// The claim's config must be one `FromClaim` GpuConfig entry with `strategy`.
fn sharing_config(claim: &AllocatedClaim, strategy: &str) -> anyhow::Result<serde_json::Value> {
    let entries: Vec<_> = claim
        .allocation
        .config
        .iter()
        .filter(|c| c.driver == tessera_api::names::DRIVER_NAME)
        .collect();
    ensure!(
        entries.len() == 1,
        "claim {} carries {} config entries for our driver, expected 1: {:?}",
        claim.name(),
        entries.len(),
        entries
    );
    let entry = entries[0];
    ensure!(
        entry.source == "FromClaim",
        "claim {}: config source {}, expected FromClaim",
        claim.name(),
        entry.source
    );
    ensure!(
        entry.parameters["kind"] == "GpuConfig"
            && entry.parameters["sharing"]["strategy"] == strategy,
        "claim {}: config {} is not a GpuConfig with sharing strategy {strategy}",
        claim.name(),
        entry.parameters
    );
    Ok(entry.parameters.clone())
}

pub async fn time_slicing(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    run_example(ctx, "time-slicing", |run| {
        let claim = run.single_claim()?;
        count(&claim, 1)?;
        untainted(run, &claim)?;
        let parameters = sharing_config(&claim, "TimeSlicing")?;
        ensure!(
            parameters["sharing"]["timeSlicing"]["interval"] == "Long",
            "interval {} in the allocation, the claim says Long",
            parameters["sharing"]["timeSlicing"]["interval"]
        );
        Ok(())
    })
    .await
}

pub async fn mps(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    run_example(ctx, "mps", |run| {
        let claim = run.single_claim()?;
        count(&claim, 1)?;
        untainted(run, &claim)?;
        let parameters = sharing_config(&claim, "MPS")?;
        ensure!(
            parameters["sharing"]["mps"]["defaultActiveThreadPercentage"] == 50,
            "MPS config {} lost the active thread percentage",
            parameters
        );
        Ok(())
    })
    .await
}

/// NVIDIA's config (driver `gpu.nvidia.com`, `resource.nvidia.com/v1beta1` GpuConfig with
/// `mpsConfig`) on a Tessera GPU: the containers' checker must see the MPS daemon with NVIDIA's
/// limits (`steps::expected_check` reads `mpsConfig` as the plugin does), and the claim must carry
/// the plugin's `NvidiaConfigTranslated` Event.
pub async fn nvidia_mps(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    run_example_with(
        ctx,
        "nvidia-mps",
        |run| {
            let claim = run.single_claim()?;
            count(&claim, 1)?;
            untainted(run, &claim)?;
            let entries: Vec<_> = claim
                .allocation
                .config
                .iter()
                .filter(|c| c.driver == tessera_api::nvidia::NVIDIA_DRIVER_NAME)
                .collect();
            ensure!(
                entries.len() == 1
                    && entries[0].parameters["apiVersion"] == "resource.nvidia.com/v1beta1"
                    && entries[0].parameters["sharing"]["mpsConfig"]["defaultActiveThreadPercentage"] == 50,
                "claim {}: expected NVIDIA's MPS config in the allocation, found {:?}",
                claim.name(),
                claim.allocation.config
            );
            Ok(())
        },
        Some(|ctx, run| Box::pin(translation_event(ctx, run))),
    )
    .await
}

/// The Event the plugin records on a claim whose NVIDIA config it translated.
async fn translation_event(ctx: &Ctx, run: &ExampleRun) -> anyhow::Result<()> {
    let claim = run.single_claim()?;
    let name = claim.name().to_owned();
    let events = Api::<Event>::namespaced(ctx.client.clone(), &run.namespace);
    let selector = format!(
        "involvedObject.kind=ResourceClaim,involvedObject.name={name},reason=NvidiaConfigTranslated"
    );
    let message = until(
        &format!(
            "an NvidiaConfigTranslated event on claim {}/{name}",
            run.namespace
        ),
        ctx.timeouts.event,
        || async {
            let found = events
                .list(&ListParams::default().fields(&selector))
                .await
                .with_context(|| format!("cannot list events of claim {name}"))?
                .items;
            Ok(match found.first().and_then(|e| e.message.clone()) {
                Some(message) => Progress::Done(message),
                None => Progress::Waiting("no such event".to_owned()),
            })
        },
    )
    .await?;
    ctx.say(format!("claim event: {message}"));
    ensure!(
        message.contains(
            "resource.nvidia.com/v1beta1 GpuConfig read as gpu.tessera.dev/v1alpha1 GpuConfig"
        ) && message.contains("sharing.mpsConfig → sharing.mps"),
        "the translation event does not say what was translated: {message}"
    );
    Ok(())
}

/// deploy/examples/nvidia-quickstart: an NVIDIA quickstart manifest after `tessera migrate` (a
/// crates/cli test keeps the example equal to the command's output).
pub async fn nvidia_quickstart(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    run_example(ctx, "nvidia-quickstart", |run| {
        let claim = run.single_claim()?;
        count(&claim, 1)?;
        untainted(run, &claim)?;
        let device = &claim.devices(&run.published)?[0];
        ensure!(device.is_whole_gpu(), "{} is not a whole GPU", device.name);
        Ok(())
    })
    .await
}

pub async fn prioritized_list(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    run_example(ctx, "prioritized-list", |run| {
        let claim = run.single_claim()?;
        count(&claim, 1)?;
        untainted(run, &claim)?;
        let result = claim
            .allocation
            .ours()
            .next()
            .map(|d| d.request.clone())
            .unwrap_or_default();
        // Every cluster the suite runs on has free, unmanaged H100s, so the first subrequest wins.
        ensure!(
            result == "gpu/h100",
            "the result names request `{result}`, expected `gpu/h100` (an H100 is free)"
        );
        let device = &claim.devices(&run.published)?[0];
        ensure!(
            device.product().unwrap_or_default().contains("H100"),
            "{} is not an H100",
            device.name
        );
        Ok(())
    })
    .await
}

pub async fn admin_access(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    run_example(ctx, "admin-access", |run| {
        let claim = run.single_claim()?;
        let node = claim.node()?;
        let devices = claim.devices(&run.published)?;
        let whole: BTreeSet<&str> = run
            .published
            .whole_gpus(node)
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        let got: BTreeSet<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        ensure!(
            got == whole,
            "allocationMode All on {node} got {got:?}, expected every whole GPU of the node {whole:?}"
        );
        ensure!(
            claim.allocation.ours().all(|d| d.admin_access),
            "every result must carry adminAccess: true"
        );
        untainted(run, &claim)
    })
    .await
}

/// The claim must be the one kube-scheduler makes for the pod's extended resources: annotated,
/// owned by the pod, one `ExactCount` request of `class` for `count` devices, named as the
/// scheduler names the request of container 0's only resource.
fn scheduler_made(
    run: &ExampleRun,
    claim: &AllocatedClaim,
    class: &str,
    count: i64,
) -> anyhow::Result<()> {
    ensure!(
        claim.entry == EXTENDED_RESOURCES_ENTRY,
        "claim {} is not the pod's extended-resource claim",
        claim.name()
    );
    let meta = &claim.claim.metadata;
    let annotated = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get("resource.kubernetes.io/extended-resource-claim"))
        .map(String::as_str);
    ensure!(
        annotated == Some("true"),
        "claim {} lacks the annotation resource.kubernetes.io/extended-resource-claim=true",
        claim.name()
    );
    let (pod, _) = &run.pods[0];
    let owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    ensure!(
        owner.is_some_and(|o| o.kind == "Pod" && Some(&o.name) == pod.metadata.name.as_ref()),
        "claim {} is not controlled by its pod: {:?}",
        claim.name(),
        meta.owner_references
    );
    let requests: Vec<(String, String, Option<i64>)> = claim
        .claim
        .spec
        .iter()
        .flat_map(|s| s.devices.iter())
        .flat_map(|d| d.requests.iter().flatten())
        .map(|r| {
            let exactly = r.exactly.as_ref();
            (
                r.name.clone(),
                exactly
                    .map(|e| e.device_class_name.clone())
                    .unwrap_or_default(),
                exactly.and_then(|e| e.count),
            )
        })
        .collect();
    ensure!(
        requests
            == [(
                "container-0-request-0".to_owned(),
                class.to_owned(),
                Some(count)
            )],
        "claim {} has requests {requests:?}, expected container-0-request-0 for {count} of {class}",
        claim.name()
    );
    Ok(())
}

pub async fn extended_resource_gpu(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    run_example(ctx, "extended-resource-gpu", |run| {
        let claim = run.single_claim()?;
        scheduler_made(run, &claim, "gpu.tessera.dev", 2)?;
        count(&claim, 2)?;
        untainted(run, &claim)?;
        let devices = claim.devices(&run.published)?;
        ensure!(
            devices.iter().all(|d| d.is_whole_gpu()),
            "not all whole GPUs: {:?}",
            devices.iter().map(|d| &d.name).collect::<Vec<_>>()
        );
        ensure!(devices[0].name != devices[1].name, "the same device twice");
        Ok(())
    })
    .await
}

pub async fn extended_resource_mig(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let published = ctx.published().await?;
    let has_profile = published.nodes().iter().any(|n| {
        published
            .on_node(n)
            .any(|d| d.is_mig() && d.profile() == Some("1g.10gb"))
    });
    if !has_profile {
        return Ok(ScenarioOutcome::Skipped(
            "no node publishes 1g.10gb MIG devices (the local cluster runs hgx-a100-mig on one node)"
                .to_owned(),
        ));
    }
    run_example(ctx, "extended-resource-mig", |run| {
        let claim = run.single_claim()?;
        scheduler_made(run, &claim, "mig-1g.10gb.gpu.tessera.dev", 1)?;
        count(&claim, 1)?;
        untainted(run, &claim)?;
        let device = &claim.devices(&run.published)?[0];
        ensure!(device.is_mig(), "{} is not a MIG device", device.name);
        ensure!(
            device.profile() == Some("1g.10gb"),
            "{} has profile {:?}, the pod asks for nvidia.com/mig-1g.10gb",
            device.name,
            device.profile()
        );
        Ok(())
    })
    .await
}

/// A gated pod asking for `nvidia.com/gpu: 4`: the controller cannot place extended resources
/// (docs/user-guide.md, "Topology-aware placement needs a claim"), so it removes the gate with a
/// `LeftToScheduler` event naming the resource, and the scheduler gives the pod four GPUs of an
/// unmanaged node through its own claim.
pub async fn extended_resource_gated(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    const NAMESPACE: &str = "tessera-e2e-extended-gated";
    if ctx.managed_nodes().await?.is_empty() {
        return Ok(ScenarioOutcome::Skipped(
            "no node is labelled gpu.tessera.dev/topology-managed=true (no controller to ask)"
                .to_owned(),
        ));
    }
    ctx.fresh_namespace(NAMESPACE).await?;
    crate::objects::create_namespace(&ctx.client, NAMESPACE).await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": NAMESPACE, "name": "pod", "labels": {"app.kubernetes.io/part-of": "tessera-e2e"}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "schedulingGates": [{"name": tessera_api::names::TOPOLOGY_AWARE_GATE}],
            "containers": [{
                "name": "ctr",
                "image": "busybox:1.37",
                "command": ["sh", "-c", crate::objects::PRINT_GPU_ENV],
                "resources": {"limits": {"nvidia.com/gpu": 4}},
            }],
        },
    }))?;
    kube::Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE)
        .create(&kube::api::PostParams::default(), &pod)
        .await
        .context("cannot create the gated pod")?;
    let claims = wait_allocated(ctx, NAMESPACE, "pod").await?;
    let published = ctx.published().await?;
    let run = ExampleRun {
        namespace: NAMESPACE.to_owned(),
        published,
        pods: vec![(pod, claims.clone())],
    };
    let claim = run.single_claim()?;
    ctx.say(claim.describe(&run.published));
    scheduler_made(&run, &claim, "gpu.tessera.dev", 4)?;
    count(&claim, 4)?;
    untainted(&run, &claim)?;
    let events = crate::steps::pod_events(ctx, NAMESPACE, "pod").await?;
    let left = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("LeftToScheduler"))
        .with_context(|| {
            format!(
                "the controller sent no LeftToScheduler event; events: {:?}",
                events.iter().map(|e| &e.reason).collect::<Vec<_>>()
            )
        })?;
    let message = left.message.as_deref().unwrap_or_default();
    ensure!(
        message.contains("nvidia.com/gpu (DeviceClass gpu.tessera.dev)"),
        "the LeftToScheduler event does not name the extended resource: {message}"
    );
    ctx.say(format!("controller: LeftToScheduler: {message}"));
    let current = wait_running(ctx, NAMESPACE, "pod").await?;
    check_containers(ctx, &current, &claims, &run.published).await?;
    check_prepared(ctx, &claims).await?;
    delete_pods_and_check_unprepared(ctx, NAMESPACE, &["pod".to_owned()], &claims).await?;
    ctx.delete_namespace(NAMESPACE).await?;
    Ok(ScenarioOutcome::Passed)
}
