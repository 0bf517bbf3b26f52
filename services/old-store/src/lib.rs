//! old-store: every old revision, in compressed multi-revision blocks.
//!
//! Revisions of a page repeat each other almost entirely; laid out together in
//! one long-window zstd block they shrink to a few percent of their size.
//! old-store appends each archived render to its title's open block without
//! rewriting it, compacts blocks in the background, and reads any revision back
//! by decoding its block only as far as that revision.
//!
//! # Layout
//! - [`body`]: the archived render and its byte layout inside a block.
//! - [`archive`]: the storage model, the write path (race-free slot
//!   allocation), the read path and compaction.
//! - [`compactor`]: the background queue of blocks to compact.
//! - [`error`]: what the archive's operations fail with, mapped to HTTP once.
//! - [`debt`]: what must still be compacted, kept in the store so restarts
//!   lose none of it, and the sweep that reads it back.
//! - [`routes`]: the HTTP API.

pub mod archive;
pub mod body;
pub mod compactor;
pub mod debt;
pub mod error;
pub mod routes;

use std::sync::Arc;
use std::time::Duration;

use revstore_schema::Component;
pub use revstore_service::BoxError;
use revstore_service::janitor_admin::{AuditSweep, AuditedTable, Sweep};
use revstore_service::{CommonArgs, Context, Platform, Service, ServiceArgs, ServiceDefinition};
use utoipa::OpenApi;

pub use archive::{Archive, ArchiveSettings, BlockLimits, UpdatePolicy};

pub const SERVICE: &str = "old-store";
pub const DEFAULT_PORT: u16 = 8082;

/// old-store's settings: the shared ones and its own.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "revstore-old-store", version, about = "revstore old-store: every old revision, in compressed multi-revision blocks")]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Which renders are kept: `first-render` (the first per revision) or
    /// `one-per:<seconds>` (at most one per interval per title).
    #[arg(long, env = "REVSTORE_ARCHIVE_POLICY", default_value = "first-render")]
    pub archive_policy: UpdatePolicy,

    /// A block is sealed when it holds this many revisions...
    /// (At most 10,000: a block's rows are read in one go, under the store's
    /// cap on reads without a limit.)
    #[arg(long, env = "REVSTORE_BLOCK_MAX_REVISIONS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub block_max_revisions: u64,

    /// ...or when the next revision would take it past this many raw bytes.
    #[arg(long, env = "REVSTORE_BLOCK_MAX_BYTES", default_value_t = 16 << 20, value_parser = clap::value_parser!(u64).range(4096..))]
    pub block_max_bytes: u64,

    /// zstd level of a block's final compaction (1-22).
    #[arg(long, env = "REVSTORE_SEAL_LEVEL", default_value_t = 19, value_parser = clap::value_parser!(i32).range(1..=22))]
    pub seal_level: i32,

    /// Seconds without archive writes after which a title's open block is
    /// compacted at the seal level.
    #[arg(long, env = "REVSTORE_SETTLE_SECS", default_value_t = 30)]
    pub settle_secs: u64,

    /// Seconds between sweeps of the compaction debt table (which also run at
    /// start and on `POST /admin/compaction/sweep`).
    #[arg(long, env = "REVSTORE_DEBT_SWEEP_SECS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub debt_sweep_secs: u64,

    /// Megabytes of decoded blocks kept in memory for reads.
    #[arg(long, env = "REVSTORE_BLOCK_CACHE_MB", default_value_t = 256)]
    pub block_cache_mb: u64,

    /// Blocks decoded at once (each needs about twice its raw size while
    /// decoding); 0: one per CPU.
    #[arg(long, env = "REVSTORE_MAX_CONCURRENT_DECODES", default_value_t = 0)]
    pub max_concurrent_decodes: usize,
}

impl ServiceArgs for Args {
    fn common(&self) -> &CommonArgs {
        &self.common
    }
}

impl Args {
    pub fn archive_settings(&self) -> ArchiveSettings {
        ArchiveSettings {
            policy: self.archive_policy,
            limits: BlockLimits { max_revisions: self.block_max_revisions, max_bytes: self.block_max_bytes },
            seal_level: self.seal_level,
            cache_bytes: self.block_cache_mb.saturating_mul(1 << 20),
            settle: Duration::from_secs(self.settle_secs),
            max_concurrent_decodes: match self.max_concurrent_decodes {
                0 => std::thread::available_parallelism().map_or(2, std::num::NonZero::get),
                n => n,
            },
        }
    }
}

/// old-store, as a kind of service.
#[derive(Debug)]
pub struct OldStore;

impl ServiceDefinition for OldStore {
    type Args = Args;
    const NAME: &'static str = SERVICE;
    const DEFAULT_PORT: u16 = DEFAULT_PORT;
    const SCHEMA: &'static Component = &revstore_schema::version::OLD_STORE;

    async fn build(args: Args, context: Context) -> Result<Service, BoxError> {
        let Context { store, settings } = context;
        let archive = Archive::new(store.clone(), args.archive_settings());
        let titles = settings.titles;
        let platform = Platform::new(Self::SCHEMA, store, settings, routes::ApiDoc::openapi());
        platform.spawn_worker(compactor::Compaction::new(archive.clone()));
        platform.spawn_worker(compactor::DebtSweep::new(archive.clone(), Duration::from_secs(args.debt_sweep_secs)));
        // Its audit: every live row is entitled (blocks, their index, suppressions,
        // and compaction debt markers until the compactor has paid them).
        let tables = revstore_schema::tables::old_store::TABLES.iter().map(|t| AuditedTable::live(t)).collect();
        let sweeps: Vec<Arc<dyn Sweep>> = vec![Arc::new(AuditSweep::new(platform.store().clone(), tables))];
        let state = routes::AppState { platform: platform.clone(), archive, titles };
        Ok(Service::with_sweeps(platform, routes::routes(state), sweeps))
    }
}
