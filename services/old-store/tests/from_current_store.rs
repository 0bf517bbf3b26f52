//! current-store and old-store together, as deployed: the first render of
//! every revision handed to old-store through current-store's outbox, old
//! revisions served by current-store from old-store once its grace period is
//! over, and a suppression reaching old-store.

mod common;

use std::time::{Duration, Instant};

use common::{Engine, start_on};
use revstore_keys::Tid;
use revstore_test_service::{StopSignal, spawn_parsed};
use serde_json::json;

const CURRENT_TOKEN: &str = "current-store-test-token";

fn launch_current(argv: Vec<String>, listener: tokio::net::TcpListener, stopped: StopSignal) -> tokio::task::JoinHandle<()> {
    spawn_parsed(argv, listener, stopped, |args: revstore_current_store::Args, settings, listener, shutdown| {
        revstore_current_store::run(args, settings, listener, shutdown)
    })
}

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < Duration::from_secs(60), "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn renders_flow_from_current_store_to_old_store_and_back(engine: Engine) {
    let old = start_on(engine, &[]).await;
    let peer_token = tempfile::NamedTempFile::new().expect("token file");
    std::fs::write(peer_token.path(), common::TOKEN).expect("write token");
    let current = revstore_test_service::start_on(
        Engine::Embedded,
        "revstore-current-store",
        CURRENT_TOKEN,
        &["--old-store-url", &old.url(""), "--peer-token-file", peer_token.path().to_str().expect("utf-8"), "--grace-ttl", "1"],
        launch_current,
    )
    .await;
    let http = reqwest::Client::new();
    let html = revstore_testdata::anarchism_html();
    let revs = [18201u64, 19746, 19749, 21111];
    for (i, rev) in revs.iter().enumerate() {
        let body = json!({ "html": html[i], "data-parsoid": { "n": i }, "section-offsets": {} });
        let r = http
            .put(current.url(&format!("/en.wikipedia.org/v1/page/Anarchism/{rev}/{}", Tid::now())))
            .bearer_auth(CURRENT_TOKEN)
            .json(&body)
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 201);
    }

    // Every revision reaches old-store, with its content intact.
    let listed = || async {
        let list: serde_json::Value =
            http.get(old.url("/en.wikipedia.org/v1/archive/revisions/Anarchism")).send().await.expect("send").json().await.expect("json");
        list["items"].as_array().map(|items| items.iter().filter_map(|i| i["rev"].as_u64()).collect::<Vec<_>>()).unwrap_or_default()
    };
    eventually("old-store holds every revision", async || listed().await == revs).await;
    for (i, rev) in revs.iter().enumerate() {
        let archived = http.get(old.url(&format!("/en.wikipedia.org/v1/archive/html/Anarchism/{rev}"))).send().await.expect("send");
        assert_eq!(archived.text().await.expect("body"), html[i]);
    }

    // Past the grace period current-store no longer holds the old revisions:
    // it serves them from old-store.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let old_rev = http.get(current.url("/en.wikipedia.org/v1/page/html/Anarchism/18201")).send().await.expect("send");
    assert_eq!(old_rev.status(), 200);
    assert!(old_rev.headers().get("etag").and_then(|v| v.to_str().ok()).is_some_and(|e| e.starts_with("\"18201/")));
    assert_eq!(old_rev.text().await.expect("body"), html[0]);
    let held: serde_json::Value =
        http.get(current.url("/en.wikipedia.org/v1/page/revisions/Anarchism")).send().await.expect("send").json().await.expect("json");
    assert!(!held.to_string().contains("18201"), "current-store still holds 18201: {held}");

    // A suppression made at current-store reaches old-store: the revision is
    // served by neither.
    let r =
        http.post(current.url("/en.wikipedia.org/v1/page/Anarchism/19746/suppress")).bearer_auth(CURRENT_TOKEN).send().await.expect("send");
    assert_eq!(r.status(), 204);
    eventually("old-store hides the suppressed revision", async || {
        http.get(old.url("/en.wikipedia.org/v1/archive/html/Anarchism/19746")).send().await.expect("send").status() == 404
    })
    .await;
    let hidden = http.get(current.url("/en.wikipedia.org/v1/page/html/Anarchism/19746")).send().await.expect("send");
    assert_eq!(hidden.status(), 404);
}

revstore_test_service::on_both_engines!(renders_flow_from_current_store_to_old_store_and_back);
