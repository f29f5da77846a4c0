//! One request in, one response out: routing (`/api/v1/...`, `/apis/<group>/<version>/...`),
//! verbs, query parameters, the request log and injected faults.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{Method, Response, StatusCode, header};
use serde_json::{Value, json};

use crate::discovery;
use crate::error::ApiError;
use crate::hooks::{FaultOutcome, RecordedRequest, Verb};
use crate::resources::{self, ResourceType};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::shared::Inner;
use crate::store::ObjectKey;
use crate::target::Target;
use crate::watch::{self, WatchRequest};
use crate::write::{self, PatchBody};

/// Where a request points.
#[derive(Debug, Clone)]
struct Route {
    resource: &'static ResourceType,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
    /// `pods/{name}/eviction` (the Eviction API).
    eviction: bool,
}

/// Parses `/api/v1/...` and `/apis/<group>/<version>/...` resource paths; `Err` is a 404 for
/// paths that are not a served resource (or a subresource other than `status`).
fn route(path: &str) -> Result<Route, ApiError> {
    let not_found = || {
        ApiError::new(
            404,
            format!("the server could not find the requested resource ({path})"),
        )
    };
    let segments: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(not_found()),
    };
    let lookup = |plural: &str| resources::by_plural(group, version, plural);
    let (resource, namespace, tail) = match rest {
        ["namespaces", namespace, plural, tail @ ..]
            if lookup(plural).is_some_and(|r| r.namespaced) =>
        {
            (
                lookup(plural).expect("checked"),
                Some((*namespace).to_owned()),
                tail,
            )
        }
        [plural, tail @ ..] => (lookup(plural).ok_or_else(not_found)?, None, tail),
        [] => return Err(not_found()),
    };
    let (name, status, eviction) = match tail {
        [] => (None, false, false),
        [name] => (Some((*name).to_owned()), false, false),
        [name, "status"] => (Some((*name).to_owned()), true, false),
        [name, "eviction"] if resource.plural == "pods" && resource.group.is_empty() => {
            (Some((*name).to_owned()), false, true)
        }
        _ => return Err(not_found()),
    };
    if resource.namespaced && name.is_some() && namespace.is_none() {
        return Err(not_found());
    }
    Ok(Route {
        resource,
        namespace,
        name,
        status,
        eviction,
    })
}

fn verb_of(
    method: &Method,
    route: &Route,
    query: &HashMap<String, String>,
    content_type: &str,
) -> Result<Verb, ApiError> {
    if route.eviction {
        return match method.as_str() {
            "POST" => Ok(Verb::Create),
            _ => Err(ApiError::new(
                405,
                format!("{method} is not allowed on the eviction subresource"),
            )),
        };
    }
    let watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    let verb = match (method.as_str(), route.name.is_some()) {
        ("GET", true) => Verb::Get,
        ("GET", false) if watch => Verb::Watch,
        ("GET", false) => Verb::List,
        ("POST", false) => Verb::Create,
        ("PUT", true) => Verb::Update,
        ("PATCH", true) if content_type.starts_with("application/apply-patch") => Verb::Apply,
        ("PATCH", true) => Verb::Patch,
        ("DELETE", true) => Verb::Delete,
        ("DELETE", false) => Verb::DeleteCollection,
        _ => {
            return Err(ApiError::new(
                405,
                format!("{method} is not allowed on this path"),
            ));
        }
    };
    if route.status && !matches!(verb, Verb::Get | Verb::Update | Verb::Patch | Verb::Apply) {
        return Err(ApiError::new(
            405,
            format!("{verb} is not allowed on the status subresource"),
        ));
    }
    Ok(verb)
}

