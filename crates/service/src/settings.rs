//! Settings every service shares. Each is a flag and a `REVSTORE_*` variable
//! (the names the deployment brief fixes keep their spelling); secrets can come
//! from files; `--help` documents all of them. Invalid settings end the process
//! with a clear message and exit code 64 (EX_USAGE).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use revstore_keys::{FirstLetterCase, TitleRules};
use revstore_schema::cql::Replication;
use revstore_storage::{CassandraOptions, CassandraTls, ConsistencyLevel, EmbeddedOptions, StorageSettings};

use crate::access::Access;
use crate::connections::ConnectionLimits;
pub use crate::secret::Secret;

/// The settings' defaults: the command line's and those of a value built in
/// code ([`CommonArgs::default`], what `revstore up` and the tests start from).
pub mod defaults {
    pub const DATA_DIR: &str = "./data";
    pub const KEYSPACE: &str = "revstore";
    pub const REPLICATION: &str = "1";
    pub const CONSISTENCY: &str = "local_quorum";
    pub const STORAGE_TIMEOUT_SECS: u64 = 10;
    pub const PURGE_INTERVAL_SECS: u64 = 600;
    pub const REQUEST_TIMEOUT_SECS: u64 = 30;
    pub const MAX_CONNECTIONS: usize = 1024;
    pub const HEADER_READ_TIMEOUT_SECS: u64 = 10;
    pub const IDLE_TIMEOUT_SECS: u64 = 120;
    pub const MEMORY_BUDGET_MB: u64 = 1024;
    pub const BODY_LIMIT_BYTES: usize = 32 * 1024 * 1024;
    pub const SHUTDOWN_DELAY_SECS: u64 = 5;
    pub const DRAIN_TIMEOUT_SECS: u64 = 20;
    pub const ACCESS_LOG_EVERY: u64 = 100;
    pub const SLOW_REQUEST_MS: u64 = 1000;
    pub const TITLE_CASE: &str = "upper";
}

/// Where the data lives: the embedded engine's directory, or a Cassandra
/// cluster. One parser and one set of names for every service, revstore-migrate
/// and the janitor.
#[derive(Debug, Clone, clap::Args)]
pub struct StorageArgs {
    /// Directory of the embedded storage engine, used when no Cassandra is given.
    #[arg(long, env = "REVSTORE_DATA_DIR", default_value = defaults::DATA_DIR)]
    pub data_dir: PathBuf,

    /// Cassandra/ScyllaDB contact points, comma-separated host[:port]; set = Cassandra engine.
    #[arg(long, env = "REVSTORE_CASSANDRA", value_delimiter = ',')]
    pub cassandra: Vec<String>,

    /// Cassandra keyspace.
    #[arg(long, env = "REVSTORE_KEYSPACE", default_value = defaults::KEYSPACE)]
    pub keyspace: String,

    /// Local datacenter: requests go there, LOCAL_* consistency counts there.
    #[arg(long, env = "REVSTORE_CASSANDRA_DATACENTER")]
    pub cassandra_datacenter: Option<String>,

    /// Replication of a keyspace that has to be created: `3`, or `eqiad:3,codfw:3`. A bare factor with
    /// --cassandra-datacenter is NetworkTopologyStrategy in that datacenter (SimpleStrategy without one).
    #[arg(long, env = "REVSTORE_CASSANDRA_REPLICATION", default_value = defaults::REPLICATION)]
    pub cassandra_replication: Replication,

    /// Consistency of reads and writes: one, local_one, quorum, local_quorum, each_quorum, all.
    #[arg(long, env = "REVSTORE_CASSANDRA_CONSISTENCY", default_value = defaults::CONSISTENCY)]
    pub cassandra_consistency: ConsistencyLevel,

    /// Conditional writes that must not have a winner in each datacenter (old-store's slot claims and
    /// compactions, the janitor's leases) run at SERIAL, across datacenters; false runs them at LOCAL_SERIAL:
    /// only for a switchover while every other datacenter is down and kept down (docs/OPERATIONS.md).
    #[arg(long, env = "REVSTORE_CASSANDRA_SERIAL_ACROSS_SITES", default_value_t = true, action = clap::ArgAction::Set)]
    pub cassandra_serial_across_sites: bool,

    /// Cassandra user name (with --cassandra-password-file).
    #[arg(long, env = "REVSTORE_CASSANDRA_USERNAME")]
    pub cassandra_username: Option<String>,

