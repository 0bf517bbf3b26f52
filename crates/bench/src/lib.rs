//! What revstore's benchmarks share, so that each bench is its question and
//! its workload, not another copy of the plumbing.
//!
//! # Layout
//! - [`arg`], [`list`], [`parsed`]: the bench's own flags (after `--`).
//! - [`percentile_ms`], [`percentile`]: latency percentiles.
//! - [`open_loop`], [`saturate`]: load at a fixed rate whatever the answers'
//!   pace (latency counted from each request's scheduled time, so queueing
//!   shows), and closed-loop load from a number of workers.
//! - [`procfs`]: a process's resident memory, high-water mark, CPU seconds,
//!   from `/proc`, and a sampler of its peak.
//! - [`chart`]: the SVG pictures in BENCHMARKS.md, drawn by the benches.
//! - [`Process`]: a child process stopped with SIGTERM when dropped;
//!   [`start_service`] starts a service binary on a port it picks itself and
//!   reads the address back from its log.

pub mod chart;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The value after `name` on the bench's command line (`--rate 500`).
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

/// Whether the bare flag `name` is on the command line (`--up`).
pub fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

/// `name`'s value parsed, or `default`; a value that does not parse ends the bench, naming the flag.
pub fn parsed<T: std::str::FromStr>(name: &str, default: T) -> T {
    arg(name).map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{name}: cannot parse {v:?}")))
}

/// `name`'s comma-separated values (or `default`'s), trimmed.
pub fn list(name: &str, default: &str) -> Vec<String> {
    arg(name).unwrap_or_else(|| default.to_owned()).split(',').map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()).collect()
}

/// The `p` quantile (0-1) of sorted latencies, in milliseconds; NaN for none.
pub fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)].as_secs_f64() * 1e3
}

/// The `p` quantile (0-1) of `samples` (sorted here), nearest rank; NaN for none.
pub fn percentile(samples: &mut [f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(f64::total_cmp);
    samples[((samples.len() as f64 * p).ceil() as usize).clamp(1, samples.len()) - 1]
}

/// What an open-loop run saw: every request's latency (sorted), the rate
/// achieved over the run, and how many failed.
#[derive(Debug, Clone)]
pub struct OpenLoop {
    pub latencies: Vec<Duration>,
    pub achieved: f64,
    pub failed: usize,
}

/// Sends `op(i)` at exactly `rate` per second for `seconds`, whatever the
/// answers' pace; each latency counts from the request's scheduled send
/// time. `op` answers whether the request succeeded.
pub async fn open_loop<F, Fut>(rate: u64, seconds: u64, op: F) -> OpenLoop
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    let op = Arc::new(op);
    let total = rate * seconds;
    let t0 = Instant::now() + Duration::from_millis(100);
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        let op = op.clone();
        let scheduled = t0 + Duration::from_micros(i * 1_000_000 / rate.max(1));
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(scheduled.into()).await;
            let ok = op(i).await;
            (scheduled.elapsed(), ok)
        }));
    }
    let (mut latencies, mut failed) = (Vec::with_capacity(tasks.len()), 0);
    for task in tasks {
        let (latency, ok) = task.await.expect("an open-loop request task");
        latencies.push(latency);
        failed += usize::from(!ok);
    }
    let achieved = latencies.len() as f64 / t0.elapsed().as_secs_f64();
    latencies.sort();
    OpenLoop { latencies, achieved, failed }
}

/// Runs `op(i)` from `workers` tasks, each as fast as answers come, for
/// `seconds`: operations per second and every latency (sorted).
pub async fn saturate<F, Fut>(workers: usize, seconds: u64, op: F) -> (f64, Vec<Duration>)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let counter = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (op, counter) = (op.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let i = counter.fetch_add(1, Ordering::Relaxed) as usize;
                let t = Instant::now();
                op(i).await;
                latencies.push(t.elapsed());
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("a saturating worker"));
    }
    let ops = all.len() as f64 / started.elapsed().as_secs_f64();
    all.sort();
    (ops, all)
}

