//! Consumable shares (KEP-5075, `DRAConsumableCapacity`): how a node publishes its GPUs so that
//! several claims can be allocated one device, each consuming part of its `memory` (and, in the
//! N-shares mode, of its `shares` capacity).
//!
//! The modes are those of NVIDIA's DRA driver (`--consumable-shares`), so that its users keep
//! their settings:
//!
//! | mode | `memory` request policy | `shares` capacity | a claim that asks for nothing gets |
//! |---|---|---|---|
//! | `disabled` | none (device not multi-allocatable) | none | the whole GPU, exclusively |
//! | `unlimited` | default 0, range 0…memory, step 1Mi | none | no memory: any number of claims |
//! | `memory` | default memory, range 1Mi…memory, step 1Mi | none | all of the memory (the whole GPU) |
//! | `N` | default 0, range 0…memory, step 1Mi | N, default 1, range 1…N, step 1 | one of N shares |
//!
//! No IO: the node plugin's flag, the chart and the renderer share this one definition.

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;

/// The granularity of `memory` requests on a shared device (NVIDIA's choice too).
pub const MEMORY_STEP_BYTES: u64 = 1 << 20;

/// Most shares one device can be split into (MPS allows at most 48 clients per GPU on Volta+;
/// a larger N could never run that many processes at once).
pub const MAX_SHARES: u32 = 48;

/// Environment variable telling a container how many bytes of device memory its claim consumed
/// on each shared device (comma-separated, in the order of `NVIDIA_VISIBLE_DEVICES`).
pub const ENV_MEMORY_LIMIT: &str = "TESSERA_GPU_MEMORY_LIMIT";
/// Environment variable telling a container how many shares its claim consumed on each shared
/// device (N-shares mode; comma-separated like [`ENV_MEMORY_LIMIT`]).
pub const ENV_SHARES: &str = "TESSERA_GPU_SHARES";
/// Environment variable with the number of shares each shared device is split into.
pub const ENV_SHARES_TOTAL: &str = "TESSERA_GPU_SHARES_TOTAL";

/// How a node's GPUs are published for sharing between claims.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ConsumableShares {
    /// Devices are allocated whole, to one claim (besides admin access).
    #[default]
    Disabled,
    /// Multi-allocatable; a claim consumes the memory it asks for, nothing if it asks for none.
    Unlimited,
    /// Multi-allocatable; a claim consumes the memory it asks for, all of it if it asks for none.
    Memory,
    /// Multi-allocatable in N equal shares (the device plugin's `replicas`); memory as in
    /// [`ConsumableShares::Unlimited`].
    Shares(NonZeroU32),
}

impl ConsumableShares {
    /// Whether devices are published with `allowMultipleAllocations: true`.
    pub fn enabled(self) -> bool {
        self != ConsumableShares::Disabled
    }

    /// The number of shares per device in the N-shares mode.
    pub fn shares(self) -> Option<u32> {
        match self {
            ConsumableShares::Shares(n) => Some(n.get()),
            _ => None,
        }
    }
}

impl fmt::Display for ConsumableShares {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConsumableShares::Disabled => f.write_str("disabled"),
            ConsumableShares::Unlimited => f.write_str("unlimited"),
            ConsumableShares::Memory => f.write_str("memory"),
            ConsumableShares::Shares(n) => write!(f, "{n}"),
        }
    }
}

/// A consumable-shares mode that is not one of the four.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "consumable shares `{0}` is not a mode: expected `disabled`, `unlimited`, `memory` or a number of shares from 1 to {MAX_SHARES}"
)]
pub struct ConsumableSharesError(pub String);

impl FromStr for ConsumableShares {
    type Err = ConsumableSharesError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "" | "disabled" => Ok(ConsumableShares::Disabled),
            "unlimited" => Ok(ConsumableShares::Unlimited),
            "memory" => Ok(ConsumableShares::Memory),
            text => text
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=MAX_SHARES).contains(n))
                .and_then(NonZeroU32::new)
                .map(ConsumableShares::Shares)
                .ok_or_else(|| ConsumableSharesError(s.to_owned())),
        }
    }
}

/// The active thread percentage that gives `consumed` of `total` shares its part of the GPU's
/// streaming multiprocessors under MPS: `100·consumed/total`, rounded down, at least 1.
pub fn thread_percentage(consumed: u64, total: u64) -> u8 {
    if total == 0 {
        return 100;
    }
    let pct = consumed.saturating_mul(100) / total;
    u8::try_from(pct.clamp(1, 100)).unwrap_or(100)
}

/// `bytes` rounded down to a whole number of [`MEMORY_STEP_BYTES`] (the published memory of a
/// shared device, so that its policy's `max` and `default` are step multiples as the API requires).
pub fn memory_rounded(bytes: u64) -> u64 {
    bytes / MEMORY_STEP_BYTES * MEMORY_STEP_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print_round_trip() {
        for (text, want) in [
            ("disabled", ConsumableShares::Disabled),
            ("", ConsumableShares::Disabled),
            ("unlimited", ConsumableShares::Unlimited),
            ("memory", ConsumableShares::Memory),
            ("4", ConsumableShares::Shares(NonZeroU32::new(4).unwrap())),
            ("48", ConsumableShares::Shares(NonZeroU32::new(48).unwrap())),
        ] {
            let parsed: ConsumableShares = text.parse().unwrap();
            assert_eq!(parsed, want, "{text}");
            if !text.is_empty() {
                assert_eq!(parsed.to_string(), text);
            }
        }
        for bad in ["0", "-1", "49", "four", "Memory", "4.5"] {
            let error = bad.parse::<ConsumableShares>().unwrap_err().to_string();
            assert!(
                error.contains(&format!("`{bad}`")) && error.contains("`memory`"),
                "{error}"
            );
        }
        assert!(!ConsumableShares::Disabled.enabled());
        assert!(ConsumableShares::Unlimited.enabled());
        assert_eq!("7".parse::<ConsumableShares>().unwrap().shares(), Some(7));
        assert_eq!(ConsumableShares::Memory.shares(), None);
    }

    #[test]
    fn thread_percentage_follows_shares() {
        assert_eq!(thread_percentage(1, 4), 25);
        assert_eq!(thread_percentage(4, 4), 100);
        assert_eq!(thread_percentage(1, 3), 33);
        assert_eq!(thread_percentage(1, 200), 1);
        assert_eq!(thread_percentage(5, 4), 100);
        assert_eq!(thread_percentage(1, 0), 100);
    }

    #[test]
    fn memory_is_rounded_down_to_mebibytes() {
        assert_eq!(memory_rounded(81559 << 20), 81559 << 20);
        assert_eq!(memory_rounded((81559 << 20) + 12345), 81559 << 20);
        assert_eq!(memory_rounded(1), 0);
    }
}
