//! What Tessera published: the devices of every `gpu.tessera.dev` ResourceSlice (highest pool
//! generation only, as the scheduler reads them), indexed by pool and device name, with typed
//! access to the attributes the scenarios check.

use std::collections::BTreeMap;
use std::fmt;

use anyhow::Context;
use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourceSlice};
use kube::api::{Api, ListParams};
use tessera_api::names::{DRIVER_NAME, attr, device_type};

/// An attribute value, as the API carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishedAttribute {
    Bool(bool),
    Int(i64),
    String(String),
    Version(String),
}

impl fmt::Display for PublishedAttribute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PublishedAttribute::Bool(v) => write!(f, "{v}"),
            PublishedAttribute::Int(v) => write!(f, "{v}"),
            PublishedAttribute::String(v) | PublishedAttribute::Version(v) => f.write_str(v),
        }
    }
}

fn attribute_value(attribute: &DeviceAttribute) -> Option<PublishedAttribute> {
    if let Some(v) = attribute.bool {
        return Some(PublishedAttribute::Bool(v));
    }
    if let Some(v) = attribute.int {
        return Some(PublishedAttribute::Int(v));
    }
    if let Some(v) = &attribute.string {
        return Some(PublishedAttribute::String(v.clone()));
    }
    attribute.version.clone().map(PublishedAttribute::Version)
}

/// A device taint (key, effect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub effect: String,
}

/// One published device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedDevice {
    /// The node of its slice (`spec.nodeName`).
    pub node: String,
    pub pool: String,
    pub name: String,
    /// Attributes by their name as published (unqualified names are in the driver's domain).
    pub attributes: BTreeMap<String, PublishedAttribute>,
    /// Capacities by name, as quantity strings.
    pub capacity: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
}

impl PublishedDevice {
    /// An attribute by its unqualified (driver-domain) or fully qualified name.
    pub fn attribute(&self, name: &str) -> Option<&PublishedAttribute> {
        self.attributes.get(name).or_else(|| {
            name.strip_prefix(&format!("{DRIVER_NAME}/"))
                .and_then(|short| self.attributes.get(short))
        })
    }

    fn string(&self, name: &str) -> Option<&str> {
        match self.attribute(name)? {
            PublishedAttribute::String(s) | PublishedAttribute::Version(s) => Some(s),
            _ => None,
        }
    }

    fn int(&self, name: &str) -> Option<i64> {
        match self.attribute(name)? {
            PublishedAttribute::Int(v) => Some(*v),
            _ => None,
        }
    }

    /// `gpu` or `mig`.
    pub fn kind(&self) -> Option<&str> {
        self.string(attr::TYPE)
    }

    pub fn is_whole_gpu(&self) -> bool {
        self.kind() == Some(device_type::GPU)
    }

    pub fn is_mig(&self) -> bool {
        self.kind() == Some(device_type::MIG)
    }

    /// The UUID CUDA lists in a container holding the device (the MIG device's own for MIG).
    pub fn uuid(&self) -> Option<&str> {
        self.string(attr::UUID)
    }

    pub fn product(&self) -> Option<&str> {
        self.string(attr::PRODUCT_NAME)
    }

    pub fn profile(&self) -> Option<&str> {
        self.string(attr::PROFILE)
    }

    pub fn island(&self) -> Option<&str> {
        self.string(attr::NVLINK_ISLAND)
    }

    /// `resource.kubernetes.io/numaNode`, else the older `gpu.tessera.dev/numaNode`.
    pub fn numa_node(&self) -> Option<i64> {
        self.int(attr::NUMA_NODE)
            .or_else(|| self.int(attr::LEGACY_NUMA_NODE))
    }

    pub fn minor(&self) -> Option<i64> {
        self.int(attr::MINOR)
    }

    /// A capacity in bytes (or units), from its quantity string.
    pub fn capacity_bytes(&self, name: &str) -> Option<u128> {
        parse_quantity(self.capacity.get(name)?)
    }

    /// The major number of `driverVersion` (`550.54.15` → 550).
    pub fn driver_major(&self) -> Option<u64> {
        self.string(attr::DRIVER_VERSION)?
            .split('.')
            .next()?
            .parse()
            .ok()
    }

    pub fn has_taint(&self, key: &str) -> bool {
        self.taints.iter().any(|t| t.key == key)
    }

