//! The real `revstore-janitor` binary against the three real services, on
//! both engines: the embedded engine with an injected clock (a quiet period
//! is a clock advance), and Cassandra with a short grace TTL (a quiet period
//! is a real wait). Overstore measured, removed, and nothing a reader is owed
//! lost; a killed run resumes; two runs never overlap; a graph divergence
//! and a lost hand-off are repaired.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;

use revstore_current_store::CurrentStore;
use revstore_dependency_graph::DependencyGraph;
use revstore_keys::TidGenerator;
use revstore_old_store::OldStore;
use revstore_schema::tables::dependency_graph::DEPENDENTS;
use revstore_schema::tables::janitor::CHECKPOINTS;
use revstore_storage::testing::TestKeyspace;
use revstore_storage::{EmbeddedEngine, EmbeddedOptions, ManualClock, Store, Upsert, Value};
use revstore_test_service::{Engine, Service, TestSettings, start_with_store};
use serde_json::{Value as Json, json};

const TOKEN: &str = "janitor-test-token-0123456789";
const DOMAIN: &str = "en.wikipedia.org";
/// Short, so that a quiet period on Cassandra is a real wait of seconds.
const GRACE_SECS: u64 = 10;
/// The slow runs' lease: long enough to outlive a pause, short enough to wait out.
const LEASE_SECS: u64 = 6;

struct System {
    engine: Engine,
    /// The embedded stores' clock (Cassandra keeps its own time).
    clock: ManualClock,
    current_store: Store,
    graph_store: Store,
    current: Service,
    old: Service,
    graph: Service,
    token_file: tempfile::NamedTempFile,
    _dirs: Vec<tempfile::TempDir>,
    _keyspaces: Vec<TestKeyspace>,
}

fn open_store(dir: &Path, clock: &ManualClock) -> Store {
    let options = EmbeddedOptions { clock: Arc::new(clock.clone()), ..EmbeddedOptions::default() };
    Store::new(Arc::new(EmbeddedEngine::open(dir, options).expect("open")))
}

/// The three services, each on a store of its own (a directory on one
/// injected clock, or a keyspace).
async fn system(engine: Engine) -> System {
    let clock = ManualClock::starting_now();
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().expect("tempdir")).collect();
    let mut keyspaces = Vec::new();
    let mut stores = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        stores.push(match engine {
            Engine::Embedded => open_store(dir.path(), &clock),
            Engine::Cassandra => {
                let keyspace = TestKeyspace::new(["janitor_cs", "janitor_os", "janitor_dg"][i]);
                let store = Store::new(Arc::new(keyspace.connect().await));
                keyspaces.push(keyspace);
                store
            }
        });
    }
    for store in &stores {
        store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
    }
    let mut token_file = tempfile::NamedTempFile::new().expect("token file");
    // A file in mid-rotation, as Kubernetes mounts it for the services too: the
    // janitor sends the first token (it once sent the whole file as one).
    let rotating = format!("# rotating: the next token below\n{TOKEN}\njanitor-next-token-0123456789\n");
    std::io::Write::write_all(&mut token_file, rotating.as_bytes()).expect("token");
    let token_path = token_file.path().to_str().expect("utf-8").to_owned();
    let old = start_with_store(stores[1].clone(), TestSettings::<OldStore>::new(TOKEN)).await;
    let graph = start_with_store(stores[2].clone(), TestSettings::<DependencyGraph>::new(TOKEN)).await;
    let current_settings = TestSettings::<CurrentStore>::new(TOKEN).with(|s| {
        s.own.grace_ttl = Duration::from_secs(GRACE_SECS);
        s.own.clock_skew = Duration::ZERO;
        s.own.old_store_url = Some(old.url(""));
        s.own.graph_url = Some(graph.url(""));
        s.own.peer_token_file = Some(token_path.clone().into());
    });
    let current = start_with_store(stores[0].clone(), current_settings).await;
    System {
        engine,
        clock,
        current_store: stores[0].clone(),
        graph_store: stores[2].clone(),
        current,
        old,
        graph,
        token_file,
        _dirs: dirs,
        _keyspaces: keyspaces,
    }
}

impl System {
    /// Lets `secs` pass for the stores: the injected clock, or a real wait.
    async fn pass(&self, secs: u64) {
        match self.engine {
            Engine::Embedded => self.clock.advance_secs(secs as i64),
            Engine::Cassandra => tokio::time::sleep(Duration::from_secs(secs)).await,
        }
    }

