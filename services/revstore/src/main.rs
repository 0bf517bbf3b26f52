//! `revstore`: the whole system on one machine.
//!
//! `revstore up` runs current-store, old-store and dependency-graph side by
//! side in this process, each on the embedded engine under `DIR/<service>`
//! (or on Cassandra when `--cassandra`/`REVSTORE_CASSANDRA` is set, its schema
//! created first), built from settings values and started by the platform's
//! one start-up sequence (`revstore_service::start`), wired to each other:
//! current-store hands first renders to old-store, reads old revisions from
//! it and sends change notices to the graph. The janitor runs on a schedule (`--janitor-every-secs`), its last
//! summary in `DIR/janitor.json`. The write token is
//! `REVSTORE_WRITE_TOKENS`' first, else the one kept in `DIR/write-token`
//! (generated on first start). Ctrl-C or SIGTERM drains and stops everything.
//! One memory budget (`--memory-budget-mb`) bounds the process: the services
//! share it, and the runtime's blocking threads are sized from it.
//! The separate binaries (`revstore-current-store`, …) stay for Kubernetes.
//!
//! `revstore import DUMP` loads a MediaWiki XML history dump into the running
//! system: every revision into old-store, each page's template dependencies
//! into the graph (`revstore_dump_import`).
//!
//! `revstore dump --current --domain D --out DIR` writes a domain's current
//! renders as compressed NDJSON shards and a manifest (`dump.rs`).
//!
//! `revstore backup DATA_DIR DEST` copies the embedded databases while the
//! services run; `revstore restore DEST DATA_DIR` puts them back into an
//! empty data directory, the services stopped
//! (`revstore_storage::embedded::backup`).

mod dump;
mod enterprise;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use revstore_current_store::CurrentStore;
use revstore_dependency_graph::DependencyGraph;
use revstore_old_store::OldStore;
use revstore_service::settings::defaults;
use revstore_service::{BoxError, CommonArgs, ServiceDefinition, StorageArgs, serve_all, shutdown_signal, start};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(name = "revstore", version, about = "revstore: the storage tier of a wiki, on one machine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Runs current-store, old-store and dependency-graph, wired to each
    /// other, and the janitor on a schedule, until Ctrl-C or SIGTERM.
    Up(UpArgs),
    /// Loads a MediaWiki XML history dump (.xml, .7z, .bz2, .gz) into the
    /// running system: revisions into old-store, each page's templates into
    /// the dependency graph.
    Import(revstore_dump_import::cli::ImportArgs),
    /// Writes a domain's current renders (`--current`) or its whole history
    /// (`--history`) to compressed NDJSON shards and a manifest, several
    /// slices at once, resumable (`--resume`).
    Dump(dump::DumpArgs),
    /// Copies every embedded database of a data directory (`revstore up`'s or
    /// one service's) into a new directory, while the services run.
    Backup {
        /// The data directory to back up.
        data_dir: PathBuf,
        /// A new (or empty) directory for the copy.
        destination: PathBuf,
    },
    /// Copies a backup into an empty data directory; the services using it
    /// must be stopped.
    Restore {
        /// A directory made by `revstore backup`.
        backup: PathBuf,
        /// The data directory to restore into (new, or holding no database).
        data_dir: PathBuf,
    },
}

/// `revstore up`'s settings. The services are built from these values, not
/// from their binaries' command lines: a `REVSTORE_*` variable meant for a
/// service binary (a listen address, a peer URL, read tokens) does not reach
/// the services of `revstore up`; only the settings below do.
#[derive(Debug, clap::Args)]
struct UpArgs {
    /// The storage: on the embedded engine (no --cassandra), each service's
    /// store lives in DATA_DIR/<service>; the write token is kept in
    /// DATA_DIR/write-token either way.
    #[command(flatten)]
    storage: StorageArgs,
    /// Address the services listen on (0.0.0.0: every address, as in a container).
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// current-store's port (0: any free one; the start-up line says which).
    #[arg(long, default_value_t = revstore_current_store::DEFAULT_PORT)]
    current_store_port: u16,
    /// old-store's port (0: any free one).
    #[arg(long, default_value_t = revstore_old_store::DEFAULT_PORT)]
    old_store_port: u16,
    /// dependency-graph's port (0: any free one).
    #[arg(long, default_value_t = revstore_dependency_graph::DEFAULT_PORT)]
    graph_port: u16,
    /// Seconds between janitor runs (the first runs this long after the start).
    #[arg(long, env = "REVSTORE_UP_JANITOR_EVERY_SECS", default_value_t = 3600)]
    janitor_every_secs: u64,
    /// First-letter rule of titles: `upper` (Wikipedia) or `sensitive` (Wiktionary).
    #[arg(long, env = "REVSTORE_TITLE_CASE", default_value = defaults::TITLE_CASE, value_parser = ["upper", "sensitive"])]
    title_case: String,
    /// The memory the whole process may use, in MB: set the container's limit
    /// 10-15% above it. old-store gets half (its caches and compactions),
    /// current-store and the graph a quarter each; each divides its share as
    /// its own binary divides its budget (about 850 at least, with the default
    /// body and block sizes).
    #[arg(long, env = "REVSTORE_MEMORY_BUDGET_MB", default_value_t = defaults::MEMORY_BUDGET_MB)]
    memory_budget_mb: u64,
}

