//! A page's deletion against its worst arrivals: a render job retried after
//! the delete (the same rev and tid, seconds to minutes later), a render that
//! passed its check just before the delete (stored behind it), a render job
//! of a revision the delete named but current-store never held, a page whose
//! last render carried a tid from a clock ahead, and a page re-created and
//! deleted again. Also one body per (rev, tid), and the janitor's `hidden`
//! task, which hides in a site what it missed. On both engines.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use revstore_api::janitor::Task;
use revstore_current_store::{PagesError, Preconditions, Refusal, RenderId, decode_part};
use revstore_keys::{Domain, RevId, TidGenerator, Title, TitleRules};
use revstore_schema::tables::current_store::{PAGE_RENDERS, SUPPRESSED, col};
use revstore_service::janitor_admin::SweepPosition;
use revstore_service::suppressions::deletion_timestamp;
use revstore_storage::testing::TestKeyspace;
use revstore_storage::{ManualClock, Store, Upsert, Value};

struct Page {
    pages: revstore_current_store::Pages,
    domain: Domain,
    title: Title,
}

impl Page {
    fn new(store: Store, title: &str) -> Page {
        let pages = common::pages_keeping(store, Duration::from_secs(3600));
        let domain = Domain::parse("en.wikipedia.org").expect("domain");
        Page { pages, domain, title: Title::parse(title, TitleRules::default()).expect("title") }
    }

    fn id(&self, rev: u64, at: SystemTime) -> RenderId {
        RenderId { rev: RevId::new(rev).expect("rev"), tid: TidGenerator::new().next_at(at) }
    }

    fn now(&self) -> SystemTime {
        self.pages.store.now()
    }

    async fn put(&self, id: RenderId, html: &str) -> Result<(), PagesError> {
        let body = common::render(html, id.rev.get());
        self.pages.put(&self.domain, &self.title, id, &body, &Preconditions::default()).await
    }

    async fn latest(&self) -> Option<RenderId> {
        self.pages.latest(&self.domain, &self.title, &["tid"]).await.expect("latest").map(|f| f.id)
    }

    async fn html_of(&self, id: RenderId) -> Option<String> {
        let found = self.pages.of_tid(&self.domain, &self.title, id.rev, id.tid, &["html"]).await.expect("of_tid")?;
        let html = decode_part(found.row.blob(col::HTML).expect("html"), "html").expect("decode");
        Some(String::from_utf8(html).expect("utf-8"))
    }

    async fn by_rev(&self, rev: u64) -> Option<RenderId> {
        self.pages.of_rev(&self.domain, &self.title, RevId::new(rev).expect("rev"), &["tid"]).await.expect("of_rev").map(|f| f.id)
    }

    async fn listed(&self) -> Vec<u64> {
        self.pages.held(&self.domain, &self.title).await.expect("held").iter().map(|h| h.rev).collect()
    }

    async fn delete(&self, through: Option<u64>) -> Option<u64> {
        let through = through.map(|r| RevId::new(r).expect("rev"));
        self.pages.delete(&self.domain, &self.title, through).await.expect("delete").map(RevId::get)
    }

    async fn hides(&self, rev: u64) -> bool {
        self.pages.hides(&self.domain, &self.title, RevId::new(rev).expect("rev")).await.expect("hides")
    }

    /// A render's row written straight to the table with the store's clock,
    /// as a write that passed its check just before the delete stores it.
    async fn store_raced(&self, id: RenderId) {
        let key = [Value::from(self.domain.as_str()), Value::from(self.title.as_str()), Value::from(id.rev.as_i64()), Value::from(id.tid)];
        let stored_at = Value::Timestamp(revstore_keys::time::millis(self.now()));
        self.pages.store.write(Upsert::new(&PAGE_RENDERS, key).set(col::STORED_AT, stored_at)).await.expect("raced write");
    }
}

fn refused(result: Result<(), PagesError>, kind: Refusal) -> bool {
    matches!(result, Err(PagesError::Refused { kind: k, .. }) if k == kind)
}

