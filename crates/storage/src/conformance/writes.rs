//! Writes as Cassandra resolves them: last write wins by timestamp, cell by cell; tombstones; TTLs.

#[allow(clippy::wildcard_imports)]
use super::*;

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
