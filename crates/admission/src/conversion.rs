//! The device-plugin conversion: a pod spec written for NVIDIA's device plugin
//! (`limits: {nvidia.com/gpu: 4}`) turned into the same request through a ResourceClaimTemplate,
//! with Tessera's scheduling gate, so the controller places it (NVLink island, NUMA node) instead
//! of kube-scheduler's first fit. docs/admission.md says when it applies and why it is done this
//! way.
//!
//! Per container and convertible extended resource, the pod gains one pod-level claim
//! (`spec.resourceClaims[]`, from the template [`template_name`] names), the container a
//! `resources.claims` entry for it, and the resource leaves the container's limits and requests.
//! The controller places all of a pod's claims together, so two containers' GPUs still land
//! close to each other. Templates hold one `exactly` request of the class, nothing else (no
//! selectors, constraints or config): Kueue counts such templates against quotas.
//!
//! The functions here work on the JSON of the object (`serde_json::Value`), never on a typed
//! round trip, so fields this build does not know survive untouched.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClass, DeviceRequest, ExactDeviceRequest, ResourceClaimSpec,
    ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tessera_api::names::{
    DEVICE_PLUGIN_CONVERSION_ANNOTATION, DRIVER_NAME, GPU_DEVICE_CLASS, TOPOLOGY_AWARE_GATE,
};
use tessera_api::quantity::Quantity;

/// Prefix of the names the conversion gives pod claims and templates.
pub const NAME_PREFIX: &str = "tessera-";
/// The one request of every conversion template.
pub const TEMPLATE_REQUEST: &str = "devices";
/// Label on the templates the controller keeps for converted pods (value `tessera-controller`).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY_LABEL`] on conversion templates.
pub const MANAGED_BY: &str = "tessera-controller";

/// Which extended resources the conversion turns into claims, and of which DeviceClass: the
/// chart's whole-GPU class (`gpu.tessera.dev`, `nvidia.com/gpu`) and its MIG profile classes
/// (`mig-<profile>.gpu.tessera.dev`, `nvidia.com/mig-<profile>`), each by the
/// `extendedResourceName` it carries. Other classes (shared GPUs, other drivers') are left to
/// kube-scheduler: topology placement adds nothing to a share of one GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConversionTable {
    class_of: BTreeMap<String, String>,
}

impl ConversionTable {
    /// The table of the classes that exist: a class that was deleted is never named in a claim
    /// the scheduler could not satisfy. When two of Tessera's classes carry one extended
    /// resource, the lower name wins.
    pub fn from_device_classes(classes: &[DeviceClass]) -> ConversionTable {
        let mut class_of: BTreeMap<String, String> = BTreeMap::new();
        for class in classes {
            let Some(name) = class.metadata.name.as_deref() else {
                continue;
            };
            if !is_convertible_class(name) {
                continue;
            }
            let Some(resource) = class
                .spec
                .as_ref()
                .and_then(|s| s.extended_resource_name.as_deref())
            else {
                continue;
            };
            let entry = class_of
                .entry(resource.to_owned())
                .or_insert_with(|| name.to_owned());
            if name < entry.as_str() {
                *entry = name.to_owned();
            }
        }
        ConversionTable { class_of }
    }

    /// The DeviceClass `resource` is converted to, if it is converted.
    pub fn class_for(&self, resource: &str) -> Option<&str> {
        self.class_of.get(resource).map(String::as_str)
    }

    /// Whether nothing is converted (no class of the chart exists).
    pub fn is_empty(&self) -> bool {
        self.class_of.is_empty()
    }
}

/// Whether `class` is one of the chart's classes the conversion uses.
fn is_convertible_class(class: &str) -> bool {
    let mig_suffix = format!(".{DRIVER_NAME}");
    class == GPU_DEVICE_CLASS || (class.starts_with("mig-") && class.ends_with(&mig_suffix))
}

/// One container's extended resource, turned into a pod claim (what the annotation
/// [`DEVICE_PLUGIN_CONVERSION_ANNOTATION`] lists).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConvertedRequest {
    pub container: String,
    pub resource: String,
    pub count: i64,
    /// The pod claim (`spec.resourceClaims[].name`).
    pub claim: String,
    /// The ResourceClaimTemplate the claim is made from.
    pub template: String,
    pub device_class: String,
}

