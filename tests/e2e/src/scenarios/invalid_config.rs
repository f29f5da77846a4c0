//! deploy/examples/invalid-config: a claim whose opaque GpuConfig says `interval: Forever`. The
//! API server cannot check opaque parameters, so the claim is allocated; the plugin refuses to
//! prepare it, the kubelet reports that as a pod event naming the field, and the pod stays in
//! ContainerCreating with nothing handed to the runtime.

use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use super::outcome::ScenarioOutcome;
use crate::context::Ctx;
use crate::dump::event_line;
use crate::manifest::Manifest;
use crate::observer::ClaimOnNode;
use crate::steps::{AllocatedClaim, pod_events, pod_summary, wait_allocated};
use crate::wait::{Progress, holds_for, until};

const EXAMPLE: &str = "invalid-config";
const POD: &str = "pod";
/// The field the error must name.
const FIELD: &str = "sharing.timeSlicing.interval";
/// How long the pod must stay un-started once the error is reported.
const STAYS_PENDING: Duration = Duration::from_secs(10);

pub async fn invalid_config(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let dir = ctx.examples_dir.join(EXAMPLE);
    let manifest = Manifest::read_dir(&dir)?;
    let namespace = format!("tessera-example-{EXAMPLE}");
    ctx.fresh_namespace(&namespace).await?;
    manifest.apply(&ctx.client).await?;
    ctx.say(format!("applied {}", dir.display()));

    let claims = wait_allocated(ctx, &namespace, POD).await?;
    let published = ctx.published().await?;
    for claim in &claims {
        ctx.say(claim.describe(&published));
    }
    refusal_event(ctx, &namespace).await?;
    let pod = stays_pending(ctx, &namespace).await?;
    if ctx.observer.is_local() {
        nothing_reached_the_runtime(ctx, &pod, &claims).await?;
    }
    ctx.delete_namespace(&namespace).await?;
    Ok(ScenarioOutcome::Passed)
}

/// Waits for the kubelet's Warning event on the pod naming the field, and checks it names the
/// rejected value too.
async fn refusal_event(ctx: &Ctx, namespace: &str) -> anyhow::Result<()> {
    let event = until(
        &format!("an event on pod {namespace}/{POD} naming `{FIELD}`"),
        ctx.timeouts.event,
        || async {
            let events = pod_events(ctx, namespace, POD).await?;
            let found = events.iter().find(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.message.as_deref().is_some_and(|m| m.contains(FIELD))
            });
            Ok(match found {
                Some(event) => Progress::Done(event.clone()),
                None => Progress::Waiting(match events.last() {
                    Some(last) => format!("{} events, last: {}", events.len(), event_line(last)),
                    None => "no events".to_owned(),
                }),
            })
        },
    )
    .await?;
    ctx.say(format!("event: {}", event_line(&event)));
    let message = event.message.clone().unwrap_or_default();
    ensure!(
        message.contains("Forever"),
        "the error names the field but not the rejected value `Forever`: {message}"
    );
    Ok(())
}

/// Holds: the pod stays Pending without started containers. Returns the pod as it stays.
async fn stays_pending(ctx: &Ctx, namespace: &str) -> anyhow::Result<Pod> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace);
    holds_for(
        "the pod to stay Pending without started containers",
        STAYS_PENDING,
        || async {
            let pod = pods.get(POD).await?;
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or_default();
            let started = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .into_iter()
                .flatten()
                .any(|c| {
                    c.state
                        .as_ref()
                        .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
                });
            Ok(if phase == "Pending" && !started {
                Ok(())
            } else {
                Err(pod_summary(&pod))
            })
        },
    )
    .await?;
    let pod = pods.get(POD).await?;
    ctx.say(format!("pod stays: {}", pod_summary(&pod)));
    Ok(pod)
}

/// On a local cluster: the runtime never received the container, and the plugin holds no CDI
/// spec or completed record of the refused claims.
async fn nothing_reached_the_runtime(
    ctx: &Ctx,
    pod: &Pod,
    claims: &[AllocatedClaim],
) -> anyhow::Result<()> {
    let container = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone())
        .context("the example pod has no container")?;
    ensure!(
        ctx.observer
            .container_view(pod, &container)
            .await?
            .is_none(),
        "the runtime received container {POD}/{container} although its claim was not prepared"
    );
    for claim in claims {
        let state = ctx.observer.claim_on_node(claim.node()?, claim.uid())?;
        if let ClaimOnNode::Seen {
            spec_files,
            checkpoint_state,
        } = &state
        {
            ensure!(
                spec_files.is_empty() && checkpoint_state.as_deref() != Some("PrepareCompleted"),
                "claim {} was refused but the plugin holds it: {}",
                claim.name(),
                state.describe()
            );
        }
    }
    ctx.say("nothing reached the runtime; no CDI spec was written");
    Ok(())
}
