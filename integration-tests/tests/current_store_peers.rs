//! current-store with its peers, as deployed, each service in this process
//! on a port of its own: the first render of every revision handed to
//! old-store through current-store's outbox, old revisions served by
//! current-store from old-store once its grace period is over, a suppression
//! reaching old-store, hand-offs old-store refuses moved aside; and a new
//! revision of a template reaching the dependency graph as a change notice,
//! so that a page using the template finds it in its pull check.

use std::time::Duration;

use futures_util::StreamExt;
use revstore_current_store::CurrentStore;
use revstore_dependency_graph::DependencyGraph;
use revstore_keys::Tid;
use revstore_old_store::OldStore;
use revstore_test_service::{Engine, Service, TestSettings, eventually, start_on};
use serde_json::{Value, json};

const CURRENT_TOKEN: &str = "current-store-test-token";
const OLD_TOKEN: &str = "old-store-test-token";
const GRAPH_TOKEN: &str = "dependency-graph-test-token";

/// current-store's settings in these tests: its own token.
fn current_settings() -> TestSettings<CurrentStore> {
    TestSettings::new(CURRENT_TOKEN)
}

/// Starts old-store on `engine`, with its test token and what `change` sets.
async fn start_old_store(engine: Engine, change: impl FnOnce(&mut TestSettings<OldStore>)) -> Service {
    start_on(engine, TestSettings::new(OLD_TOKEN).with(change)).await
}

/// A render of `title` at `rev` written to current-store: the answer's status.
async fn put_render(http: &reqwest::Client, current: &Service, title: &str, rev: u64, body: &Value) -> u16 {
    let url = current.url(&format!("/en.wikipedia.org/v1/page/{title}/{rev}/{}", Tid::now()));
    http.put(url).bearer_auth(CURRENT_TOKEN).json(body).send().await.expect("send").status().as_u16()
}

/// The janitor's retention sweep over every page, through the admin API as
/// the janitor runs it.
async fn run_retention(http: &reqwest::Client, current: &Service) {
    let holder = Tid::now().to_string();
    let lease = http.post(current.url("/admin/janitor/lease")).bearer_auth(CURRENT_TOKEN).json(&json!({"holder": holder, "ttl_secs": 600}));
    assert_eq!(lease.send().await.expect("lease").status(), 200);
    for steps in 0.. {
        assert!(steps < 10_000, "the retention sweep never ends");
        let request = json!({"holder": holder, "budget": 100, "scope": "all"});
        let step = http.post(current.url("/admin/janitor/retention/step")).bearer_auth(CURRENT_TOKEN).json(&request);
        let step = step.send().await.expect("step");
        assert_eq!(step.status(), 200);
        let report: Value = step.json().await.expect("report");
        if report["done"].as_bool().expect("done") {
            break;
        }
    }
    let back = http.delete(current.url(&format!("/admin/janitor/lease?holder={holder}"))).bearer_auth(CURRENT_TOKEN).send().await;
    assert_eq!(back.expect("give back").status(), 204);
}

/// A file holding `token`, as a peer token file is mounted.
fn token_file(token: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("token file");
    std::fs::write(file.path(), token).expect("write token");
    file
}

/// How long a hand-off may take to show in old-store.
const WAIT: Duration = Duration::from_secs(120);

