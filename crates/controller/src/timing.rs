//! The timing events: debug events (target `tessera_controller::timing`) saying when a pod passed
//! a step of its processing, in Unix microseconds: `claim-seen`, `queued`, `popped`, `decided`,
//! `allocated`, `released`, `done`. The placement benchmark turns them into a timeline per claim;
//! otherwise they cost one level check.

use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use tessera_placement::protocol::object_key;

/// The target of the timing events.
pub const TARGET: &str = "tessera_controller::timing";

/// Logs that `step` of processing the pod `pod` (`namespace/name`) ended now.
pub fn at(pod: &str, step: &'static str) {
    tracing::debug!(target: TARGET, pod, step, unix_us = unix_micros());
}

/// [`at`] for a pod object (its key made only when the events are on).
pub fn at_pod(pod: &Pod, step: &'static str) {
    if tracing::enabled!(target: TARGET, tracing::Level::DEBUG) {
        at(&object_key(&pod.metadata), step);
    }
}

/// Now, in Unix microseconds.
pub fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
