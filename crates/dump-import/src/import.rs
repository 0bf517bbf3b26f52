//! The writers: revisions parsed from the dump, archived in old-store, and
//! each page's dependency set (the pages its latest revision transcludes)
//! written to the dependency graph; or both read back and compared, to verify
//! an import.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use revstore_api::graph::{Edge, EdgeSet};
use revstore_api::{ArchiveBody, ChangeKind, Part, Selection};
use revstore_client::{Archived, ClientError, GraphClient, OldStoreClient};
use revstore_keys::Tid;
use tokio::sync::mpsc;

use crate::dump::{DumpError, Limits, Revision, cut, read_dump, shown};
use crate::templates::transclusions;

/// Archive the dump, or check that old-store returns every revision as the dump has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Import,
    Verify,
}

#[derive(Debug, Clone)]
pub struct ImportOptions {
    pub dump: PathBuf,
    /// The wiki's domain; `None` takes it from the dump's siteinfo.
    pub domain: Option<String>,
    /// Pages written at the same time.
    pub writers: usize,
    pub mode: Mode,
    /// Where each page's template dependencies go; `None`: old-store only.
    pub dependencies: Option<Dependencies>,
    /// How large a revision the reader takes (larger ones are skipped).
    pub limits: Limits,
}

/// The dependency graph an import writes page → template edges to.
#[derive(Debug, Clone)]
pub struct Dependencies {
    pub graph: GraphClient,
    /// The priority of every edge written (0 pull … 1000 push).
    pub priority: i64,
    /// The most edges one page's set may have (the graph's
    /// `REVSTORE_GRAPH_MAX_EDGES`); a page transcluding more keeps the first.
    pub max_edges: usize,
}

/// What an import (or a verification) did.
#[derive(Debug, Default)]
pub struct ImportSummary {
    pub pages: u64,
    pub revisions: u64,
    /// Archived now.
    pub stored: AtomicU64,
    /// Already archived (an import run again), or skipped by old-store's policy.
    pub already: AtomicU64,
    /// Revisions whose text the dump hides.
    pub hidden: AtomicU64,
    /// Revisions the import cannot take (a bad id or time, a text too large,
    /// a title too long), each said once.
    pub skipped: u64,
    /// Transclusion names that are no title (`{{%41}}`), left out of their
    /// page's set; and edges left out of sets over the limit.
    pub names_skipped: AtomicU64,
    pub edges_over_limit: AtomicU64,
    /// Verification: revisions read back identical, and different or missing.
    pub identical: AtomicU64,
    pub mismatched: AtomicU64,
    pub failed: AtomicU64,
    /// Dependency sets written (or read back identical), and their edges.
    pub dependency_sets: AtomicU64,
    pub dependency_edges: AtomicU64,
    pub text_bytes: AtomicU64,
    pub elapsed: Duration,
}

impl std::fmt::Display for ImportSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        writeln!(
            f,
            "pages {}, revisions {}, wikitext {:.1} MB, {:.1} s, {:.0} revisions/s",
            self.pages,
            self.revisions,
            n(&self.text_bytes) as f64 / 1e6,
            secs,
            self.revisions as f64 / secs
        )?;
        write!(
            f,
            "stored {}, already there {}, text hidden in the dump {}, skipped {}, read back identical {}, different or missing {}, failed {}; \
             dependency sets {} with {} template edges ({} names that are no title and {} edges over the limit left out)",
            n(&self.stored),
            n(&self.already),
            n(&self.hidden),
            self.skipped,
            n(&self.identical),
            n(&self.mismatched),
            n(&self.failed),
            n(&self.dependency_sets),
            n(&self.dependency_edges),
            n(&self.names_skipped),
            n(&self.edges_over_limit)
        )
    }
}

/// Work for a writer: a revision, or a page's dependency set (sent after
/// the page's last revision).
#[derive(Debug)]
enum Job {
    Revision { domain: Arc<str>, revision: Revision },
    Dependencies { domain: Arc<str>, title: String, parents: Vec<String> },
}

/// The newest revision with text of the page the parser is in.
#[derive(Debug)]
struct PageSoFar {
    domain: Arc<str>,
    title: String,
    latest: Option<(u64, String)>,
}

impl PageSoFar {
    /// The page's dependency set, from its latest revision's transclusions,
    /// with the page's title as the dump gives it; `None` when no revision of
    /// it shows its text.
    fn into_job(self) -> Option<(String, Job)> {
        let (_, text) = self.latest?;
        let title = self.title.replace(' ', "_");
        // A page showing itself (`{{:Main Page}}` on Main Page) is no edge of the graph.
        let parents = transclusions(&text).into_iter().filter(|parent| *parent != title).collect();
        let job = Job::Dependencies { domain: self.domain, title, parents };
        Some((self.title, job))
    }
}

