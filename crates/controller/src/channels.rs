//! The IMEX channels of every fabric clique, published by the leader (docs/user-guide.md, "Jobs
//! across NVLink racks (IMEX)").
//!
//! A clique spans nodes, so no node plugin can publish its channels: the plugin's admission policy
//! confines it to its own node's slices. The controller sees every node's slices, and with them
//! each GPU's `fabricClique`. [`plan`] (pure) turns the cached slices into the channel pools there
//! should be — one pool `imex-<clique>` per clique, network-attached to the clique's nodes,
//! tainted like its GPUs when they are topology-managed — and compares them with the channel
//! slices that exist: a pool whose nodes, channels or taint changed is rewritten with the next
//! generation; slices of cliques that are gone (or surplus slices) are deleted. Allocated channels
//! are never touched by this: an allocation stays valid, and a channel is handed out again only
//! after its claim is deallocated (the allocator's own rule). [`run`] applies the plan while this
//! replica leads, whenever the cached slices change.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use tessera_api::imex::{CHANNEL_TYPE, clique_of_pool};
use tessera_api::names::{DRIVER_NAME, FIELD_MANAGER, TOPOLOGY_MANAGED_TAINT, attr};
use tessera_gpu_inventory::{
    ChannelPool, HOSTNAME_LABEL, RenderError, ServerVersion, render_channel_slices,
};

use crate::leader::Leadership;
use crate::slices::{SliceCache, decode};
use crate::watch::Signals;

/// How the channels are published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelSettings {
    /// Channels per clique; 0 publishes none (and deletes those published).
    pub channels: u32,
    pub server_version: ServerVersion,
}

/// What to write so that the channel slices are what the cliques need.
#[derive(Debug, Default, PartialEq)]
pub struct ChannelPlan {
    /// Slices to apply (new, or changed with the pool's next generation).
    pub apply: Vec<ResourceSlice>,
    /// Channel slices to delete, by name.
    pub delete: Vec<String>,
    /// Cliques whose pool could not be rendered, with why.
    pub refused: Vec<(String, RenderError)>,
}

/// One clique as the GPU slices show it.
#[derive(Debug, Default)]
struct Clique {
    nodes: BTreeSet<String>,
    managed: bool,
}

/// Each node's `kubernetes.io/hostname` label, by node name: what a channel slice selects nodes by.
pub type Hostnames = BTreeMap<String, String>;

/// The hostname labels of `nodes`.
pub fn hostnames(nodes: &[Arc<Node>]) -> Hostnames {
    nodes
        .iter()
        .filter_map(|n| {
            let name = n.metadata.name.clone()?;
            let label = n.metadata.labels.as_ref()?.get(HOSTNAME_LABEL)?.clone();
            Some((name, label))
        })
        .collect()
}

/// The cliques of the GPUs Tessera publishes: each node's devices with a `fabricClique`; nodes
/// by their hostname label (their name where they have none).
fn cliques(slices: &[ResourceSlice], hostnames: &Hostnames) -> BTreeMap<String, Clique> {
    let mut cliques: BTreeMap<String, Clique> = BTreeMap::new();
    for slice in slices.iter().filter(|s| s.spec.driver == DRIVER_NAME) {
        let Some(node) = slice.spec.node_name.as_ref().filter(|n| !n.is_empty()) else {
            continue;
        };
        for device in slice.spec.devices.iter().flatten() {
            let attributes = device.attributes.as_ref();
            let clique = attributes
                .and_then(|a| a.get(attr::FABRIC_CLIQUE))
                .and_then(|v| v.string.as_deref())
                .filter(|c| !c.is_empty());
            let is_channel = attributes
                .and_then(|a| a.get(attr::TYPE))
                .and_then(|v| v.string.as_deref())
                == Some(CHANNEL_TYPE);
            let (Some(clique), false) = (clique, is_channel) else {
                continue;
            };
            let entry = cliques.entry(clique.to_owned()).or_default();
            entry
                .nodes
                .insert(hostnames.get(node).unwrap_or(node).clone());
            entry.managed |= device
                .taints
                .iter()
                .flatten()
                .any(|t| t.key == TOPOLOGY_MANAGED_TAINT);
        }
    }
    cliques
}

/// Whether two slices say the same, generation aside.
fn same_content(a: &ResourceSlice, b: &ResourceSlice) -> bool {
    let mut a = a.spec.clone();
    let mut b = b.spec.clone();
    a.pool.generation = 0;
    b.pool.generation = 0;
    a == b
}

