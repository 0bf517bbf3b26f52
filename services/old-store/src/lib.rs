//! old-store: every old revision, in compressed multi-revision blocks.
//!
//! Revisions of a page repeat each other almost entirely; laid out together in
//! one long-window zstd block they shrink to a few percent of their size.
//! old-store appends each archived render to its title's open block without
//! rewriting it, compacts blocks in the background, and reads any revision back
//! by decoding its block only as far as that revision.
//!
//! # Layout
//! Each module imports only those above it in this list:
//! - `body`: the archived render and its byte layout inside a block.
//! - `block`: the block model (keys, decoded blocks, base choices).
//! - `error`: what the archive's operations fail with, mapped to HTTP once.
//! - `queue`: the in-memory queue of blocks to compact.
//! - `debt`: what must still be compacted, kept in the store so restarts
//!   lose none of it, and the sweep that puts it back in the queue.
//! - `archive`: the archive's state and its write path (race-free slot
//!   allocation), read path and compaction, one file each.
//! - `workers`: the background workers that run the queue and the sweep.
//! - `routes`: the HTTP API.

mod archive;
mod block;
mod body;
mod debt;
mod error;
pub mod history;
mod queue;
mod routes;
#[cfg(feature = "testsuite")]
pub mod testing;
mod workers;

use std::sync::Arc;
use std::time::Duration;

use revstore_schema::Component;
pub use revstore_service::BoxError;
use revstore_service::budget::MemoryBudget;
use revstore_service::janitor_admin::{AuditSweep, AuditedTable, Sweep};
use revstore_service::settings::{SettingsError, seconds};
use revstore_service::{Context, Platform, Service, ServiceDefinition};
use utoipa::OpenApi;

pub use archive::{Archive, ArchiveOutcome, ArchiveSettings, BlockLimits, UpdatePolicy};
pub use block::{BaseChoice, BlockKey, CompactionOutcome, GROWTH_LEVEL};
pub use body::{ArchiveBody, Part, StoredParts, block_entry};
pub use error::ArchiveError;

pub const SERVICE: &str = "old-store";
pub const DEFAULT_PORT: u16 = 8082;

/// old-store's own settings: its flags (beside those every service has),
/// and the value `revstore up` and the tests build in code.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct Settings {
    /// Which renders are kept: `first-render` (the first per revision) or
    /// `one-per:<seconds>` (at most one per interval per title).
    #[arg(long, env = "REVSTORE_ARCHIVE_POLICY", default_value = "first-render")]
    pub archive_policy: UpdatePolicy,

    #[command(flatten)]
    pub limits: BlockLimits,

    /// zstd level of a block's final compaction (1-22).
    #[arg(long, env = "REVSTORE_SEAL_LEVEL", default_value = "19", value_parser = clap::value_parser!(i32).range(1..=22))]
    pub seal_level: i32,

    /// Seconds without archive writes after which a title's open block is
    /// compacted at the seal level.
    #[arg(long = "settle-secs", env = "REVSTORE_SETTLE_SECS", default_value = "30", value_parser = seconds(..))]
    pub settle: Duration,

    /// Seconds between sweeps of the compaction debt table (which also run at
    /// start and on `POST /admin/compaction/sweep`).
    #[arg(long = "debt-sweep-secs", env = "REVSTORE_DEBT_SWEEP_SECS", default_value = "300", value_parser = seconds(1..))]
    pub debt_sweep_every: Duration,

    /// Megabytes of decoded blocks kept in memory for reads (default: what
    /// the memory budget leaves; a larger one than it leaves is refused).
    #[arg(long, env = "REVSTORE_BLOCK_CACHE_MB")]
    pub block_cache_mb: Option<u64>,

    /// Blocks decoded at once (each needs about twice its raw size while
    /// decoding); 0: one per CPU.
    #[arg(long, env = "REVSTORE_MAX_CONCURRENT_DECODES", default_value = "0")]
    pub max_concurrent_decodes: usize,

    /// Revisions per second that all history dumps (`/dump/history`) served
    /// by this replica send together, so that dumps leave the node to live
    /// readers (0: no limit).
    #[arg(long, env = "REVSTORE_DUMP_REVISIONS_PER_SECOND", default_value = "2000")]
    pub dump_revisions_per_second: u32,
}

impl Default for Settings {
    /// The binary's without flags.
    fn default() -> Self {
        revstore_service::command_line_defaults()
    }
}

/// zstd's table caps tried, largest first, with what the tables of a
/// compaction take under each (see `BlockSettings::table_log_max`).
const TABLE_CAPS: [(Option<u32>, u64); 4] = [(None, 80 << 20), (Some(22), 20 << 20), (Some(20), 5 << 20), (Some(18), 5 << 18)];

