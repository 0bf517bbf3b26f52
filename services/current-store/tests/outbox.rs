//! The outbox's delivery, driven round by round on an injected clock: rows
//! queued behind the read position (a replica whose clock is behind), minutes
//! deleted whole once delivered, shards shared between replicas without a row
//! sent twice, and a stopped replica's shards taken over at once.
//!
//! The receiver is a minimal HTTP endpoint speaking old-store's archive write
//! (and the graph's change notices) and counting what it was sent.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::{Path, State};
use axum::routing::{post, put};
use revstore_client::{ClientOptions, GraphClient, HttpClient, OldStoreClient};
use revstore_current_store::testing::{
    Delivery, FAULTY_ATTEMPTS, Receivers, SETTLE, check_site_number, dead_letters, outbox_minute, outbox_shard,
};
use revstore_current_store::{Pages, Preconditions, RenderBody, RenderId, StoredParts};
use revstore_keys::{Domain, RevId, Tid, TidGenerator, Title};
use revstore_schema::tables::current_store::{OUTBOX, OUTBOX_SHARDS};
use revstore_service::worker::Worker;
use revstore_storage::{EmbeddedEngine, EmbeddedOptions, ManualClock, ReadQuery, Site, Store, Upsert, Value};
use tokio_util::sync::CancellationToken;

const MARGIN: Duration = Duration::from_secs(60);
const SHARDS: i64 = 16;

/// What the receiver was sent: deliveries per (title, rev).
type Received = Arc<Mutex<BTreeMap<(String, u64), usize>>>;

async fn archive(
    State(received): State<Received>,
    Path((_domain, title, rev, _tid)): Path<(String, String, u64, String)>,
) -> http::StatusCode {
    *received.lock().expect("lock").entry((title, rev)).or_default() += 1;
    http::StatusCode::CREATED
}

/// A receiver on a free port, and what it was sent.
async fn receiver() -> (Receivers, Received) {
    let received: Received = Arc::default();
    let app = axum::Router::new().route("/{domain}/v1/archive/{title}/{rev}/{tid}", put(archive)).with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = HttpClient::new(&url, ClientOptions::default()).expect("client");
    (Receivers { old_store: Some(OldStoreClient::new(client)), graph: None }, received)
}

/// What a receiver of both kinds was sent: each render archived, as (title,
/// rev, tid), and each change notice's page.
#[derive(Debug, Default)]
struct Sent {
    archived: Vec<(String, u64, String)>,
    notices: Vec<String>,
}

