//! Reads: clustering orders, bounds, paging and its tokens, projections, large partitions, many partitions at once.

#[allow(clippy::wildcard_imports)]
use super::*;

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

pub async fn the_first_rows_alone_read_nothing_past_them(s: &Subject) {
    for a in 1..=3 {
        for b in ["x", "y", "z"] {
            s.store.write(mixed_row(a, b)).await.expect("write");
        }
    }
    let paged = s.store.read(&ReadQuery::new(&MIXED, [text("p")]).limit(2)).await.expect("read");
    assert_eq!(keys_ab(&paged.rows), vec![(3, "x".into()), (3, "y".into())]);
    assert!(paged.next.is_some(), "a limited read says a page follows");
    let first = s.store.read(&ReadQuery::new(&MIXED, [text("p")]).first(2)).await.expect("read");
    assert_eq!(keys_ab(&first.rows), keys_ab(&paged.rows), "the same rows");
    assert!(first.next.is_none(), "the first rows alone: no page token");
    // What the engine itself read: the limit, without the row that would say a page follows.
    let query = ReadQuery::new(&MIXED, [text("p")]).first(2);
    assert_eq!(s.store.engine.read(&query, None).await.expect("read").0.len(), 2);
    assert_eq!(s.store.engine.read(&query.clone().limit(2), None).await.expect("read").0.len(), 2, "first() stays first-only");
    let lookahead = ReadQuery { first_only: false, ..query };
    assert_eq!(s.store.engine.read(&lookahead, None).await.expect("read").0.len(), 3, "a paged read reads one more");
    let many = s.store.read_many(vec![ReadQuery::new(&MIXED, [text("p")]).limit(1)]).await.expect("read_many");
    assert_eq!(keys_ab(&many[0]), vec![(3, "x".into())]);
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

/// A read that resumes after a key (a merge resuming each partition where
/// it stopped): exactly the slice's rows after it, in either order, alone or
/// many at once; a key that is not a full clustering key, or one given with
/// a page token, is refused.
pub async fn reads_resume_after_a_key_within_their_slice(s: &Subject) {
    let mut writes: Vec<Write> = Vec::new();
    for a in 0..20i64 {
        for b in ["a", "b", "c", "d", "e"] {
            writes.push(Upsert::new(&MIXED, [text("after"), int(a), text(b)]).set("v", "row").into());
        }
    }
    for chunk in writes.chunks(50) {
        s.store.apply(chunk.to_vec()).await.expect("write");
    }
    let slice = Slice::all().lower(Bound::Included(int(5))).upper(Bound::Excluded(int(15)));
    let in_slice = |order: ReadOrder| {
        let mut keys: Vec<(i64, String)> = (5..15i64).flat_map(|a| ["a", "b", "c", "d", "e"].map(|b| (a, b.to_owned()))).collect();
        keys.sort_by(|x, y| y.0.cmp(&x.0).then_with(|| x.1.cmp(&y.1)));
        if order == ReadOrder::Reversed {
            keys.reverse();
        }
        keys
    };
    let mut queries = Vec::new();
    let mut expected = Vec::new();
    for order in [ReadOrder::Clustering, ReadOrder::Reversed] {
        let all = in_slice(order);
        // After a row inside the slice, at the end of a value of `a`, and after one outside it.
        for (after, limit) in [((12, "c"), 7u32), ((9, "e"), 3), ((11, "a"), 100), ((30, "a"), 4), ((2, "z"), 4)] {
            let query =
                ReadQuery::new(&MIXED, [text("after")]).slice(slice.clone()).order(order).after([int(after.0), text(after.1)]).limit(limit);
            // Whether a key comes after the position in the read's order (a DESC, b ASC, or reversed).
            let comes_after = |k: &(i64, String)| match order {
                ReadOrder::Clustering => k.0 < after.0 || (k.0 == after.0 && k.1.as_str() > after.1),
                ReadOrder::Reversed => k.0 > after.0 || (k.0 == after.0 && k.1.as_str() < after.1),
            };
            let rest: Vec<(i64, String)> = all.iter().filter(|k| comes_after(k)).take(limit as usize).cloned().collect();
            let alone = keys_ab(&s.store.read(&query).await.expect("read after a key").rows);
            assert_eq!(alone, rest, "after {after:?}, {order:?}, limit {limit}");
            queries.push(query);
            expected.push(rest);
        }
    }
    let together: Vec<Vec<(i64, String)>> =
        s.store.read_many(queries).await.expect("read_many after keys").iter().map(|r| keys_ab(r)).collect();
    assert_eq!(together, expected, "read_many resumes each query after its key");
    let refused = |query: ReadQuery| async move { matches!(s.store.read(&query).await, Err(StoreError::Invalid(_))) };
    let base = || ReadQuery::new(&MIXED, [text("after")]).limit(3);
    assert!(refused(base().after([int(3)])).await, "a partial key");
    assert!(refused(base().after([text("3"), text("a")])).await, "a key of the wrong types");
    let token = s.store.read(&base()).await.expect("first page").next.expect("more pages");
    assert!(refused(base().page_token(Some(token)).after([int(3), text("a")])).await, "a key and a page token");
}