async fn renders_flow_from_current_store_to_old_store_and_back(engine: Engine) {
    let old = start_old_store(engine, |_| {}).await;
    let peer_token = token_file(OLD_TOKEN);
    let current = start_on(
        Engine::Embedded,
        current_settings().with(|s| {
            s.own.old_store_url = Some(old.url(""));
            s.own.peer_token_file = Some(peer_token.path().to_owned());
            s.own.grace_ttl = Duration::from_secs(1);
            s.own.clock_skew = Duration::ZERO;
        }),
    )
    .await;
    let http = reqwest::Client::new();
    let html = revstore_testdata::anarchism_html();
    let revs = [18201u64, 19746, 19749, 21111];
    for (i, rev) in revs.iter().enumerate() {
        let body = json!({ "html": html[i], "data-parsoid": { "n": i }, "section-offsets": {} });
        assert_eq!(put_render(&http, &current, "Anarchism", *rev, &body).await, 201);
    }

    // Every revision reaches old-store, with its content intact.
    let listed = || async {
        let list: serde_json::Value =
            http.get(old.url("/en.wikipedia.org/v1/archive/revisions/Anarchism")).send().await.expect("send").json().await.expect("json");
        list["items"].as_array().map(|items| items.iter().filter_map(|i| i["rev"].as_u64()).collect::<Vec<_>>()).unwrap_or_default()
    };
    eventually("old-store holds every revision", WAIT, async || listed().await == revs).await;
    for (i, rev) in revs.iter().enumerate() {
        let archived = http.get(old.url(&format!("/en.wikipedia.org/v1/archive/html/Anarchism/{rev}"))).send().await.expect("send");
        assert_eq!(archived.text().await.expect("body"), html[i]);
    }

    // Past the grace period, the janitor's retention sweep removes the old
    // revisions from current-store: it serves them from old-store.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let body = json!({ "html": html[3], "data-parsoid": { "n": 3 }, "section-offsets": {} });
    assert_eq!(put_render(&http, &current, "Anarchism", 21111, &body).await, 201);
    run_retention(&http, &current).await;
    let old_rev = http.get(current.url("/en.wikipedia.org/v1/page/html/Anarchism/18201")).send().await.expect("send");
    assert_eq!(old_rev.status(), 200);
    assert!(old_rev.headers().get("etag").and_then(|v| v.to_str().ok()).is_some_and(|e| e.starts_with("\"18201/")));
    assert_eq!(old_rev.text().await.expect("body"), html[0]);
    // A part has one content type, whichever service it comes from (the
    // data-parsoid profile was once missing from old-store's).
    let content_type = |r: &reqwest::Response| r.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let held_dp = http.get(current.url("/en.wikipedia.org/v1/page/data-parsoid/Anarchism/21111")).send().await.expect("send");
    let archived_dp = http.get(current.url("/en.wikipedia.org/v1/page/data-parsoid/Anarchism/18201")).send().await.expect("send");
    assert_eq!((held_dp.status(), archived_dp.status()), (reqwest::StatusCode::OK, reqwest::StatusCode::OK));
    assert_eq!(content_type(&held_dp), content_type(&archived_dp));
    assert!(content_type(&archived_dp).unwrap_or_default().contains("Specs/data-parsoid"), "{:?}", content_type(&archived_dp));
    let held: serde_json::Value =
        http.get(current.url("/en.wikipedia.org/v1/page/revisions/Anarchism")).send().await.expect("send").json().await.expect("json");
    assert!(!held.to_string().contains("18201"), "current-store still holds 18201: {held}");

    // A suppression made at current-store reaches old-store: the revision is
    // served by neither.
    let r =
        http.post(current.url("/en.wikipedia.org/v1/page/Anarchism/19746/suppress")).bearer_auth(CURRENT_TOKEN).send().await.expect("send");
    assert_eq!(r.status(), 204);
    eventually("old-store hides the suppressed revision", WAIT, async || {
        http.get(old.url("/en.wikipedia.org/v1/archive/html/Anarchism/19746")).send().await.expect("send").status() == 404
    })
    .await;
    let hidden = http.get(current.url("/en.wikipedia.org/v1/page/html/Anarchism/19746")).send().await.expect("send");
    assert_eq!(hidden.status(), 404);
}

revstore_test_service::on_both_engines!(renders_flow_from_current_store_to_old_store_and_back);

async fn start_current_in(dir: &std::path::Path, old_store: &Service, peer_token: &tempfile::NamedTempFile) -> Service {
    let peer = peer_token.path().to_str().expect("utf-8");
    let settings = current_settings().with(|s| {
        s.own.old_store_url = Some(old_store.url(""));
        s.own.peer_token_file = Some(peer.into());
    });
    revstore_test_service::start_in(dir, settings).await
}

async fn dead_letters(http: &reqwest::Client, current: &Service) -> Vec<serde_json::Value> {
    let answer = http.get(current.url("/admin/outbox/dead-letters")).bearer_auth(CURRENT_TOKEN).send().await.expect("send");
    assert_eq!(answer.status(), 200);
    let list: serde_json::Value = answer.json().await.expect("json");
    assert!(list["next"].is_null(), "{list}");
    list["items"].as_array().cloned().unwrap_or_default()
}

