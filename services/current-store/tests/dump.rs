//! Dumps of a domain's current renders (`GET /{domain}/v1/dump/current`), as
//! a client reads them: whole, in slices, resumed from cursors, beside writes.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{Engine, TOKEN, render, start_on};
use revstore_keys::Tid;
use serde_json::Value;

const EN: &str = "en.wikipedia.org";

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn put(s: &common::Service, domain: &str, title: &str, rev: u64) -> u16 {
    put_at(&s.url(""), domain, title, rev).await
}

async fn put_at(base: &str, domain: &str, title: &str, rev: u64) -> u16 {
    let url = format!("{base}/{domain}/v1/page/{title}/{rev}/{}", Tid::now());
    let body = render(&format!("<p>{title} at {rev}</p>"), rev);
    client().put(url).bearer_auth(TOKEN).json(&body).send().await.expect("send").status().as_u16()
}

/// A whole dump response: its page lines, then its end line.
async fn dump(s: &common::Service, domain: &str, query: &str) -> (Vec<Value>, Value) {
    revstore_test_service::read_dump(&s.url(&format!("/{domain}/v1/dump/current?{query}"))).await
}

fn titles(lines: &[Value]) -> Vec<String> {
    lines.iter().map(|l| l["title"].as_str().expect("title").to_owned()).collect()
}

fn once_each(titles: &[String]) -> BTreeSet<String> {
    let set: BTreeSet<String> = titles.iter().cloned().collect();
    assert_eq!(set.len(), titles.len(), "a page appeared twice");
    set
}

/// 60 pages on en (some with two revisions), 10 on de; then a page deleted,
/// a page whose only revision is suppressed, a page whose latest is.
async fn wiki(s: &common::Service) -> BTreeMap<String, u64> {
    let mut expected = BTreeMap::new();
    for i in 0..60 {
        let title = format!("Page_{i}");
        assert_eq!(put(s, EN, &title, 100 + i).await, 201);
        let latest = if i % 3 == 0 {
            assert_eq!(put(s, EN, &title, 200 + i).await, 201);
            200 + i
        } else {
            100 + i
        };
        expected.insert(title, latest);
    }
    for i in 0..10 {
        assert_eq!(put(s, "de.wikipedia.org", &format!("Seite_{i}"), 1).await, 201);
    }
    let send = |r: reqwest::RequestBuilder| async move { r.bearer_auth(TOKEN).send().await.expect("send").status().as_u16() };
    assert_eq!(send(client().delete(s.url(&format!("/{EN}/v1/page/Page_1")))).await, 204);
    expected.remove("Page_1");
    assert_eq!(send(client().post(s.url(&format!("/{EN}/v1/page/Page_2/102/suppress")))).await, 204);
    expected.remove("Page_2");
    assert_eq!(send(client().post(s.url(&format!("/{EN}/v1/page/Page_3/203/suppress")))).await, 204);
    expected.insert("Page_3".into(), 103);
    expected
}

async fn a_dump_holds_every_page_of_its_domain_once(engine: Engine) {
    let s = start_on(engine, |s| s.own.dump_pages_per_second = 0).await;
    let expected = wiki(&s).await;

    let (whole, end) = dump(&s, EN, "").await;
    assert_eq!(end, serde_json::json!({ "done": true }));
    let got: BTreeMap<String, u64> =
        whole.iter().map(|l| (l["title"].as_str().expect("title").to_owned(), l["rev"].as_u64().expect("rev"))).collect();
    assert_eq!(got, expected, "the latest visible render of every page, nothing of de.wikipedia.org");
    once_each(&titles(&whole));
    let line = whole.iter().find(|l| l["title"] == "Page_3").expect("Page_3");
    assert_eq!(line["html"], "<p>Page_3 at 103</p>");
    assert!(line["tid"].is_string() && line["rendered_at"].is_string() && line["cursor"].is_string(), "{line}");
    assert!(line.get("data-parsoid").is_none(), "parts on request only: {line}");

    // Three slices: together the same pages, each once.
    let mut sliced = Vec::new();
    for k in 0..3 {
        let (lines, end) = dump(&s, EN, &format!("slice={k}/3")).await;
        assert_eq!(end["done"], true);
        sliced.extend(titles(&lines));
    }
    assert_eq!(once_each(&sliced), expected.keys().cloned().collect());

    // Pages of 7, each resumed from the last cursor.
    let (mut paged, mut after) = (Vec::new(), None::<String>);
    loop {
        let query = match &after {
            Some(cursor) => format!("limit=7&after={}", urlencoding(cursor)),
            None => "limit=7".to_owned(),
        };
        let (lines, end) = dump(&s, EN, &query).await;
        assert!(lines.len() <= 7);
        paged.extend(titles(&lines));
        if end["done"] == true {
            break;
        }
        assert_eq!(end["cursor"], lines.last().expect("a full page")["cursor"]);
        after = Some(end["cursor"].as_str().expect("cursor").to_owned());
    }
    assert_eq!(paged, titles(&whole), "resumed pages continue in the same order, without gap or repeat");

    let (all_parts, _) = dump(&s, EN, "parts=all&limit=1").await;
    assert!(all_parts[0]["data-parsoid"]["ids"].is_object() && all_parts[0]["section-offsets"].is_object(), "{}", all_parts[0]);
    let (de, _) = dump(&s, "de.wikipedia.org", "parts=data-parsoid").await;
    assert_eq!(de.len(), 10);
    assert!(de.iter().all(|l| l.get("html").is_none() && l["data-parsoid"].is_object()));
}

