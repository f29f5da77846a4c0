//! Kubernetes quantities (`resource.Quantity`), exact to the nano, as the API server stores them.
//! The project's one quantity parser: CEL's `quantity()` library, the allocator's counters and
//! consumable capacity, and config values (`quantity_bytes`) all parse here.
//!
//! Parsing follows `k8s.io/apimachinery/pkg/api/resource.ParseQuantity`: a signed decimal number,
//! then a binary suffix (`Ki` … `Ei`), a decimal suffix (`n`, `u`, `m`, `k`, `M`, `G`, `T`, `P`,
//! `E`) or a decimal exponent (`e3`, `E-2`). Precision finer than a nano is rounded away from
//! zero and binary quantities are capped at 2^63-1, exactly as upstream does.
//!
//! Values are exact whole numbers of nanos in an `i128`: up to ±1.7·10^29. Upstream's decimal
//! quantities are unbounded; larger ones are refused here with an error saying so.

use std::cmp::Ordering;
use std::fmt;

/// Upstream's error text for a string that is not a quantity at all.
const FORMAT_WRONG: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
/// Upstream's error text for an unknown suffix.
const SUFFIX_WRONG: &str = "unable to parse quantity's suffix";

/// Error text for a decimal quantity too large to represent here.
const OUT_OF_RANGE: &str = "quantity is out of the supported range (magnitude above 1.7e29)";

const NANOS_PER_UNIT: i128 = 1_000_000_000;
/// Upstream caps binary-suffixed magnitudes at the largest int64.
const MAX_BINARY_MAGNITUDE_NANOS: u128 = (i64::MAX as u128) * 1_000_000_000;

/// Why a string is not a Kubernetes quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct QuantityError {
    message: &'static str,
}

/// A Kubernetes quantity as an exact number of nano-units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    nanos: i128,
}

impl Quantity {
    /// Parses a quantity such as `80Gi`, `1500m`, `1e3` or `0.5`.
    pub fn parse(text: &str) -> Result<Quantity, QuantityError> {
        let wrong = QuantityError {
            message: FORMAT_WRONG,
        };
        let (negative, rest) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            Some(_) => (false, text),
            None => return Err(wrong),
        };
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_end);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(wrong);
        }
        let multiplier = Multiplier::parse(suffix)?;
        let magnitude = Magnitude::new(whole, fraction, multiplier).nanos();
        let magnitude = if multiplier.binary_exponent > 0 {
            Some(magnitude.map_or(MAX_BINARY_MAGNITUDE_NANOS, |m| {
                m.min(MAX_BINARY_MAGNITUDE_NANOS)
            }))
        } else {
            magnitude
        };
        let nanos = magnitude
            .and_then(|m| i128::try_from(m).ok())
            .ok_or(QuantityError {
                message: OUT_OF_RANGE,
            })?;
        Ok(Quantity {
            nanos: if negative { -nanos } else { nanos },
        })
    }

    /// The quantity of a whole number.
    pub fn from_integer(value: i64) -> Quantity {
        Quantity {
            nanos: i128::from(value) * NANOS_PER_UNIT,
        }
    }

    /// The value in nano-units (`1` is `1000000000`).
    pub fn nanos(self) -> i128 {
        self.nanos
    }

    /// `-1`, `0` or `1`.
    pub fn sign(self) -> i64 {
        match self.nanos.cmp(&0) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        }
    }

    /// The value as an `i64`, if it is a whole number in range (upstream `AsInt64`).
    pub fn as_integer(self) -> Option<i64> {
        if self.nanos % NANOS_PER_UNIT != 0 {
            return None;
        }
        i64::try_from(self.nanos / NANOS_PER_UNIT).ok()
    }

    /// The nearest `f64` (upstream `AsApproximateFloat64`).
    pub fn as_approximate_float(self) -> f64 {
        let units = self.nanos / NANOS_PER_UNIT;
        let rest = self.nanos % NANOS_PER_UNIT;
        units as f64 + rest as f64 / NANOS_PER_UNIT as f64
    }

    /// `self + other`, or `None` if the sum leaves the representable range.
    pub fn checked_add(self, other: Quantity) -> Option<Quantity> {
        self.nanos
            .checked_add(other.nanos)
            .map(|nanos| Quantity { nanos })
    }

    /// `self - other`, or `None` if the difference leaves the representable range.
    pub fn checked_sub(self, other: Quantity) -> Option<Quantity> {
        self.nanos
            .checked_sub(other.nanos)
            .map(|nanos| Quantity { nanos })
    }
}

