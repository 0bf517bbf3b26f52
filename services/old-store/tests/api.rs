//! old-store's HTTP API, as a client uses it, on real page histories.

mod common;

use common::{Engine, TOKEN, start_on};
use revstore_keys::Tid;
use serde_json::{Value, json};

const ARCHIVE: &str = "/en.wikipedia.org/v1/archive";

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn put(s: &common::Service, title: &str, rev: u64, tid: Tid, body: &Value) -> reqwest::Response {
    client().put(s.url(&format!("{ARCHIVE}/{title}/{rev}/{tid}"))).bearer_auth(TOKEN).json(body).send().await.expect("send")
}

async fn get(s: &common::Service, path: &str) -> reqwest::Response {
    client().get(s.url(&format!("{ARCHIVE}/{path}"))).send().await.expect("send")
}

fn render(html: &str, n: u64) -> Value {
    json!({
        "html": html,
        "data-parsoid": { "counter": n },
        "section-offsets": { "mwAQ": { "html": [0, 10], "wt": [0, 5] } },
        "wikitext": format!("revision {n}"),
    })
}

async fn problem(r: reqwest::Response, status: u16) -> Value {
    assert_eq!(r.status(), status, "{:?}", r.headers());
    assert_eq!(r.headers().get("content-type").and_then(|v| v.to_str().ok()), Some("application/problem+json"));
    r.json().await.expect("problem")
}

async fn a_render_is_archived_once_and_read_in_every_part(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let html = &revstore_testdata::anarchism_html()[0];
    let tid = Tid::now();
    let created = put(&s, "Anarchism", 18201, tid, &render(html, 1)).await;
    assert_eq!(created.status(), 201);
    assert_eq!(created.json::<Value>().await.expect("json")["outcome"], "stored");
    let again = put(&s, "Anarchism", 18201, tid, &render(html, 1)).await;
    assert_eq!(again.status(), 200, "a retried write is idempotent");
    assert_eq!(again.json::<Value>().await.expect("json")["outcome"], "stored");
    let other = put(&s, "Anarchism", 18201, Tid::now(), &render(html, 2)).await;
    assert_eq!(other.status(), 200);
    let other: Value = other.json().await.expect("json");
    assert_eq!(other["outcome"], "skipped", "first render per revision: {other}");

    let page = get(&s, "html/Anarchism/18201").await;
    assert_eq!(page.status(), 200);
    let etag = format!("\"18201/{tid}\"");
    assert_eq!(page.headers().get("etag").and_then(|v| v.to_str().ok()), Some(etag.as_str()));
    assert!(page.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().starts_with("text/html"));
    assert_eq!(&page.text().await.expect("body"), html);
    let by_tid = get(&s, &format!("html/Anarchism/18201/{tid}")).await;
    assert_eq!(&by_tid.text().await.expect("body"), html);
    let not_modified =
        client().get(s.url(&format!("{ARCHIVE}/html/Anarchism/18201"))).header("if-none-match", &etag).send().await.expect("send");
    assert_eq!(not_modified.status(), 304);
    assert_eq!(get(&s, "wikitext/Anarchism/18201").await.text().await.expect("body"), "revision 1");
    assert_eq!(get(&s, "data-parsoid/Anarchism/18201").await.json::<Value>().await.expect("json")["counter"], 1);
    assert_eq!(get(&s, "section-offsets/Anarchism/18201").await.json::<Value>().await.expect("json")["mwAQ"]["wt"][1], 5);
    let bundle: Value = get(&s, "bundle/Anarchism/18201").await.json().await.expect("json");
    assert_eq!((bundle["rev"].as_u64(), bundle["tid"].as_str()), (Some(18201), Some(tid.to_string().as_str())));
    assert_eq!(bundle["html"].as_str(), Some(html.as_str()));

    problem(get(&s, "html/Anarchism/18202").await, 404).await;
    problem(get(&s, &format!("html/Anarchism/18201/{}", Tid::now())).await, 404).await;
    problem(get(&s, "nonsense/Anarchism/18201").await, 404).await;
}

