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
#[cfg(test)]
mod replace_races;
mod routes;
#[cfg(feature = "testsuite")]
pub mod testing;
mod writer;

use std::time::Duration;

use clap::builder::TypedValueParser as _;
use revstore_schema::Component;
pub use revstore_service::BoxError;
use revstore_service::settings::seconds;
use revstore_service::{Context, Platform, Service, ServiceDefinition};
use utoipa::OpenApi;

pub use graph::{DependentsQuery, Graph, PAGE_BYTES};

pub const SERVICE: &str = "dependency-graph";
pub const DEFAULT_PORT: u16 = 8083;

/// dependency-graph's own settings: its flags (beside those every service
/// has), and the value `revstore up` and the tests build in code.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct Settings {
    /// The most dependencies one page may have; a larger set is refused (413).
    #[arg(long = "graph-max-edges", env = "REVSTORE_GRAPH_MAX_EDGES", default_value = "10000", value_parser = clap::value_parser!(u64).range(1..=100_000).map(|n| n as usize))]
    pub max_edges: usize,

    /// Priorities at or above this are push (re-render at once), below pull
    /// (re-render when read): what `?push=true|false` selects.
    #[arg(long = "graph-push-priority", env = "REVSTORE_GRAPH_PUSH_PRIORITY", default_value = "500", value_parser = clap::value_parser!(i64).range(1..=1000))]
    pub push_priority: i64,

    /// Seconds a fragment's change is kept for pull checks; older ones are
    /// removed by the janitor's retention task (edges not updated since are
    /// then taken as stale).
    #[arg(long = "graph-change-retention-secs", env = "REVSTORE_GRAPH_CHANGE_RETENTION_SECS", default_value = "2592000", value_parser = seconds(60..))]
    pub change_retention: Duration,
}

impl Default for Settings {
    /// The binary's without flags.
    fn default() -> Self {
        revstore_service::command_line_defaults()
    }
}

/// dependency-graph, as a kind of service.
#[derive(Debug)]
pub struct DependencyGraph;

impl ServiceDefinition for DependencyGraph {
    type Settings = Settings;
    const NAME: &'static str = SERVICE;
    const BINARY: &'static str = "revstore-dependency-graph";
    const ABOUT: &'static str = "revstore dependency-graph: the page/template DAG with push/pull change propagation";
    const DEFAULT_PORT: u16 = DEFAULT_PORT;
    const SCHEMA: &'static Component = &revstore_schema::version::DEPENDENCY_GRAPH;

    async fn build(own: Settings, context: Context) -> Result<Service, BoxError> {
        let Context { store, settings } = context;
        let titles = settings.titles;
        // A change's time may run ahead of the graph's clock by the skew
        // allowed, and its journal row land as late as a write's timeout.
        let late_margin = revstore_keys::MAX_CLOCK_SKEW + settings.storage.write_timeout();
        let platform = Platform::new(Self::SCHEMA, store.clone(), settings, routes::ApiDoc::openapi());
        let graph = Graph::new(platform.store().clone(), own.max_edges);
        let sweeps = janitor::sweeps(&graph, own.change_retention, late_margin);
        let state = routes::AppState { platform: platform.clone(), graph, titles, push_priority: own.push_priority };
        Ok(Service::with_sweeps(platform, routes::routes(state), sweeps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `revstore up` and the tests start from is what the binary does
    /// without a flag (where the tests run, no `REVSTORE_*` variable of these
    /// settings is set), and what the documents say.
    #[test]
    fn the_default_settings_are_the_command_line_without_flags() {
        let line = revstore_service::parse_command_line::<DependencyGraph>(["revstore-dependency-graph"]).expect("no flags");
        assert_eq!(line.own, Settings::default());
        let d = Settings::default();
        assert_eq!((d.max_edges, d.push_priority, d.change_retention), (10_000, 500, Duration::from_secs(30 * 86_400)));
        for out_of_range in [["--graph-max-edges", "0"], ["--graph-max-edges", "100001"], ["--graph-change-retention-secs", "59"]] {
            let argv = std::iter::once("revstore-dependency-graph").chain(out_of_range);
            assert!(revstore_service::parse_command_line::<DependencyGraph>(argv).is_err(), "{out_of_range:?}");
        }
    }
}
