//! Shared by current-store's tests: real page HTML, and a service on port 0.

#![allow(dead_code, missing_debug_implementations)]

use std::net::SocketAddr;

use clap::Parser;
use revstore_current_store::render::RenderBody;
use revstore_current_store::{Args, run};

pub const TOKEN: &str = "current-store-test-token";

/// Revisions of English Wikipedia's "Anarchism" rendered to Parsoid HTML (shared/data).
pub fn anarchism_html() -> Vec<String> {
    revstore_testdata::anarchism_html()
}

pub fn render(html: &str, n: u64) -> RenderBody {
    RenderBody {
        html: html.to_owned(),
        data_parsoid: serde_json::json!({ "counter": n, "ids": { "mwAA": { "dsr": [0, html.len(), 0, 0] } } }),
        section_offsets: serde_json::json!({ "mwAQ": { "html": [0, 10], "wt": [0, 5] } }),
    }
}

pub struct Service {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<()>>,
    pub dir: Option<tempfile::TempDir>,
    /// The Cassandra keyspace to drop when the test ends.
    keyspace: Option<(String, String)>,
}

/// The storage engine a test runs current-store on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Embedded,
    /// The node named by `REVSTORE_TEST_CASSANDRA`, in a keyspace of the test's own.
    Cassandra,
}

/// Starts current-store on `engine` with a fresh data directory or keyspace.
pub async fn start_on(engine: Engine, extra: &[&str]) -> Service {
    match engine {
        Engine::Embedded => start(extra).await,
        Engine::Cassandra => {
            let node =
                std::env::var("REVSTORE_TEST_CASSANDRA").expect("REVSTORE_TEST_CASSANDRA must name the Cassandra node to test against");
            let keyspace = format!("current_store_{}", &uuid_suffix());
            let dir = tempfile::tempdir().expect("tempdir");
            let mut args = vec!["--cassandra", node.as_str(), "--keyspace", keyspace.as_str(), "--migrate-on-start", "true"];
            args.extend_from_slice(extra);
            let mut service = start_in(dir.path(), &args).await;
            service.dir = Some(dir);
            service.keyspace = Some((node.clone(), keyspace));
            service
        }
    }
}

fn uuid_suffix() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0) & 0xffff_ffff_ffff
    )
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
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some((node, keyspace)) = self.keyspace.take() {
            // Drop runs on a runtime thread: drop the keyspace from another one.
            let handle = tokio::runtime::Handle::current();
            std::thread::spawn(move || {
                handle.block_on(async {
                    let engine =
                        revstore_storage::CassandraEngine::connect(revstore_storage::CassandraOptions::new([node], keyspace.clone()))
                            .await
                            .expect("connect");
                    engine
                        .session()
                        .query_unpaged(format!("DROP KEYSPACE IF EXISTS \"{keyspace}\""), ())
                        .await
                        .expect("drop the test keyspace");
                })
            })
            .join()
            .expect("keyspace cleanup");
        }
    }
}

/// Starts current-store on the embedded engine in a fresh directory.
pub async fn start(extra: &[&str]) -> Service {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut service = start_in(dir.path(), extra).await;
    service.dir = Some(dir);
    service
}

/// Starts current-store on the embedded engine in `data_dir`.
pub async fn start_in(data_dir: &std::path::Path, extra: &[&str]) -> Service {
    let mut argv = vec![
        "revstore-current-store",
        "--data-dir",
        data_dir.to_str().expect("utf-8"),
        "--write-tokens",
        TOKEN,
        "--shutdown-delay-secs",
        "0",
    ];
    if !extra.contains(&"--body-limit-bytes") {
        argv.extend_from_slice(&["--body-limit-bytes", "4000000"]);
    }
    argv.extend_from_slice(extra);
    let args = Args::parse_from(argv);
    let settings = args.common.resolve(0).expect("settings");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        run(args, settings, listener, async move {
            let _ = stopped.await;
        })
        .await
        .expect("current-store runs");
    });
    // Ready once the schema is in place (seconds on Cassandra).
    let http = reqwest::Client::new();
    for _ in 0..1200 {
        if http.get(format!("http://{addr}/readyz")).send().await.is_ok_and(|r| r.status() == 200) {
            return Service { addr, stop: Some(stop), done: Some(done), dir: None, keyspace: None };
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("current-store did not become ready");
}
