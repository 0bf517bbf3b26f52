//! Weeks of a wiki farm's traffic in simulated time: does any table decay?
//!
//! ```text
//! cargo build --release --workspace --bins
//! cargo bench -p revstore-integration-tests --bench soak -- [--engine embedded|cassandra]
//!     [--days 21] [--day-secs 120] [--rate 40] [--seed 1] [--out DIR] [--nodetool CMD]
//! ```
//!
//! The whole system runs as in production (three service processes,
//! current-store handing off to old-store and notifying the graph, old-store
//! compacting, the janitor binary run on its schedule) on the embedded engine
//! or on the Cassandra named by `REVSTORE_TEST_CASSANDRA` (one node or the
//! three-node cluster). Time is compressed by one factor, `F = 86400 /
//! --day-secs`: a simulated day lasts `--day-secs` real seconds, and every
//! time constant is divided by `F` — the grace TTL, the clock skew allowed,
//! the graph's change retention, the janitor's schedules (a routine run
//! hourly, a full run weekly) and, on Cassandra, every table's
//! `gc_grace_seconds` (altered after the services created them). The graph's
//! change retention is cut to three simulated days (see
//! `GRAPH_CHANGE_RETENTION_DAYS`). BENCHMARKS.md lists every time constant
//! and whether it moves with the simulated day. Declared
//! TTLs that outlast the run (the outbox's four weeks) are not scaled;
//! nothing in the run waits for them. Nor are the windows of time-window
//! compaction (the outbox's 28 hours): a delivered row's data leaves the
//! disk when a compaction merges it with its partition's deletion, written
//! seconds of real time after it, and a window scaled to a minute would put
//! most of the two in different windows, which are never merged (tried: the
//! outbox held three times its live rows by day 8). So the outbox's window
//! is open all run: it is judged apart, by what it keeps once the window is
//! closed at the end.
//!
//! # The farm
//! The design notes' numbers: 400 domains with hundreds of edits a day, 5 with
//! tens of thousands, and two with hundreds of thousands (enwiki ~186,000);
//! page popularity Zipf-skewed within each domain, so hot pages are edited
//! every few simulated minutes; templates with a long-tailed fan-out (a
//! page's templates are drawn Zipf-skewed too), whose edits re-render their
//! dependents through the graph's listing; renders of real Parsoid HTML (the
//! Anarchism history in `shared/data`, 1-60 KB); page deletions and revision
//! suppressions; latest reads, old-revision reads, listings (a page's
//! archived revisions, a page of a template's dependents as change
//! propagation walks them) and a dump of a domain once
//! a simulated day; and 150 times a simulated day, probes listing a full
//! page of the largest domain's most used templates' dependents and one of
//! the page in the news's archived revisions (a day's p99 of each from its
//! own day's answers). The farm exists before day 1: before the clock starts,
//! every page is rendered once with its templates declared, the hand-offs
//! are delivered, and the janitor's routine run has been over it (a store
//! that starts empty is at its fastest on day 1, templates gathering
//! dependents from nothing list few full pages for days, and a routine
//! run's first pass over a whole farm loads the first days for minutes;
//! none of that is a wiki's first day). On Cassandra, the seed's delivered
//! hand-offs are compacted away, as their closed time window would be.
//!
//! Beside the farm's Zipf-skewed edits, a page in the news (`NEWS_PAGE`,
//! in the largest domain) is edited every 1-2 simulated minutes all run, its
//! real rate rather than the load's scaled one, and read after each edit:
//! its partition of `page_renders` is the hottest a wiki has.
//!
//! This machine cannot write a farm's volume `F` times faster than the farm,
//! so the load is scaled down too: `--rate` operations a second, which is
//! `S = farm writes per day / writes per simulated day` times fewer rows per
//! gc_grace window than the real farm writes. The run says `S`; on Cassandra
//! the node's tombstone thresholds and partition-size warning must be divided
//! by about as much (`REVSTORE_CASSANDRA_THRESHOLD_SCALE` of
//! `deploy/cassandra/cassandra-local`), and the targets below use the node's
//! own (scaled) thresholds, read from `system_views.settings`.
//!
//! `--nodetool CMD` (Cassandra: `deploy/cassandra/cassandra-local nodetool`)
//! reads every table's exact bytes on disk (`tablestats`) after each full
//! janitor run, which the overstore is judged by: the audit's own disk
//! figure is in whole mebibytes per node and table, rounded up, and on a
//! soak's tens of mebibytes a dozen near-empty tables make that rounding a
//! third of it. Nothing is flushed or compacted by hand while the clock
//! runs; the outbox's window is closed after it (above).
//!
//! # What it reports, and the targets that fail it
//! Per simulated day, a row of `soak-<engine>.csv` in `--out`: per table the
//! most tombstones one read scanned and the 99th percentile (the worst node's
//! `tombstones_per_read`), the largest partition, the bytes on disk; p99 of
//! latest reads, render writes and listings; the hand-off lag (a probe render
//! timed into old-store every simulated hour); the janitor's routine runs of
//! the day and its full run; the overstore on disk (the full run's audit);
//! the renders the page in the news holds; answers by class. Pictures of the
//! same (`soak-<engine>-*.svg`).
//!
//! At the end, every target's verdict, and the exit status: 1 when any
//! target is missed or could not be judged (too few samples, a node figure
//! not given, no full janitor run); a target whose window the run's length
//! cannot hold (fixed by `--days` before it starts) is left to a longer run
//! and said so. The targets (`revstore_integration_tests::soak_targets`):
//! - per operation (latest reads, render writes, full listings of a page's
//!   archived revisions, full pages of a template's dependents): the p99 of
//!   the last three simulated days at most 1.2x that of days 2-4, and the
//!   least-squares line through the daily p99s (days pooled until 100
//!   samples) at most 1.2x from the first day to the last, each window with
//!   at least 100 samples (a week);
//! - the page in the news holds no more renders than its grace period, the
//!   clock skew and two hours of janitor cadence at its fastest edit rate;
//! - the hand-off lag's p99 at most 5 s on every day; no 5xx; every
//!   acknowledged render served when read back by (revision, tid) at a random
//!   time within half its grace period, unless the page was deleted or the
//!   revision suppressed since (the load is open loop: an operation starts
//!   when it is due, whatever is in flight);
//! - the janitor's routine run completing on its hourly schedule, and every
//!   task's routine work of the last three days at most 1.2x that of days
//!   9-11 (two weeks);
//! - the overstore on disk at most 1.3 by every full run after the first
//!   grace period (Cassandra: after the first gc_grace), at least three of
//!   them (weekly runs: three weeks past that);
//! - on Cassandra, tombstones per read within the threshold below and flat
//!   after gc_grace, no partition past 100 MB, and the outbox keeping under
//!   1% of its bytes once its window is closed (`--nodetool`).
//!
//! Which tombstone threshold stands for the farm's depends on what a table's
//! partitions hold. A page's or a template's partition holds its history, so
//! its tombstones per gc_grace window scale with the load scale, and are held
//! to the node's scaled threshold. A partition that is a span of real time
//! (a minute of the outbox or the journal, an hour of compaction debt) is
//! filled at the soak's rate per real second; its figure times the farm's
//! rate over the soak's (and, for an hour's bucket in a run shorter than an
//! hour, extrapolated to the full hour) is held to Cassandra's own 1,000. A block of
//! `archive_blocks` holds one range deletion per compaction of it whatever
//! the time (a full run's range scan steps over those of a page of blocks),
//! and is held to 1,000 too.

#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use revstore_bench::chart::{LineChart, Series};
use revstore_bench::{arg, parsed, percentile_ms};
use revstore_integration_tests::soak_targets::{Verdicts, judge_janitor_task, judge_latency, p99_ms};
use revstore_integration_tests::{Engine, Options, System};
use revstore_keys::{Tid, TidGenerator};
use revstore_storage::{CassandraEngine, CassandraOptions, Store};
use serde_json::{Value as Json, json};

/// The two large wikis, edits a day (enwiki's is the design notes' figure).
const LARGE: [(&str, u64); 2] = [("en.wikipedia.org", 186_000), ("de.wikipedia.org", 60_000)];
/// Medium wikis: how many, and edits a day each.
const MEDIUM: (usize, u64) = (5, 30_000);
/// Small wikis: how many; their edits a day spread evenly over 100-900.
const SMALL: usize = 400;
/// Items a listing asks for (a template's dependents, a page's archived revisions).
const LISTING_PAGE: usize = 50;
/// Full-page listings probed a simulated day, beside the load's: enough
/// for a day's p99 (at least 100 answers) without pooling days.
const LISTING_PROBES: u64 = 150;
/// The page in the news: edited every 1-2 simulated minutes all run (its
/// real rate, not scaled down with the farm's load), read after each edit.
const NEWS_PAGE: &str = "Soak_page_in_the_news";
/// Its edits' interval, simulated seconds.
const NEWS_EDIT_SECS: (f64, f64) = (60.0, 120.0);

#[derive(Debug, Clone)]
struct Domain {
    name: String,
    /// Edits a day, of the real farm.
    edits_per_day: u64,
    /// Pages the soak's share of the domain's edits spreads over.
    pages: u64,
    templates: u64,
}

/// The farm, largest domains first.
fn farm() -> Vec<Domain> {
    let mut domains: Vec<Domain> =
        LARGE.iter().map(|(name, edits)| Domain { name: (*name).to_owned(), edits_per_day: *edits, pages: 0, templates: 0 }).collect();
    for i in 0..MEDIUM.0 {
        domains.push(Domain { name: format!("wiki{i}.wikisource.org"), edits_per_day: MEDIUM.1, pages: 0, templates: 0 });
    }
    for i in 0..SMALL {
        let edits = 100 + (i as u64 * 800) / SMALL as u64;
        domains.push(Domain { name: format!("wiki{i}.wiktionary.org"), edits_per_day: edits, pages: 0, templates: 0 });
    }
    domains
}

/// A Zipf-skewed index in `0..n` (s = 1): index k is drawn with weight 1/(k+1).
fn zipf(rng: &mut StdRng, n: u64) -> u64 {
    // Inverse of the continuous approximation: H(x) ~ ln(x + 1).
    let u: f64 = rng.random();
    let x = ((n as f64 + 1.0).ln() * u).exp() - 1.0;
    (x as u64).min(n.saturating_sub(1))
}

#[derive(Debug, Default, Clone)]
struct PageState {
    rev: u64,
    /// The latest render's tid: renders of one revision take precedence by
    /// their time (a tid's text does not sort by time).
    tid: Option<Tid>,
    deleted: bool,
    ever_deleted: bool,
    /// Revisions written, newest last (the last 16), and those suppressed.
    revs: Vec<u64>,
    suppressed: Vec<u64>,
    has_deps: bool,
    /// Deletions acknowledged so far: a render read back after one may be gone.
    deletions: u64,
}

