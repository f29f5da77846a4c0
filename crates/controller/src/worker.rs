//! Processing one pod: gather the inputs from the caches, let the planner decide, carry the
//! decision out through the API, report on the pod. The only place decisions meet IO.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::api::{ApiWriter, WriteError, condition_status, current_condition};
use crate::cluster::Cluster;
use crate::events::{Events, PodEvent};
use crate::group::WaitingGroups;
use crate::metrics::Metrics;
use crate::queue::Processed;
use crate::trim;
use tessera_placement::group::group_key;
use tessera_placement::message::{CONDITION_MESSAGE_LIMIT, claim_list, truncate};
use tessera_placement::planner::{Action, Failure, Placement, PodPlan};
use tessera_placement::pods::is_candidate;
use tessera_placement::protocol::{ClaimMark, PodPlacement, is_gated, object_key};
use tessera_placement::reason::{EventKind, PodReason};
use tessera_placement::resolve::{Resolution, resolve_claims};
use tessera_placement::view::{PodContext, Settings, decide_pod, decide_released};
use tessera_placement::writes::{
    ClaimProgress, UndoStep, allocation_patch, deallocation_patch, is_marked, mark_for, mark_patch,
    pod_patch, undo_plan, unmark_patch,
};

/// What the pod's condition and event say.
pub(crate) struct Report {
    pub reason: PodReason,
    pub message: String,
    pub kind: EventKind,
}

/// Processes pods, one at a time.
pub struct Worker {
    pub cluster: Arc<Cluster>,
    pub writer: ApiWriter,
    /// Where the worker's events go to be published off its path ([`crate::events`]).
    pub events: Events,
    pub metrics: Arc<Metrics>,
    pub config: Settings,
    /// Groups waiting for capacity (the starvation policy, [`crate::group`]).
    pub waiting: WaitingGroups,
}

fn claim_key(claim: &ResourceClaim) -> String {
    object_key(&claim.metadata)
}

/// Logs (at debug level, target `tessera_controller::timing`) that `step` of processing `pod`
/// ended now, in Unix microseconds: `popped`, `decided`, `allocated`, `released`, `done`. The
/// placement benchmark turns them into a timeline per claim; off (one level check) otherwise.
pub(crate) fn timing(pod: &str, step: &'static str) {
    tracing::debug!(target: "tessera_controller::timing", pod, step, unix_us = unix_micros());
}

