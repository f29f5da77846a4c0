//! [`NodeDriver`]: Tessera's [`DraDriver`] — prepare and unprepare with a crash-safe checkpoint.
//!
//! # How prepare is ordered, and why every crash point converges
//!
//! Every call first takes the locks of its claims (per claim, not per call: calls on other
//! claims run in parallel, so a claim whose API read hangs holds up nobody else). Prepare of a
//! batch then answers claims already `PrepareCompleted` from the checkpoint (idempotence,
//! without the API server), reads the others from the API server (concurrently, but at most a
//! few reads at once, each bounded by a timeout well inside the kubelet's 45 s:
//! the node plugin's `KubeClaimSource`), and:
//!
//! 1. A record left `PrepareStarted`/`UnprepareStarted` by a failed earlier call is undone
//!    first.
//! 2. The plan ([`crate::plan`], pure) resolves devices and configs; bad input fails only
//!    that claim.
//! 3. **One checkpoint write** records every planned claim that has node-local side effects
//!    (a dynamic MIG device, a time slice, an MPS daemon) as `PrepareStarted`, with its plan.
//!    A claim whose only side effect is its CDI spec skips this: an orphan spec is removed at
//!    start, so there is nothing a record would have to undo (and the write is an fsync).
//! 4. Per claim, the node-local side effects ([`Core::establish_node_local`]): dynamic MIG
//!    instances, sharing (time slice, MPS daemon). Then the CDI specs of every claim that got
//!    that far, as one batch ([`Core::write_specs`]: each spec fsynced to a temporary file and
//!    renamed, then one directory fsync for the batch). A failure undoes that claim
//!    ([`Core::undo`]).
//! 5. **One checkpoint write** records the finished claims as `PrepareCompleted` (with the MIG
//!    instances created) and drops the failed ones. Only then are CDI ids returned.
//!
//! Unprepare: record `UnprepareStarted` for claims with node-local side effects (one write),
//! remove every claim's CDI spec (one batch, one directory fsync; first, so no new container
//! gets the devices), then undo each claim's sharing and MIG, drop the records (one write). A claim without a record succeeds at once.
//! If that last write fails, a claim recorded only as `PrepareCompleted` gets its CDI spec
//! back, so a prepare call never hands out ids of a spec that is gone.
//!
//! Crash points, and what the next start ([`NodeDriver::start`]) does:
//!
//! | crash | on disk | at start | converges because |
//! |---|---|---|---|
//! | before step 3 | nothing of the claim | nothing | the kubelet retries prepare |
//! | during step 4 | `PrepareStarted` + some of MIG/MPS/time slice/spec | undo all, drop the record | undo is idempotent and finds a MIG instance by placement when its ids were not recorded yet |
//! | during step 4, claim without node-local effects | maybe its CDI spec, no record | remove the orphan spec | the kubelet retries prepare |
//! | inside step 4's spec batch | some specs renamed into place, maybe hidden temporary files | as the two rows above, claim by claim; temporary files are removed once stale | each spec is renamed whole; which of them a crash kept does not matter, since no claim of the batch is `PrepareCompleted` yet |
//! | after step 5 | `PrepareCompleted` + all effects | re-establish (MIG, sharing, spec) | establish is idempotent; the kubelet's retry gets the recorded ids |
//! | during unprepare | `UnprepareStarted` + some effects | finish the undo, drop the record | undo is idempotent; the kubelet's retry finds no record and succeeds |
//! | during unprepare, claim without node-local effects | `PrepareCompleted`, spec maybe gone | re-establish (rewrite the spec) | the kubelet's retry unprepares it again |
//! | inside a checkpoint write | the old or the new file | load it | temp file + fsync + rename + directory fsync |
//!
//! Each step boundary is a named crash point ([`crate::crash`]); the node plugin's
//! `tests/crash_points.rs` (beside the binary it runs) stops the plugin binary at every one of
//! them, each time it is reached in a mixed batch and during the recovery that follows, and
//! checks that the restart converges.
//!
//! Then, at every start: CDI specs of this driver that no record knows are removed; MPS
//! directories (and daemons) of unknown claims are stopped and removed; with dynamic MIG, MIG
//! instances no record holds are destroyed. A corrupt checkpoint (unparsable, unknown
//! version, bad checksum) is renamed aside (counted in [`DriverStats::checkpoint_quarantines`])
//! and state is rebuilt from the CDI specs on disk and the API server: a claim whose spec
//! exists and that is still allocated to this node and reserved is re-established and
//! recorded; everything else is cleaned up as above. A new boot id means the node rebooted:
//! MIG instances and MPS daemons are gone, so re-establishing a completed claim recreates them
//! (new MIG UUIDs; the CDI ids, named after devices, stay the same).

