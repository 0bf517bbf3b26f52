//! Dumps of a domain's archived revisions (`GET /{domain}/v1/dump/history`),
//! as a client reads them.

mod common;

use std::collections::BTreeMap;

use common::{Engine, TOKEN, start_on};
use revstore_keys::{Tid, TidGenerator};
use serde_json::{Value, json};

const EN: &str = "en.wikipedia.org";
/// Revisions per block: small, so that histories span several blocks.
const PER_BLOCK: u64 = 4;

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn archive(s: &common::Service, domain: &str, title: &str, rev: u64, tid: Tid) {
    let body = json!({ "html": format!("<p>{title} r{rev}</p>"), "wikitext": format!("{title} r{rev}") });
    let url = s.url(&format!("/{domain}/v1/archive/{title}/{rev}/{tid}"));
    let status = client().put(url).bearer_auth(TOKEN).json(&body).send().await.expect("send").status();
    assert_eq!(status, 201, "{title} {rev}");
}

/// Titles on en with 1 to 11 revisions (revision numbers rising, not
/// contiguous), one revision suppressed; a few titles on de. The expected
/// dump of en: (title, revisions in order).
async fn wiki(s: &common::Service) -> (BTreeMap<String, Vec<u64>>, u64) {
    let tids = TidGenerator::new();
    let (mut expected, mut blocks) = (BTreeMap::new(), 0);
    for i in 0..12u64 {
        let title = format!("Title_{i}");
        let revs: Vec<u64> = (0..=(i % 11)).map(|n| 1000 * i + 3 * n + 1).collect();
        for &rev in &revs {
            archive(s, EN, &title, rev, tids.next_at(std::time::SystemTime::now())).await;
        }
        blocks += (revs.len() as u64).div_ceil(PER_BLOCK);
        expected.insert(title, revs);
    }
    for i in 0..3 {
        archive(s, "de.wikipedia.org", &format!("Seite_{i}"), 1, Tid::now()).await;
    }
    let suppress = client().post(s.url(&format!("/{EN}/v1/archive/Title_5/5010/suppress"))).bearer_auth(TOKEN).send().await.expect("send");
    assert_eq!(suppress.status(), 204);
    expected.get_mut("Title_5").expect("Title_5").retain(|&r| r != 5010);
    (expected, blocks)
}

async fn dump(s: &common::Service, domain: &str, query: &str) -> (Vec<Value>, Value) {
    revstore_test_service::read_dump(&s.url(&format!("/{domain}/v1/dump/history?{query}"))).await
}

/// The lines as (title, revisions in the order sent), checking that a
/// title's renders come together.
fn histories(lines: &[Value]) -> BTreeMap<String, Vec<u64>> {
    let mut seen: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut last: Option<String> = None;
    for line in lines {
        let title = line["title"].as_str().expect("title").to_owned();
        if last.as_deref() != Some(&title) {
            assert!(!seen.contains_key(&title), "{title}'s renders are not together");
        }
        seen.entry(title.clone()).or_default().push(line["rev"].as_u64().expect("rev"));
        last = Some(title);
    }
    seen
}

