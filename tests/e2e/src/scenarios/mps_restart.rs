//! An MPS claim's control daemon outlives the node plugin: a DaemonSet rollout and a deleted
//! plugin pod leave it running for the claim's container, and unprepare stops it.
//!
//! Tessera installed by the chart on the local cluster (containerd, a fake NVIDIA driver per
//! node), where MPS daemons run in pods of their own (`kubeletPlugin.mpsDaemons: pod`):
//! 1. Pod A with an MPS claim runs the checker every 2 s; its claim's daemon pod
//!    `tessera-mps-<claim uid>` runs in the plugin's namespace. The daemon is identified by its
//!    pod's UID, its container's start time and restart count, and its process on this machine
//!    (the pid in the claim's pipe directory, that process's start time and command line).
//! 2. The plugin's DaemonSet is rolled out (as `kubectl rollout restart` does), then the new
//!    plugin pod is deleted with grace period 0 (the DaemonSet recreates it). After each: the
//!    daemon is the same, and a checker report of pod A taken after the new plugin is ready
//!    shows the claim's MPS daemon answering with the claim's limits.
//! 3. Pod B with a second MPS claim, prepared by the restarted plugin, runs with a daemon of its
//!    own.
//! 4. Both pods deleted: the claims are unprepared, the daemon pods are gone, the daemons'
//!    processes have ended, no process on this machine uses either pipe directory, and the
//!    claims' MPS directories are removed.

use std::path::{Path, PathBuf};

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams};

use super::outcome::ScenarioOutcome;
use crate::checker;
use crate::claims::container_claims;
use crate::context::Ctx;
use crate::objects::{
    CHECK_EVERY_2S, PlacedBy, create_claim_and_pod, create_namespace, gpu_pod_running, mps_claim,
};
use crate::observer::RuntimeObserver;
use crate::steps::{
    AllocatedClaim, check_containers, check_prepared, check_unprepared, expected_check,
    wait_allocated, wait_running,
};
use crate::wait::{Progress, until};

const NAMESPACE: &str = "tessera-e2e-mps-restart";
/// The fake `nvidia-cuda-mps-control` writes its pid here in the pipe directory.
const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
const PERCENTAGE: u32 = 40;
const PINNED: &str = "4Gi";

/// One MPS control daemon, as seen from the API server and from this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Daemon {
    pod: String,
    pod_uid: String,
    /// `state.running.startedAt` of the pod's container.
    started_at: String,
    restarts: i32,
    /// The control daemon's pid on this machine (the daemon pods use the host's pid namespace).
    pid: u32,
    /// Its start time in clock ticks since boot (`/proc/<pid>/stat`), so a reused pid is told
    /// apart.
    process_start: u64,
}

impl Daemon {
    fn describe(&self) -> String {
        format!(
            "pod {} (uid {}, started {}, {} restart(s)), pid {} (start {})",
            self.pod, self.pod_uid, self.started_at, self.restarts, self.pid, self.process_start
        )
    }
}

pub async fn mps_restart(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let Setting {
        node,
        state_dir,
        plugin_namespace,
    } = match setting(ctx).await? {
        Ok(setting) => setting,
        Err(why) => return Ok(ScenarioOutcome::Skipped(why)),
    };
    let daemon_pods = Api::<Pod>::namespaced(ctx.client.clone(), plugin_namespace);
    ctx.fresh_namespace(NAMESPACE).await?;
    create_namespace(&ctx.client, NAMESPACE).await?;
    let (claim_a, pod_a, daemon_a) = first_claim(ctx, &daemon_pods, &state_dir, &node).await?;
    let reached = (&claim_a, &pod_a, &daemon_a);
    restarts_keep_the_daemon(ctx, &daemon_pods, &state_dir, &node, reached).await?;
    let (claim_b, daemon_b) =
        second_claim(ctx, &daemon_pods, &state_dir, &node, (&claim_a, &daemon_a)).await?;
    let claims = [claim_a, claim_b];
    check_prepared(ctx, &claims).await?;

    // 4. Unprepare: nothing left.
    ctx.delete_namespace(NAMESPACE).await?;
    check_unprepared(ctx, &claims).await?;
    let daemons = [&daemon_a, &daemon_b];
    nothing_left(ctx, &daemon_pods, &state_dir, &claims, daemons).await?;
    Ok(ScenarioOutcome::Passed)
}

/// Where the scenario runs: an unmanaged node with 2 whole GPUs, its plugin's state dir, and
/// the plugins' namespace.
struct Setting<'a> {
    node: String,
    state_dir: PathBuf,
    plugin_namespace: &'a str,
}

