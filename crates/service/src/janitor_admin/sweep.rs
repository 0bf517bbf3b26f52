//! What a service offers the janitor: [`Sweep`]s, resumable bounded steps
//! over its tables, and what a step fails with (no HTTP here: the routes map
//! a [`SweepError`] to a status once).

use async_trait::async_trait;
use revstore_api::janitor::{Scope, StepReport, Task};
use revstore_keys::{Domain, FirstLetterCase, Title, TitleRules};
use revstore_storage::value::{decode_values, encode_values};
use revstore_storage::{ScanPosition, StoreError, Value};

/// One step's result: the report, and where the next step starts (`None`:
/// the sweep is complete).
#[derive(Debug, Clone, Default)]
pub struct Stepped {
    pub report: StepReport,
    pub next: Option<SweepPosition>,
}

/// Where a sweep stands, in one form for every service's sweeps: the pass it
/// is in (one of several tables, a direction of the graph), the last
/// partition it finished in that pass, and, when a step stopped inside a
/// large partition, that partition and the last row it visited there; a
/// sweep that is not a scan of a table (the journal of changed pages) keeps
/// its place in `cursor`. The service keeps it as the sweep's checkpoint
/// between steps and runs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SweepPosition {
    pub pass: usize,
    pub after: Option<ScanPosition>,
    pub inside: Option<(ScanPosition, Vec<Value>)>,
    pub cursor: Vec<Value>,
}

/// The first byte of a position's bytes: its form, so that a later form can
/// tell an earlier one (a checkpoint that does not decode is started over).
/// The form before `cursor` existed still decodes (with no cursor).
const POSITION_FORM: u8 = 0x21;
const POSITION_FORM_WITHOUT_CURSOR: u8 = 0x20;

impl SweepPosition {
    /// The start of pass `pass`.
    pub fn start_of(pass: usize) -> Self {
        SweepPosition { pass, after: None, inside: None, cursor: Vec::new() }
    }

    /// In pass `pass`, after the partition at `after` (its start when `None`).
    pub fn in_pass(pass: usize, after: Option<ScanPosition>) -> Self {
        SweepPosition { pass, after, inside: None, cursor: Vec::new() }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let blob = |bytes: Option<Vec<u8>>| bytes.map_or(Value::Null, Value::Blob);
        let values = encode_values(&[
            Value::BigInt(self.pass as i64),
            blob(self.after.as_ref().map(ScanPosition::to_bytes)),
            blob(self.inside.as_ref().map(|(p, _)| p.to_bytes())),
            blob(self.inside.as_ref().map(|(_, last)| encode_values(last))),
            Value::Blob(encode_values(&self.cursor)),
        ]);
        [vec![POSITION_FORM], values].concat()
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, StoreError> {
        let bad = || StoreError::invalid("not a sweep position");
        let Some((&form, rest)) = bytes.split_first() else { return Err(bad()) };
        let values = decode_values(rest).map_err(|_| bad())?;
        let (values, cursor) = match (form, values.as_slice()) {
            (POSITION_FORM, [first @ .., Value::Blob(cursor)]) => (first, decode_values(cursor).map_err(|_| bad())?),
            (POSITION_FORM_WITHOUT_CURSOR, values) => (values, Vec::new()),
            _ => return Err(bad()),
        };
        let [Value::BigInt(pass), after, partition, last] = values else { return Err(bad()) };
        let position = |v: &Value| match v {
            Value::Null => Ok(None),
            Value::Blob(b) => ScanPosition::from_bytes(b).map(Some),
            _ => Err(bad()),
        };
        let inside = match (position(partition)?, last) {
            (None, Value::Null) => None,
            (Some(p), Value::Blob(b)) => Some((p, decode_values(b).map_err(|_| bad())?)),
            _ => return Err(bad()),
        };
        let pass = usize::try_from(*pass).map_err(|_| bad())?;
        Ok(SweepPosition { pass, after: position(after)?, inside, cursor })
    }
}

/// A sweep a service offers the janitor: resumable, bounded steps over its
/// tables, each from a [`SweepPosition`] (the service keeps it as the
/// checkpoint and hands it back).
#[async_trait]
pub trait Sweep: Send + Sync + 'static {
    /// The task it belongs to.
    fn task(&self) -> Task;

    /// What it visits: every partition (the default), or what changed since
    /// its last completed pass.
    fn scope(&self) -> Scope {
        Scope::All
    }

    /// Visits up to `budget` partitions after `from` (the default position:
    /// from the start); with `dry_run`, counts what it would change and
    /// changes nothing.
    async fn step(&self, from: SweepPosition, budget: u32, dry_run: bool) -> Result<Stepped, SweepError>;
}

/// What a sweep's step fails with.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Store(#[from] StoreError),
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
}

/// The domain and title of a page's partition key (domain, title), as
/// stored: titles are normalised already, so case-sensitive rules keep them
/// as they are.
pub fn stored_page(key: &[Value]) -> Result<(Domain, Title), SweepError> {
    let text = |i: usize| match key.get(i) {
        Some(Value::Text(t)) => Ok(t.as_str()),
        _ => Err(SweepError::corrupt("a page's partition key is not (domain, title)")),
    };
    let domain = Domain::parse(text(0)?).map_err(SweepError::corrupt)?;
    let title = Title::parse(text(1)?, TitleRules { first_letter: FirstLetterCase::Sensitive }).map_err(SweepError::corrupt)?;
    Ok((domain, title))
}