    /// File holding the Cassandra password.
    #[arg(long, env = "REVSTORE_CASSANDRA_PASSWORD_FILE")]
    pub cassandra_password_file: Option<PathBuf>,

    /// PEM file of the CA the Cassandra nodes' certificates chain to; set = CQL over TLS only (the
    /// system's roots are not used; a file that cannot be read or holds no certificate is refused at start).
    #[arg(long, env = "REVSTORE_CASSANDRA_TLS_CA_FILE")]
    pub cassandra_tls_ca_file: Option<PathBuf>,

    /// With TLS: check that each node's certificate names the address connected to (an IP subjectAltName);
    /// false for certificates naming hosts only (the chain to the CA is still checked).
    #[arg(long, env = "REVSTORE_CASSANDRA_TLS_VERIFY_NAME", default_value_t = true, action = clap::ArgAction::Set)]
    pub cassandra_tls_verify_name: bool,

    /// With TLS: a client certificate (PEM) for nodes that require one (with --cassandra-tls-key-file).
    #[arg(long, env = "REVSTORE_CASSANDRA_TLS_CERT_FILE")]
    pub cassandra_tls_cert_file: Option<PathBuf>,

    /// The client certificate's private key (PEM).
    #[arg(long, env = "REVSTORE_CASSANDRA_TLS_KEY_FILE")]
    pub cassandra_tls_key_file: Option<PathBuf>,

    /// Seconds a storage request may take before it fails as unavailable (503).
    #[arg(long, env = "REVSTORE_STORAGE_TIMEOUT_SECS", default_value_t = defaults::STORAGE_TIMEOUT_SECS)]
    pub storage_timeout_secs: u64,

    /// Embedded engine: seconds between its purges of expired data (0: never; the janitor can).
    #[arg(long, env = "REVSTORE_PURGE_INTERVAL_SECS", default_value_t = defaults::PURGE_INTERVAL_SECS)]
    pub purge_interval_secs: u64,
}

impl Default for StorageArgs {
    /// The embedded engine in `./data`, as with no flag and no variable set.
    fn default() -> Self {
        StorageArgs {
            data_dir: PathBuf::from(defaults::DATA_DIR),
            cassandra: Vec::new(),
            keyspace: defaults::KEYSPACE.to_owned(),
            cassandra_datacenter: None,
            cassandra_replication: defaults::REPLICATION.parse().expect("the default replication parses"),
            cassandra_consistency: defaults::CONSISTENCY.parse().expect("the default consistency parses"),
            cassandra_serial_across_sites: true,
            cassandra_username: None,
            cassandra_password_file: None,
            cassandra_tls_ca_file: None,
            cassandra_tls_verify_name: true,
            cassandra_tls_cert_file: None,
            cassandra_tls_key_file: None,
            storage_timeout_secs: defaults::STORAGE_TIMEOUT_SECS,
            purge_interval_secs: defaults::PURGE_INTERVAL_SECS,
        }
    }
}

impl StorageArgs {
    /// The storage settings, with the password file read.
    pub fn resolve(&self) -> Result<StorageSettings, SettingsError> {
        if self.cassandra.is_empty() {
            let purge_interval = (self.purge_interval_secs > 0).then(|| Duration::from_secs(self.purge_interval_secs));
            return Ok(StorageSettings::Embedded {
                data_dir: self.data_dir.clone(),
                options: EmbeddedOptions { purge_interval, ..EmbeddedOptions::default() },
            });
        }
        let mut options = CassandraOptions::new(self.cassandra.clone(), self.keyspace.clone());
        options.datacenter = self.cassandra_datacenter.clone();
        options.replication = self.cassandra_replication.clone();
        options.consistency = self.cassandra_consistency;
        options.serial_across_sites = self.cassandra_serial_across_sites;
        options.request_timeout = Duration::from_secs(self.storage_timeout_secs.max(1));
        options.credentials = match (&self.cassandra_username, &self.cassandra_password_file) {
            (Some(user), Some(file)) => {
                Some((user.clone(), read_secret_file(file, "Cassandra password")?.trim_end_matches(['\n', '\r']).to_owned()))
            }
            (None, None) => None,
            _ => return Err(SettingsError("--cassandra-username and --cassandra-password-file go together".into())),
        };
        let client_identity = match (&self.cassandra_tls_cert_file, &self.cassandra_tls_key_file) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => return Err(SettingsError("--cassandra-tls-cert-file and --cassandra-tls-key-file go together".into())),
        };
        if client_identity.is_some() && self.cassandra_tls_ca_file.is_none() {
            return Err(SettingsError("a client certificate needs TLS: set --cassandra-tls-ca-file too".into()));
        }
        if let Some(ca_file) = &self.cassandra_tls_ca_file {
            let tls = CassandraTls { ca_file: ca_file.clone(), verify_name: self.cassandra_tls_verify_name, client_identity };
            // A CA file that cannot serve is a setting to fix (exit 64), not an outage to wait out.
            tls.client_config().map_err(SettingsError)?;
            options.tls = Some(tls);
        }
        Ok(StorageSettings::Cassandra(options))
    }
}