    /// Runs the janitor binary to its end (on a blocking thread: the services
    /// answer it from this test's runtime).
    async fn janitor(&self, args: &[&str]) -> (i32, Json, String) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_revstore-janitor"));
        command
            .args(args)
            .env("REVSTORE_CURRENT_STORE_URL", self.current.url(""))
            .env("REVSTORE_OLD_STORE_URL", self.old.url(""))
            .env("REVSTORE_GRAPH_URL", self.graph.url(""))
            .env("REVSTORE_PEER_TOKEN_FILE", self.token_file.path())
            .env("REVSTORE_JANITOR_OPS_PER_SEC", "0")
            .env("RUST_LOG", "warn");
        let output: Output = tokio::task::spawn_blocking(move || command.output()).await.expect("join").expect("run the janitor");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        let summary = stdout.lines().last().and_then(|l| serde_json::from_str(l).ok()).unwrap_or(Json::Null);
        (output.status.code().unwrap_or(-1), summary, stderr)
    }

    async fn put_render(&self, title: &str, rev: u64, tid: &str, html: &str) {
        let body = json!({"html": html, "data-parsoid": {"ids": {}}, "section-offsets": {"mwAQ": {"html": [0, 10], "wt": [0, 5]}}});
        let url = self.current.url(&format!("/{DOMAIN}/v1/page/{title}/{rev}/{tid}"));
        let r = reqwest::Client::new().put(url).bearer_auth(TOKEN).json(&body).send().await.expect("put");
        assert_eq!(r.status(), 201, "{title} {rev} {tid}: {}", r.text().await.unwrap_or_default());
    }

    async fn get_status(&self, path: &str) -> (u16, String) {
        let r = reqwest::Client::new().get(self.current.url(path)).send().await.expect("get");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    }
}

/// A table's ratio in a summary (`null` there: bytes held, none entitled).
fn overstore(summary: &Json, table: &str) -> f64 {
    let audited = &summary["tasks"]["audit"]["tables"][table];
    assert!(audited.is_object(), "no audit of {table}: {summary}");
    audited["overstore_ratio"].as_f64().unwrap_or(f64::INFINITY)
}

async fn a_run_removes_the_overstore_and_keeps_every_render_a_reader_is_owed(engine: Engine) {
    let s = system(engine).await;
    // A flurry: 20 titles, two revisions each rendered twice, minutes ago
    // (a generator per title: one generator's tids only ever go up, and
    // renders of one title need their own times).
    let now = SystemTime::now();
    let mut latest = Vec::new();
    for t in 0..20 {
        let generator = TidGenerator::new();
        let title = format!("Flurry_{t}");
        let mut tid = String::new();
        for (i, (rev, ago)) in [(100, 600), (100, 500), (101, 400), (101, 300)].into_iter().enumerate() {
            tid = generator.next_at(now - Duration::from_secs(ago)).to_string();
            s.put_render(&title, rev, &tid, &format!("<p>{title} render {i}</p>")).await;
        }
        latest.push((title, tid));
    }

    for (title, _) in &latest {
        let (status, html) = s.get_status(&format!("/{DOMAIN}/v1/page/html/{title}")).await;
        assert!(status == 200 && html.contains("render 3"), "before the janitor, {title}: {status} {html}");
    }

    // A quiet period past the grace TTL.
    s.pass(GRACE_SECS + 1).await;

    // Without the janitor, the audit finds the overstore: three renders of
    // each flurried page superseded for longer than the grace period, which
    // no write of the page has come to remove.
    let (code, before, stderr) = s.janitor(&["audit"]).await;
    assert_eq!(code, 0, "{stderr}\n{before}");
    assert!(overstore(&before, "current-store/page_renders") > 3.5, "{before}");
    assert!(before["tasks"]["audit"]["overstore_ratio"].as_f64().expect("ratio") > 1.3, "{before}");

    // A dry run changes nothing.
    let (code, dry, stderr) = s.janitor(&["--dry-run", "retention"]).await;
    assert_eq!(code, 0, "{stderr}\n{dry}");
    assert_eq!(dry["tasks"]["retention"]["services"]["current-store"]["rows"], 60, "{dry}");
    let (_, still, _) = s.janitor(&["audit"]).await;
    assert_eq!(overstore(&still, "current-store/page_renders"), overstore(&before, "current-store/page_renders"), "{still}");

    // One run: the superseded renders go, and the audit finds the ideal.
    let (code, run, stderr) = s.janitor(&[]).await;
    assert_eq!(code, 0, "{stderr}\n{run}");
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["tasks"]["retention"]["services"]["current-store"]["rows"], 60, "{run}");
    // The graph's change retention runs too: its fragment changes would grow for ever otherwise.
    assert_eq!(run["tasks"]["retention"]["services"]["dependency-graph"]["status"], "completed", "{run}");
    let page_renders = &run["tasks"]["audit"]["tables"]["current-store/page_renders"];
    assert_eq!((page_renders["rows_held"].as_u64(), page_renders["rows_ideal"].as_u64()), (Some(20), Some(20)), "{run}");
    let ratio = overstore(&run, "current-store/page_renders");
    assert!(ratio <= 1.05, "page_renders: {ratio}: {run}");
    let total = run["tasks"]["audit"]["overstore_ratio"].as_f64().expect("ratio");
    assert!(total <= 1.05, "{run}");

    // Every latest render is still served, by title and by tid.
    for (title, tid) in &latest {
        let (status, html) = s.get_status(&format!("/{DOMAIN}/v1/page/html/{title}")).await;
        assert_eq!(status, 200, "{title}");
        assert!(html.contains("render 3"), "{title}: {html}");
        assert_eq!(s.get_status(&format!("/{DOMAIN}/v1/page/html/{title}/101/{tid}")).await.0, 200);
    }

    // A second run finds nothing more to do.
    let (code, again, _) = s.janitor(&["retention"]).await;
    assert_eq!(code, 0);
    assert_eq!(again["tasks"]["retention"]["services"]["current-store"]["rows"], 0, "{again}");
}

