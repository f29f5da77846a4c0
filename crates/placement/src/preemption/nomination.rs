//! Nominations: devices held for a preemptor while its victims stop. The controller records a
//! plan's reservation on the preemptor pod as the annotation [`NOMINATION_ANNOTATION`] (JSON),
//! so a new leader reads the same nominations back from the pods. While a nomination stands,
//! its devices are added to the devices in use for the decisions of every other pod that is not
//! of higher priority than the nominee; they are never taken out of what is in use: a device is
//! free only once no allocated claim holds it, whatever is nominated.
//!
//! A nomination stands while its pod is gated and it has not expired. It expires at the time it
//! names (the victims' longest grace period plus a margin after the plan). It is released when the
//! pod is placed (the gate goes, and with it the nomination), deleted, or it expires; the
//! controller then removes the annotation.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use tessera_allocator::{AllocatedState, DeviceId};
use tessera_api::names::NOMINATION_ANNOTATION;

pub use super::mark::PreemptedBy;
use super::plan::{PreemptionPlan, Reservation};
use super::priority::pod_priority;
use crate::group::{GroupKey, group_key};
use crate::protocol::{is_gated, object_key};

/// Added to the victims' grace period before a nomination expires: time for the kubelet to
/// report the victims gone and for their claims to be released.
pub const DEFAULT_NOMINATION_MARGIN: SignedDuration = SignedDuration::from_secs(120);

/// A nominated device.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NominatedDevice {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

/// A pod evicted for the nominee.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NominatedVictim {
    /// `namespace/name`.
    pub pod: String,
    pub uid: String,
    /// Its gang, evicted whole: once one of its pods is gone, the others are evicted whatever
    /// a refusal says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// What the controller records on a preemptor pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Nomination {
    /// The node the devices are on.
    pub node: String,
    pub devices: Vec<NominatedDevice>,
    pub victims: Vec<NominatedVictim>,
    /// When the plan was made, RFC 3339.
    pub at: String,
    /// When the nomination lapses, RFC 3339.
    pub expires: String,
}

impl Nomination {
    /// The nomination for `reservation` of `plan`, made at `now`, lapsing after the victims'
    /// grace period plus `margin`.
    pub fn new(
        plan: &PreemptionPlan,
        reservation: &Reservation,
        now: Timestamp,
        margin: SignedDuration,
    ) -> Nomination {
        let lapse = SignedDuration::from_secs(plan.grace_seconds.max(0)).saturating_add(margin);
        let mut devices: Vec<NominatedDevice> = reservation
            .devices
            .iter()
            .map(|id| NominatedDevice {
                driver: id.driver().to_owned(),
                pool: id.pool().to_owned(),
                device: id.device().to_owned(),
            })
            .collect();
        devices.sort();
        Nomination {
            node: reservation.node.clone(),
            devices,
            victims: plan
                .victims
                .iter()
                .map(|v| NominatedVictim {
                    pod: v.pod.clone(),
                    uid: v.uid.clone(),
                    group: v.group.clone(),
                })
                .collect(),
            at: now.to_string(),
            expires: now.saturating_add(lapse).unwrap_or(now).to_string(),
        }
    }

    /// The nomination on a pod; an unreadable value counts as none (like the placement record).
    pub fn of(pod: &Pod) -> Option<Nomination> {
        let value = pod
            .metadata
            .annotations
            .as_ref()?
            .get(NOMINATION_ANNOTATION)?;
        serde_json::from_str(value).ok()
    }

    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("a Nomination always serializes")
    }

    /// Whether it has lapsed at `now` (an unreadable time has).
    pub fn expired(&self, now: Timestamp) -> bool {
        !self.expires.parse::<Timestamp>().is_ok_and(|t| now < t)
    }

    /// The devices, as the allocator names them.
    pub fn device_ids(&self) -> Vec<DeviceId> {
        self.devices
            .iter()
            .map(|d| DeviceId::new(&d.driver, &d.pool, &d.device))
            .collect()
    }

    /// The victims still present (by UID) among `present`.
    pub fn victims_left(&self, present: impl Fn(&str) -> bool) -> Vec<&NominatedVictim> {
        self.victims.iter().filter(|v| present(&v.uid)).collect()
    }
}

