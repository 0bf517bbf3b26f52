//! Every service past its saturation, on either engine: does it shed what it
//! cannot serve, keep serving near its saturation rate, keep p99 under a
//! second, keep its memory flat and lose no acknowledged write?
//!
//! ```text
//! cargo build --release --workspace --bins
//! cargo bench -p revstore-integration-tests --bench overload -- [--engine embedded|cassandra]
//!     [--services current-store,old-store,dependency-graph] [--work reads,writes]
//!     [--multiples 2,4] [--seconds 10] [--connections 1000] [--max-in-flight N]
//!     [--service-cpus LIST]
//! ```
//!
//! The whole system runs as in production (three service processes wired to
//! each other: current-store hands off to old-store and notifies the graph),
//! on the embedded engine or on the Cassandra named by
//! `REVSTORE_TEST_CASSANDRA`. Before each run, old-store's compaction queue
//! is left to empty (seeding and earlier writes fill it), so a run shares the
//! machine only with what it causes. For each service and kind of work:
//! 1. saturation: 32 connections closed loop for `--seconds`; the successes a
//!    second are the service's saturation rate;
//! 2. for each of `--multiples`: that many times the saturation rate offered
//!    open loop for `--seconds` from at most `--connections` connections
//!    (the load generator in `revstore_integration_tests::loadgen`), each
//!    answer a success, shed (503 `overloaded`) or failure, `/healthz` timed
//!    every 200 ms meanwhile, the service's RSS and CPU sampled;
//! 3. writes: every acknowledged write is read back by its id (a render by
//!    its tid, an archived render by its tid, a page's dependencies), and a
//!    sample of the shed ones is checked absent.
//!
//! `--max-in-flight` sets every service's `REVSTORE_MAX_IN_FLIGHT` (a huge
//! value turns shedding off, to compare). `--service-cpus 1` runs the services
//! on CPU 1 alone (`taskset`), as a one-CPU pod; run the bench itself with
//! `taskset -c 0` and the generator has CPU 0 to itself, as a client fleet on
//! other machines would, so the service's figures are not the generator's.

#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use revstore_bench::procfs::{cpu_seconds, rss_mb};
use revstore_bench::{arg, list};
use revstore_integration_tests::loadgen::{self, Answer, Plan, Report};
use revstore_integration_tests::{Engine, Options, ServiceProcess, System};
use revstore_keys::TidGenerator;
use serde_json::json;

const DOMAIN: &str = "en.wikipedia.org";
/// Pages of current-store and old-store the reads spread over.
const PAGES: u64 = 1000;
/// Templates the graph's listings spread over; pages seeded with 3 of them each.
const TEMPLATES: u64 = 20;
const GRAPH_PAGES: u64 = 2000;
/// Connections of the closed-loop saturation run.
const SATURATION_CONNECTIONS: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    Current,
    Old,
    Graph,
}

impl Service {
    fn parse(name: &str) -> Service {
        match name {
            "current-store" => Service::Current,
            "old-store" => Service::Old,
            "dependency-graph" => Service::Graph,
            other => panic!("unknown service {other:?}"),
        }
    }

    fn process(self, system: &System) -> &ServiceProcess {
        match self {
            Service::Current => &system.current,
            Service::Old => &system.old,
            Service::Graph => &system.graph,
        }
    }
}

/// A write the load generator sent: what to read back if it was acknowledged.
#[derive(Debug, Clone)]
struct Sent {
    index: u64,
    /// The path that reads it back, and what that read must contain.
    read_back: String,
    expect: String,
}

/// The bodies of renders: real Parsoid HTML of 10-30 KB.
struct Bodies {
    html: Vec<String>,
    /// The JSON body of a render (and of an archived render) of each `html`.
    json: Vec<Vec<u8>>,
}

impl Bodies {
    fn new() -> Bodies {
        let html: Vec<String> =
            revstore_testdata::anarchism_html().into_iter().filter(|h| (10_000..=30_000).contains(&h.len())).take(16).collect();
        assert!(!html.is_empty(), "no revision of 10-30 KB in shared/data");
        let json = html
            .iter()
            .map(|h| json!({"html": h, "data-parsoid": {"ids": {}}, "section-offsets": {"mwAQ": {"html": [0, 10], "wt": [0, 5]}}}))
            .map(|v| v.to_string().into_bytes())
            .collect();
        Bodies { html, json }
    }
}

/// Everything the request makers share.
struct Workload {
    system: Arc<System>,
    bodies: Bodies,
    tids: TidGenerator,
    /// Writes handed out so far, per service: each write is a new revision
    /// (or a new page) so that every acknowledged one can be read back.
    written: [AtomicU64; 3],
    sent: Mutex<Vec<Sent>>,
}

