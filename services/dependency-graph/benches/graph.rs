//! The dependency graph's benchmark: the real `revstore-dependency-graph`
//! binary as its own process, on the embedded engine (or Cassandra).
//!
//! ```sh
//! cargo bench -p revstore-dependency-graph --bench graph                          # 1,000,000 dependents
//! cargo bench -p revstore-dependency-graph --bench graph -- --dependents 10000000 # the 10-million walk
//! cargo bench -p revstore-dependency-graph --bench graph -- --cassandra 127.0.0.1:9042 --dependents 10000000
//! ```
//! `--chart SVG` draws the walks' pace along their length; `--spread one|few|uniform|long-tail`
//! sets how the dependents' priorities are spread (default `few`: seven values).
//!
//! ```sh
//! cargo bench -p revstore-dependency-graph --bench graph -- --cassandra 127.0.0.1:9042 --keyspace graph_bench_1234 --dependents 10000000
//! ```
//! `--keyspace KS` (Cassandra) walks the template of a keyspace an earlier
//! run loaded and kept, `--walks N` times (default 3), and stops: the walk
//! measured again once the node has compacted what the load wrote; with
//! `--janitor`, it runs the janitor's `graph` task over the keyspace instead.
//! `--binary PATH` measures another build of the service (side by side).
//!
//! ```sh
//! cargo bench -p revstore-dependency-graph --bench graph -- --spreads 200000   # the priority spreads only
//! ```
//! `--spreads N` measures only the walk against the spread of priorities: one
//! template of N dependents per spread (one priority; seven; 0-1000 uniform;
//! a long tail: most near 0, some up to 1000), each walked over HTTP a
//! thousand a page (`--limit` sets it), as change propagation pages, once
//! to warm up and once measured.
//!
//! 1. A template with `--dependents` dependents, loaded below the HTTP API
//!    (bulk writes through `Graph::add_edges`): the fan-out of the real graphs
//!    in shared/data/graphs is far smaller (Reflist: 98 of 206 pages), so the
//!    scale is generated: children `Page_<n>`, priorities spread over seven
//!    values, a child selector each, as a real transclusion has.
//! 2. The walk: every dependent through `GET /dependents` (10,000 a page),
//!    edges/s and the service's peak resident memory; then the same walk
//!    in-process through `Graph::dependents` on the same data.
//! 3. Replacing a 500-edge dependency set with 10% changed, p99.
//! 4. The pull check of a page with 500 dependencies, p99.
//! 5. Recording a change of the 10-million template, p99.
//! 6. The real graph (shared/data/graphs/wikispeedia/links.tsv) loaded through
//!    `PUT /deps`, one request per page, edges/s; the dependents of its
//!    most-linked page listed.
//! 7. The janitor's `graph` task over all of it, driven through the admin
//!    API step by step as `revstore-janitor` drives it (default budget of 100
//!    partitions, no pacing): steps, rows checked, the slowest step (a step
//!    must stay far below the request timeout whatever the partition sizes).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use revstore_api::ChangeKind;
use revstore_api::graph::Edge;
use revstore_bench::{arg, percentile};
use revstore_dependency_graph::DependentsQuery;
use revstore_dependency_graph::Graph;
use revstore_keys::{Domain, Title, TitleRules};
use revstore_storage::{CassandraOptions, EmbeddedEngine, EmbeddedOptions, Store};
use serde_json::{Value, json};

const TOKEN: &str = "dependency-graph-bench-token";
const DOMAIN: &str = "en.wikipedia.org";
const TEMPLATE: &str = "Template:Citation_needed";

struct Service {
    process: revstore_bench::Process,
    /// The service's log.
    _log: tempfile::TempDir,
    base: String,
    http: reqwest::Client,
}