/// Receivers of hand-offs and change notices on a free port, and what they were sent.
async fn receivers_of_both() -> (Receivers, Arc<Mutex<Sent>>) {
    let sent: Arc<Mutex<Sent>> = Arc::default();
    let archived = |State(sent): State<Arc<Mutex<Sent>>>, Path((_domain, title, rev, tid)): Path<(String, String, u64, String)>| async move {
        sent.lock().expect("lock").archived.push((title, rev, tid));
        http::StatusCode::CREATED
    };
    let noticed = |State(sent): State<Arc<Mutex<Sent>>>, axum::Json(notice): axum::Json<serde_json::Value>| async move {
        sent.lock().expect("lock").notices.push(notice["page"].as_str().unwrap_or_default().to_owned());
        http::StatusCode::ACCEPTED
    };
    let app = axum::Router::new()
        .route("/{domain}/v1/archive/{title}/{rev}/{tid}", put(archived))
        .route("/{domain}/v1/changes", post(noticed))
        .with_state(sent.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = || HttpClient::new(&url, ClientOptions::default()).expect("client");
    (Receivers { old_store: Some(OldStoreClient::new(client())), graph: Some(GraphClient::new(client())) }, sent)
}

/// A migrated embedded store on `clock`.
async fn store(dir: &std::path::Path, clock: &ManualClock) -> Store {
    let options = EmbeddedOptions { clock: Arc::new(clock.clone()), ..EmbeddedOptions::default() };
    let store = Store::new(Arc::new(EmbeddedEngine::open(dir, options).expect("open")));
    store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
    store
}

/// Queues the hand-off of `title`'s revision `rev` with an id of time `at`, as a render's write does.
async fn queue(store: &Store, title: &str, rev: u64, at: SystemTime) -> Tid {
    let domain = Domain::parse("en.wikipedia.org").expect("domain");
    let parsed = Title::parse(title, Default::default()).expect("title");
    let id = TidGenerator::new().next_at(at);
    let body =
        RenderBody { html: format!("<p>{title} {rev}</p>"), data_parsoid: serde_json::json!({}), section_offsets: serde_json::json!({}) };
    let key = [Value::from(outbox_shard(Site::ONLY, &domain, &parsed)), Value::from(outbox_minute(id)), Value::from(id)];
    let row = Upsert::new(&OUTBOX, key)
        .set("kind", "archive")
        .set("domain", domain.as_str())
        .set("title", title)
        .set("rev", rev as i64)
        .set("tid", id)
        .set("payload", StoredParts::encode(&body).handoff_payload())
        .set("attempts", 0i64);
    store.write(row).await.expect("queue");
    id
}

async fn round(delivery: &mut Delivery) {
    delivery.work(&CancellationToken::new()).await.expect("a delivery round");
}

fn count(received: &Received, title: &str, rev: u64) -> usize {
    received.lock().expect("lock").get(&(title.to_owned(), rev)).copied().unwrap_or(0)
}

/// The rows left in every outbox partition of `minutes`.
async fn rows_left(store: &Store, minutes: &[i64]) -> usize {
    let mut left = 0;
    for shard in 0..SHARDS {
        for minute in minutes {
            left += store.read(&ReadQuery::new(&OUTBOX, [Value::from(shard), Value::from(*minute)])).await.expect("read").rows.len();
        }
    }
    left
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_queued_behind_the_read_position_is_delivered_once_the_margin_has_passed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = store(dir.path(), &clock).await;
    let (receivers, received) = receiver().await;
    let mut delivery = Delivery::new(store.clone(), receivers, MARGIN);

    let now = store.now();
    let first = queue(&store, "Prompt", 1, now - Duration::from_secs(1)).await;
    round(&mut delivery).await;
    assert_eq!(count(&received, "Prompt", 1), 1, "a row queued before the round is sent in it");

    // A replica whose clock is 20 s behind queues a row, in the same shard,
    // that the reader has passed.
    clock.advance_secs(5);
    let late_title = same_shard_as("Prompt");
    let late = queue(&store, &late_title, 1, store.now() - Duration::from_secs(20)).await;
    assert!(late < first, "queued with an id before the row already sent");
    round(&mut delivery).await;
    assert_eq!(count(&received, &late_title, 1), 0, "behind the read position: not seen by reading on");

    // Once the margin has passed the late row's time, it is found and sent.
    clock.advance(MARGIN);
    round(&mut delivery).await;
    assert_eq!(count(&received, &late_title, 1), 1, "sent once the margin has passed");
    // Nothing twice, however many rounds follow.
    for _ in 0..3 {
        clock.advance_secs(30);
        round(&mut delivery).await;
    }
    assert_eq!((count(&received, "Prompt", 1), count(&received, &late_title, 1)), (1, 1));
}

/// A row that arrives later than the margin behind the delivered-through
/// position (a replica whose clock is further behind than allowed, a batch
/// replayed from the batchlog) is still delivered, once, when its minute
/// settles, and counted (`outbox_late_rows_total`) — in a minute that held
/// rows, and in one that held none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_later_than_the_margin_is_delivered_when_its_minute_settles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = store(dir.path(), &clock).await;
    let (receivers, received) = receiver().await;
    let mut delivery = Delivery::new(store.clone(), receivers, MARGIN);
    queue(&store, "On_time", 1, store.now() - Duration::from_secs(1)).await;
    round(&mut delivery).await;
    clock.advance(MARGIN + Duration::from_secs(120));
    round(&mut delivery).await;
    // The delivered-through position has passed both minutes. Two rows
    // arrive behind it: one in the minute that held a row, one in a minute
    // that held none.
    let beside = same_shard_as("On_time");
    queue(&store, &beside, 1, store.now() - MARGIN - Duration::from_secs(120)).await;
    let empty_minute = (0..).map(|i| format!("Later_{i}")).find(|t| shard_of(t) == shard_of("On_time")).expect("a title in the shard");
    queue(&store, &empty_minute, 1, store.now() - MARGIN - Duration::from_secs(60)).await;
    round(&mut delivery).await;
    assert_eq!((count(&received, &beside, 1), count(&received, &empty_minute, 1)), (0, 0), "behind every position");
    clock.advance(SETTLE);
    round(&mut delivery).await;
    assert_eq!((count(&received, &beside, 1), count(&received, &empty_minute, 1)), (1, 1), "delivered as their minutes settle");
    for _ in 0..3 {
        clock.advance_secs(60);
        round(&mut delivery).await;
    }
    assert_eq!((count(&received, "On_time", 1), count(&received, &beside, 1), count(&received, &empty_minute, 1)), (1, 1, 1));
}

