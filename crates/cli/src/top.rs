//! `tessera top` (`kubectl tessera top`): the GPUs of the cluster and who holds them — per node,
//! each GPU (and each MIG device in use) with its product, NVLink island and the claims and pods
//! holding it, then free whole GPUs per island; a table or `-o json`.
//!
//! Pure over the objects ([`report`]): the devices are what Tessera's ResourceSlices publish,
//! the holders the allocated claims' results (`status.allocation`) with their reservations
//! (`status.reservedFor`, the pods) and the UUID the node plugin reported in `status.devices`.
//! On a live cluster the node plugins' GPU metrics add each device's utilization
//! ([`with_utilization`], read through the API server's pod proxy by
//! [`crate::live::gpu_utilization`]) where the plugins serve them.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use k8s_openapi::api::resource::v1::{Device, ResourceClaim};
use serde::Serialize;
use tessera_api::names::{DRIVER_NAME, attr, device_type};
use tessera_placement::ClusterObjects;

use crate::output::OutputFormat;

#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Read these files or directories instead of the live cluster (as `explain --objects`).
    #[arg(long, env = "TESSERA_OBJECTS", num_args = 1.., value_delimiter = ',')]
    pub objects: Vec<PathBuf>,

    #[command(flatten)]
    pub cluster: crate::live::ClusterArgs,

    #[command(flatten)]
    pub output: crate::output::Output,
}

/// What `top` shows (the `-o json` form).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopReport {
    pub nodes: Vec<NodeReport>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub node: String,
    /// Whole GPUs published.
    pub gpus: usize,
    /// Whole GPUs no claim holds any part of.
    pub free_gpus: usize,
    pub islands: Vec<IslandReport>,
    /// Every whole GPU, and every other device some claim holds.
    pub devices: Vec<DeviceReport>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IslandReport {
    /// The `nvlinkIsland` attribute (`-` for GPUs without NVLink).
    pub island: String,
    pub gpus: usize,
    pub free_gpus: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceReport {
    pub device: String,
    /// `gpu` or `mig`.
    #[serde(rename = "type")]
    pub kind: String,
    pub product: Option<String>,
    pub island: Option<String>,
    pub uuid: Option<String>,
    pub held_by: Vec<Holder>,
    /// The GPU's utilization (percent) in its node plugin's metrics, on a live cluster whose
    /// plugins serve them (for a MIG device or a share, its whole GPU's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_percent: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    /// `namespace/name` of the claim.
    pub claim: String,
    pub request: String,
    /// `namespace/name` of the pods the claim is reserved for.
    pub pods: Vec<String>,
    pub share_id: Option<String>,
    /// The UUID the node plugin reported for this device in the claim's `status.devices`, once
    /// the claim is prepared.
    pub prepared_uuid: Option<String>,
}

fn string_attribute(device: &Device, name: &str) -> Option<String> {
    let attributes = device.attributes.as_ref()?;
    let value = attributes
        .get(name)
        .or_else(|| attributes.get(&format!("{DRIVER_NAME}/{name}")))?;
    value.string.clone().or_else(|| value.version.clone())
}

/// The holders of each `(pool, device)` of this driver.
fn holders(claims: &[ResourceClaim]) -> BTreeMap<(String, String), Vec<Holder>> {
    let mut held: BTreeMap<(String, String), Vec<Holder>> = BTreeMap::new();
    for claim in claims {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let Some(status) = &claim.status else {
            continue;
        };
        let pods: Vec<String> = status
            .reserved_for
            .iter()
            .flatten()
            .filter(|r| r.resource == "pods")
            .map(|r| format!("{namespace}/{}", r.name))
            .collect();
        let results = status
            .allocation
            .as_ref()
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref());
        for result in results.into_iter().flatten() {
            if result.driver != DRIVER_NAME {
                continue;
            }
            let prepared_uuid = status.devices.iter().flatten().find_map(|d| {
                let same = d.driver == result.driver
                    && d.pool == result.pool
                    && d.device == result.device
                    && d.share_id == result.share_id;
                let uuid = d.data.as_ref()?.0.get("uuid")?.as_str()?.to_owned();
                same.then_some(uuid)
            });
            held.entry((result.pool.clone(), result.device.clone()))
                .or_default()
                .push(Holder {
                    claim: format!("{namespace}/{name}"),
                    request: result.request.clone(),
                    pods: pods.clone(),
                    share_id: result.share_id.clone(),
                    prepared_uuid,
                });
        }
    }
    held
}

