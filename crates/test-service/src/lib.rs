//! A revstore service started in-process for a test: on port 0, on the
//! embedded engine in a fresh directory or on the Cassandra node named by
//! `REVSTORE_TEST_CASSANDRA` in a keyspace of its own (dropped afterwards).

use std::net::SocketAddr;
use std::path::Path;

use revstore_service::{CommonArgs, Secret, ServiceDefinition, ServiceSettings};
use revstore_storage::testing::TestKeyspace;

/// The storage engine a test runs a service on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Embedded,
    /// The node named by `REVSTORE_TEST_CASSANDRA`, in a keyspace of the test's own.
    Cassandra,
}

/// A running service.
#[derive(Debug)]
pub struct Service {
    pub addr: SocketAddr,
    /// The path templates of the service's own routes, as its router holds them.
    pub route_templates: Vec<String>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<()>>,
    pub dir: Option<tempfile::TempDir>,
    /// The Cassandra keyspace, dropped with the service (also when the test fails).
    keyspace: Option<TestKeyspace>,
    /// The embedded engine's data directory, which [`Service::stop`] waits to be free.
    data_dir: Option<std::path::PathBuf>,
}

/// Waits until `check` holds, asking every 100 ms; fails the test, naming
/// `what`, after `limit`. Tests wait for the state they need this way, never
/// for a fixed time: a slow, busy machine only makes them take longer.
pub async fn eventually(what: &str, limit: std::time::Duration, mut check: impl AsyncFnMut() -> bool) {
    let started = std::time::Instant::now();
    while !check().await {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Starts `command` and kills it with SIGKILL once `midway` holds (a
/// checkpoint kept, a lease taken): the state a crash leaves, reached
/// however long the machine takes to get there. Fails the test if the
/// process ends first or `midway` does not hold within `limit`.
/// [`Midway::kill_9`] delivers the kill, so a test can act on the running
/// process first (a second run against its lease).
pub async fn run_until_midway(
    mut command: std::process::Command,
    what: &str,
    limit: std::time::Duration,
    mut midway: impl AsyncFnMut() -> bool,
) -> Midway {
    let mut child = command.spawn().unwrap_or_else(|e| panic!("{what}: could not start: {e}"));
    let started = std::time::Instant::now();
    while !midway().await {
        if let Some(status) = child.try_wait().expect("wait") {
            panic!("{what}: ended ({status}) before it was midway");
        }
        if started.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: not midway within {limit:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Midway { child: Some(child) }
}

/// A process [`run_until_midway`] started and left running; killed when
/// dropped, so a failing test leaves no process behind.
#[derive(Debug)]
pub struct Midway {
    child: Option<std::process::Child>,
}

impl Midway {
    /// SIGKILL, then reaped: nothing of the process's own shutdown runs.
    pub fn kill_9(mut self) {
        let mut child = self.child.take().expect("not yet killed");
        assert!(child.try_wait().expect("wait").is_none(), "the process ended before it was killed");
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
    }
}

impl Drop for Midway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What a test starts a service of kind `D` with, as values: the settings
/// its binary has without flags, except the test's write token, port 0 of
/// the loopback (the address is read back from the listener), no drain delay
/// and 4 MB bodies. A test sets the fields it needs: `common`, every
/// service's; `own`, the service's.
pub struct TestSettings<D: ServiceDefinition> {
    pub common: CommonArgs,
    pub own: D::Settings,
}

impl<D: ServiceDefinition> std::fmt::Debug for TestSettings<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestSettings").field("common", &self.common).field("own", &self.own).finish()
    }
}

impl<D: ServiceDefinition> TestSettings<D> {
    pub fn new(token: &str) -> Self {
        TestSettings {
            common: CommonArgs {
                listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
                write_tokens: vec![Secret::new(token)],
                shutdown_delay_secs: 0,
                body_limit_bytes: 4_000_000,
                ..CommonArgs::default()
            },
            own: D::Settings::default(),
        }
    }

    /// These settings, changed by `change`.
    pub fn with(mut self, change: impl FnOnce(&mut Self)) -> Self {
        change(&mut self);
        self
    }

    fn resolved(self) -> (ServiceSettings, D::Settings) {
        let common = self.common.resolve(D::DEFAULT_PORT).unwrap_or_else(|e| panic!("revstore-{}: {e}", D::NAME));
        (common, self.own)
    }
}

/// Starts a service of kind `D` on `engine` with a fresh data directory or keyspace.
pub async fn start_on<D: ServiceDefinition>(engine: Engine, mut settings: TestSettings<D>) -> Service {
    let dir = tempfile::tempdir().expect("tempdir");
    let keyspace = match engine {
        Engine::Embedded => None,
        Engine::Cassandra => {
            let keyspace = TestKeyspace::new(D::NAME);
            settings.common.storage.cassandra = vec![keyspace.node().to_owned()];
            settings.common.storage.keyspace = keyspace.name().to_owned();
            settings.common.migrate_on_start = Some(true);
            Some(keyspace)
        }
    };
    let mut service = start_in::<D>(dir.path(), settings).await;
    service.dir = Some(dir);
    service.keyspace = keyspace;
    service
}

/// Starts a service of kind `D` on the embedded engine in `data_dir` (or on
/// the Cassandra its settings name), and waits until it is ready.
pub async fn start_in<D: ServiceDefinition>(data_dir: &Path, mut settings: TestSettings<D>) -> Service {
    settings.common.storage.data_dir = data_dir.to_owned();
    let embedded = settings.common.storage.cassandra.is_empty();
    let (common, own) = settings.resolved();
    let started = revstore_service::start::<D>(common, own).await;
    let mut service = serve_until_ready::<D>(started).await;
    if embedded {
        service.data_dir = Some(data_dir.to_owned());
    }
    service
}

/// Starts a service of kind `D` on a store the test opened (an embedded
/// engine on an injected clock, say), migrated by the caller.
pub async fn start_with_store<D: ServiceDefinition>(store: revstore_storage::Store, settings: TestSettings<D>) -> Service {
    let (common, own) = settings.resolved();
    let started = revstore_service::start_on_store::<D>(common, own, store).await;
    serve_until_ready::<D>(started).await
}

async fn serve_until_ready<D: ServiceDefinition>(
    started: Result<(revstore_service::Service, tokio::net::TcpListener), revstore_service::StartError>,
) -> Service {
    let program = format!("revstore-{}", D::NAME);
    let (built, listener) = started.unwrap_or_else(|e| panic!("{program} does not start: {e}"));
    let route_templates = built.route_templates().to_vec();
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        built
            .serve(listener, async move {
                let _ = stopped.await;
            })
            .await
            .expect("the service runs")
    });
    // Ready once the schema is in place (seconds on Cassandra).
    let http = reqwest::Client::new();
    for _ in 0..1200 {
        if http.get(format!("http://{addr}/readyz")).send().await.is_ok_and(|r| r.status() == 200) {
            return Service { addr, route_templates, stop: Some(stop), done: Some(done), dir: None, keyspace: None, data_dir: None };
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{program} did not become ready");
}

impl Service {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops the service and waits until it has shut down (the data directory is free again).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            done.await.expect("service task");
        }
        // The serve task has ended, but the store closes (and frees its
        // directory's lock) when its last holder is dropped, which a
        // background task finishing its step may still be: wait for that.
        if let Some(dir) = &self.data_dir {
            let lock = dir.join("LOCK");
            for _ in 0..1200 {
                let free = std::fs::File::open(&lock).is_ok_and(|f| f.try_lock().is_ok());
                if free {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            panic!("the service stopped, but its store in {} was still open 60 s later", dir.display());
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Sends every operation of the service's OpenAPI document a set of ordinary
/// and hostile requests: without a token, with a malformed domain, revision
/// or tid, an unknown part, a body that is not JSON, JSON of the wrong shape,
/// a body over `body_limit` bytes, a `Content-Encoding`. Returns each answer
/// whose status the document does not list for that operation, as
/// `"METHOD /path: status (request)"`; empty when the document is complete.
pub async fn undocumented_answers(service: &Service, token: &str, body_limit: usize) -> Vec<String> {
    let http = reqwest::Client::new();
    let doc: serde_json::Value = http.get(service.url("/openapi.json")).send().await.expect("openapi").json().await.expect("openapi json");
    let mut missing = Vec::new();
    let paths = doc["paths"].as_object().expect("paths");
    for (template, item) in paths {
        for (method, operation) in item.as_object().expect("path item") {
            let Ok(method) = reqwest::Method::from_bytes(method.to_ascii_uppercase().as_bytes()) else { continue };
            let takes_body = operation.get("requestBody").is_some();
            let documented = |status: u16| operation["responses"].get(status.to_string()).is_some();
            let tid = revstore_keys::Tid::now().to_string();
            let fill = |overrides: &[(&str, &str)]| fill_path(template, overrides, &tid);
            let body = r#"{"html":"<p>probe</p>","data-parsoid":{},"section-offsets":{}}"#;
            let mut requests: Vec<(&str, reqwest::RequestBuilder)> = vec![
                ("no token", http.request(method.clone(), service.url(&fill(&[])))),
                ("ordinary", http.request(method.clone(), service.url(&fill(&[]))).bearer_auth(token)),
                ("wrong token", http.request(method.clone(), service.url(&fill(&[]))).bearer_auth("not-a-token-of-this-service")),
                ("bad domain", http.request(method.clone(), service.url(&fill(&[("domain", "bad_domain!")]))).bearer_auth(token)),
                ("bad revision", http.request(method.clone(), service.url(&fill(&[("rev", "0")]))).bearer_auth(token)),
                ("bad tid", http.request(method.clone(), service.url(&fill(&[("tid", "not-a-tid")]))).bearer_auth(token)),
                ("unknown part", http.request(method.clone(), service.url(&fill(&[("part", "xml")]))).bearer_auth(token)),
                ("encoded", http.request(method.clone(), service.url(&fill(&[]))).bearer_auth(token).header("content-encoding", "gzip")),
                ("bad query", http.request(method.clone(), service.url(&format!("{}?limit=-1&cursor=%FF", fill(&[])))).bearer_auth(token)),
            ];
            if takes_body {
                let json = |b: reqwest::RequestBuilder| b.bearer_auth(token).header("content-type", "application/json");
                requests.push(("not JSON", json(http.request(method.clone(), service.url(&fill(&[])))).body("{not json")));
                requests.push(("wrong shape", json(http.request(method.clone(), service.url(&fill(&[])))).body(r#"{"unknown":1}"#)));
                requests.push((
                    "too large",
                    json(http.request(method.clone(), service.url(&fill(&[])))).body(format!(r#"{{"html":"{}"}}"#, "x".repeat(body_limit))),
                ));
                requests.push(("a render", json(http.request(method.clone(), service.url(&fill(&[])))).body(body)));
            }
            for (what, request) in requests {
                let Ok(answer) = request.send().await else { continue };
                let status = answer.status().as_u16();
                if !documented(status) {
                    missing.push(format!("{method} {template}: {status} ({what})"));
                }
            }
        }
    }
    missing
}

/// A token of the accepted shape that no service is given.
const WRONG_TOKEN: &str = "wrong-token-0123456789abcdef";

/// The documented operations that must be guarded — every write (PUT, POST,
/// DELETE, PATCH), everything under `/admin`, and any read the document says
/// needs a token — each tried without a token (it must answer 401) and with a
/// wrong one (403), and checked to say so in the document (`security`).
/// Returns how many were checked and each failure, as `"METHOD /path: …"`.
/// With [`assert_router_matches_openapi`] (the document lists every route),
/// this covers every route of the router.
pub async fn unguarded_operations(service: &Service) -> (usize, Vec<String>) {
    let http = reqwest::Client::new();
    let doc: serde_json::Value = http.get(service.url("/openapi.json")).send().await.expect("openapi").json().await.expect("openapi json");
    let tid = revstore_keys::Tid::now().to_string();
    let (mut checked, mut failures) = (0, Vec::new());
    for (template, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("path item") {
            let Ok(method) = reqwest::Method::from_bytes(method.to_ascii_uppercase().as_bytes()) else { continue };
            let documented_guard = operation["security"].as_array().is_some_and(|s| !s.is_empty());
            if method == reqwest::Method::GET && !template.starts_with("/admin") && !documented_guard {
                continue;
            }
            checked += 1;
            if !documented_guard {
                failures.push(format!("{method} {template}: the document does not say it needs a token"));
            }
            let url = service.url(&fill_path(template, &[], &tid));
            for (what, token, expected) in [("no token", None, 401), ("a wrong token", Some(WRONG_TOKEN), 403)] {
                let mut request = http.request(method.clone(), &url);
                if let Some(token) = token {
                    request = request.bearer_auth(token);
                }
                match request.send().await {
                    Ok(answer) if answer.status().as_u16() == expected => {}
                    Ok(answer) => failures.push(format!("{method} {template}: {} with {what}, not {expected}", answer.status().as_u16())),
                    Err(e) => failures.push(format!("{method} {template}: no answer with {what}: {e}")),
                }
            }
        }
    }
    (checked, failures)
}

/// Fails the test unless every operation that must be guarded is (see
/// [`unguarded_operations`]), and at least `at_least` were checked.
pub async fn assert_every_write_and_admin_route_is_guarded(service: &Service, at_least: usize) {
    let (checked, failures) = unguarded_operations(service).await;
    assert!(failures.is_empty(), "unguarded operations:\n{}", failures.join("\n"));
    assert!(checked >= at_least, "only {checked} guarded operations found, expected at least {at_least}");
}

/// The methods the contract check tries on every route.
const METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "PATCH"];

/// A path template's segments: `None` for a parameter.
fn segments(template: &str) -> Vec<Option<&str>> {
    template.trim_start_matches('/').split('/').map(|s| if s.starts_with('{') && s.ends_with('}') { None } else { Some(s) }).collect()
}

/// The route template the router picks for a concrete path (static segments
/// win over parameters, segment by segment, as axum's matcher does).
fn matching_template<'a>(templates: &'a [String], path: &str) -> Option<&'a str> {
    let wanted: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    templates
        .iter()
        .filter(|t| {
            let segs = segments(t);
            segs.len() == wanted.len() && segs.iter().zip(&wanted).all(|(s, w)| s.is_none_or(|s| s == *w))
        })
        // Most specific first: compare static-ness segment by segment.
        .max_by_key(|t| segments(t).iter().map(|s| s.is_some()).collect::<Vec<bool>>())
        .map(String::as_str)
}

/// Whether a documented path segment (static, or a parameter) describes a
/// request's segment: revisions and tids must parse as such.
fn describes(documented: &str, segment: &str) -> bool {
    match documented.strip_prefix('{').and_then(|d| d.strip_suffix('}')) {
        Some("rev") => segment.parse::<u64>().is_ok(),
        Some("tid" | "id") => segment.parse::<revstore_keys::Tid>().is_ok(),
        Some(_) => true,
        None => documented == segment,
    }
}

/// A documented path with its parameters filled with values that parse.
fn fill_path(template: &str, overrides: &[(&str, &str)], tid: &str) -> String {
    let mut path = template.to_owned();
    for (name, value) in [
        ("domain", "en.wikipedia.org"),
        ("title", "Probe_page"),
        ("child", "Probe_page"),
        ("parent", "Template:Probe"),
        ("rev", "1"),
        ("tid", tid),
        ("part", "html"),
        ("shard", "0"),
        ("id", tid),
    ] {
        let value = overrides.iter().find(|(n, _)| *n == name).map_or(value, |(_, v)| *v);
        path = path.replace(&format!("{{{name}}}"), value);
    }
    path
}

/// Where the live router and the service's OpenAPI document disagree, as
/// sentences; empty when they agree:
/// - a documented operation whose path no route serves, or which its route
///   answers 405;
/// - a route that no documented path reaches;
/// - a method a route accepts (anything but 405) that no documented
///   operation whose path describes the route's requests names.
///
/// The ops routes (`/healthz`, `/readyz`, `/metrics`, `/openapi.json`) are
/// the platform's, and are not in the service's templates.
pub async fn contract_drift(service: &Service, token: &str) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet};
    let http = reqwest::Client::new();
    let doc: serde_json::Value = http.get(service.url("/openapi.json")).send().await.expect("openapi").json().await.expect("openapi json");
    let paths = doc["paths"].as_object().expect("paths");
    let tid = revstore_keys::Tid::now().to_string();
    let templates = &service.route_templates;
    let mut drift = BTreeSet::new();
    // Titles that are also static segments of some route (a page named
    // `title` is written through the route of `/page/title/…`).
    let titles: BTreeSet<&str> =
        std::iter::once("Probe_page").chain(templates.iter().flat_map(|t| segments(t)).flatten().filter(|s| !s.is_empty())).collect();
    // Each route: the requests the document describes that reach it.
    let mut reached: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for documented in paths.keys() {
        for title in &titles {
            let concrete = fill_path(documented, &[("title", title)], &tid);
            match matching_template(templates, &concrete) {
                Some(template) => {
                    reached.entry(template).or_default().insert(concrete);
                }
                None if *title == "Probe_page" => {
                    drift.insert(format!("documented {documented} is served by no route"));
                }
                None => {}
            }
        }
    }
    for template in templates {
        let Some(requests) = reached.get(template.as_str()) else {
            drift.insert(format!("route {template} is not documented"));
            continue;
        };
        // The methods of every documented operation that describes one of
        // the route's requests.
        let mut documented = BTreeSet::new();
        for concrete in requests {
            let segments: Vec<&str> = concrete.trim_start_matches('/').split('/').collect();
            for (path, item) in paths {
                let doc_segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
                if doc_segments.len() == segments.len() && doc_segments.iter().zip(&segments).all(|(d, c)| describes(d, c)) {
                    documented.extend(item.as_object().expect("path item").keys().map(|m| m.to_ascii_uppercase()));
                }
            }
        }
        // Methods are routed by template: one request per method tells.
        let concrete = requests.first().expect("reached by a request");
        for method in METHODS {
            let request = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
            let answer = http.request(request, service.url(concrete)).bearer_auth(token).send().await.expect("request");
            match (answer.status() != 405, documented.contains(method)) {
                (true, false) => drift.insert(format!("route {template} accepts {method}, which is not documented")),
                (false, true) => drift.insert(format!("route {template} is documented to take {method} but answers it 405")),
                _ => false,
            };
        }
    }
    drift.into_iter().collect()
}

/// Fails the test when the live router and the service's OpenAPI document
/// disagree (see [`contract_drift`]).
pub async fn assert_router_matches_openapi(service: &Service, token: &str) {
    assert!(!service.route_templates.is_empty(), "the service has no routes");
    let drift = contract_drift(service, token).await;
    assert!(drift.is_empty(), "the router and the OpenAPI document disagree:\n{}", drift.join("\n"));
}

/// Runs each named async test case (`async fn case(engine: Engine)`) on each
/// engine: `embedded::case` always, `cassandra::case` when run with `--ignored`
/// against `REVSTORE_TEST_CASSANDRA` (scripts/test does).
/// A whole dump answer (`/dump/current`, `/dump/history`) read as a client
/// reads it: a 200 of NDJSON, its lines, then its end line (`done`).
pub async fn read_dump(url: &str) -> (Vec<serde_json::Value>, serde_json::Value) {
    let answer = reqwest::get(url).await.expect("send");
    assert_eq!(answer.status(), 200, "{url}");
    assert_eq!(answer.headers()["content-type"], "application/x-ndjson");
    let text = answer.text().await.expect("body");
    let mut lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    let end = lines.pop().expect("an end line");
    assert!(end.get("done").is_some(), "the stream ends with its end line: {end}");
    (lines, end)
}

#[macro_export]
macro_rules! on_both_engines {
    ($($case:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case($crate::Engine::Embedded).await
                }
            )*
        }
        mod cassandra {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs Cassandra: run scripts/test, or set REVSTORE_TEST_CASSANDRA and pass --ignored"]
                async fn $case() {
                    super::$case($crate::Engine::Cassandra).await
                }
            )*
        }
    };
}