async fn a_whole_history_lists_streams_and_reads_back_identical(engine: Engine) {
    // Small blocks: the history spans several blocks, sealed and open.
    let s = start_on(engine, |s| {
        s.own.limits.max_revisions = 30;
        s.own.settle = std::time::Duration::from_secs(1);
    })
    .await;
    let html = revstore_testdata::anarchism_html();
    let tids: Vec<Tid> = html.iter().map(|_| Tid::now()).collect();
    for (i, h) in html.iter().enumerate() {
        let r = put(&s, "Anarchism", 100 + i as u64, tids[i], &json!({ "html": h })).await;
        assert_eq!(r.status(), 201);
    }
    let mut listed = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = s.url(&format!("{ARCHIVE}/revisions/Anarchism?limit=25"));
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let page: Value = client().get(url).send().await.expect("send").json().await.expect("json");
        listed.extend(page["items"].as_array().expect("items").iter().map(|i| i["rev"].as_u64().expect("rev")));
        match page["next"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(listed, (100..100 + html.len() as u64).collect::<Vec<_>>());
    // From a revision on (the janitor's hand-off check), paged the same way.
    let from: Value = get(&s, "revisions/Anarchism?from=150&limit=3").await.json().await.expect("json");
    let revs: Vec<u64> = from["items"].as_array().expect("items").iter().map(|i| i["rev"].as_u64().expect("rev")).collect();
    assert_eq!(revs, [150, 151, 152]);
    let next = from["next"].as_str().expect("more follow");
    let after: Value = get(&s, &format!("revisions/Anarchism?from=150&limit=3&cursor={next}")).await.json().await.expect("json");
    assert_eq!(after["items"][0]["rev"], 153);

    // Reads in random order, across blocks in every state.
    use rand::seq::SliceRandom;
    let mut order: Vec<usize> = (0..html.len()).collect();
    order.shuffle(&mut rand::rng());
    for i in order.into_iter().take(30) {
        assert_eq!(get(&s, &format!("html/Anarchism/{}", 100 + i)).await.text().await.expect("body"), html[i], "revision {i}");
    }
    // Once the compactor has settled every block (waited for, not guessed),
    // the same again, streamed.
    revstore_test_service::eventually("every compaction done", std::time::Duration::from_secs(120), async || {
        let status: Value =
            client().get(s.url("/admin/compaction")).bearer_auth(TOKEN).send().await.expect("send").json().await.expect("json");
        status["pending"] == 0 && status["compacting"] == false
    })
    .await;
    let stream = get(&s, "history/Anarchism").await;
    assert_eq!(stream.headers().get("content-type").and_then(|v| v.to_str().ok()), Some("application/x-ndjson"));
    let text = stream.text().await.expect("body");
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).expect("json line")).collect();
    assert_eq!(lines.len(), html.len());
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["rev"].as_u64(), Some(100 + i as u64));
        assert_eq!(line["tid"].as_str(), Some(tids[i].to_string().as_str()));
        assert!(line["html"].as_str() == Some(html[i].as_str()), "revision {i} streamed back different");
    }
}

async fn one_render_per_interval_when_so_configured(engine: Engine) {
    let s = start_on(engine, |s| s.own.archive_policy = "one-per:3600".parse().expect("a policy")).await;
    let body = json!({ "wikitext": "x" });
    assert_eq!(put(&s, "Busy", 1, Tid::now(), &body).await.status(), 201);
    let second = put(&s, "Busy", 2, Tid::now(), &body).await;
    assert_eq!(second.json::<Value>().await.expect("json")["outcome"], "skipped");
    let old = Tid::min_at(std::time::SystemTime::now() - std::time::Duration::from_secs(7200));
    assert_eq!(put(&s, "Busy", 3, old, &body).await.status(), 201, "two hours apart: kept");
}

