//! What tests need beyond the service's API (the `testsuite` feature): the
//! compaction debt's keys and markers, to look at them or leave one behind as
//! a writer that died mid-append would.

pub use crate::debt::{DEBT_SHARDS, DebtSweeper, debt_shard, hour_of as debt_hour, marker as debt_marker};
