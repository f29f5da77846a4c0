//! Per-device GPU metrics: the plugin samples every GPU at an interval (utilization, memory,
//! power, temperature, ECC and XID counts) and exports the values labelled with who holds the
//! device — `namespace`, `pod`, `claim`, `request`, `device` (the published device name) and
//! `uuid` (the physical GPU). The plugin is the one component that knows this mapping: its
//! checkpoint says which prepared claim holds which device, and the claim's `status.reservedFor`
//! names the pods.
//!
//! - [`series`] (pure): the label sets of one sample. A GPU no claim holds gets one series with
//!   empty `namespace`, `pod`, `claim` and `request` (Prometheus reads an empty label as
//!   absent). A GPU held by claims gets one series per claim device and pod: a MIG device or a
//!   share of a consumable-shares GPU reports the values of its whole GPU (NVML reports
//!   utilization per physical GPU).
//! - [`GpuMetrics`]: the families, and [`GpuMetrics::update`], which removes every series not in
//!   the latest sample, so cardinality stays bounded by the devices and claims on the node: a
//!   claim's series go with the claim.
//! - [`idle`]: idle-claim detection (a claim whose GPUs stayed below a threshold for a window).
//! - [`monitor`]: the loop that samples, labels, exports and reports idle claims (an Event on
//!   their pods).
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `tessera_node_gpu_utilization_percent` | gauge | device labels | percent of the last NVML sample period a kernel ran |
//! | `tessera_node_gpu_memory_utilization_percent` | gauge | device labels | percent of the period device memory was read or written |
//! | `tessera_node_gpu_memory_used_bytes` | gauge | device labels | device memory in use |
//! | `tessera_node_gpu_memory_total_bytes` | gauge | device labels | device memory |
//! | `tessera_node_gpu_power_watts` | gauge | device labels | power draw |
//! | `tessera_node_gpu_temperature_celsius` | gauge | device labels | GPU temperature |
//! | `tessera_node_gpu_ecc_corrected_errors` | gauge | device labels | corrected ECC errors since the driver loaded |
//! | `tessera_node_gpu_ecc_uncorrected_errors` | gauge | device labels | uncorrected ECC errors since the driver loaded |
//! | `tessera_node_gpu_xid_errors` | gauge | device labels | XID errors the health monitor saw since the plugin started |
//! | `tessera_node_gpu_samples_total` | counter | `result` | samples taken |
//! | `tessera_node_idle_claim` | gauge | `namespace`, `claim` | 1 while a claim is idle (series only for idle claims) |
//! | `tessera_node_idle_claims` | gauge | | claims idle now |
//!
//! A value the GPU does not offer (no ECC, no power reading) has no series.

pub mod idle;
pub mod monitor;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tessera_kubelet_grpc::ClaimUid;
use tessera_nvml::{GpuTelemetry, NvmlSource};
use tessera_prepare::driver::HeldDevice;

use crate::metrics::ResultLabel;

/// Where samples come from: NVML, or a test's values.
pub trait TelemetrySource: Send + Sync + 'static {
    /// One sample of every GPU (blocking).
    fn sample(&self) -> Result<Vec<GpuTelemetry>, String>;
}

impl TelemetrySource for NvmlSource {
    fn sample(&self) -> Result<Vec<GpuTelemetry>, String> {
        self.telemetry().map_err(|e| e.to_string())
    }
}

/// A pod a claim is reserved for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// The labels of a device series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
pub struct DeviceLabels {
    pub namespace: String,
    pub pod: String,
    pub claim: String,
    pub request: String,
    pub device: String,
    pub uuid: String,
}

