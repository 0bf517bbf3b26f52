//! Regressions of the defects a hostile probe found, on both
//! engines: each test failed on the code before its fix.

mod common;

use std::time::{Duration, SystemTime};

use common::{DOMAIN, Engine, TOKEN, start_on};
use revstore_api::ChangeKind;
use revstore_api::graph::Edge;
use revstore_keys::{Tid, rfc3339};
use serde_json::{Value, json};

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn put_deps(s: &common::Service, child: &str, edges: Value) -> Value {
    let r = client()
        .put(s.url(&format!("/{DOMAIN}/v1/deps/{child}")))
        .bearer_auth(TOKEN)
        .json(&json!({ "edges": edges }))
        .send()
        .await
        .expect("send");
    let status = r.status();
    let body: Value = r.json().await.expect("json");
    assert_eq!(status, 200, "PUT deps/{child}: {body}");
    body
}

async fn get(s: &common::Service, path: &str) -> (Value, usize) {
    let r = client().get(s.url(&format!("/{DOMAIN}/v1/{path}"))).send().await.expect("send");
    let status = r.status();
    let bytes = r.bytes().await.expect("body");
    let body: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(status, 200, "{path}: {body}");
    (body, bytes.len())
}

async fn post(s: &common::Service, path: &str, body: Value) -> reqwest::Response {
    client().post(s.url(&format!("/{DOMAIN}/v1/{path}"))).bearer_auth(TOKEN).json(&body).send().await.expect("send")
}

fn names(listing: &Value, field: &str) -> Vec<String> {
    listing["items"].as_array().expect("items").iter().map(|i| i[field].as_str().expect("name").to_owned()).collect()
}

