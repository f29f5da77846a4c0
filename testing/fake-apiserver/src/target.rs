//! The target of a write (resource, namespace, name, subresource, field manager) and the checks
//! every write makes against it: the body's type, and the resourceVersion and UID preconditions.

use serde_json::Value;

use crate::error::ApiError;
use crate::resources::ResourceType;
use crate::store::ObjectKey;

/// Metadata the server owns: never taken from a client's write.
pub(crate) const SERVER_OWNED: &[&str] = &[
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// The target of a write.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    pub resource: &'static ResourceType,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    /// Writing the `status` subresource.
    pub status: bool,
    /// `fieldManager`, or the client's user agent; empty for an apply without `fieldManager`
    /// (which is refused).
    pub manager: String,
}

impl Target<'_> {
    pub(crate) fn key(&self, name: &str) -> ObjectKey {
        ObjectKey::new(self.resource, self.namespace, name)
    }

    pub(crate) fn resource_name(&self) -> String {
        self.resource.qualified_plural()
    }

    pub(crate) fn object_name(&self) -> Result<&str, ApiError> {
        self.name
            .ok_or_else(|| ApiError::new(405, "this verb needs an object name in the URL"))
    }
}

pub(crate) fn check_type(target: &Target<'_>, body: &Value) -> Result<(), ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let kind = body.get("kind").and_then(Value::as_str);
    if kind.is_some_and(|kind| kind != target.resource.kind) {
        return Err(ApiError::bad_request(format!(
            "the body is a {}, not a {} ({})",
            kind.unwrap_or_default(),
            target.resource.kind,
            target.resource_name()
        )));
    }
    Ok(())
}

pub(crate) fn check_resource_version(
    target: &Target<'_>,
    name: &str,
    body: &Value,
    old: &Value,
) -> Result<(), ApiError> {
    let wanted = body
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    let stored = old
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    // A UID in the body is a precondition too, as upstream's: the object must be that one, not
    // another created under the same name.
    let uid = |object: &Value| {
        object
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    if let (Some(wanted), Some(stored)) = (uid(body), uid(old))
        && !wanted.is_empty()
        && wanted != stored
    {
        return Err(ApiError::new(
            409,
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: UID in precondition: {wanted}, UID in object meta: {stored}",
                target.resource_name()
            ),
        ));
    }
    match wanted {
        Some(wanted) if !wanted.is_empty() && Some(wanted) != stored => {
            Err(ApiError::conflict(&target.resource_name(), name))
        }
        _ => Ok(()),
    }
}
