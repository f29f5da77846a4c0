//! Prepare and unprepare batches (blocking; see the ordering in the module docs of
//! [`crate::driver`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tessera_kubelet_grpc::{ClaimRef, ClaimUid, PrepareResult, PreparedDevice, UnprepareResult};

use super::core::Core;
use super::effects::has_node_local_effects;
use super::error::EffectError;
use super::error::{ClaimError, ClaimFailure, logged};
use super::placements::HeldPlacements;
use crate::checkpoint::{CheckpointStoreError, HeldState};
use crate::checkpoint::{ClaimRecord, ClaimState};
use crate::claims::ClaimSourceError;
use crate::plan::{PlanContext, PlanError, plan_claim};

/// A claim as read from the API server.
pub(super) type Fetched = Result<Option<ResourceClaim>, ClaimSourceError>;

/// The devices the kubelet gets for a prepared claim.
pub(super) fn prepared_devices(record: &ClaimRecord) -> Vec<PreparedDevice> {
    record
        .devices
        .iter()
        .map(|device| PreparedDevice {
            request_names: vec![device.request.clone()],
            pool_name: device.pool.clone(),
            device_name: device.device.clone(),
            cdi_device_ids: device.cdi_device_ids.clone(),
            share_id: device.share.as_ref().map(|s| s.share_id.clone()),
        })
        .chain(record.imex.iter().map(|imex| PreparedDevice {
            request_names: vec![imex.request.clone()],
            pool_name: imex.pool.clone(),
            device_name: imex.device.clone(),
            cdi_device_ids: imex.cdi_device_ids.clone(),
            share_id: None,
        }))
        .collect()
}

fn failed<T>(
    claim: &ClaimRef,
    operation: &str,
    failure: impl Into<ClaimFailure>,
) -> Result<T, ClaimError> {
    let error = ClaimError::new(claim, failure);
    tracing::warn!(claim = %logged(&claim), error = %logged(&error.failure), "{operation} failed");
    Err(error)
}

/// Fails every claim of a batch whose intent record could not be written.
fn fail_all<'a, T>(
    claims: impl IntoIterator<Item = &'a ClaimRef>,
    operation: &str,
    error: &Arc<CheckpointStoreError>,
    results: &mut BTreeMap<ClaimUid, Result<T, ClaimError>>,
) {
    for claim in claims {
        let failure = EffectError::checkpoint(error);
        results.insert(claim.uid.clone(), failed(claim, operation, failure));
    }
}

impl Core {
    /// The MIG placements the recorded claims hold.
    fn held_placements(&self) -> HeldPlacements {
        HeldPlacements::of(&self.store.records())
    }

    /// The devices of `uid` if it is prepared.
    pub(super) fn completed_devices(&self, uid: &ClaimUid) -> Option<Vec<PreparedDevice>> {
        self.store
            .get(uid)
            .filter(|r| r.state == ClaimState::PrepareCompleted)
            .map(|r| prepared_devices(&r))
    }

    fn plan(&self, claim: &ClaimRef, object: &ResourceClaim) -> Result<ClaimRecord, PlanError> {
        let inventory = self.inventory();
        let context = |inventory| PlanContext {
            node_name: &self.node_name,
            inventory,
            mig_mode: self.mig_mode,
            mps_root: &self.mps_root,
            total_shares: self.total_shares,
            imex_root: &self.imex_root,
        };
        match plan_claim(object, claim, context(&inventory)) {
            // The inventory may be stale (a MIG reconfiguration): look again once.
            Err(PlanError::UnknownDevice { .. } | PlanError::MigInstanceMissing { .. }) => {
                match self.refresh_inventory() {
                    Ok(fresh) => plan_claim(object, claim, context(&fresh)),
                    Err(e) => {
                        tracing::warn!(error = %e, "re-reading the inventory failed");
                        plan_claim(object, claim, context(&inventory))
                    }
                }
            }
            other => other,
        }
    }

    /// Undoes a record an earlier call left unfinished, then drops it.
    fn clean_up_unfinished(&self, uid: &ClaimUid, record: &ClaimRecord) -> Result<(), EffectError> {
        self.undo(uid, record, &self.held_placements())?;
        self.store.update(|claims| {
            claims.remove(uid);
        })?;
        Ok(())
    }

