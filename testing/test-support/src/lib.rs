//! Test-only helpers shared by the workspace's tests and benchmarks (a dev-dependency only, never
//! a normal dependency of anything shipped; `crates/api/tests/architecture.rs` checks that):
//!
//! - [`SplitMix64`]: a small seedable generator for randomized tests;
//! - [`objects`]: builders of the Kubernetes objects many tests are made of;
//! - [`scheduler_perf`]: the cluster and claims of scheduler_perf's
//!   `SchedulingWithResourceClaimTemplate`, the fixture the allocator benchmark and the parity
//!   benchmark share;
//! - [`harness`]: the runner of test executables that have their own `main` (they also play a
//!   fake driver's binaries);
//! - [`needed_libraries`]: what a binary needs from the machine, for building a container's root;
//!   [`running_as_root`], for the tests that mount or chroot.

pub mod harness;
pub mod objects;
pub mod scheduler_perf;

use std::path::{Path, PathBuf};
use std::process::Command;

/// SplitMix64 (Steele, Lea, Flood): small, seedable, and the same on every platform and
/// release, so a failing seed reproduces. Hand-written: ten lines, where a generator crate's
/// algorithms may change between its versions.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// A non-empty subset of `items` (when it has any) of at most `max` elements, in the order
    /// drawn.
    pub fn subset<T: Clone>(&mut self, items: &[T], max: usize) -> Vec<T> {
        let mut pool = items.to_vec();
        let count = 1 + self.below(max.min(pool.len()) as u64) as usize;
        (0..count.min(pool.len()))
            .map(|_| pool.remove(self.below(pool.len() as u64) as usize))
            .collect()
    }
}

/// The libraries `binary` needs, as `ldd` resolves them on this machine (absolute paths; the
/// loader itself included).
pub fn needed_libraries(binary: &Path) -> Vec<PathBuf> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .unwrap_or_else(|e| panic!("running ldd {}: {e}", binary.display()));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let path = line
                .split("=>")
                .nth(1)
                .unwrap_or(line)
                .split_whitespace()
                .next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Whether this process runs as root (its real uid is 0): bind mounts and chroot need it.
pub fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|uids| uids.split_whitespace().next())
        == Some("0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_gives_the_reference_sequence() {
        // The first outputs for seed 1234567 of the reference implementation (Vigna's
        // splitmix64.c).
        let mut rng = SplitMix64::new(1_234_567);
        assert_eq!(rng.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(rng.next_u64(), 3_203_168_211_198_807_973);
        assert_eq!(rng.next_u64(), 9_817_491_932_198_370_423);
    }

    #[test]
    fn draws_stay_in_their_ranges() {
        let mut rng = SplitMix64::new(7);
        for _ in 0..1000 {
            assert!(rng.below(5) < 5);
            assert_eq!(rng.below(0), 0);
            let subset = rng.subset(&[1, 2, 3, 4], 3);
            assert!((1..=3).contains(&subset.len()), "{subset:?}");
            let mut unique = subset.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), subset.len(), "no element twice: {subset:?}");
        }
        assert!(!rng.chance(-1.0));
        assert!(rng.chance(1.0));
    }

    #[test]
    fn ldd_names_the_c_library_of_this_test() {
        let libraries = needed_libraries(&std::env::current_exe().unwrap());
        assert!(
            libraries.iter().any(|l| l
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libc."))),
            "{libraries:?}"
        );
    }
}