/// Answers one request.
pub async fn handle(inner: Arc<Inner>, parts: http::request::Parts, body: Bytes) -> Response<Body> {
    let path = parts.uri.path().to_owned();
    match path.as_str() {
        "/version" => {
            let version = inner.version.lock().expect("version lock").clone();
            return json_response(StatusCode::OK, &discovery::version_info(&version));
        }
        "/healthz" | "/readyz" | "/livez" => {
            return Response::new(Body::from("ok"));
        }
        _ => {}
    }
    if parts.method == Method::GET
        && let Some(document) = discovery::document(&path)
    {
        return json_response(StatusCode::OK, &document);
    }
    let query: HashMap<String, String> =
        form_urlencoded::parse(parts.uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let route = match route(&path) {
        Ok(route) => route,
        Err(error) => return error_response(&error),
    };
    let verb = match verb_of(&parts.method, &route, &query, &content_type) {
        Ok(verb) => verb,
        Err(error) => return error_response(&error),
    };
    let mut record = RecordedRequest {
        verb,
        resource: route.resource.qualified_plural(),
        subresource: if route.status {
            "status".into()
        } else if route.eviction {
            "eviction".into()
        } else {
            String::new()
        },
        namespace: route.namespace.clone().unwrap_or_default(),
        name: route.name.clone().unwrap_or_default(),
        code: 200,
    };
    let fault = inner.hooks.lock().expect("hooks lock").take_fault(&record);
    let response = match fault {
        Some(FaultOutcome::Fail(error)) => error_response(&error),
        Some(FaultOutcome::Delay(delay)) => {
            tokio::time::sleep(delay).await;
            serve(&inner, &parts, &route, verb, &query, &content_type, body)
        }
        None => serve(&inner, &parts, &route, verb, &query, &content_type, body),
    };
    record.code = response.status().as_u16();
    inner.hooks.lock().expect("hooks lock").log.push(record);
    response
}

fn serve(
    inner: &Arc<Inner>,
    parts: &http::request::Parts,
    route: &Route,
    verb: Verb,
    query: &HashMap<String, String>,
    content_type: &str,
    body: Bytes,
) -> Response<Body> {
    if route.eviction {
        return match evict(inner, route, &body) {
            Ok(value) => json_response(StatusCode::CREATED, &value),
            Err(error) => error_response(&error),
        };
    }
    let result = match verb {
        Verb::Get => get(inner, route),
        Verb::List => list(inner, route, query),
        Verb::Watch => return start_watch(inner, route, query),
        Verb::Create | Verb::Update | Verb::Patch | Verb::Apply => {
            write_request(inner, parts, route, verb, query, content_type, &body)
        }
        Verb::Delete => delete(inner, route, &body),
        Verb::DeleteCollection => delete_collection(inner, route, query),
    };
    match result {
        Ok((code, value)) => json_response(code, &value),
        Err(error) => error_response(&error),
    }
}

fn get(inner: &Inner, route: &Route) -> Result<(StatusCode, Arc<Value>), ApiError> {
    let name = route.name.as_deref().unwrap_or_default();
    let key = ObjectKey::new(route.resource, route.namespace.as_deref(), name);
    let store = inner.store.lock().expect("store lock");
    store
        .get_shared(&key)
        .map(|object| (StatusCode::OK, object))
        .ok_or_else(|| ApiError::not_found(&route.resource.qualified_plural(), name))
}

fn selectors(
    route: &Route,
    query: &HashMap<String, String>,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.0))?;
    let fields = FieldSelector::parse(
        query.get("fieldSelector").map_or("", String::as_str),
        route.resource,
    )
    .map_err(|e| ApiError::bad_request(e.0))?;
    Ok((labels, fields))
}

