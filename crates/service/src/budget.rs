//! The memory budget: one number (`REVSTORE_MEMORY_BUDGET_MB`) an operator
//! sets a Kubernetes memory limit from, divided among what can grow.
//!
//! Every service's share of it:
//! - the process itself ([`PROCESS_BASE`]: code, runtime, allocator, idle
//!   connections), and the allocator's slack (an eighth of the budget);
//! - SQLite's page cache (embedded engine): an eighth of the budget, split
//!   across its connections (at most 32 MiB each);
//! - request bodies in flight: the body bytes admitted at once are capped at
//!   a sixteenth of the budget (at least one body of the largest size), and a
//!   body counts twice (its bytes and what is parsed from them). A request
//!   beyond that waits for room (its request timeout still runs), it does not
//!   add memory.
//!
//! What is left is the service's own to divide ([`MemoryBudget::take`]):
//! old-store's decodes, compaction and block cache. A setting that cannot fit
//! is refused at start, saying which part to lower.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use tokio::sync::Semaphore;

/// A budget that cannot be divided as asked, said so that the operator can fix it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BudgetError(pub String);

const MIB: u64 = 1 << 20;

/// What a service process needs before any cache or request: measured at
/// about 20 MiB for an idle old-store (release build).
pub const PROCESS_BASE: u64 = 24 * MIB;

/// What the allocator holds beyond what is in use, as a share of the budget
/// (an eighth): pages partly in use, and freed memory it has yet to give
/// back. Measured: with a sixteenth, a loaded old-store at 64 MB still
/// peaked 4-6 MB above its budget (BENCHMARKS.md, "Memory under a long mixed load").
pub const ALLOCATOR_SLACK_DIVISOR: u64 = 8;

/// The smallest budget accepted.
pub const MIN_BUDGET_MB: u64 = 48;

