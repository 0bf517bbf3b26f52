//! dependency-graph: the page/template DAG as adjacency lists, with push/pull
//! change propagation.
//!
//! When a template changes, the pages that use it must be brought up to
//! date: the important ones at once (push: a consumer lists the dependents
//! above the push threshold), the rest when someone reads them (pull: the
//! page's pull check finds the change). The graph answers both with bounded
//! work per request, and records a change in one write however many pages
//! depend on it. Transitive queries are a non-goal (as in FlockDB): a client
//! that needs them lists the dependents of each dependent in turn.
//!
//! # Layout
//! - `graph`: the tables' use: replacing a dependency set by diff, listings
//!   in both directions, changes and the pull check.
//! - `consistency`: the check of the two directions against each other,
//!   and their repair, a bounded step at a time.
//! - `janitor`: the sweeps it offers the janitor (graph repair, change
//!   retention in `changes.rs`, audit).
//! - `writer`: one writer at a time per page, and the page's write clock.
//! - `error`: what the graph's operations fail with, mapped to HTTP once.
//! - `routes`: the HTTP API.

mod changes;
mod consistency;
mod edge;
mod error;
mod graph;
mod janitor;
mod routes;
#[cfg(feature = "testsuite")]
pub mod testing;
mod writer;

use std::time::Duration;

use revstore_schema::Component;
pub use revstore_service::BoxError;
use revstore_service::{CommonArgs, Context, Platform, Service, ServiceArgs, ServiceDefinition, SettingsError};
use utoipa::OpenApi;

pub use graph::{DependentsQuery, Graph, PAGE_BYTES};

pub const SERVICE: &str = "dependency-graph";
pub const DEFAULT_PORT: u16 = 8083;

/// dependency-graph's own settings, as a value.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The most dependencies one page may have; a larger set is refused (413).
    pub max_edges: usize,
    /// Priorities at or above this are push (re-render at once), below pull.
    pub push_priority: i64,
    /// How long a fragment's change is kept for pull checks.
    pub change_retention: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { max_edges: 10_000, push_priority: 500, change_retention: Duration::from_secs(30 * 86_400) }
    }
}

/// `revstore-dependency-graph`'s command line: the shared settings and its own.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "revstore-dependency-graph",
    version,
    about = "revstore dependency-graph: the page/template DAG with push/pull change propagation"
)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,

    /// The most dependencies one page may have; a larger set is refused (413).
    #[arg(long, env = "REVSTORE_GRAPH_MAX_EDGES", default_value_t = Settings::default().max_edges as u64, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub graph_max_edges: u64,

    /// Priorities at or above this are push (re-render at once), below pull
    /// (re-render when read): what `?push=true|false` selects.
    #[arg(long, env = "REVSTORE_GRAPH_PUSH_PRIORITY", default_value_t = Settings::default().push_priority, value_parser = clap::value_parser!(i64).range(1..=1000))]
    pub graph_push_priority: i64,

    /// Seconds a fragment's change is kept for pull checks; older ones are
    /// removed by the janitor's retention task (edges not updated since are
    /// then taken as stale).
    #[arg(long, env = "REVSTORE_GRAPH_CHANGE_RETENTION_SECS", default_value_t = Settings::default().change_retention.as_secs(), value_parser = clap::value_parser!(u64).range(60..))]
    pub graph_change_retention_secs: u64,
}

impl ServiceArgs for Args {
    type Settings = Settings;

    fn common(&self) -> &CommonArgs {
        &self.common
    }

    fn settings(&self) -> Result<Settings, SettingsError> {
        Ok(Settings {
            max_edges: self.graph_max_edges as usize,
            push_priority: self.graph_push_priority,
            change_retention: Duration::from_secs(self.graph_change_retention_secs),
        })
    }
}

/// dependency-graph, as a kind of service.
#[derive(Debug)]
pub struct DependencyGraph;

impl ServiceDefinition for DependencyGraph {
    type Settings = Settings;
    type Args = Args;
    const NAME: &'static str = SERVICE;
    const DEFAULT_PORT: u16 = DEFAULT_PORT;
    const SCHEMA: &'static Component = &revstore_schema::version::DEPENDENCY_GRAPH;

    async fn build(own: Settings, context: Context) -> Result<Service, BoxError> {
        let Context { store, settings } = context;
        let titles = settings.titles;
        let platform = Platform::new(Self::SCHEMA, store.clone(), settings, routes::ApiDoc::openapi());
        let graph = Graph::new(platform.store().clone(), own.max_edges);
        let sweeps = janitor::sweeps(&graph, own.change_retention);
        let state = routes::AppState { platform: platform.clone(), graph, titles, push_priority: own.push_priority };
        Ok(Service::with_sweeps(platform, routes::routes(state), sweeps))
    }
}
