//! What old-store's archive costs on disk *at rest*, against the limit.
//!
//! ```text
//! cargo bench -p revstore-old-store --bench at_rest -- [--revisions 30] [--sections 150] [--copies 20] [--reads 200] [--binary PATH] [--chart SVG]
//! ```
//! For each history: a fresh data directory (its size with the empty schema
//! noted), the real binary, the revisions written one at a time through the
//! API, SIGTERM straight after the last write, a restart on the same
//! directory, a wait until nothing is queued, compacting or owed, a clean stop;
//! then the bytes the directory grew by, against the raw bytes of the history
//! and against `zstd -19 --long=27` over the whole history laid end to end
//! (computed here with the same zstd library: level 19, 128 MiB window, long
//! distance matching) — the limit a store of separately readable revisions
//! can approach. `--binary` measures another build the same way (a build
//! without `/admin/compaction` is taken at rest after two quiet seconds).
//!
//! Histories: the three of shared/data, each alone, all three in one store,
//! and all three under `--copies` titles each (a store of many pages, where
//! the 4 KB page granularity of the embedded engine no longer rounds the
//! figure); and a large page: `--revisions` revisions of `--sections` sections
//! (`revstore_testdata::large_page_history`: real Anarchism HTML sections,
//! letters permuted per section, one real edit per revision; 150 sections are
//! 4.4 MB per revision). Then `--reads` random reads of the large page's
//! revisions, 2 clients, with the default block cache and a 1 MB one.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Service, arg, binary, dir_bytes, random_reads};
use serde_json::json;

/// A history to store: its title, the part its revisions are, and the revisions.
#[derive(Clone)]
struct History {
    name: &'static str,
    title: String,
    part: &'static str,
    revisions: Vec<String>,
}

impl History {
    fn raw(&self) -> u64 {
        self.revisions.iter().map(|r| r.len() as u64).sum()
    }
}

/// `zstd -19 --long=27` of each history laid end to end, summed over the
/// histories: each page compressed whole, the limit a store of separately
/// readable pages can approach. (Over the concatenation of several pages it
/// would be lower still, by what different pages share — Anarchism's
/// wikitext and HTML share their text — which no per-page store uses.)
fn zstd_long_limit(histories: &[&History]) -> u64 {
    // Copies under other titles compress alike: compute each history once.
    let mut by_name = std::collections::HashMap::new();
    histories.iter().map(|h| *by_name.entry(h.name).or_insert_with(|| zstd_long(h))).sum()
}

fn zstd_long(history: &History) -> u64 {
    use zstd::zstd_safe::CParameter;
    let all: Vec<u8> = history.revisions.iter().flat_map(|r| r.as_bytes()).copied().collect();
    let mut c = zstd::bulk::Compressor::new(19).unwrap();
    c.set_parameter(CParameter::WindowLog(27)).unwrap();
    c.set_parameter(CParameter::EnableLongDistanceMatching(true)).unwrap();
    c.compress(&all).unwrap().len() as u64
}

struct AtRest {
    disk: u64,
    ingest: Duration,
    to_rest: Duration,
}

