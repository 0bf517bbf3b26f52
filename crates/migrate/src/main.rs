//! `revstore-migrate`: creates every revstore table and records each
//! component's schema version, on the embedded engine or on
//! Cassandra/ScyllaDB, and flags current-store's pages that have a
//! suppressed revision. Running it again changes nothing. With
//! `--rebuild-graph-dependents` it then writes every edge's by-parent row
//! again from the by-child table: the offline step of the dependency graph's
//! upgrade to version 2 (OPERATIONS, "Schema versions and upgrades").
//! Exit codes: 0 done, 64 bad settings, 69 storage unreachable, 65 the
//! database holds another schema (or the rebuild failed).

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use revstore_service::StorageArgs;
use revstore_storage::{StorageSettings, StoreError};

#[derive(Debug, Parser)]
#[command(name = "revstore-migrate", version, about = "Create revstore's tables and record the schema version (safe to run twice)")]
struct Args {
    /// The same storage settings, with the same names, as the services'.
    #[command(flatten)]
    storage: StorageArgs,

    /// After migrating, write every edge's row among its parent's dependents
    /// (`graph_parent_dependents`, `graph_parent_buckets`) from
    /// `graph_dependencies`. Run it with dependency-graph stopped.
    #[arg(long)]
    rebuild_graph_dependents: bool,
}

/// DDL waits for the whole cluster to agree: a storage timeout of at least this.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(30);

fn settings(args: Args) -> Result<StorageSettings, String> {
    let mut settings = args.storage.resolve().map_err(|e| e.to_string())?;
    if let StorageSettings::Cassandra(options) = &mut settings {
        options.request_timeout = options.request_timeout.max(MIGRATION_TIMEOUT);
    }
    Ok(settings)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let rebuild = args.rebuild_graph_dependents;
    let settings = match settings(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("revstore-migrate: {e}");
            return ExitCode::from(64);
        }
    };
    let engine = settings.engine_name();
    let store = match revstore_storage::open(settings).await {
        Ok(store) => store,
        Err(e) => return failed(engine, &e.to_string(), exit_code(&e)),
    };
    match store.migrate(&revstore_schema::COMPONENTS).await {
        Ok(outcomes) => {
            for (component, outcome) in outcomes {
                eprintln!("revstore-migrate: {engine}: {component}: {outcome}");
            }
        }
        Err(e) => return failed(engine, &e.to_string(), exit_code(&e)),
    }
    // current-store's render writes do not check suppression; a latest read
    // does, on the pages flagged as having a suppressed revision. A
    // suppression flags its page; those made by code that predates the flag
    // (before this migration, or by older replicas during the roll: run it
    // again after) are flagged here.
    match revstore_current_store::flag_suppressed_pages(&store).await {
        Ok(pages) => eprintln!("revstore-migrate: {engine}: current-store: {pages} pages with a suppressed revision flagged"),
        Err(e) => return failed(engine, &format!("flagging the pages with a suppressed revision: {e}"), 65),
    }
    if rebuild {
        let graph = revstore_dependency_graph::Graph::new(store, usize::MAX);
        let mut reported = 0;
        let progress = |edges: u64| {
            if edges >= reported + 100_000 {
                reported = edges;
                eprintln!("revstore-migrate: {engine}: dependency-graph: {edges} edges written among their parents' dependents");
            }
        };
        match graph.rebuild_dependents(progress).await {
            Ok((pages, edges)) => {
                eprintln!("revstore-migrate: {engine}: dependency-graph: rebuilt the dependents of {edges} edges of {pages} pages")
            }
            Err(e) => return failed(engine, &format!("rebuilding the graph's dependents: {e}"), 65),
        }
    }
    ExitCode::SUCCESS
}

fn exit_code(e: &StoreError) -> u8 {
    match e {
        StoreError::Unavailable(_) | StoreError::StorageFull(_) => 69,
        StoreError::Invalid(_) => 64,
        _ => 65,
    }
}

fn failed(engine: &str, why: &str, code: u8) -> ExitCode {
    eprintln!("revstore-migrate: {engine}: {why}");
    ExitCode::from(code)
}