async fn no_deleted_render_is_served_and_every_201_stays_readable(store: Store, wait: impl Fn(Duration)) {
    // A render job retried after the delete: refused, and nothing served.
    let page = Page::new(store.clone(), "Deleted and retried");
    let five = page.id(5, page.now());
    page.put(five, "<p>five</p>").await.expect("stored");
    assert_eq!(page.delete(None).await, Some(5), "deleted through the newest revision held");
    wait(Duration::from_secs(1));
    assert!(refused(page.put(five, "<p>five</p>").await, Refusal::PageDeleted), "a retried render of a deleted page was taken");
    assert_eq!(page.latest().await, None, "a deleted page served as the latest");
    assert_eq!(page.by_rev(5).await, None, "served by revision");
    assert_eq!(page.html_of(five).await, None, "served by tid");
    assert_eq!(page.listed().await, Vec::<u64>::new(), "listed");
    assert!(page.hides(5).await, "old-store's fallback would serve it");
    // One that passed its check just before the delete lands behind it: never served.
    let raced = page.id(5, page.now());
    page.store_raced(raced).await;
    assert_eq!(page.latest().await, None, "a render stored behind the delete served as the latest");
    assert_eq!(page.html_of(raced).await, None, "a render stored behind the delete served by tid");

    // Re-created by a new revision, deleted again, re-created again.
    let six = page.id(6, page.now());
    page.put(six, "<p>six</p>").await.expect("a re-creation is stored");
    assert_eq!(page.latest().await, Some(six), "a re-created page not served");
    assert!(!page.hides(6).await);
    assert_eq!(page.delete(None).await, Some(6));
    assert!(refused(page.put(six, "<p>six</p>").await, Refusal::PageDeleted));
    assert_eq!(page.latest().await, None);
    let seven = page.id(7, page.now());
    page.put(seven, "<p>seven</p>").await.expect("stored");
    assert_eq!(page.latest().await, Some(seven));
    assert_eq!(page.html_of(seven).await.as_deref(), Some("<p>seven</p>"));

    // The page's last render from a clock ahead (the allowed skew): a new
    // revision written right after the delete is stored and readable.
    let skewed = Page::new(store.clone(), "Deleted after a render from a clock ahead");
    let ahead = skewed.id(3, skewed.now() + Duration::from_secs(290));
    skewed.put(ahead, "<p>ahead</p>").await.expect("stored");
    assert_eq!(skewed.delete(None).await, Some(3));
    let four = skewed.id(4, skewed.now());
    skewed.put(four, "<p>four</p>").await.expect("stored");
    assert_eq!(skewed.latest().await, Some(four), "a 201 after the delete is not readable as the latest");
    assert_eq!(skewed.html_of(four).await.as_deref(), Some("<p>four</p>"), "a 201 after the delete is not readable by tid");

    // Deleted through a revision current-store never held (the wiki's newest,
    // whose render job was still queued): its late render is refused.
    let late = Page::new(store.clone(), "Deleted before its newest render came");
    late.put(late.id(4, late.now()), "<p>four</p>").await.expect("stored");
    assert_eq!(late.delete(Some(6)).await, Some(6));
    assert_eq!(late.delete(Some(5)).await, Some(5), "a deletion through an older revision is through it");
    assert!(refused(late.put(late.id(5, late.now()), "<p>five</p>").await, Refusal::PageDeleted));
    assert!(refused(late.put(late.id(6, late.now()), "<p>six</p>").await, Refusal::PageDeleted), "the older deletion narrowed the fence");
    assert_eq!(late.latest().await, None);
    let seven = late.id(7, late.now());
    late.put(seven, "<p>seven</p>").await.expect("stored");
    assert_eq!(late.latest().await, Some(seven));

    // A deletion job retried after the page was re-created (or in flight
    // while it was): it is through the revision it names, and the
    // re-creation stays served.
    let retried = Page::new(store.clone(), "Re-created before a deletion's retry");
    retried.put(retried.id(2, retried.now()), "<p>two</p>").await.expect("stored");
    assert_eq!(retried.delete(Some(2)).await, Some(2));
    let three = retried.id(3, retried.now());
    retried.put(three, "<p>three</p>").await.expect("a re-creation is stored");
    assert_eq!(retried.delete(Some(2)).await, Some(2), "the retried deletion");
    assert_eq!(retried.latest().await, Some(three), "a retried deletion took the re-created page");
    assert_eq!(retried.html_of(three).await.as_deref(), Some("<p>three</p>"), "the re-creation's 201 is not readable");
    assert!(retried.hides(2).await && !retried.hides(3).await);

    // A page current-store holds nothing of: nothing to fence, nothing fails.
    let never = Page::new(store.clone(), "Never rendered");
    assert_eq!(never.delete(None).await, None);
    never.put(never.id(1, never.now()), "<p>one</p>").await.expect("stored");
}