    /// Steps 1–2 for one claim: the recorded devices, or the plan, or an error.
    fn admit(
        &self,
        claim: &ClaimRef,
        fetched: Fetched,
        planned: &BTreeMap<ClaimUid, ClaimRecord>,
    ) -> Result<Admitted, ClaimError> {
        let uid = &claim.uid;
        match self.store.get(uid) {
            Some(record) if record.state == ClaimState::PrepareCompleted => {
                return Ok(Admitted::Done(prepared_devices(&record)));
            }
            Some(record) => {
                if let Err(e) = self.clean_up_unfinished(uid, &record) {
                    return failed(claim, "cleaning up an unfinished claim", e);
                }
            }
            None => {}
        }
        let object = match fetched {
            Ok(Some(object)) => object,
            Ok(None) => return failed(claim, "reading the claim", ClaimFailure::NotFound),
            Err(e) => return failed(claim, "reading the claim", e),
        };
        let record = match self.plan(claim, &object) {
            Ok(record) => record,
            Err(e) => return failed(claim, "planning", e),
        };
        let records = self.store.records();
        let held = HeldPlacements::of(records.iter().chain(planned));
        if let Err(e) = self.check_placements_free(uid, &record, &held) {
            return failed(claim, "planning", e);
        }
        Ok(Admitted::Planned(record))
    }

    /// Undoes a claim whose step 4 failed. Keeps the (partial) record if the undo did not
    /// finish: the next call or start retries it.
    fn undo_failed(
        &self,
        uid: &ClaimUid,
        record: ClaimRecord,
        error: EffectError,
    ) -> (EffectError, Option<ClaimRecord>) {
        let leftover = self
            .undo(uid, &record, &self.held_placements())
            .err()
            .map(|_| record);
        (error, leftover)
    }

