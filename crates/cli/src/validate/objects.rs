//! Reading objects out of YAML and finding the fields the linter checks.

use std::fmt;

use serde::Deserialize;
use serde_json::Value;

/// Parses every document of a multi-document YAML text, flattening `List` objects. Empty
/// documents are skipped.
pub fn documents(text: &str) -> Result<Vec<Value>, String> {
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let yaml = serde_yaml::Value::deserialize(document).map_err(|e| e.to_string())?;
        if yaml.is_null() {
            continue;
        }
        let json = serde_json::to_value(yaml).map_err(|e| e.to_string())?;
        flatten(json, &mut objects);
    }
    Ok(objects)
}

fn flatten(object: Value, objects: &mut Vec<Value>) {
    let is_list = object["kind"].as_str().is_some_and(|k| k.ends_with("List"));
    match object {
        Value::Object(mut map) if is_list && map.get("items").is_some_and(Value::is_array) => {
            if let Some(Value::Array(items)) = map.remove("items") {
                items.into_iter().for_each(|item| flatten(item, objects));
            }
        }
        other => objects.push(other),
    }
}

/// The kinds the linter checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckedKind {
    DeviceClass,
    ResourceClaim,
    ResourceClaimTemplate,
    /// A core/v1 ResourceQuota: its GPU keys are checked (see `quota`).
    ResourceQuota,
}

/// Kind, namespace and name of an object, as findings name it (`ResourceClaim/ns/name`).
#[derive(Debug, Clone)]
pub struct ObjectRef {
    kind: String,
    checked: Option<CheckedKind>,
    namespace: Option<String>,
    name: String,
}

impl ObjectRef {
    pub fn of(object: &Value) -> ObjectRef {
        let kind = object["kind"].as_str().unwrap_or("<no kind>").to_owned();
        let group = object["apiVersion"]
            .as_str()
            .and_then(|v| v.split_once('/'))
            .map(|(group, _)| group);
        let checked = match (group, kind.as_str()) {
            (Some("resource.k8s.io"), "DeviceClass") => Some(CheckedKind::DeviceClass),
            (Some("resource.k8s.io"), "ResourceClaim") => Some(CheckedKind::ResourceClaim),
            (Some("resource.k8s.io"), "ResourceClaimTemplate") => {
                Some(CheckedKind::ResourceClaimTemplate)
            }
            (None, "ResourceQuota") if object["apiVersion"] == "v1" => {
                Some(CheckedKind::ResourceQuota)
            }
            _ => None,
        };
        let metadata = &object["metadata"];
        let name = metadata["name"]
            .as_str()
            .map(str::to_owned)
            .or_else(|| metadata["generateName"].as_str().map(|g| format!("{g}*")))
            .unwrap_or_else(|| "<unnamed>".to_owned());
        ObjectRef {
            kind,
            checked,
            namespace: metadata["namespace"].as_str().map(str::to_owned),
            name,
        }
    }

    pub fn is_checked_kind(&self) -> bool {
        self.checked.is_some()
    }

    pub fn is_device_class(&self) -> bool {
        self.checked == Some(CheckedKind::DeviceClass)
    }

    pub fn is_resource_quota(&self) -> bool {
        self.checked == Some(CheckedKind::ResourceQuota)
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(namespace) => write!(f, "{}/{namespace}/{}", self.kind, self.name),
            None => write!(f, "{}/{}", self.kind, self.name),
        }
    }
}

/// The checked fields of one object, each with its path.
#[derive(Debug, Default)]
pub struct Fields {
    /// `(path of the selector, CEL expression)`.
    pub selectors: Vec<(String, String)>,
    /// `(path, fully qualified attribute name)` of `matchAttribute` / `distinctAttribute`.
    pub constraint_attributes: Vec<(String, String)>,
    /// `(path of the parameters, problem)` of opaque configurations for Tessera's driver, or
    /// NVIDIA's `resource.nvidia.com/v1beta1` ones for NVIDIA's driver (`gpu.nvidia.com`), which
    /// the node plugin takes as its own when no device of the claim is NVIDIA's driver's; the
    /// same check the validating webhook makes ([`tessera_admission::claim_config`]).
    pub config_problems: Vec<(String, String)>,
    /// `(path, problem)` for fields of the wrong shape.
    pub malformed: Vec<(String, String)>,
}

