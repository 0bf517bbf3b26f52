//! current-store and the dependency graph together, as deployed: a new
//! latest revision of a template, written to current-store, reaches the graph
//! as a change notice (through current-store's outbox), and a page that uses
//! the template finds it in its pull check.

mod common;

use std::time::{Duration, Instant};

use common::{DOMAIN, Engine, TOKEN};
use revstore_current_store::CurrentStore;
use revstore_keys::Tid;
use serde_json::{Value, json};

const CURRENT_TOKEN: &str = "current-store-test-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_edit_in_current_store_makes_its_users_pending() {
    let graph = common::start_on(Engine::Embedded, |_| {}).await;
    let peer_token = tempfile::NamedTempFile::new().expect("token file");
    std::fs::write(peer_token.path(), TOKEN).expect("write token");
    let current = revstore_test_service::start_on(
        Engine::Embedded,
        revstore_test_service::TestSettings::<CurrentStore>::new(CURRENT_TOKEN).with(|s| {
            s.own.graph_url = Some(graph.url(""));
            s.own.notify_graph = true;
            s.own.peer_token_file = Some(peer_token.path().to_owned());
        }),
    )
    .await;
    let http = reqwest::Client::new();
    // Main_Page uses the template, and was rendered before the edit.
    let edges = json!({"edges": [{"parent": "Template:Welcome", "type": "modification", "priority": 10}]});
    let r = http.put(graph.url(&format!("/{DOMAIN}/v1/deps/Main_Page"))).bearer_auth(TOKEN).json(&edges).send().await.expect("send");
    assert_eq!(r.status(), 200);
    let pending = || async {
        let r = http.get(graph.url(&format!("/{DOMAIN}/v1/pending/Main_Page"))).send().await.expect("send");
        r.json::<Value>().await.expect("json")
    };
    assert_eq!(pending().await["needs_update"], false);
    // The template gets a new revision in current-store.
    let body = json!({"html": "<p>Welcome!</p>", "data-parsoid": {}, "section-offsets": {}});
    let r = http
        .put(current.url(&format!("/{DOMAIN}/v1/page/Template:Welcome/7/{}", Tid::now())))
        .bearer_auth(CURRENT_TOKEN)
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 201);
    // The notice travels through the outbox; then the page is pending.
    let started = Instant::now();
    loop {
        let found = pending().await;
        if found["needs_update"] == true {
            assert_eq!(found["items"][0]["parent"], "Template:Welcome", "{found}");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the change never reached the graph: {found}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