async fn a_rev_and_tid_name_one_body(store: Store) {
    let page = Page::new(store, "One body per render");
    let three = page.id(3, page.now());
    page.put(three, "<p>first</p>").await.expect("stored");
    assert!(refused(page.put(three, "<p>second</p>").await, Refusal::OtherBody), "a second body under a stored (rev, tid)");
    assert_eq!(page.html_of(three).await.as_deref(), Some("<p>first</p>"));
    page.put(three, "<p>first</p>").await.expect("the same render again is taken");
    // Behind a newer render (a retry that arrives after the next render).
    let four = page.id(4, page.now());
    page.put(four, "<p>four</p>").await.expect("stored");
    assert!(refused(page.put(three, "<p>second</p>").await, Refusal::OtherBody), "a second body behind the latest");
    page.put(three, "<p>first</p>").await.expect("the same render again, behind the latest");
    assert_eq!(page.html_of(three).await.as_deref(), Some("<p>first</p>"));
    assert_eq!(page.latest().await, Some(four));
}

/// Runs the janitor's `hidden` task in current-store to its end.
async fn hidden_task(pages: &revstore_current_store::Pages) {
    let sweeps = revstore_current_store::janitor::sweeps(pages, None, Duration::from_secs(300), Duration::from_secs(60));
    let hidden = sweeps.iter().find(|s| s.task() == Task::Hidden).expect("current-store offers the hidden task");
    let mut from = SweepPosition::default();
    loop {
        let stepped = hidden.step(from, 2, false).await.expect("a step of the hidden task");
        match stepped.next {
            Some(next) => from = next,
            None => return,
        }
    }
}

/// The janitor's `hidden` task writes again what hides a page in every
/// site, from the suppression table read from every site: a site that got
/// the table's rows (by the task's read, which repairs the replicas it
/// reads) but not the page's own fence or flag (lost with the hints of a
/// long cut) hides the page once it has run. And what it writes again never
/// hides what came after: a page re-created, a suppression lifted.
async fn the_hidden_task_hides_what_a_site_missed_and_nothing_newer(store: Store) {
    // Deleted through 3, then re-created: revision 4 served.
    let recreated = Page::new(store.clone(), "Deleted then re-created");
    recreated.put(recreated.id(3, recreated.now()), "<p>three</p>").await.expect("stored");
    recreated.delete(None).await;
    let four = recreated.id(4, recreated.now());
    recreated.put(four, "<p>four</p>").await.expect("re-created");
    // Suppressed then lifted: served again; a later revision suppressed.
    let lifted = Page::new(store.clone(), "Suppressed then lifted");
    let five = lifted.id(5, lifted.now());
    lifted.put(five, "<p>five</p>").await.expect("stored");
    let rev = |r: u64| RevId::new(r).expect("rev");
    lifted.pages.suppress(&lifted.domain, &lifted.title, rev(5)).await.expect("suppress");
    lifted.pages.lift_suppression(&lifted.domain, &lifted.title, rev(5)).await.expect("lift");
    let five_again = lifted.id(5, lifted.now());
    lifted.put(five_again, "<p>five again</p>").await.expect("stored after the lift");
    lifted.put(lifted.id(6, lifted.now()), "<p>six</p>").await.expect("stored");
    lifted.pages.suppress(&lifted.domain, &lifted.title, rev(6)).await.expect("suppress");
    // A site that holds the suppression table's rows of a deletion and of a
    // suppression, and nothing else of them.
    let missed = Page::new(store.clone(), "Missed in this site");
    missed.put(missed.id(1, missed.now()), "<p>one</p>").await.expect("stored");
    let two = missed.id(2, missed.now());
    missed.put(two, "<p>two</p>").await.expect("stored");
    let other = Page::new(store.clone(), "Suppression missed in this site");
    let seven = other.id(7, other.now());
    other.put(seven, "<p>seven</p>").await.expect("stored");
    let eight = other.id(8, other.now());
    other.put(eight, "<p>eight</p>").await.expect("stored");
    let page_key = |p: &Page| vec![Value::from(p.domain.as_str()), Value::from(p.title.as_str())];
    store
        .write(Upsert::new(&SUPPRESSED, page_key(&missed)).set("deleted_through_rev", 2i64).timestamp(deletion_timestamp(rev(2))))
        .await
        .expect("the deletion's record");
    let at = revstore_keys::time::millis(store.now());
    let row = [page_key(&other), vec![Value::from(8i64)]].concat();
    store
        .write(Upsert::new(&SUPPRESSED, row).set("suppressed_at", Value::Timestamp(at)).timestamp(at * 1000))
        .await
        .expect("the suppression's row");
    assert_eq!(missed.latest().await, Some(two), "before the task, the site serves what it missed");
    assert_eq!(other.latest().await, Some(eight));

    hidden_task(&missed.pages).await;

    assert_eq!(missed.latest().await, None, "the deletion the site missed");
    assert_eq!((missed.by_rev(1).await, missed.by_rev(2).await), (None, None));
    assert_eq!(missed.listed().await, Vec::<u64>::new());
    assert_eq!(other.latest().await, Some(seven), "the suppression the site missed");
    assert_eq!(other.by_rev(8).await, None);
    assert_eq!(recreated.latest().await, Some(four), "a page re-created after its deletion");
    assert_eq!(recreated.by_rev(3).await, None);
    assert_eq!(lifted.by_rev(5).await, Some(five_again), "a lifted suppression");
    assert_eq!(lifted.latest().await, Some(five_again), "revision 6 suppressed");
    assert_eq!(lifted.by_rev(6).await, None);
    // Again: nothing changes.
    hidden_task(&missed.pages).await;
    assert_eq!((recreated.latest().await, lifted.latest().await, missed.latest().await), (Some(four), Some(five_again), None));
}

