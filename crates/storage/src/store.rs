//! The engine trait and the `Store` handle services hold.

use std::fmt::Debug;
use std::ops::Bound;
use std::sync::Arc;

use async_trait::async_trait;
use revstore_codecs::PageTokenCodec;
use revstore_schema::TableDef;

use crate::error::{StoreError, StoreResult};
use crate::validate::{validate_cas, validate_read, validate_scan, validate_write};
use crate::value::clustering_key;
use futures_util::{Stream, StreamExt};

use crate::ops::{
    Cas, CasOutcome, DiskUsage, Holdings, Page, PurgeStats, ReadHealth, ReadQuery, ScanQuery, ScanRows, ScannedPartition, Site, Slice,
    Write,
};
use crate::value::{Row, Value, decode_values, encode_values};

/// The engines revstore knows, named even when not built in, so an error can
/// say which one is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// SQLite in a local directory.
    Embedded,
    /// Apache Cassandra or ScyllaDB.
    Cassandra,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Embedded => "embedded",
            EngineKind::Cassandra => "cassandra",
        }
    }
}

/// What an engine implements. Requests reach an engine only after [`Store`] has
/// validated them against their table, so engines may rely on well-formed keys,
/// known columns and matching types.
#[async_trait]
pub trait Engine: Send + Sync + Debug {
    fn kind(&self) -> EngineKind;

    /// The engine's current time in microseconds: what its default write
    /// timestamps and TTLs count from (an injected clock in tests), for
    /// callers that stamp writes themselves. Both engines answer a time past
    /// every timestamp they handed out. A wrapper forwards it.
    fn now_micros(&self) -> i64 {
        crate::clock::Clock::now_micros(&crate::clock::SystemClock)
    }

    /// The most writes one batch of [`Store::apply_grouped`] carries. This
    /// default is Cassandra's: a logged batch of a few dozen rows stays far
    /// below `batch_size_fail_threshold` (50 KB) with rows of a few hundred
    /// bytes. The embedded engine, where a batch is one SQLite transaction and
    /// larger ones load faster, answers more. A wrapper forwards it.
    fn batch_writes(&self) -> usize {
        48
    }

    /// The site this engine writes in (see [`Site`]). A wrapper forwards it.
    fn site(&self) -> Site {
        Site::ONLY
    }

