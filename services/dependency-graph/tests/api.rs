//! The dependency graph's HTTP API, as its clients use it, on both engines.

mod common;

use std::collections::HashSet;

use common::{DOMAIN, Engine, TOKEN, start_on};
use revstore_api::ChangeKind;
use revstore_api::graph::Edge;
use serde_json::{Value, json};

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn put_deps(s: &common::Service, child: &str, edges: Value) -> reqwest::Response {
    client()
        .put(s.url(&format!("/{DOMAIN}/v1/deps/{child}")))
        .bearer_auth(TOKEN)
        .json(&json!({ "edges": edges }))
        .send()
        .await
        .expect("send")
}

async fn get_json(s: &common::Service, path: &str) -> Value {
    let r = client().get(s.url(&format!("/{DOMAIN}/v1/{path}"))).send().await.expect("send");
    let status = r.status();
    let body: Value = r.json().await.expect("json");
    assert_eq!(status, 200, "{path}: {body}");
    body
}

async fn post(s: &common::Service, path: &str, body: Value) -> reqwest::Response {
    client().post(s.url(&format!("/{DOMAIN}/v1/{path}"))).bearer_auth(TOKEN).json(&body).send().await.expect("send")
}

fn children(listing: &Value) -> Vec<String> {
    listing["items"].as_array().expect("items").iter().map(|i| i["child"].as_str().expect("child").to_owned()).collect()
}

async fn a_dependency_set_is_replaced_by_its_difference(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let set = json!([
        {"parent": "Template:Infobox", "type": "modification", "priority": 900, "child_selector": ["mwAB"]},
        {"parent": "Template:Cite", "type": "modification", "priority": 10},
        {"parent": "Template:Cite", "type": "existence", "priority": 5},
        {"parent": "Linked page", "type": "existence", "priority": 1},
    ]);
    let r = put_deps(&s, "Main_Page", set.clone()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.expect("json"), json!({"added": 4, "removed": 0, "changed": 0, "unchanged": 0}));
    // The same set again writes nothing.
    let again: Value = put_deps(&s, "Main_Page", set).await.json().await.expect("json");
    assert_eq!(again, json!({"added": 0, "removed": 0, "changed": 0, "unchanged": 4}));
    // Listed by child, priority descending; titles normalised.
    let deps = get_json(&s, "deps/Main_Page").await;
    let parents: Vec<(&str, i64)> = deps["items"]
        .as_array()
        .expect("json shape")
        .iter()
        .map(|i| (i["parent"].as_str().expect("json shape"), i["priority"].as_i64().expect("json shape")))
        .collect();
    assert_eq!(parents, [("Template:Infobox", 900), ("Template:Cite", 10), ("Template:Cite", 5), ("Linked_page", 1)]);
    assert_eq!(deps["items"][0]["child_selector"], json!(["mwAB"]));
    assert_eq!(children(&get_json(&s, "dependents/Template:Cite").await), ["Main_Page"]);
    assert_eq!(children(&get_json(&s, "dependents/Template:Cite?type=existence").await), ["Main_Page"]);
    // A new priority, new selectors, one edge gone, one new.
    let changed = json!([
        {"parent": "Template:Infobox", "type": "modification", "priority": 900, "child_selector": ["mwAB", "mwAC"]},
        {"parent": "Template:Cite", "type": "modification", "priority": 700},
        {"parent": "Linked page", "type": "existence", "priority": 1},
        {"parent": "Template:Navbox", "type": "modification", "priority": 50},
    ]);
    let outcome: Value = put_deps(&s, "Main_Page", changed).await.json().await.expect("json");
    assert_eq!(outcome, json!({"added": 1, "removed": 1, "changed": 2, "unchanged": 1}));
    let cite = get_json(&s, "dependents/Template:Cite").await;
    assert_eq!(cite["items"][0]["priority"], 700, "{cite}");
    assert_eq!(children(&cite).len(), 1, "the old priority's row is gone: {cite}");
    assert!(children(&get_json(&s, "dependents/Template:Cite?type=existence").await).is_empty());
    assert_eq!(children(&get_json(&s, "dependents/Template:Navbox").await), ["Main_Page"]);
    // A selector dropped from an edge is cleared, in both directions.
    let without = json!([
        {"parent": "Template:Infobox", "type": "modification", "priority": 900},
        {"parent": "Template:Cite", "type": "modification", "priority": 700},
        {"parent": "Linked page", "type": "existence", "priority": 1},
        {"parent": "Template:Navbox", "type": "modification", "priority": 50},
    ]);
    let outcome: Value = put_deps(&s, "Main_Page", without).await.json().await.expect("json");
    assert_eq!(outcome["changed"], 1, "{outcome}");
    assert_eq!(get_json(&s, "deps/Main_Page").await["items"][0]["child_selector"], Value::Null);
    assert_eq!(get_json(&s, "dependents/Template:Infobox").await["items"][0]["child_selector"], Value::Null);
    // Removing the page removes it from both directions.
    let r = client().delete(s.url(&format!("/{DOMAIN}/v1/deps/Main_Page"))).bearer_auth(TOKEN).send().await.expect("send");
    assert_eq!(r.status(), 204);
    assert!(get_json(&s, "deps/Main_Page").await["items"].as_array().expect("json shape").is_empty());
    for parent in ["Template:Cite", "Template:Infobox", "Template:Navbox"] {
        assert!(children(&get_json(&s, &format!("dependents/{parent}")).await).is_empty(), "{parent}");
    }
}

