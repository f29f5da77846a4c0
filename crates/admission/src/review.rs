//! The `admission.k8s.io/v1` AdmissionReview envelope, and the pod conversion's answer in it.
//!
//! The API server posts an AdmissionReview with a `request`; the webhook answers one with a
//! `response` carrying the request's `uid`, `allowed`, and for a mutation a base64 RFC 6902 patch
//! (`patchType: JSONPatch`) plus warnings the client shows. Unknown fields of the request are
//! ignored; the object is kept as raw JSON.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::conversion::{ConversionTable, convert};

/// The `apiVersion` of the envelope both ways.
pub const API_VERSION: &str = "admission.k8s.io/v1";
/// The `kind` of the envelope both ways.
pub const KIND: &str = "AdmissionReview";
/// The most warnings one answer carries; the rest are summed up in the last one.
pub const MAX_WARNINGS: usize = 8;

/// An AdmissionReview as the API server sends it.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    pub api_version: String,
    pub kind: String,
    pub request: Option<AdmissionRequest>,
}

/// The part of the request a webhook of Tessera reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    pub kind: GroupVersionKind,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    pub operation: String,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub kind: String,
}

/// The answer to one request.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    /// The JSON patch, base64 (standard alphabet, padded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<ResponseStatus>,
}

/// Why a request was refused (`allowed: false`), as the client shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResponseStatus {
    pub code: u16,
    pub message: String,
}

/// A request body that is not an AdmissionReview this webhook can answer.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not an AdmissionReview: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error("AdmissionReview of apiVersion {0:?}: only {API_VERSION} is served")]
    Version(String),
    #[error("the AdmissionReview has no request")]
    NoRequest,
}

/// Reads an AdmissionReview request body.
pub fn parse_request(body: &[u8]) -> Result<AdmissionRequest, ReviewError> {
    let review: AdmissionReview = serde_json::from_slice(body)?;
    if review.api_version != API_VERSION || review.kind != KIND {
        return Err(ReviewError::Version(format!(
            "{}/{}",
            review.api_version, review.kind
        )));
    }
    review.request.ok_or(ReviewError::NoRequest)
}

/// The AdmissionReview carrying `response`, as the API server expects it back.
pub fn review_of(response: &AdmissionResponse) -> Value {
    serde_json::json!({"apiVersion": API_VERSION, "kind": KIND, "response": response})
}

impl AdmissionResponse {
    /// Allowed, unchanged.
    pub fn allow(uid: &str) -> AdmissionResponse {
        AdmissionResponse {
            uid: uid.to_owned(),
            allowed: true,
            ..AdmissionResponse::default()
        }
    }

    /// Refused with `message` (HTTP-like `code`: 400 for a bad object, 403 for a rule).
    pub fn deny(uid: &str, code: u16, message: String) -> AdmissionResponse {
        AdmissionResponse {
            uid: uid.to_owned(),
            allowed: false,
            status: Some(ResponseStatus { code, message }),
            ..AdmissionResponse::default()
        }
    }
}

/// The device-plugin conversion's answer: for a Pod CREATE whose containers ask for a converted
/// extended resource, allowed with the patch that converts it; every other request allowed as it
/// is (with a warning saying why a GPU pod was left unconverted). It never refuses a pod. A dry
/// run gets the same answer: the conversion has no side effects.
pub fn convert_pod_request(
    request: &AdmissionRequest,
    table: &ConversionTable,
) -> AdmissionResponse {
    let mut response = AdmissionResponse::allow(&request.uid);
    let is_pod =
        request.kind.group.is_empty() && request.kind.version == "v1" && request.kind.kind == "Pod";
    let Some(object) = request
        .object
        .as_ref()
        .filter(|_| is_pod && request.operation == "CREATE")
    else {
        return response;
    };
    match convert(object, table) {
        Ok(conversion) => {
            let patch = conversion.patch_from(object);
            let bytes = serde_json::to_vec(&patch).unwrap_or_default();
            response.patch_type = Some("JSONPatch".to_owned());
            response.patch = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
            response.warnings = conversion
                .requests
                .iter()
                .map(|r| {
                    format!(
                        "tessera: container {} asks for {}: {}; converted to claim {} from ResourceClaimTemplate {} (class {}) for topology-aware placement",
                        r.container, r.resource, r.count, r.claim, r.template, r.device_class
                    )
                })
                .collect();
            cap_warnings(&mut response.warnings);
        }
        Err(why) if why.is_notable() => {
            response.warnings = vec![format!("tessera: device-plugin conversion skipped: {why}")];
        }
        Err(_) => {}
    }
    response
}

