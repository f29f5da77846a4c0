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
use tessera_gpu_inventory::{DeviceSource, MockSource, SourceError};
use tessera_kubelet_grpc::{KubeletPlugin, PluginConfig, ServeError};
use tessera_nvml::{HealthEvents, NvmlError, NvmlSource, Sysfs};
use tessera_process::{
    Clients, EndpointError, EndpointServer, Endpoints, Heartbeat, Liveness, Stop, StopOnDrop,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::claim_status::StatusWriter;
use crate::claims::KubeClaimSource;
use crate::gpu_metrics::monitor::{
    GpuMonitor, GpuMonitorSettings, Holders, KubePodEvents, XidCounts,
};
use crate::gpu_metrics::{GpuMetrics, TelemetrySource};
use crate::health::monitor::{HealthMonitor, HealthSettings, MAX_SILENCE};
use crate::health::{SharedFindings, WithDeviceHealth};
use crate::injection::{self, DriverInjection, DriverRootConfig, DriverRootError, DriverTools};
use crate::inventory::NodeInventory;
use crate::metrics::NodeMetrics;
use crate::metrics::instrumented::InstrumentedDriver;
use crate::metrics::readiness::Readiness;
use crate::mig::{MigControl, SimulatedMig};
use crate::plan::MigMode;
use crate::publish::runner::{PublishLoop, max_silence};
use crate::publish::{Publisher, PublisherConfig, watch_node};
use crate::sharing::{
    GpuControl, MpsPodTemplate, PodMpsControl, SimulatedGpuControl, SystemGpuControl,
};
use crate::{DriverParts, NodeDriver, NodeDriverConfig, StartError};

/// Where the GPUs come from.
#[derive(Debug, Clone)]
pub enum DeviceBackend {
    /// A shipped topology's name or a topology file; sharing and MIG are simulated in files
    /// under the state directory, and there are no health events.
    Mock { topology: String },
    /// NVML from `library` (none: the driver root's `libnvidia-ml.so.1`); PCIe roots and NUMA
    /// nodes from the sysfs tree at `sysfs_root`.
    Nvml {
        library: Option<PathBuf>,
        sysfs_root: PathBuf,
    },
}

/// How the node plugin runs (the binary fills it from its flags).
#[derive(Debug, Clone)]
pub struct NodePluginConfig {
    /// The node this plugin runs on.
    pub node_name: String,
    /// Where the kubelet looks for plugin registration sockets.
    pub kubelet_registrar_dir: PathBuf,
    /// The kubelet's plugins directory (the DRA socket goes into `<dir>/<driver>/`).
    pub kubelet_plugins_dir: PathBuf,
    /// Directory of CDI specs the container runtime reads.
    pub cdi_root: PathBuf,
    /// The plugin's state (checkpoint, MPS directories, simulated GPUs); survives restarts.
    pub state_dir: PathBuf,
    pub devices: DeviceBackend,
    /// The NVIDIA driver's files, which claim specs inject, and its tools, which time-slicing and
    /// MPS run; `None`: specs carry device nodes and environment only, sharing is simulated on
    /// mock nodes and uses the tools on `PATH` with NVML.
    pub driver_root: Option<DriverRootConfig>,
    /// Host directory the driver's device nodes are under (`/` on real nodes).
    pub dev_root: PathBuf,
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
    /// MPS control daemons in pods of their own (`--mps-daemons=pod`, with a driver root);
    /// `None`: daemons are processes the plugin starts.
    pub mps_pods: Option<MpsPodSettings>,
    /// Per-device GPU metrics and idle claims (`--gpu-metrics-interval`, `--idle-threshold`,
    /// `--idle-window`).
    pub gpu_metrics: GpuMonitorSettings,
}

/// What MPS daemon pods need besides the driver root (`--mps-daemons=pod`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsPodSettings {
    /// The plugin's own image (it holds `tessera-mps-daemon`).
    pub image: String,
    /// The plugin's namespace.
    pub namespace: String,
    pub priority_class: Option<String>,
}

/// Why the plugin could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("cannot read the mock topology (--topology): {0}")]
    Topology(#[source] SourceError),
    #[error("cannot open NVML (--nvml-lib): {0}")]
    Nvml(#[source] NvmlError),
    #[error("cannot read the GPUs through NVML: {0}")]
    ReadNvml(#[source] SourceError),
    #[error(
        "--mps-daemons=pod: the driver root has no nvidia-cuda-mps-control for the daemon pods \
         to run; use --mps-daemons=process or a driver root with MPS"
    )]
    NoMpsControl,
    #[error(
        "the nvml backend has no library: {} (pass --nvml-lib with the path of libnvidia-ml.so.1)",
        match .driver_root {
            Some(root) => format!("the driver root {} has no libnvidia-ml.so.1", root.display()),
            None => "neither --nvml-lib nor --driver-root is set".to_owned(),
        }
    )]
    NoNvmlLibrary { driver_root: Option<PathBuf> },
    #[error("--driver-root {}: {source}", .driver_root.display())]
    DriverRoot {
        driver_root: PathBuf,
        #[source]
        source: DriverRootError,
    },
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

