//! Why an inventory could not be rendered into slices.

use super::check::Violation;
use crate::validate::InventoryProblem;

/// Why an inventory could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The inventory breaks its consistency rules.
    #[error("the inventory is inconsistent:\n{}", list(.0))]
    InvalidInventory(Vec<InventoryProblem>),

    /// A render option has a value the API would refuse.
    #[error("render option `{option}`: {message}")]
    InvalidOption {
        option: &'static str,
        message: String,
    },

    /// In the 1.34 combined form one GPU's counter set and devices must share a slice, and they
    /// do not fit one.
    #[error(
        "the devices of {gpu} do not fit one ResourceSlice ({reason}); with dynamic MIG on a 1.34 server a GPU's counter set and its devices must share a slice — target 1.35+ or turn dynamic MIG off"
    )]
    GpuDoesNotFitInSlice { gpu: String, reason: String },

    /// A rendered slice breaks the API limits (a bug in the renderer or an unusual inventory).
    #[error(
        "rendered slice {slice} would be refused by the API server:\n{}",
        list(violations)
    )]
    InvalidSlice {
        slice: String,
        violations: Vec<Violation>,
    },

    /// The rendered slices are inconsistent as a pool.
    #[error("rendered pool would be unusable:\n{}", list(.0))]
    InvalidPool(Vec<Violation>),
}

fn list<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| format!("  - {i}"))
        .collect::<Vec<_>>()
        .join("\n")
}