/// The channel slices there should be, compared with those that are.
pub fn plan(
    slices: &[ResourceSlice],
    hostnames: &Hostnames,
    settings: &ChannelSettings,
) -> ChannelPlan {
    let existing: BTreeMap<&str, Vec<&ResourceSlice>> = slices
        .iter()
        .filter(|s| s.spec.driver == DRIVER_NAME && s.spec.node_name.is_none())
        .filter_map(|s| Some((clique_of_pool(&s.spec.pool.name)?, s)))
        .fold(BTreeMap::new(), |mut by, (clique, s)| {
            by.entry(clique).or_default().push(s);
            by
        });
    let mut plan = ChannelPlan::default();
    let mut kept: BTreeSet<String> = BTreeSet::new();
    let wanted = if settings.channels == 0 {
        BTreeMap::new()
    } else {
        cliques(slices, hostnames)
    };
    for (name, clique) in wanted {
        let old = existing.get(name.as_str()).cloned().unwrap_or_default();
        let generation = old
            .iter()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0);
        let mut pool = ChannelPool {
            driver: DRIVER_NAME.to_owned(),
            clique: name.clone(),
            nodes: clique.nodes.into_iter().collect(),
            channels: settings.channels,
            managed: clique.managed,
            generation,
            server_version: settings.server_version,
        };
        let rendered = match render_channel_slices(&pool) {
            Ok(r) => r,
            Err(e) => {
                plan.refused.push((name, e));
                continue;
            }
        };
        kept.extend(rendered.iter().filter_map(|s| s.metadata.name.clone()));
        let unchanged = rendered.len() == old.len()
            && rendered.iter().all(|r| {
                old.iter()
                    .any(|o| o.metadata.name == r.metadata.name && same_content(o, r))
            });
        if unchanged {
            continue;
        }
        pool.generation = generation + 1;
        plan.apply
            .extend(render_channel_slices(&pool).unwrap_or_default());
    }
    plan.delete = existing
        .values()
        .flatten()
        .filter_map(|s| s.metadata.name.clone())
        .filter(|n| !kept.contains(n))
        .collect();
    plan
}

/// How often the publisher looks for changed slices.
const TICK: Duration = Duration::from_secs(2);

/// Applies [`plan`] while this replica leads, whenever the slices changed (and every minute, to
/// repair what someone else changed), until the task is aborted.
pub async fn run(
    client: kube::Client,
    slices: Arc<SliceCache>,
    nodes: Store<Node>,
    signals: Arc<Signals>,
    leadership: Leadership,
    settings: ChannelSettings,
) {
    let api: Api<ResourceSlice> = Api::all(client);
    let mut seen: Option<u64> = None;
    let mut ticks = 0u32;
    loop {
        tokio::time::sleep(TICK).await;
        ticks = ticks.wrapping_add(1);
        let generation = signals.inventory_generation.load(Ordering::Acquire);
        let due = seen != Some(generation) || ticks.is_multiple_of(30);
        if !due || !signals.is_synced() || !leadership.is_leader() {
            continue;
        }
        let plan = plan(
            &decode(&slices.encoded()),
            &hostnames(&nodes.state()),
            &settings,
        );
        if publish(&api, &plan, &leadership).await {
            seen = Some(generation);
        }
    }
}

/// Writes one plan; whether every write succeeded.
async fn publish(api: &Api<ResourceSlice>, plan: &ChannelPlan, leadership: &Leadership) -> bool {
    for (clique, error) in &plan.refused {
        tracing::warn!(clique = %clique, error = %error, "cannot publish the IMEX channels of a clique");
    }
    let mut ok = true;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for slice in &plan.apply {
        let name = slice.metadata.name.clone().unwrap_or_default();
        if leadership.check().is_err() {
            return false;
        }
        let mut body = slice.clone();
        body.metadata.managed_fields = None;
        let body = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": body.spec,
        });
        match api.patch(&name, &params, &Patch::Apply(&body)).await {
            Ok(_) => tracing::info!(slice = %name, pool = %slice.spec.pool.name,
                generation = slice.spec.pool.generation, "published IMEX channels"),
            Err(e) => {
                ok = false;
                tracing::warn!(slice = %name, error = %e, "cannot publish IMEX channels");
            }
        }
    }
    for name in &plan.delete {
        if leadership.check().is_err() {
            return false;
        }
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(slice = %name, "deleted the IMEX channels of a clique that is gone")
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                ok = false;
                tracing::warn!(slice = %name, error = %e, "cannot delete IMEX channel slice");
            }
        }
    }
    ok
}