/// The [`Setting`], or why this cluster cannot run the scenario.
async fn setting(ctx: &Ctx) -> anyhow::Result<Result<Setting<'_>, String>> {
    let RuntimeObserver::Local { local, .. } = &ctx.observer else {
        return Ok(Err(
            "needs the local cluster (the daemons' processes and pipe directories are on this machine)".into(),
        ));
    };
    let Some(plugin_namespace) = ctx.plugins.namespace() else {
        return Ok(Err(
            "needs Tessera installed by helm (MPS daemons in pods of their own)".into(),
        ));
    };
    if !ctx.observer.expects_checker() {
        return Ok(Err(
            "needs containerd and a fake NVIDIA driver on every node (MPS through the driver's tools)".into(),
        ));
    }
    let published = ctx.published().await?;
    let managed = ctx.managed_nodes().await?;
    let Some(node) = published
        .nodes()
        .into_iter()
        .find(|n| !managed.contains(n) && published.whole_gpus(n).len() >= 2)
    else {
        return Ok(Err("needs an unmanaged node with 2 whole GPUs".into()));
    };
    let state_dir = local
        .node(&node)?
        .plugin_state_dir
        .clone()
        .with_context(|| format!("the local cluster names no plugin state dir for {node}"))?;
    Ok(Ok(Setting {
        node,
        state_dir,
        plugin_namespace,
    }))
}

/// 1. Pod A and its daemon, the one process using the claim's pipe directory.
async fn first_claim(
    ctx: &Ctx,
    daemon_pods: &Api<Pod>,
    state_dir: &Path,
    node: &str,
) -> anyhow::Result<(AllocatedClaim, Pod, Daemon)> {
    create(ctx, "mps-a", node).await?;
    let (claim_a, pod_a) = running(ctx, "mps-a").await?;
    let daemon_a = daemon(daemon_pods, state_dir, claim_a.uid()).await?;
    let pipe_a = pipe_directory(state_dir, claim_a.uid());
    let users = processes_using(&pipe_a)?;
    ensure!(
        users.contains(&daemon_a.pid),
        "the daemon's pid {} is not among the processes using {} ({users:?})",
        daemon_a.pid,
        pipe_a.display()
    );
    ctx.say(format!(
        "claim {} on {node}: MPS daemon {}",
        claim_a.name(),
        daemon_a.describe()
    ));
    Ok((claim_a, pod_a, daemon_a))
}

/// 2. A rollout, then a deleted plugin pod: the same daemon, still reached by pod A.
async fn restarts_keep_the_daemon(
    ctx: &Ctx,
    daemon_pods: &Api<Pod>,
    state_dir: &Path,
    node: &str,
    (claim_a, pod_a, daemon_a): (&AllocatedClaim, &Pod, &Daemon),
) -> anyhow::Result<()> {
    let rolled = ctx
        .plugins
        .rollout_restart(node, ctx.timeouts.restart)
        .await?;
    ctx.say(rolled);
    same_daemon_reached(ctx, daemon_pods, state_dir, claim_a, pod_a, daemon_a).await?;
    let killed = ctx.plugins.kill(node).await?;
    ctx.plugins.start(node, ctx.timeouts.restart).await?;
    ctx.say(format!("{killed}; the DaemonSet's new plugin pod is ready"));
    same_daemon_reached(ctx, daemon_pods, state_dir, claim_a, pod_a, daemon_a).await?;
    Ok(())
}

/// 3. A second MPS claim, prepared by the restarted plugin, with a daemon of its own.
async fn second_claim(
    ctx: &Ctx,
    daemon_pods: &Api<Pod>,
    state_dir: &Path,
    node: &str,
    (claim_a, daemon_a): (&AllocatedClaim, &Daemon),
) -> anyhow::Result<(AllocatedClaim, Daemon)> {
    create(ctx, "mps-b", node).await?;
    let (claim_b, _) = running(ctx, "mps-b").await?;
    let daemon_b = daemon(daemon_pods, state_dir, claim_b.uid()).await?;
    ensure!(
        daemon_b.pod_uid != daemon_a.pod_uid && daemon_b.pid != daemon_a.pid,
        "claims {} and {} share an MPS daemon: {} / {}",
        claim_a.name(),
        claim_b.name(),
        daemon_a.describe(),
        daemon_b.describe()
    );
    ctx.say(format!(
        "claim {} prepared after the restarts: its own MPS daemon {}",
        claim_b.name(),
        daemon_b.describe()
    ));
    Ok((claim_b, daemon_b))
}

