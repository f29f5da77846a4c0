//! Opaque device configurations checked before they reach a node: what `tessera validate` reports
//! and what the controller's validating webhook refuses at creation, one function for both so the
//! two print the same words.
//!
//! A configuration is checked when its `opaque.driver` is Tessera's (`gpu.tessera.dev`: Tessera's
//! own `GpuConfig` or NVIDIA's `resource.nvidia.com/v1beta1` kinds, which the node plugin reads as
//! its own) or NVIDIA's (`gpu.nvidia.com`) with NVIDIA's apiVersion: the node plugin takes the
//! latter as its own when the claim gets no device of NVIDIA's driver. Both go through the decoder
//! prepare uses ([`tessera_api::nvidia::decode_accepting_nvidia`]), so whatever it refuses at
//! prepare is refused here, with the same error. Other drivers' configurations are not ours to
//! judge and are never looked at.
//!
//! The webhook ([`review_claim_configs`]) answers CREATE of ResourceClaims and
//! ResourceClaimTemplates only, and lets claims made from a template for a pod pass (the
//! template was checked): their specs are immutable, and checking an UPDATE would refuse
//! the finalizer and metadata writes Kubernetes makes to a claim admitted while the webhook was
//! off, which would strand it.

use serde_json::Value;
use tessera_api::names::{CONFIG_VALIDATION_DISABLED, CONFIG_VALIDATION_LABEL};
use tessera_api::nvidia::{NVIDIA_CONFIG_API_VERSION, NVIDIA_DRIVER_NAME, decode_accepting_nvidia};

use crate::review::{AdmissionRequest, AdmissionResponse};

/// One invalid configuration: the field path of its parameters and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigProblem {
    /// `spec.devices.config[0].opaque.parameters`.
    pub path: String,
    pub problem: String,
}

impl std::fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.problem)
    }
}

/// What is wrong with one `opaque` configuration (`{driver, parameters}`), or `None` when it is
/// valid or not Tessera's to check.
pub fn opaque_config_problem(opaque: &Value) -> Option<String> {
    let parameters = &opaque["parameters"];
    match opaque["driver"].as_str() {
        Some(tessera_api::DRIVER_NAME) => decode_accepting_nvidia(parameters)
            .err()
            .map(|e| format!("invalid {} configuration: {e}", tessera_api::DRIVER_NAME)),
        Some(NVIDIA_DRIVER_NAME)
            if parameters["apiVersion"].as_str() == Some(NVIDIA_CONFIG_API_VERSION) =>
        {
            decode_accepting_nvidia(parameters).err().map(|e| {
                format!(
                    "invalid {NVIDIA_CONFIG_API_VERSION} configuration (driver {NVIDIA_DRIVER_NAME}, which the {} node plugin reads as its own): {e}",
                    tessera_api::DRIVER_NAME
                )
            })
        }
        _ => None,
    }
}

/// The problems of the configuration list `configs` found at `path` (`spec.devices.config`). A
/// value that is not a list has none here (the API server refuses its shape).
pub fn config_list_problems(configs: &Value, path: &str) -> Vec<ConfigProblem> {
    configs
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, config)| {
            opaque_config_problem(&config["opaque"]).map(|problem| ConfigProblem {
                path: format!("{path}[{i}].opaque.parameters"),
                problem,
            })
        })
        .collect()
}

/// The kinds whose configurations are checked at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimKind {
    ResourceClaim,
    ResourceClaimTemplate,
}

impl ClaimKind {
    /// The kind of a `resource.k8s.io` object of kind `kind`, when it is one of these.
    pub fn of(group: &str, kind: &str) -> Option<ClaimKind> {
        match (group, kind) {
            ("resource.k8s.io", "ResourceClaim") => Some(ClaimKind::ResourceClaim),
            ("resource.k8s.io", "ResourceClaimTemplate") => Some(ClaimKind::ResourceClaimTemplate),
            _ => None,
        }
    }

    /// The path of the claim's `devices` in an object of this kind.
    pub fn devices_path(self) -> &'static str {
        match self {
            ClaimKind::ResourceClaim => "spec.devices",
            ClaimKind::ResourceClaimTemplate => "spec.spec.devices",
        }
    }

    fn devices(self, object: &Value) -> &Value {
        match self {
            ClaimKind::ResourceClaim => &object["spec"]["devices"],
            ClaimKind::ResourceClaimTemplate => &object["spec"]["spec"]["devices"],
        }
    }
}

/// The problems of every opaque configuration of a claim or claim template.
pub fn claim_config_problems(kind: ClaimKind, object: &Value) -> Vec<ConfigProblem> {
    let path = format!("{}.config", kind.devices_path());
    config_list_problems(&kind.devices(object)["config"], &path)
}

/// The annotation Kubernetes puts on the claims it makes from a pod's ResourceClaimTemplate.
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// Whether `claim` was made by Kubernetes from a template for a pod: its config is the template's,
/// checked (or opted out) when the template was created, and refusing it would leave the pod
/// waiting for a claim that is never made. The template's own labels are not copied onto it.
fn is_generated(claim: &Value) -> bool {
    claim["metadata"]["annotations"]
        .get(POD_CLAIM_NAME_ANNOTATION)
        .is_some()
}

/// The validating webhook's answer: a CREATE of a ResourceClaim or ResourceClaimTemplate with an
/// invalid Tessera or NVIDIA-schema configuration is refused (400) with each problem as
/// `tessera validate` prints it, the object named; everything else is allowed. A dry run gets the
/// same answer.
pub fn review_claim_configs(request: &AdmissionRequest) -> AdmissionResponse {
    let allow = AdmissionResponse::allow(&request.uid);
    let Some(kind) = ClaimKind::of(&request.kind.group, &request.kind.kind) else {
        return allow;
    };
    let Some(object) = request
        .object
        .as_ref()
        .filter(|_| request.operation == "CREATE")
    else {
        return allow;
    };
    if kind == ClaimKind::ResourceClaim && is_generated(object) {
        return allow;
    }
    let problems = claim_config_problems(kind, object);
    if problems.is_empty() {
        return allow;
    }
    let name = request
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            object["metadata"]["generateName"]
                .as_str()
                .map(|g| format!("{g}*"))
        })
        .unwrap_or_else(|| "<unnamed>".to_owned());
    let object_ref = match request.namespace.as_deref() {
        Some(namespace) => format!("{}/{namespace}/{name}", request.kind.kind),
        None => format!("{}/{name}", request.kind.kind),
    };
    let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
    AdmissionResponse::deny(
        &request.uid,
        400,
        format!(
            "{object_ref}: {} (`tessera validate` reports the same before applying; label the object or its namespace {CONFIG_VALIDATION_LABEL}={CONFIG_VALIDATION_DISABLED} to have it checked only at prepare)",
            lines.join("; ")
        ),
    )
}

#[cfg(test)]
mod tests;
