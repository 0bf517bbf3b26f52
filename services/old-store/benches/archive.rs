//! old-store over HTTP on the embedded engine: what the archive costs on disk,
//! how fast it ingests, how fast it reads back. One run, one machine, the load
//! generator beside the service (as the targets are stated).
//!
//! ```text
//! cargo bench -p revstore-old-store --bench archive -- [--titles N] [--reads N]
//! ```
//! It starts the real `revstore-old-store` binary as a separate process and measures:
//! 1. **compression**: each real history of shared/data ingested one revision at
//!    a time through the API into a fresh store, left to settle (the compactor
//!    done), the service stopped cleanly; the bytes the embedded engine's files
//!    grew by, against the raw bytes of the history. Plus a page of megabyte
//!    revisions, made by joining 40 consecutive Anarchism revisions into each.
//! 2. **ingest**: `--titles` copies of the Anarchism HTML history (default 8),
//!    one writer per title, all at once: revisions per second, sustained.
//! 3. **random reads**: `--reads` GETs (default 5,000) of a random revision of a
//!    random title, 4 clients: latency percentiles, with the default block cache
//!    and with a 1 MB cache (nearly every read decodes its block).
//! 4. **history stream**: each title's whole history as NDJSON: MB/s of HTML.
//! 5. **dump import**: the aawiki full-history dump of shared/data through
//!    `revstore-dump-import` (8 writers): revisions per second, then the bytes
//!    on disk against the raw wikitext, and a verification pass.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use revstore_keys::Tid;
use serde_json::json;

const TOKEN: &str = "old-store-bench-token";
const DOMAIN: &str = "en.wikipedia.org";

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

struct Service {
    child: Child,
    base: String,
    http: reqwest::Client,
}

