//! current-store under load, over HTTP, with the load generator on the same
//! machine (as the service's targets are stated).
//!
//! ```text
//! cargo bench -p revstore-current-store --bench http -- [--engine embedded|cassandra] [--rate R] [--seconds N] [--pages N] [--binary PATH]
//! ```
//! It starts the real `revstore-current-store` binary as a separate process
//! (or `--binary`, e.g. an older build, to compare two side by side),
//! stores `--pages` pages with real Parsoid HTML (30-100 KB revisions of
//! "Anarchism" from shared/data), then measures, in one run:
//! 1. reads of the latest HTML at a fixed rate (`--rate`, default 1,000/s): latency counted
//!    from each request's scheduled send time, so queueing shows;
//! 2. reads of the latest HTML at saturation (32 connections);
//! 3. the same reads straight from the `Store` in-process (after the service
//!    stops, on the same data): the ratio of 2 to 3 is the HTTP stack's cost;
//! 4. writes of new renders at saturation (32 writers), then a precedence check.
//!
//! Cassandra uses `$REVSTORE_CASSANDRA` (default 127.0.0.1:9042).

#![allow(clippy::print_stdout)]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use revstore_current_store::pages::Pages;
use revstore_current_store::render::{RenderBody, decode_part};
use revstore_keys::{Domain, Tid, Title, TitleRules};
use revstore_storage::{CassandraOptions, EmbeddedOptions, StorageSettings};

const TOKEN: &str = "current-store-bench-token";
const CONCURRENCY: usize = 32;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

/// Real page HTML: the "Anarchism" revisions of 30-100 KB.
fn renders() -> Vec<String> {
    let all = revstore_testdata::anarchism_html();
    let sized: Vec<String> = all.iter().filter(|h| (30_000..=100_000).contains(&h.len())).cloned().collect();
    if sized.is_empty() { all } else { sized }
}

fn body(html: &str, n: u64) -> RenderBody {
    RenderBody {
        html: html.to_owned(),
        data_parsoid: serde_json::json!({ "counter": n, "ids": {} }),
        section_offsets: serde_json::json!({ "mwAQ": { "html": [0, 10], "wt": [0, 5] } }),
    }
}

struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)].as_secs_f64() * 1e3
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let engine = arg("--engine").unwrap_or_else(|| "embedded".into());
    let seconds: u64 = arg("--seconds").map(|s| s.parse().expect("--seconds")).unwrap_or(10);
    let pages_n: usize = arg("--pages").map(|s| s.parse().expect("--pages")).unwrap_or(200);
    let html = renders();
    let dir = tempfile::tempdir().expect("tempdir");
    let keyspace = format!("bench_current_{}", std::process::id());
    let node = std::env::var("REVSTORE_CASSANDRA").unwrap_or_else(|_| "127.0.0.1:9042".into());
    let port = free_port();
    let binary = arg("--binary").unwrap_or_else(|| env!("CARGO_BIN_EXE_revstore-current-store").to_owned());
    println!("binary: {binary}");
    let mut cmd = Command::new(&binary);
    cmd.args([
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--write-tokens",
        TOKEN,
        "--shutdown-delay-secs",
        "0",
        "--migrate-on-start",
        "true",
    ])
    .env("RUST_LOG", "warn")
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    match engine.as_str() {
        "embedded" => cmd.args(["--data-dir", dir.path().to_str().expect("utf-8")]),
        "cassandra" => cmd.args(["--cassandra", &node, "--keyspace", &keyspace]),
        other => panic!("unknown engine {other:?}"),
    };
    let service = Service(cmd.spawn().expect("start revstore-current-store"));
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().expect("client");
    let started = Instant::now();
    while !http.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status() == 200) {
        assert!(started.elapsed() < Duration::from_secs(120), "service not ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Load: one render per page.
    let titles: Vec<String> = (0..pages_n).map(|i| format!("Bench_page_{i}")).collect();
    for (i, t) in titles.iter().enumerate() {
        let r = http
            .post(format!("{base}/en.wikipedia.org/v1/page/{t}/1"))
            .bearer_auth(TOKEN)
            .json(&body(&html[i % html.len()], 0))
            .send()
            .await
            .expect("load");
        assert_eq!(r.status(), 201);
    }
    let avg_kb = titles.iter().enumerate().map(|(i, _)| html[i % html.len()].len()).sum::<usize>() as f64 / titles.len() as f64 / 1024.0;
    let titles = Arc::new(titles);
    let mut rows = Vec::new();

    // 1. Fixed rate.
    let rate: u64 = arg("--rate").map(|s| s.parse().expect("--rate")).unwrap_or(1000);
    let total = rate * seconds;
    let t0 = Instant::now() + Duration::from_millis(100);
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        let (http, base, titles) = (http.clone(), base.clone(), titles.clone());
        let scheduled = t0 + Duration::from_micros(i * 1_000_000 / rate);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(scheduled.into()).await;
            let t = &titles[(i as usize * 7919) % titles.len()];
            let r = http.get(format!("{base}/en.wikipedia.org/v1/page/html/{t}")).send().await.expect("read");
            assert_eq!(r.status(), 200);
            let _ = r.bytes().await.expect("body");
            scheduled.elapsed()
        }));
    }
    let mut latencies = Vec::with_capacity(tasks.len());
    for t in tasks {
        latencies.push(t.await.expect("task"));
    }
    let achieved = latencies.len() as f64 / (t0.elapsed().as_secs_f64());
    latencies.sort();
    rows.push(format!(
        "| {engine} | read latest HTML, fixed {rate}/s | {} | {achieved:.0} | {:.2} | {:.2} |",
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99)
    ));

    // 2. Saturation over HTTP.
    let (http_ops, http_lat) = saturate(seconds, {
        let (http, base, titles) = (http.clone(), base.clone(), titles.clone());
        move |i| {
            let (http, base, titles) = (http.clone(), base.clone(), titles.clone());
            async move {
                let t = &titles[(i * 7919) % titles.len()];
                let r = http.get(format!("{base}/en.wikipedia.org/v1/page/html/{t}")).send().await.expect("read");
                assert_eq!(r.status(), 200);
                let _ = r.bytes().await.expect("body");
            }
        }
    })
    .await;
    rows.push(format!(
        "| {engine} | read latest HTML, saturation over HTTP | {} | {:.0} | {:.2} | {:.2} |",
        http_lat.len(),
        http_ops,
        percentile(&http_lat, 0.5),
        percentile(&http_lat, 0.99)
    ));

    // 4. Writes at saturation (before the service stops).
    let next_rev = Arc::new(AtomicU64::new(2));
    let (write_ops, write_lat) = saturate(seconds, {
        let (http, base, titles, html, next_rev) = (http.clone(), base.clone(), titles.clone(), Arc::new(html.clone()), next_rev.clone());
        move |i| {
            let (http, base, titles, html, next_rev) = (http.clone(), base.clone(), titles.clone(), html.clone(), next_rev.clone());
            async move {
                let t = &titles[i % titles.len()];
                let rev = next_rev.fetch_add(1, Ordering::SeqCst);
                let r = http
                    .put(format!("{base}/en.wikipedia.org/v1/page/{t}/{rev}/{}", Tid::now()))
                    .bearer_auth(TOKEN)
                    .json(&body(&html[i % html.len()], rev))
                    .send()
                    .await
                    .expect("write");
                assert_eq!(r.status(), 201);
            }
        }
    })
    .await;
    rows.push(format!(
        "| {engine} | write new renders, 32 writers | {} | {:.0} | {:.2} | {:.2} |",
        write_lat.len(),
        write_ops,
        percentile(&write_lat, 0.5),
        percentile(&write_lat, 0.99)
    ));
    drop(service);

    // 3. The same reads straight from the Store, in this process.
    let settings = match engine.as_str() {
        "embedded" => StorageSettings::Embedded { data_dir: dir.path().to_owned(), options: EmbeddedOptions::default() },
        _ => StorageSettings::Cassandra(CassandraOptions::new([node.clone()], keyspace.clone())),
    };
    let store = revstore_storage::open(settings).await.expect("open store");
    let pages = Pages { store: store.clone(), grace: Duration::from_secs(86_400), hand_off: false, notify_graph: false };
    // Precedence after the write load: each page's latest is the highest revision written to it.
    let domain = Domain::parse("en.wikipedia.org").expect("domain");
    let max_rev = next_rev.load(Ordering::SeqCst);
    for t in titles.iter().take(20) {
        let title = Title::parse(t, TitleRules::default()).expect("title");
        let latest = pages.latest(&domain, &title, &["tid"]).await.expect("latest").expect("a render").id;
        let held = pages.held(&domain, &title).await.expect("held");
        let best = held.iter().map(|h| h.rev).max().unwrap_or(0);
        assert_eq!(latest.rev.get(), best.max(latest.rev.get()), "precedence violated on {t}");
        assert!(latest.rev.get() < max_rev);
    }
    let (direct_ops, direct_lat) = saturate(seconds, {
        let (pages, titles, domain) = (pages.clone(), titles.clone(), domain.clone());
        move |i| {
            let (pages, titles, domain) = (pages.clone(), titles.clone(), domain.clone());
            async move {
                let title = Title::parse(&titles[(i * 7919) % titles.len()], TitleRules::default()).expect("title");
                let found = pages.latest(&domain, &title, &["tid", "html"]).await.expect("read").expect("render");
                let html = decode_part(found.row.blob("html").expect("html"), "html").expect("decode");
                assert!(!html.is_empty());
            }
        }
    })
    .await;
    rows.push(format!(
        "| {engine} | read latest HTML, saturation, Store in-process | {} | {:.0} | {:.2} | {:.2} |",
        direct_lat.len(),
        direct_ops,
        percentile(&direct_lat, 0.5),
        percentile(&direct_lat, 0.99)
    ));
    if engine == "cassandra" {
        let engine =
            revstore_storage::CassandraEngine::connect(CassandraOptions::new([node.clone()], keyspace.clone())).await.expect("connect");
        engine.session().query_unpaged(format!("DROP KEYSPACE \"{keyspace}\""), ()).await.expect("drop the bench keyspace");
    }

    println!("pages: {pages_n}, average render {avg_kb:.0} KiB of HTML, {seconds} s per measurement\n");
    println!("| engine | measurement | requests | per second | p50 ms | p99 ms |\n|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    println!("\nHTTP reads at saturation / in-process Store reads: {:.2}", http_ops / direct_ops);
}

/// Runs `op(i)` from 32 tasks for `seconds`; returns operations per second and latencies.
async fn saturate<F, Fut>(seconds: u64, op: F) -> (f64, Vec<Duration>)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let counter = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let (op, counter) = (op.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let i = counter.fetch_add(1, Ordering::Relaxed) as usize;
                let t = Instant::now();
                op(i).await;
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    let ops = all.len() as f64 / started.elapsed().as_secs_f64();
    all.sort();
    (ops, all)
}