impl Service {
    async fn start(storage: &[String]) -> Service {
        let binary = arg("--binary").unwrap_or_else(|| env!("CARGO_BIN_EXE_revstore-dependency-graph").to_owned());
        let mut command = Command::new(binary);
        command.args(["--listen", "127.0.0.1:0", "--write-tokens", TOKEN, "--shutdown-delay-secs", "0"]).args(storage);
        let log = tempfile::tempdir().unwrap();
        let (process, addresses) = revstore_bench::start_service(command, &log.path().join("graph.log"), &["dependency-graph"]).await;
        let http = reqwest::Client::builder().pool_max_idle_per_host(16).build().unwrap();
        Service { process, _log: log, base: format!("http://{}", addresses[0]), http }
    }

    /// The process's peak resident memory, in MB.
    fn peak_rss_mb(&self) -> f64 {
        revstore_bench::procfs::high_water_mb(self.process.pid())
    }

    /// SIGTERM, then wait: a clean shutdown.
    fn stop(self) {
        drop(self.process);
    }
}

/// How a template's dependents' priorities are spread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spread {
    /// Every edge at 500.
    One,
    /// Seven values, 0 to 900.
    Few,
    /// 0-1000, uniform.
    Uniform,
    /// Most near 0, a tail up to 1000 (exponential, mean 50).
    LongTail,
}

impl Spread {
    const ALL: [Spread; 4] = [Spread::One, Spread::Few, Spread::Uniform, Spread::LongTail];

    fn name(self) -> &'static str {
        match self {
            Spread::One => "one",
            Spread::Few => "few",
            Spread::Uniform => "uniform",
            Spread::LongTail => "long-tail",
        }
    }

    fn parse(text: &str) -> Spread {
        Spread::ALL.into_iter().find(|s| s.name() == text).unwrap_or_else(|| panic!("--spread {text}: one, few, uniform or long-tail"))
    }

    /// The priority of the `i`-th dependent.
    fn priority(self, i: usize) -> i64 {
        // A fixed scramble of i, so that priorities do not follow titles.
        let mixed = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_right(29);
        let unit = (mixed >> 11) as f64 / (1u64 << 53) as f64;
        match self {
            Spread::One => 500,
            Spread::Few => (i % 7) as i64 * 150,
            Spread::Uniform => (mixed % 1001) as i64,
            Spread::LongTail => ((-(1.0 - unit).ln() * 50.0) as i64).min(1000),
        }
    }
}

fn dependent_edge(parent: &str, spread: Spread, i: usize) -> Edge {
    Edge {
        parent: parent.into(),
        kind: ChangeKind::Modification,
        priority: spread.priority(i),
        parent_selector: None,
        child_selector: Some(vec![format!("mwA{}", i % 4096)]),
    }
}

/// Loads `count` dependents of `parent` below the API.
async fn load_dependents(graph: &Graph, domain: &Domain, parent: &str, spread: Spread, count: usize) {
    let mut loaded = 0;
    while loaded < count {
        let chunk: Vec<(Title, Edge)> =
            (loaded..(loaded + 20_000).min(count)).map(|i| (title(&format!("Page_{i}")), dependent_edge(parent, spread, i))).collect();
        // Eight writers: the embedded engine has one, Cassandra takes more.
        let pieces: Vec<Vec<(Title, Edge)>> = chunk.chunks(2_500).map(<[_]>::to_vec).collect();
        futures_util::future::try_join_all(pieces.iter().map(|p| graph.add_edges(domain, p, TitleRules::default()))).await.unwrap();
        loaded += chunk.len();
    }
}

