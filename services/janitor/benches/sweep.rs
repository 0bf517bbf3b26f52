//! The janitor's sweep rate, what it leaves, and what it costs the readers.
//!
//! ```sh
//! cargo bench -p revstore-janitor --bench sweep                                   # embedded, 100,000 titles
//! cargo bench -p revstore-janitor --bench sweep -- --cassandra 127.0.0.1:9042 --titles 50000
//! ```
//!
//! 1. `--titles` titles, two revisions each, written below the HTTP API
//!    (current-store's `Pages`, no hand-off), with a 5-second grace TTL.
//! 2. current-store serves them (in this process, as `revstore_test_service`
//!    starts it); the grace period passes.
//! 3. The real `revstore-janitor` binary, limit lifted: the audit before, the
//!    retention sweep alone (a dry run: no purge), the retention, the audit after.
//! 4. Readers' p99 (2 readers, latest render of random titles) for 15 s
//!    without the janitor, then 15 s with it running at its default rate,
//!    back to back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt;
use revstore_bench::{arg, percentile};
use revstore_current_store::CurrentStore;
use revstore_current_store::{Pages, Preconditions, RenderBody, RenderId};
use revstore_keys::{Domain, RevId, TidGenerator, Title, TitleRules};
use revstore_storage::{CassandraEngine, CassandraOptions, EmbeddedEngine, EmbeddedOptions, Store};
use serde_json::{Value, json};

const TOKEN: &str = "janitor-bench-token-0123456789";
const DOMAIN: &str = "en.wikipedia.org";
const GRACE_SECS: u64 = 5;

/// Runs the janitor binary to its end; its summary. `ops_per_sec` `None`: its default rate.
fn janitor(base: &str, token_file: &std::path::Path, args: &[&str], ops_per_sec: Option<&str>) -> Value {
    let mut command = Command::new(env!("CARGO_BIN_EXE_revstore-janitor"));
    command.args(args).env("REVSTORE_CURRENT_STORE_URL", base).env("REVSTORE_PEER_TOKEN_FILE", token_file).env("RUST_LOG", "warn");
    command.env_remove("REVSTORE_JANITOR_OPS_PER_SEC");
    if let Some(rate) = ops_per_sec {
        command.env("REVSTORE_JANITOR_OPS_PER_SEC", rate);
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap_or("null")).unwrap_or(Value::Null);
    assert!(output.status.success(), "janitor {args:?}: {}\n{summary}", String::from_utf8_lossy(&output.stderr));
    summary
}

/// Readers' latencies (ms) over `seconds`, two readers.
async fn read_latencies(base: &str, titles: usize, seconds: u64) -> Vec<f64> {
    let http = reqwest::Client::new();
    let until = Instant::now() + Duration::from_secs(seconds);
    let readers = (0..2u64).map(|r| {
        let (http, base) = (http.clone(), base.to_owned());
        async move {
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (r + 1);
            let mut samples = Vec::new();
            while Instant::now() < until {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let started = Instant::now();
                let r = http.get(format!("{base}/{DOMAIN}/v1/page/html/Page_{}", x % titles as u64)).send().await.unwrap();
                assert_eq!(r.status(), 200);
                r.bytes().await.unwrap();
                samples.push(started.elapsed().as_secs_f64() * 1000.0);
            }
            samples
        }
    });
    futures_util::future::join_all(readers).await.concat()
}

