//! Processing a group (gang): gather its pods from the cache, let `placement::group` decide,
//! write every member's claims, and only then release the pods. A write that fails undoes every
//! claim the group's decision wrote, so a group never keeps a partial allocation across
//! decisions; a group that waits also undoes allocations left by an earlier leader that stopped
//! half-way. Also the starvation policy's memory: the groups waiting for capacity.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use tessera_placement::claims::PodClaims;
use tessera_placement::group::member_arrival as arrival;
use tessera_placement::group::{
    Domain, GroupInput, GroupKey, GroupOutcome, GroupPlan, GroupScore, GroupSource, Member,
    Waiting, decide_group, fits_when_free, held_back_by, label_min_count, pod_group_min_count,
};
use tessera_placement::planner::Action;
use tessera_placement::protocol::{PodPlacement, is_gated, object_key};
use tessera_placement::reason::{EventKind, PodReason};
use tessera_placement::resolve::{PodClaim, Resolution, resolve_claims};
use tessera_placement::view::PodContext;
use tessera_placement::writes::ClaimProgress;

use crate::queue::Processed;
use crate::worker::{Report, Worker};

/// The groups waiting for capacity, for [`held_back_by`].
#[derive(Debug, Default)]
pub struct WaitingGroups {
    groups: Mutex<HashMap<GroupKey, Waiting>>,
}

impl WaitingGroups {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<GroupKey, Waiting>> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every waiting group.
    pub fn all(&self) -> Vec<Waiting> {
        self.lock().values().cloned().collect()
    }

    fn insert(&self, waiting: Waiting) {
        self.lock().entry(waiting.key.clone()).or_insert(waiting);
    }

    fn remove(&self, key: &GroupKey) {
        self.lock().remove(key);
    }

    fn contains(&self, key: &GroupKey) -> bool {
        self.lock().contains_key(key)
    }
}

/// A gated member with its resolved claims.
struct Resolved {
    pod: Arc<Pod>,
    claims: Vec<PodClaim>,
}

impl Worker {
    /// The waiting group that holds back `pod` (of group `own`, if any), forgetting groups that
    /// no longer have gated pods.
    pub(crate) fn held_back(&self, pod: &Pod, own: Option<&GroupKey>) -> Option<Waiting> {
        let waiting = self.waiting.all();
        for w in &waiting {
            let gated = self
                .cluster
                .group_pods(&w.key)
                .iter()
                .any(|p| is_gated(p, &self.config.gate));
            if !gated {
                self.waiting.remove(&w.key);
            }
        }
        let waiting = self.waiting.all();
        held_back_by(
            arrival(pod),
            own,
            &waiting,
            Timestamp::now(),
            self.config.group_hold,
        )
        .cloned()
    }

    /// Processes the group of `pod` (a gated member).
    pub(crate) async fn process_group(
        &self,
        pod: Arc<Pod>,
        key: GroupKey,
        started: Instant,
    ) -> Processed {
        let pods = self.cluster.group_pods(&key);
        let gated: Vec<Arc<Pod>> = pods
            .iter()
            .filter(|p| is_gated(p, &self.config.gate))
            .cloned()
            .collect();
        let placed = u32::try_from(pods.len() - gated.len()).unwrap_or(u32::MAX);
        let min_count = match self.min_count(&key, &pods, &gated).await {
            Ok(Some(n)) => n,
            // The basic policy: the pods are placed one by one.
            Ok(None) => return self.process_single(pod, started).await,
            Err(outcome) => return outcome,
        };
        let (resolved, unresolved) = match self.resolve_members(&key, &gated).await {
            Ok(members) => members,
            Err(outcome) => return outcome,
        };
        let arrived = gated
            .iter()
            .map(|p| arrival(p))
            .min()
            .unwrap_or(Timestamp::UNIX_EPOCH);
        if let Some(outcome) = self.held_back_group(&pod, &key, arrived, &gated).await {
            return outcome;
        }
        let (decision, fits_free) = self.decide(&key, (min_count, placed), &resolved, unresolved);
        self.metrics
            .decision_seconds
            .observe(started.elapsed().as_secs_f64());
        match decision.outcome {
            GroupOutcome::Place {
                plans,
                domain,
                score,
            } => {
                self.waiting.remove(&key);
                let placed: Vec<(Arc<Pod>, Action)> = plans
                    .into_iter()
                    .map(|(i, d)| (resolved[i].pod.clone(), d.action))
                    .collect();
                let summary =
                    placed_summary(&key, placed.len(), &domain, &score, decision.truncated);
                self.place_group(placed, &summary, started).await
            }
            GroupOutcome::Wait {
                failure,
                reason,
                message,
                ..
            } => {
                if let Some(fits) = fits_free {
                    self.waiting.insert(Waiting {
                        key: key.clone(),
                        arrived,
                        since: Timestamp::now(),
                        fits_when_free: fits,
                    });
                }
                self.metrics.pod_failure(failure.reason());
                match self.undo_members(&resolved).await {
                    Err(outcome) => outcome,
                    Ok(()) => {
                        self.wait_all(&gated, reason, &message, EventKind::Warning)
                            .await
                    }
                }
            }
        }
    }