/// What the conversion recorded on a pod (its annotations): the requests it turned into claims;
/// empty when the pod was not converted or the record does not read.
pub fn recorded(annotations: Option<&BTreeMap<String, String>>) -> Vec<ConvertedRequest> {
    annotations
        .and_then(|a| a.get(DEVICE_PLUGIN_CONVERSION_ANNOTATION))
        .and_then(|value| serde_json::from_str(value).ok())
        .unwrap_or_default()
}

/// The template a converted pod (its `annotations`) names `template` for, as the controller
/// creates it in `namespace` when it is missing; `None` when the conversion did not name it.
pub fn recorded_template(
    annotations: Option<&BTreeMap<String, String>>,
    template_name: &str,
    namespace: &str,
) -> Option<ResourceClaimTemplate> {
    recorded(annotations)
        .into_iter()
        .find(|r| {
            r.template == template_name
                && self::template_name(&r.device_class, r.count) == r.template
        })
        .map(|r| template(&r.device_class, r.count, Some(namespace)))
}

/// A converted object: the pod (or pod template) with its claims, and what was converted.
#[derive(Clone, Debug, PartialEq)]
pub struct Conversion {
    pub object: Value,
    pub requests: Vec<ConvertedRequest>,
}

impl Conversion {
    /// The RFC 6902 patch from `original` to the converted object (what the webhook answers).
    pub fn patch_from(&self, original: &Value) -> json_patch::Patch {
        json_patch::diff(original, &self.object)
    }

    /// The distinct templates the converted object names, in name order.
    pub fn templates(&self, namespace: Option<&str>) -> Vec<ResourceClaimTemplate> {
        let mut by_name = BTreeMap::new();
        for request in &self.requests {
            by_name
                .entry(request.template.clone())
                .or_insert_with(|| template(&request.device_class, request.count, namespace));
        }
        by_name.into_values().collect()
    }
}

/// Why an object was left as it is. Nothing is refused: the pod is created unchanged and runs
/// as it would without the conversion (kube-scheduler allocates its extended resources).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unconverted {
    #[error("no container asks for a converted extended resource")]
    NothingToConvert,
    #[error("the object has no pod spec")]
    NoPodSpec,
    #[error(
        "the pod already uses ResourceClaims (spec.resourceClaims or a container's resources.claims); claims and extended resources are left as written"
    )]
    HasClaims,
    #[error(
        "the pod is bound to node {node} (spec.nodeName): a bound pod cannot get a scheduling gate"
    )]
    Bound { node: String },
    #[error(
        "init container {container} asks for {resource}: init containers' devices are reused by the containers, which claims cannot express; the pod is left to kube-scheduler"
    )]
    InitContainer { container: String, resource: String },
    #[error(
        "container {container} asks for {resource}: {quantity:?}, which is not a positive whole number"
    )]
    NotACount {
        container: String,
        resource: String,
        quantity: String,
    },
    #[error(
        "container {container} gives different counts of {resource} in limits ({limit}) and requests ({request})"
    )]
    LimitAndRequestDiffer {
        container: String,
        resource: String,
        limit: String,
        request: String,
    },
}

impl Unconverted {
    /// Whether the user should hear about it (an admission warning): everything but "nothing to
    /// convert".
    pub fn is_notable(&self) -> bool {
        !matches!(self, Unconverted::NothingToConvert | Unconverted::NoPodSpec)
    }
}

/// The name of the template for `count` devices of `class`: `tessera-gpu-4` for four whole GPUs,
/// `tessera-mig-1g.10gb-1` for one 1g.10gb MIG device.
pub fn template_name(class: &str, count: i64) -> String {
    format!("{NAME_PREFIX}{}-{count}", short_class(class))
}

/// `gpu` for `gpu.tessera.dev`, `mig-1g.10gb` for `mig-1g.10gb.gpu.tessera.dev`.
fn short_class(class: &str) -> &str {
    if class == GPU_DEVICE_CLASS {
        return "gpu";
    }
    class
        .strip_suffix(DRIVER_NAME)
        .and_then(|s| s.strip_suffix('.'))
        .unwrap_or(class)
}

