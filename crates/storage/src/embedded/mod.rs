//! The embedded engine: SQLite in one directory, no server to run.
//!
//! One writer thread owns the only write connection and commits in groups
//! ([`writer`]); reads run on a small pool of read-only connections on tokio's
//! blocking threads. The database runs in WAL mode, so readers never wait for
//! the writer, and a write acknowledged to a caller is committed: with the
//! default [`Durability::Normal`] it survives the process being killed (the
//! WAL is in the OS page cache); [`Durability::Full`] also survives power loss
//! at the cost of an fsync per commit group.
//!
//! The directory holds `revstore.db` (with `-wal` and `-shm` beside it) and a
//! `LOCK` file held while the engine is open, so two processes never share it.
//! The database can be inspected with the `sqlite3` command-line tool; see
//! [`layout`] for what its tables hold.

pub mod backup;
pub(crate) mod layout;
pub(crate) mod query;
mod writer;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use revstore_schema::TableDef;
use rusqlite::{Connection, OpenFlags};
use tokio::sync::{Semaphore, oneshot};

use crate::clock::{Clock, SystemClock};
use crate::error::{StoreError, StoreResult};
use crate::ops::{Cas, CasOutcome, Holdings, PurgeStats, ReadQuery, ScanQuery, ScannedPartition, Write};
use crate::store::{Engine, EngineKind};
use crate::value::{Row, Value};
use writer::{Job, Writer};

/// How hard a commit tries to reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Survives a crash of the process; the last commits may be lost on power loss.
    #[default]
    Normal,
    /// Survives power loss: an fsync per commit group.
    Full,
}

#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    pub durability: Durability,
    /// Read-only connections serving reads concurrently.
    pub readers: usize,
    /// How long a delete's tombstone is kept to shadow late writes with older
    /// timestamps (Cassandra's `gc_grace_seconds`).
    pub gc_grace: Duration,
    /// The most jobs one commit group takes.
    pub max_group: usize,
    /// SQLite page cache per connection, in KiB.
    pub cache_kib: u32,
    pub clock: Arc<dyn Clock>,
    /// How often the engine itself purges expired data and old tombstones
    /// from disk (Cassandra does it in compaction); `None`: only when asked.
    pub purge_interval: Option<Duration>,
    /// The `service` label of the engine's own metrics (its purges).
    pub metrics_service: &'static str,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            durability: Durability::Normal,
            readers: 4,
            gc_grace: Duration::from_secs(864_000),
            max_group: 256,
            cache_kib: 32 * 1024,
            clock: Arc::new(SystemClock),
            purge_interval: None,
            metrics_service: "revstore",
        }
    }
}

pub const DATABASE_FILE: &str = "revstore.db";

#[derive(Debug)]
pub struct EmbeddedEngine {
    db_path: PathBuf,
    jobs: Mutex<Option<Sender<Job>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    readers: Mutex<Vec<Connection>>,
    reader_slots: Semaphore,
    options: EmbeddedOptions,
    /// The last write timestamp handed out, by the writer or `now_micros`.
    last_ts: Arc<std::sync::atomic::AtomicI64>,
    _lock: File,
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode;
        match e.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Unavailable(format!("database busy: {e}")),
            Some(ErrorCode::DiskFull) => StoreError::StorageFull(format!("disk full: {e}")),
            Some(ErrorCode::SystemIoFailure | ErrorCode::CannotOpen | ErrorCode::ReadOnly) => StoreError::Unavailable(e.to_string()),
            Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => StoreError::Corrupt(e.to_string()),
            // A table the database does not have: it was never created (or migrated).
            _ if e.to_string().contains("no such table") => StoreError::SchemaMismatch(e.to_string()),
            _ => StoreError::Internal(e.to_string()),
        }
    }
}

/// Keeps compiled statements for reuse, and makes the reuse real: SQLite 3.47+
/// reads a bound `LIMIT ?` value while planning (`sqlite3ExprIsInteger`) and
/// then marks the statement to be compiled again whenever that parameter is
/// rebound. Every paged or bounded read binds its limit, so every read paid a
/// full compile: measured, two thirds of the CPU of a 500-partition pull check.
/// The query planner stability guarantee (QPSG) turns that off: one plan per
/// statement text, which is what our statements (values all bound) want.
pub(crate) fn reuse_prepared_statements(conn: &Connection) -> StoreResult<()> {
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    conn.set_prepared_statement_cache_capacity(256);
    Ok(())
}

/// `PRAGMA auto_vacuum`'s value for INCREMENTAL.
const INCREMENTAL_AUTO_VACUUM: i64 = 2;

