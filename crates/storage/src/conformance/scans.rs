//! Scans of the token ring, statics, and the holdings audits count.

#[allow(clippy::wildcard_imports)]
use super::*;

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
