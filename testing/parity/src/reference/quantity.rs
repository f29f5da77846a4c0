//! Kubernetes quantities as exact nano-units, written for the reference alone (it shares no
//! code with Tessera's quantity parser): an optional sign, decimal digits with an optional
//! fraction, and one suffix (`n`, `u`, `m`, none, `k`, `M`, `G`, `T`, `P`, `E`, `Ki` … `Ei`).
//! Exponent notation and values that are not whole nano-units are refused: the generator never
//! writes them, and an instance holding one is beyond the reference's reach.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A quantity in units of 10⁻⁹.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(pub i128);

const NANO: i128 = 1_000_000_000;

impl Nanos {
    pub const ZERO: Nanos = Nanos(0);

    /// Parses `text`; `None` for what the reference does not read.
    pub fn parse(text: &str) -> Option<Nanos> {
        let (negative, rest) = match text.as_bytes().first()? {
            b'-' => (true, &text[1..]),
            b'+' => (false, &text[1..]),
            _ => (false, text),
        };
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(end);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return None;
        }
        // value = digits / 10^fraction_len × multiplier, kept as numerator / denominator.
        let digits: i128 = format!("{whole}{fraction}").parse().ok()?;
        let mut numerator = digits.checked_mul(NANO)?;
        let mut denominator: i128 = 10i128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
        match suffix {
            "n" => denominator = denominator.checked_mul(NANO)?,
            "u" => denominator = denominator.checked_mul(1_000_000)?,
            "m" => denominator = denominator.checked_mul(1_000)?,
            _ => numerator = numerator.checked_mul(multiplier(suffix)?)?,
        }
        if numerator % denominator != 0 {
            return None;
        }
        let value = numerator / denominator;
        Some(Nanos(if negative { -value } else { value }))
    }

    /// Parses a quantity object.
    pub fn of(q: &Quantity) -> Option<Nanos> {
        Nanos::parse(&q.0)
    }

    /// The smallest whole number not below this value (upstream's `Quantity.Value()` for the
    /// non-negative values the reference computes with).
    pub fn ceil_units(self) -> i128 {
        self.0.div_euclid(NANO) + i128::from(self.0.rem_euclid(NANO) != 0)
    }

    /// A whole number of units.
    pub fn units(units: i128) -> Nanos {
        Nanos(units * NANO)
    }

    /// The value as a quantity string (an integer when whole, else nano-units).
    pub fn to_quantity(self) -> Quantity {
        if self.0 % NANO == 0 {
            Quantity((self.0 / NANO).to_string())
        } else {
            Quantity(format!("{}n", self.0))
        }
    }
}

impl std::ops::Add for Nanos {
    type Output = Nanos;
    fn add(self, other: Nanos) -> Nanos {
        Nanos(self.0 + other.0)
    }
}

impl std::ops::Sub for Nanos {
    type Output = Nanos;
    fn sub(self, other: Nanos) -> Nanos {
        Nanos(self.0 - other.0)
    }
}

impl std::iter::Sum for Nanos {
    fn sum<I: Iterator<Item = Nanos>>(iter: I) -> Nanos {
        iter.fold(Nanos::ZERO, |a, b| a + b)
    }
}

fn multiplier(suffix: &str) -> Option<i128> {
    let binary = |power: u32| 1i128 << (10 * power);
    let decimal = |power: u32| 10i128.pow(3 * power);
    Some(match suffix {
        "" => 1,
        "k" => decimal(1),
        "M" => decimal(2),
        "G" => decimal(3),
        "T" => decimal(4),
        "P" => decimal(5),
        "E" => decimal(6),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_suffixes_exactly() {
        let n = |s: &str| Nanos::parse(s).map(|n| n.0);
        assert_eq!(n("1536Mi"), Some(1536 * (1 << 20) * NANO));
        assert_eq!(n("1Gi"), Some((1 << 30) * NANO));
        assert_eq!(n("2"), Some(2 * NANO));
        assert_eq!(n("1.5k"), Some(1500 * NANO));
        assert_eq!(n("250m"), Some(250_000_000));
        assert_eq!(n("-3"), Some(-3 * NANO));
        assert_eq!(n("7n"), Some(7));
        assert_eq!(n("0.5n"), None, "not a whole nano-unit");
        assert_eq!(n("1e3"), None, "exponents are beyond the reference");
        assert_eq!(n("1Xi"), None);
        assert_eq!(n(""), None);
        assert_eq!(n("."), None);
    }

    #[test]
    fn rounds_up_to_whole_units_like_value() {
        assert_eq!(Nanos::parse("1500m").unwrap().ceil_units(), 2);
        assert_eq!(Nanos::parse("2").unwrap().ceil_units(), 2);
        assert_eq!(Nanos::units(3).to_quantity().0, "3");
        assert_eq!(Nanos(5).to_quantity().0, "5n");
    }
}