/// Finds the selectors, constraints and opaque configurations of `object`.
pub fn selector_fields(object_ref: &ObjectRef, object: &Value) -> Fields {
    let mut fields = Fields::default();
    match object_ref.checked {
        Some(CheckedKind::DeviceClass) => {
            let spec = &object["spec"];
            selectors(&spec["selectors"], "spec.selectors", &mut fields);
            configs(&spec["config"], "spec.config", &mut fields);
        }
        Some(CheckedKind::ResourceClaim) => {
            devices(&object["spec"]["devices"], "spec.devices", &mut fields)
        }
        Some(CheckedKind::ResourceClaimTemplate) => {
            devices(
                &object["spec"]["spec"]["devices"],
                "spec.spec.devices",
                &mut fields,
            );
        }
        Some(CheckedKind::ResourceQuota) | None => {}
    }
    fields
}

/// The entries of an optional list field; a present field that is not a list is malformed.
fn entries<'a>(value: &'a Value, path: &str, fields: &mut Fields) -> &'a [Value] {
    match value {
        Value::Null => &[],
        Value::Array(items) => items,
        _ => {
            fields
                .malformed
                .push((path.to_owned(), "must be a list".to_owned()));
            &[]
        }
    }
}

fn selectors(value: &Value, path: &str, fields: &mut Fields) {
    for (i, selector) in entries(value, path, fields).iter().enumerate() {
        let path = format!("{path}[{i}]");
        match selector["cel"]["expression"].as_str() {
            Some(expression) => fields.selectors.push((path, expression.to_owned())),
            None => fields.malformed.push((
                path,
                "a selector needs a `cel.expression` string".to_owned(),
            )),
        }
    }
}

fn configs(value: &Value, path: &str, fields: &mut Fields) {
    // The shape first (a present non-list is malformed), then the webhook's own check.
    entries(value, path, fields);
    fields.config_problems.extend(
        tessera_admission::claim_config::config_list_problems(value, path)
            .into_iter()
            .map(|p| (p.path, p.problem)),
    );
}

/// `spec.devices` of a claim: requests (v1 `exactly`, v1beta1 inline, `firstAvailable`),
/// constraints and configs.
fn devices(devices: &Value, path: &str, fields: &mut Fields) {
    let requests_path = format!("{path}.requests");
    for (i, request) in entries(&devices["requests"], &requests_path, fields)
        .iter()
        .enumerate()
    {
        let request_path = format!("{requests_path}[{i}]");
        selectors(
            &request["exactly"]["selectors"],
            &format!("{request_path}.exactly.selectors"),
            fields,
        );
        selectors(
            &request["selectors"],
            &format!("{request_path}.selectors"),
            fields,
        );
        let first_path = format!("{request_path}.firstAvailable");
        for (j, sub) in entries(&request["firstAvailable"], &first_path, fields)
            .iter()
            .enumerate()
        {
            selectors(
                &sub["selectors"],
                &format!("{first_path}[{j}].selectors"),
                fields,
            );
        }
    }
    let constraints_path = format!("{path}.constraints");
    for (i, constraint) in entries(&devices["constraints"], &constraints_path, fields)
        .iter()
        .enumerate()
    {
        for field in ["matchAttribute", "distinctAttribute"] {
            if let Some(name) = constraint[field].as_str() {
                fields
                    .constraint_attributes
                    .push((format!("{constraints_path}[{i}].{field}"), name.to_owned()));
            }
        }
    }
    configs(&devices["config"], &format!("{path}.config"), fields);
}
