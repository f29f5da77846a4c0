//! The scenario `tessera simulate` runs: the synthetic cluster (groups of nodes rendered from a
//! topology) and the claim traces, as a scenario file (`--scenario`) gives them, checked.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use serde::Deserialize;

use super::trace::Lifetime;

/// A scenario: the cluster and the trace.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimulationScenario {
    pub nodes: Vec<NodeGroup>,
    pub trace: TraceSpec,
    /// The sharing trace (`--sharing`); the default one when absent.
    #[serde(default)]
    pub sharing: Option<SharingSpec>,
}

/// `count` nodes rendered from one topology.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeGroup {
    pub topology: String,
    pub count: usize,
    #[serde(default)]
    pub name_prefix: Option<String>,
}

/// The claim trace.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TraceSpec {
    pub claims: usize,
    /// GPUs per claim → relative weight.
    pub sizes: BTreeMap<u32, u32>,
    pub lifetime: Lifetime,
}

impl SimulationScenario {
    pub fn default_scenario() -> SimulationScenario {
        SimulationScenario {
            nodes: vec![
                NodeGroup {
                    topology: "dgx-h100".into(),
                    count: 64,
                    name_prefix: None,
                },
                NodeGroup {
                    topology: "pcie-l40s".into(),
                    count: 64,
                    name_prefix: None,
                },
            ],
            trace: TraceSpec {
                claims: 3000,
                sizes: [(1, 40), (2, 25), (4, 20), (8, 15)].into(),
                lifetime: Lifetime { min: 1, max: 480 },
            },
            sharing: None,
        }
    }

    pub(super) fn load(path: &Path) -> anyhow::Result<SimulationScenario> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("read scenario {}", path.display()))?;
        let scenario: SimulationScenario = serde_yaml::from_str(&text).with_context(|| {
            format!(
                "scenario {}: invalid (see tessera simulate --help)",
                path.display()
            )
        })?;
        scenario
            .check()
            .with_context(|| format!("scenario {}", path.display()))?;
        Ok(scenario)
    }

    pub(super) fn check(&self) -> anyhow::Result<()> {
        if self.nodes.iter().all(|g| g.count == 0) {
            bail!("nodes: at least one node is needed");
        }
        if self.trace.sizes.is_empty() || self.trace.sizes.values().all(|w| *w == 0) {
            bail!("trace.sizes: give at least one size with a positive weight");
        }
        if let Some(size) = self.trace.sizes.keys().find(|s| **s == 0 || **s > 32) {
            bail!("trace.sizes: {size} GPUs per claim is outside 1..=32");
        }
        if let Some(sharing) = &self.sharing {
            sharing.check()?;
        }
        if self.trace.lifetime.min > self.trace.lifetime.max {
            bail!(
                "trace.lifetime: min {} is above max {}",
                self.trace.lifetime.min,
                self.trace.lifetime.max
            );
        }
        Ok(())
    }
}

/// The sharing trace: single-GPU claims of a memory size each.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SharingSpec {
    pub claims: usize,
    /// GiB of device memory per claim → relative weight.
    pub memory_gib: BTreeMap<u32, u32>,
    pub lifetime: Lifetime,
}

impl SharingSpec {
    /// 3000 claims of 5, 10, 20 or 40 GiB (weights 40/30/20/10) living 1-480 arrivals: small
    /// inference replicas mostly, which is what sharing is for.
    pub fn default_spec() -> Self {
        SharingSpec {
            claims: 3000,
            memory_gib: [(5, 40), (10, 30), (20, 20), (40, 10)].into(),
            lifetime: Lifetime { min: 1, max: 480 },
        }
    }

    pub(super) fn check(&self) -> anyhow::Result<()> {
        if self.memory_gib.is_empty() || self.memory_gib.values().all(|w| *w == 0) {
            bail!("sharing.memoryGiB: give at least one size with a positive weight");
        }
        if let Some(size) = self.memory_gib.keys().find(|s| **s == 0 || **s > 1024) {
            bail!("sharing.memoryGiB: {size} GiB per claim is outside 1..=1024");
        }
        if self.lifetime.min > self.lifetime.max {
            bail!(
                "sharing.lifetime: min {} is above max {}",
                self.lifetime.min,
                self.lifetime.max
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_scenarios_are_refused_with_the_field() {
        let mut s = SimulationScenario::default_scenario();
        s.trace.sizes = [(64, 1)].into();
        assert!(
            s.check()
                .unwrap_err()
                .to_string()
                .contains("trace.sizes: 64 GPUs")
        );
        let mut s = SimulationScenario::default_scenario();
        s.trace.lifetime = Lifetime { min: 5, max: 1 };
        assert!(
            s.check()
                .unwrap_err()
                .to_string()
                .contains("trace.lifetime")
        );
    }
}
