//! Writing `ResourceClaim.status.devices` (KEP-4817): after prepare the plugin says, on the
//! claim, which GPU or MIG device each of its allocated devices is (the entries:
//! [`tessera_prepare::device_status`]); after unprepare it takes its entries back.
//!
//! [`StatusWriter`] writes them in the background: prepare never waits for the API server (a
//! failed or slow write never fails or delays a claim). Each claim's latest wanted state is kept
//! until the API server has it; failed writes are retried with a backoff (1 s doubling to 60 s).
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

use std::collections::BTreeMap;
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

#[derive(Debug, Default)]
struct Queue {
    wanted: BTreeMap<ClaimUid, Wanted>,
    next_version: u64,
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
enum Written {
    Done,
    /// Not to be retried (the claim is gone or changed); logged.
    Dropped(String),
    Retry(String),
}

impl StatusWriter {
    /// Starts the writer with `client` until `stop`.
    pub fn spawn(client: kube::Client, stop: Stop) -> (Arc<StatusWriter>, JoinHandle<()>) {
        let writer = Arc::new(StatusWriter {
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
        });
        let task = tokio::spawn(Arc::clone(&writer).run(client, stop));
        (writer, task)
    }

    /// Claims whose wanted state the API server does not have yet.
    pub fn pending(&self) -> usize {
        self.lock().wanted.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn want(&self, claim: ClaimRef, devices: Vec<AllocatedDeviceStatus>) {
        let mut queue = self.lock();
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

    async fn run(self: Arc<Self>, client: kube::Client, stop: Stop) {
        loop {
            let now = Instant::now();
            let due: Vec<(ClaimUid, ClaimRef, Vec<AllocatedDeviceStatus>, u64)> = self
                .lock()
                .wanted
                .iter()
                .filter(|(_, w)| w.not_before <= now)
                .map(|(uid, w)| (uid.clone(), w.claim.clone(), w.devices.clone(), w.version))
                .collect();
            for (uid, claim, devices, version) in due {
                if stop.is_cancelled() {
                    return;
                }
                let written = write(&client, &claim, &devices).await;
                self.finish(&uid, version, written);
            }
            // The earliest retry still waiting (new wanted states wake the loop at once).
            let next = self.lock().wanted.values().map(|w| w.not_before).min();
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

    fn finish(&self, uid: &ClaimUid, version: u64, written: Written) {
        let mut queue = self.lock();
        let Some(wanted) = queue.wanted.get_mut(uid) else {
            return;
        };
        if wanted.version != version {
            return; // a newer state came in meanwhile; it is written next
        }
        let name = format!("{}/{}", wanted.claim.namespace, wanted.claim.name);
        match written {
            Written::Done => {
                queue.wanted.remove(uid);
            }
            Written::Dropped(reason) => {
                tracing::info!(claim = %name, "status.devices not written: {reason}");
                queue.wanted.remove(uid);
            }
            Written::Retry(reason) => {
                wanted.failures += 1;
                let delay = FIRST_RETRY
                    .saturating_mul(1 << wanted.failures.min(6).saturating_sub(1))
                    .min(MAX_RETRY);
                wanted.not_before = Instant::now() + delay;
                tracing::warn!(
                    claim = %name,
                    retry_in = ?delay,
                    "cannot write status.devices (prepare is not affected; retried): {reason}"
                );
            }
        }
    }
}

async fn write(
    client: &kube::Client,
    claim: &ClaimRef,
    devices: &[AllocatedDeviceStatus],
) -> Written {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &path_segment(&claim.namespace));
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
        Err(error) => Written::Retry(error.to_string()),
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
