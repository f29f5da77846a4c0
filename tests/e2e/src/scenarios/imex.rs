//! IMEX domains on one NVLink fabric clique: jobs whose pods share one claim of class
//! `imex.gpu.tessera.dev` get one channel and a daemon on each of their nodes.
//!
//! Needs the local cluster installed by the chart with at least four `gb200-tray` nodes in one
//! clique (`tests/e2e/local-up --layout gb200`), each annotated with its own IMEX address:
//! 1. The fake driver's knob makes the IMEX daemon of one node answer `UNAVAILABLE`. Job A (4 pods
//!    of 4 GPUs, one shared channel claim) is created: the pod on that node does not start, and
//!    its events carry the daemon's reason; the other pods run.
//! 2. The knob is removed: that pod starts. Every pod's checker reports the same channel, its
//!    device node and its node's daemon `READY`; a daemon pod runs on exactly the 4 nodes, each
//!    started with, and each node's nodes config naming, the 4 addresses.
//! 3. Job A is deleted: no daemon pod, no domain directory on any node, and the channel is free.
//! 4. Jobs B and C (2 pods each) run at the same time with two different channels.
//! 5. Deleted: nothing left.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use tessera_api::DRIVER_NAME;
use tessera_api::imex::{IMEX_DEVICE_CLASS, POOL_PREFIX};

use super::outcome::ScenarioOutcome;
use crate::checker::{self, CheckerReport};
use crate::context::Ctx;
use crate::objects::{CHECK_EVERY_2S, create_namespace, gpu_claim};
use crate::observer::RuntimeObserver;
use crate::steps::{pod_events, wait_running};
use crate::wait::{Progress, until};

const NAMESPACE: &str = "tessera-e2e-imex";
const DAEMON_COMPONENT: &str = "app.kubernetes.io/component=imex-daemon";
const PEERS_ANNOTATION: &str = "gpu.tessera.dev/imex-peers";
const FAILURE: &str = "link down (e2e)";

/// The clique's nodes and where their plugins keep state and the fake driver its knobs.
struct Setting<'a> {
    nodes: Vec<Node>,
    plugin_namespace: &'a str,
}

struct Node {
    name: String,
    state_dir: PathBuf,
    dev_root: PathBuf,
}

pub async fn imex(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let setting = match setting(ctx).await? {
        Ok(setting) => setting,
        Err(why) => return Ok(ScenarioOutcome::Skipped(why)),
    };
    ctx.fresh_namespace(NAMESPACE).await?;
    create_namespace(&ctx.client, NAMESPACE).await?;
    let failing = &setting.nodes[3];
    set_knob(failing, Some(FAILURE))?;
    let created = create_job(ctx, "a", 4).await;
    let waited = match created {
        Ok(()) => a_node_whose_daemon_fails_holds_its_pod(ctx, "a", failing).await,
        Err(e) => Err(e),
    };
    set_knob(failing, None)?;
    waited?;
    let channel_a = job_runs_in_one_domain(ctx, &setting, "a", 4).await?;
    delete_job(ctx, &setting, "a", 4).await?;
    ctx.say(format!(
        "job a (channel {channel_a}) deleted: no daemon, no domain directory left"
    ));
    create_job(ctx, "b", 2).await?;
    create_job(ctx, "c", 2).await?;
    let channel_b = job_runs_in_one_domain(ctx, &setting, "b", 2).await?;
    let channel_c = job_runs_in_one_domain(ctx, &setting, "c", 2).await?;
    ensure!(
        channel_b != channel_c,
        "jobs b and c share channel {channel_b}"
    );
    ctx.say(format!(
        "jobs b and c run at once on channels {channel_b} and {channel_c}"
    ));
    delete_job(ctx, &setting, "b", 2).await?;
    delete_job(ctx, &setting, "c", 2).await?;
    ctx.delete_namespace(NAMESPACE).await?;
    Ok(ScenarioOutcome::Passed)
}

