//! The node plugin's Prometheus metrics ([`NodeMetrics`]) and what its `/readyz` checks
//! ([`readiness`]); `tessera-process` serves them, with `/healthz`.
//!
//! Every family is registered under the `tessera_node` prefix:
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `tessera_node_claims_total` | counter | `operation` (prepare, unprepare), `result` (success, error) | claims handled, one per claim in a batch |
//! | `tessera_node_call_duration_seconds` | histogram | `operation` | time to answer one `NodePrepareResources` / `NodeUnprepareResources` call |
//! | `tessera_node_prepared_devices` | gauge | | devices held by prepared claims |
//! | `tessera_node_checkpoint_quarantines_total` | counter | | corrupt checkpoints moved aside |
//! | `tessera_node_slice_publications_total` | counter | `result` | attempts to publish the node's ResourceSlices |
//! | `tessera_node_published_devices` | gauge | | devices in the published pool |
//! | `tessera_node_pool_generation` | gauge | | generation of the published pool |
//! | `tessera_node_inventory_scans_total` | counter | `result` | reads of the GPU inventory |
//! | `tessera_node_health_events_total` | counter | `kind` (xid, ecc-single, ecc-double), `action` (taint, ignore) | NVML health events |
//! | `tessera_node_unhealthy_devices` | gauge | | devices currently tainted by health monitoring (XID/ECC findings, lost GPUs) |
//! | `tessera_node_driver_reloads_total` | counter | `change` (version, root), `result` | re-reads of the driver root after its driver changed version, or of a preferred root that got a driver |
//!
//! The per-device GPU metrics and idle claims (`tessera_node_gpu_*`, `tessera_node_idle_claim*`)
//! are [`crate::gpu_metrics`]'s, registered in the same registry.

pub mod instrumented;
pub mod readiness;

use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Which kubelet call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimOperation {
    Prepare,
    Unprepare,
}

/// Success or failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResultLabel {
    Success,
    Error,
}

impl ResultLabel {
    /// `Success` for `Ok`, `Error` for `Err`.
    pub fn of<T, E>(result: &Result<T, E>) -> Self {
        if result.is_ok() {
            ResultLabel::Success
        } else {
            ResultLabel::Error
        }
    }
}

/// A health event's kind, as a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HealthEventLabel {
    Xid,
    EccSingle,
    EccDouble,
}

/// What health monitoring did about an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HealthAction {
    Taint,
    Ignore,
}

/// Label values in lower case, as Prometheus conventions have them.
macro_rules! label_values {
    ($type:ty { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $type {
            /// The label value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text),+
                }
            }
        }

        impl EncodeLabelValue for $type {
            fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
                std::fmt::Write::write_str(encoder, self.as_str())
            }
        }
    };
}

label_values!(ClaimOperation { Prepare => "prepare", Unprepare => "unprepare" });
label_values!(ResultLabel { Success => "success", Error => "error" });
label_values!(HealthEventLabel { Xid => "xid", EccSingle => "ecc-single", EccDouble => "ecc-double" });
label_values!(HealthAction { Taint => "taint", Ignore => "ignore" });
label_values!(DriverChange { Version => "version", Root => "root" });

