//! old-store's resident memory under a long mixed load: does it level off near
//! the block cache plus a fixed overhead, or keep growing?
//!
//! ```text
//! cargo bench -p revstore-old-store --bench soak -- [--minutes 10] [--budget-mb 1024] [--cache-mb 16] [--clients 4] \
//!     [--binary PATH] [--service-args "--body-limit-bytes 2097152 …"] [--mix 60,10]
//! cargo build --release --bin revstore
//! cargo bench -p revstore-old-store --bench soak -- --up --binary target/release/revstore [--budget-mb 1024] …
//! ```
//! With `--up` the process under load is `revstore up --memory-budget-mb`
//! (`--binary` names the `revstore` binary): the same load on its old-store,
//! the three services and the janitor in the process, and its high-water mark
//! against the whole budget they share.
//! It starts the real `revstore-old-store` binary (or `--binary`, e.g. an older
//! build, to compare two side by side) with `--memory-budget-mb` (and
//! `--block-cache-mb` when `--cache-mb` is given; else the budget sizes the
//! cache) and any `--service-args`, loads six
//! titles with the Anarchism HTML history and two with the wikitext histories
//! of shared/data, then runs `--clients` clients for `--minutes`: 60% reads of
//! a random revision of a random title, 10% whole-history NDJSON streams, 30%
//! appends of a new revision (real HTML, so every block keeps growing and
//! compacting). Every 15 s it prints the service's RSS (VmRSS from /proc);
//! at the end it leaves the service idle for 30 s and prints RSS at rest, and
//! the peak RSS of the whole run (VmHWM: the kernel's high-water mark, not a
//! sample) against the budget.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use revstore_bench::procfs::{rss_mb, rss_parts, status_mb};
use revstore_bench::{arg, flag};
use revstore_keys::Tid;
use serde_json::json;

