//! `revstore up` and `revstore import` as a user runs them: the real binary,
//! on free ports, the three services wired to each other, the sample wiki
//! loaded, stopped by SIGTERM.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use revstore_test_service::eventually;

/// The ports of current-store, old-store and the graph, from the line
/// `revstore up` prints once its services listen (started on port 0: each
/// binds a free port itself, so no other process can take one first).
fn ports_printed(printed: &str) -> Option<(u16, u16, u16)> {
    let line = printed.lines().find(|l| l.starts_with("revstore is up:"))?;
    let port = |service: &str| -> Option<u16> {
        let at = line.find(&format!("{service} http://"))? + service.len() + " http://".len();
        line[at..].split([',', ';']).next()?.rsplit(':').next()?.parse().ok()
    };
    Some((port("current-store")?, port("old-store")?, port("dependency-graph")?))
}

/// Waits for `revstore up`'s start-up line in `stdout` (a file); its ports.
async fn ports_of(stdout: &std::path::Path) -> (u16, u16, u16) {
    let mut ports = None;
    eventually("revstore up says where it listens", WAIT, async || {
        ports = ports_printed(&std::fs::read_to_string(stdout).unwrap_or_default());
        ports.is_some()
    })
    .await;
    ports.expect("the ports")
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How long `revstore up` may take to show a state.
const WAIT: Duration = Duration::from_secs(60);

/// `revstore up` on free ports, ready: the process and the ports of
/// current-store, old-store and the graph.
async fn up(dir: &std::path::Path) -> (Running, u16, u16, u16) {
    up_with(dir, &[]).await
}

async fn up_with(dir: &std::path::Path, extra: &[&str]) -> (Running, u16, u16, u16) {
    // In the data directory, which a backup ignores (it copies databases).
    std::fs::create_dir_all(dir).expect("the data directory");
    let stdout = dir.join("up.stdout");
    let child = Command::new(env!("CARGO_BIN_EXE_revstore"))
        .args(["up", "--data-dir", dir.to_str().expect("utf-8")])
        .args(["--current-store-port", "0", "--old-store-port", "0", "--graph-port", "0"])
        .args(extra)
        .env_remove("REVSTORE_WRITE_TOKENS")
        .env_remove("REVSTORE_CASSANDRA")
        .env_remove("REVSTORE_MEMORY_BUDGET_MB")
        // Variables meant for the service binaries do not reach `revstore up`'s
        // services: with these leaking, reads would need a token, the
        // in-flight limit would refuse to start, and hand-offs would go to a dead port.
        .env("REVSTORE_READ_TOKENS", "a-read-token-nobody-sends-0123")
        .env("REVSTORE_MAX_IN_FLIGHT", "0")
        .env("REVSTORE_OLD_STORE_URL", "http://127.0.0.1:9")
        .env("REVSTORE_GRAPH_URL", "http://127.0.0.1:9")
        .env("REVSTORE_LISTEN", "127.0.0.1:9")
        .env("REVSTORE_JANITOR_LEASE_SECS", "1")
        .env("RUST_LOG", "warn")
        .stdout(std::fs::File::create(&stdout).expect("a stdout file"))
        .spawn()
        .expect("start revstore up");
    let running = Running(child);
    let (current, old, graph) = ports_of(&stdout).await;
    let http = reqwest::Client::new();
    for port in [current, old, graph] {
        let url = format!("http://127.0.0.1:{port}/readyz");
        eventually(&url, WAIT, || {
            let request = http.get(&url).send();
            async move { request.await.is_ok_and(|r| r.status() == 200) }
        })
        .await;
    }
    (running, current, old, graph)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_runs_the_three_services_wired_together_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut running, current, old, graph) = up(dir.path()).await;
    let http = reqwest::Client::new();
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
    eventually("the hand-off to old-store", WAIT, || {
        let request = http.get(&archived).send();
        async move {
            match request.await {
                Ok(r) if r.status() == 200 => r.text().await.is_ok_and(|t| t == "<p>Hello</p>"),
                _ => false,
            }
        }
    })
    .await;
    // One process, three services: each /metrics tells its own series, by
    // their `service` label (current-store's once showed old-store's compactor).
    let metrics = |port: u16| {
        let request = http.get(format!("http://127.0.0.1:{port}/metrics")).send();
        async move { request.await.expect("metrics").text().await.expect("text") }
    };
    let (current_metrics, old_metrics) = (metrics(current).await, metrics(old).await);
    assert!(!current_metrics.contains("compactor") && !current_metrics.contains("old_store_"), "{current_metrics}");
    assert!(current_metrics.contains("worker_state{service=\"current-store\",worker=\"outbox\""), "{current_metrics}");
    assert!(old_metrics.contains("worker_state{service=\"old-store\",worker=\"compactor\""), "{old_metrics}");
    for (service, text) in [("current-store", &current_metrics), ("old-store", &old_metrics)] {
        for series in ["worker_state{", "worker_steps_total{", "http_open_connections{", "storage_operation_duration_seconds_count{"] {
            let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(series)).collect();
            assert!(!lines.is_empty(), "{service} has no {series}: {text}");
            for line in lines {
                assert!(line.contains(&format!("service=\"{service}\"")), "{service}'s /metrics: {line}");
            }
        }
    }
    let pending = format!("http://127.0.0.1:{graph}/en.wikipedia.org/v1/pending/Portal:Main");
    eventually("the change notice to the graph", WAIT, || {
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

/// `revstore import` of the sample wiki against a running `revstore up`, as
/// the README shows it: the token found in the data directory, the services
/// at the addresses given by the environment.
fn import(dir: &std::path::Path, old: u16, graph: u16, extra: &[&str]) -> std::process::Output {
    let dump = revstore_testdata::shared_data().join("dumps/aawiki-20260101-pages-meta-history.xml.7z");
    Command::new(env!("CARGO_BIN_EXE_revstore"))
        .arg("import")
        .args(extra)
        .arg(&dump)
        .env("REVSTORE_DATA_DIR", dir)
        .env("REVSTORE_OLD_STORE_URL", format!("http://127.0.0.1:{old}"))
        .env("REVSTORE_GRAPH_URL", format!("http://127.0.0.1:{graph}"))
        .env_remove("REVSTORE_WRITE_TOKENS")
        .env_remove("REVSTORE_WRITE_TOKENS_FILE")
        .output()
        .expect("run revstore import")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_loads_the_sample_wiki_history_and_templates_into_the_running_system() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_running, _current, old, graph) = up(dir.path()).await;

    let imported = import(dir.path(), old, graph, &[]);
    let report = String::from_utf8_lossy(&imported.stderr);
    assert!(imported.status.success(), "{report}");
    // shared/data/README.md: 507 pages, 1,307 revisions; every page's latest revision read for templates.
    assert!(report.contains("pages 507, revisions 1307"), "{report}");
    assert!(report.contains("stored 1307,") && report.contains("failed 0;") && report.contains("dependency sets 507 with"), "{report}");

    // The README's questions. A page's history: Main Page has 81 revisions.
    let http = reqwest::Client::new();
    let mut revisions = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("http://127.0.0.1:{old}/aa.wikipedia.org/v1/archive/revisions/Main_Page?limit=50");
        if let Some(cursor) = &cursor {
            url.push_str(&format!("&cursor={cursor}"));
        }
        let page: serde_json::Value = http.get(&url).send().await.expect("history").json().await.expect("json");
        revisions.extend(page["items"].as_array().expect("items").iter().map(|item| item["rev"].as_u64().expect("rev")));
        match page["next"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(revisions.len(), 81, "{revisions:?}");
    // An old revision, byte for byte as the dump has it.
    let first = http
        .get(format!("http://127.0.0.1:{old}/aa.wikipedia.org/v1/archive/wikitext/Main_Page/{}", revisions[0]))
        .send()
        .await
        .expect("old revision");
    assert_eq!(first.status(), 200);
    assert!(!first.text().await.expect("text").is_empty());
    // The dependents of a template: Babel boxes on user pages.
    let dependents: serde_json::Value = http
        .get(format!("http://127.0.0.1:{graph}/aa.wikipedia.org/v1/dependents/Template:Babel?limit=1000"))
        .send()
        .await
        .expect("dependents")
        .json()
        .await
        .expect("json");
    let children: Vec<&str> = dependents["items"].as_array().expect("items").iter().map(|d| d["child"].as_str().expect("child")).collect();
    assert!(children.len() >= 10 && children.iter().all(|c| c.starts_with("User")), "{children:?}");

    // A dump of the wiki's history holds every imported revision once.
    let out = tempfile::tempdir().expect("tempdir");
    let dumped = Command::new(env!("CARGO_BIN_EXE_revstore"))
        .args(["dump", "--history", "--domain", "aa.wikipedia.org", "--parts", "wikitext", "--parallel", "3", "--date", "20260101"])
        .args(["--out", out.path().to_str().expect("utf-8"), "--old-store-url", &format!("http://127.0.0.1:{old}")])
        .output()
        .expect("run revstore dump");
    assert!(dumped.status.success(), "{}", String::from_utf8_lossy(&dumped.stderr));
    assert!(String::from_utf8_lossy(&dumped.stdout).contains("dumped 1307 revisions of aa.wikipedia.org in 3 shards"));
    let mut seen = std::collections::BTreeSet::new();
    let mut main_page = 0;
    for k in 0..3 {
        let shard = std::fs::read(out.path().join(format!("aa.wikipedia.org-20260101-history-{k}-of-3.ndjson.zst"))).expect("shard");
        let text = zstd::decode_all(shard.as_slice()).expect("zstd");
        for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let line: serde_json::Value = serde_json::from_slice(line).expect("json");
            assert!(line["wikitext"].is_string() && line.get("html").is_none(), "{line}");
            let title = line["title"].as_str().expect("title").to_owned();
            main_page += usize::from(title == "Main_Page");
            assert!(seen.insert((title, line["rev"].as_u64().expect("rev"))), "a revision twice: {line}");
        }
    }
    assert_eq!((seen.len(), main_page), (1307, 81), "the import's 1,307 revisions, Main Page's 81");

    // Read back, everything identical; a second import changes nothing.
    let verified = import(dir.path(), old, graph, &["--verify"]);
    let report = String::from_utf8_lossy(&verified.stderr);
    assert!(verified.status.success() && report.contains("read back identical 1307, different or missing 0, failed 0"), "{report}");
    let again = import(dir.path(), old, graph, &[]);
    let report = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success() && report.contains("stored 0, already there 1307"), "{report}");
}

