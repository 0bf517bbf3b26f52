//! The middleware every request passes through, outermost first:
//! [`observe`] (request id, a span named by the matched route with the caller's
//! trace context as parent, Prometheus metrics, one log line per request, and
//! problem bodies for every error response), then the timeout, panic catcher
//! and body limit set up in [`crate::server`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use http_body_util::BodyExt;
use tracing::Instrument;

use crate::problem::{PROBLEM_JSON, Problem, problem_response};
use crate::settings::AccessLog;

pub const REQUEST_ID: &str = "x-request-id";

/// The id of the request being served, in request extensions.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

#[derive(Debug, Clone)]
pub struct ObserveState {
    pub service: &'static str,
    pub access_log: AccessLog,
    /// Successful requests seen, for sampling the access log.
    pub served: Arc<AtomicU64>,
}

impl ObserveState {
    pub fn new(service: &'static str, access_log: AccessLog) -> Self {
        ObserveState { service, access_log, served: Arc::default() }
    }

    /// How a finished request is logged: failures and slow requests always,
    /// one in `every` of the others at info, the rest at debug.
    fn access_line(&self, status: StatusCode, elapsed: Duration) -> AccessLine {
        if status.is_server_error() {
            AccessLine::Failed
        } else if elapsed >= self.access_log.slow {
            AccessLine::Slow
        } else if status.is_client_error() {
            AccessLine::Sampled
        } else {
            let every = self.access_log.every;
            let n = self.served.fetch_add(1, Ordering::Relaxed);
            if every > 0 && n.is_multiple_of(every) { AccessLine::Sampled } else { AccessLine::Debug }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AccessLine {
    Failed,
    Slow,
    Sampled,
    Debug,
}

/// Accepts the caller's request id when it is sane, else makes one.
fn request_id(request: &Request) -> String {
    request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

/// The method as a metric label and log field: the standard methods by name,
/// any other token (hyper accepts any, of any length) as `other`, so a client
/// cannot mint label values or fill log lines.
pub fn method_label(method: &http::Method) -> &'static str {
    use http::Method as M;
    match *method {
        M::GET => "GET",
        M::HEAD => "HEAD",
        M::POST => "POST",
        M::PUT => "PUT",
        M::DELETE => "DELETE",
        M::OPTIONS => "OPTIONS",
        M::PATCH => "PATCH",
        M::TRACE => "TRACE",
        M::CONNECT => "CONNECT",
        _ => "other",
    }
}

/// The status as a metric label: the code for real HTTP statuses, else `other`.
fn status_label(status: StatusCode) -> String {
    if (100..600).contains(&status.as_u16()) { status.as_u16().to_string() } else { "other".to_owned() }
}

pub async fn observe(State(state): State<ObserveState>, mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request_id(&request);
    // Every label below is bounded: the method by name or `other`, route
    // templates (never raw paths), status codes.
    let method = method_label(request.method());
    let route = request.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let span = tracing::info_span!(
        "request",
        otel.name = %format!("{method} {route}"),
        service = state.service,
        %method,
        %route,
        request_id = %id,
        trace_id = tracing::field::Empty,
    );
    let remote = revstore_telemetry::extract_context(request.headers());
    if let Some(trace_id) = revstore_telemetry::adopt_remote_parent(&span, remote) {
        span.record("trace_id", trace_id.as_str());
    }
    request.extensions_mut().insert(RequestId(id.clone()));
    let response = next.run(request).instrument(span.clone()).await;
    let mut response = if response.status().is_client_error() || response.status().is_server_error() {
        problem_body(response, &id).await
    } else {
        response
    };
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    let status = response.status();
    let elapsed = started.elapsed();
    metrics::counter!("http_requests_total", "service" => state.service, "route" => route.clone(), "method" => method, "status" => status_label(status))
        .increment(1);
    metrics::histogram!("http_request_duration_seconds", "service" => state.service, "route" => route, "method" => method)
        .record(elapsed.as_secs_f64());
    let latency_ms = elapsed.as_secs_f64() * 1e3;
    let line = state.access_line(status, elapsed);
    span.in_scope(|| match line {
        AccessLine::Failed => tracing::warn!(status = status.as_u16(), latency_ms, "request failed"),
        AccessLine::Slow => tracing::warn!(status = status.as_u16(), latency_ms, "slow request"),
        AccessLine::Sampled => tracing::info!(status = status.as_u16(), latency_ms, "request"),
        AccessLine::Debug => tracing::debug!(status = status.as_u16(), latency_ms, "request"),
    });
    response
}

fn kind_of(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "bad-request",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not-found",
        StatusCode::METHOD_NOT_ALLOWED => "method-not-allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "payload-too-large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported-media-type",
        StatusCode::UNPROCESSABLE_ENTITY => "unprocessable",
        StatusCode::REQUEST_TIMEOUT | StatusCode::GATEWAY_TIMEOUT => "timeout",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        s if s.is_server_error() => "internal",
        _ => "error",
    }
}

/// Error responses leave as problem documents carrying the request id: our own
/// problems get the id added, anything else (axum's rejections, the body limit,
/// the timeout) is rewritten. Server errors never pass their text on.
async fn problem_body(response: Response, request_id: &str) -> Response {
    let (parts, body) = response.into_parts();
    let is_problem = parts.headers.get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Default::default(),
    };
    let status = parts.status;
    if is_problem && let Ok(mut problem) = serde_json::from_slice::<Problem>(&bytes) {
        problem.request_id = Some(request_id.to_owned());
        let mut rebuilt = problem_response(status, "", String::new(), None);
        if let Ok(json) = serde_json::to_vec(&problem) {
            *rebuilt.body_mut() = axum::body::Body::from(json);
        }
        for (name, value) in parts.headers.iter().filter(|(n, _)| *n == header::WWW_AUTHENTICATE || *n == header::RETRY_AFTER) {
            rebuilt.headers_mut().insert(name.clone(), value.clone());
        }
        rebuilt.headers_mut().remove(header::CONTENT_LENGTH);
        return rebuilt;
    }
    let text = String::from_utf8_lossy(&bytes).trim().to_owned();
    let detail = if status.is_server_error() || text.is_empty() {
        match status {
            StatusCode::SERVICE_UNAVAILABLE if text.is_empty() => "the request timed out or the service is unavailable".to_owned(),
            StatusCode::PAYLOAD_TOO_LARGE => "the request body is larger than this service accepts".to_owned(),
            s => s.canonical_reason().unwrap_or("error").to_owned(),
        }
    } else {
        text
    };
    let mut rebuilt = problem_response(status, kind_of(status), detail, Some(request_id.to_owned()));
    for (name, value) in parts.headers.iter().filter(|(n, _)| *n == header::ALLOW || *n == header::WWW_AUTHENTICATE) {
        rebuilt.headers_mut().insert(name.clone(), value.clone());
    }
    rebuilt
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(state: &ObserveState, status: StatusCode, elapsed: Duration, n: usize) -> Vec<AccessLine> {
        (0..n).map(|_| state.access_line(status, elapsed)).collect()
    }

    #[test]
    fn one_in_every_successful_request_is_logged_and_every_failed_or_slow_one() {
        let fast = Duration::from_millis(3);
        let state = ObserveState::new("test", AccessLog { every: 4, slow: Duration::from_millis(500) });
        let sampled = lines(&state, StatusCode::OK, fast, 12).iter().filter(|l| **l == AccessLine::Sampled).count();
        assert_eq!(sampled, 3);
        assert_eq!(lines(&state, StatusCode::INTERNAL_SERVER_ERROR, fast, 5), [AccessLine::Failed; 5]);
        assert_eq!(lines(&state, StatusCode::NOT_FOUND, fast, 5), [AccessLine::Sampled; 5]);
        assert_eq!(lines(&state, StatusCode::OK, Duration::from_millis(500), 5), [AccessLine::Slow; 5]);

        let every = ObserveState::new("test", AccessLog { every: 1, slow: Duration::from_secs(1) });
        assert_eq!(lines(&every, StatusCode::OK, fast, 5), [AccessLine::Sampled; 5]);
        let none = ObserveState::new("test", AccessLog { every: 0, slow: Duration::from_secs(1) });
        assert_eq!(lines(&none, StatusCode::CREATED, fast, 5), [AccessLine::Debug; 5]);
        assert_eq!(lines(&none, StatusCode::SERVICE_UNAVAILABLE, fast, 1), [AccessLine::Failed]);
    }
}
