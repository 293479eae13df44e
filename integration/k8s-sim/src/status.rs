//! API errors as Kubernetes `Status` objects (`kind: Status`, `reason`,
//! `code`), the shape kubectl and kube-rs decode into their error types.

use serde_json::{Value, json};

use super::resources::ResourceDef;

/// One failed request: the HTTP code, the `reason` and a message, plus the
/// optional `details` (resource name, kind, causes).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status code.
    pub code: u16,
    /// The `Status` reason (`NotFound`, `AlreadyExists`, ...).
    pub reason: &'static str,
    /// Human-readable message, worded as the API server words it.
    pub message: String,
    /// The `details` object, when the API server sends one.
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, res: &ResourceDef, name: &str) -> ApiError {
        self.details = Some(json!({"name": name, "group": res.group, "kind": res.plural}));
        self
    }

    /// 404: object `name` of `res` does not exist.
    pub fn not_found(res: &ResourceDef, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", res.qualified_name()),
        )
        .with_details(res, name)
    }

    /// 409: object `name` of `res` exists already.
    pub fn already_exists(res: &ResourceDef, name: &str) -> ApiError {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", res.qualified_name()),
        )
        .with_details(res, name)
    }

    /// An optimistic-concurrency failure (stale `resourceVersion`).
    pub fn conflict(res: &ResourceDef, name: &str, why: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                res.qualified_name()
            ),
        )
        .with_details(res, name)
    }

    /// A server-side apply conflict with other field managers; `causes` are
    /// `(manager, field path)` pairs.
    pub fn apply_conflict(res: &ResourceDef, name: &str, causes: &[(String, String)]) -> ApiError {
        let api_version = res.api_version();
        let listed: Vec<String> = causes
            .iter()
            .map(|(m, f)| format!("conflict with \"{m}\" using {api_version}: {f}"))
            .collect();
        let message = if causes.len() == 1 {
            format!("Apply failed with 1 conflict: {}", listed[0])
        } else {
            format!(
                "Apply failed with {} conflicts: {}",
                causes.len(),
                listed.join("\n")
            )
        };
        let causes: Vec<Value> = causes
            .iter()
            .zip(&listed)
            .map(|((_, field), msg)| {
                json!({"type": "FieldManagerConflict", "message": msg, "field": field})
            })
            .collect();
        let mut err = ApiError::new(409, "Conflict", message).with_details(res, name);
        if let Some(details) = err.details.as_mut() {
            details["causes"] = Value::Array(causes);
        }
        err
    }

    /// A semantically invalid object (`422 Invalid`).
    pub fn invalid(res: &ResourceDef, name: &str, field: &str, why: &str) -> ApiError {
        let mut err = ApiError::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {field}: {why}", res.kind),
        )
        .with_details(res, name);
        if let Some(details) = err.details.as_mut() {
            details["causes"] =
                json!([{"reason": "FieldValueInvalid", "message": why, "field": field}]);
        }
        err
    }

    /// Malformed input (bad JSON, mismatched names): `400 BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// A watch resumed from a resourceVersion older than the kept history.
    pub fn expired(rv: u64, oldest: u64) -> ApiError {
        ApiError::new(
            410,
            "Expired",
            format!("too old resource version: {rv} ({oldest})"),
        )
    }

    /// 404: no route serves `path`.
    pub fn path_not_found(path: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 403: the request on `name` is refused for `why`.
    pub fn forbidden(res: &ResourceDef, name: &str, why: &str) -> ApiError {
        ApiError::new(
            403,
            "Forbidden",
            format!("{} \"{name}\" is forbidden: {why}", res.qualified_name()),
        )
        .with_details(res, name)
    }

    /// 405: `method` is not served on `path`.
    pub fn method_not_allowed(method: &str, path: &str) -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({method} {path})"
            ),
        )
    }

    /// 415: the body's `content_type` is not accepted.
    pub fn unsupported_media_type(content_type: &str) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type:?}; k8s-sim speaks JSON only: use `kubectl create -f` or `kubectl apply -f` rather than typed `kubectl create KIND`)"
            ),
        )
    }

    /// 413: the body is larger than `limit_bytes`.
    pub fn too_large(limit_bytes: usize) -> ApiError {
        ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("the request body exceeds {limit_bytes} bytes"),
        )
    }

    /// The `Status` object sent as a response body or watch `ERROR` event.
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

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// The `Status` a successful delete-collection or similar returns.
pub fn success() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
}
