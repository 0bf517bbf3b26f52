//! Shared by current-store's tests: real page HTML, and a service on port 0.

#![allow(dead_code, missing_debug_implementations)]

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use revstore_current_store::render::RenderBody;
use revstore_current_store::{Args, run};

pub const TOKEN: &str = "current-store-test-token";

/// Revisions of English Wikipedia's "Anarchism" rendered to Parsoid HTML (shared/data).
pub fn anarchism_html() -> Vec<String> {
    let root = std::env::var_os("REVSTORE_SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data"));
    let dir = root.join("histories/enwiki_Anarchism.html");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e} (set REVSTORE_SHARED_DATA)", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "html"))
        .collect();
    files.sort();
    files.iter().map(|f| std::fs::read_to_string(f).expect("html")).collect()
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
    // Ready once the schema is in place.
    let http = reqwest::Client::new();
    for _ in 0..100 {
        if http.get(format!("http://{addr}/readyz")).send().await.is_ok_and(|r| r.status() == 200) {
            return Service { addr, stop: Some(stop), done: Some(done), dir: None };
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("current-store did not become ready");
}
