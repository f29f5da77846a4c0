//! Command-line flags of `tessera-kubelet-plugin`. Every flag has an environment variable; the
//! names follow the conventions DRA drivers already use.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args as ClapArgs, Parser, ValueEnum};
use tessera_api::DRIVER_NAME;
use tessera_api::shares::ConsumableShares;
use tessera_driver_root::edits::HOOK_BINARY;
use tessera_kubelet::{DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRAR_DIR};
use tessera_node::gpu_metrics::idle::IdleSettings;
use tessera_node::gpu_metrics::monitor::GpuMonitorSettings;
use tessera_node::health::monitor::HealthSettings;
use tessera_node::injection::{self, DriverRootConfig, HookInstall};
use tessera_node::{DeviceBackend as Backend, MpsPodSettings, NodePluginConfig};
use tessera_runtime::{LogFormat, parse_duration};

/// Tessera's node plugin: publishes this node's GPUs as ResourceSlices, prepares allocated
/// claims for containers (CDI) and reports device health to the kubelet.
#[derive(Debug, Parser)]
#[command(name = "tessera-kubelet-plugin", version, max_term_width = 100)]
pub struct Args {
    /// The node this plugin runs on (usually from the downward API: spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,

    /// Kubeconfig to reach the API server; the in-cluster service account when absent.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Directory the kubelet watches for plugin registration sockets.
    #[arg(long, env = "KUBELET_REGISTRAR_DIRECTORY_PATH", default_value = DEFAULT_REGISTRAR_DIR)]
    pub kubelet_registrar_directory_path: PathBuf,

    /// The kubelet's plugins directory; the DRA socket goes into `<dir>/gpu.tessera.dev/`.
    #[arg(long, env = "KUBELET_PLUGINS_DIRECTORY_PATH", default_value = DEFAULT_PLUGINS_DIR)]
    pub kubelet_plugins_directory_path: PathBuf,

    /// Directory of CDI specs the container runtime reads.
    #[arg(long, env = "CDI_ROOT", default_value = "/var/run/cdi")]
    pub cdi_root: PathBuf,

    /// Directory of the plugin's state (checkpoint, MPS directories); must survive restarts.
    #[arg(long, env = "STATE_DIR", default_value = "/var/lib/tessera")]
    pub state_dir: PathBuf,

    #[command(flatten)]
    pub devices: DeviceBackend,

    /// Host directory of the NVIDIA driver's files: `/` for a host install, `/run/nvidia/driver`
    /// for the GPU operator's driver container, `/home/kubernetes/bin/nvidia` on GKE, a fake
    /// driver root on mock nodes. Claim specs then inject its libraries, binaries and firmware,
    /// and time-slicing and MPS run its nvidia-smi and nvidia-cuda-mps-control. Without it, specs
    /// carry device nodes and environment only.
    #[arg(long, env = "NVIDIA_DRIVER_ROOT")]
    pub driver_root: Option<PathBuf>,

    /// Where this process sees the driver root (the chart mounts it at /driver-root); defaults
    /// to --driver-root.
    #[arg(long, env = "CONTAINER_DRIVER_ROOT", requires = "driver_root")]
    pub container_driver_root: Option<PathBuf>,

    /// The CDI hook (`tessera-cdi-hook`) already installed on the host at this path. By default
    /// the plugin copies the one next to its own program into its directory under
    /// --kubelet-plugins-directory-path.
    #[arg(long, env = "CDI_HOOK_PATH", requires = "driver_root")]
    pub cdi_hook_path: Option<PathBuf>,

    /// Host directory the driver's device nodes are under (`<dir>/dev/nvidia0`): `/` on real
    /// nodes, the stand-in device root on mock nodes. This process must see it at the same path.
    #[arg(long, env = "NVIDIA_DEV_ROOT", default_value = "/")]
    pub dev_root: PathBuf,