/// What changed when the driver root was read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DriverChange {
    /// Another driver version under the same root.
    Version,
    /// A more preferred candidate root got a complete driver (the GPU operator's, installed
    /// after the plugin started on the host's).
    Root,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DriverReloadLabels {
    change: DriverChange,
    result: ResultLabel,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ClaimLabels {
    operation: ClaimOperation,
    result: ResultLabel,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OperationLabels {
    operation: ClaimOperation,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: ResultLabel,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct HealthLabels {
    kind: HealthEventLabel,
    action: HealthAction,
}

type HistogramFamily = Family<OperationLabels, Histogram, fn() -> Histogram>;

/// Buckets of the call-duration histogram: 0.5 ms to ~16 s, doubling.
fn call_duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Handles to the node plugin's metrics. Cheap to clone; clones update the same series.
#[derive(Debug, Clone)]
pub struct NodeMetrics {
    claims: Family<ClaimLabels, Counter>,
    call_duration: HistogramFamily,
    prepared_devices: Gauge,
    checkpoint_quarantines: Counter,
    publications: Family<ResultLabels, Counter>,
    published_devices: Gauge,
    pool_generation: Gauge,
    inventory_scans: Family<ResultLabels, Counter>,
    health_events: Family<HealthLabels, Counter>,
    unhealthy_devices: Gauge,
    driver_reloads: Family<DriverReloadLabels, Counter>,
}

impl NodeMetrics {
    /// Creates the families and registers them in `registry` under the `tessera_node` prefix.
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self {
            claims: Family::default(),
            call_duration: Family::new_with_constructor(call_duration_histogram),
            prepared_devices: Gauge::default(),
            checkpoint_quarantines: Counter::default(),
            publications: Family::default(),
            published_devices: Gauge::default(),
            pool_generation: Gauge::default(),
            inventory_scans: Family::default(),
            health_events: Family::default(),
            unhealthy_devices: Gauge::default(),
            driver_reloads: Family::default(),
        };
        let node = registry.sub_registry_with_prefix("tessera_node");
        node.register(
            "claims",
            "Claims handled by the kubelet calls",
            metrics.claims.clone(),
        );
        node.register(
            "call_duration_seconds",
            "Time to answer one NodePrepareResources or NodeUnprepareResources call",
            metrics.call_duration.clone(),
        );
        node.register(
            "prepared_devices",
            "Devices held by prepared claims",
            metrics.prepared_devices.clone(),
        );
        node.register(
            "checkpoint_quarantines",
            "Corrupt checkpoints moved aside and rebuilt",
            metrics.checkpoint_quarantines.clone(),
        );
        node.register(
            "slice_publications",
            "Attempts to publish the node's ResourceSlices",
            metrics.publications.clone(),
        );
        node.register(
            "published_devices",
            "Devices in the published pool",
            metrics.published_devices.clone(),
        );
        node.register(
            "pool_generation",
            "Generation of the published pool",
            metrics.pool_generation.clone(),
        );
        node.register(
            "inventory_scans",
            "Reads of the GPU inventory",
            metrics.inventory_scans.clone(),
        );
        node.register(
            "health_events",
            "NVML XID and ECC events, by what health monitoring did about them",
            metrics.health_events.clone(),
        );
        node.register(
            "unhealthy_devices",
            "Devices currently tainted by health monitoring (XID/ECC findings, lost GPUs)",
            metrics.unhealthy_devices.clone(),
        );
        node.register(
            "driver_reloads",
            "Re-reads of the driver root after the NVIDIA driver under it changed version, or of \
             a more preferred driver root that got a complete driver",
            metrics.driver_reloads.clone(),
        );
        metrics
    }

    /// Counts one re-read of the driver root after its driver changed version, or of another
    /// root the plugin moves to.
    pub fn driver_reload(&self, change: DriverChange, result: ResultLabel) {
        self.driver_reloads
            .get_or_create(&DriverReloadLabels { change, result })
            .inc();
    }

    /// Counts one claim of a prepare or unprepare call.
    pub fn claim_done(&self, operation: ClaimOperation, result: ResultLabel) {
        self.claims
            .get_or_create(&ClaimLabels { operation, result })
            .inc();
    }

    /// Records how long one prepare or unprepare call took.
    pub fn observe_call(&self, operation: ClaimOperation, elapsed: Duration) {
        self.call_duration
            .get_or_create(&OperationLabels { operation })
            .observe(elapsed.as_secs_f64());
    }

    /// Sets the number of devices held by prepared claims.
    pub fn set_prepared_devices(&self, count: usize) {
        self.prepared_devices.set(gauge_value(count));
    }

    /// Counts a corrupt checkpoint that was quarantined.
    pub fn checkpoint_quarantined(&self) {
        self.checkpoint_quarantines.inc();
    }

    /// Counts one attempt to publish the pool.
    pub fn publication(&self, result: ResultLabel) {
        self.publications
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Records the published pool's size and generation.
    pub fn set_published_pool(&self, devices: usize, generation: i64) {
        self.published_devices.set(gauge_value(devices));
        self.pool_generation.set(generation);
    }

    /// Counts one inventory read.
    pub fn inventory_scan(&self, result: ResultLabel) {
        self.inventory_scans
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Counts one health event and what was done about it.
    pub fn health_event(&self, kind: HealthEventLabel, action: HealthAction) {
        self.health_events
            .get_or_create(&HealthLabels { kind, action })
            .inc();
    }

    /// Sets the number of devices tainted by health monitoring.
    pub fn set_unhealthy_devices(&self, count: usize) {
        self.unhealthy_devices.set(gauge_value(count));
    }
}

fn gauge_value(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    #[test]
    fn families_render_with_prefix_and_labels() {
        let mut registry = Registry::default();
        let metrics = NodeMetrics::new(&mut registry);
        metrics.claim_done(ClaimOperation::Prepare, ResultLabel::Success);
        metrics.claim_done(ClaimOperation::Prepare, ResultLabel::Success);
        metrics.claim_done(ClaimOperation::Unprepare, ResultLabel::Error);
        metrics.observe_call(ClaimOperation::Prepare, Duration::from_millis(3));
        metrics.set_prepared_devices(8);
        metrics.checkpoint_quarantined();
        metrics.publication(ResultLabel::of::<(), ()>(&Ok(())));
        metrics.set_published_pool(8, 3);
        metrics.health_event(HealthEventLabel::Xid, HealthAction::Taint);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for expected in [
            r#"tessera_node_claims_total{operation="prepare",result="success"} 2"#,
            r#"tessera_node_claims_total{operation="unprepare",result="error"} 1"#,
            r#"tessera_node_call_duration_seconds_bucket{le="0.004",operation="prepare"} 1"#,
            "tessera_node_prepared_devices 8",
            "tessera_node_checkpoint_quarantines_total 1",
            r#"tessera_node_slice_publications_total{result="success"} 1"#,
            "tessera_node_pool_generation 3",
            r#"tessera_node_health_events_total{kind="xid",action="taint"} 1"#,
        ] {
            assert!(text.contains(expected), "missing `{expected}` in:\n{text}");
        }
    }
}
