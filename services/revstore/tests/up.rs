//! `revstore up` as a user runs it: the real binary, on free ports, the three
//! services wired to each other, stopped by SIGTERM.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn until<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < Duration::from_secs(60), "{what}: not within 60 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_runs_the_three_services_wired_together_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (current, old, graph) = (free_port(), free_port(), free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_revstore"))
        .args(["up", "--data-dir", dir.path().to_str().expect("utf-8")])
        .args(["--current-store-port", &current.to_string(), "--old-store-port", &old.to_string(), "--graph-port", &graph.to_string()])
        .env_remove("REVSTORE_WRITE_TOKENS")
        .env_remove("REVSTORE_CASSANDRA")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start revstore up");
    let mut running = Running(child);
    let http = reqwest::Client::new();
    for port in [current, old, graph] {
        let url = format!("http://127.0.0.1:{port}/readyz");
        until(&url, || {
            let request = http.get(&url).send();
            async move { request.await.is_ok_and(|r| r.status() == 200) }
        })
        .await;
    }
    // The generated token is kept in the data directory, for the owner only.
    let token_file = dir.path().join("write-token");
    let token = std::fs::read_to_string(&token_file).expect("the write token").trim().to_owned();
    assert!(token.len() >= 32, "{token}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&token_file).expect("metadata").permissions().mode() & 0o777, 0o600);
    }
    for service in ["current-store", "old-store", "dependency-graph"] {
        assert!(dir.path().join(service).is_dir(), "{service} has no data directory");
    }

    // A page that depends on Main_Page, then a new revision of Main_Page.
    let put_deps = http
        .put(format!("http://127.0.0.1:{graph}/en.wikipedia.org/v1/deps/Portal:Main"))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(DEPENDS_ON_MAIN_PAGE)
        .send()
        .await
        .expect("deps");
    assert!(put_deps.status().is_success(), "{:?}", put_deps.status());
    let written = http
        .post(format!("http://127.0.0.1:{current}/en.wikipedia.org/v1/page/Main_Page/1"))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(r#"{"html":"<p>Hello</p>","data-parsoid":{},"section-offsets":{}}"#)
        .send()
        .await
        .expect("write");
    assert_eq!(written.status(), 201);

    // current-store handed the revision to old-store and told the graph.
    let archived = format!("http://127.0.0.1:{old}/en.wikipedia.org/v1/archive/html/Main_Page/1");
    until("the hand-off to old-store", || {
        let request = http.get(&archived).send();
        async move {
            match request.await {
                Ok(r) if r.status() == 200 => r.text().await.is_ok_and(|t| t == "<p>Hello</p>"),
                _ => false,
            }
        }
    })
    .await;
    let pending = format!("http://127.0.0.1:{graph}/en.wikipedia.org/v1/pending/Portal:Main");
    until("the change notice to the graph", || {
        let request = http.get(&pending).send();
        async move {
            match request.await {
                Ok(r) if r.status() == 200 => r.text().await.is_ok_and(|t| t.contains("\"needs_update\":true")),
                _ => false,
            }
        }
    })
    .await;

    // SIGTERM drains and stops everything, exit 0.
    let pid = running.0.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = running.0.try_wait().expect("wait") {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "revstore up did not stop within 60 s of SIGTERM");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status:?}");
    assert!(http.get(format!("http://127.0.0.1:{current}/healthz")).send().await.is_err(), "still serving after it stopped");
}

const DEPENDS_ON_MAIN_PAGE: &str = r#"{"edges":[{"parent":"Main_Page","type":"modification","priority":1}]}"#;