/// `--outbox-settle` moves when a minute settles: with five minutes, a row
/// arriving two minutes late is delivered five minutes after the position
/// passed its minute, where the default's ten would still wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minute_settles_after_the_settle_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = store(dir.path(), &clock).await;
    let (receivers, received) = receiver().await;
    let settle = Duration::from_secs(300);
    let mut delivery = Delivery::new(store.clone(), receivers, MARGIN).settle_after(settle);
    queue(&store, "On_time", 1, store.now() - Duration::from_secs(1)).await;
    round(&mut delivery).await;
    clock.advance(MARGIN + Duration::from_secs(120));
    round(&mut delivery).await;
    let beside = same_shard_as("On_time");
    queue(&store, &beside, 1, store.now() - MARGIN - Duration::from_secs(120)).await;
    round(&mut delivery).await;
    assert_eq!(count(&received, &beside, 1), 0, "behind the delivered-through position");
    clock.advance(settle);
    assert!(MARGIN + Duration::from_secs(120) + settle < MARGIN + SETTLE, "the default would not have settled the minute yet");
    round(&mut delivery).await;
    assert_eq!(count(&received, &beside, 1), 1, "not delivered once its minute settled at the settle set");
}

/// A receiver that fails (500) on every archive of `broken`, and what it took.
async fn receiver_failing_on(broken: &'static str) -> (Receivers, Received, Arc<Mutex<u32>>) {
    let received: Received = Arc::default();
    let failures: Arc<Mutex<u32>> = Arc::default();
    let state = (received.clone(), failures.clone());
    let archive = move |State((received, failures)): State<(Received, Arc<Mutex<u32>>)>,
                        Path((_domain, title, rev, _tid)): Path<(String, String, u64, String)>| async move {
        if title == broken {
            *failures.lock().expect("lock") += 1;
            return http::StatusCode::INTERNAL_SERVER_ERROR;
        }
        *received.lock().expect("lock").entry((title, rev)).or_default() += 1;
        http::StatusCode::CREATED
    };
    let app = axum::Router::new().route("/{domain}/v1/archive/{title}/{rev}/{tid}", put(archive)).with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = HttpClient::new(&url, ClientOptions { retries: 0, ..ClientOptions::default() }).expect("client");
    (Receivers { old_store: Some(OldStoreClient::new(client)), graph: None }, received, failures)
}

