//! current-store under load, over HTTP, with the load generator on the same
//! machine (as the service's targets are stated).
//!
//! ```text
//! cargo bench -p revstore-current-store --bench http -- [--engine embedded|cassandra] [--rate R[,R...]]
//!     [--write-rate W[,W...]] [--only reads|writes] [--seconds N] [--pages N] [--html-bytes MIN-MAX] [--binary PATH]
//!     [--service-log LEVEL [--access-log-every N]] [--settle-secs N]
//!     [--overload R[,R...]] [--overload-writes W[,W...]] [--max-in-flight N]
//! ```
//! It starts the real `revstore-current-store` binary as a separate process
//! (or `--binary`, e.g. an older build, to compare two side by side),
//! stores `--pages` pages with real Parsoid HTML (30-100 KB revisions of
//! "Anarchism" from shared/data), then measures, in one run:
//! 1. reads of the latest HTML at fixed rates (`--rate`, default 1,000/s): latency counted
//!    from each request's scheduled send time, so queueing shows;
//! 2. reads of the latest HTML at saturation (32 connections);
//! 3. the same reads straight from the `Store` in-process (after the service
//!    stops, on the same data): the ratio of 2 to 3 is the HTTP stack's cost;
//! 4. writes of new renders at saturation (32 writers), then a precedence check;
//! 5. writes at fixed rates (`--write-rate`, open loop like 1.), half new revisions
//!    and half re-renders of a page's latest revision, spread over all pages;
//!    on Cassandra with the node's and the service's CPU per write, and then
//!    the baseline: the same rates, each write one plain INSERT of the page's
//!    HTML through the same driver into the same node (its CPU per write too);
//!    between the two, the service's own write path called in this process
//!    (`Pages::put`, no HTTP) at the same rate. The service keeps superseded
//!    renders `--grace-secs` (default 5, with no clock-skew allowance: most
//!    writes of a page then find something to delete, as in a wiki's steady
//!    state).
//! 7. on Cassandra, `--churn-pages N` (with `--churn-renders R`, default 60, at
//!    `--churn-rate`, default 200/s): N pages each rendered R times, a new
//!    revision every third render, through the service;
//!    then (after `nodetool flush` when `--nodetool CMD` is given) every
//!    page's reads traced — the latest, a superseded render by revision and by
//!    tid, a write's read of the page's keys — with the live rows and tombstones each
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

#[path = "http/trace.rs"]
mod trace;

#[path = "http/dump.rs"]
mod dump;

use std::process::{Command, Stdio};

use futures_util::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use revstore_bench::procfs::{PeakRss, cpu_seconds};
use revstore_bench::{OpenLoop, arg, open_loop, percentile_ms, saturate};
use revstore_current_store::{Pages, RenderBody, decode_part};
use revstore_keys::{Domain, Tid, Title, TitleRules};
use revstore_storage::{CassandraOptions, EmbeddedOptions, StorageSettings};

const TOKEN: &str = "current-store-bench-token";
const CONCURRENCY: usize = 32;

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

/// How an answer under overload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Success,
    Shed,
    Failed,
}

fn classify(result: Result<reqwest::Response, reqwest::Error>, success: u16) -> Answer {
    match result {
        Ok(r) if r.status().as_u16() == success => Answer::Success,
        Ok(r) if r.status() == 503 => Answer::Shed,
        other => {
            let why = match &other {
                Ok(r) => format!("status {}", r.status()),
                Err(e) if e.is_timeout() => "timeout".to_owned(),
                Err(e) => {
                    // The innermost cause names it (refused, reset, too many open files).
                    let mut cause: &dyn std::error::Error = e;
                    while let Some(inner) = cause.source() {
                        cause = inner;
                    }
                    let kind = if e.is_connect() { "connect" } else { "request" };
                    format!("{kind}: {cause}").chars().take(100).collect()
                }
            };
            FAILURES.lock().expect("failures").entry(why).and_modify(|n| *n += 1).or_insert(1);
            Answer::Failed
        }
    }
}

