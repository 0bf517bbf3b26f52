//! `revstore-dependency-graph`: see the crate documentation and `--help`.

fn main() -> std::process::ExitCode {
    revstore_service::service_main::<revstore_dependency_graph::DependencyGraph>()
}
