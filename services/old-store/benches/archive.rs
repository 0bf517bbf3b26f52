//! old-store over HTTP on the embedded engine: how fast it ingests and reads
//! back. One run, one machine, the load generator beside the service (as the
//! targets are stated). What the archive costs on disk is the `at_rest` bench.
//!
//! ```text
//! cargo bench -p revstore-old-store --bench archive -- [--titles N] [--reads N] [--binary PATH]
//! ```
//! It starts the real `revstore-old-store` binary as a separate process and measures:
//! 1. **ingest**: `--titles` copies of the Anarchism HTML history (default 8),
//!    one writer per title, all at once: revisions per second, sustained.
//! 2. **random reads**: `--reads` GETs (default 5,000) of a random revision of a
//!    random title, 4 clients: latency percentiles, with the default block cache
//!    and with a 1 MB cache (nearly every read decodes its block).
//! 3. **history stream**: each title's whole history as NDJSON: MB/s of HTML.
//! 4. **dump import**: the aawiki full-history dump of shared/data through
//!    `revstore-dump-import` (8 writers): revisions per second, then the bytes
//!    on disk against the raw wikitext, and a verification pass.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::{DOMAIN, Service, TOKEN, arg, dir_bytes, random_reads};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let titles: usize = arg("--titles").map(|s| s.parse().expect("--titles")).unwrap_or(8);
    let reads: usize = arg("--reads").map(|s| s.parse().expect("--reads")).unwrap_or(5000);
    let html = Arc::new(revstore_testdata::anarchism_html());

    println!("\n## 1. Ingest: {titles} titles x {} revisions of Anarchism HTML, one writer per title\n", html.len());
    let dir = tempfile::tempdir().unwrap();
    let service = Arc::new(Service::start(dir.path(), &[]).await);
    let started = Instant::now();
    common::archive_copies(&service, titles, &html).await;
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

    println!("\n## 2. Random reads of old revisions: {reads} GETs, 4 clients\n");
    println!("| block cache | p50 ms | p99 ms | max ms | reads/s |\n|---|---|---|---|---|");
    let caches: [(&str, &[&str]); 2] =
        [("what the budget leaves (default)", &[]), ("1 MB (nearly every read decodes)", &["--block-cache-mb", "1"])];
    for (label, cache) in caches {
        let service = Arc::new(Service::start(dir.path(), cache).await);
        let html: Arc<Vec<Arc<[u8]>>> = Arc::new(html.iter().map(|h| Arc::from(h.as_bytes())).collect());
        let reads = random_reads(&service, 4, reads, move || {
            let (t, i) = (rand::random_range(0..titles), rand::random_range(0..html.len()));
            (format!("/{DOMAIN}/v1/archive/html/Title_{t}/{}", 1 + i), html[i].clone())
        })
        .await;
        println!("{}", reads.row(label, 2));
        Arc::into_inner(service).unwrap().stop();
    }

    println!("\n## 3. History stream: each title's history as NDJSON, decoded HTML per second\n");
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

    println!("\n## 4. Dump import: aawiki pages-meta-history (shared/data/dumps), 8 writers\n");
    let dir = tempfile::tempdir().unwrap();
    Service::start(dir.path(), &[]).await.stop();
    let empty = dir_bytes(dir.path());
    let service = Service::start(dir.path(), &[]).await;
    let client = revstore_client::OldStoreClient::new(
        revstore_client::HttpClient::new(&service.base, revstore_client::ClientOptions { token: Some(TOKEN.into()), ..Default::default() })
            .unwrap(),
    );
    let dump = revstore_testdata::shared_data().join("dumps/aawiki-20260101-pages-meta-history.xml.7z");
    let options = |mode| revstore_dump_import::ImportOptions {
        dump: dump.clone(),
        domain: None,
        writers: 8,
        mode,
        dependencies: None,
        limits: revstore_dump_import::dump::Limits::default(),
    };
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