/// Every page of a listing, followed by `next`: the names in `field`, and the
/// largest page's body in bytes.
async fn walk(s: &common::Service, path: &str, field: &str) -> (Vec<String>, usize, usize) {
    let (mut all, mut largest, mut pages) = (Vec::new(), 0, 0);
    let mut cursor: Option<String> = None;
    loop {
        let sep = if path.contains('?') { '&' } else { '?' };
        let url = match &cursor {
            Some(c) => format!("{path}{sep}cursor={}", urlencode(c)),
            None => path.to_owned(),
        };
        let (page, bytes) = get(s, &url).await;
        all.extend(names(&page, field));
        largest = largest.max(bytes);
        pages += 1;
        match page["next"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return (all, largest, pages),
        }
    }
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// The janitor's task run to its end through the admin API, `budget`
/// partitions a step: the reports of its steps.
async fn run_task(s: &common::Service, task: &str, budget: u32, dry_run: bool) -> Vec<Value> {
    let holder = Tid::now().to_string();
    let lease = client()
        .post(s.url("/admin/janitor/lease"))
        .bearer_auth(TOKEN)
        .json(&json!({"holder": holder, "ttl_secs": 600}))
        .send()
        .await
        .expect("lease");
    assert_eq!(lease.status(), 200);
    let mut reports = Vec::new();
    loop {
        let step = client()
            .post(s.url(&format!("/admin/janitor/{task}/step")))
            .bearer_auth(TOKEN)
            .json(&json!({"holder": holder, "budget": budget, "dry_run": dry_run}))
            .send()
            .await
            .expect("step");
        let status = step.status();
        let report: Value = step.json().await.expect("json");
        assert_eq!(status, 200, "{task} step: {report}");
        let done = report["done"].as_bool().expect("done");
        reports.push(report);
        if done {
            break;
        }
        assert!(reports.len() < 100_000, "the {task} task never ends");
    }
    let back = client().delete(s.url("/admin/janitor/lease")).bearer_auth(TOKEN).query(&[("holder", &holder)]).send().await;
    assert_eq!(back.expect("give back").status(), 204);
    reports
}

/// Both directions checked against each other: the one-sided edges found.
async fn one_sided(s: &common::Service) -> Vec<Value> {
    let mut missing = Vec::new();
    for direction in ["dependencies", "dependents"] {
        let mut after: Option<String> = None;
        loop {
            let mut request = client().get(s.url("/admin/graph/consistency")).bearer_auth(TOKEN).query(&[("direction", direction)]);
            if let Some(a) = &after {
                request = request.query(&[("after", a)]);
            }
            let step: Value = request.send().await.expect("send").json().await.expect("json");
            missing.extend(step["missing"].as_array().expect("missing").iter().cloned());
            match step["next"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => break,
            }
        }
    }
    missing
}

fn ahead(seconds: u64) -> String {
    rfc3339(SystemTime::now() + Duration::from_secs(seconds))
}

/// Item 1: an update dated up to the allowed skew ahead no longer outlives a
/// later removal, and the repair brings nothing removed back.
async fn a_removal_wins_over_an_update_dated_ahead(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let edge = |parent: &str| json!({"parent": parent, "type": "modification", "priority": 800});
    put_deps(&s, "Page", json!([edge("Template:R1"), edge("Template:R2")])).await;
    let updated: Value = post(&s, "updated/Page", json!({"at": ahead(120)})).await.json().await.expect("json");
    assert_eq!(updated["updated"], 2);
    let replaced = put_deps(&s, "Page", json!([edge("Template:R2")])).await;
    assert_eq!(replaced["removed"], 1);
    assert_eq!(names(&get(&s, "deps/Page").await.0, "parent"), ["Template:R2"], "the removed edge is gone from the page's listing");
    let deleted = client().delete(s.url(&format!("/{DOMAIN}/v1/deps/Page"))).bearer_auth(TOKEN).send().await.expect("delete");
    assert_eq!(deleted.status(), 204);
    assert_eq!(get(&s, "deps/Page").await.0["items"], json!([]), "a deleted page lists no dependencies");
    for parent in ["Template:R1", "Template:R2"] {
        assert_eq!(get(&s, &format!("dependents/{parent}")).await.0["items"], json!([]));
    }
    assert_eq!(one_sided(&s).await, Vec::<Value>::new(), "both directions agree");
    run_task(&s, "graph", 100, false).await;
    assert_eq!(get(&s, "deps/Page").await.0["items"], json!([]), "the repair brought no removed edge back");
    assert_eq!(get(&s, "dependents/Template:R1").await.0["items"], json!([]));
}

/// The largest selectors the API allows: 256 ids of 256 bytes.
fn largest_selector(seed: usize) -> Vec<String> {
    (0..revstore_api::graph::MAX_SELECTOR_IDS).map(|i| format!("{seed:04}-{i:03}-{}", "x".repeat(247))).collect()
}

/// Item 2: a listing page is bounded in bytes whatever its edges carry: each
/// listing is cut early and says `next`, and the walk still sees every item once.
async fn listings_are_bounded_in_bytes(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    const EDGES: usize = 24;
    // 24 edges of 131 KB each: 3 MB, listed with the default limit of 1,000.
    for i in 0..EDGES {
        let edge = json!({"parent": "Template:Heavy", "type": "modification", "priority": 500,
            "parent_selector": largest_selector(i), "child_selector": largest_selector(i + 1000)});
        put_deps(&s, &format!("Child_{i}"), json!([edge])).await;
    }
    let heavy_parents: Vec<Value> = (0..EDGES)
        .map(|i| {
            json!({"parent": format!("Template:P{i}"), "type": "modification", "priority": 500,
            "parent_selector": largest_selector(i), "child_selector": largest_selector(i + 1000)})
        })
        .collect();
    put_deps(&s, "Heavy_child", Value::Array(heavy_parents)).await;
    for i in 0..EDGES {
        assert_eq!(
            post(&s, "changes", json!({"page": format!("Template:P{i}"), "type": "modification", "at": ahead(60)})).await.status(),
            204
        );
    }
    let page_limit = revstore_dependency_graph::PAGE_BYTES * 3 / 2;
    for (path, field, expected) in [
        ("dependents/Template:Heavy", "child", (0..EDGES).map(|i| format!("Child_{i}")).collect::<Vec<_>>()),
        ("deps/Heavy_child", "parent", (0..EDGES).map(|i| format!("Template:P{i}")).collect()),
        ("pending/Heavy_child", "parent", (0..EDGES).map(|i| format!("Template:P{i}")).collect()),
    ] {
        let (mut seen, largest, pages) = walk(&s, path, field).await;
        assert!(largest <= page_limit, "{path}: a page of {largest} bytes");
        assert!(pages >= 3, "{path}: {pages} pages");
        seen.sort();
        let mut expected = expected;
        expected.sort();
        assert_eq!(seen, expected, "{path}: every item exactly once");
    }
}

/// Item 3: a change of the 1,500th fragment a template changed is found.
async fn the_pull_check_sees_every_fragment_change(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    put_deps(
        &s,
        "Reader",
        json!([
            {"parent": "Template:Many", "type": "modification", "priority": 10, "parent_selector": ["frag1499"]},
            {"parent": "Template:Other", "type": "modification", "priority": 20, "parent_selector": ["unchanged"]},
        ]),
    )
    .await;
    let at = ahead(60);
    for i in 0..1500 {
        let notice = json!({"page": "Template:Many", "type": "modification", "at": at, "selector": format!("frag{i:04}")});
        assert_eq!(post(&s, "changes", notice).await.status(), 204);
    }
    let notice = json!({"page": "Template:Many", "type": "modification", "at": at, "selector": "frag1499"});
    assert_eq!(post(&s, "changes", notice).await.status(), 204);
    let notice = json!({"page": "Template:Other", "type": "modification", "at": at, "selector": "something-else"});
    assert_eq!(post(&s, "changes", notice).await.status(), 204);
    let (pending, _) = get(&s, "pending/Reader").await;
    assert_eq!(pending["needs_update"], true, "{pending}");
    assert_eq!(names(&pending, "parent"), ["Template:Many"], "{pending}");
}

/// Item 3: the retention task removes old fragment rows, and an edge not
/// updated since a forgotten change is still found stale.
async fn change_retention_forgets_old_fragments_but_not_their_staleness(engine: Engine) {
    let s = start_on(engine, |s| s.own.change_retention = std::time::Duration::from_secs(86_400)).await;
    put_deps(&s, "Old_reader", json!([{"parent": "Template:Aged", "type": "modification", "priority": 10, "parent_selector": ["f1"]}]))
        .await;
    // Rendered in 2000; the fragment it uses changed in 2001, others since.
    assert_eq!(post(&s, "updated/Old_reader", json!({"at": "2000-01-01T00:00:00Z"})).await.status(), 200);
    for (fragment, at) in [("f1", "2001-01-01T00:00:00Z"), ("f2", "2002-01-01T00:00:00Z"), ("f3", "2003-01-01T00:00:00Z")] {
        let notice = json!({"page": "Template:Aged", "type": "modification", "at": at, "selector": fragment});
        assert_eq!(post(&s, "changes", notice).await.status(), 204);
    }
    let recent = json!({"page": "Template:Aged", "type": "modification", "at": ahead(0), "selector": "f9"});
    assert_eq!(post(&s, "changes", recent).await.status(), 204);
    let stale_before = get(&s, "pending/Old_reader").await.0;
    assert_eq!(names(&stale_before, "parent"), ["Template:Aged"]);
    let removed = |reports: &[Value]| reports.iter().map(|r| r["rows"].as_u64().expect("rows")).sum::<u64>();
    assert_eq!(removed(&run_task(&s, "retention", 100, true).await), 3, "a dry run counts the three old fragment rows");
    assert_eq!(removed(&run_task(&s, "retention", 100, false).await), 3);
    assert_eq!(removed(&run_task(&s, "retention", 100, false).await), 0, "nothing left to remove");
    let stale_after = get(&s, "pending/Old_reader").await.0;
    assert_eq!(names(&stale_after, "parent"), ["Template:Aged"], "still stale after its change was forgotten: {stale_after}");
}

/// Item 4: concurrent writes of one page leave one edge per (parent, type),
/// the same in both directions, with no janitor.
async fn concurrent_writes_of_one_page_never_interleave(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    for round in 0..10 {
        let child = format!("Racer_{round}");
        let writes = (1..=8).map(|p| {
            let child = child.clone();
            let s = &s;
            async move { put_deps(s, &child, json!([{"parent": "Template:Hub", "type": "modification", "priority": p * 100}])).await }
        });
        futures_util::future::join_all(writes).await;
        let deps = get(&s, &format!("deps/{child}")).await.0;
        assert_eq!(names(&deps, "parent"), ["Template:Hub"], "round {round}: {deps}");
        let priority = deps["items"][0]["priority"].clone();
        let (listed, _, _) = walk(&s, "dependents/Template:Hub", "child").await;
        assert_eq!(listed.iter().filter(|c| **c == child).count(), 1, "round {round}: listed once");
        let dependents = get(&s, "dependents/Template:Hub?limit=10000").await.0;
        let row = dependents["items"].as_array().expect("items").iter().find(|i| i["child"] == json!(child)).cloned();
        assert_eq!(row.expect("listed")["priority"], priority, "round {round}: both directions agree");
    }
    // PUTs and DELETEs of the same pages at once.
    let pages: Vec<String> = (0..20).map(|i| format!("Flicker_{i}")).collect();
    for _ in 0..3 {
        let writes = pages.iter().flat_map(|page| {
            let s = &s;
            let put = async move {
                put_deps(s, page, json!([{"parent": "Template:Hub2", "type": "modification", "priority": 300}])).await;
            };
            let delete = async move {
                let r = client().delete(s.url(&format!("/{DOMAIN}/v1/deps/{page}"))).bearer_auth(TOKEN).send().await.expect("delete");
                assert_eq!(r.status(), 204);
            };
            [Box::pin(put) as std::pin::Pin<Box<dyn Future<Output = ()> + Send>>, Box::pin(delete)]
        });
        futures_util::future::join_all(writes).await;
    }
    assert_eq!(one_sided(&s).await, Vec::<Value>::new(), "both directions agree without the janitor");
}

/// Item 5: an emptied template's listing reads at most one empty partition
/// per bucket, and the janitor's graph task prunes them.
async fn an_emptied_template_is_pruned_and_its_listing_bounded(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    // Pages that used the template and stopped, at priorities from 0 to 299:
    // a directory entry for every bucket they were in, each bucket emptied.
    let pages: Vec<String> = (0..300).map(|i| format!("Mover_{i}")).collect();
    for (p, page) in pages.iter().enumerate() {
        put_deps(&s, page, json!([{"parent": "Template:Emptied", "type": "modification", "priority": p}])).await;
    }
    for page in &pages {
        put_deps(&s, page, json!([])).await;
    }
    let buckets: std::collections::BTreeSet<i64> = pages.iter().map(|p| revstore_dependency_graph::testing::bucket(p)).collect();
    let (first, _) = get(&s, "dependents/Template:Emptied").await;
    assert_eq!(first, json!({"items": [], "next": null}), "one page reads every emptied bucket once");
    let reports = run_task(&s, "graph", 100, false).await;
    let fixed: u64 = reports.iter().map(|r| r["rows"].as_u64().expect("rows")).sum();
    assert_eq!(fixed, buckets.len() as u64, "every emptied bucket's entry pruned");
    let (after, _) = get(&s, "dependents/Template:Emptied").await;
    assert_eq!(after, json!({"items": [], "next": null}), "the listing reads nothing now");
    // A dependent added afterwards is listed.
    put_deps(&s, "Mover_7", json!([{"parent": "Template:Emptied", "type": "modification", "priority": 7}])).await;
    assert_eq!(names(&get(&s, "dependents/Template:Emptied").await.0, "child"), ["Mover_7"]);
}

/// Item 6: a graph step is bounded in rows: a step stops inside a large
/// partition (a page with a thousand dependencies) and the next resumes after
/// its last row; small partitions around it are checked a step's worth at
/// once; the janitor's task repairs every one-sided edge.
async fn graph_steps_stop_inside_large_partitions(engine: Engine) {
    const PARENTS: usize = 1_000;
    const SMALL: usize = 300;
    let (s, _guard) = common::preloaded(engine, |graph| async move {
        let edge =
            |parent: String| Edge { parent, kind: ChangeKind::Modification, priority: 100, parent_selector: None, child_selector: None };
        let mut edges: Vec<_> = (0..PARENTS).map(|i| (common::title("Wide child"), edge(format!("Template:Part {i}")))).collect();
        // Small pages of two dependencies each.
        for i in 0..SMALL {
            for parent in ["Template:Common", "Template:Also"] {
                edges.push((common::title(&format!("Small {i}")), edge(parent.to_owned())));
            }
        }
        graph.add_edges(&common::domain(), &edges, revstore_keys::TitleRules::default()).await.expect("load");
        // One-sided: the by-parent rows of every 100th parent of the wide
        // page, and of every 10th small page's first dependency, are lost.
        let lost = (0..PARENTS)
            .step_by(100)
            .map(|i| {
                revstore_dependency_graph::testing::dependent_delete(
                    DOMAIN,
                    &format!("Template:Part_{i}"),
                    "modification",
                    100,
                    "Wide_child",
                )
            })
            .chain((0..SMALL).step_by(10).map(|i| {
                revstore_dependency_graph::testing::dependent_delete(DOMAIN, "Template:Common", "modification", 100, &format!("Small_{i}"))
            }))
            .map(Into::into);
        graph.store().apply(lost.collect()).await.expect("diverge");
    })
    .await;
    let lost = PARENTS / 100 + SMALL / 10;
    // Steps of the default budget: the small partitions checked together, the wide one alone.
    assert_eq!(one_sided(&s).await.len(), lost, "every one-sided edge found, once");
    // One partition of budget: at most 100 rows a step, so the page's
    // thousand rows take ten steps, each resuming after the last.
    let (mut after, mut steps, mut missing, mut edges) = (None::<String>, 0, 0, 0);
    loop {
        let mut request =
            client().get(s.url("/admin/graph/consistency")).bearer_auth(TOKEN).query(&[("direction", "dependencies"), ("limit", "1")]);
        if let Some(a) = &after {
            request = request.query(&[("after", a)]);
        }
        let step: Value = request.send().await.expect("send").json().await.expect("json");
        let checked = step["edges"].as_u64().expect("edges");
        assert!(checked <= 100, "a step of one partition checks at most 100 rows: {checked}");
        edges += checked;
        missing += step["missing"].as_array().expect("missing").len();
        steps += 1;
        match step["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!((edges, missing), ((PARENTS + 2 * SMALL) as u64, lost), "every row checked once, every one-sided edge found");
    assert!(steps >= PARENTS / 100, "{steps} steps");
    let reports = run_task(&s, "graph", 100, false).await;
    let repaired: u64 = reports.iter().map(|r| r["rows"].as_u64().expect("rows")).sum();
    assert_eq!(repaired, lost as u64);
    assert_eq!(one_sided(&s).await, Vec::<Value>::new(), "repaired");
    assert_eq!(names(&get(&s, "dependents/Template:Part_500").await.0, "child"), ["Wide_child"]);
}

/// Item 7: a title in NFD and its NFC form are one page, in every direction.
async fn decomposed_titles_are_their_composed_page(engine: Engine) {
    let s = start_on(engine, |_| {}).await;
    let nfd_child = "Cafe\u{301}";
    let nfd_parent = "Template:Cre\u{300}me";
    put_deps(&s, &urlencode(nfd_child), json!([{"parent": nfd_parent, "type": "modification", "priority": 100}])).await;
    let (deps, _) = get(&s, &format!("deps/{}", urlencode("Caf\u{e9}"))).await;
    assert_eq!(names(&deps, "parent"), ["Template:Cr\u{e8}me"]);
    let (dependents, _) = get(&s, &format!("dependents/{}", urlencode("Template:Cr\u{e8}me"))).await;
    assert_eq!(names(&dependents, "child"), ["Caf\u{e9}"]);
    let notice = json!({"page": "Template:Cr\u{e8}me", "type": "modification", "at": ahead(60)});
    assert_eq!(post(&s, "changes", notice).await.status(), 204);
    let (pending, _) = get(&s, &format!("pending/{}", urlencode(nfd_child))).await;
    assert_eq!(pending["needs_update"], true, "{pending}");
}

revstore_test_service::on_both_engines!(
    a_removal_wins_over_an_update_dated_ahead,
    listings_are_bounded_in_bytes,
    the_pull_check_sees_every_fragment_change,
    change_retention_forgets_old_fragments_but_not_their_staleness,
    concurrent_writes_of_one_page_never_interleave,
    an_emptied_template_is_pruned_and_its_listing_bounded,
    graph_steps_stop_inside_large_partitions,
    decomposed_titles_are_their_composed_page,
);
