//! `kueue-cohort` (needs `tests/e2e/local-up --kueue`): borrowing and reclaim between two teams'
//! ClusterQueues in one Kueue cohort, each with 4 GPUs of nominal quota, and Tessera placing what
//! Kueue admits.
//!
//! Team A's Job of two 4-GPU pods needs 8 GPUs: Kueue admits it by borrowing team B's idle quota,
//! and the controller places each pod's claim on one NVLink island. Team B then submits a Job of
//! one 4-GPU pod: B's ClusterQueue reclaims its nominal quota (`reclaimWithinCohort: Any`), Kueue
//! evicts A's whole Job (suspends it, so both its pods go), and once their claims are released the
//! controller places B's pod on one island. A's Job stays suspended: 8 GPUs are no longer free in
//! the cohort.

use anyhow::{Context, ensure};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use tessera_api::names::GPU_DEVICE_CLASS;

use super::outcome::ScenarioOutcome;
use super::queues::{
    KUEUE_MANAGED_LABEL, create_kueue_object, delete_kueue_object, kueue_resource,
    labelled_namespace, needs_managed_nodes, one_island, queued_pod_spec, serves_kueue,
};
use crate::context::Ctx;
use crate::steps::{wait_allocated, wait_running};
use crate::wait::{Progress, until};

const TEAM_A: &str = "tessera-e2e-team-a";
const TEAM_B: &str = "tessera-e2e-team-b";
const COHORT: &str = "tessera-e2e-cohort";
const FLAVOR: &str = "tessera-e2e-cohort-gpus";
const LOCAL_QUEUE: &str = "gpus";
/// The template [`queued_pod_spec`] names, created in each team's namespace.
const FOUR_GPUS: &str = "four-gpus";

/// Team `namespace`'s ClusterQueue (named like the namespace).
fn cluster_queue(namespace: &str) -> serde_json::Value {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": namespace},
        "spec": {
            "cohortName": COHORT,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "preemption": {"reclaimWithinCohort": "Any"},
            "resourceGroups": [{
                "coveredResources": ["nvidia.com/gpu"],
                "flavors": [{"name": FLAVOR, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]}],
            }],
        },
    })
}

/// The flavor, both teams' ClusterQueues in the cohort, and in each namespace its LocalQueue and
/// the 4-GPU template.
async fn create_cohort(ctx: &Ctx) -> anyhow::Result<()> {
    create_kueue_object(
        ctx,
        &kueue_resource("ResourceFlavor", "resourceflavors"),
        None,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
               "metadata": {"name": FLAVOR}, "spec": {}}),
    )
    .await?;
    for team in [TEAM_A, TEAM_B] {
        let queues = kueue_resource("ClusterQueue", "clusterqueues");
        create_kueue_object(ctx, &queues, None, cluster_queue(team)).await?;
        create_kueue_object(
            ctx,
            &kueue_resource("LocalQueue", "localqueues"),
            Some(team),
            json!({
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": LOCAL_QUEUE, "namespace": team},
                "spec": {"clusterQueue": team},
            }),
        )
        .await?;
        let template: ResourceClaimTemplate = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": FOUR_GPUS, "namespace": team},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": GPU_DEVICE_CLASS, "count": 4}}
            ]}}},
        }))?;
        Api::<ResourceClaimTemplate>::namespaced(ctx.client.clone(), team)
            .create(&PostParams::default(), &template)
            .await
            .with_context(|| format!("cannot create the 4-GPU template in {team}"))?;
    }
    Ok(())
}

/// Creates, in `namespace`, a Job `name` of `pods` 4-GPU pods queued in the team's LocalQueue.
async fn submit(ctx: &Ctx, namespace: &str, name: &str, pods: i32) -> anyhow::Result<()> {
    let mut spec = queued_pod_spec();
    spec["restartPolicy"] = json!("Never");
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {
            "kueue.x-k8s.io/queue-name": LOCAL_QUEUE,
            "app.kubernetes.io/part-of": "tessera-e2e",
        }},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/part-of": "tessera-e2e"}},
                "spec": spec,
            },
        },
    }))?;
    Api::<Job>::namespaced(ctx.client.clone(), namespace)
        .create(&PostParams::default(), &job)
        .await
        .with_context(|| format!("cannot create Job {namespace}/{name}"))?;
    Ok(())
}

