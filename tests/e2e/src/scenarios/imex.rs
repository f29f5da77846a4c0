//! IMEX domains on one NVLink fabric clique: jobs whose pods share one claim of class
//! `imex.gpu.tessera.dev` get one channel and a daemon on each of their nodes.
//!
//! Needs the local cluster installed by the chart with at least four `gb200-tray` nodes in one
//! clique (`tests/e2e/local-up --layout gb200`), each annotated with its own IMEX address:
//! 1. The fake driver's knob makes the IMEX daemon of one node answer `UNAVAILABLE`. Job A (4 pods
//!    of 4 GPUs, one shared channel claim) is created: the pod on that node does not start, and
//!    its events carry the daemon's reason; the other pods run. The claim says so: that node's
//!    condition `<node>/IMEXDaemonReady` is `False` with the daemon's answer, and a Warning
//!    `IMEXDaemonNotReady` Event names the node.
//! 2. The knob is removed: that pod starts. Every pod's checker reports the same channel, its
//!    device node and its node's daemon `READY`; a daemon pod runs on exactly the 4 nodes, each
//!    started with, and each node's nodes config naming, the 4 addresses. The claim holds a `True`
//!    condition of each of the 4 nodes (each node's own, merged by the API server), and a Normal
//!    `IMEXDaemonReady` Event names the recovered node.
//! 3. The plugin's DaemonSet is rolled out on the 4 nodes while job A runs: the daemon pods are
//!    the same (UIDs, no restart), job A's pods run on (same UIDs, no restart) and their checkers,
//!    after the rollout, still see the channel and the daemon `READY`.
//! 4. The knob fails the running daemon of one node: the restarted plugin's check marks that
//!    node's condition `False` (with a second Warning Event); the knob goes: `True` again.
//! 5. Job A is deleted: no daemon pod, no domain directory on any node, and the channel is free.
//! 6. Jobs B and C (2 pods each) run at the same time with two different channels.
//! 7. Deleted: nothing left.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::{Event, Pod};
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
/// The daemon's condition on the claim, and the reasons of its Events.
const CONDITION: &str = "IMEXDaemonReady";
const READY_REASON: &str = "IMEXDaemonReady";
const NOT_READY_REASON: &str = "IMEXDaemonNotReady";

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
    let waited = match waited {
        Ok(()) => node_condition_becomes(ctx, "a", &failing.name, false, Some(FAILURE)).await,
        Err(e) => Err(e),
    };
    let waited = match waited {
        Ok(()) => claim_event_names(ctx, "a", NOT_READY_REASON, &failing.name, 1).await,
        Err(e) => Err(e),
    };
    set_knob(failing, None)?;
    waited?;
    let channel_a = job_runs_in_one_domain(ctx, &setting, "a", 4).await?;
    every_node_is_ready_on_the_claim(ctx, &setting, "a", failing).await?;
    a_rollout_leaves_the_daemons_and_the_job(ctx, &setting, "a", 4).await?;
    a_running_daemon_that_fails_marks_the_claim(ctx, "a", failing).await?;
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

/// Node `node`'s IMEX daemon condition on job `job`'s domain claim: (status, message).
async fn node_condition(
    ctx: &Ctx,
    job: &str,
    node: &str,
) -> anyhow::Result<Option<(String, String)>> {
    let claim = Api::<ResourceClaim>::namespaced(ctx.client.clone(), NAMESPACE)
        .get(&format!("{job}-domain"))
        .await?;
    let wanted = format!("{node}/{CONDITION}");
    Ok(claim
        .status
        .iter()
        .flat_map(|s| s.devices.iter().flatten())
        .filter(|d| d.driver == DRIVER_NAME)
        .flat_map(|d| d.conditions.iter().flatten())
        .find(|c| c.type_ == wanted)
        .map(|c| (c.status.clone(), c.message.clone())))
}

/// Waits until node `node`'s condition on job `job`'s claim is `ready`, its message holding
/// `naming` when given.
async fn node_condition_becomes(
    ctx: &Ctx,
    job: &str,
    node: &str,
    ready: bool,
    naming: Option<&str>,
) -> anyhow::Result<()> {
    let status = if ready { "True" } else { "False" };
    let message = until(
        &format!("claim {job}-domain to hold {node}'s condition {CONDITION}={status}"),
        ctx.timeouts.run,
        || async {
            Ok(match node_condition(ctx, job, node).await? {
                Some((s, m)) if s == status && naming.is_none_or(|n| m.contains(n)) => {
                    Progress::Done(m)
                }
                other => Progress::Waiting(format!("{other:?}")),
            })
        },
    )
    .await?;
    ctx.say(format!(
        "claim {job}-domain: {node}/{CONDITION}={status} ({message})"
    ));
    Ok(())
}

/// Events about job `job`'s claim, oldest first.
async fn claim_events(ctx: &Ctx, job: &str) -> anyhow::Result<Vec<Event>> {
    let name = format!("{job}-domain");
    let mut events = Api::<Event>::namespaced(ctx.client.clone(), NAMESPACE)
        .list(&ListParams::default().fields(&format!(
            "involvedObject.kind=ResourceClaim,involvedObject.name={name}"
        )))
        .await
        .with_context(|| format!("cannot list the events of claim {NAMESPACE}/{name}"))?
        .items;
    events.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
    Ok(events)
}

