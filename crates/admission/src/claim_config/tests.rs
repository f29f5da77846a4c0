use serde_json::{Value, json};

use super::*;
use crate::review::parse_request;

fn request(kind: &str, operation: &str, object: Value) -> AdmissionRequest {
    let body = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
            "namespace": "ml",
            "name": "bad",
            "operation": operation,
            "object": object,
        }
    });
    parse_request(&serde_json::to_vec(&body).unwrap()).unwrap()
}

fn time_slicing(interval: &str) -> Value {
    json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig",
           "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}}})
}

fn claim(configs: Value) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"namespace": "ml", "name": "bad"},
           "spec": {"devices": {
               "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}],
               "config": configs}}})
}

fn message(response: &AdmissionResponse) -> &str {
    &response
        .status
        .as_ref()
        .expect("a refusal has a status")
        .message
}

#[test]
fn a_claim_with_an_invalid_tessera_config_is_refused_naming_the_field_and_value() {
    let object = claim(json!([
        {"opaque": {"driver": "gpu.tessera.dev", "parameters": time_slicing("Short")}},
        {"opaque": {"driver": "gpu.tessera.dev", "parameters": time_slicing("Forever")}},
    ]));
    let response = review_claim_configs(&request("ResourceClaim", "CREATE", object));
    assert!(!response.allowed);
    assert_eq!(response.uid, "u-1");
    assert_eq!(response.status.as_ref().unwrap().code, 400);
    let message = message(&response);
    assert!(
        message.starts_with(
            "ResourceClaim/ml/bad: spec.devices.config[1].opaque.parameters: invalid gpu.tessera.dev configuration: "
        ),
        "{message}"
    );
    assert!(
        message.contains("sharing.timeSlicing.interval") && message.contains("Forever"),
        "{message}"
    );
    assert!(
        message.contains("gpu.tessera.dev/config-validation=disabled"),
        "{message}"
    );
}

#[test]
fn a_template_is_checked_at_its_own_path() {
    let object = json!({"spec": {"spec": {"devices": {"config": [
        {"requests": ["gpu"], "opaque": {"driver": "gpu.tessera.dev", "parameters": time_slicing("Forever")}}
    ]}}}});
    let problems = claim_config_problems(ClaimKind::ResourceClaimTemplate, &object);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(
        problems[0].path,
        "spec.spec.devices.config[0].opaque.parameters"
    );
    let response = review_claim_configs(&request("ResourceClaimTemplate", "CREATE", object));
    assert!(
        message(&response).starts_with("ResourceClaimTemplate/ml/bad: spec.spec.devices.config[0]"),
        "{}",
        message(&response)
    );
}

#[test]
fn nvidia_schema_configs_are_checked_under_either_driver_name() {
    let multi_user = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                            "sharing": {"strategy": "MPS", "mpsConfig": {"multiUser": true}}});
    for driver in ["gpu.nvidia.com", "gpu.tessera.dev"] {
        let object = claim(json!([{"opaque": {"driver": driver, "parameters": multi_user}}]));
        let response = review_claim_configs(&request("ResourceClaim", "CREATE", object));
        assert!(!response.allowed, "{driver}");
        assert!(
            message(&response).contains("sharing.mpsConfig.multiUser"),
            "{driver}: {}",
            message(&response)
        );
    }
}

#[test]
fn valid_configs_other_drivers_and_other_operations_are_allowed() {
    let valid = claim(json!([
        {"opaque": {"driver": "gpu.tessera.dev", "parameters": time_slicing("Short")}},
        {"opaque": {"driver": "nic.example.com", "parameters": {"anything": "at all"}}},
        {"opaque": {"driver": "gpu.nvidia.com", "parameters": {"apiVersion": "other.nvidia.com/v1", "kind": "X"}}},
    ]));
    assert_eq!(
        review_claim_configs(&request("ResourceClaim", "CREATE", valid)),
        AdmissionResponse::allow("u-1")
    );
    let invalid = claim(json!([
        {"opaque": {"driver": "gpu.tessera.dev", "parameters": time_slicing("Forever")}}
    ]));
    // The spec cannot change after creation; an UPDATE is metadata (finalizers) and must pass.
    assert_eq!(
        review_claim_configs(&request("ResourceClaim", "UPDATE", invalid.clone())),
        AdmissionResponse::allow("u-1")
    );
    let mut pod = request("ResourceClaim", "CREATE", invalid);
    pod.kind.group = String::new();
    pod.kind.kind = "Pod".to_owned();
    assert_eq!(review_claim_configs(&pod), AdmissionResponse::allow("u-1"));
}

#[test]
fn a_config_list_of_the_wrong_shape_has_no_config_problems() {
    assert!(config_list_problems(&json!({"not": "a list"}), "spec.devices.config").is_empty());
    assert!(config_list_problems(&Value::Null, "spec.devices.config").is_empty());
}

#[test]
fn claims_made_from_a_template_for_a_pod_pass() {
    let mut object = claim(json!([
        {"opaque": {"driver": "gpu.tessera.dev", "parameters": time_slicing("Forever")}}
    ]));
    assert!(!review_claim_configs(&request("ResourceClaim", "CREATE", object.clone())).allowed);
    object["metadata"]["annotations"] = json!({"resource.kubernetes.io/pod-claim-name": "gpu"});
    assert_eq!(
        review_claim_configs(&request("ResourceClaim", "CREATE", object)),
        AdmissionResponse::allow("u-1")
    );
}
