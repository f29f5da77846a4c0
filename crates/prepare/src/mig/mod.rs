//! MIG device management for prepare: the [`MigControl`] trait (implemented by
//! [`SimulatedMig`], and by the node plugin's NVML backend), the capability device minors
//! containers need to use a MIG device ([`MigCapMinors`]), and the two operations prepare and
//! unprepare build on: [`ensure_instance`] and [`release_instance`].

mod caps;
mod simulated;

use tessera_gpu_inventory::MigInstance;

pub use caps::{DEFAULT_MIG_MINORS_PATH, MigCapMinors};
pub use simulated::SimulatedMig;

use crate::checkpoint::MigInstanceRecord;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A MIG operation failed.
#[derive(Debug, thiserror::Error)]
pub enum MigError {
    /// The MIG devices of a GPU could not be listed.
    #[error("cannot list the MIG devices of GPU {gpu}: {source}")]
    List { gpu: String, source: BoxError },
    /// A MIG device could not be created.
    #[error("cannot create MIG device {profile} at memory slice {start} on GPU {gpu}: {source}")]
    Create {
        gpu: String,
        profile: String,
        start: u32,
        source: BoxError,
    },
    /// A MIG device could not be destroyed.
    #[error(
        "cannot destroy MIG device {uuid} (GPU instance {gpu_instance_id}, compute instance \
         {compute_instance_id}) on GPU {gpu}: {source}"
    )]
    Destroy {
        gpu: String,
        uuid: String,
        gpu_instance_id: u32,
        compute_instance_id: u32,
        source: BoxError,
    },
}

/// Creating, listing and destroying MIG devices (GPU instance + one full compute instance).
pub trait MigControl: Send + Sync {
    /// The MIG devices that exist on GPU `gpu_uuid`.
    fn mig_devices(&self, gpu_uuid: &str) -> Result<Vec<MigInstance>, MigError>;

    /// Creates a MIG device of `profile` at memory slice `placement_start` on GPU `gpu_uuid`.
    fn create(
        &self,
        gpu_uuid: &str,
        profile: &str,
        placement_start: u32,
    ) -> Result<MigInstance, MigError>;

    /// Destroys `instance` on GPU `gpu_uuid`.
    fn destroy(&self, gpu_uuid: &str, instance: &MigInstance) -> Result<(), MigError>;
}

/// The record form of a live instance.
pub fn instance_record(instance: &MigInstance) -> MigInstanceRecord {
    MigInstanceRecord {
        uuid: instance.uuid.clone(),
        gpu_instance_id: instance.gpu_instance_id,
        compute_instance_id: instance.compute_instance_id,
    }
}

/// What [`ensure_instance`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ensured {
    /// The recorded instance (or one at the placement) exists and is used.
    Existing(MigInstanceRecord),
    /// The instance was created.
    Created(MigInstanceRecord),
}

impl Ensured {
    /// The instance, whichever way it came.
    pub fn record(&self) -> &MigInstanceRecord {
        match self {
            Ensured::Existing(r) | Ensured::Created(r) => r,
        }
    }
}

/// Makes sure a MIG device of `profile` exists at `placement_start` on `gpu_uuid`: an instance
/// already there (the recorded one, or after a restart whatever sits at the placement) is used;
/// otherwise one is created.
pub fn ensure_instance(
    control: &dyn MigControl,
    gpu_uuid: &str,
    profile: &str,
    placement_start: u32,
) -> Result<Ensured, MigError> {
    let live = control.mig_devices(gpu_uuid)?;
    if let Some(existing) = live
        .iter()
        .find(|i| i.profile == profile && i.placement_start == placement_start)
    {
        return Ok(Ensured::Existing(instance_record(existing)));
    }
    let created = control.create(gpu_uuid, profile, placement_start)?;
    Ok(Ensured::Created(instance_record(&created)))
}

/// Destroys the MIG device of a claim's dynamic device, if it exists: the recorded instance
/// (matched by UUID, so that ids reused after a reboot are never mistaken for it), or — when
/// none was recorded because prepare was interrupted between creating and recording — the
/// instance at the placement. Returns whether something was destroyed.
pub fn release_instance(
    control: &dyn MigControl,
    gpu_uuid: &str,
    profile: &str,
    placement_start: u32,
    recorded: Option<&MigInstanceRecord>,
) -> Result<bool, MigError> {
    let live = control.mig_devices(gpu_uuid)?;
    let target = match recorded {
        Some(recorded) => live.iter().find(|i| i.uuid == recorded.uuid),
        None => live
            .iter()
            .find(|i| i.profile == profile && i.placement_start == placement_start),
    };
    match target {
        Some(instance) => control.destroy(gpu_uuid, instance).map(|()| true),
        None => Ok(false),
    }
}
