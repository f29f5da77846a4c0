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
            PodReason::Preempting => "Preempting",
            PodReason::Preempted => "Preempted",
            PodReason::PreemptionBlocked => "PreemptionBlocked",
        }
    }

    /// Whether the pod's claims are placed: the condition's status is `True`.
    pub fn placed(self) -> bool {
        matches!(self, PodReason::Allocated | PodReason::AlreadyAllocated)
    }
}

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
            (PodReason::Preempting, "Preempting"),
            (PodReason::Preempted, "Preempted"),
            (PodReason::PreemptionBlocked, "PreemptionBlocked"),
        ];
        for (reason, wire) in all {
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
    }
}
