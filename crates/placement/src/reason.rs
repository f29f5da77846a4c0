//! Why the controller did (or did not) place a pod: the reason of the pod's condition
//! `gpu.tessera.dev/TopologyAwarePlacement` and of its events, the `reason` label of the
//! controller's failure counts, and what `tessera explain --pod` reports. One name per reason,
//! here; the wire strings ([`PodReason::as_str`]) are part of the protocol (docs/protocol.md).

use std::fmt;

use serde::{Serialize, Serializer};

/// Why the controller did (or did not) place a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PodReason {
    /// The controller allocated the pod's claims and released it.
    Allocated,
    /// Every claim was allocated already: the pod was released.
    AlreadyAllocated,
    /// The scheduler allocates what the pod asks: released without allocating.
    LeftToScheduler,
    /// The claims fit on no eligible node now.
    Unsatisfiable,
    /// The input is wrong (a claim, a class, an annotation, a group's definition).
    InvalidInput,
    /// A claim of the pod does not exist yet or is being replaced.
    WaitingForClaims,
    /// An earlier group waits for capacity and holds later arrivals back.
    WaitingBehindGroup,
    /// The group's pods, their claims or its PodGroup do not exist (yet).
    WaitingForGroup,
    /// The group does not fit now.
    GroupUnsatisfiable,
    /// Another component's scheduling gate still holds the pod (a queue that has not admitted
    /// it): the controller decides it once its own gate is the last one.
    WaitingForGates,
    /// The pod fits once pods of lower priority are evicted: they are being evicted, and the
    /// devices they free are nominated for it.
    Preempting,
    /// The pod is evicted to free devices for a pod of higher priority (an event on the victim).
    Preempted,
    /// An eviction for the pod was refused (a PodDisruptionBudget): it waits or tries others.
    PreemptionBlocked,
}

impl PodReason {
    /// The reason as the condition, the event and the metric label spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            PodReason::Allocated => "Allocated",
            PodReason::AlreadyAllocated => "AlreadyAllocated",
            PodReason::LeftToScheduler => "LeftToScheduler",
            PodReason::Unsatisfiable => "Unsatisfiable",
            PodReason::InvalidInput => "InvalidInput",
            PodReason::WaitingForClaims => "WaitingForClaims",
            PodReason::WaitingBehindGroup => "WaitingBehindGroup",
            PodReason::WaitingForGroup => "WaitingForGroup",
            PodReason::GroupUnsatisfiable => "GroupUnsatisfiable",
            PodReason::WaitingForGates => "WaitingForGates",
            PodReason::Preempting => "Preempting",
            PodReason::Preempted => "Preempted",
            PodReason::PreemptionBlocked => "PreemptionBlocked",
        }
    }

    /// The reason a condition or event spells `wire`, if it is one of the controller's.
    pub fn from_wire(wire: &str) -> Option<PodReason> {
        ALL.iter().copied().find(|r| r.as_str() == wire)
    }

    /// Whether the pod's claims are placed: the condition's status is `True`.
    pub fn placed(self) -> bool {
        matches!(self, PodReason::Allocated | PodReason::AlreadyAllocated)
    }

    /// The status of the pod's condition with this reason: `True` once placed, `Unknown` while
    /// another component's gate holds the pod (the controller has not decided yet, so the
    /// condition's `lastTransitionTime` moves when it first decides), `False` otherwise.
    pub fn condition_status(self) -> &'static str {
        if self.placed() {
            "True"
        } else if self == PodReason::WaitingForGates {
            "Unknown"
        } else {
            "False"
        }
    }

    /// The reasons that are a lack of capacity ([`PodReason::lacks_capacity`]), in declaration
    /// order.
    pub fn lacking_capacity() -> impl Iterator<Item = PodReason> {
        ALL.into_iter().filter(|r| r.lacks_capacity())
    }

    /// Whether the pod waits because the cluster has no room for it now (alone or with its
    /// group, or only by evictions a disruption budget refuses): what the controller's capacity
    /// metric counts and operators alert on.
    pub fn lacks_capacity(self) -> bool {
        matches!(
            self,
            PodReason::Unsatisfiable | PodReason::GroupUnsatisfiable | PodReason::PreemptionBlocked
        )
    }
}

/// Every reason, in declaration order.
const ALL: [PodReason; 13] = [
    PodReason::Allocated,
    PodReason::AlreadyAllocated,
    PodReason::LeftToScheduler,
    PodReason::Unsatisfiable,
    PodReason::InvalidInput,
    PodReason::WaitingForClaims,
    PodReason::WaitingBehindGroup,
    PodReason::WaitingForGroup,
    PodReason::GroupUnsatisfiable,
    PodReason::WaitingForGates,
    PodReason::Preempting,
    PodReason::Preempted,
    PodReason::PreemptionBlocked,
];

impl fmt::Display for PodReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for PodReason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// The type of an event the controller records on a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Normal,
    /// Something the user should look at (bad input, no room).
    Warning,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_keep_their_wire_strings() {
        let all = [
            (PodReason::Allocated, "Allocated"),
            (PodReason::AlreadyAllocated, "AlreadyAllocated"),
            (PodReason::LeftToScheduler, "LeftToScheduler"),
            (PodReason::Unsatisfiable, "Unsatisfiable"),
            (PodReason::InvalidInput, "InvalidInput"),
            (PodReason::WaitingForClaims, "WaitingForClaims"),
            (PodReason::WaitingBehindGroup, "WaitingBehindGroup"),
            (PodReason::WaitingForGroup, "WaitingForGroup"),
            (PodReason::GroupUnsatisfiable, "GroupUnsatisfiable"),
            (PodReason::WaitingForGates, "WaitingForGates"),
            (PodReason::Preempting, "Preempting"),
            (PodReason::Preempted, "Preempted"),
            (PodReason::PreemptionBlocked, "PreemptionBlocked"),
        ];
        assert_eq!(all.len(), ALL.len(), "every reason is listed");
        for (reason, wire) in all {
            assert_eq!(PodReason::from_wire(wire), Some(reason));
            assert_eq!(reason.as_str(), wire);
            assert_eq!(reason.to_string(), wire);
            assert_eq!(serde_json::to_value(reason).unwrap(), wire);
        }
        let placed: Vec<PodReason> = all.iter().map(|(r, _)| *r).filter(|r| r.placed()).collect();
        assert_eq!(
            placed,
            [PodReason::Allocated, PodReason::AlreadyAllocated],
            "only these set the condition True"
        );
        let capacity: Vec<PodReason> = all
            .iter()
            .map(|(r, _)| *r)
            .filter(|r| r.lacks_capacity())
            .collect();
        assert_eq!(
            capacity,
            [
                PodReason::Unsatisfiable,
                PodReason::GroupUnsatisfiable,
                PodReason::PreemptionBlocked
            ],
            "only these are a lack of capacity"
        );
        assert_eq!(PodReason::from_wire("Unschedulable"), None);
        let statuses: Vec<&str> = [
            PodReason::Allocated,
            PodReason::WaitingForGates,
            PodReason::Unsatisfiable,
        ]
        .map(PodReason::condition_status)
        .to_vec();
        assert_eq!(statuses, ["True", "Unknown", "False"]);
    }
}