/// Ingests the histories into a fresh store, stops it, restarts it, waits
/// until it is at rest, stops it; what the directory grew by.
async fn at_rest(histories: &[&History], dir: &std::path::Path) -> AtRest {
    Service::start(dir, &[]).await.stop();
    let empty = dir_bytes(dir);
    let service = Service::start(dir, &[]).await;
    let started = Instant::now();
    for h in histories {
        for (i, r) in h.revisions.iter().enumerate() {
            service.archive(&h.title, 1 + i as u64, &json!({ h.part: r })).await;
        }
    }
    let ingest = started.elapsed();
    service.stop();
    let service = Service::start(dir, &[]).await;
    let started = Instant::now();
    service.at_rest().await;
    let to_rest = started.elapsed();
    service.stop();
    AtRest { disk: dir_bytes(dir) - empty, ingest, to_rest }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let revisions: usize = arg("--revisions").map_or(30, |s| s.parse().expect("--revisions"));
    let sections: usize = arg("--sections").map_or(150, |s| s.parse().expect("--sections"));
    let reads: usize = arg("--reads").map_or(200, |s| s.parse().expect("--reads"));
    let copies: usize = arg("--copies").map_or(20, |s| s.parse().expect("--copies"));
    println!("binary: {}\n", binary().display());

    let histories = [
        History {
            name: "enwiki Anarchism, Parsoid HTML",
            title: "Anarchism_html".into(),
            part: "html",
            revisions: revstore_testdata::anarchism_html(),
        },
        History {
            name: "enwiki Anarchism, wikitext",
            title: "Anarchism_wikitext".into(),
            part: "wikitext",
            revisions: revstore_testdata::history("enwiki_Anarchism.wikitext", "wikitext"),
        },
        History {
            name: "webplatform css/font-size, wikitext",
            title: "Font_size".into(),
            part: "wikitext",
            revisions: revstore_testdata::history("webplatform_css_font-size.wikitext", ""),
        },
    ];
    let large = History {
        name: "large page (generated from Anarchism HTML)",
        title: "Large_page".into(),
        part: "html",
        revisions: revstore_testdata::large_page_history(sections, revisions),
    };

    println!("## Bytes on disk at rest (ingested, SIGTERM, restarted, nothing queued, compacting or owed, stopped)\n");
    println!(
        "| history | revisions | raw | on disk | % of raw | zstd -19 --long=27 | % of raw | on disk / zstd | ingest s | restart to rest s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let shared: Vec<&History> = histories.iter().collect();
    let mut cases: Vec<(String, Vec<&History>)> = histories.iter().map(|h| (h.name.to_owned(), vec![h])).collect();
    cases.push(("the three above in one store".to_owned(), shared));
    let many: Vec<History> =
        (0..copies).flat_map(|c| histories.iter().map(move |h| History { title: format!("{}_{c}", h.title), ..h.clone() })).collect();
    cases.push((format!("the three above, {copies} titles each"), many.iter().collect()));
    cases.push((format!("{} ({} sections)", large.name, sections), vec![&large]));
    // For `--chart`: each case's name on the axis, its bytes on disk and the
    // zstd --long limit, both as % of raw.
    let short = ["Anarchism HTML", "Anarchism wikitext", "font-size wikitext", "the three", &format!("the three x{copies}"), "large page"];
    let mut charted = (Vec::new(), Vec::new(), Vec::new());
    let large_dir = tempfile::tempdir().unwrap();
    for (i, (name, set)) in cases.iter().enumerate() {
        let is_large = i == cases.len() - 1;
        let dir = if is_large { large_dir.path().to_owned() } else { tempfile::tempdir().unwrap().keep() };
        let raw: u64 = set.iter().map(|h| h.raw()).sum();
        let count: usize = set.iter().map(|h| h.revisions.len()).sum();
        let result = at_rest(set, &dir).await;
        let limit = zstd_long_limit(set);
        println!(
            "| {name} | {count} | {:.2} MB | {} KB | **{:.2}** | {} KB | {:.2} | **{:.2}x** | {:.1} | {:.1} |",
            raw as f64 / 1e6,
            result.disk / 1000,
            100.0 * result.disk as f64 / raw as f64,
            limit / 1000,
            100.0 * limit as f64 / raw as f64,
            result.disk as f64 / limit as f64,
            result.ingest.as_secs_f64(),
            result.to_rest.as_secs_f64(),
        );
        if !is_large {
            let _ = std::fs::remove_dir_all(&dir);
        }
        charted.0.push(short.get(i).map_or(name.clone(), |s| (*s).to_owned()));
        charted.1.push(100.0 * result.disk as f64 / raw as f64);
        charted.2.push(100.0 * limit as f64 / raw as f64);
    }
    if let Some(path) = arg("--chart") {
        let chart = revstore_bench::chart::BarChart {
            title: "old-store at rest against the zstd --long limit".into(),
            y_label: "% of the raw bytes".into(),
            categories: charted.0,
            series: vec![("old-store on disk".into(), charted.1), ("zstd -19 --long=27, whole history".into(), charted.2)],
        };
        chart.write(std::path::Path::new(&path)).expect("write the chart");
        println!("\nchart: {path}");
    }

    println!("\n## Random reads of the large page's revisions at rest: {reads} GETs, 2 clients\n");
    let mean = large.raw() as f64 / large.revisions.len() as f64 / 1e6;
    println!("revisions of {mean:.1} MB on average\n");
    println!("| block cache | p50 ms | p99 ms | max ms | reads/s |\n|---|---|---|---|---|");
    let caches: [(&str, &[&str]); 2] =
        [("what the budget leaves (default)", &[]), ("1 MB (every read decodes its block and base)", &["--block-cache-mb", "1"])];
    for (label, cache) in caches {
        let service = Arc::new(Service::start(large_dir.path(), cache).await);
        let revisions: Arc<Vec<Arc<[u8]>>> = Arc::new(large.revisions.iter().map(|r| Arc::from(r.as_bytes())).collect());
        let title = large.title.clone();
        let reads = random_reads(&service, 2, reads, move || {
            let i = rand::random_range(0..revisions.len());
            (format!("/{}/v1/archive/html/{title}/{}", common::DOMAIN, 1 + i), revisions[i].clone())
        })
        .await;
        println!("{}", reads.row(label, 1));
        Arc::into_inner(service).unwrap().stop();
    }
}
