//! The hand-off of first renders through the outbox: delivered in the
//! background, retried while the receiver is down, kept across a restart of
//! current-store, and never lost.
//!
//! The receiver here is a minimal HTTP endpoint speaking old-store's archive
//! write (`PUT /{domain}/v1/archive/{title}/{rev}/{tid}`), so the outbox's
//! delivery can be tested before old-store exists; the end-to-end test
//! against old-store itself belongs to old-store.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::routing::put;
use common::{TOKEN, anarchism_html, render, start_in};
use revstore_current_store::RenderBody;
use revstore_keys::Tid;

type Received = Arc<Mutex<BTreeMap<(String, u64), Vec<(String, RenderBody)>>>>;

async fn archive(
    State(received): State<Received>,
    Path((_domain, title, rev, tid)): Path<(String, String, u64, String)>,
    body: axum::Json<RenderBody>,
) -> http::StatusCode {
    received.lock().expect("lock").entry((title, rev)).or_default().push((tid, body.0));
    http::StatusCode::CREATED
}

/// Starts the receiver on `addr` (which may have been refused until now).
async fn receiver(addr: SocketAddr, received: Received) {
    let app = axum::Router::new().route("/{domain}/v1/archive/{title}/{rev}/{tid}", put(archive)).with_state(received);
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind receiver");
    tokio::spawn(async move { axum::serve(listener, app).await });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_renders_reach_old_store_across_outages_and_restarts() {
    // A port nobody listens on yet: old-store is down.
    let old_store = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let url = format!("http://{old_store}");
    let dir = tempfile::tempdir().expect("tempdir");
    let html = anarchism_html();
    let client = reqwest::Client::new();

    let service = start_in(dir.path(), |s| s.own.old_store_url = Some(url.clone())).await;
    let mut expected = BTreeMap::new();
    for (i, rev) in [101u64, 102, 103, 104, 105].into_iter().enumerate() {
        let tid = Tid::now();
        let body = render(&html[i], rev);
        let r = client
            .put(service.url(&format!("/en.wikipedia.org/v1/page/Anarchism/{rev}/{tid}")))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 201);
        expected.insert(rev, (tid.to_string(), body));
        // A re-render of the same revision is not handed off again.
        let again = client
            .put(service.url(&format!("/en.wikipedia.org/v1/page/Anarchism/{rev}/{}", Tid::now())))
            .bearer_auth(TOKEN)
            .json(&render(&html[i], rev + 1000))
            .send()
            .await
            .expect("send");
        assert_eq!(again.status(), 201);
    }
    // Old-store stays down for a while; then current-store restarts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    service.stop().await;
    let service = start_in(dir.path(), |s| s.own.old_store_url = Some(url.clone())).await;

    let received: Received = Arc::default();
    receiver(old_store, received.clone()).await;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got: Vec<u64> = received.lock().expect("lock").keys().map(|(_, rev)| *rev).collect();
        if got.len() == expected.len() {
            break;
        }
        assert!(Instant::now() < deadline, "only {got:?} reached old-store");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let received = received.lock().expect("lock").clone();
    for (rev, (tid, body)) in &expected {
        let deliveries = &received[&("Anarchism".to_owned(), *rev)];
        assert!(deliveries.iter().all(|(t, b)| t == tid && b == body), "revision {rev}: the first render, intact");
    }
    // Nothing else was sent: one revision, one first render.
    assert!(received.keys().all(|(_, rev)| expected.contains_key(rev)));
    drop(service);
}

/// A suppression, a lift or a page's deletion as old-store's routes
/// received it: (method, title, revision, the `at` of its query).
type Change = (String, String, u64, Option<i64>);

