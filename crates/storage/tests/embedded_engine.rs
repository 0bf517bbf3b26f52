//! Behaviour of the embedded engine beyond the conformance suite: space really
//! comes back after TTL expiry, the data directory is exclusive, data survives a
//! reopen, and a changed table declaration or an older layout is refused.

use std::sync::Arc;
use std::time::Duration;

use revstore_schema::model::ColumnType::{BigInt, Blob, Text};
use revstore_schema::{Column as C, Compaction, Order, TableDef};
use revstore_storage::{
    Delete, EmbeddedEngine, EmbeddedOptions, ManualClock, ReadQuery, ScanQuery, Slice, Store, StoreError, Upsert, Value, Write,
};

static BLOBS: TableDef = TableDef {
    name: "blobs",
    columns: &[C::partition("k", Text), C::clustering("c", BigInt, Order::Asc), C::regular("v", Blob)],
    default_ttl: None,
    compaction: Compaction::SizeTiered,
    comment: "",
};

/// The same table name with another shape, as a changed declaration would have.
static BLOBS_CHANGED: TableDef = TableDef {
    name: "blobs",
    columns: &[C::partition("k", Text), C::clustering("c", BigInt, Order::Desc), C::regular("v", Blob)],
    default_ttl: None,
    compaction: Compaction::SizeTiered,
    comment: "",
};

/// The same table with only its comment and compaction strategy edited.
static BLOBS_RECOMMENTED: TableDef = TableDef {
    name: "blobs",
    columns: &[C::partition("k", Text), C::clustering("c", BigInt, Order::Asc), C::regular("v", Blob)],
    default_ttl: None,
    compaction: Compaction::Leveled,
    comment: "a comment edited since",
};

fn open(dir: &std::path::Path, clock: &ManualClock) -> Store {
    let options = EmbeddedOptions { clock: Arc::new(clock.clone()), gc_grace: Duration::from_secs(3600), ..EmbeddedOptions::default() };
    Store::new(Arc::new(EmbeddedEngine::open(dir, options).expect("open")))
}

fn files_size(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir).expect("dir").filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum()
}

