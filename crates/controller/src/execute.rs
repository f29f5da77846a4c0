//! Carrying a decision out ([`tessera_placement::decision`]): its steps in order, each write
//! computed from the newest version of its object this decision has seen and sent with that
//! version's resourceVersion (a concurrent change fails it with 409 Conflict), every object the
//! server returns remembered in the caches. A write that fails among the steps carried out first
//! undoes the claim allocations the decision wrote, newest first; one among a pod's own steps
//! ends that pod's steps. Either way the pod is retried.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use tessera_api::names::{NOMINATION_ANNOTATION, PREEMPTED_BY_ANNOTATION};
use tessera_placement::claims::{allocation, is_reserved};
use tessera_placement::decision::{Count, Decision, Notice, PodPatch, Step, Then};
use tessera_placement::message::{CONDITION_MESSAGE_LIMIT, truncate};
use tessera_placement::preemption::nomination::{Nomination, PreemptedBy};
use tessera_placement::preemption::pod_priority;
use tessera_placement::protocol::{ClaimMark, object_key};
use tessera_placement::reason::{EventKind, PodReason};
use tessera_placement::writes::{
    ClaimProgress, UndoStep, allocation_patch, deallocation_patch, is_marked, mark_for, mark_patch,
    pod_patch, undo_plan, unmark_patch,
};

use crate::api::{ApiWriter, WriteError, condition_status, current_condition};
use crate::cluster::Cluster;
use crate::events::{Events, PodEvent};
use crate::metrics::Metrics;
use crate::queue::Processed;
use crate::refusals::RefusedEvictions;
use crate::timing;
use crate::trim;
use crate::waiting::WaitingGroups;

/// A write for `pod` failed: counted, logged, and the pod is retried after its backoff.
pub(crate) fn write_failed(metrics: &Metrics, pod: &Pod, e: WriteError) -> Processed {
    metrics.write_failure(&e);
    tracing::info!(pod = %object_key(&pod.metadata), error = %e, "write failed; retrying later");
    Processed::Retry
}

/// One eviction of a decision ([`Step::Evict`]).
struct Eviction<'s> {
    victim: &'s Arc<Pod>,
    preemptor: &'s Arc<Pod>,
    nominees: &'s [Arc<Pod>],
    by: &'s PreemptedBy,
    committed: bool,
}

/// Where a decision's steps go.
pub(crate) struct Targets<'w> {
    pub cluster: &'w Cluster,
    pub writer: &'w ApiWriter,
    pub events: &'w Events,
    pub metrics: &'w Metrics,
    pub waiting: &'w WaitingGroups,
    pub refused: &'w RefusedEvictions,
}

/// One decision being carried out.
pub(crate) struct Execution<'w> {
    to: Targets<'w>,
    /// When the pod was taken off the queue.
    started: Instant,
    /// The newest version of each claim and pod this decision wrote, by `namespace/name`.
    claims: HashMap<String, Arc<ResourceClaim>>,
    pods: HashMap<String, Arc<Pod>>,
    /// What each pod's claim writes got to, in order, for undoing.
    written: Vec<(Arc<Pod>, Vec<ClaimProgress>)>,
}

