//! `revstore dump --history` as a user runs it: after `revstore import` of the
//! sample wiki into an old-store on a free port, whole, and killed (SIGKILL)
//! then resumed; on both engines.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use revstore_old_store::OldStore;
use revstore_test_service::Engine;

const TOKEN: &str = "revstore-history-dump-token";
const AA: &str = "aa.wikipedia.org";

/// old-store with the sample wiki imported (revisions only), and one
/// revision of another domain.
async fn old_store_with_the_sample_wiki(engine: Engine, rate: &str) -> (revstore_test_service::Service, tempfile::NamedTempFile) {
    let s = revstore_test_service::start_on(
        engine,
        revstore_test_service::TestSettings::<OldStore>::new(TOKEN)
            .with(|s| s.own.dump_revisions_per_second = rate.parse().expect("a rate")),
    )
    .await;
    let token = tempfile::NamedTempFile::new().expect("token file");
    std::fs::write(token.path(), TOKEN).expect("write token");
    let dump = revstore_testdata::shared_data().join("dumps/aawiki-20260101-pages-meta-history.xml.7z");
    let imported = Command::new(env!("CARGO_BIN_EXE_revstore"))
        .args(["import", "--no-dependencies", "--write-tokens-file", token.path().to_str().expect("utf-8")])
        .arg(&dump)
        .env("REVSTORE_OLD_STORE_URL", s.url(""))
        .output()
        .expect("run revstore import");
    let report = String::from_utf8_lossy(&imported.stderr);
    assert!(imported.status.success() && report.contains("stored 1307,"), "{report}");
    let other = reqwest::Client::new()
        .put(s.url(&format!("/en.wikipedia.org/v1/archive/Elsewhere/1/{}", revstore_keys::Tid::now())))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({ "wikitext": "another wiki" }))
        .send()
        .await
        .expect("send");
    assert_eq!(other.status(), 201);
    (s, token)
}

fn dump_command(s: &revstore_test_service::Service, out: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_revstore"));
    command
        .args(["dump", "--history", "--domain", AA, "--parts", "wikitext", "--date", "20260101"])
        .args(["--out", out.to_str().expect("utf-8"), "--old-store-url", &s.url("")])
        .args(extra)
        .stdin(Stdio::null());
    command
}

/// Every (title, revision) of the shards, checking none is there twice.
fn revisions_once(out: &Path, slices: u32) -> BTreeSet<(String, u64)> {
    let mut seen = BTreeSet::new();
    for k in 0..slices {
        let shard = std::fs::read(out.join(format!("{AA}-20260101-history-{k}-of-{slices}.ndjson.zst"))).expect("shard");
        let text = zstd::decode_all(shard.as_slice()).expect("zstd frames");
        for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let line: serde_json::Value = serde_json::from_slice(line).expect("a whole line");
            assert!(line["wikitext"].is_string(), "{line}");
            let key = (line["title"].as_str().expect("title").to_owned(), line["rev"].as_u64().expect("rev"));
            assert!(seen.insert(key), "a revision twice: {line}");
        }
    }
    seen
}

async fn a_history_dump_after_an_import_holds_every_revision_once(engine: Engine) {
    let (s, _token) = old_store_with_the_sample_wiki(engine, "0").await;
    let out = tempfile::tempdir().expect("tempdir");
    let run = dump_command(&s, out.path(), &["--parallel", "3"]).output().expect("run");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let seen = revisions_once(out.path(), 3);
    // The import's own counts (shared/data/README.md): 1,307 revisions, 507 pages.
    assert_eq!(seen.len(), 1307);
    assert_eq!(seen.iter().map(|(t, _)| t).collect::<BTreeSet<_>>().len(), 507);
    assert!(!seen.iter().any(|(t, _)| t == "Elsewhere"), "another domain's title");
}

async fn a_killed_history_dump_resumes_without_duplicates(engine: Engine) {
    // Paced by the service, so that the kill lands mid-way (1,307 revisions at 200/s).
    let (s, _token) = old_store_with_the_sample_wiki(engine, "200").await;
    let out = tempfile::tempdir().expect("tempdir");
    let mut command = dump_command(&s, out.path(), &["--parallel", "2", "--checkpoint-every", "20"]);
    command.stdout(Stdio::null()).stderr(Stdio::null());
    let state = out.path().join(format!("{AA}-20260101-history-0-of-2.ndjson.zst.state.json"));
    let checkpointed = async || {
        let lines =
            std::fs::read(&state).ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok()).and_then(|v| v["lines"].as_u64());
        lines.is_some_and(|n| n >= 100)
    };
    revstore_test_service::run_until_midway(command, "the history dump", Duration::from_secs(120), checkpointed).await.kill_9();
    let resumed = dump_command(&s, out.path(), &["--parallel", "2", "--checkpoint-every", "20", "--resume"]).output().expect("run");
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    assert_eq!(revisions_once(out.path(), 2).len(), 1307);
}

revstore_test_service::on_both_engines!(
    a_history_dump_after_an_import_holds_every_revision_once,
    a_killed_history_dump_resumes_without_duplicates
);
