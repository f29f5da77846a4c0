//! Where the node's GPUs come from and how claim preparation changes them: [`Backend::open`]
//! reads the NVIDIA driver root ([`driver_root`]), picks the GPU backend ([`GpuBackend`]: NVML
//! or a mock topology) and returns the inventory, the sharing and MIG controls the driver uses,
//! and NVML's health events and telemetry when there is NVML.
//!
//! | backend | inventory | MIG | sharing | health, telemetry |
//! |---|---|---|---|---|
//! | NVML | NVML and sysfs | NVML ([`NvmlMig`]) | the driver root's tools, MPS daemons as processes or pods; without a driver root the tools on `PATH` | NVML's |
//! | mock | the topology | simulated in a file under the state directory | a fake driver root's tools, else simulated in files | none; telemetry from a fake driver root's NVML |

pub mod driver_root;
pub mod driver_watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera_gpu_inventory::{DeviceSource, MigInstance, MockSource, SourceError};
use tessera_nvml::{HealthEvents, NvmlError, NvmlSource, Sysfs};
use tessera_prepare::injection::DriverInjection;
use tessera_prepare::inventory::NodeInventory;
use tessera_prepare::mig::{MigControl, MigError, SimulatedMig};
use tessera_prepare::sharing::{GpuControl, SimulatedGpuControl, SystemGpuControl};

use crate::gpu_metrics::TelemetrySource;
use crate::imex_pods::{ImexPodTemplate, PodImexControl};
use crate::mps_pods::{MpsPodTemplate, PodMpsControl};
use driver_root::{
    CompleteRoot, DriverRootConfig, DriverRootError, DriverRoots, DriverTools, NoCompleteDriver,
};

/// Where the GPUs come from.
#[derive(Debug, Clone)]
pub enum GpuBackend {
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

/// The GPUs and the NVIDIA driver, as the flags give them.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    pub devices: GpuBackend,
    /// Where the NVIDIA driver may be (one root or candidates): its files, which claim specs
    /// inject, and its tools, which time-slicing and MPS run; `None`: specs carry device nodes
    /// and environment only, sharing is simulated on mock nodes and uses the tools on `PATH`
    /// with NVML.
    pub driver_root: Option<DriverRoots>,
    /// Host directory the driver's device nodes are under (`/` on real nodes).
    pub dev_root: PathBuf,
    /// MPS control daemons in pods of their own (`--mps-daemons=pod`, with a driver root);
    /// `None`: daemons are processes the plugin starts.
    pub mps_pods: Option<MpsPodSettings>,
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

/// Why the GPUs or the driver root could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
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
    #[error(transparent)]
    NoCompleteDriver(#[from] NoCompleteDriver),
    #[error("--driver-root {}: {source}", .driver_root.display())]
    DriverRoot {
        driver_root: PathBuf,
        #[source]
        source: DriverRootError,
    },
}

/// The GPUs, opened: where the inventory comes from, how sharing and MIG are applied, what claim
/// specs inject of the driver, and NVML's health events and telemetry when there is NVML.
pub struct Backend {
    pub inventory: Arc<NodeInventory>,
    pub gpu: Arc<dyn GpuControl>,
    pub mig: Arc<dyn MigControl>,
    pub injection: DriverInjection,
    /// The driver root in use and its driver's version (none without a driver root).
    pub driver: Option<CompleteRoot>,
    pub health_events: Option<HealthEvents>,
    pub telemetry: Option<Arc<dyn TelemetrySource>>,
    /// IMEX daemons in pods, where daemons run in pods and the driver root has `nvidia-imex`;
    /// `None`: IMEX channel claims fail with a reason.
    pub imex: Option<PodImexControl>,
}

/// Where this node keeps what the backend needs besides its flags.
#[derive(Clone, Copy)]
pub struct BackendContext<'a> {
    /// The node's name (a mock node's UUIDs, MPS daemon pods' node).
    pub node_name: &'a str,
    /// The plugin's state directory (a mock node's simulated sharing and MIG).
    pub state_dir: &'a Path,
    /// The client MPS daemon pods are created with.
    pub client: &'a kube::Client,
}