    /// Creates the tables that do not exist; fails if one exists with another shape.
    async fn ensure_tables(&self, tables: &[&'static TableDef]) -> StoreResult<()>;

    /// Applies the writes atomically: all of them or none.
    async fn apply(&self, writes: Vec<Write>) -> StoreResult<()>;

    /// Applies stages in order, each partition's writes of a stage atomically
    /// and the partitions of a stage concurrently; a stage starts once the one
    /// before it is applied. A failure can leave earlier stages (and some
    /// partitions of the failing one) applied: the caller orders its writes so
    /// that every such prefix is safe and a retry completes it. This default
    /// is Cassandra's way: no cross-partition batch, so no batchlog. Engines
    /// that apply everything in one transaction as cheaply (embedded) do.
    async fn apply_in_stages(&self, stages: Vec<Vec<Write>>) -> StoreResult<()> {
        for stage in stages {
            // Writes to one partition key, in any tables of the keyspace, are one
            // mutation on Cassandra: atomic, and one request.
            let mut groups: Vec<Vec<Write>> = Vec::new();
            for write in stage {
                match groups.iter_mut().find(|g| g[0].partition() == write.partition()) {
                    Some(group) => group.push(write),
                    None => groups.push(vec![write]),
                }
            }
            futures_util::future::try_join_all(groups.into_iter().map(|group| self.apply(group))).await?;
        }
        Ok(())
    }

    /// Reads one page. `after` is the clustering key of the last row of the
    /// previous page (from the page token); the engine returns up to `limit + 1`
    /// rows after it so the store can tell whether another page follows
    /// (`limit` when the query wants only its first rows, [`ReadQuery::lookahead`]).
    async fn read(&self, query: &ReadQuery, after: Option<Vec<Value>>) -> StoreResult<(Vec<Row>, Option<Row>)>;

    async fn cas(&self, cas: Cas) -> StoreResult<CasOutcome>;

    /// Reads the first page of each query (each has a limit; up to `limit`
    /// rows each, plus the lookahead, as [`Engine::read`]; after the query's `after` key when
    /// it has one). Engines that can answer many small
    /// reads at once cheaper than one by one override it (the embedded
    /// engine: one connection, one call); the default runs them 32 at a time.
    async fn read_many(&self, queries: Vec<ReadQuery>) -> StoreResult<Vec<Vec<Row>>> {
        let mut pages = Vec::with_capacity(queries.len());
        for chunk in queries.chunks(32) {
            let mut reads = Vec::with_capacity(chunk.len());
            for query in chunk {
                reads.push(self.read(query, query.after.clone()));
            }
            pages.extend(futures_util::future::try_join_all(reads).await?.into_iter().map(|(rows, _statics)| rows));
        }
        Ok(pages)
    }

    /// Up to `limit + 1` partitions of the query's table in token order,
    /// within its token range and strictly after its position, with the
    /// static columns it names.
    async fn scan(&self, query: &ScanQuery) -> StoreResult<Vec<crate::ops::ScannedPartition>>;

    /// What the engine holds of up to `limit` partitions of the query's range
    /// (its `statics` are ignored), and where the next step resumes.
    /// Cassandra counts what reads see, live data only (expired cells and
    /// tombstones are invisible to a client); the embedded engine counts what
    /// its files still keep. A wrapper passes the call on.
    async fn holdings(&self, query: &ScanQuery) -> StoreResult<Holdings>;

    /// Cheap reachability check for readiness probes.
    async fn ping(&self) -> StoreResult<()>;

    /// Removes data past its TTL and tombstones past their grace period, and
    /// returns the space to the file system. Engines that do this themselves
    /// (Cassandra compaction) report nothing removed.
    async fn purge_expired(&self) -> StoreResult<PurgeStats>;

    /// What the storage keeps on disk for the table, for one copy of its
    /// data, when the engine can tell (`None` when it cannot: the embedded
    /// engine keeps every table in one file, whose expired data
    /// [`Engine::holdings`] already counts).
    async fn disk_usage(&self, _table: &'static TableDef) -> StoreResult<Option<DiskUsage>> {
        Ok(None)
    }

    /// How reads of the table fare on the storage nodes, when the engine
    /// measures it (`None` when it does not: the embedded engine keeps no
    /// tombstones a read steps over, and ScyllaDB exposes no such table).
    async fn read_health(&self, _table: &'static TableDef) -> StoreResult<Option<ReadHealth>> {
        Ok(None)
    }
}

/// The handle services hold: validation, page tokens and schema checks in front
/// of one engine. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pub(crate) engine: Arc<dyn Engine>,
    tokens: PageTokenCodec,
    /// The most rows a read without a limit may find (see [`Store::read`]).
    unbounded_read_cap: u32,
    /// Whether the last write found the storage full (shared by clones).
    full: Arc<std::sync::atomic::AtomicBool>,
    /// Who uses the store: the `service` label of its metrics (several
    /// services share a process under `revstore up`).
    user: &'static str,
}

/// Used when a deployment configures no key of its own: tokens are then still
/// tamper-evident against accidental edits, not against a determined forger.
const DEFAULT_PAGE_TOKEN_KEY: &[u8] = b"revstore page tokens v1";

/// The most rows a read without a limit may find before it fails instead of
/// loading them all: a partition of millions of rows is paged
/// ([`Store::rows`]), never loaded whole by accident.
pub const UNBOUNDED_READ_CAP: u32 = 10_000;

impl Store {
    pub fn new(engine: Arc<dyn Engine>) -> Self {
        Store {
            engine,
            tokens: PageTokenCodec::new(DEFAULT_PAGE_TOKEN_KEY),
            unbounded_read_cap: UNBOUNDED_READ_CAP,
            full: Arc::default(),
            user: "revstore",
        }
    }

