//! Idle claims (pure): a claim whose GPUs all stayed below a utilization threshold for a whole
//! window is idle. [`IdleTracker::observe`] takes one sample's utilization per claim (the highest
//! of its devices' GPUs) and returns the claims that just became idle, once each: a claim is
//! reported again only after it was busy in between. A sample without a utilization for a
//! claim (the GPU does not report it, the query failed) counts as busy, so a claim is never
//! called idle on missing data; a claim that is gone is forgotten.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use tessera_kubelet_grpc::ClaimUid;

use super::ClaimLabels;

/// When a claim is idle (`--idle-threshold`, `--idle-window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleSettings {
    /// Utilization (percent) below which a GPU counts as idle.
    pub threshold_percent: u32,
    /// How long every GPU of a claim must stay below the threshold.
    pub window: Duration,
}

/// Defaults: below 5% for 30 minutes.
impl Default for IdleSettings {
    fn default() -> Self {
        Self {
            threshold_percent: 5,
            window: Duration::from_secs(30 * 60),
        }
    }
}

/// One claim's utilization in a sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimUtilization {
    pub claim: ClaimLabels,
    /// The highest utilization of the claim's GPUs; `None` when any is unknown.
    pub highest_percent: Option<u32>,
}

/// A claim that just became idle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleClaim {
    pub claim_uid: ClaimUid,
    pub claim: ClaimLabels,
    /// How long it has been below the threshold.
    pub idle_for: Duration,
}

#[derive(Debug, Clone)]
struct State {
    claim: ClaimLabels,
    below_since: Option<Instant>,
    reported: bool,
}

/// The claims' idle state across samples.
#[derive(Debug, Clone)]
pub struct IdleTracker {
    settings: IdleSettings,
    claims: BTreeMap<ClaimUid, State>,
}

impl IdleTracker {
    pub fn new(settings: IdleSettings) -> Self {
        Self {
            settings,
            claims: BTreeMap::new(),
        }
    }

    pub fn settings(&self) -> IdleSettings {
        self.settings
    }

    /// Takes the sample at `now` (claims by UID) and returns the claims that became idle.
    pub fn observe(
        &mut self,
        now: Instant,
        sample: BTreeMap<ClaimUid, ClaimUtilization>,
    ) -> Vec<IdleClaim> {
        self.claims.retain(|uid, _| sample.contains_key(uid));
        let mut became_idle = Vec::new();
        for (uid, utilization) in sample {
            let state = self.claims.entry(uid.clone()).or_insert_with(|| State {
                claim: utilization.claim.clone(),
                below_since: None,
                reported: false,
            });
            let below = utilization
                .highest_percent
                .is_some_and(|p| p < self.settings.threshold_percent);
            if !below {
                state.below_since = None;
                state.reported = false;
                continue;
            }
            let since = *state.below_since.get_or_insert(now);
            let idle_for = now.saturating_duration_since(since);
            if idle_for >= self.settings.window && !state.reported {
                state.reported = true;
                became_idle.push(IdleClaim {
                    claim_uid: uid,
                    claim: state.claim.clone(),
                    idle_for,
                });
            }
        }
        became_idle
    }

    /// The claims idle now (reported and not busy since).
    pub fn idle(&self) -> BTreeSet<ClaimLabels> {
        self.claims
            .values()
            .filter(|s| s.reported)
            .map(|s| s.claim.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str) -> ClaimLabels {
        ClaimLabels {
            namespace: "ml".into(),
            claim: name.into(),
        }
    }

    fn sample(values: &[(&str, Option<u32>)]) -> BTreeMap<ClaimUid, ClaimUtilization> {
        values
            .iter()
            .map(|(name, percent)| {
                (
                    ClaimUid::new(format!("uid-{name}")),
                    ClaimUtilization {
                        claim: claim(name),
                        highest_percent: *percent,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_claim_below_the_threshold_for_the_window_is_reported_once() {
        let mut tracker = IdleTracker::new(IdleSettings {
            threshold_percent: 5,
            window: Duration::from_secs(60),
        });
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let quiet = || sample(&[("idle", Some(0)), ("busy", Some(80)), ("edge", Some(5))]);
        assert!(tracker.observe(at(0), quiet()).is_empty());
        assert!(tracker.observe(at(30), quiet()).is_empty());
        let reported = tracker.observe(at(60), quiet());
        assert_eq!(
            reported,
            [IdleClaim {
                claim_uid: "uid-idle".into(),
                claim: claim("idle"),
                idle_for: Duration::from_secs(60),
            }],
            "5% is not below a 5% threshold; 80% is busy"
        );
        assert!(tracker.observe(at(90), quiet()).is_empty(), "reported once");
        assert_eq!(tracker.idle(), BTreeSet::from([claim("idle")]));

        // Busy again: no longer idle; quiet for a new window: reported again.
        tracker.observe(at(100), sample(&[("idle", Some(50))]));
        assert!(tracker.idle().is_empty());
        assert!(
            tracker
                .observe(at(110), sample(&[("idle", Some(1))]))
                .is_empty()
        );
        assert_eq!(
            tracker.observe(at(170), sample(&[("idle", Some(1))])).len(),
            1
        );
    }

    #[test]
    fn unknown_utilization_is_busy_and_gone_claims_are_forgotten() {
        let mut tracker = IdleTracker::new(IdleSettings {
            threshold_percent: 10,
            window: Duration::from_secs(10),
        });
        let start = Instant::now();
        tracker.observe(start, sample(&[("a", Some(0))]));
        tracker.observe(start + Duration::from_secs(5), sample(&[("a", None)]));
        assert!(
            tracker
                .observe(start + Duration::from_secs(12), sample(&[("a", Some(0))]))
                .is_empty(),
            "the unknown sample restarted the window"
        );
        assert_eq!(
            tracker
                .observe(start + Duration::from_secs(22), sample(&[("a", Some(0))]))
                .len(),
            1
        );
        assert_eq!(tracker.idle().len(), 1);
        tracker.observe(start + Duration::from_secs(23), sample(&[]));
        assert!(tracker.idle().is_empty(), "a claim that went is not idle");
    }
}
