//! Start-up: load the checkpoint (or quarantine it), converge every claim a previous run left,
//! rebuild a lost checkpoint from the CDI specs and the API server, and remove what no claim
//! owns (see the crash-point table in [`crate::driver`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tessera_cdi::SpecDir;
use tessera_kubelet_grpc::{ClaimRef, ClaimUid};

use super::core::{Core, DriverParts, NodeDriverConfig, StartError};
use super::error::logged;
use super::gate::{RecoveryError, RecoveryState};
use super::placements::HeldPlacements;
use crate::cdi_spec;
use crate::checkpoint::{CheckpointOwner, CheckpointStore, LoadOutcome, read_boot_id};
use crate::checkpoint::{ClaimRecord, ClaimState, DeviceTarget};
use crate::imex::IMEX_DIRECTORY;
use crate::mig::MigCapMinors;
use crate::plan::{MigMode, PlanContext, plan_claim};
use crate::sharing::MpsDirectories;

/// Temporary spec files older than this at start belong to no live writer.
const STALE_TEMP_FILE_AGE: Duration = Duration::from_secs(60);

/// What start-up found and did. Claims are named `namespace/name (uid)`.
#[derive(Debug, Clone, PartialEq)]
pub struct StartupReport {
    /// What the checkpoint file held.
    pub checkpoint: LoadOutcome,
    /// The checkpoint was written during another boot: the node rebooted.
    pub rebooted: bool,
    /// Claims whose interrupted prepare was undone.
    pub rolled_back: Vec<String>,
    /// Claims whose interrupted unprepare was finished.
    pub finished_unprepare: Vec<String>,
    /// Prepared claims whose side effects were checked and re-established.
    pub reestablished: Vec<String>,
    /// Claims recovered from their CDI spec and the API server after the checkpoint was lost.
    pub rebuilt: Vec<String>,
    /// CDI specs (claim UIDs) no claim owns any more, removed.
    pub removed_specs: Vec<String>,
    /// MPS directories (claim UIDs) no claim owns any more, daemon stopped and removed.
    pub stopped_mps: Vec<String>,
    /// Dynamic MIG devices (UUIDs) no claim owns, destroyed.
    pub destroyed_mig: Vec<String>,
    /// IMEX daemons (claim UIDs) of domains no claim on this node holds any more, stopped.
    pub stopped_imex: Vec<String>,
    /// What went wrong (each also logged); the claims concerned stay recorded for a retry.
    pub errors: Vec<String>,
}

impl StartupReport {
    fn new(checkpoint: LoadOutcome, rebooted: bool) -> Self {
        Self {
            checkpoint,
            rebooted,
            rolled_back: Vec::new(),
            finished_unprepare: Vec::new(),
            reestablished: Vec::new(),
            rebuilt: Vec::new(),
            removed_specs: Vec::new(),
            stopped_mps: Vec::new(),
            destroyed_mig: Vec::new(),
            stopped_imex: Vec::new(),
            errors: Vec::new(),
        }
    }

    fn error(&mut self, message: String) {
        tracing::error!("recovery: {message}");
        self.errors.push(message);
    }
}

fn describe(uid: &ClaimUid, record: &ClaimRecord) -> String {
    format!("{} ({uid})", record.display_name())
}

