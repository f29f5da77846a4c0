//! `tessera migrate --convert-device-plugin-pods`: what the admission webhook's device-plugin
//! conversion (`tessera_admission::conversion`, docs/admission.md) does to the pods of a manifest,
//! printed instead of done at creation. Pods and the pod templates of workloads (Deployment,
//! ReplicaSet, StatefulSet, DaemonSet, Job, CronJob, ReplicationController, PodTemplate) asking
//! for `nvidia.com/gpu` or a MIG profile's extended resource get the claims and the gate, and the
//! ResourceClaimTemplates they name are added to the output (in the object's namespace), as the
//! controller would keep them. The chart's DeviceClasses decide what is converted.

use k8s_openapi::api::resource::v1::DeviceClass;
use serde::Deserialize;
use serde_yaml::Value;
use tessera_admission::{ConversionTable, Unconverted, convert};

use super::Notes;

/// The chart's DeviceClasses, which the conversion converts to.
const CHART_CLASSES: &str =
    include_str!("../../../../deploy/helm/tessera/files/deviceclasses.yaml");

/// The conversion table of the chart's classes.
pub fn chart_table() -> ConversionTable {
    let classes: Vec<DeviceClass> = serde_yaml::Deserializer::from_str(CHART_CLASSES)
        .filter_map(|doc| DeviceClass::deserialize(doc).ok())
        .collect();
    ConversionTable::from_device_classes(&classes)
}

/// Where the pod template of `kind` lives, as a path of mapping keys.
pub fn template_path(kind: &str) -> Option<&'static [&'static str]> {
    Some(match kind {
        "Pod" => &[],
        "Deployment"
        | "ReplicaSet"
        | "StatefulSet"
        | "DaemonSet"
        | "Job"
        | "ReplicationController" => &["spec", "template"],
        "CronJob" => &["spec", "jobTemplate", "spec", "template"],
        "PodTemplate" => &["template"],
        _ => return None,
    })
}

/// Converts the pod (template) of `object` in place; returns the ResourceClaimTemplates it needs.
pub fn convert_object(
    object: &mut Value,
    table: &ConversionTable,
    notes: &mut Notes,
) -> Vec<Value> {
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let Some(path) = template_path(&kind) else {
        return Vec::new();
    };
    let namespace = object
        .get("metadata")
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let mut slot = &mut *object;
    for key in path {
        match slot.get_mut(*key) {
            Some(next) => slot = next,
            None => return Vec::new(),
        }
    }
    let at = if path.is_empty() {
        String::new()
    } else {
        format!("{}.", path.join("."))
    };
    let Ok(json) = serde_json::to_value(&*slot) else {
        return Vec::new();
    };
    let conversion = match convert(&json, table) {
        Ok(conversion) => conversion,
        Err(Unconverted::NothingToConvert | Unconverted::NoPodSpec) => return Vec::new(),
        Err(why) => {
            notes.not_carried(
                format!("{at}spec"),
                format!("device-plugin conversion skipped: {why}"),
            );
            return Vec::new();
        }
    };
    let Ok(converted) = serde_yaml::to_value(&conversion.object) else {
        return Vec::new();
    };
    *slot = converted;
    for request in &conversion.requests {
        notes.change(
            format!("{at}spec.containers[{}].resources", request.container),
            format!(
                "{}: {} → claim {} from ResourceClaimTemplate {} (class {}), gate gpu.tessera.dev/topology-aware",
                request.resource, request.count, request.claim, request.template, request.device_class
            ),
        );
    }
    conversion
        .templates(namespace.as_deref())
        .iter()
        .filter_map(|t| serde_yaml::to_value(t).ok())
        .collect()
}