impl EmbeddedEngine {
    /// Opens (creating if needed) the database in `dir`.
    pub fn open(dir: &Path, options: EmbeddedOptions) -> StoreResult<Self> {
        let unavailable = |what: &str, e: std::io::Error| StoreError::Unavailable(format!("{what} {}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(|e| unavailable("cannot create data directory", e))?;
        let lock = File::create(dir.join("LOCK")).map_err(|e| unavailable("cannot create lock file in", e))?;
        lock.try_lock().map_err(|_| StoreError::Unavailable(format!("data directory {} is in use by another process", dir.display())))?;

        let db_path = dir.join(DATABASE_FILE);
        let conn = Connection::open(&db_path)?;
        // Must precede the first table: lets purges give pages back to the file
        // system. Set only when not set yet: the pragma writes even when the
        // mode is already this one, and would keep a full disk from opening.
        let auto_vacuum: i64 = conn.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))?;
        if auto_vacuum != INCREMENTAL_AUTO_VACUUM {
            conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL")?;
        }
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Unavailable(format!("cannot use WAL mode in {}", db_path.display())));
        }
        let sync = match options.durability {
            Durability::Normal => "NORMAL",
            Durability::Full => "FULL",
        };
        conn.execute_batch(&format!(
            "PRAGMA synchronous = {sync}; PRAGMA busy_timeout = 5000; PRAGMA cache_size = -{};",
            options.cache_kib
        ))?;
        reuse_prepared_statements(&conn)?;

        let (tx, rx) = mpsc::channel();
        let last_ts = Arc::new(std::sync::atomic::AtomicI64::new(i64::MIN));
        let writer = Writer {
            conn,
            clock: options.clock.clone(),
            gc_grace_micros: options.gc_grace.as_micros() as i64,
            max_group: options.max_group.max(1),
            db_path: db_path.clone(),
            last_ts: last_ts.clone(),
            purge_interval: options.purge_interval,
            metrics_service: options.metrics_service,
        };
        let handle = std::thread::Builder::new()
            .name("revstore-sqlite-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| StoreError::Internal(format!("cannot start the writer thread: {e}")))?;
        Ok(EmbeddedEngine {
            db_path,
            jobs: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(handle)),
            readers: Mutex::new(Vec::new()),
            reader_slots: Semaphore::new(options.readers.max(1)),
            options,
            last_ts,
            _lock: lock,
        })
    }

    pub fn database_path(&self) -> &Path {
        &self.db_path
    }

    async fn submit<T>(&self, make: impl FnOnce(oneshot::Sender<StoreResult<T>>) -> Job) -> StoreResult<T> {
        let (reply, answer) = oneshot::channel();
        {
            let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
            let sender = jobs.as_ref().ok_or_else(|| StoreError::Unavailable("the store is closed".into()))?;
            sender.send(make(reply)).map_err(|_| StoreError::Unavailable("the writer thread stopped".into()))?;
        }
        answer.await.map_err(|_| StoreError::Internal("the writer thread dropped a job".into()))?
    }

    /// Runs `f` on a read-only connection on a blocking thread.
    async fn with_reader<T: Send + 'static>(&self, f: impl FnOnce(&Connection) -> StoreResult<T> + Send + 'static) -> StoreResult<T> {
        let _slot = self.reader_slots.acquire().await.map_err(|_| StoreError::Unavailable("the store is closed".into()))?;
        let conn = self.readers.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let conn = match conn {
            Some(c) => c,
            None => self.open_reader()?,
        };
        let (conn, result) = tokio::task::spawn_blocking(move || {
            let result = f(&conn);
            (conn, result)
        })
        .await
        .map_err(|e| StoreError::Internal(format!("read task failed: {e}")))?;
        self.readers.lock().unwrap_or_else(|p| p.into_inner()).push(conn);
        result
    }

    fn open_reader(&self) -> StoreResult<Connection> {
        let conn = Connection::open_with_flags(&self.db_path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
        conn.execute_batch(&format!(
            "PRAGMA busy_timeout = 5000; PRAGMA cache_size = -{}; PRAGMA query_only = ON;",
            self.options.cache_kib
        ))?;
        reuse_prepared_statements(&conn)?;
        Ok(conn)
    }
}

impl Drop for EmbeddedEngine {
    fn drop(&mut self) {
        // Closing the queue ends the writer loop; wait for it to checkpoint and close.
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.readers.lock().unwrap_or_else(|p| p.into_inner()).clear();
        if let Some(handle) = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = handle.join();
        }
    }
}