/// The probe's data loss: an outbox row old-store can never accept (a title
/// `..` queued before titles were checked; a render larger than old-store
/// takes) used to be retried forever, and every later first render of its
/// shard never reached old-store. Now such rows move to the dead letters,
/// the shard keeps flowing, and an operator can list and re-drive them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_hand_off_moves_aside_and_its_shard_keeps_flowing() {
    let domain = revstore_keys::Domain::parse("en.wikipedia.org").expect("domain");
    let title = |t: &str| revstore_keys::Title::parse(t, Default::default()).expect("title");
    let strict_old = start_old_store(Engine::Embedded, |s| s.common.body_limit_bytes = 20_000).await;
    let current_dir = tempfile::tempdir().expect("tempdir");
    // A row no request could queue (its title is a dot segment, which the
    // client refuses to put in a URL), as damage or a bug could leave one, in
    // the shard of `Big`.
    let shard = revstore_current_store::testing::outbox_shard(revstore_storage::Site::ONLY, &domain, &title("Big"));
    {
        let store = revstore_storage::open(revstore_storage::StorageSettings::Embedded {
            data_dir: current_dir.path().to_owned(),
            options: Default::default(),
        })
        .await
        .expect("open");
        store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
        let body = revstore_current_store::RenderBody { html: "<p>dots</p>".into(), data_parsoid: json!({}), section_offsets: json!({}) };
        let payload = revstore_current_store::StoredParts::encode(&body).handoff_payload();
        store
            .write(
                revstore_storage::Upsert::new(&revstore_schema::tables::current_store::OUTBOX, {
                    let id = Tid::now();
                    let minute = revstore_current_store::testing::outbox_minute(id);
                    [revstore_storage::Value::from(shard), revstore_storage::Value::from(minute), revstore_storage::Value::from(id)]
                })
                .set("kind", "archive")
                .set("domain", "en.wikipedia.org")
                .set("title", "..")
                .set("rev", 7i64)
                .set("tid", Tid::now())
                .set("payload", payload)
                .set("attempts", 0i64),
            )
            .await
            .expect("queue the row");
    }
    let peer_token = token_file(OLD_TOKEN);
    let current = start_current_in(current_dir.path(), &strict_old, &peer_token).await;
    let http = reqwest::Client::new();
    let put = async |title: &str, rev: u64, html: String| {
        put_render(&http, &current, title, rev, &json!({ "html": html, "data-parsoid": {}, "section-offsets": {} })).await
    };
    // Larger than old-store's body limit: refused with 413, for good.
    assert_eq!(put("Big", 1, "<p>big</p>".repeat(4000)).await, 201);
    // Later first renders, several in the blocked shards.
    let mut later: Vec<String> = (0..40).map(|i| format!("Page_{i}")).collect();
    later.extend(
        (0..400)
            .map(|i| format!("Same_shard_{i}"))
            .filter(|t| revstore_current_store::testing::outbox_shard(revstore_storage::Site::ONLY, &domain, &title(t)) == shard)
            .take(3),
    );
    for t in &later {
        assert_eq!(put(t, 1, format!("<p>{t}</p>")).await, 201);
    }
    for t in &later {
        eventually(&format!("{t} reaches old-store"), WAIT, async || {
            http.get(strict_old.url(&format!("/en.wikipedia.org/v1/archive/html/{t}/1"))).send().await.expect("send").status() == 200
        })
        .await;
    }
    let mut refused = Vec::new();
    eventually("both refused rows are dead letters", WAIT, async || {
        refused = dead_letters(&http, &current).await;
        refused.len() == 2
    })
    .await;
    let by_title =
        |t: &str| refused.iter().find(|d| d["title"] == t).cloned().unwrap_or_else(|| panic!("no dead letter for {t}: {refused:?}"));
    assert_eq!((by_title("Big")["status"].as_u64(), by_title("Big")["kind"].as_str()), (Some(413), Some("archive")));
    assert!(by_title("..")["reason"].as_str().is_some_and(|r| r.contains("dot segment")), "{refused:?}");
    assert_eq!(by_title("..")["shard"].as_i64(), Some(shard));
    let unauthenticated = http.get(current.url("/admin/outbox/dead-letters")).send().await.expect("send");
    assert_eq!(unauthenticated.status(), 401, "dead letters hold page content: the write token is needed");
    let metrics = http.get(current.url("/metrics")).send().await.expect("send").text().await.expect("text");
    assert!(metrics.lines().any(|l| l.starts_with("outbox_dead_letters_total{") && l.contains("kind=\"archive\"")), "{metrics}");
    current.stop().await;

    // The operator fixes the receiver (here: an old-store that takes large
    // bodies) and re-drives: `Big` arrives, `..` is refused again and stays aside.
    let roomy_old = start_old_store(Engine::Embedded, |_| {}).await;
    let current = start_current_in(current_dir.path(), &roomy_old, &peer_token).await;
    let redriven: serde_json::Value = http
        .post(current.url("/admin/outbox/dead-letters/redrive"))
        .bearer_auth(CURRENT_TOKEN)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(redriven["redriven"], 2, "{redriven}");
    eventually("the re-driven render reaches old-store", WAIT, async || {
        http.get(roomy_old.url("/en.wikipedia.org/v1/archive/html/Big/1")).send().await.expect("send").status() == 200
    })
    .await;
    eventually("the row old-store can never take is a dead letter again", WAIT, async || {
        let left = dead_letters(&http, &current).await;
        left.len() == 1 && left[0]["title"] == ".."
    })
    .await;
    let id = dead_letters(&http, &current).await[0]["id"].as_str().expect("id").to_owned();
    let one = http.post(current.url(&format!("/admin/outbox/dead-letters/{shard}/{id}/redrive"))).bearer_auth(CURRENT_TOKEN).send().await;
    assert_eq!(one.expect("send").status(), 200);
    let missing = http
        .post(current.url(&format!("/admin/outbox/dead-letters/{shard}/{}/redrive", Tid::now())))
        .bearer_auth(CURRENT_TOKEN)
        .send()
        .await;
    assert_eq!(missing.expect("send").status(), 404);
}