/// Failures under overload by kind, printed with the results.
static FAILURES: std::sync::Mutex<std::collections::BTreeMap<String, usize>> = std::sync::Mutex::new(std::collections::BTreeMap::new());

/// [`open_loop`] with every answer classed; latencies of all answers and of
/// the successes, and the largest RSS of `pid` seen meanwhile.
async fn open_loop_classified<F, Fut>(rate: u64, seconds: u64, pid: u32, op: F) -> (OpenLoop, [usize; 3], Vec<Duration>, u64)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Answer> + Send + 'static,
{
    let answers = Arc::new(std::sync::Mutex::new(Vec::with_capacity((rate * seconds) as usize)));
    let peak_rss = PeakRss::start(pid);
    let op = Arc::new(op);
    // `--client-connections N`: the clients hold at most N requests (so N
    // connections) at once, as a fleet of pooled clients or a proxy would;
    // the rest wait on the client side, and their wait counts in the latency.
    let (service_cpu, generator_cpu) = (cpu_seconds(&pid.to_string()), cpu_seconds("self"));
    let connections = arg("--client-connections").map(|n| Arc::new(tokio::sync::Semaphore::new(n.parse().expect("--client-connections"))));
    let run = open_loop(rate, seconds, {
        let answers = answers.clone();
        move |i| {
            let (op, answers, connections) = (op.clone(), answers.clone(), connections.clone());
            async move {
                let started = Instant::now();
                let _connection = match &connections {
                    Some(c) => Some(c.clone().acquire_owned().await.expect("semaphore")),
                    None => None,
                };
                let answer = op(i).await;
                answers.lock().expect("answers").push((answer, started.elapsed()));
                answer == Answer::Success
            }
        }
    })
    .await;
    println!(
        "cpu over the run at {rate}/s: service {:.1} s, load generator {:.1} s",
        cpu_seconds(&pid.to_string()) - service_cpu,
        cpu_seconds("self") - generator_cpu
    );
    let answers = answers.lock().expect("answers");
    let mut counts = [0usize; 3];
    let mut successes = Vec::new();
    for (answer, latency) in answers.iter() {
        counts[*answer as usize] += 1;
        if *answer == Answer::Success {
            successes.push(*latency);
        }
    }
    successes.sort();
    (run, counts, successes, peak_rss.kib())
}

/// A row of the results table for an open-loop run of writes, with its failures and `extra` after it.
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

/// The local Cassandra node's process, found by its main class (the bench
/// runs beside the node it measures).
fn cassandra_pid() -> Option<String> {
    std::fs::read_dir("/proc").ok()?.filter_map(Result::ok).find_map(|entry| {
        let name = entry.file_name().into_string().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        String::from_utf8_lossy(&cmdline).contains("org.apache.cassandra.service.CassandraDaemon").then_some(name)
    })
}

/// A session on the node, with the baseline's table in the bench keyspace:
/// the consistency the service writes at (LOCAL_QUORUM), the driver's defaults otherwise.
async fn plain_kv(node: &str, keyspace: &str) -> scylla::client::session::Session {
    use scylla::client::execution_profile::ExecutionProfile;
    let profile = ExecutionProfile::builder().consistency(scylla::statement::Consistency::LocalQuorum).build();
    let session = scylla::client::session_builder::SessionBuilder::new()
        .known_node(node)
        .default_execution_profile_handle(profile.into_handle())
        .build()
        .await
        .expect("connect for the baseline");
    session
        .query_unpaged(format!("CREATE TABLE IF NOT EXISTS \"{keyspace}\".plain_kv (key text PRIMARY KEY, value blob)"), ())
        .await
        .expect("create the baseline's table");
    session
}

