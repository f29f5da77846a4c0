//! The publish loop: rescans the inventory periodically and republishes when anything that
//! shapes the pool changes — the inventory, the Node (its uid, its topology-managed label), the
//! health findings, GPUs found lost — or when the API server no longer holds what was published
//! (the kubelet wipes a plugin's slices when it restarts, so a new registration also triggers a
//! check). Failures are retried with exponential backoff. It also keeps the kubelet health list
//! current. A GPU a rescan finds lost stays published with its last known facts, tainted
//! unreachable ([`tessera_prepare::inventory::lost`]).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tessera_gpu_inventory::GpuInventory;
use tessera_kubelet_grpc::{DeviceHealth, RegistrationState};
use tessera_prepare::inventory::NodeInventory;
use tessera_process::Heartbeat;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{PublishInput, Publisher, WatchedNode};
use crate::health::{FabricStates, HealthFindings, SharedFindings};
use crate::metrics::{NodeMetrics, ResultLabel};

/// First retry delay after a failed publish; doubles up to the rescan interval.
const FIRST_RETRY: Duration = Duration::from_millis(500);

/// How long the loop may be silent before `/healthz` calls it stuck, beyond its interval:
/// room for a slow API server (kube's default request timeouts are minutes long).
const SLOW_API_ALLOWANCE: Duration = Duration::from_secs(300);

/// The heartbeat limit for a loop rescanning every `interval`.
pub fn max_silence(interval: Duration) -> Duration {
    interval.saturating_mul(2) + SLOW_API_ALLOWANCE
}

/// Everything the loop reads and writes.
pub struct PublishLoop {
    pub publisher: Publisher,
    /// The node's GPUs, shared with claim preparation; the loop rescans them.
    pub inventory: Arc<NodeInventory>,
    pub findings: SharedFindings,
    pub node: watch::Receiver<Option<WatchedNode>>,
    pub registration: watch::Receiver<RegistrationState>,
    /// The device list the kubelet health stream serves.
    pub kubelet_health: watch::Sender<Vec<DeviceHealth>>,
    /// Set once the first publish succeeded (readiness).
    pub published: watch::Sender<bool>,
    pub metrics: NodeMetrics,
    pub heartbeat: Heartbeat,
    pub rescan_interval: Duration,
}

/// What the last successful publish was made from.
#[derive(PartialEq)]
struct PublishedFrom {
    inventory: Arc<GpuInventory>,
    node: WatchedNode,
    findings: HealthFindings,
}

/// A failed publish waiting for its next try.
struct Retry {
    /// Failures in a row so far.
    failures: u32,
    at: Instant,
}

/// Why the loop woke up.
enum Wake {
    Rescan,
    Changed,
    Registered,
    Retry,
    Stop,
}