pub(super) async fn start(
    config: NodeDriverConfig,
    parts: DriverParts,
) -> Result<(Arc<Core>, StartupReport), StartError> {
    let boot_id = read_boot_id(&config.boot_id_path)?;
    let owner = checkpoint_owner(&config, &parts);
    let (store, loaded, outcome) = CheckpointStore::open(&config.state_dir, &boot_id, &owner)?;
    let specs = SpecDir::new(&config.cdi_root, cdi_spec::kind());
    specs.remove_stale_temp_files(STALE_TEMP_FILE_AGE)?;
    let rebooted =
        matches!(&outcome, LoadOutcome::Loaded { boot_id: before, .. } if *before != boot_id);
    let report = startup_report(&outcome, rebooted, &store);
    let quarantines = AtomicU64::new(u64::from(matches!(
        outcome,
        LoadOutcome::Quarantined { .. }
    )));
    let lost = matches!(
        outcome,
        LoadOutcome::Missing | LoadOutcome::Quarantined { .. }
    );
    let unknown_specs = specs
        .list()?
        .into_iter()
        .any(|uid| !loaded.claims.contains_key(&ClaimUid::new(uid)));
    let write_needed = !matches!(
        &outcome,
        LoadOutcome::Loaded {
            migrated: false,
            ..
        }
    ) || rebooted;
    let core = Arc::new(Core {
        node_name: config.node_name,
        mig_mode: config.mig_mode,
        total_shares: config.consumable_shares.shares(),
        mps_root: config.state_dir.join("mps"),
        imex_root: config.state_dir.join(IMEX_DIRECTORY),
        caps: MigCapMinors::load(&config.mig_minors_path),
        injection: config.injection,
        inventory: parts.inventory,
        claims: parts.claims,
        gpu: parts.gpu,
        mig: parts.mig,
        imex: parts.imex,
        store,
        specs,
        locks: Arc::default(),
        admission: std::sync::Mutex::new(()),
        recovery: RecoveryState::new(lost && unknown_specs, write_needed),
        quarantines,
        recovery_errors: AtomicU64::new(0),
    });
    let report = recover_or_retry_later(&core, report).await;
    Ok((core, report))
}

/// Who the checkpoint belongs to: this node, its pool (named after the node) and its GPUs.
fn checkpoint_owner(config: &NodeDriverConfig, parts: &DriverParts) -> CheckpointOwner {
    CheckpointOwner {
        node_name: config.node_name.clone(),
        // A node's devices are published in one pool named after the node.
        pool_name: config.node_name.clone(),
        gpu_uuids: parts
            .inventory
            .current()
            .gpus
            .iter()
            .map(|gpu| gpu.uuid.clone())
            .collect(),
    }
}

/// The start's report as loading the checkpoint left it (a quarantined checkpoint is an
/// error in it).
fn startup_report(outcome: &LoadOutcome, rebooted: bool, store: &CheckpointStore) -> StartupReport {
    let mut report = StartupReport::new(outcome.clone(), rebooted);
    if let LoadOutcome::Quarantined { moved_to, error } = outcome {
        report.error(format!(
            "the checkpoint {} could not be trusted ({error}); moved it to {} and rebuilding \
             state from the CDI specs and the API server",
            store.path().display(),
            moved_to.display()
        ));
    }
    report
}

/// Runs recovery once; if it does not finish, marks recovery pending (new prepares are
/// refused) and retries in the background.
async fn recover_or_retry_later(core: &Arc<Core>, mut report: StartupReport) -> StartupReport {
    match attempt(core, report.clone()).await {
        Ok(recovered) => {
            report = recovered;
            tracing::info!(?report, "node driver recovered");
        }
        Err(error) => {
            report.error(format!(
                "recovery could not finish ({error}); serving prepared claims and unprepare, \
                 refusing new prepares, and retrying"
            ));
            core.recovery.set_pending(Some(error.to_string()));
            tokio::spawn(retry_recovery(Arc::downgrade(core), report.clone()));
        }
    }
    report
}

/// First delay between recovery attempts after a failed one; doubles up to the maximum.
const RETRY_FIRST_DELAY: Duration = Duration::from_millis(500);
const RETRY_MAX_DELAY: Duration = Duration::from_secs(30);

/// How long a prepare that arrives while recovery is pending waits for the attempt it asks for.
pub(super) const PREPARE_WAITS_FOR_RECOVERY: Duration = Duration::from_secs(10);

