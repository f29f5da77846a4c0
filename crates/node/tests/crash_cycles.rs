//! The crash test: the real `tessera-kubelet-plugin` process, driven by the kubelet simulator
//! through 200 prepare/unprepare cycles, is SIGKILLed at random points — inside calls (the
//! kill lands at a random delay into the call), between them, and during the recovery of the
//! previous kill — and restarted each time. The claims mix whole GPUs (no intent record), MPS,
//! time slicing and dynamic MIG (intent records, simulated side effects under the state
//! directory), so every crash point of the driver's table is hit.
//!
//! After every restart and at the end: the checkpoint loads and was never quarantined; every
//! CDI spec, MPS daemon, time slice and MIG instance belongs to a claim recorded as prepared,
//! and every recorded claim has all of them, exactly once; the kubelet's retry of the
//! interrupted call succeeds, with the same CDI ids every time a claim is prepared.
//!
//! The random choices come from one seed, printed at the start and in every failure:
//! `TESSERA_CRASH_SEED=<seed> cargo test -p tessera-node --test crash_cycles` replays a run
//! (the kill delays are wall-clock offsets, so a replay hits similar, not identical, points).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use tessera_gpu_inventory::{DeviceSource, GpuInventory, MockSource};
use tessera_kubelet_grpc::simulator::KubeletSimulator;
use tessera_kubelet_grpc::{ClaimRef, PreparedDevice};
use tessera_prepare_harness::{allocated_claim, claim_config, uid_of};
use tessera_test_support::SplitMix64;

use support::node_state::{check_node_state, spec_uids};
use support::process::{PluginDirs, PluginProcess, api_server_with_node, register};

const TOPOLOGY: &str = "hgx-a100-mig";
const BACKEND: &[&str] = &["--topology", TOPOLOGY, "--dynamic-mig"];
const CYCLES: usize = 200;
/// Chance that a call is interrupted by a kill (at a random delay into it).
const KILL_CHANCE: f64 = 0.2;
/// Chance that a restarted plugin is killed again while it recovers.
const KILL_DURING_RECOVERY_CHANCE: f64 = 0.1;

/// A claim of the run: name, allocation results (request, device), claim configs.
type ClaimSpec = (
    &'static str,
    Vec<(&'static str, &'static str)>,
    Vec<serde_json::Value>,
);

