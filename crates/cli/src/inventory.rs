//! `tessera inventory`: the ResourceSlices a node would publish, from a topology (shipped name or
//! file) or from the node's real GPUs through NVML.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use tessera_api::names::attr;
use tessera_api::shares::ConsumableShares;
use tessera_gpu_inventory::{
    DeviceSource, MockSource, RenderOptions, ServerVersion, render_slices, shipped_topology_names,
};
use tessera_nvml::{NvmlSource, Sysfs};

/// How `inventory -o` prints ResourceSlices (the commands that print a report take
/// [`crate::output::OutputFormat`] instead: other formats, another default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SlicesFormat {
    /// A JSON array of ResourceSlice objects.
    Json,
    /// ResourceSlice objects as a multi-document YAML stream.
    Yaml,
    /// One row per device.
    Table,
}

#[derive(Debug, clap::Args)]
pub struct InventoryArgs {
    /// A shipped topology name or the path of a topology file (docs/topology-format.md).
    #[arg(long, env = "TESSERA_TOPOLOGY", required_unless_present = "nvml", conflicts_with = "nvml", help = topology_help())]
    pub topology: Option<String>,

    /// Read the node's GPUs through NVML instead of a topology.
    #[arg(long, env = "TESSERA_NVML")]
    pub nvml: bool,

    /// The NVML library to load (default: libnvidia-ml.so.1 from the library path).
    #[arg(long, env = "TESSERA_NVML_LIB", requires = "nvml")]
    pub nvml_lib: Option<PathBuf>,

    /// Where the host's sysfs is mounted; the NVML backend reads PCIe roots and NUMA nodes there.
    #[arg(
        long,
        env = "TESSERA_SYSFS_ROOT",
        default_value = "/sys",
        requires = "nvml"
    )]
    pub sysfs_root: PathBuf,

    /// Node name: the pool name, spec.nodeName and the prefix of slice names (default `node`).
    /// With a topology, also the node the GPU and MIG UUIDs are derived for, as the node plugin
    /// does; without it the topology file's UUIDs are shown [also read from $NODE_NAME, the
    /// downward API's convention].
    #[arg(long, env = "TESSERA_NODE_NAME")]
    pub node_name: Option<String>,

    /// Output format.
    #[arg(
        short = 'o',
        long,
        env = "TESSERA_OUTPUT",
        value_enum,
        default_value = "yaml"
    )]
    pub output: SlicesFormat,

    /// Kubernetes release the slices are written for (1.34: counter sets share slices with
    /// devices; 1.35+: they get slices of their own).
    #[arg(long, env = "TESSERA_SERVER_VERSION", default_value = "1.34")]
    pub server_version: ServerVersion,

    /// Publish MIG-mode GPUs as partitionable devices (every placement of every profile).
    #[arg(long, env = "TESSERA_DYNAMIC_MIG")]
    pub dynamic_mig: bool,

    /// Taint every device gpu.tessera.dev/topology-managed:NoSchedule, as on a topology-managed node.
    #[arg(long, env = "TESSERA_TOPOLOGY_MANAGED")]
    pub topology_managed: bool,

    /// Publish for sharing between claims, as the plugin's `--consumable-shares`: `disabled`,
    /// `unlimited`, `memory` or a number of equal shares.
    #[arg(long, env = "TESSERA_CONSUMABLE_SHARES", default_value = "disabled")]
    pub consumable_shares: ConsumableShares,
}

/// The pool name when no `--node-name` is given.
const DEFAULT_NODE_NAME: &str = "node";

fn topology_help() -> String {
    format!(
        "A shipped topology name ({}) or the path of a topology file",
        shipped_topology_names().join(", ")
    )
}

/// Reads the inventory, renders it and writes it in the chosen format.
pub fn run(args: &InventoryArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let source = device_source(args)?;
    let inventory = source
        .inventory()
        .with_context(|| format!("reading the GPUs from {}", source.describe()))?;
    let options = RenderOptions {
        server_version: args.server_version,
        dynamic_mig: args.dynamic_mig,
        topology_managed: args.topology_managed,
        consumable_shares: args.consumable_shares,
        ..RenderOptions::new(node_name(args).as_deref().unwrap_or(DEFAULT_NODE_NAME))
    };
    let slices = render_slices(&inventory, &options)
        .with_context(|| format!("rendering the ResourceSlices of {}", source.describe()))?;
    match args.output {
        SlicesFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &slices)?;
            writeln!(out)?;
        }
        SlicesFormat::Yaml => {
            for slice in &slices {
                writeln!(out, "---")?;
                write!(out, "{}", serde_yaml::to_string(slice)?)?;
            }
        }
        SlicesFormat::Table => write_table(&slices, out)?,
    }
    Ok(())
}

