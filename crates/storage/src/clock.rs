//! Time as the store sees it: for TTL expiry, purges and default write timestamps.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of the current time in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + Debug {
    fn now_micros(&self) -> i64;
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

/// `now`, or one past the last timestamp handed out if that is later; handed
/// out. Write timestamps from one process never repeat or go back, as a
/// Cassandra coordinator's own never do.
pub(crate) fn next_timestamp(last: &AtomicI64, now: i64) -> i64 {
    let previous = last.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| Some(now.max(l.saturating_add(1)))).unwrap_or(i64::MIN);
    now.max(previous.saturating_add(1))
}

impl Clock for SystemClock {
    fn now_micros(&self) -> i64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
    }
}

/// A clock tests move by hand.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    pub fn new(start_micros: i64) -> Self {
        ManualClock(Arc::new(AtomicI64::new(start_micros)))
    }

    /// Starts at the real current time.
    pub fn starting_now() -> Self {
        Self::new(SystemClock.now_micros())
    }

    pub fn advance_secs(&self, secs: i64) {
        self.0.fetch_add(secs * 1_000_000, Ordering::SeqCst);
    }

    pub fn advance(&self, by: std::time::Duration) {
        self.0.fetch_add(by.as_micros() as i64, Ordering::SeqCst);
    }

    pub fn set_micros(&self, micros: i64) {
        self.0.store(micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}
