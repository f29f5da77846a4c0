//! Names Tessera publishes or reacts to. Everything a user can type in a DeviceClass, a claim, a
//! node label or a pod spec is spelled here once.

/// The DRA driver name, also the domain of Tessera's unqualified attribute and capacity names.
pub const DRIVER_NAME: &str = "gpu.tessera.dev";

/// API group and version of Tessera's opaque configuration objects.
pub const CONFIG_API_VERSION: &str = "gpu.tessera.dev/v1alpha1";

/// Prefix of the attribute names Kubernetes standardises (`deviceattribute` package upstream).
pub const STANDARD_ATTRIBUTE_PREFIX: &str = "resource.kubernetes.io/";

/// Shipped DeviceClass selecting whole GPUs.
pub const GPU_DEVICE_CLASS: &str = "gpu.tessera.dev";
/// Shipped DeviceClass selecting MIG slices.
pub const MIG_DEVICE_CLASS: &str = "mig.gpu.tessera.dev";

/// Node label that opts a node into topology-managed allocation (docs/protocol.md).
pub const TOPOLOGY_MANAGED_LABEL: &str = "gpu.tessera.dev/topology-managed";
/// Taint key carried by every device of a topology-managed node, effect `NoSchedule`.
pub const TOPOLOGY_MANAGED_TAINT: &str = "gpu.tessera.dev/topology-managed";
/// Scheduling gate with which a pod asks the controller for topology-aware placement.
pub const TOPOLOGY_AWARE_GATE: &str = "gpu.tessera.dev/topology-aware";
/// Pod annotation choosing, for that pod, how the controller weighs NUMA alignment against
/// fragmentation: `align` (a claim that fits one NUMA node gets one) or `pack` (partly used
/// nodes fill first); the controller's `--numa-policy` when absent.
pub const NUMA_POLICY_ANNOTATION: &str = "gpu.tessera.dev/numa-policy";

/// Label (value [`CONFIG_VALIDATION_DISABLED`]) that exempts a ResourceClaim or
/// ResourceClaimTemplate, or on a Namespace every one in it, from the check of opaque
/// configurations at creation (the controller's validating webhook): they are checked at prepare
/// only (docs/operations.md, "Admission checks").
pub const CONFIG_VALIDATION_LABEL: &str = "gpu.tessera.dev/config-validation";
/// The value of [`CONFIG_VALIDATION_LABEL`] that opts out.
pub const CONFIG_VALIDATION_DISABLED: &str = "disabled";

/// Namespace label (value [`DEVICE_PLUGIN_CONVERSION_ENABLED`]) that opts a namespace into the
/// device-plugin conversion: pods created there asking for `nvidia.com/gpu` (or a MIG profile's
/// extended resource) get a claim from a ResourceClaimTemplate and Tessera's gate instead
/// (docs/admission.md).
pub const DEVICE_PLUGIN_CONVERSION_LABEL: &str = "gpu.tessera.dev/device-plugin-conversion";
/// The value of [`DEVICE_PLUGIN_CONVERSION_LABEL`] that opts a namespace in.
pub const DEVICE_PLUGIN_CONVERSION_ENABLED: &str = "enabled";
/// Pod annotation the conversion writes: a JSON list of what it turned into claims (container,
/// extended resource, count, pod claim, template, DeviceClass).
pub const DEVICE_PLUGIN_CONVERSION_ANNOTATION: &str = "gpu.tessera.dev/device-plugin-conversion";

/// Pod label naming the gang (group) a gated pod belongs to, where the cluster does not serve the
/// upstream PodGroup API (`scheduling.k8s.io/v1beta1`, feature gate `GenericWorkload`).
pub const GROUP_LABEL: &str = "gpu.tessera.dev/group";

/// Pod annotation with the group's `minCount`: how many of its pods must be placed together.
pub const GROUP_MIN_COUNT_ANNOTATION: &str = "gpu.tessera.dev/group-min-count";

/// Pod annotation on a pending pod the controller preempts for: the devices it is to get once its
/// victims are gone, the victims and when they were chosen (JSON; docs/protocol.md, "Preemption").
/// While it stands, the devices count as in use for every pod not of higher priority.
pub const NOMINATION_ANNOTATION: &str = "gpu.tessera.dev/nomination";

/// Pod annotation on each pod of a gang the controller preempts, written before any of them is
/// evicted: the gang's eviction is committed, and any leader evicts a marked pod that still
/// runs, so a gang is never left half evicted (JSON: the preemptor and the time).
pub const PREEMPTED_BY_ANNOTATION: &str = "gpu.tessera.dev/preempted-by";

/// Default node label of a rack, the finest level of the controller's node-label hierarchy.
pub const RACK_LABEL: &str = "gpu.tessera.dev/rack";

/// Default node label of a network block (racks under one spine), the next level up.
pub const BLOCK_LABEL: &str = "gpu.tessera.dev/block";

/// Device taint keys set by health monitoring.
pub mod taints {
    /// An XID error was reported for the device; the value is the XID number.
    pub const XID: &str = "gpu.tessera.dev/xid";
    /// An uncorrectable ECC error was reported for the device.
    pub const ECC: &str = "gpu.tessera.dev/ecc";
    /// The device disappeared from NVML or stopped answering.
    pub const UNREACHABLE: &str = "gpu.tessera.dev/unreachable";
    /// The GPU cannot use its multi-node NVLink fabric (registration not complete or failed, or
    /// the fabric reports it unhealthy); the value says which.
    pub const FABRIC: &str = "gpu.tessera.dev/fabric";
}

