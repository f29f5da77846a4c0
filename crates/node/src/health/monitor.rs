//! The health monitor: a blocking loop (on a `spawn_blocking` thread) that waits for NVML health
//! events, records what they mean in the [`SharedFindings`], and counts them.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tessera_nvml::{HealthEvent, HealthEventKind, HealthEvents};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::findings::HealthFindings;
use super::policy::HealthFinding;
use tessera_process::{Heartbeat, Stop};

use crate::gpu_metrics::monitor::XidCounts;
use crate::metrics::{HealthAction, HealthEventLabel, NodeMetrics};

/// How long one wait for an event lasts; the loop checks for shutdown and beats its heartbeat
/// in between.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// How long the monitor may go without a beat before `/healthz` calls it stuck.
pub const MAX_SILENCE: Duration = Duration::from_secs(30);

/// Pause after a failed wait before the next one.
const ERROR_BACKOFF: Duration = Duration::from_secs(5);

/// Where health events come from: NVML's event set, or a test's channel.
pub trait HealthEventSource: Send + 'static {
    /// Blocks up to `timeout` for the next event; `Ok(None)` when none came.
    fn wait(&mut self, timeout: Duration) -> Result<Option<HealthEvent>, String>;
}

impl HealthEventSource for HealthEvents {
    fn wait(&mut self, timeout: Duration) -> Result<Option<HealthEvent>, String> {
        HealthEvents::wait(self, timeout).map_err(|e| e.to_string())
    }
}

/// A test source: events sent on the channel arrive in order.
impl HealthEventSource for std::sync::mpsc::Receiver<HealthEvent> {
    fn wait(&mut self, timeout: Duration) -> Result<Option<HealthEvent>, String> {
        match self.recv_timeout(timeout) {
            Ok(event) => Ok(Some(event)),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                std::thread::sleep(timeout);
                Ok(None)
            }
        }
    }
}

/// The findings, shared by the monitor (which records) and the publisher (which renders taints
/// and the kubelet health stream from them). Cheap to clone.
#[derive(Debug, Clone)]
pub struct SharedFindings {
    findings: Arc<Mutex<HealthFindings>>,
    revision: Arc<watch::Sender<u64>>,
}

impl Default for SharedFindings {
    fn default() -> Self {
        Self {
            findings: Arc::default(),
            revision: Arc::new(watch::channel(0).0),
        }
    }
}

impl SharedFindings {
    /// Records an event; on a new finding bumps the revision (waking [`Self::subscribe`]rs)
    /// and returns the finding.
    pub fn record(&self, event: &HealthEvent, now: SystemTime) -> Option<HealthFinding> {
        let finding = self
            .findings
            .lock()
            .expect("findings lock")
            .record(event, now)?;
        self.revision.send_modify(|revision| *revision += 1);
        Some(finding)
    }

    /// Forgets findings no event confirmed for `healthy_for`
    /// ([`HealthFindings::clear_healed`]); when any went, bumps the revision so the publisher
    /// removes their taints.
    pub fn clear_healed(
        &self,
        now: SystemTime,
        healthy_for: Duration,
    ) -> Vec<super::findings::DatedFinding> {
        let cleared = self
            .findings
            .lock()
            .expect("findings lock")
            .clear_healed(now, healthy_for);
        if !cleared.is_empty() {
            self.revision.send_modify(|revision| *revision += 1);
        }
        cleared
    }

    /// A copy of the current findings.
    pub fn snapshot(&self) -> HealthFindings {
        self.findings.lock().expect("findings lock").clone()
    }

    /// Changes whenever a new finding is recorded.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.revision.subscribe()
    }
}

/// The monitor loop's parts.
pub struct HealthMonitor {
    pub source: Box<dyn HealthEventSource>,
    pub findings: SharedFindings,
    pub metrics: NodeMetrics,
    pub heartbeat: Heartbeat,
    /// What operators change of the policy.
    pub settings: HealthSettings,
    /// XID errors per GPU, which the GPU metrics export.
    pub xids: XidCounts,
}

/// Operators' settings of the health policy (`--ignored-xids`, `--health-recovery-after`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthSettings {
    /// XIDs that never taint a device, whatever the policy table says.
    pub ignored_xids: BTreeSet<u64>,
    /// A device's XID/ECC taints go once no event confirmed them for this long; `None` keeps
    /// them until the plugin restarts.
    pub recover_after: Option<Duration>,
}

impl HealthMonitor {
    /// Runs the loop on a blocking thread until `stop` is cancelled (noticed within
    /// [`POLL_INTERVAL`]).
    pub fn spawn(self, stop: Stop) -> JoinHandle<()> {
        tokio::task::spawn_blocking(move || self.run(&stop))
    }

