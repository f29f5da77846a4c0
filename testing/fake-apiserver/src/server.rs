//! [`FakeApiServer`]: the shared state, the test hooks, and the two ways to reach it — an
//! in-process tower service behind a [`kube::Client`], or HTTP on a loopback port with a
//! kubeconfig file.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::ApiError;
use crate::hooks::{Fault, FieldDrop, Hooks, RecordedRequest, Verb};
use crate::resources::{self, ResourceType};
use crate::shared::Inner;
use crate::store::{ObjectKey, Store, metadata_mut};
use crate::write::set_type;

/// The Kubernetes release `/version` reports unless [`FakeApiServer::set_version`] says otherwise.
pub const DEFAULT_VERSION: &str = "v1.35.0";

/// How often watches that asked for bookmarks get one, by default.
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(5);

/// An in-memory Kubernetes API server for tests. Cheap to clone: clones share one server.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use k8s_openapi::api::core::v1::Node;
/// use tessera_fake_apiserver::{FakeApiServer, Fault, Verb};
///
/// let server = FakeApiServer::new();
/// server.seed(&Node { metadata: kube::api::ObjectMeta { name: Some("node-a".into()), ..Default::default() }, ..Default::default() });
/// server.inject(Fault::on(Verb::Update, "resourceclaims/status").times(2).status(409));
/// let client = server.client(); // in-process
/// let http = server.serve_http().await?; // or over HTTP, for another process
/// println!("KUBECONFIG={}", http.kubeconfig_path().display());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct FakeApiServer {
    inner: Arc<Inner>,
}

impl Default for FakeApiServer {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApiServer")
            .field("resource_version", &self.resource_version())
            .finish_non_exhaustive()
    }
}

/// The served resource type of `K`; panics (in tests) for a type the fake does not serve.
fn resource_of<K: Resource<DynamicType = ()>>() -> &'static ResourceType {
    let (group, version, plural) = (K::group(&()), K::version(&()), K::plural(&()));
    resources::by_plural(&group, &version, &plural).unwrap_or_else(|| {
        panic!("the fake API server does not serve {plural} in {group}/{version}")
    })
}

fn named_resource(name: &str) -> &'static ResourceType {
    resources::by_name(name)
        .unwrap_or_else(|| panic!("the fake API server does not serve `{name}`"))
}

fn to_json<K: Serialize>(object: &K) -> Value {
    serde_json::to_value(object).expect("Kubernetes objects serialize to JSON")
}

fn from_json<K: DeserializeOwned>(value: impl std::borrow::Borrow<Value>) -> K {
    K::deserialize(value.borrow())
        .unwrap_or_else(|e| panic!("a stored object does not decode: {e}"))
}

impl FakeApiServer {
    /// An empty server reporting [`DEFAULT_VERSION`].
    pub fn new() -> Self {
        let (changes, _) = watch::channel(0);
        Self {
            inner: Arc::new(Inner {
                store: Mutex::new(Store::default()),
                changes,
                hooks: Mutex::new(Hooks::default()),
                version: Mutex::new(DEFAULT_VERSION.to_owned()),
                bookmark_interval: Mutex::new(DEFAULT_BOOKMARK_INTERVAL),
            }),
        }
    }

    /// Makes `/version` report `git_version` (e.g. `v1.34.1`).
    pub fn set_version(&self, git_version: &str) {
        *self.inner.version.lock().expect("version lock") = git_version.to_owned();
    }

    /// How often watches that allow bookmarks get one.
    pub fn set_bookmark_interval(&self, interval: Duration) {
        *self.inner.bookmark_interval.lock().expect("bookmark lock") = interval;
    }

