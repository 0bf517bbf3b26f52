//! `revstore-current-store`: see the crate documentation and `--help`.

fn main() -> std::process::ExitCode {
    revstore_service::service_main::<revstore_current_store::CurrentStore>()
}
