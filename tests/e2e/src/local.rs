//! The local cluster of tests/cluster as the suite sees it: per node, where the plugin's CDI
//! specs and checkpoint are (files on this machine, whichever way Tessera runs), where the fake
//! runtime's container records are (fake runtime only), and how tests/e2e/local-up installed
//! Tessera: with helm (plugin and controller pods, restarted by deleting them) or as processes
//! (run script, pid file, log, state dir; the suite can kill and start them again).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use crate::envfile::EnvFile;

/// Where local-up writes how it installed Tessera, relative to the cluster's state dir.
pub const INSTALL_ENV: &str = "tessera/install.env";

/// How Tessera runs on the local cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Install {
    /// Plain processes on this machine (tests/e2e/local-up --install processes).
    Processes,
    /// The chart, installed by helm into this namespace: plugin DaemonSet pods and controller
    /// pods in containerd.
    Helm { namespace: String },
}

/// The helm release local-up installed, for scenarios that change its values and restore them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelmRelease {
    /// The helm binary tests/cluster built.
    pub helm: PathBuf,
    /// The chart archive local-up packaged from deploy/helm/tessera and installed (in its state dir),
    /// so an upgrade during the run uses the chart the run started with. Its directory also holds
    /// the chart's `ci/` values, which the archive leaves out ([`HelmRelease::ci_values`]).
    pub chart: PathBuf,
    /// The values file local-up installed with.
    pub values: PathBuf,
    pub namespace: String,
}

impl HelmRelease {
    /// The chart's CI values file `name` (`monitoring-values.yaml`), copied beside the archive
    /// when local-up packaged it.
    pub fn ci_values(&self, name: &str) -> PathBuf {
        self.chart
            .parent()
            .unwrap_or_else(|| Path::new("."))
            .join("ci")
            .join(name)
    }
}

/// A Tessera process local-up started.
#[derive(Debug, Clone)]
pub struct Process {
    /// `tessera-kubelet-plugin on tessera-node-1`, for messages.
    pub name: String,
    /// A script that writes its pid to `pid_file` and execs the process (never returns).
    pub run_script: PathBuf,
    pub pid_file: PathBuf,
    pub log: PathBuf,
    /// The plugin's `--state-dir` (checkpoint); none for the controller.
    pub state_dir: Option<PathBuf>,
    /// Text the process's command line must contain (the cluster's state dir, which every
    /// process local-up starts names in its flags), so a recycled pid is never signalled.
    pub cmdline_marker: String,
    /// Where it serves /metrics (`127.0.0.1:PORT`), when local-up recorded it.
    pub metrics: Option<String>,
}

/// One kubelet node.
#[derive(Debug, Clone)]
pub struct LocalNode {
    pub name: String,
    pub cdi_spec_dir: PathBuf,
    /// The fake runtime's container records; `None` with containerd (containers really run).
    pub cdi_record_dir: Option<PathBuf>,
    pub kubelet_log: PathBuf,
    /// The plugin process (install `Processes`).
    pub plugin: Option<Process>,
    /// The plugin's state dir (checkpoint), a host path either way.
    pub plugin_state_dir: Option<PathBuf>,
    /// The node's fake NVIDIA driver root (tessera-fake-driver-root), when local-up laid one
    /// out: claim containers then get its files and run the checker against them.
    pub driver_root: Option<PathBuf>,
    /// The fake driver's device root: its fake NVML reads scripted GPU telemetry from
    /// `<dev root>/tessera-fake-gpu-state/samples` (testing/fake-nvml/README.md).
    pub dev_root: Option<PathBuf>,
    /// The kubelet's plugin registration directory (`plugins_registry`), where a kubelet plugin
    /// of another driver registers (the stand-in NIC driver, crate::stand_in).
    pub registrar_dir: Option<PathBuf>,
    /// The kubelet's plugins directory, where such a plugin's DRA socket goes.
    pub plugins_dir: Option<PathBuf>,
}

/// The local cluster.
#[derive(Debug, Clone)]
pub struct LocalCluster {
    pub state_dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub nodes: BTreeMap<String, LocalNode>,
    pub install: Install,
    /// The helm release (install `Helm`, from a local-up that records it).
    pub helm: Option<HelmRelease>,
    pub controller: Option<Process>,
    /// Control-plane logs worth a tail on failure (scheduler, controller-manager).
    pub control_plane_logs: Vec<PathBuf>,
}

