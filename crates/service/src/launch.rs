//! Starting services and jobs: what every binary's `main` shares.
//!
//! A service is defined once ([`ServiceDefinition`]: name, default port,
//! schema component, its own settings type, how to build it from them and a
//! [`Context`]) and built into a value ([`Service`]: its platform, router and
//! workers). Its settings are values: the binary parses them from its command
//! line ([`CommandLine`]: the shared settings and the service's own struct,
//! which is its own flags too), `revstore up` and the tests build them in code, and
//! all three start the service through [`start`] (bind, open, build). A
//! binary serves one ([`service_main`]); a process can serve several side by
//! side, each with its own store and listener ([`serve_all`]). A job
//! ([`run_task`], the janitor) gets the same shutdown signal, no listener,
//! and ends with an exit code.

use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use axum::routing::MethodRouter;
use revstore_schema::Component;
use revstore_storage::Store;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::janitor_admin::{JanitorAdmin, Sweep};
use crate::server::Platform;
use crate::settings::{CommonArgs, ServiceSettings, SettingsError, exit_on_settings_error};

pub use crate::BoxError;

/// Resolves when the service must shut down.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The command line of a service binary: the settings every service shares
/// and the service's own, each a flag and a `REVSTORE_*` variable. The
/// service's settings struct is its flags: one declaration, parsed here and
/// built in code by `revstore up` and the tests.
#[derive(Debug, Clone, clap::Parser)]
pub struct CommandLine<S: clap::Args> {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub own: S,
}

impl<S: clap::Args + clap::FromArgMatches> CommandLine<S> {
    /// Both kinds of settings as values: the shared ones resolved (files
    /// read, the memory budget divided), the service's own checked.
    pub fn settings<D: ServiceDefinition<Settings = S>>(self) -> Result<(ServiceSettings, S), SettingsError> {
        let common = self.common.resolve(D::DEFAULT_PORT)?;
        D::validate(&self.own)?;
        Ok((common, self.own))
    }
}

/// The settings of a service with none of its own.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct NoSettings {}

/// The value of settings struct `S` when no flag is given and no variable is
/// set: each field at its flag's default. A settings struct's `Default` is
/// this, so that the value `revstore up` and the tests start from cannot
/// drift from what the binary does without flags.
pub fn command_line_defaults<S: clap::Args + clap::FromArgMatches>() -> S {
    let command = S::augment_args(clap::Command::new("defaults")).mut_args(|arg| arg.env(None::<&str>));
    let matches = command.try_get_matches_from(["defaults"]).expect("every setting has a default or is optional");
    S::from_arg_matches(&matches).expect("a setting's default parses")
}

/// What a service is built from: its store (opened, its schema migrated when
/// the settings say so) and its resolved settings.
#[derive(Debug)]
pub struct Context {
    pub store: Store,
    pub settings: ServiceSettings,
}

impl Context {
    /// Opens the storage the settings name for the service whose tables are `schema`.
    pub async fn open(settings: ServiceSettings, schema: &'static Component) -> Result<Context, BoxError> {
        let store = open_store(&settings, schema).await?;
        Ok(Context { store, settings })
    }
}

/// A kind of service: its name, port, tables, and how to build one.
pub trait ServiceDefinition: 'static {
    /// Its own settings, beside the shared [`ServiceSettings`]: a struct whose
    /// fields are its flags, whose `Default` is [`command_line_defaults`].
    type Settings: clap::Args + clap::FromArgMatches + Clone + Default + std::fmt::Debug + Send + 'static;
    /// `current-store`, `old-store`…: logs, metrics.
    const NAME: &'static str;
    /// Its binary's name (`revstore-current-store`…) and one-line description.
    const BINARY: &'static str;
    const ABOUT: &'static str;
    const DEFAULT_PORT: u16;
    /// Its tables: migrated at start (when asked) and checked by `/readyz`.
    const SCHEMA: &'static Component;

    /// Checks what one flag's parser cannot: settings that only work together.
    /// Called on every way a service starts ([`start`]).
    fn validate(_settings: &Self::Settings) -> Result<(), SettingsError> {
        Ok(())
    }

    /// Builds the service (routes, workers) from its settings and context.
    fn build(settings: Self::Settings, context: Context) -> impl Future<Output = Result<Service, BoxError>> + Send;
}