/// Retries recovery until it finishes or the driver is gone: after a backoff, or at once when a
/// prepare asks for it (at most one attempt per [`RETRY_FIRST_DELAY`], so prepares arriving
/// while the API server is still down do not run attempts back to back).
async fn retry_recovery(core: Weak<Core>, report: StartupReport) {
    let Some(wanted) = core
        .upgrade()
        .map(|c| Arc::clone(&c.recovery.attempt_wanted))
    else {
        return;
    };
    let mut delay = RETRY_FIRST_DELAY;
    let mut last_attempt = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = wanted.notified() => {
                tokio::time::sleep_until(last_attempt + RETRY_FIRST_DELAY).await;
            }
        }
        let Some(core) = core.upgrade() else {
            return;
        };
        last_attempt = tokio::time::Instant::now();
        match attempt(&core, report.clone()).await {
            Ok(report) => {
                core.recovery.set_pending(None);
                tracing::info!(?report, "node driver recovered after retrying");
                return;
            }
            Err(error) => {
                tracing::warn!(error = %logged(&error), retry_in = ?delay, "recovery could not finish yet");
                core.recovery.set_pending(Some(error.to_string()));
                delay = (delay * 2).min(RETRY_MAX_DELAY);
            }
        }
    }
}

/// One recovery attempt, with every call held off: lists the claims when the checkpoint must
/// be rebuilt, then converges (blocking work) from the records as they are now.
async fn attempt(
    core: &Arc<Core>,
    mut report: StartupReport,
) -> Result<StartupReport, RecoveryError> {
    let _exclusive = core.recovery.gate.write().await;
    let rebuild_from = if core.recovery.rebuild_pending() {
        Some(core.claims.list().await.map_err(RecoveryError::Rebuild)?)
    } else {
        None
    };
    let recovering = Arc::clone(core);
    let report = tokio::task::spawn_blocking(move || {
        // Converges the state as it is on disk now (another plugin process may share it).
        let _state = recovering.store.hold()?;
        recovering.recover(rebuild_from, &mut report)?;
        let errors = report.errors.len() as u64;
        recovering
            .recovery_errors
            .fetch_add(errors, Ordering::Relaxed);
        Ok::<_, RecoveryError>(report)
    })
    .await
    .map_err(|e| RecoveryError::Panicked(e.to_string()))??;
    core.recovery.set_pending(None);
    Ok(report)
}

impl Core {
    fn recover(
        &self,
        rebuild_from: Option<Vec<ResourceClaim>>,
        report: &mut StartupReport,
    ) -> Result<(), RecoveryError> {
        let loaded = self.store.records();
        let mut kept = self.converge_loaded(&loaded, report);
        if let Some(claims) = rebuild_from {
            self.rebuild(&claims, &mut kept, report)?;
        }
        crate::crash::point("recovery:converged");
        // Record the outcome (and this boot's id) before removing anything unowned; an
        // unchanged checkpoint of this boot is left as it is.
        if kept != loaded || self.recovery.write_needed() {
            self.store.update(|records| *records = kept.clone())?;
            self.recovery.written();
        }
        self.recovery.rebuilt();
        crate::crash::point("recovery:recorded");
        self.collect_garbage(&kept, report)?;
        Ok(())
    }

    /// Undoes interrupted claims and re-establishes completed ones; returns the records to keep.
    fn converge_loaded(
        &self,
        loaded: &BTreeMap<ClaimUid, ClaimRecord>,
        report: &mut StartupReport,
    ) -> BTreeMap<ClaimUid, ClaimRecord> {
        let mut kept = BTreeMap::new();
        let held = HeldPlacements::of(loaded);
        for (uid, record) in loaded
            .iter()
            .filter(|(_, r)| r.state != ClaimState::PrepareCompleted)
        {
            match self.undo(uid, record, &held) {
                Ok(()) if record.state == ClaimState::PrepareStarted => {
                    report.rolled_back.push(describe(uid, record));
                }
                Ok(()) => report.finished_unprepare.push(describe(uid, record)),
                Err(e) => {
                    report.error(format!(
                        "claim {}: undoing the interrupted {} failed: {e}",
                        describe(uid, record),
                        record.state
                    ));
                    kept.insert(uid.clone(), record.clone());
                }
            }
        }
        for (uid, record) in loaded
            .iter()
            .filter(|(_, r)| r.state == ClaimState::PrepareCompleted)
        {
            let mut current = record.clone();
            match self.establish(uid, &mut current) {
                Ok(()) => report.reestablished.push(describe(uid, record)),
                Err(e) => report.error(format!(
                    "claim {}: re-establishing the prepared claim failed: {e}",
                    describe(uid, record)
                )),
            }
            kept.insert(uid.clone(), current);
        }
        kept
    }