#[async_trait]
impl Engine for EmbeddedEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Embedded
    }

    /// The clock's time, but past every write timestamp this engine handed
    /// out (and itself handed out): a timestamp taken here lands above every
    /// write stamped before, even when the clock stands still (tests) or many
    /// writes share a microsecond.
    /// A batch is one SQLite transaction: larger ones load faster.
    fn batch_writes(&self) -> usize {
        1200
    }

    fn now_micros(&self) -> i64 {
        crate::clock::next_timestamp(&self.last_ts, self.options.clock.now_micros())
    }

    async fn ensure_tables(&self, tables: &[&'static TableDef]) -> StoreResult<()> {
        let tables = tables.to_vec();
        self.submit(|reply| Job::Ensure(tables, reply)).await
    }

    async fn apply(&self, writes: Vec<Write>) -> StoreResult<()> {
        self.submit(|reply| Job::Apply(writes, reply)).await
    }

    /// One transaction for every stage: stronger than asked, and one commit
    /// instead of one per stage.
    async fn apply_in_stages(&self, stages: Vec<Vec<Write>>) -> StoreResult<()> {
        self.apply(stages.into_iter().flatten().collect()).await
    }

    async fn read(&self, query: &ReadQuery, after: Option<Vec<Value>>) -> StoreResult<(Vec<Row>, Option<Row>)> {
        let query = query.clone();
        let now = self.options.clock.now_micros();
        self.with_reader(move |conn| query::read_rows(conn, &query, after.as_deref(), now)).await
    }

    async fn cas(&self, cas: Cas) -> StoreResult<CasOutcome> {
        self.submit(|reply| Job::Cas(cas, reply)).await
    }

    /// All the reads on one connection in one blocking call: one thread
    /// hand-off instead of one per read. (Split over several connections they
    /// were no faster: measured with the graph's pull check.)
    async fn read_many(&self, queries: Vec<ReadQuery>) -> StoreResult<Vec<Vec<Row>>> {
        let now = self.options.clock.now_micros();
        self.with_reader(move |conn| {
            queries.iter().map(|q| query::read_rows(conn, q, q.after.as_deref(), now).map(|(rows, _)| rows)).collect()
        })
        .await
    }

    async fn scan(&self, query: &ScanQuery) -> StoreResult<Vec<ScannedPartition>> {
        let now = self.options.clock.now_micros();
        let query = query.clone();
        self.with_reader(move |conn| query::scan_partitions(conn, &query, now)).await
    }

    async fn holdings(&self, query: &ScanQuery) -> StoreResult<Holdings> {
        let now = self.options.clock.now_micros();
        let query = query.clone();
        self.with_reader(move |conn| query::holdings(conn, &query, now)).await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.with_reader(|conn| Ok(conn.query_row("SELECT 1", [], |_| Ok(()))?)).await
    }

    async fn purge_expired(&self) -> StoreResult<PurgeStats> {
        self.submit(Job::Purge).await
    }
}

#[cfg(test)]
mod tests {
    use revstore_schema::model::ColumnType::{BigInt, Text};
    use revstore_schema::{Column as C, Compaction, Order, TableDef};
    use rusqlite::StatementStatus;

    use super::*;
    use crate::{ReadQuery, Upsert, Value, Write};

    static EDGES: TableDef = TableDef {
        name: "edges",
        columns: &[C::partition("parent", Text), C::clustering("child", Text, Order::Asc), C::regular("priority", BigInt)],
        default_ttl: None,
        compaction: Compaction::SizeTiered,
        comment: "",
    };

    /// Reads of many partitions are one statement run many times: a rebound
    /// limit must not make SQLite compile it again (it did, before QPSG).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_of_other_partitions_reuse_the_compiled_statement() {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = EmbeddedEngine::open(dir.path(), EmbeddedOptions::default()).expect("open");
        engine.ensure_tables(&[&EDGES]).await.expect("tables");
        let writes: Vec<Write> = (0..20)
            .map(|i| {
                Upsert::new(&EDGES, [Value::from(format!("P{}", i % 5)), Value::from(format!("C{i}"))]).set("priority", i as i64).into()
            })
            .collect();
        engine.apply(writes).await.expect("write");

        let reprepares = |conn: &Connection| {
            let now = engine.options.clock.now_micros();
            for p in 0..5 {
                let query = ReadQuery::new(&EDGES, [Value::from(format!("P{p}"))]).limit(10);
                let (rows, _) = query::read_rows(conn, &query, None, now).expect("read");
                assert_eq!(rows.len(), 4, "partition P{p}");
            }
            let sql = query::read_rows_sql(&ReadQuery::new(&EDGES, [Value::from("P0")]).limit(10), now);
            conn.prepare_cached(&sql.text).expect("cached").get_status(StatementStatus::RePrepare)
        };
        assert_eq!(reprepares(&engine.open_reader().expect("reader")), 0, "a read compiled its statement again");

        // The same reads on a connection without the setting: the control
        // that shows what the assertion above guards against.
        let plain = Connection::open_with_flags(dir.path().join(DATABASE_FILE), OpenFlags::SQLITE_OPEN_READ_ONLY).expect("plain");
        assert!(reprepares(&plain) >= 4, "without QPSG, SQLite no longer recompiles on rebinding: the setting may be dropped");
    }
}
