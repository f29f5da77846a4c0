//! The crash-point test: the real `tessera-kubelet-plugin` process is stopped at every named
//! crash point of prepare, unprepare, the side effects and recovery (`tessera_prepare::crash`),
//! at every time each point is reached in a batch, then restarted; what it left must converge.
//! The random kills of `crash_cycles` find a narrow window only by chance; this test walks
//! every window deterministically.
//!
//! A batch mixes a whole GPU (no intent record), MPS on a whole GPU, time slicing, dynamic
//! MIG and MPS on MIG devices. For each crash: the restarted plugin's state agrees with its
//! checkpoint (no leaked CDI spec, MPS daemon, time slice or MIG instance; the interrupted
//! claims wholly prepared or wholly gone), the kubelet's retry succeeds, and unpreparing
//! everything leaves nothing behind.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use serde_json::json;
use tessera_fake_apiserver::FakeApiServer;
use tessera_gpu_inventory::{DeviceSource, GpuInventory, MockSource};
use tessera_kubelet_grpc::ClaimRef;
use tessera_kubelet_grpc::simulator::KubeletSimulator;
use tessera_prepare::crash::{CRASH_AT, CRASH_EXIT_CODE};
use tessera_prepare_harness::{allocated_claim, claim_config, uid_of};

use support::node_state::check_node_state;
use support::process::{PluginDirs, PluginProcess, api_server_with_node, plugin_logs};

const TOPOLOGY: &str = "hgx-a100-mig";
const BACKEND: &[&str] = &["--topology", TOPOLOGY, "--dynamic-mig"];

/// Points reached by prepare or unprepare calls.
const CALL_POINTS: &[&str] = &[
    "prepare:started-recorded",
    "establish:mig-ready",
    "establish:mps-directories-created",
    "simulated-gpu:temp-file-written",
    "prepare:node-local-established",
    "prepare:specs-written",
    "prepare:completed-recorded",
    "unprepare:started-recorded",
    "unprepare:specs-removed",
    "undo:sharing-reset",
    "undo:mps-directory-removed",
    "unprepare:node-local-undone",
    "unprepare:records-dropped",
];

/// Points reached while a restarted plugin recovers, and the crashes that leave it work to do.
const RECOVERY_POINTS: &[&str] = &[
    "recovery:converged",
    "recovery:recorded",
    "establish:mig-ready",
    "establish:mps-directories-created",
    "simulated-gpu:temp-file-written",
    "undo:sharing-reset",
    "undo:mps-directory-removed",
];
const CRASHES_BEFORE_RECOVERY: &[&str] = &[
    "prepare:node-local-established@4",
    "prepare:completed-recorded",
    "unprepare:node-local-undone@2",
];

/// A claim of the batch: name, allocation results (request, device), claim configs.
type ClaimSpec = (
    &'static str,
    Vec<(&'static str, &'static str)>,
    Vec<serde_json::Value>,
);

fn claims(server: &FakeApiServer) -> Vec<ClaimRef> {
    let mps = |requests: &[&str], kind| claim_config(requests, kind, json!({"strategy": "MPS"}));
    let specs: Vec<ClaimSpec> = vec![
        ("whole-4", vec![("gpu", "gpu-4")], vec![]),
        ("mps-6", vec![("gpu", "gpu-6")], vec![mps(&[], "GpuConfig")]),
        (
            "sliced-7",
            vec![("gpu", "gpu-7")],
            vec![claim_config(
                &[],
                "GpuConfig",
                json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
            )],
        ),
        ("mig-a", vec![("mig", "gpu-0-mig-1g-10gb-0")], vec![]),
        (
            "mig-mps",
            vec![
                ("mig", "gpu-0-mig-1g-10gb-1"),
                ("mig", "gpu-0-mig-1g-10gb-2"),
            ],
            vec![mps(&["mig"], "MigDeviceConfig")],
        ),
    ];
    specs
        .into_iter()
        .map(|(name, results, configs)| {
            server.seed(&allocated_claim(name, &results, configs));
            ClaimRef::new("ml", name, uid_of(name))
        })
        .collect()
}