    /// The newest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.inner
            .store
            .lock()
            .expect("store lock")
            .resource_version()
    }

    // --- Reaching the server -----------------------------------------------------------------

    /// A [`kube::Client`] talking to this server in-process (default namespace `default`).
    /// Needs a tokio runtime.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.service(), "default")
    }

    /// The server as a tower service, for `kube::Client::new` or a custom stack.
    pub fn service(&self) -> FakeService {
        FakeService {
            inner: Arc::clone(&self.inner),
        }
    }

    /// Serves HTTP on `127.0.0.1:<free port>` from a task on the current tokio runtime and
    /// writes a kubeconfig for it (plain HTTP, no credentials). Dropping the returned handle stops
    /// accepting connections.
    pub async fn serve_http(&self) -> std::io::Result<HttpServer> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let address = listener.local_addr()?;
        let inner = Arc::clone(&self.inner);
        let router = axum::Router::new().fallback(move |request: Request<Body>| {
            let inner = Arc::clone(&inner);
            async move {
                let (parts, body) = request.into_parts();
                match axum::body::to_bytes(body, usize::MAX).await {
                    Ok(bytes) => crate::http::handle(inner, parts, bytes).await,
                    Err(error) => bad_body(&error.to_string()),
                }
            }
        });
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, router).await {
                tracing::error!(%error, "the fake API server's HTTP listener failed");
            }
        });
        let directory = tempfile::tempdir()?;
        let url = format!("http://{address}");
        let kubeconfig = directory.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&url))?;
        Ok(HttpServer {
            address,
            url,
            kubeconfig,
            _directory: directory,
            task,
        })
    }

    // --- Objects -----------------------------------------------------------------------------

    /// Stores `object` as if it had been created (uid unless set, resourceVersion, generation,
    /// creationTimestamp; status kept as given), bypassing faults, field drops and validation,
    /// and wakes watches. Replaces an existing object of the same name. Returns what is stored.
    pub fn seed<K: Resource<DynamicType = ()> + Serialize + DeserializeOwned>(
        &self,
        object: &K,
    ) -> K {
        from_json(self.seed_json(to_json(object)))
    }

    /// [`FakeApiServer::seed`] for a JSON object with `apiVersion` and `kind`.
    pub fn seed_json(&self, mut object: Value) -> Value {
        let api_version = object
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let kind = object
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let resource = resources::by_kind(&api_version, &kind).unwrap_or_else(|| {
            panic!("the fake API server does not serve kind {kind} of {api_version}")
        });
        let meta = metadata_mut(&mut object);
        let name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        assert!(!name.is_empty(), "a seeded {kind} needs metadata.name");
        let namespace = meta
            .get("namespace")
            .and_then(Value::as_str)
            .map(str::to_owned);
        assert!(
            !resource.namespaced || namespace.is_some(),
            "a seeded {kind} needs metadata.namespace"
        );
        meta.remove("resourceVersion");
        set_type(resource, &mut object);
        let key = ObjectKey::new(resource, namespace.as_deref(), &name);
        let stored = self.inner.mutate(|store, _| {
            store.remove(resource, &key);
            store.insert(resource, key, object)
        });
        Value::clone(&stored)
    }

    /// The stored object, if any (`namespace` is ignored for cluster-scoped types).
    pub fn get<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<K> {
        self.get_stored(resource_of::<K>(), namespace, name)
            .map(from_json)
    }

    /// The stored object as JSON; `resource` is `plural` or `plural.group`.
    pub fn get_json(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        self.get_stored(named_resource(resource), namespace, name)
    }

    fn get_stored(
        &self,
        resource: &ResourceType,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let key = ObjectKey::new(resource, namespace, name);
        self.inner
            .store
            .lock()
            .expect("store lock")
            .get(&key)
            .cloned()
    }

    /// The stored objects of `K` (in `namespace`, or all), ordered by namespace and name.
    pub fn list<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: Option<&str>,
    ) -> Vec<K> {
        self.list_stored(resource_of::<K>(), namespace)
            .into_iter()
            .map(from_json)
            .collect()
    }

    /// [`FakeApiServer::list`] as JSON; `resource` is `plural` or `plural.group`.
    pub fn list_json(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        self.list_stored(named_resource(resource), namespace)
    }

    fn list_stored(&self, resource: &ResourceType, namespace: Option<&str>) -> Vec<Value> {
        let store = self.inner.store.lock().expect("store lock");
        store
            .list(resource, namespace)
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// Changes a stored object in place (as another client would, but bypassing faults, drops
    /// and validation): bumps its resourceVersion, wakes watches, returns the new state. `None`
    /// if there is no such object.
    pub fn edit<K>(
        &self,
        namespace: Option<&str>,
        name: &str,
        change: impl FnOnce(&mut K),
    ) -> Option<K>
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let resource = resource_of::<K>();
        let key = ObjectKey::new(resource, namespace, name);
        self.inner
            .mutate(|store, _| {
                let stored = store.get(&key)?.clone();
                let mut object: K = from_json(stored.clone());
                change(&mut object);
                let mut value = to_json(&object);
                // The server-owned metadata stays the server's.
                for field in ["uid", "creationTimestamp", "generation"] {
                    if let Some(v) = stored.pointer(&format!("/metadata/{field}")) {
                        metadata_mut(&mut value).insert(field.into(), v.clone());
                    }
                }
                Some(store.replace(resource, &key, value))
            })
            .map(from_json)
    }

    /// Removes an object at once (no finalizers), waking watches. Returns its last state.
    pub fn remove<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<K> {
        let resource = resource_of::<K>();
        let key = ObjectKey::new(resource, namespace, name);
        self.inner
            .mutate(|store, _| store.remove(resource, &key))
            .map(from_json)
    }

    /// Waits until the object exists and satisfies `condition`, or `timeout` passes. Returns the
    /// object, or `Err` with its last state (if any) on timeout.
    pub async fn wait_for<K>(
        &self,
        namespace: Option<&str>,
        name: &str,
        timeout: Duration,
        condition: impl Fn(&K) -> bool,
    ) -> Result<K, Option<K>>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let mut changes = self.inner.changes.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let current: Option<K> = self.get(namespace, name);
            if current.as_ref().is_some_and(&condition) {
                return Ok(current.expect("checked"));
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return Err(current);
            }
        }
    }

    // --- Hooks -------------------------------------------------------------------------------

    /// Arms a fault; faults are checked in the order they were injected.
    pub fn inject(&self, fault: Fault) {
        self.inner
            .hooks
            .lock()
            .expect("hooks lock")
            .faults
            .push(fault);
    }

    /// Disarms every fault.
    pub fn clear_faults(&self) {
        self.inner.hooks.lock().expect("hooks lock").faults.clear();
    }

    /// Drops `path` (dotted, `*` for every list element or map value) from every object of
    /// `resource` written through the API, as the API server drops the fields of a disabled
    /// feature gate. `resource` is `plural` or `plural.group`.
    pub fn drop_field_on_write(&self, resource: &str, path: &str) {
        named_resource(resource);
        self.inner
            .hooks
            .lock()
            .expect("hooks lock")
            .drops
            .push(FieldDrop::new(resource, path));
    }

    /// Behaves like an API server with the `DRADeviceTaints` feature gate off: device taints
    /// are dropped from ResourceSlices on write.
    pub fn disable_device_taints(&self) {
        self.drop_field_on_write("resourceslices", "spec.devices.*.taints");
    }

    /// Adds validation for writes to `resource` through the API: an `Err(message)` from
    /// `validator(old, new)` refuses the write with 422 Invalid.
    pub fn validate(
        &self,
        resource: &str,
        validator: impl Fn(Option<&Value>, &Value) -> Result<(), String> + Send + Sync + 'static,
    ) {
        named_resource(resource);
        self.inner
            .hooks
            .lock()
            .expect("hooks lock")
            .validators
            .push((resource.to_owned(), Arc::new(validator)));
    }

    /// Every request answered so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.inner.hooks.lock().expect("hooks lock").log.clone()
    }

    /// How many requests with `verb` went to `resource` (`plural`, `plural.group`, either with
    /// `/status`).
    pub fn request_count(&self, verb: Verb, resource: &str) -> usize {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        self.requests()
            .iter()
            .filter(|r| {
                r.verb == verb
                    && r.subresource == subresource
                    && (r.resource == resource
                        || r.resource
                            .split_once('.')
                            .is_some_and(|(plural, _)| plural == resource))
            })
            .count()
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        self.inner.hooks.lock().expect("hooks lock").log.clear();
    }

    /// Forgets the watch history: a watch resuming from an older resourceVersion gets
    /// 410 Expired and must relist.
    pub fn compact(&self) {
        self.inner.mutate(|store, _| store.compact());
    }

    /// How many events the watch history keeps (default [`crate::DEFAULT_HISTORY_LIMIT`]).
    pub fn set_history_limit(&self, limit: usize) {
        self.inner.mutate(|store, _| store.set_history_limit(limit));
    }
}