fn urlencoding(cursor: &str) -> String {
    cursor
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// A client cut off mid-stream resumes from the last line it read; a forged
/// or foreign cursor and other bad parameters are 400s.
async fn a_cut_dump_resumes_and_bad_cursors_are_refused(engine: Engine) {
    let s = start_on(engine, |s| s.own.dump_pages_per_second = 0).await;
    let expected = wiki(&s).await;

    let mut body = client().get(s.url(&format!("/{EN}/v1/dump/current"))).send().await.expect("send");
    let (mut buffer, mut read) = (Vec::new(), Vec::<Value>::new());
    while read.len() < 10 {
        buffer.extend_from_slice(&body.chunk().await.expect("chunk").expect("more lines"));
        while let Some(at) = buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=at).collect();
            read.push(serde_json::from_slice(&line).expect("a whole line"));
        }
    }
    drop(body);
    read.truncate(10);
    let cursor = read[9]["cursor"].as_str().expect("cursor").to_owned();
    let (rest, end) = dump(&s, EN, &format!("after={}", urlencoding(&cursor))).await;
    assert_eq!(end["done"], true);
    let mut all = titles(&read);
    all.extend(titles(&rest));
    assert_eq!(once_each(&all), expected.keys().cloned().collect());

    let (half, _) = dump(&s, EN, "slice=0/2&limit=1").await;
    let other_slice = half[0]["cursor"].as_str().expect("cursor");
    let refused = [
        format!("after={}", urlencoding(other_slice)).replace("after=", "slice=1/2&after="),
        "after=AAAA".to_owned(),
        format!("after={}x", urlencoding(&cursor)),
        "slice=3/3".into(),
        "slice=1".into(),
        "slice=0/100000".into(),
        "parts=wikitext".into(),
        "limit=0".into(),
        "limit=-1".into(),
    ];
    for query in refused {
        let answer = client().get(s.url(&format!("/{EN}/v1/dump/current?{query}"))).send().await.expect("send");
        assert_eq!(answer.status(), 400, "{query}");
    }
    // A cursor of en is not one of de.
    let answer =
        client().get(s.url(&format!("/de.wikipedia.org/v1/dump/current?after={}", urlencoding(&cursor)))).send().await.expect("send");
    assert_eq!(answer.status(), 400);
}

/// Pages rewritten while a (paced) dump reads them appear once, each with one
/// whole render: its revision and its HTML belong together.
async fn writes_during_a_dump_never_tear_a_line(engine: Engine) {
    let s = start_on(engine, |s| s.own.dump_pages_per_second = 100).await;
    for i in 0..40 {
        assert_eq!(put(&s, EN, &format!("Page_{i}"), 1).await, 201);
    }
    let writer = {
        let base = s.url("");
        tokio::spawn(async move {
            for rev in 2..=4 {
                for i in 0..40 {
                    assert_eq!(put_at(&base, EN, &format!("Page_{i}"), rev).await, 201);
                }
            }
        })
    };
    let (lines, end) = dump(&s, EN, "").await;
    writer.await.expect("writer");
    assert_eq!(end["done"], true);
    assert_eq!(once_each(&titles(&lines)).len(), 40);
    for line in &lines {
        let (title, rev) = (line["title"].as_str().expect("title"), line["rev"].as_u64().expect("rev"));
        assert!((1..=4).contains(&rev), "{line}");
        assert_eq!(line["html"], format!("<p>{title} at {rev}</p>"), "one render's revision and HTML");
    }
}

revstore_test_service::on_both_engines!(
    a_dump_holds_every_page_of_its_domain_once,
    a_cut_dump_resumes_and_bad_cursors_are_refused,
    writes_during_a_dump_never_tear_a_line,
);
