//! The archive below the HTTP API: blocks filled, compacted and read back on
//! real histories; replicas racing for the same title; corruption detected.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Engine, store_on};
use revstore_keys::{Domain, RevId, Tid, TitleRules};
use revstore_old_store::testing::{debt_hour, debt_shard};
use revstore_old_store::{
    Archive, ArchiveBody, ArchiveError, ArchiveOutcome, ArchiveSettings, BaseChoice, BlockKey, BlockLimits, CompactionOutcome,
    GROWTH_LEVEL, Part, StoredParts, UpdatePolicy, block_entry,
};
use revstore_schema::tables::old_store::{ARCHIVE_BLOCKS, ARCHIVE_DEBT, ARCHIVE_META};
use revstore_service::ApiError;
use revstore_storage::{EmbeddedEngine, EmbeddedOptions, ManualClock, ReadQuery, Store, Upsert, Value};
use tokio_util::sync::CancellationToken;

fn settings(max_revisions: u64, max_bytes: u64) -> ArchiveSettings {
    ArchiveSettings {
        policy: UpdatePolicy::FirstRenderPerRevision,
        limits: BlockLimits { max_revisions, max_bytes },
        seal_level: 19,
        cache_bytes: 64 << 20,
        settle: Duration::from_secs(3600),
        max_concurrent_decodes: 2,
        table_log_max: None,
    }
}

fn page(title: &str) -> (Domain, revstore_keys::Title) {
    (Domain::parse("en.wikipedia.org").expect("domain"), revstore_keys::Title::parse(title, TitleRules::default()).expect("title"))
}

fn html_entry(html: &str) -> Vec<u8> {
    block_entry(&ArchiveBody { html: Some(html.to_owned()), ..Default::default() })
}

/// Reads every revision back through a fresh archive (cold cache) and checks it.
async fn assert_reads_back(store: &Store, settings: ArchiveSettings, title: &str, revisions: &[(u64, Tid, String)]) {
    let archive = Archive::new(store.clone(), settings);
    let (d, t) = page(title);
    // Random order first (cold blocks decoded up to each revision), then in order.
    let mut order: Vec<usize> = (0..revisions.len()).collect();
    use rand::seq::SliceRandom;
    order.shuffle(&mut rand::rng());
    for i in order.into_iter().chain(0..revisions.len()) {
        let (rev, tid, html) = &revisions[i];
        let at = archive.locate(&d, &t, RevId::new(*rev).expect("rev"), None).await.expect("locate").expect("archived");
        assert_eq!(at.tid, *tid);
        let entry = archive.content(&d, &t, &at).await.expect("content");
        let parts = StoredParts::parse(&entry.content).expect("parts");
        assert!(parts.get(Part::Html) == Some(html.as_bytes()), "revision {rev} reads back different");
    }
}