    /// Where each MPS claim's control daemon runs. `process`: a daemon the plugin starts (it
    /// outlives the plugin process, not its container). `pod`: a pod of its own on this node
    /// running `tessera-mps-daemon` from --mps-daemon-image, which outlives plugin restarts and
    /// DaemonSet rollouts; needs --driver-root, --mps-daemon-image and --namespace.
    #[arg(long, env = "MPS_DAEMONS", value_enum, default_value_t = MpsDaemons::Process)]
    pub mps_daemons: MpsDaemons,

    /// The image of MPS daemon pods (the plugin's own: it holds tessera-mps-daemon).
    #[arg(long, env = "MPS_DAEMON_IMAGE")]
    pub mps_daemon_image: Option<String>,

    /// The priority class of MPS daemon pods (the chart: system-node-critical).
    #[arg(long, env = "MPS_DAEMON_PRIORITY_CLASS")]
    pub mps_daemon_priority_class: Option<String>,

    /// The namespace of MPS daemon pods (the plugin's own, from the downward API).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,

    /// Root of the sysfs tree the NVML backend reads PCIe roots and NUMA nodes from.
    #[arg(long, env = "SYSFS_ROOT", default_value = "/sys")]
    pub sysfs_root: PathBuf,

    /// Publish MIG-enabled GPUs as partitionable devices and create MIG instances on prepare.
    #[arg(long, env = "DYNAMIC_MIG")]
    pub dynamic_mig: bool,

    /// Share GPUs (and static MIG devices) between claims (KEP-5075 consumable capacity):
    /// `disabled`; `unlimited` (a claim consumes the `memory` it asks for, none if it asks for
    /// none); `memory` (an unset request takes all the memory); or a number N of equal `shares`
    /// (the device plugin's `replicas`). Devices are published with `allowMultipleAllocations`.
    #[arg(long, env = "CONSUMABLE_SHARES", default_value = "disabled")]
    pub consumable_shares: ConsumableShares,

    /// How often the GPU inventory is re-read (and the published slices checked), e.g. `30s`,
    /// `500ms`, `2m`.
    #[arg(long, env = "RESCAN_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub rescan_interval: Duration,

    /// XIDs that never taint a device (comma-separated), for XIDs a site knows to be harmless
    /// on its hardware, e.g. `74,92`.
    #[arg(long, env = "IGNORED_XIDS", value_delimiter = ',')]
    pub ignored_xids: Vec<u64>,

    /// A device's XID/ECC taint goes once no health event confirmed it for this long, e.g.
    /// `10m`; unset, it stays until the plugin restarts (after the GPU reset or reboot such
    /// errors need).
    #[arg(long, env = "HEALTH_RECOVERY_AFTER", value_parser = parse_duration)]
    pub health_recovery_after: Option<Duration>,

    /// How often every GPU is sampled for the per-device metrics (utilization, memory, power,
    /// temperature, ECC and XID counts, labelled with the pod and claim holding the device).
    /// Needs NVML: the backend's, or on a mock node a fake driver root's.
    #[arg(long, env = "GPU_METRICS_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub gpu_metrics_interval: Duration,

    /// A claim whose GPUs all stay below this utilization (percent) for --idle-window is idle:
    /// a `GPUIdle` Event on its pods and `tessera_node_idle_claim` 1. 0 turns detection off.
    #[arg(long, env = "IDLE_THRESHOLD", default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub idle_threshold: u32,

    /// How long a claim's GPUs must stay below --idle-threshold to be idle, e.g. `30m`.
    #[arg(long, env = "IDLE_WINDOW", default_value = "30m", value_parser = parse_duration)]
    pub idle_window: Duration,

    /// Address of /metrics, /healthz and /readyz; empty turns them off.
    #[arg(long, env = "METRICS_ADDRESS", default_value = "0.0.0.0:8080", value_parser = parse_address)]
    pub metrics_address: OptionalAddress,

    /// How long one API server request may take (claim reads, slice writes); keep it well
    /// inside the kubelet's 45 s deadline for prepare, so a hung API server fails the claim in
    /// time for the kubelet's retry.
    #[arg(long, env = "API_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub api_timeout: Duration,