/// The least block cache a budget must leave.
const MIN_CACHE: u64 = 4 << 20;

impl Settings {
    /// The archive's settings, its parts taken from the memory budget: the
    /// decodes in flight (each about twice the largest block), one compaction
    /// (about five times it, and zstd's tables, capped as far as needed),
    /// and the block cache (what is left, or the one set, if it fits).
    pub fn archive_settings(&self, memory: &mut MemoryBudget, body_limit: usize) -> Result<ArchiveSettings, SettingsError> {
        // The largest block: a block's limit, or one revision as large as a body.
        let largest = self.limits.max_bytes.max(body_limit as u64);
        let cpus = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let decodes = self.concurrent_decodes(cpus, largest, memory.left());
        let decoding = 2 * largest * decodes as u64;
        let cache_wanted = self.block_cache_mb.map_or(MIN_CACHE, |mb| mb << 20);
        // A compaction holds the decoded block, the builder's copy of it,
        // zstd's window buffers (about twice the block, measured), the frame,
        // and the match tables (at most 16 times the block: the window bounds them).
        let compaction = |tables: u64| 5 * largest + tables.min(16 * largest);
        let (table_log_max, tables) = TABLE_CAPS
            .into_iter()
            .find(|(_, tables)| decoding + compaction(*tables) + cache_wanted <= memory.left())
            .unwrap_or(TABLE_CAPS[TABLE_CAPS.len() - 1]);
        memory.take("decodes in flight (REVSTORE_MAX_CONCURRENT_DECODES)", decoding)?;
        memory.take("one compaction (REVSTORE_BLOCK_MAX_BYTES)", compaction(tables))?;
        let cache_bytes = match self.block_cache_mb {
            Some(mb) => mb << 20,
            // What is left, and no less than the least cache worth having.
            None => memory.left().max(MIN_CACHE),
        };
        memory.take("the block cache (REVSTORE_BLOCK_CACHE_MB)", cache_bytes)?;
        Ok(ArchiveSettings {
            policy: self.archive_policy,
            limits: self.limits,
            seal_level: self.seal_level,
            cache_bytes,
            settle: self.settle,
            max_concurrent_decodes: decodes,
            table_log_max,
        })
    }

    /// Blocks decoded at once: the one set, or one per CPU, as many as a
    /// quarter of the budget left holds (at least one) — a machine of many
    /// cores must not push the default settings past the default budget.
    fn concurrent_decodes(&self, cpus: usize, largest_block: u64, left: u64) -> usize {
        match self.max_concurrent_decodes {
            0 => {
                let fit = (left / 4 / (2 * largest_block).max(1)) as usize;
                cpus.min(fit).max(1)
            }
            n => n,
        }
    }
}

/// old-store, as a kind of service.
#[derive(Debug)]
pub struct OldStore;

impl ServiceDefinition for OldStore {
    type Settings = Settings;
    const NAME: &'static str = SERVICE;
    const BINARY: &'static str = "revstore-old-store";
    const ABOUT: &'static str = "revstore old-store: every old revision, in compressed multi-revision blocks";
    const DEFAULT_PORT: u16 = DEFAULT_PORT;
    const SCHEMA: &'static Component = &revstore_schema::version::OLD_STORE;