async fn a_history_reads_back_through_every_stage_of_its_blocks(engine: Engine) {
    let (store, _guard) = store_on(engine).await;
    let html = revstore_testdata::anarchism_html();
    // Small blocks, so the history spans sealed, compacted and chained blocks.
    let settings = settings(40, 1 << 30);
    let archive = Archive::new(store.clone(), settings.clone());
    let (d, t) = page("Anarchism");
    let mut written = Vec::new();
    for (i, h) in html.iter().enumerate() {
        let (rev, tid) = (1000 + i as u64, Tid::now());
        let outcome = archive.archive(&d, &t, RevId::new(rev).expect("rev"), tid, html_entry(h)).await.expect("archive");
        assert_eq!(outcome, ArchiveOutcome::Stored);
        written.push((rev, tid, h.clone()));
        if i == 50 {
            // Mid-way: everything so far reads back with nothing compacted.
            assert_reads_back(&store, settings.clone(), "Anarchism", &written).await;
        }
    }
    // Blocks 0 and 1 are full (40 each), block 2 holds the last 17.
    let key = |block| BlockKey { domain: d.as_str().to_owned(), title: t.as_str().to_owned(), block };
    let stop = CancellationToken::new();
    assert_compacted(archive.compact(&key(0), GROWTH_LEVEL, &stop).await.expect("compact"), 40);
    assert_reads_back(&store, settings.clone(), "Anarchism", &written).await;
    assert_compacted(archive.compact(&key(0), 19, &stop).await.expect("compact"), 40);
    assert_eq!(archive.compact(&key(0), 19, &stop).await.expect("compact"), CompactionOutcome::NothingToDo);
    // Block 2 cannot choose its base before block 1 has: its rows are compacted, its debt kept.
    assert_eq!(archive.compact(&key(2), 19, &stop).await.expect("compact"), CompactionOutcome::BaseUndecided);
    assert_eq!(archive.compact(&key(2), 19, &stop).await.expect("compact"), CompactionOutcome::BaseUndecided);
    assert_compacted(archive.compact(&key(1), 19, &stop).await.expect("compact"), 40);
    assert_compacted(archive.compact(&key(2), 19, &stop).await.expect("compact"), 17);
    // Appends after a compaction chain onto the frame's last revision.
    for (i, h) in html.iter().take(3).enumerate() {
        let (rev, tid) = (5000 + i as u64, Tid::now());
        archive.archive(&d, &t, RevId::new(rev).expect("rev"), tid, html_entry(h)).await.expect("archive");
        written.push((rev, tid, h.clone()));
    }
    assert_reads_back(&store, settings.clone(), "Anarchism", &written).await;
    assert_compacted(archive.compact(&key(2), GROWTH_LEVEL, &stop).await.expect("compact"), 20);
    assert_reads_back(&store, settings.clone(), "Anarchism", &written).await;
    // The compacted rows are gone from the block: only the frame remains.
    let block2 = store.read(&ReadQuery::new(&ARCHIVE_BLOCKS, key(2).partition_values())).await.expect("read");
    assert!(block2.rows.is_empty(), "{} rows left after compaction", block2.rows.len());
}

fn assert_compacted(outcome: CompactionOutcome, expected: usize) {
    match outcome {
        CompactionOutcome::Compacted { revisions, raw_bytes, stored_bytes, .. } => {
            assert_eq!(revisions, expected);
            assert!(stored_bytes * 5 < raw_bytes, "{stored_bytes} bytes stored for {raw_bytes}");
        }
        other => panic!("expected a compaction of {expected} revisions, got {other:?}"),
    }
}

async fn replicas_racing_for_one_title_lose_nothing_and_store_nothing_twice(engine: Engine) {
    let (store, _guard) = store_on(engine).await;
    let html = Arc::new(revstore_testdata::anarchism_html());
    let limits = settings(8, 300_000);
    let (d, t) = page("Race");
    // Four replicas (own caches), each writing every revision once, all at the same time:
    // each revision is offered four times and must be stored exactly once.
    let replicas: Vec<Archive> = (0..4).map(|_| Archive::new(store.clone(), limits.clone())).collect();
    let tids: Arc<Vec<Tid>> = Arc::new((0..html.len()).map(|_| Tid::now()).collect());
    let mut tasks = Vec::new();
    for (r, archive) in replicas.into_iter().enumerate() {
        let (html, tids, d, t) = (html.clone(), tids.clone(), d.clone(), t.clone());
        tasks.push(tokio::spawn(async move {
            let mut stored = 0;
            // Each replica walks the history from a different starting point.
            for k in 0..html.len() {
                let i = (k + r * html.len() / 4) % html.len();
                let outcome =
                    archive.archive(&d, &t, RevId::new(1 + i as u64).expect("rev"), tids[i], html_entry(&html[i])).await.expect("archive");
                if outcome == ArchiveOutcome::Stored {
                    stored += 1;
                }
            }
            stored
        }));
    }
    let mut stored = 0;
    for task in tasks {
        stored += task.await.expect("replica");
    }
    assert_eq!(stored, html.len(), "each revision stored by exactly one replica");

    let meta = store.read(&ReadQuery::new(&ARCHIVE_META, [Value::from(d.as_str()), Value::from(t.as_str())])).await.expect("meta");
    assert_eq!(meta.rows.len(), html.len(), "one metadata row per revision");
    assert_eq!(meta.statics.as_ref().and_then(|s| s.bigint("rev_count")), Some(html.len() as i64));
    let mut slots: Vec<i64> = meta.rows.iter().filter_map(|r| r.bigint("slot")).collect();
    slots.sort();
    assert_eq!(slots, (0..html.len() as i64).collect::<Vec<_>>(), "slots taken once each, none skipped");
    // No block over its limits.
    let mut per_block: std::collections::BTreeMap<i64, (u64, u64)> = Default::default();
    for row in &meta.rows {
        let rev = row.bigint("rev").expect("rev") as usize;
        let e = per_block.entry(row.bigint("block").expect("block")).or_default();
        e.0 += 1;
        e.1 += html_entry(&html[rev - 1]).len() as u64;
    }
    for (block, (revisions, bytes)) in &per_block {
        assert!(*revisions <= 8, "block {block} holds {revisions} revisions");
        assert!(*revisions == 1 || *bytes <= 300_000, "block {block} holds {bytes} bytes");
    }
    let written: Vec<(u64, Tid, String)> = (0..html.len()).map(|i| (1 + i as u64, tids[i], html[i].clone())).collect();
    assert_reads_back(&store, limits, "Race", &written).await;
}