/// How `revstore up` divides its memory budget among its services, in
/// quarters: old-store's block cache, decodes and compactions are what grow
/// with the load; the other two hold a page or a listing at a time.
const BUDGET_QUARTERS: [(&str, u64); 3] = [(OldStore::NAME, 2), (CurrentStore::NAME, 1), (DependencyGraph::NAME, 1)];

/// A service's share of `revstore up`'s budget, in MB.
fn budget_share(service: &str, total_mb: u64) -> u64 {
    BUDGET_QUARTERS.iter().find(|(name, _)| *name == service).map_or(0, |(_, quarters)| total_mb * quarters / 4)
}

fn main() -> ExitCode {
    revstore_service::allocator::tune();
    let args = match revstore_service::parse_args_or_exit::<Cli>().command {
        Command::Up(args) => return run_up(args),
        other => other,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("revstore: cannot start the runtime: {e}");
            return ExitCode::from(70);
        }
    };
    runtime.block_on(async move {
        match args {
            Command::Up(_) => unreachable!("handled above"),
            Command::Import(args) => revstore_dump_import::cli::run(args).await,
            Command::Dump(args) => dump::run(args).await,
            Command::Backup { data_dir, destination } => {
                copy("backup", move || revstore_storage::embedded::backup::backup(&data_dir, &destination)).await
            }
            Command::Restore { backup, data_dir } => {
                copy("restore", move || revstore_storage::embedded::backup::restore(&backup, &data_dir)).await
            }
        }
    })
}

/// `revstore up`: its services' settings first (a budget or a setting that
/// cannot work exits 64 before anything starts), then one runtime for the
/// process with the blocking threads of the three services' budgets together
/// (tokio's default of 512 would let each thread's allocator heap grow the
/// process past its budget), then the services until Ctrl-C or SIGTERM.
fn run_up(args: UpArgs) -> ExitCode {
    let plan = match UpPlan::new(args) {
        Ok(plan) => plan,
        Err(UpError::Settings(e)) => revstore_service::exit_on_settings_error("revstore up", e),
        Err(UpError::Other(e)) => {
            eprintln!("revstore up: {e}");
            return ExitCode::from(1);
        }
    };
    let blocking_threads = plan.services.iter().map(|s| s.memory.blocking_threads).sum();
    revstore_service::budget::set_process_budget(plan.services.iter().map(|s| s.memory.total()).sum());
    let runtime = match revstore_service::launch::service_runtime(blocking_threads) {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("revstore up: cannot start the runtime: {e}");
            return ExitCode::from(70);
        }
    };
    runtime.block_on(async move {
        let telemetry = match revstore_telemetry::init("revstore") {
            Ok(guard) => guard,
            Err(e) => {
                eprintln!("revstore: {e}");
                return ExitCode::from(70);
            }
        };
        tracing::info!(
            service = "revstore",
            budget_mb = plan.args.memory_budget_mb,
            blocking_threads,
            division = %[OldStore::NAME, DependencyGraph::NAME, CurrentStore::NAME]
                .iter()
                .zip(&plan.services)
                .map(|(name, s)| format!("{name} {} MB", s.memory.total() >> 20))
                .collect::<Vec<_>>()
                .join(", "),
            "memory budget"
        );
        let code = match up(plan).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = %e, "revstore up stopped");
                eprintln!("revstore up: {e}");
                ExitCode::from(1)
            }
        };
        telemetry.shutdown();
        code
    })
}

/// Why `revstore up` cannot start: a setting (exit 64), or anything else.
#[derive(Debug)]
enum UpError {
    Settings(revstore_service::SettingsError),
    Other(BoxError),
}

/// What `revstore up` starts, decided before any runtime or service: the
/// data directory's lock, the write token and each service's settings.
struct UpPlan {
    args: UpArgs,
    _lock: std::fs::File,
    token_file: PathBuf,
    token_origin: TokenOrigin,
    /// old-store, the graph and current-store, in the order they start.
    services: [revstore_service::ServiceSettings; 3],
}

