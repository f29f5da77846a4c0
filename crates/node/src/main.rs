//! `tessera-kubelet-plugin`: flags, logging, signals, and the wiring of the node plugin's parts.
//!
//! Shutdown order, on SIGTERM or SIGINT:
//! 1. the registration socket goes (the kubelet deregisters the plugin), the DRA socket stops
//!    accepting calls, health streams end, and in-flight prepare/unprepare calls finish (cut off
//!    after `--shutdown-grace`);
//! 2. the publish loop, the Node watch and the health monitor stop;
//! 3. the HTTP endpoints stop.
//!
//! Published ResourceSlices are NOT deleted: the kubelet removes a plugin's slices 30 s after it
//! is gone, and a restarting plugin (upgrade, crash) must not make the devices flap.

mod args;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use clap::Parser;
use prometheus_client::registry::Registry;
use tessera_api::DRIVER_NAME;
use tessera_driver_root::edits::HOOK_BINARY;
use tessera_kubelet::PluginConfig;
use tessera_node::claims::KubeClaimSource;
use tessera_node::health::monitor::{HealthMonitor, HealthSettings, MAX_SILENCE};
use tessera_node::health::{SharedFindings, WithDeviceHealth};
use tessera_node::injection::{self, DriverInjection, DriverRootConfig, DriverTools, HookInstall};
use tessera_node::inventory::NodeInventory;
use tessera_node::metrics::NodeMetrics;
use tessera_node::metrics::endpoints::{self, EndpointState, Readiness};
use tessera_node::metrics::instrumented::InstrumentedDriver;
use tessera_node::metrics::liveness::{Heartbeat, Liveness};
use tessera_node::mig::SimulatedMig;
use tessera_node::plan::MigMode;
use tessera_node::publish::runner::{PublishLoop, max_silence};
use tessera_node::publish::{Publisher, PublisherConfig, watch_node};
use tessera_node::sharing::{SimulatedGpuControl, SystemGpuControl};
use tessera_node::{DriverParts, NodeDriver, NodeDriverConfig};
use tessera_topology::nvml::{HealthEvents, NvmlSource, Sysfs};
use tessera_topology::{DeviceSource, MockSource};
use tokio::sync::watch;

use crate::args::{Args, LogFormat};