/// A fallback read old-store refuses (here 401: old-store wants read tokens
/// that this current-store does not have) is a 404, not a 503: the client
/// cannot fix it by retrying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_read_that_old_store_refuses_is_not_found() {
    let old =
        start_old_store(Engine::Embedded, |s| s.common.read_tokens = vec![revstore_service::Secret::new("old-store-read-token-0123")])
            .await;
    let current = start_on(Engine::Embedded, current_settings().with(|s| s.own.old_store_url = Some(old.url("")))).await;
    let answer = reqwest::get(current.url("/en.wikipedia.org/v1/page/html/Anarchism/5")).await.expect("send");
    assert_eq!(answer.status(), 404);
    let body = answer.text().await.expect("body");
    assert!(!body.contains("127.0.0.1"), "no internal address in the answer: {body}");
}

/// Titles MediaWiki refuses are refused at the edge, also when percent-encoded
/// (sent raw here: an HTTP client would resolve the dots away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_titles_are_refused_at_both_edges() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let old = start_old_store(Engine::Embedded, |_| {}).await;
    let current = start_on(Engine::Embedded, current_settings()).await;
    let body = r#"{"html":"<p>x</p>","data-parsoid":{},"section-offsets":{}}"#;
    for (service, token, path) in [
        (&current, CURRENT_TOKEN, "/en.wikipedia.org/v1/page/%2E%2E/1"),
        (&current, CURRENT_TOKEN, "/en.wikipedia.org/v1/page/%2E/1"),
        (&current, CURRENT_TOKEN, "/en.wikipedia.org/v1/page/Foo%2F..%2FBar/1"),
        (&old, OLD_TOKEN, &format!("/en.wikipedia.org/v1/archive/%2E%2E/1/{}", Tid::now())),
    ] {
        let method = if path.contains("/archive/") { "PUT" } else { "POST" };
        let mut stream = tokio::net::TcpStream::connect(service.addr).await.expect("connect");
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.expect("read");
        assert!(answer.starts_with("HTTP/1.1 400"), "{method} {path}: {answer}");
        assert!(answer.contains("relative path"), "{method} {path}: {answer}");
    }
}