async fn bad_input_is_refused_and_writes_nothing(engine: Engine) {
    let s = start_on(engine, |s| s.own.max_edges = 3).await;
    let edge = |parent: &str| json!({"parent": parent, "type": "modification", "priority": 1});
    let cases: Vec<(&str, Value, u16)> = vec![
        ("itself", json!([edge("Main Page")]), 400),
        ("too many", json!([edge("A"), edge("B"), edge("C"), edge("D")]), 413),
        ("unknown type", json!([{"parent": "A", "type": "rename", "priority": 1}]), 422),
        ("priority too high", json!([{"parent": "A", "type": "modification", "priority": 1001}]), 400),
        ("negative priority", json!([{"parent": "A", "type": "modification", "priority": -1}]), 400),
        ("empty selector", json!([{"parent": "A", "type": "modification", "priority": 1, "child_selector": []}]), 400),
        ("control character", json!([{"parent": "A", "type": "modification", "priority": 1, "parent_selector": ["a\u{1}"]}]), 400),
        ("invalid title", json!([edge("A|B")]), 400),
        ("twice", json!([edge("A"), edge("A")]), 400),
    ];
    for (what, edges, status) in cases {
        let r = put_deps(&s, "Main_Page", edges).await;
        assert_eq!(r.status(), status, "{what}");
        assert_eq!(r.headers().get("content-type").and_then(|v| v.to_str().ok()), Some("application/problem+json"), "{what}");
    }
    assert!(get_json(&s, "deps/Main_Page").await["items"].as_array().expect("json shape").is_empty(), "nothing was written");
    for path in
        ["dependents/A?cursor=forged", "dependents/A?min_priority=2000", "dependents/A?type=rename", "deps/A?limit=0", "pending/A|B"]
    {
        let r = client().get(s.url(&format!("/{DOMAIN}/v1/{path}"))).send().await.expect("send");
        assert_eq!(r.status(), 400, "{path}");
    }
    let future = "2999-01-01T00:00:00Z";
    for body in [
        json!({"page": "A", "type": "modification", "at": "yesterday"}),
        json!({"page": "A", "type": "modification", "at": future}),
        json!({"page": "A|B", "type": "modification", "at": "2026-01-01T00:00:00Z"}),
        json!({"page": "A", "type": "modification", "at": "2026-01-01T00:00:00Z", "selector": ""}),
    ] {
        assert_eq!(post(&s, "changes", body.clone()).await.status(), 400, "{body}");
    }
    // Writes need the token.
    let r = client().put(s.url(&format!("/{DOMAIN}/v1/deps/A"))).json(&json!({"edges": []})).send().await.expect("send");
    assert_eq!(r.status(), 401);
}

