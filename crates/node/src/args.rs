//! Command-line flags of `tessera-kubelet-plugin`. Every flag has an environment variable,
//! `TESSERA_<FLAG>`; [`renamed`] lists the names older releases read, still accepted
//! (`tessera_process::env`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{ArgAction, Args as ClapArgs, Parser, ValueEnum};
use tessera_api::DRIVER_NAME;
use tessera_api::shares::ConsumableShares;
use tessera_driver_root::edits::HOOK_BINARY;
use tessera_kubelet_grpc::{DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRAR_DIR};
use tessera_node::NodePluginConfig;
use tessera_node::backend::driver_root::{
    DriverRootPath, DriverRoots, HookInstall, default_hook_install,
};
use tessera_node::backend::{BackendConfig, GpuBackend, MpsPodSettings};
use tessera_node::gpu_metrics::idle::IdleSettings;
use tessera_node::gpu_metrics::monitor::GpuMonitorSettings;
use tessera_node::health::monitor::HealthSettings;
use tessera_process::{COMMON_RENAMED, ClientArgs, LogArgs, Renamed, parse_duration};

/// The downward API's `NODE_NAME` and `POD_NAMESPACE`, accepted without a warning (they are
/// Kubernetes' convention), and the old names that are not simply prefixed.
const RENAMED: [Renamed; 4] = [
    Renamed::convention("NODE_NAME", "TESSERA_NODE_NAME"),
    Renamed::convention("POD_NAMESPACE", "TESSERA_NAMESPACE"),
    Renamed::deprecated("NVIDIA_DRIVER_ROOT", "TESSERA_DRIVER_ROOT"),
    Renamed::deprecated("NVIDIA_DEV_ROOT", "TESSERA_DEV_ROOT"),
];

/// The other names older releases read, each now with the `TESSERA_` prefix.
const PREFIXED: [Renamed; 20] = tessera_process::deprecated_bare_names![
    "KUBELET_REGISTRAR_DIRECTORY_PATH",
    "KUBELET_PLUGINS_DIRECTORY_PATH",
    "CDI_ROOT",
    "STATE_DIR",
    "CONTAINER_DRIVER_ROOT",
    "CDI_HOOK_PATH",
    "MPS_DAEMONS",
    "MPS_DAEMON_IMAGE",
    "MPS_DAEMON_PRIORITY_CLASS",
    "SYSFS_ROOT",
    "DYNAMIC_MIG",
    "CONSUMABLE_SHARES",
    "RESCAN_INTERVAL",
    "IGNORED_XIDS",
    "HEALTH_RECOVERY_AFTER",
    "METRICS_ADDRESS",
    "API_TIMEOUT",
    "SHUTDOWN_GRACE",
    "TOPOLOGY",
    "NVML_LIB",
];

/// [`RENAMED`], [`PREFIXED`] and the names every binary accepts (`KUBECONFIG`, `LOG_FORMAT`).
pub fn renamed() -> Vec<Renamed> {
    RENAMED
        .iter()
        .chain(&PREFIXED)
        .chain(&COMMON_RENAMED)
        .copied()
        .collect()
}

/// The plugin's default `--metrics-address`: the chart's port (8081), so that a plugin started
/// by hand and one started by the chart answer on the same port; the controller keeps 8080.
pub const DEFAULT_METRICS_ADDRESS: &str = "0.0.0.0:8081";

/// Tessera's node plugin: publishes this node's GPUs as ResourceSlices, prepares allocated
/// claims for containers (CDI) and reports device health to the kubelet.
#[derive(Debug, Parser)]
#[command(
    name = "tessera-kubelet-plugin",
    version,
    long_version = tessera_process::build::LONG_VERSION,
    max_term_width = 100,
    after_help = "Every flag can also be set by its environment variable (shown with each flag). \
                  Names older releases read (TOPOLOGY, STATE_DIR, LOG_FORMAT, ...) still work \
                  and log a deprecation warning; NODE_NAME, POD_NAMESPACE and KUBECONFIG are \
                  read as Kubernetes' conventions."
)]
pub struct Args {
    /// The node this plugin runs on (usually from the downward API: spec.nodeName)
    /// [also read from $NODE_NAME].
    #[arg(long, env = "TESSERA_NODE_NAME")]
    pub node_name: String,