    async fn build(own: Settings, context: Context) -> Result<Service, BoxError> {
        let Context { store, mut settings } = context;
        let archive_settings = own.archive_settings(&mut settings.memory, settings.body_limit)?;
        tracing::info!(
            service = SERVICE,
            budget_mb = settings.memory.total() >> 20,
            division = %settings.memory.describe(),
            zstd_table_log_max = ?archive_settings.table_log_max,
            "memory budget"
        );
        let archive = Archive::new(store.clone(), archive_settings);
        let titles = settings.titles;
        let platform = Platform::new(Self::SCHEMA, store, settings, routes::ApiDoc::openapi());
        let debt =
            debt::DebtSweeper::new(platform.store().clone(), archive.queue().clone(), archive.debt_book().clone(), archive.seal_level());
        platform.spawn_worker(workers::Compaction::new(archive.clone()));
        platform.spawn_worker(workers::DebtSweep::new(debt.clone(), own.debt_sweep_every));
        // Its audit: every live row is entitled (blocks, their index,
        // suppressions); the compaction debt, a work table whose markers are
        // deleted as they are paid, is reported from the nodes only.
        let debt_table = &revstore_schema::tables::old_store::ARCHIVE_DEBT;
        let tables = revstore_schema::tables::old_store::TABLES
            .iter()
            .map(|t| if std::ptr::eq(*t, debt_table) { AuditedTable::unscanned(t) } else { AuditedTable::live(t) })
            .collect();
        let audit = AuditSweep::new(platform.store().clone(), tables);
        let hidden = revstore_service::suppressions::HiddenSweep::new(platform.store().clone(), Arc::new(archive.clone()));
        let sweeps: Vec<Arc<dyn Sweep>> = vec![Arc::new(hidden), Arc::new(audit.from_nodes()), Arc::new(audit)];
        let dumps = Arc::new(revstore_service::dump::DumpPacer::new(own.dump_revisions_per_second));
        let state = routes::AppState { platform: platform.clone(), archive, debt, titles, dumps };
        Ok(Service::with_sweeps(platform, routes::routes(state), sweeps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> revstore_service::CommandLine<Settings> {
        revstore_service::parse_command_line::<OldStore>(["revstore-old-store"].iter().chain(args)).unwrap()
    }

    fn divided(args: &[&str]) -> Result<(ArchiveSettings, MemoryBudget), String> {
        let line =
            revstore_service::parse_command_line::<OldStore>(["revstore-old-store"].iter().chain(args)).map_err(|e| e.to_string())?;
        let (mut settings, own) = line.settings::<OldStore>().map_err(|e| e.to_string())?;
        let archive = own.archive_settings(&mut settings.memory, settings.body_limit).map_err(|e| e.to_string())?;
        Ok((archive, settings.memory))
    }

    /// What `revstore up` and the tests start from is what the binary does
    /// without a flag (where the tests run, no `REVSTORE_*` variable of these
    /// settings is set), and what the documents say.
    #[test]
    fn the_default_settings_are_the_command_line_without_flags() {
        assert_eq!(parse(&[]).own, Settings::default());
        let d = Settings::default();
        assert_eq!(d.archive_policy, UpdatePolicy::FirstRenderPerRevision);
        assert_eq!(d.limits, BlockLimits { max_revisions: 1000, max_bytes: 16 << 20 });
        assert_eq!((d.seal_level, d.settle, d.debt_sweep_every), (19, Duration::from_secs(30), Duration::from_secs(300)));
        assert_eq!((d.block_cache_mb, d.max_concurrent_decodes, d.dump_revisions_per_second), (None, 0, 2000));
    }

    #[test]
    fn the_budget_sizes_the_cache_and_caps_what_does_not_fit() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_str().unwrap();
        // The defaults: level-19 tables uncapped, hundreds of MB of cache, all of the budget divided.
        let (archive, memory) = divided(&["--data-dir", data, "--max-concurrent-decodes", "2"]).unwrap();
        assert_eq!(archive.table_log_max, None);
        assert!(archive.cache_bytes > 200 << 20, "{}", memory.describe());
        assert_eq!(memory.left(), 0);
        // 64 MB: refused with 32 MiB bodies, named; with 2 MiB ones a cache does not fit beside one decode
        // and a compaction; with 1 MiB ones it runs, two decodes, the tables capped the most.
        let refused = divided(&["--data-dir", data, "--memory-budget-mb", "64"]).unwrap_err();
        assert!(refused.contains("REVSTORE_MEMORY_BUDGET_MB") && refused.contains("request bodies"), "{refused}");
        let sized =
            |bytes: &'static str| ["--data-dir", data, "--memory-budget-mb", "64", "--body-limit-bytes", bytes, "--block-max-bytes", bytes];
        let refused = divided(&sized("2097152")).unwrap_err();
        assert!(refused.contains("REVSTORE_BLOCK_CACHE_MB") && refused.contains("(REVSTORE_MAX_CONCURRENT_DECODES) 4.0 MB"), "{refused}");
        let (archive, memory) = divided(&sized("1048576")).unwrap();
        assert_eq!((archive.max_concurrent_decodes, archive.table_log_max), (2, Some(18)), "{}", memory.describe());
        assert!(archive.cache_bytes >= MIN_CACHE, "{}", memory.describe());
        // One per CPU by default, as many as fit: 64 cores still start at the default budget.
        let own = Settings::default();
        let (largest, left) = (32 << 20, 800 << 20);
        assert_eq!(own.concurrent_decodes(2, largest, left), 2);
        assert_eq!(own.concurrent_decodes(64, largest, left), 3);
        assert_eq!(own.concurrent_decodes(64, largest, 10 << 20), 1);
        let set = parse(&["--data-dir", data, "--max-concurrent-decodes", "8"]);
        assert_eq!(set.own.concurrent_decodes(64, largest, left), 8);
        // A cache set larger than the budget leaves is refused, naming it.
        let too_big = divided(&["--data-dir", data, "--block-cache-mb", "2000"]).unwrap_err();
        assert!(too_big.contains("REVSTORE_BLOCK_CACHE_MB"), "{too_big}");
    }
}