async fn the_pull_check_finds_what_changed_after_the_last_update(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let set = json!([
        {"parent": "Template:Infobox", "type": "modification", "priority": 10, "parent_selector": ["x"], "child_selector": ["mwAB"]},
        {"parent": "Template:Cite", "type": "modification", "priority": 2, "child_selector": ["mwAC"]},
    ]);
    assert_eq!(put_deps(&s, "Main_Page", set).await.status(), 200);
    let pending = || async { get_json(&s, "pending/Main_Page").await };
    assert_eq!(pending().await, json!({"needs_update": false, "items": []}));
    let change = |page: &str, at: &str, selector: Option<&str>| {
        let mut body = json!({"page": page, "type": "modification", "at": at});
        if let Some(sel) = selector {
            body["selector"] = json!(sel);
        }
        body
    };
    // A change in a fragment the edge does not use, and one from before the
    // edge existed, are not pending.
    assert_eq!(post(&s, "changes", change("Template:Infobox", "2099-01-01T00:00:00Z", Some("y"))).await.status(), 400, "future");
    let soon = revstore_keys::rfc3339(std::time::SystemTime::now() + std::time::Duration::from_secs(60));
    assert_eq!(post(&s, "changes", change("Template:Infobox", &soon, Some("y"))).await.status(), 204);
    assert_eq!(post(&s, "changes", change("Template:Cite", "2001-01-01T00:00:00Z", None)).await.status(), 204);
    assert_eq!(pending().await["needs_update"], false);
    // A change of a used fragment, and one of a whole page: pending, pull first.
    assert_eq!(post(&s, "changes", change("Template:Infobox", &soon, Some("x"))).await.status(), 204);
    assert_eq!(post(&s, "changes", change("Template:Cite", &soon, None)).await.status(), 204);
    let found = pending().await;
    assert_eq!(found["needs_update"], true);
    let parents: Vec<&str> =
        found["items"].as_array().expect("json shape").iter().map(|i| i["parent"].as_str().expect("json shape")).collect();
    assert_eq!(parents, ["Template:Cite", "Template:Infobox"], "{found}");
    assert_eq!(found["items"][0]["child_selector"], json!(["mwAC"]));
    // A partial update covering mwAC settles Cite only; a full one, the rest.
    let later = revstore_keys::rfc3339(std::time::SystemTime::now() + std::time::Duration::from_secs(120));
    let partial: Value = post(&s, "updated/Main_Page", json!({"at": later, "selectors": ["mwAC"]})).await.json().await.expect("json");
    assert_eq!(partial["updated"], 1);
    let parents: Vec<String> = pending().await["items"]
        .as_array()
        .expect("json shape")
        .iter()
        .map(|i| i["parent"].as_str().expect("json shape").to_owned())
        .collect();
    assert_eq!(parents, ["Template:Infobox"]);
    let full: Value = post(&s, "updated/Main_Page", json!({"at": later})).await.json().await.expect("json");
    assert_eq!(full["updated"], 1, "only the stale edge is written");
    assert_eq!(pending().await, json!({"needs_update": false, "items": []}));
}

revstore_test_service::on_both_engines!(
    a_dependency_set_is_replaced_by_its_difference,
    bad_input_is_refused_and_writes_nothing,
    the_pull_check_finds_what_changed_after_the_last_update,
    paging_sees_every_dependent_exactly_once_while_edges_change,
    dependents_come_in_priority_then_title_order_in_any_range,
);