impl Workload {
    fn addr(&self, service: Service) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], service.process(&self.system).port))
    }

    /// Request `i` of a run of `service`'s reads or writes.
    fn request(&self, service: Service, writes: bool, i: u64) -> Vec<u8> {
        let addr = self.addr(service);
        let token = Some(self.system.token.as_str());
        if !writes {
            let path = match service {
                Service::Current => format!("/{DOMAIN}/v1/page/html/Overload_page_{}", (i * 7919) % PAGES),
                Service::Old => format!("/{DOMAIN}/v1/archive/html/Overload_archive_{}/{}", (i * 7919) % PAGES, 1 + i % 3),
                Service::Graph => format!("/{DOMAIN}/v1/dependents/Template:Overload_{}?limit=100", i % TEMPLATES),
            };
            return loadgen::request("GET", addr, &path, None, None);
        }
        let n = self.written[service as usize].fetch_add(1, Ordering::Relaxed);
        let body = (n % self.bodies.json.len() as u64) as usize;
        let (path, json, read_back, expect) = match service {
            // A new revision of one of the pages each time (revisions 1-3 were seeded).
            Service::Current | Service::Old => {
                let (title, rev, tid) = (n % PAGES, 4 + n / PAGES, self.tids.next());
                let (write, read) = match service {
                    Service::Current => (format!("/{DOMAIN}/v1/page/Overload_page_{title}/{rev}/{tid}"), "page"),
                    _ => (format!("/{DOMAIN}/v1/archive/Overload_archive_{title}/{rev}/{tid}"), "archive"),
                };
                let prefix = if service == Service::Current { "Overload_page" } else { "Overload_archive" };
                let read_back = format!("/{DOMAIN}/v1/{read}/html/{prefix}_{title}/{rev}/{tid}");
                (write, self.bodies.json[body].clone(), read_back, self.bodies.html[body].clone())
            }
            // A new page's dependencies each time.
            Service::Graph => {
                let page = format!("Overload_dependent_{n}");
                let template = format!("Template:Overload_{}", n % TEMPLATES);
                let edges = json!({"edges": [{"parent": template, "type": "modification", "priority": 500}]});
                (format!("/{DOMAIN}/v1/deps/{page}"), edges.to_string().into_bytes(), format!("/{DOMAIN}/v1/deps/{page}"), template)
            }
        };
        self.sent.lock().expect("sent").push(Sent { index: i, read_back, expect });
        loadgen::request("PUT", addr, &path, token, Some(&json))
    }
}

/// Loads what the reads read: a render of every page, three archived
/// revisions of every archived page, the graph's pages and their templates.
async fn seed(workload: &Workload) {
    let system = &workload.system;
    let http = reqwest::Client::new();
    let mut requests = Vec::new();
    for page in 0..PAGES {
        let body = workload.bodies.json[(page % workload.bodies.json.len() as u64) as usize].clone();
        requests.push((system.current.url(&format!("/{DOMAIN}/v1/page/Overload_page_{page}/1/{}", workload.tids.next())), body.clone()));
        for rev in 1..=3 {
            let url = system.old.url(&format!("/{DOMAIN}/v1/archive/Overload_archive_{page}/{rev}/{}", workload.tids.next()));
            requests.push((url, body.clone()));
        }
    }
    for page in 0..GRAPH_PAGES {
        let edges: Vec<_> = (0..3)
            .map(|j| json!({"parent": format!("Template:Overload_{}", (page + j) % TEMPLATES), "type": "modification", "priority": 500}))
            .collect();
        requests
            .push((system.graph.url(&format!("/{DOMAIN}/v1/deps/Overload_seed_{page}")), json!({"edges": edges}).to_string().into_bytes()));
    }
    let sends = requests.into_iter().map(|(url, body)| {
        let request = http.put(&url).bearer_auth(&system.token).header("content-type", "application/json").body(body);
        async move {
            let answer = request.send().await.expect("seed");
            assert!(answer.status().is_success(), "seeding {url}: {} {}", answer.status(), answer.text().await.unwrap_or_default());
        }
    });
    futures_util::stream::iter(sends).buffer_unordered(16).collect::<Vec<()>>().await;
}

