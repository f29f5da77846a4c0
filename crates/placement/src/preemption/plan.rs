//! What a preemption search returns: the victims, the devices to reserve for the preemptor, what
//! the plan costs, and the message the pod (and `tessera explain --pod`) shows.

use std::collections::BTreeSet;

use tessera_allocator::{DeviceId, DeviceIndex};
use tessera_api::names::{DRIVER_NAME, attr};

use super::victims::{Exclusions, Victims};

/// What evicting a set of units costs, compared field by field (lower is better): victims, then
/// the highest priority among them, then the sum of their priorities (each pod of a gang counts
/// at the gang's highest), then the work lost (managed devices × seconds run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PreemptionCost {
    pub victims: usize,
    pub max_priority: i32,
    pub priority_sum: i64,
    pub gpu_seconds: u64,
}

impl PreemptionCost {
    /// The cost of evicting `units` of `victims`.
    pub fn of(victims: &Victims, units: impl IntoIterator<Item = usize>) -> PreemptionCost {
        let mut cost = PreemptionCost {
            max_priority: i32::MIN,
            ..PreemptionCost::default()
        };
        let mut any = false;
        for u in units {
            any = true;
            let unit = &victims.units[u];
            let pods = unit.pods.len();
            cost.victims += pods;
            cost.max_priority = cost.max_priority.max(unit.priority);
            cost.priority_sum += i64::from(unit.priority) * pods as i64;
            cost.gpu_seconds += unit.gpu_seconds;
        }
        if !any {
            cost.max_priority = 0;
        }
        cost
    }

    /// GPU-hours the victims had run (what an eviction without a checkpoint loses).
    pub fn gpu_hours(&self) -> f64 {
        self.gpu_seconds as f64 / 3600.0
    }
}

/// A pod to evict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedVictim {
    /// `namespace/name`.
    pub pod: String,
    /// Evict only this UID (a pod recreated under the same name is another pod).
    pub uid: String,
    pub priority: i32,
    pub node: String,
    /// The managed devices its claims hold, by name.
    pub devices: Vec<String>,
    /// Its gang, if it is evicted as one.
    pub group: Option<String>,
}

/// Devices reserved for one preemptor pod until it is placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// `namespace/name` of the preemptor pod.
    pub pod: String,
    pub uid: String,
    pub node: String,
    pub devices: Vec<DeviceId>,
}

/// A preemption to carry out: evict the victims, reserve the devices.
#[derive(Clone, Debug, PartialEq)]
pub struct PreemptionPlan {
    /// Sorted by pod.
    pub victims: Vec<PlannedVictim>,
    /// One per preemptor pod (a gang: one per member placed).
    pub reservations: Vec<Reservation>,
    pub cost: PreemptionCost,
    /// The longest grace period of the victims: how long they may take to stop.
    pub grace_seconds: i64,
    /// `would preempt ns/a, ns/b (priority 0) to free gpu-0..3 of node-7, NVLink island x`.
    pub message: String,
}

/// What the search found.
#[derive(Clone, Debug, PartialEq)]
pub enum PreemptionOutcome {
    Preempt(PreemptionPlan),
    /// No set of victims makes room; the message says why. `budgets`: pods that disruption
    /// budgets protect (or whose eviction was refused) were set aside, so the pod's condition
    /// says `PreemptionBlocked` rather than `Unsatisfiable`.
    NotPossible {
        message: String,
        budgets: bool,
    },
}

/// A preemption search and what it cost.
#[derive(Clone, Debug, PartialEq)]
pub struct PreemptionDecision {
    pub outcome: PreemptionOutcome,
    /// Placement decisions tried (victim sets checked with the allocator, or group decisions).
    pub steps: usize,
    /// Victim sets looked at.
    pub combinations: usize,
    /// Pod decisions taken in all (each runs the allocator on some nodes): what a slower search
    /// shows first, counted rather than timed.
    pub pod_decisions: usize,
    /// A budget stopped the search: the plan may not be the cheapest (or one may exist).
    pub truncated: bool,
}

impl PreemptionDecision {
    pub(crate) fn not_possible(message: String) -> PreemptionDecision {
        PreemptionDecision {
            outcome: PreemptionOutcome::NotPossible {
                message,
                budgets: false,
            },
            steps: 0,
            combinations: 0,
            pod_decisions: 0,
            truncated: false,
        }
    }