/// The [`Setting`], or why this cluster cannot run the scenario.
async fn setting(ctx: &Ctx) -> anyhow::Result<Result<Setting<'_>, String>> {
    let RuntimeObserver::Local { local, .. } = &ctx.observer else {
        return Ok(Err(
            "needs the local cluster (the domains' directories are on this machine)".into(),
        ));
    };
    let Some(plugin_namespace) = ctx.plugins.namespace() else {
        return Ok(Err(
            "needs Tessera installed by helm (IMEX daemons in pods of their own)".into(),
        ));
    };
    if !ctx.observer.expects_checker() {
        return Ok(Err(
            "needs containerd and a fake NVIDIA driver on every node".into(),
        ));
    }
    let published = ctx.published().await?;
    let fabric_nodes = published
        .nodes()
        .into_iter()
        .filter(|n| {
            published
                .on_node(n)
                .any(|d| d.attribute("fabricClique").is_some())
        })
        .count();
    if fabric_nodes < 4 {
        return Ok(Err(format!(
            "needs 4 nodes in one NVLink fabric clique (local-up --layout gb200); {fabric_nodes} publish a fabricClique"
        )));
    }
    // The controller publishes the clique's channels once it leads and has seen the slices.
    let clique = until(
        "the controller to publish the clique's IMEX channels",
        ctx.timeouts.allocate,
        || async {
            let slices = Api::<ResourceSlice>::all(ctx.client.clone())
                .list(&ListParams::default().fields(&format!("spec.driver={DRIVER_NAME}")))
                .await?;
            let nodes = slices
                .items
                .iter()
                .filter(|s| s.spec.pool.name.starts_with(POOL_PREFIX))
                .map(selected_nodes)
                .max_by_key(Vec::len)
                .unwrap_or_default();
            Ok(if nodes.len() >= 4 {
                Progress::Done(nodes)
            } else {
                Progress::Waiting(format!("channel slices select {nodes:?}"))
            })
        },
    )
    .await?;
    let mut nodes = Vec::new();
    for name in clique.into_iter().take(4) {
        let node = local.node(&name)?;
        nodes.push(Node {
            state_dir: node
                .plugin_state_dir
                .clone()
                .context("no plugin state dir")?,
            dev_root: node.dev_root.clone().context("no fake device root")?,
            name,
        });
    }
    Ok(Ok(Setting {
        nodes,
        plugin_namespace,
    }))
}

/// The nodes a network-attached slice selects (`kubernetes.io/hostname In [...]`; the local
/// cluster's hostname labels are the node names).
fn selected_nodes(slice: &ResourceSlice) -> Vec<String> {
    slice
        .spec
        .node_selector
        .iter()
        .flat_map(|s| &s.node_selector_terms)
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|r| r.key == "kubernetes.io/hostname")
        .flat_map(|r| r.values.iter().flatten().cloned())
        .collect()
}

/// Writes (or removes) the fake driver's IMEX knob of `node`.
fn set_knob(node: &Node, fail: Option<&str>) -> anyhow::Result<()> {
    let dir = node.dev_root.join("tessera-fake-gpu-state");
    let path = dir.join("imex.json");
    match fail {
        Some(reason) => std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&path, serde_json::json!({"fail": reason}).to_string()))
            .with_context(|| format!("cannot write {}", path.display())),
        None => match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("cannot remove {}", path.display()))
            }
            _ => Ok(()),
        },
    }
}

fn pod_name(job: &str, index: usize) -> String {
    format!("{job}-{index}")
}

/// A job: one channel claim `<job>-domain` shared by `pods` pods, each with its own 4 GPUs.
async fn create_job(ctx: &Ctx, job: &str, pods: usize) -> anyhow::Result<()> {
    let claims = Api::<ResourceClaim>::namespaced(ctx.client.clone(), NAMESPACE);
    let domain: ResourceClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": NAMESPACE, "name": format!("{job}-domain")},
        "spec": {"devices": {"requests": [{"name": "channel",
            "exactly": {"deviceClassName": IMEX_DEVICE_CLASS}}]}},
    }))?;
    claims.create(&PostParams::default(), &domain).await?;
    let api = Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE);
    for index in 0..pods {
        let name = pod_name(job, index);
        let gpus = gpu_claim(NAMESPACE, &format!("{name}-gpus"), 4, None)?;
        claims.create(&PostParams::default(), &gpus).await?;
        api.create(&PostParams::default(), &job_pod(job, &name)?)
            .await?;
    }
    Ok(())
}

