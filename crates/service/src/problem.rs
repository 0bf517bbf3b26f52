//! Errors as `application/problem+json` (RFC 9457).
//!
//! Every error a client sees has this shape, whoever produced it: a handler
//! returning [`ApiError`], or the plumbing (unknown route, wrong method, body
//! too large, timeout, panic), whose plain responses
//! [`crate::middleware::problem_bodies`] rewrites. Client errors (4xx) say what
//! was wrong; server errors (5xx) are logged in full, once, where the response
//! is made (inside the request's span, so with its request id), and answered
//! with a generic detail: no internal URL, host or upstream text reaches a
//! client.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use revstore_storage::StoreError;
use serde::Serialize;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// The problem document.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Problem {
    /// A URI naming the kind of problem: `urn:revstore:problem:<kind>`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// The request id, to find the request in the logs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// An error answer. Build it with the constructors; the status is chosen here,
/// in one place, for every kind of error.
#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    /// What the client is told.
    detail: String,
    /// What the logs are told (server errors only); never sent.
    cause: Option<String>,
    www_authenticate: bool,
    /// Seconds after which a retry may succeed (`Retry-After`), for 503s.
    retry_after: Option<u32>,
}

/// `Retry-After` of a 503 whose cause is a dependency (the storage, a peer).
pub const DEPENDENCY_RETRY_AFTER_SECS: u32 = 2;

/// The detail of every server error whose cause is only for the logs.
const SEE_THE_LOGS: &str = "the request id leads to the details in the logs";

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, detail: impl Into<String>) -> Self {
        ApiError { status, kind, detail: detail.into(), cause: None, www_authenticate: false, retry_after: None }
    }

    /// 400: the request is malformed or names something invalid.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad-request", detail)
    }

    /// 401: no usable credentials.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        ApiError { www_authenticate: true, ..Self::new(StatusCode::UNAUTHORIZED, "unauthorized", detail) }
    }

    /// 403: credentials that do not allow this.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", detail)
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", detail)
    }

    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", detail)
    }

    pub fn precondition_failed(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::PRECONDITION_FAILED, "precondition-failed", detail)
    }

    pub fn payload_too_large(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large", detail)
    }

    /// 415: a body in a type or encoding the route does not take.
    pub fn unsupported_media_type(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type", detail)
    }

    /// 503 with a detail that is safe to show ("shutting down"); retry later.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
    }

    /// 503: the service already works on `limit` requests; this one was not
    /// started (nothing changed). Sent with `Retry-After`.
    pub fn overloaded(limit: usize) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            format!("the service is at its limit of {limit} requests in flight; nothing was done, retry after the Retry-After delay"),
        )
    }

    /// 503: `dependency` (storage, another service) cannot serve now. The
    /// client learns which and to retry; the cause goes to the logs only.
    pub fn dependency_unavailable(dependency: &str, cause: impl std::fmt::Display) -> Self {
        ApiError {
            cause: Some(cause.to_string()),
            // A dependency's outage (a node restarting, quorum lost) lasts
            // seconds at least: retrying sooner only adds load.
            retry_after: Some(DEPENDENCY_RETRY_AFTER_SECS),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                format!("{dependency} is unavailable; retry later ({SEE_THE_LOGS})"),
            )
        }
    }

    /// Names a more specific kind than the status's own, for a refusal a
    /// client acts on (`urn:revstore:problem:<kind>`).
    pub fn with_kind(mut self, kind: &'static str) -> Self {
        self.kind = kind;
        self
    }

    /// Tells the client, in `Retry-After`, when a retry may succeed.
    pub fn with_retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// Keeps `cause` for the logs (server errors); the client sees only the detail.
    pub fn with_cause(mut self, cause: impl std::fmt::Display) -> Self {
        self.cause = Some(cause.to_string());
        self
    }

    /// 500: our fault. The cause is logged with the response, not shown.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        ApiError {
            cause: Some(cause.to_string()),
            ..Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("internal error; {SEE_THE_LOGS}"))
        }
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The cause kept for the logs, if any.
    pub fn cause(&self) -> Option<&str> {
        self.cause.as_deref()
    }
}

/// A problem response for any status, for the plumbing's own errors.
pub fn problem_response(status: StatusCode, kind: &str, detail: String, request_id: Option<String>) -> Response {
    let problem = Problem {
        kind: format!("urn:revstore:problem:{kind}"),
        title: status.canonical_reason().unwrap_or("Error").to_owned(),
        status: status.as_u16(),
        detail,
        request_id,
    };
    let mut response = (status, Json(problem)).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match (&self.cause, self.status.is_server_error()) {
            (Some(cause), true) if self.status == StatusCode::INTERNAL_SERVER_ERROR => {
                tracing::error!(status = self.status.as_u16(), error = %cause, "internal error")
            }
            (Some(cause), true) => tracing::warn!(status = self.status.as_u16(), error = %cause, detail = %self.detail, "request failed"),
            (None, true) => tracing::warn!(status = self.status.as_u16(), detail = %self.detail, "request failed"),
            _ => {}
        }
        let mut response = problem_response(self.status, self.kind, self.detail, None);
        if self.www_authenticate {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Invalid(msg) => ApiError::bad_request(msg),
            StoreError::BadPageToken(e) => ApiError::bad_request(format!("cursor: {e}")),
            StoreError::Unavailable(msg) => ApiError::dependency_unavailable("storage", msg),
            StoreError::StorageFull(msg) => {
                ApiError::unavailable("storage is full: writes are refused until space is freed; reads still work").with_cause(msg)
            }
            StoreError::SchemaMismatch(msg) => ApiError::dependency_unavailable("the storage schema", msg),
            e @ (StoreError::Corrupt(_) | StoreError::Internal(_)) => ApiError::internal(e),
        }
    }
}

impl From<revstore_keys::KeyError> for ApiError {
    fn from(e: revstore_keys::KeyError) -> Self {
        ApiError::bad_request(e.to_string())
    }
}