/// Keeps at most [`MAX_WARNINGS`], the last one counting the rest.
fn cap_warnings(warnings: &mut Vec<String>) {
    if warnings.len() > MAX_WARNINGS {
        let rest = warnings.len() - (MAX_WARNINGS - 1);
        warnings.truncate(MAX_WARNINGS - 1);
        warnings.push(format!("tessera: {rest} more extended resources converted"));
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::DeviceClass;
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    fn table() -> ConversionTable {
        let text = include_str!("../../../deploy/helm/tessera/files/deviceclasses.yaml");
        let classes: Vec<DeviceClass> = serde_yaml::Deserializer::from_str(text)
            .map(|doc| DeviceClass::deserialize(doc).unwrap())
            .collect();
        ConversionTable::from_device_classes(&classes)
    }

    fn review(kind: &str, operation: &str, object: Value, dry_run: bool) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": kind},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "team-a",
                "operation": operation,
                "userInfo": {"username": "alice"},
                "object": object,
                "dryRun": dry_run
            }
        }))
        .unwrap()
    }

    fn gpu_pod() -> Value {
        json!({"metadata": {"generateName": "train-", "namespace": "team-a"},
               "spec": {"containers": [{"name": "main", "resources": {
                   "limits": {"nvidia.com/gpu": "4"}, "requests": {"nvidia.com/gpu": "4"}}}]}})
    }

    #[test]
    fn a_gpu_pod_is_allowed_with_the_conversion_patch() {
        let request = parse_request(&review("Pod", "CREATE", gpu_pod(), false)).unwrap();
        let response = convert_pod_request(&request, &table());
        assert!(response.allowed);
        assert_eq!(response.uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(response.patch_type.as_deref(), Some("JSONPatch"));
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(response.patch.as_deref().unwrap())
            .unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        let mut pod = gpu_pod();
        json_patch::patch(&mut pod, &patch).unwrap();
        assert_eq!(
            pod["spec"]["resourceClaims"],
            json!([{"name": "tessera-gpu-c0", "resourceClaimTemplateName": "tessera-gpu-4"}])
        );
        assert_eq!(response.warnings.len(), 1);
        assert!(
            response.warnings[0].contains("tessera-gpu-4"),
            "{:?}",
            response.warnings
        );
        let answer = review_of(&response);
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(answer["response"]["allowed"], true);
    }

    #[test]
    fn a_dry_run_gets_the_same_answer() {
        let table = table();
        let real = convert_pod_request(
            &parse_request(&review("Pod", "CREATE", gpu_pod(), false)).unwrap(),
            &table,
        );
        let dry = convert_pod_request(
            &parse_request(&review("Pod", "CREATE", gpu_pod(), true)).unwrap(),
            &table,
        );
        assert_eq!(real, dry);
    }

    #[test]
    fn everything_else_is_allowed_unchanged() {
        let table = table();
        for (kind, operation) in [
            ("Pod", "UPDATE"),
            ("Pod", "DELETE"),
            ("Deployment", "CREATE"),
        ] {
            let request = parse_request(&review(kind, operation, gpu_pod(), false)).unwrap();
            assert_eq!(
                convert_pod_request(&request, &table),
                AdmissionResponse::allow("705ab4f5-6393-11e8-b7cc-42010a800002"),
                "{kind} {operation}"
            );
        }
        let cpu_only =
            json!({"spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]}});
        let request = parse_request(&review("Pod", "CREATE", cpu_only, false)).unwrap();
        let response = convert_pod_request(&request, &table);
        assert_eq!(response, AdmissionResponse::allow(&request.uid));
    }

    #[test]
    fn a_gpu_pod_left_unconverted_says_why() {
        let mut bound = gpu_pod();
        bound["spec"]["nodeName"] = json!("node-1");
        let request = parse_request(&review("Pod", "CREATE", bound, false)).unwrap();
        let response = convert_pod_request(&request, &table());
        assert!(response.allowed && response.patch.is_none());
        assert_eq!(
            response.warnings,
            [
                "tessera: device-plugin conversion skipped: the pod is bound to node node-1 (spec.nodeName): a bound pod cannot get a scheduling gate"
            ]
        );
    }

    #[test]
    fn bodies_that_are_not_a_v1_review_are_errors() {
        assert!(matches!(parse_request(b"{"), Err(ReviewError::NotJson(_))));
        let old = br#"{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": null}"#;
        assert!(matches!(parse_request(old), Err(ReviewError::Version(_))));
        let empty = br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#;
        assert!(matches!(parse_request(empty), Err(ReviewError::NoRequest)));
    }

    #[test]
    fn warnings_are_capped() {
        let mut warnings: Vec<String> = (0..20).map(|i| format!("w{i}")).collect();
        cap_warnings(&mut warnings);
        assert_eq!(warnings.len(), MAX_WARNINGS);
        assert_eq!(
            warnings.last().unwrap(),
            "tessera: 13 more extended resources converted"
        );
    }
}
