//! The bench's read phases: the latest HTML of the loaded pages at fixed
//! rates (open loop), at saturation over HTTP, and the same reads straight
//! from the `Store` in this process (their ratio is the HTTP stack's cost).

use std::sync::Arc;
use std::time::Duration;

use revstore_bench::procfs::cpu_seconds;
use revstore_bench::{OpenLoop, open_loop, percentile_ms, saturate};
use revstore_current_store::{Pages, decode_part};
use revstore_keys::{Domain, Title, TitleRules};
use revstore_storage::Store;

use super::plain_kv::PlainKv;
use super::{Bench, CONCURRENCY, rates, saturation_row, write_row};

/// Readers of the pages' latest HTML at `rate` for `seconds` (open loop).
pub async fn read_latest_html(http: &reqwest::Client, base: &str, titles: &Arc<Vec<String>>, rate: u64, seconds: u64) -> OpenLoop {
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

/// Phase 1: reads at each `--rate` (default 1,000/s); on Cassandra, each
/// rate then as the plain key-value service's reads of the same pages, with
/// the node's and each service's CPU per read.
pub async fn at_fixed_rates(bench: &Bench) -> Vec<String> {
    let node_pid = (bench.engine == "cassandra").then(super::writes::cassandra_pid).flatten();
    let cpu_now = |pid: u32| (node_pid.as_deref().map_or(0.0, cpu_seconds), cpu_seconds(&pid.to_string()));
    let cpu_note = |before: (f64, f64), run: &OpenLoop, pid: u32| match node_pid {
        Some(_) => {
            let (node, service) = cpu_now(pid);
            let reads = (run.latencies.len() - run.failed).max(1) as f64;
            format!(
                " CPU per read: node {:.2} ms, service {:.2} ms",
                (node - before.0) * 1000.0 / reads,
                (service - before.1) * 1000.0 / reads
            )
        }
        None => String::new(),
    };
    let (mut rows, mut service, mut plain) = (Vec::new(), Vec::new(), Vec::new());
    for rate in rates("--rate", "1000") {
        let before = cpu_now(bench.pid);
        let run = read_latest_html(&bench.http, &bench.base, &bench.titles, rate, bench.seconds).await;
        rows.push(write_row(&bench.engine, &format!("read latest HTML, fixed {rate}/s"), &run, &cpu_note(before, &run, bench.pid)));
        service.push((rate, percentile_ms(&run.latencies, 0.99), run.failed));
        let Some(kv) = &bench.plain_kv else { continue };
        let before = cpu_now(kv.pid);
        let run = read_plain(&bench.http, kv, &bench.titles, rate, bench.seconds).await;
        rows.push(write_row(
            &bench.engine,
            &format!("baseline: plain service over HTTP, one SELECT, fixed {rate}/s"),
            &run,
            &cpu_note(before, &run, kv.pid),
        ));
        plain.push((rate, percentile_ms(&run.latencies, 0.99), run.failed));
    }
    if bench.plain_kv.is_some() {
        bench.note_held("Latest reads", &service, &plain);
    }
    rows
}

/// The plain key-value service's reads of the same pages, in the same order.
async fn read_plain(http: &reqwest::Client, kv: &PlainKv, titles: &Arc<Vec<String>>, rate: u64, seconds: u64) -> OpenLoop {
    let (http, urls) = (http.clone(), Arc::new(titles.iter().map(|t| kv.url(t)).collect::<Vec<_>>()));
    open_loop(rate, seconds, move |i| {
        let (http, urls) = (http.clone(), urls.clone());
        async move {
            match http.get(&urls[(i as usize * 7919) % urls.len()]).send().await {
                Ok(r) => r.status() == 200 && r.bytes().await.is_ok(),
                Err(_) => false,
            }
        }
    })
    .await
}

/// Phase 2: reads from 32 connections as fast as the service answers: the row and the reads per second.
pub async fn at_saturation(bench: &Bench) -> (String, f64) {
    let (per_second, latencies) = saturate(CONCURRENCY, bench.seconds, {
        let (http, base, titles) = (bench.http.clone(), bench.base.clone(), bench.titles.clone());
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
    (saturation_row(&bench.engine, "read latest HTML, saturation over HTTP", per_second, &latencies), per_second)
}

/// Phase 3: the same reads through the service's own code on `store`, no HTTP:
/// the row and the reads per second.
pub async fn from_the_store(bench: &Bench, store: Store) -> (String, f64) {
    let pages = Pages {
        store,
        grace: Duration::from_secs(86_400),
        clock_skew: Duration::ZERO,
        hand_off: false,
        notify_graph: false,
        remembered: Default::default(),
    };
    let domain = Domain::parse("en.wikipedia.org").expect("domain");
    let (per_second, latencies) = saturate(CONCURRENCY, bench.seconds, {
        let titles = bench.titles.clone();
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
    (saturation_row(&bench.engine, "read latest HTML, saturation, Store in-process", per_second, &latencies), per_second)
}