impl Backend {
    /// Reads the driver root, then opens the GPUs as `config` says (blocking: NVML or a file).
    pub fn open(
        config: &BackendConfig,
        place: BackendContext<'_>,
    ) -> Result<Backend, BackendError> {
        let (chosen, injection, tools, nvml_library) = load_driver_root(config)?;
        let driver = chosen.as_ref().map(|(_, driver)| driver);
        let mut devices = config.devices.clone();
        let driver_root = driver.map(|d| d.driver_root.clone());
        default_nvml_library(&mut devices, nvml_library, driver_root.clone())?;
        // Sharing through the driver root's tools (privileged daemon pods on real GPUs).
        let sharing = |privileged| {
            tools
                .as_ref()
                .map(|tools| driver_sharing(config, driver, place, tools, privileged))
                .transpose()
        };
        let mock = matches!(devices, GpuBackend::Mock { .. });
        let imex = tools
            .as_ref()
            .and_then(|tools| imex_pods(config, driver, place, tools, !mock));
        let mut backend = match &devices {
            GpuBackend::Mock { topology } => {
                let mut backend = Backend::mock(place, topology, sharing(false)?, injection)?;
                backend.telemetry = tools
                    .as_ref()
                    .and_then(|tools| tools.nvml.as_deref())
                    .and_then(driver_root_telemetry);
                backend
            }
            GpuBackend::Nvml {
                library,
                sysfs_root,
            } => {
                let library = library
                    .as_deref()
                    .ok_or(BackendError::NoNvmlLibrary { driver_root })?;
                Backend::nvml(library, sysfs_root, sharing(true)?, injection)?
            }
        };
        backend.driver = chosen.map(|(complete, _)| complete);
        backend.imex = imex;
        Ok(backend)
    }

    fn mock(
        place: BackendContext<'_>,
        topology: &str,
        tools: Option<Arc<dyn GpuControl>>,
        injection: DriverInjection,
    ) -> Result<Backend, BackendError> {
        // Each node gets its own GPU and MIG UUIDs, as real nodes do.
        let source = MockSource::new(topology)
            .map_err(BackendError::Topology)?
            .for_node(place.node_name.to_owned());
        tracing::info!(
            source = %source.describe(),
            fake_driver = tools.is_some(),
            "GPU backend (mock: MIG simulated under the state directory, no health events; \
             sharing through the fake driver root's tools, or simulated without one)"
        );
        let inventory =
            Arc::new(NodeInventory::read(Arc::new(source)).map_err(BackendError::Topology)?);
        let gpu: Arc<dyn GpuControl> = match tools {
            Some(tools) => tools,
            None => Arc::new(SimulatedGpuControl::new(
                place.state_dir.join("simulated-gpu"),
            )),
        };
        Ok(Backend {
            gpu,
            mig: Arc::new(SimulatedMig::persistent(
                &inventory.current(),
                place.state_dir.join("simulated-mig.json"),
            )),
            inventory,
            injection,
            driver: None,
            health_events: None,
            telemetry: None,
            imex: None,
        })
    }

    fn nvml(
        library: &Path,
        sysfs_root: &Path,
        tools: Option<Arc<dyn GpuControl>>,
        injection: DriverInjection,
    ) -> Result<Backend, BackendError> {
        let nvml = Arc::new(
            NvmlSource::open(Some(library))
                .map_err(BackendError::Nvml)?
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
        Ok(Backend {
            inventory: Arc::new(NodeInventory::read(nvml.clone()).map_err(BackendError::ReadNvml)?),
            gpu: match tools {
                Some(tools) => tools,
                None => Arc::new(SystemGpuControl::default()),
            },
            mig: Arc::new(NvmlMig(nvml.clone())),
            injection,
            driver: None,
            health_events,
            telemetry: Some(nvml as Arc<dyn TelemetrySource>),
            imex: None,
        })
    }
}

/// MIG devices created, listed and destroyed through NVML.
#[derive(Debug, Clone)]
pub struct NvmlMig(pub Arc<NvmlSource>);

impl MigControl for NvmlMig {
    fn mig_devices(&self, gpu_uuid: &str) -> Result<Vec<MigInstance>, MigError> {
        self.0.mig_devices(gpu_uuid).map_err(|e| MigError::List {
            gpu: gpu_uuid.to_owned(),
            source: Box::new(e),
        })
    }

