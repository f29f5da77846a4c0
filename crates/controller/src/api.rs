//! Every request the controller sends that changes something, each checked against leadership
//! first and bounded in time. The bodies come from `tessera_placement::writes`.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Pod, PodCondition};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client};
use serde_json::{Value, json};
use tessera_api::names::FIELD_MANAGER;

use crate::leader::{Leadership, NotLeader};
use tessera_placement::protocol::{CONTROLLER_NAME, PLACEMENT_CONDITION, object_key};
use tessera_placement::reason::{EventKind, PodReason};

/// Longest a single write may take.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Parameters of the controller's merge patches: they name Tessera's field manager, so a
/// claim's `status.allocation` and a pod's removed gate are attributed to Tessera in
/// `managedFields` (without one, the API server records the manager "unknown").
pub fn merge_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// A write that did not happen (or whose outcome is unknown).
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{action} {object}: not sent: {source}")]
    NotLeader {
        action: &'static str,
        object: String,
        source: NotLeader,
    },
    #[error(
        "{action} {object}: conflict (it changed since it was read); retrying with the current version"
    )]
    Conflict {
        action: &'static str,
        object: String,
    },
    #[error("{action} {object}: {source}")]
    Api {
        action: &'static str,
        object: String,
        source: kube::Error,
    },
    #[error(
        "{action} {object}: no answer within {timeout:?}; the write may or may not have happened"
    )]
    Timeout {
        action: &'static str,
        object: String,
        timeout: Duration,
    },
}

impl WriteError {
    /// The metric label of the failure.
    pub fn reason(&self) -> &'static str {
        match self {
            WriteError::NotLeader { .. } => "NotLeader",
            WriteError::Conflict { .. } => "Conflict",
            WriteError::Api { .. } | WriteError::Timeout { .. } => "ApiError",
        }
    }
}

/// Sends the controller's writes.
#[derive(Clone)]
pub struct ApiWriter {
    client: Client,
    leadership: Leadership,
    recorder: Recorder,
}

