//! Batches: all or nothing, and staged writes in order.

#[allow(clippy::wildcard_imports)]
use super::*;

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