async fn a_graph_divergence_is_found_and_repaired(engine: Engine) {
    let s = system(engine).await;
    let http = reqwest::Client::new();
    for page in ["Page_A", "Page_B", "Page_C"] {
        let edges = json!({"edges": [{"parent": "Template:Cite", "type": "modification", "priority": 10}, {"parent": "Template:Box", "type": "modification", "priority": 900}]});
        let r = http.put(s.graph.url(&format!("/{DOMAIN}/v1/deps/{page}"))).bearer_auth(TOKEN).json(&edges).send().await.expect("put");
        assert_eq!(r.status(), 200);
    }
    // A dependents row lost, and an orphan one no page lists.
    use revstore_dependency_graph::testing::{dependent_delete, dependents_partition_of};
    s.graph_store.write(dependent_delete(DOMAIN, "Template:Cite", "modification", 10, "Page_B")).await.expect("lose a row");
    let orphan = dependents_partition_of(DOMAIN, "Template:Box", "modification", "Page_Gone");
    s.graph_store
        .write(
            Upsert::new(&DEPENDENTS, orphan.into_iter().chain([Value::from(900i64), Value::from("Page_Gone")]))
                .set("created", Value::Timestamp(0)),
        )
        .await
        .expect("orphan");
    let dependents = |parent: &str| {
        let http = http.clone();
        let url = s.graph.url(&format!("/{DOMAIN}/v1/dependents/{parent}?type=modification"));
        async move {
            let list: Json = http.get(url).send().await.expect("get").json().await.expect("json");
            let mut children: Vec<String> =
                list["items"].as_array().expect("items").iter().map(|i| i["child"].as_str().expect("child").to_owned()).collect();
            children.sort();
            children
        }
    };
    assert_eq!(dependents("Template:Cite").await, ["Page_A", "Page_C"]);

    let (code, run, stderr) = s.janitor(&["graph"]).await;
    assert_eq!(code, 0, "{stderr}\n{run}");
    assert_eq!(run["tasks"]["graph"]["services"]["dependency-graph"]["rows"], 2, "{run}");
    assert_eq!(dependents("Template:Cite").await, ["Page_A", "Page_B", "Page_C"]);
    assert_eq!(dependents("Template:Box").await, ["Page_A", "Page_B", "Page_C"]);
    let (_, again, _) = s.janitor(&["graph"]).await;
    assert_eq!(again["tasks"]["graph"]["services"]["dependency-graph"]["rows"], 0, "{again}");
}

async fn a_killed_run_resumes_from_its_checkpoint_and_two_runs_never_overlap(engine: Engine) {
    let s = system(engine).await;
    // 400 titles: a slow run (20 partitions a step, 100 a second) takes seconds.
    let generator = TidGenerator::new();
    let now = SystemTime::now();
    for t in 0..400 {
        s.put_render(&format!("Page_{t}"), 1, &generator.next_at(now - Duration::from_secs(60)).to_string(), "<p>x</p>").await;
    }
    let slow = |extra: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_revstore-janitor"));
        command
            .args(["retention", "--step-partitions", "20", "--lease-secs", &LEASE_SECS.to_string()])
            .args(extra)
            .env("REVSTORE_CURRENT_STORE_URL", s.current.url(""))
            .env("REVSTORE_PEER_TOKEN_FILE", s.token_file.path())
            .env("REVSTORE_JANITOR_OPS_PER_SEC", "100")
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        command
    };
    // Midway: once its first step kept a checkpoint (it holds the lease then),
    // however long the machine took to get it there.
    let checkpoint = [Value::from("current-store/retention")];
    let checkpointed = async || s.current_store.get(&CHECKPOINTS, checkpoint.to_vec(), None).await.expect("checkpoint").is_some();
    let first = revstore_test_service::run_until_midway(slow(&[]), "the first run", Duration::from_secs(60), checkpointed).await;

    // A second run while the first holds the lease: exits 75 at once.
    let second = tokio::task::spawn_blocking({
        let mut command = slow(&[]);
        move || command.output()
    });
    let second = second.await.expect("join").expect("second run");
    assert_eq!(second.status.code(), Some(75), "{}", String::from_utf8_lossy(&second.stderr));
    let said: Json = serde_json::from_str(String::from_utf8_lossy(&second.stdout).lines().last().expect("summary")).expect("json");
    assert!(said["stopped"].as_str().expect("stopped").contains("another janitor run"), "{said}");

    // Kill -9 the first midway: its checkpoint stays with current-store.
    first.kill_9();
    // Its lease lapses.
    s.pass(LEASE_SECS + 1).await;

    let (code, resumed, stderr) = s.janitor(&["retention"]).await;
    assert_eq!(code, 0, "{stderr}\n{resumed}");
    let swept = &resumed["tasks"]["retention"]["services"]["current-store"];
    assert_eq!(swept["resumed"], true, "{resumed}");
    let partitions = swept["partitions"].as_u64().expect("partitions");
    assert!(partitions < 400 && partitions > 0, "the second run started over: {resumed}");
}

