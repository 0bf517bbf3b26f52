//! Suppression: a render of a suppressed revision is refused (409), and one
//! stored in the race with the suppression (or before the page was flagged)
//! is never served — not as the latest, not by revision or tid, not in the
//! listing, not after the page is deleted and written again — and the
//! retention sweep removes it without taking it for a boundary. A
//! suppression can be lifted and set again, in that order whatever the
//! writers' clocks. Pages suppressed before the flag existed are flagged by
//! `flag_suppressed_pages` (what `revstore-migrate` runs). On both engines.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use revstore_current_store::{Pages, PagesError, Preconditions, Refusal, RenderId, flag_suppressed_pages};
use revstore_keys::{Domain, RevId, TidGenerator, Title, TitleRules};
use revstore_schema::tables::current_store::{PAGE_RENDERS, SUPPRESSED, col};
use revstore_storage::testing::TestKeyspace;
use revstore_storage::{ManualClock, ReadQuery, Store, Upsert, Value};

struct Page {
    pages: Pages,
    domain: Domain,
    title: Title,
    tids: TidGenerator,
}

impl Page {
    fn new(store: Store, title: &str, grace: Duration) -> Page {
        let pages = common::pages_keeping(store, grace);
        let domain = Domain::parse("en.wikipedia.org").expect("domain");
        Page { pages, domain, title: Title::parse(title, TitleRules::default()).expect("title"), tids: TidGenerator::new() }
    }

    async fn put(&self, rev: u64) -> RenderId {
        self.try_put(rev).await.expect("a write is stored")
    }

    async fn try_put(&self, rev: u64) -> Result<RenderId, PagesError> {
        let id = RenderId { rev: RevId::new(rev).expect("rev"), tid: self.tids.next_at(self.pages.store.now()) };
        let body = common::render(&format!("<p>revision {rev} at {}</p>", id.tid), rev);
        self.pages.put(&self.domain, &self.title, id, &body, &Preconditions::default()).await.map(|()| id)
    }

    /// A render's row written straight to the table, as a write that passed
    /// its check just before a suppression or deletion stores it.
    async fn store_raced(&self, rev: u64) -> RenderId {
        let id = RenderId { rev: RevId::new(rev).expect("rev"), tid: self.tids.next_at(self.pages.store.now()) };
        let key = [Value::from(self.domain.as_str()), Value::from(self.title.as_str()), Value::from(rev as i64), Value::from(id.tid)];
        let stored_at = Value::Timestamp(revstore_keys::time::millis(self.pages.store.now()));
        self.pages.store.write(Upsert::new(&PAGE_RENDERS, key).set(col::STORED_AT, stored_at)).await.expect("raced write");
        id
    }

    async fn latest(&self) -> Option<RenderId> {
        self.pages.latest(&self.domain, &self.title, &["tid", "html"]).await.expect("latest").map(|f| f.id)
    }

    async fn by_rev(&self, rev: u64) -> Option<RenderId> {
        let rev = RevId::new(rev).expect("rev");
        self.pages.of_rev(&self.domain, &self.title, rev, &["tid"]).await.expect("of_rev").map(|f| f.id)
    }

    async fn by_tid(&self, id: RenderId) -> Option<RenderId> {
        self.pages.of_tid(&self.domain, &self.title, id.rev, id.tid, &["tid"]).await.expect("of_tid").map(|f| f.id)
    }

    async fn listed(&self) -> Vec<u64> {
        self.pages.held(&self.domain, &self.title).await.expect("held").iter().map(|h| h.rev).collect()
    }

    async fn suppress(&self, rev: u64) {
        self.pages.suppress(&self.domain, &self.title, RevId::new(rev).expect("rev")).await.expect("suppress");
    }

    /// Every row the page's partition holds, served or not.
    async fn rows_held(&self) -> Vec<u64> {
        let key = [Value::from(self.domain.as_str()), Value::from(self.title.as_str())];
        let rows = self.pages.store.read(&ReadQuery::new(&PAGE_RENDERS, key).columns([col::STORED_AT])).await.expect("rows").rows;
        rows.iter().filter_map(|r| r.bigint(col::REV)).map(|r| r as u64).collect()
    }
}