    #[command(flatten)]
    pub client: ClientArgs,

    /// This plugin pod's `metadata.uid` (from the downward API). Set, the kubelet sockets get
    /// per-pod names, so two plugin pods serve a node side by side during a DaemonSet rolling
    /// update with `maxSurge` (kubelet 1.33+) and the kubelet switches to the newer one; they
    /// share the state directory and take turns on it. Unset, the sockets have fixed names and
    /// one plugin per node may run at a time.
    #[arg(long, env = "TESSERA_POD_UID")]
    pub pod_uid: Option<String>,

    /// Directory the kubelet watches for plugin registration sockets.
    #[arg(long, env = "TESSERA_KUBELET_REGISTRAR_DIRECTORY_PATH", default_value = DEFAULT_REGISTRAR_DIR)]
    pub kubelet_registrar_directory_path: PathBuf,

    /// The kubelet's plugins directory; the DRA socket goes into `<dir>/gpu.tessera.dev/`.
    #[arg(long, env = "TESSERA_KUBELET_PLUGINS_DIRECTORY_PATH", default_value = DEFAULT_PLUGINS_DIR)]
    pub kubelet_plugins_directory_path: PathBuf,

    /// Directory of CDI specs the container runtime reads.
    #[arg(long, env = "TESSERA_CDI_ROOT", default_value = "/var/run/cdi")]
    pub cdi_root: PathBuf,

    /// Directory of the plugin's state (checkpoint, MPS directories); must survive restarts.
    #[arg(long, env = "TESSERA_STATE_DIR", default_value = "/var/lib/tessera")]
    pub state_dir: PathBuf,

    #[command(flatten)]
    pub devices: BackendArgs,

    /// Host directory of the NVIDIA driver's files: `/` for a host install, `/run/nvidia/driver`
    /// for the GPU operator's driver container, `/home/kubernetes/bin/nvidia` on GKE, a fake
    /// driver root on mock nodes. Claim specs then inject its libraries, binaries and firmware,
    /// and time-slicing and MPS run its nvidia-smi and nvidia-cuda-mps-control. Without it, specs
    /// carry device nodes and environment only. Given more than once (or comma-separated), the
    /// candidates in order of preference: the plugin uses the first that holds a complete
    /// driver, waits while none does, and moves to a preferred one that gets a driver later (the
    /// chart's default: /run/nvidia/driver, then /).
    #[arg(long, env = "TESSERA_DRIVER_ROOT", value_delimiter = ',', action = ArgAction::Append)]
    pub driver_root: Vec<PathBuf>,

