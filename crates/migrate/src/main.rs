//! `revstore-migrate`: creates every revstore table and records each
//! component's schema version, on the embedded engine or on
//! Cassandra/ScyllaDB. Running it again changes nothing. Exit codes: 0 done, 64 bad settings, 69 storage
//! unreachable, 65 the database holds another schema.

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
    let settings = match settings(Args::parse()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("revstore-migrate: {e}");
            return ExitCode::from(64);
        }
    };
    let engine = settings.engine_name();
    let result = async {
        let store = revstore_storage::open(settings).await?;
        store.migrate(&revstore_schema::COMPONENTS).await
    }
    .await;
    match result {
        Ok(outcomes) => {
            for (component, outcome) in outcomes {
                eprintln!("revstore-migrate: {engine}: {component}: {outcome}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("revstore-migrate: {engine}: {e}");
            ExitCode::from(match e {
                StoreError::Unavailable(_) | StoreError::StorageFull(_) => 69,
                StoreError::Invalid(_) => 64,
                _ => 65,
            })
        }
    }
}