async fn a_lost_hand_off_is_found_and_sent_again(engine: Engine) {
    let s = system(engine).await;
    // Renders written with their hand-off, as a client writes them.
    let generator = TidGenerator::new();
    let ten_minutes_ago = SystemTime::now() - Duration::from_secs(600);
    for t in 0..3 {
        s.put_render(&format!("Handed_{t}"), 7, &generator.next_at(ten_minutes_ago).to_string(), "<p>handed</p>").await;
    }
    // Renders whose outbox rows were lost (written without them, as a restore
    // of current-store's tables without its outbox would leave them).
    let pages = revstore_current_store::Pages {
        store: s.current_store.clone(),
        grace: Duration::from_secs(GRACE_SECS),
        clock_skew: Duration::ZERO,
        hand_off: false,
        notify_graph: false,
        remembered: Default::default(),
    };
    let domain = revstore_keys::Domain::parse(DOMAIN).expect("domain");
    let body = revstore_api::RenderBody { html: "<p>lost</p>".into(), data_parsoid: json!({}), section_offsets: json!({}) };
    let lose = |title: String, tid: revstore_keys::Tid| {
        let (pages, domain, body) = (&pages, &domain, &body);
        async move {
            let title = revstore_keys::Title::parse(&title, revstore_keys::TitleRules::default()).expect("title");
            let id = revstore_current_store::RenderId { rev: revstore_keys::RevId::new(9).expect("rev"), tid };
            pages.put(domain, &title, id, body, &Default::default()).await.expect("put");
        }
    };
    for t in 0..4 {
        lose(format!("Lost_{t}"), generator.next_at(ten_minutes_ago)).await;
    }
    // One lost just now: within the hand-off margin its outbox row may still
    // be on its way, so the janitor leaves it until the margin has passed.
    let just_now = s.current_store.now();
    lose("Lost_recently".into(), generator.next_at(just_now)).await;
    let archived = |title: String| {
        let url = s.old.url(&format!("/{DOMAIN}/v1/archive/html/{title}/9"));
        async move { reqwest::get(url).await.expect("get").status().as_u16() }
    };
    // The handed ones arrive through the outbox; the lost ones never do.
    revstore_test_service::eventually("the handed renders reach old-store", Duration::from_secs(60), async || {
        reqwest::get(s.old.url(&format!("/{DOMAIN}/v1/archive/html/Handed_2/7"))).await.expect("get").status() == 200
    })
    .await;
    assert_eq!(archived("Lost_0".into()).await, 404);

    let (code, dry, stderr) = s.janitor(&["--dry-run", "archive"]).await;
    assert_eq!(code, 0, "{stderr}\n{dry}");
    assert_eq!(dry["tasks"]["archive"]["services"]["current-store"]["rows"], 4, "{dry}");
    assert_eq!(archived("Lost_0".into()).await, 404, "a dry run sent something");

    let (code, run, stderr) = s.janitor(&["archive"]).await;
    assert_eq!(code, 0, "{stderr}\n{run}");
    assert_eq!(run["tasks"]["archive"]["services"]["current-store"]["rows"], 4, "{run}");
    for t in 0..4 {
        assert_eq!(archived(format!("Lost_{t}")).await, 200, "Lost_{t}");
    }
    let (_, again, _) = s.janitor(&["archive"]).await;
    assert_eq!(again["tasks"]["archive"]["services"]["current-store"]["rows"], 0, "{again}");
    assert_eq!(archived("Lost_recently".into()).await, 404, "sent within the hand-off margin");
    // The margin follows the stores' clock: on the injected one, five minutes
    // pass at once (a real Cassandra would need the real five minutes).
    if s.engine == Engine::Embedded {
        s.pass(301).await;
        let (code, late, stderr) = s.janitor(&["archive"]).await;
        assert_eq!(code, 0, "{stderr}\n{late}");
        assert_eq!(late["tasks"]["archive"]["services"]["current-store"]["rows"], 1, "{late}");
        assert_eq!(archived("Lost_recently".into()).await, 200);
    }
}