    /// Recovers claims whose CDI spec exists but whose record was lost: those still allocated
    /// to this node and reserved for a pod are re-established and recorded.
    fn rebuild(
        &self,
        claims: &[ResourceClaim],
        kept: &mut BTreeMap<ClaimUid, ClaimRecord>,
        report: &mut StartupReport,
    ) -> Result<(), RecoveryError> {
        let by_uid: BTreeMap<ClaimUid, &ResourceClaim> = claims
            .iter()
            .filter_map(|c| Some((ClaimUid::new(c.metadata.uid.as_deref()?), c)))
            .collect();
        let inventory = self.inventory();
        for uid in self.specs.list()?.into_iter().map(ClaimUid::new) {
            if kept.contains_key(&uid) {
                continue;
            }
            let Some(claim) = by_uid.get(&uid) else {
                continue;
            };
            let reserved = claim
                .status
                .as_ref()
                .and_then(|s| s.reserved_for.as_ref())
                .is_some_and(|r| !r.is_empty());
            if !reserved {
                continue;
            }
            let asked = ClaimRef::new(
                claim.metadata.namespace.as_deref().unwrap_or_default(),
                claim.metadata.name.as_deref().unwrap_or_default(),
                uid.clone(),
            );
            let context = PlanContext {
                node_name: &self.node_name,
                inventory: &inventory,
                mig_mode: self.mig_mode,
                mps_root: &self.mps_root,
                total_shares: self.total_shares,
                imex_root: &self.imex_root,
            };
            let mut record = match plan_claim(claim, &asked, context) {
                Ok(record) => record,
                Err(e) => {
                    tracing::info!(claim = %uid, error = %e, "not rebuilding a claim whose spec exists");
                    continue;
                }
            };
            let name = describe(&uid, &record);
            match self.establish(&uid, &mut record) {
                Ok(()) => {
                    record.state = ClaimState::PrepareCompleted;
                    kept.insert(uid.clone(), record);
                    report.rebuilt.push(name);
                }
                Err(e) => {
                    report.error(format!("claim {name}: rebuilding failed: {e}"));
                    let _ = self.undo(&uid, &record, &HeldPlacements::of(&*kept));
                }
            }
        }
        Ok(())
    }

    /// Removes CDI specs, MPS daemons and (dynamic) MIG instances that no kept claim owns.
    fn collect_garbage(
        &self,
        kept: &BTreeMap<ClaimUid, ClaimRecord>,
        report: &mut StartupReport,
    ) -> Result<(), RecoveryError> {
        for uid in self.specs.list()? {
            if kept.contains_key(&ClaimUid::new(uid.as_str())) {
                continue;
            }
            match self.specs.remove(&uid) {
                Ok(_) => report.removed_specs.push(uid),
                Err(e) => report.error(format!("removing the CDI spec of claim {uid}: {e}")),
            }
        }
        self.collect_mps_directories(kept, report);
        self.collect_imex_domains(kept, report);
        if self.mig_mode == MigMode::Dynamic {
            self.collect_mig_instances(kept, report);
        }
        Ok(())
    }

