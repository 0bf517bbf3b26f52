//! Retention with injected time: what a write deletes, and what it leaves to
//! the janitor's retention sweep.

mod common;

use std::sync::Arc;
use std::time::Duration;

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
    let pages = Pages {
        store: store.clone(),
        grace: GRACE,
        clock_skew: Duration::ZERO,
        hand_off: false,
        notify_graph: false,
        remembered: Default::default(),
    };
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
    let sweeps = revstore_current_store::janitor::sweeps(pages, None, Duration::from_secs(300), Duration::ZERO);
    let retention = sweeps
        .iter()
        .find(|s| s.task() == revstore_api::janitor::Task::Retention && s.scope() == revstore_api::janitor::Scope::All)
        .expect("a retention sweep");
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
        let id = RenderId { rev: RevId::new(7).expect("rev"), tid: generator.next_at(f.store.now()) };
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

/// A routine (changed-scope) retention sweep to its end: (partitions it
/// visited — journal partitions read and pages — and renders removed).
async fn run_changed_retention(pages: &Pages) -> (u64, u64) {
    let sweeps = revstore_current_store::janitor::sweeps(pages, None, Duration::from_secs(300), Duration::ZERO);
    let retention = sweeps
        .iter()
        .find(|s| s.task() == revstore_api::janitor::Task::Retention && s.scope() == revstore_api::janitor::Scope::Changed)
        .expect("a changed retention sweep");
    let (mut at, mut partitions, mut rows) = (revstore_service::janitor_admin::SweepPosition::default(), 0, 0);
    loop {
        let stepped = retention.step(at, 10, false).await.expect("retention step");
        partitions += stepped.report.partitions;
        rows += stepped.report.rows;
        match stepped.next {
            Some(next) => at = next,
            None => return (partitions, rows),
        }
    }
}

async fn render_twice(f: &Fixture, page: &Title, rev: u64) {
    let html = common::anarchism_html();
    let generator = TidGenerator::new();
    for n in 0..2u64 {
        let id = RenderId { rev: RevId::new(rev + n).expect("rev"), tid: generator.next_at(f.store.now()) };
        f.pages.put(&f.domain, page, id, &common::render(&html[0], n), &Preconditions::default()).await.expect("put");
        f.clock.advance_secs(10);
    }
}

/// A routine run visits the pages written since the last one, not the wiki:
/// the first visits every page (it has no journal window yet), the next ones
/// only the pages whose superseded renders came due (and the journal's
/// partitions of the minutes between: four a minute, however large the
/// wiki), and a run after the journal's reach visits every page again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routine_retention_run_visits_what_changed_not_the_wiki() {
    let f = fixture().await;
    let quiet: Vec<Title> = (0..400).map(|n| title(&format!("Quiet page {n}"))).collect();
    for page in &quiet {
        render_twice(&f, page, 1).await;
    }
    f.clock.advance(GRACE + Duration::from_secs(120));
    let (partitions, removed) = run_changed_retention(&f.pages).await;
    assert!(partitions >= 400, "the first routine run visits every page: {partitions}");
    assert_eq!(removed, 400, "one superseded render per page, past its grace period");

    // Two pages written now; an hour of grace later only they are visited.
    let (hot, warm) = (title("Hot page"), title("Warm page"));
    render_twice(&f, &hot, 10).await;
    render_twice(&f, &warm, 20).await;
    assert_eq!(run_changed_retention(&f.pages).await.1, 0, "removed a render inside its grace period");
    f.clock.advance(GRACE + Duration::from_secs(120));
    let (partitions, removed) = run_changed_retention(&f.pages).await;
    assert_eq!(removed, 2, "the two pages' superseded renders");
    // The window is the time since the last run: about 63 minutes.
    let journal_partitions = 4 * (GRACE.as_secs() / 60 + 4);
    assert!(partitions <= journal_partitions + 2, "the run visited {partitions} partitions for 2 pages changed");
    for page in [&hot, &warm] {
        assert_eq!(rows_held(&f, page).await, 1, "{page}");
    }
    let (partitions, removed) = run_changed_retention(&f.pages).await;
    assert_eq!(removed, 0);
    assert!(partitions < 20, "a run right after another visited {partitions} partitions");

    // No run for longer than the journal keeps: the next visits every page.
    render_twice(&f, &hot, 30).await;
    f.clock.advance(Duration::from_secs(40 * 86_400));
    let (partitions, removed) = run_changed_retention(&f.pages).await;
    assert!(partitions >= 402, "a run past the journal's reach visits every page: {partitions}");
    assert_eq!(removed, 2, "the render it had and the first of the two new ones");
    assert_eq!(rows_held(&f, &hot).await, 1);
}
