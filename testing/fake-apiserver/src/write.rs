//! Write semantics: create, update, the patch flavours, server-side apply, delete — with
//! resourceVersion preconditions, server-owned metadata, the status subresource, finalizers and
//! `metadata.managedFields`.
//!
//! Server-side apply is approximated (the fake has no schema): the applied configuration is
//! merged into the object like a JSON merge patch (maps merge, lists are replaced whole), and the
//! fields the same manager applied last time but left out now are removed. Ownership conflicts
//! between managers are not detected (`force` is accepted and has no effect), and list merge keys
//! (`+listType=map`) are not honoured. Strategic merge patches are treated as JSON merge patches.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::apply::apply;
use crate::error::ApiError;
use crate::hooks::Hooks;
use crate::managed_fields::{field_set, record_manager};
use crate::resources::{ResourceType, StatusOnCreate};
use crate::store::{ObjectKey, Store, metadata_mut, now};
use crate::target::{SERVER_OWNED, Target, check_resource_version, check_type};

/// A PATCH body by content type.
#[derive(Debug, Clone)]
pub enum PatchBody {
    /// `application/merge-patch+json` (RFC 7386).
    Merge(Value),
    /// `application/strategic-merge-patch+json`, approximated as a merge patch.
    StrategicMerge(Value),
    /// `application/json-patch+json` (RFC 6902).
    Json(json_patch::Patch),
    /// `application/apply-patch+yaml`: server-side apply (`force` changes nothing: the fake
    /// does not detect ownership conflicts).
    Apply(Value),
}

/// POST: creates an object named by the body (or generated from `generateName`).
pub fn create(
    store: &mut Store,
    hooks: &Hooks,
    target: &Target<'_>,
    mut body: Value,
) -> Result<Arc<Value>, ApiError> {
    check_type(target, &body)?;
    let meta = metadata_mut(&mut body);
    for field in SERVER_OWNED {
        meta.remove(*field);
    }
    let name = match meta.get("name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => name.to_owned(),
        _ => match meta.get("generateName").and_then(Value::as_str) {
            Some(prefix) if !prefix.is_empty() => {
                let name = store.generate_name(prefix);
                meta.insert("name".into(), Value::String(name.clone()));
                name
            }
            _ => {
                return Err(ApiError::invalid(
                    &target.resource_name(),
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
        },
    };
    if let Some(url_name) = target.name
        && url_name != name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({name}) does not match the name in the URL ({url_name})"
        )));
    }
    set_namespace(target, &mut body)?;
    let key = target.key(&name);
    if store.get(&key).is_some() {
        return Err(ApiError::already_exists(&target.resource_name(), &name));
    }
    if target.resource.status_subresource {
        match target.resource.status_on_create {
            StatusOnCreate::Keep => {}
            StatusOnCreate::Clear => {
                body.as_object_mut().map(|m| m.remove("status"));
            }
            StatusOnCreate::Initial(status) => {
                body["status"] = serde_json::from_str(status).expect("built-in JSON");
            }
        }
    }
    set_type(target.resource, &mut body);
    let fields = field_set(&body);
    record_manager(&mut body, target, "Update", fields);
    finish(store, hooks, target, &key, None, body)
}

/// PUT: replaces an object; a non-empty `metadata.resourceVersion` must match the stored one.
pub fn update(
    store: &mut Store,
    hooks: &Hooks,
    target: &Target<'_>,
    mut body: Value,
) -> Result<Arc<Value>, ApiError> {
    check_type(target, &body)?;
    let name = target.object_name()?.to_owned();
    let body_name = body
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name in the URL ({name})"
        )));
    }
    set_namespace(target, &mut body)?;
    let key = target.key(&name);
    let old = store
        .get_shared(&key)
        .ok_or_else(|| ApiError::not_found(&target.resource_name(), &name))?;
    check_resource_version(target, &name, &body, &old)?;
    let fields = field_set(&body);
    let mut new = carry_server_owned(&old, body);
    record_manager(&mut new, target, "Update", fields);
    finish(store, hooks, target, &key, Some(&old), new)
}

