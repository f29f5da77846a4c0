//! Consistency rules of an inventory, whatever its source: unique identities, resolvable NVLink
//! peers, MIG instances that sit on their profile's placements without overlapping, and values
//! that fit the attributes they are published in. The mock backend refuses a topology file that
//! breaks them; the NVML backend reports them as a backend error.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use tessera_api::validation::MAX_ATTRIBUTE_VALUE_LENGTH;

use crate::device_name::{DeviceName, profile_label};
use crate::model::{Gpu, GpuInventory, MigInstance, MigState, NvLinkRemoteType};
use crate::pci;
use crate::units::dotted_to_semver;

/// One broken rule, at a field path such as `gpus[2].mig.instances[0].placementStart`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InventoryProblem {
    pub field: String,
    pub message: String,
}

impl fmt::Display for InventoryProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "field `{}`: {}", self.field, self.message)
    }
}

impl GpuInventory {
    /// Checks the inventory's consistency rules; every problem found, not just the first.
    pub fn validate(&self) -> Result<(), Vec<InventoryProblem>> {
        let mut problems = Problems::default();
        if dotted_to_semver(&self.driver_version).is_none() {
            problems.add(
                "driverVersion",
                format!(
                    "`{}` is not a dotted version such as `550.54.15`",
                    self.driver_version
                ),
            );
        }
        let mut seen = Seen::default();
        let mut mig_uuids = BTreeSet::new();
        for (i, gpu) in self.gpus.iter().enumerate() {
            let at = format!("gpus[{i}]");
            seen.check(&mut problems, &at, gpu);
            check_gpu(&mut problems, &at, gpu, self);
            if let Some(mig) = &gpu.mig {
                check_mig(
                    &mut problems,
                    &format!("{at}.mig"),
                    gpu,
                    mig,
                    &mut mig_uuids,
                );
            }
        }
        problems.finish()
    }
}

#[derive(Default)]
struct Problems(Vec<InventoryProblem>);

impl Problems {
    fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(InventoryProblem {
            field: field.into(),
            message: message.into(),
        });
    }

    fn finish(self) -> Result<(), Vec<InventoryProblem>> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self.0)
        }
    }
}

/// Identities that must be unique across the node's GPUs.
#[derive(Default)]
struct Seen {
    uuids: BTreeMap<String, String>,
    indices: BTreeMap<u32, String>,
    minors: BTreeMap<u32, String>,
    bus_ids: BTreeMap<String, String>,
}

impl Seen {
    fn check(&mut self, problems: &mut Problems, at: &str, gpu: &Gpu) {
        let mut unique = |field: &str, first: Option<String>, value: String| {
            if let Some(first) = first {
                problems.add(
                    format!("{at}.{field}"),
                    format!("{value} is already used by {first}; every GPU needs its own"),
                );
            }
        };
        let first = self.uuids.insert(gpu.uuid.clone(), at.to_owned());
        unique("uuid", first, format!("`{}`", gpu.uuid));
        let first = self.indices.insert(gpu.index, at.to_owned());
        unique("index", first, gpu.index.to_string());
        let first = self.minors.insert(gpu.minor, at.to_owned());
        unique("minor", first, gpu.minor.to_string());
        let first = self
            .bus_ids
            .insert(gpu.pci_bus_id.to_ascii_lowercase(), at.to_owned());
        unique("pciBusId", first, format!("`{}`", gpu.pci_bus_id));
    }
}

