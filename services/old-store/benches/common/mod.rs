//! The real old-store binary as a separate process, for the benchmarks.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use revstore_keys::Tid;

pub const TOKEN: &str = "old-store-bench-token";
pub const DOMAIN: &str = "en.wikipedia.org";

pub use revstore_bench::arg;
pub use revstore_bench::percentile_ms as percentile;

/// The binary to measure: `--binary PATH` (an older build, side by side), or this build's.
pub fn binary() -> PathBuf {
    arg("--binary").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_revstore-old-store")), PathBuf::from)
}

pub struct Service {
    process: revstore_bench::Process,
    /// The service's log.
    _log: tempfile::TempDir,
    pub base: String,
    pub http: reqwest::Client,
}

impl Service {
    /// Starts `binary` on `dir` (settle period 1 s) and waits until it is ready.
    pub async fn start_binary(binary: &Path, dir: &Path, extra: &[&str]) -> Service {
        let mut command = Command::new(binary);
        command
            .args(["--listen", "127.0.0.1:0", "--write-tokens", TOKEN, "--shutdown-delay-secs", "0"])
            .args(["--data-dir", dir.to_str().unwrap(), "--body-limit-bytes", "67108864", "--settle-secs", "1"])
            .args(extra);
        let log = tempfile::tempdir().unwrap();
        let (process, addresses) = revstore_bench::start_service(command, &log.path().join("old-store.log"), &["old-store"]).await;
        let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
        Service { process, _log: log, base: format!("http://{}", addresses[0]), http }
    }

    /// This build's binary (or `--binary`).
    pub async fn start(dir: &Path, extra: &[&str]) -> Service {
        Service::start_binary(&binary(), dir, extra).await
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub async fn archive(&self, title: &str, rev: u64, body: &serde_json::Value) {
        let r = self
            .http
            .put(format!("{}/{DOMAIN}/v1/archive/{title}/{rev}/{}", self.base, Tid::now()))
            .bearer_auth(TOKEN)
            .json(body)
            .send()
            .await
            .expect("archive");
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    }

    async fn pending(&self) -> f64 {
        let metrics = self.http.get(format!("{}/metrics", self.base)).send().await.unwrap().text().await.unwrap();
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("old_store_compactions_pending "))
            .map(|v| v.trim().parse::<f64>().unwrap())
            .unwrap_or(0.0)
    }

    /// Waits until the compactor is at rest: nothing queued, nothing running,
    /// and (where the build keeps its debt in the store) nothing owed. A build
    /// without `/admin/compaction` is taken at its word after two quiet seconds.
    pub async fn at_rest(&self) {
        loop {
            let status = self.http.get(format!("{}/admin/compaction", self.base)).bearer_auth(TOKEN).send().await.unwrap();
            if status.status() == 404 {
                if self.pending().await == 0.0 {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    if self.pending().await == 0.0 {
                        return;
                    }
                }
            } else {
                let status: serde_json::Value = status.json().await.unwrap();
                if status["pending"] == 0 && status["compacting"] == false {
                    let sweep = self.http.post(format!("{}/admin/compaction/sweep", self.base)).bearer_auth(TOKEN).send().await.unwrap();
                    let sweep: serde_json::Value = sweep.json().await.unwrap();
                    if sweep["markers"] == 0 {
                        return;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until nothing is queued (compactions may still be running).
    pub async fn settle(&self) {
        while self.pending().await != 0.0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGTERM, then wait: a clean shutdown.
    pub fn stop(self) {
        drop(self.process);
    }
}

/// Archives `titles` copies of a history (`Title_0`, …; revisions 1, 2, …),
/// one writer per title, all at once.
pub async fn archive_copies(service: &Arc<Service>, titles: usize, history: &Arc<Vec<String>>) {
    let mut writers = Vec::new();
    for t in 0..titles {
        let (service, history) = (service.clone(), history.clone());
        writers.push(tokio::spawn(async move {
            for (i, h) in history.iter().enumerate() {
                service.archive(&format!("Title_{t}"), 1 + i as u64, &serde_json::json!({ "html": h })).await;
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
}

/// Bytes in the files of a data directory.
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).unwrap().filter_map(|e| e.ok()).filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum()
}

/// What random reads measured: latencies sorted, and the wall time they took.
pub struct Reads {
    pub latencies: Vec<Duration>,
    pub elapsed: Duration,
}

impl Reads {
    /// `| label | p50 | p99 | max | reads/s |`, milliseconds with `decimals` places.
    pub fn row(&self, label: &str, decimals: usize) -> String {
        let l = &self.latencies;
        format!(
            "| {label} | {:.decimals$} | {:.decimals$} | {:.decimals$} | {:.0} |",
            percentile(l, 0.5),
            percentile(l, 0.99),
            l.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
            l.len() as f64 / self.elapsed.as_secs_f64()
        )
    }
}

/// `reads` GETs from `clients` clients in a closed loop, each of the path
/// `pick` chooses, checked against the body it gives.
pub async fn random_reads(
    service: &Arc<Service>,
    clients: usize,
    reads: usize,
    pick: impl Fn() -> (String, Arc<[u8]>) + Send + Sync + 'static,
) -> Reads {
    let pick = Arc::new(pick);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (service, pick) = (service.clone(), pick.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(reads / clients);
            for _ in 0..reads / clients {
                let (path, expected) = pick();
                let sent = Instant::now();
                let r = service.http.get(format!("{}{path}", service.base)).send().await.unwrap();
                assert_eq!(r.status(), 200, "{path}");
                let body = r.bytes().await.unwrap();
                latencies.push(sent.elapsed());
                assert!(body == *expected, "{path} reads back different");
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed();
    latencies.sort();
    Reads { latencies, elapsed }
}
