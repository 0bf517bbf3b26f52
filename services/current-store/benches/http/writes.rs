//! The bench's write phases: renders at fixed rates (half new revisions,
//! half re-renders of a page's latest revision, as a wiki re-renders when
//! templates change) beside, on Cassandra, the same rates through the
//! service's write path in this process and as one plain INSERT each; new
//! renders at saturation; and the precedence check after them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use revstore_bench::chart::{LineChart, Series};
use revstore_bench::procfs::cpu_seconds;
use revstore_bench::{arg, open_loop, percentile_ms, saturate};
use revstore_current_store::{Pages, RenderBody};
use revstore_keys::{Domain, Tid, Title, TitleRules};
use revstore_storage::{CassandraOptions, StorageSettings, Store};
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;

use super::{Bench, CONCURRENCY, TOKEN, body, put_render, rates, saturation_row, write_row};

/// The local Cassandra node's process, found by its main class (the bench
/// runs beside the node it measures).
pub fn cassandra_pid() -> Option<String> {
    std::fs::read_dir("/proc").ok()?.filter_map(Result::ok).find_map(|entry| {
        let name = entry.file_name().into_string().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        String::from_utf8_lossy(&cmdline).contains("org.apache.cassandra.service.CassandraDaemon").then_some(name)
    })
}