    /// Parks the group when an earlier group holds it back, saying so on its pods.
    async fn held_back_group(
        &self,
        pod: &Pod,
        key: &GroupKey,
        arrived: Timestamp,
        gated: &[Arc<Pod>],
    ) -> Option<Processed> {
        let by = self
            .held_back(pod, Some(key))
            .filter(|by| by.arrived < arrived)?;
        let message = format!(
            "{key} waits behind {}, which arrived earlier and has waited for capacity since {}",
            by.key, by.since
        );
        Some(
            self.wait_all(
                gated,
                PodReason::WaitingBehindGroup,
                &message,
                EventKind::Normal,
            )
            .await,
        )
    }

    /// The group's `minCount` (`None`: a PodGroup with the basic policy); `Err` when the pods
    /// were told why the group cannot be decided.
    async fn min_count(
        &self,
        key: &GroupKey,
        pods: &[Arc<Pod>],
        gated: &[Arc<Pod>],
    ) -> Result<Option<u32>, Processed> {
        let count = match key.source {
            GroupSource::Label => label_min_count(key, pods.iter().map(|p| &**p)).map(Some),
            GroupSource::PodGroup => {
                match self.writer.get_pod_group(&key.namespace, &key.name).await {
                    Err(e) => {
                        return Err(match gated.first() {
                            Some(pod) => self.write_failed(pod, e),
                            None => Processed::Retry,
                        });
                    }
                    Ok(None) => {
                        let message = format!(
                            "the pod names {key} in spec.schedulingGroup.podGroupName, which does not exist \
                             (or the cluster does not serve scheduling.k8s.io/v1beta1: enable the GenericWorkload \
                             feature gate, or name the group with the label {} instead)",
                            tessera_api::names::GROUP_LABEL
                        );
                        return Err(self
                            .wait_all(
                                gated,
                                PodReason::WaitingForGroup,
                                &message,
                                EventKind::Normal,
                            )
                            .await);
                    }
                    Ok(Some(group)) => pod_group_min_count(&group),
                }
            }
        };
        match count {
            Ok(count) => Ok(count),
            Err(e) => {
                self.metrics.pod_failure(PodReason::InvalidInput);
                Err(self
                    .wait_all(
                        gated,
                        PodReason::InvalidInput,
                        &e.to_string(),
                        EventKind::Warning,
                    )
                    .await)
            }
        }
    }

    /// The gated members whose claims resolve, in the order to try them (arrival, then name),
    /// and how many still wait for their claims.
    async fn resolve_members(
        &self,
        key: &GroupKey,
        gated: &[Arc<Pod>],
    ) -> Result<(Vec<Resolved>, u32), Processed> {
        let mut resolved: Vec<Resolved> = Vec::new();
        let mut unresolved = 0;
        for member in gated {
            let namespace = member.metadata.namespace.as_deref().unwrap_or_default();
            match resolve_claims(
                member,
                |claim| self.cluster.claim(namespace, claim),
                |template| self.cluster.template_exists(namespace, template),
            ) {
                Resolution::Resolved(claims) => resolved.push(Resolved {
                    pod: member.clone(),
                    claims,
                }),
                Resolution::Waiting(_) => unresolved += 1,
                Resolution::Invalid(message) => {
                    self.metrics.pod_failure(PodReason::InvalidInput);
                    let message = format!("{key}: pod {}: {message}", object_key(&member.metadata));
                    return Err(self
                        .wait_all(gated, PodReason::InvalidInput, &message, EventKind::Warning)
                        .await);
                }
            }
        }
        resolved.sort_by(|a, b| {
            (arrival(&a.pod), object_key(&a.pod.metadata))
                .cmp(&(arrival(&b.pod), object_key(&b.pod.metadata)))
        });
        Ok((resolved, unresolved))
    }

