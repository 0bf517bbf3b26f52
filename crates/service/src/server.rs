//! The router around a service's own routes, and serving it with a graceful
//! shutdown.
//!
//! Shutdown, on SIGTERM or Ctrl-C ([`shutdown_signal`]): `/readyz` answers 503
//! at once while the service keeps serving for the shutdown delay (load
//! balancers and Kubernetes endpoints notice and stop sending); then no new
//! connections are taken and in-flight requests get the drain timeout to
//! finish; then background workers are told to stop and awaited; the caller
//! then drops its telemetry guard, which flushes traces.

use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{HeaderValue, StatusCode, header};
use revstore_schema::Component;
use revstore_storage::{Store, StoreError};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use crate::access::{Access, require_read_access};
use crate::connections::{ConnectionHandle, LimitedListener, track_requests};
use crate::middleware::{ObserveState, observe};
use crate::problem::{ApiError, problem_response};
use crate::settings::ServiceSettings;
use crate::worker::{Worker, WorkerState, WorkerStatus};

/// A running service's shared parts: its store, access rules, settings,
/// OpenAPI document, readiness and background workers.
#[derive(Debug, Clone)]
pub struct Platform {
    inner: Arc<PlatformInner>,
}

struct PlatformInner {
    service: &'static str,
    /// The service's tables: what readiness checks the recorded version of.
    schema: &'static Component,
    store: Store,
    settings: ServiceSettings,
    openapi: utoipa::openapi::OpenApi,
    ready: AtomicBool,
    stop_workers: CancellationToken,
    workers: std::sync::Mutex<Vec<(WorkerStatus, JoinHandle<()>)>>,
}

impl std::fmt::Debug for PlatformInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Platform").field("service", &self.service).field("store", &self.store).field("settings", &self.settings).finish()
    }
}

impl Platform {
    /// The platform of the service whose tables are `schema` (the service is
    /// named after its schema component).
    pub fn new(schema: &'static Component, store: Store, settings: ServiceSettings, openapi: utoipa::openapi::OpenApi) -> Self {
        // The recorder must exist before the first measurement, or it is lost.
        revstore_telemetry::prometheus();
        let store = store.for_service(schema.name);
        let store = match &settings.page_token_key {
            Some(key) => store.with_page_token_key(key.expose().as_bytes()),
            None => store,
        };
        Platform {
            inner: Arc::new(PlatformInner {
                service: schema.name,
                schema,
                store,
                settings,
                // Every service answers the janitor's admin calls (see `Service::new`).
                openapi: crate::openapi::complete(
                    openapi.merge_from(<crate::janitor_admin::JanitorAdminDoc as utoipa::OpenApi>::openapi()),
                ),
                ready: AtomicBool::new(true),
                stop_workers: CancellationToken::new(),
                workers: std::sync::Mutex::new(Vec::new()),
            }),
        }
    }

    pub fn service(&self) -> &'static str {
        self.inner.service
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    pub fn access(&self) -> &Access {
        &self.inner.settings.access
    }

    pub fn settings(&self) -> &ServiceSettings {
        &self.inner.settings
    }

    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::SeqCst)
    }

    /// Runs a background worker until it is done or the service shuts down
    /// (see [`crate::worker`]).
    pub fn spawn_worker<W: Worker>(&self, worker: W) -> WorkerStatus {
        let (status, handle) = crate::worker::spawn_worker(self.inner.service, worker, self.inner.stop_workers.clone());
        self.inner.workers.lock().unwrap_or_else(|p| p.into_inner()).push((status.clone(), handle));
        status
    }

    /// The state of each background worker, by name.
    pub fn worker_states(&self) -> Vec<(&'static str, WorkerState)> {
        self.inner.workers.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(s, _)| (s.name(), s.state())).collect()
    }

    /// The service's routes (already given their state) inside the platform:
    /// ops routes, read access, body limit, panic catcher, timeout,
    /// observation. Load shedding is outside the router ([`serve`]).
    pub fn router(&self, routes: Router) -> Router {
        let settings = &self.inner.settings;
        let ops = Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .route("/openapi.json", get(openapi))
            .with_state(self.clone());
        let routes = routes
            .layer(axum::middleware::from_fn_with_state(settings.access.clone(), require_read_access))
            .layer(axum::middleware::from_fn(refuse_encoded_bodies));
        // Bodies are admitted within the memory budget; waiting counts
        // against the request timeout (the layers below are outer).
        let gate = crate::budget::Gate { gate: settings.memory.body_gate(), body_limit: settings.body_limit };
        ops.merge(routes)
            .layer(axum::middleware::from_fn_with_state(gate, crate::budget::admit_body))
            .layer(DefaultBodyLimit::max(settings.body_limit))
            .layer(RequestBodyLimitLayer::new(settings.body_limit))
            .layer(CatchPanicLayer::custom(panic_response))
            .layer(TimeoutLayer::with_status_code(StatusCode::SERVICE_UNAVAILABLE, settings.request_timeout))
            .layer(axum::middleware::from_fn_with_state(ObserveState::new(self.inner.service, settings.access_log), observe))
    }
}

