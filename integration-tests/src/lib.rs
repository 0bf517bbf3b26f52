//! The whole system as it is deployed: current-store, old-store and
//! dependency-graph each started from its own binary as a process on a free
//! port, wired to each other by URL, on the embedded engine (a data directory
//! each) or on the Cassandra node named by `REVSTORE_TEST_CASSANDRA` (a
//! keyspace each, dropped afterwards); the janitor run as its binary, to
//! completion, as the CronJob runs it; an OTLP/HTTP receiver to collect the
//! services' spans.
//!
//! The binaries are the workspace's own, found beside the test executable in
//! the target directory: build them first (`cargo build --workspace --bins`;
//! `scripts/test` does). Each service's output goes to `<name>.log` in the
//! system's directory; a failing test prints the end of every log.

pub mod clock_shift;
pub mod contract;
pub mod history_check;
pub mod linearizable;
pub mod soak_targets;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use revstore_storage::testing::TestKeyspace;

pub mod loadgen;

/// The storage engine the services run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Embedded,
    /// The node named by `REVSTORE_TEST_CASSANDRA`.
    Cassandra,
}

/// Settings of a system under test.
#[derive(Debug, Clone)]
pub struct Options {
    /// current-store's `--grace-ttl`.
    pub grace_ttl_secs: u64,
    /// current-store's `--clock-skew`: how far apart the services' clocks may be (a test puts them on shifted clocks with `clock_shift`).
    pub clock_skew_secs: u64,
    /// Where the services export spans (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub otlp_endpoint: Option<String>,
    /// More environment for every service (`REVSTORE_MAX_IN_FLIGHT`, say).
    pub env: Vec<(String, String)>,
    /// The CPUs every service runs on (`taskset -c` syntax, e.g. `1`), as a
    /// pod limited to them would; all when `None`.
    pub cpus: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options { grace_ttl_secs: 86_400, clock_skew_secs: 0, otlp_endpoint: None, env: Vec::new(), cpus: None }
    }
}

/// A binary of the workspace, as the target directory holds it, or as the
/// directory named by `REVSTORE_TEST_BINARIES` does (another build's, to
/// compare two side by side).
pub fn binary(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("REVSTORE_TEST_BINARIES") {
        let path = Path::new(&dir).join(name);
        assert!(path.is_file(), "{} is not in REVSTORE_TEST_BINARIES", path.display());
        return path;
    }
    let test_executable = std::env::current_exe().expect("the test executable's path");
    // target/<profile>/deps/<test>: the binaries are in target/<profile>.
    let profile_dir = test_executable.parent().and_then(Path::parent).expect("a target directory");
    let path = profile_dir.join(name);
    assert!(path.is_file(), "{} is not built: run `cargo build --workspace --bins` first (scripts/test does)", path.display());
    path
}

/// A token no other test run shares.
fn uuid_like() -> String {
    format!("{:x}{:x}", std::process::id(), std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()))
}