async fn bad_input_is_refused_and_writes_nothing(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let tid = Tid::now();
    let ok = json!({ "html": "<p>x</p>" });
    let send = |path: String, body: Vec<u8>| {
        client().put(s.url(&path)).bearer_auth(TOKEN).header("content-type", "application/json").body(body).send()
    };
    let cases: Vec<(String, Vec<u8>, u16)> = vec![
        (format!("/not a domain/v1/archive/T/1/{tid}"), ok.to_string().into(), 400),
        (format!("{ARCHIVE}/%00bad/1/{tid}"), ok.to_string().into(), 400),
        (format!("{ARCHIVE}/T/0/{tid}"), ok.to_string().into(), 400),
        (format!("{ARCHIVE}/T/abc/{tid}"), ok.to_string().into(), 400),
        (format!("{ARCHIVE}/T/1/not-a-tid"), ok.to_string().into(), 400),
        (format!("{ARCHIVE}/T/1/{}", uuid_v4()), ok.to_string().into(), 400),
        (format!("{ARCHIVE}/T/1/{tid}"), b"{not json".to_vec(), 400),
        (format!("{ARCHIVE}/T/1/{tid}"), json!({}).to_string().into(), 400),
        (format!("{ARCHIVE}/T/1/{tid}"), json!({ "html": "" }).to_string().into(), 400),
        (format!("{ARCHIVE}/T/1/{tid}"), json!({ "html": "x", "data-parsoid": [1] }).to_string().into(), 400),
        (format!("{ARCHIVE}/T/1/{tid}"), json!({ "html": "x", "extra": 1 }).to_string().into(), 400),
        (format!("{ARCHIVE}/T/1/{tid}"), json!({ "html": 5 }).to_string().into(), 400),
        (format!("{ARCHIVE}/T/1/{tid}"), json!({ "html": "x", "page": { "id": 0 } }).to_string().into(), 400),
        (format!("{ARCHIVE}/T/1/{tid}"), json!({ "html": "x", "page": { "id": -1 } }).to_string().into(), 400),
        (format!("{ARCHIVE}/T/1/{tid}"), json!({ "html": "x", "page": { "id": 9_223_372_036_854_775_808u64 } }).to_string().into(), 400),
        (format!("{ARCHIVE}/T/1/{tid}"), json!({ "html": "x", "page": { "id": "12" } }).to_string().into(), 400),
        (format!("{ARCHIVE}/T/1/{tid}"), json!({ "html": "x", "page": { "namespace": 2_000_000 } }).to_string().into(), 400),
        (format!("{ARCHIVE}/T/1/{tid}"), json!({ "html": "x", "page": { "namespace": -3 } }).to_string().into(), 400),
        (format!("{ARCHIVE}/T/1/{tid}"), json!({ "html": "x", "page": { "title": "T" } }).to_string().into(), 400),
        (
            format!("{ARCHIVE}/T/1/{}", Tid::min_at(std::time::SystemTime::now() + std::time::Duration::from_secs(86_400))),
            ok.to_string().into(),
            400,
        ),
    ];
    for (path, body, status) in cases {
        let r = send(path.clone(), body).await.expect("send");
        let p = problem(r, status).await;
        assert!(!p["detail"].as_str().unwrap_or_default().is_empty(), "{path}: {p}");
    }
    let unauthenticated = client().put(s.url(&format!("{ARCHIVE}/T/1/{tid}"))).json(&ok).send().await.expect("send");
    problem(unauthenticated, 401).await;
    // A body over the limit, small enough to be sent whole before the early 413
    // (a multi-megabyte one races the server closing the connection).
    let small = start_on(engine, |s| s.common.body_limit_bytes = 200_000).await;
    let r = put(&small, "T", 1, tid, &json!({ "html": "x".repeat(300_000) })).await;
    problem(r, 413).await;
    let listed: Value = get(&s, "revisions/T").await.json().await.expect("json");
    assert_eq!(listed["items"], json!([]), "nothing was written");
    problem(get(&s, "revisions/T?limit=0").await, 400).await;
    problem(get(&s, "revisions/T?cursor=forged").await, 400).await;
    problem(get(&s, "revisions/T?from=-1").await, 400).await;
    problem(get(&s, "revisions/T?from=9223372036854775808").await, 400).await;
    problem(get(&s, "html/T/notanumber").await, 400).await;
}