impl NodePlugin {
    /// Opens the GPUs, recovers claim preparation from whatever a previous run left, binds the
    /// kubelet sockets and starts the publish loop, the Node watch, the health monitor and the
    /// endpoints. Kubelet calls are answered once [`NodePlugin::run`] runs. `clients.requests`
    /// serves claim reads and slice writes, `clients.watches` the Node watch.
    pub async fn start(
        config: NodePluginConfig,
        clients: Clients,
    ) -> Result<NodePlugin, PluginError> {
        let (injection, tools, nvml_library) = load_driver_root(&config)?;
        let config = with_nvml_library(config, nvml_library)?;
        let devices = Devices::open(&config, &clients.requests, tools.as_ref())?;
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
        let driver = start_driver(&config, &clients.requests, &devices, injection)
            .await?
            .report_status(status_writer);
        let recovery = driver.recovery();
        let holders: Holders = {
            let driver = driver.clone();
            Arc::new(move || driver.holders())
        };
        let driver = InstrumentedDriver::new(driver, metrics.clone(), Some(NodeDriver::stats));
        let kubelet = PluginConfig::new(DRIVER_NAME)
            .registrar_dir(&config.kubelet_registrar_dir)
            .plugins_dir(&config.kubelet_plugins_dir)
            .shutdown_grace(config.shutdown_grace)
            // The driver locks per claim: calls on other claims need not wait for each other.
            .serialize_calls(false)
            .bind(Arc::new(WithDeviceHealth::new(driver, kubelet_health_feed)))
            .map_err(PluginError::Sockets)?;

        let shared = Shared {
            config: &config,
            clients,
            inventory: Arc::clone(&devices.inventory),
            metrics: metrics.clone(),
            findings: SharedFindings::default(),
            xids: XidCounts::default(),
            stop: stop.clone(),
        };
        let (published, published_feed) = watch::channel(false);
        let mut background = Background::default();
        background.parts.push(("claim status writer", status_task));
        background.publish(&shared, &kubelet, kubelet_health, published);
        if let Some(events) = devices.health_events {
            background.monitor(&shared, events);
        }
        if let Some(telemetry) = devices.telemetry {
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
    /// Starts the Node watch and the publish loop.
    fn publish(
        &mut self,
        shared: &Shared<'_>,
        kubelet: &KubeletPlugin<ServedDriver>,
        kubelet_health: watch::Sender<Vec<tessera_kubelet_grpc::DeviceHealth>>,
        published: watch::Sender<bool>,
    ) {
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
            node,
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

/// The GPUs: where the inventory comes from, how sharing and MIG are applied, and NVML's
/// health events and telemetry when there is NVML.
struct Devices {
    inventory: Arc<NodeInventory>,
    gpu: Arc<dyn GpuControl>,
    mig: Arc<dyn MigControl>,
    health_events: Option<HealthEvents>,
    telemetry: Option<Arc<dyn TelemetrySource>>,
}

impl Devices {
    fn open(
        config: &NodePluginConfig,
        client: &kube::Client,
        tools: Option<&DriverTools>,
    ) -> Result<Devices, PluginError> {
        // Sharing through the driver root's tools (privileged daemon pods on real GPUs).
        let sharing = |privileged| {
            tools
                .map(|tools| driver_sharing(config, client, tools, privileged))
                .transpose()
        };
        match &config.devices {
            DeviceBackend::Mock { topology } => {
                let mut devices = Devices::mock(config, topology, sharing(false)?)?;
                devices.telemetry = tools
                    .and_then(|tools| tools.nvml.as_deref())
                    .and_then(driver_root_telemetry);
                Ok(devices)
            }
            DeviceBackend::Nvml {
                library,
                sysfs_root,
            } => {
                let library = library.as_deref().ok_or(PluginError::NoNvmlLibrary {
                    driver_root: config.driver_root.as_ref().map(|d| d.driver_root.clone()),
                })?;
                Devices::nvml(library, sysfs_root, sharing(true)?)
            }
        }
    }

    fn mock(
        config: &NodePluginConfig,
        topology: &str,
        tools: Option<Arc<dyn GpuControl>>,
    ) -> Result<Devices, PluginError> {
        // Each node gets its own GPU and MIG UUIDs, as real nodes do.
        let source = MockSource::new(topology)
            .map_err(PluginError::Topology)?
            .for_node(config.node_name.clone());
        tracing::info!(
            source = %source.describe(),
            fake_driver = tools.is_some(),
            "GPU backend (mock: MIG simulated under the state directory, no health events; \
             sharing through the fake driver root's tools, or simulated without one)"
        );
        let inventory =
            Arc::new(NodeInventory::read(Arc::new(source)).map_err(PluginError::Topology)?);
        let gpu: Arc<dyn GpuControl> = match tools {
            Some(tools) => tools,
            None => Arc::new(SimulatedGpuControl::new(
                config.state_dir.join("simulated-gpu"),
            )),
        };
        Ok(Devices {
            gpu,
            mig: Arc::new(SimulatedMig::persistent(
                &inventory.current(),
                config.state_dir.join("simulated-mig.json"),
            )),
            inventory,
            health_events: None,
            telemetry: None,
        })
    }

    fn nvml(
        library: &std::path::Path,
        sysfs_root: &std::path::Path,
        tools: Option<Arc<dyn GpuControl>>,
    ) -> Result<Devices, PluginError> {
        let nvml = Arc::new(
            NvmlSource::open(Some(library))
                .map_err(PluginError::Nvml)?
                .with_sysfs(Sysfs::new(sysfs_root)),
        );
        tracing::info!(source = %nvml.describe(), sysfs = %sysfs_root.display(), "GPU backend");
        let health_events = match nvml.health_events() {
            Ok(events) => {
                for gpu in events.unmonitored() {
                    tracing::warn!(gpu = %gpu.gpu_uuid, reason = %gpu.reason, "GPU cannot report XID/ECC events; its health is not monitored");
                }
                Some(events)
            }
            Err(error) => {
                tracing::error!(%error, "cannot register for NVML health events; device health is not monitored");
                None
            }
        };
        Ok(Devices {
            inventory: Arc::new(NodeInventory::read(nvml.clone()).map_err(PluginError::ReadNvml)?),
            gpu: match tools {
                Some(tools) => tools,
                None => Arc::new(SystemGpuControl::default()),
            },
            mig: nvml.clone(),
            health_events,
            telemetry: Some(nvml as Arc<dyn TelemetrySource>),
        })
    }
}

/// A mock node's telemetry: the NVML library of its (fake) driver root, when it opens.
fn driver_root_telemetry(library: &std::path::Path) -> Option<Arc<dyn TelemetrySource>> {
    match NvmlSource::open(Some(library)) {
        Ok(nvml) => {
            tracing::info!(library = %library.display(), "GPU metrics read the driver root's NVML");
            Some(Arc::new(nvml))
        }
        Err(error) => {
            tracing::warn!(%error, "the driver root's NVML does not open; no GPU metrics");
            None
        }
    }
}

/// The NVIDIA driver: what claim specs inject, and its tools for sharing (with a driver root).
/// The NVML backend without a library of its own gets the driver root's `libnvidia-ml.so.1`.
fn with_nvml_library(
    mut config: NodePluginConfig,
    found: Option<PathBuf>,
) -> Result<NodePluginConfig, PluginError> {
    let driver_root = config.driver_root.as_ref().map(|d| d.driver_root.clone());
    default_nvml_library(&mut config.devices, found, driver_root)?;
    Ok(config)
}

fn default_nvml_library(
    devices: &mut DeviceBackend,
    found: Option<PathBuf>,
    driver_root: Option<PathBuf>,
) -> Result<(), PluginError> {
    if let DeviceBackend::Nvml { library, .. } = devices
        && library.is_none()
    {
        *library = Some(found.ok_or(PluginError::NoNvmlLibrary { driver_root })?);
    }
    Ok(())
}

/// The driver root's injection and tools, and its `libnvidia-ml.so.1` (this process's view).
fn load_driver_root(
    config: &NodePluginConfig,
) -> Result<(DriverInjection, Option<DriverTools>, Option<PathBuf>), PluginError> {
    let Some(driver) = &config.driver_root else {
        if matches!(config.devices, DeviceBackend::Nvml { .. }) {
            tracing::warn!(
                "no --driver-root: claim specs give containers device nodes and environment but \
                 none of the driver's libraries or binaries (set kubeletPlugin.driverRoot)"
            );
        }
        return Ok((DriverInjection::devices_only(&config.dev_root), None, None));
    };
    let (injection, tools, summary) =
        injection::load(driver).map_err(|source| PluginError::DriverRoot {
            driver_root: driver.driver_root.clone(),
            source,
        })?;
    tracing::info!(
        driver_root = %driver.driver_root.display(),
        version = %summary.version,
        libraries = summary.libraries,
        library_dirs = ?summary.library_dirs,
        binaries = ?summary.binaries,
        firmware = summary.firmware,
        ipc_sockets = ?summary.ipc_sockets,
        hook = %summary.hook.display(),
        "NVIDIA driver found; claim specs inject its files"
    );
    for missing in &summary.missing_control_nodes {
        tracing::warn!(node = %missing, "driver device node missing; containers will not get it");
    }
    Ok((injection, Some(tools), summary.nvml_library))
}

/// Sharing through the driver's tools: MPS daemons as processes of the plugin's, or in pods of
/// their own ([`NodePluginConfig::mps_pods`]).
fn driver_sharing(
    config: &NodePluginConfig,
    client: &kube::Client,
    tools: &DriverTools,
    privileged: bool,
) -> Result<Arc<dyn GpuControl>, PluginError> {
    let system = driver_gpu_control(tools);
    let (Some(pods), Some(driver)) = (&config.mps_pods, &config.driver_root) else {
        return Ok(Arc::new(system));
    };
    // The tools' paths as this process sees them, made relative to the driver root.
    let in_root = |path: &std::path::Path| {
        std::path::Path::new("/").join(
            path.strip_prefix(&driver.container_driver_root)
                .unwrap_or(path),
        )
    };
    let control = tools
        .mps_control
        .as_deref()
        .ok_or(PluginError::NoMpsControl)?;
    let template = MpsPodTemplate {
        node_name: config.node_name.clone(),
        namespace: pods.namespace.clone(),
        image: pods.image.clone(),
        priority_class: pods.priority_class.clone(),
        privileged,
        driver_root: driver.driver_root.clone(),
        dev_root: config.dev_root.clone(),
        control: in_root(control),
        library_dirs: std::env::split_paths(&tools.library_path)
            .filter(|d| !d.as_os_str().is_empty())
            .map(|d| in_root(&d))
            .collect(),
    };
    tracing::info!(namespace = %pods.namespace, image = %pods.image, "MPS control daemons run in pods of their own");
    Ok(Arc::new(PodMpsControl::new(
        client.clone(),
        tokio::runtime::Handle::current(),
        system,
        template,
    )))
}

/// The driver's own tools, from the driver root.
fn driver_gpu_control(tools: &DriverTools) -> SystemGpuControl {
    let tool = |path: &Option<PathBuf>, name: &str| {
        path.clone().unwrap_or_else(|| {
            tracing::warn!("the driver root has no {name}; sharing that needs it will fail");
            PathBuf::from(name)
        })
    };
    SystemGpuControl::with_programs(
        tool(&tools.nvidia_smi, "nvidia-smi"),
        tool(&tools.mps_control, "nvidia-cuda-mps-control"),
    )
    .with_library_path(&tools.library_path)
}

/// Starts claim preparation: loads the checkpoint and recovers from whatever a previous run
/// left (see [`crate::driver`]).
async fn start_driver(
    config: &NodePluginConfig,
    client: &kube::Client,
    devices: &Devices,
    injection: DriverInjection,
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
            .injection(injection);
    let parts = DriverParts {
        inventory: Arc::clone(&devices.inventory),
        claims: Arc::new(
            KubeClaimSource::new(client.clone())
                .timeout(config.api_timeout)
                .reporter_instance(&config.node_name),
        ),
        gpu: Arc::clone(&devices.gpu),
        mig: Arc::clone(&devices.mig),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn nvml(library: Option<&str>) -> DeviceBackend {
        DeviceBackend::Nvml {
            library: library.map(PathBuf::from),
            sysfs_root: PathBuf::from("/sys"),
        }
    }

    fn library(devices: &DeviceBackend) -> Option<&std::path::Path> {
        match devices {
            DeviceBackend::Nvml { library, .. } => library.as_deref(),
            DeviceBackend::Mock { .. } => None,
        }
    }

    #[test]
    fn the_nvml_backend_takes_the_driver_roots_library_unless_given_one() {
        let found = PathBuf::from("/driver-root/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1");
        let mut devices = nvml(None);
        default_nvml_library(&mut devices, Some(found.clone()), Some("/".into())).unwrap();
        assert_eq!(library(&devices), Some(found.as_path()));

        let mut devices = nvml(Some("/given.so"));
        default_nvml_library(&mut devices, Some(found.clone()), Some("/".into())).unwrap();
        assert_eq!(library(&devices), Some(std::path::Path::new("/given.so")));

        let mut devices = DeviceBackend::Mock {
            topology: "dgx-h100".into(),
        };
        default_nvml_library(&mut devices, None, None).unwrap();

        let error = default_nvml_library(&mut nvml(None), None, Some("/run/nvidia/driver".into()))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("/run/nvidia/driver") && error.contains("--nvml-lib"),
            "{error}"
        );
    }
}
