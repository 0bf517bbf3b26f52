//! Retention with injected time: what a write deletes, and what it leaves to
//! the janitor's retention sweep.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use revstore_current_store::{Pages, Preconditions, RenderId};
use revstore_keys::{Domain, RevId, TidGenerator, Title, TitleRules};
use revstore_schema::tables::current_store::PAGE_RENDERS;
use revstore_storage::{EmbeddedEngine, EmbeddedOptions, ManualClock, ReadQuery, Store, Value};

const GRACE: Duration = Duration::from_secs(3600);

struct Fixture {
    _dir: tempfile::TempDir,
    clock: ManualClock,
    store: Store,
    pages: Pages,
    domain: Domain,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let options = EmbeddedOptions { clock: Arc::new(clock.clone()), ..EmbeddedOptions::default() };
    let store = Store::new(Arc::new(EmbeddedEngine::open(dir.path(), options).expect("open")));
    store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
    let pages = Pages { store: store.clone(), grace: GRACE, clock_skew: Duration::ZERO, hand_off: false, notify_graph: false };
    Fixture { _dir: dir, clock, store, pages, domain: Domain::parse("en.wikipedia.org").expect("domain") }
}

fn title(name: &str) -> Title {
    Title::parse(name, TitleRules::default()).expect("title")
}

/// Rows of a page in `page_renders`, whatever their state.
async fn rows_held(f: &Fixture, title: &Title) -> usize {
    let key = [Value::from(f.domain.as_str()), Value::from(title.as_str())];
    f.store.read(&ReadQuery::new(&PAGE_RENDERS, key).limit(10_000)).await.expect("read").rows.len()
}

async fn run_retention(pages: &Pages) -> u64 {
    let sweeps = revstore_current_store::janitor::sweeps(pages, None);
    let retention = sweeps.iter().find(|s| s.task() == revstore_api::janitor::Task::Retention).expect("a retention sweep");
    let (mut at, mut rows) = (revstore_service::janitor_admin::SweepPosition::start_of(0), 0);
    loop {
        let stepped = retention.step(at, 100, false).await.expect("retention step");
        rows += stepped.report.rows;
        match stepped.next {
            Some(next) => at = next,
            None => return rows,
        }
    }
}

/// A page re-rendered more often than a write reads keys keeps every render
/// until the sweep: the sweep then leaves exactly what is owed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_page_is_trimmed_by_the_sweep_to_what_is_owed() {
    let f = fixture().await;
    let page = title("Hot page");
    let html = common::anarchism_html();
    let generator = TidGenerator::new();
    // 200 renders of one revision, one every 30 s: 120 inside the hour of
    // grace, more than a write's 64 keys, so no write finds what to delete.
    let mut ids = Vec::new();
    for n in 0..200u64 {
        let id = RenderId { rev: RevId::new(7).expect("rev"), tid: generator.next_at(SystemTime::now()) };
        f.pages
            .put(&f.domain, &page, id, &common::render(&html[n as usize % html.len()], n), &Preconditions::default())
            .await
            .expect("put");
        ids.push(id);
        f.clock.advance_secs(30);
    }
    assert_eq!(rows_held(&f, &page).await, 200, "a write deleted what it could not see");
    let removed = run_retention(&f.pages).await;
    // Stored 30 s apart over 100 minutes: owed are the renders stored in the
    // last hour (each supersedes the one before it), the newest stored before
    // it (superseded within the hour), and nothing older: 120.
    let held = f.pages.held(&f.domain, &page).await.expect("held");
    assert_eq!((held.len(), removed), (120, 80));
    assert_eq!(rows_held(&f, &page).await, 120);
    assert_eq!(held[0].tid, ids[199].tid.to_string(), "the latest render stays");
    for id in &ids[80..] {
        let found = f.pages.of_tid(&f.domain, &page, id.rev, id.tid, &["tid"]).await.expect("read");
        assert!(found.is_some(), "a render superseded within the grace period is gone: {id:?}");
    }
    assert!(f.pages.of_tid(&f.domain, &page, ids[79].rev, ids[79].tid, &["tid"]).await.expect("read").is_none());
    assert_eq!(run_retention(&f.pages).await, 0, "a second sweep found more to remove");
}
