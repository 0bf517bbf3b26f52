//! Shared by current-store's tests: real page HTML, and a service on port 0.

#![allow(dead_code, missing_debug_implementations)]

use revstore_current_store::CurrentStore;
use revstore_current_store::RenderBody;
pub use revstore_test_service::{Engine, Service};

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

/// Starts current-store on `engine` with a fresh data directory or keyspace.
pub async fn start_on(engine: Engine, extra: &[&str]) -> Service {
    revstore_test_service::start_on::<CurrentStore>(engine, TOKEN, extra).await
}

/// Starts current-store on the embedded engine in a fresh directory.
pub async fn start(extra: &[&str]) -> Service {
    start_on(Engine::Embedded, extra).await
}

/// Starts current-store on the embedded engine in `data_dir`.
pub async fn start_in(data_dir: &std::path::Path, extra: &[&str]) -> Service {
    revstore_test_service::start_in::<CurrentStore>(data_dir, TOKEN, extra).await
}