/// The command line of `D`'s binary, with its name and description.
pub fn command_of<D: ServiceDefinition>() -> clap::Command {
    use clap::CommandFactory;
    CommandLine::<D::Settings>::command().name(D::BINARY).bin_name(D::BINARY).about(D::ABOUT).version(env!("CARGO_PKG_VERSION"))
}

/// `D`'s command line parsed from `args` (the program's name first).
pub fn parse_command_line<D: ServiceDefinition>(
    args: impl IntoIterator<Item = impl Into<std::ffi::OsString> + Clone>,
) -> Result<CommandLine<D::Settings>, clap::Error> {
    use clap::FromArgMatches;
    let matches = command_of::<D>().try_get_matches_from(args)?;
    CommandLine::from_arg_matches(&matches)
}

/// A service's routes with their path templates remembered: the contract
/// test compares them with the OpenAPI document.
#[derive(Debug)]
pub struct Routes<S = ()> {
    router: Router<S>,
    templates: Vec<String>,
}

impl<S: Clone + Send + Sync + 'static> Default for Routes<S> {
    fn default() -> Self {
        Routes { router: Router::new(), templates: Vec::new() }
    }
}

impl<S: Clone + Send + Sync + 'static> Routes<S> {
    pub fn new() -> Self {
        Routes::default()
    }

    pub fn route(mut self, path: &str, method_router: MethodRouter<S>) -> Self {
        self.router = self.router.route(path, method_router);
        self.templates.push(path.to_owned());
        self
    }

    pub fn with_state(self, state: S) -> Routes {
        Routes { router: self.router.with_state(state), templates: self.templates }
    }

    /// These routes and `other`'s (their paths must not overlap).
    pub fn merge(mut self, other: Routes<S>) -> Self {
        self.router = self.router.merge(other.router);
        self.templates.extend(other.templates);
        self
    }
}

/// A service built and ready to serve: its platform (store, settings,
/// workers) and its complete router.
#[derive(Debug)]
pub struct Service {
    platform: Platform,
    router: Router,
    templates: Vec<String>,
}

impl Service {
    /// The service of `platform` serving `routes` (inside the platform's
    /// layers and ops routes).
    pub fn new(platform: Platform, routes: Routes) -> Self {
        Service::with_sweeps(platform, routes, Vec::new())
    }

    /// The service, also offering the janitor these sweeps of its tables.
    /// Every service answers the janitor's lease and purge calls (see
    /// [`crate::janitor_admin`]).
    pub fn with_sweeps(platform: Platform, routes: Routes, sweeps: Vec<Arc<dyn Sweep>>) -> Self {
        let routes = routes.merge(JanitorAdmin::new(platform.clone(), sweeps).routes());
        let router = platform.router(routes.router);
        Service { platform, router, templates: routes.templates }
    }

    pub fn name(&self) -> &'static str {
        self.platform.service()
    }

    pub fn platform(&self) -> &Platform {
        &self.platform
    }

    /// The path templates of the service's own routes (ops routes excluded).
    pub fn route_templates(&self) -> &[String] {
        &self.templates
    }

    /// Serves on `listener` until `shutdown` resolves, then shuts down
    /// gracefully (see [`crate::server`]).
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()> + Send) -> Result<(), BoxError> {
        let name = self.name();
        tracing::info!(service = name, address = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), "listening");
        crate::server::serve(self.platform, self.router, listener, shutdown).await.map_err(|e| format!("{name}: serving: {e}").into())
    }
}