const TOKEN: &str = "old-store-soak-token";
const DOMAIN: &str = "en.wikipedia.org";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let minutes: f64 = arg("--minutes").map_or(10.0, |m| m.parse().expect("--minutes"));
    let cache_mb: Option<u64> = arg("--cache-mb").map(|m| m.parse().expect("--cache-mb"));
    let budget_mb: u64 = arg("--budget-mb").map_or(1024, |m| m.parse().expect("--budget-mb"));
    let service_args: Vec<String> = arg("--service-args").map(|a| a.split_whitespace().map(str::to_owned).collect()).unwrap_or_default();
    let clients: usize = arg("--clients").map_or(4, |c| c.parse().expect("--clients"));
    // Percent of reads and of streams (the rest are writes): `--mix 60,10`.
    let mix: Vec<u32> = arg("--mix").map_or(vec![60, 10], |m| m.split(',').map(|p| p.parse().expect("--mix")).collect());
    let (reads, streams) = (mix[0], mix[0] + mix.get(1).copied().unwrap_or(0));
    let up = flag("--up");
    let binary = match (arg("--binary"), up) {
        (Some(binary), _) => binary,
        (None, false) => env!("CARGO_BIN_EXE_revstore-old-store").to_owned(),
        (None, true) => panic!("--up needs --binary, the revstore binary (cargo build --release --bin revstore)"),
    };
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(&binary);
    if up {
        assert!(cache_mb.is_none() && service_args.is_empty(), "revstore up takes neither --cache-mb nor --service-args");
        command
            .args(["up", "--data-dir", dir.path().to_str().unwrap(), "--memory-budget-mb", &budget_mb.to_string()])
            .args(["--old-store-port", "0", "--current-store-port", "0", "--graph-port", "0"])
            .env("REVSTORE_WRITE_TOKENS", TOKEN);
    } else {
        command
            .args(["--listen", "127.0.0.1:0", "--write-tokens", TOKEN, "--shutdown-delay-secs", "0"])
            .args(["--data-dir", dir.path().to_str().unwrap(), "--settle-secs", "2", "--memory-budget-mb", &budget_mb.to_string()])
            .args(cache_mb.map(|mb| vec!["--block-cache-mb".to_owned(), mb.to_string()]).unwrap_or_default())
            .args(&service_args);
    }
    // The service's log (and an allocator's statistics at exit, with
    // `MIMALLOC_SHOW_STATS=1`) outlives the bench's data directory.
    let log = std::env::temp_dir().join(format!("revstore-soak-{}.log", std::process::id()));
    println!("service log: {}", log.display());
    let (service, addresses) = revstore_bench::start_service(command, &log, &["old-store"]).await;
    let base = format!("http://{}", addresses[0]);
    let pid = service.pid();
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
    println!(
        "binary: {binary}\nbudget: {budget_mb} MB, block cache: {cache_mb:?} MB, {service_args:?}, clients: {clients}, minutes: {minutes}"
    );
    println!("RSS at start: {:.1} MB ({})", rss_mb(pid), rss_parts(pid));

    // The titles and their histories.
    let html = revstore_testdata::anarchism_html();
    let wikitext_a = revstore_testdata::history("enwiki_Anarchism.wikitext", "wikitext");
    let wikitext_f = revstore_testdata::history("webplatform_css_font-size.wikitext", "");
    let mut titles: Vec<(String, &'static str, Arc<Vec<String>>)> = Vec::new();
    let html = Arc::new(html);
    for i in 0..6 {
        titles.push((format!("Soak_html_{i}"), "html", html.clone()));
    }
    titles.push(("Soak_wikitext_a".to_owned(), "wikitext", Arc::new(wikitext_a)));
    titles.push(("Soak_wikitext_f".to_owned(), "wikitext", Arc::new(wikitext_f)));
    let body = |part: &str, text: &str| if part == "html" { json!({ "html": text }) } else { json!({ "wikitext": text }) };
    let mut raw = 0usize;
    for (title, part, history) in &titles {
        for (i, text) in history.iter().enumerate() {
            let url = format!("{}/{DOMAIN}/v1/archive/{title}/{}/{}", base, i + 1, Tid::now());
            let r = http.put(url).bearer_auth(TOKEN).json(&body(part, text)).send().await.unwrap();
            assert_eq!(r.status(), 201);
            raw += text.len();
        }
    }
    println!("loaded {} titles, {:.1} MB raw; RSS {:.1} MB ({})", titles.len(), raw as f64 / 1e6, rss_mb(pid), rss_parts(pid));

    let titles = Arc::new(titles);
    let next_rev: Arc<Vec<AtomicU64>> = Arc::new(titles.iter().map(|(_, _, h)| AtomicU64::new(h.len() as u64 + 1)).collect());
    let counts: Arc<[AtomicU64; 3]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let deadline = Instant::now() + Duration::from_secs_f64(minutes * 60.0);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (http, base, titles, next_rev, counts) = (http.clone(), base.clone(), titles.clone(), next_rev.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let (which, dice) = {
                    let mut rng = rand::rng();
                    (rng.random_range(0..titles.len()), rng.random_range(0..100u32))
                };
                let (title, part, history) = &titles[which];
                if dice < reads {
                    // Loaded revisions only: one appended by another client may not be written yet.
                    let rev = rand::rng().random_range(1..=history.len());
                    let r = http.get(format!("{base}/{DOMAIN}/v1/archive/{part}/{title}/{rev}")).send().await.unwrap();
                    assert_eq!(r.status(), 200, "{title} {rev}");
                    r.bytes().await.unwrap();
                    counts[0].fetch_add(1, Ordering::Relaxed);
                } else if dice < streams {
                    let r = http.get(format!("{base}/{DOMAIN}/v1/archive/history/{title}")).send().await.unwrap();
                    assert_eq!(r.status(), 200);
                    r.bytes().await.unwrap();
                    counts[1].fetch_add(1, Ordering::Relaxed);
                } else {
                    let rev = next_rev[which].fetch_add(1, Ordering::Relaxed);
                    let text = &history[rand::rng().random_range(0..history.len())];
                    let url = format!("{base}/{DOMAIN}/v1/archive/{title}/{rev}/{}", Tid::now());
                    let body = if *part == "html" { json!({ "html": text }) } else { json!({ "wikitext": text }) };
                    let r = http.put(url).bearer_auth(TOKEN).json(&body).send().await.unwrap();
                    assert_eq!(r.status(), 201);
                    counts[2].fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    println!("\n| minute | RSS MB | reads | streams | writes | parts |\n|---|---|---|---|---|---|");
    let load_started = Instant::now();
    let mut samples = Vec::new();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(15).min(deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(10)))
            .await;
        let rss = rss_mb(pid);
        samples.push((load_started.elapsed().as_secs_f64() / 60.0, rss));
        println!(
            "| {:.2} | {rss:.1} | {} | {} | {} | {} |",
            load_started.elapsed().as_secs_f64() / 60.0,
            counts[0].load(Ordering::Relaxed),
            counts[1].load(Ordering::Relaxed),
            counts[2].load(Ordering::Relaxed),
            rss_parts(pid)
        );
    }
    for t in tasks {
        t.await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    let at_rest = rss_mb(pid);
    println!("at rest: {}", rss_parts(pid));
    let peak = samples.iter().map(|s| s.1).fold(0.0, f64::max);
    let half = samples.len() / 2;
    let mean = |s: &[(f64, f64)]| s.iter().map(|x| x.1).sum::<f64>() / s.len().max(1) as f64;
    let high_water = status_mb(pid, "VmHWM:");
    println!(
        "\nRSS: sampled peak {peak:.1} MB; mean first half {:.1} MB, second half {:.1} MB; at rest after 30 s idle {at_rest:.1} MB",
        mean(&samples[..half]),
        mean(&samples[half..])
    );
    println!(
        "peak RSS of the run (VmHWM) {high_water:.1} MB against a budget of {budget_mb} MB: {:.2} of it, {}",
        high_water / budget_mb as f64,
        if high_water <= budget_mb as f64 { "within" } else { "OVER" }
    );
}
