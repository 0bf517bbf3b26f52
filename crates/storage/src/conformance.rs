//! The behaviour every engine must show, written once.
//!
//! Each case takes a [`Subject`]: a fresh store with the [`TABLES`] created and
//! a way to move the store's time forward (an injected clock on the embedded
//! engine, so TTL cases never sleep). An engine's test binary instantiates the
//! whole suite with [`conformance_suite!`](crate::conformance_suite) inside a
//! module named after the engine, so a test run reads
//! `conformance_embedded::range_tombstones_shadow_older_writes_but_not_newer ... ok`.
//! Cases panic with a message on any deviation.

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
use crate::ops::{Cas, Condition, Delete, ReadOrder, ReadQuery, ScanPosition, ScanQuery, Slice, TokenRange, Upsert, Write};
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
            holdings_count_every_live_cell_in_steps_that_resume,
            statics_belong_to_the_partition,
            projection_returns_the_requested_columns,
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

pub async fn ordered_reads_with_mixed_clustering_orders(s: &Subject) {
    let mut writes: Vec<Write> = Vec::new();
    for a in 1..=3 {
        for b in ["x", "y", "z"] {
            writes.push(mixed_row(a, b).into());
        }
    }
    writes.shuffle(&mut rand::rng());
    for w in writes {
        s.store.write(w).await.expect("write");
    }
    let forward = keys_ab(&read_all(&s.store, ReadQuery::new(&MIXED, [text("p")])).await);
    let expected: Vec<(i64, String)> = [3, 2, 1].iter().flat_map(|&a| ["x", "y", "z"].map(|b| (a, b.to_owned()))).collect();
    assert_eq!(forward, expected, "clustering order is a DESC, then b ASC");
    let backward = keys_ab(&read_all(&s.store, ReadQuery::new(&MIXED, [text("p")]).order(ReadOrder::Reversed)).await);
    assert_eq!(backward, expected.iter().rev().cloned().collect::<Vec<_>>(), "reversed order");
    let within =
        keys_ab(&read_all(&s.store, ReadQuery::new(&MIXED, [text("p")]).slice(Slice::prefix([int(2)])).order(ReadOrder::Reversed)).await);
    assert_eq!(within, vec![(2, "z".into()), (2, "y".into()), (2, "x".into())]);
    let limited = keys_ab(&read_all(&s.store, ReadQuery::new(&MIXED, [text("p")]).limit(2)).await);
    assert_eq!(limited, vec![(3, "x".into()), (3, "y".into())]);

    // timeuuid clustering sorts by time, whatever order the writes come in.
    let generator = TidGenerator::new();
    let base = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_750_000_000);
    let mut tids: Vec<Tid> = (0..20).map(|i| generator.next_at(base + std::time::Duration::from_millis(997 * i))).collect();
    let mut shuffled = tids.clone();
    shuffled.shuffle(&mut rand::rng());
    for t in &shuffled {
        s.store.write(Upsert::new(&TIMELINE, [text("k"), Value::from(*t)]).set("v", t.to_string())).await.expect("write");
    }
    let rows = read_all(&s.store, ReadQuery::new(&TIMELINE, [text("k")])).await;
    let read: Vec<uuid::Uuid> = rows.iter().map(|r| r.timeuuid("t").expect("t")).collect();
    tids.reverse();
    assert_eq!(read, tids.iter().map(Tid::uuid).collect::<Vec<_>>(), "newest tid first");
}

pub async fn reads_resume_after_any_row_in_either_order(s: &Subject) {
    // A (DESC) then b (ASC): resuming after each row, in each order, reads
    // exactly the rows that follow it.
    for a in 1..=3 {
        for b in ["x", "y", "z"] {
            s.store.write(mixed_row(a, b)).await.expect("write");
        }
    }
    for order in [ReadOrder::Clustering, ReadOrder::Reversed] {
        let all = keys_ab(&read_all(&s.store, ReadQuery::new(&MIXED, [text("p")]).order(order)).await);
        for (i, (a, b)) in all.iter().enumerate() {
            let mut after = Vec::new();
            for slice in crate::ops::slices_after(&MIXED, &[int(*a), text(b)], order) {
                after.extend(keys_ab(&read_all(&s.store, ReadQuery::new(&MIXED, [text("p")]).slice(slice).order(order)).await));
            }
            assert_eq!(after, all[i + 1..], "{order:?}, after ({a}, {b})");
        }
    }
}

pub async fn inclusive_and_exclusive_bounds(s: &Subject) {
    for a in 1..=5 {
        for b in ["x", "y", "z"] {
            s.store.write(mixed_row(a, b)).await.expect("write");
        }
    }
    let a_values = |rows: Vec<Row>| rows.iter().map(|r| r.bigint("a").expect("a")).collect::<BTreeSet<_>>().into_iter().collect::<Vec<_>>();
    let q = |lower, upper| ReadQuery::new(&MIXED, [text("p")]).slice(Slice::all().lower(lower).upper(upper));
    assert_eq!(a_values(read_all(&s.store, q(Bound::Included(int(2)), Bound::Excluded(int(4)))).await), vec![2, 3]);
    assert_eq!(a_values(read_all(&s.store, q(Bound::Excluded(int(2)), Bound::Included(int(4)))).await), vec![3, 4]);
    assert_eq!(a_values(read_all(&s.store, q(Bound::Unbounded, Bound::Excluded(int(2)))).await), vec![1]);
    assert_eq!(a_values(read_all(&s.store, q(Bound::Excluded(int(4)), Bound::Unbounded)).await), vec![5]);
    assert_eq!(a_values(read_all(&s.store, q(Bound::Included(int(3)), Bound::Included(int(3)))).await), vec![3]);
    assert!(read_all(&s.store, q(Bound::Excluded(int(3)), Bound::Excluded(int(3)))).await.is_empty());
    let b_range = ReadQuery::new(&MIXED, [text("p")])
        .slice(Slice::prefix([int(4)]).lower(Bound::Excluded(text("x"))).upper(Bound::Included(text("z"))));
    assert_eq!(keys_ab(&read_all(&s.store, b_range).await), vec![(4, "y".into()), (4, "z".into())]);

    // A range delete honours the same bounds.
    s.store
        .write(Delete::range(&MIXED, [text("p")], Slice::all().lower(Bound::Excluded(int(1))).upper(Bound::Excluded(int(3)))))
        .await
        .expect("delete");
    assert_eq!(a_values(read_all(&s.store, ReadQuery::new(&MIXED, [text("p")])).await), vec![1, 3, 4, 5]);
    s.store.write(Delete::range(&MIXED, [text("p")], Slice::prefix([int(4)]).lower(Bound::Included(text("y"))))).await.expect("delete");
    assert_eq!(
        keys_ab(&read_all(&s.store, ReadQuery::new(&MIXED, [text("p")]).slice(Slice::prefix([int(4)]))).await),
        vec![(4, "x".into())]
    );
}