impl Service {
    async fn start(dir: &Path, extra: &[&str]) -> Service {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(env!("CARGO_BIN_EXE_revstore-old-store"))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--write-tokens", TOKEN, "--shutdown-delay-secs", "0"])
            .args(["--data-dir", dir.to_str().unwrap(), "--body-limit-bytes", "67108864", "--settle-secs", "1"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start revstore-old-store");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
        let started = Instant::now();
        while !http.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status() == 200) {
            assert!(started.elapsed() < Duration::from_secs(60), "old-store not ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Service { child, base, http }
    }

    async fn archive(&self, title: &str, rev: u64, body: &serde_json::Value) {
        let r = self
            .http
            .put(format!("{}/{DOMAIN}/v1/archive/{title}/{rev}/{}", self.base, Tid::now()))
            .bearer_auth(TOKEN)
            .json(body)
            .send()
            .await
            .expect("archive");
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    }

    /// Waits until the compactor has nothing left, quiet periods included.
    async fn settle(&self) {
        loop {
            let metrics = self.http.get(format!("{}/metrics", self.base)).send().await.unwrap().text().await.unwrap();
            let pending = metrics
                .lines()
                .find_map(|l| l.strip_prefix("old_store_compactions_pending "))
                .map(|v| v.trim().parse::<f64>().unwrap())
                .unwrap_or(0.0);
            if pending == 0.0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGTERM, then wait: a clean shutdown.
    fn stop(mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).unwrap().filter_map(|e| e.ok()).filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum()
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)].as_secs_f64() * 1e3
}

/// Ingests one history into a fresh store; returns the bytes on disk it added.
async fn on_disk_cost(revisions: &[String], part: &str) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    Service::start(dir.path(), &[]).await.stop();
    let empty = dir_bytes(dir.path());
    let service = Service::start(dir.path(), &[]).await;
    for (i, r) in revisions.iter().enumerate() {
        service.archive("History", 1 + i as u64, &json!({ part: r })).await;
    }
    service.settle().await;
    service.stop();
    (dir_bytes(dir.path()) - empty, revisions.iter().map(|r| r.len() as u64).sum())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let titles: usize = arg("--titles").map(|s| s.parse().expect("--titles")).unwrap_or(8);
    let reads: usize = arg("--reads").map(|s| s.parse().expect("--reads")).unwrap_or(5000);
    let html = Arc::new(revstore_testdata::anarchism_html());

    println!("## 1. Compression: bytes on disk added by the ingest, after a clean shutdown\n");
    println!("| history | revisions | raw | on disk | % of raw |\n|---|---|---|---|---|");
    let megabyte_revisions: Vec<String> = (0..html.len() - 40).step_by(2).map(|i| html[i..i + 40].concat()).collect();
    let histories = [
        ("enwiki Anarchism, Parsoid HTML", (*html).clone(), "html"),
        ("enwiki Anarchism, wikitext", revstore_testdata::history("enwiki_Anarchism.wikitext", "wikitext"), "wikitext"),
        ("webplatform css/font-size, wikitext", revstore_testdata::history("webplatform_css_font-size.wikitext", ""), "wikitext"),
        ("megabyte revisions (40 Anarchism revisions joined each)", megabyte_revisions, "html"),
    ];
    for (name, revisions, part) in &histories {
        let (disk, raw) = on_disk_cost(revisions, part).await;
        println!(
            "| {name} | {} | {:.2} MB | {} KB | {:.2} |",
            revisions.len(),
            raw as f64 / 1e6,
            disk / 1000,
            100.0 * disk as f64 / raw as f64
        );
    }

    println!("\n## 2. Ingest: {titles} titles x {} revisions of Anarchism HTML, one writer per title\n", html.len());
    let dir = tempfile::tempdir().unwrap();
    let service = Arc::new(Service::start(dir.path(), &[]).await);
    let started = Instant::now();
    let mut writers = Vec::new();
    for t in 0..titles {
        let (service, html) = (service.clone(), html.clone());
        writers.push(tokio::spawn(async move {
            for (i, h) in html.iter().enumerate() {
                service.archive(&format!("Title_{t}"), 1 + i as u64, &json!({ "html": h })).await;
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let elapsed = started.elapsed();
    let revisions = titles * html.len();
    let raw_mb = (titles * html.iter().map(String::len).sum::<usize>()) as f64 / 1e6;
    println!(
        "{revisions} revisions ({raw_mb:.1} MB) in {:.2} s: **{:.0} revisions/s**, {:.1} MB/s",
        elapsed.as_secs_f64(),
        revisions as f64 / elapsed.as_secs_f64(),
        raw_mb / elapsed.as_secs_f64()
    );
    let settle_started = Instant::now();
    service.settle().await;
    println!("compactor settled {:.1} s after the last write (settle period 1 s)", settle_started.elapsed().as_secs_f64());
    Arc::into_inner(service).unwrap().stop();

    println!("\n## 3. Random reads of old revisions: {reads} GETs, 4 clients\n");
    println!("| block cache | p50 ms | p99 ms | max ms | reads/s |\n|---|---|---|---|---|");
    for (label, cache_mb) in [("256 MB (default)", "256"), ("1 MB (nearly every read decodes)", "1")] {
        let service = Arc::new(Service::start(dir.path(), &["--block-cache-mb", cache_mb]).await);
        let started = Instant::now();
        let mut clients = Vec::new();
        for c in 0..4 {
            let (service, html) = (service.clone(), html.clone());
            clients.push(tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(reads / 4);
                for _ in 0..reads / 4 {
                    let (t, i) = (rand::random_range(0..titles), rand::random_range(0..html.len()));
                    let sent = Instant::now();
                    let r =
                        service.http.get(format!("{}/{DOMAIN}/v1/archive/html/Title_{t}/{}", service.base, 1 + i)).send().await.unwrap();
                    assert_eq!(r.status(), 200);
                    let body = r.bytes().await.unwrap();
                    latencies.push(sent.elapsed());
                    assert_eq!(body.len(), html[i].len(), "client {c}");
                }
                latencies
            }));
        }
        let mut latencies = Vec::new();
        for c in clients {
            latencies.extend(c.await.unwrap());
        }
        let elapsed = started.elapsed();
        latencies.sort();
        println!(
            "| {label} | {:.2} | {:.2} | {:.2} | {:.0} |",
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            latencies.last().unwrap().as_secs_f64() * 1e3,
            latencies.len() as f64 / elapsed.as_secs_f64()
        );
        Arc::into_inner(service).unwrap().stop();
    }

    println!("\n## 4. History stream: each title's history as NDJSON, decoded HTML per second\n");
    let service = Service::start(dir.path(), &[]).await;
    for pass in ["cold (fresh process)", "warm (blocks cached)"] {
        let started = Instant::now();
        let mut lines = 0usize;
        for t in 0..titles {
            // Count lines only: parsing the JSON here would measure the load generator.
            let body = service
                .http
                .get(format!("{}/{DOMAIN}/v1/archive/history/Title_{t}", service.base))
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            lines += body.iter().filter(|&&b| b == b'\n').count();
        }
        assert_eq!(lines, titles * html.len());
        let html_bytes = titles * html.iter().map(String::len).sum::<usize>();
        let elapsed = started.elapsed();
        assert_eq!(html_bytes, titles * html.iter().map(String::len).sum::<usize>());
        println!(
            "{pass}: {:.1} MB of HTML in {:.2} s: **{:.0} MB/s**",
            html_bytes as f64 / 1e6,
            elapsed.as_secs_f64(),
            html_bytes as f64 / 1e6 / elapsed.as_secs_f64()
        );
    }
    service.stop();

    println!("\n## 5. Dump import: aawiki pages-meta-history (shared/data/dumps), 8 writers\n");
    let dir = tempfile::tempdir().unwrap();
    Service::start(dir.path(), &[]).await.stop();
    let empty = dir_bytes(dir.path());
    let service = Service::start(dir.path(), &[]).await;
    let client =
        revstore_client::HttpClient::new(&service.base, revstore_client::ClientOptions { token: Some(TOKEN.into()), ..Default::default() })
            .unwrap();
    let dump = revstore_testdata::shared_data().join("dumps/aawiki-20260101-pages-meta-history.xml.7z");
    let options = |mode| revstore_dump_import::ImportOptions { dump: dump.clone(), domain: None, writers: 8, mode };
    let imported = revstore_dump_import::run_import(client.clone(), options(revstore_dump_import::Mode::Import), |_, _| {}).await.unwrap();
    println!("import: {imported}\n");
    let verified = revstore_dump_import::run_import(client, options(revstore_dump_import::Mode::Verify), |_, _| {}).await.unwrap();
    println!("verify: {verified}\n");
    service.settle().await;
    service.stop();
    let raw = imported.text_bytes.load(std::sync::atomic::Ordering::Relaxed);
    let disk = dir_bytes(dir.path()) - empty;
    println!(
        "on disk: {} KB for {:.2} MB of wikitext: {:.1}% ({:.1} revisions per page: most pages are too short a history to share a block)",
        disk / 1000,
        raw as f64 / 1e6,
        100.0 * disk as f64 / raw as f64,
        imported.revisions as f64 / imported.pages as f64
    );
}
