//! The bench's read phases: the latest HTML of the loaded pages at fixed
//! rates (open loop), at saturation over HTTP, and the same reads straight
//! from the `Store` in this process (their ratio is the HTTP stack's cost).

use std::sync::Arc;
use std::time::Duration;

use revstore_bench::{OpenLoop, open_loop, saturate};
use revstore_current_store::{Pages, decode_part};
use revstore_keys::{Domain, Title, TitleRules};
use revstore_storage::Store;

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

/// Phase 1: reads at each `--rate` (default 1,000/s).
pub async fn at_fixed_rates(bench: &Bench) -> Vec<String> {
    let mut rows = Vec::new();
    for rate in rates("--rate", "1000") {
        let run = read_latest_html(&bench.http, &bench.base, &bench.titles, rate, bench.seconds).await;
        rows.push(write_row(&bench.engine, &format!("read latest HTML, fixed {rate}/s"), &run, ""));
    }
    rows
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
    let pages = Pages { store, grace: Duration::from_secs(86_400), clock_skew: Duration::ZERO, hand_off: false, notify_graph: false };
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
