//! Conditional writes (lightweight transactions): one winner, no lost update, TTLs and deletes under a condition.

#[allow(clippy::wildcard_imports)]
use super::*;

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
        serialized: Serialized::InSite,
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
        serialized: Serialized::InSite,
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
                        serialized: Serialized::InSite,
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