    /// The store as `service` uses it: its metrics carry `service="…"`.
    /// (Clones made before keep the label they had: label a store when it is
    /// opened.)
    pub fn for_service(mut self, service: &'static str) -> Self {
        self.user = service;
        // Exported from the start (0 while writes are accepted), so an alert sees the series.
        let full = self.full.load(std::sync::atomic::Ordering::Relaxed);
        metrics::gauge!("storage_full", "service" => service, "engine" => self.kind().name()).set(if full { 1.0 } else { 0.0 });
        self
    }

    /// Lowers (or raises) the cap on reads without a limit; for tests.
    pub fn with_unbounded_read_cap(mut self, cap: u32) -> Self {
        self.unbounded_read_cap = cap.max(1);
        self
    }

    /// Signs page tokens with `key` (shared by all replicas of a service).
    pub fn with_page_token_key(mut self, key: &[u8]) -> Self {
        self.tokens = PageTokenCodec::new(key);
        self
    }

    /// The store's current time in microseconds (see [`Engine::now_micros`]):
    /// code that picks write timestamps of its own takes them from here, so
    /// they agree with the store's own and follow an injected clock.
    pub fn now_micros(&self) -> i64 {
        self.engine.now_micros()
    }

    /// The store's current time (see [`Store::now_micros`]): what services
    /// measure their timed rules against (grace, hand-off margins, leases,
    /// abandoned markers), so that a test on an injected clock moves them all.
    pub fn now(&self) -> std::time::SystemTime {
        let micros = self.now_micros();
        if micros >= 0 {
            std::time::UNIX_EPOCH + std::time::Duration::from_micros(micros as u64)
        } else {
            std::time::UNIX_EPOCH - std::time::Duration::from_micros(micros.unsigned_abs())
        }
    }

    pub fn kind(&self) -> EngineKind {
        self.engine.kind()
    }

    /// The site (datacenter) this store writes in, among how many.
    pub fn site(&self) -> Site {
        self.engine.site()
    }