fn check_gpu(problems: &mut Problems, at: &str, gpu: &Gpu, inventory: &GpuInventory) {
    if !gpu.uuid.starts_with("GPU-") || gpu.uuid.len() <= 4 {
        problems.add(
            format!("{at}.uuid"),
            format!("`{}` is not a GPU UUID (`GPU-<uuid>`)", gpu.uuid),
        );
    }
    check_string_attribute(problems, &format!("{at}.uuid"), &gpu.uuid);
    check_string_attribute(problems, &format!("{at}.productName"), &gpu.product_name);
    if gpu.product_name.is_empty() {
        problems.add(format!("{at}.productName"), "must not be empty");
    }
    if gpu.memory_bytes == 0 {
        problems.add(format!("{at}.memory"), "must be more than zero");
    }
    if gpu.multiprocessors == 0 {
        problems.add(format!("{at}.multiprocessors"), "must be more than zero");
    }
    if pci::normalize_bus_id(&gpu.pci_bus_id).as_deref() != Some(gpu.pci_bus_id.as_str()) {
        problems.add(
            format!("{at}.pciBusId"),
            format!(
                "`{}` is not an extended BDF in lower case such as `0000:18:00.0`",
                gpu.pci_bus_id
            ),
        );
    }
    if let Some(root) = &gpu.pcie_root
        && !pci::is_pcie_root(root)
    {
        problems.add(
            format!("{at}.pcieRoot"),
            format!("`{root}` is not a PCIe root such as `pci0000:00`"),
        );
    }
    if let Some(fabric) = &gpu.fabric
        && !is_uuid(&fabric.cluster_uuid)
    {
        problems.add(
            format!("{at}.fabric.clusterUuid"),
            format!(
                "`{}` is not a lower-case UUID such as `9a3f0c2e-5b1d-4e7a-8c6f-0d1e2f3a4b5c`",
                fabric.cluster_uuid
            ),
        );
    }
    check_links(problems, at, gpu, inventory);
}

fn check_links(problems: &mut Problems, at: &str, gpu: &Gpu, inventory: &GpuInventory) {
    let mut links = BTreeSet::new();
    for (j, link) in gpu.nvlinks.iter().enumerate() {
        let field = format!("{at}.nvlinks[{j}]");
        if !links.insert(link.link) {
            problems.add(
                format!("{field}.link"),
                format!("link {} is listed twice", link.link),
            );
        }
        if pci::normalize_bus_id(&link.remote_pci_bus_id).as_deref()
            != Some(link.remote_pci_bus_id.as_str())
        {
            problems.add(
                format!("{field}.remotePciBusId"),
                format!(
                    "`{}` is not an extended BDF in lower case such as `0000:05:00.0`",
                    link.remote_pci_bus_id
                ),
            );
            continue;
        }
        if link.remote_type != NvLinkRemoteType::Gpu {
            continue;
        }
        match inventory.gpu_by_pci_bus_id(&link.remote_pci_bus_id) {
            // The peer may be a lost GPU, whose PCI bus id cannot be read.
            None if !inventory.lost_gpus.is_empty() => {}
            None => problems.add(
                format!("{field}.remotePciBusId"),
                format!(
                    "no GPU of this node has PCI bus id `{}`; a `gpu` link must name another GPU's pciBusId",
                    link.remote_pci_bus_id
                ),
            ),
            Some(peer) if peer.uuid == gpu.uuid => problems.add(
                format!("{field}.remotePciBusId"),
                "a link cannot connect a GPU to itself",
            ),
            Some(_) => {}
        }
    }
}

fn check_mig(
    problems: &mut Problems,
    at: &str,
    gpu: &Gpu,
    mig: &MigState,
    mig_uuids: &mut BTreeSet<String>,
) {
    let mut names = BTreeSet::new();
    let mut labels = BTreeSet::new();
    let mut indices = BTreeSet::new();
    let mut ids = BTreeSet::new();
    for (j, p) in mig.profiles.iter().enumerate() {
        let field = format!("{at}.profiles[{j}]");
        let label = profile_label(&p.name);
        if label.is_empty() || !names.insert(p.name.clone()) || !labels.insert(label.clone()) {
            problems.add(
                format!("{field}.name"),
                format!(
                    "profile name `{}` is empty or not unique (also as device-name label `{label}`)",
                    p.name
                ),
            );
        }
        check_string_attribute(problems, &format!("{field}.name"), &p.name);
        let longest = DeviceName::mig(gpu.minor, &p.name, 99).to_string();
        if longest.len() > 63 {
            problems.add(
                format!("{field}.name"),
                format!("device name `{longest}` would be longer than a DNS label (63)"),
            );
        }
        if !indices.insert(p.profile_index) {
            problems.add(
                format!("{field}.profileIndex"),
                format!("profile index {} is used twice", p.profile_index),
            );
        }
        if !ids.insert(p.profile_id) {
            problems.add(
                format!("{field}.profileId"),
                format!("profile id {} is used twice", p.profile_id),
            );
        }
        if p.memory_slices == 0 || p.compute_slices == 0 {
            problems.add(
                format!("{field}.memorySlices"),
                "memorySlices and computeSlices must be at least 1",
            );
        }
        if p.memory_bytes > gpu.memory_bytes || p.multiprocessors > gpu.multiprocessors {
            problems.add(
                format!("{field}.memory"),
                "a profile cannot have more memory or multiprocessors than its GPU",
            );
        }
    }
    if !mig.enabled && !mig.instances.is_empty() {
        problems.add(
            format!("{at}.instances"),
            "MIG instances exist only while MIG is enabled; set `enabled: true` or remove them",
        );
    }
    check_instances(problems, at, gpu, mig, mig_uuids);
}

