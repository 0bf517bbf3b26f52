//! Validation and schema: bad requests change nothing, added columns migrate in place.

#[allow(clippy::wildcard_imports)]
use super::*;

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
        serialized: Serialized::InSite,
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
