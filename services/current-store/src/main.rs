//! `revstore-current-store`: see the crate documentation and `--help`.

use revstore_current_store::{Args, DEFAULT_PORT, SERVICE, run};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    revstore_service::service_main(SERVICE, DEFAULT_PORT, |args: Args, settings, listener, shutdown| {
        run(args, settings, listener, shutdown)
    })
    .await
}
