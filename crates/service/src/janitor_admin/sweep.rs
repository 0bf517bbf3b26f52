//! What a service offers the janitor: [`Sweep`]s, resumable bounded steps
//! over its tables, and what a step fails with (no HTTP here: the routes map
//! a [`SweepError`] to a status once).

use async_trait::async_trait;
use revstore_api::janitor::{StepReport, Task};
use revstore_storage::StoreError;

/// One step's result: the report, and where the next step starts (`None`:
/// the sweep is complete).
#[derive(Debug, Clone, Default)]
pub struct Stepped {
    pub report: StepReport,
    pub next: Option<Vec<u8>>,
}

/// A sweep a service offers the janitor: resumable, bounded steps over its
/// tables. The position is the sweep's own (the service stores it as the
/// checkpoint and hands it back), so a sweep over several tables can say
/// which one it is in.
#[async_trait]
pub trait Sweep: Send + Sync + 'static {
    /// The task it belongs to.
    fn task(&self) -> Task;

    /// Visits up to `budget` partitions after `from` (`None`: from the
    /// start); with `dry_run`, counts what it would change and changes nothing.
    async fn step(&self, from: Option<Vec<u8>>, budget: u32, dry_run: bool) -> Result<Stepped, SweepError>;
}

/// What a sweep's step fails with.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A checkpoint this build cannot read: a step with `restart` starts over.
    #[error("a checkpoint that does not decode: {0}")]
    Position(String),
    /// A service the sweep calls did not answer.
    #[error("{service} is unavailable: {cause}")]
    Dependency { service: &'static str, cause: String },
    /// Something the step needs is held by a writer for now: try again.
    #[error("{0}")]
    Busy(String),
    /// Stored data the sweep cannot make sense of (counted and logged where it is found).
    #[error("{0}")]
    Corrupt(String),
}

impl SweepError {
    pub fn corrupt(what: impl std::fmt::Display) -> Self {
        SweepError::Corrupt(what.to_string())
    }

    pub fn position(what: impl std::fmt::Display) -> Self {
        SweepError::Position(what.to_string())
    }
}