/// A 503 says which dependency is unavailable, never its address or its
/// error text (the probe saw `GET http://127.0.0.1:…/archive/…: 400 …`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_old_store_is_a_generic_503() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let nowhere = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let current = start_on(Engine::Embedded, current_settings().with(|s| s.own.old_store_url = Some(nowhere.clone()))).await;
    let answer = reqwest::get(current.url("/en.wikipedia.org/v1/page/html/Anarchism/5")).await.expect("send");
    assert_eq!(answer.status(), 503);
    let problem: serde_json::Value = answer.json().await.expect("problem");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.starts_with("old-store is unavailable; retry later"), "{problem}");
    assert!(!problem.to_string().contains("127.0.0.1") && !problem.to_string().contains("http://"), "{problem}");
    assert!(problem["request_id"].is_string(), "the request id leads to the cause in the logs: {problem}");
}

/// The probe's token rotation: one file mounted as old-store's write tokens
/// and current-store's peer token, with the new token added below the old.
/// current-store used to send the whole file as one token (a newline in a
/// header): no first render reached old-store until the file had one line
/// again. Now it sends the first line, and both tokens write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_token_file_keeps_the_hand_off_flowing() {
    let (old_token, new_token) = ("rotation-old-token-0123456789", "rotation-new-token-0123456789");
    let file = tempfile::NamedTempFile::new().expect("token file");
    std::fs::write(file.path(), format!("# rotating: the new token below the old\n{old_token}\n{new_token}\n")).expect("write");
    let tokens = file.path().to_str().expect("utf-8");
    let old = start_old_store(Engine::Embedded, |s| s.common.write_tokens_file = Some(tokens.into())).await;
    let current = start_on(
        Engine::Embedded,
        current_settings().with(|s| {
            s.own.old_store_url = Some(old.url(""));
            s.own.peer_token_file = Some(tokens.into());
            s.common.write_tokens_file = Some(tokens.into());
        }),
    )
    .await;
    let http = reqwest::Client::new();
    for (rev, token) in [(1u64, new_token), (2, old_token)] {
        let body = json!({ "html": format!("<p>{rev}</p>"), "data-parsoid": {}, "section-offsets": {} });
        let r = http.post(current.url(&format!("/en.wikipedia.org/v1/page/Rotated/{rev}"))).bearer_auth(token).json(&body).send().await;
        assert_eq!(r.expect("send").status(), 201, "rev {rev} with the {} token", if rev == 1 { "new" } else { "old" });
    }
    eventually("both first renders reach old-store", WAIT, async || {
        let list: serde_json::Value =
            http.get(old.url("/en.wikipedia.org/v1/archive/revisions/Rotated")).send().await.expect("send").json().await.expect("json");
        list["items"].as_array().is_some_and(|items| items.len() == 2)
    })
    .await;
    assert!(dead_letters(&http, &current).await.is_empty(), "nothing was refused on the way");
    for (rev, token) in [(7, old_token), (8, new_token)] {
        let direct = http
            .put(old.url(&format!("/en.wikipedia.org/v1/archive/Direct/{rev}/{}", Tid::now())))
            .bearer_auth(token)
            .json(&json!({ "html": "<p>7</p>", "data-parsoid": {}, "section-offsets": {} }))
            .send()
            .await
            .expect("send");
        assert!(direct.status().is_success(), "old-store accepts each token of the file: {}", direct.status());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_edit_in_current_store_makes_its_users_pending() {
    let graph = start_on(Engine::Embedded, TestSettings::<DependencyGraph>::new(GRAPH_TOKEN)).await;
    let peer_token = token_file(GRAPH_TOKEN);
    let current = start_on(
        Engine::Embedded,
        current_settings().with(|s| {
            s.own.graph_url = Some(graph.url(""));
            s.own.notify_graph = true;
            s.own.peer_token_file = Some(peer_token.path().to_owned());
        }),
    )
    .await;
    let http = reqwest::Client::new();
    // Main_Page uses the template, and was rendered before the edit.
    let edges = json!({"edges": [{"parent": "Template:Welcome", "type": "modification", "priority": 10}]});
    let r = http.put(graph.url("/en.wikipedia.org/v1/deps/Main_Page")).bearer_auth(GRAPH_TOKEN).json(&edges).send().await.expect("send");
    assert_eq!(r.status(), 200);
    let pending = || async {
        let r = http.get(graph.url("/en.wikipedia.org/v1/pending/Main_Page")).send().await.expect("send");
        r.json::<Value>().await.expect("json")
    };
    assert_eq!(pending().await["needs_update"], false);
    // The template gets a new revision in current-store.
    let body = json!({"html": "<p>Welcome!</p>", "data-parsoid": {}, "section-offsets": {}});
    assert_eq!(put_render(&http, &current, "Template:Welcome", 7, &body).await, 201);
    // The notice travels through the outbox; then the page is pending.
    eventually("the change reaches the graph", Duration::from_secs(60), async || pending().await["needs_update"] == true).await;
    assert_eq!(pending().await["items"][0]["parent"], "Template:Welcome");
}

/// A setting of the Cassandra node under test, as it reports it.
async fn node_setting(name: &str) -> String {
    let keyspace = revstore_storage::testing::TestKeyspace::new("settings");
    let engine = keyspace.connect().await;
    let result = engine
        .session()
        .query_unpaged("SELECT value FROM system_views.settings WHERE name = ?", (name,))
        .await
        .unwrap_or_else(|e| panic!("read the node's {name}: {e}"));
    let rows = result.into_rows_result().expect("rows");
    let (value,): (Option<String>,) = rows.single_row().unwrap_or_else(|e| panic!("no setting {name}: {e}"));
    value.unwrap_or_default()
}

/// Delivered hand-offs once left a row tombstone each in their shard's
/// partition, which every later read of the shard stepped over until
/// gc_grace had passed; past the node's `tombstone_failure_threshold` the read
/// was aborted and the hand-off stopped for good. More first renders than that
/// in one shard, on a node whose threshold is scaled down as a year's traffic
/// would meet it (scripts/test starts it with
/// REVSTORE_CASSANDRA_THRESHOLD_SCALE=100: 1,000 tombstones), must all reach
/// old-store, and so must one written after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Cassandra with a scaled-down tombstone threshold: run scripts/test"]
async fn the_hand_off_keeps_flowing_past_the_nodes_tombstone_limit() {
    let threshold: usize = node_setting("tombstone_failure_threshold").await.parse().expect("a number");
    assert!(
        threshold <= 5_000,
        "the node aborts a read past {threshold} tombstones: start it with REVSTORE_CASSANDRA_THRESHOLD_SCALE=100 \
         (deploy/cassandra/cassandra-local) so that this test can pass it"
    );
    let old = start_old_store(Engine::Cassandra, |_| {}).await;
    let peer_token = token_file(OLD_TOKEN);
    let current = start_on(
        Engine::Cassandra,
        current_settings().with(|s| {
            s.own.old_store_url = Some(old.url(""));
            s.own.peer_token_file = Some(peer_token.path().to_owned());
        }),
    )
    .await;
    let domain = revstore_keys::Domain::parse("en.wikipedia.org").expect("domain");
    let in_shard = |t: &String| {
        let title = revstore_keys::Title::parse(t, Default::default()).expect("title");
        revstore_current_store::testing::outbox_shard(revstore_storage::Site::ONLY, &domain, &title) == 0
    };
    let titles: Vec<String> = (0..).map(|i| format!("Flow_{i}")).filter(in_shard).take(threshold + threshold / 5).collect();
    let http = reqwest::Client::new();
    let body = json!({ "html": "<p>a first render</p>", "data-parsoid": {}, "section-offsets": {} });
    futures_util::stream::iter(&titles)
        .for_each_concurrent(4, |t| {
            let (http, current, body) = (&http, &current, &body);
            async move { assert_eq!(put_render(http, current, t, 1, body).await, 201, "{t}") }
        })
        .await;
    let archived =
        async |t: &str| http.get(old.url(&format!("/en.wikipedia.org/v1/archive/html/{t}/1"))).send().await.expect("send").status() == 200;
    // In queue order: the last queued arrives last.
    eventually(&format!("the last of {} hand-offs in one shard in old-store", titles.len()), WAIT * 3, async || {
        archived(titles.last().expect("titles")).await
    })
    .await;
    for t in &titles {
        assert!(archived(t).await, "{t} never reached old-store");
    }
    let after = (0..).map(|i| format!("After_{i}")).find(in_shard).expect("a title");
    assert_eq!(put_render(&http, &current, &after, 1, &body).await, 201);
    eventually("a hand-off queued after them in old-store", WAIT, async || archived(&after).await).await;
}
