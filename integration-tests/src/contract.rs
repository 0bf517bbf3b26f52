//! Clients of the page contract: each sends one site's current-store the
//! operations whose worst arrivals the contract is about — new revisions,
//! re-renders, render jobs retried seconds to minutes later (the same rev,
//! tid and body), page deletions, suppressions and lifts, reads of the
//! latest render and by tid — on a few pages of its own, and records what
//! came back as a history for [`crate::history_check`].
//!
//! The clients of one [`Contract`] share its pages, so their operations
//! overlap. What they choose keeps the model exact: a revision is suppressed
//! only while no write or read of it is in flight (a write that passed its
//! check just before a suppression is stored behind it, hidden, and would be
//! served again after a lift, where the model has it removed), and no read
//! by tid looks at a revision ever suppressed (once lifted, such a read
//! falls back to old-store, which the model does not follow).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use revstore_keys::{Tid, TidGenerator};
use serde_json::json;

use crate::history_check::{Input, Outcome, PageOperation, Version};

/// What the clients sent to one page, for choosing what to send next.
#[derive(Debug, Default)]
struct PageState {
    /// The page's newest revision sent (0: none yet).
    newest_rev: u64,
    /// Every render sent: (rev, tid, html), and when (since the start).
    sent: Vec<(u64, Tid, String, Duration)>,
    suppressed: BTreeSet<u64>,
    ever_suppressed: BTreeSet<u64>,
    /// Writes and reads by tid in flight, by revision.
    in_flight: BTreeMap<u64, usize>,
}

/// A few pages, the clients that share them, and what they saw.
#[derive(Debug)]
pub struct Contract {
    domain: String,
    titles: Vec<String>,
    pages: Vec<Mutex<PageState>>,
    history: Mutex<Vec<PageOperation>>,
    started: Instant,
    tids: TidGenerator,
}

/// A small generator of choices, seeded per client (the runs differ, each reproducible from its seed).
#[derive(Debug)]
struct Choices(u64);

impl Choices {
    fn below(&mut self, n: u64) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// One site's current-store as a client reaches it.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub http: reqwest::Client,
    /// current-store's base URL.
    pub current: String,
    pub token: String,
}

impl Contract {
    /// Pages `{prefix}_0` … of `domain`.
    pub fn new(domain: &str, prefix: &str, pages: usize) -> Contract {
        Contract {
            domain: domain.to_owned(),
            titles: (0..pages).map(|k| format!("{prefix}_{k}")).collect(),
            pages: (0..pages).map(|_| Mutex::default()).collect(),
            history: Mutex::default(),
            started: Instant::now(),
            tids: TidGenerator::new(),
        }
    }

    pub fn titles(&self) -> &[String] {
        &self.titles
    }

    /// What every client saw so far.
    pub fn history(&self) -> Vec<PageOperation> {
        self.history.lock().expect("history").clone()
    }

