//! The janitor's admin calls every service answers: the lease is exclusive
//! and renewable, steps need it, resume from the service's checkpoint, and a
//! dry run changes nothing and keeps its own checkpoint.

use std::sync::Arc;

use async_trait::async_trait;
use clap::Parser;
use http::StatusCode;
use revstore_api::janitor::{StepReport, Task};
use revstore_schema::model::ColumnType::Text;
use revstore_schema::{Column as C, Compaction, Component, TableDef};
use revstore_service::janitor_admin::{Stepped, Sweep, SweepError, SweepPosition};
use revstore_service::{CommonArgs, Platform, Routes, Service};
use revstore_storage::{Delete, ScanQuery, Store, Upsert, Value};
use serde_json::{Value as Json, json};

static NOTES: TableDef = TableDef {
    name: "janitor_admin_notes",
    columns: &[C::partition("key", Text), C::regular("state", Text)],
    default_ttl: None,
    compaction: Compaction::SizeTiered,
    comment: "janitor admin test service",
};

static NOTES_SCHEMA: Component = Component { name: "notes", version: 1, compatible_from: 1, tables: &[&NOTES] };

const TOKEN: &str = "write-token-0123456789";
const RUN_A: &str = "a1b2c3d4-0000-11ee-8000-000000000001";
const RUN_B: &str = "a1b2c3d4-0000-11ee-8000-000000000002";

#[derive(Debug, Parser)]
struct TestArgs {
    #[command(flatten)]
    common: CommonArgs,
}

/// Removes notes whose state is `stale`.
struct StaleNotes {
    store: Store,
}

#[async_trait]
impl Sweep for StaleNotes {
    fn task(&self) -> Task {
        Task::Retention
    }

    async fn step(&self, from: SweepPosition, budget: u32, dry_run: bool) -> Result<Stepped, SweepError> {
        let scanned = self.store.scan_range(&ScanQuery::new(&NOTES, budget).after(from.after)).await?;
        let mut report = StepReport { partitions: scanned.partitions.len() as u64, ..StepReport::default() };
        for partition in &scanned.partitions {
            let row = self.store.get(&NOTES, partition.key.clone(), None).await?;
            if row.as_ref().and_then(|r| r.text("state")) == Some("stale") {
                report.rows += 1;
                if !dry_run {
                    self.store.write(Delete::partition(&NOTES, partition.key.clone())).await?;
                }
            }
        }
        Ok(Stepped { report, next: scanned.next.map(|p| SweepPosition::in_pass(0, Some(p))) })
    }
}

struct Running {
    base: String,
    http: reqwest::Client,
    store: Store,
    _stop: tokio::sync::oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

impl Running {
    async fn post(&self, path: &str, body: Json) -> (StatusCode, Json) {
        let r = self.http.post(format!("{}{path}", self.base)).bearer_auth(TOKEN).json(&body).send().await.expect("post");
        let status = r.status();
        (status, r.json().await.unwrap_or(Json::Null))
    }

    async fn step(&self, holder: &str, budget: u32, dry_run: bool) -> (StatusCode, Json) {
        self.post("/admin/janitor/retention/step", json!({"holder": holder, "budget": budget, "dry_run": dry_run})).await
    }