fn job_pod(job: &str, name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": NAMESPACE, "name": name,
            "labels": {"app.kubernetes.io/part-of": "tessera-e2e", "job": job}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "resourceClaims": [
                {"name": "gpus", "resourceClaimName": format!("{name}-gpus")},
                {"name": "domain", "resourceClaimName": format!("{job}-domain")},
            ],
            "containers": [{
                "name": "ctr",
                "image": "busybox:1.37",
                "command": ["sh", "-c", CHECK_EVERY_2S],
                "resources": {"claims": [{"name": "gpus"}, {"name": "domain"}]},
            }],
        },
    }))?)
}

/// 1. The pod on the failing node waits, its events naming the daemon's answer; the others run.
async fn a_node_whose_daemon_fails_holds_its_pod(
    ctx: &Ctx,
    job: &str,
    failing: &Node,
) -> anyhow::Result<()> {
    let api = Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE);
    let held = until(
        &format!(
            "a pod of job {job} on {} to report the daemon's failure",
            failing.name
        ),
        ctx.timeouts.run * 2,
        || async {
            let pods = api
                .list(&ListParams::default().labels(&format!("job={job}")))
                .await?;
            let Some(pod) = pods.items.iter().find(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&failing.name)
            }) else {
                return Ok(Progress::Waiting("no pod bound there yet".into()));
            };
            let name = pod.metadata.name.clone().unwrap_or_default();
            let events = pod_events(ctx, NAMESPACE, &name).await?;
            Ok(
                match events
                    .iter()
                    .find(|e| e.message.as_deref().unwrap_or("").contains(FAILURE))
                {
                    Some(event) => {
                        Progress::Done((name, event.message.clone().unwrap_or_default()))
                    }
                    None => Progress::Waiting(format!(
                        "{name}: {} event(s), none naming it",
                        events.len()
                    )),
                },
            )
        },
    )
    .await?;
    let pod = api.get(&held.0).await?;
    let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
    ensure!(
        phase == "Pending",
        "pod {} is {phase}, not Pending, while its daemon fails",
        held.0
    );
    ctx.say(format!("{} on {} waits: {}", held.0, failing.name, held.1));
    Ok(())
}

/// 2. Every pod runs and reports the same channel and a ready daemon; one daemon pod per node,
///    each with the job's peers. Returns the channel.
async fn job_runs_in_one_domain(
    ctx: &Ctx,
    setting: &Setting<'_>,
    job: &str,
    pods: usize,
) -> anyhow::Result<String> {
    let mut channels = BTreeSet::new();
    let mut nodes = BTreeSet::new();
    for index in 0..pods {
        let name = pod_name(job, index);
        let pod = wait_running(ctx, NAMESPACE, &name).await?;
        nodes.insert(pod.spec.and_then(|s| s.node_name).unwrap_or_default());
        let report = ready_report(ctx, &name).await?;
        let imex = report.imex.context("the checker reports no IMEX channel")?;
        ensure!(
            imex.channel_node,
            "{name}: no device node for channel {}",
            imex.channel
        );
        channels.insert(imex.channel);
    }
    ensure!(
        channels.len() == 1,
        "job {job}'s pods see channels {channels:?}"
    );
    ensure!(
        nodes.len() == pods,
        "job {job}'s {pods} pods run on {nodes:?}"
    );
    let uid = claim_uid(ctx, &format!("{job}-domain")).await?;
    daemons_name_the_peers(ctx, setting, &uid, &nodes).await?;
    let channel = channels.into_iter().next().unwrap_or_default();
    ctx.say(format!(
        "job {job}: {pods} pods on {nodes:?}, channel {channel}, daemons ready"
    ));
    Ok(channel)
}

/// The latest checker report of `pod` once it says the daemon is `READY`.
async fn ready_report(ctx: &Ctx, pod: &str) -> anyhow::Result<CheckerReport> {
    let api = Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE);
    let params = LogParams {
        container: Some("ctr".to_owned()),
        ..LogParams::default()
    };
    until(
        &format!("{pod}'s checker to see its IMEX daemon ready"),
        ctx.timeouts.run,
        || async {
            let log = api.logs(pod, &params).await?;
            Ok(match checker::last_report(&log) {
                Some((_, report)) => {
                    let report = report?;
                    let imex = report.imex.clone();
                    match imex.as_ref().and_then(|i| i.daemon.as_deref()) {
                        Some("READY") => Progress::Done(report),
                        _ => Progress::Waiting(format!("imex: {imex:?}")),
                    }
                }
                None => Progress::Waiting("no report yet".into()),
            })
        },
    )
    .await
}