fn uuid_v4() -> String {
    "0f8fad5b-d9cb-469f-a165-70867728950e".to_owned()
}

async fn a_suppressed_revision_is_never_served(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let html = revstore_testdata::anarchism_html();
    for i in 0..3u64 {
        assert_eq!(put(&s, "Hidden", 1 + i, Tid::now(), &json!({ "html": html[i as usize] })).await.status(), 201);
    }
    let unauthenticated = client().post(s.url(&format!("{ARCHIVE}/Hidden/2/suppress"))).send().await.expect("send");
    problem(unauthenticated, 401).await;
    let r = client().post(s.url(&format!("{ARCHIVE}/Hidden/2/suppress"))).bearer_auth(TOKEN).send().await.expect("send");
    assert_eq!(r.status(), 204);
    problem(get(&s, "html/Hidden/2").await, 404).await;
    problem(get(&s, "bundle/Hidden/2").await, 404).await;
    let listed: Value = get(&s, "revisions/Hidden").await.json().await.expect("json");
    let revs: Vec<u64> = listed["items"].as_array().expect("items").iter().filter_map(|i| i["rev"].as_u64()).collect();
    assert_eq!(revs, vec![1, 3]);
    let streamed = get(&s, "history/Hidden").await.text().await.expect("body");
    assert_eq!(streamed.lines().count(), 2);
    assert!(!streamed.contains("\"rev\":2,"), "{streamed}");
    // Revision 3 was chained on the hidden one: it still reads.
    assert_eq!(get(&s, "html/Hidden/3").await.text().await.expect("body"), html[2]);
    // A render of a suppressed revision arriving later is not kept.
    let late: Value = put(&s, "Hidden", 2, Tid::now(), &json!({ "html": "x" })).await.json().await.expect("json");
    assert_eq!(late["outcome"], "skipped");

    // Lifted: served again; suppressed again: hidden again.
    let lift = client().delete(s.url(&format!("{ARCHIVE}/Hidden/2/suppress"))).bearer_auth(TOKEN).send().await.expect("send");
    assert_eq!(lift.status(), 204);
    assert_eq!(get(&s, "html/Hidden/2").await.text().await.expect("body"), html[1]);
    let listed: Value = get(&s, "revisions/Hidden").await.json().await.expect("json");
    assert_eq!(listed["items"].as_array().expect("items").len(), 3);
    let again = client().post(s.url(&format!("{ARCHIVE}/Hidden/2/suppress"))).bearer_auth(TOKEN).send().await.expect("send");
    assert_eq!(again.status(), 204);
    problem(get(&s, "html/Hidden/2").await, 404).await;
}