/// The fake as a tower service (what [`FakeApiServer::client`] wraps).
#[derive(Clone)]
pub struct FakeService {
    inner: Arc<Inner>,
}

impl tower::Service<Request<kube::client::Body>> for FakeService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<kube::client::Body>) -> Self::Future {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            Ok(match body.collect_bytes().await {
                Ok(bytes) => crate::http::handle(inner, parts, bytes).await,
                Err(error) => bad_body(&error.to_string()),
            })
        })
    }
}

fn bad_body(message: &str) -> Response<Body> {
    let error = ApiError::bad_request(format!("the request body could not be read: {message}"));
    Response::builder()
        .status(400)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(error.to_status().to_string()))
        .expect("a valid response")
}

/// A kubeconfig for `url`: one cluster, no credentials, namespace `default`.
pub fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {url}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\ncurrent-context: fake\n"
    )
}

/// Why [`HttpServer::client`] could not build a client.
#[derive(Debug, thiserror::Error)]
pub enum HttpClientError {
    /// The generated kubeconfig could not be read or used.
    #[error("cannot use the fake API server's kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// kube refused the configuration.
    #[error("cannot build a client for the fake API server: {0}")]
    Client(#[from] kube::Error),
}

/// The fake served over HTTP. Dropping it stops the listener and deletes the kubeconfig.
#[derive(Debug)]
pub struct HttpServer {
    address: SocketAddr,
    url: String,
    kubeconfig: PathBuf,
    _directory: tempfile::TempDir,
    task: JoinHandle<()>,
}

impl HttpServer {
    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A kubeconfig file pointing at this server (for `KUBECONFIG` or `--kubeconfig`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A [`kube::Client`] that goes over HTTP, configured from the kubeconfig.
    pub async fn client(&self) -> Result<kube::Client, HttpClientError> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