/// LIST with selectors and `limit`/`continue` paging. Pages are cut from the current state (the
/// real API server serves them from one snapshot); the continue token is the last key sent.
fn list(
    inner: &Inner,
    route: &Route,
    query: &HashMap<String, String>,
) -> Result<(StatusCode, Arc<Value>), ApiError> {
    let (labels, fields) = selectors(route, query)?;
    let limit = match query.get("limit") {
        Some(limit) => limit
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request(format!("limit `{limit}` is not a number")))?,
        None => 0,
    };
    let after = query
        .get("continue")
        .filter(|c| !c.is_empty())
        .map(|token| {
            let (namespace, name) = token.split_once('/').unwrap_or(("", token));
            (namespace.to_owned(), name.to_owned())
        });
    let store = inner.store.lock().expect("store lock");
    let matching: Vec<(&ObjectKey, &Value)> = store
        .list(route.resource, route.namespace.as_deref())
        .filter(|(key, _)| {
            after.as_ref().is_none_or(|(ns, name)| {
                (key.namespace.as_str(), key.name.as_str()) > (ns.as_str(), name.as_str())
            })
        })
        .filter(|(_, object)| labels.matches(object) && fields.matches(object))
        .collect();
    let page = if limit > 0 {
        limit.min(matching.len())
    } else {
        matching.len()
    };
    let items: Vec<Value> = matching[..page]
        .iter()
        .map(|(_, object)| (*object).clone())
        .collect();
    let remaining = matching.len() - page;
    let last_key = matching[..page]
        .last()
        .map(|(key, _)| format!("{}/{}", key.namespace, key.name));
    let mut metadata = json!({"resourceVersion": store.resource_version().to_string()});
    if limit > 0 && remaining > 0 {
        metadata["continue"] = json!(last_key.unwrap_or_default());
        metadata["remainingItemCount"] = json!(remaining);
    }
    Ok((
        StatusCode::OK,
        Arc::new(json!({
            "kind": format!("{}List", route.resource.kind),
            "apiVersion": route.resource.api_version(),
            "metadata": metadata,
            "items": items,
        })),
    ))
}

fn start_watch(
    inner: &Arc<Inner>,
    route: &Route,
    query: &HashMap<String, String>,
) -> Response<Body> {
    let (labels, fields) = match selectors(route, query) {
        Ok(found) => found,
        Err(error) => return error_response(&error),
    };
    let resource_version = match query.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => None,
        Some(rv) => match rv.parse::<u64>() {
            Ok(rv) => Some(rv),
            Err(_) => {
                return error_response(&ApiError::bad_request(format!(
                    "resourceVersion `{rv}` is not a resource version of this server"
                )));
            }
        },
    };
    let flag = |name: &str| query.get(name).is_some_and(|v| v == "true" || v == "1");
    let request = WatchRequest {
        resource: route.resource,
        namespace: route.namespace.clone(),
        labels,
        fields,
        resource_version,
        send_initial_events: flag("sendInitialEvents"),
        bookmarks: flag("allowWatchBookmarks"),
        timeout: query
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .map(Duration::from_secs),
    };
    let stream = watch::start(Arc::clone(inner), request);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::TRANSFER_ENCODING, "chunked")
        .body(Body::from_stream(stream))
        .expect("a valid response")
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not JSON: {e}")))
}

/// A write, with its body decoded.
enum WriteOperation {
    Create(Value),
    Update(Value),
    Patch(PatchBody),
}

