//! [`InstrumentedDriver`]: counts and times the kubelet's calls on any [`DraDriver`], so that
//! the claim-preparation driver stays free of metrics code. The driver's own counters
//! ([`DriverStats`]: devices held by prepared claims, checkpoint quarantines) are read after
//! every call.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tessera_kubelet_grpc::{
    ClaimRef, ClaimUid, DeviceHealth, DraDriver, PrepareResult, UnprepareResult,
};
use tessera_prepare::DriverStats;
use tokio::sync::watch;

use super::{ClaimOperation, NodeMetrics, ResultLabel};

/// A driver whose calls are counted and timed in [`NodeMetrics`].
pub struct InstrumentedDriver<D> {
    driver: D,
    metrics: NodeMetrics,
    gauges: Option<fn(&D) -> DriverStats>,
    quarantines_counted: AtomicU64,
}

impl<D> std::fmt::Debug for InstrumentedDriver<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstrumentedDriver").finish_non_exhaustive()
    }
}

impl<D> InstrumentedDriver<D> {
    /// Wraps `driver`; `gauges` (if any) reads the driver's counters after each call and once
    /// now (for the node driver: [`tessera_prepare::NodeDriver::stats`]).
    pub fn new(driver: D, metrics: NodeMetrics, gauges: Option<fn(&D) -> DriverStats>) -> Self {
        let instrumented = Self {
            driver,
            metrics,
            gauges,
            quarantines_counted: AtomicU64::new(0),
        };
        instrumented.sync_gauges();
        instrumented
    }

    /// The wrapped driver.
    pub fn driver(&self) -> &D {
        &self.driver
    }

    fn sync_gauges(&self) {
        let Some(read) = self.gauges else {
            return;
        };
        let gauges = read(&self.driver);
        self.metrics
            .set_prepared_devices(usize::try_from(gauges.prepared_devices).unwrap_or(usize::MAX));
        let before = self
            .quarantines_counted
            .fetch_max(gauges.checkpoint_quarantines, Ordering::Relaxed);
        for _ in before..gauges.checkpoint_quarantines {
            self.metrics.checkpoint_quarantined();
        }
    }

    fn count<T, E>(
        &self,
        operation: ClaimOperation,
        results: &BTreeMap<ClaimUid, Result<T, E>>,
        started: Instant,
    ) {
        for result in results.values() {
            self.metrics.claim_done(operation, ResultLabel::of(result));
        }
        self.metrics.observe_call(operation, started.elapsed());
        self.sync_gauges();
    }
}

impl<D: DraDriver> DraDriver for InstrumentedDriver<D> {
    type Error = D::Error;

    async fn prepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<ClaimUid, PrepareResult<D::Error>> {
        let started = Instant::now();
        let results = self.driver.prepare(claims).await;
        self.count(ClaimOperation::Prepare, &results, started);
        results
    }

    async fn unprepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> BTreeMap<ClaimUid, UnprepareResult<D::Error>> {
        let started = Instant::now();
        let results = self.driver.unprepare(claims).await;
        self.count(ClaimOperation::Unprepare, &results, started);
        results
    }

    fn device_health(&self) -> Option<watch::Receiver<Vec<DeviceHealth>>> {
        self.driver.device_health()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;

    use super::*;

    /// Prepares claims whose name starts with `ok`, fails the others; reports a quarantine.
    struct Scripted {
        prepared: AtomicU64,
    }

    impl DraDriver for Scripted {
        type Error = String;

        async fn prepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<ClaimUid, PrepareResult> {
            claims
                .into_iter()
                .map(|c| {
                    let result = if c.name.starts_with("ok") {
                        self.prepared.fetch_add(1, Ordering::Relaxed);
                        Ok(Vec::new())
                    } else {
                        Err(format!("claim {c}: refused"))
                    };
                    (c.uid, result)
                })
                .collect()
        }

        async fn unprepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<ClaimUid, UnprepareResult> {
            claims.into_iter().map(|c| (c.uid, Ok(()))).collect()
        }
    }

    #[tokio::test]
    async fn calls_are_counted_timed_and_gauges_synced() {
        let mut registry = Registry::default();
        let metrics = NodeMetrics::new(&mut registry);
        let driver = InstrumentedDriver::new(
            Scripted {
                prepared: AtomicU64::new(0),
            },
            metrics,
            Some(|d: &Scripted| DriverStats {
                prepared_devices: d.prepared.load(Ordering::Relaxed) * 2,
                checkpoint_quarantines: 1,
                ..DriverStats::default()
            }),
        );
        let results = driver
            .prepare(vec![
                ClaimRef::new("ns", "ok-1", "u1"),
                ClaimRef::new("ns", "bad", "u2"),
            ])
            .await;
        assert_eq!(results.len(), 2);
        driver
            .unprepare(vec![ClaimRef::new("ns", "ok-1", "u1")])
            .await;
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for expected in [
            r#"tessera_node_claims_total{operation="prepare",result="success"} 1"#,
            r#"tessera_node_claims_total{operation="prepare",result="error"} 1"#,
            r#"tessera_node_claims_total{operation="unprepare",result="success"} 1"#,
            r#"tessera_node_call_duration_seconds_count{operation="prepare"} 1"#,
            "tessera_node_prepared_devices 2",
            "tessera_node_checkpoint_quarantines_total 1",
        ] {
            assert!(text.contains(expected), "missing `{expected}` in:\n{text}");
        }
    }
}
