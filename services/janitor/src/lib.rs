//! revstore-janitor: retention that does not wait for the next write, repair
//! of what the online paths can leave behind, and the overstore measured.
//!
//! The janitor never opens a store. Each service owns its tables and does
//! the work in bounded admin steps (`revstore_service::janitor_admin`); the
//! janitor drives them: it takes the lease on every service it sweeps (two
//! runs never overlap), calls the steps of each task until every sweep is
//! done (each step resumes from the checkpoint the service keeps, so a killed
//! run goes on where it stopped), paces them (`--ops-per-sec` partitions a
//! second), stops at its deadline or on SIGTERM, shows progress and ends with
//! a JSON summary as the last line of stdout.
//!
//! # Layout
//! - [`settings`]: the command line and its `REVSTORE_*` variables.
//! - [`run`]: the driver (lease, tasks, pacing, retries, deadline).
//! - [`summary`]: the JSON summary and the run's Prometheus metrics.

pub mod run;
pub mod settings;
pub mod summary;

pub use run::{Janitor, RunOutcome};
pub use settings::{Scope, Settings, Task};
pub use summary::Summary;
