//! The sample wiki's full-history dump imported into a real old-store, then
//! read back revision by revision and compared with the dump.

use std::sync::atomic::Ordering;

use revstore_client::GraphClient;
use revstore_client::{ClientOptions, HttpClient, OldStoreClient};
use revstore_dump_import::dump::Limits;
use revstore_dump_import::{Dependencies, ImportOptions, Mode, run_import};
use revstore_test_service::Engine;

const TOKEN: &str = "dump-import-test-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_wiki_imports_completely_and_reads_back_identical() {
    let old_store =
        revstore_test_service::start_on(Engine::Embedded, revstore_test_service::TestSettings::<revstore_old_store::OldStore>::new(TOKEN))
            .await;
    let http =
        HttpClient::new(&old_store.url(""), ClientOptions { token: Some(TOKEN.into()), ..ClientOptions::default() }).expect("client");
    let client = OldStoreClient::new(http);
    let dump = revstore_testdata::shared_data().join("dumps/aawiki-20260101-pages-meta-history.xml.7z");
    let options =
        |mode| ImportOptions { dump: dump.clone(), domain: None, writers: 4, mode, dependencies: None, limits: Limits::default() };

    let first = run_import(client.clone(), options(Mode::Import), |_, _| {}).await.expect("import");
    assert_eq!((first.pages, first.revisions), (507, 1307), "{first}");
    let hidden = first.hidden.load(Ordering::Relaxed);
    assert_eq!(first.failed.load(Ordering::Relaxed), 0, "{first}");
    assert_eq!(first.stored.load(Ordering::Relaxed) + hidden, 1307, "{first}");

    // Importing again changes nothing: every revision is found already there.
    let again = run_import(client.clone(), options(Mode::Import), |_, _| {}).await.expect("import again");
    assert_eq!(again.stored.load(Ordering::Relaxed), 0, "{again}");
    assert_eq!(again.already.load(Ordering::Relaxed) + hidden, 1307, "{again}");

    let verified = run_import(client, options(Mode::Verify), |_, _| {}).await.expect("verify");
    assert_eq!(verified.identical.load(Ordering::Relaxed) + hidden, 1307, "{verified}");
    assert_eq!(verified.mismatched.load(Ordering::Relaxed), 0, "{verified}");
    assert_eq!(verified.failed.load(Ordering::Relaxed), 0, "{verified}");
}

/// The probe's hostile dump, in one file: a bad transclusion name made the
/// graph refuse a page's whole set (no edges at all); one bad timestamp
/// aborted the import after earlier pages were written; a revision too large
/// for old-store was held whole and then refused. Now the bad name is left
/// out and the rest kept, the bad revision and the huge one are skipped and
/// counted, and every page after them is imported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_dump_imports_what_it_can_and_counts_the_rest() {
    let old_store =
        revstore_test_service::start_on(Engine::Embedded, revstore_test_service::TestSettings::<revstore_old_store::OldStore>::new(TOKEN))
            .await;
    let graph = revstore_test_service::start_on(
        Engine::Embedded,
        revstore_test_service::TestSettings::<revstore_dependency_graph::DependencyGraph>::new(TOKEN),
    )
    .await;
    let client = |url: &str| HttpClient::new(url, ClientOptions { token: Some(TOKEN.into()), ..ClientOptions::default() }).expect("client");
    let revision =
        |id: u64, time: &str, text: &str| format!("<revision><id>{id}</id><timestamp>{time}</timestamp><text>{text}</text></revision>");
    let ok = "2004-08-13T06:24:53Z";
    let xml = format!(
        "<mediawiki><siteinfo><base>https://aa.wikipedia.org/wiki/Main_Page</base></siteinfo>\
         <page><title>Uses templates</title>{}</page>\
         <page><title>Bad time</title>{}{}</page>\
         <page><title>Huge</title>{}</page>\
         <page><title>After them</title>{}</page></mediawiki>",
        revision(1, ok, "{{%41}} {{Good}} {{Also good|x}}"),
        revision(2, "2004-13-99T00:00:00Z", "lost"),
        revision(3, ok, "kept"),
        revision(4, ok, &"x".repeat(200 * 1024)),
        revision(5, ok, "the end"),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let dump = dir.path().join("hostile.xml");
    std::fs::write(&dump, xml).expect("dump");
    let options = ImportOptions {
        dump,
        domain: None,
        writers: 2,
        mode: Mode::Import,
        dependencies: Some(Dependencies { graph: GraphClient::new(client(&graph.url(""))), priority: 500, max_edges: 10_000 }),
        limits: Limits { max_text_bytes: 64 * 1024 },
    };
    let summary = run_import(OldStoreClient::new(client(&old_store.url(""))), options, |_, _| {}).await.expect("import");
    assert_eq!((summary.pages, summary.revisions, summary.skipped), (4, 5, 2), "{summary}");
    assert_eq!(summary.stored.load(Ordering::Relaxed), 3, "{summary}");
    assert_eq!(summary.failed.load(Ordering::Relaxed), 0, "{summary}");
    assert_eq!(summary.names_skipped.load(Ordering::Relaxed), 1, "{summary}");
    let http = reqwest::Client::new();
    let deps: serde_json::Value =
        http.get(graph.url("/aa.wikipedia.org/v1/deps/Uses_templates")).send().await.expect("deps").json().await.expect("json");
    let parents: Vec<&str> = deps["items"].as_array().expect("items").iter().filter_map(|d| d["parent"].as_str()).collect();
    assert_eq!(parents, ["Template:Also_good", "Template:Good"], "{deps}");
    for (title, rev, status) in [("After_them", 5, 200), ("Bad_time", 3, 200), ("Bad_time", 2, 404), ("Huge", 4, 404)] {
        let read = http.get(old_store.url(&format!("/aa.wikipedia.org/v1/archive/wikitext/{title}/{rev}"))).send().await.expect("read");
        assert_eq!(read.status(), status, "{title} {rev}");
    }
}
