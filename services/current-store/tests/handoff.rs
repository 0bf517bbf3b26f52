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
