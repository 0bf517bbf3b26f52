//! Starting a service: what every service binary's `main` and `run` share.

use std::pin::Pin;
use std::process::ExitCode;

use revstore_schema::Component;
use revstore_storage::Store;
use tokio::net::TcpListener;

use crate::settings::{CommonArgs, ServiceSettings, exit_on_settings_error, parse_args_or_exit};

/// A start-up failure, as a message for the operator.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Resolves when the service must shut down.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The command line of a service binary: its own settings and the shared ones.
pub trait ServiceArgs: clap::Parser + Send + 'static {
    fn common(&self) -> &CommonArgs;
}

/// Opens the storage the settings name, and creates the service's tables
/// (its schema component) there when the settings say so (the embedded
/// engine's default).
pub async fn open_store(settings: &ServiceSettings, schema: &'static Component) -> Result<Store, BoxError> {
    let store = revstore_storage::open(settings.storage.clone()).await.map_err(|e| format!("cannot open storage: {e}"))?;
    if settings.migrate_on_start {
        let outcomes = store.migrate(&[schema]).await.map_err(|e| format!("schema migration: {e}"))?;
        for (component, outcome) in outcomes {
            tracing::info!(component, %outcome, "schema");
        }
    }
    Ok(store)
}

/// The `main` of a service binary: parses the command line (exit 64 when it
/// is wrong), starts telemetry (70), binds the listener (69), runs the service
/// until SIGTERM or Ctrl-C, and exits 0, or 1 when the service failed.
pub async fn service_main<A, F, Fut>(service: &'static str, default_port: u16, run: F) -> ExitCode
where
    A: ServiceArgs,
    F: FnOnce(A, ServiceSettings, TcpListener, Shutdown) -> Fut,
    Fut: Future<Output = Result<(), BoxError>>,
{
    let binary = format!("revstore-{service}");
    let args: A = parse_args_or_exit();
    let settings = match args.common().resolve(default_port) {
        Ok(s) => s,
        Err(e) => exit_on_settings_error(&binary, e),
    };
    let telemetry = match revstore_telemetry::init(service) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("{binary}: {e}");
            return ExitCode::from(70);
        }
    };
    let listener = match TcpListener::bind(settings.listen).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(address = %settings.listen, error = %e, "cannot listen");
            return ExitCode::from(69);
        }
    };
    let code = match run(args, settings, listener, Box::pin(crate::server::shutdown_signal())).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "{service} stopped");
            ExitCode::from(1)
        }
    };
    telemetry.shutdown();
    code
}