/// The report over `cluster`'s slices and claims.
pub fn report(cluster: &ClusterObjects) -> TopReport {
    let held = holders(&cluster.claims);
    // node -> device name -> device (a device published twice is shown once)
    let mut published: BTreeMap<String, BTreeMap<String, (String, &Device)>> = BTreeMap::new();
    for slice in &cluster.slices {
        if slice.spec.driver != DRIVER_NAME {
            continue;
        }
        let Some(node) = slice.spec.node_name.clone() else {
            continue;
        };
        let pool = slice.spec.pool.name.clone();
        for device in slice.spec.devices.iter().flatten() {
            published
                .entry(node.clone())
                .or_default()
                .entry(device.name.clone())
                .or_insert((pool.clone(), device));
        }
    }
    let nodes = published
        .into_iter()
        .map(|(node, devices)| node_report(node, &devices, &held))
        .collect();
    TopReport { nodes }
}

fn node_report(
    node: String,
    devices: &BTreeMap<String, (String, &Device)>,
    held: &BTreeMap<(String, String), Vec<Holder>>,
) -> NodeReport {
    let held_by = |pool: &str, name: &str| {
        held.get(&(pool.to_owned(), name.to_owned()))
            .cloned()
            .unwrap_or_default()
    };
    let mut rows: Vec<DeviceReport> = Vec::new();
    // GPU UUIDs some claim holds a part of (a MIG device names its parent).
    let mut parents_in_use = std::collections::BTreeSet::new();
    for (name, (pool, device)) in devices {
        let kind = string_attribute(device, attr::TYPE).unwrap_or_default();
        let holders = held_by(pool, name);
        if kind != device_type::GPU && holders.is_empty() {
            continue;
        }
        if kind != device_type::GPU
            && let Some(parent) = string_attribute(device, attr::PARENT_UUID)
        {
            parents_in_use.insert(parent);
        }
        rows.push(DeviceReport {
            device: name.clone(),
            kind,
            product: string_attribute(device, attr::PRODUCT_NAME),
            island: string_attribute(device, attr::NVLINK_ISLAND),
            uuid: string_attribute(device, attr::UUID),
            held_by: holders,
            utilization_percent: None,
        });
    }
    rows.sort_by_key(|a| natural(&a.device));
    let mut islands: BTreeMap<String, IslandReport> = BTreeMap::new();
    let (mut gpus, mut free_gpus) = (0, 0);
    for row in rows.iter().filter(|r| r.kind == device_type::GPU) {
        let free = row.held_by.is_empty()
            && !row
                .uuid
                .as_ref()
                .is_some_and(|u| parents_in_use.contains(u));
        let island = row.island.clone().unwrap_or_else(|| "-".to_owned());
        let entry = islands.entry(island.clone()).or_insert(IslandReport {
            island,
            gpus: 0,
            free_gpus: 0,
        });
        entry.gpus += 1;
        gpus += 1;
        if free {
            entry.free_gpus += 1;
            free_gpus += 1;
        }
    }
    NodeReport {
        node,
        gpus,
        free_gpus,
        islands: islands.into_values().collect(),
        devices: rows,
    }
}

/// `report` with each device's utilization from `utilization` (`(node, device)` to percent).
pub fn with_utilization(
    mut report: TopReport,
    utilization: &BTreeMap<(String, String), u32>,
) -> TopReport {
    for node in &mut report.nodes {
        for device in &mut node.devices {
            device.utilization_percent = utilization
                .get(&(node.node.clone(), device.device.clone()))
                .copied();
        }
    }
    report
}

/// `gpu-10` after `gpu-9`: digit runs compare as numbers.
fn natural(name: &str) -> Vec<(String, u64)> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut digits = String::new();
    for c in name.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else {
            if !digits.is_empty() {
                parts.push((
                    std::mem::take(&mut text),
                    digits.parse().unwrap_or(u64::MAX),
                ));
                digits.clear();
            }
            text.push(c);
        }
    }
    parts.push((text, digits.parse().unwrap_or(0)));
    parts
}

pub fn run(args: &TopArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let objects = crate::live::objects(&args.objects, &args.cluster)?;
    let mut report = report(&objects.cluster);
    if objects.live {
        match crate::live::gpu_utilization(&args.cluster) {
            Ok(utilization) => report = with_utilization(report, &utilization),
            Err(error) => eprintln!("no GPU utilization: {error:#}"),
        }
    }
    match args.output.format {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &report)?;
            writeln!(out)?;
        }
        OutputFormat::Text => write_table(&report, out)?,
    }
    Ok(())
}

