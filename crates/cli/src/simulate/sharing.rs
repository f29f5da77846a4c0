//! `tessera simulate --sharing`: how many GPUs consumable shares save. The same trace of
//! single-GPU claims, each with the device memory its workload needs, is allocated twice with
//! first fit (what kube-scheduler does): once on nodes published whole (each claim takes a GPU,
//! as with the device plugin without sharing), once on the same nodes published with consumable
//! shares in `memory` mode (each claim asks for its memory; claims share a GPU while their memory
//! fits). The report compares the GPUs in use.

use std::collections::HashMap;
use std::io::Write;

use k8s_openapi::api::resource::v1::{
    AllocationResult, CapacityRequirements, DeviceClaim, DeviceRequest, ExactDeviceRequest,
    ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use tessera_allocator::{AllocateOptions, Outcome, PlacementMode};
use tessera_api::names::{GPU_DEVICE_CLASS, capacity};
use tessera_api::shares::ConsumableShares;

use super::cluster::cluster_with;
use super::live::LiveClaims;
use super::scenario::{SharingSpec, SimulationScenario};
use super::stats::round2;
use super::trace::draw_trace;

#[derive(Debug, Clone, Copy)]
struct SharingClaim {
    memory_gib: u32,
    lifetime: u64,
}

fn trace(spec: &SharingSpec, seed: u64) -> Vec<SharingClaim> {
    draw_trace(spec.claims, &spec.memory_gib, &spec.lifetime, seed)
        .map(|(memory_gib, lifetime)| SharingClaim {
            memory_gib,
            lifetime,
        })
        .collect()
}

/// What one way of publishing achieved.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SharingMetrics {
    pub claims: usize,
    pub allocated: usize,
    pub rejected: usize,
    /// Most GPUs holding at least one claim at once.
    pub peak_gpus_in_use: usize,
    /// GPUs holding at least one claim, averaged over the arrivals.
    pub mean_gpus_in_use: f64,
    /// Live claims per GPU in use, averaged over the arrivals.
    pub mean_claims_per_gpu: f64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SharingReport {
    gpus: usize,
    whole_gpu: SharingMetrics,
    shared: SharingMetrics,
    /// `wholeGpu.meanGpusInUse - shared.meanGpusInUse`.
    mean_gpus_saved: f64,
    /// `wholeGpu.peakGpusInUse - shared.peakGpusInUse`.
    peak_gpus_saved: i64,
}

fn claim(index: usize, memory_gib: Option<u32>) -> ResourceClaim {
    let capacity = memory_gib.map(|gib| CapacityRequirements {
        requests: Some(
            [(capacity::MEMORY.to_owned(), Quantity(format!("{gib}Gi")))]
                .into_iter()
                .collect(),
        ),
    });
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(format!("share-{index}")),
            namespace: Some("simulate".into()),
            uid: Some(format!("share-{index}")),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "gpu".into(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: GPU_DEVICE_CLASS.into(),
                        capacity,
                        ..Default::default()
                    }),
                    first_available: None,
                }]),
                ..Default::default()
            }),
        }),
        status: None,
    }
}

/// The GPUs in use while a trace is replayed, and the metrics sampled at each arrival.
#[derive(Default)]
struct Usage {
    /// Live claims per `(pool, device)` holding at least one.
    per_gpu: HashMap<(String, String), usize>,
    allocated: usize,
    rejected: usize,
    peak: usize,
    gpu_sum: usize,
    density_sum: f64,
    samples: usize,
}

impl Usage {
    fn released(&mut self, gpu: (String, String)) {
        if let Some(n) = self.per_gpu.get_mut(&gpu) {
            *n -= 1;
            if *n == 0 {
                self.per_gpu.remove(&gpu);
            }
        }
    }

    /// Samples the GPUs in use after an arrival, with `live` claims holding them.
    fn sample(&mut self, live: usize) {
        let in_use = self.per_gpu.len();
        self.peak = self.peak.max(in_use);
        self.gpu_sum += in_use;
        if in_use > 0 {
            self.density_sum += live as f64 / in_use as f64;
        }
        self.samples += 1;
    }

    fn metrics(&self, claims: usize) -> SharingMetrics {
        let mean = |sum: f64| {
            if self.samples == 0 {
                0.0
            } else {
                round2(sum / self.samples as f64)
            }
        };
        SharingMetrics {
            claims,
            allocated: self.allocated,
            rejected: self.rejected,
            peak_gpus_in_use: self.peak,
            mean_gpus_in_use: mean(self.gpu_sum as f64),
            mean_claims_per_gpu: mean(self.density_sum),
        }
    }
}

/// The first allocation of an outcome, and the `(pool, device)` of its first device.
fn first_device(allocation: tessera_allocator::Allocation) -> (AllocationResult, (String, String)) {
    let result = allocation
        .claims
        .into_iter()
        .next()
        .map(|c| c.result)
        .unwrap_or_default();
    let device = result
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .and_then(|r| r.first())
        .map(|r| (r.pool.clone(), r.device.clone()))
        .unwrap_or_default();
    (result, device)
}

