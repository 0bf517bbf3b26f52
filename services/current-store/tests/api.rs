//! current-store's HTTP API, as a client uses it, on real page HTML.

mod common;

use common::{Engine, TOKEN, anarchism_html, render, start_on};
use revstore_keys::Tid;
use serde_json::Value;

const PAGE: &str = "/en.wikipedia.org/v1/page";

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn put(s: &common::Service, title: &str, rev: u64, tid: Tid, body: &impl serde::Serialize) -> reqwest::Response {
    client().put(s.url(&format!("{PAGE}/{title}/{rev}/{tid}"))).bearer_auth(TOKEN).json(body).send().await.expect("send")
}

fn etag(r: &reqwest::Response) -> String {
    r.headers().get("etag").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
}

async fn problem(r: reqwest::Response, status: u16) -> Value {
    assert_eq!(r.status(), status, "{:?}", r.headers());
    assert_eq!(r.headers().get("content-type").and_then(|v| v.to_str().ok()), Some("application/problem+json"));
    r.json().await.expect("problem")
}

async fn a_render_is_stored_once_and_served_in_every_part(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let html = &anarchism_html()[0];
    let tid = Tid::now();
    let created = put(&s, "Anarchism", 18201, tid, &render(html, 1)).await;
    assert_eq!(created.status(), 201);
    assert_eq!(etag(&created), format!("\"18201/{tid}\""));
    let again = put(&s, "Anarchism", 18201, tid, &render(html, 1)).await;
    assert_eq!(again.status(), 201, "a retried write answers as the first did");
    assert_eq!(etag(&again), format!("\"18201/{tid}\""));

    let latest = client().get(s.url(&format!("{PAGE}/html/Anarchism"))).send().await.expect("send");
    assert_eq!(latest.status(), 200);
    assert_eq!(etag(&latest), format!("\"18201/{tid}\""));
    let content_type = latest.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    assert!(content_type.starts_with("text/html; charset=utf-8; profile=\"https://www.mediawiki.org/wiki/Specs/HTML/"), "{content_type}");
    assert!(latest.headers().contains_key("cache-control"));
    assert_eq!(&latest.text().await.expect("body"), html);

    let not_modified = client()
        .get(s.url(&format!("{PAGE}/html/Anarchism")))
        .header("if-none-match", format!("\"18201/{tid}\""))
        .send()
        .await
        .expect("send");
    assert_eq!(not_modified.status(), 304);

    let bundle: Value =
        client().get(s.url(&format!("{PAGE}/bundle/Anarchism/18201"))).send().await.expect("send").json().await.expect("json");
    assert_eq!((bundle["rev"].as_u64(), bundle["tid"].as_str()), (Some(18201), Some(tid.to_string().as_str())));
    assert_eq!(bundle["html"].as_str(), Some(html.as_str()));
    assert_eq!(bundle["data-parsoid"]["counter"], 1);
    let dp = client().get(s.url(&format!("{PAGE}/data-parsoid/Anarchism/18201/{tid}"))).send().await.expect("send");
    assert!(dp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().contains("data-parsoid"));
    assert_eq!(dp.json::<Value>().await.expect("json")["counter"], 1);
    let so: Value =
        client().get(s.url(&format!("{PAGE}/section-offsets/Anarchism"))).send().await.expect("send").json().await.expect("json");
    assert_eq!(so["mwAQ"]["wt"][1], 5);

    let meta: Value = client().get(s.url(&format!("{PAGE}/title/Anarchism"))).send().await.expect("send").json().await.expect("json");
    assert_eq!((meta["rev"].as_u64(), meta["tid"].as_str()), (Some(18201), Some(tid.to_string().as_str())));
    assert!(meta["rendered_at"].as_str().is_some_and(|t| t.ends_with('Z')));
}

