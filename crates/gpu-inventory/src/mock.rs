//! The `mock` backend: an inventory read from a YAML topology file (docs/topology-format.md),
//! either a file on disk or one of the topologies shipped inside this crate.

use std::path::{Path, PathBuf};

use crate::model::GpuInventory;
use crate::node_identity;
use crate::source::{DeviceSource, SourceError};

/// The topologies shipped with Tessera: (name, YAML text).
pub const SHIPPED_TOPOLOGIES: &[(&str, &str)] = &[
    ("dgx-h100", include_str!("../topologies/dgx-h100.yaml")),
    (
        "hgx-a100-mig",
        include_str!("../topologies/hgx-a100-mig.yaml"),
    ),
    ("pcie-l40s", include_str!("../topologies/pcie-l40s.yaml")),
    (
        "pcie-a100-nvlink-pairs",
        include_str!("../topologies/pcie-a100-nvlink-pairs.yaml"),
    ),
    ("gb200-tray", include_str!("../topologies/gb200-tray.yaml")),
];

/// Names of the shipped topologies.
pub fn shipped_topology_names() -> Vec<String> {
    SHIPPED_TOPOLOGIES
        .iter()
        .map(|(name, _)| (*name).to_owned())
        .collect()
}

/// The YAML text of a shipped topology.
pub fn shipped_topology(name: &str) -> Option<&'static str> {
    SHIPPED_TOPOLOGIES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| *text)
}

/// Parses and validates topology YAML. `origin` names the text in errors (a path, or
/// `<shipped topology NAME>`).
pub fn parse_topology(origin: &str, yaml: &str) -> Result<GpuInventory, SourceError> {
    let deserializer = serde_yaml::Deserializer::from_str(yaml);
    let mut inventory: GpuInventory =
        serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            let location = inner.location();
            let message = strip_location(&inner.to_string());
            // serde_yaml prefixes the path it knows; the error carries the path separately.
            let message = message
                .strip_prefix(&format!("{field}: "))
                .map_or(message.clone(), str::to_owned);
            SourceError::TopologySyntax {
                file: origin.to_owned(),
                line: location.as_ref().map(|l| l.line()),
                column: location.as_ref().map(|l| l.column()),
                field: if field == "." { String::new() } else { field },
                message,
            }
        })?;
    inventory
        .validate()
        .map_err(|problems| SourceError::TopologyInvalid {
            file: origin.to_owned(),
            problems,
        })?;
    inventory.normalize();
    Ok(inventory)
}

/// serde_yaml appends ` at line L column C` to its messages; the error carries them separately.
fn strip_location(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(at) => message[..at].to_owned(),
        None => message.to_owned(),
    }
}

/// Where a mock topology comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    Shipped(&'static str, &'static str),
    File(PathBuf),
}

/// The mock backend: answers with the inventory of a topology file, re-read on every call so a
/// test can change the file under a running node plugin.
///
/// Without a node name the UUIDs are the file's; with one ([`MockSource::for_node`]) they are
/// derived from the node name and the file's UUIDs ([`crate::node_identity`]), so nodes sharing a
/// topology do not share GPU identities.
#[derive(Debug, Clone)]
pub struct MockSource {
    origin: Origin,
    node_name: Option<String>,
}

impl MockSource {
    /// A shipped topology by name, or else a file at that path. Errors name the shipped
    /// topologies when neither exists.
    pub fn new(name_or_path: &str) -> Result<MockSource, SourceError> {
        if let Some((name, text)) = SHIPPED_TOPOLOGIES.iter().find(|(n, _)| *n == name_or_path) {
            return Ok(MockSource {
                origin: Origin::Shipped(name, text),
                node_name: None,
            });
        }
        let path = Path::new(name_or_path);
        if path.is_file() {
            return Ok(MockSource::from_file(path));
        }
        Err(SourceError::UnknownTopology {
            name: name_or_path.to_owned(),
            known: shipped_topology_names(),
        })
    }

    /// A topology file on disk (read when [`DeviceSource::inventory`] is called).
    pub fn from_file(path: impl Into<PathBuf>) -> MockSource {
        MockSource {
            origin: Origin::File(path.into()),
            node_name: None,
        }
    }

    /// The same topology as seen on node `node_name`: every GPU and MIG-device UUID is replaced by
    /// a stable one derived from the node name ([`crate::node_identity::for_node`]).
    pub fn for_node(mut self, node_name: impl Into<String>) -> MockSource {
        self.node_name = Some(node_name.into());
        self
    }

    fn read_file_inventory(&self) -> Result<GpuInventory, SourceError> {
        match &self.origin {
            Origin::Shipped(name, text) => {
                parse_topology(&format!("<shipped topology {name}>"), text)
            }
            Origin::File(path) => {
                let text =
                    std::fs::read_to_string(path).map_err(|source| SourceError::ReadTopology {
                        path: path.clone(),
                        source,
                    })?;
                parse_topology(&path.display().to_string(), &text)
            }
        }
    }
}

impl DeviceSource for MockSource {
    fn inventory(&self) -> Result<GpuInventory, SourceError> {
        let inventory = self.read_file_inventory()?;
        Ok(match &self.node_name {
            Some(node_name) => node_identity::for_node(inventory, node_name),
            None => inventory,
        })
    }

    fn describe(&self) -> String {
        let topology = match &self.origin {
            Origin::Shipped(name, _) => format!("mock topology {name}"),
            Origin::File(path) => format!("mock topology file {}", path.display()),
        };
        match &self.node_name {
            Some(node_name) => format!("{topology} (UUIDs of node {node_name})"),
            None => topology,
        }
    }
}