    /// Holds the node's state lock for a batch, or fails every claim of it.
    fn hold_state<'a, T>(
        &self,
        claims: impl IntoIterator<Item = &'a ClaimRef>,
        operation: &str,
    ) -> Result<HeldState, BTreeMap<ClaimUid, Result<T, ClaimError>>> {
        self.store.hold().map_err(|e| {
            let mut results = BTreeMap::new();
            fail_all(claims, operation, &Arc::new(e), &mut results);
            results
        })
    }

    pub(super) fn prepare_batch(
        &self,
        work: Vec<(ClaimRef, Fetched)>,
    ) -> BTreeMap<ClaimUid, PrepareResult<ClaimError>> {
        let _state = match self.hold_state(work.iter().map(|(c, _)| c), "preparing") {
            Ok(held) => held,
            Err(failed) => return failed,
        };
        let admission = self.admission.lock().unwrap_or_else(|e| e.into_inner());
        let Admissions {
            mut results,
            claims,
            planned,
        } = self.admit_batch(work);
        if planned.is_empty() {
            return results;
        }
        if let Err(e) = self.record_prepare_started(&planned) {
            fail_all(
                claims.values(),
                "recording PrepareStarted",
                &e,
                &mut results,
            );
            return results;
        }
        drop(admission);
        crate::crash::point("prepare:started-recorded");
        let outcome = self.establish_batch(planned);
        self.record_prepare_completed(outcome, &claims, &mut results);
        results
    }

    /// Steps 1–2 for every claim of a batch, in order (a claim's placements are checked
    /// against those planned before it in the same batch).
    fn admit_batch(&self, work: Vec<(ClaimRef, Fetched)>) -> Admissions {
        let mut admissions = Admissions::default();
        for (claim, fetched) in work {
            match self.admit(&claim, fetched, &admissions.planned) {
                Ok(Admitted::Done(devices)) => {
                    admissions.results.insert(claim.uid.clone(), Ok(devices));
                }
                Ok(Admitted::Planned(record)) => {
                    admissions.planned.insert(claim.uid.clone(), record);
                    admissions.claims.insert(claim.uid.clone(), claim);
                }
                Err(message) => {
                    admissions.results.insert(claim.uid.clone(), Err(message));
                }
            }
        }
        admissions
    }

    /// Step 3: one write records every planned claim that has node-local side effects
    /// before the first of them. A claim whose only side effect is its CDI spec needs no
    /// such record: a spec without a record is removed at the next start.
    fn record_prepare_started(
        &self,
        planned: &BTreeMap<ClaimUid, ClaimRecord>,
    ) -> Result<(), Arc<CheckpointStoreError>> {
        let intents: Vec<(&ClaimUid, &ClaimRecord)> = planned
            .iter()
            .filter(|(_, record)| has_node_local_effects(record))
            .collect();
        if intents.is_empty() {
            return Ok(());
        }
        self.store
            .update(|records| {
                records.extend(intents.iter().map(|(u, r)| ((*u).clone(), (*r).clone())));
            })
            .map_err(Arc::new)
    }

    /// Step 4: node-local side effects claim by claim, then the CDI specs of the claims
    /// that got that far as one batch (one directory fsync). A failure undoes that claim.
    fn establish_batch(
        &self,
        planned: BTreeMap<ClaimUid, ClaimRecord>,
    ) -> BTreeMap<ClaimUid, Outcome> {
        let mut outcome: BTreeMap<ClaimUid, Outcome> = BTreeMap::new();
        let mut established = BTreeMap::new();
        for (uid, mut record) in planned {
            match self.establish_node_local(&uid, &mut record) {
                Ok(()) => {
                    crate::crash::point("prepare:node-local-established");
                    established.insert(uid, record);
                }
                Err(e) => {
                    let failure = self.undo_failed(&uid, record, e);
                    outcome.insert(uid, Err(failure));
                }
            }
        }
        let mut written = self.write_specs(&established);
        crate::crash::point("prepare:specs-written");
        for (uid, mut record) in established {
            match written.remove(&uid).unwrap_or(Ok(())) {
                Ok(()) => {
                    record.state = ClaimState::PrepareCompleted;
                    outcome.insert(uid, Ok(record));
                }
                Err(e) => {
                    let failure = self.undo_failed(&uid, record, e);
                    outcome.insert(uid, Err(failure));
                }
            }
        }
        outcome
    }

    /// Step 5: one write records the finished claims and drops the undone ones; then each
    /// claim's answer to the kubelet.
    fn record_prepare_completed(
        &self,
        outcome: BTreeMap<ClaimUid, Outcome>,
        claims: &BTreeMap<ClaimUid, ClaimRef>,
        results: &mut BTreeMap<ClaimUid, PrepareResult<ClaimError>>,
    ) {
        let committed = self
            .store
            .update(|records| {
                for (uid, result) in &outcome {
                    match result {
                        Ok(record) | Err((_, Some(record))) => {
                            records.insert(uid.clone(), record.clone());
                        }
                        Err((_, None)) => {
                            records.remove(uid);
                        }
                    }
                }
            })
            .map_err(Arc::new);
        crate::crash::point("prepare:completed-recorded");
        for (uid, result) in outcome {
            let claim = &claims[&uid];
            let answer = match (result, &committed) {
                (Ok(record), Ok(())) => Ok(prepared_devices(&record)),
                (Ok(record), Err(e)) => {
                    // Not recorded as completed: the checkpoint still says PrepareStarted.
                    // Undo now rather than leave a claim the kubelet was not told about.
                    let _ = self.undo(&uid, &record, &self.held_placements());
                    failed(
                        claim,
                        "recording PrepareCompleted",
                        EffectError::checkpoint(e),
                    )
                }
                (Err((e, _)), _) => failed(claim, "preparing", e),
            };
            results.insert(claim.uid.clone(), answer);
        }
    }

    pub(super) fn unprepare_batch(
        &self,
        claims: Vec<ClaimRef>,
    ) -> BTreeMap<ClaimUid, UnprepareResult<ClaimError>> {
        let _state = match self.hold_state(&claims, "unpreparing") {
            Ok(held) => held,
            Err(failed) => return failed,
        };
        let (mut results, undoing) = self.sort_unprepare_batch(claims);
        if undoing.is_empty() {
            return results;
        }
        if let Err(e) = self.record_unprepare_started(&undoing) {
            let claims = undoing.iter().map(|(claim, _)| claim);
            fail_all(claims, "recording UnprepareStarted", &e, &mut results);
            return results;
        }
        crate::crash::point("unprepare:started-recorded");
        let done = self.undo_batch(&undoing, &mut results);
        self.drop_unprepared_records(done, &mut results);
        results
    }

    /// The claims of an unprepare batch that have a record, with it; the answers for the
    /// others (nothing to do, or what can be found without a record undone).
    #[allow(clippy::type_complexity)]
    fn sort_unprepare_batch(
        &self,
        claims: Vec<ClaimRef>,
    ) -> (
        BTreeMap<ClaimUid, UnprepareResult<ClaimError>>,
        Vec<(ClaimRef, ClaimRecord)>,
    ) {
        let mut results = BTreeMap::new();
        let mut undoing: Vec<(ClaimRef, ClaimRecord)> = Vec::new();
        for claim in claims {
            match self.store.get(&claim.uid) {
                // The checkpoint was lost and not rebuilt yet: what the claim left that can be
                // found without its record goes (its CDI spec, its MPS daemon).
                None if self.recovery.rebuild_pending() => {
                    let undone = self.undo_unrecorded(&claim.uid);
                    let answer = undone.or_else(|e| failed(&claim, "unpreparing", e));
                    results.insert(claim.uid.clone(), answer);
                }
                // Never prepared, or already unprepared: nothing to do.
                None => {
                    results.insert(claim.uid.clone(), Ok(()));
                }
                Some(record) => undoing.push((claim, record)),
            }
        }
        (results, undoing)
    }

    /// As in prepare: only claims with node-local side effects need the intent recorded.
    /// For the others, a crash between removing the spec and dropping the record leaves a
    /// prepared record whose spec the next start rewrites; the kubelet's retry removes both.
    fn record_unprepare_started(
        &self,
        undoing: &[(ClaimRef, ClaimRecord)],
    ) -> Result<(), Arc<CheckpointStoreError>> {
        let intents: Vec<&(ClaimRef, ClaimRecord)> = undoing
            .iter()
            .filter(|(_, record)| has_node_local_effects(record))
            .collect();
        if intents.is_empty() {
            return Ok(());
        }
        self.store
            .update(|records| {
                for (claim, record) in &intents {
                    let mut started = record.clone();
                    started.state = ClaimState::UnprepareStarted;
                    records.insert(claim.uid.clone(), started);
                }
            })
            .map_err(Arc::new)
    }

    /// CDI specs first, all in one batch (one directory fsync), so no new container gets
    /// the devices; then each claim's node-local effects. Returns the claims fully undone;
    /// the others get their error in `results`.
    fn undo_batch<'a>(
        &self,
        undoing: &'a [(ClaimRef, ClaimRecord)],
        results: &mut BTreeMap<ClaimUid, UnprepareResult<ClaimError>>,
    ) -> Vec<&'a (ClaimRef, ClaimRecord)> {
        let uids: Vec<&ClaimUid> = undoing.iter().map(|(claim, _)| &claim.uid).collect();
        let mut removed = self.remove_specs(&uids);
        crate::crash::point("unprepare:specs-removed");
        let mut done = Vec::new();
        for entry in undoing {
            let (claim, record) = entry;
            let uid = &claim.uid;
            let spec_removed = removed.remove(uid).unwrap_or(Ok(()));
            match self.undo_node_local(uid, record, &self.held_placements(), spec_removed) {
                Ok(()) => {
                    crate::crash::point("unprepare:node-local-undone");
                    done.push(entry);
                }
                Err(e) => {
                    results.insert(claim.uid.clone(), failed(claim, "unpreparing", e));
                }
            }
        }
        done
    }

    /// One write drops the records of the undone claims; then each one's answer.
    fn drop_unprepared_records(
        &self,
        done: Vec<&(ClaimRef, ClaimRecord)>,
        results: &mut BTreeMap<ClaimUid, UnprepareResult<ClaimError>>,
    ) {
        let committed = self
            .store
            .update(|records| {
                for (claim, _) in &done {
                    records.remove(&claim.uid);
                }
            })
            .map_err(Arc::new);
        crate::crash::point("unprepare:records-dropped");
        for (claim, record) in done {
            let answer = match &committed {
                Ok(()) => Ok(()),
                Err(e) => {
                    // Undone, but still recorded. With an UnprepareStarted record the retry
                    // finishes it. A claim recorded as PrepareCompleted (no intent written)
                    // must not stay without its spec: a prepare call would hand out CDI ids
                    // that resolve to nothing. Put the spec back; the retry removes it.
                    if !has_node_local_effects(record) {
                        let mut restored = record.clone();
                        if let Err(restore) = self.establish(&claim.uid, &mut restored) {
                            tracing::warn!(claim = %claim, error = %restore,
                                "restoring the CDI spec after a failed unprepare failed");
                        }
                    }
                    failed(claim, "recording the unprepare", EffectError::checkpoint(e))
                }
            };
            results.insert(claim.uid.clone(), answer);
        }
    }
}

/// How step 4 went for a claim: its completed record, or the error and the record to keep
/// when the undo did not finish ([`Core::undo_failed`]).
type Outcome = Result<ClaimRecord, (EffectError, Option<ClaimRecord>)>;

/// What steps 1–2 decided for a batch: the answers already known, and the claims to
/// prepare with their plans (keyed by UID).
#[derive(Default)]
struct Admissions {
    results: BTreeMap<ClaimUid, PrepareResult<ClaimError>>,
    claims: BTreeMap<ClaimUid, ClaimRef>,
    planned: BTreeMap<ClaimUid, ClaimRecord>,
}

/// What step 1–2 decided for a claim.
enum Admitted {
    /// Already prepared: these devices.
    Done(Vec<PreparedDevice>),
    /// To be prepared: this plan.
    Planned(ClaimRecord),
}