async fn a_new_revision_supersedes_and_the_old_one_stays_for_the_grace_period(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let html = anarchism_html();
    let (t1, t2) = (Tid::now(), Tid::now());
    assert_eq!(put(&s, "Anarchism", 18201, t1, &render(&html[0], 1)).await.status(), 201);
    let posted =
        client().post(s.url(&format!("{PAGE}/Anarchism/19746"))).bearer_auth(TOKEN).json(&render(&html[1], 2)).send().await.expect("send");
    assert_eq!(posted.status(), 201);
    let location = posted.headers().get("location").and_then(|v| v.to_str().ok()).expect("location").to_owned();
    assert_eq!(client().get(s.url(&location)).send().await.expect("send").text().await.expect("body"), html[1]);
    // A late re-render of the old revision does not win.
    assert_eq!(put(&s, "Anarchism", 18201, t2, &render(&html[0], 3)).await.status(), 201);
    let latest = client().get(s.url(&format!("{PAGE}/html/Anarchism"))).send().await.expect("send");
    assert!(etag(&latest).starts_with("\"19746/"), "{}", etag(&latest));
    // The superseded revision and both its renders are still there, by revision and by tid.
    let old = client().get(s.url(&format!("{PAGE}/bundle/Anarchism/18201"))).send().await.expect("send");
    assert_eq!(old.status(), 200);
    assert_eq!(old.json::<Value>().await.expect("json")["tid"].as_str(), Some(t2.to_string().as_str()), "latest render of the revision");
    let first = client().get(s.url(&format!("{PAGE}/html/Anarchism/18201/{t1}"))).send().await.expect("send");
    assert_eq!(first.status(), 200);
    assert_eq!(first.text().await.expect("body"), html[0]);
    let listed: Value = client().get(s.url(&format!("{PAGE}/revisions/Anarchism"))).send().await.expect("send").json().await.expect("json");
    let items = listed["items"].as_array().expect("items");
    assert_eq!(items.len(), 3, "{listed}");
    assert_eq!((items[0]["rev"].as_u64(), items[0]["held_in"].as_str()), (Some(19746), Some("current")));
    assert!(items[1..].iter().all(|i| i["rev"] == 18201 && i["held_in"] == "grace"), "{listed}");
}

async fn preconditions_drop_stale_renders(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let html = &anarchism_html()[2];
    let t1 = Tid::now();
    assert_eq!(put(&s, "Anarchism", 19749, t1, &render(html, 1)).await.status(), 201);
    let stale = client()
        .put(s.url(&format!("{PAGE}/Anarchism/19749/{}", Tid::now())))
        .bearer_auth(TOKEN)
        .header("if-match", "\"19749/00000000-0000-1000-8000-000000000000\"")
        .json(&render(html, 2))
        .send()
        .await
        .expect("send");
    problem(stale, 412).await;
    let fresh = client()
        .put(s.url(&format!("{PAGE}/Anarchism/19749/{}", Tid::now())))
        .bearer_auth(TOKEN)
        .header("if-match", format!("\"19749/{t1}\""))
        .json(&render(html, 3))
        .send()
        .await
        .expect("send");
    assert_eq!(fresh.status(), 201);
    let long_ago = httpdate::fmt_http_date(std::time::SystemTime::now() - std::time::Duration::from_secs(3600));
    let rerender = client()
        .put(s.url(&format!("{PAGE}/Anarchism/19749/{}", Tid::now())))
        .bearer_auth(TOKEN)
        .header("if-unmodified-since", long_ago)
        .json(&render(html, 4))
        .send()
        .await
        .expect("send");
    problem(rerender, 412).await;
}

