//! The composition root: watches, leader election and the worker loop, started and stopped in
//! order. Shutdown: the worker finishes the pod in hand, the events it queued are published (for
//! at most a couple of seconds), then the Lease is released (so a
//! successor starts at once), then the watches stop.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::SignedDuration;
use kube::Client;
use tessera_allocator::{DEFAULT_STEP_BUDGET, NumaPolicy};
use tessera_placement::Settings;
use tessera_placement::group::{DEFAULT_GROUP_BUDGET, DEFAULT_GROUP_HOLD, Hierarchy};

use crate::waiting::WaitingGroups;
use tessera_gpu_inventory::ServerVersion;
use tessera_process::{Endpoints, Heartbeat, Liveness, Probe};
use tokio::sync::watch;

use crate::api::ApiWriter;
use crate::channels::ChannelSettings;
use crate::cluster::{Cluster, Tracked};
use crate::events::{EVENT_QUEUE, Events, publish_all};
use crate::leader::{LeaderElector, Leadership, LeaseConfig};
use crate::metrics::Metrics;
use crate::queue::Processed;
use crate::refusals::RefusedEvictions;
use crate::watch::{Signals, WATCHES, WatchTask, start};
use crate::webhook::WebhookConfig;
use crate::worker::Worker;

/// Longest the worker sleeps between checks (keeps the liveness heartbeat fresh).
const IDLE_TICK: Duration = Duration::from_secs(5);

/// How long a shutdown waits for the queued events to be published.
const EVENT_DRAIN: Duration = Duration::from_secs(2);

/// A worker that has not looked at its queue for this long is reported dead by `/healthz`.
const HEARTBEAT_LIMIT: Duration = Duration::from_secs(120);

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// The scheduling gate of the pods to place.
    pub gate: String,
    /// Leader election; `None` runs unconditionally (a single replica).
    pub lease: Option<LeaseConfig>,
    /// How long to avoid a node where the scheduler gave back an allocation.
    pub avoid_for: Duration,
    /// Allocator search steps per node.
    pub step_budget: u64,
    /// How NUMA alignment weighs against fragmentation (a pod's annotation overrides it).
    pub numa: NumaPolicy,
    /// This replica's name in events (the pod name, usually).
    pub instance: Option<String>,
    /// Node labels of topology domains, finest first, for groups.
    pub topology_levels: Hierarchy,
    /// Pod decisions one group decision may take.
    pub group_budget: usize,
    /// How long a group waits for capacity before it holds back later arrivals.
    pub group_hold: Duration,
    /// The admission webhook every replica serves; `None`: none.
    pub webhook: Option<WebhookConfig>,
    /// Whether pods that fit on no free devices preempt lower-priority pods (`--preemption`);
    /// off, pods still go by priority but nobody is evicted.
    pub preemption: bool,
    /// IMEX channels published per fabric clique ([`crate::channels`]); 0 publishes none.
    pub imex_channels: u32,
}

impl ControllerConfig {
    /// Defaults: the Tessera gate, no leader election, avoid nodes for 5 minutes.
    pub fn new(gate: &str) -> ControllerConfig {
        ControllerConfig {
            gate: gate.to_owned(),
            lease: None,
            avoid_for: Duration::from_secs(300),
            step_budget: DEFAULT_STEP_BUDGET,
            numa: NumaPolicy::Align,
            instance: None,
            topology_levels: Hierarchy::default(),
            group_budget: DEFAULT_GROUP_BUDGET,
            group_hold: DEFAULT_GROUP_HOLD.unsigned_abs(),
            webhook: None,
            preemption: true,
            imex_channels: tessera_api::imex::DEFAULT_CHANNELS,
        }
    }

    /// What the worker decides with ([`tessera_placement::Settings`]): topology-aware, this gate,
    /// step budget and avoid time. `tessera explain --pod` decides with the same defaults.
    pub fn settings(&self) -> Settings {
        let mut settings = Settings::new(&self.gate);
        settings.avoid_for = SignedDuration::try_from(self.avoid_for).unwrap_or(settings.avoid_for);
        settings.options.step_budget = self.step_budget;
        settings.group.hierarchy = self.topology_levels.clone();
        settings.group.budget = self.group_budget;
        settings.group_hold =
            SignedDuration::try_from(self.group_hold).unwrap_or(settings.group_hold);
        settings.options.numa = self.numa;
        settings
    }
}

/// Tasks aborted when dropped.
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Ready once every watch has listed once and the device inventory was built from what they
/// listed: at thousands of nodes that build takes seconds, and a pod that arrived before it would
/// wait for it. With the admission webhook on, also once it serves (the Service sends the API
/// server's calls only to ready replicas, and the conversion reads the DeviceClass cache).
struct CachesSynced {
    signals: Arc<Signals>,
    /// `Some` when the webhook is on: whether it serves.
    webhook: Option<Arc<AtomicBool>>,
}