fn check_instances(
    problems: &mut Problems,
    at: &str,
    gpu: &Gpu,
    mig: &MigState,
    mig_uuids: &mut BTreeSet<String>,
) {
    let mut used_slices: BTreeMap<u32, usize> = BTreeMap::new();
    let mut gi_ids = BTreeSet::new();
    for (j, instance) in mig.instances.iter().enumerate() {
        let field = format!("{at}.instances[{j}]");
        check_instance_identity(problems, &field, instance, mig_uuids, &mut gi_ids);
        if instance.memory_bytes > gpu.memory_bytes {
            problems.add(
                format!("{field}.memory"),
                "an instance cannot have more memory than its GPU",
            );
        }
        let Some(profile) = mig.profile(&instance.profile) else {
            let known: Vec<&str> = mig.profiles.iter().map(|p| p.name.as_str()).collect();
            problems.add(
                format!("{field}.profile"),
                format!(
                    "`{}` is not one of this GPU's profiles ({})",
                    instance.profile,
                    known.join(", ")
                ),
            );
            continue;
        };
        if !profile.placements.contains(&instance.placement_start) {
            problems.add(
                format!("{field}.placementStart"),
                format!(
                    "{} is not a placement of profile `{}` (placements: {:?})",
                    instance.placement_start, profile.name, profile.placements
                ),
            );
            continue;
        }
        for slice in profile.memory_slice_range(instance.placement_start) {
            if let Some(other) = used_slices.insert(slice, j) {
                problems.add(
                    format!("{field}.placementStart"),
                    format!("memory slice {slice} is also used by instances[{other}]"),
                );
            }
        }
    }
}

/// A MIG UUID unique on the node, a GPU-instance id unique on the GPU.
fn check_instance_identity(
    problems: &mut Problems,
    field: &str,
    instance: &MigInstance,
    mig_uuids: &mut BTreeSet<String>,
    gi_ids: &mut BTreeSet<u32>,
) {
    if !instance.uuid.starts_with("MIG-") || !mig_uuids.insert(instance.uuid.clone()) {
        problems.add(
            format!("{field}.uuid"),
            format!(
                "`{}` is not a unique MIG device UUID (`MIG-<uuid>`)",
                instance.uuid
            ),
        );
    }
    check_string_attribute(problems, &format!("{field}.uuid"), &instance.uuid);
    if !gi_ids.insert(instance.gpu_instance_id) {
        problems.add(
            format!("{field}.gpuInstanceId"),
            format!(
                "GPU instance id {} is used twice on this GPU",
                instance.gpu_instance_id
            ),
        );
    }
}

fn check_string_attribute(problems: &mut Problems, field: &str, value: &str) {
    if value.len() > MAX_ATTRIBUTE_VALUE_LENGTH {
        problems.add(
            field,
            format!(
                "`{value}` is longer than {MAX_ATTRIBUTE_VALUE_LENGTH} characters, the limit of a string attribute"
            ),
        );
    }
}

/// Lower-case hyphenated UUID: 8-4-4-4-12 hex digits.
fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups.iter().zip([8, 4, 4, 4, 12]).all(|(g, len)| {
            g.len() == len
                && g.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}