/// Why a service did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Its address is taken or not this machine's (exit 69 for a binary).
    #[error("{service}: cannot listen on {address}: {source}")]
    Listen { service: &'static str, address: std::net::SocketAddr, source: std::io::Error },
    /// Its own settings do not work together (exit 64 for a binary).
    #[error("{service}: invalid settings: {reason}")]
    Settings { service: &'static str, reason: SettingsError },
    /// Its store did not open or migrate, or the service could not be built.
    #[error("{service}: {reason}")]
    Build { service: &'static str, reason: BoxError },
}

/// The start-up of every service — its binary, `revstore up` and the test
/// harness go through it: bind the listener, open the store the settings
/// name (migrating it when they say so), build the service.
pub async fn start<D: ServiceDefinition>(settings: ServiceSettings, own: D::Settings) -> Result<(Service, TcpListener), StartError> {
    start_with::<D>(settings, own, None).await
}

/// [`start`] on a store already open (an embedded engine on an injected
/// clock, in a test), migrated by the caller.
pub async fn start_on_store<D: ServiceDefinition>(
    settings: ServiceSettings,
    own: D::Settings,
    store: Store,
) -> Result<(Service, TcpListener), StartError> {
    start_with::<D>(settings, own, Some(store)).await
}

async fn start_with<D: ServiceDefinition>(
    settings: ServiceSettings,
    own: D::Settings,
    store: Option<Store>,
) -> Result<(Service, TcpListener), StartError> {
    D::validate(&own).map_err(|reason| StartError::Settings { service: D::NAME, reason })?;
    let address = settings.listen;
    let listener = TcpListener::bind(address).await.map_err(|source| StartError::Listen { service: D::NAME, address, source })?;
    let failed = |reason: BoxError| StartError::Build { service: D::NAME, reason };
    let context = match store {
        Some(store) => Context { store, settings },
        None => Context::open(settings, D::SCHEMA).await.map_err(failed)?,
    };
    let service = D::build(own, context).await.map_err(failed)?;
    Ok((service, listener))
}

/// Serves several services side by side, each on its own listener, until
/// `shutdown` resolves or one of them fails (then the others are shut down
/// too); the first failure is the answer.
pub async fn serve_all(services: Vec<(Service, TcpListener)>, shutdown: impl Future<Output = ()> + Send) -> Result<(), BoxError> {
    let stop = CancellationToken::new();
    let mut running = tokio::task::JoinSet::new();
    for (service, listener) in services {
        let stop = stop.clone();
        running.spawn(async move {
            let result = service.serve(listener, stop.clone().cancelled_owned()).await;
            // One service ending (failed, or its listener gone) ends them all.
            stop.cancel();
            result
        });
    }
    tokio::pin!(shutdown);
    let mut first_error = None;
    loop {
        tokio::select! {
            () = &mut shutdown, if !stop.is_cancelled() => stop.cancel(),
            joined = running.join_next() => match joined {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => { first_error.get_or_insert(e); }
                Some(Err(e)) => { first_error.get_or_insert(format!("a service task failed: {e}").into()); }
            },
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Opens the storage the settings name, and creates the service's tables
/// (its schema component) there when the settings say so (the embedded
/// engine's default).
pub async fn open_store(settings: &ServiceSettings, schema: &'static Component) -> Result<Store, BoxError> {
    let mut storage = settings.storage.clone();
    match &mut storage {
        revstore_storage::StorageSettings::Embedded { options, .. } => options.metrics_service = schema.name,
        revstore_storage::StorageSettings::Cassandra(options) => options.metrics_service = schema.name,
    }
    let store = revstore_storage::open(storage).await.map_err(|e| format!("cannot open storage: {e}"))?.for_service(schema.name);
    if settings.migrate_on_start {
        // Every service keeps the janitor's lease and checkpoints for its own tables.
        let outcomes = store.migrate(&[schema, &revstore_schema::version::JANITOR]).await.map_err(|e| format!("schema migration: {e}"))?;
        for (component, outcome) in outcomes {
            // `service` names the process's service: every service also keeps the janitor's component.
            tracing::info!(service = schema.name, component, %outcome, "schema");
        }
    }
    Ok(store)
}

/// The `main` of a service binary: parses the command line (exit 64 when it
/// is wrong), starts the runtime, with as many blocking threads as the
/// memory budget allows, and telemetry (70), binds the listener (69), builds
/// the service and serves it until SIGTERM or Ctrl-C, and exits 0, or 1 when
/// the service failed.
pub fn service_main<D: ServiceDefinition>() -> ExitCode {
    let tuning = revstore_allocator::tune();
    let binary = D::BINARY;
    let line = match parse_command_line::<D>(std::env::args_os()) {
        Ok(line) => line,
        Err(e) => crate::settings::exit_on_clap_error(e),
    };
    let (settings, own) = match line.settings::<D>() {
        Ok(settings) => settings,
        Err(e) => exit_on_settings_error(binary, e),
    };
    crate::budget::set_process_budget(settings.memory.total());
    let runtime = match service_runtime(settings.memory.blocking_threads) {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{binary}: cannot start the runtime: {e}");
            return ExitCode::from(70);
        }
    };
    runtime.block_on(serve_main::<D>(binary, settings, own, tuning))
}

/// The runtime of a service process. Its blocking threads (SQLite reads,
/// block decodes and compaction) are bounded: each thread keeps an allocator
/// heap of its own, and tokio's default of 512 let a loaded old-store hold
/// about a third more memory (BENCHMARKS.md, "Memory under a long mixed load"). An idle
/// one exits after 2 s, giving its heap back.
pub fn service_runtime(blocking_threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(blocking_threads.max(1))
        .thread_keep_alive(std::time::Duration::from_secs(2))
        .build()
}

async fn serve_main<D: ServiceDefinition>(
    binary: &str,
    settings: ServiceSettings,
    own: D::Settings,
    tuning: revstore_allocator::Tuning,
) -> ExitCode {
    let telemetry = match revstore_telemetry::init(D::NAME) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("{binary}: {e}");
            return ExitCode::from(70);
        }
    };
    tracing::info!(
        service = D::NAME,
        purge_delay_ms = tuning.purge_delay_ms,
        huge_pages_disabled = tuning.huge_pages_disabled,
        blocking_threads = settings.memory.blocking_threads,
        "allocator and runtime"
    );
    let code = match start::<D>(settings, own).await {
        Err(StartError::Listen { address, source, .. }) => {
            tracing::error!(%address, error = %source, "cannot listen");
            ExitCode::from(69)
        }
        Err(e @ StartError::Settings { .. }) => {
            tracing::error!(error = %e, "{} stopped", D::NAME);
            eprintln!("{binary}: {e}");
            ExitCode::from(64)
        }
        Err(e) => {
            tracing::error!(error = %e, "{} stopped", D::NAME);
            ExitCode::from(1)
        }
        Ok((service, listener)) => match service.serve(listener, crate::server::shutdown_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = %e, "{} stopped", D::NAME);
                ExitCode::from(1)
            }
        },
    };
    telemetry.shutdown();
    code
}

