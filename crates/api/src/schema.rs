//! The device schema: every attribute and capacity Tessera publishes, with its type and the device
//! types that carry it (docs/attributes.md shows it to users). `tessera validate` checks selectors against it and the
//! renderer's tests check published devices against it, so the two cannot drift apart.

use crate::names::{DRIVER_NAME, STANDARD_ATTRIBUTE_PREFIX, attr, capacity};

/// The value type of an attribute, as in `resource.k8s.io/v1` `DeviceAttribute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttributeKind {
    Int,
    Bool,
    String,
    /// A semantic version (semver 2.0.0); CEL sees a semver value.
    Version,
}

/// Which devices carry an attribute or capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carriers {
    /// Whole GPUs and MIG devices.
    All,
    /// Whole GPUs only.
    Gpu,
    /// MIG devices only.
    Mig,
}

/// One published attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttributeSpec {
    /// The name as published: unqualified (driver domain) or fully qualified.
    pub name: &'static str,
    pub kind: AttributeKind,
    pub carriers: Carriers,
    /// Absent on some devices: where the hardware lacks the feature (NVLink, fabric, NUMA
    /// information) and, for `uuid`, on dynamic MIG placements.
    pub optional: bool,
    pub meaning: &'static str,
}

/// One published capacity. Every capacity value is a Kubernetes quantity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacitySpec {
    pub name: &'static str,
    pub carriers: Carriers,
    pub meaning: &'static str,
}

const fn a(
    name: &'static str,
    kind: AttributeKind,
    carriers: Carriers,
    optional: bool,
    meaning: &'static str,
) -> AttributeSpec {
    AttributeSpec {
        name,
        kind,
        carriers,
        optional,
        meaning,
    }
}

use AttributeKind::{Bool, Int, String as Str, Version};
use Carriers::{All, Gpu, Mig};

/// Every attribute Tessera publishes.
pub const ATTRIBUTES: &[AttributeSpec] = &[
    a(attr::TYPE, Str, All, false, "`gpu` or `mig`"),
    a(
        attr::UUID,
        Str,
        All,
        true,
        "NVML UUID of the GPU or MIG device; absent on dynamic MIG placements, whose instances come and go with claims",
    ),
    a(
        attr::PRODUCT_NAME,
        Str,
        All,
        false,
        "product name, e.g. `NVIDIA H100 80GB HBM3`",
    ),
    a(
        attr::BRAND,
        Str,
        All,
        false,
        "brand, e.g. `Nvidia`, `Tesla`",
    ),
    a(
        attr::ARCHITECTURE,
        Str,
        All,
        false,
        "architecture, e.g. `Hopper`, `Ampere`",
    ),
    a(
        attr::INDEX,
        Int,
        All,
        false,
        "NVML index of the (parent) GPU",
    ),
    a(
        attr::MINOR,
        Int,
        All,
        false,
        "device minor number of the (parent) GPU",
    ),
    a(
        attr::CUDA_COMPUTE_CAPABILITY,
        Version,
        All,
        false,
        "CUDA compute capability, e.g. 9.0.0",
    ),
    a(
        attr::DRIVER_VERSION,
        Version,
        All,
        false,
        "NVIDIA kernel driver version",
    ),
    a(
        attr::CUDA_DRIVER_VERSION,
        Version,
        All,
        false,
        "highest CUDA version the driver supports",
    ),
    a(attr::MIG_CAPABLE, Bool, Gpu, false, "the GPU supports MIG"),
    a(
        attr::MIG_ENABLED,
        Bool,
        Gpu,
        false,
        "the GPU is in MIG mode",
    ),
    a(
        attr::PROFILE,
        Str,
        Mig,
        false,
        "MIG profile, e.g. `1g.10gb`",
    ),
    a(
        attr::PARENT_UUID,
        Str,
        Mig,
        false,
        "UUID of the GPU the MIG device lives on",
    ),
    a(
        attr::NVLINK_ISLAND,
        Str,
        All,
        true,
        "id of the set of pairwise NVLink-connected GPUs",
    ),
    a(attr::NVLINK_LINKS, Int, Gpu, true, "active NVLink links"),
    a(
        attr::NVLINK_BANDWIDTH_GBPS,
        Int,
        Gpu,
        true,
        "aggregate NVLink bandwidth in GB/s",
    ),
    a(
        attr::FABRIC_CLIQUE,
        Str,
        All,
        true,
        "`<clusterUUID>.<cliqueId>` of a multi-node NVLink fabric",
    ),
    a(
        attr::NUMA_NODE,
        Int,
        All,
        true,
        "NUMA node of the GPU's PCIe attachment (the standard name, shared with other drivers)",
    ),
    a(
        attr::LEGACY_NUMA_NODE,
        Int,
        All,
        true,
        "deprecated: the same value as `resource.kubernetes.io/numaNode`, kept for selectors written against it",
    ),
    a(
        attr::PCI_BUS_ID,
        Str,
        All,
        false,
        "PCI bus id, extended BDF",
    ),
    a(
        attr::PCIE_ROOT,
        Str,
        All,
        true,
        "PCIe root complex, `pci<domain>:<bus>`",
    ),
];