/// The names of Job `job`'s pods that are not being deleted, once there are `count`.
async fn job_pods(
    ctx: &Ctx,
    namespace: &str,
    job: &str,
    count: usize,
) -> anyhow::Result<Vec<String>> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace);
    until(
        &format!("Job {namespace}/{job} to have {count} pod(s)"),
        ctx.timeouts.allocate,
        || async {
            let list = pods
                .list(&ListParams::default().labels(&format!("job-name={job}")))
                .await?;
            let names: Vec<String> = list
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter_map(|p| p.metadata.name)
                .collect();
            Ok(if names.len() == count {
                Progress::Done(names)
            } else {
                Progress::Waiting(format!("pods {names:?} (has Kueue admitted the Job?)"))
            })
        },
    )
    .await
}

/// Waits until Kueue has suspended Job `job` and none of its pods is left.
async fn evicted(ctx: &Ctx, namespace: &str, job: &str) -> anyhow::Result<()> {
    let jobs = Api::<Job>::namespaced(ctx.client.clone(), namespace);
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace);
    until(
        &format!("Kueue to evict Job {namespace}/{job} (suspended, no pods left)"),
        ctx.timeouts.allocate,
        || async {
            let suspended = jobs
                .get(job)
                .await?
                .spec
                .and_then(|s| s.suspend)
                .unwrap_or(false);
            let left = pods
                .list(&ListParams::default().labels(&format!("job-name={job}")))
                .await?
                .items
                .len();
            Ok(if suspended && left == 0 {
                Progress::Done(())
            } else {
                Progress::Waiting(format!("suspended: {suspended}, pods left: {left}"))
            })
        },
    )
    .await
}

pub async fn kueue_cohort(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    if !serves_kueue(ctx).await? {
        return Ok(ScenarioOutcome::Skipped(
            "Kueue is not installed (tests/e2e/local-up --kueue installs it)".to_owned(),
        ));
    }
    if let Some(skipped) = needs_managed_nodes(ctx).await? {
        return Ok(skipped);
    }
    for team in [TEAM_A, TEAM_B] {
        labelled_namespace(ctx, team, &[(KUEUE_MANAGED_LABEL, "true")]).await?;
    }
    let result = borrow_and_reclaim(ctx).await;
    for team in [TEAM_A, TEAM_B] {
        ctx.delete_namespace(team).await?;
        delete_kueue_object(ctx, &kueue_resource("ClusterQueue", "clusterqueues"), team).await?;
    }
    delete_kueue_object(
        ctx,
        &kueue_resource("ResourceFlavor", "resourceflavors"),
        FLAVOR,
    )
    .await?;
    result
}

async fn borrow_and_reclaim(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    create_cohort(ctx).await?;

    // 1. Team A asks for 8 GPUs with 4 of its own: admitted by borrowing B's idle quota.
    submit(ctx, TEAM_A, "train", 2).await?;
    let train = job_pods(ctx, TEAM_A, "train", 2).await?;
    for pod in &train {
        let claims = wait_allocated(ctx, TEAM_A, pod).await?;
        one_island(ctx, &claims, false).await?;
        wait_running(ctx, TEAM_A, pod).await?;
    }
    ctx.say(format!(
        "team A's Job train admitted by borrowing, its pods {train:?} each on one island"
    ));

    // 2. Team B wants its own quota back: Kueue evicts A's whole Job, B's pod is placed once
    //    A's claims are released.
    submit(ctx, TEAM_B, "serve", 1).await?;
    evicted(ctx, TEAM_A, "train").await?;
    let serve = job_pods(ctx, TEAM_B, "serve", 1).await?;
    let claims = wait_allocated(ctx, TEAM_B, &serve[0]).await?;
    one_island(ctx, &claims, false).await?;
    wait_running(ctx, TEAM_B, &serve[0]).await?;
    ctx.say(format!(
        "team B reclaimed its quota: Job train of team A evicted whole, {} placed on one island",
        serve[0]
    ));

    // 3. A's Job waits: the cohort has 4 GPUs of quota left, it needs 8.
    let suspended = Api::<Job>::namespaced(ctx.client.clone(), TEAM_A)
        .get("train")
        .await?
        .spec
        .and_then(|s| s.suspend)
        .unwrap_or(false);
    ensure!(
        suspended,
        "team A's Job was admitted again although the cohort has only 4 GPUs of quota left"
    );
    Ok(ScenarioOutcome::Passed)
}
