//! Precedence under out-of-order and concurrent writers, on both engines, and
//! the grace period with injected time.
//!
//! A page history (revisions, each rendered several times) is written in many
//! random orders from several concurrent clients while a reader watches the
//! latest render. Every read must return a render that was written and never
//! one older than a render already acknowledged; at the end the latest is the
//! highest revision's newest render, each revision's latest render is its
//! newest, and every render is still retrievable by tid (grace).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rand::seq::SliceRandom;
use revstore_current_store::{Pages, Preconditions, RenderBody, RenderId};
use revstore_keys::{Domain, RevId, TidGenerator, Title, TitleRules};
use revstore_storage::testing::TestKeyspace;
use revstore_storage::{EmbeddedEngine, EmbeddedOptions, ManualClock, Store};

const REVISIONS: u64 = 6;
const RENDERS_PER_REVISION: u64 = 3;
const WRITERS: usize = 4;

fn history() -> Vec<(RenderId, RenderBody)> {
    let html = common::anarchism_html();
    let generator = TidGenerator::new();
    let start = SystemTime::now() - Duration::from_secs(3600);
    let mut out = Vec::new();
    for r in 0..REVISIONS {
        for n in 0..RENDERS_PER_REVISION {
            // Render times interleave across revisions: a late re-render of an old
            // revision is newer, by time, than an early render of a newer one.
            let at = start + Duration::from_secs(r * 60 + n * 97);
            let id = RenderId { rev: RevId::new(1000 + r).expect("rev"), tid: generator.next_at(at) };
            out.push((id, common::render(&html[(r * RENDERS_PER_REVISION + n) as usize % html.len()], r * 10 + n)));
        }
    }
    out
}

async fn replay(pages: &Pages, title: &Title) {
    let domain = Domain::parse("en.wikipedia.org").expect("domain");
    let history = history();
    let mut order = history.clone();
    order.shuffle(&mut rand::rng());
    let written: Vec<RenderId> = history.iter().map(|(id, _)| *id).collect();
    let acknowledged: Arc<Mutex<Option<RenderId>>> = Arc::new(Mutex::new(None));
    let done = Arc::new(AtomicBool::new(false));

    let reader = {
        let (pages, domain, title, acknowledged, done, written) =
            (pages.clone(), domain.clone(), title.clone(), acknowledged.clone(), done.clone(), written.clone());
        tokio::spawn(async move {
            let mut reads = 0;
            while !done.load(Ordering::SeqCst) {
                let floor = *acknowledged.lock().expect("lock");
                let seen = pages.latest(&domain, &title, &["tid"]).await.expect("read latest").map(|f| f.id);
                if let Some(floor) = floor {
                    let seen = seen.unwrap_or_else(|| panic!("nothing latest after {floor:?} was acknowledged"));
                    assert!(!floor.is_newer_than(&seen), "read {seen:?}, older than acknowledged {floor:?}");
                }
                if let Some(seen) = seen {
                    assert!(written.contains(&seen), "read a render never written: {seen:?}");
                }
                reads += 1;
                tokio::task::yield_now().await;
            }
            reads
        })
    };
    let mut writers = Vec::new();
    for share in order.chunks(order.len().div_ceil(WRITERS)) {
        let (pages, domain, title, acknowledged, share) =
            (pages.clone(), domain.clone(), title.clone(), acknowledged.clone(), share.to_vec());
        writers.push(tokio::spawn(async move {
            for (id, body) in share {
                pages.put(&domain, &title, id, &body, &Preconditions::default()).await.expect("write");
                let mut acked = acknowledged.lock().expect("lock");
                if acked.is_none_or(|a| id.is_newer_than(&a)) {
                    *acked = Some(id);
                }
            }
        }));
    }
    for w in writers {
        w.await.expect("writer");
    }
    done.store(true, Ordering::SeqCst);
    let reads = reader.await.expect("reader");
    assert!(reads > 0);

    let newest = written.iter().copied().reduce(|a, b| if b.is_newer_than(&a) { b } else { a }).expect("history");
    assert_eq!(
        pages.latest(&domain, title, &["tid"]).await.expect("latest").map(|f| f.id),
        Some(newest),
        "order {:?}",
        order.iter().map(|(id, _)| id).collect::<Vec<_>>()
    );
    for r in 0..REVISIONS {
        let rev = RevId::new(1000 + r).expect("rev");
        let newest_of_rev = written.iter().filter(|id| id.rev == rev).max_by_key(|id| id.tid).copied();
        assert_eq!(pages.of_rev(&domain, title, rev, &["tid"]).await.expect("of_rev").map(|f| f.id), newest_of_rev, "revision {rev}");
    }
    for id in &written {
        assert!(pages.of_tid(&domain, title, id.rev, id.tid, &["tid", "html"]).await.expect("of_tid").is_some(), "render {id:?} lost");
    }
}

