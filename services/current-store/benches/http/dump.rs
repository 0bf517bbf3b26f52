//! The bench's dump phase (`--only dump`): a whole domain's dump
//! through `/dump/current`, `--dump-slices` slices at once, its pages and
//! NDJSON bytes per second and the service's peak RSS meanwhile; then the
//! latency of live readers at `--rate` without a dump and beside one. The
//! service runs with `--dump-pages-per-second` from `--dump-rate` (its
//! default when absent): `--dump-rate 0` measures what a dump can do, the
//! default what readers see beside one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use revstore_bench::OpenLoop;
use revstore_bench::procfs::PeakRss;

use super::reads::read_latest_html;
use super::write_row;

/// What one dump of the whole domain took.
pub struct Dumped {
    pub pages: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub peak_rss_kib: u64,
}

/// Dumps the domain in `slices` slices at once, each stream read to its end line.
pub async fn dump_domain(http: &reqwest::Client, base: &str, slices: u32, pid: u32) -> Dumped {
    let (pages, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let peak = PeakRss::start(pid);
    let started = Instant::now();
    let streams = (0..slices).map(|k| {
        let (http, pages, bytes) = (http.clone(), pages.clone(), bytes.clone());
        let url = format!("{base}/en.wikipedia.org/v1/dump/current?slice={k}/{slices}");
        tokio::spawn(async move {
            let mut answer = http.get(url).send().await.expect("dump request");
            assert_eq!(answer.status(), 200);
            let mut ended = false;
            while let Some(chunk) = answer.chunk().await.expect("dump stream") {
                bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                let lines = chunk.iter().filter(|&&b| b == b'\n').count() as u64;
                pages.fetch_add(lines, Ordering::Relaxed);
                ended |= chunk.windows(12).any(|w| w == b"{\"done\":true");
            }
            assert!(ended, "a dump stream ended without its end line");
            // The end line is not a page.
            pages.fetch_sub(1, Ordering::Relaxed);
        })
    });
    for stream in streams.collect::<Vec<_>>() {
        stream.await.expect("dump task");
    }
    Dumped {
        pages: pages.load(Ordering::Relaxed),
        bytes: bytes.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
        peak_rss_kib: peak.kib(),
    }
}

/// What the dump phase runs: `slices` at once, readers at `read_rate` for `seconds`.
pub struct Plan {
    pub slices: u32,
    pub read_rate: u64,
    pub seconds: u64,
}

/// The dump alone, then readers alone, then readers beside a dump: rows for the table.
pub async fn measure(engine: &str, http: &reqwest::Client, base: &str, pid: u32, titles: &Arc<Vec<String>>, plan: Plan) -> Vec<String> {
    let Plan { slices, read_rate, seconds } = plan;
    let mut rows = Vec::new();
    let alone = dump_domain(http, base, slices, pid).await;
    assert_eq!(alone.pages, titles.len() as u64, "the dump holds every page once");
    rows.push(format!(
        "| {engine} | dump of {} pages, {slices} slices | {} | {:.0} pages/s | {:.1} MB/s of NDJSON | peak service RSS {:.0} MB |",
        alone.pages,
        alone.pages,
        alone.pages as f64 / alone.seconds,
        alone.bytes as f64 / 1e6 / alone.seconds,
        alone.peak_rss_kib as f64 / 1024.0
    ));
    let quiet = read_latest_html(http, base, titles, read_rate, seconds).await;
    rows.push(write_row(engine, &format!("readers alone, fixed {read_rate}/s"), &quiet, ""));
    let dumping = tokio::spawn({
        let (http, base) = (http.clone(), base.to_owned());
        async move { dump_domain(&http, &base, slices, pid).await }
    });
    let beside = read_latest_html(http, base, titles, read_rate, seconds).await;
    let p99 = |run: &OpenLoop| run.latencies[run.latencies.len() * 99 / 100].as_secs_f64() * 1e3;
    let ratio = format!(" p99 beside a dump / alone: {:.2}", p99(&beside) / p99(&quiet));
    rows.push(write_row(engine, &format!("readers beside a dump ({slices} slices), fixed {read_rate}/s"), &beside, &ratio));
    let during = dumping.await.expect("dump beside readers");
    rows.push(format!(
        "| {engine} | the dump beside the readers | {} | {:.0} pages/s | | |",
        during.pages,
        during.pages as f64 / during.seconds
    ));
    rows
}