pub async fn paging_resumes_exactly_while_rows_are_inserted(s: &Subject) {
    let original: Vec<(i64, String)> = (0..300).map(|a| (a, "m".to_owned())).collect();
    let mut batch = Vec::new();
    for (a, b) in &original {
        batch.push(Write::from(mixed_row(*a, b)));
        if batch.len() == 50 {
            s.store.apply(std::mem::take(&mut batch)).await.expect("batch");
        }
    }
    for order in [ReadOrder::Clustering, ReadOrder::Reversed] {
        let store = s.store.clone();
        // Rows inserted while paging, before and after the cursor, between existing keys.
        let inserter = tokio::spawn(async move {
            for i in 0..120i64 {
                let (a, b) = if i % 2 == 0 { (i * 2, "n") } else { (1000 + i, "a") };
                store.write(mixed_row(a, b)).await.expect("concurrent write");
                tokio::task::yield_now().await;
            }
        });
        let mut seen: Vec<(i64, String)> = Vec::new();
        let mut token = None;
        let mut pages = 0;
        loop {
            let page = s.store.read(&ReadQuery::new(&MIXED, [text("p")]).order(order).limit(17).page_token(token)).await.expect("page");
            assert!(page.rows.len() <= 17);
            seen.extend(keys_ab(&page.rows));
            pages += 1;
            token = page.next;
            if token.is_none() {
                break;
            }
            tokio::task::yield_now().await;
        }
        inserter.await.expect("inserter");
        assert!(pages >= 18, "{pages} pages");
        let unique: HashSet<&(i64, String)> = seen.iter().collect();
        assert_eq!(unique.len(), seen.len(), "a row was returned twice ({order:?})");
        for row in &original {
            assert!(unique.contains(row), "row {row:?} that existed before paging was skipped ({order:?})");
        }
        // Pages continue each other in order.
        let sort_key = |(a, b): &(i64, String)| (-*a, b.clone());
        let mut sorted = seen.clone();
        sorted.sort_by_key(sort_key);
        if order == ReadOrder::Reversed {
            sorted.reverse();
        }
        assert_eq!(seen, sorted, "pages out of order ({order:?})");
    }
    // A listing that ends on a page boundary says so: no token after the last row.
    let all = read_all(&s.store, ReadQuery::new(&MIXED, [text("p")])).await.len() as u32;
    let page = s.store.read(&ReadQuery::new(&MIXED, [text("p")]).limit(all)).await.expect("page");
    assert_eq!(page.rows.len() as u32, all);
    assert!(page.next.is_none());
}

pub async fn page_tokens_are_bound_to_their_listing(s: &Subject) {
    for a in 0..10 {
        s.store.write(mixed_row(a, "x")).await.expect("write");
        s.store.write(Upsert::new(&MIXED, [text("other"), int(a), text("x")]).set("v", "o")).await.expect("write");
    }
    let first = s.store.read(&ReadQuery::new(&MIXED, [text("p")]).limit(3)).await.expect("page");
    let token = first.next.expect("more pages");
    let bad = |result: Result<crate::ops::Page, StoreError>| match result {
        Err(e @ StoreError::BadPageToken(_)) => assert!(e.is_client_error()),
        other => panic!("expected a bad page token error, got {other:?}"),
    };
    bad(s.store.read(&ReadQuery::new(&MIXED, [text("other")]).limit(3).page_token(Some(token.clone()))).await);
    bad(s.store.read(&ReadQuery::new(&MIXED, [text("p")]).order(ReadOrder::Reversed).limit(3).page_token(Some(token.clone()))).await);
    let mut tampered = token.clone().into_bytes();
    let last = tampered.len() - 1;
    tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
    bad(s.store.read(&ReadQuery::new(&MIXED, [text("p")]).limit(3).page_token(Some(String::from_utf8(tampered).expect("ascii")))).await);
    bad(s.store.read(&ReadQuery::new(&MIXED, [text("p")]).limit(3).page_token(Some(token[..token.len() / 2].to_owned()))).await);
    bad(s.store.read(&ReadQuery::new(&MIXED, [text("p")]).limit(3).page_token(Some("not a token".into()))).await);
    // The genuine token still works, also with another page size.
    let second = s.store.read(&ReadQuery::new(&MIXED, [text("p")]).limit(5).page_token(Some(token))).await.expect("resume");
    assert_eq!(keys_ab(&second.rows).first(), Some(&(6, "x".into())));
}

pub async fn last_write_wins_by_timestamp_in_any_arrival_order(s: &Subject) {
    let kv = |k: &str, v: &str, ts: i64| Upsert::new(&KV, [text(k)]).set("v", v).timestamp(ts);
    s.store.write(kv("a", "new", 2_000)).await.expect("write");
    s.store.write(kv("a", "old", 1_000)).await.expect("write");
    assert_eq!(kv_value(&s.store, "a").await.as_deref(), Some("new"), "an older write arriving later lost");
    // Cells resolve one by one: a newer write of another column keeps v.
    s.store.write(Upsert::new(&KV, [text("a")]).set("n", 7i64).timestamp(3_000)).await.expect("write");
    let row = s.store.get(&KV, vec![text("a")], None).await.expect("get").expect("row");
    assert_eq!((row.text("v"), row.bigint("n")), (Some("new"), Some(7)));
    // Any arrival order of ten versions leaves the newest.
    for trial in 0..8 {
        let key = format!("perm{trial}");
        let mut versions: Vec<i64> = (1..=10).collect();
        versions.shuffle(&mut rand::rng());
        for ts in &versions {
            s.store.write(kv(&key, &format!("v{ts}"), *ts * 100)).await.expect("write");
        }
        assert_eq!(kv_value(&s.store, &key).await.as_deref(), Some("v10"), "order {versions:?}");
    }
    // A delete with a timestamp only removes what is older than it.
    s.store.write(kv("d", "kept", 5_000)).await.expect("write");
    s.store.write(Delete::partition(&KV, [text("d")]).timestamp(4_000)).await.expect("delete");
    assert_eq!(kv_value(&s.store, "d").await.as_deref(), Some("kept"));
    s.store.write(Delete::partition(&KV, [text("d")]).timestamp(6_000)).await.expect("delete");
    assert_eq!(kv_value(&s.store, "d").await, None);
    s.store.write(kv("d", "late", 5_500)).await.expect("write");
    assert_eq!(kv_value(&s.store, "d").await, None, "a write older than the delete came back");
}

