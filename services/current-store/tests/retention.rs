//! Retention in the one-table layout (schema 8), with injected time: what a
//! write deletes, what it leaves to the janitor's retention sweep, and the
//! move of pages stored by schema 7's copy-on-update tables.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use revstore_current_store::{Pages, Preconditions, RenderId, StoredParts};
use revstore_keys::{Domain, RevId, TidGenerator, Title, TitleRules};
use revstore_schema::tables::current_store::{BY_TID, CURRENT, PAGE_RENDERS, RENDERS, col};
use revstore_storage::{EmbeddedEngine, EmbeddedOptions, ManualClock, ReadQuery, Store, Upsert, Value};

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

/// The titles a whole dump of the fixture's domain lists.
async fn dumped(f: &Fixture) -> Vec<String> {
    use futures_util::TryStreamExt;
    use revstore_current_store::dump::{Dump, DumpParts};
    use revstore_service::dump::{DumpPacer, DumpSlice};
    let dump = Dump {
        domain: f.domain.clone(),
        slice: DumpSlice { k: 0, n: 1 },
        parts: DumpParts::parse(None).expect("parts"),
        after: None,
        limit: None,
    };
    let lines: Vec<Vec<u8>> =
        dump.lines(f.pages.clone(), Arc::new(DumpPacer::new(0))).await.expect("dump").try_collect().await.expect("lines");
    let lines: Vec<serde_json::Value> = lines.iter().map(|l| serde_json::from_slice(l).expect("json")).collect();
    assert_eq!(lines.last().map(|l| l["done"].clone()), Some(serde_json::Value::Bool(true)));
    lines[..lines.len() - 1].iter().map(|l| l["title"].as_str().expect("title").to_owned()).collect()
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

/// A page stored by schema 7 (its latest in `current`, a superseded render in
/// `by_tid` and `renders`) is served as it was, moves to `page_renders` with
/// its next write, and a page not written moves with the sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_schema_7_are_served_and_moved() {
    let f = fixture().await;
    let html = common::anarchism_html();
    let generator = TidGenerator::new();
    let now = SystemTime::now();
    let old = RenderId { rev: RevId::new(3).expect("rev"), tid: generator.next_at(now - Duration::from_secs(120)) };
    let latest = RenderId { rev: RevId::new(4).expect("rev"), tid: generator.next_at(now - Duration::from_secs(60)) };
    let (written, quiet) = (title("Written page"), title("Quiet page"));
    for page in [&written, &quiet] {
        let key = |id: RenderId| [Value::from(f.domain.as_str()), Value::from(page.as_str()), Value::from(id.rev.as_i64())];
        let parts = |n: usize| StoredParts::encode(&common::render(&html[n], n as u64));
        let (p_old, p_latest) = (parts(0), parts(1));
        let [d, t, r] = key(latest);
        let [_, _, r_old] = key(old);
        f.store
            .apply(vec![
                Upsert::new(&CURRENT, [d.clone(), t.clone(), r])
                    .set(col::TID, latest.tid)
                    .set(col::HTML, p_latest.html)
                    .set(col::DATA_PARSOID, p_latest.data_parsoid)
                    .set(col::SECTION_OFFSETS, p_latest.section_offsets)
                    .timestamp(latest.tid.unix_micros())
                    .into(),
                Upsert::new(&BY_TID, [d.clone(), t.clone(), r_old.clone(), Value::from(old.tid)])
                    .set(col::HTML, p_old.html)
                    .set(col::DATA_PARSOID, p_old.data_parsoid)
                    .set(col::SECTION_OFFSETS, p_old.section_offsets)
                    .ttl(3600)
                    .into(),
                Upsert::new(&RENDERS, [d, t, r_old, Value::from(old.tid)]).ttl(3600).into(),
            ])
            .await
            .expect("a schema 7 page");
        let served = f.pages.latest(&f.domain, page, &["tid", "html"]).await.expect("latest").map(|r| r.id);
        assert_eq!(served, Some(latest), "schema 7's latest render is not served");
        let by_tid = f.pages.of_tid(&f.domain, page, old.rev, old.tid, &["tid"]).await.expect("of_tid").map(|r| r.id);
        assert_eq!(by_tid, Some(old), "schema 7's grace-period render is not served");
        let listed: Vec<u64> = f.pages.held(&f.domain, page).await.expect("held").iter().map(|h| h.rev).collect();
        assert_eq!(listed, vec![4, 3]);
    }

    // A write moves the page: its old latest is superseded now and kept.
    let newer = RenderId { rev: RevId::new(5).expect("rev"), tid: generator.next_at(now) };
    f.pages.put(&f.domain, &written, newer, &common::render(&html[2], 2), &Preconditions::default()).await.expect("put");
    let current_rows = |page: &Title| ReadQuery::new(&CURRENT, [Value::from(f.domain.as_str()), Value::from(page.as_str())]).limit(10);
    assert!(f.store.read(&current_rows(&written)).await.expect("read").rows.is_empty(), "the write left the page in `current`");
    assert_eq!(rows_held(&f, &written).await, 2);
    assert_eq!(f.pages.latest(&f.domain, &written, &["tid"]).await.expect("latest").map(|r| r.id), Some(newer));
    assert_eq!(f.pages.of_rev(&f.domain, &written, latest.rev, &["tid"]).await.expect("of_rev").map(|r| r.id), Some(latest));

    // The sweep moves the quiet page, and serves it the same.
    assert_eq!(dumped(&f).await, vec!["Written_page".to_owned()], "the write entered the page in the dump index");
    run_retention(&f.pages).await;
    let mut both = dumped(&f).await;
    both.sort();
    assert_eq!(both, vec!["Quiet_page".to_owned(), "Written_page".to_owned()], "the sweep entered the moved page");
    assert!(f.store.read(&current_rows(&quiet)).await.expect("read").rows.is_empty(), "the sweep left the page in `current`");
    assert_eq!(rows_held(&f, &quiet).await, 1);
    let moved = f.pages.latest(&f.domain, &quiet, &["tid", "html"]).await.expect("latest").expect("the moved latest");
    assert_eq!(moved.id, latest);
    let html_part = revstore_current_store::decode_part(moved.row.blob("html").expect("html"), "html").expect("decode");
    assert_eq!(String::from_utf8(html_part).expect("utf-8"), html[1]);
    // The grace-period render of schema 7 is still served until its TTL ends.
    assert!(f.pages.of_tid(&f.domain, &quiet, old.rev, old.tid, &["tid"]).await.expect("of_tid").is_some());
    f.clock.advance_secs(3601);
    assert!(f.pages.of_tid(&f.domain, &quiet, old.rev, old.tid, &["tid"]).await.expect("of_tid").is_none());
    assert_eq!(f.pages.latest(&f.domain, &quiet, &["tid"]).await.expect("latest").map(|r| r.id), Some(latest));
}