impl fmt::Display for Quantity {
    /// A canonical decimal form (`1073741824`, `0.5`, `-1.000000001`), not upstream's suffixed one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.nanos < 0 { "-" } else { "" };
        let magnitude = self.nanos.unsigned_abs();
        let units = magnitude / NANOS_PER_UNIT as u128;
        let rest = magnitude % NANOS_PER_UNIT as u128;
        if rest == 0 {
            write!(f, "{sign}{units}")
        } else {
            let fraction = format!("{rest:09}");
            write!(f, "{sign}{units}.{}", fraction.trim_end_matches('0'))
        }
    }
}

/// What the suffix multiplies the number by: `2^binary_exponent · 10^decimal_exponent`.
#[derive(Debug, Clone, Copy)]
struct Multiplier {
    binary_exponent: u32,
    decimal_exponent: i64,
}

impl Multiplier {
    fn parse(suffix: &str) -> Result<Multiplier, QuantityError> {
        let binary = |binary_exponent| Multiplier {
            binary_exponent,
            decimal_exponent: 0,
        };
        let decimal = |decimal_exponent| Multiplier {
            binary_exponent: 0,
            decimal_exponent,
        };
        Ok(match suffix {
            "Ki" => binary(10),
            "Mi" => binary(20),
            "Gi" => binary(30),
            "Ti" => binary(40),
            "Pi" => binary(50),
            "Ei" => binary(60),
            "n" => decimal(-9),
            "u" => decimal(-6),
            "m" => decimal(-3),
            "" => decimal(0),
            "k" => decimal(3),
            "M" => decimal(6),
            "G" => decimal(9),
            "T" => decimal(12),
            "P" => decimal(15),
            "E" => decimal(18),
            _ => decimal(Self::exponent(suffix)?),
        })
    }

    /// `e<int>` / `E<int>`: a decimal exponent.
    fn exponent(suffix: &str) -> Result<i64, QuantityError> {
        let digits = suffix.strip_prefix(['e', 'E']).ok_or(QuantityError {
            message: SUFFIX_WRONG,
        })?;
        let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
        let valid = !unsigned.is_empty()
            && unsigned.len() <= 10
            && unsigned.bytes().all(|b| b.is_ascii_digit());
        if !valid {
            return Err(QuantityError {
                message: FORMAT_WRONG,
            });
        }
        digits.parse::<i64>().map_err(|_| QuantityError {
            message: FORMAT_WRONG,
        })
    }
}

/// The exact magnitude `digits · 10^-fraction_len · multiplier`, computed in nanos and rounded
/// up like upstream: in `u128` arithmetic for ordinary quantities, with a small base-10^9 big
/// integer for long digit strings and large exponents.
struct Magnitude<'a> {
    whole: &'a str,
    fraction: &'a str,
    /// Power of ten applied to the digits to get nanos.
    nano_exponent: i64,
    binary_exponent: u32,
}