#[tokio::main]
async fn main() {
    let titles: usize = arg("--titles").map_or(100_000, |n| n.parse().unwrap());
    let cassandra = arg("--cassandra");
    let dir = tempfile::tempdir().unwrap();
    let keyspace = format!("janitor_bench_{}", std::process::id());
    let store = match &cassandra {
        None => Store::new(Arc::new(EmbeddedEngine::open(dir.path(), EmbeddedOptions::default()).unwrap())),
        Some(node) => {
            Store::new(Arc::new(CassandraEngine::connect(CassandraOptions::new(vec![node.clone()], keyspace.clone())).await.unwrap()))
        }
    };
    store.migrate(&revstore_schema::COMPONENTS).await.unwrap();
    let engine = if cassandra.is_some() { "cassandra" } else { "embedded" };
    println!("# janitor, {engine} engine, {titles} titles (two revisions each), grace {GRACE_SECS} s\n");

    // 1. The titles, below the API, 16 writes at a time.
    let pages = Pages {
        store: store.clone(),
        grace: Duration::from_secs(GRACE_SECS),
        clock_skew: Duration::ZERO,
        hand_off: false,
        notify_graph: false,
        remembered: Default::default(),
    };
    let domain = Domain::parse(DOMAIN).unwrap();
    let started = Instant::now();
    let now = SystemTime::now();
    futures_util::stream::iter(0..titles)
        .map(|t| {
            let (pages, domain) = (pages.clone(), domain.clone());
            async move {
                let title = Title::parse(&format!("Page_{t}"), TitleRules::default()).unwrap();
                let generator = TidGenerator::new();
                for (rev, ago) in [(1u64, 120u64), (2, 60)] {
                    let id = RenderId { rev: RevId::new(rev).unwrap(), tid: generator.next_at(now - Duration::from_secs(ago)) };
                    let body = RenderBody {
                        html: format!("<p>{title} revision {rev}: {}</p>", "text ".repeat(40)),
                        data_parsoid: json!({"ids": {"mwAA": {"dsr": [0, 200, 0, 0]}}}),
                        section_offsets: json!({"mwAQ": {"html": [0, 10], "wt": [0, 5]}}),
                    };
                    pages.put(&domain, &title, id, &body, &Preconditions::default()).await.unwrap();
                }
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    println!(
        "loaded below the API in {:.0} s: {:.0} renders/s\n",
        started.elapsed().as_secs_f64(),
        (2 * titles) as f64 / started.elapsed().as_secs_f64()
    );
    drop(pages);
    drop(store);

    // 2. current-store on that storage.
    let settings = revstore_test_service::TestSettings::<CurrentStore>::new(TOKEN).with(|s| {
        s.own.grace_ttl = Duration::from_secs(GRACE_SECS);
        s.own.clock_skew = Duration::ZERO;
        if let Some(node) = &cassandra {
            s.common.storage.cassandra = vec![node.clone()];
            s.common.storage.keyspace = keyspace.clone();
        }
    });
    let service = revstore_test_service::start_in(dir.path(), settings).await;
    let base = service.url("");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    tokio::time::sleep(Duration::from_secs(GRACE_SECS + 1)).await;

    // 3. The janitor, limit lifted (on a blocking thread: the service answers from this runtime).
    let run = |args: &'static [&'static str], rate: Option<&'static str>| {
        let (base, token_file) = (base.clone(), token_file.clone());
        async move { tokio::task::spawn_blocking(move || janitor(&base, &token_file, args, rate)).await.unwrap() }
    };
    let before = run(&["audit"], Some("0")).await;
    let sweep_only = run(&["--dry-run", "retention"], Some("0")).await;
    let retention = run(&["retention"], Some("0")).await;
    let after = run(&["audit"], Some("0")).await;
    println!("| measurement | partitions | seconds | partitions/s | overstore ratio |\n|---|---|---|---|---|");
    let row = |what: &str, summary: &Value, task: &str| {
        let t = &summary["tasks"][task];
        let partitions: u64 = t["services"].as_object().unwrap().values().map(|s| s["partitions"].as_u64().unwrap()).sum();
        let seconds = t["seconds"].as_f64().unwrap();
        let ratio = t["overstore_ratio"].as_f64().map_or(String::new(), |r| format!("{r:.3}"));
        println!("| {what} | {partitions} | {seconds:.2} | {:.0} | {ratio} |", partitions as f64 / seconds);
    };
    row("audit before (all current-store tables)", &before, "audit");
    row("retention sweep of `page_renders` (dry run: no purge)", &sweep_only, "retention");
    row("retention sweep of `page_renders`, and the purge", &retention, "retention");
    row("audit after", &after, "audit");
    println!(
        "\npurged: {}\nper table after: {}\n",
        retention["tasks"]["retention"]["purged"],
        serde_json::to_string(&after["tasks"]["audit"]["tables"]).unwrap()
    );

    // 4. Readers without, then with, the janitor at its default rate.
    let mut quiet = read_latencies(&base, titles, 15).await;
    let running = Arc::new(AtomicBool::new(true));
    let background = {
        let (base, token_file, running) = (base.clone(), token_file.clone(), running.clone());
        tokio::task::spawn_blocking(move || {
            let mut runs = 0;
            while running.load(Ordering::Relaxed) {
                janitor(&base, &token_file, &["retention", "audit"], None);
                runs += 1;
            }
            runs
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut busy = read_latencies(&base, titles, 15).await;
    running.store(false, Ordering::Relaxed);
    let runs = background.await.unwrap();
    let (p99_quiet, p99_busy) = (percentile(&mut quiet, 0.99), percentile(&mut busy, 0.99));
    println!("| readers (2, latest render of a random title) | reads | p50 ms | p99 ms |\n|---|---|---|---|");
    println!("| without the janitor | {} | {:.2} | {p99_quiet:.2} |", quiet.len(), percentile(&mut quiet, 0.5));
    println!("| with the janitor at its default rate ({runs} runs) | {} | {:.2} | {p99_busy:.2} |", busy.len(), percentile(&mut busy, 0.5));
    println!("\np99 with / without: {:.2}x", p99_busy / p99_quiet);
    service.stop().await;
}