/// Walks `parent`'s dependents over HTTP, `limit` a page: (edges, pages, seconds, (edges, seconds) after each page).
async fn walk_over_http(service: &Service, parent: &str, limit: usize) -> (usize, usize, f64, Vec<(usize, f64)>) {
    let started = Instant::now();
    let (mut seen, mut cursor, mut pages) = (0usize, None::<String>, 0usize);
    let mut progress = Vec::new();
    loop {
        let mut request = service.http.get(format!("{}/{DOMAIN}/v1/dependents/{parent}", service.base)).query(&[("limit", limit)]);
        if let Some(c) = &cursor {
            request = request.query(&[("cursor", c)]);
        }
        let answer = request.send().await.unwrap();
        assert_eq!(answer.status(), 200, "a page of the walk");
        let page: Value = answer.json().await.unwrap();
        seen += page["items"].as_array().unwrap().len();
        pages += 1;
        progress.push((seen, started.elapsed().as_secs_f64()));
        match page["next"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    (seen, pages, started.elapsed().as_secs_f64(), progress)
}

/// Item 7: the janitor's `graph` task over everything, driven step by step
/// through the admin API as `revstore-janitor` drives it: the line that says
/// how it went.
async fn janitor_graph_task(service: &Service) -> String {
    let holder = revstore_keys::Tid::now().to_string();
    let lease = service
        .http
        .post(format!("{}/admin/janitor/lease", service.base))
        .bearer_auth(TOKEN)
        .json(&json!({"holder": holder, "ttl_secs": 3600}))
        .send()
        .await
        .unwrap();
    assert_eq!(lease.status(), 200);
    let started = Instant::now();
    let (mut steps, mut partitions, mut repaired, mut step_ms) = (Vec::new(), 0u64, 0u64, Vec::new());
    loop {
        let step_started = Instant::now();
        let r = service
            .http
            .post(format!("{}/admin/janitor/graph/step", service.base))
            .bearer_auth(TOKEN)
            .json(&json!({"holder": holder, "budget": 100, "restart": steps.is_empty()}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "a graph step failed");
        let report: Value = r.json().await.unwrap();
        step_ms.push(step_started.elapsed().as_secs_f64() * 1000.0);
        partitions += report["partitions"].as_u64().unwrap();
        repaired += report["rows"].as_u64().unwrap();
        let done = report["done"].as_bool().unwrap();
        steps.push(report);
        if done {
            break;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let given_back =
        service.http.delete(format!("{}/admin/janitor/lease", service.base)).bearer_auth(TOKEN).query(&[("holder", &holder)]).send().await;
    assert_eq!(given_back.unwrap().status(), 204, "the lease given back, for the next run");
    let slowest = step_ms.iter().copied().fold(0.0, f64::max);
    format!(
        "janitor graph task (budget 100): {} steps, {partitions} partitions, {repaired} rows repaired, {secs:.0} s; step p50 {:.1} ms, p99 {:.1} ms, slowest {slowest:.1} ms; service peak {:.0} MB",
        steps.len(),
        percentile(&mut step_ms.clone(), 0.5),
        percentile(&mut step_ms, 0.99),
        service.peak_rss_mb()
    )
}

/// `--keyspace KS`: the walk over HTTP of a template an earlier run loaded.
async fn walks_of_a_loaded_keyspace(storage: &[String], keyspace: &str, dependents: usize) {
    let walks: usize = arg("--walks").map_or(3, |n| n.parse().expect("--walks N"));
    let service = Service::start(storage).await;
    if revstore_bench::flag("--janitor") {
        println!("{}", janitor_graph_task(&service).await);
        return service.stop();
    }
    println!("# dependency-graph, cassandra engine, {dependents} dependents of {TEMPLATE} loaded earlier in {keyspace}\n");
    println!("| walk | pages of 10,000 | dependents | seconds | edges/s |\n|---|---|---|---|---|");
    for walk in 1..=walks {
        let (seen, pages, secs, _) = walk_over_http(&service, TEMPLATE, 10_000).await;
        assert_eq!(seen, dependents, "every dependent, once");
        println!("| {walk} | {pages} | {seen} | {secs:.1} | {:.0} |", seen as f64 / secs);
    }
    println!("\nservice peak resident memory: {:.0} MB", service.peak_rss_mb());
    service.stop();
}

/// `--spreads N`: one template of N dependents per spread, each walked over
/// HTTP a thousand a page (`--limit`).
async fn spreads(count: usize, store: Store, storage: &[String], engine: &str, embedded: bool) {
    let limit: usize = arg("--limit").map_or(1000, |l| l.parse().expect("--limit N"));
    let domain = Domain::parse(DOMAIN).unwrap();
    let graph = Graph::new(store.clone(), 10_000);
    println!("# dependency-graph, {engine} engine: walks of {count} dependents against their priorities' spread\n");
    for spread in Spread::ALL {
        load_dependents(&graph, &domain, &format!("Template:Spread_{}", spread.name()), spread, count).await;
    }
    if embedded {
        drop(graph);
        drop(store);
    }
    let service = Service::start(storage).await;
    // One walk of each first, unmeasured: Cassandra's read path compiled, caches warm.
    for spread in Spread::ALL {
        walk_over_http(&service, &format!("Template:Spread_{}", spread.name()), limit).await;
    }
    println!("| priorities | dependents | pages of {limit} | seconds | edges/s |\n|---|---|---|---|---|");
    for spread in Spread::ALL {
        let (seen, pages, secs, _) = walk_over_http(&service, &format!("Template:Spread_{}", spread.name()), limit).await;
        assert_eq!(seen, count, "every dependent, once");
        println!("| {} | {seen} | {pages} | {secs:.2} | {:.0} |", spread.name(), seen as f64 / secs);
    }
    println!("\nservice peak {:.0} MB", service.peak_rss_mb());
    service.stop();
}

fn title(text: &str) -> Title {
    Title::parse(text, TitleRules::default()).unwrap()
}

#[tokio::main]
async fn main() {
    let dependents: usize = arg("--dependents").map_or(1_000_000, |n| n.parse().unwrap());
    let cassandra = arg("--cassandra");
    let dir = tempfile::tempdir_in(arg("--dir").map_or_else(std::env::temp_dir, PathBuf::from)).unwrap();
    let reused = arg("--keyspace");
    let keyspace = reused.clone().unwrap_or_else(|| format!("graph_bench_{}", std::process::id()));
    let (store, storage): (Store, Vec<String>) = match &cassandra {
        None => {
            let store = Store::new(Arc::new(EmbeddedEngine::open(dir.path(), EmbeddedOptions::default()).unwrap()));
            (store, vec!["--data-dir".into(), dir.path().to_str().unwrap().into()])
        }
        Some(node) => {
            let engine =
                revstore_storage::CassandraEngine::connect(CassandraOptions::new(vec![node.clone()], keyspace.clone())).await.unwrap();
            (Store::new(Arc::new(engine)), vec!["--cassandra".into(), node.clone(), "--keyspace".into(), keyspace.clone()])
        }
    };
    // What the service uses: its own tables and the janitor's journal of changed pages.
    store.migrate(&[&revstore_schema::version::DEPENDENCY_GRAPH, &revstore_schema::version::JANITOR]).await.unwrap();
    let engine = if cassandra.is_some() { "cassandra" } else { "embedded" };
    if reused.is_some() {
        return walks_of_a_loaded_keyspace(&storage, &keyspace, dependents).await;
    }
    if let Some(count) = arg("--spreads") {
        return spreads(count.parse().expect("--spreads N"), store, &storage, engine, cassandra.is_none()).await;
    }
    let spread = arg("--spread").map_or(Spread::Few, |s| Spread::parse(&s));
    let domain = Domain::parse(DOMAIN).unwrap();
    let graph = Graph::new(store.clone(), 10_000);

    println!("# dependency-graph, {engine} engine, {dependents} dependents of {TEMPLATE}, priorities {}\n", spread.name());
    let started = Instant::now();
    load_dependents(&graph, &domain, TEMPLATE, spread, dependents).await;
    let load_secs = started.elapsed().as_secs_f64();
    println!("loaded below the API in {load_secs:.0} s: {:.0} edges/s\n", dependents as f64 / load_secs);
    if cassandra.is_none() {
        drop(graph);
        drop(store);
    }

    let service = Service::start(&storage).await;
    println!("| measurement | count | seconds | per second | p50 ms | p99 ms |\n|---|---|---|---|---|---|");
    // 2. The walk over HTTP.
    let (seen, pages, walk, http_progress) = walk_over_http(&service, TEMPLATE, 10_000).await;
    assert_eq!(seen, dependents, "every dependent, once");
    println!("| walk all dependents over HTTP ({pages} pages of 10,000) | {seen} | {walk:.1} | {:.0} | | |", seen as f64 / walk);
    let peak = service.peak_rss_mb();

    // 3. Replacing a 500-edge set with 10% changed, on pages of their own.
    let set = |round: usize| -> Value {
        let edges: Vec<Value> = (0..500)
            .map(|j| {
                let priority = if j < 50 { (round % 2) as i64 * 100 + 1 } else { 1 };
                json!({"parent": format!("Template:T{j}"), "type": "modification", "priority": priority, "child_selector": [format!("mw{j}")]})
            })
            .collect();
        json!({"edges": edges})
    };
    let put = |page: String, body: Value| {
        let http = service.http.clone();
        let url = format!("{}/{DOMAIN}/v1/deps/{page}", service.base);
        async move {
            let started = Instant::now();
            let r = http.put(url).bearer_auth(TOKEN).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            started.elapsed().as_secs_f64() * 1000.0
        }
    };
    for p in 0..20 {
        put(format!("Set_{p}"), set(0)).await;
    }
    let mut replace = Vec::new();
    for round in 1..=10 {
        for p in 0..20 {
            replace.push(put(format!("Set_{p}"), set(round)).await);
        }
    }
    let n = replace.len();
    println!(
        "| replace a 500-edge set, 10% changed | {n} | | | {:.2} | {:.2} |",
        percentile(&mut replace, 0.5),
        percentile(&mut replace, 0.99)
    );

    // 4. The pull check of a page with 500 dependencies (50 of them stale).
    for j in 0..50 {
        let at = revstore_keys::rfc3339(std::time::SystemTime::now());
        let r = service
            .http
            .post(format!("{}/{DOMAIN}/v1/changes", service.base))
            .bearer_auth(TOKEN)
            .json(&json!({"page": format!("Template:T{j}"), "type": "modification", "at": at}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204);
    }
    let mut pull = Vec::new();
    for i in 0..400 {
        let started = Instant::now();
        let pending: Value =
            service.http.get(format!("{}/{DOMAIN}/v1/pending/Set_{}", service.base, i % 20)).send().await.unwrap().json().await.unwrap();
        pull.push(started.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(pending["needs_update"], true);
    }
    println!(
        "| pull check, 500 dependencies | {} | | | {:.2} | {:.2} |",
        pull.len(),
        percentile(&mut pull, 0.5),
        percentile(&mut pull, 0.99)
    );

    // 5. Recording a change of the template with all the dependents.
    let mut change = Vec::new();
    for _ in 0..400 {
        let at = revstore_keys::rfc3339(std::time::SystemTime::now());
        let started = Instant::now();
        let r = service
            .http
            .post(format!("{}/{DOMAIN}/v1/changes", service.base))
            .bearer_auth(TOKEN)
            .json(&json!({"page": TEMPLATE, "type": "modification", "at": at}))
            .send()
            .await
            .unwrap();
        change.push(started.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(r.status(), 204);
    }
    println!(
        "| record a change of the {dependents}-dependent template | {} | | | {:.2} | {:.2} |",
        change.len(),
        percentile(&mut change, 0.5),
        percentile(&mut change, 0.99)
    );

    // 6. The real graph, through the API, one PUT per page.
    let links = revstore_testdata::shared_data().join("graphs/wikispeedia/links.tsv");
    let mut by_page: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in std::fs::read_to_string(&links).unwrap().lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let mut fields = line.split('\t');
        let (Some(from), Some(to)) = (fields.next(), fields.next()) else { continue };
        let decode = |s: &str| percent_decode(s);
        let (from, to) = (decode(from), decode(to));
        if from != to {
            by_page.entry(from).or_default().push(to);
        }
    }
    let edges: usize = by_page.values().map(Vec::len).sum();
    let started = Instant::now();
    let requests: Vec<_> = by_page
        .iter()
        .map(|(page, targets)| {
            let body =
                json!({"edges": targets.iter().map(|t| json!({"parent": t, "type": "existence", "priority": 0})).collect::<Vec<_>>()});
            put(page_path(page), body)
        })
        .collect();
    let mut stream = futures_util::stream::iter(requests).buffer_unordered(8);
    use futures_util::StreamExt;
    while stream.next().await.is_some() {}
    let secs = started.elapsed().as_secs_f64();
    println!("| load the wikispeedia graph through PUT /deps, 8 clients | {edges} | {secs:.1} | {:.0} | | |", edges as f64 / secs);
    let mut fan_in: BTreeMap<&str, usize> = BTreeMap::new();
    for targets in by_page.values() {
        for t in targets {
            *fan_in.entry(t).or_default() += 1;
        }
    }
    let (top, count) = fan_in.iter().max_by_key(|(_, c)| **c).map(|(t, c)| (*t, *c)).unwrap();
    let started = Instant::now();
    let listed: Value = service
        .http
        .get(format!("{}/{DOMAIN}/v1/dependents/{}", service.base, page_path(top)))
        .query(&[("type", "existence"), ("limit", "10000")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(listed["items"].as_array().unwrap().len(), count);
    println!("| list the dependents of its most-linked page ({top}) | {count} | | | {ms:.2} | |");
    println!("\nservice peak resident memory during the walk: {peak:.0} MB");

    // 7. The janitor's graph task over everything, as revstore-janitor drives it.
    println!("{}", janitor_graph_task(&service).await);
    service.stop();

    // The same walk in-process, on the same data (the service stopped).
    let store = match &cassandra {
        None => Store::new(Arc::new(EmbeddedEngine::open(dir.path(), EmbeddedOptions::default()).unwrap())),
        Some(node) => Store::new(Arc::new(
            revstore_storage::CassandraEngine::connect(CassandraOptions::new(vec![node.clone()], keyspace.clone())).await.unwrap(),
        )),
    };
    let graph = Graph::new(store, 10_000);
    let template = title(TEMPLATE);
    let started = Instant::now();
    let (mut seen, mut cursor) = (0usize, None::<String>);
    let mut in_process_progress = Vec::new();
    loop {
        let query = DependentsQuery { kind: ChangeKind::Modification, min_priority: 0, max_priority: 1000, limit: 10_000, cursor };
        let page = graph.dependents(&domain, &template, query).await.unwrap();
        seen += page.items.len();
        in_process_progress.push((seen, started.elapsed().as_secs_f64()));
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!("in-process walk (Graph::dependents, same pages): {seen} edges in {secs:.1} s: {:.0} edges/s", seen as f64 / secs);
    if let Some(node) = &cassandra {
        println!("(keyspace {keyspace} on {node} kept for nodetool; drop it when done)");
    }
    if let Some(path) = arg("--chart") {
        let chart = revstore_bench::chart::LineChart {
            title: format!("Walking one template's {:.1} million dependents, {engine}, pages of 10,000", dependents as f64 / 1e6),
            x_label: "dependents walked (millions)".into(),
            y_label: "edges/s over each twentieth (thousands)".into(),
            log_y: false,
            series: vec![
                revstore_bench::chart::Series::new("over HTTP (GET /dependents)", walk_rates(&http_progress, 20)),
                revstore_bench::chart::Series::new("in-process (Graph::dependents)", walk_rates(&in_process_progress, 20)),
            ],
        };
        chart.write(std::path::Path::new(&path)).expect("write the chart");
        println!("chart: {path}");
    }
}

/// A walk's pace along its length: `progress` holds (edges seen, seconds)
/// after each page; the walk cut into `segments` equal runs of pages, each
/// drawn at its end (millions of edges) with its rate (thousands of edges/s).
fn walk_rates(progress: &[(usize, f64)], segments: usize) -> Vec<(f64, f64)> {
    let per_segment = progress.len().div_ceil(segments).max(1);
    let mut before = (0usize, 0f64);
    progress
        .chunks(per_segment)
        .filter_map(|chunk| {
            let &(seen, secs) = chunk.last()?;
            let rate = (seen - before.0) as f64 / (secs - before.1).max(1e-9);
            before = (seen, secs);
            Some((seen as f64 / 1e6, rate / 1e3))
        })
        .collect()
}

/// A title as one path segment.
fn page_path(title: &str) -> String {
    revstore_api::paths::path_segment(&title.replace(' ', "_"))
}

/// wikispeedia's titles are percent-encoded.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
