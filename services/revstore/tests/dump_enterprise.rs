//! `revstore dump --format enterprise` read by a reader of Wikimedia
//! Enterprise HTML dumps as its users run it: mwparserfromhtml 2.1.2 from
//! PyPI, unmodified (scripts/setup installs it in a venv of its own).
//!
//! The sample wiki is imported into old-store (page ids and namespaces from
//! its XML), and each page's latest revision rendered into current-store as
//! Parsoid writes a render (its page id and namespace in the head). The
//! reader must iterate every page of the current dump once and parse its
//! HTML; the history dump must hold every imported revision once, with the
//! page ids and namespaces of the XML.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use revstore_current_store::CurrentStore;
use revstore_old_store::OldStore;
use revstore_test_service::Engine;
use sha2::Digest;

const TOKEN: &str = "revstore-enterprise-dump-token";
const AA: &str = "aa.wikipedia.org";
const DATE: &str = "20260101";

/// The Python that imports mwparserfromhtml: `REVSTORE_ENTERPRISE_READER_PYTHON`,
/// or the venv scripts/setup makes.
fn reader_python() -> PathBuf {
    match std::env::var_os("REVSTORE_ENTERPRISE_READER_PYTHON") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/revstore/mwparserfromhtml/bin/python"),
    }
}

/// What the XML dump says of a page.
#[derive(Debug, Clone)]
struct Page {
    id: u64,
    namespace: i64,
    latest: (u64, std::time::SystemTime, String),
    revisions: BTreeSet<u64>,
}

fn sample_dump() -> PathBuf {
    revstore_testdata::shared_data().join("dumps/aawiki-20260101-pages-meta-history.xml.7z")
}

/// The sample wiki's pages by title (with underscores), read from its XML.
fn sample_pages() -> BTreeMap<String, Page> {
    let mut pages: BTreeMap<String, Page> = BTreeMap::new();
    revstore_dump_import::read_dump(
        &sample_dump(),
        Default::default(),
        |_, _| {},
        |_, item| {
            let r = item.expect("the sample's revisions are all readable");
            let title = r.title.replace(' ', "_");
            let page = pages.entry(title).or_insert_with(|| Page {
                id: r.page.id.expect("a page id"),
                namespace: r.page.namespace.expect("a namespace"),
                latest: (0, std::time::UNIX_EPOCH, String::new()),
                revisions: BTreeSet::new(),
            });
            page.revisions.insert(r.rev_id);
            if r.rev_id > page.latest.0
                && let Some(text) = r.text
            {
                page.latest = (r.rev_id, r.timestamp, text);
            }
            Ok(())
        },
    )
    .expect("read the sample");
    pages
}

fn escaped(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A render of the page's latest revision as Parsoid lays one out: the
/// page's id, namespace, revision and URL in the head, sections in the body.
fn parsoid_html(title: &str, page: &Page) -> String {
    let (rev, _, text) = &page.latest;
    let shown = escaped(&title.replace('_', " "));
    let url_title = escaped(title);
    format!(
        "<!DOCTYPE html>\n<html prefix=\"dc: http://purl.org/dc/terms/ mw: http://mediawiki.org/rdf/\" about=\"https://{AA}/wiki/Special:Redirect/revision/{rev}\">\
         <head prefix=\"mwr: https://{AA}/wiki/Special:Redirect/\"><meta charset=\"utf-8\"/>\
         <meta property=\"mw:pageId\" content=\"{id}\"/><meta property=\"mw:pageNamespace\" content=\"{ns}\"/>\
         <meta property=\"mw:htmlVersion\" content=\"2.8.0\"/><link rel=\"dc:isVersionOf\" href=\"//{AA}/wiki/{url_title}\"/>\
         <title>{shown}</title><base href=\"//{AA}/wiki/\"/></head>\
         <body class=\"mw-content-ltr mw-parser-output\" lang=\"aa\" dir=\"ltr\"><section data-mw-section-id=\"0\" id=\"mwAQ\">\
         <p id=\"mwAg\">{shown}</p><pre id=\"mwAw\">{body}</pre></section></body></html>",
        id = page.id,
        ns = page.namespace,
        body = escaped(text),
    )
}

fn path_segment(title: &str) -> String {
    title
        .bytes()
        .map(|b| match b.is_ascii_alphanumeric() || b"_-.:".contains(&b) {
            true => (b as char).to_string(),
            false => format!("%{b:02X}"),
        })
        .collect()
}

fn run_dump(kind: &str, out: &Path, urls: [(&str, String); 2], parallel: &str) {
    let run = Command::new(env!("CARGO_BIN_EXE_revstore"))
        .args(["dump", kind, "--format", "enterprise", "--domain", AA, "--date", DATE, "--parallel", parallel])
        .args(["--out", out.to_str().expect("utf-8")])
        .args(urls.iter().flat_map(|(flag, url)| [*flag, url.as_str()]))
        .stdin(Stdio::null())
        .output()
        .expect("run revstore dump");
    let said = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success() && said.contains("Enterprise tarball"), "{said}{}", String::from_utf8_lossy(&run.stderr));
}

