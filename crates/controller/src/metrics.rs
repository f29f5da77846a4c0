//! The controller's Prometheus metrics (`/metrics`), all prefixed `tessera_controller_`.

use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tessera_placement::pods::CapacityWaits;
use tessera_placement::reason::PodReason;
use tessera_webhook::server::Reviews;

use crate::api::WriteError;

/// Latency buckets in seconds: fine below 100 ms, where decisions should be.
const LATENCY_BUCKETS: [f64; 20] = [
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The `reason` label of failures.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// Every metric the controller exports.
pub struct Metrics {
    registry: Registry,
    /// Pods whose claims the controller allocated and released to the scheduler.
    pub pods_placed: Counter,
    /// Claims whose allocation the controller wrote.
    pub claims_allocated: Counter,
    /// Claim allocations the controller cleared again (partial writes, re-placements).
    pub claims_undone: Counter,
    /// Pods released without allocation because a claim needs devices the controller does not manage.
    pub pods_left_to_scheduler: Counter,
    /// Failed attempts by reason: `Unsatisfiable`, `InvalidInput`, `WaitingForClaims`,
    /// `Conflict`, `ApiError`, `NotLeader`.
    pub failures: Family<ReasonLabel, Counter>,
    /// From taking a pod off the queue to the decision (allocation computed), seconds.
    pub decision_seconds: Histogram,
    /// From taking a pod off the queue to its gate removed, seconds (placements only).
    pub placement_seconds: Histogram,
    /// Pods ready to process.
    pub queue_ready: Gauge,
    /// Pods waiting for a retry or a cluster change.
    pub queue_waiting: Gauge,
    /// 1 while this replica is the leader.
    pub leader: Gauge,
    /// Rebuilds of the device inventory (slices, classes or nodes changed).
    pub inventory_rebuilds: Counter,
    /// Events not published because their queue was full ([`crate::events`]).
    pub events_dropped: Counter,
    /// Gated pods the cluster has no room for now, by reason (`Unsatisfiable`,
    /// `GroupUnsatisfiable`, `PreemptionBlocked`): read from the pods' conditions when scraped.
    pub pods_waiting_for_capacity: Family<ReasonLabel, Gauge>,
    /// How long the pod that has waited longest for room has waited, seconds.
    pub capacity_wait_longest: Gauge<f64, AtomicU64>,
    /// Where the two above are read from when scraped ([`Metrics::watch_capacity`]).
    capacity: OnceLock<CapacitySource>,
    /// The admission webhook's answers, by webhook and result.
    pub admission_reviews: Reviews,
    /// Preemption plans carried out (a preemptor nominated, its victims evicted).
    pub preemptions: Counter,
    /// Pods evicted through the Eviction API to free devices.
    pub preemption_victims: Counter,
    /// GPU-hours of work the victims of preemption plans had run when evicted.
    pub preemption_gpu_hours: Counter<f64, std::sync::atomic::AtomicU64>,
    /// Evictions refused (a PodDisruptionBudget, or several covering the pod).
    pub evictions_refused: Counter,
}

/// What the capacity gauges are read from at each scrape.
type CapacitySource = Box<dyn Fn() -> CapacityWaits + Send + Sync>;

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        // The build info at the root (`tessera_build_info`, the same name in both servers), the
        // controller's own metrics under `tessera_controller_`.
        let mut root = Registry::default();
        tessera_process::build::register(&mut root);
        let metrics = Metrics {
            pods_placed: Counter::default(),
            claims_allocated: Counter::default(),
            claims_undone: Counter::default(),
            pods_left_to_scheduler: Counter::default(),
            failures: Family::default(),
            decision_seconds: Histogram::new(LATENCY_BUCKETS),
            placement_seconds: Histogram::new(LATENCY_BUCKETS),
            queue_ready: Gauge::default(),
            queue_waiting: Gauge::default(),
            leader: Gauge::default(),
            inventory_rebuilds: Counter::default(),
            events_dropped: Counter::default(),
            pods_waiting_for_capacity: Family::default(),
            capacity_wait_longest: Gauge::default(),
            capacity: OnceLock::new(),
            admission_reviews: Reviews::default(),
            preemptions: Counter::default(),
            preemption_victims: Counter::default(),
            preemption_gpu_hours: Counter::default(),
            evictions_refused: Counter::default(),
            registry: Registry::default(),
        };
        metrics.register(root.sub_registry_with_prefix("tessera_controller"));
        Metrics {
            registry: root,
            ..metrics
        }
    }

    /// Registers every metric (their names without the prefix) under `registry`.
    fn register_preemption(&self, registry: &mut Registry) {
        registry.register(
            "preemptions",
            "Preemption plans carried out: a pod nominated for devices that pods of lower priority free",
            self.preemptions.clone(),
        );
        registry.register(
            "preemption_victims",
            "Pods evicted through the Eviction API to free devices for a pod of higher priority",
            self.preemption_victims.clone(),
        );
        registry.register(
            "preemption_gpu_hours",
            "GPU-hours of work run by the victims of preemption plans when they were evicted",
            self.preemption_gpu_hours.clone(),
        );
        registry.register(
            "evictions_refused",
            "Evictions the API server refused (a PodDisruptionBudget allows no disruption)",
            self.evictions_refused.clone(),
        );
    }

    fn register(&self, registry: &mut Registry) {
        self.register_preemption(registry);
        registry.register(
            "pods_placed",
            "Pods whose claims were allocated and whose gate was removed",
            self.pods_placed.clone(),
        );
        registry.register(
            "claims_allocated",
            "Claim allocations written",
            self.claims_allocated.clone(),
        );
        registry.register(
            "claims_undone",
            "Claim allocations cleared again (partial writes undone, re-placements)",
            self.claims_undone.clone(),
        );
        registry.register(
            "pods_left_to_scheduler",
            "Pods released to the default scheduler because a claim needs devices that are not topology-managed",
            self.pods_left_to_scheduler.clone(),
        );
        registry.register(
            "failures",
            "Attempts that did not place a pod, by reason",
            self.failures.clone(),
        );
        registry.register(
            "decision_duration_seconds",
            "Time from taking a pod off the queue to the placement decision",
            self.decision_seconds.clone(),
        );
        registry.register(
            "placement_duration_seconds",
            "Time from taking a pod off the queue to its claims written and its gate removed",
            self.placement_seconds.clone(),
        );
        registry.register(
            "queue_ready",
            "Pods ready to be processed",
            self.queue_ready.clone(),
        );
        registry.register(
            "queue_waiting",
            "Pods waiting for a retry or a cluster change",
            self.queue_waiting.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            self.leader.clone(),
        );
        registry.register(
            "inventory_rebuilds",
            "Rebuilds of the device inventory after ResourceSlices, DeviceClasses or Nodes changed",
            self.inventory_rebuilds.clone(),
        );
        registry.register(
            "pods_waiting_for_capacity",
            "Gated pods the cluster has no room for now (their condition gpu.tessera.dev/TopologyAwarePlacement is False with this reason), by reason",
            self.pods_waiting_for_capacity.clone(),
        );
        registry.register(
            "capacity_wait_longest_seconds",
            "How long the gated pod that has waited longest for room has waited (since its condition's lastTransitionTime)",
            self.capacity_wait_longest.clone(),
        );
        registry.register(
            "admission_reviews",
            "AdmissionReviews the webhook answered, by webhook and result (patched, allowed, refused, bad-request)",
            self.admission_reviews.clone(),
        );
        registry.register(
            "events_dropped",
            "Pod events not published because the queue of events to publish was full",
            self.events_dropped.clone(),
        );
    }

    /// Reads the capacity gauges from `source` at every scrape (the controller's pod cache: the
    /// conditions the leader wrote, so every replica reports the same). Set once; later calls
    /// are ignored.
    pub fn watch_capacity(&self, source: impl Fn() -> CapacityWaits + Send + Sync + 'static) {
        let _ = self.capacity.set(Box::new(source));
    }

    /// Sets the capacity gauges from their source, if one is set.
    fn refresh_capacity(&self) {
        let Some(source) = self.capacity.get() else {
            return;
        };
        let waits = source();
        for (reason, pods) in &waits.pods {
            self.pods_waiting_for_capacity
                .get_or_create(&ReasonLabel {
                    reason: reason.as_str().to_owned(),
                })
                .set(i64::try_from(*pods).unwrap_or(i64::MAX));
        }
        self.capacity_wait_longest
            .set(waits.longest.as_secs_f64().max(0.0));
    }

    /// Counts an attempt that did not place a pod, by the pod's reason.
    pub fn pod_failure(&self, reason: PodReason) {
        self.failure(reason.as_str());
    }

    /// Counts an attempt whose write failed, by the write's failure.
    pub fn write_failure(&self, error: &WriteError) {
        self.failure(error.reason());
    }

    fn failure(&self, reason: &str) {
        self.failures
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        tessera_process::MetricsText::encode(self).expect("writing to a String cannot fail")
    }
}