    /// No plan, `why` and the pods set aside ([`not_possible`]); nothing searched yet.
    pub(crate) fn set_aside(why: &str, exclusions: &Exclusions) -> PreemptionDecision {
        PreemptionDecision {
            outcome: not_possible(why, exclusions),
            ..PreemptionDecision::not_possible(String::new())
        }
    }

    /// The plan, if there is one.
    pub fn plan(&self) -> Option<&PreemptionPlan> {
        match &self.outcome {
            PreemptionOutcome::Preempt(plan) => Some(plan),
            PreemptionOutcome::NotPossible { .. } => None,
        }
    }
}

/// The victims of `units`, sorted by pod.
pub(crate) fn planned_victims(victims: &Victims, units: &[usize]) -> Vec<PlannedVictim> {
    let mut planned: Vec<PlannedVictim> = units
        .iter()
        .flat_map(|&u| {
            let unit = &victims.units[u];
            unit.pods.iter().map(move |&p| {
                let pod = &victims.pods[p];
                let mut devices: Vec<String> = pod
                    .claims
                    .iter()
                    .flat_map(|&c| victims.claims[c].devices.iter())
                    .map(|(id, _)| id.device().to_owned())
                    .collect();
                devices.sort_by(|a, b| natural(a).cmp(&natural(b)));
                devices.dedup();
                PlannedVictim {
                    pod: pod.key.clone(),
                    uid: pod.uid.clone(),
                    priority: pod.priority,
                    node: pod.node.clone(),
                    devices,
                    group: unit.group.as_ref().map(ToString::to_string),
                }
            })
        })
        .collect();
    planned.sort_by(|a, b| a.pod.cmp(&b.pod));
    planned
}

/// Up to this many victims are named in a message; the rest are counted.
const NAMED_VICTIMS: usize = 8;

/// `ns/a, ns/b (priority 0)`, or each with its priority when they differ.
pub(crate) fn victims_text(victims: &[PlannedVictim]) -> String {
    let priorities: BTreeSet<i32> = victims.iter().map(|v| v.priority).collect();
    let one = priorities.len() == 1;
    let mut names: Vec<String> = victims
        .iter()
        .take(NAMED_VICTIMS)
        .map(|v| {
            if one {
                v.pod.clone()
            } else {
                format!("{} (priority {})", v.pod, v.priority)
            }
        })
        .collect();
    if victims.len() > NAMED_VICTIMS {
        names.push(format!("{} more", victims.len() - NAMED_VICTIMS));
    }
    let mut text = names.join(", ");
    if let (true, Some(p)) = (one, priorities.first()) {
        text.push_str(&format!(" (priority {p})"));
    }
    text
}

/// `gpu-0..3 of node-7, NVLink island x`: the devices reserved on one node, with their NVLink
/// island when they share one.
pub(crate) fn devices_text(index: &DeviceIndex, reservation: &Reservation) -> String {
    let names: Vec<&str> = reservation.devices.iter().map(DeviceId::device).collect();
    let mut text = format!("{} of {}", ranges(&names), reservation.node);
    let qualified = format!("{DRIVER_NAME}/{}", attr::NVLINK_ISLAND);
    let islands: BTreeSet<Option<String>> = index
        .node_devices(&reservation.node)
        .filter(|(id, _)| reservation.devices.contains(id))
        .map(|(_, device)| {
            let attributes = device.attributes.as_ref()?;
            let value = attributes
                .get(&qualified)
                .or_else(|| attributes.get(attr::NVLINK_ISLAND))?;
            value
                .string
                .clone()
                .or_else(|| value.int.map(|i| i.to_string()))
        })
        .collect();
    if let (1, Some(Some(island))) = (islands.len(), islands.first()) {
        text.push_str(&format!(", NVLink island {island}"));
    }
    text
}

/// The whole message of a plan for one or more reservations.
pub(crate) fn plan_message(
    index: &DeviceIndex,
    victims: &[PlannedVictim],
    reservations: &[Reservation],
    cost: &PreemptionCost,
) -> String {
    let places: Vec<String> = reservations
        .iter()
        .map(|r| {
            if reservations.len() == 1 {
                devices_text(index, r)
            } else {
                format!("{} for {}", devices_text(index, r), r.pod)
            }
        })
        .collect();
    format!(
        "would preempt {} to free {} ({:.1} GPU-hours of work run by the victims)",
        victims_text(victims),
        places.join("; "),
        cost.gpu_hours()
    )
}

