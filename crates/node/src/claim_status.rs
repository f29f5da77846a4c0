//! Writing `ResourceClaim.status.devices` (KEP-4817): after prepare the plugin says, on the
//! claim, which GPU or MIG device each of its allocated devices is (the entries:
//! [`tessera_prepare::device_status`]); after unprepare it takes its entries back.
//!
//! [`StatusWriter`] writes them in the background: prepare never waits for the API server (a
//! failed or slow write never fails or delays a claim). Each claim's latest wanted state is kept
//! until the API server has it (one pending write per claim, the newest). A claim unprepared
//! before its entries reached the API server is forgotten: there is nothing to take back, and its
//! pending write is for a claim no longer prepared. A failed write is retried with a backoff
//! (1 s doubling to 60 s), at most [`MAX_ATTEMPTS`] times ([`MAX_REMOVAL_ATTEMPTS`] for a
//! removal: the API server drops the entries with the allocation anyway). While the API server
//! is unreachable or overloaded (no answer, 429, 5xx) the writer holds every write and probes with
//! one at a time, backing off the same way, so an outage costs one write per backoff, not one per
//! claim; such failures are the API server's, not the claim's, and do not count as attempts. Warnings are logged at most once per [`WARNING_INTERVAL`], counting those held back.
//! Writes are server-side apply of the status subresource with the field manager
//! [`FIELD_MANAGER`]: `status.devices` is a map keyed by driver, pool, device and shareID, so the
//! plugin owns exactly its entries and another driver's entries on the same claim stay. Removal
//! applies an empty configuration: what this manager applied before goes. The claim's UID is a
//! precondition, so a claim deleted and created again under the same name is never written.
//! A claim gone (404), replaced (409) or whose allocation no longer holds the devices (422) is
//! not retried: the API server drops device statuses with the allocation itself.
//!
//! RBAC: `patch` on `resourceclaims/status`, and `associated-node:patch` on
//! `resourceclaims/driver` named `gpu.tessera.dev`: the API server lets the plugin change only
//! this driver's entries, only on claims allocated to its own node (its service account token
//! carries the node name), and not the allocation or reservations (those need
//! `resourceclaims/binding`).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use kube::api::{Api, Patch, PatchParams};
use tessera_kubelet_grpc::{ClaimRef, ClaimUid};
use tessera_prepare::device_status::ClaimStatusSink;
use tessera_process::Stop;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::claims::path_segment;

/// The field manager of the plugin's `status.devices` entries.
pub const FIELD_MANAGER: &str = "tessera-kubelet-plugin";
/// First retry delay of a failed write.
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
/// Longest retry delay.
pub const MAX_RETRY: Duration = Duration::from_secs(60);
/// Attempts at writing one claim's entries before they are given up.
pub const MAX_ATTEMPTS: u32 = 10;
/// Attempts at taking one claim's entries back before that is given up (the API server drops
/// them with the claim's allocation).
pub const MAX_REMOVAL_ATTEMPTS: u32 = 3;
/// At most one warning about failed writes per this interval.
pub const WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// The server-side apply configuration that makes `devices` this manager's entries of the claim
/// (none: removes what it applied before).
pub fn apply_configuration(
    claim: &ClaimRef,
    devices: &[AllocatedDeviceStatus],
) -> serde_json::Value {
    let mut status = serde_json::json!({});
    if !devices.is_empty() {
        status["devices"] = serde_json::to_value(devices).unwrap_or_default();
    }
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": claim.namespace, "name": claim.name, "uid": claim.uid.as_str()},
        "status": status,
    })
}

/// One claim's wanted state, not yet written.
#[derive(Debug)]
struct Wanted {
    claim: ClaimRef,
    devices: Vec<AllocatedDeviceStatus>,
    /// Bumped by every new wanted state, so a write of an older one does not clear a newer one.
    version: u64,
    failures: u32,
    not_before: Instant,
}

/// A write to make: the claim, its entries, and the version of its wanted state.
type Due = (ClaimRef, Vec<AllocatedDeviceStatus>, u64);

#[derive(Debug, Default)]
struct Queue {
    wanted: BTreeMap<ClaimUid, Wanted>,
    /// Claims whose entries the API server has (their last successful write was not empty).
    applied: BTreeSet<ClaimUid>,
    next_version: u64,
    /// While the API server is unreachable: no write before this, then one probe.
    held_until: Option<Instant>,
    unreachable_failures: u32,
    warnings: Warnings,
}

impl Queue {
    /// The API server's failure, not the claim's: the claim waits, uncounted, for the next probe.
    fn wait_for_api_server(&mut self, now: Instant, name: &str, reason: &str) {
        let pending = self.wanted.len();
        let retry_in = backoff(self.unreachable_failures);
        self.warnings.warn(
            now,
            name,
            format_args!(
                "cannot reach the API server to write status.devices (prepare is not affected; \
                 {pending} claim(s) wait, next try in {retry_in:?}): {reason}"
            ),
        );
    }

