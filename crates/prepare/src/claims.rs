//! Where the driver reads claims: the [`ClaimSource`] trait, which the node plugin implements
//! with the API server (`tessera_node::claims::KubeClaimSource`), and [`InMemoryClaims`] (tests,
//! and processes without an API server). [`ClaimSource::note`] records on a claim how its
//! configuration was read.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;

/// A boxed future, so that [`ClaimSource`] can be used as a trait object.
pub type ClaimFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, ClaimSourceError>> + Send + 'a>>;

/// Reading a claim failed (the claim not existing is not a failure: `Ok(None)`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClaimSourceError {
    /// `GET` of one claim failed.
    #[error("cannot read ResourceClaim {namespace}/{name} from the API server: {reason}")]
    Get {
        namespace: String,
        name: String,
        reason: String,
    },
    /// Listing claims failed.
    #[error("cannot list ResourceClaims from the API server: {reason}")]
    List { reason: String },
    /// Recording an Event on a claim failed.
    #[error("cannot record an Event on ResourceClaim {namespace}/{name}: {reason}")]
    Note {
        namespace: String,
        name: String,
        reason: String,
    },
    /// The API server did not answer in time.
    #[error(
        "the API server did not answer {what} within {}s; the kubelet retries",
        timeout.as_secs_f64()
    )]
    Timeout { what: String, timeout: Duration },
}

/// Where the driver reads claims from.
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim `namespace/name` as it is now, or `None` if it does not exist.
    fn get(&self, namespace: String, name: String) -> ClaimFuture<'_, Option<ResourceClaim>>;

    /// Every claim, in all namespaces. Used only to rebuild state after a lost checkpoint.
    fn list(&self) -> ClaimFuture<'_, Vec<ResourceClaim>>;

    /// Records on `claim` how the plugin read its configuration, e.g. NVIDIA's configs read as
    /// Tessera's (from the API server: a Normal Event on the claim).
    fn note(&self, claim: &ResourceClaim, note: String) -> ClaimFuture<'_, ()>;
}

/// Claims held in memory, keyed by namespace and name; tests change them at will.
#[derive(Debug, Default)]
pub struct InMemoryClaims {
    claims: Mutex<BTreeMap<(String, String), ResourceClaim>>,
    unavailable: Mutex<bool>,
    notes: Mutex<Vec<(String, String, String)>>,
}

impl InMemoryClaims {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a claim (namespace and name from its metadata).
    pub fn put(&self, claim: ResourceClaim) {
        let key = (
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        self.lock().insert(key, claim);
    }

    /// Removes a claim.
    pub fn remove(&self, namespace: &str, name: &str) -> Option<ResourceClaim> {
        self.lock().remove(&(namespace.to_owned(), name.to_owned()))
    }

    /// Makes every read fail (an unreachable API server) until called with `false`.
    pub fn set_unavailable(&self, unavailable: bool) {
        *self.unavailable.lock().unwrap_or_else(|e| e.into_inner()) = unavailable;
    }

    /// The notes recorded so far: (namespace, name, note).
    pub fn notes(&self) -> Vec<(String, String, String)> {
        self.notes.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn is_unavailable(&self) -> bool {
        *self.unavailable.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), ResourceClaim>> {
        self.claims.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ClaimSource for InMemoryClaims {
    fn get(&self, namespace: String, name: String) -> ClaimFuture<'_, Option<ResourceClaim>> {
        let result = if self.is_unavailable() {
            Err(ClaimSourceError::Get {
                namespace,
                name,
                reason: "the API server is unavailable".into(),
            })
        } else {
            Ok(self.lock().get(&(namespace, name)).cloned())
        };
        Box::pin(std::future::ready(result))
    }

    fn list(&self) -> ClaimFuture<'_, Vec<ResourceClaim>> {
        let result = if self.is_unavailable() {
            Err(ClaimSourceError::List {
                reason: "the API server is unavailable".into(),
            })
        } else {
            Ok(self.lock().values().cloned().collect())
        };
        Box::pin(std::future::ready(result))
    }

    fn note(&self, claim: &ResourceClaim, note: String) -> ClaimFuture<'_, ()> {
        self.notes.lock().unwrap_or_else(|e| e.into_inner()).push((
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default(),
            note,
        ));
        Box::pin(std::future::ready(Ok(())))
    }
}