    /// Where this process sees the driver root (the chart mounts / at /driver-root); defaults
    /// to --driver-root. With several driver roots, one for each, in the same order.
    #[arg(
        long,
        env = "TESSERA_CONTAINER_DRIVER_ROOT",
        requires = "driver_root",
        value_delimiter = ',',
        action = ArgAction::Append
    )]
    pub container_driver_root: Vec<PathBuf>,

    /// The CDI hook (`tessera-cdi-hook`) already installed on the host at this path. By default
    /// the plugin copies the one next to its own program into its directory under
    /// --kubelet-plugins-directory-path.
    #[arg(long, env = "TESSERA_CDI_HOOK_PATH", requires = "driver_root")]
    pub cdi_hook_path: Option<PathBuf>,

    /// Host directory the driver's device nodes are under (`<dir>/dev/nvidia0`): `/` on real
    /// nodes, the stand-in device root on mock nodes. This process must see it at the same path.
    #[arg(long, env = "TESSERA_DEV_ROOT", default_value = "/")]
    pub dev_root: PathBuf,

    /// Where each MPS claim's control daemon runs. `process`: a daemon the plugin starts (it
    /// outlives the plugin process, not its container). `pod`: a pod of its own on this node
    /// running `tessera-mps-daemon` from --mps-daemon-image, which outlives plugin restarts and
    /// DaemonSet rollouts; needs --driver-root, --mps-daemon-image and --namespace.
    #[arg(long, env = "TESSERA_MPS_DAEMONS", value_enum, default_value_t = MpsDaemons::Process)]
    pub mps_daemons: MpsDaemons,

    /// The image of MPS daemon pods (the plugin's own: it holds tessera-mps-daemon).
    #[arg(long, env = "TESSERA_MPS_DAEMON_IMAGE")]
    pub mps_daemon_image: Option<String>,

    /// The priority class of MPS daemon pods (the chart: system-node-critical).
    #[arg(long, env = "TESSERA_MPS_DAEMON_PRIORITY_CLASS")]
    pub mps_daemon_priority_class: Option<String>,

    /// The namespace of MPS daemon pods (the plugin's own, from the downward API)
    /// [also read from $POD_NAMESPACE].
    #[arg(long, env = "TESSERA_NAMESPACE")]
    pub namespace: Option<String>,

    /// Root of the sysfs tree the NVML backend reads PCIe roots and NUMA nodes from.
    #[arg(long, env = "TESSERA_SYSFS_ROOT", default_value = "/sys")]
    pub sysfs_root: PathBuf,

    /// Publish MIG-enabled GPUs as partitionable devices and create MIG instances on prepare.
    #[arg(long, env = "TESSERA_DYNAMIC_MIG")]
    pub dynamic_mig: bool,

    /// Share GPUs (and static MIG devices) between claims (KEP-5075 consumable capacity):
    /// `disabled`; `unlimited` (a claim consumes the `memory` it asks for, none if it asks for
    /// none); `memory` (an unset request takes all the memory); or a number N of equal `shares`
    /// (the device plugin's `replicas`). Devices are published with `allowMultipleAllocations`.
    #[arg(long, env = "TESSERA_CONSUMABLE_SHARES", default_value = "disabled")]
    pub consumable_shares: ConsumableShares,

    /// How often the GPU inventory is re-read (and the published slices checked), e.g. `30s`,
    /// `500ms`, `2m`.
    #[arg(long, env = "TESSERA_RESCAN_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub rescan_interval: Duration,

    /// XIDs that never taint a device (comma-separated), for XIDs a site knows to be harmless
    /// on its hardware, e.g. `74,92`.
    #[arg(long, env = "TESSERA_IGNORED_XIDS", value_delimiter = ',')]
    pub ignored_xids: Vec<u64>,

    /// A device's XID/ECC taint goes once no health event confirmed it for this long, e.g.
    /// `10m`; unset, it stays until the plugin restarts (after the GPU reset or reboot such
    /// errors need).
    #[arg(long, env = "TESSERA_HEALTH_RECOVERY_AFTER", value_parser = parse_duration)]
    pub health_recovery_after: Option<Duration>,

    /// How often every GPU is sampled for the per-device metrics (utilization, memory, power,
    /// temperature, ECC and XID counts, labelled with the pod and claim holding the device).
    /// Needs NVML: the backend's, or on a mock node a fake driver root's.
    #[arg(long, env = "TESSERA_GPU_METRICS_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub gpu_metrics_interval: Duration,

    /// A claim whose GPUs all stay below this utilization (percent) for --idle-window is idle:
    /// a `GPUIdle` Event on its pods and `tessera_node_idle_claim` 1. 0 turns detection off.
    #[arg(long, env = "TESSERA_IDLE_THRESHOLD", default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub idle_threshold: u32,

    /// How long a claim's GPUs must stay below --idle-threshold to be idle, e.g. `30m`.
    #[arg(long, env = "TESSERA_IDLE_WINDOW", default_value = "30m", value_parser = parse_duration)]
    pub idle_window: Duration,

    /// Address of /metrics, /healthz and /readyz; empty turns them off.
    #[arg(long, env = "TESSERA_METRICS_ADDRESS", default_value = DEFAULT_METRICS_ADDRESS, value_parser = parse_address)]
    pub metrics_address: OptionalAddress,

    /// How long one API server request may take (claim reads, slice writes); keep it well
    /// inside the kubelet's 45 s deadline for prepare, so a hung API server fails the claim in
    /// time for the kubelet's retry.
    #[arg(long, env = "TESSERA_API_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub api_timeout: Duration,

    /// How long in-flight prepare/unprepare calls may run after SIGTERM before they are cut
    /// off (keep below the pod's terminationGracePeriodSeconds).
    #[arg(long, env = "TESSERA_SHUTDOWN_GRACE", default_value = "20s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    #[command(flatten)]
    pub log: LogArgs,
}