    fn create(
        &self,
        gpu_uuid: &str,
        profile: &str,
        placement_start: u32,
    ) -> Result<MigInstance, MigError> {
        self.0
            .create_mig_device(gpu_uuid, profile, placement_start)
            .map_err(|e| MigError::Create {
                gpu: gpu_uuid.to_owned(),
                profile: profile.to_owned(),
                start: placement_start,
                source: Box::new(e),
            })
    }

    fn destroy(&self, gpu_uuid: &str, instance: &MigInstance) -> Result<(), MigError> {
        self.0
            .destroy_mig_device(
                gpu_uuid,
                instance.gpu_instance_id,
                instance.compute_instance_id,
            )
            .map_err(|e| MigError::Destroy {
                gpu: gpu_uuid.to_owned(),
                uuid: instance.uuid.clone(),
                gpu_instance_id: instance.gpu_instance_id,
                compute_instance_id: instance.compute_instance_id,
                source: Box::new(e),
            })
    }
}

/// A mock node's telemetry: the NVML library of its (fake) driver root, when it opens.
fn driver_root_telemetry(library: &Path) -> Option<Arc<dyn TelemetrySource>> {
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

/// The NVML backend without a library of its own gets the driver root's `libnvidia-ml.so.1`
/// (`found`).
fn default_nvml_library(
    devices: &mut GpuBackend,
    found: Option<PathBuf>,
    driver_root: Option<PathBuf>,
) -> Result<(), BackendError> {
    if let GpuBackend::Nvml { library, .. } = devices
        && library.is_none()
    {
        *library = Some(found.ok_or(BackendError::NoNvmlLibrary { driver_root })?);
    }
    Ok(())
}

/// The driver root in use (the first candidate with a complete driver) and its config.
type ChosenRoot = (CompleteRoot, DriverRootConfig);

/// The NVIDIA driver: the root in use, what claim specs inject, its tools for sharing (with a
/// driver root), and its `libnvidia-ml.so.1` (this process's view).
#[allow(clippy::type_complexity)]
fn load_driver_root(
    config: &BackendConfig,
) -> Result<
    (
        Option<ChosenRoot>,
        DriverInjection,
        Option<DriverTools>,
        Option<PathBuf>,
    ),
    BackendError,
> {
    let Some(roots) = &config.driver_root else {
        if matches!(config.devices, GpuBackend::Nvml { .. }) {
            tracing::warn!(
                "no --driver-root: claim specs give containers device nodes and environment but \
                 none of the driver's libraries or binaries (set nvidiaDriverRoot)"
            );
        }
        return Ok((
            None,
            DriverInjection::devices_only(&config.dev_root),
            None,
            None,
        ));
    };
    let chosen = roots.choose()?;
    let driver = roots.config(chosen.index);
    let (injection, tools, summary) =
        driver_root::load(&driver).map_err(|source| BackendError::DriverRoot {
            driver_root: driver.driver_root.clone(),
            source,
        })?;
    tracing::info!(
        driver_root = %driver.driver_root.display(),
        seen_at = %driver.container_driver_root.display(),
        candidates = ?roots.candidates.iter().map(|c| c.host.display().to_string()).collect::<Vec<_>>(),
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
    let chosen = CompleteRoot {
        index: chosen.index,
        version: summary.version,
    };
    Ok((
        Some((chosen, driver)),
        injection,
        Some(tools),
        summary.nvml_library,
    ))
}

/// Sharing through the driver's tools: MPS daemons as processes of the plugin's, or in pods of
/// their own ([`BackendConfig::mps_pods`]).
fn driver_sharing(
    config: &BackendConfig,
    driver: Option<&DriverRootConfig>,
    place: BackendContext<'_>,
    tools: &DriverTools,
    privileged: bool,
) -> Result<Arc<dyn GpuControl>, BackendError> {
    let system = driver_gpu_control(tools);
    let (Some(pods), Some(driver)) = (&config.mps_pods, driver) else {
        return Ok(Arc::new(system));
    };
    let control = tools
        .mps_control
        .as_deref()
        .ok_or(BackendError::NoMpsControl)?;
    let template = MpsPodTemplate {
        node_name: place.node_name.to_owned(),
        namespace: pods.namespace.clone(),
        image: pods.image.clone(),
        priority_class: pods.priority_class.clone(),
        privileged,
        driver_root: driver.driver_root.clone(),
        dev_root: config.dev_root.clone(),
        control: in_root(driver, control),
        library_dirs: library_dirs_in_root(driver, tools),
    };
    tracing::info!(namespace = %pods.namespace, image = %pods.image, "MPS control daemons run in pods of their own");
    Ok(Arc::new(PodMpsControl::new(
        place.client.clone(),
        tokio::runtime::Handle::current(),
        system,
        template,
    )))
}

/// IMEX daemons in pods ([`crate::imex_pods`]): where the plugin runs daemons in pods (the MPS
/// pods' image, namespace and priority) and the driver root has `nvidia-imex` and
/// `nvidia-imex-ctl` (fabric nodes' drivers do).
fn imex_pods(
    config: &BackendConfig,
    driver: Option<&DriverRootConfig>,
    place: BackendContext<'_>,
    tools: &DriverTools,
    privileged: bool,
) -> Option<PodImexControl> {
    let (Some(pods), Some(driver)) = (&config.mps_pods, driver) else {
        return None;
    };
    let (Some(daemon), Some(ctl)) = (&tools.imex_daemon, &tools.imex_ctl) else {
        tracing::info!("the driver root has no nvidia-imex: IMEX channel claims fail on this node");
        return None;
    };
    let template = ImexPodTemplate {
        node_name: place.node_name.to_owned(),
        namespace: pods.namespace.clone(),
        image: pods.image.clone(),
        priority_class: pods.priority_class.clone(),
        privileged,
        driver_root: driver.driver_root.clone(),
        dev_root: config.dev_root.clone(),
        daemon: in_root(driver, daemon),
        library_dirs: library_dirs_in_root(driver, tools),
    };
    tracing::info!(namespace = %pods.namespace, "IMEX daemons run in pods of their own");
    Some(PodImexControl::new(
        place.client.clone(),
        tokio::runtime::Handle::current(),
        template,
        place.state_dir.join(tessera_prepare::imex::IMEX_DIRECTORY),
        ctl.clone(),
        tools.library_path.clone(),
    ))
}

/// A tool's path as this process sees it, made relative to the driver root (what a daemon pod
/// that mounts the root at `/` runs).
fn in_root(driver: &DriverRootConfig, path: &Path) -> PathBuf {
    Path::new("/").join(
        path.strip_prefix(&driver.container_driver_root)
            .unwrap_or(path),
    )
}

/// The driver's library directories (the tools' `LD_LIBRARY_PATH`) relative to the driver root.
fn library_dirs_in_root(driver: &DriverRootConfig, tools: &DriverTools) -> Vec<PathBuf> {
    std::env::split_paths(&tools.library_path)
        .filter(|d| !d.as_os_str().is_empty())
        .map(|d| in_root(driver, &d))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn nvml(library: Option<&str>) -> GpuBackend {
        GpuBackend::Nvml {
            library: library.map(PathBuf::from),
            sysfs_root: PathBuf::from("/sys"),
        }
    }

    fn library(devices: &GpuBackend) -> Option<&Path> {
        match devices {
            GpuBackend::Nvml { library, .. } => library.as_deref(),
            GpuBackend::Mock { .. } => None,
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
        assert_eq!(library(&devices), Some(Path::new("/given.so")));

        let mut devices = GpuBackend::Mock {
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
