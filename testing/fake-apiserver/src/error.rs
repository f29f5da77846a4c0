//! Failed requests, answered as `meta/v1` `Status` objects the way the API server words them, so
//! that clients (kube's `Error::Api`) see the same code and reason.

use serde_json::{Value, json};

/// A request the fake refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `Status.reason`, e.g. `Conflict`, `NotFound`.
    pub reason: String,
    /// `Status.message`.
    pub message: String,
    /// `Status.details`, when there is an object to name.
    pub details: Option<Value>,
}

impl ApiError {
    /// An error with `code`, the usual reason for it, and `message`.
    pub fn new(code: u16, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason_for(code).to_owned(),
            message: message.into(),
            details: None,
        }
    }

    /// 404 for an object.
    pub fn not_found(resource: &str, name: &str) -> Self {
        Self::new(404, format!("{resource} \"{name}\" not found")).with_details(resource, name)
    }

    /// 409 AlreadyExists for an object.
    pub fn already_exists(resource: &str, name: &str) -> Self {
        let mut error = Self::new(409, format!("{resource} \"{name}\" already exists"))
            .with_details(resource, name);
        error.reason = "AlreadyExists".to_owned();
        error
    }

    /// 409 Conflict: the resourceVersion precondition failed.
    pub fn conflict(resource: &str, name: &str) -> Self {
        Self::new(
            409,
            format!(
                "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        )
        .with_details(resource, name)
    }

    /// 400 Bad Request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    /// 422 Invalid for an object.
    pub fn invalid(resource: &str, name: &str, message: impl Into<String>) -> Self {
        Self::new(
            422,
            format!("{resource} \"{name}\" is invalid: {}", message.into()),
        )
        .with_details(resource, name)
    }

    /// 410 Gone: the requested resourceVersion is no longer in the watch history.
    pub fn expired(resource_version: u64) -> Self {
        let mut error = Self::new(410, format!("too old resource version: {resource_version}"));
        error.reason = "Expired".to_owned();
        error
    }

    fn with_details(mut self, resource: &str, name: &str) -> Self {
        let (kind, group) = resource.split_once('.').unwrap_or((resource, ""));
        self.details = Some(json!({"name": name, "group": group, "kind": kind}));
        self
    }

    /// The `Status` object sent in the response body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// The API server's reason for an HTTP status code.
pub fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Gone",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_carry_code_reason_and_details() {
        let status = ApiError::conflict("resourceclaims.resource.k8s.io", "claim-a").to_status();
        assert_eq!(status["code"], 409);
        assert_eq!(status["reason"], "Conflict");
        assert_eq!(status["details"]["kind"], "resourceclaims");
        assert_eq!(status["details"]["group"], "resource.k8s.io");
        assert!(
            status["message"]
                .as_str()
                .unwrap()
                .contains("the object has been modified")
        );
        assert_eq!(
            ApiError::already_exists("nodes", "n").reason,
            "AlreadyExists"
        );
        assert_eq!(ApiError::expired(3).to_status()["reason"], "Expired");
        assert_eq!(ApiError::new(500, "boom").reason, "InternalError");
    }
}
