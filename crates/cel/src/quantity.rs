//! The CEL value of a Kubernetes quantity. Parsing and arithmetic are `tessera_api::quantity`'s,
//! the project's one implementation (upstream's rounding); the newtype exists because the
//! interpreter's value traits can only be implemented for this crate's own types.

use std::fmt;

pub use tessera_api::quantity::QuantityError;

/// A Kubernetes quantity as a CEL value (`kubernetes.Quantity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QuantityValue(tessera_api::quantity::Quantity);

impl QuantityValue {
    /// Parses a quantity such as `80Gi`, `1500m`, `1e3` or `0.5`.
    pub fn parse(text: &str) -> Result<QuantityValue, QuantityError> {
        tessera_api::quantity::Quantity::parse(text).map(QuantityValue)
    }

    /// The quantity of a whole number.
    pub fn from_integer(value: i64) -> QuantityValue {
        QuantityValue(tessera_api::quantity::Quantity::from_integer(value))
    }

    /// The value in nano-units (`1` is `1000000000`).
    pub fn nanos(self) -> i128 {
        self.0.nanos()
    }

    /// `-1`, `0` or `1`.
    pub fn sign(self) -> i64 {
        self.0.sign()
    }

    /// The value as an `i64`, if it is a whole number in range (upstream `AsInt64`).
    pub fn as_integer(self) -> Option<i64> {
        self.0.as_integer()
    }

    /// The nearest `f64` (upstream `AsApproximateFloat64`).
    pub fn as_approximate_float(self) -> f64 {
        self.0.as_approximate_float()
    }

    /// `self + other`, or `None` if the sum leaves the representable range.
    pub fn checked_add(self, other: QuantityValue) -> Option<QuantityValue> {
        self.0.checked_add(other.0).map(QuantityValue)
    }

    /// `self - other`, or `None` if the difference leaves the representable range.
    pub fn checked_sub(self, other: QuantityValue) -> Option<QuantityValue> {
        self.0.checked_sub(other.0).map(QuantityValue)
    }
}

impl fmt::Display for QuantityValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