fn pages_over(store: Store) -> Pages {
    Pages {
        store,
        grace: Duration::from_secs(86_400),
        clock_skew: Duration::ZERO,
        hand_off: true,
        notify_graph: false,
        remembered: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precedence_holds_in_any_order_embedded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::new(Arc::new(EmbeddedEngine::open(dir.path(), EmbeddedOptions::default()).expect("open")));
    store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
    let pages = pages_over(store);
    for trial in 0..12 {
        replay(&pages, &Title::parse(&format!("Trial {trial}"), TitleRules::default()).expect("title")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Cassandra: run scripts/test, or set REVSTORE_TEST_CASSANDRA and pass --ignored"]
async fn precedence_holds_in_any_order_cassandra() {
    let keyspace = TestKeyspace::new("current");
    let store = Store::new(Arc::new(keyspace.connect().await));
    store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
    let pages = pages_over(store);
    for trial in 0..6 {
        replay(&pages, &Title::parse(&format!("Trial {trial}"), TitleRules::default()).expect("title")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn superseded_renders_stay_for_the_grace_period_and_then_go() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = common::store_on_clock(dir.path(), &clock).await;
    let pages = common::pages_keeping(store.clone(), Duration::from_secs(3600));
    let (domain, title) =
        (Domain::parse("en.wikipedia.org").expect("domain"), Title::parse("Anarchism", TitleRules::default()).expect("title"));
    let html = common::anarchism_html();
    let generator = TidGenerator::new();
    let now = SystemTime::now();
    let id = |rev: u64, ago: u64| RenderId { rev: RevId::new(rev).expect("rev"), tid: generator.next_at(now - Duration::from_secs(ago)) };
    let (r1, r2, r3) = (id(5, 300), id(5, 200), id(6, 100));
    let put = |rid: RenderId, n: u64| {
        let (pages, domain, title, body) = (pages.clone(), domain.clone(), title.clone(), common::render(&html[n as usize], n));
        async move { pages.put(&domain, &title, rid, &body, &Preconditions::default()).await.expect("put") }
    };
    let by_tid = |rid: RenderId| {
        let (pages, domain, title) = (pages.clone(), domain.clone(), title.clone());
        async move { pages.of_tid(&domain, &title, rid.rev, rid.tid, &["tid"]).await.expect("read").map(|f| f.id) }
    };

    put(r1, 0).await;
    put(r2, 1).await; // supersedes r1 now: r1 must stay an hour
    clock.advance_secs(3000);
    common::run_retention(&pages).await;
    assert_eq!(by_tid(r1).await, Some(r1), "superseded render gone before the grace period ended");
    clock.advance_secs(700);
    assert_eq!(by_tid(r1).await, Some(r1), "held until retention removes it");

    put(r3, 2).await; // a new revision supersedes r2; a write deletes nothing
    assert_eq!(by_tid(r1).await, Some(r1), "a write deleted a render");
    common::run_retention(&pages).await; // r1 has been superseded for longer than the grace period
    assert_eq!(by_tid(r1).await, None, "retention left a render superseded past the grace period");
    assert_eq!(by_tid(r2).await, Some(r2), "retention removed the render just superseded");
    clock.advance_secs(3500);
    common::run_retention(&pages).await;
    assert_eq!(pages.of_rev(&domain, &title, r2.rev, &["tid"]).await.expect("read").map(|f| f.id), Some(r2));
    assert_eq!(by_tid(r2).await, Some(r2), "the grace period counts from the supersession, not from r2's own write");
    clock.advance_secs(200);
    common::run_retention(&pages).await;
    assert_eq!(pages.of_rev(&domain, &title, r2.rev, &["tid"]).await.expect("read").map(|f| f.id), None);
    assert_eq!(by_tid(r2).await, None, "retention left a render superseded past the grace period");
    assert_eq!(pages.latest(&domain, &title, &["tid"]).await.expect("read").map(|f| f.id), Some(r3), "the latest render stays");
    assert_eq!(pages.held(&domain, &title).await.expect("held").len(), 1);
}

/// A late write — a render that sorts behind one stored more than the grace
/// period ago, arriving after the retention sweep removed what was behind
/// that one, with a tid older than the sweep — is readable from its write
/// for its own grace period, like any superseded render, and then removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_write_behind_a_swept_boundary_is_readable_for_its_grace_period() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = common::store_on_clock(dir.path(), &clock).await;
    let pages = common::pages_keeping(store.clone(), Duration::from_secs(3600));
    let (domain, title) =
        (Domain::parse("en.wikipedia.org").expect("domain"), Title::parse("Anarchism", TitleRules::default()).expect("title"));
    let html = common::anarchism_html();
    let generator = TidGenerator::new();
    let start = store.now();
    let id = |rev: u64, at: SystemTime| RenderId { rev: RevId::new(rev).expect("rev"), tid: generator.next_at(at) };
    let (old, late, new) = (id(5, start - Duration::from_secs(600)), id(5, start - Duration::from_secs(300)), id(6, start));
    let put = |rid: RenderId, n: usize| {
        let (pages, domain, title, body) = (pages.clone(), domain.clone(), title.clone(), common::render(&html[n], n as u64));
        async move { pages.put(&domain, &title, rid, &body, &Preconditions::default()).await.expect("put") }
    };
    let by_tid = |rid: RenderId| {
        let (pages, domain, title) = (pages.clone(), domain.clone(), title.clone());
        async move { pages.of_tid(&domain, &title, rid.rev, rid.tid, &["tid"]).await.expect("read").map(|f| f.id) }
    };

    put(old, 0).await;
    put(new, 1).await;
    clock.advance_secs(3601);
    common::run_retention(&pages).await;
    assert_eq!(by_tid(old).await, None, "the sweep left a render superseded past the grace period");

    // Between the two in time, behind `new` by revision, written after the sweep.
    put(late, 2).await;
    assert_eq!(by_tid(late).await, Some(late), "a late write acknowledged and then unreadable");
    let held = pages.held(&domain, &title).await.expect("held");
    assert_eq!(
        held.iter().map(|h| (h.tid.clone(), h.held_in)).collect::<Vec<_>>(),
        [(new.tid.to_string(), "current"), (late.tid.to_string(), "grace")]
    );
    clock.advance_secs(3500);
    common::run_retention(&pages).await;
    assert_eq!(by_tid(late).await, Some(late), "a late write removed before its own grace period ended");
    clock.advance_secs(101);
    common::run_retention(&pages).await;
    assert_eq!(by_tid(late).await, None, "a late write kept past its grace period");
    assert_eq!(pages.latest(&domain, &title, &["tid"]).await.expect("read").map(|f| f.id), Some(new));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Cassandra: run scripts/test, or set REVSTORE_TEST_CASSANDRA and pass --ignored"]
async fn superseded_renders_stay_for_the_grace_period_cassandra() {
    // Real time on a real cluster: a grace period of four seconds.
    let keyspace = TestKeyspace::new("grace");
    let store = Store::new(Arc::new(keyspace.connect().await));
    store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
    let pages = common::pages_keeping(store, Duration::from_secs(4));
    let (domain, title) =
        (Domain::parse("en.wikipedia.org").expect("domain"), Title::parse("Anarchism", TitleRules::default()).expect("title"));
    let html = common::anarchism_html();
    let generator = TidGenerator::new();
    let now = SystemTime::now();
    let (r1, r2) = (
        RenderId { rev: RevId::new(5).expect("rev"), tid: generator.next_at(now - Duration::from_secs(20)) },
        RenderId { rev: RevId::new(5).expect("rev"), tid: generator.next_at(now - Duration::from_secs(10)) },
    );
    pages.put(&domain, &title, r1, &common::render(&html[0], 0), &Preconditions::default()).await.expect("put");
    // The grace period of r1 starts with the write that supersedes it, which
    // starts no earlier than this.
    let superseding = Instant::now();
    pages.put(&domain, &title, r2, &common::render(&html[1], 1), &Preconditions::default()).await.expect("put");
    let by_tid = |id: RenderId| {
        let (pages, domain, title) = (pages.clone(), domain.clone(), title.clone());
        async move { pages.of_tid(&domain, &title, id.rev, id.tid, &["tid"]).await.expect("read").map(|f| f.id) }
    };
    // Waits for the state, not a guessed time: r1 stays until the grace period
    // after its supersession ends, and the retention sweep then removes it.
    loop {
        common::run_retention(&pages).await;
        match by_tid(r1).await {
            Some(found) => assert_eq!(found, r1),
            None => break,
        }
        assert!(superseding.elapsed() < Duration::from_secs(60), "superseded render kept past the grace period");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let kept = superseding.elapsed();
    assert!(kept >= Duration::from_secs(4), "superseded render gone {kept:?} after it was superseded, before the grace period ended");
    assert_eq!(pages.latest(&domain, &title, &["tid"]).await.expect("read").map(|f| f.id), Some(r2), "the latest render never expires");
}

/// The embedded engine applying stages as Cassandra does (a partition at a
/// time, the trait's default) and failing every apply from the `cut_from`-th
/// on: a write cut between or inside its stages, as a crash, a timeout or a
/// node going away would cut it.
#[derive(Debug)]
struct CutWrites {
    inner: EmbeddedEngine,
    applies: std::sync::atomic::AtomicUsize,
    cut_from: std::sync::atomic::AtomicUsize,
}

impl CutWrites {
    fn cut_after(&self, applies: usize) {
        self.applies.store(0, Ordering::SeqCst);
        self.cut_from.store(applies, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl revstore_storage::Engine for CutWrites {
    fn kind(&self) -> revstore_storage::EngineKind {
        self.inner.kind()
    }
    fn now_micros(&self) -> i64 {
        self.inner.now_micros()
    }
    async fn ensure_tables(&self, tables: &[&'static revstore_storage::TableDef]) -> revstore_storage::StoreResult<()> {
        self.inner.ensure_tables(tables).await
    }
    async fn apply(&self, writes: Vec<revstore_storage::Write>) -> revstore_storage::StoreResult<()> {
        if self.applies.fetch_add(1, Ordering::SeqCst) >= self.cut_from.load(Ordering::SeqCst) {
            return Err(revstore_storage::StoreError::Unavailable("the write was cut here".into()));
        }
        self.inner.apply(writes).await
    }
    async fn read(
        &self,
        query: &revstore_storage::ReadQuery,
        after: Option<Vec<revstore_storage::Value>>,
    ) -> revstore_storage::StoreResult<(Vec<revstore_storage::Row>, Option<revstore_storage::Row>)> {
        self.inner.read(query, after).await
    }
    async fn cas(&self, cas: revstore_storage::Cas) -> revstore_storage::StoreResult<revstore_storage::CasOutcome> {
        self.inner.cas(cas).await
    }
    async fn scan(&self, query: &revstore_storage::ScanQuery) -> revstore_storage::StoreResult<Vec<revstore_storage::ScannedPartition>> {
        self.inner.scan(query).await
    }
    async fn holdings(&self, query: &revstore_storage::ScanQuery) -> revstore_storage::StoreResult<revstore_storage::Holdings> {
        self.inner.holdings(query).await
    }
    async fn ping(&self) -> revstore_storage::StoreResult<()> {
        self.inner.ping().await
    }
    async fn purge_expired(&self) -> revstore_storage::StoreResult<revstore_storage::PurgeStats> {
        self.inner.purge_expired().await
    }
}

/// A write cut anywhere in its stages changes what readers see in no way (the
/// latest render, the listing, the superseded render's grace copy), and its
/// retry completes it: the ordering that replaced the cross-partition batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_between_its_stages_is_invisible_and_its_retry_completes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Arc::new(CutWrites {
        inner: EmbeddedEngine::open(dir.path(), EmbeddedOptions::default()).expect("open"),
        applies: Default::default(),
        cut_from: usize::MAX.into(),
    });
    let store = Store::new(engine.clone());
    store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
    let pages = pages_over(store);
    let domain = Domain::parse("en.wikipedia.org").expect("domain");
    let html = common::anarchism_html();
    let generator = TidGenerator::new();
    let now = SystemTime::now();

    // A new revision: stage one holds the hand-off, stage two the page's row.
    for (cut_after, n) in [(0, 1), (1, 2)] {
        let title = Title::parse(&format!("Cut after {cut_after}"), TitleRules::default()).expect("title");
        let old = RenderId { rev: RevId::new(5).expect("rev"), tid: generator.next_at(now - Duration::from_secs(60)) };
        pages.put(&domain, &title, old, &common::render(&html[0], 0), &Preconditions::default()).await.expect("first write");
        let new = RenderId { rev: RevId::new(6).expect("rev"), tid: generator.next_at(now - Duration::from_secs(30 - n)) };
        let body = common::render(&html[n as usize], n);
        engine.cut_after(cut_after);
        let cut = pages.put(&domain, &title, new, &body, &Preconditions::default()).await;
        assert!(cut.is_err(), "a write cut after {cut_after} applies succeeded");
        engine.cut_after(usize::MAX);
        let latest = pages.latest(&domain, &title, &["tid"]).await.expect("latest").map(|f| f.id);
        assert_eq!(latest, Some(old), "a cut write became visible (cut after {cut_after} applies)");
        let held = pages.held(&domain, &title).await.expect("held");
        assert_eq!(held.len(), 1, "a cut write is listed: {held:?}");
        assert!(pages.of_rev(&domain, &title, new.rev, &["tid"]).await.expect("of_rev").is_none());

        // The retry completes it; the render it supersedes is in its grace period.
        pages.put(&domain, &title, new, &body, &Preconditions::default()).await.expect("retry");
        assert_eq!(pages.latest(&domain, &title, &["tid"]).await.expect("latest").map(|f| f.id), Some(new));
        assert_eq!(pages.of_tid(&domain, &title, old.rev, old.tid, &["tid"]).await.expect("of_tid").map(|f| f.id), Some(old));
        assert_eq!(pages.of_rev(&domain, &title, old.rev, &["tid"]).await.expect("of_rev").map(|f| f.id), Some(old));
    }
}