/// Values that do not compress away, so file sizes mean something.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expiry_gives_disk_space_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = open(dir.path(), &clock);
    store.ensure_tables(&[&BLOBS]).await.expect("tables");
    store.purge_expired().await.expect("purge");
    let empty = files_size(dir.path());

    // 24 MiB that expire in a minute, and 1 MiB that stays.
    for batch in 0..48 {
        let writes: Vec<Write> = (0..8)
            .map(|i| {
                Upsert::new(&BLOBS, [Value::from("k"), Value::from(batch * 8 + i)])
                    .set("v", noise(batch as u64 * 8 + i as u64, 64 * 1024))
                    .ttl(60)
                    .into()
            })
            .collect();
        store.apply(writes).await.expect("write");
    }
    for i in 0..16 {
        store
            .write(Upsert::new(&BLOBS, [Value::from("keep"), Value::from(i)]).set("v", noise(10_000 + i as u64, 64 * 1024)))
            .await
            .expect("write");
    }
    store.purge_expired().await.expect("purge");
    let full = files_size(dir.path());
    assert!(full > empty + 24 * 1024 * 1024, "full {full}, empty {empty}");

    // Nothing has expired yet: a purge keeps everything.
    let early = store.purge_expired().await.expect("purge");
    assert_eq!(early.rows, 0);

    clock.advance_secs(61);
    let stats = store.purge_expired().await.expect("purge");
    assert_eq!(stats.rows, 384);
    let after = files_size(dir.path());
    assert!(after < empty + 2 * 1024 * 1024 + 512 * 1024, "expired data still on disk: {after} bytes, empty store {empty}");
    assert!(stats.bytes_freed >= 20 * 1024 * 1024, "{stats:?}");
    let kept = store.read(&ReadQuery::new(&BLOBS, [Value::from("keep")])).await.expect("read");
    assert_eq!(kept.rows.len(), 16);
    // The expired partition left the registry with its last row.
    let db = rusqlite::Connection::open(dir.path().join("revstore.db")).expect("inspect");
    let partitions: i64 = db.query_row("SELECT count(*) FROM \"blobs$partitions\"", [], |r| r.get(0)).expect("count");
    assert_eq!(partitions, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstones_shadow_until_their_grace_period_ends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = open(dir.path(), &clock);
    store.ensure_tables(&[&BLOBS]).await.expect("tables");
    let row = |ts: i64| Upsert::new(&BLOBS, [Value::from("k"), Value::from(1i64)]).set("v", vec![1u8]).timestamp(ts);
    store.write(Delete::range(&BLOBS, [Value::from("k")], Slice::all()).timestamp(1_000)).await.expect("delete");
    store.write(row(900)).await.expect("write");
    assert!(store.read(&ReadQuery::new(&BLOBS, [Value::from("k")])).await.expect("read").rows.is_empty());
    // Within the grace period a purge keeps the tombstone...
    clock.advance_secs(1800);
    assert_eq!(store.purge_expired().await.expect("purge").tombstones, 0);
    store.write(row(900)).await.expect("write");
    assert!(store.read(&ReadQuery::new(&BLOBS, [Value::from("k")])).await.expect("read").rows.is_empty());
    // ...after it, the tombstone is gone, as Cassandra drops it at gc_grace_seconds.
    clock.advance_secs(1801);
    assert_eq!(store.purge_expired().await.expect("purge").tombstones, 1);
    store.write(row(900)).await.expect("write");
    assert_eq!(store.read(&ReadQuery::new(&BLOBS, [Value::from("k")])).await.expect("read").rows.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_reopen_and_the_directory_is_exclusive() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    {
        let store = open(dir.path(), &clock);
        store.ensure_tables(&[&BLOBS]).await.expect("tables");
        store.write(Upsert::new(&BLOBS, [Value::from("k"), Value::from(7i64)]).set("v", vec![7u8; 10])).await.expect("write");
        let second = EmbeddedEngine::open(dir.path(), EmbeddedOptions::default());
        match second {
            Err(StoreError::Unavailable(msg)) => assert!(msg.contains("in use by another process"), "{msg}"),
            other => panic!("a second engine opened the same directory: {other:?}"),
        }
    }
    let store = open(dir.path(), &clock);
    store.ensure_tables(&[&BLOBS]).await.expect("tables");
    let row = store.get(&BLOBS, vec![Value::from("k"), Value::from(7i64)], None).await.expect("get").expect("row");
    assert_eq!(row.blob("v"), Some(&[7u8; 10][..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_declaration_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path(), &ManualClock::starting_now());
    store.ensure_tables(&[&BLOBS]).await.expect("tables");
    match store.ensure_tables(&[&BLOBS_CHANGED]).await {
        Err(StoreError::SchemaMismatch(msg)) => assert!(msg.contains("blobs"), "{msg}"),
        other => panic!("expected a schema mismatch, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_comment_or_compaction_strategy_keeps_the_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    {
        let store = open(dir.path(), &clock);
        store.ensure_tables(&[&BLOBS]).await.expect("tables");
        store.write(Upsert::new(&BLOBS, [Value::from("k"), Value::from(1i64)]).set("v", vec![1u8])).await.expect("write");
    }
    let store = open(dir.path(), &clock);
    store.ensure_tables(&[&BLOBS_RECOMMENTED]).await.expect("the same data, another comment");
    let row = store.get(&BLOBS_RECOMMENTED, vec![Value::from("k"), Value::from(1i64)], None).await.expect("get").expect("row");
    assert_eq!(row.blob("v"), Some(&[1u8][..]));
    // The edit was recorded: the first declaration now differs only by its comment, and is accepted too.
    store.ensure_tables(&[&BLOBS]).await.expect("back to the first comment");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_reopened_by_a_build_with_added_columns_keeps_its_data() {
    use revstore_storage::conformance::{EVOLVING_AFTER, EVOLVING_BEFORE};
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    {
        let store = open(dir.path(), &clock);
        store.ensure_tables(&[&EVOLVING_BEFORE]).await.expect("tables");
        store.write(Upsert::new(&EVOLVING_BEFORE, [Value::from("p"), Value::from(1i64)]).set("v", "before")).await.expect("write");
    }
    // The next build opens the same directory with two more columns declared.
    let store = open(dir.path(), &clock);
    store.ensure_tables(&[&EVOLVING_AFTER]).await.expect("columns added in place");
    store.write(Upsert::new(&EVOLVING_AFTER, [Value::from("p"), Value::from(1i64)]).set("added", 5i64)).await.expect("write");
    let row = store.get(&EVOLVING_AFTER, vec![Value::from("p"), Value::from(1i64)], None).await.expect("get").expect("row");
    assert_eq!((row.text("v"), row.bigint("added")), (Some("before"), Some(5)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_of_another_layout_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    {
        let store = open(dir.path(), &clock);
        store.ensure_tables(&[&BLOBS]).await.expect("tables");
    }
    // As a build with the previous layout (version 1, no registry) left it.
    rusqlite::Connection::open(dir.path().join("revstore.db")).expect("db").execute_batch("PRAGMA user_version = 1").expect("downgrade");
    let store = open(dir.path(), &clock);
    match store.ensure_tables(&[&BLOBS]).await {
        Err(StoreError::SchemaMismatch(msg)) => assert!(msg.contains("layout 1"), "{msg}"),
        other => panic!("an older layout was accepted: {other:?}"),
    }
}

/// A partition's local id is reused once the partition is gone (SQLite hands
/// out the highest id plus one); nothing of the old partition may show
/// through the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_partition_id_carries_nothing_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path(), &ManualClock::starting_now());
    store.ensure_tables(&[&BLOBS]).await.expect("tables");
    let put = |k: &'static str, c: i64| Upsert::new(&BLOBS, [Value::from(k), Value::from(c)]).set("v", vec![c as u8; 4]);
    store.write(put("first", 1)).await.expect("write");
    for c in 1..=3 {
        store.write(put("gone", c)).await.expect("write");
    }
    store.write(Delete::partition(&BLOBS, [Value::from("gone")])).await.expect("delete");
    let db = rusqlite::Connection::open(dir.path().join("revstore.db")).expect("inspect");
    let pids = |db: &rusqlite::Connection| -> Vec<(String, i64)> {
        let mut stmt = db.prepare("SELECT k, pid FROM \"blobs$partitions\" ORDER BY pid").expect("query");
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).expect("rows").collect::<Result<_, _>>().expect("rows")
    };
    assert_eq!(pids(&db), vec![("first".to_owned(), 1)], "the deleted partition stayed registered");

    store.write(put("new", 9)).await.expect("write");
    assert_eq!(pids(&db), vec![("first".to_owned(), 1), ("new".to_owned(), 2)], "the id was not reused");
    let cs = |rows: Vec<revstore_storage::Row>| rows.iter().map(|r| r.bigint("c").expect("c")).collect::<Vec<_>>();
    assert_eq!(cs(store.read(&ReadQuery::new(&BLOBS, [Value::from("new")])).await.expect("read").rows), vec![9]);
    assert!(store.read(&ReadQuery::new(&BLOBS, [Value::from("gone")])).await.expect("read").rows.is_empty());
    let scanned: Vec<Vec<Value>> =
        store.scan_range(&ScanQuery::new(&BLOBS, 10)).await.expect("scan").partitions.into_iter().map(|p| p.key).collect();
    assert_eq!(scanned.len(), 2);
    assert!(scanned.contains(&vec![Value::from("first")]) && scanned.contains(&vec![Value::from("new")]), "{scanned:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holdings_count_expired_rows_until_a_purge() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = open(dir.path(), &clock);
    store.ensure_tables(&[&BLOBS]).await.expect("tables");
    // "stays": 2 rows of 100 bytes; "expires": 3 rows of 100 bytes for a
    // minute; "deleted": one row written, then deleted.
    for c in 0..2 {
        store.write(Upsert::new(&BLOBS, [Value::from("stays"), Value::from(c)]).set("v", vec![1u8; 100])).await.expect("write");
    }
    for c in 0..3 {
        store.write(Upsert::new(&BLOBS, [Value::from("expires"), Value::from(c)]).set("v", vec![2u8; 100]).ttl(60)).await.expect("write");
    }
    store.write(Upsert::new(&BLOBS, [Value::from("deleted"), Value::from(0)]).set("v", vec![3u8; 100])).await.expect("write");
    store.write(Delete::row(&BLOBS, [Value::from("deleted")], [Value::from(0)])).await.expect("delete");
    let all = revstore_storage::ScanQuery::new(&BLOBS, 100);
    let everything = || store.holdings(&all);

    clock.advance_secs(61);
    let before = everything().await.expect("holdings");
    // Live: the two rows of "stays" (8-byte key + 100 bytes each).
    assert_eq!((before.rows_live, before.bytes_live), (2, 216));
    // Held besides: the three expired rows whole. A deleted row leaves the
    // table at once (its tombstone is kept aside, in `$tombstones`).
    assert_eq!((before.partitions, before.rows_held, before.bytes_held), (2, 5, 216 + 324));
    assert_eq!(before.next, None);

    // A purge drops the expired rows and their partition.
    store.purge_expired().await.expect("purge");
    let after = everything().await.expect("holdings");
    assert_eq!((after.partitions, after.rows_held, after.bytes_held, after.rows_live, after.bytes_live), (1, 2, 216, 2, 216));
}