impl tessera_process::MetricsText for Metrics {
    fn encode(&self) -> Result<String, std::fmt::Error> {
        self.refresh_capacity();
        tessera_process::MetricsText::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_exported_with_the_prefix() {
        let m = Metrics::new();
        m.pods_placed.inc();
        m.pod_failure(PodReason::Unsatisfiable);
        m.decision_seconds.observe(0.004);
        let text = m.encode();
        assert!(
            text.contains("tessera_controller_pods_placed_total 1"),
            "{text}"
        );
        let build = format!(
            "tessera_build_info{{version=\"{}\",git_commit=\"{}\"",
            tessera_process::build::VERSION,
            tessera_process::build::GIT_COMMIT
        );
        assert!(text.contains(&build), "{build} missing from\n{text}");
        assert!(
            text.contains("tessera_controller_failures_total{reason=\"Unsatisfiable\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("tessera_controller_decision_duration_seconds_bucket{le=\"0.005\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn the_capacity_gauges_are_read_at_each_scrape() {
        let m = Metrics::new();
        let waits = std::sync::Arc::new(std::sync::Mutex::new(CapacityWaits::default()));
        let source = waits.clone();
        m.watch_capacity(move || source.lock().unwrap().clone());
        *waits.lock().unwrap() = CapacityWaits {
            pods: [
                (PodReason::Unsatisfiable, 3),
                (PodReason::GroupUnsatisfiable, 0),
            ]
            .into(),
            longest: k8s_openapi::jiff::SignedDuration::from_secs(90),
        };
        let text = m.encode();
        for line in [
            "tessera_controller_pods_waiting_for_capacity{reason=\"Unsatisfiable\"} 3",
            "tessera_controller_pods_waiting_for_capacity{reason=\"GroupUnsatisfiable\"} 0",
            "tessera_controller_capacity_wait_longest_seconds 90.0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        waits
            .lock()
            .unwrap()
            .pods
            .insert(PodReason::Unsatisfiable, 0);
        assert!(
            m.encode().contains(
                "tessera_controller_pods_waiting_for_capacity{reason=\"Unsatisfiable\"} 0"
            )
        );
    }
}