/// PATCH: merge, strategic merge (as merge), JSON patch or server-side apply.
pub fn patch(
    store: &mut Store,
    hooks: &Hooks,
    target: &Target<'_>,
    body: PatchBody,
) -> Result<Arc<Value>, ApiError> {
    let name = target.object_name()?.to_owned();
    let key = target.key(&name);
    let old = store.get_shared(&key);
    if target.status && old.is_none() {
        return Err(ApiError::not_found(&target.resource_name(), &name));
    }
    let (new, operation, fields) = match body {
        PatchBody::Merge(patch) | PatchBody::StrategicMerge(patch) => {
            let mut new = old
                .as_deref()
                .cloned()
                .ok_or_else(|| ApiError::not_found(&target.resource_name(), &name))?;
            if !patch.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            json_patch::merge(&mut new, &patch);
            check_resource_version(
                target,
                &name,
                &patch,
                old.as_deref().expect("checked above"),
            )?;
            (new, "Update", field_set(&patch))
        }
        PatchBody::Json(patch) => {
            let mut new = old
                .as_deref()
                .cloned()
                .ok_or_else(|| ApiError::not_found(&target.resource_name(), &name))?;
            json_patch::patch(&mut new, &patch).map_err(|e| {
                ApiError::new(422, format!("the JSON patch could not be applied: {e}"))
            })?;
            (new, "Update", json!({}))
        }
        PatchBody::Apply(config) => {
            let (new, fields) = apply(store, target, &name, &key, old.as_deref(), config)?;
            (new, "Apply", fields)
        }
    };
    let mut new = match &old {
        Some(old) => carry_server_owned(old, new),
        None => new,
    };
    set_namespace(target, &mut new)?;
    metadata_mut(&mut new).insert("name".into(), Value::String(name));
    record_manager(&mut new, target, operation, fields);
    finish(store, hooks, target, &key, old.as_deref(), new)
}

/// DELETE: removes the object, or marks it terminating while finalizers remain.
pub fn delete(
    store: &mut Store,
    target: &Target<'_>,
    options: &Value,
) -> Result<Arc<Value>, ApiError> {
    let name = target.object_name()?.to_owned();
    let key = target.key(&name);
    let old = store
        .get_shared(&key)
        .ok_or_else(|| ApiError::not_found(&target.resource_name(), &name))?;
    if let Some(preconditions) = options.get("preconditions") {
        let uid = preconditions.get("uid").and_then(Value::as_str);
        let rv = preconditions.get("resourceVersion").and_then(Value::as_str);
        let old_uid = old.pointer("/metadata/uid").and_then(Value::as_str);
        let old_rv = old
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str);
        if uid.is_some_and(|uid| Some(uid) != old_uid) || rv.is_some_and(|rv| Some(rv) != old_rv) {
            return Err(ApiError::conflict(&target.resource_name(), &name));
        }
    }
    let has_finalizers = old
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty());
    if has_finalizers {
        if old.pointer("/metadata/deletionTimestamp").is_some() {
            return Ok(old);
        }
        let mut terminating = Value::clone(&old);
        let meta = metadata_mut(&mut terminating);
        meta.insert("deletionTimestamp".into(), Value::String(now()));
        meta.insert("deletionGracePeriodSeconds".into(), Value::from(0));
        return Ok(store.replace(target.resource, &key, terminating));
    }
    Ok(store
        .remove(target.resource, &key)
        .expect("the object was read above"))
}

/// Takes the server-owned metadata of `old` into `new`.
fn carry_server_owned(old: &Value, mut new: Value) -> Value {
    let old_meta = old.get("metadata").and_then(Value::as_object);
    let meta = metadata_mut(&mut new);
    for field in SERVER_OWNED {
        match old_meta.and_then(|m| m.get(*field)) {
            Some(value) => meta.insert((*field).to_owned(), value.clone()),
            None => meta.remove(*field),
        };
    }
    new
}

