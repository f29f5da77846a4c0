//! What the driver is made of: its configuration and collaborators, and [`Core`], the shared
//! state every part of the driver works on (the module files below [`super`] add its methods).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tessera_api::shares::ConsumableShares;
use tessera_cdi::{SpecDir, SpecDirError};
use tessera_gpu_inventory::{GpuInventory, SourceError};

use super::gate::RecoveryState;
use super::locks::ClaimLocks;
use crate::checkpoint::{CheckpointStore, CheckpointStoreError, DEFAULT_BOOT_ID_PATH};
use crate::claims::ClaimSource;
use crate::device_status::device_statuses;
use crate::imex::ImexControl;
use crate::injection::{CurrentInjection, DriverInjection};
use crate::inventory::NodeInventory;
use crate::mig::{DEFAULT_MIG_MINORS_PATH, MigCapMinors, MigControl};
use crate::plan::MigMode;
use crate::sharing::GpuControl;

/// Where and how the driver works.
#[derive(Debug, Clone)]
pub struct NodeDriverConfig {
    /// This node's name (the pool name).
    pub node_name: String,
    /// The CDI spec directory the container runtime reads (`/var/run/cdi`).
    pub cdi_root: PathBuf,
    /// The plugin's state directory: checkpoint and per-claim MPS and IMEX directories. Those
    /// are bind-mounted into containers, so this must be the same path on the host.
    pub state_dir: PathBuf,
    /// Static or dynamic MIG; must match how the slices are published.
    pub mig_mode: MigMode,
    /// Where to read the boot id.
    pub boot_id_path: PathBuf,
    /// Where the driver lists MIG capability minors.
    pub mig_minors_path: PathBuf,
    /// What claim specs inject of the NVIDIA driver (none without a driver root), replaceable
    /// while the driver runs (the node plugin re-reads an upgraded driver root).
    pub injection: CurrentInjection,
    /// How the node's devices are published for sharing (the N of a claim's shares).
    pub consumable_shares: ConsumableShares,
}

impl NodeDriverConfig {
    /// A configuration with static MIG and the kernel's boot id and MIG minors paths.
    pub fn new(
        node_name: impl Into<String>,
        cdi_root: impl Into<PathBuf>,
        state_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            node_name: node_name.into(),
            cdi_root: cdi_root.into(),
            state_dir: state_dir.into(),
            mig_mode: MigMode::Static,
            boot_id_path: PathBuf::from(DEFAULT_BOOT_ID_PATH),
            mig_minors_path: PathBuf::from(DEFAULT_MIG_MINORS_PATH),
            injection: CurrentInjection::new(DriverInjection::none()),
            consumable_shares: ConsumableShares::Disabled,
        }
    }

    /// Sets the consumable-shares mode the slices are published with.
    pub fn consumable_shares(mut self, mode: ConsumableShares) -> Self {
        self.consumable_shares = mode;
        self
    }

    /// Injects the driver's files and device nodes as `injection` says.
    pub fn injection(mut self, injection: DriverInjection) -> Self {
        self.injection = CurrentInjection::new(injection);
        self
    }

    /// Injects what `injection` holds when each spec is built: whoever holds a clone may
    /// replace it (a driver upgraded under the driver root).
    pub fn current_injection(mut self, injection: CurrentInjection) -> Self {
        self.injection = injection;
        self
    }

    /// Sets the MIG mode.
    pub fn mig_mode(mut self, mode: MigMode) -> Self {
        self.mig_mode = mode;
        self
    }

    /// Reads the boot id from `path` instead of the kernel's.
    pub fn boot_id_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.boot_id_path = path.into();
        self
    }

    /// Reads MIG capability minors from `path` instead of the driver's.
    pub fn mig_minors_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.mig_minors_path = path.into();
        self
    }
}

/// The driver's collaborators.
#[derive(Clone)]
pub struct DriverParts {
    /// The node's GPUs, shared with the slice publisher (read again at start).
    pub inventory: Arc<NodeInventory>,
    /// Where claims are read.
    pub claims: Arc<dyn ClaimSource>,
    /// Sharing.
    pub gpu: Arc<dyn GpuControl>,
    /// MIG instances.
    pub mig: Arc<dyn MigControl>,
    /// IMEX daemons ([`crate::imex::NoImex`] where IMEX is off).
    pub imex: Arc<dyn ImexControl>,
}

/// Why the driver could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointStoreError),
    #[error("cannot list this driver's CDI specs: {0}")]
    Specs(#[from] SpecDirError),
}

/// The driver's counters, which the node plugin exports as metrics (it reads them after every
/// call).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Corrupt checkpoints moved aside (at most one per start).
    pub checkpoint_quarantines: u64,
    /// Problems met while recovering at start (each also logged and in the [`StartupReport`]).
    pub recovery_errors: u64,
    /// Claims prepared now.
    pub prepared_claims: u64,
    /// Devices of the claims prepared now.
    pub prepared_devices: u64,
}

/// Shared state of the driver; every method that does IO is blocking.
pub(crate) struct Core {
    pub(super) node_name: String,
    pub(super) mig_mode: MigMode,
    pub(super) total_shares: Option<u32>,
    pub(super) mps_root: PathBuf,
    pub(super) imex_root: PathBuf,
    pub(super) caps: MigCapMinors,
    pub(super) inventory: Arc<NodeInventory>,
    pub(super) injection: CurrentInjection,
    pub(super) claims: Arc<dyn ClaimSource>,
    pub(super) gpu: Arc<dyn GpuControl>,
    pub(super) mig: Arc<dyn MigControl>,
    pub(super) imex: Arc<dyn ImexControl>,
    pub(super) store: CheckpointStore,
    pub(super) specs: SpecDir,
    pub(super) locks: Arc<ClaimLocks>,
    /// Held from admitting a batch's claims to recording their intents, so that two batches
    /// never both plan the same MIG placement.
    pub(super) admission: std::sync::Mutex<()>,
    pub(super) recovery: RecoveryState,
    pub(super) quarantines: AtomicU64,
    pub(super) recovery_errors: AtomicU64,
}

impl Core {
    pub(crate) fn inventory(&self) -> Arc<GpuInventory> {
        self.inventory.current()
    }

    /// Re-reads the inventory (a stale one names fewer devices or old MIG instances).
    pub(super) fn refresh_inventory(&self) -> Result<Arc<GpuInventory>, SourceError> {
        self.inventory.rescan()
    }
}

impl Core {
    /// The `status.devices` entries of a prepared claim, products from the inventory.
    pub(super) fn device_statuses(
        &self,
        record: &crate::checkpoint::ClaimRecord,
    ) -> Vec<k8s_openapi::api::resource::v1::AllocatedDeviceStatus> {
        let inventory = self.inventory();
        device_statuses(record, |uuid| {
            let gpu = inventory.gpus.iter().find(|g| g.uuid == uuid)?;
            Some(gpu.product_name.clone())
        })
    }
}