async fn a_corrupted_block_is_an_integrity_error_not_garbage(engine: Engine) {
    let (store, _guard) = store_on(engine).await;
    let html = revstore_testdata::anarchism_html();
    let archive = Archive::new(store.clone(), settings(1000, 1 << 30));
    let (d, t) = page("Corrupt");
    let tids: Vec<Tid> = (0..3).map(|_| Tid::now()).collect();
    for i in 0..3 {
        archive.archive(&d, &t, RevId::new(1 + i as u64).expect("rev"), tids[i], html_entry(&html[i])).await.expect("archive");
    }
    // Flip one byte in the middle of the second revision's stored bytes.
    let key = [Value::from(d.as_str()), Value::from(t.as_str()), Value::from(0i64)];
    let block = store.read(&ReadQuery::new(&ARCHIVE_BLOCKS, key.clone())).await.expect("read");
    let row = &block.rows[1];
    let mut bytes = row.blob("content").expect("content").to_vec();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    store
        .write(
            Upsert::new(&ARCHIVE_BLOCKS, key.into_iter().chain([Value::from(1i64), Value::from(tids[1])]))
                .set("rev", 2i64)
                .set("content", bytes),
        )
        .await
        .expect("write");
    let cold = Archive::new(store.clone(), settings(1000, 1 << 30));
    let first = cold.locate(&d, &t, RevId::new(1).expect("rev"), None).await.expect("locate").expect("there");
    assert!(cold.content(&d, &t, &first).await.is_ok(), "revisions before the damage still read");
    for rev in [2, 3] {
        let at = cold.locate(&d, &t, RevId::new(rev).expect("rev"), None).await.expect("locate").expect("there");
        let err = cold.content(&d, &t, &at).await.expect_err("damaged");
        assert!(matches!(err, ArchiveError::Integrity { .. }), "revision {rev}: {err}");
        assert_eq!(ApiError::from(err).status(), 500, "an integrity error is a 500 at the HTTP edge");
    }
}