#[test]
fn import_without_a_token_or_a_readable_dump_fails_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No token anywhere: refused before anything is sent (nothing listens on port 9).
    let no_token = import(dir.path(), 9, 9, &[]);
    assert_eq!(no_token.status.code(), Some(66));
    assert!(String::from_utf8_lossy(&no_token.stderr).contains("no write token"), "{:?}", no_token);
    // A token, but the dump is not a dump.
    std::fs::write(dir.path().join("write-token"), "import-test-token-0123456789\n").expect("token");
    let import_of = |file: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_revstore"))
            .args(["import", file.to_str().expect("utf-8")])
            .env("REVSTORE_DATA_DIR", dir.path())
            .env("REVSTORE_OLD_STORE_URL", "http://127.0.0.1:9")
            .env("REVSTORE_GRAPH_URL", "http://127.0.0.1:9")
            .env_remove("REVSTORE_WRITE_TOKENS")
            .env_remove("REVSTORE_WRITE_TOKENS_FILE")
            .output()
            .expect("run revstore import")
    };
    // Files that are no MediaWiki export (they once imported "pages 0" with
    // exit 0): 66, named, before any service is asked.
    let random: Vec<u8> = (0..65_536u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    for (name, bytes) in [("not-a-dump.xml.bz2", &b"plain text"[..]), ("empty.xml", b""), ("random.xml", &random)] {
        let file = dir.path().join(name);
        std::fs::write(&file, bytes).expect("file");
        let output = import_of(&file);
        assert_eq!(output.status.code(), Some(66), "{name}: {output:?}");
        assert!(String::from_utf8_lossy(&output.stderr).contains(name), "{output:?}");
    }
    // A real dump with the services down: said at once, before the dump is
    // read (it once took 49 s and 600 failures to exit 1).
    let dump = revstore_testdata::shared_data().join("dumps/aawiki-20260101-pages-meta-history.xml.7z");
    let output = import_of(&dump);
    assert_eq!(output.status.code(), Some(69), "{output:?}");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("old-store at http://127.0.0.1:9 is not ready") && said.lines().count() == 1, "{said}");
}