/// A session on the node, with the baseline's table in the bench keyspace:
/// the consistency the service writes at (LOCAL_QUORUM), the driver's defaults otherwise.
pub async fn plain_kv(node: &str, keyspace: &str) -> Session {
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

/// What a render write is measured against, on Cassandra: one INSERT of a
/// page's HTML (the same bytes, uncompressed) into a plain key-value table,
/// through the same driver, at the same consistency, on the same node; and
/// the service's design called in this process (`Pages::put` on the Store,
/// no HTTP), on another domain's pages, which tells the design's cost from
/// the HTTP service's.
struct Controls {
    session: Arc<Session>,
    insert: Arc<PreparedStatement>,
    pages: Arc<Pages>,
    revs: Arc<Vec<AtomicU64>>,
}

impl Controls {
    async fn connect(bench: &Bench) -> Controls {
        let session = Arc::new(plain_kv(&bench.node, &bench.keyspace).await);
        let insert = session.prepare(format!("INSERT INTO \"{}\".plain_kv (key, value) VALUES (?, ?)", bench.keyspace)).await;
        let options = CassandraOptions::new([bench.node.clone()], bench.keyspace.clone());
        let store = revstore_storage::open(StorageSettings::Cassandra(options)).await.expect("open the store in-process");
        // The service (`--binary`, maybe an older build) created the tables:
        // this build's write path also needs the columns it adds.
        store.ensure_tables(&revstore_schema::tables::current_store::TABLES).await.expect("this build's columns");
        let pages = Arc::new(Pages {
            store,
            grace: bench.grace,
            clock_skew: Duration::ZERO,
            hand_off: true,
            notify_graph: false,
            remembered: Default::default(),
        });
        let loads = bench.titles.iter().enumerate().map(|(i, t)| {
            let (pages, html) = (pages.clone(), &bench.html);
            async move { in_process_put(&pages, t, 1, &body(&html[i % html.len()], 0)).await.expect("load in-process") }
        });
        futures_util::stream::iter(loads).buffer_unordered(CONCURRENCY).collect::<Vec<_>>().await;
        let revs = Arc::new((0..bench.titles.len()).map(|_| AtomicU64::new(1)).collect());
        Controls { session, insert: Arc::new(insert.expect("prepare the baseline")), pages, revs }
    }
}

/// The revision write `i` to page `p` writes: a new one every other write, else the page's latest again.
pub fn next_rev(revs: &[AtomicU64], p: usize, i: u64) -> u64 {
    if i.is_multiple_of(2) { revs[p].fetch_add(1, Ordering::SeqCst) + 1 } else { revs[p].load(Ordering::SeqCst) }
}

/// Phase 5: writes at each `--write-rate` (default 500, 1,000, 1,500/s), open loop,
/// spread over all pages; on Cassandra with the node's and the service's CPU
/// per write, then the same rate in-process and as plain INSERTs. With
/// `--chart PATH`, the p99 of each against the offered rate, drawn to PATH.
pub async fn at_fixed_rates(bench: &Bench) -> Vec<String> {
    let node_pid = (bench.engine == "cassandra").then(cassandra_pid).flatten();
    let controls = match node_pid {
        Some(_) => Some(Controls::connect(bench).await),
        None => None,
    };
    let service_pid = bench.pid.to_string();
    // CPU per write over a run: the node's and the service's (or the bench's own, for the controls).
    let cpu_now = |own: &str| (node_pid.as_deref().map_or(0.0, cpu_seconds), cpu_seconds(own));
    let cpu_per_write = |before: (f64, f64), writes: usize, own: &str| {
        let (node, other) = cpu_now(own);
        ((node - before.0) * 1000.0 / writes.max(1) as f64, (other - before.1) * 1000.0 / writes.max(1) as f64)
    };
    let page_revs: Arc<Vec<AtomicU64>> = Arc::new((0..bench.titles.len()).map(|_| AtomicU64::new(1)).collect());
    let mut rows = Vec::new();
    let mut p99 = [Vec::new(), Vec::new(), Vec::new()];
    // (rate, p99, failures) of current-store over HTTP and of the plain service over HTTP.
    let mut held: [Vec<(u64, f64, usize)>; 2] = [Vec::new(), Vec::new()];
    for rate in rates("--write-rate", "500,1000,1500") {
        let before = cpu_now(&service_pid);
        let run = open_loop(rate, bench.seconds, {
            let (http, base, titles, html, page_revs) =
                (bench.http.clone(), bench.base.clone(), bench.titles.clone(), bench.html.clone(), page_revs.clone());
            move |i| {
                let (http, base, titles, html, page_revs) = (http.clone(), base.clone(), titles.clone(), html.clone(), page_revs.clone());
                async move {
                    let p = (i as usize * 7919) % titles.len();
                    let rev = next_rev(&page_revs, p, i);
                    put_render(&http, &base, &titles[p], rev, &body(&html[i as usize % html.len()], rev)).await
                }
            }
        })
        .await;
        let (node_ms, service_ms) = cpu_per_write(before, run.latencies.len() - run.failed, &service_pid);
        let cpu = node_pid.as_ref().map(|_| format!(" CPU per stored write: node {node_ms:.2} ms, service {service_ms:.2} ms"));
        rows.push(write_row(&bench.engine, &format!("write renders (1/2 new revisions), fixed {rate}/s"), &run, &cpu.unwrap_or_default()));
        p99[0].push((rate as f64, percentile_ms(&run.latencies, 0.99)));
        held[0].push((rate, percentile_ms(&run.latencies, 0.99), run.failed));
        let Some(controls) = &controls else { continue };

        let before = cpu_now("self");
        let run = open_loop(rate, bench.seconds, {
            let (pages, titles, html, revs) = (controls.pages.clone(), bench.titles.clone(), bench.html.clone(), controls.revs.clone());
            move |i| {
                let (pages, titles, html, revs) = (pages.clone(), titles.clone(), html.clone(), revs.clone());
                async move {
                    let p = (i as usize * 7919) % titles.len();
                    let rev = next_rev(&revs, p, i);
                    in_process_put(&pages, &titles[p], rev, &body(&html[i as usize % html.len()], rev)).await.is_ok()
                }
            }
        })
        .await;
        let (node_ms, bench_ms) = cpu_per_write(before, run.latencies.len() - run.failed, "self");
        let extra = format!(" CPU per stored write: node {node_ms:.2} ms, client {bench_ms:.2} ms");
        rows.push(write_row(&bench.engine, &format!("the service's write path in-process (Pages::put), fixed {rate}/s"), &run, &extra));
        p99[1].push((rate as f64, percentile_ms(&run.latencies, 0.99)));

        let before = cpu_now("self");
        let run = open_loop(rate, bench.seconds, {
            let (session, insert, titles, html) =
                (controls.session.clone(), controls.insert.clone(), bench.titles.clone(), bench.html.clone());
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
        let (node_ms, bench_ms) = cpu_per_write(before, run.latencies.len() - run.failed, "self");
        let cpu = format!(" CPU per stored write: node {node_ms:.2} ms, client {bench_ms:.2} ms");
        rows.push(write_row(&bench.engine, &format!("baseline: one INSERT of the page, fixed {rate}/s"), &run, &cpu));
        p99[2].push((rate as f64, percentile_ms(&run.latencies, 0.99)));

        let Some(kv) = &bench.plain_kv else { continue };
        let kv_pid = kv.pid.to_string();
        let before = cpu_now(&kv_pid);
        let run = open_loop(rate, bench.seconds, {
            let (http, titles, html) =
                (bench.http.clone(), Arc::new(bench.titles.iter().map(|t| kv.url(t)).collect::<Vec<_>>()), bench.html.clone());
            move |i| {
                let (http, urls, html) = (http.clone(), titles.clone(), html.clone());
                async move {
                    let p = (i as usize * 7919) % urls.len();
                    let sent = http.put(&urls[p]).body(html[i as usize % html.len()].clone()).send().await;
                    sent.is_ok_and(|r| r.status() == 201)
                }
            }
        })
        .await;
        let (node_ms, kv_ms) = cpu_per_write(before, run.latencies.len() - run.failed, &kv_pid);
        let cpu = format!(" CPU per stored write: node {node_ms:.2} ms, service {kv_ms:.2} ms");
        rows.push(write_row(&bench.engine, &format!("baseline: plain service over HTTP, one INSERT, fixed {rate}/s"), &run, &cpu));
        held[1].push((rate, percentile_ms(&run.latencies, 0.99), run.failed));
    }
    if bench.plain_kv.is_some() {
        bench.note_held("Render writes", &held[0], &held[1]);
    }
    if let Some(path) = arg("--chart") {
        let [service, in_process, insert] = p99;
        let names = ["current-store over HTTP", "its write path in-process (Pages::put)", "one plain INSERT of the page"];
        let chart = LineChart {
            title: format!("Render writes on {}: p99 against the offered rate", bench.engine),
            x_label: "offered writes/s (open loop)".into(),
            y_label: "p99 ms (log)".into(),
            log_y: true,
            series: names
                .iter()
                .zip([service, in_process, insert])
                .filter(|(_, p)| !p.is_empty())
                .map(|(n, p)| Series::new(*n, p))
                .collect(),
        };
        chart.write(std::path::Path::new(&path)).expect("write the chart");
        println!("chart: {path}");
    }
    rows
}

/// Phase 4: new renders from 32 writers as fast as the service stores them: the
/// row and the revision after the newest written.
pub async fn at_saturation(bench: &Bench) -> (String, u64) {
    let next_rev = Arc::new(AtomicU64::new(1_000_000));
    let (per_second, latencies) = saturate(CONCURRENCY, bench.seconds, {
        let (http, base, titles, html, next_rev) =
            (bench.http.clone(), bench.base.clone(), bench.titles.clone(), bench.html.clone(), next_rev.clone());
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
    (saturation_row(&bench.engine, "write new renders, 32 writers", per_second, &latencies), next_rev.load(Ordering::SeqCst))
}

/// Precedence after the write load: each page's latest is the highest revision written to it.
pub async fn check_precedence(store: &Store, titles: &[String], newest_rev: u64) {
    let pages = Pages {
        store: store.clone(),
        grace: Duration::from_secs(86_400),
        clock_skew: Duration::ZERO,
        hand_off: false,
        notify_graph: false,
        remembered: Default::default(),
    };
    let domain = Domain::parse("en.wikipedia.org").expect("domain");
    for t in titles.iter().take(20) {
        let title = Title::parse(t, TitleRules::default()).expect("title");
        let latest = pages.latest(&domain, &title, &["tid"]).await.expect("latest").expect("a render").id;
        let held = pages.held(&domain, &title).await.expect("held");
        let best = held.iter().map(|h| h.rev).max().unwrap_or(0);
        assert_eq!(latest.rev.get(), best.max(latest.rev.get()), "precedence violated on {t}");
        assert!(latest.rev.get() < newest_rev);
    }
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