//!
//! # Two plugin processes on one node
//!
//! During a DaemonSet rolling update with surge the old and the new plugin run side by side
//! and share the state directory, the CDI directory and the GPUs; the kubelet sends each call
//! to either. Each process keeps the checkpoint in memory, so every part that reads or changes
//! the node's claim state holds the node's state lock ([`crate::checkpoint::HeldState`]:
//! `flock(2)`, shared by the calls of one process, taken in turn by the processes): the
//! answer from the checkpoint for prepared claims, each batch of a prepare or unprepare, each
//! recovery attempt and the loading of the checkpoint at start. The first holder of a process
//! reads the checkpoint again if the other process replaced it. So a claim prepared by one
//! process can be unprepared by the other, a starting process never rolls back a claim the
//! other is preparing, and no write drops the other's records; calls wait at most for the
//! other process's batch in flight, and are never refused.

// Bottom-up: error; gate, locks; core; effects, placements; prepare, recovery; this file.
mod core;
mod effects;
mod error;
mod gate;
mod locks;
mod placements;
mod prepare;
mod recovery;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tessera_kubelet_grpc::{
    ClaimRef, ClaimUid, DraDriver, PrepareResult, PreparedDevice, UnprepareResult,
};

pub use core::{DriverParts, DriverStats, NodeDriverConfig, StartError};
pub use error::{ClaimError, ClaimFailure, EffectError};
pub use recovery::StartupReport;

use crate::device_status::ClaimStatusSink;
use core::Core;

/// One device of one prepared claim, with who holds it (from the checkpoint:
/// [`NodeDriver::holders`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct HeldDevice {
    pub claim_uid: ClaimUid,
    pub namespace: String,
    pub claim: String,
    /// The allocation result's request (`req` or `req/sub`).
    pub request: String,
    /// The published device name (`gpu-0`, `gpu-3-mig-1g-10gb-6`).
    pub device: String,
    /// The physical GPU behind the device.
    pub gpu_uuid: String,
}

/// Tessera's node driver.
#[derive(Clone)]
pub struct NodeDriver {
    core: Arc<Core>,
    /// Where prepared and unprepared claims are reported (`status.devices`), if anywhere.
    status: Option<Arc<dyn ClaimStatusSink>>,
}

impl std::fmt::Debug for NodeDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeDriver")
            .field("node_name", &self.core.node_name)
            .field("checkpoint", &self.core.store.path())
            .finish_non_exhaustive()
    }
}

impl NodeDriver {
    /// Loads the checkpoint, recovers from whatever a previous run left (see the module
    /// docs), and returns the driver ready to be served, with a report of what recovery did.
    pub async fn start(
        config: NodeDriverConfig,
        parts: DriverParts,
    ) -> Result<(NodeDriver, StartupReport), StartError> {
        let (core, report) = recovery::start(config, parts).await?;
        Ok((NodeDriver { core, status: None }, report))
    }

    /// Reports every claim prepared from now on to `sink` (and unprepared: its entries go), and
    /// at once every claim already prepared (a restarted plugin writes its entries again; writes
    /// are idempotent). Prepare never waits for the sink.
    pub fn report_status(mut self, sink: Arc<dyn ClaimStatusSink>) -> Self {
        for (uid, record) in self.core.store.records() {
            if record.state == crate::checkpoint::ClaimState::PrepareCompleted {
                sink.prepared(claim_ref(&uid, &record), self.core.device_statuses(&record));
            }
        }
        self.status = Some(sink);
        self
    }