    fn now(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    /// One client, `client` (distinct among the contract's), until `stop` says so.
    pub async fn run_client(&self, client: usize, seed: u64, to: &Endpoint, stop: impl Fn() -> bool) {
        let mut choices = Choices(seed | 1);
        while !stop() {
            let page = choices.below(self.titles.len() as u64) as usize;
            let choice = choices.below(100);
            match choice {
                0..30 => self.write(client, to, page, WriteKind::NewRevision, &mut choices).await,
                30..42 => self.write(client, to, page, WriteKind::ReRender, &mut choices).await,
                42..54 => self.write(client, to, page, WriteKind::Retry, &mut choices).await,
                54..58 => self.delete(client, to, page).await,
                58..63 => self.suppress(client, to, page, &mut choices).await,
                63..67 => self.lift(client, to, page, &mut choices).await,
                67..85 => self.read(client, to, page, None).await,
                _ => self.read_by_tid(client, to, page, &mut choices).await,
            }
            tokio::time::sleep(Duration::from_millis(20 + choices.below(180))).await;
        }
    }

    fn page_url(&self, to: &Endpoint, path: &str) -> String {
        format!("{}/{}/v1/page/{path}", to.current.trim_end_matches('/'), self.domain)
    }

    fn record(&self, client: usize, page: usize, call: u64, input: Input, outcome: Outcome) {
        let returned = (outcome != Outcome::Unknown).then(|| self.now());
        let op = PageOperation { client, page: self.titles[page].clone(), call, returned, input, outcome };
        self.history.lock().expect("history").push(op);
    }

    fn done(&self, page: usize, rev: u64) {
        let mut state = self.pages[page].lock().expect("page");
        if let Some(n) = state.in_flight.get_mut(&rev) {
            *n -= 1;
            if *n == 0 {
                state.in_flight.remove(&rev);
            }
        }
    }

    async fn write(&self, client: usize, to: &Endpoint, page: usize, kind: WriteKind, choices: &mut Choices) {
        let (rev, tid, html) = {
            let mut state = self.pages[page].lock().expect("page");
            let chosen = match kind {
                WriteKind::NewRevision => None,
                WriteKind::ReRender if state.newest_rev > 0 => {
                    let rev = state.newest_rev;
                    Some((rev, self.tids.next(), format!("<p>{} revision {rev}, a re-render</p>", self.titles[page])))
                }
                // A job re-sent as it was, at least a second after it was first sent.
                WriteKind::Retry => {
                    let now = self.started.elapsed();
                    let old: Vec<&(u64, Tid, String, Duration)> =
                        state.sent.iter().filter(|s| now - s.3 >= Duration::from_secs(1)).collect();
                    (!old.is_empty()).then(|| {
                        let (rev, tid, html, _) = old[choices.below(old.len() as u64) as usize];
                        (*rev, *tid, html.clone())
                    })
                }
                WriteKind::ReRender => None,
            };
            let (rev, tid, html) = chosen.unwrap_or_else(|| {
                state.newest_rev += 1;
                let rev = state.newest_rev;
                (rev, self.tids.next(), format!("<p>{} revision {rev}</p>", self.titles[page]))
            });
            if kind != WriteKind::Retry {
                state.sent.push((rev, tid, html.clone(), self.started.elapsed()));
            }
            *state.in_flight.entry(rev).or_default() += 1;
            (rev, tid, html)
        };
        let call = self.now();
        let body = json!({"html": html, "data-parsoid": {"ids": {}}, "section-offsets": {}}).to_string();
        let url = self.page_url(to, &format!("{}/{rev}/{tid}", self.titles[page]));
        let answer = to.http.put(&url).bearer_auth(&to.token).header("content-type", "application/json").body(body).send().await;
        let outcome = match answer.map(|a| a.status().as_u16()) {
            Ok(200 | 201) => Outcome::Stored,
            Ok(409) => Outcome::Refused,
            _ => Outcome::Unknown,
        };
        self.record(client, page, call, Input::Write(Version::new(rev, tid.unix_micros(), tid.to_string(), &html)), outcome);
        self.done(page, rev);
    }

    async fn delete(&self, client: usize, to: &Endpoint, page: usize) {
        let through = self.pages[page].lock().expect("page").newest_rev;
        if through == 0 {
            return;
        }
        let call = self.now();
        let url = self.page_url(to, &format!("{}?rev={through}", self.titles[page]));
        let answer = to.http.delete(&url).bearer_auth(&to.token).send().await;
        let outcome = if answer.is_ok_and(|a| a.status() == 204) { Outcome::Done } else { Outcome::Unknown };
        self.record(client, page, call, Input::Delete(through), outcome);
    }

    /// Suppresses a revision older than the newest, with nothing of it in flight.
    async fn suppress(&self, client: usize, to: &Endpoint, page: usize, choices: &mut Choices) {
        let rev = {
            let mut state = self.pages[page].lock().expect("page");
            let candidates: Vec<u64> =
                (1..state.newest_rev).filter(|r| !state.suppressed.contains(r) && !state.in_flight.contains_key(r)).collect();
            if candidates.is_empty() {
                return;
            }
            let rev = candidates[choices.below(candidates.len() as u64) as usize];
            // Nothing of it is sent again from now on, or read by tid.
            state.suppressed.insert(rev);
            state.ever_suppressed.insert(rev);
            state.sent.retain(|s| s.0 != rev);
            rev
        };
        let call = self.now();
        let url = self.page_url(to, &format!("{}/{rev}/suppress", self.titles[page]));
        let answer = to.http.post(&url).bearer_auth(&to.token).send().await;
        let outcome = if answer.is_ok_and(|a| a.status() == 204) { Outcome::Done } else { Outcome::Unknown };
        self.record(client, page, call, Input::Suppress(rev), outcome);
    }

    async fn lift(&self, client: usize, to: &Endpoint, page: usize, choices: &mut Choices) {
        let rev = {
            let mut state = self.pages[page].lock().expect("page");
            let suppressed: Vec<u64> = state.suppressed.iter().copied().collect();
            if suppressed.is_empty() {
                return;
            }
            let rev = suppressed[choices.below(suppressed.len() as u64) as usize];
            state.suppressed.remove(&rev);
            rev
        };
        let call = self.now();
        let url = self.page_url(to, &format!("{}/{rev}/suppress", self.titles[page]));
        let answer = to.http.delete(&url).bearer_auth(&to.token).send().await;
        let outcome = if answer.is_ok_and(|a| a.status() == 204) { Outcome::Done } else { Outcome::Unknown };
        self.record(client, page, call, Input::Lift(rev), outcome);
    }

    async fn read_by_tid(&self, client: usize, to: &Endpoint, page: usize, choices: &mut Choices) {
        let chosen = {
            let mut state = self.pages[page].lock().expect("page");
            let readable: Vec<(u64, Tid, String)> = state
                .sent
                .iter()
                .filter(|s| !state.ever_suppressed.contains(&s.0))
                .map(|(rev, tid, html, _)| (*rev, *tid, html.clone()))
                .collect();
            if readable.is_empty() {
                return;
            }
            let chosen = readable[choices.below(readable.len() as u64) as usize].clone();
            *state.in_flight.entry(chosen.0).or_default() += 1;
            chosen
        };
        let (rev, tid, html) = chosen;
        self.read(client, to, page, Some(Version::new(rev, tid.unix_micros(), tid.to_string(), &html))).await;
        self.done(page, rev);
    }

    /// Reads the latest render, or `by_tid`'s; a read that fails says nothing and is not recorded.
    async fn read(&self, client: usize, to: &Endpoint, page: usize, by_tid: Option<Version>) {
        let title = &self.titles[page];
        let path = match &by_tid {
            Some(v) => format!("html/{title}/{}/{}", v.rev, v.tid),
            None => format!("html/{title}"),
        };
        let call = self.now();
        let Ok(answer) = to.http.get(self.page_url(to, &path)).send().await else { return };
        let status = answer.status().as_u16();
        let etag = answer.headers().get("etag").and_then(|e| e.to_str().ok()).map(|e| e.trim_matches('"').to_owned());
        let Ok(html) = answer.text().await else { return };
        let found = match (status, etag) {
            (200, Some(etag)) => {
                let Some((rev, tid)) = etag.split_once('/') else { return };
                let (Ok(rev), Ok(tid)) = (rev.parse::<u64>(), tid.parse::<Tid>()) else { return };
                Some(Version::new(rev, tid.unix_micros(), tid.to_string(), &html))
            }
            (404, _) => None,
            _ => return,
        };
        let input = by_tid.map_or(Input::ReadLatest, Input::ReadTid);
        self.record(client, page, call, input, Outcome::Read(found));
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteKind {
    NewRevision,
    ReRender,
    Retry,
}
