//! A small service built on the platform, exercised over real HTTP: problem
//! documents, tokens, body limits, readiness, metrics, trace propagation to a
//! second server, panics, timeouts, OpenAPI — and a SIGTERM drain of a real
//! child process that also flushes its traces to an OTLP endpoint.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::Json;
use axum::extract::{FromRef, Path, Query, State};
use axum::routing::{get, post};
use clap::Parser;
use http::{HeaderMap, Method, StatusCode};
use revstore_client::{ClientOptions, HttpClient, undocumented_routes};
use revstore_keys::Domain;
use revstore_schema::model::ColumnType::Text;
use revstore_schema::tables::meta::SCHEMA_META;
use revstore_schema::{Column as C, Compaction, Component, TableDef};
use revstore_service::worker::{Worker, WorkerState};
use revstore_service::{
    Access, ApiError, BoxError, CommonArgs, Context, JobOutcome, NoSettings, Platform, Routes, Secret, Service, ServiceDefinition,
    StorageArgs, WriteAccess, run_task, serve,
};
use revstore_storage::{
    Cas, CasOutcome, Engine, EngineKind, PurgeStats, ReadQuery, Row, ScanQuery, ScannedPartition, Store, StoreError, StoreResult, Upsert,
    Value, Write,
};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

static ITEMS: TableDef = TableDef {
    name: "platform_items",
    columns: &[C::partition("domain", Text), C::partition("key", Text), C::regular("value", Text)],
    default_ttl: None,
    compaction: Compaction::SizeTiered,
    comment: "platform test service",
};

/// The test service's schema component: its one table, at version 1.
static ITEMS_SCHEMA: Component = Component { name: "items", version: 1, compatible_from: 1, tables: &[&ITEMS] };

const WRITE_TOKEN: &str = "write-token-0123456789";
const ROTATED_TOKEN: &str = "rotated-token-0123456789";

#[derive(Clone)]
struct AppState {
    platform: Platform,
    downstream: Option<HttpClient>,
}

impl FromRef<AppState> for Access {
    fn from_ref(state: &AppState) -> Access {
        state.platform.access().clone()
    }
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
struct Item {
    value: String,
}

#[utoipa::path(put, path = "/{domain}/v1/items/{key}", request_body = Item,
    params(("domain" = String, Path), ("key" = String, Path)),
    responses((status = 201, description = "stored"), (status = 400, body = revstore_service::problem::Problem)))]
async fn put_item(
    _: WriteAccess,
    State(state): State<AppState>,
    Path((domain, key)): Path<(String, String)>,
    Json(item): Json<Item>,
) -> Result<StatusCode, ApiError> {
    let domain = Domain::parse(&domain)?;
    state.platform.store().write(Upsert::new(&ITEMS, [Value::from(domain.as_str()), Value::from(key)]).set("value", item.value)).await?;
    Ok(StatusCode::CREATED)
}

#[utoipa::path(get, path = "/{domain}/v1/items/{key}",
    params(("domain" = String, Path), ("key" = String, Path)),
    responses((status = 200, body = Item), (status = 404, body = revstore_service::problem::Problem)))]
async fn get_item(State(state): State<AppState>, Path((domain, key)): Path<(String, String)>) -> Result<Json<Item>, ApiError> {
    let domain = Domain::parse(&domain)?;
    let row = state.platform.store().get(&ITEMS, vec![Value::from(domain.as_str()), Value::from(key.clone())], None).await?;
    let value = row.and_then(|r| r.text("value").map(str::to_owned)).ok_or_else(|| ApiError::not_found(format!("no item {key}")))?;
    Ok(Json(Item { value }))
}

#[derive(Deserialize)]
struct SlowQuery {
    ms: u64,
}

async fn slow(Query(q): Query<SlowQuery>) -> &'static str {
    tokio::time::sleep(Duration::from_millis(q.ms)).await;
    "done"
}

async fn boom() -> &'static str {
    panic!("deliberate panic in a handler")
}

/// Calls the downstream server's /echo-trace and returns what it saw.
async fn relay(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    let client = state.downstream.as_ref().ok_or_else(|| ApiError::unavailable("no downstream"))?;
    let seen: serde_json::Value = client.get_json("/echo-trace").await.map_err(|e| ApiError::unavailable(e.to_string()))?;
    Ok(Json(seen))
}

async fn echo_trace(headers: HeaderMap) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "traceparent": headers.get("traceparent").and_then(|v| v.to_str().ok()) }))
}

/// What a typed client of this service calls; checked against the OpenAPI document.
const CLIENT_ROUTES: &[(Method, &str)] = &[(Method::PUT, "/{domain}/v1/items/{key}"), (Method::GET, "/{domain}/v1/items/{key}")];

fn app(state: AppState) -> (axum::Router, utoipa::openapi::OpenApi) {
    let (router, openapi) = OpenApiRouter::new()
        .routes(routes!(put_item))
        .routes(routes!(get_item))
        .route("/slow", get(slow))
        .route("/boom", get(boom))
        .route("/relay", post(relay).get(relay))
        .route("/echo-trace", get(echo_trace))
        .split_for_parts();
    (router.with_state(state), openapi)
}

