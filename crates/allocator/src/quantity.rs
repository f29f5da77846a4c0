//! Exact arithmetic on Kubernetes quantities (`resource.Quantity`), as far as the allocator needs
//! it: counters and consumable capacity are added, subtracted, compared and rounded up to a step.
//!
//! An [`Amount`] holds a quantity in nano-units in an `i128`, which is exact for every suffix the
//! API accepts (`n` … `E`, `Ki` … `Ei`) and for values up to about 10^29.

use std::fmt;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A quantity in nano-units (10^-9), exact for all API suffixes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Amount(i128);

/// A string that is not a Kubernetes quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a quantity ({why}); write e.g. \"4\", \"500m\", \"80Gi\" or \"1e3\"")]
pub struct QuantityError {
    /// The rejected text.
    pub text: String,
    /// What is wrong with it.
    pub why: &'static str,
}

const NANO: i128 = 1_000_000_000;

impl Amount {
    /// Zero.
    pub const ZERO: Amount = Amount(0);

    /// Parses the Kubernetes quantity syntax: `[+-]digits[.digits][suffix]` where the suffix is a
    /// binary SI suffix (`Ki`…`Ei`), a decimal SI suffix (`n u m k M G T P E`) or an exponent
    /// (`e3`, `E-2`).
    pub fn parse(text: &str) -> Result<Amount, QuantityError> {
        let err = |why| QuantityError {
            text: text.to_owned(),
            why,
        };
        let s = text.trim();
        let (negative, s) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            Some(_) => (false, s),
            None => return Err(err("empty")),
        };
        let number_end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, suffix) = s.split_at(number_end);
        if number.is_empty() || number == "." {
            return Err(err("no digits"));
        }
        let (int_part, frac_part) = match number.split_once('.') {
            Some((i, f)) => (i, f),
            None => (number, ""),
        };
        if frac_part.contains('.') {
            return Err(err("more than one decimal point"));
        }
        // mantissa = digits as integer, scaled by 10^-frac_len.
        let mut mantissa: i128 = 0;
        for c in int_part.chars().chain(frac_part.chars()) {
            let digit = i128::from(c as u8 - b'0');
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(digit))
                .ok_or_else(|| err("too large"))?;
        }
        let frac_len = i32::try_from(frac_part.len()).map_err(|_| err("too many digits"))?;
        // value in nano-units = mantissa * multiplier * 10^9 / 10^frac_len
        let (numerator, exp10) = suffix_scale(suffix)
            .ok_or_else(|| err("unknown suffix"))?
            .map_err(err)?;
        let shift = exp10 + 9 - frac_len;
        let scaled = mantissa
            .checked_mul(numerator)
            .ok_or_else(|| err("too large"))?;
        let value = if shift >= 0 {
            let factor = 10i128
                .checked_pow(shift.unsigned_abs())
                .ok_or_else(|| err("too large"))?;
            scaled.checked_mul(factor).ok_or_else(|| err("too large"))?
        } else {
            // Finer than a nano-unit: Kubernetes rounds up to its smallest unit too.
            let divisor = 10i128
                .checked_pow(shift.unsigned_abs())
                .ok_or_else(|| err("too small"))?;
            (scaled + divisor - 1) / divisor
        };
        Ok(Amount(if negative { -value } else { value }))
    }

    /// Parses a k8s-openapi [`Quantity`].
    pub fn from_quantity(q: &Quantity) -> Result<Amount, QuantityError> {
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

/// The multiplier a suffix stands for: a binary factor and a power of ten (`Err` for a malformed
/// exponent, `None` for an unknown suffix).
fn suffix_scale(suffix: &str) -> Option<Result<(i128, i32), &'static str>> {
    let scale = match suffix {
        "" => (1, 0),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        other => {
            let exp = other
                .strip_prefix('e')
                .or_else(|| other.strip_prefix('E'))?;
            return Some(
                exp.parse::<i32>()
                    .map(|e| (1, e))
                    .map_err(|_| "bad exponent"),
            );
        }
    };
    Some(Ok(scale))
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