/// A pod whose nomination stands.
#[derive(Clone, Debug, PartialEq)]
pub struct Nominee {
    /// `namespace/name`.
    pub pod: String,
    pub uid: String,
    pub priority: i32,
    pub group: Option<GroupKey>,
    pub nomination: Nomination,
}

/// The nominations that stand, and the ones to release.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Nominations {
    /// By pod UID.
    standing: BTreeMap<String, Nominee>,
    /// Pods (`namespace/name`, UID) whose nomination has lapsed or is left on a pod no longer
    /// gated: the controller removes their annotation.
    pub to_release: Vec<(String, String)>,
}

impl Nominations {
    /// The nominations of `pods` at `now`: a gated pod's unexpired nomination stands; a lapsed
    /// one, or one on a pod no longer gated by `gate`, is to be released. Deleted pods are not
    /// among `pods`, so their nominations are gone.
    pub fn from_pods<'p>(
        pods: impl IntoIterator<Item = &'p Pod>,
        gate: &str,
        now: Timestamp,
    ) -> Nominations {
        let mut nominations = Nominations::default();
        for pod in pods {
            let Some(nomination) = Nomination::of(pod) else {
                continue;
            };
            let key = object_key(&pod.metadata);
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if !is_gated(pod, gate) || pod.metadata.deletion_timestamp.is_some() {
                nominations.to_release.push((key, uid));
                continue;
            }
            if nomination.expired(now) {
                nominations.to_release.push((key, uid));
                continue;
            }
            nominations.standing.insert(
                uid.clone(),
                Nominee {
                    pod: key,
                    uid,
                    priority: pod_priority(pod),
                    group: group_key(pod),
                    nomination,
                },
            );
        }
        nominations.to_release.sort();
        nominations
    }

    /// The standing nomination of the pod with `uid`.
    pub fn of_pod(&self, uid: &str) -> Option<&Nominee> {
        self.standing.get(uid)
    }

    /// Every standing nomination.
    pub fn standing(&self) -> impl Iterator<Item = &Nominee> {
        self.standing.values()
    }

    /// The victims (UIDs) of every standing nomination: pods a plan still has to evict, or
    /// evicted already. Nobody else's victims, and charged to their budgets
    /// ([`super::Victims::new`]).
    pub fn promised(&self) -> HashSet<String> {
        self.standing
            .values()
            .flat_map(|n| n.nomination.victims.iter().map(|v| v.uid.clone()))
            .collect()
    }

    /// The devices a pod of `priority` may not take: those nominated for pods of the same or a
    /// higher priority, other than the pods with the UIDs in `except` (the pod itself, or its
    /// gang's members) and, with `group`, other than that group's members.
    pub fn reserved_against(
        &self,
        priority: i32,
        except: &[&str],
        group: Option<&GroupKey>,
    ) -> Vec<DeviceId> {
        self.standing
            .values()
            .filter(|n| n.priority >= priority)
            .filter(|n| !except.contains(&n.uid.as_str()))
            .filter(|n| group.is_none() || n.group.as_ref() != group)
            .flat_map(|n| n.nomination.device_ids())
            .collect()
    }
}