#[derive(Debug, Parser)]
struct TestArgs {
    #[command(flatten)]
    common: CommonArgs,
}

/// An engine that can be switched off: the real embedded engine behind it,
/// every call failing as unavailable while `down` is set.
#[derive(Debug)]
struct Switchable {
    inner: Arc<dyn Engine>,
    down: AtomicBool,
}

impl Switchable {
    fn check(&self) -> StoreResult<()> {
        if self.down.load(Ordering::SeqCst) { Err(StoreError::Unavailable("switched off by the test".into())) } else { Ok(()) }
    }
}

#[async_trait]
impl Engine for Switchable {
    fn kind(&self) -> EngineKind {
        self.inner.kind()
    }
    fn now_micros(&self) -> i64 {
        self.inner.now_micros()
    }
    async fn ensure_tables(&self, tables: &[&'static TableDef]) -> StoreResult<()> {
        self.check()?;
        self.inner.ensure_tables(tables).await
    }
    async fn apply(&self, writes: Vec<Write>) -> StoreResult<()> {
        self.check()?;
        self.inner.apply(writes).await
    }
    async fn read(&self, query: &ReadQuery, after: Option<Vec<Value>>) -> StoreResult<(Vec<Row>, Option<Row>)> {
        self.check()?;
        self.inner.read(query, after).await
    }
    async fn cas(&self, cas: Cas) -> StoreResult<CasOutcome> {
        self.check()?;
        self.inner.cas(cas).await
    }
    async fn scan(&self, query: &ScanQuery) -> StoreResult<Vec<ScannedPartition>> {
        self.check()?;
        self.inner.scan(query).await
    }
    async fn holdings(&self, query: &revstore_storage::ScanQuery) -> StoreResult<revstore_storage::Holdings> {
        self.check()?;
        self.inner.holdings(query).await
    }
    async fn ping(&self) -> StoreResult<()> {
        self.check()?;
        self.inner.ping().await
    }
    async fn purge_expired(&self) -> StoreResult<PurgeStats> {
        self.check()?;
        self.inner.purge_expired().await
    }
}

struct Running {
    addr: SocketAddr,
    engine: Arc<Switchable>,
    store: Store,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    dir: tempfile::TempDir,
}

impl Running {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn telemetry() {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        // Keep the guard for the whole test process.
        if let Ok(guard) = revstore_telemetry::init("platform-test") {
            std::mem::forget(guard);
        }
    });
}

async fn start(extra_args: &[&str], migrate: bool, downstream: Option<String>) -> Running {
    telemetry();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut args =
        vec!["test", "--data-dir", dir.path().to_str().expect("path"), "--write-tokens", "write-token-0123456789,rotated-token-0123456789"];
    // The harness's defaults, unless the test sets them itself.
    let defaults =
        [("--shutdown-delay-secs", "0"), ("--drain-timeout-secs", "5"), ("--body-limit-bytes", "1024"), ("--request-timeout-secs", "1")];
    for (flag, value) in defaults.into_iter().filter(|(flag, _)| !extra_args.contains(flag)) {
        args.extend_from_slice(&[flag, value]);
    }
    args.extend_from_slice(extra_args);
    let settings = TestArgs::parse_from(args).common.resolve(0).expect("settings");
    let mut switchable = None;
    let store = revstore_storage::open(settings.storage.clone()).await.expect("open").map_engine(|inner| {
        let engine = Arc::new(Switchable { inner, down: AtomicBool::new(false) });
        switchable = Some(engine.clone());
        engine
    });
    let engine = switchable.expect("wrapped");
    if migrate {
        store.migrate(&[&ITEMS_SCHEMA]).await.expect("migrate");
    } else {
        store.ensure_tables(&[&ITEMS]).await.expect("tables");
    }
    let downstream = downstream.map(|url| HttpClient::new(&url, ClientOptions::default()).expect("client"));
    let platform_for_state = |platform: Platform| AppState { platform, downstream };
    let (_, openapi) =
        app(AppState { platform: Platform::new(&ITEMS_SCHEMA, store.clone(), settings.clone(), Default::default()), downstream: None });
    let platform = Platform::new(&ITEMS_SCHEMA, store.clone(), settings, openapi);
    let (routes, _) = app(platform_for_state(platform.clone()));
    let router = platform.router(routes);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel();
    tokio::spawn(serve(platform, router, listener, async move {
        let _ = stopped.await;
    }));
    Running { addr, engine, store, stop: Some(stop), dir }
}

