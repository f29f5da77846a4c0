//! The IMEX channels of one fabric clique → the slices of its pool `imex-<clique>`: devices
//! `channel-0` … `channel-<n-1>` (attributes `type: imex-channel`, `channel`, `fabricClique`),
//! network-attached: each slice's `nodeSelector` admits exactly the clique's nodes (one term,
//! `kubernetes.io/hostname In [...]`: the API server allows one node name per `matchFields`
//! requirement and one term per slice), so a claim allocated one of them may be used on every
//! node of the clique and on no other. Every slice passes [`check_slice`](super::check_slice)
//! and the pool passes [`check_pool`](super::check_pool).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tessera_api::imex::{CHANNEL_ATTRIBUTE, CHANNEL_TYPE, MAX_CHANNELS, device_name, pool_name};
use tessera_api::names::{TOPOLOGY_MANAGED_TAINT, attr};
use tessera_api::validation::{
    MAX_DEVICES_PER_SLICE, MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS, MAX_POOL_NAME_LENGTH,
    is_dns_subdomain,
};

use super::error::RenderError;
use super::options::ServerVersion;
use super::slices::slice_name;

/// One clique's channel pool, as the controller publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelPool {
    /// The driver name (`gpu.tessera.dev`).
    pub driver: String,
    /// `<clusterUUID>.<cliqueId>`, the GPUs' `fabricClique`.
    pub clique: String,
    /// The clique's nodes, as their `kubernetes.io/hostname` label values (sorted and
    /// deduplicated when rendered).
    pub nodes: Vec<String>,
    /// How many channels to publish.
    pub channels: u32,
    /// Whether the clique's nodes are topology-managed: the channels then carry the managed
    /// taint like their GPUs, so that the controller, which places the domain's pods, allocates
    /// them too.
    pub managed: bool,
    pub generation: i64,
    pub server_version: ServerVersion,
}

fn attribute_string(value: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(value.to_owned()),
        ..DeviceAttribute::default()
    }
}

fn channel_device(pool: &ChannelPool, channel: u32) -> Device {
    let attributes = BTreeMap::from([
        (attr::TYPE.to_owned(), attribute_string(CHANNEL_TYPE)),
        (
            CHANNEL_ATTRIBUTE.to_owned(),
            DeviceAttribute {
                int: Some(i64::from(channel)),
                ..DeviceAttribute::default()
            },
        ),
        (
            attr::FABRIC_CLIQUE.to_owned(),
            attribute_string(&pool.clique),
        ),
    ]);
    Device {
        name: device_name(channel),
        attributes: Some(attributes),
        taints: pool.managed.then(|| {
            vec![DeviceTaint {
                key: TOPOLOGY_MANAGED_TAINT.to_owned(),
                effect: "NoSchedule".to_owned(),
                ..DeviceTaint::default()
            }]
        }),
        ..Device::default()
    }
}

/// The node label a channel slice selects its nodes by.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// The selector of exactly the nodes whose `kubernetes.io/hostname` is one of `hostnames`
/// (sorted, without repeats).
pub fn nodes_selector(hostnames: &[String]) -> NodeSelector {
    let mut values = hostnames.to_vec();
    values.sort();
    values.dedup();
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: HOSTNAME_LABEL.to_owned(),
                operator: "In".to_owned(),
                values: Some(values),
            }]),
            match_fields: None,
        }],
    }
}

fn check_pool_options(pool: &ChannelPool) -> Result<(), RenderError> {
    let name = pool_name(&pool.clique);
    if pool.clique.is_empty() || name.len() > MAX_POOL_NAME_LENGTH || !is_dns_subdomain(&name) {
        return Err(RenderError::InvalidOption {
            option: "clique",
            message: format!("`{name}` is not a pool name (a DNS subdomain)"),
        });
    }
    if pool.nodes.is_empty() {
        return Err(RenderError::InvalidOption {
            option: "nodes",
            message: format!("clique {} has no node", pool.clique),
        });
    }
    if pool.channels == 0 || pool.channels > MAX_CHANNELS {
        return Err(RenderError::InvalidOption {
            option: "channels",
            message: format!("{} channels: between 1 and {MAX_CHANNELS}", pool.channels),
        });
    }
    Ok(())
}

