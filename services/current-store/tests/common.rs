//! Shared by current-store's tests: real page HTML, and a service on port 0.

#![allow(dead_code, missing_debug_implementations)]

use std::sync::Arc;
use std::time::Duration;

use revstore_current_store::RenderBody;
use revstore_current_store::{CurrentStore, Pages};
use revstore_storage::{EmbeddedEngine, EmbeddedOptions, ManualClock, Store};
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

/// A migrated embedded store in `dir` whose clock is `clock`.
pub async fn store_on_clock(dir: &std::path::Path, clock: &ManualClock) -> Store {
    let options = EmbeddedOptions { clock: Arc::new(clock.clone()), ..EmbeddedOptions::default() };
    let store = Store::new(Arc::new(EmbeddedEngine::open(dir, options).expect("open")));
    store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
    store
}

/// current-store's pages over `store`, keeping superseded renders `grace`,
/// handing nothing off.
pub fn pages_keeping(store: Store, grace: Duration) -> Pages {
    Pages { store, grace, clock_skew: Duration::ZERO, hand_off: false, notify_graph: false, remembered: Default::default() }
}

/// The janitor's retention sweep over every page, to the end.
pub async fn run_retention(pages: &Pages) {
    let sweeps = revstore_current_store::janitor::sweeps(pages, None, Duration::from_secs(300), Duration::ZERO);
    let retention = sweeps
        .iter()
        .find(|s| s.task() == revstore_api::janitor::Task::Retention && s.scope() == revstore_api::janitor::Scope::All)
        .expect("a retention sweep");
    let mut at = revstore_service::janitor_admin::SweepPosition::start_of(0);
    while let Some(next) = retention.step(at, 100, false).await.expect("retention step").next {
        at = next;
    }
}