    /// The API server refused this claim's write: retried after a backoff, or given up after
    /// [`MAX_ATTEMPTS`] ([`MAX_REMOVAL_ATTEMPTS`] for a removal).
    fn refused(&mut self, uid: &ClaimUid, now: Instant, name: &str, entries: bool, reason: &str) {
        let limit = if entries {
            MAX_ATTEMPTS
        } else {
            MAX_REMOVAL_ATTEMPTS
        };
        let Some(wanted) = self.wanted.get_mut(uid) else {
            return;
        };
        wanted.failures += 1;
        if wanted.failures >= limit {
            self.wanted.remove(uid);
            self.warnings.warn(
                now,
                name,
                format_args!(
                    "status.devices given up after {limit} failed writes (prepare is not \
                     affected): {reason}"
                ),
            );
            return;
        }
        let delay = backoff(wanted.failures);
        wanted.not_before = now + delay;
        let pending = self.wanted.len();
        self.warnings.warn(
            now,
            name,
            format_args!(
                "cannot write status.devices (prepare is not affected; retried in {delay:?}, \
                 {pending} claim(s) pending): {reason}"
            ),
        );
    }
}

/// The warning log's rate limit: one line per [`WARNING_INTERVAL`], saying how many failures it
/// stands for.
#[derive(Debug, Default)]
struct Warnings {
    last: Option<Instant>,
    held_back: u64,
    logged: u64,
}

impl Warnings {
    fn warn(&mut self, now: Instant, claim: &str, message: std::fmt::Arguments<'_>) {
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < WARNING_INTERVAL)
        {
            self.held_back += 1;
            return;
        }
        let held_back = std::mem::take(&mut self.held_back);
        self.last = Some(now);
        self.logged += 1;
        tracing::warn!(
            claim = %claim,
            similar_failures_not_logged = held_back,
            "{message}"
        );
    }
}

/// Writes `status.devices` in the background (see the module docs).
pub struct StatusWriter {
    queue: Mutex<Queue>,
    wake: Notify,
}

impl std::fmt::Debug for StatusWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusWriter")
            .field("pending", &self.pending())
            .finish()
    }
}

/// How a write ended.
#[derive(Debug)]
pub enum Written {
    Done,
    /// Not to be retried (the claim is gone or changed); logged.
    Dropped(String),
    /// This claim's write failed; retried after a backoff.
    Retry(String),
    /// The API server is unreachable or overloaded: every write waits.
    Unreachable(String),
}

/// Where the writes go: the API server ([`kube::Client`]), or a test's stand-in.
pub trait StatusApi: Send + Sync + 'static {
    /// Applies `devices` as this manager's entries of `claim`.
    fn write(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDeviceStatus],
    ) -> impl Future<Output = Written> + Send;
}

impl StatusWriter {
    /// Starts the writer with `client` until `stop`.
    pub fn spawn(client: kube::Client, stop: Stop) -> (Arc<StatusWriter>, JoinHandle<()>) {
        Self::spawn_with(client, stop)
    }

    /// Starts the writer with `api` until `stop`.
    pub fn spawn_with(api: impl StatusApi, stop: Stop) -> (Arc<StatusWriter>, JoinHandle<()>) {
        let writer = Arc::new(StatusWriter {
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
        });
        let task = tokio::spawn(Arc::clone(&writer).run(api, stop));
        (writer, task)
    }

    /// Claims whose wanted state the API server does not have yet.
    pub fn pending(&self) -> usize {
        self.lock().wanted.len()
    }