/// Runs the import. `progress` is told the bytes of XML parsed (of a total
/// when known) and each revision done. Fails on an unreadable dump; failed
/// revisions are counted in the summary.
pub async fn run_import(
    client: OldStoreClient,
    options: ImportOptions,
    progress: impl FnMut(u64, Option<u64>) + Send + 'static,
) -> Result<ImportSummary, DumpError> {
    let started = Instant::now();
    let summary = Arc::new(ImportSummary::default());
    let writers = options.writers.max(1);
    let mut queues = Vec::with_capacity(writers);
    let mut tasks = Vec::with_capacity(writers);
    for _ in 0..writers {
        // A small queue per writer: the parser waits for the slowest one, so
        // memory stays bounded.
        let (tx, rx) = mpsc::channel::<Job>(16);
        queues.push(tx);
        tasks.push(tokio::spawn(writer(client.clone(), options.dependencies.clone(), options.mode, rx, summary.clone())));
    }
    let domain_override = options.domain.clone();
    let path = options.dump.clone();
    let with_dependencies = options.dependencies.is_some();
    let parsed = tokio::task::spawn_blocking(move || {
        let mut domain: Option<Arc<str>> = domain_override.map(Arc::from);
        let mut page: Option<PageSoFar> = None;
        // Every job of a page goes to the same writer, in dump order.
        let queue_of = |title: &str| {
            let mut hasher = DefaultHasher::new();
            title.hash(&mut hasher);
            &queues[(hasher.finish() % queues.len() as u64) as usize]
        };
        let send = |job: Job, title: &str| queue_of(title).blocking_send(job).map_err(|_| "a writer stopped".to_owned());
        let limits = options.limits;
        let parsed = read_dump(&path, limits, progress, |info, item| {
            let revision = match item {
                Ok(revision) => revision,
                Err(skipped) => {
                    eprintln!("revstore import: {skipped}");
                    return Ok(());
                }
            };
            let domain = match &domain {
                Some(d) => d.clone(),
                None => {
                    let d: Arc<str> = Arc::from(info.domain().ok_or("the dump names no site (<base>); pass --domain")?);
                    domain = Some(d.clone());
                    d
                }
            };
            if with_dependencies {
                if page.as_ref().is_some_and(|p| p.title != revision.title)
                    && let Some((title, job)) = page.take().and_then(PageSoFar::into_job)
                {
                    send(job, &title)?;
                }
                let current = page.get_or_insert_with(|| PageSoFar { domain: domain.clone(), title: revision.title.clone(), latest: None });
                if let Some(text) = &revision.text
                    && current.latest.as_ref().is_none_or(|(rev, _)| revision.rev_id > *rev)
                {
                    current.latest = Some((revision.rev_id, text.clone()));
                }
            }
            let title = revision.title.clone();
            send(Job::Revision { domain, revision }, &title)
        });
        // The last page's set, once its last revision is known to be read.
        if parsed.is_ok()
            && let Some((title, job)) = page.take().and_then(PageSoFar::into_job)
        {
            send(job, &title).map_err(DumpError::Stopped)?;
        }
        parsed
    })
    .await
    .map_err(|e| DumpError::Stopped(e.to_string()))?;
    for task in tasks {
        let _ = task.await;
    }
    let info = parsed?;
    let mut summary = Arc::into_inner(summary).unwrap_or_default();
    summary.pages = info.pages;
    summary.revisions = info.revisions;
    summary.skipped = info.skipped;
    summary.elapsed = started.elapsed();
    Ok(summary)
}