impl UpPlan {
    fn new(args: UpArgs) -> Result<UpPlan, UpError> {
        let data_dir = args.storage.data_dir.clone();
        let lock = lock_data_dir(&data_dir).map_err(UpError::Other)?;
        let (token_file, token_origin) = write_token(&data_dir).map_err(UpError::Other)?;
        let shared = |service: &str, port: u16| {
            CommonArgs {
                listen: Some(SocketAddr::new(args.host, port)),
                storage: StorageArgs { data_dir: data_dir.join(service), ..args.storage.clone() },
                write_tokens_file: Some(token_file.clone()),
                shutdown_delay_secs: 0,
                migrate_on_start: Some(true),
                title_case: args.title_case.clone(),
                memory_budget_mb: budget_share(service, args.memory_budget_mb),
                ..CommonArgs::default()
            }
            .resolve(port)
            .map_err(|e| UpError::Settings(revstore_service::SettingsError(format!("{service}: {e}"))))
        };
        let services = [
            shared(OldStore::NAME, args.old_store_port)?,
            shared(DependencyGraph::NAME, args.graph_port)?,
            shared(CurrentStore::NAME, args.current_store_port)?,
        ];
        Ok(UpPlan { _lock: lock, token_file, token_origin, services, args })
    }
}

/// Runs a backup or a restore and reports it: exit 0, 65 for a refused
/// request (not empty, not a backup), 75 when a directory is in use or
/// cannot be read or written.
async fn copy(
    what: &str,
    run: impl FnOnce() -> Result<revstore_storage::embedded::backup::Copied, revstore_storage::StoreError> + Send + 'static,
) -> ExitCode {
    let started = std::time::Instant::now();
    match tokio::task::spawn_blocking(run).await {
        Ok(Ok(copied)) => {
            let databases: Vec<String> = copied.databases.iter().map(|d| d.display().to_string()).collect();
            eprintln!(
                "revstore {what}: {} database(s), {:.1} MB, {:.1} s: {}",
                databases.len(),
                copied.bytes as f64 / 1e6,
                started.elapsed().as_secs_f64(),
                databases.join(", ")
            );
            ExitCode::SUCCESS
        }
        Ok(Err(revstore_storage::StoreError::Invalid(reason))) => {
            eprintln!("revstore {what}: {reason}");
            ExitCode::from(65)
        }
        Ok(Err(e)) => {
            eprintln!("revstore {what}: {e}");
            ExitCode::from(75)
        }
        Err(e) => {
            eprintln!("revstore {what}: {e}");
            ExitCode::from(70)
        }
    }
}

async fn up(plan: UpPlan) -> Result<(), BoxError> {
    let UpPlan { args, _lock, token_file, token_origin, services: [old_store_settings, graph_settings, current_settings_shared] } = plan;
    let data_dir = args.storage.data_dir.clone();
    // Listening on every address (in a container): the services call each other on the loopback.
    // The URLs are those of the bound listeners, so a port of 0 (any free one) works too.
    let peer_host = if args.host.is_unspecified() { IpAddr::from([127, 0, 0, 1]) } else { args.host };
    let url = |listener: &tokio::net::TcpListener| -> Result<String, BoxError> {
        Ok(format!("http://{}", SocketAddr::new(peer_host, listener.local_addr()?.port())))
    };
    let old_store = start::<OldStore>(old_store_settings, Default::default()).await?;
    let graph = start::<DependencyGraph>(graph_settings, Default::default()).await?;
    let (old_url, graph_url) = (url(&old_store.1)?, url(&graph.1)?);
    let current_settings = revstore_current_store::Settings {
        old_store_url: Some(old_url.clone()),
        graph_url: Some(graph_url.clone()),
        notify_graph: true,
        peer_token_file: Some(token_file.clone()),
        ..Default::default()
    };
    let current = start::<CurrentStore>(current_settings_shared, current_settings).await?;
    let current_url = url(&current.1)?;

    let janitor = revstore_janitor::Settings {
        current_store_url: Some(current_url.clone()),
        old_store_url: Some(old_url.clone()),
        graph_url: Some(graph_url.clone()),
        peer_token_file: Some(token_file.clone()),
        ..Default::default()
    };
    let token = token_file.display().to_string();
    let stop = CancellationToken::new();
    let every = Duration::from_secs(args.janitor_every_secs.max(1));
    let schedule = tokio::spawn(janitor_schedule(janitor, every, data_dir.join("janitor.json"), stop.clone()));
    tracing::info!(service = "revstore", current_store = %current_url, old_store = %old_url, dependency_graph = %graph_url, write_token_file = %token, "revstore is up");
    #[allow(clippy::print_stdout)]
    {
        // The token itself only when it was generated on this start and a
        // person is watching: stdout of a container ends up in its logs.
        use std::io::IsTerminal;
        let shown = match token_origin {
            TokenOrigin::Generated if std::io::stdout().is_terminal() => {
                format!("a new write token, {}, kept in {token}", std::fs::read_to_string(&token_file).unwrap_or_default().trim())
            }
            _ => format!("the write token is kept in {token}"),
        };
        println!(
            "revstore is up: current-store {current_url}, old-store {old_url}, dependency-graph {graph_url}; the janitor every {}s\n\
             {shown}; Ctrl-C stops everything",
            args.janitor_every_secs.max(1),
        );
    }
    let served = serve_all(vec![old_store, graph, current], shutdown_signal()).await;
    stop.cancel();
    let _ = schedule.await;
    served
}

