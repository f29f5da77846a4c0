//! The controller's decisions run against a [`ClusterModel`]: each step, pending pods and gangs
//! in priority order (then arrival) are placed on free devices, or, if they cannot be, a
//! preemption plan is made and carried out (the preemptor nominated, the victims evicted unit by
//! unit). What it does is logged as [`Event`]s for the checks that read them.
//!
//! How a plan is carried out: each unit's pods are evicted in turn. If a unit's first pod is
//! refused, the plan is withdrawn (the nomination removed; pods already evicted free their
//! devices for whoever comes next) and the refused pod is not tried again for
//! [`ControllerModel::backoff`]. Once a unit's first pod is evicted, the rest of the unit is
//! evicted whatever a refusal says, retried every step while the nomination stands; the
//! nomination lists the victims, so a new leader — which remembers nothing else — finishes
//! them too.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tessera_allocator::DeviceIndex;

use super::cluster::{ClusterModel, ModelError, Refusal};
use crate::group::{
    GroupInput, GroupKey, GroupOutcome, GroupSettings, Member, decide_group, group_key,
    label_min_count,
};
use crate::planner::{Action, PodPlan};
use crate::preemption::nomination::{Nomination, Nominations, PreemptedBy, with_reserved};
use crate::preemption::{
    DisruptionBudgets, ManagedDevices, PreemptionDecision, PreemptionInput, PreemptionOutcome,
    PreemptionPlan, PreemptionSettings, Victims, pod_priority, preempt_group, preempt_pod,
};
use crate::protocol::{is_gated, object_key};
use crate::resolve::PodClaim;
use crate::view::{PodContext, Settings, decide_pod};
use tessera_api::names::PREEMPTED_BY_ANNOTATION;

/// What the controller did.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Pods (UIDs) released onto nodes in one decision (a gang's members together).
    Placed {
        pods: Vec<(String, String)>,
    },
    /// A plan: the preemptors (UIDs) and their lowest priority, the victims (UIDs).
    Preempted {
        preemptors: Vec<String>,
        priority: i32,
        plan: PreemptionPlan,
    },
    Evicted {
        pod: String,
    },
    Refused {
        pod: String,
        refusal: Refusal,
    },
    /// A nomination removed: the plan was withdrawn or the nomination lapsed.
    Released {
        pod: String,
    },
}

/// The controller: its settings and what it remembers between steps.
pub struct ControllerModel {
    pub settings: Settings,
    pub group_settings: GroupSettings,
    /// `None`: never preempt.
    pub preemption: Option<PreemptionSettings>,
    /// Added to the victims' grace period before a nomination lapses.
    pub margin: SignedDuration,
    /// How long a pod whose eviction was refused is not tried again.
    pub backoff: SignedDuration,
    /// Refused evictions: pod UID → until. Lost on a leader change.
    refused: BTreeMap<String, Timestamp>,
    /// How long a gang waits for capacity before it holds back others.
    pub hold: SignedDuration,
    /// Gangs waiting for capacity. Lost on a leader change.
    waiting: BTreeMap<GroupKey, WaitingGang>,
    pub events: Vec<Event>,
}

/// A gang waiting for capacity, as the starvation hold reads it.
#[derive(Clone, Debug)]
struct WaitingGang {
    priority: i32,
    arrived: Timestamp,
    since: Timestamp,
    /// It could be placed on the cluster's devices when free: only then does it hold back.
    fits_when_free: bool,
}

/// A pending pod or gang, in line.
struct Pending {
    priority: i32,
    arrived: Timestamp,
    /// Member UIDs, in arrival order.
    pods: Vec<String>,
    group: Option<GroupKey>,
}

/// Evicts one pod (the model's Eviction API, or a test's wrapper that refuses some).
pub type Evictor<'e> = dyn FnMut(&mut ClusterModel, &str) -> Result<(), Refusal> + 'e;

impl ControllerModel {
    pub fn new(settings: Settings, preemption: Option<PreemptionSettings>) -> ControllerModel {
        ControllerModel {
            settings,
            group_settings: GroupSettings::default(),
            preemption,
            margin: crate::preemption::nomination::DEFAULT_NOMINATION_MARGIN,
            backoff: SignedDuration::from_secs(60),
            refused: BTreeMap::new(),
            hold: crate::group::DEFAULT_GROUP_HOLD,
            waiting: BTreeMap::new(),
            events: Vec::new(),
        }
    }