pub async fn cells_keep_their_timestamps_when_a_row_is_partly_rewritten(s: &Subject) {
    let row = || Upsert::new(&KV, [text("partial")]);
    let get = || async { s.store.get(&KV, vec![text("partial")], None).await.expect("get") };
    let cells = |r: Option<Row>| r.map(|r| (r.text("v").map(str::to_owned), r.bigint("n")));
    // Written whole at 1_000, then n alone at 3_000: v is still a 1_000 cell.
    s.store.write(row().set("v", "at 1000").set("n", 1i64).timestamp(1_000)).await.expect("write");
    s.store.write(row().set("n", 3i64).timestamp(3_000)).await.expect("write");
    s.store.write(row().set("v", "at 2000").timestamp(2_000)).await.expect("write");
    assert_eq!(cells(get().await), Some((Some("at 2000".into()), Some(3))), "v took the row's newer timestamp");
    s.store.write(row().set("n", 2i64).timestamp(1_500)).await.expect("write");
    assert_eq!(cells(get().await), Some((Some("at 2000".into()), Some(3))), "an older n won");
    // A delete between the cells' timestamps takes v and leaves n and the row.
    s.store.write(Delete::partition(&KV, [text("partial")]).timestamp(2_500)).await.expect("delete");
    assert_eq!(cells(get().await), Some((None, Some(3))));
    // A cell written with a timestamp older than the row's keeps its own.
    s.store.write(row().set("v", "at 2700").timestamp(2_700)).await.expect("write");
    assert_eq!(cells(get().await), Some((Some("at 2700".into()), Some(3))));
    s.store.write(Delete::partition(&KV, [text("partial")]).timestamp(2_800)).await.expect("delete");
    assert_eq!(cells(get().await), Some((None, Some(3))), "v outlived a newer delete");
    // Once nothing of the partition is left, scans do not list it.
    s.store.write(Delete::partition(&KV, [text("partial")]).timestamp(3_000)).await.expect("delete");
    assert_eq!(get().await, None);
    assert!(scan_all(&s.store, &KV, 50).await.iter().all(|p| p.key != vec![text("partial")]), "a deleted partition was scanned");
}

pub async fn a_timestamp_taken_from_the_store_lands_above_its_earlier_writes(s: &Subject) {
    // A caller that stamps its own writes (a per-key clock) takes the time
    // from the store: a write stamped so lands above writes the store stamped
    // before, even where the store's clock stands still.
    for round in 0..20 {
        let key = format!("stamped-{round}");
        s.store.write(Upsert::new(&KV, [text(&key)]).set("v", "first")).await.expect("write");
        s.store.write(Delete::partition(&KV, [text(&key)])).await.expect("delete");
        let at = s.store.now_micros();
        s.store.write(Upsert::new(&KV, [text(&key)]).set("v", "stamped").timestamp(at)).await.expect("stamped write");
        assert_eq!(kv_value(&s.store, &key).await.as_deref(), Some("stamped"), "round {round}");
        assert!(s.store.now_micros() > at, "the store's time moves on");
    }
}

pub async fn equal_timestamps_resolve_as_cassandra_does(s: &Subject) {
    let kv = |k: &str, v: Value, ts: i64| Upsert::new(&KV, [text(k)]).set("v", v).timestamp(ts);
    // Between two live values, the greater value wins, in either arrival order.
    for (first, second) in [("apple", "banana"), ("banana", "apple")] {
        let key = format!("tie-{first}");
        s.store.write(kv(&key, text(first), 100)).await.expect("write");
        s.store.write(kv(&key, text(second), 100)).await.expect("write");
        assert_eq!(kv_value(&s.store, &key).await.as_deref(), Some("banana"));
    }
    // A deletion beats a value with the same timestamp, in either order.
    s.store.write(kv("tie-del-1", text("x"), 100)).await.expect("write");
    s.store.write(kv("tie-del-1", Value::Null, 100)).await.expect("write");
    assert_eq!(kv_value(&s.store, "tie-del-1").await, None);
    s.store.write(kv("tie-del-2", Value::Null, 100)).await.expect("write");
    s.store.write(kv("tie-del-2", text("x"), 100)).await.expect("write");
    assert_eq!(kv_value(&s.store, "tie-del-2").await, None);
    // So does a row or partition delete.
    s.store.write(kv("tie-del-3", text("x"), 100)).await.expect("write");
    s.store.write(Delete::partition(&KV, [text("tie-del-3")]).timestamp(100)).await.expect("delete");
    assert_eq!(kv_value(&s.store, "tie-del-3").await, None);
    // An expiring value beats a permanent one with the same timestamp.
    s.store.write(kv("tie-ttl", text("zzz-permanent"), 100)).await.expect("write");
    s.store.write(kv("tie-ttl", text("aaa-expiring"), 100).ttl(1000)).await.expect("write");
    assert_eq!(kv_value(&s.store, "tie-ttl").await.as_deref(), Some("aaa-expiring"));
}

pub async fn range_tombstones_shadow_older_writes_but_not_newer(s: &Subject) {
    let row = |a: i64, v: &str, ts: i64| Upsert::new(&MIXED, [text("p"), int(a), text("r")]).set("v", v).timestamp(ts);
    for a in 1..=5 {
        s.store.write(row(a, "original", 1_000)).await.expect("write");
    }
    // current-store's pattern: a new revision deletes the older ones.
    s.store
        .write(Delete::range(&MIXED, [text("p")], Slice::all().upper(Bound::Excluded(int(4)))).timestamp(2_000))
        .await
        .expect("range delete");
    let a_values = |rows: Vec<Row>| rows.iter().map(|r| r.bigint("a").expect("a")).collect::<Vec<_>>();
    assert_eq!(a_values(read_all(&s.store, ReadQuery::new(&MIXED, [text("p")])).await), vec![5, 4]);
    // A late write older than the tombstone stays deleted; a newer one is visible.
    s.store.write(row(2, "late and old", 1_500)).await.expect("write");
    s.store.write(row(3, "newer", 2_500)).await.expect("write");
    assert_eq!(a_values(read_all(&s.store, ReadQuery::new(&MIXED, [text("p")])).await), vec![5, 4, 3]);
    // Outside the range nothing is shadowed.
    s.store.write(row(4, "updated", 1_800)).await.expect("write");
    let rows = read_all(&s.store, ReadQuery::new(&MIXED, [text("p")]).slice(Slice::prefix([int(4)]))).await;
    assert_eq!(rows[0].text("v"), Some("updated"));
    // A wider, newer tombstone shadows everything older, also where the first one did.
    s.store
        .write(Delete::range(&MIXED, [text("p")], Slice::all().upper(Bound::Included(int(10)))).timestamp(3_000))
        .await
        .expect("range delete");
    assert!(read_all(&s.store, ReadQuery::new(&MIXED, [text("p")])).await.is_empty());
    for a in 1..=5 {
        s.store.write(row(a, "late", 2_999)).await.expect("write");
    }
    assert!(read_all(&s.store, ReadQuery::new(&MIXED, [text("p")])).await.is_empty());
    s.store.write(row(1, "after", 3_001)).await.expect("write");
    assert_eq!(a_values(read_all(&s.store, ReadQuery::new(&MIXED, [text("p")])).await), vec![1]);
}