/// The claims of the run: whole GPUs, MPS, time slicing, dynamic MIG, and mixes.
fn claims() -> Vec<ClaimSpec> {
    let mps = |requests: &[&str], kind| claim_config(requests, kind, json!({"strategy": "MPS"}));
    vec![
        ("whole-4", vec![("gpu", "gpu-4")], vec![]),
        ("whole-5", vec![("gpu", "gpu-5")], vec![]),
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
        ("mig-b", vec![("mig", "gpu-1-mig-2g-20gb-4")], vec![]),
        (
            "mig-and-whole",
            vec![("mig", "gpu-2-mig-3g-40gb-0"), ("gpu", "gpu-3")],
            vec![],
        ),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Call {
    Prepare,
    Unprepare,
}

/// The test's side: the plugin process, its kubelet, what the kubelet believes.
struct Run {
    seed: u64,
    rng: SplitMix64,
    kubeconfig: std::path::PathBuf,
    dirs: PluginDirs,
    inventory: GpuInventory,
    plugin: PluginProcess,
    kubelet: KubeletSimulator,
    /// Claims the kubelet was told are prepared.
    prepared: BTreeSet<String>,
    /// The devices (with CDI ids) each claim got the first time it was prepared.
    first_devices: BTreeMap<String, Vec<PreparedDevice>>,
    /// Recent durations of calls and starts, to aim kills inside them.
    recent: BTreeMap<&'static str, Vec<Duration>>,
    /// Time spent restarting (kill to registration).
    restarting: Duration,
    restarts: usize,
    kills_in_calls: usize,
    kills_in_recovery: usize,
    interrupted_calls: usize,
}

impl Run {
    fn context(&self) -> String {
        format!(
            "seed {} (replay: TESSERA_CRASH_SEED={} cargo test -p tessera-node --test crash_cycles)",
            self.seed, self.seed
        )
    }

    fn fail(&self, message: String) -> ! {
        panic!(
            "{message}\n{}\n--- the last plugin logs\n{}",
            self.context(),
            last_logs(&self.dirs, 3)
        )
    }

    fn observe(&mut self, what: &'static str, took: Duration) {
        let recent = self.recent.entry(what).or_default();
        if recent.len() == 32 {
            recent.remove(0);
        }
        recent.push(took);
    }

    /// A random delay within a recently observed duration of `what`: a kill after it lands
    /// inside such a call (or start) unless this one is quicker.
    fn delay_into(&mut self, what: &'static str) -> Duration {
        let span = match self.recent.get(what) {
            Some(recent) if !recent.is_empty() => {
                recent[self.rng.below(recent.len() as u64) as usize]
            }
            _ => Duration::from_millis(20),
        };
        Duration::from_micros(self.rng.below(span.as_micros() as u64))
    }

    /// Sends SIGKILL to the plugin after `delay`, from another thread, so the kill lands while
    /// this task awaits a call.
    fn kill_after(&self, delay: Duration) -> std::thread::JoinHandle<()> {
        let child = std::sync::Arc::clone(&self.plugin.child);
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            let mut child = child.lock().unwrap_or_else(|e| e.into_inner());
            child.kill().expect("SIGKILL the plugin");
        })
    }

    /// Starts a new plugin process once the old one is gone; sometimes kills it again while it
    /// recovers. Returns when a plugin has registered (recovery is over).
    async fn restart(&mut self) {
        let restarting = Instant::now();
        let exited = self.plugin.kill();
        if exited.code().is_some() {
            self.fail(format!("the plugin exited by itself: {exited}"));
        }
        loop {
            self.restarts += 1;
            let started = Instant::now();
            self.plugin = PluginProcess::start(&self.kubeconfig, &self.dirs, BACKEND, &[]);
            if self.rng.chance(KILL_DURING_RECOVERY_CHANCE) {
                let delay = self.delay_into("start");
                self.kill_after(delay).join().expect("killer thread");
                self.plugin.kill();
                self.kills_in_recovery += 1;
                continue;
            }
            self.kubelet = register(&self.dirs).await;
            self.observe("start", started.elapsed());
            self.restarting += restarting.elapsed();
            return;
        }
    }

    /// One call as the kubelet makes it; with [`KILL_CHANCE`] the plugin is killed at a random
    /// point of it, restarted, checked, and the call retried until it succeeds.
    async fn call(&mut self, call: Call, batch: &[ClaimRef]) {
        let what = match call {
            Call::Prepare => "prepare",
            Call::Unprepare => "unprepare",
        };
        let killer = if self.rng.chance(KILL_CHANCE) {
            let delay = self.delay_into(what);
            Some(self.kill_after(delay))
        } else {
            None
        };
        let started = Instant::now();
        let mut answered = self.send(call, batch).await;
        let took = started.elapsed();
        if let Some(killer) = killer {
            killer.join().expect("killer thread");
            self.kills_in_calls += 1;
            self.restart().await;
            let in_flight: BTreeSet<String> = batch.iter().map(|c| c.uid.to_string()).collect();
            if answered.is_ok() {
                // The call finished before the kill: its answer stands.
                self.check(&BTreeSet::new());
            } else {
                self.interrupted_calls += 1;
                self.check(&in_flight);
                // The kubelet retries the interrupted call; it must succeed now.
                answered = self.send(call, batch).await;
            }
        } else {
            self.observe(what, took);
        }
        match answered {
            Ok(()) => {}
            Err(error) => self.fail(format!("{what} of {batch:?} failed: {error}")),
        }
        self.check(&BTreeSet::new());
    }

    /// Sends one call; per-claim errors fail the test (every claim is valid), transport errors
    /// are returned (the plugin was killed).
    async fn send(&mut self, call: Call, batch: &[ClaimRef]) -> Result<(), String> {
        match call {
            Call::Prepare => {
                let answers = self
                    .kubelet
                    .prepare(batch)
                    .await
                    .map_err(|e| e.to_string())?;
                for claim in batch {
                    let devices = match answers.get(&claim.uid) {
                        Some(Ok(devices)) => devices.clone(),
                        other => self.fail(format!("prepare of {claim}: {other:?}")),
                    };
                    let uid = claim.uid.to_string();
                    let first = self
                        .first_devices
                        .entry(uid.clone())
                        .or_insert_with(|| devices.clone());
                    if *first != devices {
                        let first = first.clone();
                        self.fail(format!(
                            "{claim} got other devices than the first time: {devices:?} vs {first:?}"
                        ));
                    }
                    self.prepared.insert(uid);
                }
            }
            Call::Unprepare => {
                let answers = self
                    .kubelet
                    .unprepare(batch)
                    .await
                    .map_err(|e| e.to_string())?;
                for claim in batch {
                    if !matches!(answers.get(&claim.uid), Some(Ok(()))) {
                        self.fail(format!(
                            "unprepare of {claim}: {:?}",
                            answers.get(&claim.uid)
                        ));
                    }
                    self.prepared.remove(claim.uid.as_str());
                }
            }
        }
        Ok(())
    }

    /// What is on disk agrees with the checkpoint, and the checkpoint with what the kubelet
    /// was told — except for the claims of an interrupted call (`in_flight`), which must be
    /// either wholly prepared or wholly gone.
    fn check(&self, in_flight: &BTreeSet<String>) {
        if let Err(problem) = check_node_state(
            &self.dirs.path("state"),
            &self.dirs.path("cdi"),
            &self.inventory,
            &self.prepared,
            in_flight,
        ) {
            self.fail(problem);
        }
    }
}