/// The settings shared by every service; each service's own `Args` flattens this.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// Address and port to listen on (default: the service's own port on 0.0.0.0).
    #[arg(long, env = "REVSTORE_LISTEN")]
    pub listen: Option<SocketAddr>,

    #[command(flatten)]
    pub storage: StorageArgs,

    /// Bearer tokens that may write, comma-separated (rotate by listing old and new).
    #[arg(long, env = "REVSTORE_WRITE_TOKENS", value_delimiter = ',', hide_env_values = true)]
    pub write_tokens: Vec<Secret>,

    /// File with write tokens, one per line.
    #[arg(long, env = "REVSTORE_WRITE_TOKENS_FILE")]
    pub write_tokens_file: Option<PathBuf>,

    /// Bearer tokens that may read; when any is set, reads need a token (write tokens also read).
    #[arg(long, env = "REVSTORE_READ_TOKENS", value_delimiter = ',', hide_env_values = true)]
    pub read_tokens: Vec<Secret>,

    /// File with read tokens, one per line.
    #[arg(long, env = "REVSTORE_READ_TOKENS_FILE")]
    pub read_tokens_file: Option<PathBuf>,

    /// File with the key that signs page tokens (default: a key built into revstore, the same for
    /// every deployment); replicas of a service must share it.
    #[arg(long, env = "REVSTORE_PAGE_TOKEN_KEY_FILE")]
    pub page_token_key_file: Option<PathBuf>,

    /// Seconds a request may take before it is answered 503.
    #[arg(long, env = "REVSTORE_REQUEST_TIMEOUT_SECS", default_value_t = defaults::REQUEST_TIMEOUT_SECS)]
    pub request_timeout_secs: u64,

    /// Most requests worked on at once; more are answered 503 with Retry-After
    /// at once (probes and /metrics never are). Default: 64 per CPU, 64 to 1024.
    #[arg(long, env = "REVSTORE_MAX_IN_FLIGHT")]
    pub max_in_flight: Option<usize>,

    /// Most connections open at once; at the cap the one idle longest (for
    /// more than 250 ms) is closed, else new connections wait to be
    /// accepted (lowered automatically to stay below the file-descriptor limit).
    #[arg(long, env = "REVSTORE_MAX_CONNECTIONS", default_value_t = defaults::MAX_CONNECTIONS)]
    pub max_connections: usize,

    /// Seconds a request's headers may take to arrive, from their first byte
    /// (and a new connection may stay silent).
    #[arg(long, env = "REVSTORE_HEADER_READ_TIMEOUT_SECS", default_value_t = defaults::HEADER_READ_TIMEOUT_SECS)]
    pub header_read_timeout_secs: u64,

    /// Seconds a kept-alive connection may stay idle between requests (told
    /// to clients in `Keep-Alive: timeout=…`); longer than common clients'
    /// own idle timeouts, so that they close first.
    #[arg(long, env = "REVSTORE_IDLE_TIMEOUT_SECS", default_value_t = defaults::IDLE_TIMEOUT_SECS)]
    pub idle_timeout_secs: u64,

    /// The memory this service may use, in MB: set the Kubernetes memory
    /// limit from it. SQLite's page cache, the request bodies in flight and
    /// old-store's caches are derived from it (see OPERATIONS.md).
    #[arg(long, env = "REVSTORE_MEMORY_BUDGET_MB", default_value_t = defaults::MEMORY_BUDGET_MB)]
    pub memory_budget_mb: u64,

    /// Largest request body accepted, in bytes.
    #[arg(long, env = "REVSTORE_BODY_LIMIT_BYTES", default_value_t = defaults::BODY_LIMIT_BYTES)]
    pub body_limit_bytes: usize,

    /// On SIGTERM: seconds to keep serving with /readyz at 503, so load balancers stop sending.
    #[arg(long, env = "REVSTORE_SHUTDOWN_DELAY_SECS", default_value_t = defaults::SHUTDOWN_DELAY_SECS)]
    pub shutdown_delay_secs: u64,

    /// Then: seconds in-flight requests get to finish before they are cut.
    #[arg(long, env = "REVSTORE_DRAIN_TIMEOUT_SECS", default_value_t = defaults::DRAIN_TIMEOUT_SECS)]
    pub drain_timeout_secs: u64,

    /// Create the schema at start (default: yes on the embedded engine, no on
    /// Cassandra, where `revstore-migrate` does it once).
    #[arg(long, env = "REVSTORE_MIGRATE_ON_START")]
    pub migrate_on_start: Option<bool>,

    /// Log one in this many successful requests at info (1: every request; 0:
    /// none); the others are logged at debug. Server errors, client errors and
    /// slow requests are always logged.
    #[arg(long, env = "REVSTORE_ACCESS_LOG_EVERY", default_value_t = defaults::ACCESS_LOG_EVERY)]
    pub access_log_every: u64,

    /// A request slower than this many milliseconds is always logged, at warn.
    #[arg(long, env = "REVSTORE_SLOW_REQUEST_MS", default_value_t = defaults::SLOW_REQUEST_MS)]
    pub slow_request_ms: u64,

    /// First-letter rule of titles: `upper` (Wikipedia) or `sensitive` (Wiktionary).
    /// Every service of one wiki must agree.
    #[arg(long, env = "REVSTORE_TITLE_CASE", default_value = defaults::TITLE_CASE, value_parser = ["upper", "sensitive"])]
    pub title_case: String,
}