/// Suppressions and lifts forwarded with the time current-store recorded
/// them (`?at=`): old-store holds the same times, so the latest change wins
/// whatever order they arrive in and however often one is sent again; a
/// time that is not one (or far ahead of the clock) is refused and changes
/// nothing.
async fn changes_forwarded_with_their_times_agree_whatever_their_order(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let html = revstore_testdata::anarchism_html();
    for i in 0..2u64 {
        assert_eq!(put(&s, "Timed", 1 + i, Tid::now(), &json!({ "html": html[i as usize] })).await.status(), 201);
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after the epoch").as_millis() as i64;
    let t = now - 10_000;
    let change = |method: reqwest::Method, at: String| {
        client().request(method, s.url(&format!("{ARCHIVE}/Timed/2/suppress?at={at}"))).bearer_auth(TOKEN).send()
    };
    let served = || async { get(&s, "html/Timed/2").await.status().as_u16() };
    // A lift that arrives before the suppression it came after.
    assert_eq!(change(reqwest::Method::DELETE, (t + 2).to_string()).await.expect("send").status(), 204);
    assert_eq!(change(reqwest::Method::POST, (t + 1).to_string()).await.expect("send").status(), 204);
    assert_eq!(served().await, 200, "the lift is the later change");
    assert_eq!(change(reqwest::Method::POST, (t + 3).to_string()).await.expect("send").status(), 204);
    assert_eq!(served().await, 404, "suppressed again after the lift");
    assert_eq!(change(reqwest::Method::DELETE, (t + 2).to_string()).await.expect("send").status(), 204);
    assert_eq!(served().await, 404, "the earlier lift sent again changes nothing");
    let far_ahead = (now + 2 * 3_600_000).to_string();
    for at in ["0", "-5", "soon", "99999999999999999999", far_ahead.as_str()] {
        problem(change(reqwest::Method::DELETE, at.to_owned()).await.expect("send"), 400).await;
        assert_eq!(served().await, 404, "a lift at {at:?} is refused and changes nothing");
    }
    assert_eq!(change(reqwest::Method::DELETE, (t + 4).to_string()).await.expect("send").status(), 204);
    assert_eq!(served().await, 200, "the latest change, a lift");
    assert_eq!(get(&s, "html/Timed/1").await.status(), 200);
}

async fn a_deleted_page_is_never_served_and_a_re_created_one_is(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let html = revstore_testdata::anarchism_html();
    for i in 0..3u64 {
        assert_eq!(put(&s, "Deleted", 1 + i, Tid::now(), &json!({ "html": html[i as usize] })).await.status(), 201);
    }
    let delete = |query: &str| client().delete(s.url(&format!("{ARCHIVE}/Deleted{query}"))).bearer_auth(TOKEN).send();
    problem(client().delete(s.url(&format!("{ARCHIVE}/Deleted?rev=3"))).send().await.expect("send"), 401).await;
    problem(delete("").await.expect("send"), 400).await;
    problem(delete("?rev=zero").await.expect("send"), 400).await;
    assert_eq!(delete("?rev=3").await.expect("send").status(), 204);
    for rev in 1..=3 {
        problem(get(&s, &format!("html/Deleted/{rev}")).await, 404).await;
    }
    let listed: Value = get(&s, "revisions/Deleted").await.json().await.expect("json");
    assert_eq!(listed["items"], json!([]));
    assert_eq!(get(&s, "history/Deleted").await.text().await.expect("body"), "");
    // An archive write of a deleted revision (a hand-off retried) is skipped.
    let late: Value = put(&s, "Deleted", 3, Tid::now(), &json!({ "html": "x" })).await.json().await.expect("json");
    assert_eq!(late["outcome"], "skipped");
    // A deletion through an older revision does not narrow it.
    assert_eq!(delete("?rev=2").await.expect("send").status(), 204);
    problem(get(&s, "html/Deleted/3").await, 404).await;
    // Re-created by a newer revision.
    assert_eq!(put(&s, "Deleted", 4, Tid::now(), &json!({ "html": html[3] })).await.status(), 201);
    assert_eq!(get(&s, "html/Deleted/4").await.text().await.expect("body"), html[3]);
    let listed: Value = get(&s, "revisions/Deleted").await.json().await.expect("json");
    let revs: Vec<u64> = listed["items"].as_array().expect("items").iter().filter_map(|i| i["rev"].as_u64()).collect();
    assert_eq!(revs, vec![4]);
}

async fn the_openapi_document_covers_the_contract(engine: Engine) {
    use http::Method;
    let s = start_on(engine, |_| {}).await;
    let doc: Value = client().get(s.url("/openapi.json")).send().await.expect("send").json().await.expect("json");
    let contract = [
        (Method::PUT, "/{domain}/v1/archive/{title}/{rev}/{tid}"),
        (Method::GET, "/{domain}/v1/archive/{part}/{title}/{rev}"),
        (Method::GET, "/{domain}/v1/archive/{part}/{title}/{rev}/{tid}"),
        (Method::GET, "/{domain}/v1/archive/revisions/{title}"),
        (Method::GET, "/{domain}/v1/archive/history/{title}"),
        (Method::POST, "/{domain}/v1/archive/{title}/{rev}/suppress"),
        (Method::DELETE, "/{domain}/v1/archive/{title}/{rev}/suppress"),
        (Method::DELETE, "/{domain}/v1/archive/{title}"),
    ];
    assert_eq!(revstore_client::undocumented_routes(&doc, &contract), Vec::<String>::new());
    // What current-store and dump-import call, through the typed client.
    assert_eq!(revstore_client::undocumented_routes(&doc, &revstore_client::OldStoreClient::ROUTES), Vec::<String>::new());
}

/// A restart loses the decoded-block cache and the compaction queue: appends
/// after it chain onto what is stored, and every revision still reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_old_store_appends_to_its_open_blocks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let html = revstore_testdata::anarchism_html();
    let (first, second) = html.split_at(40);
    let s = common::start_in(dir.path(), |s| s.own.limits.max_revisions = 25).await;
    for (i, h) in first.iter().enumerate() {
        assert_eq!(put(&s, "Anarchism", 1 + i as u64, Tid::now(), &json!({ "html": h })).await.status(), 201);
    }
    s.stop().await;
    let s = common::start_in(dir.path(), |s| s.own.limits.max_revisions = 25).await;
    for (i, h) in second.iter().enumerate() {
        assert_eq!(put(&s, "Anarchism", 41 + i as u64, Tid::now(), &json!({ "html": h })).await.status(), 201);
    }
    s.stop().await;
    let s = common::start_in(dir.path(), |_| {}).await;
    let streamed = get(&s, "history/Anarchism").await.text().await.expect("body");
    let lines: Vec<Value> = streamed.lines().map(|l| serde_json::from_str(l).expect("json")).collect();
    assert_eq!(lines.len(), html.len());
    for (i, line) in lines.iter().enumerate() {
        assert!(line["html"].as_str() == Some(html[i].as_str()), "revision {} reads back different", i + 1);
    }
}

