//! current-store: the latest render of every page.
//!
//! Serves the latest render of the latest revision of each page, keeps any
//! render a reader saw retrievable for a grace TTL after it is superseded, and
//! never lets an older revision or render win, whatever order writes arrive
//! in. Revisions it no longer holds are fetched from old-store; the first
//! render of each revision is handed to old-store through a durable outbox.
//!
//! # Layout
//! - `render`: the render body, its parts and how they are stored.
//! - `pages`: the storage model and the write path (precedence, copy-on-update).
//! - `error`: what the page operations fail with, mapped to HTTP once.
//! - `routes`: the HTTP API.
//! - `outbox`: delivery of hand-offs to old-store and notices to the graph.
//! - `janitor`: the sweeps it offers the janitor (hidden, retention, archive, audit).
//! - `dump`: a domain's current renders as NDJSON, by slices of the token ring.

pub mod dump;
mod error;
pub mod janitor;
mod outbox;
mod pages;
mod render;
mod routes;
#[cfg(feature = "testsuite")]
pub mod testing;

pub use error::{PagesError, Refusal};
pub use pages::{Pages, Preconditions, WriterMemory, flag_suppressed_pages};
pub use render::{RenderBody, RenderId, StoredParts, decode_part};

use std::time::Duration;

use revstore_client::{ClientOptions, GraphClient, HttpClient, OldStoreClient};
use revstore_schema::Component;
pub use revstore_service::BoxError;
use revstore_service::settings::seconds;
use revstore_service::{Context, Platform, Service, ServiceDefinition, SettingsError};
use utoipa::OpenApi;

pub const SERVICE: &str = "current-store";
pub const DEFAULT_PORT: u16 = 8081;

/// current-store's own settings: its flags (beside those every service has),
/// and the value `revstore up` and the tests build in code.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct Settings {
    /// Seconds a superseded render stays retrievable by revision and by tid.
    #[arg(long = "grace-ttl", env = "REVSTORE_GRACE_TTL", default_value = "86400", value_parser = seconds(1..))]
    pub grace_ttl: Duration,

    /// Seconds of clock difference between current-store's instances that
    /// retention allows for: a superseded render is removed once the grace
    /// period has passed on every clock within this of the remover's.
    #[arg(long = "clock-skew", env = "REVSTORE_CLOCK_SKEW", default_value = "300", value_parser = seconds(..))]
    pub clock_skew: Duration,

    /// Seconds the janitor's hand-off check leaves a revision to the outbox
    /// after its newest render (the outbox delivers within seconds; sending it
    /// to old-store sooner would only be a repeat).
    #[arg(long = "hand-off-check-after", env = "REVSTORE_HAND_OFF_CHECK_AFTER", default_value = "300", value_parser = seconds(1..))]
    pub hand_off_check_after: Duration,

    /// Seconds after the outbox has delivered past a minute that it reads the
    /// minute once more for rows that arrived late, then deletes it.
    #[arg(long = "outbox-settle", env = "REVSTORE_OUTBOX_SETTLE", default_value = "600", value_parser = seconds(1..))]
    pub outbox_settle: Duration,

    /// old-store's base URL: revisions not held here are read from it, and the
    /// first render of each revision is handed to it.
    #[arg(long, env = "REVSTORE_OLD_STORE_URL")]
    pub old_store_url: Option<String>,

    /// The dependency graph's base URL, for change notices.
    #[arg(long, env = "REVSTORE_GRAPH_URL")]
    pub graph_url: Option<String>,

    /// Notify the dependency graph of new revisions (needs --graph-url).
    #[arg(long, env = "REVSTORE_NOTIFY_GRAPH", default_value_t = false)]
    pub notify_graph: bool,

    /// Token file: this service presents its first token to old-store and the graph.
    #[arg(long, env = "REVSTORE_PEER_TOKEN_FILE")]
    pub peer_token_file: Option<std::path::PathBuf>,

    /// Pages per second that all dumps served by this replica read together,
    /// so that a dump never starves live readers (0: no limit).
    #[arg(long, env = "REVSTORE_DUMP_PAGES_PER_SECOND", default_value = "1000")]
    pub dump_pages_per_second: u32,
}

impl Default for Settings {
    /// The binary's without flags: a day's grace, not wired to old-store or the graph.
    fn default() -> Self {
        revstore_service::command_line_defaults()
    }
}

/// current-store, as a kind of service.
#[derive(Debug)]
pub struct CurrentStore;

