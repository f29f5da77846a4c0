//! Opaque device configuration (`gpu.tessera.dev/v1alpha1`): what users put in
//! `DeviceClass.spec.config[].opaque.parameters` and `ResourceClaim.spec.devices.config[].opaque.parameters`.
//!
//! Decoding is strict: an unknown field, a wrong kind, a value out of range or a sub-config that
//! contradicts the chosen strategy is an error naming the field and what is allowed. Nothing is
//! silently ignored, because an ignored sharing setting means a workload runs with a GPU it was
//! not meant to share (or the reverse).

use std::collections::BTreeMap;
use std::fmt;

use crate::quantity::Quantity;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::names::CONFIG_API_VERSION;

/// Kind of a whole-GPU configuration.
pub const GPU_CONFIG_KIND: &str = "GpuConfig";
/// Kind of a MIG-device configuration.
pub const MIG_DEVICE_CONFIG_KIND: &str = "MigDeviceConfig";
/// Every kind Tessera decodes.
pub const KINDS: &[&str] = &[GPU_CONFIG_KIND, MIG_DEVICE_CONFIG_KIND];

/// Largest `parameters` object the API server accepts (10 KiB).
pub const MAX_PARAMETERS_BYTES: usize = 10 * 1024;

/// A decoded opaque configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind")]
pub enum OpaqueConfig {
    #[serde(rename = "GpuConfig")]
    Gpu(GpuConfig),
    #[serde(rename = "MigDeviceConfig")]
    Mig(MigDeviceConfig),
}

impl OpaqueConfig {
    /// The `kind` the object was decoded from.
    pub fn kind(&self) -> &'static str {
        match self {
            OpaqueConfig::Gpu(_) => GPU_CONFIG_KIND,
            OpaqueConfig::Mig(_) => MIG_DEVICE_CONFIG_KIND,
        }
    }

    /// The sharing settings, whichever kind carries them.
    pub fn sharing(&self) -> Option<&Sharing> {
        match self {
            OpaqueConfig::Gpu(c) => c.sharing.as_ref(),
            OpaqueConfig::Mig(c) => c.sharing.as_ref(),
        }
    }
}

/// Configuration of whole GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GpuConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
}

/// Configuration of MIG devices.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MigDeviceConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
}

/// How the containers of a claim share the allocated device(s).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Sharing {
    pub strategy: SharingStrategy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<TimeSlicingConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsConfig>,
}

/// The sharing strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SharingStrategy {
    /// CUDA time slicing between processes (the driver default, with a configurable interval).
    TimeSlicing,
    /// CUDA Multi-Process Service: one MPS control daemon per claim.
    #[serde(rename = "MPS")]
    Mps,
}

impl fmt::Display for SharingStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SharingStrategy::TimeSlicing => "TimeSlicing",
            SharingStrategy::Mps => "MPS",
        })
    }
}

/// Time-slicing settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TimeSlicingConfig {
    #[serde(default)]
    pub interval: TimeSliceInterval,
}

/// The compute time-slice lengths NVIDIA drivers offer (`nvidia-smi compute-policy --set-timeslice`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeSliceInterval {
    #[default]
    Default,
    Short,
    Medium,
    Long,
}

impl TimeSliceInterval {
    /// The value `nvidia-smi compute-policy --set-timeslice` takes.
    pub fn nvidia_smi_value(self) -> u8 {
        match self {
            TimeSliceInterval::Default => 0,
            TimeSliceInterval::Short => 1,
            TimeSliceInterval::Medium => 2,
            TimeSliceInterval::Long => 3,
        }
    }
}

