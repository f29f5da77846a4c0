//! `metadata.managedFields`: which manager wrote which fields, as the API server records it
//! (lists count as single fields: the fake does not track list items).

use serde_json::{Map, Value, json};

use crate::store::{metadata_mut, now};
use crate::target::{SERVER_OWNED, Target};

/// The `fieldsV1` form of the fields a body sets: `{"f:spec": {"f:driver": {}}}`. Lists count
/// as single fields (the fake does not track list items).
pub(crate) fn field_set(body: &Value) -> Value {
    let mut fields = Map::new();
    if let Some(map) = body.as_object() {
        for (key, value) in map {
            if matches!(key.as_str(), "apiVersion" | "kind") {
                continue;
            }
            let child = if key == "metadata" {
                let mut meta = value.clone();
                if let Some(meta) = meta.as_object_mut() {
                    for skip in SERVER_OWNED
                        .iter()
                        .chain(&["name", "namespace", "generateName"])
                    {
                        meta.remove(*skip);
                    }
                }
                field_set(&meta)
            } else {
                field_set(value)
            };
            if key == "metadata" && child.as_object().is_some_and(Map::is_empty) {
                continue;
            }
            fields.insert(format!("f:{key}"), child);
        }
    }
    Value::Object(fields)
}

/// Records the write in `metadata.managedFields`, replacing the entry of the same manager,
/// operation and subresource. An entry whose fields did not change keeps its time, so that a
/// write changing nothing leaves the object as it was (and is not stored: see `write::finish`).
pub(crate) fn record_manager(
    object: &mut Value,
    target: &Target<'_>,
    operation: &str,
    fields: Value,
) {
    let subresource = if target.status { "status" } else { "" };
    let mut entry = json!({
        "manager": target.manager,
        "operation": operation,
        "apiVersion": target.resource.api_version(),
        "time": now(),
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    });
    if target.status {
        entry["subresource"] = Value::String("status".into());
    }
    let meta = metadata_mut(object);
    let mut entries: Vec<Value> = meta
        .get("managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let same_writer = |e: &Value| {
        e.get("manager").and_then(Value::as_str) == Some(&target.manager)
            && e.get("operation").and_then(Value::as_str) == Some(operation)
            && e.get("subresource")
                .and_then(Value::as_str)
                .unwrap_or_default()
                == subresource
    };
    match entries.iter_mut().find(|e| same_writer(e)) {
        Some(existing) if existing.get("fieldsV1") == entry.get("fieldsV1") => {}
        Some(existing) => *existing = entry,
        None => entries.push(entry),
    }
    meta.insert("managedFields".into(), Value::Array(entries));
}