async fn a_suppressed_revision_is_never_served_and_its_suppression_can_be_lifted(
    store: Store,
    grace: Duration,
    advance: impl Fn(Duration),
    rewind: impl Fn(Duration),
) {
    let page = Page::new(store.clone(), "Suppressed latest", grace);
    let five = page.put(5).await;
    let six = page.put(6).await;
    assert_eq!(page.latest().await, Some(six));

    page.suppress(6).await;
    assert_eq!(page.latest().await, Some(five), "the latest falls back past the suppressed revision");
    advance(Duration::from_secs(1));
    // A re-render queued before the suppression is refused, and stores nothing.
    let refused = page.try_put(6).await;
    assert!(matches!(refused, Err(PagesError::Refused { kind: Refusal::RevisionSuppressed, .. })), "{refused:?}");
    assert_eq!(page.rows_held().await, [5], "a refused render was stored");
    // One that passed its check just before the suppression is stored, and never served.
    let raced = page.store_raced(6).await;
    assert_eq!(page.latest().await, Some(five), "a suppressed revision's render served as the latest");
    assert_eq!(page.by_rev(6).await, None, "served by revision");
    assert_eq!(page.by_tid(raced).await, None, "served by tid");
    assert_eq!(page.listed().await, [5], "listed");

    // Deleted and written again: the suppression outlives the page's deletion.
    page.pages.delete(&page.domain, &page.title, None).await.expect("delete");
    assert_eq!(page.latest().await, None);
    advance(Duration::from_secs(1));
    assert!(page.try_put(6).await.is_err(), "a render of a suppressed, deleted revision stored");
    let seven = page.put(7).await;
    assert_eq!(page.latest().await, Some(seven));

    // The sweep removes the suppressed revision's render and does not take it
    // for the boundary (which would remove what is served).
    let eight = page.put(8).await;
    advance(grace + Duration::from_secs(1));
    common::run_retention(&page.pages).await;
    assert_eq!(page.rows_held().await, [8], "the sweep kept a suppressed render or what it owes");
    assert_eq!(page.latest().await, Some(eight));

    // Lifted, suppressed again, lifted again: each in turn, whatever the
    // clocks (the second suppression is made by a writer whose clock is
    // behind the lift's, as after a failover to another replica).
    let lifted = Page::new(store.clone(), "Suppressed and lifted", grace);
    lifted.put(1).await;
    lifted.suppress(2).await;
    assert!(lifted.try_put(2).await.is_err());
    lifted.pages.lift_suppression(&lifted.domain, &lifted.title, RevId::new(2).expect("rev")).await.expect("lift");
    let two = lifted.put(2).await;
    assert_eq!(lifted.latest().await, Some(two), "a lifted revision is served");
    assert_eq!(lifted.by_tid(two).await, Some(two));
    rewind(Duration::from_secs(2));
    lifted.suppress(2).await;
    assert_eq!(lifted.by_tid(two).await, None, "a suppression after a lift, from a clock behind the lift's, was lost");
    assert_eq!(lifted.latest().await.map(|id| id.rev.get()), Some(1));
    lifted.pages.lift_suppression(&lifted.domain, &lifted.title, RevId::new(2).expect("rev")).await.expect("lift");
    let again = lifted.put(2).await;
    assert_eq!(lifted.latest().await, Some(again));

    // A suppression made before the flag existed (a row in `suppressed` alone,
    // as older code wrote it): unflagged, a write of its revision is served;
    // flagged by the migration, it is not.
    let old = Page::new(store.clone(), "Suppressed before the flag", grace);
    old.put(3).await;
    let key = [Value::from(old.domain.as_str()), Value::from(old.title.as_str()), Value::from(4i64)];
    let suppressed_at = Value::Timestamp(revstore_keys::time::millis(SystemTime::now()));
    store.write(Upsert::new(&SUPPRESSED, key).set(col::SUPPRESSED_AT, suppressed_at)).await.expect("an old suppression");
    let four = old.put(4).await;
    assert_eq!(old.latest().await, Some(four), "unflagged: the danger the migration removes");
    assert!(flag_suppressed_pages(&store).await.expect("flag") >= 2);
    assert_eq!(old.latest().await.map(|id| id.rev.get()), Some(3), "flagged: the suppressed revision is passed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suppressed_revision_is_never_served_and_its_suppression_can_be_lifted_embedded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = common::store_on_clock(dir.path(), &clock).await;
    let (advance, rewind) = (|by| clock.advance(by), |by: Duration| clock.advance_secs(-(by.as_secs() as i64)));
    a_suppressed_revision_is_never_served_and_its_suppression_can_be_lifted(store, Duration::from_secs(3600), advance, rewind).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Cassandra: run scripts/test, or set REVSTORE_TEST_CASSANDRA and pass --ignored"]
async fn a_suppressed_revision_is_never_served_and_its_suppression_can_be_lifted_cassandra() {
    let keyspace = TestKeyspace::new("suppressed");
    let store = Store::new(Arc::new(keyspace.connect().await));
    store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
    // Real time on a real node: a grace period of two seconds, waited out.
    let wait = |by| tokio::task::block_in_place(|| std::thread::sleep(by));
    // The node's clock is the host's: the writer behind is a store whose clock lags.
    let rewind = |_| {};
    a_suppressed_revision_is_never_served_and_its_suppression_can_be_lifted(store, Duration::from_secs(2), wait, rewind).await;
}
