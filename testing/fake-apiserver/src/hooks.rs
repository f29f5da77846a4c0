//! Test hooks: injected faults, fields dropped on write, extra validation, and the request log.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::error::ApiError;

/// What a request does, as the API server's audit log and RBAC name verbs; server-side apply is
/// told apart from other patches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    /// JSON, merge or strategic-merge patch.
    Patch,
    /// Server-side apply (`application/apply-patch+yaml`).
    Apply,
    Delete,
    DeleteCollection,
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Apply => "apply",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        })
    }
}

/// One request the fake answered (or refused), for assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    pub verb: Verb,
    /// `plural` or `plural.group`, e.g. `resourceslices.resource.k8s.io`.
    pub resource: String,
    /// `status`, or empty for the main resource.
    pub subresource: String,
    /// Empty for cluster-scoped requests and requests across all namespaces.
    pub namespace: String,
    /// Empty for collection requests.
    pub name: String,
    /// The HTTP status code of the answer (for watches: of the response head).
    pub code: u16,
}

/// Which requests a [`Fault`] hits.
///
/// `resource` is `plural` (e.g. `resourceclaims`), `plural.group`, or either with a subresource
/// (`resourceclaims/status`); a resource without a subresource matches only the main resource.
#[derive(Debug, Clone)]
pub struct Fault {
    verb: Option<Verb>,
    resource: String,
    subresource: String,
    name: Option<String>,
    namespace: Option<String>,
    remaining: usize,
    action: FaultAction,
}

#[derive(Debug, Clone)]
enum FaultAction {
    Fail { code: u16, message: Option<String> },
    Delay(Duration),
}

impl Fault {
    /// A fault on requests with `verb` (`None`: any verb) to `resource`; by default it hits the
    /// next request once with 500 Internal Error.
    pub fn on(verb: impl Into<Option<Verb>>, resource: &str) -> Self {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        Self {
            verb: verb.into(),
            resource: resource.to_owned(),
            subresource: subresource.to_owned(),
            name: None,
            namespace: None,
            remaining: 1,
            action: FaultAction::Fail {
                code: 500,
                message: None,
            },
        }
    }

    /// Hits the next `count` matching requests.
    pub fn times(mut self, count: usize) -> Self {
        self.remaining = count;
        self
    }

    /// Only requests naming this object.
    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }

    /// Only requests in this namespace.
    pub fn in_namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.to_owned());
        self
    }

    /// Answers with this HTTP status code (and the API server's reason for it, e.g. 409 →
    /// `Conflict`, 500 → `InternalError`, 429 → `TooManyRequests`).
    pub fn status(mut self, code: u16) -> Self {
        self.action = FaultAction::Fail {
            code,
            message: None,
        };
        self
    }

    /// Answers with `code` and `message`.
    pub fn status_with_message(mut self, code: u16, message: &str) -> Self {
        self.action = FaultAction::Fail {
            code,
            message: Some(message.to_owned()),
        };
        self
    }

    /// Delays matching requests by `delay`, then serves them normally.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.action = FaultAction::Delay(delay);
        self
    }

    fn matches(&self, request: &RecordedRequest) -> bool {
        let resource_matches = self.resource == request.resource
            || request
                .resource
                .split_once('.')
                .is_some_and(|(plural, _)| plural == self.resource);
        self.remaining > 0
            && self.verb.is_none_or(|verb| verb == request.verb)
            && resource_matches
            && self.subresource == request.subresource
            && self.name.as_ref().is_none_or(|n| *n == request.name)
            && self
                .namespace
                .as_ref()
                .is_none_or(|n| *n == request.namespace)
    }
}

/// What an armed fault does to a request.
pub(crate) enum FaultOutcome {
    Fail(ApiError),
    Delay(Duration),
}

/// A field removed from every object of a resource type written through the API, the way the
/// API server drops the fields of a disabled feature gate.
#[derive(Debug, Clone)]
pub(crate) struct FieldDrop {
    pub resource: String,
    pub path: Vec<String>,
}

impl FieldDrop {
    /// `path` is dotted; `*` stands for every element of a list or every value of a map:
    /// `spec.devices.*.taints`.
    pub fn new(resource: &str, path: &str) -> Self {
        Self {
            resource: resource.to_owned(),
            path: path.split('.').map(str::to_owned).collect(),
        }
    }