/// Refuses a request body with a `Content-Encoding` (other than `identity`):
/// no service decodes compressed bodies, and reading one as plain JSON
/// would ignore what the client said about it.
async fn refuse_encoded_bodies(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let encoded = request.headers().get_all(header::CONTENT_ENCODING).iter().any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    if encoded {
        return ApiError::unsupported_media_type("request bodies are not decoded: send them without a Content-Encoding").into_response();
    }
    next.run(request).await
}

fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let message =
        panic.downcast_ref::<String>().map(String::as_str).or_else(|| panic.downcast_ref::<&str>().copied()).unwrap_or("(no message)");
    tracing::error!(panic = message, "handler panicked");
    problem_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "internal error; the request id leads to the details in the logs".into(),
        None,
    )
}

async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "alive" }))
}

/// Ready when not shutting down, the storage answers, and the service's schema
/// component is at this build's version or a newer one compatible with it.
async fn readyz(State(platform): State<Platform>) -> Result<Json<serde_json::Value>, ApiError> {
    if !platform.is_ready() {
        return Err(ApiError::unavailable("shutting down"));
    }
    let store = platform.store();
    let check = async {
        store.ping().await?;
        store.check_schema(platform.inner.schema).await
    };
    let version = match tokio::time::timeout(Duration::from_secs(5), check).await {
        Ok(Ok(version)) => version,
        Ok(Err(StoreError::SchemaMismatch(msg))) => {
            // Our own words (versions, what to run): safe and useful to show.
            return Err(ApiError::unavailable(format!("storage schema: {msg}")));
        }
        Ok(Err(e)) => return Err(ApiError::dependency_unavailable("storage", e)),
        Err(_) => return Err(ApiError::unavailable("storage did not answer within 5 s")),
    };
    // A full disk keeps the service ready: reads go on, and taking it out of
    // the load balancer would stop them too. The body says writes are refused.
    let writes = if store.is_full() { "refused: storage full" } else { "accepted" };
    let workers: serde_json::Map<String, serde_json::Value> =
        platform.worker_states().into_iter().map(|(name, state)| (name.to_owned(), state.name().into())).collect();
    Ok(Json(serde_json::json!({
        "status": "ready",
        "engine": store.kind().name(),
        "schema_version": version,
        "writes": writes,
        "workers": workers,
    })))
}

async fn metrics(State(platform): State<Platform>) -> Response {
    // Memory against the budget, for the alert that fires before the
    // container's limit kills the process: the resident set is the process's,
    // and so is the budget it is held to (under `revstore up` three services
    // share the process, each with its share of the budget).
    let own = platform.inner.settings.memory.total();
    metrics::gauge!("memory_budget_bytes", "service" => platform.service()).set(own as f64);
    metrics::gauge!("process_memory_budget_bytes").set(crate::budget::process_budget().unwrap_or(own) as f64);
    if let Some(rss) = resident_bytes() {
        metrics::gauge!("process_resident_memory_bytes").set(rss as f64);
    }
    let mut response = series_of(platform.service(), &revstore_telemetry::prometheus().render()).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    response
}