/// The Kubernetes base points the three services at one keyspace. Their
/// checkpoints were keyed by the task alone, so a sweep cut mid-way at one
/// service resumed at another's position (skipping partitions, wrong audit
/// totals), and they shared one lease row. Now each service keeps its own:
/// audits stepped a few partitions at a time, in turn, visit every partition
/// of each service exactly once, as a whole audit of each alone does.
async fn services_sharing_one_keyspace_resume_their_own_sweeps(engine: Engine) {
    let (store, _dir, _keyspace) = match engine {
        Engine::Embedded => {
            let dir = tempfile::tempdir().expect("tempdir");
            (open_store(dir.path(), &ManualClock::starting_now()), Some(dir), None)
        }
        Engine::Cassandra => {
            let keyspace = TestKeyspace::new("janitor_shared");
            (Store::new(Arc::new(keyspace.connect().await)), None, Some(keyspace))
        }
    };
    store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
    let old = start_with_store(store.clone(), TestSettings::<OldStore>::new(TOKEN)).await;
    let graph = start_with_store(store.clone(), TestSettings::<DependencyGraph>::new(TOKEN)).await;
    let current = start_with_store(store.clone(), TestSettings::<CurrentStore>::new(TOKEN)).await;
    let http = reqwest::Client::new();
    let generator = TidGenerator::new();
    for t in 0..12 {
        let render = json!({"html": "<p>x</p>", "data-parsoid": {}, "section-offsets": {}});
        let r =
            http.put(current.url(&format!("/{DOMAIN}/v1/page/Shared_{t}/1/{}", generator.next()))).bearer_auth(TOKEN).json(&render).send();
        assert_eq!(r.await.expect("render").status(), 201);
        let r =
            http.put(old.url(&format!("/{DOMAIN}/v1/archive/Shared_{t}/1/{}", generator.next()))).bearer_auth(TOKEN).json(&render).send();
        assert!(r.await.expect("archive").status().is_success());
        let deps = json!({"edges": [{"parent": format!("Template:T{}", t % 3), "type": "modification", "priority": 1}]});
        let r = http.put(graph.url(&format!("/{DOMAIN}/v1/deps/Shared_{t}"))).bearer_auth(TOKEN).json(&deps).send();
        assert!(r.await.expect("deps").status().is_success());
    }
    let services = [("current-store", &current), ("old-store", &old), ("dependency-graph", &graph)];
    let holder = generator.next().to_string();
    for (name, service) in services {
        let lease = http.post(service.url("/admin/janitor/lease")).bearer_auth(TOKEN).json(&json!({"holder": holder, "ttl_secs": 600}));
        assert_eq!(lease.send().await.expect("lease").status(), 200, "{name}'s lease");
    }
    // One audit step: the partitions it visited per table, whether it
    // resumed, whether the sweep is complete.
    let step = async |service: &Service, budget: u32, restart: bool| -> (std::collections::BTreeMap<String, u64>, bool, bool) {
        let request = json!({"holder": holder, "budget": budget, "restart": restart});
        let answer = http.post(service.url("/admin/janitor/audit/step")).bearer_auth(TOKEN).json(&request).send().await.expect("step");
        assert_eq!(answer.status(), 200);
        let report: Json = answer.json().await.expect("json");
        let tables =
            report["tables"].as_object().map(|t| t.iter().map(|(k, v)| (k.clone(), v["partitions"].as_u64().unwrap_or(0))).collect());
        (tables.unwrap_or_default(), report["resumed"] == true, report["done"] == true)
    };
    let add = |into: &mut std::collections::BTreeMap<String, u64>, from: std::collections::BTreeMap<String, u64>| {
        for (table, n) in from {
            *into.entry(table).or_default() += n;
        }
    };
    // Each service's audit whole, alone: what every partition visited once adds up to.
    let mut whole = Vec::new();
    for (name, service) in services {
        let (mut tables, mut restart) = (Default::default(), true);
        loop {
            let (visited, _, done) = step(service, 10_000, restart).await;
            add(&mut tables, visited);
            restart = false;
            if done {
                break;
            }
        }
        assert!(tables.values().sum::<u64>() >= 12, "{name} audited {tables:?}");
        whole.push(tables);
    }
    // Then all three cut into steps of 2 partitions, taken in turn.
    let mut stepped: Vec<std::collections::BTreeMap<String, u64>> = vec![Default::default(); 3];
    let mut done = [false; 3];
    let mut first = true;
    while done.contains(&false) {
        for (i, (name, service)) in services.iter().enumerate() {
            if done[i] {
                continue;
            }
            let (visited, resumed, finished) = step(service, 2, first).await;
            assert!(first || resumed || finished, "{name}'s step did not resume from its own checkpoint");
            add(&mut stepped[i], visited);
            done[i] = finished;
        }
        first = false;
    }
    for (i, (name, _)) in services.iter().enumerate() {
        assert_eq!(stepped[i], whole[i], "{name}: the interleaved audit visited other partitions than the whole one");
    }
}

