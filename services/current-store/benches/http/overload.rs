//! The bench's overload phase (`--overload R,...` reads, `--overload-writes
//! W,...` writes): load offered open loop well past saturation, each answer
//! classed as a success, shed (503 `overloaded`) or another failure
//! (connection errors, timeouts), with the p99 of every answer and the
//! service's peak RSS. `--max-in-flight` passes the service's limit (a huge
//! one turns shedding off, to compare); `--client-connections N` holds the
//! clients to N connections.

#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use revstore_bench::procfs::{PeakRss, cpu_seconds};
use revstore_bench::{OpenLoop, arg, open_loop, percentile_ms};
use revstore_keys::Tid;

use super::writes::next_rev;
use super::{Bench, TOKEN, body, rates};

/// How an answer under overload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Success,
    Shed,
    Failed,
}

/// Failures under overload by kind, printed with the results.
static FAILURES: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());

fn count_failure(why: String) {
    *FAILURES.lock().expect("failures").entry(why).or_insert(0) += 1;
}

fn classify(result: Result<reqwest::Response, reqwest::Error>, success: u16) -> Answer {
    match result {
        Ok(r) if r.status().as_u16() == success => Answer::Success,
        Ok(r) if r.status() == 503 => Answer::Shed,
        Ok(r) => {
            count_failure(format!("status {}", r.status()));
            Answer::Failed
        }
        Err(e) if e.is_timeout() => {
            count_failure("timeout".to_owned());
            Answer::Failed
        }
        Err(e) => {
            // The innermost cause names it (refused, reset, too many open files).
            let mut cause: &dyn std::error::Error = &e;
            while let Some(inner) = cause.source() {
                cause = inner;
            }
            let kind = if e.is_connect() { "connect" } else { "request" };
            count_failure(format!("{kind}: {cause}").chars().take(100).collect());
            Answer::Failed
        }
    }
}

/// One overload run: the open loop, the answers by class, the latencies of
/// the successes (sorted) and the service's peak RSS in KiB.
struct Classified {
    run: OpenLoop,
    counts: [usize; 3],
    successes: Vec<Duration>,
    peak_rss_kib: u64,
}

/// [`open_loop`] with every answer classed, and the largest RSS of `pid` seen meanwhile.
async fn open_loop_classified<F, Fut>(rate: u64, seconds: u64, pid: u32, op: F) -> Classified
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Answer> + Send + 'static,
{
    let answers = Arc::new(Mutex::new(Vec::with_capacity((rate * seconds) as usize)));
    let peak_rss = PeakRss::start(pid);
    let op = Arc::new(op);
    let (service_cpu, generator_cpu) = (cpu_seconds(&pid.to_string()), cpu_seconds("self"));
    // `--client-connections N`: the clients hold at most N requests (so N
    // connections) at once, as a fleet of pooled clients or a proxy would;
    // the rest wait on the client side, and their wait counts in the latency.
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
    Classified { run, counts, successes, peak_rss_kib: peak_rss.kib() }
}

fn row(engine: &str, what: &str, rate: u64, c: &Classified) -> String {
    format!(
        "| {engine} | {what} | {rate} | {} | {:.0} | {} | {} | {:.0} | {:.0} | {:.0} |",
        c.run.latencies.len(),
        // Over the whole run, until the last answer came.
        c.run.achieved * c.counts[Answer::Success as usize] as f64 / c.run.latencies.len().max(1) as f64,
        c.counts[Answer::Shed as usize],
        c.counts[Answer::Failed as usize],
        percentile_ms(&c.run.latencies, 0.99),
        percentile_ms(&c.successes, 0.99),
        c.peak_rss_kib as f64 / 1024.0
    )
}

/// Reads at each `--overload` rate, then writes at each `--overload-writes`
/// rate (half new revisions): a row each.
pub async fn measure(bench: &Bench) -> Vec<String> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).timeout(Duration::from_secs(30)).build().expect("client");
    let mut rows = Vec::new();
    for rate in arg("--overload").map(|_| rates("--overload", "")).unwrap_or_default() {
        let classified = open_loop_classified(rate, bench.seconds, bench.pid, {
            let (http, base, titles) = (http.clone(), bench.base.clone(), bench.titles.clone());
            move |i| {
                let (http, base, titles) = (http.clone(), base.clone(), titles.clone());
                async move {
                    let t = &titles[(i as usize * 7919) % titles.len()];
                    match http.get(format!("{base}/en.wikipedia.org/v1/page/html/{t}")).send().await {
                        Ok(r) if r.status() == 200 => {
                            if r.bytes().await.is_ok() {
                                Answer::Success
                            } else {
                                count_failure("body".into());
                                Answer::Failed
                            }
                        }
                        other => classify(other, 200),
                    }
                }
            }
        })
        .await;
        rows.push(row(&bench.engine, "read latest HTML", rate, &classified));
    }
    let revs: Arc<Vec<AtomicU64>> = Arc::new((0..bench.titles.len()).map(|_| AtomicU64::new(500_000)).collect());
    for rate in arg("--overload-writes").map(|_| rates("--overload-writes", "")).unwrap_or_default() {
        let classified = open_loop_classified(rate, bench.seconds, bench.pid, {
            let (http, base, titles, html, revs) =
                (http.clone(), bench.base.clone(), bench.titles.clone(), bench.html.clone(), revs.clone());
            move |i| {
                let (http, base, titles, html, revs) = (http.clone(), base.clone(), titles.clone(), html.clone(), revs.clone());
                async move {
                    let p = (i as usize * 7919) % titles.len();
                    let rev = next_rev(&revs, p, i);
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
        rows.push(row(&bench.engine, "write renders (1/2 new revisions)", rate, &classified));
    }
    if !rows.is_empty() {
        // What the service says it did with the connections and the excess.
        let metrics = bench.http.get(format!("{}/metrics", bench.base)).send().await.expect("metrics").text().await.expect("text");
        for line in metrics.lines().filter(|l| l.starts_with("http_connections_closed_total") || l.starts_with("http_requests_shed_total"))
        {
            println!("service: {line}");
        }
    }
    rows
}

/// Prints the overload table.
pub fn print(rows: Vec<String>) {
    if rows.is_empty() {
        return;
    }
    println!(
        "\nmax in flight: {}, client connections: {}",
        arg("--max-in-flight").unwrap_or_else(|| "default".into()),
        arg("--client-connections").unwrap_or_else(|| "unbounded".into())
    );
    println!("failures by kind: {:?}", FAILURES.lock().expect("failures"));
    println!(
        "| engine | overload | offered/s | answers | succeeded/s | shed | failed | p99 all ms | p99 successes ms | peak RSS MB |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in rows {
        println!("{r}");
    }
}