/// The label sets of one sample, each with the GPU whose values it carries (see the module
/// documentation). `pods` maps claim UIDs to the pods they are reserved for; `device_name`
/// names a GPU no claim holds by its UUID (`gpu-<minor>`; `None`: the UUID is used).
pub fn series<'a>(
    gpus: &'a [GpuTelemetry],
    holders: &[HeldDevice],
    pods: &HashMap<ClaimUid, Vec<PodRef>>,
    device_name: impl Fn(&str) -> Option<String>,
) -> Vec<(DeviceLabels, &'a GpuTelemetry)> {
    let mut by_gpu: BTreeMap<&str, Vec<&HeldDevice>> = BTreeMap::new();
    for holder in holders {
        by_gpu.entry(&holder.gpu_uuid).or_default().push(holder);
    }
    let mut out = Vec::new();
    for gpu in gpus {
        let Some(held) = by_gpu.get(gpu.uuid.as_str()) else {
            out.push((
                DeviceLabels {
                    namespace: String::new(),
                    pod: String::new(),
                    claim: String::new(),
                    request: String::new(),
                    device: device_name(&gpu.uuid).unwrap_or_else(|| gpu.uuid.clone()),
                    uuid: gpu.uuid.clone(),
                },
                gpu,
            ));
            continue;
        };
        for holder in held {
            let labels = |pod: &str| DeviceLabels {
                namespace: holder.namespace.clone(),
                pod: pod.to_owned(),
                claim: holder.claim.clone(),
                request: holder.request.clone(),
                device: holder.device.clone(),
                uuid: gpu.uuid.clone(),
            };
            match pods.get(&holder.claim_uid).filter(|p| !p.is_empty()) {
                Some(pods) => out.extend(pods.iter().map(|p| (labels(&p.name), gpu))),
                None => out.push((labels(""), gpu)),
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.dedup_by(|a, b| a.0 == b.0);
    out
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: ResultLabel,
}

/// The labels of an idle claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
pub struct ClaimLabels {
    pub namespace: String,
    pub claim: String,
}

type Values = Family<DeviceLabels, Gauge>;

/// Handles to the per-device families. Cheap to clone; clones update the same series.
#[derive(Debug, Clone)]
pub struct GpuMetrics {
    utilization: Values,
    memory_utilization: Values,
    memory_used: Values,
    memory_total: Values,
    power: Family<DeviceLabels, Gauge<f64, AtomicU64>>,
    temperature: Values,
    ecc_corrected: Values,
    ecc_uncorrected: Values,
    xid: Values,
    samples: Family<ResultLabels, Counter>,
    idle: Family<ClaimLabels, Gauge>,
    idle_claims: Gauge,
    /// The label sets of the latest update (what the next one removes if gone).
    current: Arc<Mutex<BTreeSet<DeviceLabels>>>,
    current_idle: Arc<Mutex<BTreeSet<ClaimLabels>>>,
}

impl GpuMetrics {
    /// Creates the families and registers them in `registry` under the `tessera_node` prefix.
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self {
            utilization: Values::default(),
            memory_utilization: Values::default(),
            memory_used: Values::default(),
            memory_total: Values::default(),
            power: Family::default(),
            temperature: Values::default(),
            ecc_corrected: Values::default(),
            ecc_uncorrected: Values::default(),
            xid: Values::default(),
            samples: Family::default(),
            idle: Family::default(),
            idle_claims: Gauge::default(),
            current: Arc::default(),
            current_idle: Arc::default(),
        };
        metrics.register(registry.sub_registry_with_prefix("tessera_node"));
        metrics
    }

    fn register(&self, node: &mut Registry) {
        let values: [(&str, &str, &Values); 8] = [
            (
                "gpu_utilization_percent",
                "Percent of the last NVML sample period a kernel ran on the GPU",
                &self.utilization,
            ),
            (
                "gpu_memory_utilization_percent",
                "Percent of the last NVML sample period the GPU's memory was read or written",
                &self.memory_utilization,
            ),
            (
                "gpu_memory_used_bytes",
                "GPU memory in use",
                &self.memory_used,
            ),
            ("gpu_memory_total_bytes", "GPU memory", &self.memory_total),
            (
                "gpu_temperature_celsius",
                "GPU temperature",
                &self.temperature,
            ),
            (
                "gpu_ecc_corrected_errors",
                "Corrected ECC errors since the driver loaded",
                &self.ecc_corrected,
            ),
            (
                "gpu_ecc_uncorrected_errors",
                "Uncorrected ECC errors since the driver loaded",
                &self.ecc_uncorrected,
            ),
            (
                "gpu_xid_errors",
                "XID errors the health monitor saw on the GPU since the plugin started",
                &self.xid,
            ),
        ];
        for (name, help, family) in values {
            node.register(name, help, family.clone());
        }
        node.register("gpu_power_watts", "GPU power draw", self.power.clone());
        node.register("gpu_samples", "GPU samples taken", self.samples.clone());
        node.register(
            "idle_claim",
            "1 while a claim's GPUs stay below the idle threshold for the idle window",
            self.idle.clone(),
        );
        node.register("idle_claims", "Claims idle now", self.idle_claims.clone());
    }

    /// Counts one sample.
    pub fn sampled(&self, result: ResultLabel) {
        self.samples.get_or_create(&ResultLabels { result }).inc();
    }

    /// Sets the series of one sample and removes every series the previous update had that this
    /// one has not. `xids` counts the XID errors of a GPU by UUID.
    pub fn update(&self, series: &[(DeviceLabels, &GpuTelemetry)], xids: impl Fn(&str) -> u64) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let now: BTreeSet<DeviceLabels> = series.iter().map(|(l, _)| l.clone()).collect();
        for gone in current.difference(&now) {
            self.remove(gone);
        }
        for (labels, gpu) in series {
            self.set(labels, gpu, xids(&gpu.uuid));
        }
        *current = now;
    }

    fn set(&self, labels: &DeviceLabels, gpu: &GpuTelemetry, xids: u64) {
        let int = |family: &Values, value: Option<u64>| match value {
            Some(value) => {
                family
                    .get_or_create(labels)
                    .set(i64::try_from(value).unwrap_or(i64::MAX));
            }
            None => {
                family.remove(labels);
            }
        };
        int(&self.utilization, gpu.utilization_percent.map(u64::from));
        int(
            &self.memory_utilization,
            gpu.memory_utilization_percent.map(u64::from),
        );
        int(&self.memory_used, gpu.memory_used_bytes);
        int(&self.memory_total, gpu.memory_total_bytes);
        int(&self.temperature, gpu.temperature_celsius.map(u64::from));
        int(&self.ecc_corrected, gpu.ecc_corrected);
        int(&self.ecc_uncorrected, gpu.ecc_uncorrected);
        int(&self.xid, Some(xids));
        match gpu.power_milliwatts {
            Some(milliwatts) => {
                self.power
                    .get_or_create(labels)
                    .set(f64::from(milliwatts) / 1000.0);
            }
            None => {
                self.power.remove(labels);
            }
        }
    }

    fn remove(&self, labels: &DeviceLabels) {
        for family in [
            &self.utilization,
            &self.memory_utilization,
            &self.memory_used,
            &self.memory_total,
            &self.temperature,
            &self.ecc_corrected,
            &self.ecc_uncorrected,
            &self.xid,
        ] {
            family.remove(labels);
        }
        self.power.remove(labels);
    }

    /// Sets the idle claims (exactly these have an `idle_claim` series).
    pub fn set_idle(&self, idle: BTreeSet<ClaimLabels>) {
        let mut current = self.current_idle.lock().unwrap_or_else(|e| e.into_inner());
        for gone in current.difference(&idle) {
            self.idle.remove(gone);
        }
        for claim in &idle {
            self.idle.get_or_create(claim).set(1);
        }
        self.idle_claims
            .set(i64::try_from(idle.len()).unwrap_or(i64::MAX));
        *current = idle;
    }

    /// How many device series the latest update set (for tests and the bench).
    pub fn series_count(&self) -> usize {
        self.current.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests;