/// How a started plugin ended up: registered with the kubelet, or exited.
enum Started {
    Registered(PluginProcess, KubeletSimulator),
    Exited(ExitStatus),
}

/// One node's plugin across its restarts.
struct Node {
    kubeconfig: std::path::PathBuf,
    dirs: PluginDirs,
    inventory: GpuInventory,
}

impl Node {
    fn new(kubeconfig: &Path) -> Self {
        let shm = Path::new("/dev/shm");
        Self {
            kubeconfig: kubeconfig.to_owned(),
            dirs: if shm.is_dir() {
                PluginDirs::under(shm)
            } else {
                PluginDirs::new()
            },
            inventory: MockSource::new(TOPOLOGY).unwrap().inventory().unwrap(),
        }
    }

    /// Starts a plugin (stopping at `crash_at` if given) and waits until it registered or
    /// exited.
    async fn start(&self, crash_at: Option<&str>) -> Started {
        let env: Vec<(&str, String)> = crash_at
            .map(|point| (CRASH_AT, point.to_owned()))
            .into_iter()
            .collect();
        let plugin = PluginProcess::start(&self.kubeconfig, &self.dirs, BACKEND, &env);
        let socket = self.dirs.registration_socket();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = exit_status(&plugin) {
                return Started::Exited(status);
            }
            if socket.exists()
                && let Ok(kubelet) = KubeletSimulator::register(&socket).await
            {
                return Started::Registered(plugin, kubelet);
            }
            assert!(
                Instant::now() < deadline,
                "the plugin neither registered nor exited\n{}",
                plugin_logs(&self.dirs)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn check(&self, prepared: &BTreeSet<String>, in_flight: &BTreeSet<String>, what: &str) {
        if let Err(problem) = check_node_state(
            &self.dirs.path("state"),
            &self.dirs.path("cdi"),
            &self.inventory,
            prepared,
            in_flight,
        ) {
            panic!(
                "{what}: {problem}\n--- plugin logs\n{}",
                plugin_logs(&self.dirs)
            );
        }
    }
}

fn exit_status(plugin: &PluginProcess) -> Option<ExitStatus> {
    plugin
        .child
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .try_wait()
        .unwrap()
}

/// Waits for a plugin that was asked to crash to exit, and checks that it crashed there.
fn crashed(plugin: &PluginProcess, what: &str, dirs: &PluginDirs) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = exit_status(plugin) {
            assert_eq!(
                status.code(),
                Some(CRASH_EXIT_CODE),
                "{what}: the plugin exited, but not at the crash point: {status}\n{}",
                plugin_logs(dirs)
            );
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn uids(claims: &[ClaimRef]) -> BTreeSet<String> {
    claims.iter().map(|c| c.uid.to_string()).collect()
}

fn all_ok<T, E: std::fmt::Debug>(
    answers: &BTreeMap<tessera_kubelet_grpc::ClaimUid, Result<T, E>>,
    what: &str,
) {
    for (uid, answer) in answers {
        assert!(
            answer.is_ok(),
            "{what}: claim {uid}: {:?}",
            answer.as_ref().err()
        );
    }
}

/// Restarts the plugin with a crash at `point`: whether it crashed there while recovering (any
/// other exit fails the test); a plugin that did not would stop in a call, so it goes.
async fn crashes_while_recovering(node: &Node, point: &str, what: &str) -> bool {
    match node.start(Some(point)).await {
        Started::Exited(status) => {
            assert_eq!(
                status.code(),
                Some(CRASH_EXIT_CODE),
                "{what}: the restarted plugin exited: {status}\n{}",
                plugin_logs(&node.dirs)
            );
            true
        }
        // Not reached while recovering.
        Started::Registered(plugin, _) => {
            drop(plugin);
            false
        }
    }
}

/// The calls of one scenario: prepare the batch, then unprepare it, in a plugin started with
/// `crash_at`; `after_crash` is set on the first restart. Returns where the crash happened
/// (`None`: the point was not reached).
async fn scenario(
    kubeconfig: &Path,
    batch: &[ClaimRef],
    crash_at: &str,
    after_crash: Option<&str>,
) -> Option<&'static str> {
    let what = match after_crash {
        Some(recovery) => format!("crash at {crash_at}, then at {recovery} while recovering"),
        None => format!("crash at {crash_at}"),
    };
    let node = Node::new(kubeconfig);
    let none = BTreeSet::new();
    let all = uids(batch);
    let Started::Registered(plugin, kubelet) = node.start(Some(crash_at)).await else {
        panic!(
            "{what}: the plugin did not start\n{}",
            plugin_logs(&node.dirs)
        );
    };
    let interrupted = match kubelet.prepare(batch).await {
        Err(_) => "prepare",
        Ok(answers) => {
            all_ok(&answers, &what);
            node.check(&all, &none, &what);
            match kubelet.unprepare(batch).await {
                Err(_) => "unprepare",
                Ok(answers) => {
                    all_ok(&answers, &what);
                    node.check(&none, &none, &what);
                    return None;
                }
            }
        }
    };
    assert!(
        crashed(&plugin, &what, &node.dirs),
        "{what}: the {interrupted} call failed but the plugin did not exit\n{}",
        plugin_logs(&node.dirs)
    );
    drop(plugin);

    let recovery_crashed = match after_crash {
        Some(point) => crashes_while_recovering(&node, point, &what).await,
        None => false,
    };
    let Started::Registered(plugin, kubelet) = node.start(None).await else {
        panic!(
            "{what}: the restarted plugin exited\n{}",
            plugin_logs(&node.dirs)
        );
    };
    let before = if interrupted == "prepare" {
        &none
    } else {
        &all
    };
    node.check(before, &all, &format!("{what}, after the restart"));
    // The kubelet retries the interrupted call; then everything is unprepared.
    if interrupted == "prepare" {
        let answers = kubelet
            .prepare(batch)
            .await
            .unwrap_or_else(|e| panic!("{what}: the retried prepare: {e}"));
        all_ok(&answers, &what);
        node.check(&all, &none, &format!("{what}, after the retried prepare"));
    }
    let answers = kubelet
        .unprepare(batch)
        .await
        .unwrap_or_else(|e| panic!("{what}: the unprepare: {e}"));
    all_ok(&answers, &what);
    node.check(&none, &none, &format!("{what}, after the unprepare"));
    drop(plugin);
    Some(if recovery_crashed {
        "recovery"
    } else {
        interrupted
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_crash_point_converges_after_a_restart() {
    let (server, http, _) = api_server_with_node().await;
    let batch = claims(&server);
    let kubeconfig = http.kubeconfig_path().to_owned();

    let mut hits: BTreeMap<String, usize> = BTreeMap::new();
    for point in CALL_POINTS {
        for nth in 1.. {
            let crash_at = format!("{point}@{nth}");
            match scenario(&kubeconfig, &batch, &crash_at, None).await {
                Some(_) => *hits.entry((*point).to_owned()).or_default() += 1,
                None => break,
            }
        }
    }
    for point in CALL_POINTS {
        assert!(
            hits.contains_key(*point),
            "crash point {point} was never reached: {hits:?}"
        );
    }

    let mut recovered: BTreeSet<&str> = BTreeSet::new();
    for first in CRASHES_BEFORE_RECOVERY {
        for point in RECOVERY_POINTS {
            if scenario(&kubeconfig, &batch, first, Some(point)).await == Some("recovery") {
                recovered.insert(point);
            }
        }
    }
    for point in RECOVERY_POINTS {
        assert!(
            recovered.contains(point),
            "crash point {point} was never reached during recovery"
        );
    }
    println!("crash points and hits: {hits:?}; during recovery: {recovered:?}");
}