impl LocalCluster {
    /// Reads `DIR/env` and, when present, `DIR/tessera/install.env`.
    pub fn read(env_file: &Path) -> anyhow::Result<Self> {
        let env = EnvFile::read(env_file)?;
        let state_dir = env.path("TESSERA_CLUSTER_STATE_DIR")?;
        let processes_path = state_dir.join(INSTALL_ENV);
        let processes = if processes_path.exists() {
            Some(EnvFile::read(&processes_path)?)
        } else {
            None
        };
        Self::from_env(&env, processes.as_ref())
    }

    /// Builds the description from the cluster's env file and local-up's install.env.
    pub fn from_env(env: &EnvFile, processes: Option<&EnvFile>) -> anyhow::Result<Self> {
        let install = install_of(processes)?;
        let count: usize = env.get("TESSERA_NODE_COUNT")?.parse().with_context(|| {
            format!(
                "{}: TESSERA_NODE_COUNT is not a number",
                env.source().display()
            )
        })?;
        let state_dir = env.path("TESSERA_CLUSTER_STATE_DIR")?;
        let marker = state_dir.display().to_string();
        let mut nodes = BTreeMap::new();
        for i in 1..=count {
            let node = local_node(env, processes, i, &marker)?;
            nodes.insert(node.name.clone(), node);
        }
        let controller = match processes {
            Some(p) => process(p, "TESSERA_E2E_CONTROLLER", &marker)?,
            None => None,
        };
        let control_plane_logs = [
            "TESSERA_LOG_KUBE_SCHEDULER",
            "TESSERA_LOG_KUBE_CONTROLLER_MANAGER",
        ]
        .iter()
        .filter_map(|k| env.optional(k).map(PathBuf::from))
        .collect();
        let helm = helm_release(&install, processes);
        Ok(Self {
            state_dir,
            kubeconfig: env.path("KUBECONFIG")?,
            nodes,
            install,
            helm,
            controller,
            control_plane_logs,
        })
    }

