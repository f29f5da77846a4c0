//! The controller's work queue of pods (keyed `namespace/name`), with the clock passed in.
//!
//! - A changed pod is queued at once (and processed once more if it changes while processed).
//! - A pod that cannot be placed is *parked*: it is retried when the cluster changed (slices,
//!   classes, claims, nodes, pods on nodes) *and* its backoff has passed, or after
//!   [`PARK_LIMIT`] even without a change.
//! - A failed write is retried after a backoff regardless of changes.
//!
//! Backoff doubles from [`BACKOFF_START`] to [`BACKOFF_LIMIT`] per consecutive failure of the
//! same pod and resets when the pod is done.
//!
//! Ready pods are taken in priority order ([`Rank`]: higher `spec.priority` first, then earlier
//! arrival), and in the order they became ready within a rank. A parked pod that saw a change is
//! taken before a ready pod ranked after it even within its backoff, so a change goes to the pods
//! in priority order whatever their backoffs.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// First retry delay.
pub const BACKOFF_START: Duration = Duration::from_millis(250);
/// Longest retry delay.
pub const BACKOFF_LIMIT: Duration = Duration::from_secs(30);
/// Longest a parked pod waits without any cluster change.
pub const PARK_LIMIT: Duration = Duration::from_secs(300);

/// The delay after `failures` consecutive failures.
pub fn backoff(failures: u32) -> Duration {
    BACKOFF_START
        .saturating_mul(1u32.checked_shl(failures.min(16)).unwrap_or(u32::MAX))
        .min(BACKOFF_LIMIT)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Ready,
    /// Being processed since the cluster was at `epoch`; `again`: it changed meanwhile.
    Processing {
        again: bool,
        epoch: u64,
    },
    /// Retry at this time.
    Delayed(Instant),
    /// Retry after a cluster change past `not_before`, or at `deadline`.
    Parked {
        not_before: Instant,
        deadline: Instant,
        epoch: u64,
    },
}

/// How processing a pod ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Processed {
    /// Placed, released, or nothing to do: forget the pod and its failures.
    Done,
    /// Cannot be placed now: park it until the cluster changes.
    Park,
    /// A write failed: retry after the backoff.
    Retry,
    /// Retry after this delay, without counting a failure (e.g. a stale cache).
    After(Duration),
}

/// A pod's place in line: its priority (higher first), then its arrival (creation time in
/// seconds since the epoch, earlier first).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rank {
    priority: Reverse<i32>,
    arrival: i64,
}

impl Rank {
    pub fn new(priority: i32, arrival: i64) -> Rank {
        Rank {
            priority: Reverse(priority),
            arrival,
        }
    }
}

/// The queue.
#[derive(Debug, Default)]
pub struct WorkQueue {
    /// Ready keys by rank, then by when they became ready (a sequence number).
    ready: BTreeSet<(Rank, u64, String)>,
    ranks: HashMap<String, Rank>,
    sequence: u64,
    states: HashMap<String, State>,
    failures: HashMap<String, u32>,
    epoch: u64,
}

impl WorkQueue {
    pub fn new() -> WorkQueue {
        WorkQueue::default()
    }

    /// The pod changed: process it now.
    pub fn add(&mut self, key: &str) {
        match self.states.get_mut(key) {
            Some(State::Ready) => {}
            Some(State::Processing { again, .. }) => *again = true,
            _ => {
                self.states.insert(key.to_owned(), State::Ready);
                self.push(key.to_owned());
            }
        }
    }

    /// The pod changed and ranks `rank` in line: process it now.
    pub fn add_ranked(&mut self, key: &str, rank: Rank) {
        self.ranks.insert(key.to_owned(), rank);
        self.add(key);
    }

    fn push(&mut self, key: String) {
        let rank = self.ranks.get(&key).copied().unwrap_or_default();
        self.sequence += 1;
        self.ready.insert((rank, self.sequence, key));
    }

    /// Something a parked pod may be waiting for changed.
    pub fn cluster_changed(&mut self) {
        self.epoch += 1;
    }

    /// Forgets a pod (deleted).
    pub fn forget(&mut self, key: &str) {
        if !matches!(self.states.get(key), Some(State::Processing { .. })) {
            self.states.remove(key);
            self.ranks.remove(key);
        }
        self.failures.remove(key);
    }

    /// The next pod to process, if one is due at `now`.
    pub fn pop(&mut self, now: Instant) -> Option<String> {
        self.promote(now);
        self.promote_ahead();
        while let Some((_, _, key)) = self.ready.pop_first() {
            if self.states.get(&key) == Some(&State::Ready) {
                let epoch = self.epoch;
                self.states.insert(
                    key.clone(),
                    State::Processing {
                        again: false,
                        epoch,
                    },
                );
                return Some(key);
            }
        }
        None
    }