impl ServiceDefinition for CurrentStore {
    type Settings = Settings;
    const NAME: &'static str = SERVICE;
    const BINARY: &'static str = "revstore-current-store";
    const ABOUT: &'static str = "revstore current-store: the latest render of every page";
    const DEFAULT_PORT: u16 = DEFAULT_PORT;
    const SCHEMA: &'static Component = &revstore_schema::version::CURRENT_STORE;

    fn validate(settings: &Settings) -> Result<(), SettingsError> {
        match settings.notify_graph && settings.graph_url.is_none() {
            true => Err(SettingsError("--notify-graph needs --graph-url".into())),
            false => Ok(()),
        }
    }

    async fn build(args: Settings, context: Context) -> Result<Service, BoxError> {
        let peer_token = match &args.peer_token_file {
            Some(path) => Some(revstore_client::tokens::read_peer_token(path, "peer token")?),
            None => None,
        };
        let client = |url: &Option<String>, what: &str| -> Result<Option<HttpClient>, BoxError> {
            url.as_deref()
                .map(|u| {
                    let options = ClientOptions { token: peer_token.clone(), ..ClientOptions::default() };
                    HttpClient::new(u, options).map_err(|e| format!("{what}: {e}").into())
                })
                .transpose()
        };
        let old_store = client(&args.old_store_url, "--old-store-url")?.map(OldStoreClient::new);
        let graph = client(&args.graph_url, "--graph-url")?.map(GraphClient::new);
        let Context { store, settings } = context;
        if settings.migrate_on_start {
            // The schema was just migrated here: flag the pages of suppressions
            // made before the flag existed, as `revstore-migrate` does.
            let flagged = pages::flag_suppressed_pages(&store).await?;
            tracing::info!(service = "current-store", pages = flagged, "pages with a suppressed revision flagged");
        }
        // Two sites must never share a number: they would deliver each other's shards.
        outbox::check_site_number(&store, store.site()).await?;
        let outbox_margin = args.clock_skew + settings.storage.write_timeout();
        let pages = pages::Pages {
            store: store.clone(),
            grace: args.grace_ttl,
            clock_skew: args.clock_skew,
            // Only what has a receiver is queued: a row nobody can take
            // would hold its shard up.
            hand_off: old_store.is_some(),
            notify_graph: args.notify_graph,
            remembered: Default::default(),
        };
        let titles = settings.titles;
        let platform = Platform::new(Self::SCHEMA, store.clone(), settings, routes::ApiDoc::openapi());
        if old_store.is_some() || graph.is_some() {
            let receivers = outbox::Receivers { old_store: old_store.clone(), graph };
            platform.spawn_worker(outbox::Delivery::new(store, receivers, outbox_margin).settle_after(args.outbox_settle));
        }
        if old_store.is_none() {
            tracing::warn!(service = "current-store", "no --old-store-url: revisions are not handed to old-store");
        }
        let sweeps = janitor::sweeps(&pages, old_store.clone(), args.hand_off_check_after, outbox_margin);
        let dumps = std::sync::Arc::new(revstore_service::dump::DumpPacer::new(args.dump_pages_per_second));
        let state = routes::AppState { platform: platform.clone(), pages, titles, old_store, dumps };
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
        let line = revstore_service::parse_command_line::<CurrentStore>(["revstore-current-store"]).expect("no flags");
        assert_eq!(line.own, Settings::default());
        let d = Settings::default();
        assert_eq!(
            (d.grace_ttl, d.clock_skew, d.dump_pages_per_second),
            (Duration::from_secs(86_400), revstore_keys::time::MAX_CLOCK_SKEW, 1000)
        );
        assert_eq!((d.old_store_url, d.graph_url, d.notify_graph, d.peer_token_file), (None, None, false, None));
    }

    /// Settings that only work together are refused from a command line and
    /// as a value alike; a flag's own range is the parser's.
    #[test]
    fn settings_that_do_not_work_together_are_refused() {
        let line = revstore_service::parse_command_line::<CurrentStore>(["revstore-current-store", "--notify-graph"]).expect("parses");
        let refused = line.settings::<CurrentStore>().expect_err("--notify-graph without --graph-url");
        assert!(refused.to_string().contains("--graph-url"), "{refused}");
        let in_code = Settings { notify_graph: true, ..Settings::default() };
        assert!(CurrentStore::validate(&in_code).is_err());
        assert!(revstore_service::parse_command_line::<CurrentStore>(["revstore-current-store", "--grace-ttl", "0"]).is_err());
    }
}