/// The process's resident set in bytes (Linux: `VmRSS` of /proc/self/status).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The exposition text without the series of other services: under `revstore
/// up` three services share the process's one recorder, and each `/metrics`
/// shows its own series (`service="…"`) and the process's unlabelled ones.
fn series_of(service: &str, exposition: &str) -> String {
    let other = |line: &str| {
        let Some(labels) = line.split_once('{').map(|(_, rest)| rest) else { return false };
        let mut rest = labels;
        while let Some(at) = rest.find("service=\"") {
            let starts_label = at == 0 || rest[..at].ends_with(',');
            let value = &rest[at + "service=\"".len()..];
            if starts_label {
                return value.split_once('"').is_some_and(|(v, _)| v != service);
            }
            rest = value;
        }
        false
    };
    let mut out = String::with_capacity(exposition.len());
    let mut header = String::new();
    for line in exposition.lines() {
        if line.starts_with('#') {
            // A new family's header replaces one whose samples were all dropped.
            let family = line.split_whitespace().nth(2).unwrap_or_default();
            if line.starts_with("# HELP ") || header.split_whitespace().nth(2).is_none_or(|f| f != family) {
                header.clear();
            }
            header.push_str(line);
            header.push('\n');
        } else if line.is_empty() {
            // Between families: a header whose samples were all dropped ends here.
            header.clear();
            out.push('\n');
        } else if !other(line) {
            // A family's HELP and TYPE go out with its first sample kept.
            out.push_str(&header);
            header.clear();
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

async fn openapi(State(platform): State<Platform>) -> Json<utoipa::openapi::OpenApi> {
    Json(platform.inner.openapi.clone())
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("ctrl-c received"),
        () = term => tracing::info!("SIGTERM received"),
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, then shuts down
/// gracefully (see the module documentation).
pub async fn serve(
    platform: Platform,
    router: Router,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let service = platform.service();
    let (stop_accepting, stopped) = tokio::sync::oneshot::channel::<()>();
    let listener = LimitedListener::new(listener, platform.settings().connections, platform.service());
    let router = router.layer(axum::middleware::from_fn(track_requests));
    // Shedding wraps the whole router, outermost: a refusal costs a semaphore
    // try and a ready body, no routing, no span, no labelled metrics, no body
    // rewrite, so a flood of refusals does not starve the requests being
    // served (see crate::shedding).
    let shedder = crate::shedding::Shedder::new(service, platform.settings().max_in_flight);
    let app = tower::Layer::layer(&shedder, router);
    let make_service = axum::ServiceExt::<axum::extract::Request>::into_make_service_with_connect_info::<ConnectionHandle>(app);
    let server = axum::serve(listener, make_service).with_graceful_shutdown(async move {
        let _ = stopped.await;
    });
    let mut server: JoinHandle<std::io::Result<()>> = tokio::spawn(server.into_future());
    tokio::select! {
        result = &mut server => {
            return result.unwrap_or_else(|e| Err(std::io::Error::other(format!("server task failed: {e}"))));
        }
        () = shutdown => {}
    }
    let settings = platform.settings();
    platform.inner.ready.store(false, Ordering::SeqCst);
    tracing::info!(service, delay_secs = settings.shutdown_delay.as_secs_f64(), "shutting down: /readyz answers 503");
    tokio::time::sleep(settings.shutdown_delay).await;
    let _ = stop_accepting.send(());
    tracing::info!(service, drain_timeout_secs = settings.drain_timeout.as_secs_f64(), "no new connections; draining in-flight requests");
    match tokio::time::timeout(settings.drain_timeout, &mut server).await {
        Ok(Ok(result)) => result?,
        Ok(Err(e)) => return Err(std::io::Error::other(format!("server task failed: {e}"))),
        Err(_) => {
            tracing::warn!(service, "drain timeout reached: cutting the remaining requests");
            server.abort();
        }
    }
    platform.inner.stop_workers.cancel();
    let workers = std::mem::take(&mut *platform.inner.workers.lock().unwrap_or_else(|p| p.into_inner()));
    for (status, handle) in workers {
        if tokio::time::timeout(Duration::from_secs(10), handle).await.is_err() {
            tracing::warn!(service, worker = status.name(), "worker did not stop within 10 s");
        }
    }
    tracing::info!(service, "stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::series_of;

    #[test]
    fn each_service_sees_its_own_series_and_the_unlabelled_ones() {
        let exposition = "# HELP worker_state state\n# TYPE worker_state gauge\n\
            worker_state{service=\"old-store\",worker=\"compactor\",state=\"idle\"} 1\n\
            worker_state{service=\"current-store\",worker=\"outbox\",state=\"idle\"} 1\n\
            \n\
            # TYPE old_store_compactions_pending gauge\n\
            old_store_compactions_pending{service=\"old-store\"} 0\n\
            \n\
            # TYPE http_requests_total counter\n\
            http_requests_total{route=\"/x?service=\\\"old-store\\\"\",service=\"current-store\"} 3\n\
            # TYPE revstore_janitor_run_seconds gauge\n\
            revstore_janitor_run_seconds 2\n";
        let current = series_of("current-store", exposition);
        assert!(current.contains("worker=\"outbox\"") && !current.contains("compactor"), "{current}");
        assert!(!current.contains("old_store_compactions_pending"), "{current}");
        assert!(current.contains("http_requests_total{") && current.contains("revstore_janitor_run_seconds 2"), "{current}");
        assert!(
            current.contains("# HELP worker_state state\n# TYPE worker_state gauge\nworker_state{service=\"current-store\""),
            "{current}"
        );
        let old = series_of("old-store", exposition);
        assert!(old.contains("compactor") && old.contains("old_store_compactions_pending{") && !old.contains("outbox"), "{old}");
        assert!(!old.contains("http_requests_total{"), "{old}");
    }
}
