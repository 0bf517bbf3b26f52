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

/// current-store's settings in a test: the test token, the rest as the
/// binary's without flags, until `change` sets what the test needs.
pub type Settings = revstore_test_service::TestSettings<CurrentStore>;

/// Starts current-store on `engine` with a fresh data directory or keyspace.
pub async fn start_on(engine: Engine, change: impl FnOnce(&mut Settings)) -> Service {
    revstore_test_service::start_on(engine, Settings::new(TOKEN).with(change)).await
}

/// Starts current-store on the embedded engine in a fresh directory.
pub async fn start(change: impl FnOnce(&mut Settings)) -> Service {
    start_on(Engine::Embedded, change).await
}

/// Starts current-store on the embedded engine in `data_dir`.
pub async fn start_in(data_dir: &std::path::Path, change: impl FnOnce(&mut Settings)) -> Service {
    revstore_test_service::start_in(data_dir, Settings::new(TOKEN).with(change)).await
}