/// A routine run (`--scope changed`) visits what changed since the last one:
/// its first visits every page (there is no last one), the next only the
/// pages written since (and the journal's partitions of the minutes between),
/// however many others the wiki holds. It has no graph repair, and its audit
/// reads no table.
async fn a_routine_run_visits_what_changed_since_the_last(engine: Engine) {
    let s = system(engine).await;
    let now = SystemTime::now();
    for t in 0..40 {
        let generator = TidGenerator::new();
        for (rev, ago) in [(100, 600), (101, 500)] {
            let tid = generator.next_at(now - Duration::from_secs(ago)).to_string();
            s.put_render(&format!("Quiet_{t}"), rev, &tid, &format!("<p>{t} {rev}</p>")).await;
        }
    }
    // Past the grace TTL and the journal's margin for a late row (a storage
    // write's timeout on Cassandra).
    let quiet = GRACE_SECS + 12;
    s.pass(quiet).await;
    let routine = ["--scope", "changed"];
    let (code, first, stderr) = s.janitor(&routine).await;
    assert_eq!(code, 0, "{stderr}\n{first}");
    assert_eq!(first["scope"], "changed", "{first}");
    assert!(first["tasks"].get("graph").is_none(), "a routine run repaired the graph: {first}");
    let retention = &first["tasks"]["retention"]["services"]["current-store"];
    assert_eq!(retention["rows"], 40, "{first}");
    assert!(retention["partitions"].as_u64().unwrap_or(0) >= 40, "the first routine run visits every page: {first}");
    let renders = &first["tasks"]["audit"]["tables"]["current-store/page_renders"];
    assert_eq!(renders["partitions"], 0, "a routine run's audit read the table: {first}");

    // Two pages written again; the next routine run visits those.
    for t in 0..2 {
        let tid = TidGenerator::new().next_at(SystemTime::now()).to_string();
        s.put_render(&format!("Quiet_{t}"), 102, &tid, "<p>again</p>").await;
    }
    s.pass(quiet).await;
    let (code, next, stderr) = s.janitor(&routine).await;
    assert_eq!(code, 0, "{stderr}\n{next}");
    let retention = &next["tasks"]["retention"]["services"]["current-store"];
    assert_eq!(retention["rows"], 2, "{next}");
    let visited = retention["partitions"].as_u64().expect("partitions");
    assert!(visited < 40, "a routine run visited {visited} partitions for 2 pages written: {next}");
    for t in 0..2 {
        let (status, html) = s.get_status(&format!("/{DOMAIN}/v1/page/html/Quiet_{t}")).await;
        assert!(status == 200 && html.contains("again"), "Quiet_{t}: {status} {html}");
    }

    // The graph's repair reads every edge: asked of a routine run, refused.
    let (code, _, stderr) = s.janitor(&["--scope", "changed", "graph"]).await;
    assert_eq!(code, 64, "{stderr}");
    assert!(stderr.contains("--scope all"), "{stderr}");

    // A full run under way (its lease held, as for the days it takes at the
    // size of a large wiki) keeps other full runs out, not the routine ones.
    let full_run = TidGenerator::new().next().to_string();
    for service in [&s.current, &s.old, &s.graph] {
        let taken = reqwest::Client::new()
            .post(service.url("/admin/janitor/lease"))
            .bearer_auth(TOKEN)
            .json(&json!({"holder": full_run, "ttl_secs": 600}))
            .send()
            .await
            .expect("lease");
        assert_eq!(taken.status(), 200);
    }
    let (code, beside, stderr) = s.janitor(&routine).await;
    assert_eq!(code, 0, "a routine run beside a full one: {stderr}\n{beside}");
    let (code, second_full, _) = s.janitor(&["retention"]).await;
    assert_eq!(code, 75, "a second full run beside the first: {second_full}");
}

revstore_test_service::on_both_engines!(
    a_routine_run_visits_what_changed_since_the_last,
    services_sharing_one_keyspace_resume_their_own_sweeps,
    a_run_removes_the_overstore_and_keeps_every_render_a_reader_is_owed,
    a_graph_divergence_is_found_and_repaired,
    a_killed_run_resumes_from_its_checkpoint_and_two_runs_never_overlap,
    a_lost_hand_off_is_found_and_sent_again,
);