fn main() -> ExitCode {
    let args = Args::parse();
    init_tracing(args.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A log line that cannot be written (stderr on a full disk) is lost, and never stops the
    // plugin: tracing-subscriber would otherwise report it with eprintln!, which panics.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The GPUs: where the inventory comes from, how sharing and MIG are applied, and NVML's
/// health events when there is NVML.
struct Devices {
    inventory: Arc<NodeInventory>,
    gpu: Arc<dyn tessera_node::sharing::GpuControl>,
    mig: Arc<dyn tessera_node::mig::MigControl>,
    health_events: Option<HealthEvents>,
}

/// The NVIDIA driver: what claim specs inject, and its tools for sharing (with a driver root).
fn load_driver_root(args: &Args) -> anyhow::Result<(DriverInjection, Option<DriverTools>)> {
    let Some(driver_root) = &args.driver_root else {
        if args.devices.nvml_lib.is_some() {
            tracing::warn!(
                "no --driver-root: claim specs give containers device nodes and environment but                  none of the driver's libraries or binaries (set kubeletPlugin.driverRoot)"
            );
        }
        return Ok((DriverInjection::devices_only(&args.dev_root), None));
    };
    let exe = std::env::current_exe().context("cannot find this program's own path")?;
    let config = DriverRootConfig {
        driver_root: driver_root.clone(),
        container_driver_root: args
            .container_driver_root
            .clone()
            .unwrap_or_else(|| driver_root.clone()),
        dev_root: args.dev_root.clone(),
        hook: match &args.cdi_hook_path {
            Some(path) => HookInstall::Installed(path.clone()),
            None => HookInstall::Copy {
                source: exe.with_file_name(HOOK_BINARY),
                target: injection::default_hook_install(
                    &args.kubelet_plugins_directory_path,
                    DRIVER_NAME,
                ),
            },
        },
    };
    let (injection, tools, summary) = injection::load(&config)
        .with_context(|| format!("--driver-root {}", driver_root.display()))?;
    tracing::info!(
        driver_root = %driver_root.display(),
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
    Ok((injection, Some(tools)))
}

/// The driver's own tools, from the driver root.
fn driver_gpu_control(tools: &DriverTools) -> SystemGpuControl {
    let tool = |path: &Option<std::path::PathBuf>, name: &str| {
        path.clone().unwrap_or_else(|| {
            tracing::warn!("the driver root has no {name}; sharing that needs it will fail");
            std::path::PathBuf::from(name)
        })
    };
    SystemGpuControl::with_programs(
        tool(&tools.nvidia_smi, "nvidia-smi"),
        tool(&tools.mps_control, "nvidia-cuda-mps-control"),
    )
    .with_library_path(&tools.library_path)
}

fn open_devices(args: &Args, tools: Option<&DriverTools>) -> anyhow::Result<Devices> {
    if let Some(topology) = &args.devices.topology {
        // Each node gets its own GPU and MIG UUIDs, as real nodes do.
        let source = MockSource::new(topology)
            .context("--topology")?
            .for_node(args.node_name.clone());
        let inventory = source.inventory().context("--topology")?;
        tracing::info!(
            source = %source.describe(),
            fake_driver = tools.is_some(),
            "GPU backend (mock: MIG simulated under the state directory, no health events; \
             sharing through the fake driver root's tools, or simulated without one)"
        );
        let gpu: Arc<dyn tessera_node::sharing::GpuControl> = match tools {
            Some(tools) => Arc::new(driver_gpu_control(tools)),
            None => Arc::new(SimulatedGpuControl::new(
                args.state_dir.join("simulated-gpu"),
            )),
        };
        return Ok(Devices {
            inventory: Arc::new(NodeInventory::read(Arc::new(source)).context("--topology")?),
            gpu,
            mig: Arc::new(SimulatedMig::persistent(
                &inventory,
                args.state_dir.join("simulated-mig.json"),
            )),
            health_events: None,
        });
    }
    let library = args
        .devices
        .nvml_lib
        .as_deref()
        .context("either --topology or --nvml-lib is required")?;
    let nvml = Arc::new(
        NvmlSource::open(Some(library))
            .context("--nvml-lib")?
            .with_sysfs(Sysfs::new(&args.sysfs_root)),
    );
    tracing::info!(source = %nvml.describe(), sysfs = %args.sysfs_root.display(), "GPU backend");
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
        inventory: Arc::new(
            NodeInventory::read(nvml.clone()).context("cannot read the GPUs through NVML")?,
        ),
        gpu: match tools {
            Some(tools) => Arc::new(driver_gpu_control(tools)),
            None => Arc::new(SystemGpuControl::default()),
        },
        mig: nvml,
        health_events,
    })
}

/// The API server clients: `requests` bounds every call by `--api-timeout` (claims, slices,
/// events); `watches` keeps kube's long read timeout, which the Node watch needs (the server
/// holds a watch open for minutes).
struct Clients {
    requests: kube::Client,
    watches: kube::Client,
}

async fn kube_clients(args: &Args) -> anyhow::Result<Clients> {
    let config = match args.kubeconfig.as_deref() {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        None => kube::Config::incluster()
            .context("no --kubeconfig, and the in-cluster configuration is not available")?,
    };
    // A backstop for calls without a deadline of their own; claim reads time out at
    // `--api-timeout` with a message that says so.
    let backstop = args.api_timeout + std::time::Duration::from_secs(2);
    let mut bounded = config.clone();
    bounded.connect_timeout = Some(args.api_timeout);
    bounded.read_timeout = Some(backstop);
    bounded.write_timeout = Some(backstop);
    Ok(Clients {
        requests: kube::Client::try_from(bounded).context("cannot build the Kubernetes client")?,
        watches: kube::Client::try_from(config).context("cannot build the Kubernetes client")?,
    })
}

/// Starts claim preparation: loads the checkpoint and recovers from whatever a previous run
/// left (see `tessera_node::driver`).
async fn start_driver(
    args: &Args,
    client: &kube::Client,
    devices: &Devices,
    injection: DriverInjection,
) -> anyhow::Result<NodeDriver> {
    let mig_mode = if args.dynamic_mig {
        MigMode::Dynamic
    } else {
        MigMode::Static
    };
    let config = NodeDriverConfig::new(&args.node_name, &args.cdi_root, &args.state_dir)
        .mig_mode(mig_mode)
        .injection(injection);
    let parts = DriverParts {
        inventory: Arc::clone(&devices.inventory),
        claims: Arc::new(KubeClaimSource::new(client.clone()).timeout(args.api_timeout)),
        gpu: Arc::clone(&devices.gpu),
        mig: Arc::clone(&devices.mig),
    };
    let (driver, report) = NodeDriver::start(config, parts)
        .await
        .context("cannot start claim preparation")?;
    tracing::info!(checkpoint = %driver.checkpoint_path().display(), report = ?report, "claim preparation recovered its state");
    for error in &report.errors {
        tracing::warn!(%error, "recovery left a problem for a later retry");
    }
    Ok(driver)
}

async fn run(args: Args) -> anyhow::Result<()> {
    let clients = kube_clients(&args).await?;
    let client = clients.requests.clone();
    let (injection, tools) = load_driver_root(&args)?;
    let devices = open_devices(&args, tools.as_ref())?;
    let mut registry = Registry::default();
    let metrics = NodeMetrics::new(&mut registry);
    let findings = SharedFindings::default();
    let (kubelet_health, kubelet_health_feed) = watch::channel(Vec::new());

    let driver = start_driver(&args, &client, &devices, injection).await?;
    let recovery = driver.recovery();
    let driver = InstrumentedDriver::new(driver, metrics.clone(), Some(NodeDriver::stats));
    let plugin = PluginConfig::new(DRIVER_NAME)
        .registrar_dir(&args.kubelet_registrar_directory_path)
        .plugins_dir(&args.kubelet_plugins_directory_path)
        .shutdown_grace(args.shutdown_grace)
        // The driver locks per claim: calls on other claims need not wait for each other.
        .serialize_calls(false)
        .bind(Arc::new(WithDeviceHealth::new(driver, kubelet_health_feed)))
        .context("cannot set up the kubelet plugin sockets")?;

    let (stop, stopped) = watch::channel(false);
    let until_stopped = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }
    };
    let mut liveness = Liveness::default();

    let (node, node_watch) = watch_node(clients.watches.clone(), &args.node_name);
    let (published, published_feed) = watch::channel(false);
    let publisher_heartbeat = Heartbeat::new("publish loop", max_silence(args.rescan_interval));
    liveness.watch(publisher_heartbeat.clone());
    let publish_loop = PublishLoop {
        publisher: Publisher::new(
            client.clone(),
            PublisherConfig {
                node_name: args.node_name.clone(),
                driver_name: DRIVER_NAME.to_owned(),
                dynamic_mig: args.dynamic_mig,
            },
            metrics.clone(),
        ),
        inventory: Arc::clone(&devices.inventory),
        findings: findings.clone(),
        node,
        registration: plugin.registration_state(),
        kubelet_health,
        published,
        metrics: metrics.clone(),
        heartbeat: publisher_heartbeat,
        rescan_interval: args.rescan_interval,
    };
    let publishing = tokio::spawn(publish_loop.run(until_stopped()));

    let monitor_stop = Arc::new(AtomicBool::new(false));
    let monitoring = devices.health_events.map(|events| {
        let heartbeat = Heartbeat::new("health monitor", MAX_SILENCE);
        liveness.watch(heartbeat.clone());
        HealthMonitor {
            source: Box::new(events),
            findings: findings.clone(),
            metrics: metrics.clone(),
            heartbeat,
            settings: HealthSettings {
                ignored_xids: args.ignored_xids.iter().copied().collect(),
                recover_after: args.health_recovery_after,
            },
        }
        .spawn(Arc::clone(&monitor_stop))
    });

    let serving_endpoints = match args.metrics_address.0 {
        Some(address) => {
            let listener = endpoints::bind(address).await?;
            tracing::info!(%address, "serving /metrics, /healthz and /readyz");
            let state = EndpointState {
                registry: Arc::new(registry),
                liveness,
                readiness: Readiness {
                    registration: plugin.registration_state(),
                    published: published_feed,
                    recovery,
                },
            };
            Some(tokio::spawn(endpoints::serve(
                listener,
                state,
                until_stopped(),
            )))
        }
        None => None,
    };

    tracing::info!(node = %args.node_name, driver = DRIVER_NAME, "tessera-kubelet-plugin running");
    let served = plugin.serve(termination()).await;

    stop.send_replace(true);
    monitor_stop.store(true, Ordering::Relaxed);
    node_watch.abort();
    if publishing.await.is_err() {
        tracing::error!("the publish loop panicked");
    }
    if let Some(monitoring) = monitoring
        && monitoring.await.is_err()
    {
        tracing::error!("the health monitor panicked");
    }
    if let Some(serving) = serving_endpoints {
        match serving.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::error!(%error, "the HTTP endpoints failed"),
            Err(_) => tracing::error!("the HTTP endpoints panicked"),
        }
    }
    served.context("the kubelet plugin stopped with an error")?;
    tracing::info!("tessera-kubelet-plugin stopped");
    Ok(())
}

/// Completes on SIGTERM or SIGINT.
async fn termination() {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM; only SIGINT stops the plugin");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
