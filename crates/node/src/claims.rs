//! Reading ResourceClaims from the API server: [`KubeClaimSource`], the node plugin's
//! [`ClaimSource`].
//!
//! [`KubeClaimSource`] bounds every read by a timeout well inside the kubelet's 45 s deadline
//! (a hung API server fails the claim in time for the kubelet's retry instead of holding the
//! call), and how many reads run at once (a batch of thousands of claims reuses a few
//! connections instead of opening one per claim). Names go into request paths percent-encoded.
//! [`ClaimSource::note`] records an Event on a claim (how its configuration was read), with the
//! reason [`TRANSLATED_CONFIG_REASON`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use tokio::sync::Semaphore;

use tessera_prepare::claims::{ClaimFuture, ClaimSource, ClaimSourceError};

/// How long one read of the API server may take by default.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How many claim reads run at once by default (each holds one connection).
pub const DEFAULT_CONCURRENT_READS: usize = 32;

/// Characters left as they are in a path segment: RFC 3986 unreserved.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `segment` escaped for one segment of a request path (kube puts names into URLs as given).
pub fn path_segment(segment: &str) -> String {
    utf8_percent_encode(segment, PATH_SEGMENT).to_string()
}

/// Reason of the Event that says an NVIDIA configuration was read as Tessera's.
pub const TRANSLATED_CONFIG_REASON: &str = "NvidiaConfigTranslated";
/// Longest Event note the API server takes.
const MAX_EVENT_NOTE_BYTES: usize = 1024;

/// Claims from the API server (`resource.k8s.io/v1`).
#[derive(Clone)]
pub struct KubeClaimSource {
    client: kube::Client,
    timeout: Duration,
    reads: Arc<Semaphore>,
    reporter_instance: Option<String>,
}

impl KubeClaimSource {
    /// Reads claims with `client` (needs `get` and `list` on `resourceclaims`), each read
    /// bounded by [`DEFAULT_READ_TIMEOUT`], at most [`DEFAULT_CONCURRENT_READS`] at once.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            timeout: DEFAULT_READ_TIMEOUT,
            reads: Arc::new(Semaphore::new(DEFAULT_CONCURRENT_READS)),
            reporter_instance: None,
        }
    }

    /// Names this plugin instance (the node) in the Events it records.
    pub fn reporter_instance(mut self, instance: impl Into<String>) -> Self {
        self.reporter_instance = Some(instance.into());
        self
    }

    /// Bounds each read by `timeout` instead (waiting for a free read slot included).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs `read` in a read slot, within the timeout.
    async fn bounded<T>(
        &self,
        what: impl FnOnce() -> String,
        read: impl Future<Output = Result<T, ClaimSourceError>>,
    ) -> Result<T, ClaimSourceError> {
        let slot_and_read = async {
            let _slot = self.reads.acquire().await;
            read.await
        };
        tokio::time::timeout(self.timeout, slot_and_read)
            .await
            .unwrap_or_else(|_| {
                Err(ClaimSourceError::Timeout {
                    what: what(),
                    timeout: self.timeout,
                })
            })
    }
}

impl ClaimSource for KubeClaimSource {
    fn get(&self, namespace: String, name: String) -> ClaimFuture<'_, Option<ResourceClaim>> {
        Box::pin(async move {
            let api: Api<ResourceClaim> =
                Api::namespaced(self.client.clone(), &path_segment(&namespace));
            let read = async {
                api.get_opt(&path_segment(&name))
                    .await
                    .map_err(|e| ClaimSourceError::Get {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        reason: e.to_string(),
                    })
            };
            self.bounded(|| format!("GET ResourceClaim {namespace}/{name}"), read)
                .await
        })
    }

    fn list(&self) -> ClaimFuture<'_, Vec<ResourceClaim>> {
        Box::pin(async move {
            let api: Api<ResourceClaim> = Api::all(self.client.clone());
            let mut claims = Vec::new();
            let mut params = ListParams::default().limit(500);
            loop {
                let read = async {
                    api.list(&params).await.map_err(|e| ClaimSourceError::List {
                        reason: e.to_string(),
                    })
                };
                let page = self
                    .bounded(|| "LIST ResourceClaims".to_owned(), read)
                    .await?;
                let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
                claims.extend(page.items);
                match next {
                    Some(token) => params = params.continue_token(&token),
                    None => return Ok(claims),
                }
            }
        })
    }

    fn note(&self, claim: &ResourceClaim, note: String) -> ClaimFuture<'_, ()> {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let reference = ObjectReference {
            api_version: Some("resource.k8s.io/v1".into()),
            kind: Some("ResourceClaim".into()),
            namespace: Some(namespace.clone()),
            name: Some(name.clone()),
            uid: claim.metadata.uid.clone(),
            ..ObjectReference::default()
        };
        Box::pin(async move {
            let recorder = Recorder::new(
                self.client.clone(),
                Reporter {
                    controller: "tessera-kubelet-plugin".into(),
                    instance: self.reporter_instance.clone(),
                },
            );
            let event = Event {
                type_: EventType::Normal,
                reason: TRANSLATED_CONFIG_REASON.into(),
                note: Some(truncate(&note, MAX_EVENT_NOTE_BYTES)),
                action: "PrepareResources".into(),
                secondary: None,
            };
            let write = async {
                recorder
                    .publish(&event, &reference)
                    .await
                    .map_err(|e| ClaimSourceError::Note {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        reason: e.to_string(),
                    })
            };
            self.bounded(
                || format!("POST Event on ResourceClaim {namespace}/{name}"),
                write,
            )
            .await
        })
    }
}

/// `text` cut to at most `max` bytes, at a character boundary (Event notes have a size limit).
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;
    use tessera_fake_apiserver::{FakeApiServer, Verb};

    use super::*;

    fn claim(namespace: &str, name: &str) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"namespace": namespace, "name": name},
            "spec": {"devices": {"requests": []}},
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn names_are_escaped_in_request_paths() {
        let server = FakeApiServer::new();
        server.seed(&claim("ml", "a"));
        let source = KubeClaimSource::new(server.client());
        // Unescaped, this would read claim `a` (with a query), or watch it and never return.
        for name in ["a?watch=true", "a/../a", "a#x", "a%2F"] {
            let read =
                tokio::time::timeout(Duration::from_secs(5), source.get("ml".into(), name.into()))
                    .await
                    .unwrap_or_else(|_| panic!("reading {name:?} hung"));
            assert!(matches!(read, Ok(None)), "{name:?}: {read:?}");
        }
        assert_eq!(server.request_count(Verb::Watch, "resourceclaims"), 0);
        assert!(source.get("ml".into(), "a".into()).await.unwrap().is_some());
        assert_eq!(path_segment("a b/c?d"), "a%20b%2Fc%3Fd");
    }
}