impl Probe for CachesSynced {
    fn check(&self) -> Result<(), Vec<String>> {
        let synced = self.signals.synced_watches();
        if self
            .webhook
            .as_ref()
            .is_some_and(|serving| !serving.load(Ordering::Acquire))
        {
            Err(vec![
                "the admission webhook is not serving yet (its certificates are being settled)"
                    .to_owned(),
            ])
        } else if synced < WATCHES {
            Err(vec![format!(
                "caches not synced yet: {synced} of {WATCHES} watches have listed"
            )])
        } else if !self.signals.inventory_built.load(Ordering::Acquire) {
            Err(vec![
                "the device inventory is being built from the synced caches".to_owned(),
            ])
        } else {
            Ok(())
        }
    }
}

/// The controller, ready to run.
pub struct Controller {
    client: Client,
    config: ControllerConfig,
    metrics: Arc<Metrics>,
    signals: Arc<Signals>,
    heartbeat: Heartbeat,
    leadership: Leadership,
    /// Whether the admission webhook serves (when it is on).
    webhook_serving: Arc<AtomicBool>,
}

impl Controller {
    pub fn new(client: Client, config: ControllerConfig, metrics: Arc<Metrics>) -> Controller {
        let leadership = match config.lease {
            Some(_) => Leadership::candidate(),
            None => Leadership::unconditional(),
        };
        Controller {
            client,
            signals: Arc::new(Signals::new(&config.gate)),
            config,
            metrics,
            heartbeat: Heartbeat::new("the worker loop", HEARTBEAT_LIMIT),
            leadership,
            webhook_serving: Arc::new(AtomicBool::new(false)),
        }
    }

    /// What `/metrics`, `/healthz` and `/readyz` serve: the metrics, the worker loop's
    /// heartbeat, and whether the caches have synced.
    pub fn endpoints(&self) -> Endpoints {
        let mut liveness = Liveness::default();
        liveness.watch(self.heartbeat.clone());
        Endpoints {
            metrics: self.metrics.clone(),
            liveness: Arc::new(liveness),
            readiness: Arc::new(CachesSynced {
                signals: self.signals.clone(),
                webhook: self
                    .config
                    .webhook
                    .as_ref()
                    .map(|_| self.webhook_serving.clone()),
            }),
        }
    }

    /// Whether this replica may write now.
    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    /// Spawns the watches and the publisher of the fabric cliques' IMEX channels
    /// ([`crate::channels`]).
    fn spawn_watches(&self, watches: Vec<WatchTask>, stores: &crate::cluster::Stores) -> Tasks {
        let channels: WatchTask = Box::pin(crate::channels::run(
            self.client.clone(),
            stores.slices.clone(),
            stores.nodes.clone(),
            self.signals.clone(),
            self.leadership.clone(),
            ChannelSettings {
                channels: self.config.imex_channels,
                server_version: ServerVersion::V1_35,
            },
        ));
        Tasks(
            watches
                .into_iter()
                .chain([channels])
                .map(tokio::spawn)
                .collect(),
        )
    }