async fn problem(response: reqwest::Response) -> (StatusCode, serde_json::Value, HeaderMap) {
    let status = response.status();
    let headers = response.headers().clone();
    assert_eq!(headers.get("content-type").and_then(|v| v.to_str().ok()), Some("application/problem+json"), "status {status}");
    let body: serde_json::Value = response.json().await.expect("problem json");
    assert_eq!(body["status"], status.as_u16(), "{body}");
    assert!(body["type"].as_str().is_some_and(|t| t.starts_with("urn:revstore:problem:")), "{body}");
    assert_eq!(body["request_id"].as_str(), headers.get("x-request-id").and_then(|v| v.to_str().ok()), "{body}");
    (status, body, headers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_problem_document() {
    let s = start(&[], true, None).await;
    let http = reqwest::Client::new();
    let put = |path: &str, body: &'static str| {
        http.put(s.url(path)).bearer_auth(WRITE_TOKEN).header("content-type", "application/json").body(body)
    };
    let (status, body, _) = problem(put("/bad_domain!/v1/items/k", r#"{"value":"v"}"#).send().await.expect("send")).await;
    assert_eq!(status, 400);
    assert!(body["detail"].as_str().unwrap_or_default().contains("invalid domain"), "{body}");
    let (status, body, _) = problem(put("/en.wikipedia.org/v1/items/k", "{not json").send().await.expect("send")).await;
    assert_eq!(status, 400);
    assert!(body["detail"].as_str().unwrap_or_default().to_lowercase().contains("json"), "{body}");
    let (status, _, _) = problem(put("/en.wikipedia.org/v1/items/k", r#"{"nope":1}"#).send().await.expect("send")).await;
    assert_eq!(status, 422);
    let (status, _, _) = problem(http.get(s.url("/no/such/route")).send().await.expect("send")).await;
    assert_eq!(status, 404);
    let (status, _, headers) = problem(http.delete(s.url("/en.wikipedia.org/v1/items/k")).send().await.expect("send")).await;
    assert_eq!(status, 405);
    assert!(headers.contains_key("allow"));
    // A Content-Encoding is never ignored: the probe's 'gzip' body that was
    // not gzip was stored as plain JSON; now any encoded body is a 415.
    for encoding in ["gzip", "br", "identity, gzip"] {
        let (status, body, _) = problem(
            put("/en.wikipedia.org/v1/items/k", r#"{"value":"v"}"#).header("content-encoding", encoding).send().await.expect("send"),
        )
        .await;
        assert_eq!(status, 415, "{encoding}");
        assert!(body["detail"].as_str().unwrap_or_default().contains("Content-Encoding"), "{body}");
    }
    // Nothing was written by the rejected requests.
    let (status, _, _) = problem(http.get(s.url("/en.wikipedia.org/v1/items/k")).send().await.expect("send")).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_need_a_valid_token_and_tokens_rotate() {
    let s = start(&[], true, None).await;
    let http = reqwest::Client::new();
    let put = || http.put(s.url("/en.wikipedia.org/v1/items/k")).json(&serde_json::json!({ "value": "v" }));
    let (status, _, headers) = problem(put().send().await.expect("send")).await;
    assert_eq!(status, 401);
    assert_eq!(headers.get("www-authenticate").and_then(|v| v.to_str().ok()), Some("Bearer"));
    let (status, _, _) = problem(put().bearer_auth("not-the-token-0123456789").send().await.expect("send")).await;
    assert_eq!(status, 403);
    assert_eq!(put().bearer_auth(WRITE_TOKEN).send().await.expect("send").status(), 201);
    assert_eq!(put().bearer_auth(ROTATED_TOKEN).send().await.expect("send").status(), 201);
    let upper_case_scheme = put().header("authorization", format!("BEARER {WRITE_TOKEN}")).send().await.expect("send");
    assert_eq!(upper_case_scheme.status(), 201, "auth schemes are case-insensitive (RFC 9110 section 11.1)");
    let read = http.get(s.url("/en.wikipedia.org/v1/items/k")).send().await.expect("send");
    assert_eq!(read.status(), 200, "reads are open by default");
    assert_eq!(read.json::<Item>().await.expect("json").value, "v");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_can_be_closed_with_read_tokens() {
    let s = start(&["--read-tokens", "reader-token-0123456789"], true, None).await;
    let http = reqwest::Client::new();
    let (status, _, _) = problem(http.get(s.url("/en.wikipedia.org/v1/items/k")).send().await.expect("send")).await;
    assert_eq!(status, 401);
    let status =
        http.get(s.url("/en.wikipedia.org/v1/items/k")).bearer_auth("reader-token-0123456789").send().await.expect("send").status();
    assert_eq!(status, 404, "authorised, and the item does not exist");
    assert_eq!(http.get(s.url("/healthz")).send().await.expect("send").status(), 200, "ops routes stay open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_413() {
    let s = start(&[], true, None).await;
    let big = serde_json::json!({ "value": "x".repeat(4096) });
    let response =
        reqwest::Client::new().put(s.url("/en.wikipedia.org/v1/items/k")).bearer_auth(WRITE_TOKEN).json(&big).send().await.expect("send");
    let (status, _, _) = problem(response).await;
    assert_eq!(status, 413);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_storage_and_its_schema() {
    let s = start(&[], true, None).await;
    let http = reqwest::Client::new();
    let ready = http.get(s.url("/readyz")).send().await.expect("send");
    assert_eq!(ready.status(), 200);
    let body: serde_json::Value = ready.json().await.expect("json");
    assert_eq!((body["engine"].as_str(), body["schema_version"].as_u64()), (Some("embedded"), Some(u64::from(ITEMS_SCHEMA.version))));
    // A newer build added to the tables during a rolling upgrade, compatibly: still ready.
    let newer = |version: i64, compatible_from: i64| {
        Upsert::new(&SCHEMA_META, [Value::from("items")]).set("version", version).set("compatible_from", compatible_from)
    };
    s.store.write(newer(2, 1)).await.expect("record");
    let ready = http.get(s.url("/readyz")).send().await.expect("send");
    assert_eq!(ready.status(), 200);
    assert_eq!(ready.json::<serde_json::Value>().await.expect("json")["schema_version"], 2);
    // A change this build cannot work with: not ready, saying why.
    s.store.write(newer(2, 2)).await.expect("record");
    let (status, body, _) = problem(http.get(s.url("/readyz")).send().await.expect("send")).await;
    assert_eq!(status, 503);
    assert!(body["detail"].as_str().unwrap_or_default().contains("needs version 2 or newer"), "{body}");
    s.store.write(newer(1, 1)).await.expect("record");
    s.engine.down.store(true, Ordering::SeqCst);
    let (status, body, _) = problem(http.get(s.url("/readyz")).send().await.expect("send")).await;
    assert_eq!(status, 503);
    assert!(body["detail"].as_str().unwrap_or_default().contains("storage is unavailable"), "{body}");
    assert!(!body.to_string().contains("switched off by the test"), "the cause is for the logs only: {body}");
    assert_eq!(http.get(s.url("/healthz")).send().await.expect("send").status(), 200, "alive even when storage is down");
    let (status, body, _) = problem(http.get(s.url("/en.wikipedia.org/v1/items/k")).send().await.expect("send")).await;
    assert_eq!(status, 503);
    assert!(!body.to_string().contains("switched off by the test"), "the cause is for the logs only: {body}");
    s.engine.down.store(false, Ordering::SeqCst);
    assert_eq!(http.get(s.url("/readyz")).send().await.expect("send").status(), 200);

    let unmigrated = start(&[], false, None).await;
    let (status, body, _) = problem(http.get(unmigrated.url("/readyz")).send().await.expect("send")).await;
    assert_eq!(status, 503);
    assert!(body["detail"].as_str().unwrap_or_default().contains("no schema recorded"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_labelled_by_route_template() {
    let s = start(&[], true, None).await;
    let http = reqwest::Client::new();
    for key in ["a", "b", "c"] {
        http.get(s.url(&format!("/en.wikipedia.org/v1/items/{key}"))).send().await.expect("send");
    }
    let text = http.get(s.url("/metrics")).send().await.expect("send").text().await.expect("text");
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("http_requests_total{") && l.contains(r#"route="/{domain}/v1/items/{key}""#) && l.contains(r#"status="404""#)
        })
        .unwrap_or_else(|| panic!("no per-route counter in:\n{text}"));
    let count: f64 = line.rsplit(' ').next().and_then(|n| n.parse().ok()).expect("count");
    assert!(count >= 3.0, "{line}");
    assert!(!text.contains("/en.wikipedia.org/v1/items/a"), "raw paths must not become labels");
    assert!(text.contains("http_request_duration_seconds_bucket{"), "latency histogram missing");
    assert!(
        text.lines().any(|l| l.starts_with(r#"storage_operation_duration_seconds_bucket{service="items",engine="embedded""#)),
        "storage timings missing, or not labelled with their service"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_data_is_purged_in_the_background() {
    let s = start(&["--purge-interval-secs", "1"], true, None).await;
    let store = Store::new(s.engine.clone());
    for i in 0..10 {
        store
            .write(Upsert::new(&ITEMS, [Value::from("en.wikipedia.org"), Value::from(format!("short-lived-{i}"))]).set("value", "x").ttl(1))
            .await
            .expect("write");
    }
    // The rows leave the database file itself (an expired row is hidden from
    // reads at once, but stays on disk until purged). The purge metric is
    // process-wide and other tests purge too, so the file is what is checked.
    let db =
        rusqlite::Connection::open_with_flags(s.dir.path().join("revstore.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).expect("db");
    let on_disk = || db.query_row("SELECT count(*) FROM platform_items", [], |r| r.get::<_, i64>(0)).expect("count");
    assert_eq!(on_disk(), 10, "the expired rows are on disk until the engine purges them");
    let deadline = Instant::now() + Duration::from_secs(15);
    while on_disk() > 0 {
        assert!(Instant::now() < deadline, "expired rows were not purged in the background");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_id_follows_the_request_to_the_next_service() {
    let downstream = start(&[], true, None).await;
    let upstream = start(&[], true, Some(downstream.url(""))).await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let response = reqwest::Client::new()
        .get(upstream.url("/relay"))
        .header("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01"))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 200);
    let seen: serde_json::Value = response.json().await.expect("json");
    let traceparent = seen["traceparent"].as_str().unwrap_or_else(|| panic!("no traceparent reached downstream: {seen}"));
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[1], trace_id, "downstream saw another trace");
    assert_ne!(parts[2], "00f067aa0ba902b7", "the outgoing call is a new span within the trace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_is_a_500_problem_not_a_dropped_connection() {
    let s = start(&[], true, None).await;
    let (status, body, _) = problem(reqwest::Client::new().get(s.url("/boom")).send().await.expect("an answer, not a reset")).await;
    assert_eq!(status, 500);
    assert!(!body["detail"].as_str().unwrap_or_default().contains("deliberate"), "panic text leaked: {body}");
    assert_eq!(reqwest::Client::new().get(s.url("/healthz")).send().await.expect("send").status(), 200, "still serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_timeout_is_a_503_problem() {
    let s = start(&[], true, None).await;
    let started = Instant::now();
    // A handler of a minute against the 1 s timeout: cut by the timeout, with
    // room on the slow side for a busy machine.
    let (status, _, _) = problem(reqwest::Client::new().get(s.url("/slow?ms=60000")).send().await.expect("send")).await;
    assert_eq!(status, 503);
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_describes_what_the_client_calls() {
    let s = start(&[], true, None).await;
    let doc: serde_json::Value = reqwest::get(s.url("/openapi.json")).await.expect("send").json().await.expect("json");
    assert_eq!(undocumented_routes(&doc, CLIENT_ROUTES), Vec::<String>::new());
    assert!(!undocumented_routes(&doc, &[(Method::DELETE, "/{domain}/v1/items/{key}")]).is_empty(), "the check can fail");
}

// ---- SIGTERM on a real child process ----

const CHILD: &str = "REVSTORE_PLATFORM_TEST_CHILD";

/// The child process of `sigterm_drains_in_flight_requests_and_flushes_traces`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of sigterm_drains_in_flight_requests_and_flushes_traces"]
async fn child_process_serving() {
    let data_dir = std::env::var(CHILD).expect("run by the SIGTERM test");
    let guard = revstore_telemetry::init("platform-child").expect("telemetry");
    let args = [
        "test",
        "--data-dir",
        data_dir.as_str(),
        "--write-tokens",
        WRITE_TOKEN,
        // Long enough that the test's look at /readyz during the delay holds
        // on a busy machine (it once was 1 s, a 0.9 s margin).
        "--shutdown-delay-secs",
        "5",
        "--drain-timeout-secs",
        "10",
    ];
    let settings = TestArgs::parse_from(args).common.resolve(0).expect("settings");
    let store = revstore_storage::open(settings.storage.clone()).await.expect("open");
    store.migrate(&[&ITEMS_SCHEMA]).await.expect("migrate");
    let platform = Platform::new(&ITEMS_SCHEMA, store, settings, Default::default());
    let worker_stopped = Arc::new(AtomicBool::new(false));
    let flag = worker_stopped.clone();
    platform.spawn_worker(Ticker { stopped: flag });
    let (routes, _) = app(AppState { platform: platform.clone(), downstream: None });
    let router = platform.router(routes);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    println!("listening {}", listener.local_addr().expect("addr"));
    serve(platform, router, listener, revstore_service::shutdown_signal()).await.expect("serve");
    assert!(worker_stopped.load(Ordering::SeqCst), "the worker was not stopped");
    guard.shutdown();
    println!("exited cleanly");
}

/// A worker that is idle until stopped, and says when it was.
struct Ticker {
    stopped: Arc<AtomicBool>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
    }
}

impl Worker for Ticker {
    fn name(&self) -> &'static str {
        "ticker"
    }
    async fn work(&mut self, _stop: &CancellationToken) -> Result<WorkerState, BoxError> {
        Ok(WorkerState::Idle)
    }
    async fn wait_for_work(&mut self) {
        std::future::pending::<()>().await
    }
}

/// A worker with one step of work.
struct Seed;

impl Worker for Seed {
    fn name(&self) -> &'static str {
        "seed"
    }
    async fn work(&mut self, _stop: &CancellationToken) -> Result<WorkerState, BoxError> {
        Ok(WorkerState::Done)
    }
    async fn wait_for_work(&mut self) {}
}

/// The items service as a kind of service, built the way a binary builds it.
struct Items;

impl ServiceDefinition for Items {
    type Settings = NoSettings;
    const NAME: &'static str = "items";
    const BINARY: &'static str = "revstore-items";
    const ABOUT: &'static str = "items, the platform's test service";
    const DEFAULT_PORT: u16 = 0;
    const SCHEMA: &'static Component = &ITEMS_SCHEMA;

    async fn build(_: NoSettings, context: Context) -> Result<Service, BoxError> {
        let platform = Platform::new(Self::SCHEMA, context.store, context.settings, Default::default());
        platform.spawn_worker(Seed);
        let routes = Routes::new()
            .route("/{domain}/v1/items/{key}", axum::routing::put(put_item).get(get_item))
            .with_state(AppState { platform: platform.clone(), downstream: None });
        Ok(Service::new(platform, routes))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_serves_two_services_side_by_side_each_on_its_own_store() {
    telemetry();
    let dirs = [tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir")];
    let mut services = Vec::new();
    let mut urls = Vec::new();
    for dir in &dirs {
        // Settings built as values, as `revstore up` builds them.
        let settings = CommonArgs {
            listen: Some(([127, 0, 0, 1], 0).into()),
            storage: StorageArgs { data_dir: dir.path().to_owned(), ..StorageArgs::default() },
            write_tokens: vec![Secret::new(WRITE_TOKEN)],
            ..CommonArgs::default()
        }
        .resolve(Items::DEFAULT_PORT)
        .expect("settings");
        let (service, listener) = revstore_service::start::<Items>(settings, NoSettings {}).await.expect("start");
        assert_eq!(service.name(), "items");
        // Its own route, and the janitor's admin calls every service answers.
        assert_eq!(
            service.route_templates(),
            ["/{domain}/v1/items/{key}", "/admin/janitor/lease", "/admin/janitor/{task}/step", "/admin/storage/purge"]
        );
        urls.push(format!("http://{}", listener.local_addr().expect("addr")));
        services.push((service, listener));
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(revstore_service::serve_all(services, async move {
        let _ = stopped.await;
    }));
    let http = reqwest::Client::new();
    let put = http
        .put(format!("{}/en.wikipedia.org/v1/items/a", urls[0]))
        .bearer_auth(WRITE_TOKEN)
        .json(&serde_json::json!({"value": "in the first"}))
        .send()
        .await
        .expect("put");
    assert_eq!(put.status(), 201);
    let first = http.get(format!("{}/en.wikipedia.org/v1/items/a", urls[0])).send().await.expect("get");
    assert_eq!(first.status(), 200);
    let second = http.get(format!("{}/en.wikipedia.org/v1/items/a", urls[1])).send().await.expect("get");
    assert_eq!(second.status(), 404, "the second service has a store of its own");
    for url in &urls {
        let ready: serde_json::Value = http.get(format!("{url}/readyz")).send().await.expect("readyz").json().await.expect("json");
        assert_eq!(ready["workers"], serde_json::json!({"seed": "done"}), "{ready}");
    }
    stop.send(()).expect("stop");
    tokio::time::timeout(Duration::from_secs(30), running).await.expect("both stop").expect("task").expect("serve_all");
    for url in &urls {
        assert!(http.get(format!("{url}/healthz")).send().await.is_err(), "{url} still answers");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_exits_0_when_done_75_when_interrupted_and_1_when_it_fails() {
    telemetry();
    let never = std::future::pending::<()>;
    // Done: the job ran to its end.
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();
    let code = run_task("items-job", never(), |_| async move {
        flag.store(true, Ordering::SeqCst);
        Ok(JobOutcome::Completed)
    })
    .await;
    assert_eq!((code, ran.load(Ordering::SeqCst)), (ExitCode::SUCCESS, true));
    // Stopped by the signal at a safe point.
    let code = run_task("items-job", async {}, |stop| async move {
        stop.cancelled().await;
        Ok(JobOutcome::Interrupted)
    })
    .await;
    assert_eq!(code, ExitCode::from(revstore_service::EXIT_INTERRUPTED));
    // Failed.
    let code = run_task("items-job", never(), |_| async { Err("the repair found a contradiction".into()) }).await;
    assert_eq!(code, ExitCode::from(1));
}

/// A minimal OTLP/HTTP endpoint: counts the trace exports it receives.
async fn otlp_collector() -> (SocketAddr, Arc<AtomicUsize>) {
    let received = Arc::new(AtomicUsize::new(0));
    let counter = received.clone();
    let router = axum::Router::new().route(
        "/v1/traces",
        post(move |body: axum::body::Bytes| {
            let counter = counter.clone();
            async move {
                if !body.is_empty() {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
                StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await });
    (addr, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_and_flushes_traces() {
    let (collector, exports) = otlp_collector().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["child_process_serving", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD, dir.path())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{collector}"))
        .env("REVSTORE_LOG_FORMAT", "json")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let collected = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // The test harness may print "test child_process_serving ... " first on the same line.
            if let Some((_, addr)) = line.split_once("listening ") {
                let _ = addr_tx.send(addr.trim().to_owned());
            }
            collected.lock().expect("lines").push(line);
        }
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(60)).expect("the child started listening");
    let http = reqwest::Client::new();
    let url = |path: &str| format!("http://{addr}{path}");
    assert_eq!(http.get(url("/readyz")).send().await.expect("send").status(), 200);

    // A request in flight when the signal comes must complete.
    let in_flight = tokio::spawn({
        let request = http.get(url("/slow?ms=900"));
        async move { request.send().await.map(|r| r.status()) }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent = Instant::now();
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
    assert!(status.success());
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Within the shutdown delay: still answering, but not ready.
    let (status, body, _) = problem(http.get(url("/readyz")).send().await.expect("answered during the delay")).await;
    assert_eq!(status, 503);
    assert!(body["detail"].as_str().unwrap_or_default().contains("shutting down"), "{body}");
    assert_eq!(in_flight.await.expect("task").expect("the in-flight request completed"), StatusCode::OK);

    let exit = loop {
        if let Some(exit) = child.try_wait().expect("wait") {
            break exit;
        }
        assert!(sent.elapsed() < Duration::from_secs(30), "the child did not exit after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "child exit: {exit:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(lines.lock().expect("lines").iter().any(|l| l.contains("exited cleanly")), "serve did not return cleanly");
    assert!(http.get(url("/healthz")).send().await.is_err(), "still accepting connections after exit");
    assert!(exports.load(Ordering::SeqCst) >= 1, "no traces reached the OTLP endpoint");
}

// ---- exit code 64 on bad settings, from a real process ----

const SETTINGS_CHILD: &str = "REVSTORE_SETTINGS_TEST_ARGS";

/// The child process of `invalid_settings_exit_64`: parses the arguments it is given.
#[test]
#[ignore = "the child process of invalid_settings_exit_64"]
fn child_process_settings() {
    let args = std::env::var(SETTINGS_CHILD).expect("run by invalid_settings_exit_64");
    let parsed: TestArgs = revstore_service::parse_from_or_exit(std::iter::once("svc").chain(args.split(' ')));
    if let Err(e) = parsed.common.resolve(0) {
        revstore_service::exit_on_settings_error("svc", e);
    }
}

#[test]
fn invalid_settings_exit_64() {
    for (args, says) in
        [("--listen nowhere", "invalid value"), ("--write-tokens short", "at least 16"), ("--help", "REVSTORE_WRITE_TOKENS")]
    {
        let out = Command::new(std::env::current_exe().expect("test binary"))
            .args(["child_process_settings", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(SETTINGS_CHILD, args)
            .output()
            .expect("run child");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let expected = if args == "--help" { 0 } else { 64 };
        assert_eq!(out.status.code(), Some(expected), "{args}: {text}");
        assert!(text.contains(says), "{args}: {text}");
    }
}

/// The probe sent 5,000 requests with random 41-character methods and took
/// /metrics from 1.9 KB to 12.6 MB: each method was a new label value. Now
/// any method that is not a standard one is labelled `other`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_chosen_methods_do_not_mint_metric_series() {
    let s = start(&[], true, None).await;
    let http = reqwest::Client::new();
    let size_of_metrics = async || http.get(s.url("/metrics")).send().await.expect("send").text().await.expect("text");
    let mut sent = Vec::new();
    for i in 0..200 {
        let method = format!("PROBE{i:04}{}", "X".repeat(36));
        let m = reqwest::Method::from_bytes(method.as_bytes()).expect("a method token");
        let answer = http.request(m, s.url("/en.wikipedia.org/v1/items/k")).send().await.expect("send");
        assert!(answer.status().is_client_error(), "{}", answer.status());
        sent.push(method);
    }
    let before = size_of_metrics().await.len();
    for method in &sent[..50] {
        let m = reqwest::Method::from_bytes(method.as_bytes()).expect("a method token");
        http.request(m, s.url("/nowhere")).send().await.expect("send");
    }
    let metrics = size_of_metrics().await;
    assert!(!metrics.contains("PROBE"), "a request-chosen method reached the metrics");
    assert!(metrics.contains("method=\"other\""), "{metrics}");
    // 50 more odd requests add no series beyond one route label ("unmatched").
    assert!(metrics.len() < before + 4096, "metrics grew from {before} to {} bytes", metrics.len());
}

/// Reads until the server closes the connection; how long that took.
async fn time_until_closed(stream: &mut tokio::net::TcpStream) -> std::time::Duration {
    use tokio::io::AsyncReadExt;
    let started = std::time::Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(30), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("the connection was still open after 30 s"),
        }
    }
}

/// Slowloris, as the probe ran it: connections that trickle header bytes or
/// send nothing stayed open indefinitely, and enough of them stopped every
/// new request, /healthz included. Now headers must arrive within the
/// header-read timeout, idle keep-alive connections close, and at the
/// connection cap the longest-waiting connection makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_connections_are_closed_and_healthz_stays_answerable() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The two timeouts far apart, so that which one closed a connection shows
    // whatever the machine's speed; bounds below are generous on the slow side.
    let s = start(&["--header-read-timeout-secs", "1", "--idle-timeout-secs", "8", "--max-connections", "8"], true, None).await;

    // Trickled headers: closed about a second after their first byte.
    let mut trickle = tokio::net::TcpStream::connect(s.addr).await.expect("connect");
    let trickling = tokio::spawn(async move {
        for b in b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: " {
            if trickle.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        time_until_closed(&mut trickle).await
    });
    // Silent from the start: closed after the header-read timeout.
    let mut silent = tokio::net::TcpStream::connect(s.addr).await.expect("connect");
    let silent_for = time_until_closed(&mut silent).await;
    assert!(silent_for < std::time::Duration::from_secs(7), "a silent connection stayed {silent_for:?}: not the header-read timeout");
    trickling.await.expect("trickle task");

    // Kept alive after an answer: still usable past the header-read timeout,
    // closed after the idle timeout.
    let mut kept = tokio::net::TcpStream::connect(s.addr).await.expect("connect");
    let request = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n";
    let mut buf = [0u8; 1024];
    kept.write_all(request).await.expect("write");
    let n = kept.read(&mut buf).await.expect("read");
    assert!(
        String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase().contains("keep-alive: timeout=8\r\n"),
        "the answer says how long an idle connection is kept: {}",
        String::from_utf8_lossy(&buf[..n])
    );
    tokio::time::sleep(std::time::Duration::from_millis(1800)).await;
    kept.write_all(request).await.expect("write");
    let n = kept.read(&mut buf).await.expect("read");
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"), "a kept-alive connection is reusable within the idle timeout");
    let idle_for = time_until_closed(&mut kept).await;
    assert!(
        idle_for > std::time::Duration::from_secs(7) && idle_for < std::time::Duration::from_secs(30),
        "closed after {idle_for:?} idle"
    );

    // Many more slow connections than the cap: /healthz is still answered promptly.
    let mut attackers = Vec::new();
    for _ in 0..40 {
        let mut c = tokio::net::TcpStream::connect(s.addr).await.expect("connect");
        c.write_all(b"GET /healthz HTTP/1.1\r\nho").await.expect("write");
        attackers.push(c);
    }
    let http = reqwest::Client::builder().pool_max_idle_per_host(0).build().expect("client");
    for _ in 0..5 {
        let asked = std::time::Instant::now();
        let answer =
            http.get(s.url("/healthz")).timeout(std::time::Duration::from_secs(20)).send().await.expect("healthz answers under attack");
        assert_eq!(answer.status(), 200);
        // Not queued behind the attackers' header-read timeout (8 s idle, 1 s
        // per header): answered well inside it even on a busy machine.
        assert!(asked.elapsed() < std::time::Duration::from_secs(5), "{:?}", asked.elapsed());
    }
    let metrics = http.get(s.url("/metrics")).send().await.expect("send").text().await.expect("text");
    for reason in ["header_timeout", "idle_timeout", "evicted"] {
        assert!(
            metrics.contains(&format!("http_connections_closed_total{{service=\"items\",reason=\"{reason}\"}}")),
            "{reason}: {metrics}"
        );
    }
}

/// At the cap, an idle kept-alive connection was closed to keep a place free
/// even when nobody wanted it, and a client reusing it at that moment lost
/// its request ("server closed idle connection"). Now one is closed only for
/// a connection waiting in the listen backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_an_idle_connection_is_closed_only_for_a_newcomer() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = start(&["--max-connections", "16"], true, None).await;
    let request = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n";
    async fn answer(c: &mut tokio::net::TcpStream, request: &[u8]) -> String {
        c.write_all(request).await.expect("write");
        let mut buf = [0u8; 2048];
        let n = tokio::time::timeout(std::time::Duration::from_secs(30), c.read(&mut buf)).await.expect("answered").expect("read");
        String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase()
    }
    let mut kept = Vec::new();
    for _ in 0..16 {
        let mut c = tokio::net::TcpStream::connect(s.addr).await.expect("connect");
        let head = answer(&mut c, request).await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        kept.push(c);
    }
    // Every connection idle well past the reuse grace: evictable, had anyone come.
    tokio::time::sleep(4 * revstore_service::connections::REUSE_GRACE).await;
    for c in &mut kept {
        let head = answer(c, request).await;
        assert!(head.starts_with("http/1.1 200"), "an idle connection at the cap was closed with nobody waiting: {head:?}");
    }
    // A newcomer: the connection idle longest makes room, and it is answered.
    tokio::time::sleep(4 * revstore_service::connections::REUSE_GRACE).await;
    let mut newcomer = tokio::net::TcpStream::connect(s.addr).await.expect("connect");
    assert!(answer(&mut newcomer, request).await.starts_with("http/1.1 200"));
    let mut closed = 0;
    for c in &mut kept {
        let mut buf = [0u8; 16];
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(std::time::Duration::from_millis(50), c.read(&mut buf)).await {
            closed += 1;
        }
    }
    assert_eq!(closed, 1, "one idle connection made room for the newcomer");
}

/// An open-loop flood made every request slow (p99 of 19-31 s) instead of
/// refusing what the service could not take. Now past `--max-in-flight` a
/// request is answered 503 `overloaded` with `Retry-After` at once, the probes
/// and /metrics are still answered, and places free up as requests finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_in_flight_limit_are_shed_and_probes_are_not() {
    let s = start(&["--max-in-flight", "2", "--request-timeout-secs", "300"], true, None).await;
    let http = reqwest::Client::new();
    let held: Vec<_> = (0..2).map(|_| tokio::spawn(http.get(s.url("/slow?ms=120000")).send())).collect();
    let in_flight = |metrics: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with("http_requests_in_flight{service=\"items\"}"))
            .map(|l| l.rsplit(' ').next().unwrap_or("").to_owned())
    };
    // Wait (as long as a slow machine needs) until both hold their places.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = http.get(s.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
        if in_flight(&metrics).as_deref() == Some("2") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the two slow requests never got in flight: {:?}", in_flight(&metrics));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let asked = std::time::Instant::now();
    let (status, body, headers) = problem(http.get(s.url("/slow?ms=1")).send().await.expect("send")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["type"], "urn:revstore:problem:overloaded", "{body}");
    assert_eq!(headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    // Refused, not queued behind the two-minute requests.
    assert!(asked.elapsed() < Duration::from_secs(30), "{:?}", asked.elapsed());
    for probe in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(http.get(s.url(probe)).send().await.expect("send").status(), 200, "{probe} is never shed");
    }
    let metrics = http.get(s.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert!(metrics.contains("http_requests_shed_total{service=\"items\"} 1"), "{metrics}");
    // The held requests' clients give up: their places are given back.
    for h in held {
        h.abort();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let answer = http.get(s.url("/slow?ms=1")).send().await.expect("send");
        if answer.status() == 200 {
            break;
        }
        assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(std::time::Instant::now() < deadline, "places were never given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