    /// How long in-flight prepare/unprepare calls may run after SIGTERM before they are cut
    /// off (keep below the pod's terminationGracePeriodSeconds).
    #[arg(long, env = "SHUTDOWN_GRACE", default_value = "20s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Where the GPUs come from: exactly one of the two.
#[derive(Debug, Clone, ClapArgs)]
#[group(required = true, multiple = false)]
pub struct DeviceBackend {
    /// Mock backend: a shipped topology (dgx-h100, hgx-a100-mig, pcie-l40s,
    /// pcie-a100-nvlink-pairs, gb200-tray) or a topology file. GPU and MIG UUIDs are derived
    /// from the node name, so nodes sharing a topology do not share UUIDs.
    #[arg(long, env = "TOPOLOGY")]
    pub topology: Option<String>,

    /// NVML backend: path of libnvidia-ml.so.1 (on the host driver root).
    #[arg(long, env = "NVML_LIB")]
    pub nvml_lib: Option<PathBuf>,
}

/// `--metrics-address`: an address, or none (empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionalAddress(pub Option<SocketAddr>);

/// Where MPS control daemons run (`--mps-daemons`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MpsDaemons {
    /// A process started by the plugin (`nvidia-cuda-mps-control -d`).
    Process,
    /// A pod of its own per claim.
    Pod,
}

fn parse_address(text: &str) -> Result<OptionalAddress, String> {
    if text.trim().is_empty() {
        return Ok(OptionalAddress(None));
    }
    text.parse::<SocketAddr>()
        .map(|a| OptionalAddress(Some(a)))
        .map_err(|_| format!("`{text}` is not an address such as 0.0.0.0:8080 (or empty, to turn the endpoints off)"))
}

impl Args {
    /// What the node plugin runs with.
    pub fn plugin_config(&self) -> anyhow::Result<NodePluginConfig> {
        let devices = match (&self.devices.topology, &self.devices.nvml_lib) {
            (Some(topology), _) => Backend::Mock {
                topology: topology.clone(),
            },
            (None, Some(library)) => Backend::Nvml {
                library: library.clone(),
                sysfs_root: self.sysfs_root.clone(),
            },
            (None, None) => anyhow::bail!("either --topology or --nvml-lib is required"),
        };
        let driver_root = match &self.driver_root {
            None => None,
            Some(driver_root) => Some(DriverRootConfig {
                driver_root: driver_root.clone(),
                container_driver_root: self
                    .container_driver_root
                    .clone()
                    .unwrap_or_else(|| driver_root.clone()),
                dev_root: self.dev_root.clone(),
                hook: match &self.cdi_hook_path {
                    Some(path) => HookInstall::Installed(path.clone()),
                    None => HookInstall::Copy {
                        source: std::env::current_exe()
                            .context("cannot find this program's own path")?
                            .with_file_name(HOOK_BINARY),
                        target: injection::default_hook_install(
                            &self.kubelet_plugins_directory_path,
                            DRIVER_NAME,
                        ),
                    },
                },
            }),
        };
        Ok(NodePluginConfig {
            node_name: self.node_name.clone(),
            kubelet_registrar_dir: self.kubelet_registrar_directory_path.clone(),
            kubelet_plugins_dir: self.kubelet_plugins_directory_path.clone(),
            cdi_root: self.cdi_root.clone(),
            state_dir: self.state_dir.clone(),
            devices,
            driver_root,
            dev_root: self.dev_root.clone(),
            dynamic_mig: self.dynamic_mig,
            consumable_shares: self.consumable_shares,
            health: HealthSettings {
                ignored_xids: self.ignored_xids.iter().copied().collect(),
                recover_after: self.health_recovery_after,
            },
            rescan_interval: self.rescan_interval,
            metrics_address: self.metrics_address.0,
            api_timeout: self.api_timeout,
            shutdown_grace: self.shutdown_grace,
            mps_pods: self.mps_pods()?,
            gpu_metrics: GpuMonitorSettings {
                interval: self.gpu_metrics_interval,
                idle: (self.idle_threshold > 0).then_some(IdleSettings {
                    threshold_percent: self.idle_threshold,
                    window: self.idle_window,
                }),
            },
        })
    }

