//! A test-only, in-memory Kubernetes API server for the resources Tessera uses.
//!
//! Objects are stored as JSON per (group, version, resource, namespace, name), with a global
//! resourceVersion counter, uids, creation timestamps and generations. The verbs GET, LIST
//! (label and field selectors, `limit`/`continue`), WATCH (history replay, `410 Expired`,
//! bookmarks, `sendInitialEvents` streaming lists), CREATE (`generateName`), UPDATE
//! (resourceVersion conflicts → 409), PATCH (JSON merge, strategic merge treated as merge, JSON
//! patch, server-side apply approximated as below), DELETE (finalizers → `deletionTimestamp`),
//! DELETECOLLECTION and the `status` subresource are served for:
//!
//! - `resource.k8s.io/v1`: ResourceSlices, ResourceClaims (+status), ResourceClaimTemplates,
//!   DeviceClasses;
//! - `v1`: Nodes (+status), Namespaces (+status), Pods (+status), Events, Secrets;
//! - `events.k8s.io/v1` Events, `coordination.k8s.io/v1` Leases,
//!   `admissionregistration.k8s.io/v1` MutatingWebhookConfigurations;
//!
//! plus `/version` and the legacy discovery documents.
//!
//! Reach it in-process with [`FakeApiServer::client`] (a [`kube::Client`] over a tower service)
//! or over HTTP with [`FakeApiServer::serve_http`] (loopback port, generated kubeconfig) for
//! tests that run a binary. Test hooks seed and read objects, inject faults ([`Fault`]), count
//! requests ([`FakeApiServer::request_count`]), drop fields on write (a disabled feature gate),
//! add validation and compact the watch history.
//!
//! Server-side apply is approximated (the fake has no schema): the applied configuration is
//! merged into the object like a JSON merge patch (maps merge, lists are replaced whole), and the
//! fields the same manager applied last time but left out now are removed; the manager is
//! recorded in `metadata.managedFields` (operation `Apply`, `fieldsV1` of the applied fields,
//! lists as single fields). Ownership conflicts between managers are not detected (`force` is
//! accepted and changes nothing) and list merge keys (`+listType=map`) are not honoured.
//! Strategic merge patches are treated as JSON merge patches (lists replaced whole).
//!
//! Not modelled: authentication and authorization, admission, defaulting and schema validation
//! (objects are stored as sent, unknown fields included), garbage collection of owned objects,
//! graceful pod deletion (pods go at once unless they have finalizers), namespace existence,
//! dry runs (refused), protobuf and CBOR (JSON only), aggregated discovery.
//!
//! Modules: `error` (failures as `meta/v1` Status objects), `resources` (the resource
//! types served), `selectors`, `store`, `managed_fields`, `hooks` (faults, dropped fields, the
//! request log), `shared` (the state every handle shares), `target` (a write's target and its
//! checks), `apply` (server-side apply, approximated), `write`, `watch`, `discovery`, `http` (the
//! loopback server), `server` (`FakeApiServer`).

mod apply;
mod discovery;
mod error;
mod hooks;
mod http;
mod managed_fields;
pub mod resources;
mod selectors;
mod server;
mod shared;
mod store;
mod target;
mod watch;
mod write;

pub use error::ApiError;
pub use hooks::{Fault, RecordedRequest, Validator, Verb};
pub use server::{
    DEFAULT_BOOKMARK_INTERVAL, DEFAULT_VERSION, FakeApiServer, FakeService, HttpClientError,
    HttpServer, kubeconfig_yaml,
};
pub use store::DEFAULT_HISTORY_LIMIT;
