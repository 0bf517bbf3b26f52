//! `revstore-old-store`: see the crate documentation and `--help`.

use revstore_old_store::{Args, DEFAULT_PORT, run};
use revstore_service::{exit_on_settings_error, parse_args_or_exit, shutdown_signal};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args: Args = parse_args_or_exit();
    let settings = match args.common.resolve(DEFAULT_PORT) {
        Ok(s) => s,
        Err(e) => exit_on_settings_error("revstore-old-store", e),
    };
    let telemetry = match revstore_telemetry::init("old-store") {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("revstore-old-store: {e}");
            return std::process::ExitCode::from(70);
        }
    };
    let listener = match tokio::net::TcpListener::bind(settings.listen).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(address = %settings.listen, error = %e, "cannot listen");
            return std::process::ExitCode::from(69);
        }
    };
    let result = run(args, settings, listener, shutdown_signal()).await;
    let code = match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "old-store stopped");
            std::process::ExitCode::from(1)
        }
    };
    telemetry.shutdown();
    code
}