const fn c(name: &'static str, carriers: Carriers, meaning: &'static str) -> CapacitySpec {
    CapacitySpec {
        name,
        carriers,
        meaning,
    }
}

/// Every capacity Tessera publishes.
pub const CAPACITIES: &[CapacitySpec] = &[
    c(capacity::MEMORY, All, "device memory in bytes"),
    c(capacity::MULTIPROCESSORS, All, "streaming multiprocessors"),
    c(
        capacity::COPY_ENGINES,
        Mig,
        "copy engines of the MIG device",
    ),
    c(capacity::DECODERS, Mig, "video decoders of the MIG device"),
    c(capacity::ENCODERS, Mig, "video encoders of the MIG device"),
    c(
        capacity::JPEG_ENGINES,
        Mig,
        "JPEG engines of the MIG device",
    ),
    c(
        capacity::OFA_ENGINES,
        Mig,
        "optical flow accelerators of the MIG device",
    ),
    c(
        capacity::SHARES,
        All,
        "equal shares of a shared device (consumable shares, N-shares mode only)",
    ),
];

/// A name as a selector writes it, split into its domain and identifier.
/// Unqualified names belong to the driver's domain.
pub fn split_qualified(name: &str) -> (&str, &str) {
    match name.split_once('/') {
        Some((domain, id)) => (domain, id),
        None => (DRIVER_NAME, name),
    }
}

/// Looks up an attribute by domain and identifier (as CEL sees them: `device.attributes[domain][id]`).
pub fn attribute(domain: &str, id: &str) -> Option<&'static AttributeSpec> {
    ATTRIBUTES
        .iter()
        .find(|s| split_qualified(s.name) == (domain, id))
}

/// Looks up a capacity by domain and identifier.
pub fn capacity(domain: &str, id: &str) -> Option<&'static CapacitySpec> {
    CAPACITIES
        .iter()
        .find(|s| split_qualified(s.name) == (domain, id))
}

/// Whether the domain is one whose names Tessera's schema fully describes. For the standard
/// `resource.kubernetes.io` domain only the names Tessera publishes are known, so lookups there
/// report a miss but callers should treat other standard names as "not published by Tessera".
pub fn is_schema_domain(domain: &str) -> bool {
    domain == DRIVER_NAME || STANDARD_ATTRIBUTE_PREFIX.trim_end_matches('/') == domain
}

/// The closest known attribute identifier in `domain`, for "did you mean" hints on typos.
pub fn closest_attribute(domain: &str, id: &str) -> Option<&'static str> {
    closest(ATTRIBUTES.iter().map(|s| s.name), domain, id)
}

/// The closest known capacity identifier in `domain`, for "did you mean" hints on typos.
pub fn closest_capacity(domain: &str, id: &str) -> Option<&'static str> {
    closest(CAPACITIES.iter().map(|s| s.name), domain, id)
}

fn closest(
    names: impl Iterator<Item = &'static str>,
    domain: &str,
    id: &str,
) -> Option<&'static str> {
    let wanted = id.to_ascii_lowercase();
    names
        .filter(|name| split_qualified(name).0 == domain)
        .map(|name| {
            let candidate = split_qualified(name).1;
            (
                strsim::jaro_winkler(&wanted, &candidate.to_ascii_lowercase()),
                candidate,
            )
        })
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|x, y| x.0.total_cmp(&y.0))
        .map(|(_, candidate)| candidate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_resolvable() {
        for spec in ATTRIBUTES {
            let (domain, id) = split_qualified(spec.name);
            assert_eq!(attribute(domain, id), Some(spec), "{}", spec.name);
            assert!(
                capacity(domain, id).is_none(),
                "{} is both attribute and capacity",
                spec.name
            );
        }
        for spec in CAPACITIES {
            let (domain, id) = split_qualified(spec.name);
            assert_eq!(capacity(domain, id), Some(spec), "{}", spec.name);
        }
        // Attributes and capacities together stay far below the API's 32 entries per device.
        assert!(ATTRIBUTES.len() + CAPACITIES.len() <= 32);
    }

    #[test]
    fn standard_names_live_in_the_kubernetes_domain() {
        assert!(attribute("resource.kubernetes.io", "pcieRoot").is_some());
        assert!(attribute(DRIVER_NAME, "pcieRoot").is_none());
        assert!(attribute(DRIVER_NAME, "productName").is_some());
    }

    #[test]
    fn typos_get_the_closest_name() {
        assert_eq!(closest_capacity(DRIVER_NAME, "memroy"), Some("memory"));
        assert_eq!(
            closest_attribute(DRIVER_NAME, "productname"),
            Some("productName")
        );
        assert_eq!(
            closest_attribute(DRIVER_NAME, "nvlinkIsand"),
            Some("nvlinkIsland")
        );
        assert_eq!(
            closest_attribute("resource.kubernetes.io", "pcieroot"),
            Some("pcieRoot")
        );
        assert_eq!(closest_attribute(DRIVER_NAME, "zzzzzz"), None);
    }
}
