//! Shared by old-store's tests: the service on port 0, a bare store, real histories.

#![allow(dead_code, missing_debug_implementations)]

use std::sync::Arc;

use revstore_old_store::OldStore;
use revstore_storage::testing::TestKeyspace;
use revstore_storage::{EmbeddedEngine, EmbeddedOptions, Store};
pub use revstore_test_service::{Engine, Service};

pub const TOKEN: &str = "old-store-test-token";

/// old-store's settings in a test: the test token, the rest as the
/// binary's without flags, until `change` sets what the test needs.
pub type Settings = revstore_test_service::TestSettings<OldStore>;

/// Starts old-store on `engine` with a fresh data directory or keyspace.
pub async fn start_on(engine: Engine, change: impl FnOnce(&mut Settings)) -> Service {
    revstore_test_service::start_on(engine, Settings::new(TOKEN).with(change)).await
}

/// Starts old-store on the embedded engine in `data_dir`.
pub async fn start_in(data_dir: &std::path::Path, change: impl FnOnce(&mut Settings)) -> Service {
    revstore_test_service::start_in(data_dir, Settings::new(TOKEN).with(change)).await
}

/// Keeps a test store's data alive, and removes it when dropped.
pub enum StoreGuard {
    Dir(tempfile::TempDir),
    Keyspace(TestKeyspace),
}

/// A store with the schema in place, for tests below the HTTP API.
pub async fn store_on(engine: Engine) -> (Store, StoreGuard) {
    match engine {
        Engine::Embedded => {
            let dir = tempfile::tempdir().expect("tempdir");
            let engine = EmbeddedEngine::open(dir.path(), EmbeddedOptions::default()).expect("open");
            let store = Store::new(Arc::new(engine));
            store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
            (store, StoreGuard::Dir(dir))
        }
        Engine::Cassandra => {
            let keyspace = TestKeyspace::new("old_store_lib");
            let store = Store::new(Arc::new(keyspace.connect().await));
            store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
            (store, StoreGuard::Keyspace(keyspace))
        }
    }
}
