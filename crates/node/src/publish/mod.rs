//! Publishing the node's pool: the inventory rendered into ResourceSlices
//! ([`tessera_gpu_inventory::render_slices`]) and server-side applied.
//!
//! - Field manager `tessera`, forced (the slices are ours); every slice is owned by the Node
//!   (owner reference, `controller: false`), so deleting the Node deletes them.
//! - Every slice passes [`check_slice`] for the API server's version before it is written; the
//!   version (`/version`) also decides the 1.34 combined or 1.35+ split counter form.
//! - The pool generation grows when the layout changes ([`pool`]), never goes backwards across
//!   restarts (it is recovered from the slices in the API), and stays put otherwise.
//! - Slices of this node and driver that are no longer rendered are deleted after the new ones
//!   are written (at start, and when the pool shrinks).
//! - Topology-managed nodes (docs/protocol.md): every device carries the
//!   `gpu.tessera.dev/topology-managed:NoSchedule` taint. If the taint does not survive the write
//!   (DRADeviceTaints off: the API server drops device taints), managed mode is refused for the
//!   rest of the process: logged, reported as a Warning event on the Node, and the slices are
//!   published untainted so that the scheduler can still use the devices.
//! - Health findings add their taints ([`crate::health`]); so do GPUs a rescan finds lost, which
//!   stay published with their last known facts ([`tessera_prepare::inventory::lost`]).
//!
//! Slices are never deleted on shutdown: the kubelet removes them 30 s after the plugin is
//! gone, and a restarting plugin must not make the devices flap.

pub mod node;
pub mod pool;
pub mod runner;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tessera_api::names::{FIELD_MANAGER, TOPOLOGY_MANAGED_LABEL, TOPOLOGY_MANAGED_TAINT};
use tessera_api::shares::ConsumableShares;
use tessera_gpu_inventory::{
    GpuInventory, RenderError, RenderOptions, ServerVersion, Violation, check_slice, render_slices,
};

use crate::health::HealthFindings;
use crate::metrics::{NodeMetrics, ResultLabel};
pub use node::{WatchedNode, watch_node};
pub use pool::{PoolLayout, PublishedPool, next_generation};

/// The reason of the Node event that reports refused managed mode.
pub const MANAGED_MODE_REFUSED_REASON: &str = "TopologyManagedModeRefused";

/// What the publisher is configured with.
#[derive(Debug, Clone)]
pub struct PublisherConfig {
    pub node_name: String,
    pub driver_name: String,
    /// Publish MIG-enabled GPUs as partitionable devices.
    pub dynamic_mig: bool,
    /// How devices are published for sharing between claims.
    pub consumable_shares: ConsumableShares,
}

/// Why publishing failed; the publish loop retries with backoff.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// `/version` could not be read.
    #[error("cannot read the API server's version (GET /version): {0}")]
    ReadVersion(#[source] kube::Error),
    /// `/version` names a release without resource.k8s.io/v1.
    #[error(
        "the API server reports version {version}, which does not serve resource.k8s.io/v1 (Kubernetes 1.34 or later is needed)"
    )]
    UnsupportedVersion { version: String },
    /// This node's slices could not be listed.
    #[error("cannot list the ResourceSlices of node {node}: {source}")]
    ListSlices {
        node: String,
        #[source]
        source: kube::Error,
    },
    /// The inventory could not be rendered.
    #[error("cannot render the ResourceSlices of node {node}: {source}")]
    Render {
        node: String,
        #[source]
        source: RenderError,
    },
    /// A slice would break the API server's limits.
    #[error(
        "ResourceSlice {slice} would be refused by the API server {version}:\n{}",
        list(violations)
    )]
    Limits {
        slice: String,
        version: ServerVersion,
        violations: Vec<Violation>,
    },
    /// A slice could not be applied.
    #[error("cannot apply ResourceSlice {slice}: {source}")]
    Apply {
        slice: String,
        #[source]
        source: kube::Error,
    },
    /// A stale slice could not be deleted.
    #[error("cannot delete the stale ResourceSlice {slice}: {source}")]
    DeleteStale {
        slice: String,
        #[source]
        source: kube::Error,
    },
}

fn list(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| format!("  - {v}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What one publish needs.
#[derive(Debug, Clone, Copy)]
pub struct PublishInput<'a> {
    pub inventory: &'a GpuInventory,
    pub node: &'a WatchedNode,
    pub findings: &'a HealthFindings,
}

/// What a successful publish wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishOutcome {
    /// The slices as the API server stored them.
    pub slices: Vec<ResourceSlice>,
    pub generation: i64,
    /// Whether the devices carry the topology-managed taint.
    pub topology_managed: bool,
    /// Stale slices deleted.
    pub deleted: Vec<String>,
}

