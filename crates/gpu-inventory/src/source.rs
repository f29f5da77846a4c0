//! Where inventories come from: the [`DeviceSource`] trait and its error type.

use std::path::PathBuf;

use crate::model::GpuInventory;
use crate::validate::InventoryProblem;

/// A backend that reads the node's GPUs: `mock` (a topology file) or `nvml` (the real driver).
pub trait DeviceSource: Send + Sync {
    /// Reads the current inventory, normalized ([`GpuInventory::normalize`]) and validated.
    fn inventory(&self) -> Result<GpuInventory, SourceError>;

    /// A short description for logs, e.g. `mock topology dgx-h100` or `NVML (libnvidia-ml.so.1)`.
    fn describe(&self) -> String;
}

/// Why a backend could not produce an inventory.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A topology file could not be read.
    #[error("cannot read topology file {}: {source}", path.display())]
    ReadTopology {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A topology file is not valid YAML or does not have the topology format.
    #[error("{}", syntax_message(file, *line, *column, field, message))]
    TopologySyntax {
        /// The file path, or `<shipped topology NAME>`.
        file: String,
        /// 1-based line and column of the offending value, when the parser knows them.
        line: Option<usize>,
        column: Option<usize>,
        /// Field path such as `gpus[2].memory`; empty at the document root.
        field: String,
        /// What is wrong and what was expected.
        message: String,
    },

    /// A topology file parsed but breaks the inventory's consistency rules.
    #[error("invalid topology {file}:\n{}", list(problems))]
    TopologyInvalid {
        file: String,
        problems: Vec<InventoryProblem>,
    },

    /// No shipped topology has this name, and no file has this path.
    #[error("unknown topology `{name}`: not a file, and not one of the shipped topologies ({})", known.join(", "))]
    UnknownTopology { name: String, known: Vec<String> },

    /// A hardware backend (NVML) failed to read something.
    #[error("{backend}: {operation} failed: {source}")]
    Backend {
        /// `nvml`.
        backend: &'static str,
        /// What was being read, on which device, e.g. `nvmlDeviceGetMemoryInfo on GPU 3`.
        operation: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A hardware backend produced an inventory that breaks the consistency rules.
    #[error("{backend} reported an inconsistent inventory:\n{}", list(problems))]
    BackendInvalid {
        backend: &'static str,
        problems: Vec<InventoryProblem>,
    },
}

fn syntax_message(
    file: &str,
    line: Option<usize>,
    column: Option<usize>,
    field: &str,
    message: &str,
) -> String {
    let mut out = file.to_owned();
    if let Some(line) = line {
        out.push_str(&format!(":{line}"));
        if let Some(column) = column {
            out.push_str(&format!(":{column}"));
        }
    }
    if field.is_empty() {
        out.push_str(&format!(": {message}"));
    } else {
        out.push_str(&format!(": field `{field}`: {message}"));
    }
    out
}

fn list(problems: &[InventoryProblem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}