/// One service binary, started and stopped as a process; its data and port
/// stay the same across restarts (the first start takes a free port, and
/// later ones ask for it again).
#[derive(Debug)]
pub struct ServiceProcess {
    /// `current-store`, `old-store` or `dependency-graph`.
    pub name: &'static str,
    /// 0 until the first start has bound a port.
    pub port: u16,
    /// The Cassandra keyspace it uses (none on the embedded engine).
    pub keyspace: Option<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    cpus: Option<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl ServiceProcess {
    pub fn url(&self, path: &str) -> String {
        assert_ne!(self.port, 0, "{} has no port before its first start", self.name);
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The process's id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts the process and waits until it is ready (`/readyz` 200).
    pub async fn start(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("the service's log file");
        let binary = binary(&format!("revstore-{}", self.name));
        let mut command = match &self.cpus {
            Some(cpus) => {
                let mut pinned = Command::new("taskset");
                pinned.args(["-c", cpus]).arg(&binary);
                pinned
            }
            None => Command::new(&binary),
        };
        let listen = SocketAddr::from(([127, 0, 0, 1], self.port)).to_string();
        let child = command
            .args(&self.args)
            .args(["--listen", &listen])
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env_remove("REVSTORE_WRITE_TOKENS")
            .env_remove("REVSTORE_CASSANDRA")
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.name));
        self.child = Some(child);
        let started = Instant::now();
        while self.port == 0 {
            match revstore_bench::listening_address(&std::fs::read_to_string(&self.log).unwrap_or_default(), self.name) {
                Some(address) => self.port = address.port(),
                None => {
                    if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                        panic!("{} exited before it listened ({status}):\n{}", self.name, tail(&self.log));
                    }
                    assert!(started.elapsed() < Duration::from_secs(60), "{} not listening within 60 s:\n{}", self.name, tail(&self.log));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        let ready = self.url("/readyz");
        let http = reqwest::Client::new();
        loop {
            if http.get(&ready).send().await.is_ok_and(|r| r.status() == 200) {
                return;
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("{} exited before it was ready ({status}):\n{}", self.name, tail(&self.log));
            }
            // Cassandra schema creation takes tens of seconds on a fresh keyspace.
            assert!(started.elapsed() < Duration::from_secs(180), "{} not ready within 180 s:\n{}", self.name, tail(&self.log));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM, then waits for the exit, which must be clean (status 0).
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let terminated = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
        assert!(terminated.success(), "cannot signal {}", self.name);
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "{} did not stop within 60 s of SIGTERM", self.name);
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(status.success(), "{} stopped with {status}:\n{}", self.name, tail(&self.log));
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- the end of {}'s log ---\n{}", self.name, tail(&self.log));
        }
    }
}

/// The last lines of a log file.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// One site of a two-datacenter cluster (`deploy/cassandra/cassandra-sites`).
#[derive(Debug, Clone)]
pub struct Site {
    /// Its nodes, `address:port` comma-separated.
    pub contact_points: String,
    /// Its datacenter's name, as the nodes gossip it.
    pub datacenter: String,
}

/// The three services of one system, wired to each other.
#[derive(Debug)]
pub struct System {
    pub engine: Engine,
    pub token: String,
    pub current: ServiceProcess,
    pub old: ServiceProcess,
    pub graph: ServiceProcess,
    pub http: reqwest::Client,
    token_file: PathBuf,
    // Dropped after the processes (fields drop in order): the keyspaces and
    // the directory outlive the services that use them. Two sites share one
    // set of keyspaces, dropped with the last of the two systems: a keyspace
    // dropped while the other site's services still write to it can leave a
    // node's schema half-dropped (see `hints_delivered`).
    _keyspaces: Arc<Vec<TestKeyspace>>,
    dir: tempfile::TempDir,
}

impl System {
    /// Starts old-store, the graph and current-store (in that order: each
    /// one's peers first), each ready before the next.
    pub async fn start(engine: Engine, options: Options) -> System {
        System::start_with(engine, options, None).await
    }

    /// The whole system in each of two sites of one Cassandra cluster: each
    /// site's services bound to its own datacenter and nodes (LOCAL_QUORUM
    /// there), both on the same keyspaces, which the first site creates and
    /// the last of the two to be dropped drops, once both sites' services
    /// have stopped. `REVSTORE_CASSANDRA_REPLICATION` names both datacenters.
    pub async fn start_in_sites(options: [Options; 2], first: &Site, second: &Site) -> (System, System) {
        let [first_options, second_options] = options;
        let one = System::start_with(Engine::Cassandra, first_options, Some((first, None))).await;
        let two = System::start_with(Engine::Cassandra, second_options, Some((second, Some(&one)))).await;
        (one, two)
    }

