//! Shared by current-store's tests: real page HTML, and a service on port 0.

#![allow(dead_code, missing_debug_implementations)]

use clap::Parser;
use revstore_current_store::render::RenderBody;
use revstore_current_store::{Args, run};
pub use revstore_testdata::service::{Engine, Service};
use revstore_testdata::service::{StopSignal, spawn_service};

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

fn launch(argv: Vec<String>, listener: tokio::net::TcpListener, stopped: StopSignal) -> tokio::task::JoinHandle<()> {
    let args = Args::parse_from(argv);
    let settings = args.common.resolve(0).expect("settings");
    spawn_service(async move {
        run(args, settings, listener, async move {
            let _ = stopped.await;
        })
        .await
        .expect("current-store runs");
    })
}

/// Starts current-store on `engine` with a fresh data directory or keyspace.
pub async fn start_on(engine: Engine, extra: &[&str]) -> Service {
    revstore_testdata::service::start_on(engine, "revstore-current-store", TOKEN, extra, launch).await
}

/// Starts current-store on the embedded engine in a fresh directory.
pub async fn start(extra: &[&str]) -> Service {
    start_on(Engine::Embedded, extra).await
}

/// Starts current-store on the embedded engine in `data_dir`.
pub async fn start_in(data_dir: &std::path::Path, extra: &[&str]) -> Service {
    revstore_testdata::service::start_in(data_dir, "revstore-current-store", TOKEN, extra, launch).await
}