/// A receiver of old-store's hand-off routes that records every
/// suppression, lift and deletion (and takes every archive write).
async fn change_receiver(changes: Arc<Mutex<Vec<Change>>>) -> String {
    use axum::extract::Query;
    use axum::http::Method;
    use axum::routing::{delete, post};
    type Params = Query<BTreeMap<String, String>>;
    async fn suppression(
        State(changes): State<Arc<Mutex<Vec<Change>>>>,
        method: Method,
        Path((_domain, title, rev)): Path<(String, String, u64)>,
        Query(query): Params,
    ) -> http::StatusCode {
        let at = query.get("at").and_then(|at| at.parse().ok());
        changes.lock().expect("lock").push((method.to_string(), title, rev, at));
        http::StatusCode::NO_CONTENT
    }
    async fn deletion(
        State(changes): State<Arc<Mutex<Vec<Change>>>>,
        Path((_domain, title)): Path<(String, String)>,
        Query(query): Params,
    ) -> http::StatusCode {
        let through = query.get("rev").and_then(|rev| rev.parse().ok()).unwrap_or_default();
        changes.lock().expect("lock").push(("DELETE page".to_owned(), title, through, None));
        http::StatusCode::NO_CONTENT
    }
    let app = axum::Router::new()
        .route("/{domain}/v1/archive/{title}/{rev}/{tid}", put(|| async { http::StatusCode::CREATED }))
        .route("/{domain}/v1/archive/{title}/{rev}/suppress", post(suppression).delete(suppression))
        .route("/{domain}/v1/archive/{title}", delete(deletion))
        .with_state(changes);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// Suppressions, lifts and deletions reach old-store with the times
/// current-store recorded them (so the two stores' suppression rows agree
/// whatever order the changes arrive in), and the janitor's `hidden` task
/// sends every one of them again, with the same times: the backstop for a
/// hand-off old-store lost (a delivery later than the outbox reads, a
/// restore of old-store from before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hidden_task_sends_old_store_every_suppression_and_deletion_again_with_its_time() {
    let changes: Arc<Mutex<Vec<Change>>> = Arc::default();
    let url = change_receiver(changes.clone()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let service = start_in(dir.path(), |s| s.own.old_store_url = Some(url.clone())).await;
    let client = reqwest::Client::new();
    let page = |path: String| service.url(&format!("/en.wikipedia.org/v1/page/{path}"));
    for (title, rev) in [("Suppressed", 1u64), ("Suppressed", 2), ("Suppressed", 3), ("Deleted", 1)] {
        let r = client.put(page(format!("{title}/{rev}/{}", Tid::now()))).bearer_auth(TOKEN).json(&render("<p>x</p>", rev)).send();
        assert_eq!(r.await.expect("send").status(), 201);
    }
    let send = |request: reqwest::RequestBuilder| async move { request.bearer_auth(TOKEN).send().await.expect("send").status().as_u16() };
    assert_eq!(send(client.post(page("Suppressed/2/suppress".into()))).await, 204);
    assert_eq!(send(client.delete(page("Suppressed/2/suppress".into()))).await, 204);
    assert_eq!(send(client.post(page("Suppressed/3/suppress".into()))).await, 204);
    assert_eq!(send(client.delete(page("Deleted".into()))).await, 204);
    let deadline = Instant::now() + Duration::from_secs(90);
    while changes.lock().expect("lock").len() < 4 {
        assert!(Instant::now() < deadline, "only {:?} reached old-store", changes.lock().expect("lock"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut delivered = std::mem::take(&mut *changes.lock().expect("lock"));
    delivered.sort();
    let at = |method: &str, rev: u64| delivered.iter().find(|c| c.0 == method && c.1 == "Suppressed" && c.2 == rev).and_then(|c| c.3);
    let (suppressed, lifted) = (at("POST", 2).expect("the suppression's time"), at("DELETE", 2).expect("the lift's time"));
    assert!(lifted > suppressed, "the lift is recorded after the suppression it lifts: {delivered:?}");
    assert!(at("POST", 3).is_some(), "{delivered:?}");

    // old-store lost them all; the janitor's hidden task, one full pass.
    let holder = Tid::now().to_string();
    let lease = client.post(service.url("/admin/janitor/lease")).json(&serde_json::json!({"holder": holder, "ttl_secs": 60}));
    assert_eq!(send(lease).await, 200);
    let mut restart = true;
    loop {
        let step = serde_json::json!({"holder": holder, "budget": 1, "restart": restart});
        let answer = client.post(service.url("/admin/janitor/hidden/step")).bearer_auth(TOKEN).json(&step).send().await.expect("send");
        assert_eq!(answer.status(), 200);
        let report: serde_json::Value = answer.json().await.expect("a step report");
        restart = false;
        if report["done"] == true {
            break;
        }
    }
    let mut forwarded = changes.lock().expect("lock").clone();
    forwarded.sort();
    assert_eq!(forwarded, delivered, "the hidden task sends old-store what the outbox did, with the same times");
    drop(service);
}
