//! Reading ResourceClaims: the [`ClaimSource`] trait, [`KubeClaimSource`] (the API server) and
//! [`InMemoryClaims`] (tests, and processes without an API server).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams};

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
}

/// Where the driver reads claims from.
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim `namespace/name` as it is now, or `None` if it does not exist.
    fn get(&self, namespace: String, name: String) -> ClaimFuture<'_, Option<ResourceClaim>>;

    /// Every claim, in all namespaces. Used only to rebuild state after a lost checkpoint.
    fn list(&self) -> ClaimFuture<'_, Vec<ResourceClaim>>;
}

/// Claims from the API server (`resource.k8s.io/v1`).
#[derive(Clone)]
pub struct KubeClaimSource {
    client: kube::Client,
}

impl KubeClaimSource {
    /// Reads claims with `client` (needs `get` and `list` on `resourceclaims`).
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl ClaimSource for KubeClaimSource {
    fn get(&self, namespace: String, name: String) -> ClaimFuture<'_, Option<ResourceClaim>> {
        Box::pin(async move {
            let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &namespace);
            api.get_opt(&name).await.map_err(|e| ClaimSourceError::Get {
                namespace,
                name,
                reason: e.to_string(),
            })
        })
    }

    fn list(&self) -> ClaimFuture<'_, Vec<ResourceClaim>> {
        Box::pin(async move {
            let api: Api<ResourceClaim> = Api::all(self.client.clone());
            let mut claims = Vec::new();
            let mut params = ListParams::default().limit(500);
            loop {
                let page = api
                    .list(&params)
                    .await
                    .map_err(|e| ClaimSourceError::List {
                        reason: e.to_string(),
                    })?;
                let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
                claims.extend(page.items);
                match next {
                    Some(token) => params = params.continue_token(&token),
                    None => return Ok(claims),
                }
            }
        })
    }
}

/// Claims held in memory, keyed by namespace and name; tests change them at will.
#[derive(Debug, Default)]
pub struct InMemoryClaims {
    claims: Mutex<BTreeMap<(String, String), ResourceClaim>>,
    unavailable: Mutex<bool>,
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
}