/// Every article of the Enterprise tarballs in `out` whose names end with
/// `suffix`, read with the tar and gzip crates: the files hold NDJSON only.
fn articles(out: &Path, suffix: &str) -> Vec<(String, serde_json::Value)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(out).expect("out") {
        let name = entry.expect("entry").file_name().to_string_lossy().into_owned();
        if !name.ends_with(suffix) {
            continue;
        }
        let file = std::fs::File::open(out.join(&name)).expect("tarball");
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
        for member in archive.entries().expect("a tar") {
            let mut member = member.expect("a member");
            assert!(member.path().expect("path").to_string_lossy().starts_with("aawiki_"), "member of {name}");
            let mut text = String::new();
            member.read_to_string(&mut text).expect("UTF-8 NDJSON");
            found.extend(text.lines().map(|l| (name.clone(), serde_json::from_str(l).expect("one article per line"))));
        }
    }
    found
}

/// The reader's view of each tarball: `HTMLDump(path)` iterated, each
/// `Document` asked what a researcher's script asks, and its HTML parsed
/// (sections, plain text). Failures the reader swallows (it prints them
/// and goes on) are counted from its output.
const READER: &str = r#"
import glob, json, sys
from mwparserfromhtml import HTMLDump
out = []
for path in sorted(glob.glob(sys.argv[1] + "/*-ENTERPRISE-HTML.json.tar.gz")):
    for doc in HTMLDump(path):
        sections = doc.html.wikistew.get_sections()
        text = "".join(doc.html.get_plaintext())
        out.append({"file": path.rsplit("/", 1)[1], "database": HTMLDump(path).database, "title": doc.get_title(),
            "page_id": doc.get_page_id(), "namespace": doc.get_namespace(), "html_page_id": doc.html.get_page_id(),
            "html_namespace": doc.html.get_namespace(), "revision": doc.html.get_revision_id(), "url": doc.html.get_url(),
            "modified": doc.get_curr_revision_time().isoformat(), "sections": len(sections), "text": len(text)})