    /// A new leader: everything remembered is gone; what is on the objects stays.
    pub fn change_leader(&mut self) {
        self.refused.clear();
        self.waiting.clear();
    }

    /// Whether a gang that waits for capacity holds `pending` back: it fits the free cluster,
    /// has waited at least [`ControllerModel::hold`], and `pending` is of lower priority, or of
    /// the same and arrived later. A higher priority is never held back.
    fn held_back(&self, pending: &Pending, now: Timestamp) -> bool {
        self.waiting.iter().any(|(key, w)| {
            Some(key) != pending.group.as_ref()
                && w.fits_when_free
                && now.duration_since(w.since) >= self.hold
                && (pending.priority < w.priority
                    || (pending.priority == w.priority && pending.arrived > w.arrived))
        })
    }

    /// Records whether the gang of `pending` was placed (it no longer waits) or not (it waits
    /// from now on, if it did not already).
    fn note_gang(&mut self, model: &ClusterModel, pending: &Pending, placed: bool) {
        let Some(key) = &pending.group else { return };
        if placed {
            self.waiting.remove(key);
            return;
        }
        if self.waiting.contains_key(key) {
            return;
        }
        let pods: Vec<Pod> = pending
            .pods
            .iter()
            .filter_map(|uid| model.pod(uid).cloned())
            .collect();
        let claims: Vec<Vec<PodClaim>> = pods.iter().map(|p| model.claims_of(p)).collect();
        let unmanaged = Arc::new(DeviceIndex::new(Vec::new(), Vec::new(), Vec::new()));
        let unmanaged_fn = || unmanaged.clone();
        let fits = group_input(model, key, &pods, &claims).is_some_and(|input| {
            crate::group::fits_when_free(
                &input,
                &model.snapshot,
                &unmanaged_fn,
                &self.settings,
                &self.group_settings,
                model.now,
            )
        });
        self.waiting.insert(
            key.clone(),
            WaitingGang {
                priority: pending.priority,
                arrived: pending.arrived,
                since: model.now,
                fits_when_free: fits,
            },
        );
    }

    /// One pass over the cluster.
    pub fn step(
        &mut self,
        model: &mut ClusterModel,
        evict: &mut Evictor<'_>,
    ) -> Result<(), ModelError> {
        model.refresh_budgets();
        let now = model.now;
        self.refused.retain(|_, until| *until > now);
        let nominations = Nominations::from_pods(model.pods(), &model.gate, now);
        for (_, uid) in &nominations.to_release {
            model.set_nomination(uid, None);
            self.events.push(Event::Released { pod: uid.clone() });
        }
        self.evict_marked(model, &mut *evict);
        for nominee in nominations.standing() {
            self.finish_plan(model, &nominee.uid, &nominee.nomination, &mut *evict);
        }
        let pending = pending(model);
        let present: BTreeSet<&GroupKey> =
            pending.iter().filter_map(|p| p.group.as_ref()).collect();
        self.waiting.retain(|key, _| present.contains(key));
        for pending in &pending {
            if self.held_back(pending, now) {
                continue;
            }
            let placed = self.decide(model, pending, &mut *evict)?;
            self.note_gang(model, pending, placed);
        }
        Ok(())
    }

    /// Evicts what is left of a standing nomination's victims (after a refusal or a leader
    /// change), withdrawing it if one is refused.
    fn finish_plan(
        &mut self,
        model: &mut ClusterModel,
        nominee: &str,
        nomination: &Nomination,
        evict: &mut Evictor<'_>,
    ) {
        if nomination.victims.iter().all(|v| is_gone(model, &v.uid)) {
            return;
        }
        let victims: Vec<(String, Option<String>)> = nomination
            .victims
            .iter()
            .map(|v| (v.uid.clone(), v.group.clone()))
            .collect();
        let by = PreemptedBy {
            pod: model
                .pod(nominee)
                .map(|p| object_key(&p.metadata))
                .unwrap_or_default(),
            uid: nominee.to_owned(),
            at: model.now.to_string(),
        };
        if !self.evict_units(model, &victim_units(&victims), &by, evict) {
            model.set_nomination(nominee, None);
            self.events.push(Event::Released {
                pod: nominee.to_owned(),
            });
        }
    }