/// Renders the clique's channel pool: slices `<pool>-<driver>-<n>`, as many as the channels
/// need (64 tainted or 128 untainted devices per slice).
pub fn render_channel_slices(pool: &ChannelPool) -> Result<Vec<ResourceSlice>, RenderError> {
    check_pool_options(pool)?;
    let per_slice = if pool.managed {
        MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
    } else {
        MAX_DEVICES_PER_SLICE
    };
    let devices: Vec<Device> = (0..pool.channels)
        .map(|c| channel_device(pool, c))
        .collect();
    let chunks: Vec<&[Device]> = devices.chunks(per_slice).collect();
    let name = pool_name(&pool.clique);
    let selector = nodes_selector(&pool.nodes);
    let rendered: Vec<ResourceSlice> = chunks
        .iter()
        .enumerate()
        .map(|(index, chunk)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(&name, &pool.driver, index)),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: pool.driver.clone(),
                node_selector: Some(selector.clone()),
                pool: ResourcePool {
                    name: name.clone(),
                    generation: pool.generation,
                    resource_slice_count: i64::try_from(chunks.len()).unwrap_or(i64::MAX),
                },
                devices: Some(chunk.to_vec()),
                ..ResourceSliceSpec::default()
            },
        })
        .collect();
    super::checked(rendered, pool.server_version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(channels: u32, managed: bool) -> ChannelPool {
        ChannelPool {
            driver: "gpu.tessera.dev".into(),
            clique: "522c88f3-2731-5718-acd9-980cbf3d0f20.32766".into(),
            nodes: vec!["tray-2".into(), "tray-1".into(), "tray-2".into()],
            channels,
            managed,
            generation: 3,
            server_version: ServerVersion::V1_35,
        }
    }

    #[test]
    fn channels_are_network_attached_to_the_cliques_nodes() {
        let slices = render_channel_slices(&pool(128, true)).unwrap();
        assert_eq!(slices.len(), 2, "64 tainted devices per slice");
        let first = &slices[0];
        assert_eq!(
            first.metadata.name.as_deref(),
            Some("imex-522c88f3-2731-5718-acd9-980cbf3d0f20.32766-gpu.tessera.dev-0")
        );
        assert_eq!(first.spec.node_name, None);
        assert_eq!(
            first.spec.node_selector,
            Some(nodes_selector(&["tray-1".into(), "tray-2".into()]))
        );
        let requirement = &first
            .spec
            .node_selector
            .as_ref()
            .unwrap()
            .node_selector_terms[0]
            .match_expressions
            .as_ref()
            .unwrap()[0];
        assert_eq!(requirement.key, HOSTNAME_LABEL);
        assert_eq!(
            requirement.values.as_deref(),
            Some(&["tray-1".to_owned(), "tray-2".to_owned()][..])
        );
        assert_eq!(first.spec.pool.resource_slice_count, 2);
        assert_eq!(first.spec.pool.generation, 3);
        let device = &slices[1].spec.devices.as_ref().unwrap()[0];
        assert_eq!(device.name, "channel-64");
        let attributes = device.attributes.as_ref().unwrap();
        assert_eq!(attributes["type"].string.as_deref(), Some("imex-channel"));
        assert_eq!(attributes["channel"].int, Some(64));
        assert_eq!(
            attributes["fabricClique"].string.as_deref(),
            Some("522c88f3-2731-5718-acd9-980cbf3d0f20.32766")
        );
        assert_eq!(
            device.taints.as_ref().unwrap()[0].key,
            TOPOLOGY_MANAGED_TAINT
        );

        let plain = render_channel_slices(&pool(128, false)).unwrap();
        assert_eq!(plain.len(), 1, "128 untainted devices fit one slice");
        assert!(plain[0].spec.devices.as_ref().unwrap()[0].taints.is_none());
    }

    #[test]
    fn bad_pools_are_refused() {
        assert!(render_channel_slices(&pool(0, false)).is_err());
        assert!(render_channel_slices(&pool(MAX_CHANNELS + 1, false)).is_err());
        let mut empty = pool(4, false);
        empty.nodes.clear();
        assert!(render_channel_slices(&empty).is_err());
        let mut odd = pool(4, false);
        odd.clique = "Not A Name".into();
        assert!(render_channel_slices(&odd).is_err());
    }
}