/// A writer that lost its slot can leave its content row behind, even below a
/// block's compacted part (its write landed after the compaction's delete).
/// Such a row is never read, and never hides the renders appended after it.
async fn a_leftover_row_neither_shows_nor_stalls_compaction(engine: Engine) {
    let (store, _guard) = store_on(engine).await;
    let html = revstore_testdata::anarchism_html();
    let archive = Archive::new(store.clone(), settings(1000, 1 << 30));
    let (d, t) = page("Leftover");
    let mut written = Vec::new();
    for (i, h) in html.iter().enumerate().take(3) {
        let tid = Tid::now();
        archive.archive(&d, &t, RevId::new(1 + i as u64).expect("rev"), tid, html_entry(h)).await.expect("archive");
        written.push((1 + i as u64, tid, h.clone()));
    }
    let key = BlockKey { domain: d.as_str().to_owned(), title: t.as_str().to_owned(), block: 0 };
    let stop = CancellationToken::new();
    assert_compacted(archive.compact(&key, 19, &stop).await.expect("compact"), 3);
    // The loser's row at slot 1, written after the compaction.
    store
        .write(
            Upsert::new(&ARCHIVE_BLOCKS, key.partition_values().into_iter().chain([Value::from(1i64), Value::from(Tid::now())]))
                .set("rev", 99i64)
                .set("content", b"not a chained revision".to_vec()),
        )
        .await
        .expect("write");
    for (i, h) in html.iter().enumerate().take(5).skip(3) {
        let tid = Tid::now();
        archive.archive(&d, &t, RevId::new(1 + i as u64).expect("rev"), tid, html_entry(h)).await.expect("archive");
        written.push((1 + i as u64, tid, h.clone()));
    }
    assert_reads_back(&store, settings(1000, 1 << 30), "Leftover", &written).await;
    assert_compacted(archive.compact(&key, 19, &stop).await.expect("compact"), 5);
    assert_reads_back(&store, settings(1000, 1 << 30), "Leftover", &written).await;
}

/// The soak's writers: a writer that lost a slot at a block boundary (it saw
/// the block with room, the winner found it full and took the slot in the
/// next block) leaves its row in the block the winner left. Two such rows
/// made the block's seal fail for good ("no committed render at slot 4"),
/// retried and logged forever; one alone was sealed into the block as a
/// render nobody reads. Both are left out now.
async fn a_lost_writer_at_a_block_boundary_neither_stalls_nor_joins_the_seal(engine: Engine) {
    let (store, _guard) = store_on(engine).await;
    let html = revstore_testdata::anarchism_html();
    for losers in [1usize, 2] {
        let archive = Archive::new(store.clone(), settings(4, 1 << 30));
        let (d, t) = page(&format!("Boundary_{losers}"));
        let mut written = Vec::new();
        let mut archive_rev = async |i: usize| {
            let tid = Tid::now();
            let outcome = archive.archive(&d, &t, RevId::new(1 + i as u64).expect("rev"), tid, html_entry(&html[i])).await;
            assert_eq!(outcome.expect("archive"), ArchiveOutcome::Stored);
            written.push((1 + i as u64, tid, html[i].clone()));
        };
        for i in 0..4 {
            archive_rev(i).await;
        }
        // Block 0 is full (four revisions): the losers took slot 4 in it.
        let block = |block| BlockKey { domain: d.as_str().to_owned(), title: t.as_str().to_owned(), block };
        for n in 0..losers {
            let link = revstore_codecs::encode_chained(None, &html_entry(&html[10 + n]), 3).expect("encode");
            let row =
                Upsert::new(&ARCHIVE_BLOCKS, block(0).partition_values().into_iter().chain([Value::from(4i64), Value::from(Tid::now())]))
                    .set("rev", 50 + n as i64)
                    .set("content", link);
            store.write(row).await.expect("a loser's row");
        }
        // The winner: slot 4, in block 1.
        archive_rev(4).await;
        let stop = CancellationToken::new();
        assert_compacted(archive.compact(&block(0), 19, &stop).await.expect("the seal of block 0"), 4);
        assert_compacted(archive.compact(&block(1), 19, &stop).await.expect("the seal of block 1"), 1);
        assert_reads_back(&store, settings(4, 1 << 30), &format!("Boundary_{losers}"), &written).await;
    }
}

