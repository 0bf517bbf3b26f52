//! `revstore dump --current` as a user runs it: the real binary against a
//! current-store on a free port, whole, and killed (SIGKILL) then resumed.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use revstore_current_store::CurrentStore;
use revstore_test_service::Engine;
use sha2::Digest;

const TOKEN: &str = "revstore-dump-test-token";
const EN: &str = "en.wikipedia.org";
const PAGES: usize = 150;

const READ_TOKEN: &str = "revstore-dump-read-token-0123";

/// current-store with reads behind a read token, and pages on two domains.
async fn service_with_pages(engine: Engine, rate: &str) -> revstore_test_service::Service {
    let s = revstore_test_service::start_on(
        engine,
        revstore_test_service::TestSettings::<CurrentStore>::new(TOKEN).with(|s| {
            s.own.dump_pages_per_second = rate.parse().expect("a rate");
            s.common.read_tokens = vec![revstore_service::Secret::new(READ_TOKEN)];
        }),
    )
    .await;
    let http = reqwest::Client::new();
    let put = async |domain: &str, title: String| {
        let url = s.url(&format!("/{domain}/v1/page/{title}/1/{}", revstore_keys::Tid::now()));
        let body = serde_json::json!({ "html": format!("<p>{title}</p>"), "data-parsoid": {}, "section-offsets": {} });
        assert_eq!(http.put(url).bearer_auth(TOKEN).json(&body).send().await.expect("send").status(), 201);
    };
    for i in 0..PAGES {
        put(EN, format!("Page_{i}")).await;
    }
    for i in 0..5 {
        put("de.wikipedia.org", format!("Seite_{i}")).await;
    }
    s
}

/// `revstore dump` against the service, its read token in `token_file`.
fn dump_command(s: &revstore_test_service::Service, out: &Path, token_file: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_revstore"));
    command
        .args(["dump", "--current", "--domain", EN, "--out", out.to_str().expect("utf-8"), "--date", "20261204"])
        .args(["--current-store-url", &s.url(""), "--read-token-file", token_file.to_str().expect("utf-8")])
        .args(extra)
        .stdin(Stdio::null());
    command
}

/// The titles of every shard, in the order written, and the manifest.
fn read_dump(out: &Path, slices: u32) -> (Vec<String>, serde_json::Value) {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join(format!("{EN}-20261204-current-manifest.json"))).expect("manifest")).expect("json");
    let mut titles = Vec::new();
    for k in 0..slices {
        let name = format!("{EN}-20261204-current-{k}-of-{slices}.ndjson.zst");
        let compressed = std::fs::read(out.join(&name)).expect("shard");
        let shard = &manifest["shards"][k as usize];
        assert_eq!(shard["file"], name.as_str());
        assert_eq!(shard["bytes"].as_u64(), Some(compressed.len() as u64));
        let sha: String = sha2::Sha256::digest(&compressed).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(shard["sha256"], sha.as_str());
        let text = zstd::decode_all(compressed.as_slice()).expect("zstd frames");
        assert_eq!(shard["raw_bytes"].as_u64(), Some(text.len() as u64));
        let lines: Vec<serde_json::Value> =
            text.split(|&b| b == b'\n').filter(|l| !l.is_empty()).map(|l| serde_json::from_slice(l).expect("line")).collect();
        assert_eq!(shard["lines"].as_u64(), Some(lines.len() as u64));
        for line in lines {
            let title = line["title"].as_str().expect("title").to_owned();
            assert_eq!(line["html"], format!("<p>{title}</p>"));
            titles.push(title);
        }
    }
    (titles, manifest)
}

fn every_page_once(titles: &[String]) {
    let set: BTreeSet<&String> = titles.iter().collect();
    assert_eq!(set.len(), titles.len(), "a page was written twice");
    let expected: BTreeSet<String> = (0..PAGES).map(|i| format!("Page_{i}")).collect();
    assert_eq!(set.into_iter().cloned().collect::<BTreeSet<_>>(), expected, "every page of en, none of de");
}

fn token_file(token: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("token file");
    std::fs::write(file.path(), token).expect("write token");
    file
}

async fn a_dump_writes_every_page_once_with_a_manifest(engine: Engine) {
    let s = service_with_pages(engine, "0").await;
    let out = tempfile::tempdir().expect("tempdir");
    // Reads need a read token: with another, nothing is written and the exit is 1.
    let wrong = token_file("not-the-read-token-0123");
    let refused = dump_command(&s, out.path(), wrong.path(), &["--parallel", "3"]).output().expect("run");
    assert_eq!(refused.status.code(), Some(1), "{}", String::from_utf8_lossy(&refused.stderr));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("current-store answered 40"), "{}", String::from_utf8_lossy(&refused.stderr));
    let out = tempfile::tempdir().expect("tempdir");
    let token = token_file(READ_TOKEN);
    let run = dump_command(&s, out.path(), token.path(), &["--parallel", "3"]).output().expect("run");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let summary = String::from_utf8_lossy(&run.stdout);
    assert!(summary.contains(&format!("dumped {PAGES} pages of {EN} in 3 shards")), "{summary}");
    let (titles, manifest) = read_dump(out.path(), 3);
    every_page_once(&titles);
    assert_eq!(manifest["lines"].as_u64(), Some(PAGES as u64));

    // Shards of a dump are not overwritten by another run without --resume.
    let again = dump_command(&s, out.path(), token.path(), &["--parallel", "3"]).output().expect("run");
    assert_eq!(again.status.code(), Some(64), "{}", String::from_utf8_lossy(&again.stderr));
}

async fn a_killed_dump_resumes_without_duplicates(engine: Engine) {
    // Paced by the service, so that the kill lands mid-way.
    let s = service_with_pages(engine, "50").await;
    let out = tempfile::tempdir().expect("tempdir");
    let token = token_file(READ_TOKEN);
    let mut command = dump_command(&s, out.path(), token.path(), &["--parallel", "2", "--checkpoint-every", "5"]);
    command.stdout(Stdio::null()).stderr(Stdio::null());
    let state = out.path().join(format!("{EN}-20261204-current-0-of-2.ndjson.zst.state.json"));
    let checkpointed = async || checkpointed_lines(&state).is_some_and(|pages| pages >= 10);
    revstore_test_service::run_until_midway(command, "the dump", Duration::from_secs(120), checkpointed).await.kill_9();
    assert!(!out.path().join(format!("{EN}-20261204-current-manifest.json")).exists(), "killed before its end");

    let resumed =
        dump_command(&s, out.path(), token.path(), &["--parallel", "2", "--checkpoint-every", "5", "--resume"]).output().expect("run");
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let (titles, _) = read_dump(out.path(), 2);
    every_page_once(&titles);
}

/// The lines a shard's checkpoint says it has written.
fn checkpointed_lines(state: &Path) -> Option<u64> {
    std::fs::read(state).ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok()).and_then(|v| v["lines"].as_u64())
}

revstore_test_service::on_both_engines!(a_dump_writes_every_page_once_with_a_manifest, a_killed_dump_resumes_without_duplicates);