/// CREATE, UPDATE, PATCH and APPLY (`verb` is one of these).
fn write_request(
    inner: &Inner,
    parts: &http::request::Parts,
    route: &Route,
    verb: Verb,
    query: &HashMap<String, String>,
    content_type: &str,
    body: &[u8],
) -> Result<(StatusCode, Arc<Value>), ApiError> {
    if query.contains_key("dryRun") {
        return Err(ApiError::bad_request(
            "the fake API server does not support dryRun",
        ));
    }
    let field_manager = query.get("fieldManager").cloned();
    let manager = match verb {
        Verb::Apply => field_manager.unwrap_or_default(),
        _ => field_manager.unwrap_or_else(|| user_agent(parts)),
    };
    let target = Target {
        resource: route.resource,
        namespace: route.namespace.as_deref(),
        name: route.name.as_deref(),
        status: route.status,
        manager,
    };
    let operation = match verb {
        Verb::Create => WriteOperation::Create(parse_json(body)?),
        Verb::Update => WriteOperation::Update(parse_json(body)?),
        Verb::Apply => WriteOperation::Patch(PatchBody::Apply(
            serde_json::from_slice(body)
                .or_else(|_| serde_yaml::from_slice(body))
                .map_err(|e| {
                    ApiError::bad_request(format!(
                        "the apply configuration is neither JSON nor YAML: {e}"
                    ))
                })?,
        )),
        _ if content_type.starts_with("application/json-patch+json") => {
            WriteOperation::Patch(PatchBody::Json(
                serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?,
            ))
        }
        _ if content_type.starts_with("application/strategic-merge-patch+json") => {
            WriteOperation::Patch(PatchBody::StrategicMerge(parse_json(body)?))
        }
        _ if content_type.starts_with("application/merge-patch+json") => {
            WriteOperation::Patch(PatchBody::Merge(parse_json(body)?))
        }
        _ => {
            return Err(ApiError::new(
                415,
                format!(
                    "the body of a PATCH must be one of the patch content types, not `{content_type}`"
                ),
            ));
        }
    };
    let existed = route.name.as_deref().is_some_and(|name| {
        let key = ObjectKey::new(route.resource, route.namespace.as_deref(), name);
        inner.store.lock().expect("store lock").get(&key).is_some()
    });
    let stored = inner.mutate(|store, hooks| match operation {
        WriteOperation::Create(object) => write::create(store, hooks, &target, object),
        WriteOperation::Update(object) => write::update(store, hooks, &target, object),
        WriteOperation::Patch(patch) => write::patch(store, hooks, &target, patch),
    })?;
    let created = verb == Verb::Create || (verb == Verb::Apply && !existed);
    Ok((
        if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        stored,
    ))
}

fn user_agent(parts: &http::request::Parts) -> String {
    parts
        .headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|agent| agent.split('/').next())
        .filter(|agent| !agent.is_empty())
        .unwrap_or("unknown")
        .to_owned()
}

fn delete(inner: &Inner, route: &Route, body: &[u8]) -> Result<(StatusCode, Arc<Value>), ApiError> {
    let options = if body.is_empty() {
        json!({})
    } else {
        parse_json(body)?
    };
    let target = Target {
        resource: route.resource,
        namespace: route.namespace.as_deref(),
        name: route.name.as_deref(),
        status: false,
        manager: String::new(),
    };
    let object = inner.mutate(|store, _| write::delete(store, &target, &options))?;
    Ok((StatusCode::OK, object))
}

/// The Eviction API: the pod is deleted (with the eviction's delete options) unless a
/// PodDisruptionBudget of its namespace whose `matchLabels` select it has
/// `status.disruptionsAllowed` 0 (429, as the API server answers); a budget that allows one has
/// it spent. Like the API server, a pod that is pending, finished or terminating is deleted
/// whatever the budgets say. Budgets with `matchExpressions` are not evaluated (they select
/// nothing here).
fn evict(inner: &Inner, route: &Route, body: &[u8]) -> Result<Value, ApiError> {
    let eviction = parse_json(body)?;
    let name = route.name.clone().unwrap_or_default();
    let namespace = route.namespace.clone().unwrap_or_default();
    if eviction.pointer("/metadata/name").and_then(Value::as_str) != Some(name.as_str()) {
        return Err(ApiError::new(
            400,
            format!("the name of the eviction must be the pod's ({name})"),
        ));
    }
    let options = eviction.get("deleteOptions").cloned().unwrap_or(json!({}));
    let target = Target {
        resource: route.resource,
        namespace: Some(&namespace),
        name: Some(&name),
        status: false,
        manager: String::new(),
    };
    let budgets = resources::by_plural("policy", "v1", "poddisruptionbudgets").expect("served");
    inner.mutate(|store, _| {
        let key = target.key(&name);
        let pod = store
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found("pods", &name))?;
        let phase = pod.pointer("/status/phase").and_then(Value::as_str);
        let exempt = matches!(phase, Some("Pending" | "Succeeded" | "Failed"))
            || pod.pointer("/metadata/deletionTimestamp").is_some();
        let labels = pod
            .pointer("/metadata/labels")
            .cloned()
            .unwrap_or(json!({}));
        let covering: Vec<(ObjectKey, Value)> = store
            .list(budgets, Some(&namespace))
            .filter(|(_, pdb)| selects_by_labels(pdb, &labels))
            .map(|(key, pdb)| (key.clone(), pdb.clone()))
            .collect();
        if !exempt && let Some((key, pdb)) = covering.first() {
            let allowed = pdb
                .pointer("/status/disruptionsAllowed")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if allowed <= 0 {
                return Err(ApiError::new(
                    429,
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                ));
            }
            let mut spent = pdb.clone();
            spent["status"]["disruptionsAllowed"] = json!(allowed - 1);
            store.replace(budgets, key, spent);
        }
        write::delete(store, &target, &options)
    })?;
    Ok(json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}))
}

