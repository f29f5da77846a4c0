//! The node's view of its GPUs and what it publishes about them.
//!
//! - [`model`]: the inventory — raw per-GPU facts as NVML and sysfs report them. The same types
//!   are the YAML topology file format (docs/topology-format.md).
//! - [`DeviceSource`]: where inventories come from — [`MockSource`] (a topology file, shipped ones
//!   included) or the driver through NVML (`tessera_nvml::NvmlSource`, in a crate of its own:
//!   the FFI edge).
//! - [`node_identity`]: per-node GPU and MIG UUIDs for mock topologies shared by many nodes.
//! - [`islands`]: NVLink islands derived from the links, with stable ids.
//! - [`device_name`]: published device names and their resolution back to hardware.
//! - [`render`]: inventory → the node's ResourceSlices, and [`check_slice`], the API limits.
//!
//! Everything except the mock backend's file reading is pure: no IO, no kube, no tokio, no FFI.
//!
//! Modules: `units` (majors.minors and semver forms), `pci` (bus ids and PCIe roots),
//! `model`, `validate` (what an inventory must satisfy), `source` and `mock`, `node_identity`,
//! `islands`, `device_name`, `render`.

pub mod device_name;
pub mod islands;
pub mod mock;
pub mod model;
pub mod node_identity;
pub mod pci;
pub mod render;
pub mod source;
pub mod units;
pub mod validate;

pub use device_name::{DeviceName, ResolvedDevice, profile_label};
pub use islands::{NvlinkIsland, island_id, island_of};
pub use mock::{MockSource, SHIPPED_TOPOLOGIES, parse_topology, shipped_topology_names};
pub use model::{
    Architecture, Brand, FabricHealth, FabricInfo, FabricState, Gpu, GpuInventory, LinkPeer,
    MigEngines, MigInstance, MigProfile, MigState, NvLink, NvLinkRemoteType, NvLinkState,
    NvLinkVersion,
};
pub use render::{
    ChannelPool, HOSTNAME_LABEL, RenderError, RenderOptions, ServerVersion, Violation, check_pool,
    check_slice, render_channel_slices, render_slices,
};
pub use source::{DeviceSource, SourceError};
pub use units::{MajorMinor, dotted_to_semver};
pub use validate::InventoryProblem;
