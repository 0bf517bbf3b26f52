//! What every revstore service shares, so that each service is mostly its own
//! domain logic and all of them look and behave alike to the people who deploy
//! and call them.
//!
//! # Layout
//! - [`settings`]: flags and `REVSTORE_*` variables common to every service,
//!   secrets from files, exit code 64 on bad settings.
//! - [`openapi`]: what every service's OpenAPI document says alike (the
//!   bearer scheme, the platform's error answers, path parameter constraints).
//! - [`problem`]: errors as `application/problem+json` (RFC 9457).
//! - [`secret`]: tokens, keys and passwords as values that never print.
//! - [`access`]: bearer tokens for writes (and, optionally, reads).
//! - [`middleware`]: request ids, spans named by route, Prometheus metrics,
//!   problem bodies for every error response.
//! - [`connections`]: the accepted connections, with a cap, a header-read
//!   timeout and an idle timeout (slowloris).
//! - [`shedding`]: the in-flight request limit; what exceeds it is answered
//!   503 with `Retry-After` at once (probes and metrics never are).
//! - [`server`]: the router around a service's routes (`/healthz`, `/readyz`,
//!   `/metrics`, `/openapi.json`, timeouts, body limits, panics caught) and
//!   [`server::serve`] with its graceful shutdown.
//! - [`launch`]: a service as a value ([`ServiceDefinition`] builds a
//!   [`Service`] from its settings and a [`Context`]), the one start-up
//!   sequence ([`start`]: bind, open, build) that its binary
//!   ([`service_main`]), `revstore up` and the test harness share, serving
//!   several in one process ([`serve_all`]), and a job run to an exit code
//!   ([`run_task`]).
//! - [`worker`]: background loops as [`worker::Worker`]s, with their states,
//!   failure pauses and metrics in one place.
//! - [`suppressions`]: revisions hidden from readers, suppressed and lifted
//!   in any order across clocks.
//! - [`janitor_admin`]: what every service answers the janitor: the run
//!   lease, resumable sweep steps over its tables, the storage purge.

/// The memory allocator of every process that links this crate, and its
/// tuning ([`allocator::tune`], called by the entry points in [`launch`] and
/// by any other `main`).
pub use revstore_allocator as allocator;

pub mod access;
pub mod budget;
pub mod connections;
pub mod dump;
pub mod janitor_admin;
pub mod launch;
pub mod middleware;
pub mod openapi;
pub mod problem;
pub mod secret;
pub mod server;
pub mod settings;
pub mod shedding;
pub mod suppressions;
pub mod worker;

pub use access::{Access, WriteAccess};
/// A failure for the operator to read: start-up, a worker's step.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub use launch::{
    CommandLine, Context, EXIT_INTERRUPTED, JobOutcome, NoSettings, Routes, Service, ServiceDefinition, Shutdown, StartError,
    command_line_defaults, command_of, open_store, parse_command_line, run_task, serve_all, service_main, start, start_on_store,
};
pub use problem::ApiError;
pub use server::{Platform, serve, shutdown_signal};
pub use settings::{
    AccessLog, CommonArgs, Secret, ServiceSettings, SettingsError, StorageArgs, exit_on_clap_error, exit_on_settings_error,
    parse_args_or_exit, parse_from_or_exit,
};

/// Whether a request's `If-None-Match` names `etag` (or is `*`): the answer is
/// then 304. Weak validators compare as strong ones (renders never change).
pub fn not_modified(request: &http::HeaderMap, etag: &str) -> bool {
    request
        .get(http::header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|inm| inm.trim() == "*" || inm.split(',').any(|e| e.trim().trim_start_matches("W/") == etag))
}
