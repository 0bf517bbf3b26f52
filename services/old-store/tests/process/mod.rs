//! The real old-store binary as a child process, for tests that kill it,
//! stop it with SIGTERM or fill its disk.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The old-store binary, its address, and the lines it logged.
pub struct Running {
    child: Child,
    base: String,
    logs: std::sync::mpsc::Receiver<String>,
}

impl Running {
    /// Starts old-store with `args` (and a listener on port 0, JSON logs) and
    /// waits until it says where it listens.
    pub fn start(args: &[String]) -> Running {
        let mut child = Command::new(env!("CARGO_BIN_EXE_revstore-old-store"))
            .args(["--listen", "127.0.0.1:0", "--shutdown-delay-secs", "0"])
            .args(args)
            .env("RUST_LOG", "info")
            .env("REVSTORE_LOG_FORMAT", "json")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start old-store");
        let stderr = child.stderr.take().expect("stderr");
        let (lines, logs) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    return;
                }
            }
        });
        let started = Instant::now();
        let base = loop {
            let line = logs.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| {
                let status = child.try_wait().ok().flatten();
                let said: Vec<String> = logs.try_iter().collect();
                panic!("old-store did not say where it listens (exit status: {status:?}); it said: {said:?}")
            });
            if line.contains("\"ERROR\"") {
                eprintln!("old-store: {line}");
            }
            if line.contains("\"listening\"") {
                let log: serde_json::Value = serde_json::from_str(&line).expect("a JSON log line");
                break format!("http://{}", log["fields"]["address"].as_str().expect("address"));
            }
            assert!(started.elapsed() < Duration::from_secs(60), "old-store did not start");
        };
        Running { child, base, logs }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn kill_9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// Sends SIGTERM and waits for the exit; how long it took.
    pub fn terminate(mut self) -> Duration {
        let sent = Instant::now();
        let status = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().expect("run kill");
        assert!(status.success(), "kill -TERM failed");
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "old-store exited with {status} on SIGTERM");
                return sent.elapsed();
            }
            assert!(sent.elapsed() < Duration::from_secs(60), "old-store did not exit within 60 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The lines logged so far.
    pub fn logged(&self) -> Vec<String> {
        self.logs.try_iter().collect()
    }

    /// Waits until `/readyz` answers 200, and returns its answer.
    pub async fn ready(&self, http: &reqwest::Client) -> serde_json::Value {
        let started = Instant::now();
        loop {
            if let Ok(r) = http.get(self.url("/readyz")).send().await
                && r.status() == 200
            {
                return r.json().await.expect("json");
            }
            assert!(started.elapsed() < Duration::from_secs(60), "old-store did not become ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The value of an unlabelled metric (or one with exactly these labels), or 0.
    pub async fn metric(&self, http: &reqwest::Client, name_and_labels: &str) -> f64 {
        let text = http.get(self.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
        text.lines()
            .find_map(|l| l.strip_prefix(name_and_labels).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