    fn promote(&mut self, now: Instant) {
        let epoch = self.epoch;
        let mut due_now = Vec::new();
        for (key, state) in self.states.iter_mut() {
            let due = match *state {
                State::Delayed(at) => at <= now,
                State::Parked {
                    not_before,
                    deadline,
                    epoch: parked,
                } => (epoch > parked && not_before <= now) || deadline <= now,
                _ => false,
            };
            if due {
                *state = State::Ready;
                due_now.push(key.clone());
            }
        }
        for key in due_now {
            self.push(key);
        }
    }

    /// Parked pods that saw a change and rank before the next ready pod are made ready too, even
    /// within their backoff: what the change freed must go to them first. Without this, a
    /// priority-100 pod queued by a change of its own (a status write) took the devices a
    /// deleted pod freed while the priority-500 pod waiting for them sat out its backoff.
    fn promote_ahead(&mut self) {
        let next = self
            .ready
            .iter()
            .find(|(_, _, key)| self.states.get(key) == Some(&State::Ready))
            .map(|(rank, _, _)| *rank);
        let Some(next) = next else {
            return;
        };
        let epoch = self.epoch;
        let mut ahead = Vec::new();
        for (key, state) in self.states.iter_mut() {
            let changed = matches!(*state, State::Parked { epoch: parked, .. } if epoch > parked);
            if changed && self.ranks.get(key).copied().unwrap_or_default() < next {
                *state = State::Ready;
                ahead.push(key.clone());
            }
        }
        for key in ahead {
            self.push(key);
        }
    }

    /// Records how processing `key` ended.
    pub fn done(&mut self, key: &str, outcome: Processed, now: Instant) {
        // A park waits for a change after the pod was taken off the queue: what changed while
        // it was processed may already be what it waits for.
        let (again, started) = match self.states.get(key) {
            Some(State::Processing { again, epoch }) => (*again, *epoch),
            _ => (false, self.epoch),
        };
        let failures = self.failures.get(key).copied().unwrap_or(0);
        let next = match outcome {
            Processed::Done => {
                self.failures.remove(key);
                None
            }
            Processed::Park => {
                self.failures.insert(key.to_owned(), failures + 1);
                Some(State::Parked {
                    not_before: now + backoff(failures),
                    deadline: now + PARK_LIMIT,
                    epoch: started,
                })
            }
            Processed::Retry => {
                self.failures.insert(key.to_owned(), failures + 1);
                Some(State::Delayed(now + backoff(failures)))
            }
            Processed::After(delay) => Some(State::Delayed(now + delay)),
        };
        match (again, next) {
            (true, _) => {
                self.states.insert(key.to_owned(), State::Ready);
                self.push(key.to_owned());
            }
            (false, Some(state)) => {
                self.states.insert(key.to_owned(), state);
            }
            (false, None) => {
                self.states.remove(key);
            }
        }
    }

    /// When the next pod becomes due without any further change (`None`: nothing waits).
    pub fn next_due(&self) -> Option<Instant> {
        self.states
            .values()
            .filter_map(|state| match *state {
                State::Ready => None,
                State::Delayed(at) => Some(at),
                State::Parked {
                    not_before,
                    deadline,
                    epoch,
                } => Some(if self.epoch > epoch {
                    not_before
                } else {
                    deadline
                }),
                State::Processing { .. } => None,
            })
            .min()
    }

    /// Pods ready to process now.
    pub fn ready_len(&self) -> usize {
        self.states.values().filter(|s| **s == State::Ready).count()
    }

    /// Pods waiting (delayed or parked).
    pub fn waiting_len(&self) -> usize {
        self.states
            .values()
            .filter(|s| matches!(s, State::Delayed(_) | State::Parked { .. }))
            .count()
    }