    /// Runs an engine call, recording its duration and outcome in the
    /// `storage_operation_duration_seconds` histogram.
    async fn timed<T>(&self, operation: &'static str, call: impl std::future::Future<Output = StoreResult<T>>) -> StoreResult<T> {
        let started = std::time::Instant::now();
        let result = call.await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) if e.is_client_error() => "invalid",
            Err(StoreError::Unavailable(_)) => "unavailable",
            Err(StoreError::StorageFull(_)) => "full",
            Err(_) => "error",
        };
        metrics::histogram!("storage_operation_duration_seconds", "service" => self.user, "engine" => self.kind().name(), "operation" => operation, "outcome" => outcome)
            .record(started.elapsed().as_secs_f64());
        result
    }

    /// Notes what a write says about free space: full on `StorageFull`, not
    /// full on success. Each change is logged once and kept in the
    /// `storage_full` gauge, so a full disk is one log line, not one per write.
    fn note_write<T>(&self, result: &StoreResult<T>) {
        use std::sync::atomic::Ordering;
        let full = match result {
            Ok(_) => false,
            Err(StoreError::StorageFull(_)) => true,
            Err(_) => return,
        };
        if self.full.swap(full, Ordering::Relaxed) != full {
            metrics::gauge!("storage_full", "service" => self.user, "engine" => self.kind().name()).set(if full { 1.0 } else { 0.0 });
            match result {
                Err(e) => tracing::error!(error = %e, "storage is full: writes are refused until space is freed; reads go on"),
                Ok(_) => tracing::warn!("storage has space again: writes are accepted"),
            }
        }
    }

    /// Whether the last write was refused for want of space (reads still work).
    pub fn is_full(&self) -> bool {
        self.full.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The same store over its engine wrapped by `wrap` (a test's fault
    /// injector, say). The engine is reachable only this way, behind the
    /// store's validation: nothing gets a write past it.
    pub fn map_engine(self, wrap: impl FnOnce(Arc<dyn Engine>) -> Arc<dyn Engine>) -> Store {
        Store { engine: wrap(self.engine), ..self }
    }

    pub async fn ensure_tables(&self, tables: &[&'static TableDef]) -> StoreResult<()> {
        for t in tables {
            t.validate().map_err(StoreError::Invalid)?;
        }
        self.engine.ensure_tables(tables).await
    }

    /// Applies one write.
    pub async fn write(&self, write: impl Into<Write>) -> StoreResult<()> {
        self.apply(vec![write.into()]).await
    }

    /// Applies writes atomically. Every write is validated first; one invalid
    /// write rejects the whole batch before anything is written.
    pub async fn apply(&self, writes: Vec<Write>) -> StoreResult<()> {
        if writes.is_empty() {
            return Err(StoreError::invalid("empty batch"));
        }
        for w in &writes {
            validate_write(w)?;
        }
        let result = self.timed("apply", self.engine.apply(writes)).await;
        self.note_write(&result);
        result
    }

    /// Applies groups of writes in order, each group whole in one atomic
    /// batch and as many groups to a batch as the engine's batch size allows
    /// ([`Engine::batch_writes`]; a larger group goes alone). A failure
    /// leaves the batches before it applied: the caller orders its groups so
    /// that every such prefix is safe and a retry completes it.
    pub async fn apply_grouped(&self, groups: Vec<Vec<Write>>) -> StoreResult<()> {
        let most = self.engine.batch_writes();
        let mut batch: Vec<Write> = Vec::new();
        for group in groups.into_iter().filter(|g| !g.is_empty()) {
            if !batch.is_empty() && batch.len() + group.len() > most {
                self.apply(std::mem::take(&mut batch)).await?;
            }
            batch.extend(group);
        }
        if !batch.is_empty() {
            self.apply(batch).await?;
        }
        Ok(())
    }

    /// Applies writes in ordered stages (see [`Engine::apply_in_stages`]):
    /// atomic per partition, not across partitions. Every write of every stage
    /// is validated before anything is written.
    pub async fn apply_in_stages(&self, stages: Vec<Vec<Write>>) -> StoreResult<()> {
        let stages: Vec<Vec<Write>> = stages.into_iter().filter(|s| !s.is_empty()).collect();
        if stages.is_empty() {
            return Err(StoreError::invalid("empty batch"));
        }
        for w in stages.iter().flatten() {
            validate_write(w)?;
        }
        let result = self.timed("apply_in_stages", self.engine.apply_in_stages(stages)).await;
        self.note_write(&result);
        result
    }

    /// Reads one page of a partition.
    pub async fn read(&self, query: &ReadQuery) -> StoreResult<Page> {
        validate_read(query)?;
        let scope = read_scope(query);
        let after = match &query.page_token {
            Some(token) => {
                let payload = self.tokens.open(&scope, token).map_err(StoreError::BadPageToken)?;
                let key = decode_values(&payload).map_err(|_| StoreError::invalid("page token does not hold a row key"))?;
                if key.len() != query.table.clustering().count() {
                    return Err(StoreError::invalid("page token does not hold a row key of this table"));
                }
                Some(key)
            }
            None => query.after.clone(),
        };
        let (mut rows, statics) = match query.limit {
            Some(_) => self.timed("read", self.engine.read(query, after)).await?,
            None => {
                let capped = ReadQuery { limit: Some(self.unbounded_read_cap), ..query.clone() };
                let (rows, statics) = self.timed("read", self.engine.read(&capped, after)).await?;
                if rows.len() > self.unbounded_read_cap as usize {
                    return Err(StoreError::Internal(format!(
                        "a read of {} without a limit found more than {} rows: give it a limit and page it (Store::rows)",
                        query.table.name, self.unbounded_read_cap
                    )));
                }
                (rows, statics)
            }
        };
        let mut next = None;
        if let Some(limit) = query.limit
            && rows.len() > limit as usize
        {
            rows.truncate(limit as usize);
            if !query.first_only {
                let last = rows.last().map(|row| clustering_key(query.table, row)).unwrap_or_default();
                next = Some(self.tokens.seal(&scope, &encode_values(&last)));
            }
        }
        Ok(Page { rows, statics, next })
    }

    /// The first page of each query (each must have a limit; it may start
    /// [`ReadQuery::after`] a key), rows only, in the queries' order: many
    /// small partitions read at the cost of a few reads (a pull check's
    /// hundreds of parents, a merge of a parent's buckets).
    pub async fn read_many(&self, queries: Vec<ReadQuery>) -> StoreResult<Vec<Vec<Row>>> {
        for query in &queries {
            validate_read(query)?;
            if query.limit.is_none() || query.page_token.is_some() {
                return Err(StoreError::invalid("read_many reads first pages: every query needs a limit and no page token"));
            }
        }
        let limits: Vec<usize> = queries.iter().map(|q| q.limit.unwrap_or(0) as usize).collect();
        // Rows only, no page tokens: nothing past each limit needs reading.
        let queries = queries.into_iter().map(|q| ReadQuery { first_only: true, ..q }).collect();
        let mut pages = self.timed("read_many", self.engine.read_many(queries)).await?;
        for (rows, limit) in pages.iter_mut().zip(limits) {
            rows.truncate(limit);
        }
        Ok(pages)
    }

    /// Seals a service's own listing cursor (`payload`, for the listing
    /// `scope`) with the deployment's page-token key, as the store seals its
    /// page tokens: a client can hand it back, not forge or move it to
    /// another listing.
    pub fn seal_cursor(&self, scope: &str, payload: &[u8]) -> String {
        self.tokens.seal(format!("cursor|{scope}").as_bytes(), payload)
    }

    /// The payload of a cursor [`Store::seal_cursor`] sealed for `scope`.
    pub fn open_cursor(&self, scope: &str, cursor: &str) -> StoreResult<Vec<u8>> {
        self.tokens.open(format!("cursor|{scope}").as_bytes(), cursor).map_err(StoreError::BadPageToken)
    }

    /// Reads one row by its full key, or `None`.
    pub async fn get(&self, table: &'static TableDef, key: Vec<Value>, columns: Option<Vec<&'static str>>) -> StoreResult<Option<Row>> {
        let pk_len = table.partition_key().count();
        if key.len() != pk_len + table.clustering().count() {
            return Err(StoreError::invalid(format!("table {} needs the full key to get a row", table.name)));
        }
        let mut key = key;
        let clustering = key.split_off(pk_len);
        let mut query = ReadQuery::new(table, key).slice(Slice::prefix(clustering)).first(1);
        query.columns = columns;
        let mut page = self.read(&query).await?;
        Ok(if page.rows.is_empty() { None } else { Some(page.rows.swap_remove(0)) })
    }

    pub async fn cas(&self, cas: Cas) -> StoreResult<CasOutcome> {
        validate_cas(&cas)?;
        let result = self.timed("cas", self.engine.cas(cas)).await;
        self.note_write(&result);
        result
    }

    /// One step of a token-ordered scan: partitions in the query's token
    /// range after its position, with the static columns it names, and the
    /// plain position to resume from (jobs checkpoint it as it is).
    pub async fn scan_range(&self, query: &ScanQuery) -> StoreResult<ScanRows> {
        validate_scan(query)?;
        let limit = query.limit as usize;
        let mut partitions = self.timed("scan", self.engine.scan(query)).await?;
        let mut next = None;
        if partitions.len() > limit {
            partitions.truncate(limit);
            next = partitions.last().map(ScannedPartition::position);
        }
        Ok(ScanRows { partitions, next })
    }

    /// Every row of a partition read, as a stream that fetches a page of
    /// `query.limit` rows (1000 when unset) at a time: a partition of any
    /// size is walked in constant memory.
    pub fn rows(&self, query: ReadQuery) -> impl Stream<Item = StoreResult<Row>> + Send + 'static {
        let page = query.limit.unwrap_or(DEFAULT_STREAM_PAGE);
        let start = query.limit(page);
        paged(self.clone(), Some(start), |store, query| async move {
            let page = store.read(&query).await?;
            let next = page.next.map(|token| query.clone().page_token(Some(token)));
            Ok((page.rows, next))
        })
    }

    /// Every partition of a scan, as a stream that takes `query.limit`
    /// partitions at a time.
    pub fn partitions(&self, query: ScanQuery) -> impl Stream<Item = StoreResult<ScannedPartition>> + Send + 'static {
        paged(self.clone(), Some(query), |store, query| async move {
            let step = store.scan_range(&query).await?;
            let next = step.next.map(|after| query.clone().after(Some(after)));
            Ok((step.partitions, next))
        })
    }

    pub async fn ping(&self) -> StoreResult<()> {
        self.timed("ping", self.engine.ping()).await
    }

    /// What the engine holds of up to `query.limit` partitions (see [`Holdings`]).
    pub async fn holdings(&self, query: &ScanQuery) -> StoreResult<Holdings> {
        if query.limit == 0 {
            return Err(StoreError::Invalid("a holdings step needs a limit of at least one partition".into()));
        }
        self.timed("holdings", self.engine.holdings(query)).await
    }

    pub async fn purge_expired(&self) -> StoreResult<PurgeStats> {
        self.timed("purge", self.engine.purge_expired()).await
    }

    /// What the storage keeps on disk for one copy of the table (see [`Engine::disk_usage`]).
    pub async fn disk_usage(&self, table: &'static TableDef) -> StoreResult<Option<DiskUsage>> {
        self.timed("disk_usage", self.engine.disk_usage(table)).await
    }

    /// How reads of the table fare on the storage nodes (see [`Engine::read_health`]).
    pub async fn read_health(&self, table: &'static TableDef) -> StoreResult<Option<ReadHealth>> {
        self.timed("read_health", self.engine.read_health(table)).await
    }
}