/// Runs `nodetool ARGS` on every node of the Cassandra under test, with the
/// command `scripts/test` names in `REVSTORE_TEST_NODETOOL` (its
/// `cassandra-local nodetool` or `cassandra-cluster nodetool`).
fn nodetool(args: &[&str]) {
    let command = std::env::var("REVSTORE_TEST_NODETOOL")
        .expect("REVSTORE_TEST_NODETOOL must name the command that runs nodetool on every node (scripts/test sets it)");
    let mut words = command.split_whitespace();
    let program = words.next().expect("REVSTORE_TEST_NODETOOL is empty");
    let output = Command::new(program).args(words).args(args).output().expect("run nodetool");
    assert!(output.status.success(), "nodetool {args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

/// The audit's on-disk figures for the whole system: what the nodes report,
/// the least the disk can hold given their rounding up to whole mebibytes,
/// and the ideal.
struct OnDisk {
    ratio: f64,
    reported: u64,
    at_least: u64,
    ideal: u64,
    /// `table on-disk/ideal` in MiB, for the tables with data.
    tables: String,
}

impl OnDisk {
    fn of(summary: &Json) -> OnDisk {
        let audit = &summary["tasks"]["audit"];
        let ratio = audit["overstore_on_disk"].as_f64().unwrap_or_else(|| panic!("no overstore_on_disk: {summary}"));
        let tables = audit["tables"].as_object().expect("tables");
        let sum = |field: &str| tables.values().map(|t| t[field].as_u64().unwrap_or(0)).sum::<u64>();
        let at_least = tables
            .values()
            .map(|t| t["bytes_on_disk"].as_u64().unwrap_or(0).saturating_sub(t["disk_resolution_bytes"].as_u64().unwrap_or(0)))
            .sum();
        let mib = |b: &Json| b.as_u64().unwrap_or(0) as f64 / f64::from(1 << 20);
        let tables = tables
            .iter()
            .filter(|(_, t)| t["bytes_on_disk"].as_u64().unwrap_or(0) > 0)
            .map(|(name, t)| format!("{name} {:.1}/{:.1}", mib(&t["bytes_on_disk"]), mib(&t["bytes_ideal"])))
            .collect::<Vec<_>>()
            .join(", ");
        OnDisk { ratio, reported: sum("bytes_on_disk"), at_least, ideal: sum("bytes_ideal"), tables }
    }
}

impl std::fmt::Display for OnDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        write!(
            f,
            "{:.1} MiB reported ({:.1} MiB at least) for {:.1} MiB ideal: {:.2} [{}]",
            mib(self.reported),
            mib(self.at_least),
            mib(self.ideal),
            self.ratio,
            self.tables
        )
    }
}