/// Readers of the pages' latest HTML at `rate` for `seconds` (open loop).
async fn read_latest_html(http: &reqwest::Client, base: &str, titles: &Arc<Vec<String>>, rate: u64, seconds: u64) -> OpenLoop {
    let (http, base, titles) = (http.clone(), base.to_owned(), titles.clone());
    open_loop(rate, seconds, move |i| {
        let (http, base, titles) = (http.clone(), base.clone(), titles.clone());
        async move {
            let t = &titles[(i as usize * 7919) % titles.len()];
            match http.get(format!("{base}/en.wikipedia.org/v1/page/html/{t}")).send().await {
                Ok(r) => r.status() == 200 && r.bytes().await.is_ok(),
                Err(_) => false,
            }
        }
    })
    .await
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
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
    let grace = Duration::from_secs(arg("--grace-secs").map_or(5, |s| s.parse().expect("--grace-secs")));
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
        "--grace-ttl",
        &grace.as_secs().to_string(),
        "--clock-skew",
        "0",
    ])
    // `--service-log info` (with `--access-log-every N`) measures what logging
    // costs: the service's log goes to a file, as in a pod.
    .args(arg("--max-in-flight").map(|n| vec!["--max-in-flight".to_owned(), n]).unwrap_or_default())
    .args(arg("--dump-rate").map(|n| vec!["--dump-pages-per-second".to_owned(), n]).unwrap_or_default())
    .env("RUST_LOG", arg("--service-log").unwrap_or_else(|| "warn".into()))
    .env("REVSTORE_ACCESS_LOG_EVERY", arg("--access-log-every").unwrap_or_else(|| "100".into()))
    .stdout(Stdio::null())
    .stderr(match arg("--service-log") {
        Some(_) => Stdio::from(std::fs::File::create(dir.path().join("service.log")).expect("log file")),
        None => Stdio::inherit(),
    });
    match engine.as_str() {
        "embedded" => cmd.args(["--data-dir", dir.path().to_str().expect("utf-8")]),
        "cassandra" => cmd.args(["--cassandra", &node, "--keyspace", &keyspace]),
        other => panic!("unknown engine {other:?}"),
    };
    let service = revstore_bench::Process(cmd.spawn().expect("start revstore-current-store"));
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().expect("client");
    let started = Instant::now();
    while !http.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status() == 200) {
        assert!(started.elapsed() < Duration::from_secs(120), "service not ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Load: one render per page, 32 at a time.
    let titles: Vec<String> = (0..pages_n).map(|i| format!("Bench_page_{i}")).collect();
    let loads = titles.iter().enumerate().map(|(i, t)| {
        let request = http.post(format!("{base}/en.wikipedia.org/v1/page/{t}/1")).bearer_auth(TOKEN).json(&body(&html[i % html.len()], 0));
        async move {
            let r = request.send().await.expect("load");
            assert_eq!(r.status(), 201);
        }
    });
    futures_util::stream::iter(loads).buffer_unordered(CONCURRENCY).collect::<Vec<()>>().await;
    // Let the node flush and compact what the load wrote before measuring
    // (`--settle-secs`, default 30; the load of the faster build otherwise
    // leaves more of that work for its first measurement).
    let settle: u64 = arg("--settle-secs").map(|s| s.parse().expect("--settle-secs")).unwrap_or(30);
    tokio::time::sleep(Duration::from_secs(settle)).await;
    let avg_kb = titles.iter().enumerate().map(|(i, _)| html[i % html.len()].len()).sum::<usize>() as f64 / titles.len() as f64 / 1024.0;
    let titles = Arc::new(titles);
    let mut rows = Vec::new();

    let only = arg("--only");
    let (measure_reads, measure_writes) = match only.as_deref() {
        Some("overload" | "dump") => (false, false),
        only => (only != Some("writes"), only != Some("reads")),
    };

    // 8. Dumps (`--only dump`).
    if only.as_deref() == Some("dump") {
        let plan = dump::Plan {
            slices: arg("--dump-slices").map_or(2, |n| n.parse().expect("--dump-slices")),
            read_rate: rates("--rate", "1000")[0],
            seconds,
        };
        rows.extend(dump::measure(&engine, &http, &base, service.0.id(), &titles, plan).await);
    }

    // 1. Fixed rates.
    for rate in rates("--rate", "1000").into_iter().filter(|_| measure_reads) {
        let run = read_latest_html(&http, &base, &titles, rate, seconds).await;
        rows.push(format!(
            "| {engine} | read latest HTML, fixed {rate}/s | {} | {:.0} | {:.2} | {:.2} |{}",
            run.latencies.len(),
            run.achieved,
            percentile_ms(&run.latencies, 0.5),
            percentile_ms(&run.latencies, 0.99),
            if run.failed > 0 { format!(" {} failed", run.failed) } else { String::new() }
        ));
    }

    // 5. Writes at fixed rates: half new revisions, half re-renders of the
    // page's latest revision (a wiki re-renders when templates change).
    let page_revs: Arc<Vec<AtomicU64>> = Arc::new((0..pages_n).map(|_| AtomicU64::new(1)).collect());
    let node_pid = (engine == "cassandra").then(cassandra_pid).flatten();
    let service_pid = service.0.id().to_string();
    // CPU per write over a run: the node's and the service's (or the bench's own, for the baseline).
    let cpu_per_write = |before: (f64, f64), writes: usize, own: &str| {
        let node = node_pid.as_deref().map_or(0.0, cpu_seconds) - before.0;
        let other = cpu_seconds(own) - before.1;
        (node * 1000.0 / writes.max(1) as f64, other * 1000.0 / writes.max(1) as f64)
    };
    // The baseline, on Cassandra, run after the renders at each rate: the same
    // open loop, each write one INSERT of a page's HTML (the same bytes,
    // uncompressed) into a plain key-value table, through the same driver, at
    // the same consistency, on the same node — what a render write is measured against.
    let baseline = match (&node_pid, measure_writes) {
        (Some(_), true) => {
            let session = Arc::new(plain_kv(&node, &keyspace).await);
            let insert = session.prepare(format!("INSERT INTO \"{keyspace}\".plain_kv (key, value) VALUES (?, ?)")).await;
            Some((session, Arc::new(insert.expect("prepare the baseline"))))
        }
        _ => None,
    };
    // The service's design called in this process too (`Pages::put` on the
    // Store, no HTTP), on another domain's pages: the control that tells the
    // design's cost from the HTTP service's.
    let in_process = match &baseline {
        Some(_) => {
            let store = revstore_storage::open(StorageSettings::Cassandra(CassandraOptions::new([node.clone()], keyspace.clone())))
                .await
                .expect("open the store in-process");
            let pages = Arc::new(Pages { store, grace, clock_skew: Duration::ZERO, hand_off: true, notify_graph: false });
            let loads = titles.iter().enumerate().map(|(i, t)| {
                let (pages, html) = (pages.clone(), &html);
                async move { in_process_put(&pages, t, 1, &body(&html[i % html.len()], 0)).await.expect("load in-process") }
            });
            futures_util::stream::iter(loads).buffer_unordered(CONCURRENCY).collect::<Vec<_>>().await;
            Some(pages)
        }
        None => None,
    };
    let in_process_revs: Arc<Vec<AtomicU64>> = Arc::new((0..pages_n).map(|_| AtomicU64::new(1)).collect());
    for rate in rates("--write-rate", "500,1000,1500").into_iter().filter(|_| measure_writes) {
        let cpu_before = (node_pid.as_deref().map_or(0.0, cpu_seconds), cpu_seconds(&service_pid));
        let run = open_loop(rate, seconds, {
            let (http, base, titles, html, page_revs) =
                (http.clone(), base.clone(), titles.clone(), Arc::new(html.clone()), page_revs.clone());
            move |i| {
                let (http, base, titles, html, page_revs) = (http.clone(), base.clone(), titles.clone(), html.clone(), page_revs.clone());
                async move {
                    let p = (i as usize * 7919) % titles.len();
                    let rev =
                        if i % 2 == 0 { page_revs[p].fetch_add(1, Ordering::SeqCst) + 1 } else { page_revs[p].load(Ordering::SeqCst) };
                    put_render(&http, &base, &titles[p], rev, &body(&html[i as usize % html.len()], rev)).await
                }
            }
        })
        .await;
        let (node_ms, service_ms) = cpu_per_write(cpu_before, run.latencies.len() - run.failed, &service_pid);
        let cpu = node_pid.as_ref().map(|_| format!(" CPU per stored write: node {node_ms:.2} ms, service {service_ms:.2} ms"));
        rows.push(write_row(&engine, &format!("write renders (1/2 new revisions), fixed {rate}/s"), &run, &cpu.unwrap_or_default()));
        if let Some(pages) = &in_process {
            let cpu_before = (node_pid.as_deref().map_or(0.0, cpu_seconds), cpu_seconds("self"));
            let run = open_loop(rate, seconds, {
                let (pages, titles, html, revs) = (pages.clone(), titles.clone(), Arc::new(html.clone()), in_process_revs.clone());
                move |i| {
                    let (pages, titles, html, revs) = (pages.clone(), titles.clone(), html.clone(), revs.clone());
                    async move {
                        let p = (i as usize * 7919) % titles.len();
                        let rev = if i % 2 == 0 { revs[p].fetch_add(1, Ordering::SeqCst) + 1 } else { revs[p].load(Ordering::SeqCst) };
                        in_process_put(&pages, &titles[p], rev, &body(&html[i as usize % html.len()], rev)).await.is_ok()
                    }
                }
            })
            .await;
            let (node_ms, bench_ms) = cpu_per_write(cpu_before, run.latencies.len() - run.failed, "self");
            let extra = format!(" CPU per stored write: node {node_ms:.2} ms, client {bench_ms:.2} ms");
            rows.push(write_row(&engine, &format!("the service's write path in-process (Pages::put), fixed {rate}/s"), &run, &extra));
        }
        let Some((session, insert)) = &baseline else { continue };
        let cpu_before = (node_pid.as_deref().map_or(0.0, cpu_seconds), cpu_seconds("self"));
        let run = open_loop(rate, seconds, {
            let (session, insert, titles, html) = (session.clone(), insert.clone(), titles.clone(), Arc::new(html.clone()));
            move |i| {
                let (session, insert, titles, html) = (session.clone(), insert.clone(), titles.clone(), html.clone());
                async move {
                    let p = (i as usize * 7919) % titles.len();
                    let value = html[i as usize % html.len()].as_bytes();
                    session.execute_unpaged(&insert, (&titles[p], value)).await.is_ok()
                }
            }
        })
        .await;
        let (node_ms, bench_ms) = cpu_per_write(cpu_before, run.latencies.len() - run.failed, "self");
        let cpu = format!(" CPU per stored write: node {node_ms:.2} ms, client {bench_ms:.2} ms");
        rows.push(write_row(&engine, &format!("baseline: one INSERT of the page, fixed {rate}/s"), &run, &cpu));
    }

    // 7. Churn: hot pages through the service, then what their reads meet.
    let churn_pages: u64 = arg("--churn-pages").map_or(0, |n| n.parse().expect("--churn-pages"));
    let mut churn_rows = Vec::new();
    if let (Some((session, _)), true) = (&baseline, churn_pages > 0) {
        let per_page: u64 = arg("--churn-renders").map_or(60, |n| n.parse().expect("--churn-renders"));
        let churn_rate: u64 = arg("--churn-rate").map_or(200, |n| n.parse().expect("--churn-rate"));
        let churn_titles: Arc<Vec<String>> = Arc::new((0..churn_pages).map(|i| format!("Churn_page_{i}")).collect());
        let writes = churn_pages * per_page;
        // Write i is render i / pages of page i % pages; every third render of a page is a new revision.
        let page_and_rev = move |i: u64| ((i % churn_pages) as usize, 1 + i / churn_pages / 3);
        let run = open_loop(churn_rate, writes.div_ceil(churn_rate), {
            let (http, base, titles, html) = (http.clone(), base.clone(), churn_titles.clone(), Arc::new(html.clone()));
            move |i| {
                let (http, base, titles, html) = (http.clone(), base.clone(), titles.clone(), html.clone());
                async move {
                    if i >= writes {
                        return true;
                    }
                    let (p, rev) = page_and_rev(i);
                    put_render(&http, &base, &titles[p], rev, &body(&html[i as usize % html.len()], rev)).await
                }
            }
        })
        .await;
        rows.push(write_row(&engine, &format!("churn: {churn_pages} pages x {per_page} renders, the service"), &run, ""));
        if let Some(nodetool) = arg("--nodetool") {
            let flushed = Command::new("sh").arg("-c").arg(format!("{nodetool} flush {keyspace}")).status().expect("nodetool");
            assert!(flushed.success(), "nodetool flush failed");
        }
        churn_rows = churn_reads(session, &keyspace, &churn_titles).await;
        let disk = session
            .query_unpaged("SELECT table_name, mebibytes FROM system_views.disk_usage WHERE keyspace_name = ?", (&keyspace,))
            .await
            .expect("disk usage");
        for table in disk.into_rows_result().expect("rows").rows::<(String, i64)>().expect("typed").flatten() {
            churn_rows.push(format!("| on disk: {} | {} MiB (all pages of the bench) | | |", table.0, table.1));
        }
        if let Some(nodetool) = arg("--nodetool") {
            let out =
                Command::new("sh").arg("-c").arg(format!("{nodetool} tablehistograms {keyspace} page_renders")).output().expect("nodetool");
            println!("tablehistograms page_renders:\n{}", String::from_utf8_lossy(&out.stdout));
        }
    }

    // 6. Overload: reads, then writes, past saturation, every answer classed.
    let overload_http = reqwest::Client::builder().pool_max_idle_per_host(64).timeout(Duration::from_secs(30)).build().expect("client");
    let pid = service.0.id();
    let mut overload_rows = Vec::new();
    let overload_row = |what: String, rate: u64, run: &OpenLoop, counts: [usize; 3], successes: &[Duration], rss: u64| {
        format!(
            "| {engine} | {what} | {rate} | {} | {:.0} | {} | {} | {:.0} | {:.0} | {:.0} |",
            run.latencies.len(),
            // Over the whole run, until the last answer came.
            run.achieved * counts[Answer::Success as usize] as f64 / run.latencies.len().max(1) as f64,
            counts[Answer::Shed as usize],
            counts[Answer::Failed as usize],
            percentile_ms(&run.latencies, 0.99),
            percentile_ms(successes, 0.99),
            rss as f64 / 1024.0
        )
    };
    for rate in arg("--overload").map(|_| rates("--overload", "")).unwrap_or_default() {
        let (run, counts, successes, rss) = open_loop_classified(rate, seconds, pid, {
            let (http, base, titles) = (overload_http.clone(), base.clone(), titles.clone());
            move |i| {
                let (http, base, titles) = (http.clone(), base.clone(), titles.clone());
                async move {
                    let t = &titles[(i as usize * 7919) % titles.len()];
                    match http.get(format!("{base}/en.wikipedia.org/v1/page/html/{t}")).send().await {
                        Ok(r) if r.status() == 200 => {
                            if r.bytes().await.is_ok() {
                                Answer::Success
                            } else {
                                FAILURES.lock().expect("failures").entry("body".into()).and_modify(|n| *n += 1).or_insert(1);
                                Answer::Failed
                            }
                        }
                        other => classify(other, 200),
                    }
                }
            }
        })
        .await;
        overload_rows.push(overload_row("read latest HTML".into(), rate, &run, counts, &successes, rss));
    }
    let overload_revs: Arc<Vec<AtomicU64>> = Arc::new((0..pages_n).map(|_| AtomicU64::new(500_000)).collect());
    for rate in arg("--overload-writes").map(|_| rates("--overload-writes", "")).unwrap_or_default() {
        let (run, counts, successes, rss) = open_loop_classified(rate, seconds, pid, {
            let (http, base, titles, html, revs) =
                (overload_http.clone(), base.clone(), titles.clone(), Arc::new(html.clone()), overload_revs.clone());
            move |i| {
                let (http, base, titles, html, revs) = (http.clone(), base.clone(), titles.clone(), html.clone(), revs.clone());
                async move {
                    let p = (i as usize * 7919) % titles.len();
                    let rev = if i % 2 == 0 { revs[p].fetch_add(1, Ordering::SeqCst) + 1 } else { revs[p].load(Ordering::SeqCst) };
                    let sent = http
                        .put(format!("{base}/en.wikipedia.org/v1/page/{}/{rev}/{}", titles[p], Tid::now()))
                        .bearer_auth(TOKEN)
                        .json(&body(&html[i as usize % html.len()], rev))
                        .send()
                        .await;
                    classify(sent, 201)
                }
            }
        })
        .await;
        overload_rows.push(overload_row("write renders (1/2 new revisions)".into(), rate, &run, counts, &successes, rss));
    }

    if !overload_rows.is_empty() {
        // What the service says it did with the connections and the excess.
        let metrics = http.get(format!("{base}/metrics")).send().await.expect("metrics").text().await.expect("text");
        for line in metrics.lines().filter(|l| l.starts_with("http_connections_closed_total") || l.starts_with("http_requests_shed_total"))
        {
            println!("service: {line}");
        }
    }

    // 2. Saturation over HTTP.
    let (http_ops, http_lat) = saturate(CONCURRENCY, if measure_reads { seconds } else { 0 }, {
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
    if !http_lat.is_empty() {
        rows.push(format!(
            "| {engine} | read latest HTML, saturation over HTTP | {} | {:.0} | {:.2} | {:.2} |",
            http_lat.len(),
            http_ops,
            percentile_ms(&http_lat, 0.5),
            percentile_ms(&http_lat, 0.99)
        ));
    }

    // 4. Writes at saturation (before the service stops).
    let next_rev = Arc::new(AtomicU64::new(1_000_000));
    let (write_ops, write_lat) = saturate(CONCURRENCY, if measure_writes { seconds } else { 0 }, {
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
    if !write_lat.is_empty() {
        rows.push(format!(
            "| {engine} | write new renders, 32 writers | {} | {:.0} | {:.2} | {:.2} |",
            write_lat.len(),
            write_ops,
            percentile_ms(&write_lat, 0.5),
            percentile_ms(&write_lat, 0.99)
        ));
    }
    drop(service);

    // 3. The same reads straight from the Store, in this process.
    let settings = match engine.as_str() {
        "embedded" => StorageSettings::Embedded { data_dir: dir.path().to_owned(), options: EmbeddedOptions::default() },
        _ => StorageSettings::Cassandra(CassandraOptions::new([node.clone()], keyspace.clone())),
    };
    let store = revstore_storage::open(settings).await.expect("open store");
    let pages = Pages {
        store: store.clone(),
        grace: Duration::from_secs(86_400),
        clock_skew: Duration::ZERO,
        hand_off: false,
        notify_graph: false,
    };
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
    let (direct_ops, direct_lat) = saturate(CONCURRENCY, if measure_reads { seconds } else { 0 }, {
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
    if !direct_lat.is_empty() {
        rows.push(format!(
            "| {engine} | read latest HTML, saturation, Store in-process | {} | {:.0} | {:.2} | {:.2} |",
            direct_lat.len(),
            direct_ops,
            percentile_ms(&direct_lat, 0.5),
            percentile_ms(&direct_lat, 0.99)
        ));
    }
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
    if !churn_rows.is_empty() {
        println!(
            "\nreads after the churn, traced (per read: mean live rows; tombstones mean / max)\n| read | reads | live rows | tombstones |\n|---|---|---|---|"
        );
        for r in churn_rows {
            println!("{r}");
        }
    }
    if measure_reads {
        println!("\nHTTP reads at saturation / in-process Store reads: {:.2}", http_ops / direct_ops);
    }
    if !overload_rows.is_empty() {
        println!(
            "\nmax in flight: {}, client connections: {}",
            arg("--max-in-flight").unwrap_or_else(|| "default".into()),
            arg("--client-connections").unwrap_or_else(|| "unbounded".into())
        );
        println!("failures by kind: {:?}", FAILURES.lock().expect("failures"));
        println!(
            "| engine | overload | offered/s | answers | succeeded/s | shed | failed | p99 all ms | p99 successes ms | peak RSS MB |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in overload_rows {
            println!("{r}");
        }
    }
}

/// Every churned page's reads, traced, in `page_renders`: the latest render,
/// the newest superseded render by revision and by tid, and the read before a
/// write (the page's newest 64 keys). A row per read: mean live rows, mean
/// and max tombstones.
async fn churn_reads(session: &scylla::client::session::Session, keyspace: &str, titles: &[String]) -> Vec<String> {
    use trace::{ReadCost, traced_read};
    let prepare = |cql: String| async move { session.prepare(cql).await.expect("prepare a traced read") };
    let table = format!("\"{keyspace}\".page_renders");
    let latest = prepare(format!("SELECT tid, html FROM {table} WHERE domain = ? AND title = ? LIMIT 1")).await;
    let keys_of = prepare(format!("SELECT rev, tid FROM {table} WHERE domain = ? AND title = ? LIMIT 2")).await;
    let head = prepare(format!("SELECT rev, tid, stored_at FROM {table} WHERE domain = ? AND title = ? LIMIT 64")).await;
    let of_rev = prepare(format!("SELECT tid, html FROM {table} WHERE domain = ? AND title = ? AND rev = ? LIMIT 1")).await;
    let by_tid = prepare(format!("SELECT html FROM {table} WHERE domain = ? AND title = ? AND rev = ? AND tid = ?")).await;
    let kinds = ["latest", "superseded, by revision", "superseded, by tid", "before a write"];
    let mut service = vec![Vec::<ReadCost>::new(); 4];
    let domain = "en.wikipedia.org";
    for title in titles {
        let keys = session.execute_unpaged(&keys_of, (domain, title)).await.expect("renders").into_rows_result().expect("rows");
        let keys: Vec<(i64, scylla::value::CqlTimeuuid)> = keys.rows().expect("typed").flatten().collect();
        if let Some(&(rev, tid)) = keys.get(1) {
            let costs = [
                traced_read(session, &latest, (domain, title)).await.expect("trace"),
                traced_read(session, &of_rev, (domain, title, rev)).await.expect("trace"),
                traced_read(session, &by_tid, (domain, title, rev, tid)).await.expect("trace"),
                traced_read(session, &head, (domain, title)).await.expect("trace"),
            ];
            for (k, cost) in costs.into_iter().enumerate() {
                service[k].push(cost);
            }
        }
    }
    let mut rows = Vec::new();
    for (kind, costs) in kinds.iter().zip(service.iter()) {
        let n = costs.len().max(1) as f64;
        rows.push(format!(
            "| {kind} | {} | {:.1} | {:.1} / {} |",
            costs.len(),
            costs.iter().map(|c| c.live_rows).sum::<u64>() as f64 / n,
            costs.iter().map(|c| c.tombstones).sum::<u64>() as f64 / n,
            costs.iter().map(|c| c.tombstones).max().unwrap_or(0)
        ));
    }
    rows
}

/// A render written by the service's own code in this process, on
/// `de.wikipedia.org` (the HTTP service writes `en.wikipedia.org`).
async fn in_process_put(pages: &Pages, title: &str, rev: u64, body: &RenderBody) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // What the service does with a request's body before storing it.
    let received: RenderBody = serde_json::from_slice(&serde_json::to_vec(body)?)?;
    let domain = Domain::parse("de.wikipedia.org")?;
    let title = Title::parse(title, TitleRules::default())?;
    let id = revstore_current_store::RenderId { rev: revstore_keys::RevId::new(rev)?, tid: Tid::now() };
    pages.put(&domain, &title, id, &received, &revstore_current_store::Preconditions::default()).await?;
    Ok(())
}

/// A render written through the service's API: whether it was stored (201).
async fn put_render(http: &reqwest::Client, base: &str, title: &str, rev: u64, body: &RenderBody) -> bool {
    let sent = http.put(format!("{base}/en.wikipedia.org/v1/page/{title}/{rev}/{}", Tid::now())).bearer_auth(TOKEN).json(body).send().await;
    sent.is_ok_and(|r| r.status() == 201)
}