/// Takes `DIR/LOCK` for as long as the returned file lives, so that a second
/// `revstore up` on the same directory stops before it changes anything in it.
fn lock_data_dir(data_dir: &Path) -> Result<std::fs::File, BoxError> {
    std::fs::create_dir_all(data_dir).map_err(|e| format!("cannot create {}: {e}", data_dir.display()))?;
    let path = data_dir.join("LOCK");
    let lock = std::fs::File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    lock.try_lock().map_err(|_| format!("data directory {} is in use by another revstore up", data_dir.display()))?;
    Ok(lock)
}

/// Where the write token comes from on this start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenOrigin {
    Given,
    Kept,
    Generated,
}

/// The write token's file: `REVSTORE_WRITE_TOKENS`' first token, else the one
/// kept there, else a new one; readable by its owner only. Call it with the
/// directory's lock held.
fn write_token(data_dir: &Path) -> Result<(PathBuf, TokenOrigin), BoxError> {
    use revstore_client::tokens::{parse_token_list, read_peer_token};
    let path = data_dir.join("write-token");
    let given = match std::env::var("REVSTORE_WRITE_TOKENS") {
        Ok(list) => parse_token_list(&list, "write token")?.into_iter().next(),
        Err(_) => None,
    };
    let (token, origin) = match given {
        Some(given) => (given, TokenOrigin::Given),
        None if path.exists() => {
            // Checked now, not by the first service to read it.
            read_peer_token(&path, "write token")?;
            return Ok((path, TokenOrigin::Kept));
        }
        None => (format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple()), TokenOrigin::Generated),
    };
    std::fs::write(&path, format!("{token}\n")).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok((path, origin))
}

/// How often `revstore up`'s janitor visits every page (its other runs visit
/// what changed since the last), as the daily CronJob does.
const FULL_JANITOR_EVERY: Duration = Duration::from_secs(86_400);

/// Runs the janitor every `every` until `stop`, as the CronJobs would: a
/// routine run (scope `changed`) each time, a full one first and then once a
/// day. The last run's summary is kept in `summary_file`.
async fn janitor_schedule(settings: revstore_janitor::Settings, every: Duration, summary_file: PathBuf, stop: CancellationToken) {
    // Settings a janitor cannot run with are said at the start, not an hour later.
    if let Err(e) = revstore_janitor::Janitor::new(settings.clone()) {
        tracing::error!(service = "janitor", error = %e, "the janitor cannot run");
        return;
    }
    let mut last_full: Option<std::time::Instant> = None;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let scope = match last_full {
            Some(at) if at.elapsed() < FULL_JANITOR_EVERY => revstore_janitor::Scope::Changed,
            _ => revstore_janitor::Scope::All,
        };
        // A janitor per run, as each CronJob run is: each has a run id of its own.
        let janitor = match revstore_janitor::Janitor::new(revstore_janitor::Settings { scope, ..settings.clone() }) {
            Ok(janitor) => janitor,
            Err(e) => {
                tracing::error!(service = "janitor", error = %e, "the janitor cannot run");
                return;
            }
        };
        let (outcome, summary) = janitor.run(stop.clone()).await;
        if scope == revstore_janitor::Scope::All && outcome == revstore_janitor::RunOutcome::Completed {
            last_full = Some(std::time::Instant::now());
        }
        // A failed run (a 403 from a changed token, a service down) is the
        // operator's to see: warn, with what the summary says stopped it.
        if outcome == revstore_janitor::RunOutcome::Failed {
            tracing::warn!(service = "janitor", outcome = ?outcome, stopped = ?summary.stopped, summary = %summary_file.display(), "janitor run failed");
        } else {
            tracing::info!(service = "janitor", outcome = ?outcome, stopped = ?summary.stopped, summary = %summary_file.display(), "janitor run");
        }
        if let Err(e) = std::fs::write(&summary_file, serde_json::to_vec(&summary).unwrap_or_default()) {
            tracing::warn!(error = %e, file = %summary_file.display(), "cannot keep the janitor's summary");
        }
    }
}