/// Waits until old-store has no compaction queued or running (what seeding
/// and the writes left it), so that a measured run does not share the CPU
/// with compaction it did not cause; at most five minutes. Returns the wait.
async fn quiesce(system: &System) -> Duration {
    let started = Instant::now();
    let http = reqwest::Client::new();
    let mut idle_polls = 0;
    while idle_polls < 3 && started.elapsed() < Duration::from_secs(300) {
        let status: serde_json::Value = match http.get(system.old.url("/admin/compaction")).bearer_auth(&system.token).send().await {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(_) => serde_json::Value::Null,
        };
        let idle = status["pending"] == 0 && status["compacting"] == false;
        idle_polls = if idle { idle_polls + 1 } else { 0 };
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    started.elapsed()
}

/// What was seen beside a run: the service's memory and CPU, the generator's
/// CPU and the slowest `/healthz`.
struct Beside {
    rss_start_mb: f64,
    rss_peak_mb: f64,
    service_cpu: f64,
    generator_cpu: f64,
    slowest_healthz_ms: f64,
}

/// Runs `plan` for `service`'s `writes` or reads, watching the service meanwhile.
async fn measure(workload: &Arc<Workload>, service: Service, writes: bool, plan: Plan) -> (Report, Beside) {
    let waited = quiesce(&workload.system).await;
    if waited > Duration::from_secs(10) {
        println!("<!-- waited {:.0} s for old-store's compaction to finish -->", waited.as_secs_f64());
    }
    let process = service.process(&workload.system);
    let pid = process.pid().expect("the service runs");
    let healthz = process.url("/healthz");
    let (cpu_start, generator_start, rss_start_mb) = (cpu_seconds(&pid.to_string()), cpu_seconds("self"), rss_mb(pid));
    let watching = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = tokio::spawn({
        let watching = watching.clone();
        async move {
            let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client");
            let (mut peak, mut slowest) = (0.0f64, Duration::ZERO);
            while watching.load(Ordering::Relaxed) {
                peak = peak.max(rss_mb(pid));
                let asked = Instant::now();
                let ok = http.get(&healthz).send().await.is_ok_and(|r| r.status() == 200);
                slowest = slowest.max(if ok { asked.elapsed() } else { Duration::from_secs(30) });
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (peak, slowest)
        }
    });
    let report = loadgen::run(
        plan,
        {
            let workload = workload.clone();
            move |i| workload.request(service, writes, i)
        },
        move |_, status, body| Answer::of(status, body, if writes { &[200, 201, 204] } else { &[200] }),
    )
    .await;
    watching.store(false, Ordering::Relaxed);
    let (peak, slowest) = watcher.await.expect("watcher");
    let beside = Beside {
        rss_start_mb,
        rss_peak_mb: peak,
        service_cpu: cpu_seconds(&pid.to_string()) - cpu_start,
        generator_cpu: cpu_seconds("self") - generator_start,
        slowest_healthz_ms: slowest.as_secs_f64() * 1e3,
    };
    (report, beside)
}

/// Reads back every acknowledged write of `report` and a sample of the shed
/// ones: (acknowledged, lost, shed checked, shed found stored).
async fn check_writes(workload: &Workload, service: Service, report: &Report) -> (usize, usize, usize, usize) {
    let sent: Vec<Sent> = std::mem::take(&mut *workload.sent.lock().expect("sent"));
    let answers: std::collections::HashMap<u64, Answer> = report.outcomes.iter().map(|o| (o.index, o.answer)).collect();
    let acked: Vec<&Sent> = sent.iter().filter(|s| answers.get(&s.index) == Some(&Answer::Success)).collect();
    let shed: Vec<&Sent> = sent.iter().filter(|s| answers.get(&s.index) == Some(&Answer::Shed)).take(500).collect();
    let process = service.process(&workload.system);
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("client");
    let read = |s: &Sent| {
        let (http, url, expect) = (http.clone(), process.url(&s.read_back), s.expect.clone());
        async move {
            for _ in 0..10 {
                match http.get(&url).send().await {
                    Ok(r) if r.status() == 200 => return Some(r.text().await.is_ok_and(|t| t.contains(&expect))),
                    Ok(r) if r.status() == 404 => return Some(false),
                    // Busy (still draining the run's hand-offs): ask again.
                    _ => tokio::time::sleep(Duration::from_secs(1)).await,
                }
            }
            None
        }
    };
    let acked_found: Vec<Option<bool>> = futures_util::stream::iter(acked.iter().map(|s| read(s))).buffer_unordered(16).collect().await;
    let shed_found: Vec<Option<bool>> = futures_util::stream::iter(shed.iter().map(|s| read(s))).buffer_unordered(16).collect().await;
    let lost = acked_found.iter().filter(|f| **f != Some(true)).count();
    let stored = shed_found.iter().filter(|f| **f != Some(false)).count();
    (acked.len(), lost, shed.len(), stored)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let engine = match arg("--engine").as_deref() {
        None | Some("embedded") => Engine::Embedded,
        Some("cassandra") => Engine::Cassandra,
        Some(other) => panic!("unknown engine {other:?}"),
    };
    let seconds: u64 = arg("--seconds").map_or(10, |s| s.parse().expect("--seconds"));
    let connections: usize = arg("--connections").map_or(1000, |s| s.parse().expect("--connections"));
    let multiples: Vec<u64> = list("--multiples", "2,4").iter().map(|m| m.parse().expect("--multiples")).collect();
    let mut options = Options::default();
    if let Some(limit) = arg("--max-in-flight") {
        options.env.push(("REVSTORE_MAX_IN_FLIGHT".into(), limit));
    }
    options.cpus = arg("--service-cpus");
    let started = Instant::now();
    let system = Arc::new(System::start(engine, options).await);
    let workload = Arc::new(Workload {
        system,
        bodies: Bodies::new(),
        tids: TidGenerator::new(),
        written: Default::default(),
        sent: Mutex::default(),
    });
    seed(&workload).await;
    println!("engine: {engine:?}; system started and seeded in {:.0} s", started.elapsed().as_secs_f64());
    println!();
    println!(
        "| service | work | saturation/s | offered/s | succeeded/s | shed/s | failed | p99 all ms | p99 successes ms | slowest /healthz ms | RSS start → peak MB | CPU service / generator s | acked writes lost |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for name in list("--services", "current-store,old-store,dependency-graph") {
        let service = Service::parse(&name);
        for work in list("--work", "reads,writes") {
            let writes = match work.as_str() {
                "reads" => false,
                "writes" => true,
                other => panic!("unknown work {other:?}"),
            };
            let addr = workload.addr(service);
            let timeout = Duration::from_secs(30);
            let duration = Duration::from_secs(seconds);
            let closed = Plan { addr, rate: None, duration, connections: SATURATION_CONNECTIONS, timeout };
            let (report, beside) = measure(&workload, service, writes, closed).await;
            let saturation = report.rate(Answer::Success);
            let lost = if writes { check_writes(&workload, service, &report).await.1.to_string() } else { "-".into() };
            print_row(&name, &work, saturation, None, &report, &beside, &lost);
            for multiple in &multiples {
                let rate = (saturation * *multiple as f64) as u64;
                let plan = Plan { addr, rate: Some(rate), duration, connections, timeout };
                let (report, beside) = measure(&workload, service, writes, plan).await;
                let lost = if writes {
                    let (acked, lost, shed_checked, shed_stored) = check_writes(&workload, service, &report).await;
                    assert_eq!(shed_stored, 0, "{name}: {shed_stored} of {shed_checked} shed writes were stored");
                    format!("{lost} of {acked}")
                } else {
                    "-".into()
                };
                print_row(&name, &work, saturation, Some((*multiple, rate)), &report, &beside, &lost);
                println!("<!-- successes each second: {:?} -->", report.per_second(Answer::Success));
                if !report.failures.is_empty() {
                    println!("<!-- failures: {:?} -->", report.failures);
                }
            }
        }
    }
    keep_logs(&workload.system);
}

/// Keeps the services' logs (their directory goes with the system).
fn keep_logs(system: &System) {
    for process in [&system.current, &system.old, &system.graph] {
        let kept = std::env::temp_dir().join(format!("overload-{}.log", process.name));
        if std::fs::copy(system.dir().join(format!("{}.log", process.name)), &kept).is_ok() {
            println!("<!-- {}'s log: {} -->", process.name, kept.display());
        }
    }
}

fn print_row(service: &str, work: &str, saturation: f64, offered: Option<(u64, u64)>, report: &Report, beside: &Beside, lost: &str) {
    let offered = offered.map_or_else(|| format!("closed loop, {SATURATION_CONNECTIONS} conns"), |(m, rate)| format!("{rate} ({m}x)"));
    println!(
        "| {service} | {work} | {saturation:.0} | {offered} | {:.0} | {:.0} | {} | {:.0} | {:.0} | {:.0} | {:.0} → {:.0} | {:.1} / {:.1} | {lost} |",
        report.rate(Answer::Success),
        report.rate(Answer::Shed),
        report.count(Answer::Failed),
        report.quantile_ms(None, 0.99),
        report.quantile_ms(Some(Answer::Success), 0.99),
        beside.slowest_healthz_ms,
        beside.rss_start_mb,
        beside.rss_peak_mb,
        beside.service_cpu,
        beside.generator_cpu,
    );
}
