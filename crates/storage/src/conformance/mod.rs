//! The behaviour every engine must show, written once.
//!
//! Each case takes a [`Subject`]: a fresh store with the [`TABLES`] created and
//! a way to move the store's time forward (an injected clock on the embedded
//! engine, so TTL cases never sleep). An engine's test binary instantiates the
//! whole suite with [`conformance_suite!`](crate::conformance_suite) inside a
//! module named after the engine, so a test run reads
//! `conformance_embedded::range_tombstones_shadow_older_writes_but_not_newer ... ok`.
//! Cases panic with a message on any deviation. One file per area: reads, writes, conditional, batches, scans, schema.

mod batches;
mod conditional;
mod reads;
mod scans;
mod schema;
mod writes;

pub use batches::*;
pub use conditional::*;
pub use reads::*;
pub use scans::*;
pub use schema::*;
pub use writes::*;

use std::collections::{BTreeSet, HashSet};
use std::future::Future;
use std::ops::Bound;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use rand::seq::SliceRandom;
use revstore_keys::{Tid, TidGenerator, composite_key_bytes, murmur3_token};
use revstore_schema::model::ColumnType::{BigInt, Blob, Text, TimeUuid};
use revstore_schema::{Column as C, Compaction, Order, TableDef};

use crate::error::StoreError;
use crate::ops::{Cas, Condition, Delete, ReadOrder, ReadQuery, ScanPosition, ScanQuery, Serialized, Slice, TokenRange, Upsert, Write};
use crate::store::Store;
use crate::value::{Row, Value};

/// Rows with clustering columns in opposite orders, and a static column.
pub static MIXED: TableDef = TableDef {
    name: "conformance_mixed",
    columns: &[
        C::partition("part", Text),
        C::clustering("a", BigInt, Order::Desc),
        C::clustering("b", Text, Order::Asc),
        C::statik("s", Text),
        C::regular("v", Text),
        C::regular("n", BigInt),
    ],
    default_ttl: None,
    compaction: Compaction::SizeTiered,
    comment: "conformance suite",
};

/// One row per partition.
pub static KV: TableDef = TableDef {
    name: "conformance_kv",
    columns: &[C::partition("k", Text), C::regular("v", Text), C::regular("n", BigInt), C::regular("data", Blob)],
    default_ttl: None,
    compaction: Compaction::SizeTiered,
    comment: "conformance suite",
};

/// Rows that expire after six seconds unless a write says otherwise (short, so
/// an engine whose time cannot be moved can be tested by waiting).
pub static EXPIRING: TableDef = TableDef {
    name: "conformance_expiring",
    columns: &[C::partition("k", Text), C::clustering("c", BigInt, Order::Asc), C::regular("v", Blob)],
    default_ttl: Some(6),
    compaction: Compaction::TimeWindow,
    comment: "conformance suite",
};

/// Rows clustered by time-based UUID, newest first.
pub static TIMELINE: TableDef = TableDef {
    name: "conformance_timeline",
    columns: &[C::partition("k", Text), C::clustering("t", TimeUuid, Order::Desc), C::regular("v", Text)],
    default_ttl: None,
    compaction: Compaction::SizeTiered,
    comment: "conformance suite",
};

/// A per-partition counter allocated by compare-and-set (old-store's block allocation).
pub static COUNTERS: TableDef = TableDef {
    name: "conformance_counters",
    columns: &[C::partition("k", Text), C::clustering("c", BigInt, Order::Asc), C::statik("count", BigInt), C::regular("owner", Text)],
    default_ttl: None,
    compaction: Compaction::SizeTiered,
    comment: "conformance suite",
};

/// Declared but never created: writes to it fail inside the engine.
pub static NOT_CREATED: TableDef = TableDef {
    name: "conformance_not_created",
    columns: &[C::partition("k", Text), C::regular("v", Text)],
    default_ttl: None,
    compaction: Compaction::SizeTiered,
    comment: "conformance suite",
};

/// The tables a subject must have created.
// A table as one build declared it (`EVOLVING_BEFORE`) and as the next one
// does (`EVOLVING_AFTER`: a static and a regular column added, the only
// change migrated in place), and with a column's type changed (refused).
const EVOLVING_P: C = C::partition("p", Text);
const EVOLVING_C: C = C::clustering("c", BigInt, Order::Asc);
const EVOLVING_S: C = C::statik("s", Text);
const EVOLVING_V: C = C::regular("v", Text);
const EVOLVING_ADDED_STATIC: C = C::statik("added_static", BigInt);
const EVOLVING_ADDED: C = C::regular("added", BigInt);

const fn evolving(columns: &'static [C]) -> TableDef {
    TableDef { name: "evolving", columns, default_ttl: None, compaction: Compaction::SizeTiered, comment: "conformance: added columns" }
}