/// Waits until `count` Events with `reason` on job `job`'s claim name `node`.
async fn claim_event_names(
    ctx: &Ctx,
    job: &str,
    reason: &str,
    node: &str,
    count: usize,
) -> anyhow::Result<()> {
    let naming = format!("node {node}:");
    let note = until(
        &format!("{count} {reason} Event(s) on claim {job}-domain naming {node}"),
        ctx.timeouts.run,
        || async {
            let events = claim_events(ctx, job).await?;
            // The recorder counts a repeated Event in the one it recorded first.
            let found: Vec<(String, usize)> = events
                .iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .filter_map(|e| Some((e.message.clone()?, e.count.unwrap_or(1).max(1) as usize)))
                .filter(|(m, _)| m.contains(&naming))
                .collect();
            let occurrences: usize = found.iter().map(|(_, n)| n).sum();
            Ok(if occurrences >= count {
                Progress::Done(found.last().map(|(m, _)| m.clone()).unwrap_or_default())
            } else {
                Progress::Waiting(format!(
                    "{} Event(s), {} of them {reason} naming {node}",
                    events.len(),
                    found.len()
                ))
            })
        },
    )
    .await?;
    ctx.say(format!("claim {job}-domain: Event {reason}: {note}"));
    Ok(())
}

/// 2. Each of the job's nodes holds its own `True` condition on the claim, and the node whose
///    daemon failed has a recovery Event.
async fn every_node_is_ready_on_the_claim(
    ctx: &Ctx,
    setting: &Setting<'_>,
    job: &str,
    recovered: &Node,
) -> anyhow::Result<()> {
    for node in &setting.nodes {
        node_condition_becomes(ctx, job, &node.name, true, None).await?;
    }
    claim_event_names(ctx, job, READY_REASON, &recovered.name, 1).await
}

/// A daemon pod as the rollout must leave it: UID and restart count.
fn daemon_identity(pod: &Pod) -> (String, String, i32) {
    let restarts = pod
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .map(|c| c.restart_count)
        .sum();
    (
        pod.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        pod.metadata.uid.clone().unwrap_or_default(),
        restarts,
    )
}

/// 3. A plugin rollout on the job's nodes leaves the daemons and the job's pods running, and
///    the checkers still see the channel and the daemon ready.
async fn a_rollout_leaves_the_daemons_and_the_job(
    ctx: &Ctx,
    setting: &Setting<'_>,
    job: &str,
    pods: usize,
) -> anyhow::Result<()> {
    let uid = claim_uid(ctx, &format!("{job}-domain")).await?;
    let daemons = Api::<Pod>::namespaced(ctx.client.clone(), setting.plugin_namespace);
    let selector = format!("{DAEMON_COMPONENT},gpu.tessera.dev/imex-domain={uid}");
    let job_pods = Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE);
    let identities = || async {
        let mut daemon_pods: Vec<_> = daemons
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .iter()
            .map(daemon_identity)
            .collect();
        daemon_pods.sort();
        let mut workers: Vec<_> = job_pods
            .list(&ListParams::default().labels(&format!("job={job}")))
            .await?
            .items
            .iter()
            .map(daemon_identity)
            .collect();
        workers.sort();
        anyhow::Ok((daemon_pods, workers))
    };
    let before = identities().await?;
    ensure!(
        before.0.len() == pods && before.1.len() == pods,
        "before the rollout: daemon pods {:?}, job pods {:?}",
        before.0,
        before.1
    );
    let nodes: Vec<&str> = setting.nodes.iter().map(|n| n.name.as_str()).collect();
    let rolled = ctx
        .plugins
        .rollout_restart_on(&nodes, ctx.timeouts.restart * 2)
        .await?;
    ctx.say(rolled);
    let after = identities().await?;
    ensure!(
        after == before,
        "the rollout changed the daemon or job pods (node, uid, restarts): before {before:?}, after {after:?}"
    );
    for index in 0..pods {
        let name = pod_name(job, index);
        let running = wait_running(ctx, NAMESPACE, &name).await?;
        ensure!(
            running.metadata.uid.is_some(),
            "{name} has no UID after the rollout"
        );
        let report = ready_report(ctx, &name).await?;
        ensure!(
            report.imex.as_ref().is_some_and(|i| i.channel_node),
            "{name}: the checker sees no channel device node after the rollout"
        );
    }
    ctx.say(format!(
        "the plugin rollout left {pods} daemon pods and {pods} job pods as they were; the checkers see the channel and READY"
    ));
    Ok(())
}

/// 4. A running daemon that stops answering `READY` is marked on the claim by the plugin's check
///    (a second Warning Event), and marked ready again when it recovers.
async fn a_running_daemon_that_fails_marks_the_claim(
    ctx: &Ctx,
    job: &str,
    failing: &Node,
) -> anyhow::Result<()> {
    set_knob(failing, Some(FAILURE))?;
    let failed = async {
        node_condition_becomes(ctx, job, &failing.name, false, Some(FAILURE)).await?;
        claim_event_names(ctx, job, NOT_READY_REASON, &failing.name, 2).await
    }
    .await;
    set_knob(failing, None)?;
    failed?;
    node_condition_becomes(ctx, job, &failing.name, true, None).await?;
    claim_event_names(ctx, job, READY_REASON, &failing.name, 2).await
}
