//! Writing a node's daemon health on its domain's claim ([`super::condition`] says what and why
//! so): the condition by server-side apply of the claim's status under this node's field manager,
//! and an Event on the claim when the state changes.
//!
//! Each claim's last written condition is remembered, so a state that holds costs no write; after
//! a plugin restart the claim's own condition is the previous state. Writes are bounded by
//! [`WRITE_TIMEOUT`]; a failed one is logged by the caller and made again at the next report
//! (prepare's retry, or the next refresh).
//!
//! RBAC: `patch` on `resourceclaims/status`, and `arbitrary-node:patch` on `resourceclaims/driver`
//! named `gpu.tessera.dev`: a domain's claim is allocated to the nodes of a fabric clique, not to
//! this node alone, so the API server's per-driver check asks for it instead of the
//! `associated-node:patch` that a node-local claim's `status.devices` needs (still only this
//! driver's entries, never the allocation or reservations); `create`/`patch` on `events.k8s.io`
//! events, as the plugin's other Events.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use super::condition::{
    DaemonHealth, Recorded, apply_configuration, change, channel_device, empty_configuration,
    field_manager, next, recorded,
};
use crate::claims::{path_segment, truncate};

/// How long one write (the condition, or the Event) may take.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_NOTE: usize = 1024;

/// This node's daemon health on its domains' claims.
pub struct DomainConditions {
    client: kube::Client,
    node: String,
    recorder: Recorder,
    /// The condition last written, by claim UID.
    written: Mutex<HashMap<String, Recorded>>,
}

impl DomainConditions {
    pub fn new(client: kube::Client, node: &str) -> Self {
        DomainConditions {
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: "tessera-kubelet-plugin".into(),
                    instance: Some(node.to_owned()),
                },
            ),
            client,
            node: node.to_owned(),
            written: Mutex::default(),
        }
    }

    fn written(&self) -> std::sync::MutexGuard<'_, HashMap<String, Recorded>> {
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that this node's daemon of the claim's domain is in state `health`: the condition
    /// when it changed, and an Event when readiness changed.
    pub async fn report(&self, claim: &ResourceClaim, health: &DaemonHealth) -> Result<(), String> {
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let what = claim_name(claim);
        let remembered = self.written().get(&uid).cloned();
        let previous = remembered.or_else(|| recorded(claim, &self.node));
        let wanted = next(
            previous.as_ref(),
            health,
            Time(k8s_openapi::jiff::Timestamp::now()),
        );
        if previous
            .as_ref()
            .is_some_and(|p| p.ready == wanted.ready && p.message == wanted.message)
        {
            return Ok(());
        }
        let (pool, device) = channel_device(claim)
            .ok_or_else(|| format!("claim {what} has no IMEX channel allocated"))?;
        let body = apply_configuration(claim, (&pool, &device), &self.node, &wanted);
        self.apply(claim, &body)
            .await
            .map_err(|e| format!("cannot write the IMEX daemon condition on claim {what}: {e}"))?;
        self.written().insert(uid, wanted.clone());
        let Some((warning, reason)) = change(previous.as_ref(), health) else {
            return Ok(());
        };
        let note = match health {
            DaemonHealth::Ready => {
                format!("node {}: the IMEX daemon answers READY again", self.node)
            }
            DaemonHealth::NotReady(_) => format!(
                "node {}: the IMEX daemon is not ready: {}",
                self.node, wanted.message
            ),
        };
        self.event(claim, warning, reason, note)
            .await
            .map_err(|e| format!("cannot record an Event on claim {what}: {e}"))
    }

    /// Takes this node's condition off the claim (the domain left the node); returns whether it
    /// did. A condition saying the daemon is not ready stays: a failed start is undone at once
    /// and the kubelet retries it, and the claim must go on saying why its pod waits (it goes when
    /// the daemon answers, or with the claim's allocation). A claim gone or no longer allocated
    /// has no condition to take back.
    pub async fn forget(&self, namespace: &str, name: &str, uid: &str) -> Result<bool, String> {
        if self.written().get(uid).is_some_and(|r| !r.ready) {
            return Ok(false);
        }
        self.written().remove(uid);
        let claim = ResourceClaim {
            metadata: ObjectMeta {
                namespace: Some(namespace.to_owned()),
                name: Some(name.to_owned()),
                uid: Some(uid.to_owned()),
                ..ObjectMeta::default()
            },
            ..ResourceClaim::default()
        };
        match self.apply(&claim, &empty_configuration(&claim)).await {
            Err(kube::Error::Api(e)) if [404, 409, 422].contains(&e.code) => Ok(true),
            other => other.map(|()| true).map_err(|e| {
                format!("cannot take the IMEX daemon condition off claim {namespace}/{name}: {e}")
            }),
        }
    }

    async fn apply(&self, claim: &ResourceClaim, body: &serde_json::Value) -> kube::Result<()> {
        let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        let params = PatchParams::apply(&field_manager(&self.node)).force();
        let segment = path_segment(name);
        let patch = Patch::Apply(body);
        let write = api.patch_status(&segment, &params, &patch);
        match tokio::time::timeout(WRITE_TIMEOUT, write).await {
            Ok(result) => result.map(drop),
            Err(_) => Err(kube::Error::Service(
                format!("no answer within {WRITE_TIMEOUT:?}").into(),
            )),
        }
    }

    async fn event(
        &self,
        claim: &ResourceClaim,
        warning: bool,
        reason: &str,
        note: String,
    ) -> Result<(), String> {
        let reference = ObjectReference {
            api_version: Some("resource.k8s.io/v1".into()),
            kind: Some("ResourceClaim".into()),
            namespace: claim.metadata.namespace.clone(),
            name: claim.metadata.name.clone(),
            uid: claim.metadata.uid.clone(),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(truncate(&note, MAX_NOTE)),
            action: "CheckIMEXDaemon".into(),
            secondary: None,
        };
        match tokio::time::timeout(WRITE_TIMEOUT, self.recorder.publish(&event, &reference)).await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {WRITE_TIMEOUT:?}")),
        }
    }
}

fn claim_name(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}