    /// Puts every waiting pod back at the front of the line (after becoming leader).
    pub fn wake_all(&mut self) {
        let mut woken = Vec::new();
        for (key, state) in self.states.iter_mut() {
            if matches!(state, State::Delayed(_) | State::Parked { .. }) {
                *state = State::Ready;
                woken.push(key.clone());
            }
        }
        for key in woken {
            self.push(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_limit() {
        assert_eq!(backoff(0), Duration::from_millis(250));
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(3), Duration::from_secs(2));
        assert_eq!(backoff(40), BACKOFF_LIMIT);
    }

    #[test]
    fn a_pod_is_queued_once_and_again_if_it_changes_while_processed() {
        let now = Instant::now();
        let mut q = WorkQueue::new();
        q.add("ns/a");
        q.add("ns/a");
        assert_eq!(q.pop(now).as_deref(), Some("ns/a"));
        assert_eq!(q.pop(now), None);
        q.add("ns/a");
        q.done("ns/a", Processed::Done, now);
        assert_eq!(
            q.pop(now).as_deref(),
            Some("ns/a"),
            "changed while processed"
        );
        q.done("ns/a", Processed::Done, now);
        assert_eq!(q.pop(now), None);
        assert_eq!(q.next_due(), None);
    }

    #[test]
    fn a_parked_pod_needs_a_change_and_its_backoff() {
        let now = Instant::now();
        let mut q = WorkQueue::new();
        q.add("ns/a");
        q.pop(now);
        q.done("ns/a", Processed::Park, now);
        assert_eq!(q.waiting_len(), 1);
        let later = now + Duration::from_secs(10);
        assert_eq!(q.pop(later), None, "no change yet");
        assert_eq!(q.next_due(), Some(now + PARK_LIMIT));
        q.cluster_changed();
        assert_eq!(q.next_due(), Some(now + BACKOFF_START));
        assert_eq!(q.pop(now), None, "changed, but within the backoff");
        assert_eq!(q.pop(later).as_deref(), Some("ns/a"));
        // The second failure doubles the backoff.
        q.done("ns/a", Processed::Park, later);
        q.cluster_changed();
        assert_eq!(q.next_due(), Some(later + Duration::from_millis(500)));
        // Without any change it is retried at the park limit.
        let mut quiet = WorkQueue::new();
        quiet.add("ns/b");
        quiet.pop(now);
        quiet.done("ns/b", Processed::Park, now);
        assert_eq!(quiet.pop(now + PARK_LIMIT).as_deref(), Some("ns/b"));
    }

    #[test]
    fn a_parked_pod_within_its_backoff_goes_before_a_lower_ranked_ready_pod_after_a_change() {
        let now = Instant::now();
        let mut q = WorkQueue::new();
        let (high, low) = (Rank::new(500, 20), Rank::new(100, 10));
        q.add_ranked("ns/high", high);
        q.pop(now);
        // Its fourth failure: a backoff of 2 s.
        q.failures.insert("ns/high".into(), 3);
        q.done("ns/high", Processed::Park, now);
        // Nothing changed yet: the lower-ranked pod that is ready goes alone.
        q.add_ranked("ns/low", low);
        assert_eq!(q.pop(now).as_deref(), Some("ns/low"));
        q.done("ns/low", Processed::Park, now);
        // A change (devices freed), then the lower-ranked pod changes (its status written):
        // the higher-ranked one is decided first, though its backoff has not passed.
        q.cluster_changed();
        q.add_ranked("ns/low", low);
        assert_eq!(q.pop(now).as_deref(), Some("ns/high"));
        assert_eq!(q.pop(now).as_deref(), Some("ns/low"));
        // Without a ready pod behind it, the backoff holds as before.
        q.done("ns/high", Processed::Park, now);
        q.done("ns/low", Processed::Done, now);
        q.cluster_changed();
        assert_eq!(
            q.pop(now),
            None,
            "within its backoff, nothing ranked behind it"
        );
    }

    #[test]
    fn a_change_while_processing_counts_for_the_park() {
        let now = Instant::now();
        let mut q = WorkQueue::new();
        q.add("ns/a");
        q.pop(now);
        q.cluster_changed();
        q.done("ns/a", Processed::Park, now);
        assert_eq!(q.pop(now + BACKOFF_START).as_deref(), Some("ns/a"));
    }

    #[test]
    fn retries_wait_for_the_backoff_only() {
        let now = Instant::now();
        let mut q = WorkQueue::new();
        q.add("ns/a");
        q.pop(now);
        q.done("ns/a", Processed::Retry, now);
        assert_eq!(q.pop(now), None);
        assert_eq!(q.pop(now + BACKOFF_START).as_deref(), Some("ns/a"));
        q.done("ns/a", Processed::After(Duration::from_millis(10)), now);
        assert_eq!(
            q.pop(now + Duration::from_millis(10)).as_deref(),
            Some("ns/a")
        );
        q.done("ns/a", Processed::Done, now);
        assert_eq!(q.ready_len() + q.waiting_len(), 0);
    }

    #[test]
    fn forgetting_and_waking() {
        let now = Instant::now();
        let mut q = WorkQueue::new();
        for key in ["ns/a", "ns/b"] {
            q.add(key);
            q.pop(now);
            q.done(key, Processed::Park, now);
        }
        q.forget("ns/a");
        q.wake_all();
        assert_eq!(q.pop(now).as_deref(), Some("ns/b"));
        assert_eq!(q.pop(now), None);
    }

    #[test]
    fn ready_pods_go_by_priority_then_arrival() {
        let now = Instant::now();
        let mut q = WorkQueue::new();
        q.add_ranked("ns/batch-early", Rank::new(-10, 100));
        q.add_ranked("ns/prod-late", Rank::new(1000, 300));
        q.add_ranked("ns/prod-early", Rank::new(1000, 200));
        q.add_ranked("ns/default", Rank::new(0, 50));
        let order: Vec<String> = std::iter::from_fn(|| q.pop(now)).collect();
        assert_eq!(
            order,
            [
                "ns/prod-early",
                "ns/prod-late",
                "ns/default",
                "ns/batch-early"
            ]
        );
        // A parked pod woken again keeps its rank.
        q.done("ns/batch-early", Processed::Park, now);
        q.done("ns/prod-late", Processed::Park, now);
        q.wake_all();
        assert_eq!(q.pop(now).as_deref(), Some("ns/prod-late"));
    }
}
