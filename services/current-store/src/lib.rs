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
//! - `janitor`: the sweeps it offers the janitor (retention, archive, audit).
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

pub use pages::{Pages, Preconditions, PutOutcome};
pub use render::{RenderBody, RenderId, StoredParts, decode_part};

use std::time::Duration;

use revstore_client::{ClientOptions, GraphClient, HttpClient, OldStoreClient};
use revstore_schema::Component;
pub use revstore_service::BoxError;
use revstore_service::{CommonArgs, Context, Platform, Service, ServiceArgs, ServiceDefinition, SettingsError};
use utoipa::OpenApi;

pub const SERVICE: &str = "current-store";
pub const DEFAULT_PORT: u16 = 8081;

/// current-store's own settings, as a value.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long a superseded render stays retrievable by revision and by tid.
    pub grace_ttl: Duration,
    /// The largest clock difference between instances that retention allows for.
    pub clock_skew: Duration,
    /// old-store's base URL: revisions not held here are read from it, and
    /// the first render of each revision is handed to it.
    pub old_store_url: Option<String>,
    /// The dependency graph's base URL, for change notices.
    pub graph_url: Option<String>,
    /// Notify the graph of new revisions (needs `graph_url`).
    pub notify_graph: bool,
    /// This service presents the file's first token to old-store and the graph.
    pub peer_token_file: Option<std::path::PathBuf>,
    /// Pages per second all dumps of this replica read together (0: no limit).
    pub dump_pages_per_second: u32,
}

/// The dump rate when none is set: about 20 MB/s of HTML, a fraction of what
/// the node serves live readers.
pub const DEFAULT_DUMP_PAGES_PER_SECOND: u32 = 1000;

/// The grace TTL when none is set: a day.
pub const DEFAULT_GRACE_TTL_SECS: u64 = 86_400;

impl Default for Settings {
    /// Not wired to old-store or the graph; a day's grace.
    fn default() -> Self {
        Settings {
            grace_ttl: Duration::from_secs(DEFAULT_GRACE_TTL_SECS),
            clock_skew: revstore_keys::time::MAX_CLOCK_SKEW,
            old_store_url: None,
            graph_url: None,
            notify_graph: false,
            peer_token_file: None,
            dump_pages_per_second: DEFAULT_DUMP_PAGES_PER_SECOND,
        }
    }
}

/// `revstore-current-store`'s command line: the shared settings and its own.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "revstore-current-store", version, about = "revstore current-store: the latest render of every page")]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Seconds a superseded render stays retrievable by revision and by tid.
    #[arg(long, env = "REVSTORE_GRACE_TTL", default_value_t = DEFAULT_GRACE_TTL_SECS)]
    pub grace_ttl: u64,

    /// Seconds of clock difference between current-store's instances that
    /// retention allows for: a superseded render is removed once the grace
    /// period has passed on every clock within this of the remover's.
    #[arg(long, env = "REVSTORE_CLOCK_SKEW", default_value_t = revstore_keys::time::MAX_CLOCK_SKEW.as_secs())]
    pub clock_skew: u64,

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
    #[arg(long, env = "REVSTORE_DUMP_PAGES_PER_SECOND", default_value_t = DEFAULT_DUMP_PAGES_PER_SECOND)]
    pub dump_pages_per_second: u32,
}

impl ServiceArgs for Args {
    type Settings = Settings;

    fn common(&self) -> &CommonArgs {
        &self.common
    }

    fn settings(&self) -> Result<Settings, SettingsError> {
        if self.notify_graph && self.graph_url.is_none() {
            return Err(SettingsError("--notify-graph needs --graph-url".into()));
        }
        Ok(Settings {
            grace_ttl: Duration::from_secs(self.grace_ttl.max(1)),
            clock_skew: Duration::from_secs(self.clock_skew),
            old_store_url: self.old_store_url.clone(),
            graph_url: self.graph_url.clone(),
            notify_graph: self.notify_graph,
            peer_token_file: self.peer_token_file.clone(),
            dump_pages_per_second: self.dump_pages_per_second,
        })
    }
}

/// current-store, as a kind of service.
#[derive(Debug)]
pub struct CurrentStore;

impl ServiceDefinition for CurrentStore {
    type Settings = Settings;
    type Args = Args;
    const NAME: &'static str = SERVICE;
    const DEFAULT_PORT: u16 = DEFAULT_PORT;
    const SCHEMA: &'static Component = &revstore_schema::version::CURRENT_STORE;

    async fn build(args: Settings, context: Context) -> Result<Service, BoxError> {
        if args.notify_graph && args.graph_url.is_none() {
            return Err("change notices to the graph need its URL (--graph-url)".into());
        }
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
        let pages = pages::Pages {
            store: store.clone(),
            grace: args.grace_ttl.max(Duration::from_secs(1)),
            clock_skew: args.clock_skew,
            hand_off: true,
            notify_graph: args.notify_graph,
        };
        let titles = settings.titles;
        let platform = Platform::new(Self::SCHEMA, store.clone(), settings, routes::ApiDoc::openapi());
        if old_store.is_some() || graph.is_some() {
            let receivers = outbox::Receivers { old_store: old_store.clone(), graph };
            platform.spawn_worker(outbox::Delivery::new(store, receivers));
        } else {
            tracing::warn!(service = "current-store", "no --old-store-url: first renders wait in the outbox until one is configured");
        }
        let sweeps = janitor::sweeps(&pages, old_store.clone());
        let dumps = std::sync::Arc::new(revstore_service::dump::DumpPacer::new(args.dump_pages_per_second));
        let state = routes::AppState { platform: platform.clone(), pages, titles, old_store, dumps };
        Ok(Service::with_sweeps(platform, routes::routes(state), sweeps))
    }
}