    /// `site`: the site's nodes and datacenter, and the system whose
    /// keyspaces it shares (none: keyspaces of its own).
    async fn start_with(engine: Engine, options: Options, site: Option<(&Site, Option<&System>)>) -> System {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = format!("integration-{}", uuid_like());
        let token_file = dir.path().join("write-token");
        std::fs::write(&token_file, format!("{token}\n")).expect("token file");
        let mut keyspaces = Vec::new();
        // A Cassandra that wants TLS or a login (scripts/test's TLS stage): the
        // services are given them as an operator would.
        let access = revstore_storage::testing::TestAccess::from_env();
        let mut cassandra_access: Vec<String> = Vec::new();
        if let Some(ca) = &access.tls_ca_file {
            cassandra_access.extend(["--cassandra-tls-ca-file".into(), ca.display().to_string()]);
        }
        if let Some((cert, key)) = &access.tls_client {
            cassandra_access.extend([
                "--cassandra-tls-cert-file".into(),
                cert.display().to_string(),
                "--cassandra-tls-key-file".into(),
                key.display().to_string(),
            ]);
        }
        if let Some((user, password)) = &access.credentials {
            let password_file = dir.path().join("cassandra-password");
            std::fs::write(&password_file, password).expect("password file");
            cassandra_access.extend([
                "--cassandra-username".into(),
                user.clone(),
                "--cassandra-password-file".into(),
                password_file.display().to_string(),
            ]);
        }
        let mut service = |name: &'static str, extra: Vec<String>| {
            let mut args: Vec<String> = vec![
                "--data-dir".into(),
                dir.path().join(name).display().to_string(),
                "--write-tokens-file".into(),
                token_file.display().to_string(),
                "--migrate-on-start".into(),
                "true".into(),
                "--shutdown-delay-secs".into(),
                "0".into(),
            ];
            let mut keyspace_name = None;
            if engine == Engine::Cassandra {
                let shared = site.and_then(|(_, shared)| shared).map(|other| other.service(name).keyspace.clone().expect("a keyspace"));
                let name = match shared {
                    Some(name) => name,
                    None => {
                        let keyspace = TestKeyspace::new(&format!("it_{}", name.replace('-', "_")));
                        let name = keyspace.name().to_owned();
                        keyspaces.push(keyspace);
                        name
                    }
                };
                let nodes = match site {
                    Some((site, _)) => site.contact_points.clone(),
                    None => keyspaces.last().expect("a keyspace").node().to_owned(),
                };
                args.extend(["--cassandra".into(), nodes, "--keyspace".into(), name.clone()]);
                if let Some((site, _)) = site {
                    args.extend(["--cassandra-datacenter".into(), site.datacenter.clone()]);
                }
                args.extend(cassandra_access.iter().cloned());
                keyspace_name = Some(name);
            }
            args.extend(extra);
            let mut env = vec![("RUST_LOG".to_owned(), revstore_bench::SERVICE_LOG_FILTER.to_owned())];
            if let Some(endpoint) = &options.otlp_endpoint {
                env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), endpoint.clone()));
                // Spans leave within a fifth of a second instead of five.
                env.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "200".into()));
            }
            env.extend(options.env.iter().cloned());
            ServiceProcess {
                name,
                port: 0,
                keyspace: keyspace_name,
                args,
                env,
                cpus: options.cpus.clone(),
                log: dir.path().join(format!("{name}.log")),
                child: None,
            }
        };
        let mut old = service("old-store", vec![]);
        let mut graph = service("dependency-graph", vec![]);
        // Each one's peers first: current-store is given their addresses.
        old.start().await;
        graph.start().await;
        let current_extra = vec![
            "--old-store-url".into(),
            old.url(""),
            "--graph-url".into(),
            graph.url(""),
            "--notify-graph".into(),
            "--peer-token-file".into(),
            token_file.display().to_string(),
            "--grace-ttl".into(),
            options.grace_ttl_secs.to_string(),
            "--clock-skew".into(),
            options.clock_skew_secs.to_string(),
        ];
        let mut current = service("current-store", current_extra);
        current.start().await;
        let keyspaces = match site.and_then(|(_, shared)| shared) {
            Some(other) => other._keyspaces.clone(),
            None => Arc::new(keyspaces),
        };
        System { engine, token, current, old, graph, http: reqwest::Client::new(), token_file, _keyspaces: keyspaces, dir }
    }

    /// One of the three services, by name.
    pub fn service(&self, name: &str) -> &ServiceProcess {
        match name {
            "current-store" => &self.current,
            "old-store" => &self.old,
            "dependency-graph" => &self.graph,
            other => panic!("no service {other:?}"),
        }
    }

    /// Another current-store instance beside the first, sharing its storage
    /// and peers (Cassandra: its keyspace), on a port and data directory of
    /// its own, with `env` added to its environment (a clock offset, say);
    /// not started.
    pub fn another_current_store(&self, label: &str, env: &[(&str, &str)]) -> ServiceProcess {
        let data_dir = self.dir.path().join(format!("current-store-{label}"));
        let mut args = self.current.args.clone();
        let at = args.iter().position(|a| a == "--data-dir").expect("the first instance's flag") + 1;
        args[at] = data_dir.display().to_string();
        let mut process_env = self.current.env.clone();
        process_env.extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        ServiceProcess {
            name: "current-store",
            port: 0,
            keyspace: self.current.keyspace.clone(),
            args,
            env: process_env,
            cpus: self.current.cpus.clone(),
            log: self.dir.path().join(format!("current-store-{label}.log")),
            child: None,
        }
    }

    /// Runs the janitor binary to completion against the three services and
    /// returns its exit and output (the last stdout line is its JSON summary).
    pub fn janitor(&self, extra: &[&str]) -> Output {
        Command::new(binary("revstore-janitor"))
            .args(["--current-store-url", &self.current.url(""), "--old-store-url", &self.old.url(""), "--graph-url", &self.graph.url("")])
            .args(["--peer-token-file", &self.token_file.display().to_string()])
            .args(extra)
            .env("RUST_LOG", "warn")
            .env_remove("REVSTORE_CASSANDRA")
            .output()
            .expect("run revstore-janitor")
    }

    /// The directory holding the services' data and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