    /// A one-line summary: `gpu-4  NUMA 1  island …  GPU-…`.
    pub fn summary(&self) -> String {
        let mut out = format!("{:<22}", self.name);
        match self.numa_node() {
            Some(numa) => out.push_str(&format!(" NUMA {numa}")),
            None => out.push_str(" NUMA -"),
        }
        out.push_str(&format!("  island {}", self.island().unwrap_or("-")));
        if let Some(profile) = self.profile() {
            out.push_str(&format!("  profile {profile}"));
        }
        out.push_str(&format!("  {}", self.uuid().unwrap_or("<no uuid>")));
        out
    }
}

/// Every device Tessera published, by (pool, device name).
#[derive(Debug, Clone, Default)]
pub struct Published {
    devices: BTreeMap<(String, String), PublishedDevice>,
}

impl Published {
    /// Lists the driver's ResourceSlices.
    pub async fn list(client: &kube::Client) -> anyhow::Result<Self> {
        let slices = Api::<ResourceSlice>::all(client.clone())
            .list(&ListParams::default().fields(&format!("spec.driver={DRIVER_NAME}")))
            .await
            .context("cannot list ResourceSlices")?;
        Ok(Self::from_slices(&slices.items))
    }

    /// Indexes `slices` (other drivers' slices and older pool generations are left out).
    pub fn from_slices(slices: &[ResourceSlice]) -> Self {
        let mut newest: BTreeMap<&str, i64> = BTreeMap::new();
        for slice in slices.iter().filter(|s| s.spec.driver == DRIVER_NAME) {
            let generation = newest.entry(&slice.spec.pool.name).or_insert(i64::MIN);
            *generation = (*generation).max(slice.spec.pool.generation);
        }
        let mut devices = BTreeMap::new();
        for slice in slices.iter().filter(|s| s.spec.driver == DRIVER_NAME) {
            let pool = &slice.spec.pool;
            if newest.get(pool.name.as_str()) != Some(&pool.generation) {
                continue;
            }
            let node = slice.spec.node_name.clone().unwrap_or_default();
            for device in slice.spec.devices.iter().flatten() {
                let attributes = device
                    .attributes
                    .iter()
                    .flatten()
                    .filter_map(|(k, v)| Some((k.clone(), attribute_value(v)?)))
                    .collect();
                let capacity = device
                    .capacity
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.value.0.clone()))
                    .collect();
                let taints = device
                    .taints
                    .iter()
                    .flatten()
                    .map(|t| Taint {
                        key: t.key.clone(),
                        effect: t.effect.clone(),
                    })
                    .collect();
                devices.insert(
                    (pool.name.clone(), device.name.clone()),
                    PublishedDevice {
                        node: node.clone(),
                        pool: pool.name.clone(),
                        name: device.name.clone(),
                        attributes,
                        capacity,
                        taints,
                    },
                );
            }
        }
        Self { devices }
    }

    pub fn get(&self, pool: &str, device: &str) -> Option<&PublishedDevice> {
        self.devices.get(&(pool.to_owned(), device.to_owned()))
    }

    /// The devices of `node`, in name order.
    pub fn on_node<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a PublishedDevice> + 'a {
        self.devices.values().filter(move |d| d.node == node)
    }

    /// Nodes with at least one device, sorted.
    pub fn nodes(&self) -> Vec<String> {
        // Network-attached devices (IMEX channels) have no node of their own.
        let mut nodes: Vec<String> = self
            .devices
            .values()
            .filter(|d| !d.node.is_empty())
            .map(|d| d.node.clone())
            .collect();
        nodes.dedup();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// Whole GPUs of `node`.
    pub fn whole_gpus<'a>(&'a self, node: &'a str) -> Vec<&'a PublishedDevice> {
        self.on_node(node).filter(|d| d.is_whole_gpu()).collect()
    }
}

/// Parses the integer quantities devices publish: a number with an optional binary (`Ki`…`Ei`)
/// or decimal (`k`, `M`, `G`, `T`, `P`, `E`) suffix. Fractions and exponents are not used for
/// device capacities and are refused.
pub fn parse_quantity(text: &str) -> Option<u128> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: u128 = number.parse().ok()?;
    let multiplier: u128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return None,
    };
    number.checked_mul(multiplier)
}