    fn run(mut self, stop: &Stop) {
        tracing::info!("health monitor started");
        while !stop.is_cancelled() {
            self.heartbeat.beat();
            match self.source.wait(POLL_INTERVAL) {
                Ok(Some(event)) => self.handle(&event),
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(%error, "waiting for NVML health events failed; retrying");
                    std::thread::sleep(ERROR_BACKOFF);
                }
            }
            if let Some(healthy_for) = self.settings.recover_after {
                for healed in self.findings.clear_healed(SystemTime::now(), healthy_for) {
                    tracing::info!(
                        taint = %format!("{}={}", healed.finding.key, healed.finding.value),
                        healthy_for = ?healthy_for,
                        "{}: no event for the recovery time; removing the taint",
                        healed.finding.message
                    );
                }
            }
        }
        tracing::info!("health monitor stopped");
    }

    fn handle(&self, event: &HealthEvent) {
        let label = match event.kind {
            HealthEventKind::Xid(_) => HealthEventLabel::Xid,
            HealthEventKind::SingleBitEcc => HealthEventLabel::EccSingle,
            HealthEventKind::DoubleBitEcc => HealthEventLabel::EccDouble,
        };
        if matches!(event.kind, HealthEventKind::Xid(_)) {
            self.xids.add(&event.gpu_uuid);
        }
        let ignored = matches!(event.kind, HealthEventKind::Xid(xid) if self.settings.ignored_xids.contains(&xid));
        let acted = !ignored && super::policy::classify(event.kind).is_some();
        self.metrics.health_event(
            label,
            if acted {
                HealthAction::Taint
            } else {
                HealthAction::Ignore
            },
        );
        if ignored {
            tracing::info!(gpu = %event.gpu_uuid, kind = ?event.kind, "health event ignored (--ignored-xids)");
            return;
        }
        match self.findings.record(event, SystemTime::now()) {
            Some(finding) => tracing::warn!(
                gpu = %event.gpu_uuid,
                gpu_instance = ?event.gpu_instance_id,
                compute_instance = ?event.compute_instance_id,
                taint = %format!("{}={}:{}", finding.key, finding.value, finding.effect.as_str()),
                "{}; tainting the device",
                finding.message
            ),
            None if acted => {
                tracing::debug!(gpu = %event.gpu_uuid, kind = ?event.kind, "health event repeats a known finding")
            }
            None => {
                tracing::info!(gpu = %event.gpu_uuid, kind = ?event.kind, "health event needs no action")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;

    /// Waits for the monitor's thread to end after its stop; it notices within
    /// [`POLL_INTERVAL`], so a few seconds is ample.
    async fn join_in_time(task: JoinHandle<()>) {
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the monitor stops within its poll interval")
            .expect("the monitor loop does not panic");
    }

    #[tokio::test]
    async fn events_become_findings_and_wake_subscribers() {
        let (send, receive) = std::sync::mpsc::channel();
        let findings = SharedFindings::default();
        let mut revisions = findings.subscribe();
        let xids = XidCounts::default();
        let monitor = HealthMonitor {
            source: Box::new(receive),
            findings: findings.clone(),
            metrics: NodeMetrics::new(&mut Registry::default()),
            heartbeat: Heartbeat::new("health monitor", MAX_SILENCE),
            settings: HealthSettings::default(),
            xids: xids.clone(),
        };
        let stop = Stop::new();
        let task = monitor.spawn(stop.clone());
        // A failed assertion must still stop the blocking loop, or the runtime waits for it
        // forever and the test hangs instead of failing.
        let _stop_on_panic = stop.clone().drop_guard();
        let event = |kind| HealthEvent {
            gpu_uuid: "GPU-1".into(),
            kind,
            gpu_instance_id: None,
            compute_instance_id: None,
        };
        send.send(event(HealthEventKind::Xid(31))).unwrap();
        send.send(event(HealthEventKind::Xid(79))).unwrap();
        tokio::time::timeout(Duration::from_secs(5), revisions.changed())
            .await
            .expect("a new finding in time")
            .unwrap();
        assert_eq!(
            *revisions.borrow_and_update(),
            1,
            "the ignored XID made no finding"
        );
        assert!(!findings.snapshot().is_empty());
        assert_eq!(
            xids.get("GPU-1"),
            2,
            "every XID is counted for the GPU metrics"
        );
        assert_eq!(xids.get("GPU-2"), 0);
        stop.cancel();
        join_in_time(task).await;
    }

    #[tokio::test]
    async fn ignored_xids_taint_nothing_and_taints_clear_after_the_healthy_time() {
        let (send, receive) = std::sync::mpsc::channel();
        let findings = SharedFindings::default();
        let mut revisions = findings.subscribe();
        let monitor = HealthMonitor {
            source: Box::new(receive),
            findings: findings.clone(),
            metrics: NodeMetrics::new(&mut Registry::default()),
            heartbeat: Heartbeat::new("health monitor", MAX_SILENCE),
            settings: HealthSettings {
                ignored_xids: [79].into(),
                recover_after: Some(Duration::from_millis(1500)),
            },
            xids: XidCounts::default(),
        };
        let stop = Stop::new();
        let task = monitor.spawn(stop.clone());
        // A failed assertion must still stop the blocking loop, or the runtime waits for it.
        let _stop_on_panic = stop.clone().drop_guard();
        let event = |gpu: &str, kind| HealthEvent {
            gpu_uuid: gpu.into(),
            kind,
            gpu_instance_id: None,
            compute_instance_id: None,
        };
        // XID 79 taints by the table, but operators ignore it here; XID 74 taints.
        send.send(event("GPU-1", HealthEventKind::Xid(79))).unwrap();
        send.send(event("GPU-2", HealthEventKind::Xid(74))).unwrap();
        tokio::time::timeout(Duration::from_secs(5), revisions.changed())
            .await
            .expect("a new finding in time")
            .unwrap();
        assert_eq!(
            *revisions.borrow_and_update(),
            1,
            "only XID 74 made a finding"
        );
        let snapshot = findings.snapshot();
        assert!(!snapshot.is_empty());
        // No further event: the finding goes after the healthy time, waking the publisher.
        tokio::time::timeout(Duration::from_secs(10), revisions.changed())
            .await
            .expect("the taint clears after the healthy time")
            .unwrap();
        assert!(findings.snapshot().is_empty(), "{:?}", findings.snapshot());
        stop.cancel();
        join_in_time(task).await;
    }
}