/// What a page token is bound to: the table, the partition, the slice and the order.
fn read_scope(q: &ReadQuery) -> Vec<u8> {
    let mut scope = format!("read|{}|{:?}|", q.table.name, q.order).into_bytes();
    scope.extend_from_slice(&encode_values(&q.partition));
    scope.extend_from_slice(&encode_values(&q.slice.prefix));
    for bound in [&q.slice.lower, &q.slice.upper] {
        match bound {
            Bound::Unbounded => scope.push(0),
            Bound::Included(v) => {
                scope.push(1);
                scope.extend_from_slice(&encode_values(std::slice::from_ref(v)));
            }
            Bound::Excluded(v) => {
                scope.push(2);
                scope.extend_from_slice(&encode_values(std::slice::from_ref(v)));
            }
        }
    }
    scope
}

/// The page size of [`Store::rows`] when the query sets none.
const DEFAULT_STREAM_PAGE: u32 = 1000;

/// Items fetched a page at a time: `fetch` answers a page and the query of the
/// next one (`None`: done). An error ends the stream after it is yielded.
/// Fused: polling it after its end answers the end again (callers chain it
/// after peeking at its first item).
fn paged<Q, T, F, Fut>(store: Store, first: Option<Q>, fetch: F) -> impl Stream<Item = StoreResult<T>> + Send + 'static
where
    Q: Send + 'static,
    T: Send + 'static,
    F: Fn(Store, Q) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = StoreResult<(Vec<T>, Option<Q>)>> + Send,
{
    let state = (store, first, std::collections::VecDeque::<T>::new());
    futures_util::stream::unfold((state, fetch), |((store, mut next, mut buffer), fetch)| async move {
        loop {
            if let Some(item) = buffer.pop_front() {
                return Some((Ok(item), ((store, next, buffer), fetch)));
            }
            let query = next.take()?;
            match fetch(store.clone(), query).await {
                Ok((items, following)) => {
                    buffer.extend(items);
                    next = following;
                }
                Err(e) => return Some((Err(e), ((store, None, buffer), fetch))),
            }
        }
    })
    .fuse()
}