/// Pages through the dependents of one template (CI's scaled-down fan-out)
/// while other pages gain and lose edges to it: every edge present for the
/// whole walk is seen exactly once, none twice, in listing order (priority
/// descending, then title), with priorities spread over 0-1000.
async fn paging_sees_every_dependent_exactly_once_while_edges_change(engine: Engine) {
    const DEPENDENTS: usize = 200_000;
    let template = common::title("Template:Citation needed");
    let edge = |i: usize| Edge {
        parent: template.as_str().to_owned(),
        kind: ChangeKind::Modification,
        priority: (i * 7919 % 1001) as i64,
        parent_selector: None,
        child_selector: Some(vec![format!("mw{i}")]),
    };
    let (s, _guard) = common::preloaded(engine, |graph| async move {
        let edges: Vec<_> = (0..DEPENDENTS).map(|i| (common::title(&format!("Page {i}")), edge(i))).collect();
        for chunk in edges.chunks(5_000) {
            graph.add_edges(&common::domain(), chunk, revstore_keys::TitleRules::default()).await.expect("load");
        }
    })
    .await;
    let mut seen = vec![0u8; DEPENDENTS];
    let mut churned = HashSet::new();
    let mut cursor: Option<String> = None;
    let mut last: Option<(i64, String)> = None;
    let mut pages = 0;
    loop {
        let mut request = client().get(s.url(&format!("/{DOMAIN}/v1/dependents/{}", template.as_str()))).query(&[("limit", "5000")]);
        if let Some(c) = &cursor {
            request = request.query(&[("cursor", c)]);
        }
        let answer = request.send().await.expect("send");
        assert_eq!(answer.status(), 200);
        let page: Value = answer.json().await.expect("json");
        for item in page["items"].as_array().expect("json shape") {
            let priority = item["priority"].as_i64().expect("json shape");
            let child = item["child"].as_str().expect("json shape");
            if let Some((p, c)) = &last {
                assert!(priority < *p || (priority == *p && child > c.as_str()), "({priority}, {child}) listed after ({p}, {c})");
            }
            last = Some((priority, child.to_owned()));
            if let Some(i) = child.strip_prefix("Page_").and_then(|n| n.parse::<usize>().ok()) {
                seen[i] += 1;
            }
        }
        // Meanwhile other pages gain an edge to the template, and lose it.
        let churn = format!("Churn_{pages}");
        assert_eq!(
            put_deps(&s, &churn, json!([{"parent": template.as_str(), "type": "modification", "priority": 300}])).await.status(),
            200
        );
        if pages % 2 == 1 {
            assert_eq!(put_deps(&s, &format!("Churn_{}", pages - 1), json!([])).await.status(), 200);
        }
        churned.insert(churn);
        pages += 1;
        cursor = page["next"].as_str().map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    let twice: Vec<usize> = (0..DEPENDENTS).filter(|i| seen[*i] > 1).collect();
    let never: Vec<usize> = (0..DEPENDENTS).filter(|i| seen[*i] == 0).collect();
    assert!(
        twice.is_empty() && never.is_empty(),
        "seen twice: {:?}, never: {:?}",
        &twice[..twice.len().min(5)],
        &never[..never.len().min(5)]
    );
    assert!(pages >= DEPENDENTS / 5000, "{pages} pages");
}

/// Small pages of a priority range list exactly the dependents in it, in
/// listing order, each once: the merge of the buckets and its cursor.
async fn dependents_come_in_priority_then_title_order_in_any_range(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let priority = |i: usize| (i * 37 % 1001) as i64;
    let mut expected = Vec::new();
    for i in 0..600 {
        let page = format!("Reader_{i:03}");
        let edges = json!([{"parent": "Template:Spread", "type": "modification", "priority": priority(i)}]);
        assert_eq!(put_deps(&s, &page, edges).await.status(), 200);
        if (200..=700).contains(&priority(i)) {
            expected.push((priority(i), page));
        }
    }
    expected.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let (mut listed, mut cursor, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let mut request = client().get(s.url(&format!("/{DOMAIN}/v1/dependents/Template:Spread"))).query(&[
            ("limit", "7"),
            ("min_priority", "200"),
            ("max_priority", "700"),
        ]);
        if let Some(c) = &cursor {
            request = request.query(&[("cursor", c)]);
        }
        let answer = request.send().await.expect("send");
        assert_eq!(answer.status(), 200);
        let page: Value = answer.json().await.expect("json");
        for item in page["items"].as_array().expect("items") {
            listed.push((item["priority"].as_i64().expect("priority"), item["child"].as_str().expect("child").to_owned()));
        }
        pages += 1;
        cursor = page["next"].as_str().map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(listed, expected, "{pages} pages");
    assert!(pages >= expected.len() / 7, "{pages} pages");
}

/// Every status an operation answers is documented, and the router and the
/// document agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_matches_the_service() {
    let s = start_on(Engine::Embedded, |s| s.common.body_limit_bytes = 2000).await;
    let missing = revstore_test_service::undocumented_answers(&s, TOKEN, 2000).await;
    assert!(missing.is_empty(), "answers the OpenAPI document does not list:\n{}", missing.join("\n"));
    revstore_test_service::assert_router_matches_openapi(&s, TOKEN).await;
    // So every route is in the document: each write and admin route answers
    // 401 without a token and 403 with a wrong one.
    revstore_test_service::assert_every_write_and_admin_route_is_guarded(&s, 9).await;
    let doc: Value = client().get(s.url("/openapi.json")).send().await.expect("send").json().await.expect("json");
    assert_eq!(revstore_client::undocumented_routes(&doc, &revstore_client::GraphClient::ROUTES), Vec::<String>::new());
}

/// The janitor's check finds an edge one direction has lost, in either
/// direction, stepping through the tables by token range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_divergence_between_the_two_directions_is_found() {
    use revstore_dependency_graph::testing::{dependency_delete, dependent_delete};
    let (s, _guard) = common::preloaded(Engine::Embedded, |graph| async move {
        let edge = |parent: &str| Edge {
            parent: parent.into(),
            kind: ChangeKind::Modification,
            priority: 7,
            parent_selector: None,
            child_selector: None,
        };
        let edges: Vec<_> = (0..300).map(|i| (common::title(&format!("Page {i}")), edge(&format!("Template:T{}", i % 5)))).collect();
        graph.add_edges(&common::domain(), &edges, revstore_keys::TitleRules::default()).await.expect("load");
        // Page_17's edge loses its by-parent row; Page_42's its by-child row.
        let lost_dependent = dependent_delete(DOMAIN, "Template:T2", "modification", 7, "Page_17");
        let lost_dependency = dependency_delete(DOMAIN, "Page_42", 7, "modification", "Template:T2");
        graph.store().apply(vec![lost_dependent.into(), lost_dependency.into()]).await.expect("diverge");
    })
    .await;
    for (direction, expected_child) in [("dependencies", "Page_17"), ("dependents", "Page_42")] {
        let mut after: Option<String> = None;
        let (mut missing, mut edges, mut steps) = (Vec::new(), 0, 0);
        loop {
            let mut request =
                client().get(s.url("/admin/graph/consistency")).bearer_auth(TOKEN).query(&[("direction", direction), ("limit", "50")]);
            if let Some(a) = &after {
                request = request.query(&[("after", a)]);
            }
            let step: Value = request.send().await.expect("send").json().await.expect("json");
            edges += step["edges"].as_u64().expect("edges");
            missing
                .extend(step["missing"].as_array().expect("missing").iter().map(|m| m["child"].as_str().expect("json shape").to_owned()));
            steps += 1;
            match step["next"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => break,
            }
        }
        assert_eq!(missing, [expected_child], "{direction}");
        assert_eq!(edges, 299, "{direction}: every other edge was checked");
        assert!(steps > 1, "{direction}: {steps} steps");
    }
}