/// [`timing`] for a pod object (its key made only when the events are on).
fn timing_of(pod: &Pod, step: &'static str) {
    if tracing::enabled!(target: "tessera_controller::timing", tracing::Level::DEBUG) {
        timing(&object_key(&pod.metadata), step);
    }
}

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl Worker {
    /// Processes the pod `namespace/name`.
    pub async fn process(&self, key: &str) -> Processed {
        timing(key, "popped");
        let outcome = self.process_pod(key).await;
        tracing::debug!(target: "tessera_controller::timing", pod = key, step = "done",
            outcome = ?outcome, unix_us = unix_micros());
        outcome
    }

    async fn process_pod(&self, key: &str) -> Processed {
        let started = Instant::now();
        let (pod_namespace, name) = key.split_once('/').unwrap_or(("", key));
        let Some(pod) = self.cluster.pod(pod_namespace, name) else {
            return Processed::Done;
        };
        if !is_candidate(&pod, &self.config.gate) {
            return Processed::Done;
        }
        if is_gated(&pod, &self.config.gate)
            && let Some(key) = group_key(&pod)
        {
            return self.process_group(pod, key, started).await;
        }
        self.process_single(pod, started).await
    }

    /// Parks a pod that a waiting group holds back ([`crate::group`]), saying so on the pod.
    async fn wait_behind_group(&self, pod: &Pod) -> Option<Processed> {
        let by = self.held_back(pod, None)?;
        self.metrics.pod_failure(PodReason::WaitingBehindGroup);
        let message = format!(
            "waiting behind {}, which arrived earlier and has waited for capacity since {}: \
             pods that arrived later are not placed before it",
            by.key, by.since
        );
        let report = Report {
            reason: PodReason::WaitingBehindGroup,
            message,
            kind: EventKind::Normal,
        };
        self.report(pod, report).await;
        Some(Processed::Park)
    }

    /// Processes a pod that is placed alone.
    pub(crate) async fn process_single(&self, pod: Arc<Pod>, started: Instant) -> Processed {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let namespace = namespace.as_str();
        let gated = is_gated(&pod, &self.config.gate);
        if gated && let Some(outcome) = self.wait_behind_group(&pod).await {
            return outcome;
        }
        let resolution = resolve_claims(
            &pod,
            |claim| self.cluster.claim(namespace, claim),
            |template| self.cluster.template_exists(namespace, template),
        );
        let claims = match resolution {
            Resolution::Resolved(claims) => claims,
            Resolution::Waiting(message) => {
                self.metrics.pod_failure(PodReason::WaitingForClaims);
                self.report(
                    &pod,
                    Report {
                        reason: PodReason::WaitingForClaims,
                        message,
                        kind: EventKind::Normal,
                    },
                )
                .await;
                return Processed::Park;
            }
            Resolution::Invalid(message) => {
                self.metrics.pod_failure(PodReason::InvalidInput);
                self.report(
                    &pod,
                    Report {
                        reason: PodReason::InvalidInput,
                        message,
                        kind: EventKind::Warning,
                    },
                )
                .await;
                return Processed::Park;
            }
        };
        // A released pod whose claims are all allocated (each placed pod is looked at once more
        // after its release) needs neither the inventory nor copies of what is in use.
        if let Some(decision) = decide_released(&pod, &claims, &self.config) {
            self.metrics
                .decision_seconds
                .observe(started.elapsed().as_secs_f64());
            return self.execute(pod, gated, decision, started).await;
        }
        let snapshot = self.cluster.inventory(|| {
            self.metrics.inventory_rebuilds.inc();
        });
        // The context holds a `&dyn Fn`, which is not `Sync`: keep it out of the awaits below. The
        // snapshots of what is in use go with it, so that the writes below (which update the
        // counts) do not copy them.
        let decision = {
            let in_use = self.cluster.devices_in_use();
            let usage = self
                .cluster
                .node_usage(pod.metadata.uid.as_deref().unwrap_or_default());
            let unmanaged = || snapshot.unmanaged();
            let context = PodContext {
                devices: &snapshot.devices,
                unmanaged: &unmanaged,
                in_use: &in_use,
                usage: &usage,
            };
            decide_pod(&pod, &claims, &context, &self.config, Timestamp::now())
        };
        self.metrics
            .decision_seconds
            .observe(started.elapsed().as_secs_f64());
        timing_of(&pod, "decided");
        self.execute(pod, gated, decision, started).await
    }

    async fn execute(
        &self,
        mut pod: Arc<Pod>,
        gated: bool,
        decision: PodPlan,
        started: Instant,
    ) -> Processed {
        let PodPlan {
            action,
            mut record,
            record_first,
        } = decision;
        if record_first {
            let patch = pod_patch(&pod, Some(&record), None);
            match self
                .writer
                .patch_pod("record the nodes to avoid for", &pod, &patch)
                .await
            {
                Ok(updated) => pod = self.assume_pod(updated),
                Err(e) => return self.write_failed(&pod, e),
            }
        }
        match action {
            Action::Nothing => Processed::Done,
            Action::Release { node } => {
                if let Some(node) = node {
                    record.node = node;
                }
                self.release_allocated(pod, gated, record).await
            }
            Action::LeaveToScheduler { message } => {
                self.leave_to_scheduler(pod, gated, message).await
            }
            Action::CannotPlace {
                failure,
                message,
                undo,
            } => self.cannot_place(pod, failure, message, undo).await,
            Action::Place(placement) => self.place(pod, gated, record, placement, started).await,
        }
    }

    /// Every claim of the pod is already allocated: release the pod to the scheduler.
    async fn release_allocated(
        &self,
        pod: Arc<Pod>,
        gated: bool,
        mut record: PodPlacement,
    ) -> Processed {
        record.placed_at = Timestamp::now().to_string();
        let message =
            "every claim of the pod was already allocated; released it to the scheduler".to_owned();
        let report = Report {
            reason: PodReason::AlreadyAllocated,
            message,
            kind: EventKind::Normal,
        };
        self.release(pod, gated, &record, report, || {}).await
    }

    /// The scheduler can allocate what the pod asks and the controller cannot: remove the gate
    /// without a placement record (the controller has nothing more to do with this pod).
    async fn leave_to_scheduler(
        &self,
        mut pod: Arc<Pod>,
        gated: bool,
        message: String,
    ) -> Processed {
        let gate = gated.then_some(self.config.gate.as_str());
        let patch = pod_patch(&pod, None, gate);
        match self.writer.patch_pod("release", &pod, &patch).await {
            Ok(updated) => pod = self.assume_pod(updated),
            Err(e) => return self.write_failed(&pod, e),
        }
        self.metrics.pods_left_to_scheduler.inc();
        self.report(
            &pod,
            Report {
                reason: PodReason::LeftToScheduler,
                message,
                kind: EventKind::Normal,
            },
        )
        .await;
        Processed::Done
    }

    /// The pod fits nowhere now: undo its own partial allocations, report why and park it.
    async fn cannot_place(
        &self,
        pod: Arc<Pod>,
        failure: Failure,
        message: String,
        undo: Vec<Arc<ResourceClaim>>,
    ) -> Processed {
        for claim in undo {
            if let Err(e) = self.undo(&[ClaimProgress::of_own(claim)], &pod).await {
                return self.write_failed(&pod, e);
            }
        }
        self.metrics.pod_failure(failure.reason());
        self.report(
            &pod,
            Report {
                reason: failure.reason(),
                message,
                kind: EventKind::Warning,
            },
        )
        .await;
        Processed::Park
    }

    async fn place(
        &self,
        pod: Arc<Pod>,
        gated: bool,
        mut record: PodPlacement,
        placement: Placement,
        started: Instant,
    ) -> Processed {
        let mut progress: Vec<ClaimProgress> = Vec::new();
        if let Err(e) = self.write_placement(&pod, &placement, &mut progress).await {
            tracing::info!(pod = %object_key(&pod.metadata), error = %e,
                "writing the placement failed; undoing what was written");
            if let Err(undo) = self.undo(&progress, &pod).await {
                tracing::warn!(pod = %object_key(&pod.metadata), error = %undo,
                    "undoing a partial placement failed; the next attempt completes or undoes it");
            }
            return self.write_failed(&pod, e);
        }
        timing_of(&pod, "allocated");
        record.node = placement.node.clone();
        record.placed_at = Timestamp::now().to_string();
        let message = placed_message(&placement);
        self.metrics
            .claims_allocated
            .inc_by(placement.writes.len() as u64);
        let report = Report {
            reason: PodReason::Allocated,
            message,
            kind: EventKind::Normal,
        };
        self.release(pod, gated, &record, report, || {
            self.metrics.pods_placed.inc();
            self.metrics
                .placement_seconds
                .observe(started.elapsed().as_secs_f64());
        })
        .await
    }

    /// Undoes the controller's earlier allocations the placement replaces, then writes its
    /// claims in order; `progress` records what was written, for undoing.
    pub(crate) async fn write_placement(
        &self,
        pod: &Pod,
        placement: &Placement,
        progress: &mut Vec<ClaimProgress>,
    ) -> Result<(), WriteError> {
        let mut newest: HashMap<String, Arc<ResourceClaim>> = HashMap::new();
        for claim in &placement.undo {
            let updated = self
                .undo(&[ClaimProgress::of_own(claim.clone())], pod)
                .await?;
            newest.extend(updated.into_iter().map(|c| (claim_key(&c), c)));
        }
        for write in &placement.writes {
            let claim = newest
                .get(&claim_key(&write.claim))
                .cloned()
                .unwrap_or_else(|| write.claim.clone());
            self.write_claim(pod, &placement.node, claim, &write.allocation, progress)
                .await?;
        }
        Ok(())
    }

    /// Writes one claim: mark and finalizer, then the allocation. `progress` records what was
    /// written, for undoing.
    async fn write_claim(
        &self,
        pod: &Pod,
        node: &str,
        mut claim: Arc<ResourceClaim>,
        allocation: &AllocationResult,
        progress: &mut Vec<ClaimProgress>,
    ) -> Result<(), WriteError> {
        let mark = mark_for(&claim, pod, node);
        if !is_marked(&claim, &mark) {
            let updated = self
                .writer
                .patch_claim(
                    "add the finalizer and mark to",
                    &claim,
                    &mark_patch(&claim, &mark),
                )
                .await?;
            claim = self.assume_claim(updated);
        }
        progress.push(ClaimProgress {
            claim: claim.clone(),
            marked: true,
            finalizer_added: mark.finalizer_added,
            allocated: false,
        });
        let mut allocation = allocation.clone();
        allocation.allocation_timestamp = Some(Time(Timestamp::now()));
        let updated = self
            .writer
            .patch_claim_status(
                "write the allocation of",
                &claim,
                &allocation_patch(&claim, &allocation),
            )
            .await?;
        let claim = self.assume_claim(updated);
        if let Some(last) = progress.last_mut() {
            last.claim = claim;
            last.allocated = true;
        }
        Ok(())
    }

    /// Undoes `progress` (see [`undo_plan`]); returns the claims as they are afterwards.
    pub(crate) async fn undo(
        &self,
        progress: &[ClaimProgress],
        pod: &Pod,
    ) -> Result<Vec<Arc<ResourceClaim>>, WriteError> {
        let mut newest: HashMap<String, Arc<ResourceClaim>> = HashMap::new();
        for step in undo_plan(progress) {
            let key = claim_key(step.claim());
            let claim = newest
                .get(&key)
                .cloned()
                .unwrap_or_else(|| step.claim().clone());
            let updated = self.undo_step(&step, claim, pod).await?;
            if matches!(step, UndoStep::Deallocate(_)) {
                self.metrics.claims_undone.inc();
            }
            newest.insert(key, updated);
        }
        Ok(newest.into_values().collect())
    }

    /// One undo step, re-reading the claim after a conflict (up to three times) and skipping the
    /// step when the claim no longer carries what the controller wrote.
    async fn undo_step(
        &self,
        step: &UndoStep,
        mut claim: Arc<ResourceClaim>,
        pod: &Pod,
    ) -> Result<Arc<ResourceClaim>, WriteError> {
        let mut attempts = 0;
        loop {
            let result = match step {
                UndoStep::Deallocate(_) => {
                    self.writer
                        .patch_claim_status(
                            "clear the allocation of",
                            &claim,
                            &deallocation_patch(&claim),
                        )
                        .await
                }
                UndoStep::Unmark {
                    remove_finalizer, ..
                } => {
                    self.writer
                        .patch_claim(
                            "remove the finalizer and mark from",
                            &claim,
                            &unmark_patch(&claim, *remove_finalizer),
                        )
                        .await
                }
            };
            match result {
                Ok(updated) => return Ok(self.assume_claim(updated)),
                Err(WriteError::Conflict { .. }) if attempts < 3 => {
                    attempts += 1;
                    let Some(mut fresh) = self.writer.get_claim(&claim).await? else {
                        return Ok(claim);
                    };
                    trim::claim(&mut fresh);
                    let ours = ClaimMark::of(&fresh).is_some_and(|m| m.is_for(pod));
                    let applies = match step {
                        UndoStep::Deallocate(_) => {
                            ours && tessera_placement::claims::allocation(&fresh).is_some()
                                && !tessera_placement::claims::is_reserved(&fresh)
                        }
                        UndoStep::Unmark { .. } => ours,
                    };
                    claim = Arc::new(fresh);
                    if !applies {
                        return Ok(claim);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Removes the gate (if gated) and records the placement, then (after `released`) reports.
    pub(crate) async fn release(
        &self,
        pod: Arc<Pod>,
        gated: bool,
        record: &PodPlacement,
        report: Report,
        released: impl FnOnce(),
    ) -> Processed {
        let gate = gated.then_some(self.config.gate.as_str());
        let updated = match self
            .writer
            .patch_pod("release", &pod, &pod_patch(&pod, Some(record), gate))
            .await
        {
            Ok(updated) => self.assume_pod(updated),
            Err(e) => return self.write_failed(&pod, e),
        };
        timing_of(&pod, "released");
        released();
        self.report(&updated, report).await;
        Processed::Done
    }

    pub(crate) fn write_failed(&self, pod: &Pod, e: WriteError) -> Processed {
        self.metrics.write_failure(&e);
        tracing::info!(pod = %object_key(&pod.metadata), error = %e, "write failed; retrying later");
        Processed::Retry
    }

    /// Sets the condition and queues an event ([`crate::events`]), unless the condition already
    /// says the same.
    pub(crate) async fn report(&self, pod: &Pod, report: Report) {
        let message = truncate(&report.message, CONDITION_MESSAGE_LIMIT);
        let status = condition_status(report.reason);
        let unchanged = current_condition(pod).is_some_and(|c| {
            c.status == status
                && c.reason.as_deref() == Some(report.reason.as_str())
                && c.message.as_deref() == Some(message.as_str())
        });
        if unchanged {
            return;
        }
        match self
            .writer
            .set_condition(pod, report.reason, &message)
            .await
        {
            Ok(updated) => {
                self.assume_pod(updated);
            }
            Err(e) => {
                tracing::info!(pod = %object_key(&pod.metadata), error = %e, "setting the pod condition failed");
            }
        }
        self.events.publish(PodEvent::new(
            pod,
            report.kind,
            report.reason.as_str(),
            &report.message,
        ));
    }

    fn assume_claim(&self, mut claim: ResourceClaim) -> Arc<ResourceClaim> {
        trim::claim(&mut claim);
        self.cluster.assume_claim(claim)
    }

    fn assume_pod(&self, mut pod: Pod) -> Arc<Pod> {
        trim::pod(&mut pod);
        self.cluster.assume_pod(pod)
    }
}

/// `allocated claims ns/a (gpu-4, gpu-5), ns/b (gpu-6) on node n (topology-aware, score …)`.
pub(crate) fn placed_message(placement: &Placement) -> String {
    let claims: Vec<String> = placement
        .writes
        .iter()
        .map(|w| {
            let devices: Vec<&str> = w
                .allocation
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
                .map(|r| r.device.as_str())
                .collect();
            format!(
                "{} ({})",
                claim_list(std::slice::from_ref(&w.claim)),
                devices.join(", ")
            )
        })
        .collect();
    let truncated = if placement.truncated {
        "; the search stopped at its step budget, a better placement may exist"
    } else {
        ""
    };
    format!(
        "allocated {} on node {} (topology-aware; {}){truncated}",
        claims.join(", "),
        placement.node,
        placement.score
    )
}