/// Pages stored before the dump index existed (or by a replica of schema 8)
/// have no index row: the retention sweep enters every page it visits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_enters_pages_missing_from_the_dump_index() {
    let f = fixture().await;
    let generator = TidGenerator::new();
    let pages: Vec<Title> = (0..5).map(|i| title(&format!("Page {i}"))).collect();
    // Rows as schema 8 wrote them: the render alone.
    for (i, page) in pages.iter().enumerate() {
        let tid = generator.next_at(SystemTime::now());
        let parts = StoredParts::encode(&common::render("<p>x</p>", i as u64));
        let key = [Value::from(f.domain.as_str()), Value::from(page.as_str()), Value::from(1i64), Value::from(tid)];
        let row = Upsert::new(&PAGE_RENDERS, key)
            .set(col::STORED_AT, Value::Timestamp(f.store.now_micros() / 1000))
            .set(col::HTML, parts.html)
            .set(col::DATA_PARSOID, parts.data_parsoid)
            .set(col::SECTION_OFFSETS, parts.section_offsets)
            .timestamp(tid.unix_micros());
        f.store.write(row).await.expect("a schema 8 page");
        assert!(f.pages.latest(&f.domain, page, &["tid"]).await.expect("latest").is_some());
    }
    assert_eq!(dumped(&f).await, Vec::<String>::new());
    run_retention(&f.pages).await;
    let mut listed = dumped(&f).await;
    listed.sort();
    assert_eq!(listed, pages.iter().map(|p| p.as_str().to_owned()).collect::<Vec<_>>());
}