/// A process's figures from `/proc` (Linux).
pub mod procfs {
    use super::*;

    /// A `/proc/PID/status` figure in KiB (`VmRSS:`, `VmHWM:`, `RssAnon:`…).
    pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
    }

    /// A `/proc/PID/status` figure in MB (0 when the process is gone).
    pub fn status_mb(pid: u32, field: &str) -> f64 {
        status_kib(pid, field).unwrap_or(0) as f64 / 1024.0
    }

    /// The resident set, in MB.
    pub fn rss_mb(pid: u32) -> f64 {
        status_mb(pid, "VmRSS:")
    }

    /// The kernel's high-water mark of the resident set over the process's life, in MB.
    pub fn high_water_mb(pid: u32) -> f64 {
        status_mb(pid, "VmHWM:")
    }

    /// The resident set split: anonymous (heaps, stacks; how much in
    /// transparent huge pages), file-backed (the binary's pages), and threads.
    pub fn rss_parts(pid: u32) -> String {
        let threads = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("Threads:").map(|v| v.trim().to_owned()))
            .unwrap_or_default();
        let huge_kib: f64 = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("AnonHugePages:").and_then(|v| v.split_whitespace().next()?.parse().ok()))
            .unwrap_or(0.0);
        format!(
            "anon {:.1} MB ({:.1} MB in huge pages), file {:.1} MB, {threads} threads",
            status_mb(pid, "RssAnon:"),
            huge_kib / 1024.0,
            status_mb(pid, "RssFile:")
        )
    }

    /// CPU seconds (user + system) the process has used, from `/proc/PID/stat`
    /// (`self` for this process).
    pub fn cpu_seconds(pid: &str) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // After the command (which may hold spaces): utime and stime are the 12th and 13th fields.
        let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
        let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
        (ticks(11) + ticks(12)) / 100.0
    }

    /// Samples the resident set of `pid` every 100 ms while it lives; its peak
    /// in KiB, read with [`PeakRss::kib`].
    #[derive(Debug)]
    pub struct PeakRss {
        peak: Arc<AtomicU64>,
        sampler: tokio::task::JoinHandle<()>,
    }

    impl PeakRss {
        pub fn start(pid: u32) -> PeakRss {
            let peak = Arc::new(AtomicU64::new(0));
            let sampler = tokio::spawn({
                let peak = peak.clone();
                async move {
                    while let Some(kib) = status_kib(pid, "VmRSS:") {
                        peak.fetch_max(kib, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            });
            PeakRss { peak, sampler }
        }

        pub fn kib(&self) -> u64 {
            self.peak.load(Ordering::Relaxed)
        }
    }

    impl Drop for PeakRss {
        fn drop(&mut self) {
            self.sampler.abort();
        }
    }
}

/// A child process the bench started: SIGTERM when dropped, so that it drains
/// and exits as in production (and an allocator asked for statistics prints
/// them), SIGKILL if it has not exited 30 s later; a bench that panics leaves
/// no service behind.
#[derive(Debug)]
pub struct Process(pub Child);

impl Process {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.0.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The log filter of a service [`start_service`] starts: warnings, and the
/// launch module's start-up lines (where each service listens).
pub const SERVICE_LOG_FILTER: &str = "warn,revstore_service::launch=info";

/// Where `service` listens, from its `listening` start-up line in `log`.
/// A process told to listen on port 0 binds a free port itself, so no other
/// process can take the port between a bench picking it and the service
/// binding it.
pub fn listening_address(log: &str, service: &str) -> Option<SocketAddr> {
    let named = format!("\"service\":\"{service}\"");
    log.lines().filter(|l| l.contains("\"listening\"") && l.contains(&named)).find_map(|l| {
        let at = l.find("\"address\":\"")? + "\"address\":\"".len();
        l[at..].split('"').next()?.parse().ok()
    })
}

/// Starts a service binary with `command` (its `RUST_LOG`, warnings if it
/// sets none), which asks for port 0 (`--listen
/// 127.0.0.1:0`; `revstore up`: `--current-store-port 0` and the others), its
/// log in `log`, and waits until each of `services` has said where it listens
/// and answers `/readyz`. Returns the process and the services' addresses, in
/// the order asked.
pub async fn start_service(mut command: Command, log: &Path, services: &[&str]) -> (Process, Vec<SocketAddr>) {
    let file = std::fs::File::create(log).expect("the service's log file");
    // The launch module's start-up lines are what say where it listens,
    // whatever else the command asks its log for.
    let asked = command.get_envs().find(|(k, _)| *k == "RUST_LOG").and_then(|(_, v)| v).map(|v| v.to_string_lossy().into_owned());
    command.env("RUST_LOG", asked.map_or(SERVICE_LOG_FILTER.to_owned(), |filter| format!("{filter},revstore_service::launch=info")));
    let child = command.stdout(Stdio::null()).stderr(Stdio::from(file)).spawn().expect("start the service");
    let mut process = Process(child);
    let started = Instant::now();
    let tail = || std::fs::read_to_string(log).unwrap_or_default().lines().rev().take(20).collect::<Vec<_>>().join("\n");
    let addresses = loop {
        let written = std::fs::read_to_string(log).unwrap_or_default();
        let found: Option<Vec<SocketAddr>> = services.iter().map(|s| listening_address(&written, s)).collect();
        if let Some(found) = found {
            break found;
        }
        if let Some(status) = process.0.try_wait().expect("wait") {
            panic!("the service exited ({status}) before it listened:\n{}", tail());
        }
        assert!(started.elapsed() < Duration::from_secs(120), "not listening within 120 s:\n{}", tail());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let http = reqwest::Client::new();
    for address in &addresses {
        while !http.get(format!("http://{address}/readyz")).send().await.is_ok_and(|r| r.status() == 200) {
            if let Some(status) = process.0.try_wait().expect("wait") {
                panic!("the service exited ({status}) before it was ready:\n{}", tail());
            }
            assert!(started.elapsed() < Duration::from_secs(180), "{address} not ready within 180 s:\n{}", tail());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    (process, addresses)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let sorted: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&sorted, 0.5), 51.0);
        assert_eq!(percentile_ms(&sorted, 0.99), 100.0);
        assert!(percentile_ms(&[], 0.5).is_nan());
        let mut samples: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&mut samples, 0.99), 99.0);
        assert_eq!(percentile(&mut samples, 0.5), 50.0);
    }

    #[test]
    fn a_listening_address_is_read_from_its_own_services_line() {
        let log = concat!(
            r#"{"fields":{"message":"listening","service":"old-store","address":"127.0.0.1:37353"}}"#,
            "\n",
            r#"{"fields":{"message":"listening","service":"current-store","address":"127.0.0.1:37427"}}"#,
            "\n",
        );
        assert_eq!(listening_address(log, "current-store"), Some(SocketAddr::from(([127, 0, 0, 1], 37427))));
        assert_eq!(listening_address(log, "old-store"), Some(SocketAddr::from(([127, 0, 0, 1], 37353))));
        assert_eq!(listening_address(log, "dependency-graph"), None);
    }

    #[test]
    fn this_process_has_a_resident_set_and_cpu_time() {
        let pid = std::process::id();
        // The resident set first: the high-water mark read after it covers it.
        let resident = procfs::rss_mb(pid);
        assert!(resident > 0.0);
        assert!(procfs::high_water_mb(pid) >= resident);
        // Spin until the kernel has counted a tick of CPU time (10 ms), not
        // for a span of wall time: on a busy machine 50 ms of wall time may
        // hold less than a tick. A parser that reads nothing never gets there.
        let spin = Instant::now();
        let mut x = 0u64;
        while procfs::cpu_seconds("self") == 0.0 {
            assert!(spin.elapsed() < Duration::from_secs(60), "no CPU time read after a minute of spinning");
            for _ in 0..100_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
        }
        std::hint::black_box(x);
    }
}
