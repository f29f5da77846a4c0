//! What the decisions of a pod alone, a group and a preemption share: the cluster read once
//! through the [`ClusterSource`], and the small steps they all take.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::decision::{ClusterSource, Notice, Step};
use crate::reason::{EventKind, PodReason};

/// What `decide` answers with the cluster of `source` (what the pods on each node request, less
/// the pod with UID `except`).
pub(crate) fn in_context<T>(
    source: &dyn ClusterSource,
    except: &str,
    decide: impl FnOnce(&crate::view::PodContext<'_>) -> T,
) -> T {
    let mut decide = Some(decide);
    let mut answer = None;
    source.with_context(except, &mut |context| {
        if let Some(decide) = decide.take() {
            answer = Some(decide(context));
        }
    });
    answer.expect("ClusterSource::with_context calls its function once")
}

/// Undoing the controller's own allocations of `claims` for `pod`.
pub(crate) fn undo_steps(
    pod: &Arc<Pod>,
    claims: &[Arc<k8s_openapi::api::resource::v1::ResourceClaim>],
) -> Vec<Step> {
    claims
        .iter()
        .map(|claim| Step::Undo {
            pod: pod.clone(),
            claim: claim.clone(),
        })
        .collect()
}

/// A report on `pod` that it waits.
pub(crate) fn waits(pod: &Arc<Pod>, reason: PodReason, message: &str, kind: EventKind) -> Step {
    Step::Notify {
        pod: pod.clone(),
        notice: Notice {
            reason,
            message: message.to_owned(),
            kind,
        },
    }
}
