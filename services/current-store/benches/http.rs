//! current-store under load, over HTTP, with the load generator on the same
//! machine (as the service's targets are stated).
//!
//! ```text
//! cargo bench -p revstore-current-store --bench http -- [--engine embedded|cassandra] [--rate R[,R...]]
//!     [--write-rate W[,W...]] [--only reads|writes] [--seconds N] [--pages N] [--html-bytes MIN-MAX] [--binary PATH]
//!     [--service-log LEVEL [--access-log-every N]] [--settle-secs N]
//!     [--overload R[,R...]] [--overload-writes W[,W...]] [--max-in-flight N] [--chart SVG]
//!     [--renders-per-page N]
//! ```
//! It starts the real `revstore-current-store` binary as a separate process
//! (or `--binary`, e.g. an older build, to compare two side by side),
//! stores `--pages` pages with real Parsoid HTML (30-100 KB revisions of
//! "Anarchism" from shared/data), then measures, in one run:
//! 1. reads of the latest HTML at fixed rates (`--rate`, default 1,000/s): latency counted
//!    from each request's scheduled send time, so queueing shows; on
//!    Cassandra each rate also as reads of a plain key-value service over
//!    HTTP (one SELECT a request, `http/plain_kv.rs`) of the same pages;
//!    `--renders-per-page N` loads each page N times, as a page holds its
//!    superseded renders through the grace period;
//! 2. reads of the latest HTML at saturation (32 connections);
//! 3. the same reads straight from the `Store` in-process (after the service
//!    stops, on the same data): the ratio of 2 to 3 is the HTTP stack's cost;
//! 4. writes of new renders at saturation (32 writers), then a precedence check;
//! 5. writes at fixed rates (`--write-rate`, open loop like 1.), half new revisions
//!    and half re-renders of a page's latest revision, spread over all pages;
//!    on Cassandra with the node's and the service's CPU per write, and then
//!    the baselines: the same rates, each write one plain INSERT of the page's
//!    HTML through the same driver into the same node (its CPU per write too),
//!    in this process and through the plain key-value service over HTTP;
//!    between the two, the service's own write path called in this process
//!    (`Pages::put`, no HTTP) at the same rate. The service keeps superseded
//!    renders `--grace-secs` (default 5; a write deletes nothing, so this sets
//!    only what the bench's reads of superseded renders find). `--chart SVG` draws each one's p99 against the offered rate.
//! 7. on Cassandra, `--churn-pages N` (with `--churn-renders R`, default 60, at
//!    `--churn-rate`, default 200/s): N pages each rendered R times, a new
//!    revision every third render, through the service;
//!    then (after `nodetool flush` when `--nodetool CMD` is given) every
//!    page's reads traced — the latest, a superseded render by revision and by
//!    tid (a write reads nothing) — with the live rows and tombstones each
//!    met, and each table's size on disk.
//!
//! 6. overload (`--overload`, `--overload-writes`): reads or writes offered
//!    open loop well past saturation, each answer classed as a success, shed
//!    (503 `overloaded`) or another failure (connection errors, timeouts),
//!    with the p99 of every answer and the service's peak RSS. `--max-in-flight`
//!    passes the service's limit (a huge one turns shedding off, to compare);
//!    `--client-connections N` holds the clients to N connections.
//!
//! 8. `--only dump`: a dump of the whole domain through `/dump/current`
//!    (`--dump-slices`, default 2) alone, then readers at `--rate` without and
//!    beside one; `--dump-rate R` starts the service with
//!    `--dump-pages-per-second R` (0: no limit; absent: its default).
//!
//! `--only writes` runs 5. alone (`--only reads`: 1. to 3.), `--only overload` 6. alone.
//!
//! Cassandra uses `$REVSTORE_CASSANDRA` (default 127.0.0.1:9042).

#![allow(clippy::print_stdout)]

#[path = "http/churn.rs"]
mod churn;
#[path = "http/dump.rs"]
mod dump;
#[path = "http/overload.rs"]
mod overload;
#[path = "http/plain_kv.rs"]
mod plain_kv;
#[path = "http/reads.rs"]
mod reads;
#[path = "http/trace.rs"]
mod trace;
#[path = "http/writes.rs"]
mod writes;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use revstore_bench::{OpenLoop, arg, percentile_ms};
use revstore_current_store::RenderBody;
use revstore_keys::Tid;
use revstore_storage::{CassandraOptions, EmbeddedOptions, StorageSettings};