fn write_table(report: &TopReport, out: &mut impl Write) -> anyhow::Result<()> {
    if report.nodes.is_empty() {
        writeln!(out, "no node publishes {DRIVER_NAME} devices")?;
        return Ok(());
    }
    let mut rows = vec![[
        "NODE".to_owned(),
        "DEVICE".to_owned(),
        "PRODUCT".to_owned(),
        "ISLAND".to_owned(),
        "UTIL".to_owned(),
        "POD".to_owned(),
        "CLAIM".to_owned(),
    ]];
    for node in &report.nodes {
        for device in &node.devices {
            let base = [
                node.node.clone(),
                device.device.clone(),
                device.product.clone().unwrap_or_else(|| "-".into()),
                device.island.clone().unwrap_or_else(|| "-".into()),
                device
                    .utilization_percent
                    .map_or_else(|| "-".into(), |p| format!("{p}%")),
            ];
            if device.held_by.is_empty() {
                rows.push([
                    base[0].clone(),
                    base[1].clone(),
                    base[2].clone(),
                    base[3].clone(),
                    base[4].clone(),
                    "-".into(),
                    "-".into(),
                ]);
            }
            for holder in &device.held_by {
                let pods = if holder.pods.is_empty() {
                    "-".to_owned()
                } else {
                    holder.pods.join(",")
                };
                let mut claim = format!("{} ({})", holder.claim, holder.request);
                if let Some(share) = &holder.share_id {
                    claim.push_str(&format!(" share {share}"));
                }
                rows.push([
                    base[0].clone(),
                    base[1].clone(),
                    base[2].clone(),
                    base[3].clone(),
                    base[4].clone(),
                    pods,
                    claim,
                ]);
            }
        }
    }
    write_columns(out, &rows)?;
    writeln!(out)?;
    let mut islands = vec![[
        "NODE".to_owned(),
        "ISLAND".to_owned(),
        "GPUS".to_owned(),
        "FREE".to_owned(),
    ]];
    for node in &report.nodes {
        for island in &node.islands {
            islands.push([
                node.node.clone(),
                island.island.clone(),
                island.gpus.to_string(),
                island.free_gpus.to_string(),
            ]);
        }
    }
    write_columns(out, &islands)?;
    Ok(())
}

fn write_columns<const N: usize>(out: &mut impl Write, rows: &[[String; N]]) -> anyhow::Result<()> {
    let mut widths = [0usize; N];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == N {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::utilization_of;

    #[test]
    fn utilization_comes_from_the_plugins_series_per_device() {
        let metrics = "# TYPE tessera_node_gpu_utilization_percent gauge\n\
            tessera_node_gpu_utilization_percent{namespace=\"ml\",pod=\"a\",claim=\"c\",request=\"gpu\",device=\"gpu-0\",uuid=\"GPU-0\"} 80\n\
            tessera_node_gpu_utilization_percent{namespace=\"ml\",pod=\"b\",claim=\"c\",request=\"gpu\",device=\"gpu-0\",uuid=\"GPU-0\"} 80\n\
            tessera_node_gpu_utilization_percent{namespace=\"\",pod=\"\",claim=\"\",request=\"\",device=\"gpu-1\",uuid=\"GPU-1\"} 3\n\
            tessera_node_gpu_memory_used_bytes{namespace=\"\",pod=\"\",claim=\"\",request=\"\",device=\"gpu-2\",uuid=\"GPU-2\"} 7\n";
        let found = utilization_of(metrics);
        assert_eq!(
            found,
            BTreeMap::from([("gpu-0".to_owned(), 80), ("gpu-1".to_owned(), 3)])
        );
        let report = TopReport {
            nodes: vec![NodeReport {
                node: "n".into(),
                gpus: 2,
                free_gpus: 1,
                islands: Vec::new(),
                devices: ["gpu-0", "gpu-2"]
                    .iter()
                    .map(|d| DeviceReport {
                        device: (*d).into(),
                        kind: "gpu".into(),
                        product: None,
                        island: None,
                        uuid: None,
                        held_by: Vec::new(),
                        utilization_percent: None,
                    })
                    .collect(),
            }],
        };
        let by_node = found
            .into_iter()
            .map(|(device, p)| (("n".to_owned(), device), p))
            .collect();
        let report = with_utilization(report, &by_node);
        assert_eq!(report.nodes[0].devices[0].utilization_percent, Some(80));
        assert_eq!(report.nodes[0].devices[1].utilization_percent, None);
    }
}