/// What the run has acknowledged, and the farm's revision counters.
#[derive(Debug, Default)]
struct FarmState {
    pages: BTreeMap<(usize, String), PageState>,
    next_rev: Vec<u64>,
}

/// Latencies and answers of one simulated day.
#[derive(Debug, Default)]
struct DayStats {
    latest_reads: Vec<Duration>,
    render_writes: Vec<Duration>,
    listings: Vec<Duration>,
    /// Listings of a page's archived revisions that answered a full page
    /// (`LISTING_PAGE` items): a listing's work grows with its answer until
    /// the page is full, so time is judged on listings of one size.
    full_listings: Vec<Duration>,
    /// Pages of a template's dependents that answered a full page.
    dependents_pages: Vec<Duration>,
    old_reads: Vec<Duration>,
    server_errors: u64,
    client_errors: u64,
    not_found: u64,
    answers: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    LatestRead,
    RenderWrite,
    /// A page's archived revisions (old-store).
    Listing,
    /// A page of a template's dependents (the graph).
    DependentsPage,
    OldRead,
    Other,
}

struct Run {
    system: System,
    domains: Vec<Domain>,
    state: Mutex<FarmState>,
    days: Mutex<Vec<DayStats>>,
    tids: TidGenerator,
    bodies: Vec<Vec<u8>>,
    started: Instant,
    day_secs: f64,
    seed: u64,
    /// Acknowledged writes and the 5xx answers, over the whole run.
    acknowledged: AtomicU64,
    read_backs: ReadBacks,
    /// Operations started and not yet answered, and the most at once.
    in_flight: AtomicU64,
    most_in_flight: AtomicU64,
    /// Hand-off probes: (the simulated day it started, seconds into old-store).
    hand_off_lags: Mutex<Vec<(usize, f64)>>,
}

/// Every acknowledged render read back by its (revision, tid) at a random
/// time within half its grace period: one that is not served, and that no
/// later deletion or suppression excuses, is a lost write.
#[derive(Debug, Default)]
struct ReadBacks {
    pending: AtomicU64,
    served: AtomicU64,
    /// Not served, and the page deleted or the revision suppressed since.
    excused: AtomicU64,
    lost: AtomicU64,
    /// The first few lost, for the report.
    examples: Mutex<Vec<String>>,
}

impl Run {
    fn day(&self) -> usize {
        (self.started.elapsed().as_secs_f64() / self.day_secs) as usize
    }

    fn record(&self, kind: Kind, took: Duration, status: u16, body: &[u8]) {
        let day = self.day();
        let mut days = self.days.lock().expect("lock");
        while days.len() <= day {
            days.push(DayStats::default());
        }
        let stats = &mut days[day];
        stats.answers += 1;
        match status {
            500.. => stats.server_errors += 1,
            404 | 410 => stats.not_found += 1,
            400..=499 => stats.client_errors += 1,
            _ => match kind {
                Kind::LatestRead => stats.latest_reads.push(took),
                Kind::RenderWrite => stats.render_writes.push(took),
                Kind::Listing | Kind::DependentsPage => {
                    stats.listings.push(took);
                    let items = serde_json::from_slice::<Json>(body).ok().and_then(|b| b["items"].as_array().map(Vec::len));
                    if items == Some(LISTING_PAGE) {
                        match kind {
                            Kind::Listing => stats.full_listings.push(took),
                            _ => stats.dependents_pages.push(took),
                        }
                    }
                }
                Kind::OldRead => stats.old_reads.push(took),
                Kind::Other => {}
            },
        }
    }

    async fn call(&self, kind: Kind, request: reqwest::RequestBuilder) -> (u16, Vec<u8>) {
        let started = Instant::now();
        let (status, body) = match request.timeout(Duration::from_secs(60)).send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                (status, response.bytes().await.map(|b| b.to_vec()).unwrap_or_default())
            }
            // No answer counts as a server error: the client saw none.
            Err(_) => (599, Vec::new()),
        };
        self.record(kind, started.elapsed(), status, &body);
        (status, body)
    }

    /// Renders a new revision of `title` (or the same revision again, for a
    /// template's dependent), and remembers it once acknowledged.
    async fn render(self: &Arc<Self>, domain: usize, title: &str, new_revision: bool, rng: &mut StdRng) {
        let rev = {
            let mut state = self.state.lock().expect("lock");
            let next = state.next_rev[domain] + 1;
            let page = state.pages.entry((domain, title.to_owned())).or_default();
            if new_revision || page.rev == 0 || page.deleted {
                state.next_rev[domain] = next;
                next
            } else {
                page.rev
            }
        };
        let tid = self.tids.next();
        let body = self.bodies[rng.random_range(0..self.bodies.len())].clone();
        let name = &self.domains[domain].name;
        let url = self.system.current.url(&format!("/{name}/v1/page/{}/{rev}/{tid}", encode(title)));
        let request = self.system.http.put(url).bearer_auth(&self.system.token).header("content-type", "application/json").body(body);
        let (status, _) = self.call(Kind::RenderWrite, request).await;
        if status == 201 || status == 200 {
            self.acknowledged.fetch_add(1, Ordering::Relaxed);
            let mut state = self.state.lock().expect("lock");
            let page = state.pages.entry((domain, title.to_owned())).or_default();
            let after = Duration::from_secs_f64(rng.random_range(0.0..self.day_secs / 2.0));
            self.read_back(domain, title.to_owned(), rev, tid, page.deletions, after);
            if rev > page.rev || (rev == page.rev && Some(tid) > page.tid) {
                page.rev = rev;
                page.tid = Some(tid);
                page.deleted = false;
            }
            if page.revs.last() != Some(&rev) {
                page.revs.push(rev);
                if page.revs.len() > 16 {
                    page.revs.remove(0);
                }
            }
        }
    }

    /// Reads the acknowledged render (`rev`, `tid`) back `after` from now
    /// (see [`ReadBacks`]); `deletions` is the page's count at its acknowledgement.
    fn read_back(self: &Arc<Self>, domain: usize, title: String, rev: u64, tid: Tid, deletions: u64, after: Duration) {
        let run = self.clone();
        run.read_backs.pending.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let name = &run.domains[domain].name;
            let url = run.system.current.url(&format!("/{name}/v1/page/html/{}/{rev}/{tid}", encode(&title)));
            // A 5xx or no answer is tried again: the write is lost only if the render is not there.
            let mut status = 0;
            for attempt in 0..3 {
                status = match run.system.http.get(&url).timeout(Duration::from_secs(60)).send().await {
                    Ok(response) => response.status().as_u16(),
                    Err(_) => 599,
                };
                if status < 500 {
                    break;
                }
                tokio::time::sleep(Duration::from_secs(1 << attempt)).await;
            }
            let counter = if status == 200 {
                &run.read_backs.served
            } else {
                let state = run.state.lock().expect("lock");
                let page = state.pages.get(&(domain, title.clone()));
                if page.is_some_and(|p| p.deletions > deletions || p.suppressed.contains(&rev)) {
                    &run.read_backs.excused
                } else {
                    let mut examples = run.read_backs.examples.lock().expect("lock");
                    if examples.len() < 5 {
                        examples.push(format!("{url}: {status}"));
                    }
                    &run.read_backs.lost
                }
            };
            counter.fetch_add(1, Ordering::Relaxed);
            run.read_backs.pending.fetch_sub(1, Ordering::Relaxed);
        });
    }

    /// One operation of the farm, drawn from `i`.
    async fn operation(self: Arc<Self>, i: u64, weights: Arc<Vec<f64>>) {
        let mut rng = StdRng::seed_from_u64(self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i);
        // The domain, by its share of the farm's edits.
        let pick: f64 = rng.random();
        let domain = weights.partition_point(|w| *w < pick).min(self.domains.len() - 1);
        let d = self.domains[domain].clone();
        let page = zipf(&mut rng, d.pages);
        let title = format!("Soak_page_{page}");
        let roll: f64 = rng.random();
        match roll {
            // An edit: a new revision, its templates declared on the first.
            r if r < 0.30 => {
                let declare = !self.state.lock().expect("lock").pages.get(&(domain, title.clone())).is_some_and(|p| p.has_deps);
                if declare {
                    let edges: Vec<Json> = (0..1 + rng.random_range(0..3))
                        .map(|_| json!({"parent": template_title(zipf(&mut rng, d.templates)), "type": "modification", "priority": 500}))
                        .collect();
                    let url = self.system.graph.url(&format!("/{}/v1/deps/{}", d.name, encode(&title)));
                    let request = self.system.http.put(url).bearer_auth(&self.system.token).json(&json!({"edges": edges}));
                    let (status, _) = self.call(Kind::Other, request).await;
                    if status < 300 {
                        self.state.lock().expect("lock").pages.entry((domain, title.clone())).or_default().has_deps = true;
                    }
                }
                self.render(domain, &title, true, &mut rng).await;
            }
            // A template edit: the template's new revision, then its
            // dependents re-rendered, as far as one page of the listing goes.
            r if r < 0.31 => {
                let template = template_title(zipf(&mut rng, d.templates));
                self.render(domain, &template, true, &mut rng).await;
                let url = self.system.graph.url(&format!("/{}/v1/dependents/{}?limit={LISTING_PAGE}", d.name, encode(&template)));
                let (status, body) = self.call(Kind::DependentsPage, self.system.http.get(url)).await;
                if status == 200 {
                    let listed: Json = serde_json::from_slice(&body).unwrap_or(Json::Null);
                    let children: Vec<String> = listed["items"]
                        .as_array()
                        .map(|items| items.iter().filter_map(|e| e["child"].as_str().map(str::to_owned)).take(10).collect())
                        .unwrap_or_default();
                    for child in children {
                        self.render(domain, &child, false, &mut rng).await;
                    }
                }
            }
            // A deletion (and the graph forgets the page).
            r if r < 0.312 => {
                let url = self.system.current.url(&format!("/{}/v1/page/{}", d.name, encode(&title)));
                let (status, _) = self.call(Kind::Other, self.system.http.delete(url).bearer_auth(&self.system.token)).await;
                if status < 300 {
                    {
                        let mut state = self.state.lock().expect("lock");
                        let p = state.pages.entry((domain, title.clone())).or_default();
                        p.deleted = true;
                        p.ever_deleted = true;
                        p.has_deps = false;
                        p.deletions += 1;
                    }
                    let url = self.system.graph.url(&format!("/{}/v1/deps/{}", d.name, encode(&title)));
                    self.call(Kind::Other, self.system.http.delete(url).bearer_auth(&self.system.token)).await;
                }
            }
            // A suppression of an older revision.
            r if r < 0.314 => {
                let older = {
                    let state = self.state.lock().expect("lock");
                    state.pages.get(&(domain, title.clone())).and_then(|p| (p.revs.len() > 1).then(|| p.revs[0]))
                };
                if let Some(rev) = older {
                    let url = self.system.current.url(&format!("/{}/v1/page/{}/{rev}/suppress", d.name, encode(&title)));
                    let (status, _) = self.call(Kind::Other, self.system.http.post(url).bearer_auth(&self.system.token)).await;
                    if status < 300 {
                        let mut state = self.state.lock().expect("lock");
                        state.pages.entry((domain, title.clone())).or_default().suppressed.push(rev);
                    }
                }
            }
            // An old revision, through current-store (which reads old-store
            // for what it no longer holds).
            r if r < 0.40 => {
                let older = {
                    let state = self.state.lock().expect("lock");
                    state.pages.get(&(domain, title.clone())).filter(|p| !p.deleted).and_then(|p| {
                        let candidates: Vec<u64> = p.revs.iter().rev().skip(1).filter(|r| !p.suppressed.contains(r)).copied().collect();
                        candidates.first().copied()
                    })
                };
                if let Some(rev) = older {
                    let url = self.system.current.url(&format!("/{}/v1/page/html/{}/{rev}", d.name, encode(&title)));
                    self.call(Kind::OldRead, self.system.http.get(url)).await;
                }
            }
            // A listing of the page's archived revisions.
            r if r < 0.43 => {
                let url = self.system.old.url(&format!("/{}/v1/archive/revisions/{}?limit={LISTING_PAGE}", d.name, encode(&title)));
                self.call(Kind::Listing, self.system.http.get(url)).await;
            }
            // Change propagation walking a template's dependents, a page at
            // a time (templates drawn as pages draw them: the hot ones have
            // many dependents, so most answers are full pages).
            r if r < 0.48 => {
                let template = template_title(zipf(&mut rng, d.templates));
                let url = self.system.graph.url(&format!("/{}/v1/dependents/{}?limit={LISTING_PAGE}", d.name, encode(&template)));
                self.call(Kind::DependentsPage, self.system.http.get(url)).await;
            }
            // The latest render: most of the traffic.
            _ => {
                let url = self.system.current.url(&format!("/{}/v1/page/html/{}", d.name, encode(&title)));
                self.call(Kind::LatestRead, self.system.http.get(url)).await;
            }
        }
    }
}