impl<'w> Execution<'w> {
    pub(crate) fn new(to: Targets<'w>, started: Instant) -> Execution<'w> {
        Execution {
            to,
            started,
            claims: HashMap::new(),
            pods: HashMap::new(),
            written: Vec::new(),
        }
    }

    /// Carries `decision` out.
    pub(crate) async fn run(mut self, decision: Decision) -> Processed {
        for step in decision.first {
            if let Err((pod, e)) = self.step(step).await {
                self.undo_written().await;
                return write_failed(self.to.metrics, &pod, e);
            }
        }
        for (pod, _) in &self.written {
            timing::at_pod(pod, "allocated");
        }
        let mut processed = match decision.then {
            Then::Done => Processed::Done,
            Then::Park => Processed::Park,
        };
        for steps in decision.per_pod {
            for step in steps {
                if let Err((pod, e)) = self.step(step).await {
                    processed = write_failed(self.to.metrics, &pod, e);
                    break;
                }
            }
        }
        processed
    }

    /// Carries one step out; a failed write names its pod.
    async fn step(&mut self, step: Step) -> Result<(), (Arc<Pod>, WriteError)> {
        match step {
            Step::Undo { pod, claim } => {
                let claim = self.claim(&claim);
                self.undo(&[ClaimProgress::of_own(claim)], &pod)
                    .await
                    .map_err(|e| (pod, e))?;
            }
            Step::Allocate { pod, node, write } => {
                let claim = self.claim(&write.claim);
                self.allocate(&pod, &node, claim, &write.allocation)
                    .await
                    .map_err(|e| (pod, e))?;
            }
            Step::PatchPod { pod, patch } => {
                self.patch_pod(&pod, patch).await.map_err(|e| (pod, e))?;
            }
            Step::Notify { pod, notice } => {
                let pod = self.pod(&pod);
                self.notify(&pod, notice).await;
            }
            Step::CreateTemplate { pod, template } => {
                self.to
                    .writer
                    .create_template(&template)
                    .await
                    .map_err(|e| (pod, e))?;
            }
            Step::Count(count) => self.count(count),
            Step::Remember(waiting) => self.to.waiting.insert(waiting),
            Step::Forget(key) => self.to.waiting.remove(&key),
            Step::Nominate { pod, nomination } => {
                self.nominate(&pod, nomination.as_ref())
                    .await
                    .map_err(|e| (pod, e))?;
            }
            Step::Evict {
                victim,
                preemptor,
                nominees,
                by,
                committed,
            } => {
                let eviction = Eviction {
                    victim: &victim,
                    preemptor: &preemptor,
                    nominees: &nominees,
                    by: &by,
                    committed,
                };
                self.evict(eviction)
                    .await
                    .map_err(|e| (preemptor.clone(), e))?;
            }
        }
        Ok(())
    }

    /// The newest version of `claim` this decision has seen.
    fn claim(&self, claim: &Arc<ResourceClaim>) -> Arc<ResourceClaim> {
        self.claims
            .get(&object_key(&claim.metadata))
            .cloned()
            .unwrap_or_else(|| claim.clone())
    }

    /// The newest version of `pod` this decision has seen.
    fn pod(&self, pod: &Arc<Pod>) -> Arc<Pod> {
        self.pods
            .get(&object_key(&pod.metadata))
            .cloned()
            .unwrap_or_else(|| pod.clone())
    }

    fn count(&self, count: Count) {
        let metrics = self.to.metrics;
        match count {
            Count::Failure(reason) => metrics.pod_failure(reason),
            Count::ClaimsAllocated(n) => {
                metrics.claims_allocated.inc_by(n);
            }
            Count::PodPlaced => {
                metrics.pods_placed.inc();
                metrics
                    .placement_seconds
                    .observe(self.started.elapsed().as_secs_f64());
            }
            Count::LeftToScheduler => {
                metrics.pods_left_to_scheduler.inc();
            }
            Count::Preemption {
                victims,
                gpu_seconds,
            } => {
                metrics.preemptions.inc();
                metrics.preemption_victims.inc_by(victims);
                metrics
                    .preemption_gpu_hours
                    .inc_by(gpu_seconds as f64 / 3600.0);
            }
        }
    }

    /// Writes one claim for `pod` on `node`: mark and finalizer, then the allocation, stamped
    /// with the time of the write. What was written is recorded for undoing.
    async fn allocate(
        &mut self,
        pod: &Arc<Pod>,
        node: &str,
        mut claim: Arc<ResourceClaim>,
        allocation: &AllocationResult,
    ) -> Result<(), WriteError> {
        let mark = mark_for(&claim, pod, node);
        if !is_marked(&claim, &mark) {
            let body = mark_patch(&claim, &mark);
            let action = "add the finalizer and mark to";
            let updated = self.to.writer.patch_claim(action, &claim, &body).await?;
            claim = self.assume_claim(updated);
        }
        let progress = ClaimProgress {
            claim: claim.clone(),
            marked: true,
            finalizer_added: mark.finalizer_added,
            allocated: false,
        };
        match self.written.last_mut() {
            Some((last, written)) if Arc::ptr_eq(last, pod) => written.push(progress),
            _ => self.written.push((pod.clone(), vec![progress])),
        }
        let mut allocation = allocation.clone();
        allocation.allocation_timestamp = Some(Time(Timestamp::now()));
        let body = allocation_patch(&claim, &allocation);
        let action = "write the allocation of";
        let updated = self
            .to
            .writer
            .patch_claim_status(action, &claim, &body)
            .await?;
        let claim = self.assume_claim(updated);
        if let Some(last) = self.written.last_mut().and_then(|(_, w)| w.last_mut()) {
            last.claim = claim;
            last.allocated = true;
        }
        Ok(())
    }

    /// Undoes every claim this decision wrote, the last written pod first (best effort: a
    /// failure is logged and the next decision completes or undoes what is left).
    async fn undo_written(&mut self) {
        let written = std::mem::take(&mut self.written);
        if written.is_empty() {
            return;
        }
        tracing::info!(
            pods = written.len(),
            "writing the decision's claims failed; undoing every claim it wrote"
        );
        for (pod, progress) in written.iter().rev() {
            if let Err(e) = self.undo(progress, pod).await {
                tracing::warn!(pod = %object_key(&pod.metadata), error = %e,
                    "undoing a partial placement failed; the next attempt completes or undoes it");
            }
        }
    }

    /// Undoes `progress` for `pod` (see [`undo_plan`]).
    async fn undo(&mut self, progress: &[ClaimProgress], pod: &Pod) -> Result<(), WriteError> {
        let mut newest: HashMap<String, Arc<ResourceClaim>> = HashMap::new();
        for step in undo_plan(progress) {
            let key = object_key(&step.claim().metadata);
            let claim = newest
                .get(&key)
                .cloned()
                .unwrap_or_else(|| step.claim().clone());
            let updated = self.undo_step(&step, claim, pod).await?;
            if matches!(step, UndoStep::Deallocate(_)) {
                self.to.metrics.claims_undone.inc();
            }
            newest.insert(key, updated);
        }
        Ok(())
    }

    /// One undo step, re-reading the claim after a conflict (up to three times) and skipping the
    /// step when the claim no longer carries what the controller wrote.
    async fn undo_step(
        &mut self,
        step: &UndoStep,
        mut claim: Arc<ResourceClaim>,
        pod: &Pod,
    ) -> Result<Arc<ResourceClaim>, WriteError> {
        let writer = self.to.writer;
        let mut attempts = 0;
        loop {
            let result = match step {
                UndoStep::Deallocate(_) => {
                    let body = deallocation_patch(&claim);
                    let action = "clear the allocation of";
                    writer.patch_claim_status(action, &claim, &body).await
                }
                UndoStep::Unmark {
                    remove_finalizer, ..
                } => {
                    let body = unmark_patch(&claim, *remove_finalizer);
                    let action = "remove the finalizer and mark from";
                    writer.patch_claim(action, &claim, &body).await
                }
            };
            match result {
                Ok(updated) => return Ok(self.assume_claim(updated)),
                Err(WriteError::Conflict { .. }) if attempts < 3 => {
                    attempts += 1;
                    let Some(mut fresh) = writer.get_claim(&claim).await? else {
                        return Ok(claim);
                    };
                    trim::claim(&mut fresh);
                    let ours = ClaimMark::of(&fresh).is_some_and(|m| m.is_for(pod));
                    let applies = match step {
                        UndoStep::Deallocate(_) => {
                            ours && allocation(&fresh).is_some() && !is_reserved(&fresh)
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

    /// Patches the pod: the nodes to avoid, or its release (gate and placement record, the
    /// record's `placedAt` the time of the write).
    async fn patch_pod(&mut self, pod: &Arc<Pod>, patch: PodPatch) -> Result<(), WriteError> {
        let newest = self.pod(pod);
        let (action, body, recorded) = match patch {
            PodPatch::AvoidNodes(record) => (
                "record the nodes to avoid for",
                pod_patch(&newest, Some(&record), None),
                false,
            ),
            PodPatch::Release { mut record, gate } => {
                if let Some(record) = record.as_mut() {
                    record.placed_at = Timestamp::now().to_string();
                }
                let body = pod_patch(&newest, record.as_ref(), gate.as_deref());
                ("release", body, record.is_some())
            }
        };
        let updated = self.to.writer.patch_pod(action, &newest, &body).await?;
        self.assume_pod(updated);
        if recorded {
            timing::at_pod(pod, "released");
        }
        Ok(())
    }

    /// Records `nomination` on `pod` (the annotation, then `status.nominatedNodeName`, which
    /// tells kube-scheduler and autoscalers where the pod will go), or removes both.
    async fn nominate(
        &mut self,
        pod: &Arc<Pod>,
        nomination: Option<&Nomination>,
    ) -> Result<(), WriteError> {
        let newest = self.pod(pod);
        let value = nomination.map(Nomination::to_annotation);
        let body = json!({"metadata": {"annotations": {NOMINATION_ANNOTATION: value}}});
        let action = if nomination.is_some() {
            "record the nomination of"
        } else {
            "remove the nomination of"
        };
        let updated = self.to.writer.patch_pod(action, &newest, &body).await?;
        let updated = self.assume_pod(updated);
        let node = nomination.map(|n| n.node.as_str());
        let current = updated
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref());
        if current != node {
            let body = json!({"status": {"nominatedNodeName": node}});
            let action = "set status.nominatedNodeName of";
            let updated = self
                .to
                .writer
                .patch_pod_status(action, &updated, &body)
                .await?;
            self.assume_pod(updated);
        }
        Ok(())
    }

    /// Marks `victim` as preempted by `preemptor`, then evicts it. A refused eviction is
    /// remembered (the victim is left out of searches a while) and told to the preemptor; unless
    /// `committed`, it withdraws the preemptor's nomination and fails (the pod is retried). An
    /// evicted victim is told who preempted it.
    async fn evict(&mut self, eviction: Eviction<'_>) -> Result<(), WriteError> {
        let Eviction {
            victim,
            preemptor,
            nominees,
            by,
            committed,
        } = eviction;
        let victim_key = object_key(&victim.metadata);
        if !PreemptedBy::is_marked(victim) {
            let body =
                json!({"metadata": {"annotations": {PREEMPTED_BY_ANNOTATION: by.to_annotation()}}});
            let updated = self
                .to
                .writer
                .patch_pod("mark as preempted", victim, &body)
                .await?;
            self.assume_pod(updated);
        }
        match self.to.writer.evict(victim).await {
            Ok(()) => {
                let priority = pod_priority(preemptor);
                let note = format!(
                    "evicted to free GPUs for {} (priority {priority}), which has a higher priority",
                    by.pod
                );
                self.to.events.publish(PodEvent::new(
                    victim,
                    EventKind::Normal,
                    PodReason::Preempted.as_str(),
                    &note,
                ));
                Ok(())
            }
            Err(e @ WriteError::Api { .. }) => {
                self.to.metrics.evictions_refused.inc();
                self.to
                    .refused
                    .insert(victim.metadata.uid.as_deref().unwrap_or_default());
                let note = format!(
                    "the eviction of {victim_key} was refused ({e}); {}",
                    if committed {
                        "its gang is being evicted already: it is evicted again later"
                    } else {
                        "the preemption is withdrawn: other victims are tried, or the pod waits"
                    }
                );
                self.to.events.publish(PodEvent::new(
                    preemptor,
                    EventKind::Warning,
                    PodReason::PreemptionBlocked.as_str(),
                    &note,
                ));
                if committed {
                    return Ok(());
                }
                // Nothing of its unit was evicted: the victim is nobody's again.
                let body = json!({"metadata": {"annotations": {PREEMPTED_BY_ANNOTATION: null}}});
                let newest = self.pod(victim);
                let updated = self
                    .to
                    .writer
                    .patch_pod("unmark as preempted", &newest, &body)
                    .await?;
                self.assume_pod(updated);
                for nominee in nominees {
                    self.nominate(nominee, None).await?;
                }
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Sets the condition and queues an event ([`crate::events`]), unless the condition already
    /// says the same.
    async fn notify(&mut self, pod: &Pod, notice: Notice) {
        let message = truncate(&notice.message, CONDITION_MESSAGE_LIMIT);
        let status = condition_status(notice.reason);
        let unchanged = current_condition(pod).is_some_and(|c| {
            c.status == status
                && c.reason.as_deref() == Some(notice.reason.as_str())
                && c.message.as_deref() == Some(message.as_str())
        });
        if unchanged {
            return;
        }
        match self
            .to
            .writer
            .set_condition(pod, notice.reason, &message)
            .await
        {
            Ok(updated) => {
                self.assume_pod(updated);
            }
            Err(e) => {
                tracing::info!(pod = %object_key(&pod.metadata), error = %e, "setting the pod condition failed");
            }
        }
        self.to.events.publish(PodEvent::new(
            pod,
            notice.kind,
            notice.reason.as_str(),
            &notice.message,
        ));
    }

    fn assume_claim(&mut self, mut claim: ResourceClaim) -> Arc<ResourceClaim> {
        trim::claim(&mut claim);
        let claim = self.to.cluster.assume_claim(claim);
        self.claims
            .insert(object_key(&claim.metadata), claim.clone());
        claim
    }

    fn assume_pod(&mut self, mut pod: Pod) -> Arc<Pod> {
        trim::pod(&mut pod);
        let pod = self.to.cluster.assume_pod(pod);
        self.pods.insert(object_key(&pod.metadata), pod.clone());
        pod
    }
}