/// Whether the budget's `spec.selector.matchLabels` (all of them, at least one) are among
/// `labels`.
fn selects_by_labels(pdb: &Value, labels: &Value) -> bool {
    let Some(wanted) = pdb
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
    else {
        return false;
    };
    !wanted.is_empty() && wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn delete_collection(
    inner: &Inner,
    route: &Route,
    query: &HashMap<String, String>,
) -> Result<(StatusCode, Arc<Value>), ApiError> {
    let (labels, fields) = selectors(route, query)?;
    let deleted = inner.mutate(|store, _| {
        let names: Vec<(String, String)> = store
            .list(route.resource, route.namespace.as_deref())
            .filter(|(_, object)| labels.matches(object) && fields.matches(object))
            .map(|(key, _)| (key.namespace.clone(), key.name.clone()))
            .collect();
        names
            .iter()
            .map(|(namespace, name)| {
                let target = Target {
                    resource: route.resource,
                    namespace: Some(namespace),
                    name: Some(name),
                    status: false,
                    manager: String::new(),
                };
                write::delete(store, &target, &json!({}))
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    let items: Vec<&Value> = deleted.iter().map(Arc::as_ref).collect();
    Ok((
        StatusCode::OK,
        Arc::new(json!({
            "kind": format!("{}List", route.resource.kind),
            "apiVersion": route.resource.api_version(),
            "metadata": {},
            "items": items,
        })),
    ))
}

fn json_response(code: StatusCode, value: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(
            serde_json::to_vec(value).expect("JSON values serialize"),
        ))
        .expect("a valid response")
}

fn error_response(error: &ApiError) -> Response<Body> {
    let code = StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(code, &error.to_status())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse_like_the_api_server() {
        let r = route("/api/v1/namespaces/ns/pods/p/status").unwrap();
        assert_eq!(
            (
                r.resource.plural,
                r.namespace.as_deref(),
                r.name.as_deref(),
                r.status
            ),
            ("pods", Some("ns"), Some("p"), true)
        );
        let r = route("/api/v1/namespaces/ns").unwrap();
        assert_eq!(
            (r.resource.plural, r.name.as_deref()),
            ("namespaces", Some("ns"))
        );
        let r = route("/api/v1/namespaces/ns/status").unwrap();
        assert_eq!(
            (r.resource.plural, r.name.as_deref(), r.status),
            ("namespaces", Some("ns"), true)
        );
        let r = route("/apis/resource.k8s.io/v1/resourceslices").unwrap();
        assert_eq!((r.resource.plural, r.name), ("resourceslices", None));
        let r = route("/apis/resource.k8s.io/v1/resourceclaims").unwrap();
        assert_eq!((r.resource.plural, r.namespace), ("resourceclaims", None));
        assert_eq!(
            route("/apis/resource.k8s.io/v1/resourceclaims/c")
                .unwrap_err()
                .code,
            404
        );
        assert_eq!(route("/api/v1/configmaps").unwrap_err().code, 404);
        assert_eq!(route("/api/v1/nodes/n/proxy").unwrap_err().code, 404);
        assert_eq!(
            route("/apis/resource.k8s.io/v1beta1/resourceslices")
                .unwrap_err()
                .code,
            404
        );
    }
}
