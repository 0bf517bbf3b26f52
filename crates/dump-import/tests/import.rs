//! The sample wiki's full-history dump imported into a real old-store, then
//! read back revision by revision and compared with the dump.

use std::sync::atomic::Ordering;

use revstore_client::{ClientOptions, HttpClient, OldStoreClient};
use revstore_dump_import::{ImportOptions, Mode, run_import};
use revstore_test_service::Engine;

const TOKEN: &str = "dump-import-test-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_wiki_imports_completely_and_reads_back_identical() {
    let old_store = revstore_test_service::start_on::<revstore_old_store::OldStore>(Engine::Embedded, TOKEN, &[]).await;
    let http =
        HttpClient::new(&old_store.url(""), ClientOptions { token: Some(TOKEN.into()), ..ClientOptions::default() }).expect("client");
    let client = OldStoreClient::new(http);
    let dump = revstore_testdata::shared_data().join("dumps/aawiki-20260101-pages-meta-history.xml.7z");
    let options = |mode| ImportOptions { dump: dump.clone(), domain: None, writers: 4, mode, dependencies: None };

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