/// Field manager used for every server-side apply Tessera makes.
pub const FIELD_MANAGER: &str = "tessera";

/// Values of the `type` attribute.
pub mod device_type {
    /// A whole GPU.
    pub const GPU: &str = "gpu";
    /// A MIG slice (existing instance or a dynamically creatable profile placement).
    pub const MIG: &str = "mig";
}

/// Attribute names. Unqualified names live in the [`DRIVER_NAME`] domain.
pub mod attr {
    pub const TYPE: &str = "type";
    pub const UUID: &str = "uuid";
    pub const PRODUCT_NAME: &str = "productName";
    pub const BRAND: &str = "brand";
    pub const ARCHITECTURE: &str = "architecture";
    pub const INDEX: &str = "index";
    pub const MINOR: &str = "minor";
    pub const CUDA_COMPUTE_CAPABILITY: &str = "cudaComputeCapability";
    pub const DRIVER_VERSION: &str = "driverVersion";
    pub const CUDA_DRIVER_VERSION: &str = "cudaDriverVersion";
    pub const MIG_CAPABLE: &str = "migCapable";
    pub const MIG_ENABLED: &str = "migEnabled";
    pub const PROFILE: &str = "profile";
    pub const PARENT_UUID: &str = "parentUUID";
    pub const NVLINK_ISLAND: &str = "nvlinkIsland";
    pub const NVLINK_LINKS: &str = "nvlinkLinks";
    pub const NVLINK_BANDWIDTH_GBPS: &str = "nvlinkBandwidthGBps";
    pub const FABRIC_CLIQUE: &str = "fabricClique";
    /// The old name of [`NUMA_NODE`] in the driver's domain (`gpu.tessera.dev/numaNode`), still
    /// published for selectors written against it and still read by the topology score for
    /// devices published by older plugins. Deprecated: write `resource.kubernetes.io/numaNode`.
    pub const LEGACY_NUMA_NODE: &str = "numaNode";
    /// Standard upstream name (`resource.kubernetes.io/numaNode`), the NUMA node of the device's
    /// PCIe attachment: NVIDIA's driver and NIC drivers publish it too, so one claim can align
    /// devices of different drivers with `matchAttribute`.
    pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";
    /// Standard upstream name (`resource.kubernetes.io/pciBusID`), extended BDF `dddd:bb:dd.f`.
    pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
    /// Standard upstream name (`resource.kubernetes.io/pcieRoot`), `pci<domain>:<bus>`.
    pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
}

/// Capacity names. Unqualified names live in the [`DRIVER_NAME`] domain.
pub mod capacity {
    pub const MEMORY: &str = "memory";
    pub const MULTIPROCESSORS: &str = "multiprocessors";
    pub const COPY_ENGINES: &str = "copyEngines";
    pub const DECODERS: &str = "decoders";
    pub const ENCODERS: &str = "encoders";
    pub const JPEG_ENGINES: &str = "jpegEngines";
    pub const OFA_ENGINES: &str = "ofaEngines";
    /// Equal shares of a multi-allocatable device (consumable shares' N-shares mode).
    pub const SHARES: &str = "shares";
}

/// Counter names of a GPU's counter set in dynamic MIG (partitionable devices). Counter and
/// counter-set names must be DNS labels (resource.k8s.io/v1 validation), hence the dashes.
pub mod counter {
    /// Prefix of the per-memory-slice counters `memory-slice-<i>` (value 1 each): a MIG placement
    /// starting at slice `s` of size `n` consumes `memory-slice-s` … `memory-slice-(s+n-1)`, which is
    /// what makes two overlapping placements mutually exclusive.
    pub const MEMORY_SLICE_PREFIX: &str = "memory-slice-";
    /// MIG compute (GPC) slices of the GPU (7 on A100/H100).
    pub const COMPUTE_SLICES: &str = "compute-slices";
    /// Device memory in bytes.
    pub const MEMORY: &str = "memory";
    /// Streaming multiprocessors.
    pub const MULTIPROCESSORS: &str = "multiprocessors";
    /// Video decoders (NVDEC). Like the other engine counters, present only when the GPU's MIG
    /// profiles have such engines; engines are assigned to GPU instances exclusively, so e.g. two
    /// `1g.10gb+me` instances (one OFA each, one OFA per A100) can never be placed together.
    pub const DECODERS: &str = "decoders";
    /// Video encoders (NVENC).
    pub const ENCODERS: &str = "encoders";
    /// JPEG decoders (NVJPG).
    pub const JPEG_ENGINES: &str = "jpeg-engines";
    /// Optical flow accelerators.
    pub const OFA_ENGINES: &str = "ofa-engines";

    /// The counter for memory slice `index`.
    pub fn memory_slice(index: u32) -> String {
        format!("{MEMORY_SLICE_PREFIX}{index}")
    }

    /// The name of the counter set of the GPU with device minor `minor`.
    pub fn counter_set(minor: u32) -> String {
        format!("gpu-{minor}-counters")
    }
}
