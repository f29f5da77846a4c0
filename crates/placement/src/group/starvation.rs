//! No starvation: a group that could run on the cluster's devices when free and has waited longer
//! than the hold time holds back every pod and group of lower priority, and those of its own
//! priority that arrived after it, so devices that free up are not taken by later arrivals
//! (docs/protocol.md, "Groups"). A pod or group of higher priority is never held back.

use std::collections::HashMap;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tessera_allocator::{AllocatedState, DeviceIndex};

use crate::group::membership::GroupKey;
use crate::group::search::{GroupInput, GroupOutcome, decide_group};
use crate::group::settings::GroupSettings;
use crate::view::{ClusterSnapshot, PodContext, Settings};

/// Whether the group could be placed if no device were in use and no pod ran (the cluster as
/// it is, empty): a group that could not is never waited for by others.
pub fn fits_when_free(
    input: &GroupInput<'_>,
    devices: &ClusterSnapshot,
    unmanaged: &dyn Fn() -> std::sync::Arc<DeviceIndex>,
    settings: &Settings,
    group: &GroupSettings,
    now: Timestamp,
) -> bool {
    let empty = AllocatedState::new();
    let usage = HashMap::new();
    let context = PodContext {
        devices,
        unmanaged,
        in_use: &empty,
        usage: &usage,
    };
    matches!(
        decide_group(input, &context, settings, group, now).outcome,
        GroupOutcome::Place { .. }
    )
}

/// A group that waits, as the starvation policy sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub key: GroupKey,
    /// Its priority (`spec.priority` of its pods, the lowest if they differ).
    pub priority: i32,
    /// When its oldest pod was created: its place in line.
    pub arrived: Timestamp,
    /// When it was first found waiting for capacity.
    pub since: Timestamp,
    /// It could be placed on the cluster's devices when free ([`fits_when_free`]).
    pub fits_when_free: bool,
}

/// The group that holds back a pod (or group) of `priority` that `arrived` at that time: among
/// the groups that could run on the free cluster and have waited at least `hold`, those of higher
/// priority, or of the same priority that arrived before it — the first in line (highest
/// priority, then earliest arrival). Holding back what comes after it in line is what guarantees
/// the group runs once the work before it has freed enough devices; a group that could never run
/// holds back nothing, and nothing of higher priority waits behind a group.
pub fn held_back_by<'w>(
    priority: i32,
    arrived: Timestamp,
    own: Option<&GroupKey>,
    waiting: impl IntoIterator<Item = &'w Waiting>,
    now: Timestamp,
    hold: SignedDuration,
) -> Option<&'w Waiting> {
    waiting
        .into_iter()
        .filter(|w| {
            w.fits_when_free
                && Some(&w.key) != own
                && (w.priority > priority || (w.priority == priority && w.arrived < arrived))
                && now.duration_since(w.since) >= hold
        })
        .min_by(|a, b| {
            (std::cmp::Reverse(a.priority), a.arrived, &a.key).cmp(&(
                std::cmp::Reverse(b.priority),
                b.arrived,
                &b.key,
            ))
        })
}