/// A row its receiver fails on every time (a damaged block in old-store)
/// holds neither the other shards nor, after a bounded number of attempts,
/// the rows behind it: it is moved to the dead letters and its shard flows on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_its_receiver_keeps_failing_on_is_set_aside_and_no_other_shard_waits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = store(dir.path(), &clock).await;
    let (receivers, received, failures) = receiver_failing_on("Broken").await;
    let mut delivery = Delivery::new(store.clone(), receivers, MARGIN);
    let behind = same_shard_as("Broken");
    let elsewhere = (0..).map(|i| format!("Elsewhere_{i}")).find(|t| shard_of(t) != shard_of("Broken")).expect("title");
    let now = store.now();
    queue(&store, "Broken", 1, now - Duration::from_secs(3)).await;
    queue(&store, &behind, 1, now - Duration::from_secs(2)).await;
    queue(&store, &elsewhere, 1, now - Duration::from_secs(2)).await;

    round(&mut delivery).await; // a round with a failing shard does not fail
    assert_eq!(count(&received, &elsewhere, 1), 1, "another shard waited on the failing one");
    assert_eq!(count(&received, &behind, 1), 0, "the shard's order was not kept");
    let mut rounds = 1;
    while count(&received, &behind, 1) == 0 {
        assert!(rounds < 100, "the failing row never set aside ({} failures)", failures.lock().expect("lock"));
        clock.advance_secs(61); // past the shard's pause
        queue(&store, &elsewhere, 1 + rounds, store.now() - Duration::from_secs(1)).await;
        round(&mut delivery).await;
        assert_eq!(count(&received, &elsewhere, 1 + rounds), 1, "another shard waited on the failing one");
        rounds += 1;
    }
    assert_eq!(*failures.lock().expect("lock"), FAULTY_ATTEMPTS, "set aside after its attempts, not before");
    let (letters, _) = dead_letters(&store, None, 100).await.expect("dead letters");
    assert_eq!(letters.iter().map(|l| (l.title.as_str(), l.status)).collect::<Vec<_>>(), [("Broken", Some(500))]);
    assert!(letters[0].reason.contains("in a row"), "{}", letters[0].reason);
}

/// A shard nobody has ever held — every shard of a site added to a
/// deployment years old — is read from near the present, not from when the
/// schema was created: its first row is delivered within a few rounds (the
/// ten million minutes since would take one round far past the bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_never_held_starts_near_the_present() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = store(dir.path(), &clock).await;
    clock.advance_secs(20 * 365 * 86_400);
    let (receivers, received) = receiver().await;
    let mut delivery = Delivery::new(store.clone(), receivers, MARGIN);
    queue(&store, "Far_later", 1, store.now() - Duration::from_secs(1)).await;
    let mut rounds = 0;
    // Twenty years of minutes walked in one round would take far longer than this.
    let caught_up = tokio::time::timeout(Duration::from_secs(120), async {
        while count(&received, "Far_later", 1) == 0 && rounds < 10 {
            round(&mut delivery).await;
            rounds += 1;
        }
    })
    .await;
    assert!(caught_up.is_ok(), "a round walked the minutes since the schema was created");
    assert_eq!(count(&received, "Far_later", 1), 1);
    assert!(rounds <= 3, "{rounds} rounds to reach the present");
}

/// Two sites given the datacenters in different orders would take one
/// number and deliver each other's shards: the second to start is refused,
/// as is a datacenter given a second number; a restart with its own is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_number_is_one_datacenters_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(dir.path(), &ManualClock::starting_now()).await;
    let site = |index, datacenter| Site { index, count: 2, datacenter: Some(datacenter) };
    check_site_number(&store, site(0, "eqiad")).await.expect("the first claim");
    check_site_number(&store, site(0, "eqiad")).await.expect("a restart with the same number");
    let taken = check_site_number(&store, site(0, "codfw")).await.expect_err("a second datacenter on number 0");
    assert!(taken.contains("\"eqiad\"") && taken.contains("REVSTORE_CASSANDRA_REPLICATION"), "{taken}");
    let twice = check_site_number(&store, site(1, "eqiad")).await.expect_err("eqiad on a second number");
    assert!(twice.contains("site number 0"), "{twice}");
    check_site_number(&store, site(1, "codfw")).await.expect("codfw on number 1");
    check_site_number(&store, Site::ONLY).await.expect("one datacenter: nothing to check");
}

/// The outbox shard of `title`'s rows.
fn shard_of(title: &str) -> i64 {
    let domain = Domain::parse("en.wikipedia.org").expect("domain");
    outbox_shard(Site::ONLY, &domain, &Title::parse(title, Default::default()).expect("title"))
}