    /// MPS daemon pods (`--mps-daemons=pod`), or `None` for daemons as processes.
    fn mps_pods(&self) -> anyhow::Result<Option<MpsPodSettings>> {
        if self.mps_daemons == MpsDaemons::Process {
            return Ok(None);
        }
        anyhow::ensure!(
            self.driver_root.is_some(),
            "--mps-daemons=pod needs --driver-root (the daemon pods run its tools)"
        );
        Ok(Some(MpsPodSettings {
            image: self
                .mps_daemon_image
                .clone()
                .context("--mps-daemons=pod needs --mps-daemon-image (the plugin's own image)")?,
            namespace: self
                .namespace
                .clone()
                .context("--mps-daemons=pod needs --namespace (POD_NAMESPACE)")?,
            priority_class: self.mps_daemon_priority_class.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn duration_flags_refuse_zero_and_overflow_with_an_error() {
        let base = ["p", "--node-name", "n", "--topology", "dgx-h100"];
        let args = Args::try_parse_from(base.iter().copied().chain(["--rescan-interval", "500ms"]))
            .unwrap();
        assert_eq!(args.rescan_interval, Duration::from_millis(500));
        for (flag, value) in [
            ("--rescan-interval", "0s"),
            ("--rescan-interval", "999999999999999999m"),
            ("--shutdown-grace", "-1s"),
            ("--shutdown-grace", "1.5.s"),
        ] {
            let argument = format!("{flag}={value}");
            let error =
                Args::try_parse_from(base.iter().copied().chain([argument.as_str()])).unwrap_err();
            let text = error.to_string();
            assert!(text.contains(flag) && text.contains(value), "{text}");
        }
    }

    #[test]
    fn exactly_one_backend_and_defaults() {
        let args =
            Args::try_parse_from(["p", "--node-name", "n", "--topology", "dgx-h100"]).unwrap();
        assert_eq!(
            args.metrics_address,
            OptionalAddress(Some("0.0.0.0:8080".parse().unwrap()))
        );
        assert_eq!(args.cdi_root, PathBuf::from("/var/run/cdi"));
        assert_eq!(args.driver_root, None);
        assert_eq!(args.dev_root, PathBuf::from("/"));
        assert!(
            Args::try_parse_from([
                "p",
                "--node-name",
                "n",
                "--topology",
                "x",
                "--container-driver-root",
                "/driver-root"
            ])
            .is_err(),
            "a container view of no driver root is a mistake"
        );
        assert_eq!(args.rescan_interval, Duration::from_secs(30));
        let config = args.plugin_config().unwrap();
        assert_eq!(
            config.gpu_metrics,
            GpuMonitorSettings::default(),
            "the documented defaults: every 10s, idle below 5% for 30m"
        );
        let no_idle = Args::try_parse_from([
            "p",
            "--node-name",
            "n",
            "--topology",
            "x",
            "--idle-threshold",
            "0",
        ])
        .unwrap();
        assert_eq!(no_idle.plugin_config().unwrap().gpu_metrics.idle, None);
        assert!(
            Args::try_parse_from([
                "p",
                "--node-name",
                "n",
                "--topology",
                "x",
                "--idle-threshold",
                "101"
            ])
            .is_err()
        );
        assert!(matches!(config.devices, Backend::Mock { ref topology } if topology == "dgx-h100"));
        assert_eq!(
            config.metrics_address,
            Some("0.0.0.0:8080".parse().unwrap())
        );
        let none = Args::try_parse_from([
            "p",
            "--node-name",
            "n",
            "--topology",
            "x",
            "--metrics-address",
            "",
        ])
        .unwrap();
        assert_eq!(none.metrics_address, OptionalAddress(None));
        assert!(Args::try_parse_from(["p", "--node-name", "n"]).is_err());
        assert!(
            Args::try_parse_from([
                "p",
                "--node-name",
                "n",
                "--topology",
                "x",
                "--nvml-lib",
                "/l.so"
            ])
            .is_err()
        );
    }
}