/// How a job ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobOutcome {
    /// All its work is done: exit 0.
    Completed,
    /// Stopped by the signal at a safe point, work left for the next run: exit 75.
    Interrupted,
}

/// The exit code of a job stopped before it finished (EX_TEMPFAIL: run again).
pub const EXIT_INTERRUPTED: u8 = 75;

/// Runs a job that needs no store of its own (the janitor drives services
/// over HTTP): `job` gets a stop token cancelled when `shutdown` resolves; the
/// answer is its exit code: 0 completed, 75 interrupted, 1 failed (the error
/// logged once).
pub async fn run_task<F, Fut>(name: &'static str, shutdown: impl Future<Output = ()> + Send + 'static, job: F) -> ExitCode
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<JobOutcome, BoxError>>,
{
    revstore_allocator::tune();
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    let signal = tokio::spawn(async move {
        shutdown.await;
        tracing::info!(job = name, "stopping at the next safe point");
        on_signal.cancel();
    });
    let started = std::time::Instant::now();
    let outcome = job(stop).await;
    signal.abort();
    let seconds = started.elapsed().as_secs_f64();
    match outcome {
        Ok(JobOutcome::Completed) => {
            tracing::info!(job = name, seconds, "job completed");
            ExitCode::SUCCESS
        }
        Ok(JobOutcome::Interrupted) => {
            tracing::warn!(job = name, seconds, "job interrupted; the next run goes on from where it is");
            ExitCode::from(EXIT_INTERRUPTED)
        }
        Err(e) => {
            tracing::error!(job = name, seconds, error = %e, "job failed");
            ExitCode::from(1)
        }
    }
}