    /// Evicts every marked pod that still runs: a gang's eviction, once committed, is finished
    /// by whoever leads.
    fn evict_marked(&mut self, model: &mut ClusterModel, evict: &mut Evictor<'_>) {
        let marked: Vec<String> = model
            .pods()
            .filter(|p| PreemptedBy::is_marked(p) && p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        for uid in marked {
            self.evict_one(model, &uid, evict);
        }
    }

    /// One eviction, with its event; `false` when refused.
    fn evict_one(&mut self, model: &mut ClusterModel, uid: &str, evict: &mut Evictor<'_>) -> bool {
        match evict(model, uid) {
            Ok(()) => {
                self.events.push(Event::Evicted {
                    pod: uid.to_owned(),
                });
                true
            }
            Err(refusal) => {
                self.events.push(Event::Refused {
                    pod: uid.to_owned(),
                    refusal,
                });
                let until = model.now.saturating_add(self.backoff).unwrap_or(model.now);
                self.refused.insert(uid.to_owned(), until);
                false
            }
        }
    }

    /// Evicts a plan's victims: pods alone first, each in turn; a refusal (now or recently)
    /// withdraws the plan before any gang is touched. Then each gang: every pod marked
    /// [`PreemptedBy`] first (the gang's eviction is committed), then evicted; a refused gang pod
    /// is evicted again on the next pass ([`ControllerModel::evict_marked`]). Returns whether the
    /// plan goes on.
    fn evict_units(
        &mut self,
        model: &mut ClusterModel,
        units: &[(Option<String>, Vec<String>)],
        by: &PreemptedBy,
        evict: &mut Evictor<'_>,
    ) -> bool {
        for (_, unit) in units.iter().filter(|(g, _)| g.is_none()) {
            for uid in unit {
                if is_gone(model, uid) {
                    continue;
                }
                if self.refused.contains_key(uid) || !self.evict_one(model, uid, evict) {
                    return false;
                }
            }
        }
        for (_, unit) in units.iter().filter(|(g, _)| g.is_some()) {
            for uid in unit {
                if is_gone(model, uid) {
                    continue;
                }
                model.annotate(uid, PREEMPTED_BY_ANNOTATION, Some(by.to_annotation()));
            }
            for uid in unit {
                if !is_gone(model, uid) {
                    self.evict_one(model, uid, evict);
                }
            }
        }
        true
    }

    /// Places one pending pod or gang, or preempts for it, or leaves it waiting; whether it was
    /// placed.
    fn decide(
        &mut self,
        model: &mut ClusterModel,
        pending: &Pending,
        evict: &mut Evictor<'_>,
    ) -> Result<bool, ModelError> {
        let now = model.now;
        let nominations = Nominations::from_pods(model.pods(), &model.gate, now);
        let except: Vec<&str> = pending.pods.iter().map(String::as_str).collect();
        let reserved =
            nominations.reserved_against(pending.priority, &except, pending.group.as_ref());
        let in_use = model.in_use();
        let usage = model.usage();
        let unmanaged = Arc::new(DeviceIndex::new(Vec::new(), Vec::new(), Vec::new()));
        let unmanaged_fn = || unmanaged.clone();
        let pods: Vec<Pod> = pending
            .pods
            .iter()
            .filter_map(|uid| model.pod(uid).cloned())
            .collect();
        let claims: Vec<Vec<PodClaim>> = pods.iter().map(|p| model.claims_of(p)).collect();
        let placed = {
            let state = with_reserved(&in_use, &reserved);
            let context = PodContext {
                devices: &model.snapshot,
                unmanaged: &unmanaged_fn,
                in_use: &state,
                usage: &usage,
            };
            self.place(model, pending, &pods, &claims, &context)
        };
        if let Some(decisions) = placed {
            return self.apply(model, &pods, decisions).map(|()| true);
        }
        let nominated = pending
            .pods
            .iter()
            .any(|uid| nominations.of_pod(uid).is_some());
        let Some(preemption) = self.preemption.clone().filter(|_| !nominated) else {
            return Ok(false);
        };
        let context = PodContext {
            devices: &model.snapshot,
            unmanaged: &unmanaged_fn,
            in_use: &in_use,
            usage: &usage,
        };
        let decision = self.search(
            model,
            pending,
            &pods,
            &claims,
            &context,
            &reserved,
            &preemption,
        );
        if let PreemptionOutcome::Preempt(plan) = decision.outcome {
            self.carry_out(model, pending, plan, evict);
        }
        Ok(false)
    }

    /// The placement decisions for the pod or gang on free devices, if it fits.
    fn place(
        &self,
        model: &ClusterModel,
        pending: &Pending,
        pods: &[Pod],
        claims: &[Vec<PodClaim>],
        context: &PodContext<'_>,
    ) -> Option<Vec<(usize, PodPlan)>> {
        match &pending.group {
            None => {
                let decision = decide_pod(&pods[0], &claims[0], context, &self.settings, model.now);
                matches!(decision.action, Action::Place(_)).then(|| vec![(0, decision)])
            }
            Some(key) => {
                let input = group_input(model, key, pods, claims)?;
                match decide_group(
                    &input,
                    context,
                    &self.settings,
                    &self.group_settings,
                    model.now,
                )
                .outcome
                {
                    GroupOutcome::Place {
                        plans: decisions, ..
                    } => Some(decisions),
                    GroupOutcome::Wait { .. } => None,
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn search(
        &self,
        model: &ClusterModel,
        pending: &Pending,
        pods: &[Pod],
        claims: &[Vec<PodClaim>],
        context: &PodContext<'_>,
        reserved: &[tessera_allocator::DeviceId],
        preemption: &PreemptionSettings,
    ) -> PreemptionDecision {
        let promised = Nominations::from_pods(model.pods(), &model.gate, model.now).promised();
        let victims = Victims::new(
            &ManagedDevices::new(&model.snapshot),
            model.pods(),
            model.claims().cloned(),
            DisruptionBudgets::new(model.budgets()),
            &promised,
            model.now,
        );
        let refused: HashSet<String> = self.refused.keys().cloned().collect();
        let input = PreemptionInput {
            victims: &victims,
            reserved,
            refused: &refused,
            settings: preemption,
        };
        match &pending.group {
            None => preempt_pod(
                &pods[0],
                &claims[0],
                context,
                &self.settings,
                &input,
                model.now,
            ),
            Some(key) => match group_input(model, key, pods, claims) {
                Some(group) => preempt_group(
                    &group,
                    context,
                    &self.settings,
                    &self.group_settings,
                    &input,
                    model.now,
                ),
                None => PreemptionDecision {
                    outcome: PreemptionOutcome::NotPossible {
                        message: "the group is incomplete".into(),
                        budgets: false,
                    },
                    steps: 0,
                    combinations: 0,
                    pod_decisions: 0,
                    truncated: false,
                },
            },
        }
    }

    /// Nominates the preemptors, then evicts the victims unit by unit.
    fn carry_out(
        &mut self,
        model: &mut ClusterModel,
        pending: &Pending,
        plan: PreemptionPlan,
        evict: &mut Evictor<'_>,
    ) {
        for reservation in &plan.reservations {
            let nomination = Nomination::new(&plan, reservation, model.now, self.margin);
            model.set_nomination(&reservation.uid, Some(&nomination));
        }
        let victims: Vec<(String, Option<String>)> = plan
            .victims
            .iter()
            .map(|v| (v.uid.clone(), v.group.clone()))
            .collect();
        let units = victim_units(&victims);
        self.events.push(Event::Preempted {
            preemptors: pending.pods.clone(),
            priority: pending.priority,
            plan: plan.clone(),
        });
        let first = &plan.reservations.first();
        let by = PreemptedBy {
            pod: first.map(|r| r.pod.clone()).unwrap_or_default(),
            uid: first.map(|r| r.uid.clone()).unwrap_or_default(),
            at: model.now.to_string(),
        };
        if !self.evict_units(model, &units, &by, evict) {
            for reservation in &plan.reservations {
                model.set_nomination(&reservation.uid, None);
                self.events.push(Event::Released {
                    pod: reservation.uid.clone(),
                });
            }
        }
    }

    /// Writes the decisions' allocations and runs the pods.
    fn apply(
        &mut self,
        model: &mut ClusterModel,
        pods: &[Pod],
        decisions: Vec<(usize, PodPlan)>,
    ) -> Result<(), ModelError> {
        let mut placed = Vec::new();
        for (index, decision) in decisions {
            let Action::Place(placement) = decision.action else {
                continue;
            };
            let pod = &pods[index];
            for write in placement.writes {
                let name = write.claim.metadata.name.clone().unwrap_or_default();
                model.allocate(&name, write.allocation)?;
            }
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            model.run_on(&uid, &placement.node)?;
            placed.push((uid, placement.node));
        }
        self.events.push(Event::Placed { pods: placed });
        Ok(())
    }
}

/// The gang of `pods` as the group decision reads it, if enough members are gated.
fn group_input<'a>(
    model: &ClusterModel,
    key: &'a GroupKey,
    pods: &'a [Pod],
    claims: &'a [Vec<PodClaim>],
) -> Option<GroupInput<'a>> {
    let min_count = label_min_count(key, pods.iter()).ok()?;
    let placed = model
        .pods()
        .filter(|p| group_key(p).as_ref() == Some(key) && !is_gated(p, &model.gate))
        .count();
    Some(GroupInput {
        key,
        min_count,
        placed: u32::try_from(placed).unwrap_or(u32::MAX),
        members: pods
            .iter()
            .zip(claims)
            .map(|(pod, claims)| Member { pod, claims })
            .collect(),
        unresolved: 0,
        // The model has no other components' gates.
        held: 0,
        domain_nodes: Default::default(),
    })
}

/// The gated pods and gangs in line: priority (highest first), then arrival.
fn pending(model: &ClusterModel) -> Vec<Pending> {
    let mut singles = Vec::new();
    let mut groups: BTreeMap<GroupKey, Pending> = BTreeMap::new();
    for uid in model.gated() {
        let Some(pod) = model.pod(&uid) else { continue };
        let arrived = pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |t| t.0);
        let priority = pod_priority(pod);
        match group_key(pod) {
            None => singles.push(Pending {
                priority,
                arrived,
                pods: vec![uid],
                group: None,
            }),
            Some(key) => {
                let entry = groups.entry(key.clone()).or_insert(Pending {
                    priority,
                    arrived,
                    pods: Vec::new(),
                    group: Some(key),
                });
                entry.priority = entry.priority.min(priority);
                entry.arrived = entry.arrived.min(arrived);
                entry.pods.push(uid);
            }
        }
    }
    singles.extend(groups.into_values());
    singles.sort_by(|a, b| {
        (std::cmp::Reverse(a.priority), a.arrived, &a.pods[0]).cmp(&(
            std::cmp::Reverse(b.priority),
            b.arrived,
            &b.pods[0],
        ))
    });
    singles
}

/// Whether the pod is gone or terminating.
fn is_gone(model: &ClusterModel, uid: &str) -> bool {
    model
        .pod(uid)
        .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
}

/// The victims (UIDs, with their gang) in units: a gang's members together, in the order given.
fn victim_units(victims: &[(String, Option<String>)]) -> Vec<(Option<String>, Vec<String>)> {
    let mut units: Vec<(Option<String>, Vec<String>)> = Vec::new();
    let mut of_group: HashMap<&str, usize> = HashMap::new();
    for (uid, group) in victims {
        match group {
            Some(g) => match of_group.get(g.as_str()) {
                Some(&i) => units[i].1.push(uid.clone()),
                None => {
                    of_group.insert(g, units.len());
                    units.push((Some(g.clone()), vec![uid.clone()]));
                }
            },
            None => units.push((None, vec![uid.clone()])),
        }
    }
    units
}

/// The pods of `model` grouped by gang, for checks: gang → member UIDs.
pub fn gangs(model: &ClusterModel) -> BTreeMap<GroupKey, BTreeSet<String>> {
    let mut gangs: BTreeMap<GroupKey, BTreeSet<String>> = BTreeMap::new();
    for pod in model.pods() {
        if let Some(key) = group_key(pod) {
            gangs
                .entry(key)
                .or_default()
                .insert(pod.metadata.uid.clone().unwrap_or_default());
        }
    }
    gangs
}