fn embedded_store() -> (tempfile::TempDir, ManualClock) {
    (tempfile::tempdir().expect("tempdir"), ManualClock::starting_now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_deleted_render_is_served_and_every_201_stays_readable_embedded() {
    let (dir, clock) = embedded_store();
    let store = common::store_on_clock(dir.path(), &clock).await;
    no_deleted_render_is_served_and_every_201_stays_readable(store, |by| clock.advance(by)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rev_and_tid_name_one_body_embedded() {
    let (dir, clock) = embedded_store();
    a_rev_and_tid_name_one_body(common::store_on_clock(dir.path(), &clock).await).await;
}

async fn cassandra_store(name: &str) -> (TestKeyspace, Store) {
    let keyspace = TestKeyspace::new(name);
    let store = Store::new(Arc::new(keyspace.connect().await));
    store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
    (keyspace, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Cassandra: run scripts/test, or set REVSTORE_TEST_CASSANDRA and pass --ignored"]
async fn no_deleted_render_is_served_and_every_201_stays_readable_cassandra() {
    let (_keyspace, store) = cassandra_store("deletes").await;
    let wait = |by| tokio::task::block_in_place(|| std::thread::sleep(by));
    no_deleted_render_is_served_and_every_201_stays_readable(store, wait).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Cassandra: run scripts/test, or set REVSTORE_TEST_CASSANDRA and pass --ignored"]
async fn a_rev_and_tid_name_one_body_cassandra() {
    let (_keyspace, store) = cassandra_store("one_body").await;
    a_rev_and_tid_name_one_body(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hidden_task_hides_what_a_site_missed_and_nothing_newer_embedded() {
    let (dir, clock) = embedded_store();
    the_hidden_task_hides_what_a_site_missed_and_nothing_newer(common::store_on_clock(dir.path(), &clock).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Cassandra: run scripts/test, or set REVSTORE_TEST_CASSANDRA and pass --ignored"]
async fn the_hidden_task_hides_what_a_site_missed_and_nothing_newer_cassandra() {
    let (_keyspace, store) = cassandra_store("hidden_task").await;
    the_hidden_task_hides_what_a_site_missed_and_nothing_newer(store).await;
}