/// The `count` most recently written plugin logs (one per start).
fn last_logs(dirs: &PluginDirs, count: usize) -> String {
    let mut logs: Vec<(std::time::SystemTime, std::path::PathBuf)> =
        std::fs::read_dir(dirs.root.path())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
    logs.sort();
    logs.iter()
        .rev()
        .take(count)
        .rev()
        .map(|(_, p)| {
            format!(
                "== {}\n{}",
                p.display(),
                std::fs::read_to_string(p).unwrap_or_default()
            )
        })
        .collect()
}

fn seed() -> u64 {
    std::env::var("TESSERA_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// Starts the plugin (its directories on tmpfs where there is one) and registers it with a
/// kubelet: a run with nothing prepared yet.
async fn start_run(seed: u64, kubeconfig: PathBuf) -> Run {
    // A SIGKILL loses no page cache, so fsync plays no part in what this test checks: on tmpfs
    // (as /var/run/cdi is on nodes) the run takes half the time it takes on ext4.
    let shm = Path::new("/dev/shm");
    let dirs = if shm.is_dir() {
        PluginDirs::under(shm)
    } else {
        PluginDirs::new()
    };
    let plugin = PluginProcess::start(&kubeconfig, &dirs, BACKEND, &[]);
    let kubelet = register(&dirs).await;
    Run {
        seed,
        rng: SplitMix64::new(seed),
        kubeconfig,
        inventory: MockSource::new(TOPOLOGY).unwrap().inventory().unwrap(),
        dirs,
        plugin,
        kubelet,
        prepared: BTreeSet::new(),
        first_devices: BTreeMap::new(),
        recent: BTreeMap::new(),
        restarting: Duration::ZERO,
        restarts: 0,
        kills_in_calls: 0,
        kills_in_recovery: 0,
        interrupted_calls: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_kills_during_200_cycles_leave_every_claim_prepared_once_or_not_at_all() {
    let seed = seed();
    println!("crash test seed {seed} (replay: TESSERA_CRASH_SEED={seed})");
    let (server, http, _) = api_server_with_node().await;
    let refs: Vec<ClaimRef> = claims()
        .into_iter()
        .map(|(name, results, configs)| {
            server.seed(&allocated_claim(name, &results, configs));
            ClaimRef::new("ml", name, uid_of(name))
        })
        .collect();
    let mut run = start_run(seed, http.kubeconfig_path().to_owned()).await;
    run.check(&BTreeSet::new());

    let started = Instant::now();
    for _ in 0..CYCLES {
        let batch = run.rng.subset(&refs, 4);
        run.call(Call::Prepare, &batch).await;
        let prepared: Vec<ClaimRef> = refs
            .iter()
            .filter(|c| run.prepared.contains(c.uid.as_str()))
            .cloned()
            .collect();
        let batch = run.rng.subset(&prepared, 4);
        run.call(Call::Unprepare, &batch).await;
    }
    // Everything still prepared goes; then one last kill and restart find nothing.
    let rest: Vec<ClaimRef> = refs
        .iter()
        .filter(|c| run.prepared.contains(c.uid.as_str()))
        .cloned()
        .collect();
    if !rest.is_empty() {
        run.call(Call::Unprepare, &rest).await;
    }
    run.restart().await;
    run.check(&BTreeSet::new());
    assert!(spec_uids(&run.dirs.path("cdi")).is_empty());
    assert_eq!(
        run.first_devices.len(),
        refs.len(),
        "every claim was prepared at least once ({})",
        run.context()
    );
    assert!(
        run.interrupted_calls > 0 && run.kills_in_calls > 0,
        "no call was interrupted ({})",
        run.context()
    );
    println!(
        "{CYCLES} cycles in {:.1} s ({:.1} s restarting): {} restarts, {} kills aimed at calls ({} interrupted a call), {} during recovery",
        started.elapsed().as_secs_f64(),
        run.restarting.as_secs_f64(),
        run.restarts,
        run.kills_in_calls,
        run.interrupted_calls,
        run.kills_in_recovery,
    );
}