/// No plan: the search's account and the pods it could not consider.
pub(crate) fn not_possible(why: &str, exclusions: &Exclusions) -> PreemptionOutcome {
    let excluded = exclusions.summary();
    let message = if excluded.is_empty() {
        format!("preemption cannot make room: {why}")
    } else {
        format!("preemption cannot make room: {why}; {excluded}")
    };
    PreemptionOutcome::NotPossible {
        message,
        budgets: exclusions.budgets_set_aside(),
    }
}

/// A name split into its text and trailing number, so `gpu-10` sorts after `gpu-9`.
fn natural(name: &str) -> (&str, u64, &str) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (prefix, number) = name.split_at(name.len() - digits);
    (prefix, number.parse().unwrap_or(0), name)
}

/// `gpu-0..3, gpu-6`: runs of consecutive numbers under one prefix shortened.
pub(crate) fn ranges(names: &[&str]) -> String {
    let mut sorted: Vec<&str> = names.to_vec();
    sorted.sort_by(|a, b| natural(a).cmp(&natural(b)));
    sorted.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let (prefix, start, _) = natural(sorted[i]);
        let numbered = sorted[i].len() > prefix.len();
        let mut end = i;
        while numbered && end + 1 < sorted.len() {
            let (p, n, whole) = natural(sorted[end + 1]);
            let (_, last, _) = natural(sorted[end]);
            if p != prefix || whole.len() == p.len() || n != last + 1 {
                break;
            }
            end += 1;
        }
        if end > i {
            let (_, last, _) = natural(sorted[end]);
            parts.push(format!("{prefix}{start}..{last}"));
        } else {
            parts.push(sorted[i].to_owned());
        }
        i = end + 1;
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_device_names_are_shortened_to_ranges() {
        assert_eq!(ranges(&["gpu-3", "gpu-0", "gpu-2", "gpu-1"]), "gpu-0..3");
        assert_eq!(
            ranges(&["gpu-0", "gpu-2", "gpu-3", "gpu-10"]),
            "gpu-0, gpu-2..3, gpu-10"
        );
        assert_eq!(ranges(&["gpu-9", "gpu-10"]), "gpu-9..10");
        assert_eq!(ranges(&["a", "b"]), "a, b");
        assert_eq!(
            ranges(&["gpu-1-mig-1g-0", "gpu-1-mig-1g-1"]),
            "gpu-1-mig-1g-0..1"
        );
        assert_eq!(ranges(&[]), "");
    }

    fn victim(pod: &str, priority: i32) -> PlannedVictim {
        PlannedVictim {
            pod: pod.into(),
            uid: pod.into(),
            priority,
            node: "n".into(),
            devices: Vec::new(),
            group: None,
        }
    }

    #[test]
    fn victims_share_one_priority_in_the_text_or_each_says_its_own() {
        assert_eq!(
            victims_text(&[victim("ns/a", 0), victim("ns/b", 0)]),
            "ns/a, ns/b (priority 0)"
        );
        assert_eq!(
            victims_text(&[victim("ns/a", 0), victim("ns/b", -5)]),
            "ns/a (priority 0), ns/b (priority -5)"
        );
        let many: Vec<PlannedVictim> = (0..10).map(|i| victim(&format!("ns/p{i}"), 1)).collect();
        assert_eq!(
            victims_text(&many),
            "ns/p0, ns/p1, ns/p2, ns/p3, ns/p4, ns/p5, ns/p6, ns/p7, 2 more (priority 1)"
        );
    }

    #[test]
    fn costs_compare_victims_first_then_priorities_then_work() {
        let c = |victims, max_priority, priority_sum, gpu_seconds| PreemptionCost {
            victims,
            max_priority,
            priority_sum,
            gpu_seconds,
        };
        assert!(c(1, 100, 100, 9_999) < c(2, 0, 0, 0));
        assert!(c(2, 0, 0, 9_999) < c(2, 1, 1, 0));
        assert!(c(2, 5, 5, 9_999) < c(2, 5, 10, 0));
        assert!(c(2, 5, 5, 10) < c(2, 5, 5, 11));
        assert!((c(1, 0, 0, 7_200).gpu_hours() - 2.0).abs() < f64::EPSILON);
    }
}
