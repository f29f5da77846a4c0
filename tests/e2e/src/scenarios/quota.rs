//! `gpu-quota`: deploy/examples/gpu-quota — a namespace whose ResourceQuota allows four whole
//! GPUs. The example's 4-GPU claim is allocated and its pod runs; then one GPU more is asked
//! three ways (over-quota/fifth-gpu.yaml) and each is refused with an error naming the quota:
//! a claim and a device-plugin pod at creation (HTTP 403), a template's claim when
//! kube-controller-manager creates it (a `FailedResourceClaimCreation` event on the pod, which
//! stays Pending).

use anyhow::{Context, bail, ensure};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use super::example::{ExampleRun, run_example_with};
use super::outcome::ScenarioOutcome;
use crate::context::Ctx;
use crate::manifest::{Manifest, Object, apply_object};
use crate::steps::pod_events;
use crate::wait::{Progress, until};

/// The example's quota, which every refusal must name.
const QUOTA: &str = "gpus";
/// What the API server's quota admission says when a request goes over a quota.
const EXCEEDED: &str = "exceeded quota: gpus";
/// The pod whose claim comes from a template (created; its claim is not).
const TEMPLATE_POD: &str = "fifth-gpu-from-template";

pub async fn gpu_quota(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    run_example_with(
        ctx,
        "gpu-quota",
        |run| {
            let claim = run.single_claim()?;
            let devices = claim.devices(&run.published)?;
            ensure!(
                devices.len() == 4,
                "claim {} got {} devices, expected the quota's 4",
                claim.name(),
                devices.len()
            );
            Ok(())
        },
        Some(over_quota),
    )
    .await
}

/// Asks for a fifth GPU three ways while the example's pod runs.
fn over_quota<'a>(ctx: &'a Ctx, run: &'a ExampleRun) -> BoxFuture<'a, anyhow::Result<()>> {
    async move {
        let path = ctx.examples_dir.join("gpu-quota/over-quota/fifth-gpu.yaml");
        let manifest = Manifest::read_file(&path)?;
        for object in &manifest.objects {
            apply_over_quota(ctx, object).await?;
        }
        wait_refused_claim_event(ctx, &run.namespace).await
    }
    .boxed()
}

/// Claims and device-plugin pods must be refused naming the quota; templates and pods that ask
/// for no device themselves must be created.
async fn apply_over_quota(ctx: &Ctx, object: &Object) -> anyhow::Result<()> {
    let refused = match object {
        Object::ResourceClaim(_) => true,
        Object::Pod(pod) => asks_extended_gpus(pod),
        _ => false,
    };
    let result = apply_object(&ctx.client, object).await;
    match (refused, result) {
        (false, Ok(())) => {
            ctx.say(format!("{}: created", object.describe()));
            Ok(())
        }
        (false, Err(e)) => Err(e.context(format!("{} must be created", object.describe()))),
        (true, Ok(())) => bail!(
            "{} was created although the namespace's quota {QUOTA} is used up",
            object.describe()
        ),
        (true, Err(e)) => {
            let status = e
                .downcast_ref::<kube::Error>()
                .and_then(|k| match k {
                    kube::Error::Api(status) => Some(status),
                    _ => None,
                })
                .with_context(|| {
                    format!(
                        "{} failed, but not in the API server: {e:#}",
                        object.describe()
                    )
                })?;
            ensure!(
                status.code == 403 && status.message.contains(EXCEEDED),
                "{} was refused with HTTP {} {:?}; expected 403 naming quota {QUOTA} ({EXCEEDED:?})",
                object.describe(),
                status.code,
                status.message
            );
            ctx.say(format!(
                "{}: refused: {}",
                object.describe(),
                status.message
            ));
            Ok(())
        }
    }
}

fn asks_extended_gpus(pod: &Pod) -> bool {
    pod.spec.iter().flat_map(|s| &s.containers).any(|c| {
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .is_some_and(|l| l.contains_key("nvidia.com/gpu"))
    })
}

/// The template pod is admitted but its claim is not: a `FailedResourceClaimCreation` event
/// naming the quota, no claim in its status, the pod still Pending.
async fn wait_refused_claim_event(ctx: &Ctx, namespace: &str) -> anyhow::Result<()> {
    let message = until(
        &format!("a FailedResourceClaimCreation event on pod {namespace}/{TEMPLATE_POD} naming quota {QUOTA}"),
        ctx.timeouts.event,
        || async {
            let events = pod_events(ctx, namespace, TEMPLATE_POD).await?;
            let found = events.iter().find(|e| {
                e.reason.as_deref() == Some("FailedResourceClaimCreation")
                    && e.message.as_deref().is_some_and(|m| m.contains(EXCEEDED))
            });
            Ok(match found {
                Some(event) => Progress::Done(event.message.clone().unwrap_or_default()),
                None => Progress::Waiting(format!(
                    "events: {:?}",
                    events
                        .iter()
                        .map(|e| (e.reason.clone(), e.message.clone()))
                        .collect::<Vec<_>>()
                )),
            })
        },
    )
    .await?;
    ctx.say(format!("{TEMPLATE_POD}: {message}"));
    let pod = Api::<Pod>::namespaced(ctx.client.clone(), namespace)
        .get(TEMPLATE_POD)
        .await?;
    let status = pod.status.unwrap_or_default();
    ensure!(
        status.phase.as_deref() == Some("Pending")
            && status
                .resource_claim_statuses
                .unwrap_or_default()
                .iter()
                .all(|s| s.resource_claim_name.is_none()),
        "pod {TEMPLATE_POD} should stay Pending without a claim while the quota is used up (phase {:?})",
        status.phase
    );
    Ok(())
}
