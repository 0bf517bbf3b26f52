//! What every revstore service shares, so that each service is mostly its own
//! domain logic and all of them look and behave alike to the people who deploy
//! and call them.
//!
//! # Layout
//! - [`settings`]: flags and `REVSTORE_*` variables common to every service,
//!   secrets from files, exit code 64 on bad settings.
//! - [`problem`]: errors as `application/problem+json` (RFC 9457).
//! - [`access`]: bearer tokens for writes (and, optionally, reads).
//! - [`middleware`]: request ids, spans named by route, Prometheus metrics,
//!   problem bodies for every error response.
//! - [`server`]: the router around a service's routes (`/healthz`, `/readyz`,
//!   `/metrics`, `/openapi.json`, timeouts, body limits, panics caught) and
//!   [`server::serve`] with its graceful shutdown.

pub mod access;
pub mod middleware;
pub mod problem;
pub mod server;
pub mod settings;

pub use access::{Access, WriteAccess};
pub use problem::ApiError;
pub use server::{Platform, serve, shutdown_signal};
pub use settings::{CommonArgs, Secret, ServiceSettings, SettingsError, exit_on_settings_error, parse_args_or_exit, parse_from_or_exit};