    pub fn node(&self, name: &str) -> anyhow::Result<&LocalNode> {
        self.nodes.get(name).with_context(|| {
            format!(
                "node {name} is not one of the local cluster's nodes ({})",
                self.nodes.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })
    }

    /// The samples file of `node`'s fake NVML (its fake driver root's), when it has one.
    pub fn gpu_samples_file(&self, node: &str) -> anyhow::Result<PathBuf> {
        let dev_root = self.node(node)?.dev_root.as_ref().with_context(|| {
            format!(
                "node {node} has no fake driver (local-up lays one out when the workspace has it)"
            )
        })?;
        Ok(dev_root.join("tessera-fake-gpu-state").join("samples"))
    }

    /// Whether every node has a fake driver root: claim containers must then report, through
    /// the checker, exactly their devices and the driver's files.
    pub fn has_fake_drivers(&self) -> bool {
        !self.nodes.is_empty() && self.nodes.values().all(|n| n.driver_root.is_some())
    }

    /// The plugin process of `node`, or an error saying local-up did not start one.
    pub fn plugin(&self, node: &str) -> anyhow::Result<&Process> {
        self.node(node)?.plugin.as_ref().with_context(|| {
            format!(
                "no tessera-kubelet-plugin was started on {node} (no {} in {}); start the cluster with tests/e2e/local-up",
                "TESSERA_E2E_PLUGIN_<i>_RUN",
                self.state_dir.join(INSTALL_ENV).display()
            )
        })
    }

    /// The logs of the Tessera processes (plugins, controller).
    pub fn tessera_logs(&self) -> Vec<(String, PathBuf)> {
        self.nodes
            .values()
            .filter_map(|n| n.plugin.as_ref())
            .chain(self.controller.as_ref())
            .map(|p| (p.name.clone(), p.log.clone()))
            .collect()
    }

    /// The scheduler's and controller-manager's logs.
    pub fn control_plane_logs(&self) -> Vec<(String, PathBuf)> {
        self.control_plane_logs
            .iter()
            .map(|log| {
                let name = log.file_stem().and_then(|s| s.to_str()).unwrap_or("log");
                (name.to_owned(), log.clone())
            })
            .collect()
    }
}

/// How Tessera was installed, from local-up's install.env (processes when there is none).
fn install_of(processes: Option<&EnvFile>) -> anyhow::Result<Install> {
    Ok(
        match processes.and_then(|p| p.optional("TESSERA_E2E_INSTALL")) {
            Some("helm") => Install::Helm {
                namespace: processes
                    .and_then(|p| p.optional("TESSERA_E2E_NAMESPACE"))
                    .unwrap_or("tessera-system")
                    .to_owned(),
            },
            Some("processes") | None => Install::Processes,
            Some(other) => bail!(
                "{}: TESSERA_E2E_INSTALL={other} is neither helm nor processes",
                processes
                    .map(|p| p.source().display().to_string())
                    .unwrap_or_default()
            ),
        },
    )
}

/// Node `i` (1-based) of the cluster's env file, with its plugin process and fake driver from
/// install.env; `marker` is what the processes' command lines name.
fn local_node(
    env: &EnvFile,
    processes: Option<&EnvFile>,
    i: usize,
    marker: &str,
) -> anyhow::Result<LocalNode> {
    let key = |what: &str| format!("TESSERA_NODE_{i}_{what}");
    let name = env.get(&key("NAME"))?.to_owned();
    let plugin = match processes {
        Some(p) => process(p, &format!("TESSERA_E2E_PLUGIN_{i}"), marker)?,
        None => None,
    };
    let plugin_state_dir = processes
        .and_then(|p| p.optional(&format!("TESSERA_E2E_PLUGIN_{i}_STATE_DIR")))
        .map(PathBuf::from);
    let driver_root = processes
        .and_then(|p| p.optional(&format!("TESSERA_E2E_NODE_{i}_DRIVER_ROOT")))
        .map(PathBuf::from);
    let dev_root = processes
        .and_then(|p| p.optional(&format!("TESSERA_E2E_NODE_{i}_DEV_ROOT")))
        .map(PathBuf::from);
    Ok(LocalNode {
        name,
        cdi_spec_dir: env.path(&key("CDI_SPEC_DIR"))?,
        cdi_record_dir: env.optional(&key("CDI_RECORD_DIR")).map(PathBuf::from),
        kubelet_log: env.path(&key("KUBELET_LOG"))?,
        plugin,
        plugin_state_dir,
        driver_root,
        dev_root,
        registrar_dir: env.optional(&key("REGISTRAR_DIR")).map(PathBuf::from),
        plugins_dir: env.optional(&key("PLUGINS_DIR")).map(PathBuf::from),
    })
}

/// The helm release to upgrade, when Tessera was installed by helm and install.env names the
/// helm binary, the chart and the values.
fn helm_release(install: &Install, processes: Option<&EnvFile>) -> Option<HelmRelease> {
    match (install, processes) {
        (Install::Helm { namespace }, Some(p)) => {
            let path = |k: &str| p.optional(k).map(PathBuf::from);
            match (
                path("TESSERA_E2E_HELM"),
                path("TESSERA_E2E_CHART"),
                path("TESSERA_E2E_VALUES"),
            ) {
                (Some(helm), Some(chart), Some(values)) => Some(HelmRelease {
                    helm,
                    chart,
                    values,
                    namespace: namespace.clone(),
                }),
                _ => None,
            }
        }
        _ => None,
    }
}

fn process(env: &EnvFile, prefix: &str, marker: &str) -> anyhow::Result<Option<Process>> {
    let Some(run_script) = env.optional(&format!("{prefix}_RUN")) else {
        return Ok(None);
    };
    Ok(Some(Process {
        name: env.get(&format!("{prefix}_NAME"))?.to_owned(),
        run_script: PathBuf::from(run_script),
        pid_file: env.path(&format!("{prefix}_PIDFILE"))?,
        log: env.path(&format!("{prefix}_LOG"))?,
        state_dir: env
            .optional(&format!("{prefix}_STATE_DIR"))
            .map(PathBuf::from),
        cmdline_marker: marker.to_owned(),
        metrics: env
            .optional(&format!("{prefix}_METRICS"))
            .map(str::to_owned),
    }))
}

impl Process {
    /// The pid of the running process, if it is running (a zombie counts as gone, and so does
    /// a process whose command line lacks [`Process::cmdline_marker`]).
    pub fn running_pid(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(&self.pid_file)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        if process_state(&stat).is_none_or(|s| s == 'Z' || s == 'X') {
            return None;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        String::from_utf8_lossy(&cmdline)
            .contains(&self.cmdline_marker)
            .then_some(pid)
    }

    /// SIGKILLs the process and waits until it is gone.
    pub fn kill(&self) -> anyhow::Result<u32> {
        let pid = self.running_pid().with_context(|| {
            format!(
                "{} is not running (pid file {})",
                self.name,
                self.pid_file.display()
            )
        })?;
        let status = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .context("cannot run kill")?;
        if !status.success() {
            bail!("kill -KILL {pid} ({}) failed", self.name);
        }
        for _ in 0..100 {
            if self.running_pid().is_none() {
                return Ok(pid);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        bail!("{} (pid {pid}) survived SIGKILL for 5 s", self.name)
    }

    /// Starts the process again in its own session, appending to its log.
    pub fn start(&self) -> anyhow::Result<()> {
        if let Some(pid) = self.running_pid() {
            bail!("{} is already running (pid {pid})", self.name);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("cannot open {}", self.log.display()))?;
        let log_err = log.try_clone().context("cannot duplicate the log handle")?;
        // `setsid` keeps the process alive after the suite exits and out of its process group.
        Command::new("setsid")
            .arg(&self.run_script)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .with_context(|| format!("cannot start {}", self.run_script.display()))?;
        Ok(())
    }
}

/// The state letter of a `/proc/<pid>/stat` line (after the parenthesised command name).
pub fn process_state(stat: &str) -> Option<char> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// The last `lines` lines of `path` (empty when it cannot be read).
pub fn tail(path: &Path, lines: usize) -> String {
    tail_matching(path, lines, |_| true)
}

/// The last `lines` lines of `path` for which `keep` holds.
pub fn tail_matching(path: &Path, lines: usize, keep: impl Fn(&str) -> bool) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let kept: Vec<&str> = text.lines().filter(|l| keep(l)).collect();
    kept[kept.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(text: &str) -> EnvFile {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("env");
        std::fs::write(&path, text).unwrap();
        EnvFile::read(&path).unwrap()
    }

    #[test]
    fn reads_nodes_and_processes() {
        let cluster = env("KUBECONFIG=/s/kubeconfig\nTESSERA_CLUSTER_STATE_DIR=/s\n\
             TESSERA_NODE_COUNT=2\n\
             TESSERA_NODE_1_NAME=tessera-node-1\nTESSERA_NODE_1_CDI_SPEC_DIR=/s/n1/cdi\n\
             TESSERA_NODE_1_CDI_RECORD_DIR=/s/n1/rec\nTESSERA_NODE_1_KUBELET_LOG=/s/logs/k1\n\
             TESSERA_NODE_2_NAME=tessera-node-2\nTESSERA_NODE_2_CDI_SPEC_DIR=/s/n2/cdi\n\
             TESSERA_NODE_2_CDI_RECORD_DIR=/s/n2/rec\nTESSERA_NODE_2_KUBELET_LOG=/s/logs/k2\n\
             TESSERA_LOG_KUBE_SCHEDULER=/s/logs/kube-scheduler.log\n");
        let processes = env(
            "TESSERA_E2E_PLUGIN_1_NAME=plugin on 1\nTESSERA_E2E_PLUGIN_1_RUN=/s/t/run\n\
             TESSERA_E2E_PLUGIN_1_PIDFILE=/s/t/pid\nTESSERA_E2E_PLUGIN_1_LOG=/s/logs/p1\n\
             TESSERA_E2E_PLUGIN_1_STATE_DIR=/s/t/state\n",
        );
        let local = LocalCluster::from_env(&cluster, Some(&processes)).unwrap();
        assert_eq!(local.nodes.len(), 2);
        assert_eq!(local.install, Install::Processes);
        assert_eq!(
            local.nodes["tessera-node-1"].cdi_record_dir.as_deref(),
            Some(Path::new("/s/n1/rec"))
        );
        assert_eq!(
            local.nodes["tessera-node-1"].plugin_state_dir.as_deref(),
            Some(Path::new("/s/t/state"))
        );
        let plugin = local.plugin("tessera-node-1").unwrap();
        assert_eq!(plugin.state_dir.as_deref(), Some(Path::new("/s/t/state")));
        let error = local.plugin("tessera-node-2").unwrap_err().to_string();
        assert!(
            error.contains("no tessera-kubelet-plugin was started on tessera-node-2"),
            "{error}"
        );
        assert!(local.node("tessera-node-9").is_err());
        assert!(local.controller.is_none());
        let logs: Vec<String> = local.tessera_logs().into_iter().map(|(n, _)| n).collect();
        assert_eq!(logs, ["plugin on 1"]);
        let logs: Vec<String> = local
            .control_plane_logs()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(logs, ["kube-scheduler"]);
    }

    #[test]
    fn a_helm_install_has_pods_and_state_dirs_but_no_processes_or_records() {
        let cluster = env("KUBECONFIG=/s/kubeconfig\nTESSERA_CLUSTER_STATE_DIR=/s\n\
             TESSERA_NODE_COUNT=1\nTESSERA_NODE_1_NAME=tessera-node-1\n\
             TESSERA_NODE_1_CDI_SPEC_DIR=/s/n1/cdi\nTESSERA_NODE_1_KUBELET_LOG=/s/logs/k1\n");
        let install = env("TESSERA_E2E_INSTALL=helm\nTESSERA_E2E_NAMESPACE=ns\n\
             TESSERA_E2E_PLUGIN_1_STATE_DIR=/s/nodes/tessera-node-1/tessera\n\
             TESSERA_E2E_HELM=/c/helm\nTESSERA_E2E_CHART=/s/tessera/chart/tessera-0.1.0.tgz\nTESSERA_E2E_VALUES=/s/v.yaml\n");
        let local = LocalCluster::from_env(&cluster, Some(&install)).unwrap();
        assert_eq!(
            local.install,
            Install::Helm {
                namespace: "ns".to_owned()
            }
        );
        assert_eq!(
            local.helm,
            Some(HelmRelease {
                helm: "/c/helm".into(),
                chart: "/s/tessera/chart/tessera-0.1.0.tgz".into(),
                values: "/s/v.yaml".into(),
                namespace: "ns".into(),
            })
        );
        assert_eq!(
            local
                .helm
                .as_ref()
                .unwrap()
                .ci_values("monitoring-values.yaml"),
            Path::new("/s/tessera/chart/ci/monitoring-values.yaml")
        );
        let node = &local.nodes["tessera-node-1"];
        assert!(node.plugin.is_none() && node.cdi_record_dir.is_none());
        assert_eq!(
            node.plugin_state_dir.as_deref(),
            Some(Path::new("/s/nodes/tessera-node-1/tessera"))
        );
        let bad = env("TESSERA_E2E_INSTALL=docker\n");
        assert!(LocalCluster::from_env(&cluster, Some(&bad)).is_err());
    }

    #[test]
    fn process_states_are_read_after_the_command_name() {
        assert_eq!(process_state("42 (my (odd) name) S 1 2 3"), Some('S'));
        assert_eq!(process_state("42 (x) Z 1"), Some('Z'));
        assert_eq!(process_state("garbage"), None);
    }

    #[test]
    fn a_process_without_a_pid_file_is_not_running() {
        let dir = tempfile::tempdir().unwrap();
        let process = Process {
            name: "p".to_owned(),
            run_script: dir.path().join("run"),
            pid_file: dir.path().join("pid"),
            log: dir.path().join("log"),
            state_dir: None,
            cmdline_marker: String::new(),
            metrics: None,
        };
        assert_eq!(process.running_pid(), None);
        std::fs::write(&process.pid_file, std::process::id().to_string()).unwrap();
        assert_eq!(process.running_pid(), Some(std::process::id()));
        assert!(
            process.start().is_err(),
            "must refuse to start a second copy"
        );
        let foreign = Process {
            cmdline_marker: "/no/such/state/dir".to_owned(),
            ..process
        };
        assert_eq!(
            foreign.running_pid(),
            None,
            "a pid of another program is not ours"
        );
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "1\n2\n3\n").unwrap();
        assert_eq!(tail(&path, 2), "2\n3");
        assert_eq!(tail(&path, 10), "1\n2\n3");
        assert_eq!(tail(&dir.path().join("none"), 3), "");
        std::fs::write(&path, "ns-a line\nnoise\nns-a again\nnoise\n").unwrap();
        assert_eq!(
            tail_matching(&path, 5, |l| l.contains("ns-a")),
            "ns-a line\nns-a again"
        );
    }
}