/// Every page of every domain rendered once (a revision of its own) with
/// its templates declared, sixteen requests at a time, then the outbox
/// waited out; what was acknowledged, as the run keeps it.
async fn seed_farm(system: &System, domains: &[Domain], bodies: &[Vec<u8>], seed: u64) -> FarmState {
    use futures_util::StreamExt as _;
    let tids = TidGenerator::new();
    let mut state = FarmState { next_rev: vec![0; domains.len()], ..FarmState::default() };
    let mut pages = Vec::new();
    for (domain, d) in domains.iter().enumerate() {
        for page in 0..d.pages {
            state.next_rev[domain] += 1;
            pages.push((domain, format!("Soak_page_{page}"), state.next_rev[domain], tids.next()));
        }
    }
    let seeded = futures_util::stream::iter(pages)
        .map(|(domain, title, rev, tid)| async move {
            let d = &domains[domain];
            let mut rng = StdRng::seed_from_u64(seed ^ tid.unix_micros() as u64);
            let edges: Vec<Json> = (0..1 + rng.random_range(0..3))
                .map(|_| json!({"parent": template_title(zipf(&mut rng, d.templates)), "type": "modification", "priority": 500}))
                .collect();
            let deps = system.graph.url(&format!("/{}/v1/deps/{}", d.name, encode(&title)));
            let declared = system.http.put(deps).bearer_auth(&system.token).json(&json!({"edges": edges})).send().await;
            let declared = declared.is_ok_and(|r| r.status().is_success());
            let body = bodies[rng.random_range(0..bodies.len())].clone();
            let url = system.current.url(&format!("/{}/v1/page/{}/{rev}/{tid}", d.name, encode(&title)));
            let rendered =
                system.http.put(url).bearer_auth(&system.token).header("content-type", "application/json").body(body).send().await;
            let rendered = rendered.is_ok_and(|r| r.status().is_success());
            (domain, title, rev, tid, declared, rendered)
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    let mut failed = 0;
    for (domain, title, rev, tid, declared, rendered) in seeded {
        if !rendered {
            failed += 1;
            continue;
        }
        let page = PageState { rev, tid: Some(tid), revs: vec![rev], has_deps: declared, ..PageState::default() };
        state.pages.insert((domain, title), page);
    }
    assert_eq!(failed, 0, "renders of the farm before day 1 failed");
    // Every hand-off delivered before the clock starts: the first day's
    // hand-off lag is the day's, not the seed's backlog.
    let metrics = system.current.url("/metrics");
    let deadline = Instant::now() + Duration::from_secs(1800);
    // Caught up in two delivery rounds in a row (the gauge is as of the
    // worker's last round, which may have run before the last render).
    let mut caught_up = 0;
    loop {
        let text = match system.http.get(&metrics).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let pending =
            text.lines().find(|l| l.starts_with("outbox_oldest_pending_seconds")).and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        caught_up = if pending == Some(0.0) { caught_up + 1 } else { 0 };
        if caught_up == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the seed's hand-offs not delivered in 30 minutes: {pending:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    state
}

fn template_title(template: u64) -> String {
    format!("Template:Soak_{template}")
}

/// A title as a path segment (the soak's titles are ASCII; `:` and `_` stay).
fn encode(title: &str) -> String {
    title.replace('/', "%2F").replace(' ', "_")
}

/// One run of the janitor binary.
#[derive(Debug, Clone)]
struct JanitorRun {
    /// A full run (`--scope all`), or a routine one (`--scope changed`).
    full: bool,
    /// The simulated day it ended in.
    day: usize,
    seconds: f64,
    /// Partitions its sweeps visited (the audit's excepted: it reads every table).
    partitions: u64,
    /// Partitions visited per service and task, "service task" (the audit's included).
    per_task: BTreeMap<String, u64>,
    overstore_on_disk: Option<f64>,
    /// The same from the nodes' exact bytes (`--nodetool`), where the audit's
    /// figure is rounded up to whole mebibytes per node and table.
    overstore_exact: Option<f64>,
    completed: bool,
}

/// One table's figures on one simulated day.
#[derive(Debug, Clone, Default)]
struct TableDay {
    tombstones_max: u64,
    tombstones_p99: u64,
    largest_partition: u64,
    bytes_on_disk: u64,
}

/// One simulated day's row of the timeline.
#[derive(Debug, Clone, Default)]
struct Timeline {
    day: usize,
    tables: BTreeMap<String, TableDay>,
    latest_p99_ms: f64,
    write_p99_ms: f64,
    listing_p99_ms: f64,
    old_read_p99_ms: f64,
    hand_off_lag_secs: f64,
    /// The day's routine janitor runs: mean seconds and partitions per run.
    janitor_secs: f64,
    janitor_partitions: u64,
    janitor_runs: usize,
    /// Partitions the day's routine runs visited together: the janitor's
    /// routine work per day of edits (a run's own depends on how long since
    /// the last, which the full run's share of the machine stretches).
    janitor_day_partitions: u64,
    /// Of those, the dependency graph's change retention's (see
    /// [`GRAPH_CHANGE_RETENTION_DAYS`]).
    janitor_day_change_retention: u64,
    /// Mean partitions per routine run, by "service task".
    janitor_tasks: BTreeMap<String, u64>,
    /// Partitions the day's routine runs visited together, by "service task".
    janitor_day_tasks: BTreeMap<String, u64>,
    /// The renders the page in the news holds at the day's end (`None`: the listing failed).
    news_page_renders: Option<usize>,
    /// The last full run (every page) that ended this day.
    full_run_secs: f64,
    full_run_partitions: u64,
    overstore_on_disk: Option<f64>,
    overstore_exact: Option<f64>,
    server_errors: u64,
    answers: u64,
    data_dir_bytes: u64,
    /// The day's latencies, for the verdict's windows of several days.
    samples: Samples,
}

/// One day's latencies of the kinds the targets hold to time.
#[derive(Debug, Clone, Default)]
struct Samples {
    latest_reads: Vec<Duration>,
    render_writes: Vec<Duration>,
    full_listings: Vec<Duration>,
    dependents_pages: Vec<Duration>,
}

/// The stores of the services' keyspaces, to ask the nodes for their figures.
async fn keyspace_stores(system: &System) -> Vec<(&'static str, Store)> {
    let node = std::env::var("REVSTORE_TEST_CASSANDRA").expect("REVSTORE_TEST_CASSANDRA");
    let mut stores = Vec::new();
    for service in [&system.current, &system.old, &system.graph] {
        let keyspace = service.keyspace.clone().expect("a keyspace");
        let engine = CassandraEngine::connect(CassandraOptions::new(node.split(',').map(str::trim), keyspace)).await.expect("connect");
        stores.push((service.name, Store::new(Arc::new(engine))));
    }
    stores
}

/// Every table's read health and disk figure, from the nodes.
async fn table_figures(stores: &[(&'static str, Store)]) -> BTreeMap<String, TableDay> {
    let mut tables = BTreeMap::new();
    for (service, store) in stores {
        let component = revstore_schema::version::component(service).expect("a component");
        for table in component.tables {
            // A figure the nodes do not give leaves the table out of the day: a failed verdict.
            let Ok(Some(health)) = store.read_health(table).await else {
                println!("{service}/{}: the nodes gave no read figures", table.name);
                continue;
            };
            let disk = store.disk_usage(table).await.ok().flatten().unwrap_or_default();
            tables.insert(
                format!("{service}/{}", table.name),
                TableDay {
                    tombstones_max: health.tombstones_per_read_max,
                    tombstones_p99: health.tombstones_per_read_p99,
                    largest_partition: health.largest_partition_bytes,
                    bytes_on_disk: disk.bytes,
                },
            );
        }
    }
    tables
}

/// A node setting from `system_views.settings` (the thresholds it was started with).
async fn node_setting(name: &str) -> Option<String> {
    let node = std::env::var("REVSTORE_TEST_CASSANDRA").ok()?;
    let session = scylla::client::session_builder::SessionBuilder::new().known_nodes(node.split(',').map(str::trim)).build().await.ok()?;
    let result = session.query_unpaged("SELECT value FROM system_views.settings WHERE name = ?", (name,)).await.ok()?;
    let rows = result.into_rows_result().ok()?;
    rows.maybe_first_row::<(Option<String>,)>().ok()?.and_then(|(v,)| v)
}

fn dir_bytes(path: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Times one probe render from its acknowledgement into old-store.
async fn hand_off_lag(run: &Run) -> f64 {
    let tid = run.tids.next().to_string();
    // A title of its own: a second render of one revision is not archived again.
    let probe = format!("Soak_probe_{tid}");
    let name = &run.domains[0].name;
    let url = run.system.current.url(&format!("/{name}/v1/page/{probe}/1/{tid}"));
    let body = run.bodies[0].clone();
    let request = run.system.http.put(url).bearer_auth(&run.system.token).header("content-type", "application/json").body(body);
    let Ok(response) = request.send().await else { return f64::NAN };
    if !response.status().is_success() {
        return f64::NAN;
    }
    let acknowledged = Instant::now();
    let archived = run.system.old.url(&format!("/{name}/v1/archive/html/{probe}/1/{tid}"));
    while acknowledged.elapsed() < Duration::from_secs(600) {
        if run.system.http.get(&archived).send().await.is_ok_and(|r| r.status().is_success()) {
            return acknowledged.elapsed().as_secs_f64();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    f64::INFINITY
}

#[tokio::main]
async fn main() {
    let engine = match arg("--engine").as_deref().unwrap_or("embedded") {
        "embedded" => Engine::Embedded,
        "cassandra" => Engine::Cassandra,
        other => panic!("--engine: embedded or cassandra, not {other:?}"),
    };
    let days: usize = parsed("--days", 21);
    let day_secs: f64 = parsed("--day-secs", 120.0);
    let rate: f64 = parsed("--rate", 40.0);
    let seed: u64 = parsed("--seed", 1);
    let out = PathBuf::from(arg("--out").unwrap_or_else(|| "target/soak".to_owned()));
    std::fs::create_dir_all(&out).expect("--out");
    let factor = 86_400.0 / day_secs;
    let scaled = |secs: f64, floor: f64| ((secs / factor).round()).max(floor) as u64;

    // The load: operations a second, ~30% of them edits, each edit ~1.5 renders.
    let mut domains = farm();
    let farm_edits: u64 = domains.iter().map(|d| d.edits_per_day).sum();
    let edits_per_sim_day = rate * day_secs * 0.30;
    let load_scale = farm_edits as f64 / edits_per_sim_day;
    for d in &mut domains {
        // Enough pages that the hottest is edited every few simulated minutes
        // and the tail is touched rarely: the soak's share times 20.
        let share = d.edits_per_day as f64 / load_scale;
        d.pages = ((share * 20.0) as u64).clamp(20, 200_000);
        d.templates = (d.pages / 20).clamp(5, 2_000);
    }
    let total: f64 = domains.iter().map(|d| d.edits_per_day as f64).sum();
    let mut cumulative = 0.0;
    let weights: Vec<f64> = domains
        .iter()
        .map(|d| {
            cumulative += d.edits_per_day as f64 / total;
            cumulative
        })
        .collect();

    let grace = scaled(86_400.0, 1.0);
    let hand_off_check_after = scaled(HAND_OFF_CHECK_AFTER_SECS, HAND_OFF_CHECK_AFTER_FLOOR_SECS);
    let options = Options {
        grace_ttl_secs: grace,
        clock_skew_secs: scaled(300.0, 0.0),
        env: vec![
            ("REVSTORE_GRAPH_CHANGE_RETENTION_SECS".into(), scaled(GRAPH_CHANGE_RETENTION_DAYS * 86_400.0, 60.0).to_string()),
            // The embedded engine's purge (every ten minutes): what it frees and
            // folds back is what was deleted since the last; unscaled, one purge
            // a simulated fortnight stalls every write behind days of deletes.
            ("REVSTORE_PURGE_INTERVAL_SECS".into(), scaled(PURGE_INTERVAL_SECS, 1.0).to_string()),
            // Old-store's sweep of its compaction debt (every five minutes):
            // unscaled, a sweep a simulated day and a half re-queues what the
            // farm appended since, in one burst.
            ("REVSTORE_DEBT_SWEEP_SECS".into(), scaled(DEBT_SWEEP_SECS, 1.0).to_string()),
            // current-store's hand-off check leaves a revision to the outbox
            // five minutes: unscaled, that is days of simulated time, and the
            // check of a day's revisions fell after the run.
            ("REVSTORE_HAND_OFF_CHECK_AFTER".into(), hand_off_check_after.to_string()),
            // The outbox deletes a delivered minute ten minutes after it has
            // passed it: unscaled, a week of 30 s days ends before any of its
            // minutes is deleted, and the closed window keeps them all.
            ("REVSTORE_OUTBOX_SETTLE".into(), scaled(OUTBOX_SETTLE_SECS, OUTBOX_SETTLE_FLOOR_SECS).to_string()),
        ],
        ..Options::default()
    };
    let janitor_every = Duration::from_secs_f64((3600.0 / factor).max(1.0));
    println!(
        "soak on {engine:?}: {days} simulated days of {day_secs} s (time factor {factor:.0}); farm {} domains, {farm_edits} edits a day; \
         here {rate} operations/s, {edits_per_sim_day:.0} edits a simulated day: load scale {load_scale:.0}; grace TTL {grace} s, \
         janitor every {:.1} s",
        domains.len(),
        janitor_every.as_secs_f64()
    );

    let system = System::start(engine, options).await;
    let stores: Vec<(&'static str, Store)> = if engine == Engine::Cassandra { keyspace_stores(&system).await } else { Vec::new() };
    let mut warn_threshold = None;
    if !stores.is_empty() {
        // Every table's gc_grace_seconds, scaled by the time factor.
        let node = std::env::var("REVSTORE_TEST_CASSANDRA").expect("node");
        let session = scylla::client::session_builder::SessionBuilder::new()
            .known_nodes(node.split(',').map(str::trim))
            .build()
            .await
            .expect("session");
        for service in [&system.current, &system.old, &system.graph] {
            let keyspace = service.keyspace.clone().expect("keyspace");
            let result = session
                .query_unpaged("SELECT table_name, gc_grace_seconds FROM system_schema.tables WHERE keyspace_name = ?", (&keyspace,))
                .await
                .expect("tables");
            let rows: Vec<(String, i32)> = result.into_rows_result().expect("rows").rows().expect("typed").flatten().collect();
            for (table, gc_grace) in rows {
                let to = scaled(f64::from(gc_grace), 1.0);
                let alter = format!("ALTER TABLE \"{keyspace}\".\"{table}\" WITH gc_grace_seconds = {to}");
                session.query_unpaged(alter, ()).await.expect("alter gc_grace_seconds");
            }
        }
        session.await_schema_agreement().await.expect("schema agreement");
        warn_threshold = node_setting("tombstone_warn_threshold").await.and_then(|v| v.parse::<u64>().ok());
        let failure = node_setting("tombstone_failure_threshold").await;
        println!("node thresholds: tombstone warning {warn_threshold:?}, failure {failure:?}; gc_grace_seconds divided by {factor:.0}");
    }

    let html = revstore_testdata::anarchism_html();
    let bodies: Vec<Vec<u8>> = html
        .iter()
        .map(|h| json!({"html": h, "data-parsoid": {"ids": {}}, "section-offsets": {"mwAQ": {"html": [0, 10], "wt": [0, 5]}}}))
        .map(|v| v.to_string().into_bytes())
        .collect();
    // The farm exists before day 1: every page rendered once, with its
    // templates declared, and every hand-off delivered. A store that starts
    // empty is at its fastest on day 1, and templates gathering dependents
    // from nothing list few full pages for days: neither is a wiki's first day.
    let seeded = Instant::now();
    let state = seed_farm(&system, &domains, &bodies, seed).await;
    let seed_took = seeded.elapsed();
    println!(
        "the farm before day 1: {} pages rendered and their templates declared, hand-offs delivered, in {:.0} s",
        state.pages.len(),
        seeded.elapsed().as_secs_f64()
    );
    // And the janitor's routine run has been over it, as a deployed one has
    // (its first run visits every page it has not seen: left to the clock,
    // that takes minutes and loads the first days, which the last days are
    // compared with). The weekly full run starts with the clock: a full run
    // of the seeded wiki takes longer than a simulated week at this time
    // factor, so one is running in the first days and in the last, as on a
    // large wiki, where a full run takes hours.
    // Not before the seed's last revisions are due for the hand-off check
    // (its wait, and a minute for the journal's margin): a run
    // sooner left 4,774 pages for the first routine runs on the clock (runs of
    // 31-58 s on days 1-3).
    let due = Duration::from_secs(hand_off_check_after + 60);
    if let Some(wait) = due.checked_sub(seeded.elapsed().saturating_sub(seed_took)) {
        println!("the farm before day 1: waiting {:.0} s for the seed's hand-off checks to fall due", wait.as_secs_f64());
        tokio::time::sleep(wait).await;
    }
    let started = Instant::now();
    let output = system.janitor(&["--ops-per-sec", "0", "--scope", "changed"]);
    assert!(output.status.success(), "the seeded farm's first routine janitor run failed: {}", String::from_utf8_lossy(&output.stderr));
    println!("the farm before day 1: the janitor's first routine run in {:.0} s", started.elapsed().as_secs_f64());
    // The seed's hand-offs, delivered, leave the disk as the farm's window
    // of them, closed long before day 1, took them (see `OPEN_WINDOW`; left
    // open, the seed's 12,000 delivered rows stayed on disk all run).
    if let (Some(nodetool), Some(keyspace)) = (arg("--nodetool"), system.current.keyspace.clone()) {
        let (open, closed) = close_outbox_window(&nodetool, &keyspace);
        println!(
            "the farm before day 1: the seed's {OPEN_WINDOW} window closed, {:.2} MiB on disk (all copies) to {:.3}",
            open as f64 / 1048576.0,
            closed as f64 / 1048576.0
        );
    }
    let run = Arc::new(Run {
        state: Mutex::new(state),
        domains,
        system,
        days: Mutex::new(Vec::new()),
        tids: TidGenerator::new(),
        bodies,
        started: Instant::now(),
        day_secs,
        seed,
        acknowledged: AtomicU64::new(0),
        read_backs: ReadBacks::default(),
        in_flight: AtomicU64::new(0),
        most_in_flight: AtomicU64::new(0),
        hand_off_lags: Mutex::default(),
    });
    let weights = Arc::new(weights);

    // The janitor on its (scaled) schedules, as the two CronJobs run it, each
    // holding its own lease: a routine run (the pages changed since the
    // last) every hour, and a full run (every page) at the start and once a
    // simulated week, beside the routine ones (the first routine run ran
    // before the clock started). A run starts every interval, or as soon as
    // the last one ended when it took longer.
    let janitor_runs: Arc<Mutex<Vec<JanitorRun>>> = Arc::default();
    // Each service's keyspace, to read the nodes' exact bytes of its tables.
    let keyspaces: Arc<BTreeMap<&'static str, String>> = Arc::new(
        [("current-store", &run.system.current), ("old-store", &run.system.old), ("dependency-graph", &run.system.graph)]
            .into_iter()
            .filter_map(|(name, service)| Some((name, service.keyspace.clone()?)))
            .collect(),
    );
    let janitor_loop = |full: bool, every: Duration| {
        let (run, runs, keyspaces) = (run.clone(), janitor_runs.clone(), keyspaces.clone());
        tokio::spawn(async move {
            let end = Duration::from_secs_f64(days as f64 * run.day_secs);
            let scope = if full { "all" } else { "changed" };
            if !full {
                tokio::time::sleep(every).await;
            }
            while run.started.elapsed() < end {
                let started = Instant::now();
                let system_run = run.clone();
                let output = tokio::task::spawn_blocking(move || system_run.system.janitor(&["--ops-per-sec", "0", "--scope", scope]))
                    .await
                    .expect("janitor");
                let stdout = String::from_utf8_lossy(&output.stdout);
                let summary: Json = stdout.lines().last().and_then(|l| serde_json::from_str(l).ok()).unwrap_or(Json::Null);
                // A routine run that takes long: which task and service, and what the full run did meanwhile.
                if !full && started.elapsed() > Duration::from_secs_f64(run.day_secs / 2.0) {
                    let tasks = summary["tasks"].as_object().into_iter().flatten().map(|(name, t)| {
                        let services = t["services"]
                            .as_object()
                            .into_iter()
                            .flatten()
                            .map(|(service, s)| format!("{service}: {} partitions, {} steps", s["partitions"], s["steps"]));
                        format!("{name} {:.1} s ({})", t["seconds"].as_f64().unwrap_or(f64::NAN), services.collect::<Vec<_>>().join("; "))
                    });
                    println!(
                        "a routine janitor run took {:.1} s (day {:.1}): {}",
                        started.elapsed().as_secs_f64(),
                        run.started.elapsed().as_secs_f64() / run.day_secs,
                        tasks.collect::<Vec<_>>().join(" | ")
                    );
                }
                if !output.status.success() {
                    let stderr = String::from_utf8_lossy(&output.stderr);
                    let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
                    println!(
                        "janitor run ({scope}) ended {:?} after {:.1} s: {}; {}",
                        output.status.code(),
                        started.elapsed().as_secs_f64(),
                        summary["stopped"],
                        tail.join(" | ")
                    );
                }
                // Partitions each service's task visited ("current-store retention").
                let per_task: BTreeMap<String, u64> = summary["tasks"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .flat_map(|(task, t)| {
                        t["services"]
                            .as_object()
                            .into_iter()
                            .flatten()
                            .map(move |(service, s)| (format!("{service} {task}"), s["partitions"].as_u64().unwrap_or(0)))
                    })
                    .collect();
                // A full run's audit reads every table by design (a routine
                // run's reads none); the other tasks' work is what must not
                // grow with the wiki.
                let partitions = per_task.iter().filter(|(name, _)| !name.ends_with(" audit")).map(|(_, n)| n).sum();
                // The disk's figure where the storage reports one (Cassandra);
                // the embedded engine's held bytes count what it has not purged.
                let audit = &summary["tasks"]["audit"];
                let overstore = audit["overstore_on_disk"].as_f64().or_else(|| audit["overstore_ratio"].as_f64());
                // The nodes report a table's disk in whole mebibytes (rounded
                // up, per node): on a soak's tens of mebibytes, a dozen
                // near-empty tables make that a third of the whole. Where the
                // run can ask the nodes for exact bytes, the ratio is taken
                // from those, against the same audit's ideal bytes.
                let exact = match (full, arg("--nodetool")) {
                    (true, Some(nodetool)) => {
                        let keyspaces: Vec<String> = keyspaces.values().cloned().collect();
                        tokio::task::spawn_blocking(move || tablestats_bytes(&nodetool, &keyspaces)).await.ok()
                    }
                    _ => None,
                };
                let mut overstore_exact = None;
                if let (Some(exact), Some(tables)) = (&exact, audit["tables"].as_object()) {
                    let copies = replication_copies();
                    // Per table: (exact bytes of one copy, ideal bytes, the audit's rounded figure).
                    let mut parts: Vec<(u64, u64, u64, &str)> = tables
                        .iter()
                        .filter_map(|(name, t)| {
                            let rounded = t["bytes_on_disk"].as_u64()?;
                            let (service, table) = name.split_once('/')?;
                            let on_disk = exact.get(&(keyspaces.get(service)?.clone(), table.to_owned())).copied().unwrap_or(0) / copies;
                            Some((on_disk, t["bytes_ideal"].as_u64().unwrap_or(0), rounded, name.as_str()))
                        })
                        .collect();
                    // The outbox is judged apart (see `OPEN_WINDOW`): its
                    // window holds the whole run.
                    let open_window = format!("current-store/{OPEN_WINDOW}");
                    let outbox = parts.iter().find(|p| p.3 == open_window).map_or(0, |p| p.0);
                    parts.retain(|p| p.3 != open_window);
                    let (on_disk, ideal): (u64, u64) = parts.iter().fold((0, 0), |(d, i), p| (d + p.0, i + p.1));
                    overstore_exact = (ideal > 0).then(|| on_disk as f64 / ideal as f64);
                    parts.sort_by_key(|p| std::cmp::Reverse(p.0));
                    let mib = |b: u64| b as f64 / 1048576.0;
                    println!("full run's audit: {OPEN_WINDOW} {:.2} MiB on disk, its window open since the run began", mib(outbox));
                    let largest: Vec<String> = parts
                        .iter()
                        .take(6)
                        .map(|(d, i, r, name)| format!("{name} {:.2}/{:.2} (reported {:.0})", mib(*d), mib(*i), mib(*r)))
                        .collect();
                    println!(
                        "full run's audit: {:.1} MiB on disk (the nodes' exact bytes; {:.1} as reported in whole MiB) for {:.1} MiB ideal; largest tables, MiB on disk/ideal: {}",
                        mib(on_disk),
                        mib(parts.iter().map(|p| p.2).sum()),
                        mib(ideal),
                        largest.join("; ")
                    );
                }
                let finished = JanitorRun {
                    full,
                    day: (run.started.elapsed().as_secs_f64() / run.day_secs) as usize,
                    seconds: started.elapsed().as_secs_f64(),
                    partitions,
                    per_task,
                    overstore_on_disk: overstore,
                    overstore_exact,
                    completed: output.status.success(),
                };
                runs.lock().expect("lock").push(finished);
                if let Some(wait) = every.checked_sub(started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
        })
    };
    let routine_janitor = janitor_loop(false, janitor_every);
    let full_janitor = janitor_loop(true, janitor_every * 24 * 7);

    // Full pages of listings, probed: the load's own (a hot template's
    // dependents walked, a page's archived revisions) are full pages a few
    // dozen times a simulated day, too few for a p99 over three days. So
    // LISTING_PROBES times a day a page of the largest domain's most used
    // templates' dependents is listed (they have hundreds from the seed on),
    // timed as the load's listings are.
    let listing_probes = {
        let run = run.clone();
        tokio::spawn(async move {
            let end = Duration::from_secs_f64(days as f64 * run.day_secs);
            let every = Duration::from_secs_f64(run.day_secs / LISTING_PROBES as f64);
            let name = run.domains[0].name.clone();
            for probe in 0u64.. {
                let due = every * probe as u32;
                if due >= end {
                    break;
                }
                if let Some(wait) = due.checked_sub(run.started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
                let template = template_title(probe % 5);
                let url = run.system.graph.url(&format!("/{name}/v1/dependents/{}?limit={LISTING_PAGE}", encode(&template)));
                run.call(Kind::DependentsPage, run.system.http.get(url)).await;
                // And a full page of the news page's archived revisions.
                let url = run.system.old.url(&format!("/{name}/v1/archive/revisions/{NEWS_PAGE}?limit={LISTING_PAGE}"));
                run.call(Kind::Listing, run.system.http.get(url)).await;
            }
        })
    };

    // Each simulated day's row, taken as the next day begins (beside the
    // load, which does not wait for it).
    let stores = Arc::new(stores);
    let sampler = {
        let (run, stores, janitor_runs) = (run.clone(), stores.clone(), janitor_runs.clone());
        tokio::spawn(async move {
            let mut timeline = Vec::new();
            for day in 0..days {
                let end = Duration::from_secs_f64((day + 1) as f64 * run.day_secs);
                if let Some(wait) = end.checked_sub(run.started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
                let row = sample(&run, &stores, day, &janitor_runs).await;
                print_day(&row);
                timeline.push(row);
            }
            timeline
        })
    };

    // The page in the news, at its real rate: an edit every 1-2 simulated
    // minutes, and a read of its latest after each.
    let news = {
        let run = run.clone();
        tokio::spawn(async move {
            let end = Duration::from_secs_f64(days as f64 * run.day_secs);
            let mut rng = StdRng::seed_from_u64(run.seed ^ 0x6e65_7773);
            let mut due = Duration::ZERO;
            let mut edits = tokio::task::JoinSet::new();
            while due < end {
                if let Some(wait) = due.checked_sub(run.started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
                let (run, mut rng_edit) = (run.clone(), StdRng::seed_from_u64(rng.random()));
                edits.spawn(async move {
                    run.render(0, NEWS_PAGE, true, &mut rng_edit).await;
                    let url = run.system.current.url(&format!("/{}/v1/page/html/{NEWS_PAGE}", run.domains[0].name));
                    run.call(Kind::LatestRead, run.system.http.get(url)).await;
                });
                due += Duration::from_secs_f64(rng.random_range(NEWS_EDIT_SECS.0..NEWS_EDIT_SECS.1) / factor);
            }
            while edits.join_next().await.is_some() {}
        })
    };
    // The hand-off lag, probed every simulated hour (each probe a render of
    // its own title, timed into old-store).
    let hand_off_probes = {
        let run = run.clone();
        tokio::spawn(async move {
            let end = Duration::from_secs_f64(days as f64 * run.day_secs);
            let every = Duration::from_secs_f64(run.day_secs / 24.0);
            let mut probes = tokio::task::JoinSet::new();
            for probe in 0u32.. {
                let due = every * probe;
                if due >= end {
                    break;
                }
                if let Some(wait) = due.checked_sub(run.started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
                let run = run.clone();
                probes.spawn(async move {
                    let day = run.day();
                    let lag = hand_off_lag(&run).await;
                    run.hand_off_lags.lock().expect("lock").push((day, lag));
                });
            }
            while probes.join_next().await.is_some() {}
        })
    };

    // The farm's operations, open loop at `rate`: operation i starts at i /
    // rate whatever the answers' pace (nothing waits for a permit first).
    let total_ops = (rate * day_secs * days as f64) as u64;
    let mut operations = tokio::task::JoinSet::new();
    for i in 0..total_ops {
        let due = Duration::from_secs_f64(i as f64 / rate);
        if let Some(wait) = due.checked_sub(run.started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        while operations.try_join_next().is_some() {}
        let (run, weights) = (run.clone(), weights.clone());
        operations.spawn(async move {
            let now = run.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
            run.most_in_flight.fetch_max(now, Ordering::Relaxed);
            run.clone().operation(i, weights).await;
            run.in_flight.fetch_sub(1, Ordering::Relaxed);
        });
    }
    while operations.join_next().await.is_some() {}
    println!(
        "the load: {total_ops} operations open loop at {rate}/s, at most {} in flight at once",
        run.most_in_flight.load(Ordering::Relaxed)
    );
    news.await.expect("the news page");
    hand_off_probes.await.expect("hand-off probes");
    let timeline = sampler.await.expect("sampler");
    routine_janitor.await.expect("routine janitor loop");
    full_janitor.await.expect("full janitor loop");
    listing_probes.await.expect("listing probes");

    // Every acknowledged render's read-back, due within half a grace period.
    let waited = Instant::now();
    while run.read_backs.pending.load(Ordering::Relaxed) > 0 && waited.elapsed() < Duration::from_secs_f64(day_secs + 300.0) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let read_backs = &run.read_backs;
    let (served, excused, lost, pending) = (
        read_backs.served.load(Ordering::Relaxed),
        read_backs.excused.load(Ordering::Relaxed),
        read_backs.lost.load(Ordering::Relaxed),
        read_backs.pending.load(Ordering::Relaxed),
    );
    println!(
        "read-backs of every acknowledged render by (revision, tid) within half its grace: {served} served, {excused} gone with a later \
         deletion or suppression, {lost} lost, {pending} not answered in time"
    );
    for example in read_backs.examples.lock().expect("lock").iter() {
        println!("  lost: {example}");
    }
    let lost = lost + pending;
    // The outbox's window closed (Cassandra): the load has ended, so every
    // hand-off is delivered and every minute's partition deleted two real
    // minutes on (the deliverer deletes a minute once it is past), and the
    // deletions are past their scaled gc_grace.
    let outbox_window = match (arg("--nodetool"), run.system.current.keyspace.clone()) {
        (Some(nodetool), Some(keyspace)) => {
            tokio::time::sleep(Duration::from_secs(120)).await;
            tokio::task::spawn_blocking(move || close_outbox_window(&nodetool, &keyspace)).await.ok()
        }
        _ => None,
    };
    write_csv(&out, engine, &timeline);
    draw(&out, engine, &timeline);
    // The farm's edits per real second over the soak's (its time factor and
    // its load scale, which nearly cancel).
    let scale = Scale {
        real_time_rate: (farm_edits as f64 / 86_400.0) / (edits_per_sim_day / day_secs),
        run_secs: run.started.elapsed().as_secs_f64(),
    };
    // What the services counted that the soak's own answers do not show:
    // answers they gave one another (the outbox's calls) that were not 2xx,
    // requests shed, the outbox's own figures.
    for service in [&run.system.current, &run.system.old, &run.system.graph] {
        let Ok(response) = run.system.http.get(service.url("/metrics")).send().await else { continue };
        let text = response.text().await.unwrap_or_default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let notable = line.starts_with("outbox_") || line.contains("shed") || line.contains("status=\"5");
            if notable && !line.ends_with(" 0") {
                println!("{}: {line}", service.name);
            }
        }
    }
    let findings = Findings {
        days,
        engine,
        warn_threshold,
        scale,
        acknowledged: run.acknowledged.load(Ordering::Relaxed),
        lost,
        hand_off_lags: run.hand_off_lags.lock().expect("lock").clone(),
        outbox_window,
    };
    let verdicts = targets(&timeline, &findings);
    print!("{}", verdicts.report());
    if !verdicts.passed() {
        std::process::exit(1);
    }
}

/// The day's row, taken once the day has ended: the nodes' figures, the
/// day's latencies, a probe's hand-off lag, the janitor's runs that ended in
/// the day.
async fn sample(run: &Run, stores: &[(&'static str, Store)], day: usize, janitor_runs: &Mutex<Vec<JanitorRun>>) -> Timeline {
    // No flush: the nodes flush and compact on their own schedule in the
    // measured window, as in production (a day's figures are the SSTables'
    // as the nodes left them).
    let tables = table_figures(stores).await;
    let lags: Vec<f64> = run.hand_off_lags.lock().expect("lock").iter().filter(|(d, _)| *d == day).map(|(_, lag)| *lag).collect();
    let lag = lags.iter().copied().fold(f64::NAN, f64::max);
    // The renders the page in the news holds (its partition of `page_renders`).
    let url = run.system.current.url(&format!("/{}/v1/page/revisions/{NEWS_PAGE}", run.domains[0].name));
    let news_page_renders = match run.system.http.get(url).send().await {
        Ok(response) if response.status().is_success() => {
            response.json::<Json>().await.ok().and_then(|listed| listed["items"].as_array().map(Vec::len))
        }
        _ => None,
    };
    let (stats, janitor) = {
        let mut days = run.days.lock().expect("lock");
        while days.len() <= day {
            days.push(DayStats::default());
        }
        let stats = std::mem::take(&mut days[day]);
        let runs = janitor_runs.lock().expect("lock");
        let today: Vec<JanitorRun> = runs.iter().filter(|r| r.completed && r.day == day).cloned().collect();
        (stats, today)
    };
    let routine: Vec<&JanitorRun> = janitor.iter().filter(|r| !r.full).collect();
    let full_run = janitor.iter().rev().find(|r| r.full);
    let mean = |f: &dyn Fn(&JanitorRun) -> f64| {
        if routine.is_empty() { f64::NAN } else { routine.iter().map(|r| f(r)).sum::<f64>() / routine.len() as f64 }
    };
    let mut day_tasks: BTreeMap<String, u64> = BTreeMap::new();
    for r in &routine {
        for (task, n) in &r.per_task {
            *day_tasks.entry(task.clone()).or_default() += n;
        }
    }
    let tasks: BTreeMap<String, u64> = day_tasks.iter().map(|(task, n)| (task.clone(), n / routine.len().max(1) as u64)).collect();
    let p99 = |v: &[Duration]| {
        let mut v = v.to_vec();
        v.sort();
        percentile_ms(&v, 0.99)
    };
    let (overstore, overstore_exact) = janitor_runs
        .lock()
        .expect("lock")
        .iter()
        .rev()
        .filter(|r| r.full && r.day <= day)
        .find(|r| r.overstore_on_disk.is_some())
        .map_or((None, None), |r| (r.overstore_on_disk, r.overstore_exact));
    Timeline {
        day,
        tables,
        latest_p99_ms: p99(&stats.latest_reads),
        write_p99_ms: p99(&stats.render_writes),
        listing_p99_ms: p99(&stats.listings),
        old_read_p99_ms: p99(&stats.old_reads),
        hand_off_lag_secs: lag,
        janitor_secs: mean(&|r| r.seconds),
        janitor_partitions: mean(&|r| r.partitions as f64).round() as u64,
        janitor_runs: routine.len(),
        janitor_day_partitions: routine.iter().map(|r| r.partitions).sum(),
        janitor_day_change_retention: routine.iter().map(|r| r.per_task.get(CHANGE_RETENTION_TASK).copied().unwrap_or(0)).sum(),
        janitor_tasks: tasks,
        janitor_day_tasks: day_tasks,
        news_page_renders,
        full_run_secs: full_run.map_or(f64::NAN, |r| r.seconds),
        full_run_partitions: full_run.map_or(0, |r| r.partitions),
        overstore_on_disk: overstore,
        overstore_exact,
        server_errors: stats.server_errors,
        answers: stats.answers,
        data_dir_bytes: dir_bytes(run.system.dir()),
        samples: Samples {
            latest_reads: stats.latest_reads,
            render_writes: stats.render_writes,
            full_listings: stats.full_listings,
            dependents_pages: stats.dependents_pages,
        },
    }
}

/// Bytes of each table's SSTables summed over the nodes, by (keyspace,
/// table): `CMD tablestats -F json KEYSPACE...` (the command runs nodetool on
/// every node in turn; each prints one JSON document after its JVM's log
/// lines). Empty when it cannot be run.
fn tablestats_bytes(nodetool: &str, keyspaces: &[String]) -> BTreeMap<(String, String), u64> {
    let command = format!("{nodetool} tablestats -F json {}", keyspaces.join(" "));
    let mut bytes = BTreeMap::new();
    let Ok(output) = std::process::Command::new("sh").arg("-c").arg(&command).output() else { return bytes };
    let text = String::from_utf8_lossy(&output.stdout);
    let mut rest: &str = &text;
    loop {
        let start = if rest.starts_with('{') {
            0
        } else {
            match rest.find("\n{") {
                Some(at) => at + 1,
                None => break,
            }
        };
        let mut documents = serde_json::Deserializer::from_str(&rest[start..]).into_iter::<Json>();
        let Some(Ok(node)) = documents.next() else { break };
        for (keyspace, figures) in node.as_object().into_iter().flatten() {
            for (table, t) in figures["tables"].as_object().into_iter().flatten() {
                let used = &t["space_used_total"];
                let used = used.as_u64().or_else(|| used.as_str().and_then(|s| s.parse().ok())).unwrap_or(0);
                *bytes.entry((keyspace.clone(), table.clone())).or_insert(0) += used;
            }
        }
        rest = &rest[start + documents.byte_offset()..];
    }
    bytes
}

/// The table whose time window the run cannot close (see the module's
/// header), judged apart from the overstore: its deliverers delete a
/// minute's partition once its hand-offs are delivered, and the rows leave
/// the disk when the compaction of a closed window (time-window compaction
/// makes one SSTable of a past window) merges them with those deletions. On
/// the farm the 28-hour window holds about a day of hand-offs, a sliver of
/// the wiki; here the whole run is one open window, holding every hand-off
/// of three simulated weeks. At the end of the run the window is closed as
/// time would close it (`nodetool compact` of the table) and what it keeps
/// is measured.
const OPEN_WINDOW: &str = "outbox_by_minute";

/// Closes the outbox's window as time would (see [`OPEN_WINDOW`]) once every
/// minute's partition is past and its scaled gc_grace has passed, and
/// reports the table's bytes (all copies) before and after.
fn close_outbox_window(nodetool: &str, keyspace: &str) -> (u64, u64) {
    let bytes =
        || tablestats_bytes(nodetool, &[keyspace.to_owned()]).get(&(keyspace.to_owned(), OPEN_WINDOW.to_owned())).copied().unwrap_or(0);
    let flush = format!("{nodetool} flush {keyspace} {OPEN_WINDOW}");
    let output = std::process::Command::new("sh").arg("-c").arg(&flush).output().expect("nodetool");
    assert!(output.status.success(), "{flush}: {}", String::from_utf8_lossy(&output.stderr));
    let before = bytes();
    let compact = format!("{nodetool} compact {keyspace} {OPEN_WINDOW}");
    let output = std::process::Command::new("sh").arg("-c").arg(&compact).output().expect("nodetool");
    assert!(output.status.success(), "{compact}: {}", String::from_utf8_lossy(&output.stderr));
    (before, bytes())
}

/// Copies of each row the keyspaces keep: the replication factors of
/// `REVSTORE_CASSANDRA_REPLICATION` (`3`, `datacenter1:3`, `dc1:2,dc2:2`) added up.
fn replication_copies() -> u64 {
    let replication = std::env::var("REVSTORE_CASSANDRA_REPLICATION").unwrap_or_default();
    let factors = replication.split(',').filter_map(|part| part.rsplit(':').next()?.trim().parse::<u64>().ok());
    factors.sum::<u64>().max(1)
}

fn print_day(t: &Timeline) {
    let worst = t.tables.iter().max_by_key(|(_, d)| d.tombstones_max);
    println!(
        "day {:>3}: answers {:>7}, 5xx {}; p99 latest {:.1} ms, write {:.1} ms, listing {:.1} ms, old {:.1} ms; hand-off {:.2} s; \
         janitor: {} routine runs, {:.2} s over {} partitions a run ({}; {} in the day), full run {:.1} s over {}; overstore on disk {}; \
         most tombstones/read {} ({}); data dirs {:.1} MiB",
        t.day,
        t.answers,
        t.server_errors,
        t.latest_p99_ms,
        t.write_p99_ms,
        t.listing_p99_ms,
        t.old_read_p99_ms,
        t.hand_off_lag_secs,
        t.janitor_runs,
        t.janitor_secs,
        t.janitor_partitions,
        t.janitor_tasks.iter().map(|(task, n)| format!("{task} {n}")).collect::<Vec<_>>().join(", "),
        t.janitor_day_partitions,
        t.full_run_secs,
        t.full_run_partitions,
        match (t.overstore_on_disk, t.overstore_exact) {
            (_, Some(exact)) => format!("{exact:.2} (exact bytes)"),
            (Some(reported), None) => format!("{reported:.2}"),
            (None, None) => "-".to_owned(),
        },
        worst.map_or(0, |(_, d)| d.tombstones_max),
        worst.map_or("-", |(name, _)| name.as_str()),
        t.data_dir_bytes as f64 / 1048576.0,
    );
}

/// The outbox's settle in production (`REVSTORE_OUTBOX_SETTLE`).
const OUTBOX_SETTLE_SECS: f64 = 600.0;
/// The least the soak scales it to: above the outbox's margin (the clock
/// skew allowed, scaled, and a storage write's timeout), within which rows
/// arrive late.
const OUTBOX_SETTLE_FLOOR_SECS: f64 = 15.0;
/// How long current-store's hand-off check leaves a revision to the outbox
/// in production (`REVSTORE_HAND_OFF_CHECK_AFTER`).
const HAND_OFF_CHECK_AFTER_SECS: f64 = 300.0;
/// The least the soak scales it to: the outbox delivers in real time (its
/// hand-offs' p99 is under a second here), and a check sooner than the
/// delivery sends old-store repeats.
const HAND_OFF_CHECK_AFTER_FLOOR_SECS: f64 = 15.0;

/// How long the dependency graph keeps a change (its
/// `REVSTORE_GRAPH_CHANGE_RETENTION_SECS`), in simulated days: its janitor
/// task visits a changed page once its changes are that old. Production
/// keeps 30 days; the soak keeps 3, so that the task reaches its steady work
/// (every day, the pages changed that many days before) within a run rather
/// than after a month: the work of a day is the same whatever the wait. The
/// seed's changes, made in a few real minutes before day 1, fall due
/// together as a wave on days 3-4, before the task's baseline (days 9-11).
const GRAPH_CHANGE_RETENTION_DAYS: f64 = 3.0;
/// The embedded engine's purge interval in production (`REVSTORE_PURGE_INTERVAL_SECS`).
const PURGE_INTERVAL_SECS: f64 = 600.0;
/// Old-store's debt sweep interval in production (`REVSTORE_DEBT_SWEEP_SECS`).
const DEBT_SWEEP_SECS: f64 = 300.0;
/// The janitor summary's name for that task, as `per_task` keys it.
const CHANGE_RETENTION_TASK: &str = "dependency-graph retention";

fn write_csv(out: &std::path::Path, engine: Engine, timeline: &[Timeline]) {
    let tables: Vec<String> =
        timeline.iter().flat_map(|t| t.tables.keys().cloned()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let mut csv = String::from(
        "day,answers,server_errors,latest_p99_ms,write_p99_ms,listing_p99_ms,old_read_p99_ms,hand_off_lag_secs,routine_runs,routine_run_secs,routine_run_partitions,routine_day_partitions,full_run_secs,full_run_partitions,overstore_on_disk,overstore_on_disk_exact,data_dir_bytes",
    );
    let tasks: Vec<String> =
        timeline.iter().flat_map(|t| t.janitor_tasks.keys().cloned()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    for task in &tasks {
        csv.push_str(&format!(",routine {task} partitions"));
    }
    for table in &tables {
        csv.push_str(&format!(",{table} tombstones_max,{table} tombstones_p99,{table} largest_partition,{table} bytes_on_disk"));
    }
    csv.push('\n');
    for t in timeline {
        csv.push_str(&format!(
            "{},{},{},{:.2},{:.2},{:.2},{:.2},{:.3},{},{:.3},{},{},{:.2},{},{},{},{}",
            t.day,
            t.answers,
            t.server_errors,
            t.latest_p99_ms,
            t.write_p99_ms,
            t.listing_p99_ms,
            t.old_read_p99_ms,
            t.hand_off_lag_secs,
            t.janitor_runs,
            t.janitor_secs,
            t.janitor_partitions,
            t.janitor_day_partitions,
            t.full_run_secs,
            t.full_run_partitions,
            t.overstore_on_disk.map_or(String::new(), |r| format!("{r:.3}")),
            t.overstore_exact.map_or(String::new(), |r| format!("{r:.3}")),
            t.data_dir_bytes
        ));
        for task in &tasks {
            csv.push_str(&format!(",{}", t.janitor_tasks.get(task).copied().unwrap_or(0)));
        }
        for table in &tables {
            let d = t.tables.get(table).cloned().unwrap_or_default();
            csv.push_str(&format!(",{},{},{},{}", d.tombstones_max, d.tombstones_p99, d.largest_partition, d.bytes_on_disk));
        }
        csv.push('\n');
    }
    let path = out.join(format!("soak-{}.csv", engine_name(engine)));
    std::fs::write(&path, csv).expect("write the timeline");
    println!("timeline: {}", path.display());
}

fn engine_name(engine: Engine) -> &'static str {
    match engine {
        Engine::Embedded => "embedded",
        Engine::Cassandra => "cassandra",
    }
}

fn draw(out: &std::path::Path, engine: Engine, timeline: &[Timeline]) {
    let name = engine_name(engine);
    let day = |t: &Timeline| t.day as f64 + 1.0;
    let latencies = LineChart {
        title: format!("p99 per simulated day ({name})"),
        x_label: "simulated day".into(),
        y_label: "ms".into(),
        log_y: false,
        series: vec![
            Series::new("latest read", timeline.iter().map(|t| (day(t), t.latest_p99_ms)).filter(|p| p.1.is_finite()).collect()),
            Series::new("render write", timeline.iter().map(|t| (day(t), t.write_p99_ms)).filter(|p| p.1.is_finite()).collect()),
            Series::new("listing", timeline.iter().map(|t| (day(t), t.listing_p99_ms)).filter(|p| p.1.is_finite()).collect()),
        ],
    };
    let _ = latencies.write(&out.join(format!("soak-{name}-latency.svg")));
    let janitor = LineChart {
        title: format!("janitor runs and hand-off lag per simulated day ({name})"),
        x_label: "simulated day".into(),
        y_label: "seconds".into(),
        log_y: false,
        series: vec![
            Series::new("routine run (mean)", timeline.iter().map(|t| (day(t), t.janitor_secs)).filter(|p| p.1.is_finite()).collect()),
            Series::new("full run", timeline.iter().map(|t| (day(t), t.full_run_secs)).filter(|p| p.1.is_finite()).collect()),
            Series::new("hand-off lag", timeline.iter().map(|t| (day(t), t.hand_off_lag_secs)).filter(|p| p.1.is_finite()).collect()),
        ],
    };
    let _ = janitor.write(&out.join(format!("soak-{name}-janitor.svg")));
    let work = LineChart {
        title: format!("janitor: partitions visited per simulated day ({name})"),
        x_label: "simulated day".into(),
        y_label: "partitions".into(),
        log_y: false,
        series: vec![
            Series::new("routine runs, the day's together", timeline.iter().map(|t| (day(t), t.janitor_day_partitions as f64)).collect()),
            Series::new(
                "of which the graph's change retention",
                timeline.iter().map(|t| (day(t), t.janitor_day_change_retention as f64)).collect(),
            ),
            Series::new(
                "a full run (every page)",
                timeline.iter().filter(|t| t.full_run_partitions > 0).map(|t| (day(t), t.full_run_partitions as f64)).collect(),
            ),
        ],
    };
    let _ = work.write(&out.join(format!("soak-{name}-janitor-work.svg")));
    if engine == Engine::Cassandra {
        let mut worst: Vec<(String, u64)> =
            timeline.last().map(|t| t.tables.iter().map(|(n, d)| (n.clone(), d.tombstones_max)).collect()).unwrap_or_default();
        worst.sort_by_key(|(_, most)| std::cmp::Reverse(*most));
        let series = worst
            .iter()
            .take(5)
            .map(|(table, _)| {
                Series::new(
                    table.clone(),
                    timeline.iter().map(|t| (day(t), t.tables.get(table).map_or(0.0, |d| d.tombstones_max as f64))).collect(),
                )
            })
            .collect();
        let tombstones = LineChart {
            title: "most tombstones scanned by one read".into(),
            x_label: "simulated day".into(),
            y_label: "tombstones".into(),
            log_y: false,
            series,
        };
        let _ = tombstones.write(&out.join(format!("soak-{name}-tombstones.svg")));
    }
}

/// Cassandra's own `tombstone_warn_threshold`, before the soak's nodes divide it.
const CASSANDRA_TOMBSTONE_WARN: u64 = 1_000;
/// Tables whose partitions are spans of real time (the outbox's minutes, the
/// debt's hours, the journal's minutes). The soak fills such a partition at
/// its own rate per real second, not per simulated day, so the most
/// tombstones one read of it scans is compared with the farm's by that rate,
/// against Cassandra's unscaled warning.
const REAL_TIME_BUCKETS: [&str; 3] = ["outbox_by_minute", "archive_debt_by_hour", "janitor_journal"];
/// Tables whose tombstones per partition a structure bounds, not time: a
/// block of `archive_blocks` holds one range deletion per compaction of it (a
/// few levels), and a range scan of the full run steps over those of the
/// blocks in its page. Held to the unscaled warning.
const STRUCTURALLY_BOUNDED: [&str; 1] = ["archive_blocks"];

/// Real seconds a real-time bucket spans, by table.
fn bucket_secs(table: &str) -> f64 {
    if table == "archive_debt_by_hour" { 3600.0 } else { 60.0 }
}

/// How the soak's load compares with the farm's, for the tombstone verdict.
#[derive(Debug, Clone, Copy)]
struct Scale {
    /// Farm edits per real second over the soak's.
    real_time_rate: f64,
    /// Real seconds the soak ran: a bucket longer than the run is filled
    /// only as far as the run went.
    run_secs: f64,
}

impl Scale {
    /// The most tombstones one read of a full real-time bucket would scan on
    /// the farm, from the most the soak's reads scanned: the farm's rate over
    /// the soak's, and a bucket the run did not fill extrapolated to full.
    fn farm_bucket(&self, table: &str, measured: u64) -> u64 {
        let span = bucket_secs(table);
        let filled = span / span.min(self.run_secs);
        (measured as f64 * self.real_time_rate * filled).ceil() as u64
    }
}

/// What the run's verdicts are read from, beside its timeline.
struct Findings {
    days: usize,
    engine: Engine,
    /// The node's tombstone warning (Cassandra), and whether it could be read.
    warn_threshold: Option<u64>,
    scale: Scale,
    acknowledged: u64,
    /// Acknowledged renders not served when read back, and not excused.
    lost: u64,
    hand_off_lags: Vec<(usize, f64)>,
    /// The outbox's bytes with its window open and closed (`--nodetool`).
    outbox_window: Option<(u64, u64)>,
}

/// The simulated day from which a full janitor run's overstore is judged:
/// after the first grace period on the embedded engine (it frees space as it
/// deletes); on Cassandra after the first gc_grace (ten simulated days): what
/// a delete removes leaves the disk only then.
fn overstore_settled_day(engine: Engine) -> usize {
    if engine == Engine::Cassandra { 10 } else { 1 }
}

/// Full janitor runs the overstore is judged by, at the least.
const OVERSTORE_RUNS: usize = 3;

/// The most renders the page in the news may hold: those of its grace
/// period (a simulated day), the clock skew allowed, and an hour's more
/// before the routine janitor run after its grace sweeps them
/// (`docs/design/current-store-writes.md`, "Retention"), plus that run's own
/// hour, at its fastest edit rate.
fn news_page_bound() -> usize {
    ((86_400.0 + 300.0 + 2.0 * 3_600.0) / NEWS_EDIT_SECS.0).ceil() as usize + 1
}

/// The targets, each judged: see the module's header.
fn targets(timeline: &[Timeline], findings: &Findings) -> Verdicts {
    let mut verdicts = Verdicts::new(findings.days);
    if timeline.len() < findings.days {
        verdicts.not_judged("the run", format!("{} of {} simulated days sampled", timeline.len(), findings.days));
        return verdicts;
    }
    // Latency, per operation.
    for (operation, pick) in [
        ("latest reads", (|s: &Samples| s.latest_reads.clone()) as fn(&Samples) -> Vec<Duration>),
        ("render writes", |s: &Samples| s.render_writes.clone()),
        ("full listings of a page's archived revisions", |s: &Samples| s.full_listings.clone()),
        ("full pages of a template's dependents", |s: &Samples| s.dependents_pages.clone()),
    ] {
        let days: Vec<Vec<Duration>> = timeline.iter().map(|t| pick(&t.samples)).collect();
        judge_latency(&mut verdicts, operation, &days);
    }
    // Tombstones and partitions (Cassandra: the nodes' own figures).
    if findings.engine == Engine::Cassandra {
        judge_tables(&mut verdicts, timeline, findings);
    }
    // The page in the news: its partition holds its grace period and the janitor's cadence.
    let bound = news_page_bound();
    let held: Vec<Option<usize>> = timeline.iter().skip(1).map(|t| t.news_page_renders).collect();
    let target = format!("the page in the news: renders held from day 2 on within the design's bound, {bound}");
    match held.iter().copied().collect::<Option<Vec<usize>>>() {
        Some(held) if !held.is_empty() => {
            let most = held.iter().copied().max().unwrap_or(0);
            verdicts.judge(&target, format!("at most {most} (by day: {held:?})"), most <= bound);
        }
        _ => verdicts.not_judged(&target, format!("its renders could not be listed every day: {held:?}")),
    }
    // The hand-off lag: every day's p99 of its probes.
    let target = "hand-off lag: every day's p99 of the hourly probes at most 5 s";
    let by_day: Vec<Vec<Duration>> = (0..findings.days)
        .map(|day| findings.hand_off_lags.iter().filter(|(d, _)| *d == day).map(|(_, s)| Duration::from_secs_f64(s.min(3600.0))).collect())
        .collect();
    let failed = findings.hand_off_lags.iter().filter(|(_, s)| !s.is_finite()).count();
    if by_day.iter().any(Vec::is_empty) {
        verdicts.not_judged(target, "a day without a probe");
    } else {
        let p99s: Vec<f64> = by_day.iter().map(|d| p99_ms(d) / 1000.0).collect();
        let worst = p99s.iter().copied().fold(0.0, f64::max);
        let listed: Vec<String> = p99s.iter().map(|s| format!("{s:.2}")).collect();
        verdicts.judge(
            target,
            format!("p99 by day {} s; {failed} probes not written or never archived", listed.join(", ")),
            worst <= 5.0 && failed == 0,
        );
    }
    judge_janitor(&mut verdicts, timeline, findings);
    let errors: u64 = timeline.iter().map(|t| t.server_errors).sum();
    verdicts.judge("5xx answers: none", format!("{errors}"), errors == 0);
    verdicts.judge(
        "acknowledged writes lost: none",
        format!("{} of {} acknowledged renders", findings.lost, findings.acknowledged),
        findings.lost == 0 && findings.acknowledged > 0,
    );
    verdicts
}

/// The janitor: every task's routine work flat, and the overstore on disk by
/// every full run after the store settled.
fn judge_janitor(verdicts: &mut Verdicts, timeline: &[Timeline], findings: &Findings) {
    let tasks: std::collections::BTreeSet<&String> = timeline.iter().flat_map(|t| t.janitor_day_tasks.keys()).collect();
    let routine_target = "janitor: routine runs on their hourly schedule, every simulated day";
    if timeline.iter().any(|t| t.janitor_runs == 0) || tasks.is_empty() {
        verdicts.not_judged(routine_target, "a day without a completed routine run");
    } else {
        let runs: Vec<usize> = timeline.iter().map(|t| t.janitor_runs).collect();
        // The schedule fires 24 times a simulated day; a run that takes longer than the interval delays the next.
        verdicts.judge(routine_target, format!("completed runs by day {runs:?}"), runs.iter().all(|n| *n >= 12));
    }
    for task in tasks.into_iter().filter(|t| !t.ends_with(" audit")) {
        let per_day: Vec<u64> = timeline.iter().map(|t| t.janitor_day_tasks.get(task).copied().unwrap_or(0)).collect();
        judge_janitor_task(verdicts, task, &per_day);
    }
    let settled = overstore_settled_day(findings.engine);
    let target = format!("overstore on disk at most 1.3 by every full janitor run after day {settled}, at least {OVERSTORE_RUNS} of them");
    // Full runs are weekly: three after the store settled need three weeks past it.
    if !verdicts.within_run(&target, settled + 7 * OVERSTORE_RUNS + 1) {
        return;
    }
    let runs: Vec<(usize, f64)> = timeline
        .iter()
        .filter(|t| t.day >= settled && t.full_run_partitions > 0)
        .filter_map(|t| Some((t.day + 1, t.overstore_exact.or(t.overstore_on_disk)?)))
        .collect();
    if runs.len() < OVERSTORE_RUNS {
        verdicts.not_judged(&target, format!("{} full runs with an overstore figure after day {settled}", runs.len()));
        return;
    }
    let worst = runs.iter().map(|r| r.1).fold(0.0, f64::max);
    let listed: Vec<String> = runs.iter().map(|(day, r)| format!("day {day} {r:.2}")).collect();
    verdicts.judge(&target, listed.join(", "), worst <= 1.3);
}

/// Tombstones per read and partition sizes, per table, by what its
/// partitions hold (see the module's header); the outbox's closed window.
fn judge_tables(verdicts: &mut Verdicts, timeline: &[Timeline], findings: &Findings) {
    let target = "tombstones per read: every table within its threshold and flat after gc_grace";
    let Some(threshold) = findings.warn_threshold else {
        verdicts.not_judged(target, "the node's tombstone warning threshold could not be read");
        return;
    };
    let declared: usize = ["current-store", "old-store", "dependency-graph"]
        .iter()
        .filter_map(|service| revstore_schema::version::component(service))
        .map(|c| c.tables.len())
        .sum();
    if let Some(short) = timeline.iter().find(|t| t.tables.len() < declared) {
        let why = format!("day {}: the nodes gave figures of {} of {declared} tables", short.day + 1, short.tables.len());
        verdicts.not_judged(target, why);
        return;
    }
    let gc_grace_days = 10usize;
    let mut missed = Vec::new();
    let tables: std::collections::BTreeSet<&String> = timeline.iter().flat_map(|t| t.tables.keys()).collect();
    for table in &tables {
        let most = |days: &[Timeline]| days.iter().filter_map(|t| t.tables.get(*table)).map(|d| d.tombstones_max).max().unwrap_or(0);
        let worst = most(timeline);
        let short = table.rsplit('/').next().unwrap_or(table);
        let real_time = REAL_TIME_BUCKETS.contains(&short);
        let (equivalent, limit) = if real_time {
            (findings.scale.farm_bucket(short, worst), CASSANDRA_TOMBSTONE_WARN)
        } else if STRUCTURALLY_BOUNDED.contains(&short) {
            (worst, CASSANDRA_TOMBSTONE_WARN)
        } else {
            (worst, threshold)
        };
        // Flat once gc_grace has let the first deletions go (a real-time
        // bucket starts empty each minute or hour: its bound is the full one).
        let settled: Vec<Timeline> = timeline.iter().filter(|t| t.day >= gc_grace_days).take(3).cloned().collect();
        let late = most(&timeline[timeline.len().saturating_sub(3)..]);
        let growing = !real_time && !settled.is_empty() && late > (most(&settled) as f64 * 1.2).ceil() as u64 + 2;
        if equivalent > limit || growing {
            missed.push(format!("{table} {worst} a read ({equivalent} against {limit}{})", if growing { ", growing" } else { "" }));
        }
    }
    verdicts.judge(target, if missed.is_empty() { format!("{} tables", tables.len()) } else { missed.join("; ") }, missed.is_empty());
    let largest = timeline.iter().flat_map(|t| t.tables.values().map(|d| d.largest_partition)).max().unwrap_or(0);
    verdicts.judge("largest partition at most 100 MB", format!("{:.2} MiB", largest as f64 / 1048576.0), largest <= 100_000_000);
    let target = "the outbox once its window closes: under 1% of what it held open";
    match findings.outbox_window {
        Some((open, closed)) => {
            let mib = |b: u64| b as f64 / 1048576.0;
            verdicts.judge(target, format!("{:.2} MiB open, {:.3} MiB closed", mib(open), mib(closed)), closed * 100 <= open);
        }
        None => verdicts.not_judged(target, "no --nodetool to close it with"),
    }
}
