//! Load shedding: a service works on at most [`Shedder::limit`] requests at a
//! time and answers the rest at once with 503 and `Retry-After`, instead of
//! queueing them until every request is slow (the collapse an open-loop flood
//! caused: p99 of 19-31 s and connections given up by clients).
//!
//! The shedder is a tower layer around the whole router, outside routing and
//! every other middleware: a refusal costs a semaphore try and a ready body.
//! Inside the router each request clones the route's middleware stack (axum
//! clones a `from_fn` layer's inner service per call), which made a refusal
//! cost about a seventh of a served read; at four times saturation the
//! refusals then took half the CPU the served requests needed.
//!
//! A request counts from the moment it reaches the service until its handler
//! has answered (its response body may still be on its way to the client). `/healthz`, `/readyz` and
//! `/metrics` are never shed: a probe that fails under load would make
//! Kubernetes restart or unroute a service that is merely busy. Shed requests
//! are counted in `http_requests_shed_total{service}`; the requests in flight
//! are `http_requests_in_flight{service}`. They are not logged one by one (a
//! flood would become a flood of log lines): at most one warning a second
//! says how many were shed since the last.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::response::Response;
use futures_util::future::{BoxFuture, Either, Ready};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::problem::ApiError;

/// The paths that are answered whatever the load.
pub const NEVER_SHED: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// Seconds a shed client is asked to wait: long enough for a burst to pass,
/// short enough that a client retrying once does not miss much.
pub const SHED_RETRY_AFTER_SECS: u32 = 1;

/// The in-flight limit of one service; as a [`tower::Layer`], the service
/// that enforces it.
#[derive(Debug, Clone)]
pub struct Shedder {
    service: &'static str,
    limit: usize,
    permits: Arc<Semaphore>,
    log: Arc<ShedLog>,
    /// The shed answer's body, made once: refusing must cost far less than
    /// serving, or a flood of refusals starves the requests being served.
    body: axum::body::Bytes,
}

/// Shed requests not yet reported in a log line, and when the last line was.
#[derive(Debug)]
struct ShedLog {
    started: Instant,
    unreported: AtomicU64,
    last_line_ms: AtomicU64,
}

impl Shedder {
    pub fn new(service: &'static str, limit: usize) -> Self {
        // Exported from the start, at 0: an alert's rate() needs the series before the first shed.
        metrics::counter!("http_requests_shed_total", "service" => service).increment(0);
        let log = ShedLog { started: Instant::now(), unreported: AtomicU64::new(0), last_line_ms: AtomicU64::new(0) };
        let body = overloaded_body(limit);
        Shedder { service, limit, permits: Arc::new(Semaphore::new(limit)), log: Arc::new(log), body }
    }

    /// Counts a shed request; says so in the log at most once a second.
    fn shed(&self) {
        metrics::counter!("http_requests_shed_total", "service" => self.service).increment(1);
        self.log.unreported.fetch_add(1, Ordering::Relaxed);
        let now_ms = self.log.started.elapsed().as_millis() as u64 + LOG_EVERY.as_millis() as u64;
        let last = self.log.last_line_ms.load(Ordering::Relaxed);
        let due = now_ms.saturating_sub(last) >= LOG_EVERY.as_millis() as u64;
        if due && self.log.last_line_ms.compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            let shed = self.log.unreported.swap(0, Ordering::Relaxed);
            tracing::warn!(service = self.service, shed, limit = self.limit, "requests shed: the service is at its in-flight limit");
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    fn in_flight(&self) -> usize {
        self.limit - self.permits.available_permits()
    }

    fn report(&self) {
        metrics::gauge!("http_requests_in_flight", "service" => self.service).set(self.in_flight() as f64);
    }
}

impl<S> tower::Layer<S> for Shedder {
    type Service = Shedding<S>;

