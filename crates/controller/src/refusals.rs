//! Evictions refused recently (a PodDisruptionBudget that allows no disruption): their pods are
//! left out of preemption searches for [`REFUSAL_BACKOFF`], so the preemptor tries other victims
//! or waits. The worker keeps it; a new leader starts empty and learns again.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a pod whose eviction was refused is nobody's victim.
pub const REFUSAL_BACKOFF: Duration = Duration::from_secs(60);

/// Pods (by UID) whose eviction was refused, and when.
#[derive(Debug, Default)]
pub struct RefusedEvictions {
    refused: Mutex<HashMap<String, Instant>>,
}

impl RefusedEvictions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers that evicting the pod with `uid` was refused now.
    pub fn insert(&self, uid: &str) {
        self.lock().insert(uid.to_owned(), Instant::now());
    }

    /// The UIDs refused within the backoff; older refusals are forgotten.
    pub fn recent(&self) -> HashSet<String> {
        let mut refused = self.lock();
        refused.retain(|_, at| at.elapsed() < REFUSAL_BACKOFF);
        refused.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_remembered_within_the_backoff() {
        let refusals = RefusedEvictions::default();
        assert!(refusals.recent().is_empty());
        refusals.insert("uid-1");
        assert_eq!(refusals.recent(), HashSet::from(["uid-1".to_owned()]));
        refusals
            .lock()
            .insert("uid-2".into(), Instant::now() - REFUSAL_BACKOFF);
        assert_eq!(refusals.recent(), HashSet::from(["uid-1".to_owned()]));
    }
}
