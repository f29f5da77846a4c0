//! Exact arithmetic on Kubernetes quantities (`resource.Quantity`), as far as the allocator needs
//! it: counters and consumable capacity are added, subtracted, compared and rounded up to a step.
//!
//! An [`Amount`] holds a quantity in nano-units in an `i128`, which is exact for every suffix the
//! API accepts (`n` … `E`, `Ki` … `Ei`) and for values up to about 10^29. Parsing is
//! `tessera_api::quantity`'s; this module adds the saturating arithmetic and the canonical text the
//! allocator writes.

use std::fmt;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A quantity in nano-units (10^-9), exact for all API suffixes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Amount(i128);

/// A string that is not a Kubernetes quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a quantity ({why}); write e.g. \"4\", \"500m\", \"80Gi\" or \"1e3\"")]
pub struct InvalidQuantity {
    /// The rejected text.
    pub text: String,
    /// What is wrong with it, in upstream's words.
    pub why: tessera_api::quantity::QuantityError,
}

const NANO: i128 = 1_000_000_000;

impl Amount {
    /// Zero.
    pub const ZERO: Amount = Amount(0);

    /// Parses the Kubernetes quantity syntax with upstream's rounding (finer than a nano rounds
    /// away from zero, binary quantities cap at 2^63-1), by the project's one parser
    /// ([`tessera_api::quantity`]).
    pub fn parse(text: &str) -> Result<Amount, InvalidQuantity> {
        tessera_api::quantity::Quantity::parse(text)
            .map(|q| Amount(q.nanos()))
            .map_err(|why| InvalidQuantity {
                text: text.to_owned(),
                why,
            })
    }

    /// Parses a k8s-openapi [`Quantity`].
    pub fn from_quantity(q: &Quantity) -> Result<Amount, InvalidQuantity> {
        Amount::parse(&q.0)
    }

    /// A whole number of units.
    pub fn from_units(units: i64) -> Amount {
        Amount(i128::from(units) * NANO)
    }

    /// The value rounded up to whole units, like `resource.Quantity.Value()`.
    pub fn ceil_units(self) -> i128 {
        self.0.div_euclid(NANO) + i128::from(self.0.rem_euclid(NANO) != 0)
    }

    /// The raw value in nano-units.
    pub fn nanos(self) -> i128 {
        self.0
    }

    /// A value in nano-units.
    pub fn from_nanos(nanos: i128) -> Amount {
        Amount(nanos)
    }

    /// Whether this is a whole number of units.
    pub fn is_whole(self) -> bool {
        self.0 % NANO == 0
    }

    /// Sum, saturating at the representable range.
    pub fn saturating_add(self, other: Amount) -> Amount {
        Amount(self.0.saturating_add(other.0))
    }

    /// Difference, saturating at the representable range.
    pub fn saturating_sub(self, other: Amount) -> Amount {
        Amount(self.0.saturating_sub(other.0))
    }

    /// The canonical text Kubernetes would print for this value in binary SI form (`4`, `2Ki`,
    /// `3Gi`), or in decimal form with the `m`/`n` suffix for fractions.
    pub fn to_quantity(self) -> Quantity {
        Quantity(self.to_string())
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_whole() {
            let units = self.0 / NANO;
            const SUFFIXES: [&str; 6] = ["Ei", "Pi", "Ti", "Gi", "Mi", "Ki"];
            if units != 0 {
                for (i, suffix) in SUFFIXES.iter().enumerate() {
                    let factor = 1i128 << (10 * (6 - i));
                    if units % factor == 0 {
                        return write!(f, "{}{suffix}", units / factor);
                    }
                }
            }
            return write!(f, "{units}");
        }
        if self.0 % 1_000_000 == 0 {
            return write!(f, "{}m", self.0 / 1_000_000);
        }
        if self.0 % 1_000 == 0 {
            return write!(f, "{}u", self.0 / 1_000);
        }
        write!(f, "{}n", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amount(s: &str) -> Amount {
        Amount::parse(s).unwrap()
    }

    #[test]
    fn parses_every_suffix_family_exactly() {
        assert_eq!(amount("1Gi"), Amount::from_units(1 << 30));
        assert_eq!(amount("1.5Gi"), Amount::from_units(3 << 29));
        assert_eq!(amount("500m").0, 500_000_000);
        assert_eq!(amount("2k"), Amount::from_units(2000));
        assert_eq!(amount("1e3"), Amount::from_units(1000));
        assert_eq!(amount("1E-3").0, 1_000_000);
        assert_eq!(amount("-4"), Amount::from_units(-4));
        assert_eq!(amount("+4"), Amount::from_units(4));
        assert_eq!(amount("0.5"), amount("500m"));
        assert_eq!(amount("80Gi"), amount("81920Mi"));
        assert_eq!(amount("1n").0, 1);
    }

    #[test]
    fn rejects_what_is_not_a_quantity() {
        for bad in ["", "Gi", "1.2.3", "1Xi", "abc", "1e", "."] {
            let e = Amount::parse(bad).unwrap_err();
            assert_eq!(e.text, bad);
        }
    }

    #[test]
    fn formats_canonically() {
        assert_eq!(Amount::from_units(4).to_string(), "4");
        assert_eq!(Amount::from_units(2048).to_string(), "2Ki");
        assert_eq!(Amount::from_units(3 << 30).to_string(), "3Gi");
        assert_eq!(Amount::from_units(3000).to_string(), "3000");
        assert_eq!(Amount::from_units(0).to_string(), "0");
        assert_eq!(amount("500m").to_string(), "500m");
        assert_eq!(amount("1500u").to_string(), "1500u");
    }

    #[test]
    fn ceil_units_rounds_up_like_value() {
        assert_eq!(amount("1500m").ceil_units(), 2);
        assert_eq!(amount("2").ceil_units(), 2);
        assert_eq!(amount("-1500m").ceil_units(), -1);
    }
}