/// The conversion template for `count` devices of `class`: one `exactly` request, nothing else.
pub fn template(class: &str, count: i64, namespace: Option<&str>) -> ResourceClaimTemplate {
    ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(template_name(class, count)),
            namespace: namespace.map(str::to_owned),
            labels: Some(BTreeMap::from([(
                MANAGED_BY_LABEL.to_owned(),
                MANAGED_BY.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceClaimTemplateSpec {
            metadata: None,
            spec: Some(ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: TEMPLATE_REQUEST.to_owned(),
                        exactly: Some(ExactDeviceRequest {
                            device_class_name: class.to_owned(),
                            allocation_mode: Some("ExactCount".to_owned()),
                            count: Some(count),
                            ..ExactDeviceRequest::default()
                        }),
                        first_available: None,
                    }]),
                    ..DeviceClaim::default()
                }),
            }),
        }),
    }
}

/// The pod claim name for container `index`'s `class`: `tessera-gpu-c0`, `tessera-mig-1g-10gb-c1`
/// (a DNS label: the class's dots become dashes).
fn claim_name(class: &str, index: usize) -> String {
    format!(
        "{NAME_PREFIX}{}-c{index}",
        short_class(class).replace('.', "-")
    )
}

/// Converts a Pod or a PodTemplateSpec (`{metadata, spec}`); `object` itself is not changed.
/// Idempotent: a converted object has claims, and is left as it is.
pub fn convert(object: &Value, table: &ConversionTable) -> Result<Conversion, Unconverted> {
    let spec = object.get("spec").ok_or(Unconverted::NoPodSpec)?;
    if has_claims(spec) {
        return Err(Unconverted::HasClaims);
    }
    check_init_containers(spec, table)?;
    let found = convertible_requests(spec, table)?;
    if found.is_empty() {
        return Err(Unconverted::NothingToConvert);
    }
    if let Some(node) = spec
        .get("nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
    {
        return Err(Unconverted::Bound {
            node: node.to_owned(),
        });
    }
    let mut converted = object.clone();
    let spec = converted
        .get_mut("spec")
        .and_then(Value::as_object_mut)
        .ok_or(Unconverted::NoPodSpec)?;
    let mut requests = Vec::new();
    let mut pod_claims = Vec::new();
    for found in found {
        let container = &mut spec["containers"][found.index];
        remove_resource(container, &found.resource);
        push_claim(container, &found.claim);
        pod_claims.push(json!({"name": found.claim, "resourceClaimTemplateName": found.template}));
        requests.push(found.into_request());
    }
    spec.insert("resourceClaims".to_owned(), Value::Array(pod_claims));
    add_gate(spec);
    annotate(&mut converted, &requests);
    Ok(Conversion {
        object: converted,
        requests,
    })
}

/// Whether the pod spec already names a claim.
fn has_claims(spec: &Value) -> bool {
    let pod_level = spec
        .get("resourceClaims")
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty());
    let in_container = ["containers", "initContainers"].iter().any(|list| {
        spec.get(*list)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| {
                c.pointer("/resources/claims")
                    .and_then(Value::as_array)
                    .is_some_and(|c| !c.is_empty())
            })
    });
    pod_level || in_container
}

/// Refuses to convert a pod whose init containers ask for a converted resource.
fn check_init_containers(spec: &Value, table: &ConversionTable) -> Result<(), Unconverted> {
    for container in spec
        .get("initContainers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for (resource, _) in named_resources(container) {
            if table.class_for(&resource).is_some() {
                return Err(Unconverted::InitContainer {
                    container: container_name(container),
                    resource,
                });
            }
        }
    }
    Ok(())
}

/// One (container, resource) the conversion turns into a claim.
struct Found {
    index: usize,
    container: String,
    resource: String,
    count: i64,
    class: String,
    claim: String,
    template: String,
}

impl Found {
    fn into_request(self) -> ConvertedRequest {
        ConvertedRequest {
            container: self.container,
            resource: self.resource,
            count: self.count,
            claim: self.claim,
            template: self.template,
            device_class: self.class,
        }
    }
}

/// The containers' convertible resources, in container order, then resource name order. A zero
/// count is not a request (left in place, as the scheduler ignores it).
fn convertible_requests(spec: &Value, table: &ConversionTable) -> Result<Vec<Found>, Unconverted> {
    let mut found = Vec::new();
    let containers = spec.get("containers").and_then(Value::as_array);
    for (index, container) in containers.into_iter().flatten().enumerate() {
        for (resource, quantity) in named_resources(container) {
            let Some(class) = table.class_for(&resource) else {
                continue;
            };
            let count = count_of(container, &resource, &quantity)?;
            if count == 0 {
                continue;
            }
            found.push(Found {
                index,
                container: container_name(container),
                claim: claim_name(class, index),
                template: template_name(class, count),
                class: class.to_owned(),
                resource,
                count,
            });
        }
    }
    Ok(found)
}