/// Held by a test while it dumps: the services of this file's tests run in
/// one process and share its metrics, so a count of blocks decoded is only
/// one dump's when no other test dumps meanwhile.
static DUMPING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn blocks_decoded(s: &common::Service) -> u64 {
    let metrics = client().get(s.url("/metrics")).send().await.expect("send").text().await.expect("text");
    metrics
        .lines()
        .find(|l| l.starts_with("old_store_dump_blocks_decoded_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .map_or(0, |n| n as u64)
}

async fn a_history_dump_holds_every_revision_once_in_order(engine: Engine) {
    let per_block = PER_BLOCK.to_string();
    let s = start_on(engine, |s| {
        s.own.limits.max_revisions = per_block.parse().expect("a count");
        s.own.dump_revisions_per_second = 0;
    })
    .await;
    let (expected, blocks) = wiki(&s).await;

    let counting = DUMPING.lock().await;
    let before = blocks_decoded(&s).await;
    let (whole, end) = dump(&s, EN, "parts=html,wikitext").await;
    assert_eq!(end, json!({ "done": true }));
    assert_eq!(histories(&whole), expected, "every revision once, in order, none suppressed, nothing of de");
    assert_eq!(blocks_decoded(&s).await - before, blocks, "each block decoded once");
    drop(counting);
    let line = &whole[0];
    let (title, rev) = (line["title"].as_str().expect("title"), line["rev"].as_u64().expect("rev"));
    assert_eq!(
        (line["html"].as_str(), line["wikitext"].as_str()),
        (Some(&*format!("<p>{title} r{rev}</p>")), Some(&*format!("{title} r{rev}")))
    );
    assert!(line["tid"].is_string() && line["cursor"].is_string(), "{line}");

    let (html_only, _) = dump(&s, EN, "limit=3").await;
    assert!(html_only.iter().all(|l| l["html"].is_string() && l.get("wikitext").is_none()), "{html_only:?}");

    // Three slices together: the same histories.
    let mut sliced = Vec::new();
    for k in 0..3 {
        let (lines, end) = dump(&s, EN, &format!("slice={k}/3")).await;
        assert_eq!(end["done"], true);
        sliced.extend(lines);
    }
    assert_eq!(histories(&sliced), expected);

    // Pages of 5 renders, resumed from cursors in the middle of histories.
    let (mut paged, mut after) = (Vec::new(), None::<String>);
    loop {
        let query = after.as_ref().map_or("limit=5".to_owned(), |c| format!("limit=5&after={c}"));
        let (lines, end) = dump(&s, EN, &query).await;
        paged.extend(lines.iter().map(|l| (l["title"].clone(), l["rev"].clone())));
        if end["done"] == true {
            break;
        }
        after = Some(end["cursor"].as_str().expect("cursor").to_owned());
    }
    let whole_keys: Vec<(Value, Value)> = whole.iter().map(|l| (l["title"].clone(), l["rev"].clone())).collect();
    assert_eq!(paged, whole_keys, "resumed pages continue in the same order, without gap or repeat");

    let (de, _) = dump(&s, "de.wikipedia.org", "").await;
    assert_eq!(de.len(), 3);
}

async fn bad_dump_requests_are_refused(engine: Engine) {
    let s = start_on(engine, |s| s.own.dump_revisions_per_second = 0).await;
    wiki(&s).await;
    let (first, _) = {
        let _dumping = DUMPING.lock().await;
        dump(&s, EN, "slice=0/2&limit=1").await
    };
    let cursor = first[0]["cursor"].as_str().expect("cursor").to_owned();
    for query in [
        format!("slice=1/2&after={cursor}"),
        format!("after={cursor}x"),
        "after=AAAA".into(),
        "slice=2/2".into(),
        "slice=0/0".into(),
        "parts=bogus".into(),
        "limit=0".into(),
    ] {
        let answer = client().get(s.url(&format!("/{EN}/v1/dump/history?{query}"))).send().await.expect("send");
        assert_eq!(answer.status(), 400, "{query}");
    }
    let foreign = client().get(s.url(&format!("/de.wikipedia.org/v1/dump/history?slice=0/2&after={cursor}"))).send().await.expect("send");
    assert_eq!(foreign.status(), 400);
}

/// Revisions archived while a (paced) dump reads the same titles: every
/// revision archived before the dump began is in it once, and every line is
/// one whole render (its revision and its content belong together).
async fn archives_during_a_dump_never_tear_a_line(engine: Engine) {
    let s = start_on(engine, |s| {
        s.own.limits.max_revisions = 4;
        s.own.dump_revisions_per_second = 100;
    })
    .await;
    let tids = TidGenerator::new();
    for i in 0..8 {
        for rev in 1..=5 {
            archive(&s, EN, &format!("Busy_{i}"), rev, tids.next_at(std::time::SystemTime::now())).await;
        }
    }
    let writer = {
        let base = s.url("");
        tokio::spawn(async move {
            for rev in 6..=10 {
                for i in 0..8 {
                    let title = format!("Busy_{i}");
                    let body = json!({ "html": format!("<p>{title} r{rev}</p>"), "wikitext": format!("{title} r{rev}") });
                    let url = format!("{base}/{EN}/v1/archive/{title}/{rev}/{}", Tid::now());
                    assert_eq!(client().put(url).bearer_auth(TOKEN).json(&body).send().await.expect("send").status(), 201);
                }
            }
        })
    };
    let (lines, end) = {
        let _dumping = DUMPING.lock().await;
        dump(&s, EN, "parts=all").await
    };
    writer.await.expect("writer");
    assert_eq!(end["done"], true);
    for line in &lines {
        let (title, rev) = (line["title"].as_str().expect("title"), line["rev"].as_u64().expect("rev"));
        assert_eq!(line["html"], format!("<p>{title} r{rev}</p>"), "one render's revision and content");
        assert_eq!(line["wikitext"], format!("{title} r{rev}"));
    }
    let histories = histories(&lines);
    for (title, revs) in &histories {
        assert!(revs.windows(2).all(|w| w[0] < w[1]), "{title}: {revs:?}");
        assert_eq!(revs[..5], [1, 2, 3, 4, 5], "{title}: what was archived before the dump, once each");
    }
    assert_eq!(histories.len(), 8);
}

/// What archive writes say of a page (its MediaWiki page id and namespace)
/// goes out with each of its lines, the newest render's word standing,
/// also for a title resumed from a cursor.
async fn history_lines_name_the_page_as_its_newest_render_did(engine: Engine) {
    let s = start_on(engine, |s| s.own.dump_revisions_per_second = 0).await;
    // Tids at the times stated: a generator of its own for each, since one
    // generator never hands out a tid older than its last.
    let at =
        |minutes_ago: u64| TidGenerator::new().next_at(std::time::SystemTime::now() - std::time::Duration::from_secs(60 * minutes_ago));
    let put = async |title: &str, rev: u64, tid: Tid, page: Value| {
        let body = json!({ "wikitext": format!("{title} r{rev}"), "page": page });
        let url = s.url(&format!("/{EN}/v1/archive/{title}/{rev}/{tid}"));
        client().put(url).bearer_auth(TOKEN).json(&body).send().await.expect("send").status().as_u16()
    };
    assert_eq!(put("Wikipedia:About", 10, at(30), json!({ "id": 7, "namespace": 4 })).await, 201);
    // The page deleted and created again under its title: a new id, from a newer render.
    assert_eq!(put("Wikipedia:About", 20, at(20), json!({ "id": 9, "namespace": 4 })).await, 201);
    // A render archived late (older than the newest) does not take the page back.
    assert_eq!(put("Wikipedia:About", 5, at(40), json!({ "id": 3 })).await, 201);
    // Said again with an archived render (an import run again): 200, and kept.
    let talk = at(30);
    assert_eq!(put("Talk:Anarchism", 1, talk, json!({})).await, 201);
    assert_eq!(put("Talk:Anarchism", 1, talk, json!({ "id": 12, "namespace": 1 })).await, 200);
    let plain = client()
        .put(s.url(&format!("/{EN}/v1/archive/Unnamed/1/{}", at(10))))
        .bearer_auth(TOKEN)
        .json(&json!({ "wikitext": "no page said" }))
        .send()
        .await
        .expect("send");
    assert_eq!(plain.status(), 201);

    let named = |lines: &[Value]| -> BTreeMap<(String, u64), (Value, Value)> {
        lines
            .iter()
            .map(|l| {
                let key = (l["title"].as_str().expect("title").to_owned(), l["rev"].as_u64().expect("rev"));
                (key, (l.get("page_id").cloned().unwrap_or(Value::Null), l.get("namespace").cloned().unwrap_or(Value::Null)))
            })
            .collect()
    };
    let (whole, _) = dump(&s, EN, "parts=wikitext").await;
    let expected: BTreeMap<(String, u64), (Value, Value)> = [
        (("Talk:Anarchism".to_owned(), 1), (json!(12), json!(1))),
        (("Unnamed".to_owned(), 1), (Value::Null, Value::Null)),
        (("Wikipedia:About".to_owned(), 5), (json!(9), json!(4))),
        (("Wikipedia:About".to_owned(), 10), (json!(9), json!(4))),
        (("Wikipedia:About".to_owned(), 20), (json!(9), json!(4))),
    ]
    .into();
    assert_eq!(named(&whole), expected);
    // One line a response: every title resumed from a cursor says the same.
    let (mut paged, mut after) = (Vec::new(), None::<String>);
    loop {
        let query = after.as_ref().map_or("limit=1".to_owned(), |c| format!("limit=1&after={c}"));
        let (lines, end) = dump(&s, EN, &query).await;
        paged.extend(lines);
        if end["done"] == true {
            break;
        }
        after = Some(end["cursor"].as_str().expect("cursor").to_owned());
    }
    assert_eq!(named(&paged), expected);
}

revstore_test_service::on_both_engines!(
    history_lines_name_the_page_as_its_newest_render_did,
    a_history_dump_holds_every_revision_once_in_order,
    bad_dump_requests_are_refused,
    archives_during_a_dump_never_tear_a_line,
);