pub static EVOLVING_BEFORE: TableDef = evolving(&[EVOLVING_P, EVOLVING_C, EVOLVING_S, EVOLVING_V]);
pub static EVOLVING_AFTER: TableDef = evolving(&[EVOLVING_P, EVOLVING_C, EVOLVING_S, EVOLVING_ADDED_STATIC, EVOLVING_V, EVOLVING_ADDED]);
pub static EVOLVING_RETYPED: TableDef =
    evolving(&[EVOLVING_P, EVOLVING_C, EVOLVING_S, EVOLVING_ADDED_STATIC, C::regular("v", BigInt), EVOLVING_ADDED]);

pub static TABLES: [&TableDef; 5] = [&MIXED, &KV, &EXPIRING, &TIMELINE, &COUNTERS];

pub type AdvanceFn = Arc<dyn Fn(Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A store under test.
#[allow(missing_debug_implementations)]
pub struct Subject {
    pub store: Store,
    /// Moves the store's time forward: an injected clock, or a real wait.
    pub advance: AdvanceFn,
    /// Keeps the store's resources (a temporary directory, a keyspace) alive.
    pub guard: Box<dyn std::any::Any + Send + Sync>,
}

impl Subject {
    async fn advance(&self, by: Duration) {
        (self.advance)(by).await
    }
}

/// Instantiates every conformance case as a `#[tokio::test]` calling `$subject()`
/// (an async fn returning a [`Subject`]). An attribute given after the subject,
/// such as `[ignore = "needs Cassandra"]`, is put on every case.
#[macro_export]
macro_rules! conformance_suite {
    ($subject:path) => {
        $crate::conformance_suite!($subject, [allow(unused_attributes)]);
    };
    ($subject:path, $attr:tt) => {
        $crate::conformance_suite!(@cases $subject, $attr;
            ordered_reads_with_mixed_clustering_orders,
            reads_resume_after_any_row_in_either_order,
            inclusive_and_exclusive_bounds,
            paging_resumes_exactly_while_rows_are_inserted,
            page_tokens_are_bound_to_their_listing,
            last_write_wins_by_timestamp_in_any_arrival_order,
            cells_keep_their_timestamps_when_a_row_is_partly_rewritten,
            equal_timestamps_resolve_as_cassandra_does,
            a_timestamp_taken_from_the_store_lands_above_its_earlier_writes,
            range_tombstones_shadow_older_writes_but_not_newer,
            partition_and_row_deletes,
            ttl_expiry,
            conditional_insert_has_exactly_one_winner,
            a_conditional_insert_with_a_ttl_lapses,
            a_conditional_delete_removes_the_condition_row_only_when_it_holds,
            compare_and_set_loses_no_update,
            batches_are_all_or_nothing,
            staged_writes_land_in_order_and_stop_at_a_failed_stage,
            scans_visit_every_partition_exactly_once,
            token_range_scans_resume_from_plain_positions_with_statics,
            a_read_without_a_limit_never_loads_a_large_partition_whole,
            many_partitions_read_at_once_answer_as_one_by_one,
            reads_resume_after_a_key_within_their_slice,
            holdings_count_every_live_cell_in_steps_that_resume,
            statics_belong_to_the_partition,
            projection_returns_the_requested_columns,
            the_first_rows_alone_read_nothing_past_them,
            bad_requests_change_nothing,
            added_columns_are_migrated_in_place
        );
    };
    (@cases $subject:path, $attr:tt; $($case:ident),*) => {
        $(
            #$attr
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let subject = $subject().await;
                $crate::conformance::$case(&subject).await;
            }
        )*
    };
}

fn text(s: &str) -> Value {
    Value::Text(s.to_owned())
}

fn int(i: i64) -> Value {
    Value::BigInt(i)
}

fn mixed_row(a: i64, b: &str) -> Upsert {
    Upsert::new(&MIXED, [text("p"), int(a), text(b)]).set("v", format!("{a}{b}"))
}

/// The rows of a query: one page when it sets a limit, else every row,
/// streamed three at a time (so that paging is exercised everywhere).
async fn read_all(store: &Store, query: ReadQuery) -> Vec<Row> {
    match query.limit {
        Some(_) => store.read(&query).await.expect("read").rows,
        None => store.rows(query.limit(3)).try_collect().await.expect("read"),
    }
}

fn keys_ab(rows: &[Row]) -> Vec<(i64, String)> {
    rows.iter().map(|r| (r.bigint("a").expect("a"), r.text("b").expect("b").to_owned())).collect()
}

async fn kv_value(store: &Store, k: &str) -> Option<String> {
    store.get(&KV, vec![text(k)], None).await.expect("get").and_then(|r| r.text("v").map(str::to_owned))
}

async fn scan_all(store: &Store, table: &'static TableDef, page_size: u32) -> Vec<crate::ops::ScannedPartition> {
    store.partitions(ScanQuery::new(table, page_size)).try_collect().await.expect("scan")
}