/// The extended resources a container names in limits or requests, each once (limits first),
/// with the quantity as written.
fn named_resources(container: &Value) -> BTreeMap<String, String> {
    let mut named = BTreeMap::new();
    for field in ["requests", "limits"] {
        let entries = container
            .pointer(&format!("/resources/{field}"))
            .and_then(Value::as_object);
        for (resource, quantity) in entries.into_iter().flatten() {
            named.insert(resource.clone(), quantity_text(quantity));
        }
    }
    named
}

/// A quantity as text: `"4"` and `4` (YAML integers) alike.
fn quantity_text(quantity: &Value) -> String {
    match quantity {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The whole count a container asks for: its limit, which the request (defaulted from it by the
/// API server) must equal.
fn count_of(container: &Value, resource: &str, quantity: &str) -> Result<i64, Unconverted> {
    let field = |name: &str| {
        container
            .pointer(&format!("/resources/{name}"))
            .and_then(|m| m.get(resource))
            .map(quantity_text)
    };
    let not_a_count = || Unconverted::NotACount {
        container: container_name(container),
        resource: resource.to_owned(),
        quantity: quantity.to_owned(),
    };
    let parse = |text: &str| {
        Quantity::parse(text)
            .ok()
            .and_then(Quantity::as_integer)
            .filter(|n| *n >= 0)
    };
    let limit = field("limits");
    let request = field("requests");
    let count = parse(limit.as_deref().unwrap_or(quantity)).ok_or_else(not_a_count)?;
    if let (Some(limit), Some(request)) = (limit, request)
        && parse(&request) != Some(count)
    {
        return Err(Unconverted::LimitAndRequestDiffer {
            container: container_name(container),
            resource: resource.to_owned(),
            limit,
            request,
        });
    }
    Ok(count)
}

fn container_name(container: &Value) -> String {
    container
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("(unnamed)")
        .to_owned()
}

/// Takes `resource` out of the container's limits and requests (and drops a map left empty).
fn remove_resource(container: &mut Value, resource: &str) {
    let Some(resources) = container
        .get_mut("resources")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    for field in ["limits", "requests"] {
        if let Some(map) = resources.get_mut(field).and_then(Value::as_object_mut) {
            map.remove(resource);
            if map.is_empty() {
                resources.remove(field);
            }
        }
    }
}

/// Adds `{name: claim}` to the container's `resources.claims`.
fn push_claim(container: &mut Value, claim: &str) {
    let Some(container) = container.as_object_mut() else {
        return;
    };
    let resources = container
        .entry("resources")
        .or_insert_with(|| Value::Object(Map::new()));
    if !resources.is_object() {
        *resources = Value::Object(Map::new());
    }
    let claims = resources
        .as_object_mut()
        .map(|r| r.entry("claims").or_insert_with(|| json!([])));
    if let Some(Value::Array(claims)) = claims {
        claims.push(json!({"name": claim}));
    }
}

/// Adds Tessera's gate unless the pod has it.
fn add_gate(spec: &mut Map<String, Value>) {
    let gates = spec.entry("schedulingGates").or_insert_with(|| json!([]));
    if !gates.is_array() {
        *gates = json!([]);
    }
    if let Value::Array(gates) = gates {
        let present = gates
            .iter()
            .any(|g| g.get("name").and_then(Value::as_str) == Some(TOPOLOGY_AWARE_GATE));
        if !present {
            gates.push(json!({"name": TOPOLOGY_AWARE_GATE}));
        }
    }
}

/// Records what was converted in the pod's annotation.
fn annotate(object: &mut Value, requests: &[ConvertedRequest]) {
    let Some(object) = object.as_object_mut() else {
        return;
    };
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !metadata.is_object() {
        *metadata = Value::Object(Map::new());
    }
    let Some(metadata) = metadata.as_object_mut() else {
        return;
    };
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if !annotations.is_object() {
        *annotations = Value::Object(Map::new());
    }
    if let Some(annotations) = annotations.as_object_mut() {
        let text = serde_json::to_string(requests).unwrap_or_default();
        annotations.insert(
            DEVICE_PLUGIN_CONVERSION_ANNOTATION.to_owned(),
            Value::String(text),
        );
    }
}

#[cfg(test)]
mod tests;