impl ApiWriter {
    pub fn new(client: Client, leadership: Leadership, instance: Option<String>) -> ApiWriter {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: CONTROLLER_NAME.to_owned(),
                instance,
            },
        );
        ApiWriter {
            client,
            leadership,
            recorder,
        }
    }

    async fn send<T>(
        &self,
        action: &'static str,
        object: String,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, WriteError> {
        if let Err(source) = self.leadership.check() {
            return Err(WriteError::NotLeader {
                action,
                object,
                source,
            });
        }
        match tokio::time::timeout(WRITE_TIMEOUT, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                Err(WriteError::Conflict { action, object })
            }
            Ok(Err(source)) => Err(WriteError::Api {
                action,
                object,
                source,
            }),
            Err(_) => Err(WriteError::Timeout {
                action,
                object,
                timeout: WRITE_TIMEOUT,
            }),
        }
    }

    fn claims(&self, claim: &ResourceClaim) -> Api<ResourceClaim> {
        Api::namespaced(
            self.client.clone(),
            claim.metadata.namespace.as_deref().unwrap_or_default(),
        )
    }

    /// The claims API of `claim`'s namespace, its name, and how errors name it.
    fn claim_target(&self, claim: &ResourceClaim) -> (Api<ResourceClaim>, String, String) {
        let name = claim.metadata.name.clone().unwrap_or_default();
        let object = format!("ResourceClaim {}", object_key(&claim.metadata));
        (self.claims(claim), name, object)
    }

    /// Merge-patches a claim's metadata (finalizers, annotations).
    pub async fn patch_claim(
        &self,
        action: &'static str,
        claim: &ResourceClaim,
        body: &Value,
    ) -> Result<ResourceClaim, WriteError> {
        let (api, name, object) = self.claim_target(claim);
        let (params, patch) = (merge_params(), Patch::Merge(body));
        self.send(action, object, api.patch(&name, &params, &patch))
            .await
    }

    /// Merge-patches a claim's status subresource (`status.allocation`).
    pub async fn patch_claim_status(
        &self,
        action: &'static str,
        claim: &ResourceClaim,
        body: &Value,
    ) -> Result<ResourceClaim, WriteError> {
        let (api, name, object) = self.claim_target(claim);
        let (params, patch) = (merge_params(), Patch::Merge(body));
        let request = api.patch_status(&name, &params, &patch);
        self.send(action, object, request).await
    }

    /// Reads a claim fresh from the API server (after a conflict).
    pub async fn get_claim(
        &self,
        claim: &ResourceClaim,
    ) -> Result<Option<ResourceClaim>, WriteError> {
        let (api, name, object) = self.claim_target(claim);
        match tokio::time::timeout(WRITE_TIMEOUT, api.get_opt(&name)).await {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(source)) => Err(WriteError::Api {
                action: "read",
                object,
                source,
            }),
            Err(_) => Err(WriteError::Timeout {
                action: "read",
                object,
                timeout: WRITE_TIMEOUT,
            }),
        }
    }

    /// Reads a `scheduling.k8s.io/v1beta1` PodGroup. `None` when it does not exist or the API
    /// server does not serve the API (the `GenericWorkload` feature gate is off): both answer 404.
    pub async fn get_pod_group(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<k8s_openapi::api::scheduling::v1beta1::PodGroup>, WriteError> {
        let object = format!("PodGroup {namespace}/{name}");
        let api: Api<k8s_openapi::api::scheduling::v1beta1::PodGroup> =
            Api::namespaced(self.client.clone(), namespace);
        match tokio::time::timeout(WRITE_TIMEOUT, api.get_opt(name)).await {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(kube::Error::Api(status))) if status.code == 404 => Ok(None),
            Ok(Err(source)) => Err(WriteError::Api {
                action: "read",
                object,
                source,
            }),
            Err(_) => Err(WriteError::Timeout {
                action: "read",
                object,
                timeout: WRITE_TIMEOUT,
            }),
        }
    }

    /// Creates a ResourceClaimTemplate (one a converted pod names); one that exists already
    /// (another write won) counts as created.
    pub async fn create_template(
        &self,
        template: &ResourceClaimTemplate,
    ) -> Result<(), WriteError> {
        let api: Api<ResourceClaimTemplate> = Api::namespaced(
            self.client.clone(),
            template.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let object = format!("ResourceClaimTemplate {}", object_key(&template.metadata));
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        match self
            .send("create", object, api.create(&params, template))
            .await
        {
            Ok(_) | Err(WriteError::Conflict { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The API of `pod`'s namespace, its name, and how errors name it (`Pod ns/name`).
    fn pod_target(&self, pod: &Pod) -> (Api<Pod>, String, String) {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        (
            Api::namespaced(self.client.clone(), namespace),
            pod.metadata.name.clone().unwrap_or_default(),
            format!("Pod {}", object_key(&pod.metadata)),
        )
    }

    /// Merge-patches a pod.
    pub async fn patch_pod(
        &self,
        action: &'static str,
        pod: &Pod,
        body: &Value,
    ) -> Result<Pod, WriteError> {
        let (api, name, object) = self.pod_target(pod);
        self.send(
            action,
            object,
            api.patch(&name, &merge_params(), &Patch::Merge(body)),
        )
        .await
    }

    /// Merge-patches a pod's status (`status.nominatedNodeName`).
    pub async fn patch_pod_status(
        &self,
        action: &'static str,
        pod: &Pod,
        body: &Value,
    ) -> Result<Pod, WriteError> {
        let (api, name, object) = self.pod_target(pod);
        self.send(
            action,
            object,
            api.patch_status(&name, &merge_params(), &Patch::Merge(body)),
        )
        .await
    }

    /// Evicts a pod through the Eviction API (`policy/v1`), its UID as precondition so only the
    /// pod planned for is evicted. The body is built here: kube's `evict` sends its delete
    /// options under a field name the API server ignores. A 429 (a PodDisruptionBudget allows
    /// no disruption) is an [`WriteError::Api`] error; so is a `Failure` status the server
    /// returns with 201 (a pod covered by several budgets). A pod already gone is evicted.
    pub async fn evict(&self, pod: &Pod) -> Result<(), WriteError> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let (api, name, object) = self.pod_target(pod);
        let body = json!({
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": pod.metadata.uid}},
        });
        let post = kube::api::PostParams::default();
        let request =
            api.create_subresource::<Value, kube::core::Status>("eviction", &name, &post, &body);
        match self.send("evict", object.clone(), request).await {
            Ok(status) if status.is_failure() => Err(WriteError::Api {
                action: "evict",
                object,
                source: kube::Error::Api(Box::new(status)),
            }),
            Ok(_) => Ok(()),
            Err(WriteError::Api {
                source: kube::Error::Api(s),
                ..
            }) if s.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Sets the controller's condition on a pod (server-side apply of that one condition, so
    /// other conditions stay as they are): `True` when `reason` says the pod is placed.
    /// `lastTransitionTime` moves only when the status does.
    pub async fn set_condition(
        &self,
        pod: &Pod,
        reason: PodReason,
        message: &str,
    ) -> Result<Pod, WriteError> {
        let status = condition_status(reason);
        let current = current_condition(pod);
        let since = current
            .filter(|c| c.status == status)
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or(Time(Timestamp::now()));
        let body = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod.metadata.name,
                "namespace": pod.metadata.namespace,
            },
            "status": { "conditions": [{
                "type": PLACEMENT_CONDITION,
                "status": status,
                "reason": reason.as_str(),
                "message": message,
                "lastTransitionTime": since,
            }]},
        });
        let (api, name, object) = self.pod_target(pod);
        self.send(
            "set the placement condition of",
            object,
            api.patch_status(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            ),
        )
        .await
    }

    /// Publishes an event about a pod (best effort: failures are logged, never retried).
    pub async fn event(
        &self,
        reference: &ObjectReference,
        kind: EventKind,
        reason: &str,
        note: &str,
    ) {
        if self.leadership.check().is_err() {
            return;
        }
        let pod = format!(
            "{}/{}",
            reference.namespace.as_deref().unwrap_or_default(),
            reference.name.as_deref().unwrap_or_default()
        );
        let event = Event {
            type_: match kind {
                EventKind::Normal => EventType::Normal,
                EventKind::Warning => EventType::Warning,
            },
            reason: reason.to_owned(),
            note: Some(tessera_placement::message::truncate(
                note,
                tessera_placement::message::EVENT_NOTE_LIMIT,
            )),
            action: "TopologyAwarePlacement".to_owned(),
            secondary: None,
        };
        let publish = self.recorder.publish(&event, reference);
        match tokio::time::timeout(WRITE_TIMEOUT, publish).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(pod = %pod, error = %e, "publishing an event failed")
            }
            Err(_) => {
                tracing::warn!(pod = %pod, "publishing an event timed out")
            }
        }
    }
}

/// The status of the controller's condition for `reason`.
pub fn condition_status(reason: PodReason) -> &'static str {
    reason.condition_status()
}

/// The controller's condition on a pod, if set.
pub fn current_condition(pod: &Pod) -> Option<&PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == PLACEMENT_CONDITION))
}