const TOKEN: &str = "current-store-bench-token";
const CONCURRENCY: usize = 32;

/// The service under measurement and what every phase reads and writes.
struct Bench {
    /// `embedded` or `cassandra`.
    engine: String,
    http: reqwest::Client,
    /// The service's URL, `http://127.0.0.1:PORT`.
    base: String,
    pid: u32,
    /// The pages loaded before the phases, each with one render.
    titles: Arc<Vec<String>>,
    /// Real page HTML, the renders' bodies in turn.
    html: Arc<Vec<String>>,
    seconds: u64,
    /// The Cassandra node (`$REVSTORE_CASSANDRA`) and the bench's keyspace.
    node: String,
    keyspace: String,
    /// The service's grace period for superseded renders.
    grace: Duration,
    /// The embedded engine's data directory.
    dir: tempfile::TempDir,
    /// On Cassandra, the plain key-value service over HTTP beside it.
    plain_kv: Option<plain_kv::PlainKv>,
    /// Lines printed after the results table.
    notes: std::sync::Mutex<Vec<String>>,
}

/// The bar a rate is held to: p99 at most this, and no request failed.
const HELD_P99_MS: f64 = 100.0;

/// The highest offered rate of `runs` (rate, p99 ms, failures) held to the bar.
fn held_rate(runs: &[(u64, f64, usize)]) -> Option<u64> {
    runs.iter().filter(|(_, p99, failed)| *p99 <= HELD_P99_MS && *failed == 0).map(|(rate, _, _)| *rate).max()
}

impl Bench {
    /// Notes what `what` held to the bar, against the plain service's rate.
    fn note_held(&self, what: &str, service: &[(u64, f64, usize)], plain: &[(u64, f64, usize)]) {
        let show = |r: Option<u64>| r.map_or("none of the rates".to_owned(), |r| format!("{r}/s"));
        let (ours, theirs) = (held_rate(service), held_rate(plain));
        let ratio = match (ours, theirs) {
            (Some(o), Some(t)) => format!(" ({:.2}x; only the rates offered are known)", o as f64 / t as f64),
            _ => String::new(),
        };
        self.notes.lock().expect("notes").push(format!(
            "{what} held to p99 ≤ {HELD_P99_MS} ms with no failure: current-store {}, the plain service {}{ratio}",
            show(ours),
            show(theirs)
        ));
    }
}

impl Bench {
    /// Where the service's data is, for reading it in this process once the service has stopped.
    fn storage(&self) -> StorageSettings {
        match self.engine.as_str() {
            "embedded" => StorageSettings::Embedded { data_dir: self.dir.path().join("data"), options: EmbeddedOptions::default() },
            _ => StorageSettings::Cassandra(CassandraOptions::new([self.node.clone()], self.keyspace.clone())),
        }
    }
}

/// Real page HTML: the "Anarchism" revisions whose size is in `--html-bytes`
/// (default 30-100 KB).
fn renders() -> Vec<String> {
    let bounds = arg("--html-bytes").unwrap_or_else(|| "30000-100000".into());
    let (min, max) = bounds.split_once('-').expect("--html-bytes MIN-MAX");
    let (min, max): (usize, usize) = (min.parse().expect("--html-bytes MIN"), max.parse().expect("--html-bytes MAX"));
    let all = revstore_testdata::anarchism_html();
    let sized: Vec<String> = all.iter().filter(|h| (min..=max).contains(&h.len())).cloned().collect();
    assert!(!sized.is_empty(), "no revision of {min}-{max} bytes");
    sized
}

fn rates(name: &str, default: &str) -> Vec<u64> {
    arg(name).unwrap_or_else(|| default.into()).split(',').map(|r| r.trim().parse().expect(name)).collect()
}

fn body(html: &str, n: u64) -> RenderBody {
    RenderBody {
        html: html.to_owned(),
        data_parsoid: serde_json::json!({ "counter": n, "ids": {} }),
        section_offsets: serde_json::json!({ "mwAQ": { "html": [0, 10], "wt": [0, 5] } }),
    }
}

/// A render written through the service's API: whether it was stored (201).
async fn put_render(http: &reqwest::Client, base: &str, title: &str, rev: u64, body: &RenderBody) -> bool {
    let sent = http.put(format!("{base}/en.wikipedia.org/v1/page/{title}/{rev}/{}", Tid::now())).bearer_auth(TOKEN).json(body).send().await;
    sent.is_ok_and(|r| r.status() == 201)
}

