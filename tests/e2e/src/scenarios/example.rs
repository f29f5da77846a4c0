//! One deploy/examples manifest run as a scenario: applied as it is, its claims waited for and
//! checked, every pod Running with what each container received, prepared on the node, then
//! deleted and checked unprepared.

use std::collections::BTreeSet;

use anyhow::{Context, ensure};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;

use super::outcome::ScenarioOutcome;
use crate::context::Ctx;
use crate::devices::Published;
use crate::manifest::Manifest;
use crate::steps::{
    AllocatedClaim, check_containers, check_prepared, delete_pods_and_check_unprepared, names,
    wait_allocated, wait_running,
};

/// An applied example whose claims are allocated.
pub struct ExampleRun {
    pub namespace: String,
    pub published: Published,
    /// Each pod with the claims it uses.
    pub pods: Vec<(Pod, Vec<AllocatedClaim>)>,
}

impl ExampleRun {
    /// Every distinct claim of the example.
    pub fn claims(&self) -> Vec<AllocatedClaim> {
        let mut seen = BTreeSet::new();
        self.pods
            .iter()
            .flat_map(|(_, claims)| claims.iter())
            .filter(|c| seen.insert(c.uid().to_owned()))
            .cloned()
            .collect()
    }

    /// The only claim of the example.
    pub fn single_claim(&self) -> anyhow::Result<AllocatedClaim> {
        let claims = self.claims();
        ensure!(
            claims.len() == 1,
            "expected one claim in {}, found {}",
            self.namespace,
            claims.len()
        );
        Ok(claims.into_iter().next().unwrap_or_else(|| unreachable!()))
    }
}

/// A check that runs once the example's pods are Running and checked, before cleanup.
pub type AfterRunning = for<'a> fn(&'a Ctx, &'a ExampleRun) -> BoxFuture<'a, anyhow::Result<()>>;

/// Applies example `name`, waits for its claims, checks them with `expect`, then runs the
/// common checks and cleans up.
pub async fn run_example(
    ctx: &Ctx,
    name: &str,
    expect: impl Fn(&ExampleRun) -> anyhow::Result<()>,
) -> anyhow::Result<ScenarioOutcome> {
    run_example_with(ctx, name, expect, None).await
}

/// [`run_example`], with `after_running` checked while the pods run.
pub async fn run_example_with(
    ctx: &Ctx,
    name: &str,
    expect: impl Fn(&ExampleRun) -> anyhow::Result<()>,
    after_running: Option<AfterRunning>,
) -> anyhow::Result<ScenarioOutcome> {
    let dir = ctx.examples_dir.join(name);
    let manifest = Manifest::read_dir(&dir)?;
    let namespace = manifest
        .namespaces()
        .into_iter()
        .next()
        .with_context(|| format!("{} creates no namespace", dir.display()))?;
    ctx.fresh_namespace(&namespace).await?;
    manifest.apply(&ctx.client).await?;
    ctx.say(format!(
        "applied {} ({} objects)",
        dir.display(),
        manifest.objects.len()
    ));

    let mut pods = Vec::new();
    for pod in manifest.pods() {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let claims = wait_allocated(ctx, &namespace, &pod_name).await?;
        pods.push((pod.clone(), claims));
    }
    let run = ExampleRun {
        namespace: namespace.clone(),
        published: ctx.published().await?,
        pods,
    };
    for claim in run.claims() {
        ctx.say(claim.describe(&run.published));
    }
    expect(&run)?;

    let mut running = Vec::new();
    for (pod, claims) in &run.pods {
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        let current = wait_running(ctx, &namespace, pod_name).await?;
        check_containers(ctx, &current, claims, &run.published).await?;
        running.push(current);
    }
    ctx.say(format!("pods Running: {}", names(&running).join(", ")));
    if let Some(check) = after_running {
        check(ctx, &run).await?;
    }
    let claims = run.claims();
    check_prepared(ctx, &claims).await?;
    delete_pods_and_check_unprepared(ctx, &namespace, &names(&running), &claims).await?;
    ctx.delete_namespace(&namespace).await?;
    Ok(ScenarioOutcome::Passed)
}