    /// The group's decision from the caches; when it waits for capacity and is not known to be
    /// waiting yet, also whether it would fit the cluster when free.
    fn decide(
        &self,
        key: &GroupKey,
        (min_count, placed): (u32, u32),
        resolved: &[Resolved],
        unresolved: u32,
    ) -> (GroupPlan, Option<bool>) {
        let input = &GroupInput {
            key,
            min_count,
            placed,
            members: resolved
                .iter()
                .map(|r| Member {
                    pod: &r.pod,
                    claims: &r.claims,
                })
                .collect(),
            unresolved,
        };
        let snapshot = self.cluster.inventory(|| {
            self.metrics.inventory_rebuilds.inc();
        });
        let in_use = self.cluster.devices_in_use();
        let usage = self.cluster.node_usage("");
        let unmanaged = || snapshot.unmanaged();
        let context = PodContext {
            devices: &snapshot.devices,
            unmanaged: &unmanaged,
            in_use: &in_use,
            usage: &usage,
        };
        let now = Timestamp::now();
        let decision = decide_group(input, &context, &self.config, &self.config.group, now);
        let capacity = matches!(
            decision.outcome,
            GroupOutcome::Wait {
                reason: PodReason::GroupUnsatisfiable,
                ..
            }
        );
        let fits_free = (capacity && !self.waiting.contains(input.key)).then(|| {
            fits_when_free(
                input,
                &snapshot.devices,
                &unmanaged,
                &self.config,
                &self.config.group,
                now,
            )
        });
        (decision, fits_free)
    }

    /// Undoes the allocations an earlier leader left for members: a waiting group holds no
    /// devices.
    async fn undo_members(&self, resolved: &[Resolved]) -> Result<(), Processed> {
        for r in resolved {
            for claim in PodClaims::sort(&r.pod, &r.claims).own {
                if let Err(e) = self.undo(&[ClaimProgress::of_own(claim)], &r.pod).await {
                    return Err(self.write_failed(&r.pod, e));
                }
            }
        }
        Ok(())
    }

    /// Writes every member's claims, then releases the members. A failed claim write undoes
    /// everything this group's decision wrote.
    async fn place_group(
        &self,
        placed: Vec<(Arc<Pod>, Action)>,
        summary: &str,
        started: Instant,
    ) -> Processed {
        let mut progress: Vec<(Arc<Pod>, Vec<ClaimProgress>)> = Vec::new();
        let mut released: Vec<(Arc<Pod>, PodPlacement, String)> = Vec::new();
        for (pod, action) in &placed {
            let record = PodPlacement::of(pod).unwrap_or_default();
            match action {
                Action::Place(placement) => {
                    let mut written = Vec::new();
                    let result = self.write_placement(pod, placement, &mut written).await;
                    progress.push((pod.clone(), written));
                    if let Err(e) = result {
                        tracing::info!(pod = %object_key(&pod.metadata), error = %e,
                            "writing a group's placement failed; undoing every claim the group wrote");
                        for (member, written) in progress.iter().rev() {
                            if let Err(undo) = self.undo(written, member).await {
                                tracing::warn!(pod = %object_key(&member.metadata), error = %undo,
                                    "undoing a partial group placement failed; the next attempt undoes it");
                            }
                        }
                        return self.write_failed(pod, e);
                    }
                    self.metrics
                        .claims_allocated
                        .inc_by(placement.writes.len() as u64);
                    let mut record = record;
                    record.node = placement.node.clone();
                    released.push((
                        pod.clone(),
                        record,
                        crate::worker::placed_message(placement),
                    ));
                }
                Action::Release { node } => {
                    let mut record = record;
                    if let Some(node) = node {
                        record.node = node.clone();
                    }
                    released.push((
                        pod.clone(),
                        record,
                        "every claim of the pod was already allocated".to_owned(),
                    ));
                }
                _ => {}
            }
        }
        // Every claim is written: release the pods. A release that fails is finished by the next
        // decision, which finds the member's claims allocated and releases it.
        let mut outcome = Processed::Done;
        for (pod, mut record, message) in released {
            record.placed_at = Timestamp::now().to_string();
            let report = Report {
                reason: PodReason::Allocated,
                message: format!("{summary}; {message}"),
                kind: EventKind::Normal,
            };
            let result = self
                .release(pod, true, &record, report, || {
                    self.metrics.pods_placed.inc();
                    self.metrics
                        .placement_seconds
                        .observe(started.elapsed().as_secs_f64());
                })
                .await;
            if result != Processed::Done {
                outcome = result;
            }
        }
        outcome
    }

    /// Reports `reason`/`message` on every gated member and parks the pod.
    async fn wait_all(
        &self,
        gated: &[Arc<Pod>],
        reason: PodReason,
        message: &str,
        kind: EventKind,
    ) -> Processed {
        for member in gated {
            self.report(
                member,
                Report {
                    reason,
                    message: message.to_owned(),
                    kind,
                },
            )
            .await;
        }
        Processed::Park
    }
}

/// `group ns/g: 2 pods placed together in gpu.tessera.dev/rack=r1 (2 nodes)`.
fn placed_summary(
    key: &GroupKey,
    pods: usize,
    domain: &Domain,
    score: &GroupScore,
    truncated: bool,
) -> String {
    let truncated = if truncated {
        "; the search stopped at its budget, a closer placement may exist"
    } else {
        ""
    };
    format!(
        "{key}: {pods} pods placed together in {domain} ({} nodes{truncated})",
        score.nodes
    )
}