    /// Runs until `shutdown` completes, then stops in order.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let tracked = Arc::new(Tracked::default());
        let (stores, watches) = start(&self.client, &self.signals, &tracked);
        // Dropping `run` (a crash, in tests) stops every task it started, as a process exit would.
        let _watch_tasks = self.spawn_watches(watches, &stores);
        let cluster = Arc::new(Cluster::new(
            stores,
            tracked,
            self.signals.inventory_generation.clone(),
        ));
        let stop_webhook = tessera_process::Stop::new();
        let webhook = self.config.webhook.clone().map(|config| {
            tokio::spawn(crate::webhook::serve(
                self.client.clone(),
                config,
                cluster.stores.classes.clone(),
                self.metrics.admission_reviews.clone(),
                self.webhook_serving.clone(),
                stop_webhook.clone(),
            ))
        });
        let pods = cluster.clone();
        let gate = self.config.gate.clone();
        self.metrics.watch_capacity(move || {
            pods.capacity_waits(&gate, k8s_openapi::jiff::Timestamp::now())
        });
        let (stop_election, election_stopped) = watch::channel(false);
        let mut elector = Tasks(
            self.config
                .lease
                .clone()
                .map(|lease| {
                    tokio::spawn(
                        LeaderElector::new(self.client.clone(), lease, self.leadership.clone())
                            .run(election_stopped),
                    )
                })
                .into_iter()
                .collect(),
        );
        let writer = ApiWriter::new(
            self.client.clone(),
            self.leadership.clone(),
            self.config.instance.clone(),
        );
        let (events, queued) = Events::new(EVENT_QUEUE, self.metrics.events_dropped.clone());
        let publisher = tokio::spawn(publish_all(queued, writer.clone()));
        let worker = Worker {
            cluster: cluster.clone(),
            writer,
            events,
            metrics: self.metrics.clone(),
            config: self.config.settings(),
            waiting: WaitingGroups::default(),
            refused: RefusedEvictions::default(),
            preemption: self.config.preemption,
        };
        self.work(&worker, shutdown).await;
        // The events still queued are published while the Lease is held, for a bounded time.
        drop(worker);
        if tokio::time::timeout(EVENT_DRAIN, publisher).await.is_err() {
            tracing::info!("shutting down: events still queued after {EVENT_DRAIN:?} were dropped");
        }
        tracing::info!("shutting down: releasing the lease");
        let _ = stop_election.send(true);
        for task in std::mem::take(&mut elector.0) {
            let _ = task.await;
        }
        self.metrics.leader.set(0);
        // The webhook serves to the end: admission does not wait for the worker.
        stop_webhook.cancel();
        if let Some(webhook) = webhook {
            match webhook.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "admission webhook stopped with an error"),
                Err(e) => tracing::warn!(error = %e, "admission webhook task failed"),
            }
        }
    }

    /// The worker loop, until `shutdown` completes; a pod being processed is finished first (its
    /// writes are never cut off half-way by a shutdown).
    async fn work(&self, worker: &Worker, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut leadership = self.leadership.subscribe();
        let mut was_leader = false;
        loop {
            if futures::poll!(shutdown.as_mut()).is_ready() {
                return;
            }
            self.heartbeat.beat();
            let leader = self.leadership.is_leader();
            self.metrics.leader.set(i64::from(leader));
            if leader && !was_leader {
                // Whatever was assumed may have been changed by another leader meanwhile.
                worker.cluster.forget_assumed();
                self.queue().wake_all();
                tracing::info!("leading: placing gated pods");
            } else if !leader && was_leader {
                tracing::info!("not leading any more: writes stopped");
            }
            was_leader = leader;
            if self.signals.is_synced() && !self.signals.inventory_built.load(Ordering::Acquire) {
                // The first inventory, before any pod (standbys build it too, to take over at once).
                worker.cluster.inventory(|| {
                    worker.metrics.inventory_rebuilds.inc();
                });
                self.signals.inventory_built.store(true, Ordering::Release);
                tracing::info!("caches synced and the device inventory built: ready");
            }
            let next = if leader && self.signals.is_synced() {
                self.queue().pop(Instant::now())
            } else {
                None
            };
            match next {
                Some(key) => {
                    let outcome = worker.process(&key).await;
                    self.finish(&key, outcome);
                }
                None => {
                    if self.signals.is_synced() {
                        // Idle: build the inventory of the newest slices, classes and nodes
                        // now rather than in the next pod's decision (a large cluster's takes
                        // a few hundred milliseconds). Standbys do too, to take over at once.
                        worker.cluster.inventory(|| {
                            worker.metrics.inventory_rebuilds.inc();
                        });
                    }
                    let due = self.queue().next_due();
                    let wait = due
                        .map(|d| d.saturating_duration_since(Instant::now()))
                        .unwrap_or(IDLE_TICK)
                        .min(IDLE_TICK);
                    tokio::select! {
                        _ = self.signals.wake.notified() => {}
                        _ = leadership.changed() => {}
                        _ = tokio::time::sleep(wait) => {}
                        _ = shutdown.as_mut() => return,
                    }
                }
            }
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, crate::queue::WorkQueue> {
        self.signals.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn finish(&self, key: &str, outcome: Processed) {
        let mut queue = self.queue();
        queue.done(key, outcome, Instant::now());
        self.metrics
            .queue_ready
            .set(i64::try_from(queue.ready_len()).unwrap_or(i64::MAX));
        self.metrics
            .queue_waiting
            .set(i64::try_from(queue.waiting_len()).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_the_caches_are_synced_and_the_inventory_is_built() {
        let signals = Arc::new(Signals::new("example.com/gate"));
        let probe = CachesSynced {
            signals: signals.clone(),
            webhook: None,
        };
        let reasons = probe.check().expect_err("nothing listed yet");
        assert_eq!(
            reasons,
            ["caches not synced yet: 0 of 7 watches have listed"]
        );
        signals.synced.store(WATCHES, Ordering::Release);
        let reasons = probe.check().expect_err("listed, no inventory yet");
        assert_eq!(
            reasons,
            ["the device inventory is being built from the synced caches"]
        );
        signals.inventory_built.store(true, Ordering::Release);
        assert_eq!(probe.check(), Ok(()));
    }
}
