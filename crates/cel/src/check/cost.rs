//! The static cost estimate: an upper bound of the evaluation cost in cel-go's units, where the
//! sizes of the values involved are known (literals, and what the API allows a device to carry).

use super::Ty;

/// An upper bound of a cost, or unbounded when it depends on a size nothing bounds statically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cost(Option<u64>);

impl Cost {
    pub(crate) const fn known(units: u64) -> Cost {
        Cost(Some(units))
    }

    pub(crate) const UNBOUNDED: Cost = Cost(None);

    /// The bound, or `None` when unbounded.
    pub(crate) fn bound(self) -> Option<u64> {
        self.0
    }

    pub(crate) fn plus(self, units: u64) -> Cost {
        self.add(Cost::known(units))
    }

    pub(crate) fn add(self, other: Cost) -> Cost {
        match (self.0, other.0) {
            (Some(a), Some(b)) => Cost(Some(a.saturating_add(b))),
            _ => Cost::UNBOUNDED,
        }
    }

    /// This cost paid once per element of something of `size`.
    pub(crate) fn times(self, size: Size) -> Cost {
        match (self.0, size) {
            (Some(0), _) => Cost::known(0),
            (Some(units), Size::Known(n)) => Cost(Some(units.saturating_mul(n))),
            _ => Cost::UNBOUNDED,
        }
    }
}

/// An upper bound of a value's size (string length, list or map entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Size {
    Known(u64),
    Unknown,
}

impl Size {
    pub(crate) fn max(self, other: Size) -> Size {
        match (self, other) {
            (Size::Known(a), Size::Known(b)) => Size::Known(a.max(b)),
            _ => Size::Unknown,
        }
    }

    fn scaled(self, numerator: u64, denominator: u64) -> Cost {
        match self {
            Size::Known(n) => Cost::known(1 + n.saturating_mul(numerator).div_ceil(denominator)),
            Size::Unknown => Cost::UNBOUNDED,
        }
    }
}

/// What the checker knows about one expression.
#[derive(Debug, Clone)]
pub(crate) struct Info {
    pub ty: Ty,
    pub cost: Cost,
    pub size: Size,
    /// Size bound of the elements (or map keys) of this value, what an iteration variable gets.
    pub elements: Size,
}

impl Info {
    pub(crate) fn new(ty: Ty, cost: Cost, size: Size) -> Info {
        Info {
            ty,
            cost,
            size,
            elements: Size::Unknown,
        }
    }

    pub(crate) fn with_elements(mut self, elements: Size) -> Info {
        self.elements = elements;
        self
    }

    pub(crate) fn with_cost(mut self, cost: Cost) -> Info {
        self.cost = cost;
        self
    }
}

/// The cost of the call itself beyond one unit, from the sizes of its receiver and arguments
/// (`infos[0]` is the receiver of a member call).
pub(crate) fn call_cost(name: &str, infos: &[Info]) -> Cost {
    let size = |i: usize| infos.get(i).map_or(Size::Known(0), |info| info.size);
    match name {
        // Traversals of the receiver string or list.
        "contains" | "startsWith" | "endsWith" | "charAt" | "indexOf" | "lastIndexOf"
        | "lowerAscii" | "upperAscii" | "replace" | "split" | "substring" | "trim" | "join"
        | "format" | "strings.quote" | "quantity" | "isQuantity" | "semver" | "isSemver" => {
            size(0).scaled(1, 10)
        }
        "isSorted" | "sum" | "min" | "max" | "@iterkeys" => size(0).scaled(1, 1),
        "matches" | "find" | "findAll" => match (size(0), size(1)) {
            (Size::Known(text), Size::Known(pattern)) => {
                Cost::known((1 + text.div_ceil(10)).saturating_mul(1 + pattern.div_ceil(4)))
            }
            _ => Cost::UNBOUNDED,
        },
        "sets.contains" | "sets.equivalent" | "sets.intersects" => match (size(0), size(1)) {
            (Size::Known(a), Size::Known(b)) => Cost::known(1 + a.saturating_mul(b)),
            _ => Cost::UNBOUNDED,
        },
        "includes" => Cost::known(48),
        _ => Cost::known(0),
    }
}

/// Bound of the size of the call's result, where it follows from its inputs.
pub(crate) fn result_size(name: &str, infos: &[Info]) -> Size {
    let size = |i: usize| infos.get(i).map_or(Size::Unknown, |info| info.size);
    match name {
        "@iterkeys" | "split" | "findAll" | "lowerAscii" | "upperAscii" | "trim" | "substring"
        | "charAt" | "find" => size(0),
        "size" | "int" | "uint" | "double" | "bool" | "sign" | "asInteger" | "major" | "minor"
        | "patch" | "compareTo" | "indexOf" | "lastIndexOf" => Size::Known(1),
        _ => Size::Unknown,
    }
}