    pub fn apply(&self, object: &mut Value) {
        drop_path(object, &self.path);
    }
}

fn drop_path(value: &mut Value, path: &[String]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    if rest.is_empty() {
        if let Some(map) = value.as_object_mut() {
            map.remove(first);
        }
        return;
    }
    if first == "*" {
        match value {
            Value::Array(items) => items.iter_mut().for_each(|item| drop_path(item, rest)),
            Value::Object(map) => map.values_mut().for_each(|item| drop_path(item, rest)),
            _ => {}
        }
    } else if let Some(child) = value.get_mut(first.as_str()) {
        drop_path(child, rest);
    }
}

/// Extra validation for writes: `(old object if any, new object) -> Err(message)` becomes
/// 422 Invalid.
pub type Validator = Arc<dyn Fn(Option<&Value>, &Value) -> Result<(), String> + Send + Sync>;

/// Everything tests configure, behind one lock.
#[derive(Default)]
pub(crate) struct Hooks {
    pub faults: Vec<Fault>,
    pub drops: Vec<FieldDrop>,
    pub validators: Vec<(String, Validator)>,
    pub log: Vec<RecordedRequest>,
}

impl Hooks {
    /// Consumes one use of the first armed fault matching `request`.
    pub fn take_fault(&mut self, request: &RecordedRequest) -> Option<FaultOutcome> {
        let fault = self.faults.iter_mut().find(|f| f.matches(request))?;
        fault.remaining -= 1;
        Some(match &fault.action {
            FaultAction::Fail { code, message } => {
                let mut error = ApiError::new(
                    *code,
                    message.clone().unwrap_or_else(|| {
                        format!(
                            "injected fault: {} {} {}",
                            request.verb, request.resource, request.name
                        )
                    }),
                );
                if *code == 409 && message.is_none() {
                    error = ApiError::conflict(&request.resource, &request.name);
                }
                FaultOutcome::Fail(error)
            }
            FaultAction::Delay(delay) => FaultOutcome::Delay(*delay),
        })
    }

    /// Applies the field drops registered for `resource` (`plural` or `plural.group`).
    pub fn drop_fields(&self, resource: &str, plural: &str, object: &mut Value) {
        self.drops
            .iter()
            .filter(|d| d.resource == resource || d.resource == plural)
            .for_each(|d| d.apply(object));
    }

    /// Validators for `resource`.
    pub fn validators(&self, resource: &str, plural: &str) -> Vec<Validator> {
        self.validators
            .iter()
            .filter(|(r, _)| r == resource || r == plural)
            .map(|(_, v)| Arc::clone(v))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn request(verb: Verb, resource: &str, subresource: &str) -> RecordedRequest {
        RecordedRequest {
            verb,
            resource: resource.into(),
            subresource: subresource.into(),
            namespace: "ns".into(),
            name: "claim".into(),
            code: 0,
        }
    }

    #[test]
    fn faults_match_and_run_out() {
        let mut hooks = Hooks::default();
        hooks.faults.push(
            Fault::on(Verb::Update, "resourceclaims/status")
                .times(2)
                .status(409),
        );
        let status_update = request(Verb::Update, "resourceclaims.resource.k8s.io", "status");
        let main_update = request(Verb::Update, "resourceclaims.resource.k8s.io", "");
        assert!(hooks.take_fault(&main_update).is_none());
        for _ in 0..2 {
            match hooks.take_fault(&status_update) {
                Some(FaultOutcome::Fail(error)) => assert_eq!(error.reason, "Conflict"),
                _ => panic!("expected an injected conflict"),
            }
        }
        assert!(hooks.take_fault(&status_update).is_none());
    }

    #[test]
    fn drops_follow_wildcards() {
        let mut slice = json!({"spec": {"devices": [
            {"name": "a", "taints": [{"key": "k"}]},
            {"name": "b"}
        ]}});
        FieldDrop::new("resourceslices", "spec.devices.*.taints").apply(&mut slice);
        assert_eq!(
            slice,
            json!({"spec": {"devices": [{"name": "a"}, {"name": "b"}]}})
        );
    }
}