pub async fn partition_and_row_deletes(s: &Subject) {
    for a in 1..=3 {
        s.store.write(mixed_row(a, "x").timestamp(100)).await.expect("write");
    }
    s.store.write(Upsert::new(&MIXED, [text("p")]).set("s", "static").timestamp(100)).await.expect("static");
    s.store.write(Delete::row(&MIXED, [text("p")], [int(2), text("x")]).timestamp(200)).await.expect("row delete");
    let page = s.store.read(&ReadQuery::new(&MIXED, [text("p")])).await.expect("read");
    assert_eq!(keys_ab(&page.rows), vec![(3, "x".into()), (1, "x".into())]);
    s.store.write(mixed_row(2, "x").timestamp(150)).await.expect("write");
    assert_eq!(read_all(&s.store, ReadQuery::new(&MIXED, [text("p")])).await.len(), 2, "row delete shadowed an older late write");
    s.store.write(Delete::partition(&MIXED, [text("p")]).timestamp(300)).await.expect("partition delete");
    let page = s.store.read(&ReadQuery::new(&MIXED, [text("p")])).await.expect("read");
    assert!(page.rows.is_empty() && page.statics.is_none(), "{page:?}");
    s.store.write(Upsert::new(&MIXED, [text("p")]).set("s", "late").timestamp(299)).await.expect("static");
    s.store.write(mixed_row(9, "x").timestamp(299)).await.expect("write");
    let page = s.store.read(&ReadQuery::new(&MIXED, [text("p")])).await.expect("read");
    assert!(page.rows.is_empty() && page.statics.is_none(), "partition tombstone let older writes through: {page:?}");
    s.store.write(mixed_row(9, "x").timestamp(301)).await.expect("write");
    assert_eq!(read_all(&s.store, ReadQuery::new(&MIXED, [text("p")])).await.len(), 1);
    // Deleting a cell (writing null) keeps the row while its marker lives.
    s.store.write(Upsert::new(&MIXED, [text("p"), int(9), text("x")]).set("v", Value::Null).timestamp(302)).await.expect("cell delete");
    let rows = read_all(&s.store, ReadQuery::new(&MIXED, [text("p")])).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get("v"), None);
}

pub async fn ttl_expiry(s: &Subject) {
    // TTLs of seconds, checked with a margin either side: engines count TTLs in
    // whole seconds from the write.
    let row = |c: i64| Upsert::new(&EXPIRING, [text("k"), int(c)]).set("v", vec![c as u8; 64]);
    s.store.write(row(1).ttl(2)).await.expect("write");
    s.store.write(row(2)).await.expect("write"); // the table's default: six seconds
    s.store.write(row(3).ttl(0)).await.expect("write"); // never expires
    s.store.write(Upsert::new(&KV, [text("cells")]).set("v", "short").ttl(2)).await.expect("write");
    s.store.write(Upsert::new(&KV, [text("cells")]).set("n", 5i64).ttl(0)).await.expect("write");
    s.store.write(Upsert::new(&KV, [text("gone")]).set("v", "short").ttl(2)).await.expect("write");
    let cs = |rows: Vec<Row>| rows.iter().map(|r| r.bigint("c").expect("c")).collect::<Vec<_>>();
    assert_eq!(cs(read_all(&s.store, ReadQuery::new(&EXPIRING, [text("k")])).await), vec![1, 2, 3]);

    s.advance(Duration::from_millis(3500)).await;
    assert_eq!(cs(read_all(&s.store, ReadQuery::new(&EXPIRING, [text("k")])).await), vec![2, 3]);
    let cells = s.store.get(&KV, vec![text("cells")], None).await.expect("get").expect("row lives on its other cell");
    assert_eq!((cells.text("v"), cells.bigint("n")), (None, Some(5)));
    assert_eq!(s.store.get(&KV, vec![text("gone")], None).await.expect("get"), None);
    let scanned = scan_all(&s.store, &KV, 10).await;
    assert!(scanned.iter().all(|p| p.key != vec![text("gone")]), "an expired partition was scanned");
    s.store.purge_expired().await.expect("purge");
    assert_eq!(cs(read_all(&s.store, ReadQuery::new(&EXPIRING, [text("k")])).await), vec![2, 3]);

    s.advance(Duration::from_millis(3500)).await;
    assert_eq!(cs(read_all(&s.store, ReadQuery::new(&EXPIRING, [text("k")])).await), vec![3]);
}

/// A lease: taken by a conditional insert with a TTL, refused while it
/// lives, free again once it has expired.
pub async fn a_conditional_insert_with_a_ttl_lapses(s: &Subject) {
    let lease = |owner: &str| Cas::insert_if_not_exists(Upsert::new(&KV, [text("lease")]).set("v", owner.to_owned()).ttl(2));
    assert!(s.store.cas(lease("first")).await.expect("cas").applied);
    let refused = s.store.cas(lease("second")).await.expect("cas");
    assert!(!refused.applied);
    assert_eq!(refused.current.as_ref().and_then(|r| r.text("v")), Some("first"));
    s.advance(Duration::from_secs(3)).await;
    assert!(s.store.cas(lease("second")).await.expect("cas").applied, "the lease did not lapse");
    assert_eq!(kv_value(&s.store, "lease").await.as_deref(), Some("second"));
}

