//! GPU telemetry for the node plugin's per-device metrics: one [`GpuTelemetry`] per GPU, read
//! through nvml-wrapper with the calls a monitoring agent makes on real GPUs —
//! `utilization_rates` (`nvmlDeviceGetUtilizationRates`), `memory_info`
//! (`nvmlDeviceGetMemoryInfo_v2`), `power_usage` (`nvmlDeviceGetPowerUsage`), `temperature`
//! (`nvmlDeviceGetTemperature`, the GPU sensor) and `total_ecc_errors`
//! (`nvmlDeviceGetTotalEccErrors`, volatile counters: since the driver loaded).
//!
//! A query the GPU does not offer (`NVML_ERROR_NOT_SUPPORTED`: no ECC on a GeForce, no power
//! reading on some boards) leaves its value out; any other failure (a lost GPU) leaves it out and
//! is listed in [`GpuTelemetry::failures`]. Only whole GPUs are read: NVML reports utilization
//! per physical GPU, not per MIG device.

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};

use super::error::{CallError, NvmlError};

/// What one GPU reported in one sample. `None`: the GPU does not offer the value, or the query
/// failed (then it is in `failures`).
#[derive(Debug, Default)]
pub struct GpuTelemetry {
    pub uuid: String,
    /// Percent of the last sample period a kernel ran (0–100).
    pub utilization_percent: Option<u32>,
    /// Percent of the last sample period device memory was read or written (0–100).
    pub memory_utilization_percent: Option<u32>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub power_milliwatts: Option<u32>,
    pub temperature_celsius: Option<u32>,
    /// Corrected (single-bit) ECC errors since the driver loaded.
    pub ecc_corrected: Option<u64>,
    /// Uncorrected (double-bit) ECC errors since the driver loaded.
    pub ecc_uncorrected: Option<u64>,
    /// Queries that failed for another reason than the GPU not offering them.
    pub failures: Vec<(&'static str, CallError)>,
}

/// Reads every GPU NVML lists. A GPU whose handle or UUID cannot be read is left out (its
/// failure is logged by the caller through the count of GPUs it expected); only a failure to
/// count the GPUs fails the whole sample.
pub(crate) fn sample(nvml: &Nvml) -> Result<Vec<GpuTelemetry>, NvmlError> {
    let count = nvml.device_count().map_err(|e| NvmlError::SystemQuery {
        query: "nvmlDeviceGetCount_v2",
        source: e.into(),
    })?;
    let mut gpus = Vec::with_capacity(count as usize);
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        let Ok(uuid) = device.uuid() else {
            continue;
        };
        let mut failures = Vec::new();
        let utilization = answered(
            &mut failures,
            "nvmlDeviceGetUtilizationRates",
            device.utilization_rates(),
        );
        let memory = answered(
            &mut failures,
            "nvmlDeviceGetMemoryInfo_v2",
            device.memory_info(),
        );
        let power = answered(
            &mut failures,
            "nvmlDeviceGetPowerUsage",
            device.power_usage(),
        );
        let temperature = answered(
            &mut failures,
            "nvmlDeviceGetTemperature",
            device.temperature(TemperatureSensor::Gpu),
        );
        let ecc_corrected = answered(
            &mut failures,
            "nvmlDeviceGetTotalEccErrors",
            device.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile),
        );
        let ecc_uncorrected = answered(
            &mut failures,
            "nvmlDeviceGetTotalEccErrors",
            device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
        );
        gpus.push(GpuTelemetry {
            uuid,
            utilization_percent: utilization.as_ref().map(|u| u.gpu),
            memory_utilization_percent: utilization.as_ref().map(|u| u.memory),
            memory_used_bytes: memory.as_ref().map(|m| m.used),
            memory_total_bytes: memory.as_ref().map(|m| m.total),
            power_milliwatts: power,
            temperature_celsius: temperature,
            ecc_corrected,
            ecc_uncorrected,
            failures,
        });
    }
    Ok(gpus)
}

/// The value of an answered query; a failure other than "not supported" is recorded.
fn answered<T>(
    failures: &mut Vec<(&'static str, CallError)>,
    query: &'static str,
    result: Result<T, nvml_wrapper::error::NvmlError>,
) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(error) => {
            let error = CallError::from(error);
            if !error.is_not_supported() {
                failures.push((query, error));
            }
            None
        }
    }
}
