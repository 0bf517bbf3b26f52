//! The whole system end to end, as deployed: the service binaries as
//! processes on free ports, over HTTP, on each engine. One system per engine
//! runs every scenario in turn (on Cassandra, creating three keyspaces'
//! schema is most of the cost), the janitor last, against what the others
//! left.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use revstore_integration_tests::{Engine, Options, OtlpReceiver, System, eventually};
use revstore_keys::TidGenerator;
use serde_json::{Value, json};

const DOMAIN: &str = "en.wikipedia.org";
/// current-store's grace period in these tests.
const GRACE_SECS: u64 = 6;
/// How long a delivery may take: the outbox backs off up to a minute after
/// failed rounds.
const DELIVERY: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_system_on_the_embedded_engine() {
    the_whole_system(Engine::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Cassandra: run scripts/test, or set REVSTORE_TEST_CASSANDRA and pass --ignored"]
async fn the_whole_system_on_cassandra() {
    the_whole_system(Engine::Cassandra).await;
}

async fn the_whole_system(engine: Engine) {
    let otlp = OtlpReceiver::start().await;
    let options = Options { grace_ttl_secs: GRACE_SECS, otlp_endpoint: Some(otlp.endpoint.clone()), ..Options::default() };
    let mut system = System::start(engine, options).await;
    history_written_out_of_order_by_concurrent_clients_reads_back_by_precedence(&system).await;
    a_template_change_lists_its_dependents_and_a_pulled_page_is_marked_updated(&system).await;
    superseded_within_grace_then_gone_then_from_old_store_and_old_store_outage_loses_nothing(&mut system).await;
    a_deleted_page_is_served_by_no_route_and_a_lifted_suppression_is_served_again(&system).await;
    one_trace_follows_a_render_into_old_store_and_the_graph(&system, &otlp).await;
    the_janitor_finds_the_result_at_the_ideal(&system);
}

fn render(html: &str) -> String {
    json!({"html": html, "data-parsoid": {"ids": {}}, "section-offsets": {}}).to_string()
}

async fn get(system: &System, url: &str) -> (u16, String) {
    let response = system.http.get(url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    (response.status().as_u16(), response.text().await.expect("body"))
}

async fn get_json(system: &System, url: &str) -> Value {
    let (status, body) = get(system, url).await;
    assert_eq!(status, 200, "GET {url}: {body}");
    serde_json::from_str(&body).expect("JSON")
}

/// Writes one render: with an explicit tid (`PUT`), or stamped now (`POST`).
async fn write(system: &System, title: &str, rev: u64, tid: Option<&str>, html: &str, traceparent: Option<&str>) -> String {
    let base = system.current.url(&format!("/{DOMAIN}/v1/page/{title}/{rev}"));
    let request = match tid {
        Some(tid) => system.http.put(format!("{base}/{tid}")),
        None => system.http.post(base),
    };
    let mut request = request.bearer_auth(&system.token).header("content-type", "application/json").body(render(html));
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    let response = request.send().await.expect("write");
    let status = response.status();
    let location = response.headers().get("location").and_then(|l| l.to_str().ok()).unwrap_or_default().to_owned();
    let body = response.text().await.unwrap_or_default();
    assert!(status.is_success(), "write of {title}/{rev}: {status} {body}");
    location
}

/// All the revision numbers old-store lists for a title.
async fn archived_revisions(system: &System, title: &str) -> Vec<u64> {
    let mut revisions = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = system.old.url(&format!("/{DOMAIN}/v1/archive/revisions/{title}?limit=100"));
        if let Some(cursor) = &cursor {
            url.push_str(&format!("&cursor={cursor}"));
        }
        let (status, body) = get(system, &url).await;
        if status == 404 {
            return revisions;
        }
        assert_eq!(status, 200, "{url}: {body}");
        let page: Value = serde_json::from_str(&body).expect("JSON");
        revisions.extend(page["items"].as_array().expect("items").iter().filter_map(|i| i["rev"].as_u64()));
        match page["next"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return revisions,
        }
    }
}

/// Two renders of each of 24 revisions of Anarchism (real Parsoid HTML),
/// written by eight concurrent clients in a shuffled order: current-store
/// serves the newest render of the newest revision, and old-store receives
/// a render of every revision.
async fn history_written_out_of_order_by_concurrent_clients_reads_back_by_precedence(system: &System) {
    const REVISIONS: u64 = 24;
    let html = revstore_testdata::anarchism_html();
    let generator = TidGenerator::new();
    let day_ago = SystemTime::now() - Duration::from_secs(86_400);
    let mut renders = Vec::new();
    for rev in 1..=REVISIONS {
        for k in 0..2u64 {
            let tid = generator.next_at(day_ago + Duration::from_secs(rev * 60 + k * 10)).to_string();
            let body = format!("{}<!-- render {k} of revision {rev} -->", html[rev as usize]);
            renders.push((rev, tid, body));
        }
    }
    // A fixed shuffle (a permutation by a multiplier prime to the length), so a failure repeats.
    let count = renders.len();
    let order: Vec<usize> = (0..count).map(|i| (i * 29 + 7) % count).collect();
    assert_eq!(order.iter().collect::<BTreeSet<_>>().len(), count, "a permutation");
    futures_util::stream::iter(order)
        .map(|i| {
            let (rev, tid, body) = &renders[i];
            write(system, "Anarchism", *rev, Some(tid), body, None)
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;

    let newest = &renders[count - 1];
    let (status, latest) = get(system, &system.current.url(&format!("/{DOMAIN}/v1/page/html/Anarchism"))).await;
    assert_eq!((status, latest.len()), (200, newest.2.len()), "precedence: the latest is revision {REVISIONS}'s second render");
    assert_eq!(latest, newest.2, "precedence: the latest is revision {REVISIONS}'s second render");
    // Each revision's newest render, by revision (all within the grace period: written just now).
    for rev in [1, REVISIONS / 2, REVISIONS - 1] {
        let (status, body) = get(system, &system.current.url(&format!("/{DOMAIN}/v1/page/html/Anarchism/{rev}"))).await;
        let expected = &renders[(rev as usize - 1) * 2 + 1].2;
        assert!(status == 200 && body == *expected, "revision {rev}: {status}, {} bytes", body.len());
    }
    // Every revision reaches old-store, with one of its own renders.
    eventually("every revision of Anarchism in old-store", DELIVERY, || async {
        archived_revisions(system, "Anarchism").await == (1..=REVISIONS).collect::<Vec<_>>()
    })
    .await;
    for rev in [1, REVISIONS] {
        let (status, body) = get(system, &system.old.url(&format!("/{DOMAIN}/v1/archive/html/Anarchism/{rev}"))).await;
        let own = [&renders[(rev as usize - 1) * 2].2, &renders[(rev as usize - 1) * 2 + 1].2];
        assert!(status == 200 && own.contains(&&body), "old-store's revision {rev}: {status}");
    }
}

/// Pages depend on a template, some pushed, some pulled; the template is
/// written through current-store (graph notices on): its dependents are
/// listed by push/pull, a pulled page turns pending and, once marked updated,
/// is up to date while the other pulled page still waits.
async fn a_template_change_lists_its_dependents_and_a_pulled_page_is_marked_updated(system: &System) {
    let template = "Template:Infobox_integration";
    let pages = [("Pushed_1", 900), ("Pushed_2", 800), ("Pulled_1", 100), ("Pulled_2", 50)];
    for (page, priority) in pages {
        let edges = json!({"edges": [{"parent": template, "type": "modification", "priority": priority}]});
        let response = system
            .http
            .put(system.graph.url(&format!("/{DOMAIN}/v1/deps/{page}")))
            .bearer_auth(&system.token)
            .json(&edges)
            .send()
            .await
            .expect("deps");
        assert!(response.status().is_success(), "deps of {page}: {}", response.status());
    }
    write(system, template, 1, None, "<table class=\"infobox\"></table>", None).await;

    let listed = |push: bool| {
        let url = system.graph.url(&format!("/{DOMAIN}/v1/dependents/{template}?push={push}"));
        async move {
            let page = get_json(system, &url).await;
            page["items"].as_array().expect("items").iter().map(|d| d["child"].as_str().expect("child").to_owned()).collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(true).await, ["Pushed_1", "Pushed_2"], "push dependents, priority descending");
    assert_eq!(listed(false).await.into_iter().collect::<BTreeSet<_>>(), BTreeSet::from(["Pulled_1".to_owned(), "Pulled_2".to_owned()]));

    let pending = |page: &'static str| {
        let url = system.graph.url(&format!("/{DOMAIN}/v1/pending/{page}"));
        async move { get_json(system, &url).await }
    };
    eventually("the template's change notice reaches the graph", DELIVERY, || async { pending("Pulled_1").await["needs_update"] == true })
        .await;
    let changed_at = pending("Pulled_1").await["items"][0]["changed_at"].as_str().expect("changed_at").to_owned();
    let updated = system
        .http
        .post(system.graph.url(&format!("/{DOMAIN}/v1/updated/Pulled_1")))
        .bearer_auth(&system.token)
        .json(&json!({"at": changed_at}))
        .send()
        .await
        .expect("updated");
    assert_eq!(updated.status(), 200);
    assert_eq!(updated.json::<Value>().await.expect("JSON")["updated"], 1);
    assert_eq!(pending("Pulled_1").await["needs_update"], false, "a page re-rendered after the change is up to date");
    assert_eq!(pending("Pulled_2").await["needs_update"], true, "the other pulled page still waits");
}

/// A revision superseded by the next stays readable by its tid for the grace
/// period; after it, the janitor's retention run removes it from current-store
/// (old-store stopped: not found) and, old-store back, it is served from there. Meanwhile, revisions
/// written while old-store was down all reach it once it is back.
async fn superseded_within_grace_then_gone_then_from_old_store_and_old_store_outage_loses_nothing(system: &mut System) {
    let location = write(system, "Grace_page", 1, None, "<p>first</p>", None).await;
    let tid = location.rsplit('/').next().expect("the tid in Location").to_owned();
    write(system, "Grace_page", 2, None, "<p>second</p>", None).await;
    let by_tid = system.current.url(&format!("/{DOMAIN}/v1/page/html/Grace_page/1/{tid}"));
    assert_eq!(get(system, &by_tid).await, (200, "<p>first</p>".to_owned()), "within the grace period");
    eventually("revision 1 of Grace_page in old-store", DELIVERY, || async {
        get(system, &system.old.url(&format!("/{DOMAIN}/v1/archive/html/Grace_page/1"))).await.0 == 200
    })
    .await;
    tokio::time::sleep(Duration::from_secs(GRACE_SECS + 2)).await;
    write(system, "Grace_page", 3, None, "<p>third</p>", None).await;
    assert_eq!(get(system, &by_tid).await.0, 200, "a write deletes nothing");
    // The janitor's retention run removes what has been superseded for longer than the grace period.
    let retention = tokio::task::block_in_place(|| system.janitor(&["--scope", "all", "retention"]));
    assert!(retention.status.success(), "janitor: {:?}\n{}", retention.status, String::from_utf8_lossy(&retention.stderr));

    system.old.stop().await;
    let (status, _) = get(system, &by_tid).await;
    assert_ne!(status, 200, "the superseded render is still in current-store after the grace period and the retention run");
    let latest = system.current.url(&format!("/{DOMAIN}/v1/page/html/Grace_page"));
    assert_eq!(get(system, &latest).await, (200, "<p>third</p>".to_owned()), "the latest needs no old-store");

    // Old-store down: writes still succeed, their hand-offs wait in the outbox.
    for rev in 1..=10 {
        write(system, "Outage_page", rev, None, &format!("<p>revision {rev}</p>"), None).await;
    }
    system.old.start().await;
    eventually("every revision written during the outage in old-store", DELIVERY, || async {
        archived_revisions(system, "Outage_page").await == (1..=10).collect::<Vec<_>>()
    })
    .await;
    for rev in [1, 10] {
        let url = system.old.url(&format!("/{DOMAIN}/v1/archive/html/Outage_page/{rev}"));
        assert_eq!(get(system, &url).await, (200, format!("<p>revision {rev}</p>")));
    }
    assert_eq!(get(system, &by_tid).await, (200, "<p>first</p>".to_owned()), "served from old-store after the grace period");
}

/// A page deleted after its revisions reached old-store: no route serves
/// them again — current-store's latest, by tid, the fallback to old-store,
/// old-store's own reads once the deletion is delivered — and the render job
/// retried after the delete is refused. A newer revision re-creates the page;
/// a suppression of it lifted is served again by both stores.
async fn a_deleted_page_is_served_by_no_route_and_a_lifted_suppression_is_served_again(system: &System) {
    let location = write(system, "Deleted_page", 1, None, "<p>one</p>", None).await;
    let tid = location.rsplit('/').next().expect("the tid in Location").to_owned();
    write(system, "Deleted_page", 2, None, "<p>two</p>", None).await;
    let archived = |rev: u64| system.old.url(&format!("/{DOMAIN}/v1/archive/html/Deleted_page/{rev}"));
    eventually("both revisions of Deleted_page in old-store", DELIVERY, || async {
        get(system, &archived(1)).await.0 == 200 && get(system, &archived(2)).await.0 == 200
    })
    .await;
    let page = system.current.url(&format!("/{DOMAIN}/v1/page/Deleted_page"));
    let deleted = system.http.delete(&page).bearer_auth(&system.token).send().await.expect("delete");
    assert_eq!(deleted.status(), 204);
    let current = |path: &str| system.current.url(&format!("/{DOMAIN}/v1/page/{path}"));
    assert_eq!(get(system, &current("html/Deleted_page")).await.0, 404, "the deleted page's latest");
    assert_eq!(get(system, &current(&format!("html/Deleted_page/1/{tid}"))).await.0, 404, "by tid, or through old-store");
    assert_eq!(get(system, &current("html/Deleted_page/1")).await.0, 404, "through the fallback to old-store");
    eventually("the deletion delivered to old-store", DELIVERY, || async {
        get(system, &archived(1)).await.0 == 404 && get(system, &archived(2)).await.0 == 404
    })
    .await;
    let retried = system
        .http
        .put(current(&format!("Deleted_page/1/{tid}")))
        .bearer_auth(&system.token)
        .header("content-type", "application/json")
        .body(render("<p>one</p>"))
        .send()
        .await
        .expect("retry");
    assert_eq!(retried.status(), 409, "the render job retried after the delete");
    assert_eq!(get(system, &current("html/Deleted_page")).await.0, 404, "the retried render brought the page back");

    write(system, "Deleted_page", 3, None, "<p>three</p>", None).await;
    assert_eq!(get(system, &current("html/Deleted_page")).await, (200, "<p>three</p>".to_owned()), "re-created");
    eventually("the re-created revision in old-store", DELIVERY, || async { get(system, &archived(3)).await.0 == 200 }).await;
    let suppression = current("Deleted_page/3/suppress");
    assert_eq!(system.http.post(&suppression).bearer_auth(&system.token).send().await.expect("suppress").status(), 204);
    assert_eq!(get(system, &current("html/Deleted_page")).await.0, 404, "a suppressed revision served");
    eventually("the suppression delivered to old-store", DELIVERY, || async { get(system, &archived(3)).await.0 == 404 }).await;
    assert_eq!(system.http.delete(&suppression).bearer_auth(&system.token).send().await.expect("lift").status(), 204);
    eventually("the lift delivered to old-store", DELIVERY, || async { get(system, &archived(3)).await.0 == 200 }).await;
    assert_eq!(get(system, &current("html/Deleted_page/3")).await, (200, "<p>three</p>".to_owned()), "lifted, through old-store");
}

/// A render written with a trace context: current-store's request, the
/// outbox's delivery to old-store and the change notice to the graph are
/// spans of that one trace, exported by each service.
async fn one_trace_follows_a_render_into_old_store_and_the_graph(system: &System, otlp: &OtlpReceiver) {
    let trace_id = "5d3b2e6f9a0c41d7b8e2f4a6c8d0e1f2";
    write(system, "Traced_page", 1, None, "<p>traced</p>", Some(&format!("00-{trace_id}-a1b2c3d4e5f60718-01"))).await;
    let services = || -> BTreeSet<String> { otlp.spans().into_iter().filter(|s| s.trace_id == trace_id).map(|s| s.service).collect() };
    let all: BTreeSet<String> = ["current-store", "old-store", "dependency-graph"].map(String::from).into();
    eventually("spans of the trace from all three services", Duration::from_secs(60), || async { services() == all }).await;
}

/// The janitor, run as the CronJob runs it, completes every task, and its
/// audit finds no more held than the system is entitled to.
fn the_janitor_finds_the_result_at_the_ideal(system: &System) {
    let output = system.janitor(&[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "janitor: {:?}\n{stdout}\n{}", output.status, String::from_utf8_lossy(&output.stderr));
    let summary: Value = serde_json::from_str(stdout.lines().last().expect("the summary line")).expect("JSON summary");
    assert_eq!(summary["status"], "completed", "{summary}");
    for (task, result) in summary["tasks"].as_object().expect("tasks") {
        assert_eq!(result["status"], "completed", "task {task}: {result}");
    }
    let ratio = summary["tasks"]["audit"]["overstore_ratio"].as_f64().expect("the audit's ratio");
    assert!((1.0..=1.05).contains(&ratio), "held over ideal: {ratio}\n{summary}");
}