print("READ " + json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs mwparserfromhtml from PyPI: scripts/setup installs it, scripts/test runs this"]
async fn enterprise_reader_reads_every_page_of_the_dumps_once() {
    let python = reader_python();
    assert!(python.exists(), "{} is missing: run scripts/setup", python.display());
    let pages = sample_pages();
    assert_eq!(pages.len(), 507);

    // The sample wiki imported into old-store.
    let old = revstore_test_service::start_on(Engine::Embedded, revstore_test_service::TestSettings::<OldStore>::new(TOKEN)).await;
    let token = tempfile::NamedTempFile::new().expect("token file");
    std::fs::write(token.path(), TOKEN).expect("write token");
    let imported = Command::new(env!("CARGO_BIN_EXE_revstore"))
        .args(["import", "--no-dependencies", "--write-tokens-file", token.path().to_str().expect("utf-8")])
        .arg(sample_dump())
        .env("REVSTORE_OLD_STORE_URL", old.url(""))
        .output()
        .expect("run revstore import");
    let report = String::from_utf8_lossy(&imported.stderr);
    assert!(imported.status.success() && report.contains("stored 1307,"), "{report}");

    // Each page's latest revision rendered into current-store, at the revision's time.
    let current = revstore_test_service::start_on(Engine::Embedded, revstore_test_service::TestSettings::<CurrentStore>::new(TOKEN)).await;
    let http = reqwest::Client::new();
    for (title, page) in &pages {
        let (rev, at, _) = &page.latest;
        let url = current.url(&format!("/{AA}/v1/page/{}/{rev}/{}", path_segment(title), revstore_keys::Tid::min_at(*at)));
        let body = serde_json::json!({ "html": parsoid_html(title, page), "data-parsoid": {}, "section-offsets": {} });
        let answer = http.put(url).bearer_auth(TOKEN).json(&body).send().await.expect("send");
        assert_eq!(answer.status(), 201, "{title}: {}", answer.text().await.unwrap_or_default());
    }

    let out = tempfile::tempdir().expect("tempdir");
    run_dump("--current", out.path(), [("--current-store-url", current.url("")), ("--old-store-url", old.url(""))], "3");
    run_dump("--history", out.path(), [("--current-store-url", current.url("")), ("--old-store-url", old.url(""))], "2");

    // The manifest lists each tarball with its articles, bytes and digest.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join(format!("{AA}-{DATE}-current-manifest.json"))).expect("manifest"))
            .expect("json");
    let listed = manifest["enterprise"].as_array().expect("the tarballs listed");
    assert_eq!(listed.iter().map(|t| t["articles"].as_u64().expect("articles")).sum::<u64>(), 507);
    for tarball in listed {
        let bytes = std::fs::read(out.path().join(tarball["file"].as_str().expect("file"))).expect("a listed tarball");
        assert_eq!(tarball["bytes"].as_u64(), Some(bytes.len() as u64));
        let sha: String = sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(tarball["sha256"], sha.as_str());
    }

    // The reader, unmodified, over the current dump.
    let read = Command::new(&python).arg("-c").arg(READER).arg(out.path()).output().expect("run the reader");
    let said = String::from_utf8_lossy(&read.stdout);
    assert!(read.status.success(), "{said}{}", String::from_utf8_lossy(&read.stderr));
    assert!(!said.contains("Article parsing failed"), "the reader could not parse an article: {}", &said[..said.len().min(2000)]);
    let documents: Vec<serde_json::Value> =
        serde_json::from_str(said.lines().find_map(|l| l.strip_prefix("READ ")).expect("the reader's summary")).expect("json");
    let mut seen = BTreeSet::new();
    for doc in &documents {
        let title = doc["title"].as_str().expect("title").replace(' ', "_");
        let page = &pages[&title];
        assert!(seen.insert(title.clone()), "{title} twice");
        assert_eq!(doc["database"], "aawiki");
        assert_eq!(doc["file"], format!("aawiki-NS{}-{DATE}-ENTERPRISE-HTML.json.tar.gz", page.namespace).as_str(), "{title}");
        assert_eq!((doc["page_id"].as_u64(), doc["html_page_id"].as_u64()), (Some(page.id), Some(page.id)), "{title}");
        assert_eq!((doc["namespace"].as_i64(), doc["html_namespace"].as_i64()), (Some(page.namespace), Some(page.namespace)), "{title}");
        assert_eq!(doc["revision"].as_u64(), Some(page.latest.0), "{title}");
        let modified = revstore_keys::rfc3339(page.latest.1);
        assert_eq!(doc["modified"].as_str(), Some(&modified[..19]), "{title}");
        assert!(doc["sections"].as_u64() >= Some(1) && doc["text"].as_u64() > Some(0), "{title}: the HTML parsed to nothing: {doc}");
    }
    assert_eq!(seen.len(), 507, "every page once");
    // More than the main namespace: talk pages, users, templates… each in its own tarball.
    assert!(listed.len() > 3, "{listed:?}");

    // The history dump: every imported revision once, as Enterprise articles
    // carrying the wikitext, with the XML's page id and namespace.
    let mut revisions = BTreeSet::new();
    for (file, article) in articles(out.path(), "-ENTERPRISE-HTML-HISTORY.json.tar.gz") {
        let title = article["name"].as_str().expect("name").replace(' ', "_");
        let page = &pages[&title];
        let rev = article["version"]["identifier"].as_u64().expect("version");
        assert!(page.revisions.contains(&rev) && revisions.insert(rev), "{title} {rev}");
        assert_eq!((article["identifier"].as_u64(), article["namespace"]["identifier"].as_i64()), (Some(page.id), Some(page.namespace)));
        assert!(file.starts_with(&format!("aawiki-NS{}-{DATE}-", page.namespace)), "{file}");
        assert!(article["article_body"]["wikitext"].is_string(), "{article}");
        assert_eq!(
            (article["is_part_of"]["identifier"].as_str(), article["in_language"]["identifier"].as_str()),
            (Some("aawiki"), Some("aa"))
        );
        assert_eq!(article["license"][0]["identifier"], "CC-BY-SA-4.0");
    }
    assert_eq!(revisions.len(), 1307, "every revision once");
}
