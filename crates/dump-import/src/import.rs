//! The writers: revisions parsed from the dump, archived in old-store (or read
//! back and compared, to verify an import).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use revstore_api::{ArchiveBody, Part, Selection};
use revstore_client::{Archived, ClientError, OldStoreClient};
use revstore_keys::Tid;
use tokio::sync::mpsc;

use crate::dump::{DumpError, Revision, read_dump};

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
    /// Verification: revisions read back identical, and different or missing.
    pub identical: AtomicU64,
    pub mismatched: AtomicU64,
    pub failed: AtomicU64,
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
            "stored {}, already there {}, text hidden in the dump {}, read back identical {}, different or missing {}, failed {}",
            n(&self.stored),
            n(&self.already),
            n(&self.hidden),
            n(&self.identical),
            n(&self.mismatched),
            n(&self.failed)
        )
    }
}

/// One revision on its way to a writer.
#[derive(Debug)]
struct Job {
    domain: Arc<str>,
    revision: Revision,
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
        tasks.push(tokio::spawn(writer(client.clone(), options.mode, rx, summary.clone())));
    }
    let domain_override = options.domain.clone();
    let path = options.dump.clone();
    let parsed = tokio::task::spawn_blocking(move || {
        let mut domain: Option<Arc<str>> = domain_override.map(Arc::from);
        read_dump(&path, progress, |info, revision| {
            let domain = match &domain {
                Some(d) => d.clone(),
                None => {
                    let d: Arc<str> = Arc::from(info.domain().ok_or("the dump names no site (<base>); pass --domain")?);
                    domain = Some(d.clone());
                    d
                }
            };
            // Every revision of a page goes to the same writer, in dump order.
            let mut hasher = DefaultHasher::new();
            revision.title.hash(&mut hasher);
            let queue = &queues[(hasher.finish() % queues.len() as u64) as usize];
            queue.blocking_send(Job { domain, revision }).map_err(|_| "a writer stopped".to_owned())
        })
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
    summary.elapsed = started.elapsed();
    Ok(summary)
}

async fn writer(client: OldStoreClient, mode: Mode, mut jobs: mpsc::Receiver<Job>, summary: Arc<ImportSummary>) {
    while let Some(job) = jobs.recv().await {
        let Revision { title, rev_id, timestamp, text } = job.revision;
        let Some(text) = text else {
            summary.hidden.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        summary.text_bytes.fetch_add(text.len() as u64, Ordering::Relaxed);
        let title = title.replace(' ', "_");
        let result = match mode {
            Mode::Import => archive(&client, &job.domain, &title, rev_id, timestamp, text, &summary).await,
            Mode::Verify => verify(&client, &job.domain, &title, rev_id, &text, &summary).await,
        };
        if let Err(e) = result {
            summary.failed.fetch_add(1, Ordering::Relaxed);
            eprintln!("revision {rev_id} of {title}: {e}");
        }
    }
}

async fn archive(
    client: &OldStoreClient,
    domain: &str,
    title: &str,
    rev_id: u64,
    timestamp: std::time::SystemTime,
    text: String,
    summary: &ImportSummary,
) -> Result<(), ClientError> {
    // The render time is the revision's time: importing the dump again finds
    // the same (rev, tid) and changes nothing.
    let tid = Tid::min_at(timestamp);
    let body = ArchiveBody { wikitext: Some(text), ..ArchiveBody::default() };
    let counter = match client.archive(domain, title, rev_id, &tid.to_string(), &body).await? {
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
            eprintln!("revision {rev_id} of {title}: old-store returns different text");
        }
        None => {
            summary.mismatched.fetch_add(1, Ordering::Relaxed);
            eprintln!("revision {rev_id} of {title}: not in old-store");
        }
    }
    Ok(())
}