/// After unprepare: each daemon's pod gone, its process ended, no process using its pipe
/// directory, its MPS directory removed.
async fn nothing_left(
    ctx: &Ctx,
    daemon_pods: &Api<Pod>,
    state_dir: &Path,
    claims: &[AllocatedClaim],
    daemons: [&Daemon; 2],
) -> anyhow::Result<()> {
    for (claim, daemon) in claims.iter().zip(daemons) {
        until(
            &format!("MPS daemon pod {} to be gone", daemon.pod),
            ctx.timeouts.delete,
            || async {
                Ok(match daemon_pods.get_opt(&daemon.pod).await? {
                    None => Progress::Done(()),
                    Some(pod) => Progress::Waiting(format!(
                        "still there (deletion {})",
                        if pod.metadata.deletion_timestamp.is_some() {
                            "requested"
                        } else {
                            "not requested"
                        }
                    )),
                })
            },
        )
        .await?;
        ensure!(
            process_start(daemon.pid).ok() != Some(daemon.process_start),
            "claim {} is unprepared but its MPS daemon (pid {}) still runs",
            claim.name(),
            daemon.pid
        );
        let pipe = pipe_directory(state_dir, claim.uid());
        let users = processes_using(&pipe)?;
        ensure!(
            users.is_empty(),
            "claim {} is unprepared but processes {users:?} still use its pipe directory {}",
            claim.name(),
            pipe.display()
        );
        let dir = state_dir.join("mps").join(claim.uid());
        ensure!(
            !dir.exists(),
            "claim {} is unprepared but its MPS directory {} is still there",
            claim.name(),
            dir.display()
        );
    }
    ctx.say(
        "unprepared: both daemon pods gone, their processes ended, no process uses their pipe \
         directories, their MPS directories removed",
    );
    Ok(())
}

async fn create(ctx: &Ctx, name: &str, node: &str) -> anyhow::Result<()> {
    create_claim_and_pod(
        &ctx.client,
        &mps_claim(NAMESPACE, name, PERCENTAGE, PINNED)?,
        &gpu_pod_running(
            NAMESPACE,
            name,
            name,
            PlacedBy::SchedulerOn(node),
            CHECK_EVERY_2S,
        )?,
    )
    .await
    .with_context(|| format!("creating {name}"))
}

/// Waits until pod `name` runs and its container's first checker report is right (the claim's
/// GPU, the driver, MPS with the claim's limits); its claim.
async fn running(ctx: &Ctx, name: &str) -> anyhow::Result<(AllocatedClaim, Pod)> {
    let claims = wait_allocated(ctx, NAMESPACE, name).await?;
    let pod = wait_running(ctx, NAMESPACE, name).await?;
    check_containers(ctx, &pod, &claims, &ctx.published().await?).await?;
    let [claim] = <[AllocatedClaim; 1]>::try_from(claims)
        .map_err(|c| anyhow::anyhow!("pod {name} has {} claims, expected 1", c.len()))?;
    Ok((claim, pod))
}

/// After a plugin restart: the claim's daemon is `before`, and a checker report that pod A's
/// container printed after the new plugin was ready shows MPS working with the claim's limits.
async fn same_daemon_reached(
    ctx: &Ctx,
    daemon_pods: &Api<Pod>,
    state_dir: &Path,
    claim: &AllocatedClaim,
    pod: &Pod,
    before: &Daemon,
) -> anyhow::Result<()> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let after = daemon(daemon_pods, state_dir, claim.uid()).await?;
    ensure!(
        after == *before,
        "the MPS daemon of claim {} changed across the plugin restart: before {}, after {}",
        claim.name(),
        before.describe(),
        after.describe()
    );
    // A report begun before the restart ended could predate it: wait for two more.
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE);
    let log_params = LogParams {
        container: Some("ctr".to_owned()),
        ..LogParams::default()
    };
    let reports_now = checker::last_report(&pods.logs(pod_name, &log_params).await?)
        .map_or(0, |(count, _)| count);
    let report = until(
        &format!("two more checker reports from {NAMESPACE}/{pod_name}"),
        ctx.timeouts.run,
        || async {
            let log = pods.logs(pod_name, &log_params).await?;
            Ok(match checker::last_report(&log) {
                Some((count, report)) if count >= reports_now + 2 => Progress::Done(report?),
                Some((count, _)) => Progress::Waiting(format!("{count} report(s) so far")),
                None => Progress::Waiting("no report".to_owned()),
            })
        },
    )
    .await?;
    let expected = expected_check(
        pod,
        &container_claims(pod, "ctr"),
        std::slice::from_ref(claim),
        &ctx.published().await?,
    )?;
    ensure!(
        expected.mps.is_some(),
        "claim {} is not an MPS claim",
        claim.name()
    );
    checker::check_claim_container(&report, &expected).with_context(|| {
        format!("{NAMESPACE}/{pod_name}/ctr after the plugin restart: the checker's latest report")
    })?;
    ctx.say(format!(
        "same MPS daemon after the restart ({}); {pod_name}'s latest checker report: MPS daemon answers with {}% and the pinned limit",
        after.describe(),
        report
            .mps
            .as_ref()
            .and_then(|m| m.active_thread_percentage.clone())
            .unwrap_or_default()
    ));
    Ok(())
}