fn device_source(args: &InventoryArgs) -> anyhow::Result<Box<dyn DeviceSource>> {
    if args.nvml {
        let source = NvmlSource::open(args.nvml_lib.as_deref())?;
        return Ok(Box::new(source.with_sysfs(Sysfs::new(&args.sysfs_root))));
    }
    let topology = args
        .topology
        .as_deref()
        .context("either --topology or --nvml is required")?;
    let source = MockSource::new(topology)?;
    Ok(Box::new(match node_name(args) {
        Some(node_name) => source.for_node(node_name),
        None => source,
    }))
}

/// `--node-name`, else `$NODE_NAME` (the downward API's convention, as the node plugin reads it).
fn node_name(args: &InventoryArgs) -> Option<String> {
    args.node_name
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok())
        .filter(|n| !n.is_empty())
}

/// One row per device: name, type, MIG profile, memory, NVLink island, NUMA node, PCIe root.
fn write_table(slices: &[ResourceSlice], out: &mut impl Write) -> anyhow::Result<()> {
    let header = [
        "DEVICE",
        "TYPE",
        "PROFILE",
        "MEMORY",
        "ISLAND",
        "NUMA",
        "PCIE-ROOT",
        "TAINTS",
    ];
    let mut rows = vec![header.map(str::to_owned).to_vec()];
    let mut counter_sets = 0;
    for slice in slices {
        counter_sets += slice.spec.shared_counters.as_ref().map_or(0, Vec::len);
        for device in slice.spec.devices.iter().flatten() {
            rows.push(table_row(device));
        }
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        writeln!(out, "{}", line.join("  ").trim_end())?;
    }
    writeln!(
        out,
        "\n{} devices, {counter_sets} counter sets, {} slices",
        rows.len() - 1,
        slices.len()
    )?;
    Ok(())
}

fn table_row(device: &Device) -> Vec<String> {
    let attributes = device.attributes.as_ref();
    let attribute = |name: &str| {
        attributes
            .and_then(|a| a.get(name))
            .map(|a| {
                a.string
                    .clone()
                    .or_else(|| a.int.map(|i| i.to_string()))
                    .or_else(|| a.version.clone())
                    .or_else(|| a.bool.map(|b| b.to_string()))
                    .unwrap_or_default()
            })
            .unwrap_or_else(|| "-".to_owned())
    };
    let memory = device
        .capacity
        .as_ref()
        .and_then(|c| c.get(tessera_api::names::capacity::MEMORY))
        .and_then(|q| q.value.0.parse::<u64>().ok())
        .map_or_else(
            || "-".to_owned(),
            |bytes| format!("{:.1}GiB", bytes as f64 / f64::from(1u32 << 30)),
        );
    let taints = device
        .taints
        .iter()
        .flatten()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect::<Vec<_>>()
        .join(",");
    vec![
        device.name.clone(),
        attribute(attr::TYPE),
        attribute(attr::PROFILE),
        memory,
        attribute(attr::NVLINK_ISLAND),
        attribute(attr::NUMA_NODE),
        attribute(attr::PCIE_ROOT),
        if taints.is_empty() {
            "-".to_owned()
        } else {
            taints
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(topology: &str, output: SlicesFormat) -> InventoryArgs {
        InventoryArgs {
            topology: Some(topology.to_owned()),
            nvml: false,
            nvml_lib: None,
            sysfs_root: "/sys".into(),
            node_name: Some("node-1".to_owned()),
            output,
            server_version: ServerVersion::V1_34,
            dynamic_mig: false,
            topology_managed: false,
            consumable_shares: ConsumableShares::Disabled,
        }
    }

    #[test]
    fn table_has_one_row_per_device() {
        let mut out = Vec::new();
        run(
            &args("pcie-a100-nvlink-pairs", SlicesFormat::Table),
            &mut out,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("DEVICE"), "{text}");
        assert!(lines[1].starts_with("gpu-0  "), "{text}");
        assert!(
            lines[1].contains("80.0GiB") && lines[1].contains("pci0000:16"),
            "{text}"
        );
        assert!(
            text.ends_with("4 devices, 0 counter sets, 1 slices\n"),
            "{text}"
        );
    }
}
