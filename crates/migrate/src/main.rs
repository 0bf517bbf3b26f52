//! `revstore-migrate`: creates every revstore table and records each
//! component's schema version, on the embedded engine or on
//! Cassandra/ScyllaDB. Running it again changes nothing. Exit codes: 0 done, 64 bad settings, 69 storage
//! unreachable, 65 the database holds another schema.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use revstore_schema::cql::Replication;
use revstore_storage::{CassandraOptions, EmbeddedOptions, StorageSettings, StoreError};

#[derive(Debug, Parser)]
#[command(name = "revstore-migrate", version, about = "Create revstore's tables and record the schema version (safe to run twice)")]
struct Args {
    /// Data directory of the embedded engine (used when no Cassandra is given).
    #[arg(long, env = "REVSTORE_DATA_DIR", default_value = "./data")]
    data_dir: PathBuf,

    /// Cassandra/ScyllaDB contact points, comma-separated host[:port]; set = Cassandra engine.
    #[arg(long, env = "REVSTORE_CASSANDRA", value_delimiter = ',')]
    cassandra: Vec<String>,

    /// Keyspace of revstore's tables.
    #[arg(long, env = "REVSTORE_KEYSPACE", default_value = "revstore")]
    keyspace: String,

    /// Local datacenter (LOCAL_QUORUM reads and writes go there).
    #[arg(long, env = "REVSTORE_CASSANDRA_DATACENTER")]
    datacenter: Option<String>,

    /// Replication of a keyspace that has to be created: `3`, or `eqiad:3,codfw:3`.
    #[arg(long, env = "REVSTORE_CASSANDRA_REPLICATION", default_value = "1")]
    replication: Replication,

    /// Cassandra user name.
    #[arg(long, env = "REVSTORE_CASSANDRA_USERNAME")]
    username: Option<String>,

    /// File holding the Cassandra password (never the password itself).
    #[arg(long, env = "REVSTORE_CASSANDRA_PASSWORD_FILE")]
    password_file: Option<PathBuf>,
}

fn settings(args: Args) -> Result<StorageSettings, String> {
    if args.cassandra.is_empty() {
        return Ok(StorageSettings::Embedded { data_dir: args.data_dir, options: EmbeddedOptions::default() });
    }
    let mut options = CassandraOptions::new(args.cassandra, args.keyspace);
    options.datacenter = args.datacenter;
    options.replication = args.replication;
    options.request_timeout = Duration::from_secs(30);
    options.credentials = match (args.username, args.password_file) {
        (Some(user), Some(file)) => {
            let password = std::fs::read_to_string(&file).map_err(|e| format!("cannot read the password file {}: {e}", file.display()))?;
            Some((user, password.trim_end_matches(['\n', '\r']).to_owned()))
        }
        (None, None) => None,
        _ => return Err("--username and --password-file go together".into()),
    };
    Ok(StorageSettings::Cassandra(options))
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