/// Server-side applies the node's slices; keeps what it needs across publishes (the
/// generation written last, refused managed mode, the API server's version).
pub struct Publisher {
    client: kube::Client,
    config: PublisherConfig,
    metrics: NodeMetrics,
    recorder: Recorder,
    server_version: Option<ServerVersion>,
    written_generation: Option<i64>,
    /// Why managed mode was refused, once it was.
    managed_refused: Option<String>,
    /// What the last publish wrote: slice name → resourceVersion.
    written: BTreeMap<String, String>,
    warned_health_taints_dropped: bool,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("config", &self.config)
            .field("server_version", &self.server_version)
            .field("written_generation", &self.written_generation)
            .field("managed_refused", &self.managed_refused)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    pub fn new(client: kube::Client, config: PublisherConfig, metrics: NodeMetrics) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "tessera-kubelet-plugin".into(),
                instance: Some(config.node_name.clone()),
            },
        );
        Self {
            client,
            config,
            metrics,
            recorder,
            server_version: None,
            written_generation: None,
            managed_refused: None,
            written: BTreeMap::new(),
            warned_health_taints_dropped: false,
        }
    }

    /// Why managed mode was refused, if it was.
    pub fn managed_refused(&self) -> Option<&str> {
        self.managed_refused.as_deref()
    }

    fn slices(&self) -> Api<ResourceSlice> {
        Api::all(self.client.clone())
    }

    /// The API server's release, read from `/version` once.
    pub async fn server_version(&mut self) -> Result<ServerVersion, PublishError> {
        if let Some(version) = self.server_version {
            return Ok(version);
        }
        let info = self
            .client
            .apiserver_version()
            .await
            .map_err(PublishError::ReadVersion)?;
        let text = format!("{}.{}", info.major, info.minor.trim_end_matches('+'));
        let version = text
            .parse::<ServerVersion>()
            .or_else(|_| info.git_version.parse::<ServerVersion>())
            .map_err(|_| PublishError::UnsupportedVersion {
                version: info.git_version.clone(),
            })?;
        tracing::info!(%version, git_version = %info.git_version, "API server version");
        self.server_version = Some(version);
        Ok(version)
    }

    /// This node's slices of this driver, as the API server holds them.
    pub async fn list_own_slices(&self) -> Result<Vec<ResourceSlice>, PublishError> {
        let selector = format!(
            "spec.nodeName={},spec.driver={}",
            self.config.node_name, self.config.driver_name
        );
        self.slices()
            .list(&ListParams::default().fields(&selector))
            .await
            .map(|list| list.items)
            .map_err(|source| PublishError::ListSlices {
                node: self.config.node_name.clone(),
                source,
            })
    }

    /// The device names and layout the inventory renders to (without taints or generation):
    /// what the kubelet health stream lists and what the generation tracks.
    pub fn layout(
        &self,
        inventory: &GpuInventory,
        version: ServerVersion,
    ) -> Result<PoolLayout, PublishError> {
        let options = self.options(version, false, 0, BTreeMap::new());
        let slices =
            render_slices(inventory, &options).map_err(|source| self.render_error(source))?;
        Ok(PoolLayout::of(&slices))
    }

    fn options(
        &self,
        version: ServerVersion,
        topology_managed: bool,
        generation: i64,
        device_taints: BTreeMap<String, Vec<k8s_openapi::api::resource::v1::DeviceTaint>>,
    ) -> RenderOptions {
        RenderOptions {
            node_name: self.config.node_name.clone(),
            driver_name: self.config.driver_name.clone(),
            server_version: version,
            dynamic_mig: self.config.dynamic_mig,
            topology_managed,
            pool_generation: generation,
            device_taints,
            consumable_shares: self.config.consumable_shares,
        }
    }

    fn render_error(&self, source: RenderError) -> PublishError {
        PublishError::Render {
            node: self.config.node_name.clone(),
            source,
        }
    }

    /// Renders and writes the pool, deletes stale slices, and refuses managed mode if the API
    /// server drops device taints.
    pub async fn publish(
        &mut self,
        input: PublishInput<'_>,
    ) -> Result<PublishOutcome, PublishError> {
        let result = self.publish_inner(input).await;
        self.metrics.publication(ResultLabel::of(&result));
        if let Ok(outcome) = &result {
            let devices = PoolLayout::of(&outcome.slices).device_count();
            self.metrics.set_published_pool(devices, outcome.generation);
        }
        result
    }

    async fn publish_inner(
        &mut self,
        input: PublishInput<'_>,
    ) -> Result<PublishOutcome, PublishError> {
        let version = self.server_version().await?;
        let layout = self.layout(input.inventory, version)?;
        let existing = self.list_own_slices().await?;
        let listed = PublishedPool::from_slices(&existing);
        let generation = next_generation(listed.as_ref(), self.written_generation, &layout);
        let health_taints = input
            .findings
            .device_taints(input.inventory, layout.device_names());
        self.metrics.set_unhealthy_devices(health_taints.len());

        let managed = input.node.topology_managed && self.managed_refused.is_none();
        let mut written = self
            .write(input, version, managed, generation, &health_taints)
            .await?;
        if managed && !every_device_has_taint(&written, TOPOLOGY_MANAGED_TAINT) {
            self.refuse_managed_mode(input.node).await;
            written = self
                .write(input, version, false, generation, &health_taints)
                .await?;
        }
        self.check_health_taints(&written, &health_taints);

        let rendered: BTreeSet<String> = written.iter().map(ResourceExt::name_any).collect();
        let mut deleted = Vec::new();
        for stale in existing
            .iter()
            .map(ResourceExt::name_any)
            .filter(|n| !rendered.contains(n))
        {
            match self.slices().delete(&stale, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(source) => {
                    return Err(PublishError::DeleteStale {
                        slice: stale,
                        source,
                    });
                }
            }
            tracing::info!(slice = %stale, "deleted a stale ResourceSlice");
            deleted.push(stale);
        }
        self.written_generation = Some(generation);
        self.written = written
            .iter()
            .map(|s| (s.name_any(), s.resource_version().unwrap_or_default()))
            .collect();
        let topology_managed = managed && self.managed_refused.is_none();
        tracing::info!(
            node = %self.config.node_name,
            slices = written.len(),
            devices = layout.device_count(),
            generation,
            topology_managed,
            tainted_by_health = health_taints.len(),
            "published the node's ResourceSlices"
        );
        Ok(PublishOutcome {
            slices: written,
            generation,
            topology_managed,
            deleted,
        })
    }

    /// Renders with the given options, checks every slice against the API limits, and applies
    /// them in order. Returns the slices as stored.
    async fn write(
        &self,
        input: PublishInput<'_>,
        version: ServerVersion,
        managed: bool,
        generation: i64,
        health_taints: &BTreeMap<String, Vec<k8s_openapi::api::resource::v1::DeviceTaint>>,
    ) -> Result<Vec<ResourceSlice>, PublishError> {
        let options = self.options(version, managed, generation, health_taints.clone());
        let slices =
            render_slices(input.inventory, &options).map_err(|source| self.render_error(source))?;
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: input.node.name.clone(),
            uid: input.node.uid.clone(),
            controller: Some(false),
            block_owner_deletion: None,
        };
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let mut stored = Vec::with_capacity(slices.len());
        for mut slice in slices {
            let name = slice.name_any();
            check_slice(&slice, version).map_err(|violations| PublishError::Limits {
                slice: name.clone(),
                version,
                violations,
            })?;
            slice.metadata.owner_references = Some(vec![owner.clone()]);
            let applied = self
                .slices()
                .patch(&name, &params, &Patch::Apply(&slice))
                .await
                .map_err(|source| PublishError::Apply {
                    slice: name.clone(),
                    source,
                })?;
            stored.push(applied);
        }
        Ok(stored)
    }

    async fn refuse_managed_mode(&mut self, node: &WatchedNode) {
        let reason = format!(
            "node {} is labelled {}=true, but the API server dropped the device taint {} from its ResourceSlices: the DRADeviceTaints feature gate is off. \
             Topology-managed allocation is refused for this node and its devices are published untainted for the default scheduler; \
             enable DRADeviceTaints on the API server (and scheduler), then restart the plugin",
            node.name, TOPOLOGY_MANAGED_LABEL, TOPOLOGY_MANAGED_TAINT
        );
        tracing::error!("{reason}");
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.name.clone()),
            uid: Some(node.uid.clone()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: MANAGED_MODE_REFUSED_REASON.into(),
            note: Some(crate::claims::truncate(&reason, 1024)),
            action: "PublishResourceSlices".into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(%error, "cannot record the refusal as an event on the Node");
        }
        self.managed_refused = Some(reason);
    }

    fn check_health_taints(
        &mut self,
        written: &[ResourceSlice],
        health_taints: &BTreeMap<String, Vec<k8s_openapi::api::resource::v1::DeviceTaint>>,
    ) {
        if health_taints.is_empty() || self.warned_health_taints_dropped {
            return;
        }
        let kept = written
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .filter(|d| health_taints.contains_key(&d.name))
            .all(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()));
        if !kept {
            tracing::warn!(
                "the API server dropped the health taints of unhealthy devices (DRADeviceTaints is off); \
                 the kubelet health stream still reports them UNHEALTHY"
            );
            self.warned_health_taints_dropped = true;
        }
    }

    /// Whether the API server still holds exactly what the last publish wrote (no slice
    /// deleted, e.g. by a restarting kubelet, none changed by someone else, none added).
    pub async fn verify(&self) -> Result<bool, PublishError> {
        if self.written.is_empty() {
            return Ok(false);
        }
        let current: BTreeMap<String, String> = self
            .list_own_slices()
            .await?
            .iter()
            .map(|s| (s.name_any(), s.resource_version().unwrap_or_default()))
            .collect();
        Ok(current == self.written)
    }
}

/// Whether every device of `slices` carries a taint with `key`.
fn every_device_has_taint(slices: &[ResourceSlice], key: &str) -> bool {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .all(|d| d.taints.iter().flatten().any(|t| t.key == key))
}