    fn collect_mps_directories(
        &self,
        kept: &BTreeMap<ClaimUid, ClaimRecord>,
        report: &mut StartupReport,
    ) {
        // No MPS directory yet: no directories to collect, but maybe daemon pods.
        let entries = std::fs::read_dir(&self.mps_root).into_iter().flatten();
        for entry in entries.flatten() {
            let uid = ClaimUid::new(entry.file_name().to_string_lossy());
            if kept.get(&uid).is_some_and(|r| r.mps.is_some()) {
                continue;
            }
            let dir = entry.path();
            let directories = MpsDirectories {
                pipe: dir.join("pipe"),
                log: dir.join("log"),
            };
            if let Err(e) = self.gpu.stop_mps(&directories) {
                report.error(format!("stopping the MPS daemon in {}: {e}", dir.display()));
                continue;
            }
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => report.stopped_mps.push(uid.to_string()),
                Err(e) => report.error(format!("removing {}: {e}", dir.display())),
            }
        }
        // Daemons that outlive their directories (daemon pods) of claims no record knows.
        let running = match self.gpu.mps_daemon_claims() {
            Ok(running) => running,
            Err(e) => {
                report.error(e.to_string());
                return;
            }
        };
        for uid in running {
            let stopped = report.stopped_mps.iter().any(|s| s == uid.as_str());
            if kept.get(&uid).is_some_and(|r| r.mps.is_some()) || stopped {
                continue;
            }
            let dir = self.mps_root.join(uid.as_str());
            let directories = MpsDirectories {
                pipe: dir.join("pipe"),
                log: dir.join("log"),
            };
            match self.gpu.stop_mps(&directories) {
                Ok(()) => report.stopped_mps.push(uid.to_string()),
                Err(e) => report.error(format!("stopping the MPS daemon of claim {uid}: {e}")),
            }
        }
    }

    /// Stops the IMEX daemons, and removes the directories, of domains no record holds.
    fn collect_imex_domains(
        &self,
        kept: &BTreeMap<ClaimUid, ClaimRecord>,
        report: &mut StartupReport,
    ) {
        let mut found: BTreeSet<ClaimUid> = std::fs::read_dir(&self.imex_root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| ClaimUid::new(e.file_name().to_string_lossy()))
            .collect();
        match self.imex.domains() {
            Ok(running) => found.extend(running),
            Err(e) => report.error(e.to_string()),
        }
        for uid in found {
            if kept.get(&uid).is_some_and(|r| r.imex.is_some()) {
                continue;
            }
            let Ok(dir) = crate::paths::child(&self.imex_root, uid.as_str()) else {
                report.error(format!(
                    "an IMEX daemon names claim {uid}, which names no directory"
                ));
                continue;
            };
            match self.imex.stop(uid.as_str(), &dir) {
                Ok(()) => report.stopped_imex.push(uid.to_string()),
                Err(e) => report.error(e.to_string()),
            }
        }
    }

    fn collect_mig_instances(
        &self,
        kept: &BTreeMap<ClaimUid, ClaimRecord>,
        report: &mut StartupReport,
    ) {
        let held: BTreeSet<&str> = kept
            .values()
            .flat_map(|r| &r.devices)
            .filter_map(|d| match &d.target {
                DeviceTarget::Mig {
                    instance: Some(i), ..
                } => Some(i.uuid.as_str()),
                _ => None,
            })
            .collect();
        let inventory = self.inventory();
        for gpu in inventory.gpus.iter().filter(|g| g.mig_enabled()) {
            let live = match self.mig.mig_devices(&gpu.uuid) {
                Ok(live) => live,
                Err(e) => {
                    report.error(e.to_string());
                    continue;
                }
            };
            for instance in live.iter().filter(|i| !held.contains(i.uuid.as_str())) {
                match self.mig.destroy(&gpu.uuid, instance) {
                    Ok(()) => report.destroyed_mig.push(instance.uuid.clone()),
                    Err(e) => report.error(e.to_string()),
                }
            }
        }
    }
}