/// `in_use` with `reserved` added (as exclusively allocated): what a decision reads. Copied
/// only when something is reserved.
pub fn with_reserved<'s>(
    in_use: &'s AllocatedState,
    reserved: &[DeviceId],
) -> std::borrow::Cow<'s, AllocatedState> {
    if reserved.is_empty() {
        return std::borrow::Cow::Borrowed(in_use);
    }
    let mut state = in_use.clone();
    for id in reserved {
        state.insert_device(id.clone());
    }
    std::borrow::Cow::Owned(state)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSchedulingGate, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use tessera_api::names::TOPOLOGY_AWARE_GATE;

    use super::*;
    use crate::preemption::{PlannedVictim, PreemptionCost};

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn plan() -> (PreemptionPlan, Reservation) {
        let reservation = Reservation {
            pod: "ns/trainer".into(),
            uid: "u-t".into(),
            node: "node-7".into(),
            devices: vec![
                DeviceId::new("gpu.tessera.dev", "node-7", "gpu-1"),
                DeviceId::new("gpu.tessera.dev", "node-7", "gpu-0"),
            ],
        };
        let plan = PreemptionPlan {
            victims: vec![PlannedVictim {
                pod: "ns/batch".into(),
                uid: "u-b".into(),
                priority: 0,
                node: "node-7".into(),
                devices: vec!["gpu-0".into(), "gpu-1".into()],
                group: None,
            }],
            reservations: vec![reservation.clone()],
            cost: PreemptionCost::default(),
            grace_seconds: 30,
            message: String::new(),
        };
        (plan, reservation)
    }

    fn pod(uid: &str, priority: i32, gated: bool, annotation: Option<String>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(uid.into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                annotations: annotation
                    .map(|a| BTreeMap::from([(NOMINATION_ANNOTATION.to_owned(), a)])),
                ..Default::default()
            },
            spec: Some(PodSpec {
                priority: Some(priority),
                scheduling_gates: gated.then(|| {
                    vec![PodSchedulingGate {
                        name: TOPOLOGY_AWARE_GATE.into(),
                    }]
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn a_nomination_round_trips_and_lapses_after_grace_and_margin() {
        let (plan, reservation) = plan();
        let now = at("2026-11-28T10:00:00Z");
        let nomination = Nomination::new(&plan, &reservation, now, DEFAULT_NOMINATION_MARGIN);
        assert_eq!(nomination.devices[0].device, "gpu-0", "sorted");
        assert_eq!(nomination.expires, "2026-11-28T10:02:30Z");
        let annotated = pod("u-t", 1000, true, Some(nomination.to_annotation()));
        assert_eq!(Nomination::of(&annotated), Some(nomination.clone()));
        assert!(!nomination.expired(at("2026-11-28T10:02:29Z")));
        assert!(nomination.expired(at("2026-11-28T10:02:30Z")));
        assert_eq!(
            nomination.victims_left(|uid| uid == "u-b").len(),
            1,
            "the victim is still there"
        );
        assert!(nomination.victims_left(|_| false).is_empty());
    }

    #[test]
    fn an_unreadable_nomination_counts_as_none_and_an_unreadable_time_as_lapsed() {
        assert_eq!(Nomination::of(&pod("u", 0, true, Some("{".into()))), None);
        let (plan, reservation) = plan();
        let mut nomination = Nomination::new(
            &plan,
            &reservation,
            at("2026-11-28T10:00:00Z"),
            DEFAULT_NOMINATION_MARGIN,
        );
        nomination.expires = "soon".into();
        assert!(nomination.expired(at("2026-11-28T10:00:00Z")));
    }

    #[test]
    fn reservations_bind_pods_of_equal_or_lower_priority_only() {
        let (plan, reservation) = plan();
        let now = at("2026-11-28T10:00:00Z");
        let value =
            Nomination::new(&plan, &reservation, now, DEFAULT_NOMINATION_MARGIN).to_annotation();
        let pods = [
            pod("u-t", 1000, true, Some(value.clone())),
            pod("u-placed", 1000, false, Some(value.clone())),
            pod("u-plain", 5, true, None),
        ];
        let nominations = Nominations::from_pods(&pods, TOPOLOGY_AWARE_GATE, now);
        assert!(nominations.of_pod("u-t").is_some());
        assert_eq!(
            nominations.to_release,
            [("ns/u-placed".to_owned(), "u-placed".to_owned())],
            "a placed pod's nomination is released"
        );
        assert_eq!(nominations.reserved_against(1000, &[], None).len(), 2);
        assert_eq!(nominations.reserved_against(0, &[], None).len(), 2);
        assert!(nominations.reserved_against(1001, &[], None).is_empty());
        assert!(
            nominations.reserved_against(0, &["u-t"], None).is_empty(),
            "the nominee's own devices are its own"
        );
        let later = at("2026-11-28T10:05:00Z");
        let lapsed = Nominations::from_pods(&pods, TOPOLOGY_AWARE_GATE, later);
        assert!(lapsed.of_pod("u-t").is_none());
        assert_eq!(lapsed.to_release.len(), 2);
    }

    #[test]
    fn reserving_only_adds_to_what_is_in_use() {
        let mut in_use = AllocatedState::new();
        let held = DeviceId::new("d", "n", "gpu-0");
        in_use.insert_device(held.clone());
        let nominated = DeviceId::new("d", "n", "gpu-1");
        let state = with_reserved(&in_use, std::slice::from_ref(&nominated));
        assert!(state.is_in_use(&held));
        assert!(state.is_in_use(&nominated));
        assert!(matches!(
            with_reserved(&in_use, &[]),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