    /// Warning lines logged so far (each may stand for several failures).
    pub fn warnings_logged(&self) -> u64 {
        self.lock().warnings.logged
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn want(&self, claim: ClaimRef, devices: Vec<AllocatedDeviceStatus>) {
        let mut queue = self.lock();
        if devices.is_empty() && !queue.applied.contains(&claim.uid) {
            // Unprepared before its entries reached the API server: nothing to take back.
            queue.wanted.remove(&claim.uid);
            return;
        }
        queue.next_version += 1;
        let version = queue.next_version;
        let uid = claim.uid.clone();
        queue.wanted.insert(
            uid,
            Wanted {
                claim,
                devices,
                version,
                failures: 0,
                not_before: Instant::now(),
            },
        );
        drop(queue);
        self.wake.notify_one();
    }

    /// The writes due now (none while the API server is held as unreachable).
    fn due(&self, now: Instant) -> Vec<Due> {
        let queue = self.lock();
        if queue.held_until.is_some_and(|until| until > now) {
            return Vec::new();
        }
        queue
            .wanted
            .values()
            .filter(|w| w.not_before <= now)
            .map(|w| (w.claim.clone(), w.devices.clone(), w.version))
            .collect()
    }

    /// Whether `version` is still the claim's wanted state (an unprepare may have dropped it).
    fn still_wanted(&self, uid: &ClaimUid, version: u64) -> bool {
        self.lock()
            .wanted
            .get(uid)
            .is_some_and(|w| w.version == version)
    }

    /// When the loop must look again: the end of the hold, or the earliest retry.
    fn next_wake(&self) -> Option<Instant> {
        let queue = self.lock();
        let earliest = queue.wanted.values().map(|w| w.not_before).min()?;
        Some(
            queue
                .held_until
                .map_or(earliest, |until| until.max(earliest)),
        )
    }

    async fn run(self: Arc<Self>, api: impl StatusApi, stop: Stop) {
        loop {
            for (claim, devices, version) in self.due(Instant::now()) {
                if stop.is_cancelled() {
                    return;
                }
                if !self.still_wanted(&claim.uid, version) {
                    continue;
                }
                let written = api.write(&claim, &devices).await;
                if self.finish(&claim, version, !devices.is_empty(), written) {
                    break; // the API server is held: the rest waits for the next probe
                }
            }
            let next = self.next_wake();
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.wake.notified() => {}
                () = sleep => {}
            }
        }
    }

    /// Records how a write of `claim`'s wanted state `version` ended (`entries`: it wrote
    /// entries, not a removal). Returns whether the API server is now held as unreachable.
    fn finish(&self, claim: &ClaimRef, version: u64, entries: bool, written: Written) -> bool {
        let now = Instant::now();
        let mut guard = self.lock();
        let queue = &mut *guard;
        let uid = &claim.uid;
        if let Written::Unreachable(_) = &written {
            queue.unreachable_failures += 1;
            queue.held_until = Some(now + backoff(queue.unreachable_failures));
        } else {
            queue.unreachable_failures = 0;
            queue.held_until = None;
        }
        if let Written::Done = &written {
            if entries {
                queue.applied.insert(uid.clone());
            } else {
                queue.applied.remove(uid);
            }
        }
        let held = queue.held_until.is_some();
        let Some(wanted) = queue.wanted.get_mut(uid) else {
            if entries && matches!(written, Written::Done) {
                // Unprepared while its entries were being written: take them back.
                drop(guard);
                self.want(claim.clone(), Vec::new());
            }
            return held;
        };
        if wanted.version != version {
            return held; // a newer state came in meanwhile; it is written next
        }
        let name = format!("{}/{}", claim.namespace, claim.name);
        match written {
            Written::Done => {
                queue.wanted.remove(uid);
            }
            Written::Dropped(reason) => {
                tracing::info!(claim = %name, "status.devices not written: {reason}");
                queue.applied.remove(uid);
                queue.wanted.remove(uid);
            }
            Written::Unreachable(reason) => queue.wait_for_api_server(now, &name, &reason),
            Written::Retry(reason) => queue.refused(uid, now, &name, entries, &reason),
        }
        held
    }
}

/// The delay after `failures` failed attempts: 1 s doubling to [`MAX_RETRY`].
fn backoff(failures: u32) -> Duration {
    FIRST_RETRY
        .saturating_mul(1 << failures.min(7).saturating_sub(1))
        .min(MAX_RETRY)
}

impl StatusApi for kube::Client {
    async fn write(&self, claim: &ClaimRef, devices: &[AllocatedDeviceStatus]) -> Written {
        let api: Api<ResourceClaim> =
            Api::namespaced(self.clone(), &path_segment(&claim.namespace));
        let body = apply_configuration(claim, devices);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        match api
            .patch_status(&path_segment(&claim.name), &params, &Patch::Apply(&body))
            .await
        {
            Ok(_) => Written::Done,
            Err(kube::Error::Api(status)) if [404, 409, 422].contains(&status.code) => {
                Written::Dropped(status.message)
            }
            Err(kube::Error::Api(status)) if status.code == 429 || status.code >= 500 => {
                Written::Unreachable(format!("{} ({})", status.message, status.code))
            }
            Err(kube::Error::Api(status)) => {
                Written::Retry(format!("{} ({})", status.message, status.code))
            }
            Err(error) => Written::Unreachable(error.to_string()),
        }
    }
}

impl ClaimStatusSink for StatusWriter {
    fn prepared(&self, claim: ClaimRef, devices: Vec<AllocatedDeviceStatus>) {
        self.want(claim, devices);
    }

    fn unprepared(&self, claim: ClaimRef) {
        self.want(claim, Vec::new());
    }
}