    /// The counters.
    pub fn stats(&self) -> DriverStats {
        let records = self.core.store.records();
        let prepared = records
            .values()
            .filter(|r| r.state == crate::checkpoint::ClaimState::PrepareCompleted);
        let (claims, devices) =
            prepared.fold((0, 0), |(c, d), r| (c + 1, d + r.devices.len() as u64));
        DriverStats {
            checkpoint_quarantines: self.core.quarantines.load(Ordering::Relaxed),
            recovery_errors: self.core.recovery_errors.load(Ordering::Relaxed),
            prepared_claims: claims,
            prepared_devices: devices,
        }
    }

    /// Every device of every prepared claim (`PrepareCompleted`), with the physical GPU behind
    /// it: who holds what (the node plugin's per-device GPU metrics).
    pub fn holders(&self) -> Vec<HeldDevice> {
        let mut holders = Vec::new();
        for (uid, record) in self.core.store.records() {
            if record.state != crate::checkpoint::ClaimState::PrepareCompleted {
                continue;
            }
            holders.extend(record.devices.iter().map(|device| HeldDevice {
                claim_uid: uid.clone(),
                namespace: record.namespace.clone(),
                claim: record.name.clone(),
                request: device.request.clone(),
                device: device.device.clone(),
                gpu_uuid: device.target.gpu_uuid().to_owned(),
            }));
        }
        holders
    }

    /// `None` once start-up recovery has finished; else why not yet (it is retried, and
    /// meanwhile new prepares are refused). For readiness.
    pub fn recovery(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.core.recovery.subscribe()
    }

    /// The checkpoint file.
    pub fn checkpoint_path(&self) -> &Path {
        self.core.store.path()
    }

    /// The CDI spec file of claim `claim_uid` (whether or not it exists).
    pub fn cdi_spec_path(&self, claim_uid: &ClaimUid) -> Option<PathBuf> {
        self.core.specs.path_of(claim_uid.as_str()).ok()
    }
}

/// The claim a record is of.
fn claim_ref(uid: &ClaimUid, record: &crate::checkpoint::ClaimRecord) -> ClaimRef {
    ClaimRef::new(&record.namespace, &record.name, uid.clone())
}

fn uids_of(claims: &[ClaimRef]) -> Vec<ClaimUid> {
    claims.iter().map(|c| c.uid.clone()).collect()
}

/// Runs blocking driver work off the async runtime; a panic becomes a per-claim error.
async fn blocking<T: Send + 'static>(
    claims: &[ClaimRef],
    work: impl FnOnce() -> BTreeMap<ClaimUid, Result<T, ClaimError>> + Send + 'static,
) -> BTreeMap<ClaimUid, Result<T, ClaimError>> {
    match tokio::task::spawn_blocking(work).await {
        Ok(results) => results,
        Err(e) => claims
            .iter()
            .map(|claim| {
                let failure = ClaimFailure::Internal(e.to_string());
                (claim.uid.clone(), Err(ClaimError::new(claim, failure)))
            })
            .collect(),
    }
}

impl NodeDriver {
    /// Logs how a prepared claim's NVIDIA configs were read and records it as an Event on the
    /// claim, in the background: a slow or failing Event write never delays the answer.
    fn note_translation(&self, claim: ResourceClaim, notes: Vec<String>) {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        for note in &notes {
            tracing::info!(claim = %format!("{namespace}/{name}"), "NVIDIA config translated: {note}");
        }
        let claims = Arc::clone(&self.core.claims);
        let text = notes.join("\n");
        tokio::spawn(async move {
            if let Err(error) = claims.note(&claim, text).await {
                tracing::warn!(%error, "the translation is logged but not recorded as an Event");
            }
        });
    }
}

impl NodeDriver {
    /// The devices of those of `claims` that are prepared, as the checkpoint says under the
    /// state lock (another plugin process may have changed it). If the lock cannot be taken,
    /// none: the batch then fails each claim with the reason.
    async fn completed(&self, claims: &[ClaimRef]) -> BTreeMap<ClaimUid, Vec<PreparedDevice>> {
        let core = Arc::clone(&self.core);
        let uids = uids_of(claims);
        let read = tokio::task::spawn_blocking(move || {
            let _state = core.store.hold()?;
            Ok::<_, crate::checkpoint::CheckpointStoreError>(
                uids.into_iter()
                    .filter_map(|uid| Some((uid.clone(), core.completed_devices(&uid)?)))
                    .collect(),
            )
        });
        match read.await {
            Ok(Ok(completed)) => completed,
            Ok(Err(error)) => {
                tracing::warn!(error = %error::logged(&error), "cannot read the checkpoint");
                BTreeMap::new()
            }
            Err(_) => BTreeMap::new(),
        }
    }
}

