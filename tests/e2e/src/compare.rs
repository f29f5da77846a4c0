//! Two allocations of the same claim shown side by side: one row per device (name, NUMA node,
//! NVLink island), then how many NUMA nodes and islands each side spans. This is what the
//! `topology-fragmented` scenario prints to show the controller's placement next to first fit.

use std::collections::BTreeSet;

use crate::devices::PublishedDevice;

/// One side of the comparison: a title (who allocated, on which node) and its devices.
pub struct Side<'a> {
    pub title: String,
    pub devices: Vec<&'a PublishedDevice>,
}

/// `gpu-4  NUMA 1  nvl-…` for a device, `-` for what it lacks.
fn cell(device: Option<&&PublishedDevice>) -> String {
    let Some(device) = device else {
        return String::new();
    };
    let numa = device
        .numa_node()
        .map_or_else(|| "-".to_owned(), |n| n.to_string());
    format!(
        "{:<7} NUMA {numa:<2} island {}",
        device.name,
        device.island().unwrap_or("-")
    )
}

/// `1 NUMA node {1}, 1 NVLink island` for a side.
fn span(devices: &[&PublishedDevice]) -> String {
    let numa: BTreeSet<Option<i64>> = devices.iter().map(|d| d.numa_node()).collect();
    let islands: BTreeSet<&str> = devices.iter().map(|d| d.island().unwrap_or("-")).collect();
    let plural = |n: usize, word: &str| {
        if n == 1 {
            format!("{n} {word}")
        } else {
            format!("{n} {word}s")
        }
    };
    format!(
        "{} {{{}}}, {}",
        plural(numa.len(), "NUMA node"),
        numa.iter()
            .map(|n| n.map_or_else(|| "-".to_owned(), |n| n.to_string()))
            .collect::<Vec<_>>()
            .join(","),
        plural(islands.len(), "NVLink island")
    )
}

/// The two sides as a table: a header, one row per device, a span row.
pub fn side_by_side(left: &Side<'_>, right: &Side<'_>) -> String {
    let rows = left.devices.len().max(right.devices.len());
    let mut left_column = vec![left.title.clone()];
    let mut right_column = vec![right.title.clone()];
    for i in 0..rows {
        left_column.push(cell(left.devices.get(i)));
        right_column.push(cell(right.devices.get(i)));
    }
    left_column.push(span(&left.devices));
    right_column.push(span(&right.devices));
    let width = left_column
        .iter()
        .map(|c| c.chars().count())
        .max()
        .unwrap_or(0);
    left_column
        .iter()
        .zip(&right_column)
        .map(|(l, r)| format!("{l:<width$}  |  {r}").trim_end().to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use pretty_assertions::assert_eq;
    use tessera_api::names::attr;

    use super::*;
    use crate::devices::PublishedAttribute;

    fn gpu(name: &str, numa: i64, island: &str) -> PublishedDevice {
        PublishedDevice {
            node: "n".to_owned(),
            pool: "n".to_owned(),
            name: name.to_owned(),
            attributes: BTreeMap::from([
                (attr::NUMA_NODE.to_owned(), PublishedAttribute::Int(numa)),
                (
                    attr::NVLINK_ISLAND.to_owned(),
                    PublishedAttribute::String(island.to_owned()),
                ),
            ]),
            capacity: BTreeMap::new(),
            taints: Vec::new(),
        }
    }

    #[test]
    fn rows_pair_devices_and_the_last_row_counts_numa_nodes_and_islands() {
        let controller = [gpu("gpu-4", 1, "nvl-a"), gpu("gpu-5", 1, "nvl-a")];
        let first_fit = [
            gpu("gpu-2", 0, "nvl-a"),
            gpu("gpu-3", 0, "nvl-a"),
            gpu("gpu-4", 1, "nvl-b"),
        ];
        let table = side_by_side(
            &Side {
                title: "controller (node-1)".to_owned(),
                devices: controller.iter().collect(),
            },
            &Side {
                title: "first fit (node-2)".to_owned(),
                devices: first_fit.iter().collect(),
            },
        );
        let expected = [
            "controller (node-1)               |  first fit (node-2)",
            "gpu-4   NUMA 1  island nvl-a      |  gpu-2   NUMA 0  island nvl-a",
            "gpu-5   NUMA 1  island nvl-a      |  gpu-3   NUMA 0  island nvl-a",
            "                                  |  gpu-4   NUMA 1  island nvl-b",
            "1 NUMA node {1}, 1 NVLink island  |  2 NUMA nodes {0,1}, 2 NVLink islands",
        ];
        assert_eq!(table, expected.join("\n"));
    }
}
