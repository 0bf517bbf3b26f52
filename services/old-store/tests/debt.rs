//! Compaction debt over two days of an injected clock: every appended
//! render's block is found by the sweep until a seal-level compaction covers
//! it, and a sweep reads only the hours that may still hold debt, never the
//! deletions of the hours behind them.

use std::sync::Arc;
use std::time::Duration;

use revstore_keys::time::millis;
use revstore_keys::{Domain, RevId, TidGenerator, Title, TitleRules};
use revstore_old_store::testing::{DEBT_SHARDS, DebtSweeper, debt_hour, debt_marker};
use revstore_old_store::{Archive, ArchiveBody, ArchiveSettings, BlockKey, BlockLimits, CompactionOutcome, UpdatePolicy, block_entry};
use revstore_storage::{EmbeddedEngine, EmbeddedOptions, ManualClock, Store};
use tokio_util::sync::CancellationToken;

const SEAL: i32 = 19;

async fn store(dir: &std::path::Path, clock: &ManualClock) -> Store {
    let options = EmbeddedOptions { clock: Arc::new(clock.clone()), ..EmbeddedOptions::default() };
    let store = Store::new(Arc::new(EmbeddedEngine::open(dir, options).expect("open")));
    store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
    store
}

fn archive(store: &Store) -> Archive {
    Archive::new(
        store.clone(),
        ArchiveSettings {
            policy: UpdatePolicy::FirstRenderPerRevision,
            limits: BlockLimits { max_revisions: 1000, max_bytes: 1 << 30 },
            seal_level: SEAL,
            cache_bytes: 16 << 20,
            settle: Duration::from_secs(30),
            max_concurrent_decodes: 1,
            table_log_max: None,
        },
    )
}

fn block_of(title: &str) -> BlockKey {
    BlockKey { domain: "en.wikipedia.org".to_owned(), title: title.to_owned(), block: 0 }
}

/// Appends one render of `title` at the store's time.
async fn append(archive: &Archive, ids: &TidGenerator, title: &str, rev: u64) {
    let domain = Domain::parse("en.wikipedia.org").expect("domain");
    let parsed = Title::parse(title, TitleRules::default()).expect("title");
    let entry = block_entry(&ArchiveBody { html: Some(format!("<p>{title} {rev}</p>")), ..Default::default() });
    let tid = ids.next_at(archive.store().now());
    archive.archive(&domain, &parsed, RevId::new(rev).expect("rev"), tid, entry).await.expect("archive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_reads_only_the_hours_that_may_still_hold_debt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = store(dir.path(), &clock).await;
    let archive = archive(&store);
    let sweeper = DebtSweeper::new(store.clone(), archive.queue().clone(), archive.debt_book().clone(), SEAL);
    let ids = TidGenerator::new();
    let stop = CancellationToken::new();

    // Two days: every hour, a dozen titles appended and sealed (their debt
    // discharged), then a sweep.
    let mut read_per_sweep = Vec::new();
    for hour in 0..48 {
        for i in 0..12 {
            let title = format!("Hour_{hour}_{i}");
            append(&archive, &ids, &title, 1).await;
            let outcome = archive.compact(&block_of(&title), SEAL, &stop).await.expect("seal");
            assert!(matches!(outcome, CompactionOutcome::Compacted { .. }), "{outcome:?}");
        }
        let report = sweeper.sweep().await.expect("sweep");
        assert_eq!(report.markers, 0, "hour {hour}: every marker was discharged by its seal: {report:?}");
        read_per_sweep.push(report.partitions);
        clock.advance(Duration::from_secs(3600));
    }
    // A shard's start trails now by the late-append margin (ten minutes):
    // each sweep reads the shard's current hour and at most two before it,
    // however many hours of deletions lie behind.
    let most = *read_per_sweep[2..].iter().max().expect("sweeps");
    assert!(most <= 3 * DEBT_SHARDS as u64, "a sweep read {most} partitions: {read_per_sweep:?}");
    assert!(read_per_sweep[47] <= read_per_sweep[2], "the sweep grew with the hours behind it: {read_per_sweep:?}");

    // Debt is still found: an append not yet sealed, and a marker another
    // replica left in the previous hour (its clock behind), not in this
    // process's book.
    let into_hour = millis(store.now()).rem_euclid(3_600_000) as u64;
    clock.advance(Duration::from_millis(3_600_000 - into_hour) + Duration::from_secs(120));
    append(&archive, &ids, "Owed_now", 1).await;
    let behind = store.now() - Duration::from_secs(300);
    assert_eq!(debt_hour(millis(behind)), debt_hour(millis(store.now())) - 1, "five minutes behind is the hour before");
    store.write(debt_marker(&block_of("Owed_behind"), 0, behind)).await.expect("a marker from a clock behind");
    let report = sweeper.sweep().await.expect("sweep");
    assert_eq!((report.markers, report.blocks), (2, 2), "{report:?}");
    // The sweep noted where the other replica's marker is: the seal of its
    // block (nothing to compact there) discharges it.
    append(&archive, &ids, "Owed_behind", 1).await;
    archive.compact(&block_of("Owed_behind"), SEAL, &stop).await.expect("seal");
    archive.compact(&block_of("Owed_now"), SEAL, &stop).await.expect("seal");
    let report = sweeper.sweep().await.expect("sweep");
    assert_eq!(report.markers, 0, "every marker discharged: {report:?}");
}
