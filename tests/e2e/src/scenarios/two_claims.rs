//! One container that lists two claims sees the GPUs of both: its device nodes are both claims',
//! and CUDA in it (the in-container checker, on the fake driver) lists both claims' UUIDs. (Each
//! claim's CDI spec once set `CUDA_VISIBLE_DEVICES` to its own GPUs, and the runtime kept the
//! last claim's value, hiding the other's GPUs from CUDA.)

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

use super::outcome::ScenarioOutcome;
use crate::context::Ctx;
use crate::objects::{self, PlacedBy, gpu_claim};
use crate::steps::{check_containers, wait_allocated, wait_running};

const NAMESPACE: &str = "tessera-e2e-two-claims";
const POD: &str = "both";
const CLAIMS: [&str; 2] = ["first", "second"];

pub async fn two_claims(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    if !ctx.observer.expects_checker() {
        return Ok(ScenarioOutcome::Skipped(
            "needs the in-container checker on a fake driver (local cluster with containerd)"
                .to_owned(),
        ));
    }
    ctx.fresh_namespace(NAMESPACE).await?;
    objects::create_namespace(&ctx.client, NAMESPACE).await?;
    let claims = Api::<k8s_openapi::api::resource::v1::ResourceClaim>::namespaced(
        ctx.client.clone(),
        NAMESPACE,
    );
    for name in CLAIMS {
        claims
            .create(
                &PostParams::default(),
                &gpu_claim(NAMESPACE, name, 1, None)?,
            )
            .await
            .with_context(|| format!("cannot create claim {name}"))?;
    }
    Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE)
        .create(&PostParams::default(), &two_claim_pod()?)
        .await
        .context("cannot create the pod")?;
    let allocated = wait_allocated(ctx, NAMESPACE, POD).await?;
    ensure!(allocated.len() == 2, "{} claims allocated", allocated.len());
    let pod = wait_running(ctx, NAMESPACE, POD).await?;
    let published = ctx.published().await?;
    // Device nodes exactly both claims', CUDA's devices exactly both claims' UUIDs.
    check_containers(ctx, &pod, &allocated, &published).await?;
    let view = ctx
        .observer
        .container_view(&pod, "ctr")
        .await?
        .context("no output of the container")?;
    let report = view
        .check
        .context("the container printed no checker report")?;
    let listed: Vec<&str> = report
        .cuda
        .devices
        .iter()
        .map(|d| d.uuid.as_str())
        .collect();
    for claim in &allocated {
        for device in claim.devices(&published)? {
            let uuid = device.uuid().context("a device without a uuid")?;
            ensure!(
                listed.contains(&uuid),
                "claim {}'s GPU {uuid} is missing from CUDA's devices {listed:?} in the container",
                claim.name()
            );
        }
    }
    ctx.say(format!(
        "CUDA in {POD}/ctr lists {listed:?}: both claims' GPUs"
    ));
    ctx.delete_namespace(NAMESPACE).await?;
    Ok(ScenarioOutcome::Passed)
}

/// A pod whose one container uses claims `first` and `second` (placed by kube-scheduler).
fn two_claim_pod() -> anyhow::Result<Pod> {
    let mut pod = objects::gpu_pod(NAMESPACE, POD, CLAIMS[0], PlacedBy::SchedulerOn(""))?;
    let spec = pod.spec.as_mut().context("a pod without spec")?;
    spec.node_selector = None;
    spec.resource_claims = Some(
        CLAIMS
            .iter()
            .map(|name| {
                serde_json::from_value(serde_json::json!({"name": name, "resourceClaimName": name}))
            })
            .collect::<Result<_, _>>()?,
    );
    let container = spec
        .containers
        .first_mut()
        .context("a pod without containers")?;
    container.resources.get_or_insert_default().claims = Some(
        CLAIMS
            .iter()
            .map(|name| serde_json::from_value(serde_json::json!({"name": name})))
            .collect::<Result<_, _>>()?,
    );
    Ok(pod)
}
