//! Server-side apply, approximated without a schema (see the crate docs): the applied
//! configuration is merged in like a JSON merge patch, and what the same manager applied before
//! but no longer applies is removed.

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::managed_fields::field_set;
use crate::resources::StatusOnCreate;
use crate::store::{ObjectKey, Store, metadata_mut};
use crate::target::{SERVER_OWNED, Target, check_resource_version, check_type};

/// The server-side apply approximation described in the module docs.
pub(crate) fn apply(
    store: &mut Store,
    target: &Target<'_>,
    name: &str,
    key: &ObjectKey,
    old: Option<&Value>,
    config: Value,
) -> Result<(Value, Value), ApiError> {
    if target.manager.is_empty() {
        return Err(ApiError::bad_request(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
        ));
    }
    check_type(target, &config)?;
    let api_version = config.get("apiVersion").and_then(Value::as_str);
    let kind = config.get("kind").and_then(Value::as_str);
    if api_version != Some(&target.resource.api_version()) || kind != Some(target.resource.kind) {
        return Err(ApiError::bad_request(format!(
            "an apply configuration needs apiVersion {} and kind {}, got {:?} and {:?}",
            target.resource.api_version(),
            target.resource.kind,
            api_version,
            kind
        )));
    }
    let config_name = config.pointer("/metadata/name").and_then(Value::as_str);
    if config_name != Some(name) {
        return Err(ApiError::bad_request(format!(
            "the name of the apply configuration ({config_name:?}) does not match the name in the URL ({name})"
        )));
    }
    if let Some(old) = old {
        check_resource_version(target, name, &config, old)?;
    }
    let mut applied = config.clone();
    for field in SERVER_OWNED {
        metadata_mut(&mut applied).remove(*field);
    }
    let mut new = match old {
        Some(old) => old.clone(),
        None => {
            let mut fresh = json!({"metadata": {}});
            if target.resource.status_subresource
                && !target.status
                && let StatusOnCreate::Initial(status) = target.resource.status_on_create
            {
                fresh["status"] = serde_json::from_str(status).expect("built-in JSON");
            }
            fresh
        }
    };
    if let Some(previous) = store.applied(key, &target.manager, target.status) {
        remove_released(&mut new, previous, &applied);
    }
    json_patch::merge(&mut new, &applied);
    let fields = field_set(&applied);
    store.record_applied(key, &target.manager, target.status, applied);
    Ok((new, fields))
}

/// Removes from `object` the fields that `previous` set and `current` no longer sets.
fn remove_released(object: &mut Value, previous: &Value, current: &Value) {
    let (Some(object), Some(previous)) = (object.as_object_mut(), previous.as_object()) else {
        return;
    };
    for (field, before) in previous {
        match current.get(field) {
            None => {
                object.remove(field);
            }
            Some(now) if before.is_object() && now.is_object() => {
                if let Some(child) = object.get_mut(field) {
                    remove_released(child, before, now);
                }
            }
            Some(_) => {}
        }
    }
}