async fn writer(
    client: OldStoreClient,
    dependencies: Option<Dependencies>,
    mode: Mode,
    mut jobs: mpsc::Receiver<Job>,
    summary: Arc<ImportSummary>,
) {
    while let Some(job) = jobs.recv().await {
        let (domain, revision) = match job {
            Job::Revision { domain, revision } => (domain, revision),
            Job::Dependencies { domain, title, parents } => {
                if let Some(dependencies) = &dependencies {
                    write_dependencies(dependencies, mode, &domain, &title, parents, &summary).await;
                }
                continue;
            }
        };
        let Revision { title, rev_id, timestamp, page, text } = revision;
        let Some(text) = text else {
            summary.hidden.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        summary.text_bytes.fetch_add(text.len() as u64, Ordering::Relaxed);
        let title = title.replace(' ', "_");
        let result = match mode {
            Mode::Import => {
                // The page's id and namespace go with every revision: old-store keeps them per title for dumps.
                let body = ArchiveBody { wikitext: Some(text), page: (!page.is_empty()).then_some(page), ..ArchiveBody::default() };
                archive(&client, &domain, &title, rev_id, timestamp, &body, &summary).await
            }
            Mode::Verify => verify(&client, &domain, &title, rev_id, &text, &summary).await,
        };
        if let Err(e) = result {
            summary.failed.fetch_add(1, Ordering::Relaxed);
            eprintln!("revision {rev_id} of {}: {}", shown(&title), cut(&e.to_string(), 1000));
        }
    }
}

async fn archive(
    client: &OldStoreClient,
    domain: &str,
    title: &str,
    rev_id: u64,
    timestamp: std::time::SystemTime,
    body: &ArchiveBody,
    summary: &ImportSummary,
) -> Result<(), ClientError> {
    // The render time is the revision's time: importing the dump again finds
    // the same (rev, tid) and changes nothing.
    let tid = Tid::min_at(timestamp);
    let counter = match client.archive(domain, title, rev_id, &tid.to_string(), body).await? {
        Archived::Created => &summary.stored,
        Archived::Unchanged => &summary.already,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

async fn verify(
    client: &OldStoreClient,
    domain: &str,
    title: &str,
    rev_id: u64,
    text: &str,
    summary: &ImportSummary,
) -> Result<(), ClientError> {
    match client.read(domain, Selection::Part(Part::Wikitext), title, rev_id, None).await? {
        Some(answer) if answer.body == text.as_bytes() => {
            summary.identical.fetch_add(1, Ordering::Relaxed);
        }
        Some(_) => {
            summary.mismatched.fetch_add(1, Ordering::Relaxed);
            eprintln!("revision {rev_id} of {}: old-store returns different text", shown(title));
        }
        None => {
            summary.mismatched.fetch_add(1, Ordering::Relaxed);
            eprintln!("revision {rev_id} of {}: not in old-store", shown(title));
        }
    }
    Ok(())
}

/// Writes (or, verifying, compares) a page's dependency set.
async fn write_dependencies(
    dependencies: &Dependencies,
    mode: Mode,
    domain: &str,
    title: &str,
    parents: Vec<String>,
    summary: &ImportSummary,
) {
    // A name that is no title would make the graph refuse the whole set:
    // left out (and counted), the rest kept. Over the limit: the first kept.
    let rules = revstore_keys::TitleRules::default();
    let (mut parents, bad): (Vec<String>, Vec<String>) =
        parents.into_iter().partition(|parent| revstore_keys::Title::parse(parent, rules).is_ok());
    if !bad.is_empty() {
        summary.names_skipped.fetch_add(bad.len() as u64, Ordering::Relaxed);
        eprintln!(
            "dependencies of {}: left out {} transclusion name(s) that are no title, e.g. {}",
            shown(title),
            bad.len(),
            shown(&bad[0])
        );
    }
    if parents.len() > dependencies.max_edges {
        let over = parents.len() - dependencies.max_edges;
        summary.edges_over_limit.fetch_add(over as u64, Ordering::Relaxed);
        eprintln!(
            "dependencies of {}: {} templates, over the {} a page may have; kept the first {}",
            shown(title),
            parents.len(),
            dependencies.max_edges,
            dependencies.max_edges
        );
        parents.truncate(dependencies.max_edges);
    }
    let edges = parents.len() as u64;
    let outcome = match mode {
        Mode::Import => {
            let edges = parents
                .into_iter()
                .map(|parent| Edge {
                    parent,
                    kind: ChangeKind::Modification,
                    priority: dependencies.priority,
                    parent_selector: None,
                    child_selector: None,
                })
                .collect();
            dependencies.graph.replace_dependencies(domain, title, &EdgeSet { edges }).await.map(|()| true)
        }
        Mode::Verify => dependencies.graph.dependencies(domain, title).await.map(|listed| {
            let mut listed: Vec<String> = listed.into_iter().map(|d| d.parent).collect();
            listed.sort();
            listed == parents
        }),
    };
    match outcome {
        Ok(true) => {
            summary.dependency_sets.fetch_add(1, Ordering::Relaxed);
            summary.dependency_edges.fetch_add(edges, Ordering::Relaxed);
        }
        Ok(false) => {
            summary.mismatched.fetch_add(1, Ordering::Relaxed);
            eprintln!("dependencies of {}: the graph lists other templates than the dump's latest revision transcludes", shown(title));
        }
        Err(e) => {
            summary.failed.fetch_add(1, Ordering::Relaxed);
            eprintln!("dependencies of {}: {}", shown(title), cut(&e.to_string(), 1000));
        }
    }
}