/// A row of the results table for an open-loop run, with its failures and `extra` after it.
fn write_row(engine: &str, what: &str, run: &OpenLoop, extra: &str) -> String {
    format!(
        "| {engine} | {what} | {} | {:.0} | {:.2} | {:.2} |{}{extra}",
        run.latencies.len(),
        run.achieved,
        percentile_ms(&run.latencies, 0.5),
        percentile_ms(&run.latencies, 0.99),
        if run.failed > 0 { format!(" {} failed", run.failed) } else { String::new() },
    )
}

/// A row of the results table for a run at saturation.
fn saturation_row(engine: &str, what: &str, per_second: f64, latencies: &[Duration]) -> String {
    format!(
        "| {engine} | {what} | {} | {per_second:.0} | {:.2} | {:.2} |",
        latencies.len(),
        percentile_ms(latencies, 0.5),
        percentile_ms(latencies, 0.99)
    )
}

/// Starts the service (`--binary`, or this build's) on a port it picks, on
/// `--engine`, and loads `--pages` pages, one render each; then lets the
/// node settle (`--settle-secs`).
async fn start() -> (Bench, revstore_bench::Process) {
    let engine = arg("--engine").unwrap_or_else(|| "embedded".into());
    let dir = tempfile::tempdir().expect("tempdir");
    let keyspace = format!("bench_current_{}", std::process::id());
    let node = std::env::var("REVSTORE_CASSANDRA").unwrap_or_else(|_| "127.0.0.1:9042".into());
    let grace = Duration::from_secs(arg("--grace-secs").map_or(5, |s| s.parse().expect("--grace-secs")));
    let binary = arg("--binary").unwrap_or_else(|| env!("CARGO_BIN_EXE_revstore-current-store").to_owned());
    println!("binary: {binary}");
    let mut cmd = Command::new(&binary);
    cmd.args(["--listen", "127.0.0.1:0", "--write-tokens", TOKEN, "--shutdown-delay-secs", "0", "--migrate-on-start", "true"])
        .args(["--grace-ttl", &grace.as_secs().to_string(), "--clock-skew", "0"])
        .args(arg("--max-in-flight").map(|n| vec!["--max-in-flight".to_owned(), n]).unwrap_or_default())
        .args(arg("--dump-rate").map(|n| vec!["--dump-pages-per-second".to_owned(), n]).unwrap_or_default())
        // `--service-log info` (with `--access-log-every N`) measures what
        // logging costs: the service's log goes to a file, as in a pod.
        .env("RUST_LOG", arg("--service-log").unwrap_or_else(|| "warn".into()))
        .env("REVSTORE_ACCESS_LOG_EVERY", arg("--access-log-every").unwrap_or_else(|| "100".into()));
    match engine.as_str() {
        "embedded" => cmd.args(["--data-dir", dir.path().join("data").to_str().expect("utf-8")]),
        "cassandra" => cmd.args(["--cassandra", &node, "--keyspace", &keyspace]),
        other => panic!("unknown engine {other:?}"),
    };
    let (service, addresses) = revstore_bench::start_service(cmd, &dir.path().join("service.log"), &["current-store"]).await;
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().expect("client");
    let pages: usize = arg("--pages").map(|s| s.parse().expect("--pages")).unwrap_or(200);
    let bench = Bench {
        engine,
        http,
        base: format!("http://{}", addresses[0]),
        pid: service.pid(),
        titles: Arc::new((0..pages).map(|i| format!("Bench_page_{i}")).collect()),
        html: Arc::new(renders()),
        seconds: arg("--seconds").map(|s| s.parse().expect("--seconds")).unwrap_or(10),
        node,
        keyspace,
        grace,
        dir,
        plain_kv: None,
        notes: std::sync::Mutex::default(),
    };

    // Load: `--renders-per-page` renders of revision 1 of each page (default
    // one; more stand for the superseded renders a page holds through its
    // grace period), 32 at a time.
    let renders_per_page: usize = arg("--renders-per-page").map_or(1, |n| n.parse().expect("--renders-per-page"));
    let loads = (0..renders_per_page).flat_map(|_| bench.titles.iter().enumerate()).map(|(i, t)| {
        let request = bench.http.post(format!("{}/en.wikipedia.org/v1/page/{t}/1", bench.base)).bearer_auth(TOKEN);
        let request = request.json(&body(&bench.html[i % bench.html.len()], 0));
        async move {
            let r = request.send().await.expect("load");
            assert_eq!(r.status(), 201);
        }
    });
    futures_util::stream::iter(loads).buffer_unordered(CONCURRENCY).collect::<Vec<()>>().await;
    // Let the node flush and compact what the load wrote before measuring
    // (`--settle-secs`, default 30; the load of the faster build otherwise
    // leaves more of that work for its first measurement).
    let mut bench = bench;
    if bench.engine == "cassandra" && matches!(arg("--only").as_deref(), None | Some("reads") | Some("writes")) {
        bench.plain_kv = Some(plain_kv::PlainKv::start(&bench).await);
    }
    let settle: u64 = arg("--settle-secs").map(|s| s.parse().expect("--settle-secs")).unwrap_or(30);
    tokio::time::sleep(Duration::from_secs(settle)).await;
    (bench, service)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if let Some(node) = arg("--serve-plain-kv") {
        plain_kv::serve(&node, &arg("--keyspace").expect("--keyspace")).await;
        return;
    }
    let (bench, service) = start().await;
    let only = arg("--only");
    let (measure_reads, measure_writes) = match only.as_deref() {
        Some("overload" | "dump") => (false, false),
        only => (only != Some("writes"), only != Some("reads")),
    };
    let mut rows = Vec::new();
    // 8. Dumps (`--only dump`).
    if only.as_deref() == Some("dump") {
        let plan = dump::Plan {
            slices: arg("--dump-slices").map_or(2, |n| n.parse().expect("--dump-slices")),
            read_rate: rates("--rate", "1000")[0],
            seconds: bench.seconds,
        };
        rows.extend(dump::measure(&bench.engine, &bench.http, &bench.base, bench.pid, &bench.titles, plan).await);
    }
    // 1. Reads at fixed rates.
    if measure_reads {
        rows.extend(reads::at_fixed_rates(&bench).await);
    }
    // 5. Writes at fixed rates, beside the plain-INSERT baseline.
    if measure_writes {
        rows.extend(writes::at_fixed_rates(&bench).await);
    }
    // 7. Churn: hot pages through the service, then what their reads meet.
    let (churn_row, churn_traced) = churn::measure(&bench).await;
    rows.extend(churn_row);
    // 6. Overload: reads, then writes, past saturation, every answer classed.
    let overload_rows = overload::measure(&bench).await;
    // 2. Reads at saturation over HTTP.
    let mut http_per_second = None;
    if measure_reads {
        let (row, per_second) = reads::at_saturation(&bench).await;
        rows.push(row);
        http_per_second = Some(per_second);
    }
    // 4. Writes at saturation (before the service stops).
    let mut newest_rev = None;
    if measure_writes {
        let (row, newest) = writes::at_saturation(&bench).await;
        rows.push(row);
        newest_rev = Some(newest);
    }
    drop(service);

    // 3. The same reads straight from the Store, in this process; precedence after the writes.
    let store = revstore_storage::open(bench.storage()).await.expect("open store");
    if let Some(newest) = newest_rev {
        writes::check_precedence(&store, &bench.titles, newest).await;
    }
    let mut ratio = None;
    if let Some(over_http) = http_per_second {
        let (row, in_process) = reads::from_the_store(&bench, store).await;
        rows.push(row);
        ratio = Some(over_http / in_process);
    }
    if bench.engine == "cassandra" {
        let options = CassandraOptions::new([bench.node.clone()], bench.keyspace.clone());
        let engine = revstore_storage::CassandraEngine::connect(options).await.expect("connect");
        engine.session().query_unpaged(format!("DROP KEYSPACE \"{}\"", bench.keyspace), ()).await.expect("drop the bench keyspace");
    }

    let avg_kb = bench.titles.iter().enumerate().map(|(i, _)| bench.html[i % bench.html.len()].len()).sum::<usize>() as f64
        / bench.titles.len() as f64
        / 1024.0;
    println!("pages: {}, average render {avg_kb:.0} KiB of HTML, {} s per measurement\n", bench.titles.len(), bench.seconds);
    println!("| engine | measurement | requests | per second | p50 ms | p99 ms |\n|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    for note in bench.notes.lock().expect("notes").iter() {
        println!("\n{note}");
    }
    churn::print(churn_traced);
    if let Some(ratio) = ratio {
        println!("\nHTTP reads at saturation / in-process Store reads: {ratio:.2}");
    }
    overload::print(overload_rows);
}