/// `revstore backup` and `revstore restore` as OPERATIONS.md gives them.
fn revstore(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_revstore")).args(args).output().expect("run revstore")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_up_restores_the_system_as_it_was() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (mut running, current, _old, _graph) = up(&data).await;
    let token = std::fs::read_to_string(data.join("write-token")).expect("token").trim().to_owned();
    let http = reqwest::Client::new();
    let write = |rev: u64, html: &'static str| {
        let request = http
            .post(format!("http://127.0.0.1:{current}/en.wikipedia.org/v1/page/Backed_up/{rev}"))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(format!(r#"{{"html":"{html}","data-parsoid":{{}},"section-offsets":{{}}}}"#))
            .send();
        async move { assert_eq!(request.await.expect("write").status(), 201) }
    };
    write(1, "<p>before the backup</p>").await;

    // Taken while the services run and write.
    let backup = dir.path().join("backup");
    let taken = revstore(&["backup".as_ref(), data.as_os_str(), backup.as_os_str()]);
    assert!(taken.status.success(), "{taken:?}");
    let report = String::from_utf8_lossy(&taken.stderr);
    for service in ["current-store", "dependency-graph", "old-store"] {
        assert!(report.contains(&format!("{service}/revstore.db")), "{report}");
    }
    write(2, "<p>after the backup</p>").await;
    // Never over an existing backup, never into a running system.
    assert_eq!(revstore(&["backup".as_ref(), data.as_os_str(), backup.as_os_str()]).status.code(), Some(65));
    assert_eq!(revstore(&["restore".as_ref(), backup.as_os_str(), data.as_os_str()]).status.code(), Some(75));

    let pid = running.0.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
    let _ = running.0.wait();

    let restored = dir.path().join("restored");
    let put_back = revstore(&["restore".as_ref(), backup.as_os_str(), restored.as_os_str()]);
    assert!(put_back.status.success(), "{put_back:?}");
    let (_running, current, _old, _graph) = up(&restored).await;
    assert_eq!(std::fs::read_to_string(restored.join("write-token")).expect("token").trim(), token, "the token comes back too");
    let latest = http
        .get(format!("http://127.0.0.1:{current}/en.wikipedia.org/v1/page/html/Backed_up"))
        .send()
        .await
        .expect("read")
        .text()
        .await
        .expect("text");
    assert_eq!(latest, "<p>before the backup</p>", "the system as it was when the backup was taken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_janitor_runs_on_its_schedule_each_run_complete_and_with_its_own_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_running, _current, _old, _graph) = up_with(dir.path(), &["--janitor-every-secs", "1"]).await;
    let summary_file = dir.path().join("janitor.json");
    let mut runs = std::collections::BTreeSet::new();
    eventually("two janitor runs", WAIT, || {
        let summary: Option<serde_json::Value> = std::fs::read(&summary_file).ok().and_then(|b| serde_json::from_slice(&b).ok());
        if let Some(summary) = summary {
            assert_eq!(summary["status"], "completed", "{summary}");
            runs.insert(summary["run"].as_str().expect("run id").to_owned());
        }
        let two = runs.len() >= 2;
        async move { two }
    })
    .await;
}

/// A second `revstore up` on a directory in use is refused, and changes
/// nothing there: it once rewrote `DIR/write-token` with its own token before
/// it found the directory locked, and every janitor run of the live system
/// then failed with 403. The token is not printed either: stdout of the image's
/// `up` lands in container logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_up_on_a_directory_in_use_changes_nothing_and_no_token_is_printed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let given = "given-write-token-0123456789";
    let stdout = dir.path().join("first.out");
    let data = dir.path().join("data");
    let first = Command::new(env!("CARGO_BIN_EXE_revstore"))
        .args(["up", "--data-dir", data.to_str().expect("utf-8")])
        .args(["--current-store-port", "0", "--old-store-port", "0", "--graph-port", "0"])
        .env("REVSTORE_WRITE_TOKENS", given)
        .env_remove("REVSTORE_CASSANDRA")
        .env("RUST_LOG", "warn")
        .stdout(std::fs::File::create(&stdout).expect("stdout file"))
        .spawn()
        .expect("start revstore up");
    let _first = Running(first);
    let (current, _, _) = ports_of(&stdout).await;
    let http = reqwest::Client::new();
    let ready = format!("http://127.0.0.1:{current}/readyz");
    eventually(&ready, WAIT, || {
        let request = http.get(&ready).send();
        async move { request.await.is_ok_and(|r| r.status() == 200) }
    })
    .await;
    let printed = std::fs::read_to_string(&stdout).expect("stdout");
    assert!(printed.contains("revstore is up") && printed.contains("write-token"), "{printed}");
    assert!(!printed.contains(given), "the token was printed: {printed}");
    let kept = std::fs::read_to_string(data.join("write-token")).expect("token");

    let second = Command::new(env!("CARGO_BIN_EXE_revstore"))
        .args(["up", "--data-dir", data.to_str().expect("utf-8")])
        .args(["--current-store-port", "0", "--old-store-port", "0", "--graph-port", "0"])
        .env("REVSTORE_WRITE_TOKENS", "another-write-token-0123456789")
        .env_remove("REVSTORE_CASSANDRA")
        .env("RUST_LOG", "warn")
        .output()
        .expect("run a second revstore up");
    assert_eq!(second.status.code(), Some(1), "{second:?}");
    assert!(String::from_utf8_lossy(&second.stderr).contains("in use"), "{second:?}");
    assert_eq!(std::fs::read_to_string(data.join("write-token")).expect("token"), kept, "the running system's token changed");
    // The running system still takes its own token.
    let written = http
        .post(format!("http://127.0.0.1:{current}/en.wikipedia.org/v1/page/Still_mine/1"))
        .bearer_auth(given)
        .header("content-type", "application/json")
        .body(r#"{"html":"<p>x</p>","data-parsoid":{},"section-offsets":{}}"#)
        .send()
        .await
        .expect("write");
    assert_eq!(written.status(), 201);
}

/// The value of an unlabelled or exactly labelled series in a `/metrics` text.
fn series(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

/// One memory budget for the process: old-store gets half, current-store
/// and the graph a quarter each, and every service's `/metrics` says its
/// share and the process's whole (what the memory alert divides by); a
/// budget too small for a service's parts is refused at start (64), naming
/// the service, before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_divides_one_memory_budget_among_its_services() {
    const MIB: f64 = 1048576.0;
    let dir = tempfile::tempdir().expect("tempdir");
    let (_running, current, old, graph) = up_with(dir.path(), &["--memory-budget-mb", "1000"]).await;
    let http = reqwest::Client::new();
    for (port, service, share_mb) in [(current, "current-store", 250.0), (old, "old-store", 500.0), (graph, "dependency-graph", 250.0)] {
        let metrics = http.get(format!("http://127.0.0.1:{port}/metrics")).send().await.expect("metrics").text().await.expect("text");
        assert_eq!(series(&metrics, "process_memory_budget_bytes"), Some(1000.0 * MIB), "{service}: {metrics}");
        assert_eq!(series(&metrics, &format!("memory_budget_bytes{{service=\"{service}\"}}")), Some(share_mb * MIB), "{service}");
        let resident = series(&metrics, "process_resident_memory_bytes").expect("the resident set");
        assert!(resident > 0.0 && resident < 1000.0 * MIB, "{service}: {resident}");
    }

    let small = tempfile::tempdir().expect("tempdir");
    let refused = Command::new(env!("CARGO_BIN_EXE_revstore"))
        .args(["up", "--data-dir", small.path().join("data").to_str().expect("utf-8"), "--memory-budget-mb", "200"])
        .args(["--current-store-port", "0", "--old-store-port", "0", "--graph-port", "0"])
        .env_remove("REVSTORE_WRITE_TOKENS")
        .env_remove("REVSTORE_MEMORY_BUDGET_MB")
        .output()
        .expect("run revstore up");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(64), "{said}");
    assert!(said.contains("old-store: the memory budget of 100 MB cannot hold"), "{said}");
    assert!(!small.path().join("data").join("old-store").exists(), "a refused start created a store");
}