/// The debt markers of a title appended in the last few hours: (block, slot)
/// of each render still owed a seal-level compaction.
async fn debt_of(store: &Store, d: &Domain, t: &revstore_keys::Title) -> Vec<(i64, i64)> {
    let shard = Value::from(debt_shard(d.as_str(), t.as_str()));
    let now = debt_hour(revstore_keys::time::millis(store.now()));
    let mut markers = Vec::new();
    for hour in now - 3..=now {
        let page = store
            .read(
                &ReadQuery::new(&ARCHIVE_DEBT, [shard.clone(), Value::from(hour)])
                    .slice(revstore_storage::Slice::prefix([Value::from(d.as_str()), Value::from(t.as_str())])),
            )
            .await
            .expect("debt");
        markers.extend(page.rows.iter().map(|r| (r.bigint("block").expect("block"), r.bigint("slot").expect("slot"))));
    }
    markers.sort();
    markers
}

async fn debt_is_kept_per_render_until_a_seal_level_compaction_covers_it(engine: Engine) {
    let (store, _guard) = store_on(engine).await;
    let html = revstore_testdata::anarchism_html();
    let archive = Archive::new(store.clone(), settings(1000, 1 << 30));
    let (d, t) = page("Debt");
    let stop = CancellationToken::new();
    for (i, h) in html.iter().enumerate().take(6) {
        archive.archive(&d, &t, RevId::new(1 + i as u64).expect("rev"), Tid::now(), html_entry(h)).await.expect("archive");
    }
    assert_eq!(debt_of(&store, &d, &t).await, (0..6).map(|slot| (0, slot)).collect::<Vec<_>>(), "one marker per appended render");
    let key = BlockKey { domain: d.as_str().to_owned(), title: t.as_str().to_owned(), block: 0 };
    // A growth-level compaction leaves the block owed its seal-level one.
    assert_compacted(archive.compact(&key, GROWTH_LEVEL, &stop).await.expect("compact"), 6);
    assert_eq!(debt_of(&store, &d, &t).await.len(), 6);
    assert_compacted(archive.compact(&key, 19, &stop).await.expect("compact"), 6);
    assert!(debt_of(&store, &d, &t).await.is_empty(), "the seal-level compaction discharges the debt");
    // A render appended after it is owed again, and only it.
    archive.archive(&d, &t, RevId::new(7).expect("rev"), Tid::now(), html_entry(&html[6])).await.expect("archive");
    assert_eq!(debt_of(&store, &d, &t).await, vec![(0, 6)]);
    // A cancelled compaction stores nothing and keeps the debt.
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    assert_eq!(archive.compact(&key, 19, &cancelled).await.expect("compact"), CompactionOutcome::Cancelled);
    assert_eq!(debt_of(&store, &d, &t).await, vec![(0, 6)]);
    assert_compacted(archive.compact(&key, 19, &stop).await.expect("compact"), 7);
    assert!(debt_of(&store, &d, &t).await.is_empty());
}

/// A marker whose append never committed (its writer died between the
/// marker and the row) outlives the seal that covers its block's committed
/// renders, as an append still in flight must; once it is older than the
/// abandoned-after limit by the store's clock, the next seal drops it.
/// Time is the injected clock's: nothing sleeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_whose_append_never_committed_is_dropped_once_abandoned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let options = EmbeddedOptions { clock: Arc::new(clock.clone()), ..EmbeddedOptions::default() };
    let store = Store::new(Arc::new(EmbeddedEngine::open(dir.path(), options).expect("open")));
    store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
    let html = revstore_testdata::anarchism_html();
    let archive = Archive::new(store.clone(), settings(1000, 1 << 30));
    let (d, t) = page("Abandoned");
    let stop = CancellationToken::new();
    let generator = revstore_keys::TidGenerator::new();
    let tid_now = || generator.next_at(store.now());
    for (i, h) in html.iter().enumerate().take(3) {
        archive.archive(&d, &t, RevId::new(1 + i as u64).expect("rev"), tid_now(), html_entry(h)).await.expect("archive");
    }
    let key = BlockKey { domain: d.as_str().to_owned(), title: t.as_str().to_owned(), block: 0 };
    store.write(revstore_old_store::testing::debt_marker(&key, 5, store.now())).await.expect("the marker of an append that died");
    assert_compacted(archive.compact(&key, 19, &stop).await.expect("seal"), 3);
    assert_eq!(debt_of(&store, &d, &t).await, vec![(0, 5)], "an append in flight keeps its marker");
    // Within the limit, another seal keeps it too.
    clock.advance(Duration::from_secs(3000));
    archive.archive(&d, &t, RevId::new(4).expect("rev"), tid_now(), html_entry(&html[3])).await.expect("archive");
    assert_compacted(archive.compact(&key, 19, &stop).await.expect("seal"), 4);
    assert_eq!(debt_of(&store, &d, &t).await, vec![(0, 5)]);
    // Past it (an hour after the marker): the next seal drops it.
    clock.advance(Duration::from_secs(601));
    archive.archive(&d, &t, RevId::new(5).expect("rev"), tid_now(), html_entry(&html[4])).await.expect("archive");
    assert_compacted(archive.compact(&key, 19, &stop).await.expect("seal"), 5);
    assert!(debt_of(&store, &d, &t).await.is_empty(), "the abandoned marker outlived the limit");
}

