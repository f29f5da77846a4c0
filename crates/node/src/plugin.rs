//! The node plugin's composition root: [`NodePlugin`] starts its parts in order and stops them
//! with one [`Stop`].
//!
//! Parts: claim preparation ([`NodeDriver`], served to the kubelet on its sockets), the writer of
//! prepared claims' `status.devices` ([`crate::claim_status`]), the publish
//! loop and the watch of this node's Node object ([`crate::publish`]), the health monitor when
//! there is NVML ([`crate::health`]), the GPU monitor (per-device metrics and idle claims,
//! [`crate::gpu_metrics`]) when there is NVML — the backend's, or on a mock node a fake driver
//! root's — and the HTTP endpoints (`tessera-process`).
//!
//! Shutdown order, once the `shutdown` future given to [`NodePlugin::run`] completes:
//! 1. the registration socket goes (the kubelet deregisters the plugin), the DRA socket stops
//!    accepting calls, health streams end, and in-flight prepare/unprepare calls finish (cut off
//!    after the shutdown grace);
//! 2. the [`Stop`] is cancelled: the publish loop, the Node watch, the health monitor and the
//!    HTTP endpoints stop, and are awaited.
//!
//! Published ResourceSlices are NOT deleted: the kubelet removes a plugin's slices 30 s after it
//! is gone, and a restarting plugin (upgrade, crash) must not make the devices flap.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tessera_api::DRIVER_NAME;
use tessera_api::shares::ConsumableShares;
use tessera_kubelet_grpc::{KubeletPlugin, PluginConfig, ServeError};
use tessera_nvml::HealthEvents;
use tessera_prepare::inventory::NodeInventory;
use tessera_prepare::plan::MigMode;
use tessera_prepare::{DriverParts, NodeDriver, NodeDriverConfig, StartError};
use tessera_process::{
    Clients, EndpointError, EndpointServer, Endpoints, Heartbeat, Liveness, Stop, StopOnDrop,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backend::driver_root::{CompleteRoot, DriverRootError};
use crate::backend::driver_watch::{DriverWatch, NodeDriverEvents};
use crate::backend::{Backend, BackendConfig, BackendContext, BackendError};
use crate::claim_status::StatusWriter;
use crate::claims::KubeClaimSource;
use crate::gpu_metrics::monitor::{
    GpuMonitor, GpuMonitorSettings, Holders, KubePodEvents, XidCounts,
};
use crate::gpu_metrics::{GpuMetrics, TelemetrySource};
use crate::health::monitor::{HealthMonitor, HealthSettings, MAX_SILENCE};
use crate::health::{SharedFindings, WithDeviceHealth};
use crate::imex_pods::PodImexControl;
use crate::metrics::NodeMetrics;
use crate::metrics::instrumented::InstrumentedDriver;
use crate::metrics::readiness::Readiness;
use crate::publish::node::WatchedNode;
use crate::publish::runner::{PublishLoop, max_silence};
use crate::publish::{Publisher, PublisherConfig, watch_node};
use tessera_prepare::injection::CurrentInjection;

/// How the node plugin runs (the binary fills it from its flags).
#[derive(Debug, Clone)]
pub struct NodePluginConfig {
    /// The node this plugin runs on.
    pub node_name: String,
    /// This plugin pod's UID: per-pod kubelet socket names, for rolling updates with surge.
    pub pod_uid: Option<String>,
    /// Where the kubelet looks for plugin registration sockets.
    pub kubelet_registrar_dir: PathBuf,
    /// The kubelet's plugins directory (the DRA socket goes into `<dir>/<driver>/`).
    pub kubelet_plugins_dir: PathBuf,
    /// Directory of CDI specs the container runtime reads.
    pub cdi_root: PathBuf,
    /// The plugin's state (checkpoint, MPS directories, simulated GPUs); survives restarts.
    pub state_dir: PathBuf,
    /// The GPUs (NVML or mock), the NVIDIA driver root, MPS daemon pods.
    pub backend: BackendConfig,
    /// Publish MIG-enabled GPUs as partitionable devices and create MIG instances on prepare.
    pub dynamic_mig: bool,
    /// How devices are published for sharing between claims (`--consumable-shares`).
    pub consumable_shares: ConsumableShares,
    /// What operators change of the health policy (`--ignored-xids`, `--health-recovery-after`).
    pub health: HealthSettings,
    /// How often the GPU inventory is read again.
    pub rescan_interval: Duration,
    /// Address of `/metrics`, `/healthz` and `/readyz`; `None` turns them off.
    pub metrics_address: Option<SocketAddr>,
    /// How long one claim read may take (the clients bound other API requests themselves:
    /// [`tessera_process::kube_clients`]).
    pub api_timeout: Duration,
    /// How long in-flight kubelet calls may run after the shutdown signal.
    pub shutdown_grace: Duration,
    /// Per-device GPU metrics and idle claims (`--gpu-metrics-interval`, `--idle-threshold`,
    /// `--idle-window`).
    pub gpu_metrics: GpuMonitorSettings,
}

/// Why the plugin could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("cannot start claim preparation: {0}")]
    Driver(#[source] StartError),
    #[error("cannot set up the kubelet plugin sockets: {0}")]
    Sockets(#[source] ServeError),
    #[error(transparent)]
    Endpoints(EndpointError),
    #[error("the kubelet plugin stopped with an error: {0}")]
    Serve(#[source] ServeError),
}

/// The driver as the kubelet sees it: instrumented, with the device health stream.
type ServedDriver = WithDeviceHealth<InstrumentedDriver<NodeDriver>>;

/// The node plugin, started: its sockets are bound and its background parts run.
pub struct NodePlugin {
    node_name: String,
    kubelet: KubeletPlugin<ServedDriver>,
    stop: Stop,
    /// Stops the parts if the plugin is dropped without [`NodePlugin::run`].
    _stop_on_drop: StopOnDrop,
    parts: Vec<(&'static str, JoinHandle<()>)>,
    endpoints: Option<JoinHandle<std::io::Result<()>>>,
}

/// The kubelet sockets of this plugin: per pod when it knows its pod's UID (rolling updates
/// with surge).
fn kubelet_config(config: &NodePluginConfig) -> PluginConfig {
    let kubelet = PluginConfig::new(DRIVER_NAME)
        .registrar_dir(&config.kubelet_registrar_dir)
        .plugins_dir(&config.kubelet_plugins_dir)
        .shutdown_grace(config.shutdown_grace)
        // The driver locks per claim (and per node across plugin processes): calls on other
        // claims need not wait for each other.
        .serialize_calls(false);
    match &config.pod_uid {
        Some(pod_uid) => kubelet.rolling_update(pod_uid),
        None => kubelet,
    }
}

/// The IMEX daemons' peers refresh, where this node runs IMEX daemons.
fn imex_refresh(
    imex: Option<PodImexControl>,
    stop: &Stop,
) -> Option<(&'static str, JoinHandle<()>)> {
    let refresh = imex?.refresh_until(IMEX_REFRESH, stop.clone().cancelled_owned());
    Some(("IMEX peers refresh", tokio::spawn(refresh)))
}

/// The watch of the driver roots for a new driver version or a preferred root, where the plugin
/// injects a driver; its changes are Events on the Node (`node`: the Node watch's facts).
fn driver_watch(
    shared: &Shared<'_>,
    chosen: Option<CompleteRoot>,
    injection: CurrentInjection,
    node: watch::Receiver<Option<WatchedNode>>,
) -> Option<(&'static str, JoinHandle<()>)> {
    let config = shared.config;
    let roots = config.backend.driver_root.clone()?;
    let watch = DriverWatch::new(roots, chosen?, injection, shared.metrics.clone());
    let events = NodeDriverEvents::new(shared.clients.requests.clone(), &config.node_name, node);
    Some((
        "driver root watch",
        watch.spawn(Some(events), shared.stop.clone()),
    ))
}

impl NodePlugin {
    /// Opens the GPUs, recovers claim preparation from whatever a previous run left, binds the
    /// kubelet sockets and starts the publish loop, the Node watch, the health monitor and the
    /// endpoints. Kubelet calls are answered once [`NodePlugin::run`] runs. `clients.requests`
    /// serves claim reads and slice writes, `clients.watches` the Node watch.
    pub async fn start(
        config: NodePluginConfig,
        clients: Clients,
    ) -> Result<NodePlugin, PluginError> {
        let context = BackendContext {
            node_name: &config.node_name,
            state_dir: &config.state_dir,
            client: &clients.requests,
        };
        let backend = open_backend(&config.backend, config.metrics_address, context).await?;
        let injection = CurrentInjection::new(backend.injection.clone());
        let mut registry = Registry::default();
        tessera_process::build::register(&mut registry);
        let metrics = NodeMetrics::new(&mut registry);
        let gpu_metrics = GpuMetrics::new(&mut registry);
        let (kubelet_health, kubelet_health_feed) = watch::channel(Vec::new());
        let stop = Stop::new();
        let stop_on_drop = stop.clone().drop_guard();
        // status.devices of prepared claims, written in the background (prepare never waits).
        let (status_writer, status_task) =
            StatusWriter::spawn(clients.requests.clone(), stop.clone());
        let driver = start_driver(&config, &clients.requests, &backend, injection.clone())
            .await?
            .report_status(status_writer);
        let recovery = driver.recovery();
        let holders: Holders = {
            let driver = driver.clone();
            Arc::new(move || driver.holders())
        };
        let driver = InstrumentedDriver::new(driver, metrics.clone(), Some(NodeDriver::stats));
        let kubelet = kubelet_config(&config)
            .bind(Arc::new(WithDeviceHealth::new(driver, kubelet_health_feed)))
            .map_err(PluginError::Sockets)?;

        let shared = Shared {
            config: &config,
            clients,
            inventory: Arc::clone(&backend.inventory),
            metrics: metrics.clone(),
            findings: SharedFindings::default(),
            xids: XidCounts::default(),
            stop: stop.clone(),
        };
        let (published, published_feed) = watch::channel(false);
        let mut background = Background::default();
        background.parts.push(("claim status writer", status_task));
        background
            .parts
            .extend(imex_refresh(backend.imex.clone(), &stop));
        let node = background.publish(&shared, &kubelet, kubelet_health, published);
        if let Some(events) = backend.health_events {
            background.monitor(&shared, events);
        }
        background
            .parts
            .extend(driver_watch(&shared, backend.driver, injection, node));
        if let Some(telemetry) = backend.telemetry {
            background.gpu_monitor(&shared, telemetry, holders, gpu_metrics);
        }
        let Background { liveness, parts } = background;
        let endpoints = Endpoints {
            metrics: Arc::new(registry),
            liveness: Arc::new(liveness),
            readiness: Arc::new(Readiness {
                registration: kubelet.registration_state(),
                published: published_feed,
                recovery,
            }),
        };
        let endpoints = serve_endpoints(config.metrics_address, endpoints, &stop).await?;
        Ok(NodePlugin {
            node_name: config.node_name.clone(),
            kubelet,
            _stop_on_drop: stop_on_drop,
            stop,
            parts,
            endpoints,
        })
    }

    /// Serves the kubelet until `shutdown` completes, then stops every part in order (see the
    /// module documentation).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), PluginError> {
        tracing::info!(node = %self.node_name, driver = DRIVER_NAME, "tessera-kubelet-plugin running");
        let served = self.kubelet.serve(shutdown).await;
        self.stop.cancel();
        for (name, task) in self.parts {
            if task.await.is_err() {
                tracing::error!("the {name} panicked");
            }
        }
        if let Some(endpoints) = self.endpoints {
            match endpoints.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::error!(%error, "the HTTP endpoints failed"),
                Err(_) => tracing::error!("the HTTP endpoints panicked"),
            }
        }
        served.map_err(PluginError::Serve)
    }
}

/// What the background parts share.
struct Shared<'a> {
    config: &'a NodePluginConfig,
    clients: Clients,
    inventory: Arc<NodeInventory>,
    metrics: NodeMetrics,
    findings: SharedFindings,
    xids: XidCounts,
    stop: Stop,
}

/// The background parts, as they are started, and the heartbeats `/healthz` checks.
#[derive(Default)]
struct Background {
    liveness: Liveness,
    parts: Vec<(&'static str, JoinHandle<()>)>,
}

impl Background {
    /// Starts the Node watch and the publish loop; returns the Node watch's facts.
    fn publish(
        &mut self,
        shared: &Shared<'_>,
        kubelet: &KubeletPlugin<ServedDriver>,
        kubelet_health: watch::Sender<Vec<tessera_kubelet_grpc::DeviceHealth>>,
        published: watch::Sender<bool>,
    ) -> watch::Receiver<Option<WatchedNode>> {
        let config = shared.config;
        let (node, node_watch) = watch_node(
            shared.clients.watches.clone(),
            &config.node_name,
            shared.stop.clone(),
        );
        self.parts.push(("Node watch", node_watch));
        let heartbeat = Heartbeat::new("publish loop", max_silence(config.rescan_interval));
        self.liveness.watch(heartbeat.clone());
        let publisher_config = PublisherConfig {
            node_name: config.node_name.clone(),
            driver_name: DRIVER_NAME.to_owned(),
            dynamic_mig: config.dynamic_mig,
            consumable_shares: config.consumable_shares,
        };
        let publish_loop = PublishLoop {
            publisher: Publisher::new(
                shared.clients.requests.clone(),
                publisher_config,
                shared.metrics.clone(),
            ),
            inventory: Arc::clone(&shared.inventory),
            findings: shared.findings.clone(),
            node: node.clone(),
            registration: kubelet.registration_state(),
            kubelet_health,
            published,
            metrics: shared.metrics.clone(),
            heartbeat,
            rescan_interval: config.rescan_interval,
        };
        let stopped = shared.stop.clone().cancelled_owned();
        self.parts
            .push(("publish loop", tokio::spawn(publish_loop.run(stopped))));
        node
    }

    /// Starts the health monitor on NVML's events.
    fn monitor(&mut self, shared: &Shared<'_>, events: HealthEvents) {
        let heartbeat = Heartbeat::new("health monitor", MAX_SILENCE);
        self.liveness.watch(heartbeat.clone());
        let monitor = HealthMonitor {
            source: Box::new(events),
            findings: shared.findings.clone(),
            metrics: shared.metrics.clone(),
            heartbeat,
            settings: shared.config.health.clone(),
            xids: shared.xids.clone(),
        };
        self.parts
            .push(("health monitor", monitor.spawn(shared.stop.clone())));
    }

    /// Starts the GPU monitor: per-device metrics and idle claims.
    fn gpu_monitor(
        &mut self,
        shared: &Shared<'_>,
        source: Arc<dyn TelemetrySource>,
        holders: Holders,
        metrics: GpuMetrics,
    ) {
        let config = shared.config;
        let settings = config.gpu_metrics;
        let heartbeat = Heartbeat::new("GPU monitor", settings.max_silence());
        self.liveness.watch(heartbeat.clone());
        let client = shared.clients.requests.clone();
        let monitor = GpuMonitor {
            source,
            holders,
            inventory: Arc::clone(&shared.inventory),
            claims: Arc::new(KubeClaimSource::new(client.clone()).timeout(config.api_timeout)),
            events: Arc::new(KubePodEvents::new(client, &config.node_name)),
            metrics,
            xids: shared.xids.clone(),
            settings,
            heartbeat,
        };
        self.parts
            .push(("GPU monitor", monitor.spawn(shared.stop.clone())));
    }
}

/// How often a driver root without a complete driver is looked at again at start.
const DRIVER_ROOT_RETRY: Duration = Duration::from_secs(5);

/// Opens the backend, waiting while no candidate driver root holds a complete driver (the GPU
/// operator's driver container is still laying its files, or not installed yet): meanwhile
/// `/healthz` answers (waiting is not hanging, so the liveness probe does not restart the
/// container) and `/readyz` says why, as the log does every [`DRIVER_ROOT_RETRY`] at most once a
/// minute — every candidate and what it lacks. The candidates are read again at each try, so
/// the first to get a complete driver is used.
async fn open_backend(
    config: &BackendConfig,
    address: Option<SocketAddr>,
    context: BackendContext<'_>,
) -> Result<Backend, PluginError> {
    let mut said: Option<std::time::Instant> = None;
    let mut waiting: Option<WaitingEndpoints> = None;
    loop {
        let reason = match Backend::open(config, context) {
            Err(BackendError::NoCompleteDriver(lacking)) => lacking.to_string(),
            // The root was emptied between the look and the read.
            Err(BackendError::DriverRoot {
                driver_root,
                source: DriverRootError::Discovery(error),
            }) => format!("{}: {error}", driver_root.display()),
            other => {
                if let Some(waiting) = waiting {
                    waiting.close().await;
                }
                return other.map_err(PluginError::from);
            }
        };
        if said.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
            tracing::warn!(reason = %reason, "waiting for a complete NVIDIA driver under the driver root; not ready until then");
            said = Some(std::time::Instant::now());
        }
        match &waiting {
            Some(endpoints) => endpoints.say(reason),
            None => waiting = WaitingEndpoints::serve(address, reason).await,
        }
        tokio::time::sleep(DRIVER_ROOT_RETRY).await;
    }
}

/// The endpoints while the plugin waits for a driver: alive, not ready (the reason), no metrics.
struct WaitingEndpoints {
    reason: Arc<std::sync::Mutex<String>>,
    stop: Stop,
    task: JoinHandle<std::io::Result<()>>,
}

impl WaitingEndpoints {
    /// Serves them on `address` (none without one, or if it cannot be bound: the log says why
    /// the plugin waits either way).
    async fn serve(address: Option<SocketAddr>, reason: String) -> Option<WaitingEndpoints> {
        let reason = Arc::new(std::sync::Mutex::new(reason));
        let said = Arc::clone(&reason);
        let not_ready = move || -> Result<(), Vec<String>> {
            let reason = said.lock().unwrap_or_else(|e| e.into_inner()).clone();
            Err(vec![reason])
        };
        let endpoints = Endpoints {
            metrics: Arc::new(Registry::default()),
            liveness: Arc::new(|| -> Result<(), Vec<String>> { Ok(()) }),
            readiness: Arc::new(not_ready),
        };
        let server = match EndpointServer::bind(address?, endpoints).await {
            Ok(server) => server,
            Err(error) => {
                tracing::warn!(%error, "cannot serve /healthz and /readyz while waiting for the driver");
                return None;
            }
        };
        let stop = Stop::new();
        let task = tokio::spawn(server.serve(stop.clone().cancelled_owned()));
        Some(WaitingEndpoints { reason, stop, task })
    }

    fn say(&self, reason: String) {
        *self.reason.lock().unwrap_or_else(|e| e.into_inner()) = reason;
    }

    /// Stops serving and waits until the port is free for the plugin's own endpoints.
    async fn close(self) {
        self.stop.cancel();
        let abort = self.task.abort_handle();
        // Connections a scraper keeps open must not hold the port for long.
        match tokio::time::timeout(Duration::from_secs(5), self.task).await {
            Ok(Ok(Err(error))) => {
                tracing::warn!(%error, "the endpoints served while waiting for the driver stopped with an error");
            }
            Ok(_) => {}
            Err(_) => {
                abort.abort();
            }
        }
    }
}

/// How often the IMEX daemons' peers are compared with their domains' pods.
const IMEX_REFRESH: std::time::Duration = std::time::Duration::from_secs(3);

/// Starts claim preparation: loads the checkpoint and recovers from whatever a previous run
/// left (see [`tessera_prepare::driver`]).
async fn start_driver(
    config: &NodePluginConfig,
    client: &kube::Client,
    backend: &Backend,
    injection: CurrentInjection,
) -> Result<NodeDriver, PluginError> {
    let mig_mode = if config.dynamic_mig {
        MigMode::Dynamic
    } else {
        MigMode::Static
    };
    let driver_config =
        NodeDriverConfig::new(&config.node_name, &config.cdi_root, &config.state_dir)
            .mig_mode(mig_mode)
            .consumable_shares(config.consumable_shares)
            .current_injection(injection);
    let parts = DriverParts {
        inventory: Arc::clone(&backend.inventory),
        claims: Arc::new(
            KubeClaimSource::new(client.clone())
                .timeout(config.api_timeout)
                .reporter_instance(&config.node_name),
        ),
        gpu: Arc::clone(&backend.gpu),
        mig: Arc::clone(&backend.mig),
        imex: match &backend.imex {
            Some(pods) => Arc::new(pods.clone()),
            None => Arc::new(tessera_prepare::imex::NoImex),
        },
    };
    let (driver, report) = NodeDriver::start(driver_config, parts)
        .await
        .map_err(PluginError::Driver)?;
    tracing::info!(checkpoint = %driver.checkpoint_path().display(), report = ?report, "claim preparation recovered its state");
    for error in &report.errors {
        tracing::warn!(%error, "recovery left a problem for a later retry");
    }
    Ok(driver)
}

/// Binds and serves the endpoints until `stop` (none without an address).
async fn serve_endpoints(
    address: Option<SocketAddr>,
    endpoints: Endpoints,
    stop: &Stop,
) -> Result<Option<JoinHandle<std::io::Result<()>>>, PluginError> {
    let Some(address) = address else {
        return Ok(None);
    };
    let server = EndpointServer::bind(address, endpoints)
        .await
        .map_err(PluginError::Endpoints)?;
    tracing::info!(%address, "serving /metrics, /healthz and /readyz");
    Ok(Some(tokio::spawn(
        server.serve(stop.clone().cancelled_owned()),
    )))
}
