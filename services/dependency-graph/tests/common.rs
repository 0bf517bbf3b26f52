//! Shared by the dependency graph's tests: the service on port 0, on either
//! engine, optionally preloaded with edges below the HTTP API.

#![allow(dead_code, missing_debug_implementations)]

use std::sync::Arc;

use revstore_dependency_graph::{DependencyGraph, Graph};
use revstore_keys::{Domain, Title, TitleRules};
use revstore_storage::testing::TestKeyspace;
use revstore_storage::{EmbeddedEngine, EmbeddedOptions, Store};
pub use revstore_test_service::{Engine, Service};

pub const TOKEN: &str = "dependency-graph-test-token";
pub const DOMAIN: &str = "en.wikipedia.org";

/// The graph's settings in a test: the test token, the rest as the
/// binary's without flags, until `change` sets what the test needs.
pub type Settings = revstore_test_service::TestSettings<DependencyGraph>;

pub async fn start_on(engine: Engine, change: impl FnOnce(&mut Settings)) -> Service {
    revstore_test_service::start_on(engine, Settings::new(TOKEN).with(change)).await
}

/// A service whose store was loaded by `load` (through [`Graph`], below the
/// HTTP API) before it started. Keep the guard as long as the service.
pub async fn preloaded<F, Fut>(engine: Engine, load: F) -> (Service, Guard)
where
    F: FnOnce(Graph) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir = tempfile::tempdir().expect("tempdir");
    match engine {
        Engine::Embedded => {
            {
                let store = Store::new(Arc::new(EmbeddedEngine::open(dir.path(), EmbeddedOptions::default()).expect("open")));
                store.migrate(&[&revstore_schema::version::DEPENDENCY_GRAPH, &revstore_schema::version::JANITOR]).await.expect("migrate");
                load(Graph::new(store, 10_000)).await;
            }
            let service = revstore_test_service::start_in(dir.path(), Settings::new(TOKEN)).await;
            (service, Guard::Dir(dir))
        }
        Engine::Cassandra => {
            let keyspace = TestKeyspace::new("graph");
            let store = Store::new(Arc::new(keyspace.connect().await));
            store.migrate(&[&revstore_schema::version::DEPENDENCY_GRAPH, &revstore_schema::version::JANITOR]).await.expect("migrate");
            load(Graph::new(store, 10_000)).await;
            let settings = Settings::new(TOKEN).with(|s| {
                s.common.storage.cassandra = vec![keyspace.node().to_owned()];
                s.common.storage.keyspace = keyspace.name().to_owned();
            });
            let service = revstore_test_service::start_in(dir.path(), settings).await;
            (service, Guard::Keyspace(keyspace, dir))
        }
    }
}

/// Keeps a preloaded service's data alive.
pub enum Guard {
    Dir(tempfile::TempDir),
    Keyspace(TestKeyspace, tempfile::TempDir),
}

pub fn domain() -> Domain {
    Domain::parse(DOMAIN).expect("domain")
}

pub fn title(text: &str) -> Title {
    Title::parse(text, TitleRules::default()).expect("title")
}