impl<'a> Magnitude<'a> {
    fn new(whole: &'a str, fraction: &'a str, multiplier: Multiplier) -> Magnitude<'a> {
        Magnitude {
            whole,
            fraction,
            nano_exponent: multiplier.decimal_exponent + 9 - fraction.len() as i64,
            binary_exponent: multiplier.binary_exponent,
        }
    }

    /// The significant digits: `whole` and `fraction` together, leading zeros removed.
    fn digits(&self) -> impl Iterator<Item = u8> + '_ {
        self.whole
            .bytes()
            .chain(self.fraction.bytes())
            .skip_while(|b| *b == b'0')
            .map(|b| b - b'0')
    }

    /// The magnitude in nanos, `None` if it does not fit a `u128`.
    fn nanos(&self) -> Option<u128> {
        let count = self.digits().count() as i64;
        if count == 0 {
            return Some(0);
        }
        // The value in nanos lies within [10^(count-1+e), 10^(count+e+19)) (2^60 < 10^19).
        if count - 1 + self.nano_exponent > 40 {
            return None;
        }
        if count + self.nano_exponent + 19 < 0 {
            // Far below one nano: rounded up to one.
            return Some(1);
        }
        if count <= 30 && (-38..=38).contains(&self.nano_exponent) {
            return self.nanos_in_u128();
        }
        self.nanos_in_big_integer()
    }

    /// At most 30 digits (< 10^30) and an exponent within ±38: `u128` arithmetic suffices, its
    /// overflow meaning what the big integer's would.
    fn nanos_in_u128(&self) -> Option<u128> {
        let digits = self.digits().fold(0u128, |n, d| n * 10 + u128::from(d));
        let scaled = digits.checked_mul(1u128 << self.binary_exponent)?;
        let exponent = self.nano_exponent.unsigned_abs() as u32;
        if self.nano_exponent >= 0 {
            scaled.checked_mul(10u128.pow(exponent))
        } else {
            let divisor = 10u128.pow(exponent);
            Some(scaled / divisor + u128::from(scaled % divisor != 0))
        }
    }

    fn nanos_in_big_integer(&self) -> Option<u128> {
        let mut number = BigUint::from_digits(self.digits());
        for _ in 0..self.binary_exponent / 10 {
            number.mul_small(1024);
        }
        let mut inexact = false;
        if self.nano_exponent >= 0 {
            for _ in 0..self.nano_exponent {
                number.mul_small(10);
            }
        } else {
            for _ in 0..-self.nano_exponent {
                inexact |= number.div_small(10) != 0;
            }
        }
        number.to_u128()?.checked_add(u128::from(inexact))
    }
}

/// An unsigned big integer in base 10^9, least significant limb first: just enough arithmetic to
/// parse quantities exactly.
struct BigUint {
    limbs: Vec<u32>,
}

const LIMB_BASE: u64 = 1_000_000_000;

impl BigUint {
    fn from_digits(digits: impl Iterator<Item = u8>) -> BigUint {
        let mut number = BigUint { limbs: vec![0] };
        for digit in digits {
            number.mul_small(10);
            number.add_small(u32::from(digit));
        }
        number
    }

    fn mul_small(&mut self, factor: u32) {
        let mut carry = 0u64;
        for limb in &mut self.limbs {
            let product = u64::from(*limb) * u64::from(factor) + carry;
            *limb = (product % LIMB_BASE) as u32;
            carry = product / LIMB_BASE;
        }
        while carry > 0 {
            self.limbs.push((carry % LIMB_BASE) as u32);
            carry /= LIMB_BASE;
        }
    }

    fn add_small(&mut self, addend: u32) {
        let mut carry = u64::from(addend);
        for limb in &mut self.limbs {
            if carry == 0 {
                return;
            }
            let sum = u64::from(*limb) + carry;
            *limb = (sum % LIMB_BASE) as u32;
            carry = sum / LIMB_BASE;
        }
        if carry > 0 {
            self.limbs.push(carry as u32);
        }
    }

    /// Divides in place and returns the remainder.
    fn div_small(&mut self, divisor: u32) -> u32 {
        let mut remainder = 0u64;
        for limb in self.limbs.iter_mut().rev() {
            let current = remainder * LIMB_BASE + u64::from(*limb);
            *limb = (current / u64::from(divisor)) as u32;
            remainder = current % u64::from(divisor);
        }
        while self.limbs.len() > 1 && self.limbs.last() == Some(&0) {
            self.limbs.pop();
        }
        remainder as u32
    }