/// Giving a lease back: the row deleted only by its holder, and gone whole.
pub async fn a_conditional_delete_removes_the_condition_row_only_when_it_holds(s: &Subject) {
    let release = |owner: &str| Cas {
        table: &KV,
        partition: vec![text("held")],
        clustering: Some(Vec::new()),
        condition: Condition::Equals(vec![("v", text(owner))]),
        writes: vec![Delete::partition(&KV, [text("held")]).into()],
    };
    s.store.write(Upsert::new(&KV, [text("held")]).set("v", "holder").set("n", 7i64)).await.expect("write");
    let refused = s.store.cas(release("someone else")).await.expect("cas");
    assert!(!refused.applied);
    assert_eq!(kv_value(&s.store, "held").await.as_deref(), Some("holder"));
    assert!(s.store.cas(release("holder")).await.expect("cas").applied);
    assert_eq!(s.store.get(&KV, vec![text("held")], None).await.expect("get"), None, "a cell of the released row is left");

    // The same for a row of a partition with clustering columns.
    s.store.write(Upsert::new(&COUNTERS, [text("rows"), int(1)]).set("owner", "holder")).await.expect("write");
    s.store.write(Upsert::new(&COUNTERS, [text("rows"), int(2)]).set("owner", "other")).await.expect("write");
    let release_row = Cas {
        table: &COUNTERS,
        partition: vec![text("rows")],
        clustering: Some(vec![int(1)]),
        condition: Condition::Equals(vec![("owner", text("holder"))]),
        writes: vec![Delete::row(&COUNTERS, [text("rows")], [int(1)]).into()],
    };
    assert!(s.store.cas(release_row).await.expect("cas").applied);
    let left = s.store.read(&ReadQuery::new(&COUNTERS, [text("rows")])).await.expect("read").rows;
    assert_eq!(left.iter().map(|r| r.text("owner")).collect::<Vec<_>>(), [Some("other")]);
}

