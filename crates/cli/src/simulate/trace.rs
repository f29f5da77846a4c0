//! Traces: claims drawn one arrival after another by a seeded generator, each a size drawn by
//! weight and a lifetime, the same on every platform and release.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::Deserialize;
use tessera_api::names::GPU_DEVICE_CLASS;
use tessera_placement::synthetic;

/// How many arrivals a claim stays, uniformly in `min..=max`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lifetime {
    pub min: u64,
    pub max: u64,
}

/// SplitMix64: small, fast, and the same on every platform and release.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// A key of `weights` drawn with probability proportional to its weight (1 if all are 0).
    pub(super) fn weighted(&mut self, weights: &BTreeMap<u32, u32>) -> u32 {
        let total: u64 = weights.values().map(|w| u64::from(*w)).sum();
        let mut pick = self.below(total);
        weights
            .iter()
            .find(|(_, w)| {
                let w = u64::from(**w);
                if pick < w {
                    true
                } else {
                    pick -= w;
                    false
                }
            })
            .map(|(key, _)| *key)
            .unwrap_or(1)
    }

    /// A lifetime drawn uniformly from `lifetime.min..=lifetime.max`.
    pub(super) fn lifetime(&mut self, lifetime: &Lifetime) -> u64 {
        lifetime.min + self.below(lifetime.max - lifetime.min + 1)
    }
}

/// A trace of `claims` arrivals from the generator seeded with `seed`: each a size drawn by
/// `weights` (GPUs, GiB, ...), then a lifetime in `lifetime`.
pub(super) fn draw_trace(
    claims: usize,
    weights: &BTreeMap<u32, u32>,
    lifetime: &Lifetime,
    seed: u64,
) -> impl Iterator<Item = (u32, u64)> {
    let mut rng = Rng(seed);
    (0..claims).map(move |_| {
        let size = rng.weighted(weights);
        (size, rng.lifetime(lifetime))
    })
}

/// The claim of arrival `index`, for `gpus` whole GPUs.
pub(super) fn claim(index: usize, gpus: u32) -> ResourceClaim {
    synthetic::device_claim(
        "simulate",
        &format!("claim-{index}"),
        &format!("sim-{index}"),
        GPU_DEVICE_CLASS,
        i64::from(gpus),
    )
}
