//! The one writer of an embedded database.
//!
//! SQLite allows one writer at a time, so every write goes through this thread.
//! It commits in groups: it takes every job waiting in its queue (up to a
//! bound), runs each inside its own savepoint of one transaction, commits once,
//! and only then answers each job. One fsync is shared by many writers, and a
//! job that fails rolls back to its savepoint without touching the others. A
//! caller is answered `Ok` only after the commit that holds its write.
//!
//! The writer's work is split by concern: this module is the queue (groups,
//! savepoints, replies); `schema` creates and checks tables; `cells` holds
//! Cassandra's cell semantics (upserts, deletes, tombstones, conditional
//! batches); `maintenance` purges what expired and gives the space back.

mod cells;
mod maintenance;
mod schema;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::Receiver;

use revstore_schema::TableDef;
use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::clock::Clock;
use crate::error::{StoreError, StoreResult};
use crate::ops::{Cas, CasOutcome, PurgeStats, Write};

type Reply<T> = oneshot::Sender<StoreResult<T>>;

pub(crate) enum Job {
    Ensure(Vec<&'static TableDef>, Reply<()>),
    Apply(Vec<Write>, Reply<()>),
    Cas(Cas, Reply<CasOutcome>),
    Purge(Reply<PurgeStats>),
}

/// A job's result, held until its group commits.
enum Pending {
    Unit(Reply<()>, StoreResult<()>),
    Cas(Reply<CasOutcome>, StoreResult<CasOutcome>),
}

pub(crate) struct Writer {
    pub conn: Connection,
    pub clock: Arc<dyn Clock>,
    pub gc_grace_micros: i64,
    pub max_group: usize,
    pub db_path: PathBuf,
    /// The last write timestamp handed out (shared with the engine's
    /// `now_micros`), so default timestamps never repeat.
    pub last_ts: std::sync::Arc<std::sync::atomic::AtomicI64>,
    /// How often to purge expired data between jobs.
    pub purge_interval: Option<std::time::Duration>,
    /// The `service` label of the purge counters.
    pub metrics_service: &'static str,
}

impl Writer {
    pub fn run(mut self, jobs: Receiver<Job>) {
        let mut next_purge = self.purge_interval.map(|i| std::time::Instant::now() + i);
        loop {
            let first = match next_purge {
                None => match jobs.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                },
                Some(due) => match jobs.recv_timeout(due.saturating_duration_since(std::time::Instant::now())) {
                    Ok(job) => job,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        self.purge_and_report();
                        next_purge = self.purge_interval.map(|i| std::time::Instant::now() + i);
                        continue;
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                },
            };
            let mut group = vec![first];
            while group.len() < self.max_group {
                match jobs.try_recv() {
                    Ok(job) => group.push(job),
                    Err(_) => break,
                }
            }
            self.process(group);
        }
        // The queue closed: the engine was dropped. Leave a compact database
        // behind: free pages handed back, the WAL folded in.
        let _ = step_to_end(&self.conn, "PRAGMA incremental_vacuum");
        let _ = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)");
    }

    fn process(&mut self, group: Vec<Job>) {
        let mut pending = Vec::with_capacity(group.len());
        let mut solo = Vec::new();
        if let Err(e) = self.conn.execute_batch("BEGIN IMMEDIATE") {
            let err = StoreError::from(e);
            for job in group {
                fail(job, err.clone());
            }
            return;
        }
        for job in group {
            match job {
                Job::Apply(writes, reply) => {
                    let result = self.in_savepoint(|w| w.apply(&writes));
                    pending.push(Pending::Unit(reply, result));
                }
                Job::Cas(cas, reply) => {
                    let result = self.in_savepoint(|w| w.cas(&cas));
                    pending.push(Pending::Cas(reply, result));
                }
                other => solo.push(other),
            }
        }
        let committed = self.conn.execute_batch("COMMIT").map_err(StoreError::from);
        if committed.is_err() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        for p in pending {
            match p {
                Pending::Unit(reply, result) => {
                    let _ = reply.send(committed.clone().and(result));
                }
                Pending::Cas(reply, result) => {
                    let _ = reply.send(committed.clone().and(result));
                }
            }
        }
        for job in solo {
            match job {
                Job::Ensure(tables, reply) => {
                    let _ = reply.send(self.ensure(&tables));
                }
                Job::Purge(reply) => {
                    let _ = reply.send(self.purge());
                }
                other => fail(other, StoreError::Internal("job routed wrongly".into())),
            }
        }
    }

    fn in_savepoint<T>(&mut self, f: impl FnOnce(&mut Self) -> StoreResult<T>) -> StoreResult<T> {
        self.conn.execute_batch("SAVEPOINT job")?;
        let result = f(self);
        match &result {
            Ok(_) => self.conn.execute_batch("RELEASE job")?,
            Err(_) => self.conn.execute_batch("ROLLBACK TO job; RELEASE job")?,
        }
        result
    }

    fn now(&self) -> i64 {
        self.clock.now_micros()
    }

    /// A write timestamp: the current time, but always after the last one given.
    fn next_ts(&mut self) -> i64 {
        crate::clock::next_timestamp(&self.last_ts, self.now())
    }
}

/// Runs a statement until it has no more rows (some pragmas work a step at a time).
fn step_to_end(conn: &Connection, sql: &str) -> StoreResult<()> {
    let mut stmt = conn.prepare(sql)?;
    let mut rows = stmt.query([])?;
    while rows.next()?.is_some() {}
    Ok(())
}

fn fail(job: Job, err: StoreError) {
    match job {
        Job::Ensure(_, r) | Job::Apply(_, r) => {
            let _ = r.send(Err(err));
        }
        Job::Cas(_, r) => {
            let _ = r.send(Err(err));
        }
        Job::Purge(r) => {
            let _ = r.send(Err(err));
        }
    }
}