impl Default for CommonArgs {
    /// Every setting at its default, none read from the environment: where a
    /// service built in code (by `revstore up`, by a test) starts.
    fn default() -> Self {
        CommonArgs {
            listen: None,
            storage: StorageArgs::default(),
            write_tokens: Vec::new(),
            write_tokens_file: None,
            read_tokens: Vec::new(),
            read_tokens_file: None,
            page_token_key_file: None,
            request_timeout_secs: defaults::REQUEST_TIMEOUT_SECS,
            max_in_flight: None,
            max_connections: defaults::MAX_CONNECTIONS,
            header_read_timeout_secs: defaults::HEADER_READ_TIMEOUT_SECS,
            idle_timeout_secs: defaults::IDLE_TIMEOUT_SECS,
            memory_budget_mb: defaults::MEMORY_BUDGET_MB,
            body_limit_bytes: defaults::BODY_LIMIT_BYTES,
            shutdown_delay_secs: defaults::SHUTDOWN_DELAY_SECS,
            drain_timeout_secs: defaults::DRAIN_TIMEOUT_SECS,
            migrate_on_start: None,
            access_log_every: defaults::ACCESS_LOG_EVERY,
            slow_request_ms: defaults::SLOW_REQUEST_MS,
            title_case: defaults::TITLE_CASE.to_owned(),
        }
    }
}

/// The in-flight limit when none is set: 64 requests per CPU, from 64 to 1,024
/// (BENCHMARKS.md, "Past saturation", for what that holds on two cores).
pub fn default_max_in_flight() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (64 * cpus).clamp(64, 1024)
}

/// Settings resolved and checked: files read, storage chosen.
#[derive(Debug, Clone)]
pub struct ServiceSettings {
    pub listen: SocketAddr,
    pub storage: StorageSettings,
    pub access: Access,
    pub page_token_key: Option<Secret>,
    pub request_timeout: Duration,
    /// How many connections, and how slow and idle they may be.
    pub connections: ConnectionLimits,
    /// Most requests worked on at once (see [`crate::shedding`]).
    pub max_in_flight: usize,
    pub body_limit: usize,
    /// The memory budget, as divided so far (services take their parts).
    pub memory: crate::budget::MemoryBudget,
    pub shutdown_delay: Duration,
    pub drain_timeout: Duration,
    /// Create the schema at start.
    pub migrate_on_start: bool,
    /// How titles are normalised.
    pub titles: TitleRules,
    /// Which requests get an access log line at info.
    pub access_log: AccessLog,
}