    async fn notes(&self) -> usize {
        let mut n = 0;
        let mut after = None;
        loop {
            let page = self.store.scan_range(&ScanQuery::new(&NOTES, 100).after(after)).await.expect("scan");
            n += page.partitions.len();
            match page.next {
                Some(p) => after = Some(p),
                None => return n,
            }
        }
    }
}

async fn start() -> Running {
    let dir = tempfile::tempdir().expect("tempdir");
    let args = ["test", "--data-dir", dir.path().to_str().expect("path"), "--write-tokens", TOKEN, "--migrate-on-start", "true"];
    let settings = TestArgs::parse_from(args).common.resolve(0).expect("settings");
    let store = revstore_service::launch::open_store(&settings, &NOTES_SCHEMA).await.expect("open");
    // 30 notes, every third stale.
    for i in 0..30 {
        let state = if i % 3 == 0 { "stale" } else { "fresh" };
        store.write(Upsert::new(&NOTES, [Value::from(format!("note{i}"))]).set("state", state)).await.expect("write");
    }
    let platform = Platform::new(&NOTES_SCHEMA, store.clone(), settings, Default::default());
    let sweeps: Vec<Arc<dyn Sweep>> = vec![Arc::new(StaleNotes { store: store.clone() })];
    let service = Service::with_sweeps(platform, Routes::new(), sweeps);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(service.serve(listener, async move {
        let _ = stopped.await;
    }));
    Running { base, http: reqwest::Client::new(), store, _stop: stop, _dir: dir }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_exclusive_renewable_and_given_back() {
    let s = start().await;
    let (status, lease) = s.post("/admin/janitor/lease", json!({"holder": RUN_A, "ttl_secs": 60})).await;
    assert_eq!(status, StatusCode::OK, "{lease}");
    assert_eq!(lease["holder"], RUN_A);
    // Another run is refused, and told who holds it.
    let (status, refused) = s.post("/admin/janitor/lease", json!({"holder": RUN_B, "ttl_secs": 60})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(refused["detail"].as_str().expect("detail").contains(RUN_A), "{refused}");
    assert_eq!(refused["type"], "urn:revstore:problem:janitor-lease-held", "{refused}");
    // The holder renews.
    assert_eq!(s.post("/admin/janitor/lease", json!({"holder": RUN_A, "ttl_secs": 60})).await.0, StatusCode::OK);
    // Giving it back is only the holder's to do.
    let give_back =
        |holder: &str| s.http.delete(format!("{}/admin/janitor/lease", s.base)).query(&[("holder", holder)]).bearer_auth(TOKEN).send();
    assert_eq!(give_back(RUN_B).await.expect("delete").status(), StatusCode::NO_CONTENT);
    assert_eq!(s.post("/admin/janitor/lease", json!({"holder": RUN_B, "ttl_secs": 60})).await.0, StatusCode::CONFLICT);
    assert_eq!(give_back(RUN_A).await.expect("delete").status(), StatusCode::NO_CONTENT);
    assert_eq!(s.post("/admin/janitor/lease", json!({"holder": RUN_B, "ttl_secs": 60})).await.0, StatusCode::OK);
    // Bad input is a 400 and takes nothing; no token is a 401.
    for body in [json!({"holder": "me", "ttl_secs": 60}), json!({"holder": RUN_A, "ttl_secs": 0}), json!({"holder": RUN_A})] {
        let (status, problem) = s.post("/admin/janitor/lease", body.clone()).await;
        assert!(status.is_client_error(), "{body}: {status} {problem}");
    }
    let anonymous = s.http.post(format!("{}/admin/janitor/lease", s.base)).json(&json!({"holder": RUN_A, "ttl_secs": 60})).send().await;
    assert_eq!(anonymous.expect("post").status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_need_the_lease_and_resume_from_the_checkpoint_of_an_earlier_run() {
    let s = start().await;
    // Without the lease: refused (a kind the janitor acts on), nothing removed.
    let (status, refused) = s.step(RUN_A, 7, false).await;
    assert_eq!((status, refused["type"].as_str()), (StatusCode::CONFLICT, Some("urn:revstore:problem:janitor-lease-held")));
    assert_eq!(s.notes().await, 30);
    assert_eq!(s.post("/admin/janitor/lease", json!({"holder": RUN_A, "ttl_secs": 60})).await.0, StatusCode::OK);

    // A dry run counts all ten stale notes and removes none.
    let mut would_remove = 0;
    loop {
        let (status, report) = s.step(RUN_A, 7, true).await;
        assert_eq!(status, StatusCode::OK, "{report}");
        would_remove += report["rows"].as_u64().expect("rows");
        if report["done"] == true {
            break;
        }
    }
    assert_eq!((would_remove, s.notes().await), (10, 30));

    // Run A takes two steps (14 partitions) and stops, as a killed run would.
    let (_, first) = s.step(RUN_A, 7, false).await;
    assert_eq!((first["resumed"].clone(), first["done"].clone()), (json!(false), json!(false)), "{first}");
    s.step(RUN_A, 7, false).await;
    let removed_by_a = 30 - s.notes().await;
    assert!(removed_by_a > 0 && removed_by_a < 10, "{removed_by_a}");

    // Its lease lapses (here: given back); run B resumes where A stopped.
    s.http.delete(format!("{}/admin/janitor/lease", s.base)).query(&[("holder", RUN_A)]).bearer_auth(TOKEN).send().await.expect("delete");
    assert_eq!(s.post("/admin/janitor/lease", json!({"holder": RUN_B, "ttl_secs": 60})).await.0, StatusCode::OK);
    assert_eq!(s.step(RUN_A, 7, false).await.0, StatusCode::CONFLICT, "A no longer holds the lease");
    let mut visited = 14;
    let mut steps = 0;
    loop {
        let (status, report) = s.step(RUN_B, 7, false).await;
        assert_eq!(status, StatusCode::OK, "{report}");
        if steps == 0 {
            assert_eq!(report["resumed"], true, "{report}");
        }
        steps += 1;
        visited += report["partitions"].as_u64().expect("partitions");
        if report["done"] == true {
            break;
        }
    }
    // B visited only the 16 partitions after A's 14: none twice.
    assert_eq!(visited, 30);
    assert_eq!(s.notes().await, 20);
    // Done: the next step starts over.
    let (_, again) = s.step(RUN_B, 100, false).await;
    assert_eq!((again["resumed"].clone(), again["partitions"].clone(), again["rows"].clone()), (json!(false), json!(20), json!(0)));

    // A task this service does not sweep, or no task at all: 404 of the kind
    // the janitor skips on; a wrong URL is a plain 404 it does not mistake for one.
    for task in ["audit", "vacuum"] {
        let (status, problem) = s.post(&format!("/admin/janitor/{task}/step"), json!({"holder": RUN_B, "budget": 5})).await;
        assert_eq!((status, problem["type"].as_str()), (StatusCode::NOT_FOUND, Some("urn:revstore:problem:janitor-task-not-offered")));
        assert!(problem["detail"].as_str().expect("detail").contains("retention"), "{problem}");
    }
    let (status, problem) = s.post("/admin/janitr/retention/step", json!({"holder": RUN_B, "budget": 5})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_ne!(problem["type"].as_str(), Some("urn:revstore:problem:janitor-task-not-offered"), "{problem}");
    // Bad steps: budget out of range 400, not a run id 400.
    assert_eq!(s.step(RUN_B, 0, false).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(s.step(RUN_B, 10_001, false).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(s.step("not-a-run", 5, false).await.0, StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_answers_what_it_removed() {
    let s = start().await;
    let (status, report) = s.post("/admin/storage/purge", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert!(report["rows"].is_u64() && report["bytes_freed"].is_u64(), "{report}");
}