fn pipe_directory(state_dir: &Path, claim_uid: &str) -> PathBuf {
    state_dir.join("mps").join(claim_uid).join("pipe")
}

/// The claim's MPS daemon: its pod (`tessera-mps-<claim uid>`, running) and its process.
async fn daemon(pods: &Api<Pod>, state_dir: &Path, claim_uid: &str) -> anyhow::Result<Daemon> {
    let name = format!("tessera-mps-{claim_uid}");
    let pod = pods.get_opt(&name).await?.with_context(|| {
        format!("claim {claim_uid} is prepared but has no MPS daemon pod {name}")
    })?;
    let status = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .with_context(|| format!("MPS daemon pod {name} has no container status"))?;
    let started_at = status
        .state
        .as_ref()
        .and_then(|s| s.running.as_ref())
        .and_then(|r| r.started_at.as_ref())
        .map(|t| t.0.to_string())
        .with_context(|| format!("the container of MPS daemon pod {name} is not running"))?;
    let pid_file = pipe_directory(state_dir, claim_uid).join(PID_FILE);
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .with_context(|| format!("cannot read the daemon's pid file {}", pid_file.display()))?
        .trim()
        .parse()
        .with_context(|| format!("{} holds no pid", pid_file.display()))?;
    let command = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let command = String::from_utf8_lossy(&command).replace('\0', " ");
    ensure!(
        command.contains("nvidia-cuda-mps-control"),
        "pid {pid} of {} is not an MPS control daemon: `{command}`",
        pid_file.display()
    );
    Ok(Daemon {
        pod: name,
        pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
        started_at,
        restarts: status.restart_count,
        pid,
        process_start: process_start(pid)?,
    })
}

/// Field 22 of `/proc/<pid>/stat`: when the process started, in clock ticks since boot.
fn process_start(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("process {pid} does not run"))?;
    parse_start(&stat).with_context(|| format!("cannot read the start time in /proc/{pid}/stat"))
}

fn parse_start(stat: &str) -> Option<u64> {
    // The command (field 2) is in parentheses and may hold spaces; field 3 follows the last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// The processes on this machine whose environment names `pipe` as their MPS pipe directory:
/// the claim's daemon, its server and its clients.
fn processes_using(pipe: &Path) -> anyhow::Result<Vec<u32>> {
    let wanted = format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe.display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").context("cannot list /proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // Processes that end while we look, or that we may not read, are skipped.
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ
            .split(|b| *b == 0)
            .any(|var| var == wanted.as_bytes())
        {
            found.push(pid);
        }
    }
    // A zombie is not a process that uses the directory.
    found.retain(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| crate::local::process_state(&s))
            .is_some_and(|state| state != 'Z')
    });
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_field_22_even_with_spaces_in_the_command() {
        let stat = "4242 (nvidia mps) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    987654 12345 67 18446744073709551615";
        assert_eq!(parse_start(stat), Some(987_654));
        assert_eq!(parse_start("4242 (x) S 1"), None);
    }

    #[test]
    fn a_process_is_found_by_the_pipe_directory_in_its_environment() {
        let pipe = Path::new("/nonexistent/tessera-e2e-test/pipe");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
            .spawn()
            .unwrap();
        // The child's environment is its own only once it has exec'd, which `spawn` returning
        // does not promise: look until it shows (or 10 s pass).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let found = loop {
            let found = processes_using(pipe).unwrap();
            if !found.is_empty() || std::time::Instant::now() > deadline {
                break found;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let other = processes_using(Path::new("/nonexistent/tessera-e2e-test/other")).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(found, vec![child.id()]);
        assert!(other.is_empty(), "{other:?}");
        assert!(processes_using(pipe).unwrap().is_empty());
        assert!(process_start(std::process::id()).unwrap() > 0);
    }
}