async fn bad_input_is_refused_and_writes_nothing(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let html = &anarchism_html()[3];
    let ok = render(html, 1);
    let tid = Tid::now();
    let put_raw = |path: String, body: String| {
        client().put(s.url(&path)).bearer_auth(TOKEN).header("content-type", "application/json").body(body).send()
    };
    let good_json = serde_json::to_string(&ok).expect("json");
    for (path, body, status, says) in [
        (format!("/not a domain/v1/page/Anarchism/1/{tid}"), good_json.clone(), 400, "invalid domain"),
        (format!("{PAGE}/Bad%23Title/1/{tid}"), good_json.clone(), 400, "'#'"),
        (format!("{PAGE}/Anarchism/0/{tid}"), good_json.clone(), 400, "revisions start at 1"),
        (format!("{PAGE}/Anarchism/1/not-a-tid"), good_json.clone(), 400, "invalid tid"),
        (format!("{PAGE}/Anarchism/1/{}", uuid_v4()), good_json.clone(), 400, "version 1"),
        (format!("{PAGE}/Anarchism/1/{tid}"), "{\"html\": ".to_owned(), 400, "json"),
        (
            format!("{PAGE}/Anarchism/1/{tid}"),
            r#"{"html":"<p>x</p>","data-parsoid":[],"section-offsets":{}}"#.to_owned(),
            400,
            "data-parsoid must be a JSON object",
        ),
        (
            format!("{PAGE}/Anarchism/1/{tid}"),
            r#"{"html":"<p>x</p>","data-parsoid":{},"section-offsets":{},"extra":1}"#.to_owned(),
            422,
            "extra",
        ),
        (format!("{PAGE}/Anarchism/1/{}", future_tid()), good_json.clone(), 400, "lies in the future"),
        // A tid from 1582 (the UUID epoch) used to be stored.
        (format!("{PAGE}/Anarchism/1/00000000-0000-1000-8000-000000000000"), good_json.clone(), 400, "before 2001"),
        (format!("{PAGE}/Foo%2F..%2FBar/1/{tid}"), good_json.clone(), 400, "relative path"),
        (format!("{PAGE}/:Anarchism/1/{tid}"), good_json.clone(), 400, "':'"),
    ] {
        let body = problem(put_raw(path.clone(), body).await.expect("send"), status).await;
        assert!(body["detail"].as_str().unwrap_or_default().to_lowercase().contains(&says.to_lowercase()), "{path}: {body}");
    }
    // Not UTF-8 at all.
    let garbage = client()
        .put(s.url(&format!("{PAGE}/Anarchism/1/{tid}")))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(vec![0xff, 0xfe, 0x7b])
        .send()
        .await
        .expect("send");
    problem(garbage, 400).await;
    // Over the body limit (a service with a small one, so the client finishes
    // sending before it reads the early 413).
    let small = start_on(engine, |s| s.common.body_limit_bytes = 200_000).await;
    problem(put(&small, "Anarchism", 1, tid, &render(&"x".repeat(300_000), 1)).await, 413).await;
    problem(client().get(small.url(&format!("{PAGE}/html/Anarchism"))).send().await.expect("send"), 404).await;
    problem(client().put(s.url(&format!("{PAGE}/Anarchism/1/{tid}"))).json(&ok).send().await.expect("send"), 401).await;
    problem(client().get(s.url(&format!("{PAGE}/xml/Anarchism"))).send().await.expect("send"), 404).await;
    // None of it was written.
    problem(client().get(s.url(&format!("{PAGE}/html/Anarchism"))).send().await.expect("send"), 404).await;
}

/// Pages named like the static routes' first segment (`title`, `revisions`)
/// could not be written by POST: the static GET routes answered 405.
async fn pages_named_title_and_revisions_can_be_posted(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    for name in ["title", "revisions", "Title"] {
        let posted = client().post(s.url(&format!("{PAGE}/{name}/5"))).bearer_auth(TOKEN).json(&render("<p>named</p>", 1)).send().await;
        let posted = posted.expect("send");
        assert_eq!(posted.status(), 201, "POST {name}");
        let location = posted.headers().get("location").and_then(|v| v.to_str().ok()).expect("location").to_owned();
        let page = if name.eq_ignore_ascii_case("title") { "Title" } else { "Revisions" };
        assert!(location.starts_with(&format!("/en.wikipedia.org/v1/page/html/{page}/5/")), "{location}");
    }
    for name in ["Title", "Revisions"] {
        let html = client().get(s.url(&format!("{PAGE}/html/{name}/5"))).send().await.expect("send");
        assert_eq!((html.status().as_u16(), html.text().await.expect("body")), (200, "<p>named</p>".to_owned()), "{name}");
    }
    // The static routes still mean what they meant.
    let meta: Value = client().get(s.url(&format!("{PAGE}/title/Title"))).send().await.expect("send").json().await.expect("json");
    assert_eq!(meta["rev"], 5);
    problem(client().post(s.url(&format!("{PAGE}/title/5"))).json(&render("<p>x</p>", 1)).send().await.expect("send"), 401).await;
}

fn uuid_v4() -> String {
    "0b8c6c2e-1a40-4f7e-9c1d-6a7f1f2f3e4d".to_owned()
}