pub use revstore_test_service::eventually;

/// Waits (up to five minutes) until no node holds a hint for another, as
/// `nodetool listpendinghints` reports it; `nodetool` runs one command (each
/// entry: the program and the arguments that come before nodetool's own).
///
/// A test that restarted nodes waits for this before its keyspaces are
/// dropped: Cassandra 5.0 can fail a DROP KEYSPACE on a node that is
/// replaying hints into the keyspace's tables ("Unknown CF" while recycling
/// the commit log), which leaves that node's schema half-dropped, and every
/// later schema change in the cluster then times out waiting for agreement.
pub async fn hints_delivered(nodetools: &[Vec<String>]) {
    let nodetools = nodetools.to_vec();
    eventually("every hint delivered", Duration::from_secs(300), || {
        let nodetools = nodetools.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                nodetools.iter().all(|command| {
                    Command::new(&command[0]).args(&command[1..]).arg("listpendinghints").output().is_ok_and(|out| {
                        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("does not have any pending hints")
                    })
                })
            })
            .await
            .unwrap_or(false)
        }
    })
    .await;
}

/// One span as a service exported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedSpan {
    /// The exporting process's `service.name`.
    pub service: String,
    /// Hex, as in `traceparent`.
    pub trace_id: String,
    pub name: String,
}

/// An OTLP/HTTP trace receiver (`POST /v1/traces`, protobuf), keeping every
/// span it is sent.
#[derive(Debug)]
pub struct OtlpReceiver {
    pub endpoint: String,
    spans: Arc<Mutex<Vec<ExportedSpan>>>,
    server: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    pub async fn start() -> OtlpReceiver {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message;

        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let kept = kept.clone();
                async move {
                    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                        return axum::http::StatusCode::BAD_REQUEST;
                    };
                    let mut kept = kept.lock().expect("spans");
                    for resource in request.resource_spans {
                        let service = resource
                            .resource
                            .iter()
                            .flat_map(|r| &r.attributes)
                            .find(|a| a.key == "service.name")
                            .and_then(|a| a.value.as_ref())
                            .and_then(|v| match &v.value {
                                Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => Some(s.clone()),
                                _ => None,
                            })
                            .unwrap_or_default();
                        for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                            let trace_id = span.trace_id.iter().map(|b| format!("{b:02x}")).collect();
                            kept.push(ExportedSpan { service: service.clone(), trace_id, name: span.name });
                        }
                    }
                    axum::http::StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("address"));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        OtlpReceiver { endpoint, spans, server }
    }

    /// The spans received so far.
    pub fn spans(&self) -> Vec<ExportedSpan> {
        self.spans.lock().expect("spans").clone()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}
