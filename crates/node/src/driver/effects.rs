//! The side effects of one claim, in the order that makes every crash point recoverable:
//! [`Core::establish`] (MIG instances, then sharing, then the CDI spec) and [`Core::undo`]
//! (CDI spec, then sharing, then MIG instances). Both are idempotent: running either again
//! after a crash at any point between their steps finishes the job.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;

use tessera_api::checkpoint::{ClaimRecord, DeviceTarget, MigLifecycle};
use tessera_cdi::SpecDirError;
use tessera_topology::ResolvedDevice;

use super::Core;
use crate::cdi_spec::{self, CdiSpecError};
use crate::checkpoint::CheckpointStoreError;
use crate::mig::{self, MigError};
use crate::sharing::{self, SharingError};

/// A side effect failed.
#[derive(Debug, thiserror::Error)]
pub enum EffectError {
    #[error(transparent)]
    Mig(#[from] MigError),
    #[error(transparent)]
    Sharing(#[from] SharingError),
    #[error(transparent)]
    Spec(#[from] CdiSpecError),
    #[error("cannot write or remove the claim's CDI spec: {0}")]
    SpecDir(#[from] SpecDirError),
    #[error("{0}; the claim's side effects were undone or will be at the next start")]
    Checkpoint(#[from] CheckpointStoreError),
    /// Dynamic MIG: another claim still holds the placement (it is being unprepared).
    #[error(
        "MIG device `{device}` is still held by claim {holder}, which the kubelet has not \
         unprepared yet; retrying"
    )]
    PlacementBusy { device: String, holder: String },
    /// Static MIG: the recorded instance is gone.
    #[error("MIG device `{device}` no longer exists on GPU {gpu}")]
    StaticInstanceGone { device: String, gpu: String },
    /// The claim's MPS directory could not be created or removed.
    #[error("cannot create or remove the MPS directory {}: {source}", path.display())]
    MpsDirectory { path: PathBuf, source: io::Error },
}

/// Whether a claim changes anything on the node besides its CDI spec: a dynamic MIG device,
/// a time slice or an MPS daemon. Only such claims need their intent recorded before acting.
pub(super) fn has_node_local_effects(record: &ClaimRecord) -> bool {
    record.mps.is_some()
        || record.devices.iter().any(|device| {
            device.sharing.is_some()
                || matches!(
                    device.target,
                    DeviceTarget::Mig {
                        lifecycle: MigLifecycle::Dynamic,
                        ..
                    }
                )
        })
}

/// Whether two MIG targets name the same placement of the same GPU.
fn same_placement(a: &DeviceTarget, b: &DeviceTarget) -> bool {
    matches!(
        (a, b),
        (
            DeviceTarget::Mig { parent_uuid: g1, profile: p1, placement_start: s1, .. },
            DeviceTarget::Mig { parent_uuid: g2, profile: p2, placement_start: s2, .. },
        ) if g1 == g2 && p1 == p2 && s1 == s2
    )
}

impl Core {
    /// Refuses a dynamic MIG device whose placement another claim's record still holds.
    pub(super) fn check_placements_free(
        &self,
        uid: &str,
        record: &ClaimRecord,
        others: &BTreeMap<String, ClaimRecord>,
    ) -> Result<(), EffectError> {
        for device in &record.devices {
            if !matches!(
                device.target,
                DeviceTarget::Mig {
                    lifecycle: MigLifecycle::Dynamic,
                    ..
                }
            ) {
                continue;
            }
            let holder = others.iter().find(|(other_uid, other)| {
                *other_uid != uid
                    && other
                        .devices
                        .iter()
                        .any(|d| same_placement(&d.target, &device.target))
            });
            if let Some((holder_uid, holder)) = holder {
                return Err(EffectError::PlacementBusy {
                    device: device.device.clone(),
                    holder: format!("{} ({holder_uid})", holder.display_name()),
                });
            }
        }
        Ok(())
    }

    /// Brings a claim's side effects into being, or back after a restart: creates (or adopts)
    /// dynamic MIG instances and records them in `record`, re-reads static ones, applies
    /// sharing, and writes the CDI spec if it differs from what is on disk. On error, `record`
    /// holds what was created so far, for [`Core::undo`].
    pub(super) fn establish(&self, uid: &str, record: &mut ClaimRecord) -> Result<(), EffectError> {
        for device in &mut record.devices {
            let DeviceTarget::Mig {
                parent_uuid,
                profile,
                placement_start,
                lifecycle,
                instance,
                ..
            } = &mut device.target
            else {
                continue;
            };
            match lifecycle {
                MigLifecycle::Dynamic => {
                    let ensured =
                        mig::ensure_instance(&*self.mig, parent_uuid, profile, *placement_start)?;
                    *instance = Some(ensured.record().clone());
                }
                MigLifecycle::Static => {
                    let inventory = self.inventory();
                    let live = match inventory.resolve_device(&device.device) {
                        Some(ResolvedDevice::Mig {
                            instance: Some(live),
                            ..
                        }) => mig::instance_record(live),
                        _ => {
                            return Err(EffectError::StaticInstanceGone {
                                device: device.device.clone(),
                                gpu: parent_uuid.clone(),
                            });
                        }
                    };
                    *instance = Some(live);
                }
            }
        }
        if let Some(directories) = sharing::mps_directories(record) {
            for path in [directories.pipe, directories.log] {
                std::fs::create_dir_all(&path)
                    .map_err(|source| EffectError::MpsDirectory { path, source })?;
            }
        }
        sharing::apply(&*self.gpu, uid, record)?;
        let spec = cdi_spec::claim_spec(uid, record, &self.caps)?;
        if self.specs.read(uid)?.as_ref() != Some(&spec) {
            self.specs.write(uid, &spec)?;
        }
        Ok(())
    }

    /// Undoes a claim's side effects, newest first: removes the CDI spec (no container can
    /// get the devices any more), stops sharing, removes the MPS directory, destroys dynamic
    /// MIG instances. Every step is attempted even if an earlier one failed; the first error is
    /// returned. `others` are the other claims' records: an instance at a placement another
    /// claim holds is never destroyed on a guess.
    pub(super) fn undo(
        &self,
        uid: &str,
        record: &ClaimRecord,
        others: &BTreeMap<String, ClaimRecord>,
    ) -> Result<(), EffectError> {
        let mut first_error: Option<EffectError> = None;
        let mut keep = |result: Result<(), EffectError>| {
            if let Err(e) = result {
                tracing::warn!(claim = %uid, error = %e, "undoing a claim's side effect failed");
                first_error.get_or_insert(e);
            }
        };
        keep(self.specs.remove(uid).map(drop).map_err(EffectError::from));
        keep(sharing::reset(&*self.gpu, record).map_err(EffectError::from));
        keep(self.remove_mps_directory(uid));
        for device in &record.devices {
            let DeviceTarget::Mig {
                parent_uuid,
                profile,
                placement_start,
                lifecycle: MigLifecycle::Dynamic,
                instance,
                ..
            } = &device.target
            else {
                continue;
            };
            let held_by_other = instance.is_none()
                && others.iter().any(|(other_uid, other)| {
                    other_uid != uid
                        && other
                            .devices
                            .iter()
                            .any(|d| same_placement(&d.target, &device.target))
                });
            if held_by_other {
                continue;
            }
            keep(
                mig::release_instance(
                    &*self.mig,
                    parent_uuid,
                    profile,
                    *placement_start,
                    instance.as_ref(),
                )
                .map(drop)
                .map_err(EffectError::from),
            );
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The host directory of a claim's MPS daemon.
    pub(super) fn mps_directory(&self, uid: &str) -> PathBuf {
        self.mps_root.join(uid)
    }

    fn remove_mps_directory(&self, uid: &str) -> Result<(), EffectError> {
        let path = self.mps_directory(uid);
        match std::fs::remove_dir_all(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(EffectError::MpsDirectory { path, source: e })
            }
            _ => Ok(()),
        }
    }
}