fn future_tid() -> Tid {
    revstore_keys::TidGenerator::new().next_at(std::time::SystemTime::now() + std::time::Duration::from_secs(86_400))
}

async fn delete_and_suppress_hide_content(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let html = anarchism_html();
    let (t1, t2) = (Tid::now(), Tid::now());
    assert_eq!(put(&s, "Anarchism", 20514, t1, &render(&html[3], 1)).await.status(), 201);
    assert_eq!(put(&s, "Anarchism", 42733, t2, &render(&html[4], 2)).await.status(), 201);
    let suppress = client().post(s.url(&format!("{PAGE}/Anarchism/20514/suppress"))).bearer_auth(TOKEN).send().await.expect("send");
    assert_eq!(suppress.status(), 204);
    problem(client().get(s.url(&format!("{PAGE}/html/Anarchism/20514"))).send().await.expect("send"), 404).await;
    problem(client().get(s.url(&format!("{PAGE}/html/Anarchism/20514/{t1}"))).send().await.expect("send"), 404).await;
    let listed: Value = client().get(s.url(&format!("{PAGE}/revisions/Anarchism"))).send().await.expect("send").json().await.expect("json");
    assert!(listed["items"].as_array().expect("items").iter().all(|i| i["rev"] != 20514), "{listed}");
    // A render of a suppressed revision is refused, and nothing of it served.
    let t3 = Tid::now();
    let refused = problem(put(&s, "Anarchism", 20514, t3, &render(&html[3], 3)).await, 409).await;
    assert_eq!(refused["type"], "urn:revstore:problem:revision-suppressed", "{refused}");
    problem(client().get(s.url(&format!("{PAGE}/html/Anarchism/20514/{t3}"))).send().await.expect("send"), 404).await;
    problem(client().get(s.url(&format!("{PAGE}/html/Anarchism/20514"))).send().await.expect("send"), 404).await;
    let latest = client().get(s.url(&format!("{PAGE}/html/Anarchism"))).send().await.expect("send");
    assert_eq!(etag(&latest), format!("\"42733/{t2}\""));

    // Lifted: its renders are taken and served again; suppressed again: hidden.
    let suppression = s.url(&format!("{PAGE}/Anarchism/20514/suppress"));
    problem(client().delete(&suppression).send().await.expect("send"), 401).await;
    assert_eq!(client().delete(&suppression).bearer_auth(TOKEN).send().await.expect("send").status(), 204);
    assert_eq!(put(&s, "Anarchism", 20514, t3, &render(&html[3], 3)).await.status(), 201);
    assert_eq!(client().get(s.url(&format!("{PAGE}/html/Anarchism/20514/{t3}"))).send().await.expect("send").status(), 200);
    assert_eq!(client().post(&suppression).bearer_auth(TOKEN).send().await.expect("send").status(), 204);
    problem(client().get(s.url(&format!("{PAGE}/html/Anarchism/20514/{t3}"))).send().await.expect("send"), 404).await;

    problem(client().delete(s.url(&format!("{PAGE}/Anarchism"))).send().await.expect("send"), 401).await;
    problem(client().delete(s.url(&format!("{PAGE}/Anarchism?rev=x"))).bearer_auth(TOKEN).send().await.expect("send"), 400).await;
    assert_eq!(client().delete(s.url(&format!("{PAGE}/Anarchism"))).bearer_auth(TOKEN).send().await.expect("send").status(), 204);
    problem(client().get(s.url(&format!("{PAGE}/html/Anarchism"))).send().await.expect("send"), 404).await;
    problem(client().get(s.url(&format!("{PAGE}/html/Anarchism/42733/{t2}"))).send().await.expect("send"), 404).await;
    let listed: Value = client().get(s.url(&format!("{PAGE}/revisions/Anarchism"))).send().await.expect("send").json().await.expect("json");
    assert_eq!(listed["items"], serde_json::json!([]));
    // The render job retried after the delete: refused, and the page stays deleted.
    let retried = problem(put(&s, "Anarchism", 42733, t2, &render(&html[4], 2)).await, 409).await;
    assert_eq!(retried["type"], "urn:revstore:problem:page-deleted", "{retried}");
    problem(client().get(s.url(&format!("{PAGE}/html/Anarchism"))).send().await.expect("send"), 404).await;
    // A new revision re-creates it.
    let t4 = Tid::now();
    assert_eq!(put(&s, "Anarchism", 42734, t4, &render(&html[5], 4)).await.status(), 201);
    assert_eq!(etag(&client().get(s.url(&format!("{PAGE}/html/Anarchism"))).send().await.expect("send")), format!("\"42734/{t4}\""));
}

