//! GpuInventory → the ResourceSlices of the node's pool (docs/attributes.md). Pure: no IO, no clock.
//!
//! One pool per node, named after the node, `spec.nodeName` set on every slice. Devices:
//!
//! - a GPU not in MIG mode is published whole as `gpu-<minor>`;
//! - static MIG (default): a GPU in MIG mode publishes its existing MIG instances as
//!   `gpu-<minor>-mig-<profile>-<start>` and is not published whole (a MIG-mode GPU with no
//!   instances publishes nothing);
//! - dynamic MIG ([`RenderOptions::dynamic_mig`]): a GPU in MIG mode is a partitionable device —
//!   one counter set per GPU, the whole GPU consuming all of it, and a device for every placement
//!   of every profile consuming its memory slices, compute slices, memory, multiprocessors and
//!   engines. The devices (names, attributes, counters) depend only on the profiles, not on which
//!   instances exist — placements carry no `uuid` — so creating instances at prepare time does
//!   not change the pool.
//!
//! Every rendered slice passes [`check_slice`] and the pool passes [`check_pool`]; rendering
//! returns an error instead of an invalid slice.
//!
//! The IMEX channels of a fabric clique are rendered here too ([`render_channel_slices`]), for
//! the controller: not one node's pool but one clique's, network-attached to its nodes.

mod channels;
mod check;
mod devices;
mod error;
mod options;
mod pool_check;
mod slices;

use k8s_openapi::api::resource::v1::{ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tessera_api::validation::{MAX_POOL_NAME_LENGTH, is_dns_subdomain};

pub use channels::{ChannelPool, HOSTNAME_LABEL, nodes_selector, render_channel_slices};
pub use check::{
    MAX_BINDING_CONDITIONS, MAX_CONSUMED_COUNTERS_PER_SLICE_1_34,
    MAX_COUNTER_CONSUMPTIONS_PER_DEVICE, MAX_COUNTER_SETS_PER_SLICE, MAX_DRIVER_NAME_LENGTH,
    MAX_SHARED_COUNTERS_PER_SLICE_1_34, Violation, check_slice,
};
pub use error::RenderError;
pub use options::{RenderOptions, ServerVersion, ServerVersionError};
pub use pool_check::check_pool;

use crate::model::GpuInventory;

/// Renders the node's pool: every slice named `<node>-<driver>-<n>`, in order, each checked
/// against the limits of `options.server_version`. A node without devices renders no slices.
pub fn render_slices(
    inventory: &GpuInventory,
    options: &RenderOptions,
) -> Result<Vec<ResourceSlice>, RenderError> {
    check_options(options)?;
    inventory
        .validate()
        .map_err(RenderError::InvalidInventory)?;
    let groups = devices::device_groups(inventory, options);
    let contents = slices::pack(groups, options.server_version)?;
    let count = contents.len();
    let rendered: Vec<ResourceSlice> = contents
        .into_iter()
        .enumerate()
        .map(|(index, content)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slices::slice_name(
                    &options.node_name,
                    &options.driver_name,
                    index,
                )),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: options.driver_name.clone(),
                node_name: Some(options.node_name.clone()),
                pool: ResourcePool {
                    name: options.node_name.clone(),
                    generation: options.pool_generation,
                    resource_slice_count: i64::try_from(count).unwrap_or(i64::MAX),
                },
                devices: (!content.devices.is_empty()).then_some(content.devices),
                shared_counters: (!content.counter_sets.is_empty()).then_some(content.counter_sets),
                ..ResourceSliceSpec::default()
            },
        })
        .collect();
    checked(rendered, options.server_version)
}

/// `rendered`, once every slice passes [`check_slice`] for `server` and the pool passes
/// [`check_pool`]: what every renderer of slices returns.
fn checked(
    rendered: Vec<ResourceSlice>,
    server: ServerVersion,
) -> Result<Vec<ResourceSlice>, RenderError> {
    for slice in &rendered {
        check_slice(slice, server).map_err(|violations| RenderError::InvalidSlice {
            slice: slice.metadata.name.clone().unwrap_or_default(),
            violations,
        })?;
    }
    check_pool(&rendered).map_err(RenderError::InvalidPool)?;
    Ok(rendered)
}

fn check_options(options: &RenderOptions) -> Result<(), RenderError> {
    if options.node_name.len() > MAX_POOL_NAME_LENGTH || !is_dns_subdomain(&options.node_name) {
        return Err(RenderError::InvalidOption {
            option: "node_name",
            message: format!(
                "`{}` is not a node name (a DNS subdomain: lower case, at most 253 characters)",
                options.node_name
            ),
        });
    }
    if options.driver_name.len() > MAX_DRIVER_NAME_LENGTH || !is_dns_subdomain(&options.driver_name)
    {
        return Err(RenderError::InvalidOption {
            option: "driver_name",
            message: format!(
                "`{}` is not a DNS subdomain of at most {MAX_DRIVER_NAME_LENGTH} characters",
                options.driver_name
            ),
        });
    }
    if options.pool_generation < 0 {
        return Err(RenderError::InvalidOption {
            option: "pool_generation",
            message: "must not be negative".to_owned(),
        });
    }
    Ok(())
}
