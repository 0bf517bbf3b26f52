//! Histories of pages checked against the page contract by
//! `history-check` (`integration-tests/history-check`: porcupine, the
//! linearizability checker, on a per-page model of the contract; built by
//! `scripts/setup`).
//!
//! The model of a page: the renders stored, each a [`Version`] (revision,
//! render time, tid, a hash of its body), the revision the page is deleted
//! through and the revisions suppressed. A render is visible when its
//! revision is above the deletion and not suppressed; a read of the latest
//! must return the highest visible version, a read of a revision its
//! highest visible version, a read by tid that version if visible. A write
//! acknowledged (201) must be keepable: its revision visible, and no other
//! body stored under its (revision, tid); a write refused (409) must not
//! be. An operation with no answer may have taken effect, or not, at any
//! time after it was sent: it has no return time. Unlike the max register of
//! [`crate::linearizable`], deletes and suppressions make the latest fall as
//! well as rise, so the check is a search (porcupine's), partitioned by page.

use std::hash::{Hash, Hasher};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

/// A render's identity and content, as the model compares them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub rev: u64,
    /// The render time's order (the tid's time in microseconds).
    pub order: i64,
    pub tid: String,
    /// A hash of the body stored under it.
    pub body: String,
}

impl Version {
    pub fn new(rev: u64, order: i64, tid: impl Into<String>, body: &str) -> Version {
        Version { rev, order, tid: tid.into(), body: body_hash(body) }
    }

    fn to_json(&self) -> Value {
        json!({"rev": self.rev, "order": self.order, "tid": self.tid, "body": self.body})
    }
}

/// The hash of a body the model compares (stable within a run).
pub fn body_hash(body: &str) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// What was asked of a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Write(Version),
    /// The page deleted through this revision.
    Delete(u64),
    Suppress(u64),
    Lift(u64),
    ReadLatest,
    ReadRev(u64),
    ReadTid(Version),
}

/// What came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A write acknowledged (201, or 200 for a repeat).
    Stored,
    /// A write refused (409): it did not take effect.
    Refused,
    /// A delete, suppression or lift acknowledged.
    Done,
    /// No answer, or an answer that does not say (5xx): it may have taken
    /// effect at any time after it was sent.
    Unknown,
    /// A read's answer: a version, or none (404).
    Read(Option<Version>),
}

/// One operation on one page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageOperation {
    /// Who asked (operations of one client do not overlap).
    pub client: usize,
    pub page: String,
    /// When it was sent and when its answer came, in any rising unit; no
    /// return: the outcome is [`Outcome::Unknown`].
    pub call: u64,
    pub returned: Option<u64>,
    pub input: Input,
    pub outcome: Outcome,
}

impl PageOperation {
    fn to_json(&self) -> Value {
        let input = match &self.input {
            Input::Write(v) => json!({"kind": "write", "version": v.to_json()}),
            Input::Delete(rev) => json!({"kind": "delete", "rev": rev}),
            Input::Suppress(rev) => json!({"kind": "suppress", "rev": rev}),
            Input::Lift(rev) => json!({"kind": "lift", "rev": rev}),
            Input::ReadLatest => json!({"kind": "read_latest"}),
            Input::ReadRev(rev) => json!({"kind": "read_rev", "rev": rev}),
            Input::ReadTid(v) => json!({"kind": "read_tid", "version": v.to_json()}),
        };
        let output = match &self.outcome {
            Outcome::Stored => json!({"status": "stored"}),
            Outcome::Refused => json!({"status": "refused"}),
            Outcome::Done => json!({"status": "done"}),
            Outcome::Unknown => json!({"status": "unknown"}),
            Outcome::Read(None) => json!({"status": "read"}),
            Outcome::Read(Some(v)) => json!({"status": "read", "found": v.to_json()}),
        };
        let returned = if self.outcome == Outcome::Unknown { None } else { self.returned };
        json!({"client": self.client, "page": self.page, "call": self.call, "return": returned, "input": input, "output": output})
    }
}

/// A history as the checker reads it.
pub fn to_json(history: &[PageOperation]) -> Value {
    json!({"operations": history.iter().map(PageOperation::to_json).collect::<Vec<_>>()})
}

/// The checker's verdict on a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// Not linearizable: no order of the operations within their intervals
    /// keeps the contract. `visualization`: porcupine's drawing of it.
    Violated {
        summary: String,
        visualization: Option<PathBuf>,
    },
}

/// The checker's binary: `REVSTORE_HISTORY_CHECK`, or where `scripts/setup` builds it.
pub fn checker() -> PathBuf {
    std::env::var_os("REVSTORE_HISTORY_CHECK").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
        home.join(".cache/revstore/history-check/history-check")
    })
}

/// Checks `history`; on a violation, porcupine's visualization is written to
/// `visualize` when given. Panics when the checker cannot run or cannot
/// decide (its search timed out): a check that cannot answer is not a pass.
pub fn check(history: &[PageOperation], visualize: Option<&Path>) -> Verdict {
    check_json(&to_json(history), visualize)
}

/// [`check`] of a history already in the checker's form (a fixture file).
pub fn check_json(history: &Value, visualize: Option<&Path>) -> Verdict {
    let binary = checker();
    let mut command = Command::new(&binary);
    if let Some(path) = visualize {
        command.arg("-visualize").arg(path);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run the history checker {} ({e}): scripts/setup builds it", binary.display()));
    child.stdin.take().expect("stdin").write_all(history.to_string().as_bytes()).expect("write the history");
    let output = child.wait_with_output().expect("the history checker");
    let summary = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    match output.status.code() {
        Some(0) => Verdict::Linearizable,
        Some(1) => Verdict::Violated { summary, visualization: visualize.map(Path::to_path_buf) },
        _ => panic!("the history checker could not decide: {summary} {}", String::from_utf8_lossy(&output.stderr)),
    }
}
