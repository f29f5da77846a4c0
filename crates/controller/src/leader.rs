//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's rules:
//!
//! - a candidate takes the Lease when it has no holder, or when the holder's record has not
//!   changed for `leaseDurationSeconds` as measured on the candidate's own clock (so clock skew
//!   between machines does not matter);
//! - every write of the Lease carries the resourceVersion it read, so two candidates cannot both
//!   win: one gets 409 Conflict;
//! - the holder renews every `retry_period`; it stops considering itself leader `renew_deadline`
//!   after the start of its last successful renewal — without waiting for the API server, so a
//!   partitioned leader stops writing before (`lease_duration` − `renew_deadline` before) anyone
//!   else may take over;
//! - on shutdown the holder releases the Lease (empty holder) so a successor starts at once.
//!
//! [`Leadership`] is what writers consult before every request.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;

/// Lease timing and identity.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This candidate's identity (unique per process).
    pub identity: String,
    /// How long a holder's record stays valid without renewal (client-go default 15 s).
    pub lease_duration: Duration,
    /// How long the holder keeps acting without a successful renewal (default 10 s).
    pub renew_deadline: Duration,
    /// How often to try to acquire or renew (default 2 s).
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's default timing.
    pub fn new(namespace: &str, name: &str, identity: &str) -> LeaseConfig {
        LeaseConfig {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// A write was not sent because this process is not (or no longer) the leader.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("this controller is not the leader (or its lease renewal is overdue)")]
pub struct NotLeader;

#[derive(Debug)]
struct State {
    holding: bool,
    valid_until: Option<Instant>,
}

/// Whether this process may write. Cheap to clone; all clones share one state.
#[derive(Clone, Debug)]
pub struct Leadership {
    state: Arc<Mutex<State>>,
    changes: Arc<watch::Sender<bool>>,
}

impl Leadership {
    fn new(holding: bool, valid_until: Option<Instant>) -> Leadership {
        let (changes, _) = watch::channel(holding);
        Leadership {
            state: Arc::new(Mutex::new(State {
                holding,
                valid_until,
            })),
            changes: Arc::new(changes),
        }
    }

    /// Always the leader (leader election disabled: a single replica).
    pub fn unconditional() -> Leadership {
        Leadership::new(true, None)
    }

    /// Not the leader until an elector says so.
    pub fn candidate() -> Leadership {
        Leadership::new(false, Some(Instant::now()))
    }

    /// Whether writes may be sent now.
    pub fn is_leader(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.holding && state.valid_until.is_none_or(|until| Instant::now() < until)
    }

    /// `Ok` when writes may be sent now.
    pub fn check(&self) -> Result<(), NotLeader> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(NotLeader)
        }
    }

    /// Notified when leadership is gained or lost (the value is whether it is held).
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.changes.subscribe()
    }

    /// Renewed (or acquired): valid until `until`.
    fn renewed(&self, until: Instant) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.valid_until = Some(until);
        if !state.holding {
            state.holding = true;
            self.changes.send_replace(true);
        }
    }

    /// Lost (or released).
    fn lost(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.holding {
            state.holding = false;
            self.changes.send_replace(false);
        }
    }
}

/// What a candidate may do with the Lease as it last read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseVerdict {
    /// No holder, or the holder's record expired: take it.
    Free,
    /// This candidate holds it: renew.
    Mine,
    /// Someone else holds a valid record: wait.
    Held,
}

/// The verdict on `spec` for `identity`, where the current record was first seen (unchanged
/// since) at `observed_at` on the local clock.
pub fn lease_verdict(
    spec: &LeaseSpec,
    identity: &str,
    observed_at: Instant,
    now: Instant,
) -> LeaseVerdict {
    match spec.holder_identity.as_deref() {
        None | Some("") => LeaseVerdict::Free,
        Some(holder) if holder == identity => LeaseVerdict::Mine,
        Some(_) => {
            let seconds = spec.lease_duration_seconds.unwrap_or(0).max(0);
            let duration = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
            if now >= observed_at + duration {
                LeaseVerdict::Free
            } else {
                LeaseVerdict::Held
            }
        }
    }
}

/// Why talking to the Lease failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error(
        "read Lease {namespace}/{name}: {source}; check that the namespace exists and RBAC allows get"
    )]
    Read {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error(
        "write Lease {namespace}/{name}: {source}; check that RBAC allows create and update on leases"
    )]
    Write {
        namespace: String,
        name: String,
        source: kube::Error,
    },
}

/// Runs an election for one candidate.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    leadership: Leadership,
    /// The holder record last seen and when it was first seen unchanged.
    seen: Option<(Option<String>, Option<MicroTime>, Instant)>,
}

