//! The side effects of one claim, in the order that makes every crash point recoverable:
//! [`Core::establish`] (MIG instances, then sharing, then the CDI spec) and [`Core::undo`]
//! (CDI spec, then sharing, then MIG instances). Both are idempotent: running either again
//! after a crash at any point between their steps finishes the job.
//!
//! A batch splits them so that its CDI specs cost one directory fsync: every claim's node-local
//! effects ([`Core::establish_node_local`]), then all specs at once ([`Core::write_specs`]);
//! and in reverse, all specs at once ([`Core::remove_specs`]), then each claim's node-local
//! effects ([`Core::undo_node_local`]).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use tessera_cdi::Spec;
use tessera_gpu_inventory::ResolvedDevice;
use tessera_kubelet_grpc::ClaimUid;

use super::core::Core;
use super::error::EffectError;
use super::placements::HeldPlacements;
use crate::cdi_spec;
use crate::checkpoint::{ClaimRecord, DeviceTarget, MigLifecycle};
use crate::imex::ImexDomain;
use crate::mig;
use crate::sharing::{self, SharingError};

/// Whether a claim changes anything on the node besides its CDI spec: a dynamic MIG device,
/// a time slice, an MPS daemon or an IMEX daemon. Only such claims need their intent recorded before acting.
pub(super) fn has_node_local_effects(record: &ClaimRecord) -> bool {
    record.mps.is_some()
        || record.imex.is_some()
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

impl Core {
    /// Refuses a dynamic MIG device whose placement another claim's record still holds.
    pub(super) fn check_placements_free(
        &self,
        uid: &ClaimUid,
        record: &ClaimRecord,
        held: &HeldPlacements,
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
            if let Some(holder) = held.held_by_other(uid, &device.target) {
                return Err(EffectError::PlacementBusy {
                    device: device.device.clone(),
                    holder,
                });
            }
        }
        Ok(())
    }

    /// Brings a claim's side effects into being, or back after a restart: its node-local
    /// effects ([`Core::establish_node_local`]), then the CDI spec if it differs from what is
    /// on disk. On error, `record` holds what was created so far, for [`Core::undo`].
    pub(super) fn establish(
        &self,
        uid: &ClaimUid,
        record: &mut ClaimRecord,
    ) -> Result<(), EffectError> {
        self.establish_node_local(uid, record)?;
        if let Some(spec) = self.spec_to_write(uid, record)? {
            self.specs.write(uid.as_str(), &spec)?;
        }
        Ok(())
    }

    /// A claim's side effects except its CDI spec: creates (or adopts) dynamic MIG instances
    /// and records them in `record`, re-reads static ones, creates the MPS directories and
    /// applies sharing. On error, `record` holds what was created so far, for [`Core::undo`].
    pub(super) fn establish_node_local(
        &self,
        uid: &ClaimUid,
        record: &mut ClaimRecord,
    ) -> Result<(), EffectError> {
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
        crate::crash::point("establish:mig-ready");
        if let Some(directories) = sharing::mps_directories(record) {
            // Only ever the claim's own directory under the state directory, whatever the
            // record says.
            let own = self.mps_directory(uid)?;
            if directories.pipe != own.join("pipe") || directories.log != own.join("log") {
                return Err(EffectError::ForeignMpsDirectory {
                    path: directories.pipe,
                    expected: own,
                });
            }
            let modes = [
                (self.mps_root.clone(), crate::paths::PRIVATE_DIR_MODE),
                (own, crate::paths::SHARED_DIR_MODE),
                (directories.pipe, crate::paths::SHARED_DIR_MODE),
                (directories.log, crate::paths::SHARED_DIR_MODE),
            ];
            for (path, mode) in modes {
                crate::paths::create_dir(&path, mode)
                    .map_err(|source| EffectError::MpsDirectory { path, source })?;
            }
            crate::crash::point("establish:mps-directories-created");
        }
        sharing::apply(&*self.gpu, uid.as_str(), record)?;
        if let Some(domain) = ImexDomain::of(uid.as_str(), record) {
            self.check_imex_directory(uid, &domain.directory)?;
            self.imex.start(&domain)?;
            crate::crash::point("establish:imex-ready");
        }
        Ok(())
    }

    /// Refuses an IMEX directory other than the claim's own under the state directory.
    fn check_imex_directory(&self, uid: &ClaimUid, path: &Path) -> Result<(), EffectError> {
        let expected = crate::paths::child(&self.imex_root, uid.as_str())?;
        if path != expected {
            return Err(EffectError::ForeignImexDirectory {
                path: path.to_path_buf(),
                expected,
            });
        }
        Ok(())
    }

    /// The claim's CDI spec, or `None` when the one on disk is already it.
    fn spec_to_write(
        &self,
        uid: &ClaimUid,
        record: &ClaimRecord,
    ) -> Result<Option<Spec>, EffectError> {
        let injection = self.injection.get();
        let spec = cdi_spec::claim_spec(uid.as_str(), record, &self.caps, &injection)?;
        let current = self.specs.read(uid.as_str())?;
        Ok((current.as_ref() != Some(&spec)).then_some(spec))
    }

    /// Writes the CDI specs of claims whose node-local effects are established, as one batch
    /// (one directory fsync). If the batch fails, falls back to one write per claim, so a bad
    /// spec or file fails only its own claim. Returns each claim's outcome.
    pub(super) fn write_specs(
        &self,
        claims: &BTreeMap<ClaimUid, ClaimRecord>,
    ) -> BTreeMap<ClaimUid, Result<(), EffectError>> {
        let mut results = BTreeMap::new();
        let mut to_write: Vec<(&ClaimUid, Spec)> = Vec::new();
        for (uid, record) in claims {
            match self.spec_to_write(uid, record) {
                Ok(Some(spec)) => to_write.push((uid, spec)),
                Ok(None) => {
                    results.insert(uid.clone(), Ok(()));
                }
                Err(e) => {
                    results.insert(uid.clone(), Err(e));
                }
            }
        }
        let batch: Vec<(&str, &Spec)> = to_write
            .iter()
            .map(|(uid, spec)| (uid.as_str(), spec))
            .collect();
        let batch_failed = match self.specs.write_all(&batch) {
            Ok(_) => false,
            Err(e) => {
                tracing::warn!(error = %e, "writing the batch's CDI specs failed; writing them one by one");
                true
            }
        };
        for (uid, spec) in &to_write {
            let result = if batch_failed {
                self.specs
                    .write(uid.as_str(), spec)
                    .map(drop)
                    .map_err(EffectError::from)
            } else {
                Ok(())
            };
            results.insert((*uid).clone(), result);
        }
        results
    }

    /// Removes the CDI specs of `uids` as one batch (one directory fsync); if the batch fails,
    /// falls back to one removal per claim. Returns each claim's outcome.
    pub(super) fn remove_specs<'a>(
        &self,
        uids: &[&'a ClaimUid],
    ) -> BTreeMap<&'a ClaimUid, Result<(), EffectError>> {
        let names: Vec<&str> = uids.iter().map(|uid| uid.as_str()).collect();
        match self.specs.remove_all(&names) {
            Ok(_) => uids.iter().map(|uid| (*uid, Ok(()))).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "removing the batch's CDI specs failed; removing them one by one");
                uids.iter()
                    .map(|uid| {
                        let removed = self
                            .specs
                            .remove(uid.as_str())
                            .map(drop)
                            .map_err(EffectError::from);
                        (*uid, removed)
                    })
                    .collect()
            }
        }
    }

    /// Undoes a claim's side effects, newest first: removes the CDI spec (no container can
    /// get the devices any more), stops sharing, removes the MPS directory, destroys dynamic
    /// MIG instances. Every step is attempted even if an earlier one failed; the first error is
    /// returned. An instance not recorded yet at a placement another claim holds (`held`) is
    /// never destroyed on a guess.
    pub(super) fn undo(
        &self,
        uid: &ClaimUid,
        record: &ClaimRecord,
        held: &HeldPlacements,
    ) -> Result<(), EffectError> {
        let spec_removed = self
            .specs
            .remove(uid.as_str())
            .map(drop)
            .map_err(EffectError::from);
        self.undo_node_local(uid, record, held, spec_removed)
    }

    /// [`Core::undo`] after the caller removed the claim's CDI spec (`spec_removed` says how
    /// that went): stops sharing, removes the MPS directory, destroys dynamic MIG instances.
    /// Every step is attempted, except that the MPS directory stays while its daemon could not
    /// be stopped (the pipe directory is the only way to reach the daemon on a retry); the
    /// first error, the spec's included, is returned.
    pub(super) fn undo_node_local(
        &self,
        uid: &ClaimUid,
        record: &ClaimRecord,
        held: &HeldPlacements,
        spec_removed: Result<(), EffectError>,
    ) -> Result<(), EffectError> {
        let mut first_error: Option<EffectError> = None;
        let mut keep = |result: Result<(), EffectError>| {
            if let Err(e) = result {
                tracing::warn!(claim = %uid, error = %e, "undoing a claim's side effect failed");
                first_error.get_or_insert(e);
            }
        };
        keep(spec_removed);
        // A GPU another recorded claim still holds (a shared device) keeps its time slice.
        let still_used: std::collections::BTreeSet<String> = self
            .store
            .records()
            .iter()
            .filter(|(other, _)| *other != uid)
            .flat_map(|(_, other)| sharing::gpus_of(other).map(str::to_owned))
            .collect();
        if let Some(imex) = &record.imex {
            let path = Path::new(&imex.directory);
            keep(
                self.check_imex_directory(uid, path)
                    .and_then(|()| Ok(self.imex.stop(uid.as_str(), path)?)),
            );
            crate::crash::point("undo:imex-stopped");
        }
        let reset = sharing::reset(&*self.gpu, record, &still_used);
        let daemon_running = matches!(reset, Err(SharingError::StopMps { .. }));
        keep(reset.map_err(EffectError::from));
        crate::crash::point("undo:sharing-reset");
        if !daemon_running {
            keep(self.remove_mps_directory(uid));
            crate::crash::point("undo:mps-directory-removed");
        }
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
            let held_by_other =
                instance.is_none() && held.held_by_other(uid, &device.target).is_some();
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

    /// Undoes what a claim without a record (a lost checkpoint not rebuilt yet) can be found to
    /// have: its CDI spec, and its MPS daemon through the claim's MPS directory. Its dynamic
    /// MIG devices, if any, are destroyed by the recovery that follows.
    pub(super) fn undo_unrecorded(&self, uid: &ClaimUid) -> Result<(), EffectError> {
        self.specs.remove(uid.as_str())?;
        let imex = crate::paths::child(&self.imex_root, uid.as_str())?;
        self.imex.stop(uid.as_str(), &imex)?;
        let dir = self.mps_directory(uid)?;
        if dir.is_dir() {
            let directories = sharing::MpsDirectories {
                pipe: dir.join("pipe"),
                log: dir.join("log"),
            };
            self.gpu.stop_mps(&directories)?;
            self.remove_mps_directory(uid)?;
        }
        Ok(())
    }

    /// The host directory of a claim's MPS daemon.
    pub(super) fn mps_directory(&self, uid: &ClaimUid) -> Result<PathBuf, EffectError> {
        Ok(crate::paths::child(&self.mps_root, uid.as_str())?)
    }

    /// Removes a claim's MPS directory once its daemon is stopped. A daemon that has stopped
    /// answering may still write its last log line while it exits, so a directory that is not
    /// empty yet is tried again a few times before that is an error.
    fn remove_mps_directory(&self, uid: &ClaimUid) -> Result<(), EffectError> {
        const TRIES: u32 = 20;
        let path = self.mps_directory(uid)?;
        for _ in 1..TRIES {
            match std::fs::remove_dir_all(&path) {
                Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                _ => break,
            }
        }
        match std::fs::remove_dir_all(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(EffectError::MpsDirectory { path, source: e })
            }
            _ => Ok(()),
        }
    }
}