async fn a_rev_and_tid_name_one_body(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let html = anarchism_html();
    let tid = Tid::now();
    assert_eq!(put(&s, "Anarchism", 18201, tid, &render(&html[0], 1)).await.status(), 201);
    let conflict = problem(put(&s, "Anarchism", 18201, tid, &render(&html[1], 1)).await, 409).await;
    assert_eq!(conflict["type"], "urn:revstore:problem:render-conflict", "{conflict}");
    let served = client().get(s.url(&format!("{PAGE}/html/Anarchism/18201/{tid}"))).send().await.expect("send");
    assert_eq!(&served.text().await.expect("body"), &html[0], "one ETag, two contents");
}

async fn titles_with_slashes_and_spaces_are_one_page(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let tid = Tid::now();
    assert_eq!(put(&s, "AC%2FDC%20live", 7, tid, &render("<p>rock</p>", 1)).await.status(), 201);
    for alias in ["AC%2FDC_live", "aC%2FDC%20live"] {
        let r = client().get(s.url(&format!("{PAGE}/html/{alias}"))).send().await.expect("send");
        assert_eq!(r.status(), 200, "{alias}");
    }
    let meta: Value = client().get(s.url(&format!("{PAGE}/title/AC%2FDC_live"))).send().await.expect("send").json().await.expect("json");
    assert_eq!(meta["title"], "AC/DC_live");
}

async fn the_openapi_document_covers_the_contract(engine: Engine) {
    use http::Method;
    let s = start_on(engine, |_| {}).await;
    let doc: Value = client().get(s.url("/openapi.json")).send().await.expect("send").json().await.expect("json");
    let contract = [
        (Method::PUT, "/{domain}/v1/page/{title}/{rev}/{tid}"),
        (Method::POST, "/{domain}/v1/page/{title}/{rev}"),
        (Method::GET, "/{domain}/v1/page/{part}/{title}"),
        (Method::GET, "/{domain}/v1/page/{part}/{title}/{rev}"),
        (Method::GET, "/{domain}/v1/page/{part}/{title}/{rev}/{tid}"),
        (Method::GET, "/{domain}/v1/page/title/{title}"),
        (Method::GET, "/{domain}/v1/page/revisions/{title}"),
        (Method::DELETE, "/{domain}/v1/page/{title}"),
        (Method::POST, "/{domain}/v1/page/{title}/{rev}/suppress"),
        (Method::DELETE, "/{domain}/v1/page/{title}/{rev}/suppress"),
    ];
    assert_eq!(revstore_client::undocumented_routes(&doc, &contract), Vec::<String>::new());
}

revstore_test_service::on_both_engines!(
    a_render_is_stored_once_and_served_in_every_part,
    a_new_revision_supersedes_and_the_old_one_stays_for_the_grace_period,
    preconditions_drop_stale_renders,
    bad_input_is_refused_and_writes_nothing,
    delete_and_suppress_hide_content,
    a_rev_and_tid_name_one_body,
    titles_with_slashes_and_spaces_are_one_page,
    the_openapi_document_covers_the_contract,
    pages_named_title_and_revisions_can_be_posted,
);

/// Every status an operation answers is in the OpenAPI document (the probe
/// found undocumented problem answers and no security scheme).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_is_documented() {
    let s = common::start_on(common::Engine::Embedded, |s| s.common.body_limit_bytes = 2000).await;
    let doc: serde_json::Value = reqwest::get(s.url("/openapi.json")).await.expect("send").json().await.expect("json");
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    let missing = revstore_test_service::undocumented_answers(&s, TOKEN, 2000).await;
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
    revstore_test_service::assert_every_write_and_admin_route_is_guarded(&s, 11).await;
}