/// The whole process's memory budget in bytes, when its entry point said it:
/// a service binary's is its service's, `revstore up`'s the sum of its
/// services'. The memory alert divides the process's resident set by it.
static PROCESS_BUDGET: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Records the process's memory budget (see [`process_budget`]).
pub fn set_process_budget(bytes: u64) {
    PROCESS_BUDGET.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

/// The process's memory budget in bytes, if its entry point recorded one.
pub fn process_budget() -> Option<u64> {
    Some(PROCESS_BUDGET.load(std::sync::atomic::Ordering::Relaxed)).filter(|b| *b > 0)
}

/// One service's memory budget and how it is divided so far.
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    total: u64,
    /// (part, bytes), in the order taken: for the start-up log and errors.
    parts: Vec<(&'static str, u64)>,
    /// SQLite's page cache per connection, in KiB (embedded engine).
    pub sqlite_cache_kib: u32,
    /// Request body bytes admitted at once.
    pub request_body_bytes: u64,
    /// The runtime's blocking threads (SQLite reads, decodes, compaction):
    /// each keeps an allocator heap of its own, so a small budget gets few.
    pub blocking_threads: usize,
}

impl MemoryBudget {
    /// Divides `total_mb` for a service taking bodies up to `body_limit`
    /// bytes, with `sqlite_connections` SQLite connections (0 on Cassandra).
    pub fn plan(total_mb: u64, body_limit: usize, sqlite_connections: usize) -> Result<Self, BudgetError> {
        if total_mb < MIN_BUDGET_MB {
            return Err(BudgetError(format!("the memory budget is {total_mb} MB; use at least {MIN_BUDGET_MB}")));
        }
        let total = total_mb * MIB;
        let sqlite_cache_kib =
            if sqlite_connections == 0 { 0 } else { ((total / 8 / sqlite_connections as u64).clamp(512 * 1024, 32 * MIB) / 1024) as u32 };
        let request_body_bytes = (total / 16).max(body_limit as u64);
        // One per 16 MB of budget, 4 to 64; blocking work beyond them waits
        // its turn (SQLite reads wait for a connection before taking one).
        let blocking_threads = (total_mb / 16).clamp(4, 64) as usize;
        let mut budget = MemoryBudget { total, parts: Vec::new(), sqlite_cache_kib, request_body_bytes, blocking_threads };
        budget.take("the process itself", PROCESS_BASE)?;
        budget.take("the allocator's slack", total / ALLOCATOR_SLACK_DIVISOR)?;
        budget.take("SQLite's page cache", u64::from(sqlite_cache_kib) * 1024 * sqlite_connections as u64)?;
        budget.take("request bodies in flight (REVSTORE_BODY_LIMIT_BYTES bounds one)", 2 * request_body_bytes)?;
        Ok(budget)
    }

    /// What is not yet divided.
    pub fn left(&self) -> u64 {
        self.total - self.parts.iter().map(|(_, b)| b).sum::<u64>()
    }

    /// Takes `bytes` for `part`, or says why the budget cannot hold it.
    pub fn take(&mut self, part: &'static str, bytes: u64) -> Result<(), BudgetError> {
        if bytes > self.left() {
            return Err(BudgetError(format!(
                "the memory budget of {} MB cannot hold {part} ({:.1} MB): {}; raise REVSTORE_MEMORY_BUDGET_MB or lower that part",
                self.total / MIB,
                bytes as f64 / MIB as f64,
                self.describe()
            )));
        }
        self.parts.push((part, bytes));
        Ok(())
    }

    /// The division so far, for the start-up log: `part 24.0 MB, …, left 12.0 MB`.
    pub fn describe(&self) -> String {
        let mut said: Vec<String> = self.parts.iter().map(|(part, b)| format!("{part} {:.1} MB", *b as f64 / MIB as f64)).collect();
        said.push(format!("left {:.1} MB", self.left() as f64 / MIB as f64));
        said.join(", ")
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// The admission of request bodies this budget allows.
    pub fn body_gate(&self) -> BodyGate {
        BodyGate::new(self.request_body_bytes)
    }
}

/// Admits request bodies while the bytes in flight stay within a cap: a
/// request with a body waits for room before its body is read.
#[derive(Debug, Clone)]
pub struct BodyGate {
    permits: Arc<Semaphore>,
    /// Permits are KiB: a semaphore counts in u32.
    capacity_kib: u32,
}

impl BodyGate {
    pub fn new(bytes: u64) -> Self {
        let capacity_kib = (bytes / 1024).clamp(1, u64::from(u32::MAX >> 4)) as u32;
        BodyGate { permits: Arc::new(Semaphore::new(capacity_kib as usize)), capacity_kib }
    }

    /// KiB of permits a request with these headers holds while it is served:
    /// its declared length, or the body limit when it declares none.
    fn cost_kib(&self, headers: &http::HeaderMap, body_limit: usize) -> u32 {
        let declared = headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        let chunked = headers.contains_key(http::header::TRANSFER_ENCODING);
        let bytes = match declared {
            Some(n) => n.min(body_limit as u64),
            None if chunked => body_limit as u64,
            None => 0,
        };
        (bytes.div_ceil(1024) as u32).min(self.capacity_kib)
    }
}

/// The gate and the body limit, as the middleware's state.
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    pub gate: BodyGate,
    pub body_limit: usize,
}

/// Middleware: a request with a body holds its share of the gate until its
/// answer is made (by then its body has been read and dropped).
pub(crate) async fn admit_body(State(gate): State<Gate>, request: Request, next: Next) -> Response {
    let cost = gate.gate.cost_kib(request.headers(), gate.body_limit);
    if cost == 0 {
        return next.run(request).await;
    }
    // The semaphore is never closed: acquiring can only wait.
    let Ok(_held) = gate.gate.permits.clone().acquire_many_owned(cost).await else { return next.run(request).await };
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_is_divided_and_refuses_what_does_not_fit() {
        let budget = MemoryBudget::plan(1024, 32 << 20, 5).unwrap();
        assert_eq!(budget.sqlite_cache_kib, 25 * 1024 + 614, "an eighth of 1 GiB over five connections");
        assert_eq!(budget.request_body_bytes, 64 * MIB);
        assert!(budget.left() > 600 * MIB, "{}", budget.describe());
        // 64 MB with 32 MiB bodies: two bodies do not fit beside the process.
        let refused = MemoryBudget::plan(64, 32 << 20, 5).unwrap_err().to_string();
        assert!(refused.contains("request bodies") && refused.contains("REVSTORE_MEMORY_BUDGET_MB"), "{refused}");
        let mut small = MemoryBudget::plan(64, 2 << 20, 5).unwrap();
        assert_eq!(small.sqlite_cache_kib, 1638);
        let left = small.left();
        assert!(small.take("a cache", left + 1).is_err());
        small.take("a cache", left).unwrap();
        assert_eq!(small.left(), 0);
        assert!(MemoryBudget::plan(16, 1024, 0).is_err());
    }

    #[tokio::test]
    async fn the_gate_holds_bodies_to_its_capacity() {
        let gate = BodyGate::new(10 * 1024);
        let mut headers = http::HeaderMap::new();
        assert_eq!(gate.cost_kib(&headers, 1 << 20), 0, "no body, no cost");
        headers.insert(http::header::CONTENT_LENGTH, "4096".parse().unwrap());
        assert_eq!(gate.cost_kib(&headers, 1 << 20), 4);
        headers.insert(http::header::CONTENT_LENGTH, "999999999".parse().unwrap());
        assert_eq!(gate.cost_kib(&headers, 1 << 20), 10, "at most the whole gate: a large body waits for all of it");
        let first = gate.permits.clone().acquire_many_owned(8).await.unwrap();
        assert!(gate.permits.clone().try_acquire_many_owned(4).is_err(), "no room for a second body");
        drop(first);
        assert!(gate.permits.clone().try_acquire_many_owned(4).is_ok());
    }
}