/// A title whose rows go to the same outbox shard as `title`'s.
fn same_shard_as(title: &str) -> String {
    (0..).map(|i| format!("Late_{i}")).find(|t| shard_of(t) == shard_of(title)).expect("some title shares the shard")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivered_minutes_are_deleted_whole_once_the_margin_has_passed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = store(dir.path(), &clock).await;
    let (receivers, received) = receiver().await;
    let mut delivery = Delivery::new(store.clone(), receivers, MARGIN);

    let mut minutes = Vec::new();
    for i in 0..50u64 {
        let id = queue(&store, &format!("Page_{i}"), 1, store.now() - Duration::from_millis(10)).await;
        minutes.push(outbox_minute(id));
        clock.advance(Duration::from_millis(100));
    }
    minutes.dedup();
    round(&mut delivery).await;
    assert_eq!(received.lock().expect("lock").len(), 50, "every row sent in order, in one round");
    assert_eq!(rows_left(&store, &minutes).await, 50, "within the margin, the rows stay (a late row may still join them)");
    clock.advance(MARGIN + Duration::from_secs(60));
    round(&mut delivery).await;
    assert_eq!(rows_left(&store, &minutes).await, 50, "passed, but not yet settled: a row later than the margin may still come");
    clock.advance(SETTLE);
    round(&mut delivery).await;
    assert_eq!(rows_left(&store, &minutes).await, 0, "every delivered minute is gone");
    assert!(received.lock().expect("lock").values().all(|&n| n == 1), "each row sent once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_the_shards_and_send_each_row_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = store(dir.path(), &clock).await;
    let (receivers, received) = receiver().await;
    let mut first = Delivery::new(store.clone(), receivers.clone(), MARGIN);
    let mut second = Delivery::new(store.clone(), receivers, MARGIN);

    for i in 0..200u64 {
        queue(&store, &format!("Shared_{i}"), 1, store.now() - Duration::from_secs(1)).await;
    }
    for _ in 0..3 {
        round(&mut first).await;
        round(&mut second).await;
        clock.advance_secs(1);
    }
    let got = received.lock().expect("lock").clone();
    assert_eq!(got.len(), 200, "every row sent");
    assert!(got.values().all(|&n| n == 1), "no row sent by both replicas: {got:?}");
    let mut owners = Vec::new();
    for shard in 0..SHARDS {
        let row = store.get(&OUTBOX_SHARDS, vec![Value::from(shard)], None).await.expect("read");
        owners.push(row.expect("every shard has a deliverer").text("owner").expect("owner").to_owned());
    }
    assert!(owners.iter().all(|o| *o == owners[0]), "the first replica to look took every free shard: {owners:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_replicas_shards_are_taken_over_at_once_where_it_left_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = store(dir.path(), &clock).await;
    let (receivers, received) = receiver().await;
    let mut leaving = Delivery::new(store.clone(), receivers.clone(), MARGIN);
    for i in 0..20u64 {
        queue(&store, &format!("Before_{i}"), 1, store.now() - Duration::from_secs(1)).await;
    }
    round(&mut leaving).await;
    clock.advance(MARGIN + Duration::from_secs(60));
    round(&mut leaving).await;
    leaving.stopped().await;

    // Well within the lease: the shards were given back, not left to lapse.
    clock.advance_secs(1);
    let mut taking_over = Delivery::new(store.clone(), receivers, MARGIN);
    for i in 0..20u64 {
        queue(&store, &format!("After_{i}"), 1, store.now() - Duration::from_secs(1)).await;
    }
    round(&mut taking_over).await;
    let got = received.lock().expect("lock").clone();
    for i in 0..20u64 {
        assert_eq!(got.get(&(format!("After_{i}"), 1)), Some(&1), "After_{i}: {got:?}");
        assert_eq!(got.get(&(format!("Before_{i}"), 1)), Some(&1), "Before_{i} sent once, before the hand-over: {got:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_replicas_shards_are_taken_over_without_sending_a_row_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = store(dir.path(), &clock).await;
    let (receivers, received) = receiver().await;
    let mut crashed = Delivery::new(store.clone(), receivers.clone(), MARGIN);
    for i in 0..20u64 {
        queue(&store, &format!("Sent_{i}"), 1, store.now() - Duration::from_secs(1)).await;
    }
    round(&mut crashed).await;
    // No give-back: the replica died. Its leases lapse after 30 s, well
    // within the margin, so its delivered-through position is behind every
    // row it sent.
    drop(crashed);
    clock.advance_secs(45);
    let mut successor = Delivery::new(store.clone(), receivers, MARGIN);
    queue(&store, "Later", 1, store.now() - Duration::from_secs(1)).await;
    round(&mut successor).await;
    clock.advance(MARGIN);
    round(&mut successor).await;
    let got = received.lock().expect("lock").clone();
    assert_eq!(got.get(&("Later".to_owned(), 1)), Some(&1), "{got:?}");
    for i in 0..20u64 {
        assert_eq!(got.get(&(format!("Sent_{i}"), 1)), Some(&1), "Sent_{i} sent once, not again by the successor: {got:?}");
    }
}

/// Writers queue a revision's hand-off without reading the page, so each
/// instance queues one for a revision it has not itself handed off, and one
/// again for a render older than any it queued. The delivery sends each
/// revision's oldest render once, and a change notice only for the page's
/// newest revision: every other row is a repeat, marked delivered unsent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blind_writers_hand_off_each_revision_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = store(dir.path(), &clock).await;
    let (receivers, sent) = receivers_of_both().await;
    let instance = || Pages {
        store: store.clone(),
        grace: Duration::from_secs(86_400),
        clock_skew: Duration::ZERO,
        hand_off: true,
        notify_graph: true,
        remembered: Default::default(),
    };
    let (a, b) = (instance(), instance());
    let domain = Domain::parse("en.wikipedia.org").expect("domain");
    let title = Title::parse("Blind", Default::default()).expect("title");
    let generator = TidGenerator::new();
    let now = store.now();
    let tids: Vec<Tid> = (0..6).map(|i| generator.next_at(now - Duration::from_secs(60 - 10 * i))).collect();
    let id = |rev: u64, tid: Tid| RenderId { rev: RevId::new(rev).expect("rev"), tid };
    let body = |n: usize| RenderBody {
        html: format!("<p>render {n}</p>"),
        data_parsoid: serde_json::json!({}),
        section_offsets: serde_json::json!({}),
    };
    let minute = outbox_minute(Tid::min_at(now));
    let minutes = [minute - 1, minute, minute + 1];

    let writes = [
        (&a, id(7, tids[2]), 2, 2), // the first render of 7 this instance writes: a hand-off and a notice
        (&a, id(7, tids[3]), 3, 0), // a re-render: nothing
        (&b, id(7, tids[4]), 4, 2), // another instance's: a repeat
        (&a, id(7, tids[1]), 1, 2), // older than the one queued: queued again, the one that goes
        (&b, id(8, tids[5]), 5, 2), // a new revision
        (&a, id(6, tids[0]), 0, 2), // a late first render of an older revision
    ];
    let mut expected = 0;
    for (instance, render, n, rows) in writes {
        instance.put(&domain, &title, render, &body(n), &Preconditions::default()).await.expect("put");
        expected += rows;
        assert_eq!(rows_left(&store, &minutes).await, expected, "rows queued after writing {render:?}");
    }

    let mut delivery = Delivery::new(store.clone(), receivers, MARGIN);
    round(&mut delivery).await;
    let sent = sent.lock().expect("lock");
    let mut archived = sent.archived.clone();
    archived.sort();
    let archived_as = |rev: u64, tid: Tid| ("Blind".to_owned(), rev, tid.to_string());
    assert_eq!(
        archived,
        vec![archived_as(6, tids[0]), archived_as(7, tids[1]), archived_as(8, tids[5])],
        "each revision's oldest render, once"
    );
    assert_eq!(sent.notices, vec!["Blind".to_owned()], "one notice: the newest revision's");
}

/// A receiver that takes each archive write only when `answering` gives it
/// a turn (a receiver that does not answer), counting the writes it got.
async fn stalled_receiver(answering: Arc<tokio::sync::Semaphore>) -> (Receivers, Received, Arc<std::sync::atomic::AtomicUsize>) {
    let received: Received = Arc::default();
    let arrived: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
    let state = (received.clone(), arrived.clone(), answering);
    type Stalled = (Received, Arc<std::sync::atomic::AtomicUsize>, Arc<tokio::sync::Semaphore>);
    let archive = |State((received, arrived, answering)): State<Stalled>,
                   Path((_domain, title, rev, _tid)): Path<(String, String, u64, String)>| async move {
        arrived.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        answering.acquire().await.expect("a turn").forget();
        *received.lock().expect("lock").entry((title, rev)).or_default() += 1;
        http::StatusCode::CREATED
    };
    let app = axum::Router::new().route("/{domain}/v1/archive/{title}/{rev}/{tid}", put(archive)).with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let options = ClientOptions { retries: 0, timeout: Duration::from_secs(300), ..ClientOptions::default() };
    let client = HttpClient::new(&url, options).expect("client");
    (Receivers { old_store: Some(OldStoreClient::new(client)), graph: None }, received, arrived)
}

/// A round that lasts longer than a lease (a receiver that does not answer,
/// a shard far behind walking its minutes) goes on renewing its leases, so
/// no other replica takes its shards and sends their rows beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_renewed_while_a_round_waits_on_its_receiver() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = store(dir.path(), &clock).await;
    let answering = Arc::new(tokio::sync::Semaphore::new(0));
    let (receivers, received, arrived) = stalled_receiver(answering.clone()).await;
    queue(&store, "Stalled", 1, store.now() - Duration::from_secs(1)).await;
    let shard = outbox_shard(
        Site::ONLY,
        &Domain::parse("en.wikipedia.org").expect("domain"),
        &Title::parse("Stalled", Default::default()).expect("title"),
    );
    let lease = || {
        let store = store.clone();
        async move {
            let row = store.get(&OUTBOX_SHARDS, vec![Value::from(shard)], None).await.expect("read").expect("the shard's lease");
            (row.text("owner").expect("owner").to_owned(), row.timestamp("expires_at").expect("expires_at"))
        }
    };
    let mut first = Delivery::new(store.clone(), receivers, MARGIN);
    let stalled = tokio::spawn(async move {
        first.work(&CancellationToken::new()).await.expect("the stalled round");
        first
    });
    let waited = std::time::Instant::now();
    while arrived.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(waited.elapsed() < Duration::from_secs(60), "the row never reached its receiver");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (holder, _) = lease().await;
    // More than three leases' length passes while the receiver holds the round.
    for _ in 0..4 {
        clock.advance_secs(25);
        let now_ms = store.now().duration_since(std::time::UNIX_EPOCH).expect("after the epoch").as_millis() as i64;
        let waited = std::time::Instant::now();
        loop {
            let (owner, expires_at) = lease().await;
            assert_eq!(owner, holder);
            if expires_at > now_ms {
                break;
            }
            assert!(
                waited.elapsed() < Duration::from_secs(60),
                "the lease was not renewed during the round: it ended at {expires_at}, now {now_ms}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Another replica finds the shard held, and sends nothing of it.
    let (other_receivers, other_received) = receiver().await;
    let mut second = Delivery::new(store.clone(), other_receivers, MARGIN);
    round(&mut second).await;
    assert_eq!(lease().await.0, holder, "the shard changed hands during the round");
    assert_eq!(count(&other_received, "Stalled", 1), 0);
    answering.add_permits(1);
    let _first = stalled.await.expect("the first replica's round");
    assert_eq!(count(&received, "Stalled", 1), 1);
}

/// Two writes whose ids are in one order and whose commits are in the
/// other (two render writes of one replica, the first slower to finish): the
/// row committed second is behind the read position once it lands, and is
/// delivered at the next round, not once the margin has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_committed_out_of_order_is_delivered_at_the_next_round() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let store = store(dir.path(), &clock).await;
    let (receivers, received) = receiver().await;
    let mut delivery = Delivery::new(store.clone(), receivers, MARGIN);
    let started = store.now();
    queue(&store, "Committed_first", 1, started - Duration::from_secs(1)).await;
    round(&mut delivery).await;
    assert_eq!(count(&received, "Committed_first", 1), 1);
    // Its id taken two seconds before the first's, committed after it was read.
    let slower = same_shard_as("Committed_first");
    queue(&store, &slower, 1, started - Duration::from_secs(3)).await;
    clock.advance_secs(1);
    round(&mut delivery).await;
    assert_eq!(count(&received, &slower, 1), 1, "delivered at the next round, well within the margin");
    clock.advance(MARGIN + Duration::from_secs(60));
    round(&mut delivery).await;
    assert_eq!((count(&received, "Committed_first", 1), count(&received, &slower, 1)), (1, 1), "each once");
}