/// The status-subresource split, field drops, validation, then the store.
fn finish(
    store: &mut Store,
    hooks: &Hooks,
    target: &Target<'_>,
    key: &ObjectKey,
    old: Option<&Value>,
    mut new: Value,
) -> Result<Arc<Value>, ApiError> {
    if target.resource.status_subresource {
        if let Some(old) = old {
            new = split_status(old, new, target.status);
        }
    } else if target.status {
        return Err(ApiError::not_found(
            &format!("{}/status", target.resource_name()),
            &key.name,
        ));
    }
    set_type(target.resource, &mut new);
    let resource = target.resource_name();
    hooks.drop_fields(&resource, target.resource.plural, &mut new);
    for validator in hooks.validators(&resource, target.resource.plural) {
        validator(old, &new).map_err(|message| ApiError::invalid(&resource, &key.name, message))?;
    }
    Ok(match old {
        // A write that changes nothing is not stored: no new resourceVersion, no event.
        Some(old) if *old == new => Arc::new(new),
        Some(_) => store.replace(target.resource, key, new),
        None => store.insert(target.resource, key.clone(), new),
    })
}

/// A main-resource write keeps the stored status; a status write changes only the status
/// (and the managed fields it records).
fn split_status(old: &Value, new: Value, status_write: bool) -> Value {
    if status_write {
        let mut result = old.clone();
        match new.get("status") {
            Some(status) => result["status"] = status.clone(),
            None => {
                result.as_object_mut().map(|m| m.remove("status"));
            }
        }
        if let Some(fields) = new.pointer("/metadata/managedFields") {
            metadata_mut(&mut result).insert("managedFields".into(), fields.clone());
        }
        result
    } else {
        let mut result = new;
        match old.get("status") {
            Some(status) => result["status"] = status.clone(),
            None => {
                result.as_object_mut().map(|m| m.remove("status"));
            }
        }
        result
    }
}

fn set_namespace(target: &Target<'_>, body: &mut Value) -> Result<(), ApiError> {
    let meta = metadata_mut(body);
    if !target.resource.namespaced {
        meta.remove("namespace");
        return Ok(());
    }
    let Some(namespace) = target.namespace else {
        return Err(ApiError::bad_request(format!(
            "{} are namespaced: write them under /namespaces/<namespace>/",
            target.resource_name()
        )));
    };
    match meta.get("namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() && ns != namespace => Err(ApiError::bad_request(format!(
            "the namespace of the object ({ns}) does not match the namespace on the request ({namespace})"
        ))),
        _ => {
            meta.insert("namespace".into(), Value::String(namespace.to_owned()));
            Ok(())
        }
    }
}