revstore_test_service::on_both_engines!(
    a_render_is_archived_once_and_read_in_every_part,
    a_whole_history_lists_streams_and_reads_back_identical,
    one_render_per_interval_when_so_configured,
    bad_input_is_refused_and_writes_nothing,
    a_suppressed_revision_is_never_served,
    changes_forwarded_with_their_times_agree_whatever_their_order,
    a_deleted_page_is_never_served_and_a_re_created_one_is,
    the_openapi_document_covers_the_contract,
);

/// Every status an operation answers is in the OpenAPI document (the probe
/// found undocumented problem answers and no security scheme).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_is_documented() {
    let s = common::start_on(common::Engine::Embedded, |s| s.common.body_limit_bytes = 2000).await;
    let doc: serde_json::Value = reqwest::get(s.url("/openapi.json")).await.expect("send").json().await.expect("json");
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    let missing = revstore_test_service::undocumented_answers(&s, common::TOKEN, 2000).await;
    assert!(missing.is_empty(), "answers the OpenAPI document does not list:\n{}", missing.join("\n"));
}

/// The live router and the OpenAPI document describe the same routes and
/// methods (the document is written apart from the router, so they can drift).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_and_the_openapi_document_agree() {
    let s = common::start_on(common::Engine::Embedded, |_| {}).await;
    revstore_test_service::assert_router_matches_openapi(&s, common::TOKEN).await;
    // So every route is in the document: each write and admin route answers
    // 401 without a token and 403 with a wrong one.
    revstore_test_service::assert_every_write_and_admin_route_is_guarded(&s, 8).await;
}

/// A title with nothing archived has an empty history, not a panic in the
/// middle of the answer (the stream was polled after its end; found by the
/// contract check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_of_a_title_with_nothing_archived_is_empty() {
    let s = common::start_on(common::Engine::Embedded, |_| {}).await;
    let answer = reqwest::get(s.url("/en.wikipedia.org/v1/archive/history/Never_archived")).await.expect("send");
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.text().await.expect("body"), "");
}
