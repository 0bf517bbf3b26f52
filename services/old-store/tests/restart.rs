//! old-store killed or stopped while it owes compactions: the real binary,
//! on both engines. Whatever it owed is compacted after a restart with no new
//! write, and SIGTERM does not wait for a long compaction to finish.

mod process;

use std::time::{Duration, Instant};

use process::Running;
use revstore_keys::Tid;
use revstore_storage::testing::TestKeyspace;
use revstore_test_service::{Engine, eventually};
use serde_json::{Value, json};

const TOKEN: &str = "old-store-restart-token";

/// Where the binary keeps its data: a directory, and on Cassandra a keyspace
/// of the test's own (dropped with it, also when the test fails).
struct Storage {
    dir: tempfile::TempDir,
    cassandra: Option<TestKeyspace>,
}

impl Storage {
    fn new(engine: Engine) -> Storage {
        let cassandra = (engine == Engine::Cassandra).then(|| TestKeyspace::new("old_store_restart"));
        Storage { dir: tempfile::tempdir().expect("tempdir"), cassandra }
    }

    /// Starts old-store on this storage with `extra` settings.
    fn start(&self, extra: &[&str]) -> Running {
        let mut args: Vec<String> =
            ["--data-dir", self.dir.path().to_str().expect("utf-8"), "--write-tokens", TOKEN].map(String::from).to_vec();
        if let Some(keyspace) = &self.cassandra {
            args.extend(["--cassandra", keyspace.node(), "--keyspace", keyspace.name(), "--migrate-on-start", "true"].map(String::from));
        }
        args.extend(["--body-limit-bytes", "40000000"].map(String::from));
        args.extend(extra.iter().map(|s| s.to_string()));
        Running::start(&args)
    }
}

async fn archive(http: &reqwest::Client, s: &Running, title: &str, rev: u64, html: &str) {
    let url = s.url(&format!("/en.wikipedia.org/v1/archive/{title}/{rev}/{}", Tid::now()));
    let answer = http.put(url).bearer_auth(TOKEN).json(&json!({ "html": html })).send().await.expect("send");
    assert_eq!(answer.status(), 201, "{}", answer.text().await.unwrap_or_default());
}

async fn admin(http: &reqwest::Client, s: &Running, post: bool, path: &str) -> Value {
    let request = if post { http.post(s.url(path)) } else { http.get(s.url(path)) };
    let answer = request.bearer_auth(TOKEN).send().await.expect("send");
    assert_eq!(answer.status(), 200, "{path}");
    answer.json().await.expect("json")
}