fn run_one(
    scenario: &SimulationScenario,
    trace: &[SharingClaim],
    mode: ConsumableShares,
) -> anyhow::Result<(usize, SharingMetrics)> {
    let cluster = cluster_with(scenario, mode)?;
    let options = AllocateOptions {
        mode: PlacementMode::FirstFit,
        explain: false,
        ..AllocateOptions::default()
    };
    let mut live = LiveClaims::new();
    let mut usage = Usage::default();
    for (index, tc) in trace.iter().enumerate() {
        live.depart(index as u64, |gpu| usage.released(gpu))?;
        let memory = mode.enabled().then_some(tc.memory_gib);
        let claims = [claim(index, memory)];
        match cluster
            .inventory
            .allocate(&claims, &live.state, None, &options)?
        {
            Outcome::Allocated(a) => {
                usage.allocated += 1;
                let (result, device) = first_device(a);
                *usage.per_gpu.entry(device.clone()).or_default() += 1;
                live.arrive(index, tc.lifetime, result, device)?;
            }
            Outcome::Unsatisfiable(_) => usage.rejected += 1,
        }
        usage.sample(live.len());
    }
    Ok((cluster.gpus.len(), usage.metrics(trace.len())))
}

/// Runs the sharing trace of `scenario` (its `sharing` section, or the default) and writes the
/// report.
pub(super) fn run(
    scenario: &SimulationScenario,
    seed: u64,
    json: bool,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let spec = scenario
        .sharing
        .clone()
        .unwrap_or_else(SharingSpec::default_spec);
    let trace = trace(&spec, seed);
    let (gpus, whole_gpu) = run_one(scenario, &trace, ConsumableShares::Disabled)?;
    let (_, shared) = run_one(scenario, &trace, ConsumableShares::Memory)?;
    let report = SharingReport {
        gpus,
        mean_gpus_saved: round2(whole_gpu.mean_gpus_in_use - shared.mean_gpus_in_use),
        peak_gpus_saved: whole_gpu.peak_gpus_in_use as i64 - shared.peak_gpus_in_use as i64,
        whole_gpu,
        shared,
    };
    if json {
        serde_json::to_writer_pretty(&mut *out, &report)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "{} GPUs, {} single-GPU claims by memory (seed {seed}), first fit\n",
        report.gpus,
        trace.len()
    )?;
    writeln!(out, "{:<20} {:>10} {:>10}", "METRIC", "WHOLE-GPU", "SHARED")?;
    let (w, s) = (&report.whole_gpu, &report.shared);
    for (name, a, b) in [
        ("claims", w.claims.to_string(), s.claims.to_string()),
        (
            "allocated",
            w.allocated.to_string(),
            s.allocated.to_string(),
        ),
        ("rejected", w.rejected.to_string(), s.rejected.to_string()),
        (
            "peakGpusInUse",
            w.peak_gpus_in_use.to_string(),
            s.peak_gpus_in_use.to_string(),
        ),
        (
            "meanGpusInUse",
            w.mean_gpus_in_use.to_string(),
            s.mean_gpus_in_use.to_string(),
        ),
        (
            "meanClaimsPerGpu",
            w.mean_claims_per_gpu.to_string(),
            s.mean_claims_per_gpu.to_string(),
        ),
    ] {
        writeln!(out, "{name:<20} {a:>10} {b:>10}")?;
    }
    writeln!(
        out,
        "\nGPUs saved by sharing: {} on average, {} at the peak",
        report.mean_gpus_saved, report.peak_gpus_saved
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::scenario::NodeGroup;
    use crate::simulate::trace::Lifetime;

    fn small(claims: usize) -> SimulationScenario {
        SimulationScenario {
            nodes: vec![NodeGroup {
                topology: "dgx-h100".into(),
                count: 1,
                name_prefix: None,
            }],
            trace: SimulationScenario::default_scenario().trace,
            sharing: Some(SharingSpec {
                claims,
                memory_gib: [(20, 1)].into(),
                lifetime: Lifetime {
                    min: 1000,
                    max: 1000,
                },
            }),
        }
    }

    #[test]
    fn shared_gpus_hold_as_many_claims_as_their_memory_fits() {
        // 12 claims of 20Gi that never leave, on one node of eight 81559Mi H100s: whole GPUs
        // take 8 and refuse 4; shared, three fit a GPU, so 4 GPUs hold all 12.
        let scenario = small(12);
        let spec = scenario.sharing.clone().unwrap();
        let trace = trace(&spec, 1);
        let (gpus, whole) = run_one(&scenario, &trace, ConsumableShares::Disabled).unwrap();
        let (_, shared) = run_one(&scenario, &trace, ConsumableShares::Memory).unwrap();
        assert_eq!(gpus, 8);
        assert_eq!((whole.allocated, whole.rejected), (8, 4));
        assert_eq!(whole.peak_gpus_in_use, 8);
        assert_eq!((shared.allocated, shared.rejected), (12, 0));
        assert_eq!(shared.peak_gpus_in_use, 4);
        assert_eq!(shared.mean_claims_per_gpu, 2.48);
    }

    #[test]
    fn the_report_says_what_sharing_saved() {
        let mut out = Vec::new();
        run(&small(6), 1, true, &mut out).unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(report["wholeGpu"]["peakGpusInUse"], 6);
        assert_eq!(report["shared"]["peakGpusInUse"], 2);
        assert_eq!(report["peakGpusSaved"], 4);
        let mut text = Vec::new();
        run(&small(6), 1, false, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("GPUs saved by sharing"), "{text}");
    }

    #[test]
    fn bad_sharing_specs_are_refused_with_the_field() {
        let mut spec = SharingSpec::default_spec();
        spec.memory_gib = [(0, 1)].into();
        assert!(
            spec.check()
                .unwrap_err()
                .to_string()
                .contains("sharing.memoryGiB")
        );
        let mut spec = SharingSpec::default_spec();
        spec.lifetime = Lifetime { min: 3, max: 1 };
        assert!(
            spec.check()
                .unwrap_err()
                .to_string()
                .contains("sharing.lifetime")
        );
    }
}