async fn blocks_of_a_large_page_are_compressed_against_an_anchor(engine: Engine) {
    let (store, _guard) = store_on(engine).await;
    // 150 KB revisions, three to a block: the shape of a page of multi-megabyte revisions.
    let large = revstore_testdata::large_page_history(5, 18);
    let max_bytes = large.iter().map(|r| html_entry(r).len() as u64).max().expect("revisions") * 3 + 100;
    let archive = Archive::new(store.clone(), settings(1000, max_bytes));
    let (d, t) = page("Large");
    let stop = CancellationToken::new();
    let mut written = Vec::new();
    for (i, r) in large.iter().enumerate() {
        let tid = Tid::now();
        archive.archive(&d, &t, RevId::new(1 + i as u64).expect("rev"), tid, html_entry(r)).await.expect("archive");
        written.push((1 + i as u64, tid, r.clone()));
    }
    let key = |block| BlockKey { domain: d.as_str().to_owned(), title: t.as_str().to_owned(), block };
    let mut stored = Vec::new();
    for block in 0..6 {
        match archive.compact(&key(block), 19, &stop).await.expect("compact") {
            CompactionOutcome::Compacted { revisions, stored_bytes, base, .. } => {
                assert_eq!(revisions, 3);
                let expected = if block == 0 { BaseChoice::Anchor } else { BaseChoice::On { block: 0, slot: 0 } };
                assert_eq!(base, expected, "block {block}");
                stored.push(stored_bytes);
            }
            other => panic!("block {block}: {other:?}"),
        }
    }
    // Every block after the anchor costs a fraction of the anchor, which pays for a whole revision.
    for (block, bytes) in stored.iter().enumerate().skip(1) {
        assert!(bytes * 4 < stored[0], "block {block}: {bytes} bytes against the anchor's {}", stored[0]);
    }
    assert_reads_back(&store, settings(1000, max_bytes), "Large", &written).await;
    // A block whose frame is corrupted against its base is an integrity error, not garbage:
    // tamper with the base slot the block names.
    store.write(Upsert::new(&ARCHIVE_BLOCKS, key(3).partition_values()).set("base_slot", 1i64)).await.expect("tamper");
    let fresh = Archive::new(store.clone(), settings(1000, max_bytes));
    let at = fresh.locate(&d, &t, RevId::new(11).expect("rev"), None).await.expect("locate").expect("archived");
    assert_eq!(at.block, 3);
    assert!(fresh.content(&d, &t, &at).await.is_err(), "a wrong base must not decode");
}

revstore_test_service::on_both_engines!(
    a_lost_writer_at_a_block_boundary_neither_stalls_nor_joins_the_seal,
    a_leftover_row_neither_shows_nor_stalls_compaction,
    a_history_reads_back_through_every_stage_of_its_blocks,
    replicas_racing_for_one_title_lose_nothing_and_store_nothing_twice,
    a_corrupted_block_is_an_integrity_error_not_garbage,
    debt_is_kept_per_render_until_a_seal_level_compaction_covers_it,
    blocks_of_a_large_page_are_compressed_against_an_anchor,
);