impl PublishLoop {
    /// Runs until `shutdown` completes. Does not delete anything on the way out.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let started = SystemTime::now();
        let mut rescan = tokio::time::interval(self.rescan_interval);
        rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut findings_changed = self.findings.subscribe();
        let mut inventory: Option<Arc<GpuInventory>> = None;
        let mut last: Option<PublishedFrom> = None;
        let mut retry: Option<Retry> = None;
        let mut waiting_for_node_logged = false;
        let mut fabric = FabricStates::default();
        loop {
            self.heartbeat.beat();
            let wake = tokio::select! {
                () = &mut shutdown => Wake::Stop,
                _ = rescan.tick() => Wake::Rescan,
                () = changed(&mut self.node) => Wake::Changed,
                () = changed(&mut findings_changed) => Wake::Changed,
                () = changed(&mut self.registration) => {
                    if self.registration.borrow().is_registered() { Wake::Registered } else { Wake::Changed }
                }
                () = sleep_until(retry.as_ref().map(|r| r.at)) => Wake::Retry,
            };
            self.heartbeat.beat();
            if matches!(wake, Wake::Stop) {
                tracing::info!("publish loop stopped; the published slices stay");
                return;
            }
            if matches!(wake, Wake::Rescan) || inventory.is_none() {
                inventory = self.rescan(inventory).await;
                if let Some(current) = &inventory {
                    fabric.observe(current, SystemTime::now());
                }
            }
            let Some(current) = inventory.as_ref() else {
                continue;
            };
            let mut findings = self.findings.snapshot();
            findings.record_lost(self.inventory.lost_gpus());
            findings.record_fabric(&fabric);
            self.update_kubelet_health(current, &findings, started);
            let node = self.node.borrow().clone();
            let Some(node) = node else {
                if !waiting_for_node_logged {
                    tracing::info!(node = %self.publisher.config.node_name, "waiting for the Node object before publishing");
                    waiting_for_node_logged = true;
                }
                continue;
            };
            let input_changed = last.as_ref().is_none_or(|last| {
                *last.inventory != **current || last.node != node || last.findings != findings
            });
            if !self
                .publish_needed(&wake, input_changed || retry.is_some())
                .await
            {
                continue;
            }
            let input = PublishInput {
                inventory: current,
                node: &node,
                findings: &findings,
            };
            if self.publish_or_schedule_retry(input, &mut retry).await {
                last = Some(PublishedFrom {
                    inventory: Arc::clone(current),
                    node,
                    findings,
                });
            }
        }
    }

    /// Whether to publish now: the input changed or a retry is due (`changed`), or — on a
    /// rescan or a new registration — the API server no longer holds what was published.
    async fn publish_needed(&self, wake: &Wake, changed: bool) -> bool {
        if changed {
            return true;
        }
        if !matches!(wake, Wake::Rescan | Wake::Registered) {
            return false;
        }
        match self.publisher.verify().await {
            Ok(intact) => {
                if !intact {
                    tracing::info!("the published slices changed in the API server; republishing");
                }
                !intact
            }
            Err(error) => {
                tracing::warn!(%error, "cannot check the published slices");
                false
            }
        }
    }

    /// Publishes `input`; on failure schedules the next try in `retry` (exponential backoff),
    /// on success clears it and marks the loop published. Returns whether it succeeded.
    async fn publish_or_schedule_retry(
        &mut self,
        input: PublishInput<'_>,
        retry: &mut Option<Retry>,
    ) -> bool {
        match self.publisher.publish(input).await {
            Ok(_) => {
                *retry = None;
                self.published.send_replace(true);
                true
            }
            Err(error) => {
                let failures = retry.as_ref().map_or(0, |r| r.failures).saturating_add(1);
                let delay = backoff(failures, self.rescan_interval);
                tracing::error!(%error, retry_in = ?delay, "publishing the node's ResourceSlices failed");
                *retry = Some(Retry {
                    failures,
                    at: Instant::now() + delay,
                });
                false
            }
        }
    }

    /// Rescans the inventory on a blocking thread; keeps `previous` (what the loop last worked
    /// with) when the read fails.
    async fn rescan(&self, previous: Option<Arc<GpuInventory>>) -> Option<Arc<GpuInventory>> {
        let shared = Arc::clone(&self.inventory);
        let read = tokio::task::spawn_blocking(move || shared.rescan()).await;
        match read {
            Ok(Ok(inventory)) => {
                self.metrics.inventory_scan(ResultLabel::Success);
                let changed = previous.as_ref().is_none_or(|p| **p != *inventory);
                if changed && previous.is_some() {
                    tracing::info!("the GPU inventory changed");
                }
                warn_missing_pci_facts(&inventory, previous.as_deref());
                Some(inventory)
            }
            Ok(Err(error)) => {
                self.metrics.inventory_scan(ResultLabel::Error);
                tracing::error!(source = %self.inventory.source().describe(), %error, "cannot read the GPU inventory; keeping the last one");
                previous
            }
            Err(panic) => {
                self.metrics.inventory_scan(ResultLabel::Error);
                tracing::error!(%panic, "reading the GPU inventory panicked; keeping the last one");
                previous
            }
        }
    }

    /// Replaces the kubelet health list when it changed (device set or findings).
    fn update_kubelet_health(
        &self,
        inventory: &GpuInventory,
        findings: &HealthFindings,
        started: SystemTime,
    ) {
        let version = match self.publisher.server_version {
            Some(version) => version,
            None => tessera_gpu_inventory::ServerVersion::V1_34,
        };
        let layout = match self.publisher.layout(inventory, version) {
            Ok(layout) => layout,
            Err(error) => {
                tracing::error!(%error, "cannot list the node's devices for the kubelet health stream");
                return;
            }
        };
        let health = findings.device_health(
            inventory,
            &self.publisher.config.node_name,
            layout.device_names(),
            started,
        );
        self.kubelet_health.send_if_modified(|current| {
            let changed = *current != health;
            if changed {
                *current = health;
            }
            changed
        });
    }
}

/// Logs GPUs the backend found without their PCIe root or NUMA node (the NVML backend reads
/// them from sysfs); such devices lose the `pcieRoot`/`numaNode` attributes that topology-aware
/// placement uses. Logged when first seen.
fn warn_missing_pci_facts(inventory: &GpuInventory, previous: Option<&GpuInventory>) {
    for gpu in &inventory.gpus {
        let missing: Vec<&str> = [
            gpu.pcie_root.is_none().then_some("PCIe root"),
            gpu.numa_node.is_none().then_some("NUMA node"),
        ]
        .into_iter()
        .flatten()
        .collect();
        let seen_before = previous
            .and_then(|p| p.gpu_by_uuid(&gpu.uuid))
            .is_some_and(|p| p.pcie_root == gpu.pcie_root && p.numa_node == gpu.numa_node);
        if !missing.is_empty() && !seen_before {
            tracing::warn!(
                gpu = %gpu.uuid,
                pci_bus_id = %gpu.pci_bus_id,
                missing = %missing.join(" and "),
                "GPU has no {} (read from sysfs; check --sysfs-root): its devices are published without them",
                missing.join(" and ")
            );
        }
    }
}

/// Completes when the channel changes; never when its sender is gone.
async fn changed<T>(receiver: &mut watch::Receiver<T>) {
    if receiver.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The delay before retry number `failures` (1-based): 0.5 s doubling, at most `cap`.
fn backoff(failures: u32, cap: Duration) -> Duration {
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(16));
    FIRST_RETRY.saturating_mul(factor).min(cap.max(FIRST_RETRY))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_interval() {
        let cap = Duration::from_secs(10);
        let delays: Vec<_> = (1..=7).map(|n| backoff(n, cap).as_millis()).collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 8000, 10000, 10000]);
        assert_eq!(backoff(1, Duration::ZERO), FIRST_RETRY);
        assert_eq!(
            max_silence(Duration::from_secs(30)),
            Duration::from_secs(360)
        );
    }
}