pub async fn conditional_insert_has_exactly_one_winner(s: &Subject) {
    let mut tasks = Vec::new();
    for i in 0..24 {
        let store = s.store.clone();
        tasks.push(tokio::spawn(async move {
            let owner = format!("writer-{i}");
            let outcome = store
                .cas(Cas::insert_if_not_exists(Upsert::new(&COUNTERS, [text("lease"), int(1)]).set("owner", owner.clone())))
                .await
                .expect("cas");
            (owner, outcome)
        }));
    }
    let mut winners = Vec::new();
    let mut losers_saw = Vec::new();
    for t in tasks {
        let (owner, outcome) = t.await.expect("task");
        if outcome.applied {
            winners.push(owner);
        } else {
            losers_saw.push(outcome.current.and_then(|r| r.text("owner").map(str::to_owned)));
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    let stored = s.store.get(&COUNTERS, vec![text("lease"), int(1)], None).await.expect("get").expect("row");
    assert_eq!(stored.text("owner"), Some(winners[0].as_str()));
    assert!(losers_saw.iter().all(|o| o.as_deref() == Some(winners[0].as_str())), "losers saw {losers_saw:?}");
}

pub async fn compare_and_set_loses_no_update(s: &Subject) {
    // Eight writers each claim ten slots from a shared counter, old-store style:
    // read the counter, then set it one higher and add the row, if unchanged.
    let per_writer = 10;
    let mut tasks = Vec::new();
    for w in 0..8 {
        let store = s.store.clone();
        tasks.push(tokio::spawn(async move {
            let mut claimed = Vec::new();
            while claimed.len() < per_writer {
                let page = store.read(&ReadQuery::new(&COUNTERS, [text("ctr")]).limit(1).columns(["count"])).await.expect("read");
                let current = page.statics.and_then(|r| r.bigint("count"));
                let next = current.unwrap_or(0) + 1;
                let outcome = store
                    .cas(Cas {
                        table: &COUNTERS,
                        partition: vec![text("ctr")],
                        clustering: None,
                        condition: Condition::Equals(vec![("count", current.map_or(Value::Null, Value::BigInt))]),
                        writes: vec![
                            Upsert::new(&COUNTERS, [text("ctr")]).set("count", next).into(),
                            Upsert::new(&COUNTERS, [text("ctr"), int(next)]).set("owner", format!("w{w}")).into(),
                        ],
                    })
                    .await
                    .expect("cas");
                if outcome.applied {
                    claimed.push(next);
                }
            }
            claimed
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    all.sort();
    assert_eq!(all, (1..=80).collect::<Vec<i64>>(), "a slot was claimed twice or skipped");
    let page = s.store.read(&ReadQuery::new(&COUNTERS, [text("ctr")])).await.expect("read");
    assert_eq!(page.statics.and_then(|r| r.bigint("count")), Some(80));
    assert_eq!(page.rows.len(), 80);
}

pub async fn batches_are_all_or_nothing(s: &Subject) {
    // Across partitions and tables, all land together.
    s.store
        .apply(vec![
            Upsert::new(&KV, [text("b1")]).set("v", "one").into(),
            Upsert::new(&KV, [text("b2")]).set("v", "two").into(),
            mixed_row(1, "batch").into(),
            Delete::partition(&KV, [text("nothing-here")]).into(),
        ])
        .await
        .expect("batch");
    assert_eq!(kv_value(&s.store, "b1").await.as_deref(), Some("one"));
    assert_eq!(kv_value(&s.store, "b2").await.as_deref(), Some("two"));
    // A batch with one invalid write is refused whole, before anything is written.
    let refused = s
        .store
        .apply(vec![
            Upsert::new(&KV, [text("b3")]).set("v", "three").into(),
            Upsert::new(&KV, [text("b4")]).set("no_such_column", "x").into(),
        ])
        .await;
    assert!(matches!(refused, Err(StoreError::Invalid(_))), "{refused:?}");
    assert_eq!(kv_value(&s.store, "b3").await, None);
    // A batch that fails inside the engine, midway, leaves nothing behind either.
    let failed = s
        .store
        .apply(vec![
            Upsert::new(&KV, [text("b1")]).set("v", "changed").into(),
            Upsert::new(&NOT_CREATED, [text("x")]).set("v", "x").into(),
            Upsert::new(&KV, [text("b5")]).set("v", "five").into(),
        ])
        .await;
    assert!(failed.is_err(), "a write to a missing table succeeded");
    assert_eq!(kv_value(&s.store, "b1").await.as_deref(), Some("one"), "first write of a failed batch was kept");
    assert_eq!(kv_value(&s.store, "b5").await, None);
}

/// Writes in ordered stages: every partition of every stage lands, with its own
/// timestamps; a stage that fails stops the ones after it; an invalid write
/// anywhere is refused before anything is written.
pub async fn staged_writes_land_in_order_and_stop_at_a_failed_stage(s: &Subject) {
    s.store.write(Upsert::new(&MIXED, [text("staged"), int(1), text("old")]).set("v", "old").timestamp(100)).await.expect("write");
    s.store
        .apply_in_stages(vec![
            vec![
                Upsert::new(&KV, [text("s1")]).set("v", "one").into(),
                Upsert::new(&KV, [text("s2")]).set("v", "two").into(),
                // One partition: a range delete and a newer row, applied together.
                Delete::range(&MIXED, [text("staged")], Slice::all()).timestamp(200).into(),
                Upsert::new(&MIXED, [text("staged"), int(2), text("new")]).set("v", "new").timestamp(201).into(),
            ],
            vec![Upsert::new(&KV, [text("s3")]).set("v", "three").into()],
        ])
        .await
        .expect("staged writes");
    for (k, v) in [("s1", "one"), ("s2", "two"), ("s3", "three")] {
        assert_eq!(kv_value(&s.store, k).await.as_deref(), Some(v), "{k}");
    }
    let staged = read_all(&s.store, ReadQuery::new(&MIXED, [text("staged")])).await;
    assert_eq!(staged.iter().map(|r| r.text("v")).collect::<Vec<_>>(), [Some("new")]);

    let refused = s
        .store
        .apply_in_stages(vec![
            vec![Upsert::new(&KV, [text("s4")]).set("v", "four").into()],
            vec![Upsert::new(&KV, [text("s5")]).set("no_such_column", "x").into()],
        ])
        .await;
    assert!(matches!(refused, Err(StoreError::Invalid(_))), "{refused:?}");
    assert_eq!(kv_value(&s.store, "s4").await, None, "a stage before an invalid write was written");

    let failed = s
        .store
        .apply_in_stages(vec![
            vec![Upsert::new(&KV, [text("s6")]).set("v", "six").into()],
            vec![Upsert::new(&NOT_CREATED, [text("x")]).set("v", "x").into()],
            vec![Upsert::new(&KV, [text("s7")]).set("v", "seven").into()],
        ])
        .await;
    assert!(failed.is_err(), "a write to a missing table succeeded");
    assert_eq!(kv_value(&s.store, "s7").await, None, "a stage after a failed one was written");
}

async fn scan_all(store: &Store, table: &'static TableDef, page_size: u32) -> Vec<crate::ops::ScannedPartition> {
    store.partitions(ScanQuery::new(table, page_size)).try_collect().await.expect("scan")
}

pub async fn scans_visit_every_partition_exactly_once(s: &Subject) {
    let mut expected = BTreeSet::new();
    let mut batch = Vec::new();
    for i in 0..250 {
        // Some keys end in bytes with the high bit set, where Cassandra's Murmur3
        // differs from the reference hash.
        let k = if i % 5 == 0 { format!("páge-{i}-ü") } else { format!("page-{i}") };
        expected.insert(k.clone());
        batch.push(Write::from(Upsert::new(&KV, [text(&k)]).set("v", "x")));
        if batch.len() == 50 {
            s.store.apply(std::mem::take(&mut batch)).await.expect("batch");
        }
    }
    let scanned = scan_all(&s.store, &KV, 7).await;
    let keys: Vec<String> = scanned
        .iter()
        .map(|p| match &p.key[..] {
            [Value::Text(k)] => k.clone(),
            other => panic!("unexpected key {other:?}"),
        })
        .collect();
    assert_eq!(keys.len(), expected.len(), "a partition was visited twice or skipped");
    assert_eq!(keys.iter().cloned().collect::<BTreeSet<_>>(), expected);
    assert!(scanned.windows(2).all(|w| w[0].token <= w[1].token), "scan is not in token order");
    for p in &scanned {
        let bytes: Vec<Vec<u8>> = p.key.iter().map(Value::cql_bytes).collect();
        let refs: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
        assert_eq!(p.token, murmur3_token(&composite_key_bytes(&refs)), "token of {:?}", p.key);
    }
    // Partitions with only static cells and with composite keys are found too.
    s.store.write(Upsert::new(&COUNTERS, [text("only-static")]).set("count", 1i64)).await.expect("static");
    s.store.write(Upsert::new(&COUNTERS, [text("with-row"), int(1)]).set("owner", "x")).await.expect("row");
    let counters: Vec<Vec<Value>> = scan_all(&s.store, &COUNTERS, 1).await.into_iter().map(|p| p.key).collect();
    assert_eq!(counters.len(), 2, "{counters:?}");
}

pub async fn statics_belong_to_the_partition(s: &Subject) {
    s.store.write(Upsert::new(&MIXED, [text("p"), int(1), text("x")]).set("v", "row").set("s", "shared")).await.expect("write");
    s.store.write(mixed_row(2, "x")).await.expect("write");
    let page = s.store.read(&ReadQuery::new(&MIXED, [text("p")])).await.expect("read");
    assert_eq!(page.rows.len(), 2);
    assert_eq!(page.statics.as_ref().and_then(|r| r.text("s")), Some("shared"));
    let other = s.store.read(&ReadQuery::new(&MIXED, [text("q")])).await.expect("read");
    assert!(other.statics.is_none() && other.rows.is_empty());
    // A static-only partition: no rows, and conditional creation of the static.
    let created = s.store.cas(Cas::insert_if_not_exists(Upsert::new(&COUNTERS, [text("fresh")]).set("count", 0i64))).await.expect("cas");
    assert!(created.applied);
    let again = s.store.cas(Cas::insert_if_not_exists(Upsert::new(&COUNTERS, [text("fresh")]).set("count", 9i64))).await.expect("cas");
    assert!(!again.applied);
    assert_eq!(again.current.and_then(|r| r.bigint("count")), Some(0));
    let page = s.store.read(&ReadQuery::new(&COUNTERS, [text("fresh")])).await.expect("read");
    assert!(page.rows.is_empty());
    assert_eq!(page.statics.and_then(|r| r.bigint("count")), Some(0));
}

pub async fn projection_returns_the_requested_columns(s: &Subject) {
    s.store.write(Upsert::new(&KV, [text("proj")]).set("v", "value").set("n", 3i64).set("data", vec![1u8, 2, 3])).await.expect("write");
    let row = s.store.get(&KV, vec![text("proj")], Some(vec!["n"])).await.expect("get").expect("row");
    assert_eq!(row.bigint("n"), Some(3));
    assert_eq!(row.text("k"), Some("proj"), "key columns are always returned");
    assert_eq!(row.get("v"), None);
    assert_eq!(row.get("data"), None);
    let full = s.store.get(&KV, vec![text("proj")], None).await.expect("get").expect("row");
    assert_eq!(full.blob("data"), Some(&[1u8, 2, 3][..]));
}

pub async fn bad_requests_change_nothing(s: &Subject) {
    let invalid = |r: Result<(), StoreError>, what: &str| match r {
        Err(e @ StoreError::Invalid(_)) => assert!(e.is_client_error(), "{what}"),
        other => panic!("{what}: expected an invalid-request error, got {other:?}"),
    };
    invalid(s.store.write(Upsert::new(&KV, [text("bad")]).set("v", 5i64)).await, "wrong type");
    invalid(s.store.write(Upsert::new(&KV, [text("bad")]).set("nope", "x")).await, "unknown column");
    invalid(s.store.write(Upsert::new(&KV, [int(1)]).set("v", "x")).await, "wrong key type");
    invalid(s.store.write(Upsert::new(&KV, [Value::Null]).set("v", "x")).await, "null key");
    invalid(s.store.write(Upsert::new(&MIXED, [text("bad"), int(1)]).set("v", "x")).await, "partial clustering key");
    invalid(s.store.write(Upsert::new(&MIXED, [text("bad")]).set("v", "x")).await, "regular cell without clustering key");
    invalid(s.store.write(Upsert::new(&KV, [text("bad")]).set("v", "x").set("v", "y")).await, "column set twice");
    invalid(s.store.write(Upsert::new(&KV, [text("bad")]).set("v", "x").ttl(u32::MAX)).await, "TTL too long");
    invalid(
        s.store.write(Upsert::new(&TIMELINE, [text("bad"), Value::TimeUuid(uuid::Uuid::new_v4())]).set("v", "x")).await,
        "random UUID as timeuuid",
    );
    invalid(s.store.write(Delete::row(&MIXED, [text("bad")], [int(1)])).await, "row delete without full key");
    invalid(s.store.write(Upsert::new(&KV, [text(&"k".repeat(70_000))]).set("v", "x")).await, "key over 64 KiB");
    invalid(s.store.apply(vec![]).await, "empty batch");
    // A condition on a static that a write to another row sets: Cassandra
    // cannot carry the condition on that write, so no engine takes it.
    let cas = Cas {
        table: &MIXED,
        partition: vec![text("bad")],
        clustering: None,
        condition: Condition::Equals(vec![("s", text("a"))]),
        writes: vec![Write::Upsert(Upsert::new(&MIXED, [text("bad"), int(1), text("x")]).set("s", "b"))],
    };
    let conditional = s.store.cas(cas).await.map(|_| ());
    invalid(conditional, "a condition column set outside the condition row");
    let read = s.store.read(&ReadQuery::new(&KV, [text("bad")]).limit(0)).await;
    assert!(matches!(read, Err(StoreError::Invalid(_))), "{read:?}");
    let read = s.store.read(&ReadQuery::new(&MIXED, [text("bad")]).slice(Slice::all().lower(Bound::Included(text("not a number"))))).await;
    assert!(matches!(read, Err(StoreError::Invalid(_))), "{read:?}");
    assert!(scan_all(&s.store, &KV, 100).await.is_empty(), "a rejected write left data behind");
    assert!(read_all(&s.store, ReadQuery::new(&MIXED, [text("bad")])).await.is_empty());
}

pub async fn added_columns_are_migrated_in_place(s: &Subject) {
    s.store.ensure_tables(&[&EVOLVING_BEFORE]).await.expect("create");
    s.store.write(Upsert::new(&EVOLVING_BEFORE, [text("p"), int(1)]).set("v", "kept").set("s", "static kept")).await.expect("write");
    // The next build declares two more columns: they are added, nothing is lost.
    s.store.ensure_tables(&[&EVOLVING_AFTER]).await.expect("add the columns");
    s.store.ensure_tables(&[&EVOLVING_AFTER]).await.expect("again: nothing to do");
    s.store
        .write(Upsert::new(&EVOLVING_AFTER, [text("p"), int(2)]).set("v", "new").set("added", 7i64).set("added_static", 9i64))
        .await
        .expect("write");
    let page = s.store.read(&ReadQuery::new(&EVOLVING_AFTER, [text("p")])).await.expect("read");
    assert_eq!(page.rows.len(), 2);
    assert_eq!(page.rows[0].text("v"), Some("kept"));
    assert_eq!(page.rows[0].get("added"), None);
    assert_eq!(page.rows[1].bigint("added"), Some(7));
    let statics = page.statics.expect("statics");
    assert_eq!((statics.text("s"), statics.bigint("added_static")), (Some("static kept"), Some(9)));
    // Anything else than added columns is refused, and changes nothing.
    match s.store.ensure_tables(&[&EVOLVING_RETYPED]).await {
        Err(StoreError::SchemaMismatch(msg)) => assert!(msg.contains("evolving"), "{msg}"),
        other => panic!("a changed column type was accepted: {other:?}"),
    }
    let page = s.store.read(&ReadQuery::new(&EVOLVING_AFTER, [text("p")])).await.expect("read after the refusal");
    assert_eq!(page.rows[1].bigint("added"), Some(7));
}

pub async fn token_range_scans_resume_from_plain_positions_with_statics(s: &Subject) {
    // Even partitions have a static, odd ones only a row.
    for i in 0..40i64 {
        let part = text(&format!("r{i}"));
        let write = if i % 2 == 0 {
            Upsert::new(&MIXED, [part]).set("s", format!("s{i}"))
        } else {
            Upsert::new(&MIXED, [part, int(i), text("x")]).set("v", "row")
        };
        s.store.write(write).await.expect("write");
    }
    let expected_static = |key: &[Value]| {
        let Some(Value::Text(k)) = key.first() else { panic!("a text key") };
        let i: i64 = k[1..].parse().expect("r<i>");
        (i % 2 == 0).then(|| format!("s{i}"))
    };
    // The whole ring, 7 at a time, each position written out and read back as a checkpoint would be.
    let mut seen = Vec::new();
    let mut position: Option<String> = None;
    loop {
        let after = position.as_deref().map(|p| p.parse::<ScanPosition>().expect("a position reads back"));
        let step = s.store.scan_range(&ScanQuery::new(&MIXED, 7).statics(["s"]).after(after)).await.expect("scan");
        for p in &step.partitions {
            assert_eq!(p.statics.as_ref().and_then(|r| r.text("s")).map(str::to_owned), expected_static(&p.key), "{:?}", p.key);
        }
        seen.extend(step.partitions);
        match step.next {
            Some(next) => position = Some(next.to_string()),
            None => break,
        }
    }
    assert_eq!(seen.len(), 40, "every partition once");
    let ordered = |a: &crate::ops::ScannedPartition, b: &crate::ops::ScannedPartition| {
        a.token.cmp(&b.token).then_with(|| crate::value::cmp_keys(&a.key, &b.key)).is_lt()
    };
    assert!(seen.windows(2).all(|w| ordered(&w[0], &w[1])), "in token order, no repeats");
    // Four ranges cover the ring, each partition in exactly the range of its token.
    let mut by_range = Vec::new();
    for range in TokenRange::split(4) {
        let step = s.store.scan_range(&ScanQuery::new(&MIXED, 100).range(range)).await.expect("scan");
        assert!(step.next.is_none());
        assert!(step.partitions.iter().all(|p| range.contains(p.token) && p.statics.is_none()));
        by_range.extend(step.partitions);
    }
    assert_eq!(by_range.iter().map(|p| p.key.clone()).collect::<Vec<_>>(), seen.iter().map(|p| p.key.clone()).collect::<Vec<_>>());
    // What a scan cannot be asked.
    let bad = s.store.scan_range(&ScanQuery::new(&MIXED, 10).statics(["v"])).await;
    assert!(matches!(bad, Err(StoreError::Invalid(_))), "a regular column as a static: {bad:?}");
    let outside = ScanPosition { token: i64::MIN, key: vec![text("r0")] };
    let bad = s.store.scan_range(&ScanQuery::new(&MIXED, 10).range(TokenRange::split(2)[1]).after(Some(outside))).await;
    assert!(matches!(bad, Err(StoreError::Invalid(_))), "a position outside the range: {bad:?}");
    assert!("zz".parse::<ScanPosition>().is_err() && "00".parse::<ScanPosition>().is_err());
}

pub async fn a_read_without_a_limit_never_loads_a_large_partition_whole(s: &Subject) {
    let store = s.store.clone().with_unbounded_read_cap(5);
    for i in 0..6 {
        store.write(Upsert::new(&MIXED, [text("wide"), int(i), text("x")]).set("v", "row")).await.expect("write");
    }
    match store.read(&ReadQuery::new(&MIXED, [text("wide")])).await {
        Err(StoreError::Internal(msg)) => assert!(msg.contains("without a limit found more than 5 rows"), "{msg}"),
        other => panic!("an unbounded read of 6 rows under a cap of 5: {other:?}"),
    }
    // With a limit it pages, and the stream walks it all.
    assert_eq!(store.read(&ReadQuery::new(&MIXED, [text("wide")]).limit(4)).await.expect("read").rows.len(), 4);
    let all: Vec<Row> = store.rows(ReadQuery::new(&MIXED, [text("wide")]).limit(4)).try_collect().await.expect("stream");
    assert_eq!(all.len(), 6);
    // Under the cap, a read without a limit answers as before.
    store.write(Delete::row(&MIXED, [text("wide")], [int(0), text("x")])).await.expect("delete");
    assert_eq!(store.read(&ReadQuery::new(&MIXED, [text("wide")])).await.expect("read").rows.len(), 5);
}

pub async fn holdings_count_every_live_cell_in_steps_that_resume(s: &Subject) {
    // 30 partitions of COUNTERS: a static count (8 bytes) on every third,
    // and p % 4 rows of clustering (8) + owner ("owner-{p}") each.
    let mut expected_rows = 0;
    let mut expected_bytes = 0;
    for p in 0..30i64 {
        let part = format!("held{p}");
        if p % 3 == 0 {
            s.store.write(Upsert::new(&COUNTERS, [text(&part)]).set("count", p)).await.expect("static");
            expected_bytes += 8;
        }
        for c in 0..p % 4 {
            let owner = format!("owner-{p}");
            expected_rows += 1;
            expected_bytes += 8 + owner.len() as u64;
            s.store.write(Upsert::new(&COUNTERS, [text(&part), int(c)]).set("owner", owner)).await.expect("row");
        }
    }
    // Partitions with only statics or rows, 7 per step: each step resumes
    // after the last one, and the steps together count everything once.
    let mut total = crate::ops::Holdings::default();
    let mut after = None;
    let mut steps = 0;
    loop {
        let step = s.store.holdings(&ScanQuery::new(&COUNTERS, 7).after(after.take())).await.expect("holdings");
        assert!(step.partitions <= 7);
        total.add(&step);
        steps += 1;
        match step.next {
            Some(next) => after = Some(next),
            None => break,
        }
        assert!(steps < 30, "holdings steps do not end");
    }
    // Partitions 1..29 with a row or a static: p % 4 != 0 or p % 3 == 0.
    let partitions = (0..30).filter(|p| p % 4 != 0 || p % 3 == 0).count() as u64;
    assert_eq!((total.partitions, total.rows_live, total.bytes_live), (partitions, expected_rows, expected_bytes));
    // Nothing expired or deleted yet: everything held is live.
    assert_eq!((total.rows_held, total.bytes_held), (total.rows_live, total.bytes_live));
    assert!(steps >= 3, "{steps} steps for {partitions} partitions");
    assert!(matches!(s.store.holdings(&ScanQuery::new(&COUNTERS, 0)).await, Err(StoreError::Invalid(_))));
}

pub async fn many_partitions_read_at_once_answer_as_one_by_one(s: &Subject) {
    for p in 0..20i64 {
        for a in 0..p % 5 {
            s.store.write(Upsert::new(&MIXED, [text(&format!("many{p}")), int(a), text("x")]).set("v", "row")).await.expect("write");
        }
    }
    let queries: Vec<ReadQuery> = (0..20).map(|p| ReadQuery::new(&MIXED, [text(&format!("many{p}"))]).limit(3)).collect();
    let together = s.store.read_many(queries.clone()).await.expect("read_many");
    assert_eq!(together.len(), 20);
    for (query, rows) in queries.iter().zip(&together) {
        let alone = s.store.read(query).await.expect("read").rows;
        assert_eq!(keys_ab(rows), keys_ab(&alone));
        assert!(rows.len() <= 3);
    }
    assert_eq!(together.iter().map(Vec::len).sum::<usize>(), (0..20).map(|p| (p % 5).min(3)).sum::<usize>());
    // Every query needs a limit.
    assert!(matches!(s.store.read_many(vec![ReadQuery::new(&MIXED, [text("many1")])]).await, Err(StoreError::Invalid(_))));
}