/// Sorts device names the way people read them (`gpu-2` before `gpu-10`): runs of digits
/// compare as numbers, everything else as text.
pub fn natural_order(a: &str, b: &str) -> std::cmp::Ordering {
    #[derive(PartialEq, Eq, PartialOrd, Ord)]
    enum Chunk<'a> {
        Number(u64),
        Text(&'a str),
    }
    fn chunks(s: &str) -> Vec<Chunk<'_>> {
        let mut out = Vec::new();
        let mut rest = s;
        while let Some(first) = rest.chars().next() {
            let digit = first.is_ascii_digit();
            let end = rest
                .find(|c: char| c.is_ascii_digit() != digit)
                .unwrap_or(rest.len());
            let (chunk, tail) = rest.split_at(end);
            out.push(match chunk.parse() {
                Ok(n) if digit => Chunk::Number(n),
                _ => Chunk::Text(chunk),
            });
            rest = tail;
        }
        out
    }
    chunks(a).cmp(&chunks(b))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{Device, DeviceTaint, ResourcePool, ResourceSliceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn string(value: &str) -> DeviceAttribute {
        DeviceAttribute {
            string: Some(value.to_owned()),
            ..Default::default()
        }
    }

    fn slice(node: &str, generation: i64, devices: &[(&str, i64)]) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta::default(),
            spec: ResourceSliceSpec {
                driver: DRIVER_NAME.to_owned(),
                node_name: Some(node.to_owned()),
                pool: ResourcePool {
                    name: node.to_owned(),
                    generation,
                    resource_slice_count: 1,
                },
                devices: Some(
                    devices
                        .iter()
                        .map(|(name, numa)| Device {
                            name: (*name).to_owned(),
                            attributes: Some(BTreeMap::from([
                                ("type".to_owned(), string("gpu")),
                                (
                                    "numaNode".to_owned(),
                                    DeviceAttribute {
                                        int: Some(*numa),
                                        ..Default::default()
                                    },
                                ),
                                ("uuid".to_owned(), string(&format!("GPU-{name}"))),
                            ])),
                            taints: Some(vec![DeviceTaint {
                                key: "k".to_owned(),
                                effect: "NoSchedule".to_owned(),
                                ..Default::default()
                            }]),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            },
        }
    }

    #[test]
    fn only_the_newest_pool_generation_counts() {
        let slices = [
            slice("n1", 1, &[("gpu-0", 0), ("gpu-9", 0)]),
            slice("n1", 2, &[("gpu-0", 1)]),
            slice("n2", 1, &[("gpu-0", 0)]),
        ];
        let published = Published::from_slices(&slices);
        assert_eq!(published.nodes(), ["n1", "n2"]);
        assert!(published.get("n1", "gpu-9").is_none());
        let gpu = published.get("n1", "gpu-0").unwrap();
        assert_eq!(gpu.numa_node(), Some(1));
        assert_eq!(gpu.uuid(), Some("GPU-gpu-0"));
        assert!(gpu.is_whole_gpu() && !gpu.is_mig());
        assert!(gpu.has_taint("k"));
        assert_eq!(
            gpu.attribute("gpu.tessera.dev/numaNode"),
            Some(&PublishedAttribute::Int(1))
        );
        assert_eq!(published.whole_gpus("n2").len(), 1);
    }

    #[test]
    fn quantities_parse() {
        assert_eq!(parse_quantity("81559Mi"), Some(81559 << 20));
        assert_eq!(parse_quantity("132"), Some(132));
        assert_eq!(parse_quantity("2G"), Some(2_000_000_000));
        assert_eq!(parse_quantity("1.5Gi"), None);
        assert_eq!(parse_quantity("Gi"), None);
        assert_eq!(parse_quantity("1e3"), None);
    }

    #[test]
    fn natural_order_sorts_numbers_as_numbers() {
        let mut names = vec![
            "gpu-10",
            "gpu-2",
            "gpu-1-mig-1g-3",
            "gpu-1",
            "gpu-1-mig-1g-10",
        ];
        names.sort_by(|a, b| natural_order(a, b));
        assert_eq!(
            names,
            [
                "gpu-1",
                "gpu-1-mig-1g-3",
                "gpu-1-mig-1g-10",
                "gpu-2",
                "gpu-10"
            ]
        );
    }
}