/// On Cassandra, what the nodes keep on disk: after a flurry of re-renders and
/// new revisions and a quiet period past the grace TTL, the disk holds every
/// superseded render and overwritten cell; after the janitor's run and the
/// compaction that follows, about what readers are owed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Cassandra and nodetool: run scripts/test (REVSTORE_TEST_CASSANDRA, REVSTORE_TEST_NODETOOL)"]
async fn the_overstore_on_disk_is_measured_and_compaction_brings_it_to_the_ideal() {
    let s = system(Engine::Cassandra).await;
    let keyspaces: Vec<String> = s._keyspaces.iter().map(|k| k.name().to_owned()).collect();
    // Enough data that the figure is not the nodes' rounding (each reports
    // whole mebibytes per table, and a dozen tables hold something): pages of
    // eight real Parsoid HTML sections (about 240 KB, 40-60 KB compressed),
    // three renders per title — a revision rendered, re-rendered after a
    // template edit changed a section, then the next revision — minutes apart.
    let history = revstore_testdata::large_page_history(8, 3);
    const TITLES: usize = 400;
    let now = SystemTime::now();
    let mut latest = Vec::new();
    let mut writes = Vec::new();
    for t in 0..TITLES {
        let generator = TidGenerator::new();
        let title = format!("Disk_{t}");
        let mut renders = Vec::new();
        for (i, (rev, ago)) in [(100u64, 600u64), (100, 500), (101, 400)].into_iter().enumerate() {
            let tid = generator.next_at(now - Duration::from_secs(ago)).to_string();
            renders.push((rev, tid, format!("<p>{title}</p>{}", history[i])));
        }
        latest.push((title.clone(), renders[2].1.clone()));
        writes.push((title, renders));
    }
    // Round by round, each flushed before the next: a wiki's renders of one
    // page come hours apart, with many memtable flushes between them (a
    // render superseded while still in the memtable never reaches the disk).
    // Background compaction held off until the janitor has run: what the
    // audit sees before it is then what the flurry left, not how far the
    // node's compactions happened to get meanwhile (the loaded cluster's
    // had merged less than half as much as the one node's).
    for keyspace in &keyspaces {
        nodetool(&["disableautocompaction", keyspace]);
    }
    let s = Arc::new(s);
    let writing = std::time::Instant::now();
    for round in 0..3 {
        futures_util::stream::iter(&writes)
            .for_each_concurrent(8, |(title, renders)| {
                let s = s.clone();
                async move {
                    let (rev, tid, body) = &renders[round];
                    s.put_render(title, *rev, tid, body).await;
                }
            })
            .await;
        nodetool(&["flush"]);
    }
    eprintln!("{} renders written in {:.1?}", 3 * TITLES, writing.elapsed());

    // Quiet past the grace TTL; what the memtables hold goes to disk.
    s.pass(GRACE_SECS + 1).await;
    nodetool(&["flush"]);
    let (code, before_json, stderr) = s.janitor(&["audit"]).await;
    assert_eq!(code, 0, "{stderr}\n{before_json}");
    let before = OnDisk::of(&before_json);
    // The renders superseded past the grace period that no later write of
    // their page removed — the second round's (the third round's writes
    // removed the first's when it was past the grace period): held (a reader
    // could still fetch them), about as many bytes as the latest, and
    // megabytes on disk, with what the writes deleted.
    let page_renders = &before_json["tasks"]["audit"]["tables"]["current-store/page_renders"];
    let (held, ideal) = (page_renders["bytes_held"].as_u64().expect("held"), page_renders["bytes_ideal"].as_u64().expect("ideal"));
    assert!(held as f64 > 1.5 * ideal as f64, "{before_json}");
    let mib = 1 << 20;
    assert!(page_renders["bytes_on_disk"].as_u64().expect("page_renders on disk") > 20 * mib, "{before_json}");

    // The janitor's run, then the compaction that follows it.
    let (code, run, stderr) = s.janitor(&[]).await;
    assert_eq!(code, 0, "{stderr}\n{run}");
    nodetool(&["flush"]);
    let (_, after_run, _) = s.janitor(&["audit"]).await;
    let after_run = OnDisk::of(&after_run);
    for keyspace in &keyspaces {
        nodetool(&["enableautocompaction", keyspace]);
        nodetool(&["compact", keyspace]);
    }
    let metrics = tempfile::NamedTempFile::new().expect("metrics file");
    let metrics_path = metrics.path().to_str().expect("utf-8").to_owned();
    let (code, after_json, stderr) = s.janitor(&["--metrics-file", &metrics_path, "audit"]).await;
    assert_eq!(code, 0, "{stderr}\n{after_json}");
    let after = OnDisk::of(&after_json);
    // The alert's series (RevstoreOverstoreOnDisk), as the run exports it.
    let exported = std::fs::read_to_string(metrics.path()).expect("metrics");
    let total = exported.lines().find(|l| l.starts_with("revstore_janitor_overstore_on_disk_ratio{table=\"all\"} "));
    let total: f64 = total.and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or_else(|| panic!("no total on-disk ratio: {exported}"));
    assert!((total - after.ratio).abs() < 1e-9, "the metric {total} is the summary's {}", after.ratio);
    let at_least = exported.lines().find(|l| l.starts_with("revstore_janitor_overstore_on_disk_at_least_ratio{table=\"all\"} "));
    let at_least: f64 =
        at_least.and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or_else(|| panic!("no at-least on-disk ratio: {exported}"));
    let certain = after_json["tasks"]["audit"]["overstore_on_disk_at_least"].as_f64().expect("overstore_on_disk_at_least");
    assert!((at_least - certain).abs() < 1e-9, "the alert's series {at_least} is the summary's {certain}");
    assert!(at_least < total, "less the rounding ({at_least}) is below the rounded-up total ({total})");
    assert!(exported.contains("revstore_janitor_bytes_on_disk{table=\"current-store/page_renders\"} "), "{exported}");
    // The decay alerts' series (RevstoreTombstonesPerRead and the others), from the nodes.
    for series in ["tombstones_per_read_p99", "tombstones_per_read_max", "largest_partition_bytes"] {
        let sample = format!("revstore_janitor_{series}{{table=\"current-store/page_renders\"}} ");
        assert!(exported.contains(&sample), "no {sample}in {exported}");
    }
    // Compacted, the renders are in SSTables: their largest partition is known.
    let largest = &after_json["tasks"]["audit"]["tables"]["current-store/page_renders"]["largest_partition_bytes"];
    assert!(largest.as_u64().is_some_and(|b| b > 0), "{after_json}");
    eprintln!("on disk: before the janitor {before}; after its run {after_run}; after compaction {after}");
    // Compaction freed what the nodes kept beyond their rounding, and the disk
    // is near the ideal after it (the reported figure is an upper bound).
    assert!(after.reported < before.at_least, "compaction freed nothing: before {before}, after {after}");
    assert!(after.reported as f64 <= 1.3 * after.ideal as f64, "after the run and compaction: {after}: {after_json}");
    let page_renders = &after_json["tasks"]["audit"]["tables"]["current-store/page_renders"];
    let on_disk = page_renders["bytes_on_disk"].as_u64().expect("page_renders on disk");
    let ideal = page_renders["bytes_ideal"].as_u64().expect("ideal");
    assert!(on_disk as f64 <= 1.3 * ideal as f64 + mib as f64, "the renders deleted by the run are gone from disk: {after_json}");

    // Nothing a reader is owed is gone: every latest render, by title and by tid.
    for (title, tid) in &latest {
        let (status, body) = s.get_status(&format!("/{DOMAIN}/v1/page/html/{title}")).await;
        assert!(status == 200 && body.contains(&format!("<p>{title}</p>")), "{title}: {status}");
        assert_eq!(s.get_status(&format!("/{DOMAIN}/v1/page/html/{title}/101/{tid}")).await.0, 200, "{title} by tid");
    }
}