/// Parameters of the Lease writes: Tessera's field manager, so `managedFields` says who holds it.
fn lease_write_params() -> PostParams {
    PostParams {
        field_manager: Some(tessera_api::names::FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl LeaderElector {
    /// An elector reporting into `leadership` (see [`Leadership::candidate`]).
    pub fn new(client: kube::Client, config: LeaseConfig, leadership: Leadership) -> LeaderElector {
        LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
            leadership,
            seen: None,
        }
    }

    fn read_error(&self, source: kube::Error) -> LeaseError {
        LeaseError::Read {
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            source,
        }
    }

    fn write_error(&self, source: kube::Error) -> LeaseError {
        LeaseError::Write {
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            source,
        }
    }

    /// Campaigns and renews until `stop` turns true, then releases the Lease if held.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        loop {
            if *stop.borrow() {
                break;
            }
            let started = Instant::now();
            match self.try_acquire_or_renew(started).await {
                Ok(true) => self
                    .leadership
                    .renewed(started + self.config.renew_deadline),
                Ok(false) => self.leadership.lost(),
                Err(e) => {
                    tracing::warn!(error = %e, "leader election: acquiring or renewing the lease failed");
                    if !self.leadership.is_leader() {
                        self.leadership.lost();
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.retry_period) => {}
                _ = stop.changed() => {}
            }
        }
        let held = self.leadership.is_leader();
        self.leadership.lost();
        if held && let Err(e) = self.release().await {
            tracing::warn!(error = %e, "leader election: releasing the lease failed; a successor waits for it to expire");
        }
    }

    /// One round: `Ok(true)` when this candidate holds the Lease afterwards.
    pub async fn try_acquire_or_renew(&mut self, now: Instant) -> Result<bool, LeaseError> {
        let current = match self.api.get_opt(&self.config.name).await {
            Ok(lease) => lease,
            Err(e) => return Err(self.read_error(e)),
        };
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(self.record(None, true)),
            };
            return match self.api.create(&lease_write_params(), &lease).await {
                Ok(_) => Ok(true),
                Err(e) if is_conflict(&e) => Ok(false),
                Err(e) => Err(self.write_error(e)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let observed_at = self.observe(&spec, now);
        let verdict = lease_verdict(&spec, &self.config.identity, observed_at, now);
        if verdict == LeaseVerdict::Held {
            return Ok(false);
        }
        let renewing = verdict == LeaseVerdict::Mine;
        let mut record = self.record(Some(&spec), !renewing);
        if renewing {
            record.acquire_time = spec.acquire_time.clone();
        }
        lease.spec = Some(record);
        match self
            .api
            .replace(&self.config.name, &lease_write_params(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(self.write_error(e)),
        }
    }

    /// When the holder record in `spec` was first seen unchanged.
    fn observe(&mut self, spec: &LeaseSpec, now: Instant) -> Instant {
        let key = (spec.holder_identity.clone(), spec.renew_time.clone());
        match &self.seen {
            Some((holder, renew, at)) if (holder, renew) == (&key.0, &key.1) => *at,
            _ => {
                self.seen = Some((key.0, key.1, now));
                now
            }
        }
    }

    fn record(&self, previous: Option<&LeaseSpec>, acquiring: bool) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
        let changed_hands = acquiring
            && previous
                .and_then(|p| p.holder_identity.as_deref())
                .is_some_and(|h| !h.is_empty() && h != self.config.identity);
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(transitions + i32::from(changed_hands)),
            ..Default::default()
        }
    }

    /// Gives the Lease up: no holder, expiring at once.
    pub async fn release(&self) -> Result<(), LeaseError> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(|e| self.read_error(e))?
        else {
            return Ok(());
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        let now = MicroTime(Timestamp::now());
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now.clone());
        spec.acquire_time = Some(now);
        lease.spec = Some(spec);
        match self
            .api
            .replace(&self.config.name, &lease_write_params(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            // Someone took it meanwhile: nothing to release.
            Err(e) if is_conflict(&e) => Ok(()),
            Err(e) => Err(self.write_error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(Into::into),
            lease_duration_seconds: Some(seconds),
            ..Default::default()
        }
    }

    #[test]
    fn verdicts_follow_the_local_observation_clock() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(16);
        assert_eq!(
            lease_verdict(&spec(None, 15), "me", t0, t0),
            LeaseVerdict::Free
        );
        assert_eq!(
            lease_verdict(&spec(Some(""), 15), "me", t0, t0),
            LeaseVerdict::Free
        );
        assert_eq!(
            lease_verdict(&spec(Some("me"), 15), "me", t0, later),
            LeaseVerdict::Mine
        );
        assert_eq!(
            lease_verdict(&spec(Some("other"), 15), "me", t0, t0),
            LeaseVerdict::Held
        );
        assert_eq!(
            lease_verdict(&spec(Some("other"), 15), "me", t0, later),
            LeaseVerdict::Free,
            "the holder's record did not change for a lease duration"
        );
    }

    #[test]
    fn leadership_lapses_at_its_deadline_without_any_call() {
        let leadership = Leadership::candidate();
        assert!(leadership.check().is_err());
        let mut changes = leadership.subscribe();
        leadership.renewed(Instant::now() + Duration::from_secs(60));
        assert!(leadership.is_leader());
        assert!(changes.has_changed().unwrap());
        assert!(*changes.borrow_and_update());
        leadership.renewed(Instant::now() - Duration::from_millis(1));
        assert!(!leadership.is_leader(), "renewal overdue: no more writes");
        leadership.lost();
        assert!(!*changes.borrow_and_update());
        assert!(Leadership::unconditional().is_leader());
    }
}
