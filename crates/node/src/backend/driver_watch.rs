//! The NVIDIA driver under the driver root, watched while the plugin runs.
//!
//! The GPU operator upgrades the driver in place under `/run/nvidia/driver` (k8s-driver-manager
//! drains the node, replaces the driver container, and the new one lays its files under the same
//! root); a host package upgrade does the same under `/`. Claim specs name the driver's files by
//! version (`libcuda.so.<version>`), so specs written after the upgrade must name the new files.
//! Every [`DriverWatch::interval`] the watch reads the root's driver version
//! ([`tessera_driver_root::discover`]) and:
//!
//! - same version: nothing;
//! - no complete driver (the upgrade is laying files, or the root was emptied): the claim specs
//!   keep the last driver's files, the watch says so once, and looks again;
//! - another version: reads the root again as at start ([`driver_root::load`]) and replaces the
//!   injection ([`CurrentInjection`]) every claim spec prepared afterwards is built with; logs
//!   the change and counts it (`tessera_node_driver_reloads{result}`). Claims already prepared keep
//!   their specs (their containers run with the files they were started with; a plugin restart
//!   rewrites them).
//!
//! What it does not follow: the NVML handle the backend opened at start and the driver's tools
//! used for time-slicing and MPS (paths of the old version); docs/operations.md, "Driver
//! upgrades", says to restart the plugin after an upgrade for those.

use std::time::Duration;

use tessera_driver_root::discover::{self, DiscoveryError};
use tessera_driver_root::tree::HostTree;
use tessera_prepare::injection::CurrentInjection;
use tessera_process::Stop;
use tokio::task::JoinHandle;

use super::driver_root::{self, DriverRootConfig};
use crate::metrics::{NodeMetrics, ResultLabel};

/// How often the driver root is read by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);

/// What one look at the driver root found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverCheck {
    /// The driver the specs inject is there.
    Unchanged,
    /// No complete driver under the root; the specs keep the last one's files.
    Incomplete(DiscoveryError),
    /// Another version, read: specs prepared from now on inject its files.
    Changed { from: String, to: String },
    /// Another version, which could not be read (the specs keep the last driver's files).
    ReloadFailed {
        from: String,
        to: String,
        error: String,
    },
}

/// Watches one driver root and keeps [`CurrentInjection`] on its driver.
pub struct DriverWatch {
    pub config: DriverRootConfig,
    /// The version the injection holds now.
    pub version: String,
    pub injection: CurrentInjection,
    pub metrics: NodeMetrics,
    pub interval: Duration,
    /// Whether the last look found no complete driver (said once, until one is there again).
    incomplete: bool,
}

impl DriverWatch {
    pub fn new(
        config: DriverRootConfig,
        version: String,
        injection: CurrentInjection,
        metrics: NodeMetrics,
    ) -> DriverWatch {
        DriverWatch {
            config,
            version,
            injection,
            metrics,
            interval: DEFAULT_INTERVAL,
            incomplete: false,
        }
    }

    /// Reads the root once and follows a new driver (blocking: file IO).
    pub fn check(&mut self) -> DriverCheck {
        let tree = HostTree::new(&self.config.container_driver_root);
        let root = self.config.driver_root.display().to_string();
        let found = match discover::discover(&tree, &root) {
            Ok(files) => files.version,
            Err(error) => return DriverCheck::Incomplete(error),
        };
        if found == self.version {
            return DriverCheck::Unchanged;
        }
        let from = self.version.clone();
        match driver_root::load(&self.config) {
            Ok((injection, _tools, summary)) => {
                self.injection.replace(injection);
                self.version = summary.version.clone();
                self.metrics.driver_reload(ResultLabel::Success);
                DriverCheck::Changed {
                    from,
                    to: summary.version,
                }
            }
            Err(error) => {
                // Keep the old injection; try again at the next look.
                self.metrics.driver_reload(ResultLabel::Error);
                DriverCheck::ReloadFailed {
                    from,
                    to: found,
                    error: error.to_string(),
                }
            }
        }
    }

    /// Logs what [`DriverWatch::check`] found (an incomplete root once until it is whole again).
    fn report(&mut self, check: &DriverCheck) {
        let root = self.config.driver_root.display().to_string();
        match check {
            DriverCheck::Unchanged => self.incomplete = false,
            DriverCheck::Incomplete(error) => {
                if !std::mem::replace(&mut self.incomplete, true) {
                    tracing::warn!(driver_root = %root, version = %self.version, %error, "the driver root holds no complete NVIDIA driver now (an upgrade in progress?); claim specs keep the last driver's files");
                }
            }
            DriverCheck::Changed { from, to } => {
                self.incomplete = false;
                tracing::info!(driver_root = %root, %from, %to, "NVIDIA driver changed under the driver root; claims prepared from now on get the new driver's files (restart the plugin for MPS/time-slicing tools and NVML)");
            }
            DriverCheck::ReloadFailed { from, to, error } => {
                tracing::warn!(driver_root = %root, %from, %to, %error, "NVIDIA driver changed under the driver root but cannot be read; claim specs keep the last driver's files");
            }
        }
    }

    /// Looks every [`DriverWatch::interval`] until `stop`.
    pub fn spawn(self, stop: Stop) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut watch = self;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(watch.interval) => {}
                    _ = stop.cancelled() => return,
                }
                let looked = tokio::task::spawn_blocking(move || {
                    let check = watch.check();
                    (watch, check)
                })
                .await;
                let Ok((returned, check)) = looked else {
                    tracing::error!("the driver root watch panicked");
                    return;
                };
                watch = returned;
                watch.report(&check);
            }
        })
    }
}

#[cfg(test)]
mod tests;