impl NodeDriver {
    /// While recovery is pending (the API server was away), a prepare of a claim not prepared
    /// yet asks for a recovery attempt now rather than after the backoff, and waits for it.
    async fn recover_for(&self, claims: &[ClaimRef]) {
        if self.core.recovery.pending().is_none() {
            return;
        }
        let completed = self.completed(claims).await;
        if claims.iter().all(|c| completed.contains_key(&c.uid)) {
            return; // served from the checkpoint, recovered or not
        }
        self.core
            .recovery
            .attempt_now(recovery::PREPARE_WAITS_FOR_RECOVERY)
            .await;
    }
}

impl DraDriver for NodeDriver {
    type Error = ClaimError;

    async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> BTreeMap<ClaimUid, PrepareResult<ClaimError>> {
        self.recover_for(&claims).await;
        let gate = self.core.recovery.gate.read().await;
        // Held from before the reads until the answer: a claim is never read, prepared or
        // unprepared by two calls at once; other claims' calls run in parallel.
        let held = self.core.locks.lock(&uids_of(&claims)).await;
        let mut results = BTreeMap::new();
        let mut to_read = Vec::new();
        let recovering = self.core.recovery.pending();
        let mut completed = self.completed(&claims).await;
        for claim in claims {
            match (completed.remove(&claim.uid), &recovering) {
                (Some(devices), _) => {
                    results.insert(claim.uid.clone(), Ok(devices));
                }
                (None, Some(reason)) => {
                    let failure = ClaimFailure::Recovering(reason.clone());
                    results.insert(claim.uid.clone(), Err(ClaimError::new(&claim, failure)));
                }
                (None, None) => to_read.push(claim),
            }
        }
        if to_read.is_empty() {
            return results;
        }
        let reads = to_read.iter().map(|claim| {
            self.core
                .claims
                .get(claim.namespace.clone(), claim.name.clone())
        });
        let fetched = futures::future::join_all(reads).await;
        // How NVIDIA configs are read, noted on each claim that gets prepared now.
        let translated: Vec<(ClaimUid, ResourceClaim, Vec<String>)> = to_read
            .iter()
            .zip(&fetched)
            .filter_map(|(claim, fetched)| {
                let object = fetched.as_ref().ok()?.as_ref()?;
                let notes = crate::plan::translation_notes(object);
                (!notes.is_empty()).then(|| (claim.uid.clone(), object.clone(), notes))
            })
            .collect();
        let work: Vec<_> = to_read.iter().cloned().zip(fetched).collect();
        let core = Arc::clone(&self.core);
        let prepared = blocking(&to_read, move || {
            let _held = held;
            core.prepare_batch(work)
        });
        results.extend(prepared.await);
        drop(gate);
        if let Some(sink) = &self.status {
            let records = self.core.store.records();
            for claim in &to_read {
                let record = records.get(&claim.uid);
                if let (Some(Ok(_)), Some(record)) = (results.get(&claim.uid), record) {
                    let prepared = claim_ref(&claim.uid, record);
                    sink.prepared(prepared, self.core.device_statuses(record));
                }
            }
        }
        for (uid, object, notes) in translated {
            if matches!(results.get(&uid), Some(Ok(_))) {
                self.note_translation(object, notes);
            }
        }
        results
    }

    async fn unprepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> BTreeMap<ClaimUid, UnprepareResult<ClaimError>> {
        let _gate = self.core.recovery.gate.read().await;
        let held = self.core.locks.lock(&uids_of(&claims)).await;
        let core = Arc::clone(&self.core);
        let batch = claims.clone();
        let results = blocking(&claims, move || {
            let _held = held;
            core.unprepare_batch(batch)
        })
        .await;
        if let Some(sink) = &self.status {
            for claim in &claims {
                if matches!(results.get(&claim.uid), Some(Ok(_))) {
                    sink.unprepared(claim.clone());
                }
            }
        }
        results
    }
}