/// Waits until the first sweep has run and the queue is empty, then sweeps
/// again and returns how many renders are still owed a compaction.
async fn owed_once_idle(http: &reqwest::Client, s: &Running) -> (Value, u64) {
    let started = Instant::now();
    loop {
        let status = admin(http, s, false, "/admin/compaction").await;
        if status["pending"] == 0 && status["compacting"] == false && !status["last_sweep"].is_null() {
            let first_sweep = status["last_sweep"].clone();
            let again = admin(http, s, true, "/admin/compaction/sweep").await;
            return (first_sweep, again["markers"].as_u64().expect("markers"));
        }
        assert!(started.elapsed() < Duration::from_secs(120), "compactions still pending after 120 s: {status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn a_killed_old_store_compacts_what_it_owed_after_restart_without_a_new_write(engine: Engine) {
    let storage = Storage::new(engine);
    let http = reqwest::Client::new();
    let html = revstore_testdata::anarchism_html();
    // A settle period longer than the test: this process never seals anything.
    let s = storage.start(&["--settle-secs", "3600", "--debt-sweep-secs", "3600"]);
    s.ready(&http).await;
    for (i, h) in html.iter().take(20).enumerate() {
        archive(&http, &s, "Owed_A", 1 + i as u64, h).await;
    }
    for (i, h) in html.iter().skip(50).take(5).enumerate() {
        archive(&http, &s, "Owed_B", 1 + i as u64, h).await;
    }
    assert_eq!(s.metric(&http, "old_store_compactions_pending{service=\"old-store\"}").await, 2.0, "both open blocks wait to settle");
    s.kill_9();

    // Restarted, with a short settle period and no writes at all.
    let s = storage.start(&["--settle-secs", "1", "--debt-sweep-secs", "3600"]);
    s.ready(&http).await;
    let (first_sweep, owed_after) = owed_once_idle(&http, &s).await;
    assert_eq!(first_sweep["markers"], 25, "the sweep at start found every render owed: {first_sweep}");
    assert_eq!(first_sweep["blocks"], 2, "{first_sweep}");
    assert_eq!(owed_after, 0, "the owed blocks were compacted at the seal level");
    assert!(s.metric(&http, "old_store_compactions_total{service=\"old-store\",outcome=\"compacted\"}").await >= 2.0);
    // And everything reads back from the compacted blocks.
    for (title, revisions) in [("Owed_A", html.iter().take(20).collect::<Vec<_>>()), ("Owed_B", html.iter().skip(50).take(5).collect())] {
        for (i, h) in revisions.into_iter().enumerate() {
            let read = http.get(s.url(&format!("/en.wikipedia.org/v1/archive/html/{title}/{}", i + 1))).send().await.expect("send");
            assert_eq!(read.status(), 200);
            assert!(read.text().await.expect("body") == *h, "{title} revision {} reads back different", i + 1);
        }
    }
}

async fn sigterm_stops_a_long_compaction_promptly_and_keeps_its_debt(engine: Engine) {
    let storage = Storage::new(engine);
    let http = reqwest::Client::new();
    // Three revisions of about 4.4 MB: a level-19 compaction of seconds.
    let large = revstore_testdata::large_page_history(150, 3);
    // Written where nothing settles within the test (the test once used a 1 s
    // settle period, and on a slow machine a compaction of two of the three
    // started between the writes), then owed to the next process.
    let s = storage.start(&["--settle-secs", "3600"]);
    s.ready(&http).await;
    for (i, page) in large.iter().enumerate() {
        archive(&http, &s, "Large", 1 + i as u64, page).await;
    }
    s.terminate();
    // Its sweep at start queues the three; one compaction of all of them
    // starts a settle period later, and leaves the queue then.
    let s = storage.start(&["--settle-secs", "1"]);
    s.ready(&http).await;
    eventually("a sweep at start", Duration::from_secs(60), async || {
        !admin(&http, &s, false, "/admin/compaction").await["last_sweep"].is_null()
    })
    .await;
    eventually("the compaction starts", Duration::from_secs(60), async || {
        s.metric(&http, "old_store_compactions_pending{service=\"old-store\"}").await == 0.0
    })
    .await;
    let exit = s.terminate();

    let s = storage.start(&["--settle-secs", "1"]);
    s.ready(&http).await;
    let (first_sweep, owed_after) = owed_once_idle(&http, &s).await;
    assert_eq!(first_sweep["markers"], 3, "the stopped compaction's debt was kept: {first_sweep}");
    assert_eq!(owed_after, 0);
    let compaction = s.metric(&http, "old_store_compaction_seconds_sum{service=\"old-store\"}").await;
    assert!(
        exit.as_secs_f64() * 2.0 < compaction,
        "SIGTERM took {exit:?} to stop, the compaction it interrupted takes {compaction:.1} s: it waited instead of cancelling"
    );
    let read = http.get(s.url("/en.wikipedia.org/v1/archive/html/Large/2")).send().await.expect("send");
    assert!(read.text().await.expect("body") == large[1]);
}

revstore_test_service::on_both_engines!(
    a_killed_old_store_compacts_what_it_owed_after_restart_without_a_new_write,
    sigterm_stops_a_long_compaction_promptly_and_keeps_its_debt,
);
