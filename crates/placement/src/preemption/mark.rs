//! The mark the controller leaves on each pod it preempts ([`PreemptedBy`]), before evicting it:
//! a marked pod is nobody else's victim, and any leader evicts it should it still run.

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use tessera_api::names::PREEMPTED_BY_ANNOTATION;

/// The mark on each pod of a victim gang: who preempted it, when ([`PREEMPTED_BY_ANNOTATION`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptedBy {
    /// `namespace/name` of the preemptor (a gang's: its first pod).
    pub pod: String,
    pub uid: String,
    /// RFC 3339.
    pub at: String,
}

impl PreemptedBy {
    /// Whether a pod carries the mark, readable or not: a marked pod is evicted whatever its
    /// value says, so an unreadable one still counts.
    pub fn is_marked(pod: &Pod) -> bool {
        pod.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(PREEMPTED_BY_ANNOTATION))
    }

    /// The mark on a pod, if readable.
    pub fn of(pod: &Pod) -> Option<PreemptedBy> {
        let value = pod
            .metadata
            .annotations
            .as_ref()?
            .get(PREEMPTED_BY_ANNOTATION)?;
        serde_json::from_str(value).ok()
    }

    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("a PreemptedBy always serializes")
    }
}