/// Which requests get an access log line at info: every request that failed
/// or was slow, and one in `every` of the others (the rest go to debug).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessLog {
    /// 1: every request; 0: only failed and slow ones.
    pub every: u64,
    pub slow: Duration,
}

/// A flag's value parser: whole seconds within `range`, as a `Duration`.
pub fn seconds(range: impl std::ops::RangeBounds<u64>) -> impl clap::builder::TypedValueParser<Value = Duration> {
    use clap::builder::TypedValueParser as _;
    clap::value_parser!(u64).range(range).map(Duration::from_secs)
}

/// A setting that cannot be used, said so that the operator can fix it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SettingsError(pub String);

impl From<crate::budget::BudgetError> for SettingsError {
    fn from(e: crate::budget::BudgetError) -> Self {
        SettingsError(e.0)
    }
}

fn read_secret_file(path: &PathBuf, what: &str) -> Result<String, SettingsError> {
    std::fs::read_to_string(path).map_err(|e| SettingsError(format!("cannot read the {what} file {}: {e}", path.display())))
}

/// The tokens given inline and in the file, each checked by the one rule of
/// [`revstore_client::tokens`].
fn tokens(inline: &[Secret], file: Option<&PathBuf>, what: &str) -> Result<Vec<Secret>, SettingsError> {
    use revstore_client::tokens::{check_token, read_token_file};
    let mut all = Vec::new();
    for token in inline.iter().map(|t| t.expose().trim()).filter(|t| !t.is_empty()) {
        check_token(token, what).map_err(|e| SettingsError(e.to_string()))?;
        all.push(Secret::new(token));
    }
    if let Some(path) = file {
        all.extend(read_token_file(path, what).map_err(|e| SettingsError(e.to_string()))?.into_iter().map(Secret::new));
    }
    Ok(all)
}

impl CommonArgs {
    /// Reads the files the settings name and checks what can be checked
    /// without reaching the storage.
    pub fn resolve(&self, default_port: u16) -> Result<ServiceSettings, SettingsError> {
        let mut storage = self.storage.resolve()?;
        let sqlite_connections = match &storage {
            StorageSettings::Embedded { options, .. } => options.readers + 1,
            StorageSettings::Cassandra(_) => 0,
        };
        let memory = crate::budget::MemoryBudget::plan(self.memory_budget_mb, self.body_limit_bytes, sqlite_connections)?;
        if let StorageSettings::Embedded { options, .. } = &mut storage {
            options.cache_kib = memory.sqlite_cache_kib;
        }
        let write = tokens(&self.write_tokens, self.write_tokens_file.as_ref(), "write token")?;
        let read = tokens(&self.read_tokens, self.read_tokens_file.as_ref(), "read token")?;
        let page_token_key = match &self.page_token_key_file {
            Some(path) => Some(Secret::new(read_secret_file(path, "page token key")?.trim())),
            None => None,
        };
        if self.body_limit_bytes == 0 || self.request_timeout_secs == 0 {
            return Err(SettingsError("the body limit and the request timeout must be above zero".into()));
        }
        if self.max_in_flight == Some(0) {
            return Err(SettingsError("the in-flight request limit must be above zero".into()));
        }
        if self.max_connections == 0 || self.header_read_timeout_secs == 0 || self.idle_timeout_secs == 0 {
            return Err(SettingsError("the connection cap, the header-read timeout and the idle timeout must be above zero".into()));
        }
        Ok(ServiceSettings {
            listen: self.listen.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], default_port))),
            access: Access::new(&write, if read.is_empty() { None } else { Some(&read) }),
            page_token_key,
            request_timeout: Duration::from_secs(self.request_timeout_secs),
            connections: ConnectionLimits {
                max_connections: self.max_connections,
                header_read_timeout: Duration::from_secs(self.header_read_timeout_secs),
                idle_timeout: Duration::from_secs(self.idle_timeout_secs),
            },
            max_in_flight: self.max_in_flight.unwrap_or_else(default_max_in_flight),
            body_limit: self.body_limit_bytes,
            memory,
            shutdown_delay: Duration::from_secs(self.shutdown_delay_secs),
            drain_timeout: Duration::from_secs(self.drain_timeout_secs),
            migrate_on_start: self.migrate_on_start.unwrap_or(matches!(storage, StorageSettings::Embedded { .. })),
            titles: TitleRules {
                first_letter: if self.title_case == "sensitive" { FirstLetterCase::Sensitive } else { FirstLetterCase::Upper },
            },
            access_log: AccessLog { every: self.access_log_every, slow: Duration::from_millis(self.slow_request_ms) },
            storage,
        })
    }
}