/// MPS settings, applied to the claim's MPS control daemon.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MpsConfig {
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` for every client, 1–100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_active_thread_percentage: Option<u8>,
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` for every device of the claim, a quantity such as `10Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_pinned_device_memory_limit: Option<String>,
    /// Per-device overrides, keyed by device name (`gpu-0`, `gpu-3-mig-1g.10gb-0`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub per_device_pinned_memory_limit: BTreeMap<String, String>,
}

impl MpsConfig {
    /// The pinned-memory limit in bytes for `device`, if any.
    pub fn pinned_memory_limit_bytes(&self, device: &str) -> Option<u64> {
        self.per_device_pinned_memory_limit
            .get(device)
            .or(self.default_pinned_device_memory_limit.as_ref())
            .and_then(|q| quantity_bytes(q).ok())
    }
}

/// Why an opaque configuration was refused. `field` is a dotted path into the parameters
/// object (`sharing.mps.defaultActiveThreadPercentage`); callers add the object that carried it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {problem}")]
pub struct ConfigError {
    pub field: String,
    pub problem: String,
}

impl ConfigError {
    pub(crate) fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// Decodes raw `parameters` bytes (JSON, as the API server stores them).
pub fn decode_bytes(parameters: &[u8]) -> Result<OpaqueConfig, ConfigError> {
    if parameters.len() > MAX_PARAMETERS_BYTES {
        return Err(ConfigError::new(
            "(parameters)",
            format!(
                "{} bytes is more than the {MAX_PARAMETERS_BYTES} bytes the API allows",
                parameters.len()
            ),
        ));
    }
    let value: Value = serde_json::from_slice(parameters)
        .map_err(|e| ConfigError::new("(parameters)", format!("not valid JSON: {e}")))?;
    decode(&value)
}

/// Decodes and validates an opaque configuration object.
pub fn decode(parameters: &Value) -> Result<OpaqueConfig, ConfigError> {
    let Value::Object(object) = parameters else {
        return Err(ConfigError::new(
            "(parameters)",
            format!(
                "must be a JSON object with apiVersion `{CONFIG_API_VERSION}` and kind one of {}",
                quoted(KINDS)
            ),
        ));
    };
    let mut body = object.clone();
    let api_version = take_string(&mut body, "apiVersion")?;
    if api_version != CONFIG_API_VERSION {
        return Err(ConfigError::new(
            "apiVersion",
            format!("`{api_version}` is not supported; use `{CONFIG_API_VERSION}`"),
        ));
    }
    let kind = take_string(&mut body, "kind")?;
    let body = Value::Object(body);
    let config = match kind.as_str() {
        GPU_CONFIG_KIND => OpaqueConfig::Gpu(strict_from_value(body)?),
        MIG_DEVICE_CONFIG_KIND => OpaqueConfig::Mig(strict_from_value(body)?),
        other => {
            return Err(ConfigError::new(
                "kind",
                format!(
                    "`{other}` is not a Tessera configuration kind; use one of {}",
                    quoted(KINDS)
                ),
            ));
        }
    };
    if let Some(sharing) = config.sharing() {
        validate_sharing(sharing)?;
    }
    Ok(config)
}

pub(crate) fn take_string(
    body: &mut serde_json::Map<String, Value>,
    field: &str,
) -> Result<String, ConfigError> {
    match body.remove(field) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(ConfigError::new(
            field,
            format!("must be a string, found {other}"),
        )),
        None => Err(ConfigError::new(field, "is required")),
    }
}

pub(crate) fn strict_from_value<T: serde::de::DeserializeOwned>(
    body: Value,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            "(parameters)".to_owned()
        } else {
            path
        };
        ConfigError::new(field, e.into_inner().to_string())
    })
}

pub(crate) fn validate_sharing(sharing: &Sharing) -> Result<(), ConfigError> {
    match sharing.strategy {
        SharingStrategy::TimeSlicing if sharing.mps.is_some() => {
            return Err(ConfigError::new(
                "sharing.mps",
                "is set but strategy is `TimeSlicing`; remove `mps` or set strategy to `MPS`",
            ));
        }
        SharingStrategy::Mps if sharing.time_slicing.is_some() => {
            return Err(ConfigError::new(
                "sharing.timeSlicing",
                "is set but strategy is `MPS`; remove `timeSlicing` or set strategy to `TimeSlicing`",
            ));
        }
        _ => {}
    }
    if let Some(mps) = &sharing.mps {
        if let Some(pct) = mps.default_active_thread_percentage
            && !(1..=100).contains(&pct)
        {
            return Err(ConfigError::new(
                "sharing.mps.defaultActiveThreadPercentage",
                format!("{pct} is out of range; use a percentage from 1 to 100"),
            ));
        }
        if let Some(limit) = &mps.default_pinned_device_memory_limit {
            check_memory_limit("sharing.mps.defaultPinnedDeviceMemoryLimit", limit)?;
        }
        for (device, limit) in &mps.per_device_pinned_memory_limit {
            let field = format!("sharing.mps.perDevicePinnedMemoryLimit.{device}");
            if !crate::validation::is_dns_label(device) {
                return Err(ConfigError::new(
                    field,
                    "the key must be a device name as published in the ResourceSlice (a DNS label such as `gpu-0`)",
                ));
            }
            check_memory_limit(&field, limit)?;
        }
    }
    Ok(())
}

/// The largest MPS pinned-memory limit a config may carry: more memory than any GPU has (the
/// largest have a few hundred GiB). The node plugin holds each limit against its device's own
/// memory at prepare; this bound is what a check without the device (`tessera validate`, the
/// decoder) can refuse, and it catches quantities such as `1000000Ei`, which Kubernetes'
/// quantity parser clamps to the largest representable value instead of refusing.
pub const PINNED_MEMORY_LIMIT_CEILING_BYTES: u64 = 16 << 40;

fn check_memory_limit(field: &str, limit: &str) -> Result<(), ConfigError> {
    memory_limit_bytes(field, limit).map(|_| ())
}

/// An MPS pinned-memory limit in bytes: a quantity greater than zero and at most
/// [`PINNED_MEMORY_LIMIT_CEILING_BYTES`]. `field` names it in the error.
pub(crate) fn memory_limit_bytes(field: &str, limit: &str) -> Result<u64, ConfigError> {
    match quantity_bytes(limit) {
        Ok(0) => Err(ConfigError::new(
            field,
            format!("`{limit}` must be greater than zero"),
        )),
        Ok(bytes) if bytes > PINNED_MEMORY_LIMIT_CEILING_BYTES => Err(ConfigError::new(
            field,
            format!(
                "`{limit}` is more memory than any GPU has (at most {}Ti is accepted, and at \
                 prepare at most the device's own memory); use a limit such as `10Gi`, or \
                 remove the field for no limit",
                PINNED_MEMORY_LIMIT_CEILING_BYTES >> 40
            ),
        )),
        Ok(bytes) => Ok(bytes),
        Err(problem) => Err(ConfigError::new(field, problem)),
    }
}

/// Parses a Kubernetes quantity into whole bytes.
pub fn quantity_bytes(quantity: &str) -> Result<u64, String> {
    let parsed = Quantity::parse(quantity).map_err(|e| {
        format!("`{quantity}` is not a Kubernetes quantity ({e}); write e.g. `512Mi` or `10Gi`")
    })?;
    parsed
        .as_integer()
        .and_then(|bytes| u64::try_from(bytes).ok())
        .ok_or_else(|| format!("`{quantity}` is not a whole, non-negative number of bytes"))
}

fn quoted(items: &[&str]) -> String {
    items
        .iter()
        .map(|i| format!("`{i}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(value: Value) -> ConfigError {
        decode(&value).expect_err("must be refused")
    }

    #[test]
    fn decodes_every_kind_and_strategy() {
        let gpu = decode(&json!({
            "apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}
        }))
        .unwrap();
        let sharing = gpu.sharing().unwrap();
        assert_eq!(sharing.strategy, SharingStrategy::TimeSlicing);
        assert_eq!(
            sharing.time_slicing.as_ref().unwrap().interval,
            TimeSliceInterval::Long
        );

        let mig = decode(&json!({
            "apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "MigDeviceConfig",
            "sharing": {"strategy": "MPS", "mps": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
                "perDevicePinnedMemoryLimit": {"gpu-0-mig-1g-10gb-0": "1Gi"}
            }}
        }))
        .unwrap();
        assert_eq!(mig.kind(), MIG_DEVICE_CONFIG_KIND);
        let mps = mig.sharing().unwrap().mps.as_ref().unwrap();
        assert_eq!(
            mps.pinned_memory_limit_bytes("gpu-0-mig-1g-10gb-0"),
            Some(1 << 30)
        );
        assert_eq!(mps.pinned_memory_limit_bytes("gpu-1"), Some(10 << 30));

        let empty = decode(&json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig"}))
            .unwrap();
        assert_eq!(empty, OpaqueConfig::Gpu(GpuConfig::default()));
    }

    #[test]
    fn bytes_round_trip_through_json() {
        let raw = br#"{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing"}}"#;
        let config = decode_bytes(raw).unwrap();
        let mut encoded = serde_json::to_value(&config).unwrap();
        encoded["apiVersion"] = json!(CONFIG_API_VERSION);
        assert_eq!(decode(&encoded).unwrap(), config);
    }

    /// Refusals of the envelope: not an object, a missing or wrong `apiVersion` or `kind`.
    fn envelope_refusals() -> Vec<(Value, &'static str, &'static str)> {
        vec![
            (json!([1]), "(parameters)", "must be a JSON object"),
            (json!({"kind": "GpuConfig"}), "apiVersion", "is required"),
            (
                json!({"apiVersion": "gpu.tessera.dev/v1", "kind": "GpuConfig"}),
                "apiVersion",
                "use `gpu.tessera.dev/v1alpha1`",
            ),
            (
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1"}),
                "kind",
                "is required",
            ),
            (
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GPUConfig"}),
                "kind",
                "use one of `GpuConfig`, `MigDeviceConfig`",
            ),
            (
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": 3}),
                "kind",
                "must be a string",
            ),
        ]
    }

    /// Refusals of the sharing settings: unknown fields and strategies, settings of the other
    /// strategy, values out of range.
    fn sharing_refusals() -> Vec<(Value, &'static str, &'static str)> {
        vec![
            (
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharin": {}}),
                "sharin",
                "unknown field `sharin`, expected `sharing`",
            ),
            (
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "Spatial"}}),
                "sharing.strategy",
                "unknown variant `Spatial`, expected `TimeSlicing` or `MPS`",
            ),
            (
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {}}),
                "sharing",
                "missing field `strategy`",
            ),
            (
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Forever"}}}),
                "sharing.timeSlicing.interval",
                "expected one of `Default`, `Short`, `Medium`, `Long`",
            ),
            (
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "mps": {}}}),
                "sharing.mps",
                "set strategy to `MPS`",
            ),
            (
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "timeSlicing": {}}}),
                "sharing.timeSlicing",
                "set strategy to `TimeSlicing`",
            ),
            (
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 0}}}),
                "sharing.mps.defaultActiveThreadPercentage",
                "from 1 to 100",
            ),
            (
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 300}}}),
                "sharing.mps.defaultActiveThreadPercentage",
                "invalid value: integer `300`",
            ),
            (
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "lots"}}}),
                "sharing.mps.defaultPinnedDeviceMemoryLimit",
                "is not a Kubernetes quantity",
            ),
            (
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "1000000Ei"}}}),
                "sharing.mps.defaultPinnedDeviceMemoryLimit",
                "more memory than any GPU has",
            ),
            (
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mps": {"perDevicePinnedMemoryLimit": {"gpu-0": "17Ti"}}}}),
                "sharing.mps.perDevicePinnedMemoryLimit.gpu-0",
                "remove the field for no limit",
            ),
            (
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "0"}}}),
                "sharing.mps.defaultPinnedDeviceMemoryLimit",
                "greater than zero",
            ),
            (
                json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mps": {"perDevicePinnedMemoryLimit": {"GPU_0": "1Gi"}}}}),
                "sharing.mps.perDevicePinnedMemoryLimit.GPU_0",
                "must be a device name",
            ),
        ]
    }

    #[test]
    fn refusals_name_the_field_and_the_fix() {
        let cases: Vec<(Value, &str, &str)> = [envelope_refusals(), sharing_refusals()].concat();
        for (value, field, problem) in cases {
            let e = err(value.clone());
            assert_eq!(e.field, field, "{value}: {e}");
            assert!(
                e.problem.contains(problem),
                "{value}: `{}` lacks `{problem}`",
                e.problem
            );
        }
    }

    #[test]
    fn oversized_and_malformed_bytes_are_refused() {
        let big = format!(
            r#"{{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","x":"{}"}}"#,
            "a".repeat(MAX_PARAMETERS_BYTES)
        );
        assert!(
            decode_bytes(big.as_bytes())
                .unwrap_err()
                .problem
                .contains("10240 bytes")
        );
        assert!(
            decode_bytes(b"{not json")
                .unwrap_err()
                .problem
                .contains("not valid JSON")
        );
    }
}