/// Sets `apiVersion` and `kind`.
pub fn set_type(resource: &ResourceType, object: &mut Value) {
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".into(), Value::String(resource.api_version()));
        map.insert("kind".into(), Value::String(resource.kind.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::by_name;

    fn target(resource: &str, name: Option<&'static str>, status: bool) -> Target<'static> {
        Target {
            resource: by_name(resource).unwrap(),
            namespace: Some("ns"),
            name,
            status,
            manager: "test".into(),
        }
    }

    #[test]
    fn apply_removes_what_the_manager_stopped_setting() {
        let mut store = Store::default();
        let hooks = Hooks::default();
        let t = target("resourceslices", Some("s"), false);
        let first = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "s", "labels": {"a": "1", "b": "2"}},
            "spec": {"driver": "d", "nodeName": "n", "devices": [{"name": "x"}]}
        });
        let stored = patch(&mut store, &hooks, &t, PatchBody::Apply(first)).unwrap();
        assert_eq!(stored["metadata"]["generation"], 1);
        assert_eq!(stored["metadata"]["managedFields"][0]["operation"], "Apply");
        assert_eq!(
            stored["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:driver"],
            json!({})
        );
        let second = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "s", "labels": {"a": "1"}},
            "spec": {"driver": "d", "devices": [{"name": "y"}]}
        });
        let stored = patch(&mut store, &hooks, &t, PatchBody::Apply(second)).unwrap();
        assert_eq!(stored["metadata"]["labels"], json!({"a": "1"}));
        assert_eq!(
            stored["spec"],
            json!({"driver": "d", "devices": [{"name": "y"}]})
        );
        assert_eq!(stored["metadata"]["generation"], 2);
    }

    #[test]
    fn apply_needs_a_manager_and_matching_type() {
        let mut store = Store::default();
        let hooks = Hooks::default();
        let mut t = target("nodes", Some("n"), false);
        let config = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}});
        t.manager = String::new();
        assert_eq!(
            patch(&mut store, &hooks, &t, PatchBody::Apply(config.clone()))
                .unwrap_err()
                .code,
            400
        );
        t.manager = "m".into();
        let wrong = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "n"}});
        assert_eq!(
            patch(&mut store, &hooks, &t, PatchBody::Apply(wrong))
                .unwrap_err()
                .code,
            400
        );
        assert!(patch(&mut store, &hooks, &t, PatchBody::Apply(config)).is_ok());
    }

    #[test]
    fn status_writes_and_main_writes_stay_apart() {
        let mut store = Store::default();
        let hooks = Hooks::default();
        let main = target("resourceclaims", None, false);
        let created = create(
            &mut store,
            &hooks,
            &main,
            json!({"metadata": {"name": "c"}, "spec": {"devices": {}}, "status": {"allocation": {}}}),
        )
        .unwrap();
        assert!(
            created.get("status").is_none(),
            "create clears a claim's status"
        );
        assert_eq!(created["metadata"]["namespace"], "ns");

        let status = target("resourceclaims", Some("c"), true);
        let mut with_status = Value::clone(&created);
        with_status["status"] = json!({"allocation": {"devices": {"results": []}}});
        with_status["spec"] = json!({"changed": true});
        let written = update(&mut store, &hooks, &status, with_status).unwrap();
        assert_eq!(
            written["spec"],
            json!({"devices": {}}),
            "a status write keeps the spec"
        );
        assert!(written["status"]["allocation"].is_object());

        let main_named = target("resourceclaims", Some("c"), false);
        let mut stale = Value::clone(&created);
        stale["metadata"]["labels"] = json!({"x": "y"});
        assert_eq!(
            update(&mut store, &hooks, &main_named, stale)
                .unwrap_err()
                .code,
            409
        );
        let mut fresh = Value::clone(&written);
        fresh.as_object_mut().unwrap().remove("status");
        let kept = update(&mut store, &hooks, &main_named, fresh).unwrap();
        assert!(
            kept["status"]["allocation"].is_object(),
            "a main write keeps the status"
        );
    }

    #[test]
    fn delete_honours_finalizers_and_preconditions() {
        let mut store = Store::default();
        let hooks = Hooks::default();
        let t = target("resourceclaims", Some("c"), false);
        let created = create(
            &mut store,
            &hooks,
            &t,
            json!({"metadata": {"name": "c", "finalizers": ["f"]}}),
        )
        .unwrap();
        let wrong = json!({"preconditions": {"uid": "other"}});
        assert_eq!(delete(&mut store, &t, &wrong).unwrap_err().code, 409);
        let terminating = delete(&mut store, &t, &json!({})).unwrap();
        assert!(terminating["metadata"]["deletionTimestamp"].is_string());
        assert_eq!(terminating["metadata"]["uid"], created["metadata"]["uid"]);
        let merge = PatchBody::Merge(json!({"metadata": {"finalizers": null}}));
        patch(&mut store, &hooks, &t, merge).unwrap();
        assert!(store.get(&t.key("c")).is_none());
    }

    #[test]
    fn json_patch_and_generate_name() {
        let mut store = Store::default();
        let hooks = Hooks::default();
        let t = target("nodes", None, false);
        let created = create(
            &mut store,
            &hooks,
            &t,
            json!({"metadata": {"generateName": "node-"}}),
        )
        .unwrap();
        let name = created["metadata"]["name"].as_str().unwrap().to_owned();
        assert!(name.starts_with("node-") && name.len() == 10, "{name}");
        let named = Target {
            name: Some(Box::leak(name.into_boxed_str())),
            ..t
        };
        let ops: json_patch::Patch = serde_json::from_value(json!([
            {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}},
            {"op": "test", "path": "/metadata/labels/a", "value": "b"}
        ]))
        .unwrap();
        let patched = patch(&mut store, &hooks, &named, PatchBody::Json(ops)).unwrap();
        assert_eq!(patched["metadata"]["labels"]["a"], "b");
        let failing: json_patch::Patch = serde_json::from_value(
            json!([{"op": "test", "path": "/metadata/labels/a", "value": "c"}]),
        )
        .unwrap();
        assert_eq!(
            patch(&mut store, &hooks, &named, PatchBody::Json(failing))
                .unwrap_err()
                .code,
            422
        );
    }
}