/// Parses the command line; `--help` and `--version` print and exit 0, anything
/// invalid prints the reason and exits 64.
pub fn parse_args_or_exit<T: clap::Parser>() -> T {
    parse_from_or_exit(std::env::args_os())
}

/// [`parse_args_or_exit`] over given arguments.
pub fn parse_from_or_exit<T: clap::Parser, I: IntoIterator<Item = impl Into<std::ffi::OsString> + Clone>>(args: I) -> T {
    T::try_parse_from(args).unwrap_or_else(|e| exit_on_clap_error(e))
}

/// Ends the process for what parsing a command line said: `--help` and
/// `--version` print and exit 0, anything invalid prints the reason and exits 64.
pub fn exit_on_clap_error(e: clap::Error) -> ! {
    let _ = e.print();
    match e.kind() {
        clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => std::process::exit(0),
        _ => std::process::exit(64),
    }
}

/// Ends the process for a settings error, with exit code 64.
pub fn exit_on_settings_error(service: &str, error: SettingsError) -> ! {
    eprintln!("{service}: invalid settings: {error}");
    std::process::exit(64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Args {
        #[command(flatten)]
        common: CommonArgs,
    }

    fn resolve(args: &[&str]) -> Result<ServiceSettings, SettingsError> {
        Args::try_parse_from(std::iter::once("svc").chain(args.iter().copied())).expect("parses").common.resolve(8081)
    }

    #[test]
    fn defaults_give_the_embedded_engine_on_the_service_port() {
        let s = resolve(&[]).unwrap();
        assert_eq!(s.listen, SocketAddr::from(([0, 0, 0, 0], 8081)));
        assert!(matches!(s.storage, StorageSettings::Embedded { ref data_dir, .. } if data_dir == &PathBuf::from("./data")));
        let s = resolve(&["--cassandra", "a:9042,b", "--keyspace", "ks", "--cassandra-consistency", "quorum"]).unwrap();
        match s.storage {
            StorageSettings::Cassandra(o) => {
                assert_eq!(o.contact_points, vec!["a:9042", "b"]);
                assert_eq!((o.keyspace.as_str(), o.consistency), ("ks", ConsistencyLevel::Quorum));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_default_value_is_the_command_line_without_flags() {
        // Built in code or parsed from nothing (the environment aside), a service gets the same settings.
        let parsed = format!("{:?}", resolve(&[]).unwrap());
        let built = format!("{:?}", CommonArgs::default().resolve(8081).unwrap());
        assert_eq!(parsed, built);
    }

    #[test]
    fn secrets_come_from_files_and_never_show() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, "# rotated 2026-11\nfirst-token-0123456789\n\nsecond-token-0123456789\n").unwrap();
        let password = dir.path().join("password");
        std::fs::write(&password, "hunter2-cassandra\n").unwrap();
        let s = resolve(&[
            "--write-tokens-file",
            tokens.to_str().unwrap(),
            "--cassandra",
            "db",
            "--cassandra-username",
            "revstore",
            "--cassandra-password-file",
            password.to_str().unwrap(),
        ])
        .unwrap();
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::AUTHORIZATION, "Bearer second-token-0123456789".parse().unwrap());
        assert!(s.access.check_write(&headers).is_ok());
        let shown = format!("{s:?}");
        for secret in ["first-token", "second-token", "hunter2"] {
            assert!(!shown.contains(secret), "{secret} leaked into {shown}");
        }
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn unusable_settings_say_why() {
        let err = |args: &[&str]| resolve(args).unwrap_err().to_string();
        assert!(err(&["--write-tokens", "short"]).contains("at least 16"));
        assert!(err(&["--write-tokens-file", "/nonexistent/tokens"]).contains("cannot read the write token file"));
        assert!(err(&["--cassandra", "db", "--cassandra-username", "u"]).contains("go together"));
        assert!(err(&["--body-limit-bytes", "0"]).contains("above zero"));
        assert!(Args::try_parse_from(["svc", "--listen", "not an address"]).is_err());
        assert!(Args::try_parse_from(["svc", "--cassandra-consistency", "most"]).is_err());
    }
}