    fn layer(&self, inner: S) -> Shedding<S> {
        Shedding { inner, shedder: self.clone() }
    }
}

/// `inner` behind a [`Shedder`].
#[derive(Debug, Clone)]
pub struct Shedding<S> {
    inner: S,
    shedder: Shedder,
}

impl<S> tower::Service<Request> for Shedding<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response, Infallible>>, BoxFuture<'static, Result<Response, Infallible>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        if NEVER_SHED.contains(&request.uri().path()) {
            return Either::Right(Box::pin(self.inner.call(request)));
        }
        let Ok(permit) = self.shedder.permits.clone().try_acquire_owned() else {
            self.shedder.shed();
            return Either::Left(futures_util::future::ready(Ok(overloaded_response(&self.shedder.body))));
        };
        self.shedder.report();
        let place = InFlight { shedder: self.shedder.clone(), permit: Some(permit) };
        let answered = self.inner.call(request);
        Either::Right(Box::pin(async move {
            let response = answered.await;
            // The place is given back once the handler has answered: sending a body
            // that is already made is the connection's business, not work, and a
            // client slow to read (or a flood of them) must not hold places a
            // request being worked on needs. A client that gives up drops this
            // future, and the place with it.
            drop(place);
            response
        }))
    }
}

/// A request's place among those in flight, given back when it is answered.
struct InFlight {
    shedder: Shedder,
    permit: Option<OwnedSemaphorePermit>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.shedder.report();
    }
}

/// The problem document of a shed answer (an [`ApiError::overloaded`]).
fn overloaded_body(limit: usize) -> axum::body::Bytes {
    let error = ApiError::overloaded(limit);
    let problem = crate::problem::Problem {
        kind: "urn:revstore:problem:overloaded".into(),
        title: "Service Unavailable".into(),
        status: error.status().as_u16(),
        detail: error.detail().to_owned(),
        request_id: None,
    };
    serde_json::to_vec(&problem).unwrap_or_default().into()
}

/// The shed answer: the ready body, no per-request work and no warning.
fn overloaded_response(body: &axum::body::Bytes) -> Response {
    let mut response = Response::new(axum::body::Body::from(body.clone()));
    *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(crate::problem::PROBLEM_JSON));
    headers.insert(http::header::RETRY_AFTER, http::HeaderValue::from(SHED_RETRY_AFTER_SECS));
    response
}

/// At most one log line about shedding per this long.
const LOG_EVERY: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::Router;
    use axum::routing::get;
    use http::StatusCode;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    /// A router whose `/slow` handler waits for `release`, behind `shedder`.
    fn router(shedder: &Shedder, release: Arc<tokio::sync::Notify>) -> Shedding<Router> {
        let slow = move || {
            let release = release.clone();
            async move {
                release.notified().await;
                "done"
            }
        };
        let router = Router::new()
            .route("/slow", get(slow))
            .route("/healthz", get(|| async { "ok" }))
            .route("/metrics", get(|| async { "# metrics" }));
        tower::Layer::layer(shedder, router)
    }

    fn get_request(path: &str) -> Request {
        Request::get(path).body(axum::body::Body::empty()).expect("request")
    }

    #[tokio::test]
    async fn requests_past_the_limit_are_refused_at_once_and_probes_never_are() {
        let release = Arc::new(tokio::sync::Notify::new());
        let shedder = Shedder::new("test", 2);
        let app = router(&shedder, release.clone());
        let held: Vec<_> = (0..2).map(|_| tokio::spawn(app.clone().oneshot(get_request("/slow")))).collect();
        tokio::time::timeout(Duration::from_secs(60), async {
            while shedder.in_flight() < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("both held requests in flight");
        // A third is refused without waiting for a place.
        let third = tokio::time::timeout(Duration::from_secs(60), app.clone().oneshot(get_request("/slow")))
            .await
            .expect("a refusal does not wait")
            .expect("infallible");
        assert_eq!(third.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(third.headers().get(http::header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("1"));
        let body = third.into_body().collect().await.expect("body").to_bytes();
        let problem: serde_json::Value = serde_json::from_slice(&body).expect("a problem document");
        assert_eq!(problem["type"], "urn:revstore:problem:overloaded", "{problem}");
        for probe in ["/healthz", "/metrics"] {
            let answer = app.clone().oneshot(get_request(probe)).await.expect("infallible");
            assert_eq!(answer.status(), StatusCode::OK, "{probe} is never shed");
        }
        // Once the held requests are answered, their places are free again.
        release.notify_waiters();
        for h in held {
            let answer = h.await.expect("task").expect("infallible");
            assert_eq!(answer.status(), StatusCode::OK);
            answer.into_body().collect().await.expect("body");
        }
        assert_eq!(shedder.in_flight(), 0, "every place is given back when its request is answered");
        let answer = app.clone().oneshot(get_request("/healthz")).await.expect("infallible");
        assert_eq!(answer.status(), StatusCode::OK);
    }
}