async fn claim_uid(ctx: &Ctx, name: &str) -> anyhow::Result<String> {
    let claim = Api::<ResourceClaim>::namespaced(ctx.client.clone(), NAMESPACE)
        .get(name)
        .await?;
    claim.metadata.uid.context("a claim without a UID")
}

/// A daemon pod of the domain runs on each of `nodes` and on no other, started with as many
/// peers as there are nodes; each node's nodes config names them.
async fn daemons_name_the_peers(
    ctx: &Ctx,
    setting: &Setting<'_>,
    uid: &str,
    nodes: &BTreeSet<String>,
) -> anyhow::Result<()> {
    let api = Api::<Pod>::namespaced(ctx.client.clone(), setting.plugin_namespace);
    let selector = format!("{DAEMON_COMPONENT},gpu.tessera.dev/imex-domain={uid}");
    let peers = until(
        &format!(
            "the daemons of domain {uid} to name their {} peers",
            nodes.len()
        ),
        ctx.timeouts.run,
        || async {
            let pods = api
                .list(&ListParams::default().labels(&selector))
                .await?
                .items;
            let on: BTreeSet<String> = pods
                .iter()
                .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                .collect();
            let peers: BTreeSet<String> = pods
                .iter()
                .filter_map(|p| {
                    p.metadata
                        .annotations
                        .as_ref()?
                        .get(PEERS_ANNOTATION)
                        .cloned()
                })
                .collect();
            Ok(match (on == *nodes, peers.len(), peers.iter().next()) {
                (true, 1, Some(list)) if list.split(',').count() == nodes.len() => {
                    Progress::Done(list.clone())
                }
                _ => Progress::Waiting(format!("daemon pods on {on:?} with peers {peers:?}")),
            })
        },
    )
    .await?;
    for node in setting.nodes.iter().filter(|n| nodes.contains(&n.name)) {
        let file = domain_dir(&node.state_dir, uid).join("nodes_config.cfg");
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let lines: Vec<&str> = text.lines().collect();
        ensure!(
            lines.join(",") == peers,
            "{}: {lines:?}, the daemon pods say {peers}",
            file.display()
        );
    }
    ctx.say(format!("domain {uid}: daemons on {nodes:?}, peers {peers}"));
    Ok(())
}

fn domain_dir(state_dir: &Path, uid: &str) -> PathBuf {
    state_dir.join("imex").join(uid)
}

/// 3. Deletes a job's pods and claims; then no daemon pod or directory of its domain is left.
async fn delete_job(
    ctx: &Ctx,
    setting: &Setting<'_>,
    job: &str,
    pods: usize,
) -> anyhow::Result<()> {
    let uid = claim_uid(ctx, &format!("{job}-domain")).await?;
    let api = Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE);
    let claims = Api::<ResourceClaim>::namespaced(ctx.client.clone(), NAMESPACE);
    for index in 0..pods {
        api.delete(&pod_name(job, index), &DeleteParams::default())
            .await?;
    }
    let daemons = Api::<Pod>::namespaced(ctx.client.clone(), setting.plugin_namespace);
    let selector = format!("{DAEMON_COMPONENT},gpu.tessera.dev/imex-domain={uid}");
    until(
        &format!("job {job}'s pods and daemons to go"),
        ctx.timeouts.delete,
        || async {
            let left = api
                .list(&ListParams::default().labels(&format!("job={job}")))
                .await?
                .items
                .len();
            let daemons = daemons
                .list(&ListParams::default().labels(&selector))
                .await?
                .items
                .len();
            let dirs: Vec<String> = setting
                .nodes
                .iter()
                .filter(|n| domain_dir(&n.state_dir, &uid).exists())
                .map(|n| n.name.clone())
                .collect();
            Ok(if left + daemons == 0 && dirs.is_empty() {
                Progress::Done(())
            } else {
                Progress::Waiting(format!(
                    "{left} pod(s), {daemons} daemon pod(s), directories on {dirs:?}"
                ))
            })
        },
    )
    .await?;
    claims
        .delete(&format!("{job}-domain"), &DeleteParams::default())
        .await?;
    for index in 0..pods {
        claims
            .delete(
                &format!("{}-gpus", pod_name(job, index)),
                &DeleteParams::default(),
            )
            .await?;
    }
    Ok(())
}