/// Where the GPUs come from: a topology (mock), else NVML from --nvml-lib, else NVML from the
/// driver root's libnvidia-ml.so.1.
#[derive(Debug, Clone, ClapArgs)]
#[group(required = false, multiple = false)]
pub struct BackendArgs {
    /// Mock backend: a shipped topology (dgx-h100, hgx-a100-mig, pcie-l40s,
    /// pcie-a100-nvlink-pairs, gb200-tray) or a topology file. GPU and MIG UUIDs are derived
    /// from the node name, so nodes sharing a topology do not share UUIDs.
    #[arg(long, env = "TESSERA_TOPOLOGY")]
    pub topology: Option<String>,

    /// NVML backend: path of libnvidia-ml.so.1 as this process sees it. Without it and without
    /// --topology, the NVML backend loads the libnvidia-ml.so.1 it finds under --driver-root
    /// (through the root's loader cache, so /usr/lib/aarch64-linux-gnu on arm64 nodes).
    #[arg(long, env = "TESSERA_NVML_LIB")]
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
            (Some(topology), _) => GpuBackend::Mock {
                topology: topology.clone(),
            },
            (None, library) => {
                anyhow::ensure!(
                    library.is_some() || !self.driver_root.is_empty(),
                    "no GPUs to publish: pass --topology (mock), --nvml-lib or --driver-root (NVML)"
                );
                GpuBackend::Nvml {
                    library: library.clone(),
                    sysfs_root: self.sysfs_root.clone(),
                }
            }
        };
        let driver_root = self.driver_roots()?;
        Ok(NodePluginConfig {
            node_name: self.node_name.clone(),
            pod_uid: self.pod_uid.clone().filter(|uid| !uid.is_empty()),
            kubelet_registrar_dir: self.kubelet_registrar_directory_path.clone(),
            kubelet_plugins_dir: self.kubelet_plugins_directory_path.clone(),
            cdi_root: self.cdi_root.clone(),
            state_dir: self.state_dir.clone(),
            backend: BackendConfig {
                devices,
                driver_root,
                dev_root: self.dev_root.clone(),
                mps_pods: self.mps_pods()?,
            },
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
            gpu_metrics: GpuMonitorSettings {
                interval: self.gpu_metrics_interval,
                idle: (self.idle_threshold > 0).then_some(IdleSettings {
                    threshold_percent: self.idle_threshold,
                    window: self.idle_window,
                }),
            },
        })
    }

    /// The driver root candidates (`--driver-root`, `--container-driver-root`), or `None`.
    fn driver_roots(&self) -> anyhow::Result<Option<DriverRoots>> {
        if self.driver_root.is_empty() {
            return Ok(None);
        }
        let seen = &self.container_driver_root;
        anyhow::ensure!(
            seen.is_empty() || seen.len() == self.driver_root.len(),
            "--container-driver-root is given {} time(s) for {} --driver-root(s): give it once \
             for each driver root, in the same order, or not at all (each is then seen at its \
             host path)",
            seen.len(),
            self.driver_root.len()
        );
        let candidates = self
            .driver_root
            .iter()
            .enumerate()
            .map(|(i, host)| DriverRootPath {
                host: host.clone(),
                container: seen.get(i).unwrap_or(host).clone(),
            })
            .collect();
        let hook = match &self.cdi_hook_path {
            Some(path) => HookInstall::Installed(path.clone()),
            None => HookInstall::Copy {
                source: std::env::current_exe()
                    .context("cannot find this program's own path")?
                    .with_file_name(HOOK_BINARY),
                target: default_hook_install(&self.kubelet_plugins_directory_path, DRIVER_NAME),
            },
        };
        Ok(Some(DriverRoots {
            candidates,
            dev_root: self.dev_root.clone(),
            hook,
        }))
    }

    /// MPS daemon pods (`--mps-daemons=pod`), or `None` for daemons as processes.
    fn mps_pods(&self) -> anyhow::Result<Option<MpsPodSettings>> {
        if self.mps_daemons == MpsDaemons::Process {
            return Ok(None);
        }
        anyhow::ensure!(
            !self.driver_root.is_empty(),
            "--mps-daemons=pod needs --driver-root (the daemon pods run its tools)"
        );
        Ok(Some(MpsPodSettings {
            image: self
                .mps_daemon_image
                .clone()
                .context("--mps-daemons=pod needs --mps-daemon-image (the plugin's own image)")?,
            namespace: self.namespace.clone().context(
                "--mps-daemons=pod needs --namespace (TESSERA_NAMESPACE or POD_NAMESPACE)",
            )?,
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
    fn the_default_metrics_port_is_the_charts() {
        let values: serde_yaml::Value = serde_yaml::from_str(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../deploy/helm/tessera/values.yaml"
            ))
            .unwrap(),
        )
        .unwrap();
        let port = values["kubeletPlugin"]["metrics"]["port"].as_u64().unwrap();
        let address: SocketAddr = DEFAULT_METRICS_ADDRESS.parse().unwrap();
        assert_eq!(u64::from(address.port()), port);
    }

    #[test]
    fn every_variable_is_prefixed_and_every_old_name_reaches_its_flag() {
        tessera_process::env::check_table(&Args::command(), &renamed()).unwrap();
    }

    #[test]
    fn old_variable_names_still_work_and_warn() {
        use std::ffi::OsString;

        use tessera_process::OldEnvName;

        let env: std::collections::BTreeMap<&str, &str> = [
            ("NODE_NAME", "gpu-1"),
            ("TOPOLOGY", "pcie-l40s"),
            ("STATE_DIR", "/old/state"),
            ("LOG_FORMAT", "json"),
            ("DYNAMIC_MIG", "1"),
        ]
        .into();
        let (argv, notices) = tessera_process::env::apply_renamed(
            &Args::command(),
            &renamed(),
            |name| env.get(name).map(OsString::from),
            vec![OsString::from("tessera-kubelet-plugin")],
        );
        let args = Args::try_parse_from(argv).unwrap();
        assert_eq!(args.node_name, "gpu-1");
        assert_eq!(args.devices.topology.as_deref(), Some("pcie-l40s"));
        assert_eq!(args.state_dir, PathBuf::from("/old/state"));
        assert_eq!(args.log.log_format, tessera_process::LogFormat::Json);
        assert!(args.dynamic_mig);
        let mut warned: Vec<&str> = notices
            .iter()
            .map(|n| match n {
                OldEnvName::Deprecated { old, .. } => *old,
                OldEnvName::Ignored { old, .. } => panic!("{old} ignored"),
            })
            .collect();
        warned.sort();
        // NODE_NAME is the downward API's convention: accepted without a warning.
        assert_eq!(
            warned,
            ["DYNAMIC_MIG", "LOG_FORMAT", "STATE_DIR", "TOPOLOGY"]
        );
    }

    #[test]
    fn the_nvml_backend_defaults_to_the_driver_roots_library() {
        let args = Args::try_parse_from(["p", "--node-name", "n", "--driver-root", "/"]).unwrap();
        let config = args.plugin_config().unwrap();
        assert!(
            matches!(
                config.backend.devices,
                GpuBackend::Nvml { library: None, .. }
            ),
            "{:?}",
            config.backend.devices
        );
        let args = Args::try_parse_from(["p", "--node-name", "n", "--nvml-lib", "/l.so"]).unwrap();
        assert!(matches!(
            args.plugin_config().unwrap().backend.devices,
            GpuBackend::Nvml { library: Some(ref l), .. } if l == std::path::Path::new("/l.so")
        ));
        let error = Args::try_parse_from(["p", "--node-name", "n"])
            .unwrap()
            .plugin_config()
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--topology") && error.contains("--driver-root"),
            "{error}"
        );
    }

    #[test]
    fn driver_roots_are_candidates_in_order_each_seen_where_its_container_path_says() {
        let roots = |flags: &[&str]| {
            mock_node_with(flags)
                .unwrap()
                .plugin_config()
                .map(|config| config.backend.driver_root.map(|r| r.candidates))
        };
        let path = |host: &str, container: &str| DriverRootPath {
            host: host.into(),
            container: container.into(),
        };
        // The chart's default on nvml nodes: the GPU operator's root first, then the host's.
        let chart = [
            "--driver-root=/run/nvidia/driver",
            "--container-driver-root=/host-run-nvidia/driver",
            "--driver-root=/",
            "--container-driver-root=/driver-root",
        ];
        assert_eq!(
            roots(&chart).unwrap(),
            Some(vec![
                path("/run/nvidia/driver", "/host-run-nvidia/driver"),
                path("/", "/driver-root")
            ])
        );
        // One root: as before; without a container path, seen at its host path.
        assert_eq!(
            roots(&["--driver-root", "/opt/nvidia"]).unwrap(),
            Some(vec![path("/opt/nvidia", "/opt/nvidia")])
        );
        assert_eq!(
            roots(&["--driver-root", "/a,/b"]).unwrap(),
            Some(vec![path("/a", "/a"), path("/b", "/b")])
        );
        assert_eq!(roots(&[]).unwrap(), None);
        let error = roots(&[
            "--driver-root=/a",
            "--driver-root=/b",
            "--container-driver-root=/seen-a",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("--container-driver-root is given 1 time(s) for 2 --driver-root(s)"),
            "{error}"
        );
    }

    #[test]
    fn a_pod_uid_gives_per_pod_sockets_and_an_empty_one_none() {
        let config = |env_uid: &str| {
            mock_node_with(&["--pod-uid", env_uid])
                .unwrap()
                .plugin_config()
                .unwrap()
                .pod_uid
        };
        assert_eq!(config("0a0a-11"), Some("0a0a-11".to_owned()));
        assert_eq!(config(""), None, "the downward API unset gives no UID");
        assert_eq!(
            mock_node_with(&[])
                .unwrap()
                .plugin_config()
                .unwrap()
                .pod_uid,
            None
        );
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

    /// Parses `--node-name n --topology x` and then `more`.
    fn mock_node_with(more: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(
            ["p", "--node-name", "n", "--topology", "x"]
                .into_iter()
                .chain(more.iter().copied()),
        )
    }

    #[test]
    fn exactly_one_backend_and_defaults() {
        let args =
            Args::try_parse_from(["p", "--node-name", "n", "--topology", "dgx-h100"]).unwrap();
        assert_eq!(
            args.metrics_address,
            OptionalAddress(Some("0.0.0.0:8081".parse().unwrap()))
        );
        assert_eq!(args.cdi_root, PathBuf::from("/var/run/cdi"));
        assert!(args.driver_root.is_empty());
        assert_eq!(args.dev_root, PathBuf::from("/"));
        assert!(
            mock_node_with(&["--container-driver-root", "/driver-root"]).is_err(),
            "a container view of no driver root is a mistake"
        );
        assert_eq!(args.rescan_interval, Duration::from_secs(30));
        let config = args.plugin_config().unwrap();
        assert_eq!(
            config.gpu_metrics,
            GpuMonitorSettings::default(),
            "the documented defaults: every 10s, idle below 5% for 30m"
        );
        let no_idle = mock_node_with(&["--idle-threshold", "0"]).unwrap();
        assert_eq!(no_idle.plugin_config().unwrap().gpu_metrics.idle, None);
        assert!(mock_node_with(&["--idle-threshold", "101"]).is_err());
        assert!(
            matches!(config.backend.devices, GpuBackend::Mock { ref topology } if topology == "dgx-h100")
        );
        assert_eq!(
            config.metrics_address,
            Some("0.0.0.0:8081".parse().unwrap())
        );
        let none = mock_node_with(&["--metrics-address", ""]).unwrap();
        assert_eq!(none.metrics_address, OptionalAddress(None));
        assert!(mock_node_with(&["--nvml-lib", "/l.so"]).is_err());
    }
}