    fn to_u128(&self) -> Option<u128> {
        self.limbs.iter().rev().try_fold(0u128, |acc, limb| {
            acc.checked_mul(u128::from(LIMB_BASE as u32))?
                .checked_add(u128::from(*limb))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nanos(text: &str) -> i128 {
        Quantity::parse(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .nanos()
    }

    #[test]
    fn parses_every_suffix_exactly() {
        let unit = NANOS_PER_UNIT;
        let cases: &[(&str, i128)] = &[
            ("0", 0),
            ("1", unit),
            ("+1", unit),
            ("-1", -unit),
            ("1Ki", 1024 * unit),
            ("1Mi", (1 << 20) * unit),
            ("80Gi", 80 * (1 << 30) * unit),
            ("1Ti", (1 << 40) * unit),
            ("1Pi", (1 << 50) * unit),
            ("1Ei", (1 << 60) * unit),
            ("1n", 1),
            ("1u", 1_000),
            ("1500m", 1_500_000_000),
            ("1k", 1_000 * unit),
            ("1M", 1_000_000 * unit),
            ("1G", 1_000_000_000 * unit),
            ("1T", 1_000_000_000_000 * unit),
            ("1P", 1_000_000_000_000_000 * unit),
            ("1E", 1_000_000_000_000_000_000 * unit),
            ("1e3", 1_000 * unit),
            ("1E3", 1_000 * unit),
            ("1e-3", 1_000_000),
            ("1e+3", 1_000 * unit),
            ("0.5", 500_000_000),
            (".5", 500_000_000),
            ("5.", 5 * unit),
            ("1.5Ki", 1536 * unit),
            ("0.1n", 1),
            ("-0.1n", -1),
            ("1.0000000001", unit + 1),
            ("0001", unit),
            (
                "123456789012345678901234567890",
                123456789012345678901234567890 * unit,
            ),
            (
                "1234567890123456789.0123456789",
                1234567890123456789012345679,
            ),
            ("0.0000000000000000000000000000000000000001", 1),
            ("12.5e-1", 1_250_000_000),
        ];
        for (text, expected) in cases {
            assert_eq!(nanos(text), *expected, "{text}");
        }
    }

    #[test]
    fn the_fast_path_agrees_with_the_big_integer_path() {
        for text in [
            "1",
            "1.5",
            "80Gi",
            "1500m",
            "0.1n",
            "1e20",
            "123.456e-7",
            "99999999999999999999Ki",
            "7.5e-30",
            "1.0000000001",
        ] {
            let number_end = text
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(text.len());
            let (number, suffix) = text.split_at(number_end);
            let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
            let magnitude = Magnitude::new(whole, fraction, Multiplier::parse(suffix).unwrap());
            assert_eq!(
                magnitude.nanos_in_u128(),
                magnitude.nanos_in_big_integer(),
                "{text}"
            );
        }
    }

    #[test]
    fn caps_binary_quantities_at_the_largest_int64_like_upstream() {
        let cap = i128::from(i64::MAX) * NANOS_PER_UNIT;
        assert_eq!(nanos("100Ei"), cap);
        assert_eq!(nanos("-100Ei"), -cap);
        assert_eq!(nanos("8Ei"), cap);
        assert_eq!(nanos("99999999999999999999999999999999999999999999Ki"), cap);
        // Decimal quantities are not capped.
        assert_eq!(
            nanos("9223372036854775808"),
            (cap / NANOS_PER_UNIT + 1) * NANOS_PER_UNIT
        );
        assert_eq!(nanos("1e-999"), 1);
    }

    #[test]
    fn refuses_decimal_quantities_beyond_the_supported_range() {
        assert!(Quantity::parse("1e29").is_ok());
        for text in [
            "1e30",
            "-1e30",
            "1e999",
            "9999999999999999999999999999999999999G",
        ] {
            assert_eq!(
                Quantity::parse(text).unwrap_err().to_string(),
                OUT_OF_RANGE,
                "{text}"
            );
        }
    }

    #[test]
    fn rejects_what_upstream_rejects() {
        for text in [
            "",
            "-",
            "+",
            ".",
            "..",
            "1..",
            "1.2.3",
            "abc",
            "1Z",
            "1KiB",
            " 1",
            "1 ",
            "1e",
            "1e+",
            "Ki",
            "1ki",
            "1e99999999999",
        ] {
            assert!(Quantity::parse(text).is_err(), "{text:?} parsed");
        }
    }

    #[test]
    fn arithmetic_and_conversions() {
        let q = |t| Quantity::parse(t).unwrap();
        assert_eq!(q("1Gi"), q("1024Mi"));
        assert!(q("1Mi") > q("1M"));
        assert_eq!(q("1").checked_add(q("500m")).unwrap(), q("1.5"));
        assert_eq!(q("1").checked_sub(q("2")).unwrap().sign(), -1);
        assert_eq!(q("1Ki").as_integer(), Some(1024));
        assert_eq!(q("1500m").as_integer(), None);
        assert_eq!(q("100Ei").as_integer(), Some(i64::MAX));
        assert_eq!(q("9223372036854775808").as_integer(), None);
        assert_eq!(q("1500m").as_approximate_float(), 1.5);
        assert_eq!(q("1.5Ki").to_string(), "1536");
        assert_eq!(q("-1.25").to_string(), "-1.25");
        assert_eq!(Quantity::from_integer(3), q("3"));
    }
}
