//! The Cassandra/ScyllaDB engine, through the `scylla` driver.
//!
//! One session per engine (per process), statements prepared once and reused
//! (token-aware routing follows from preparing: the driver knows where each
//! partition key lives), consistency LOCAL_QUORUM for reads and writes and
//! LOCAL_SERIAL for conditions unless configured otherwise. Every request has a
//! client-side timeout, so a stopped cluster makes calls fail with
//! [`StoreError::Unavailable`] instead of hanging; the driver reconnects on its
//! own when nodes come back.
//!
//! Cassandra-only behaviour worth knowing, all handled here:
//! - CQL has no `OR`, so resuming a page after (a, b) runs "a = x AND b > y",
//!   then "a > x" ([`cql::reads`]);
//! - a range delete over every row is written as `first_clustering >= min`,
//!   since a bare partition delete would also remove the static cells;
//! - `USING TIMESTAMP` cannot be combined with a condition, so conditional
//!   writes take the server's (Paxos) timestamp, as on the embedded engine;
//! - plain writes always carry a timestamp (this process's clock when the
//!   caller gave none), so the driver may retry them on another node;
//! - ScyllaDB keyspaces are created with tablets off (lightweight transactions).

mod cas;
pub(crate) mod cql;
mod options;
mod table_metrics;
mod tls;

pub use options::{CassandraOptions, ConsistencyLevel};
pub use tls::CassandraTls;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicI64;

use async_trait::async_trait;
use revstore_schema::cql::{Flavor, Replication, add_column, alter_options, create_keyspace, create_table, table_options};
use revstore_schema::{Column, ColumnKind, Order, TableDef};
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::errors::{ExecutionError, NewSessionError, PrepareError, RequestAttemptError};
use scylla::frame::types::{Consistency, SerialConsistency};
use scylla::response::query_result::QueryResult;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlValue;

use crate::error::{StoreError, StoreResult};
use crate::ops::{Cas, CasOutcome, DiskUsage, Holdings, PurgeStats, ReadHealth, ReadQuery, ScanQuery, ScannedPartition, Write};
use crate::store::{Engine, EngineKind};
use crate::value::{Row, Value, cmp_keys};
use cql::{Statement, from_cql};

pub struct CassandraEngine {
    session: Session,
    keyspace: String,
    flavor: Flavor,
    replication: Replication,
    prepared: Mutex<HashMap<String, PreparedStatement>>,
    /// The serial consistency of conditional writes serialised within the site.
    serial_consistency: SerialConsistency,
    /// The site this engine writes in (from the replication setting).
    site: crate::Site,
    /// Whether conditional writes serialised across sites run at SERIAL (or,
    /// for a switchover with every other site down, as those within the site).
    serial_across_sites: bool,
    metrics_service: &'static str,
    /// Per table, the widest token slice a holdings scan got through (see
    /// [`Engine::holdings`] below); absent: the whole range.
    holdings_slices: Mutex<HashMap<&'static str, u64>>,
    /// The last write timestamp this engine handed out (see [`Engine::apply`] below).
    last_ts: AtomicI64,
}

/// The narrowest slice a holdings step narrows to: 1/65,536 of the ring.
const MIN_HOLDINGS_SLICE: u64 = 1 << 48;

impl std::fmt::Debug for CassandraEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CassandraEngine").field("keyspace", &self.keyspace).field("flavor", &self.flavor).finish()
    }
}

impl CassandraEngine {
    /// Connects to the cluster. The keyspace is created by [`Engine::ensure_tables`].
    pub async fn connect(options: CassandraOptions) -> StoreResult<Self> {
        if !revstore_schema::model::is_identifier(&options.keyspace) {
            return Err(StoreError::invalid(format!("keyspace {:?} is not a lower-case identifier", options.keyspace)));
        }
        let site = options.site().map_err(StoreError::invalid)?;
        let profile = ExecutionProfile::builder()
            .consistency(options.consistency.into())
            .serial_consistency(Some(options.serial_consistency))
            .request_timeout(Some(options.request_timeout))
            .build();
        let mut builder = SessionBuilder::new()
            .known_nodes(&options.contact_points)
            .connection_timeout(options.connect_timeout)
            .default_execution_profile_handle(profile.into_handle());
        if let Some(dc) = &options.datacenter {
            builder = builder.prefer_datacenter(dc.clone());
        }
        if let Some((user, password)) = &options.credentials {
            builder = builder.user(user, password);
        }
        if let Some(tls) = &options.tls {
            builder = builder.tls_context(Some(tls.client_config().map_err(StoreError::invalid)?));
        }
        let session = builder.build().await.map_err(|e: NewSessionError| {
            StoreError::Unavailable(format!("cannot connect to Cassandra at {}: {e}", options.contact_points.join(",")))
        })?;
        let replication = options.keyspace_replication();
        // ScyllaDB has system.versions; Cassandra does not.
        let flavor = match session.query_unpaged("SELECT version FROM system.versions", ()).await {
            Ok(_) => Flavor::Scylla,
            Err(_) => Flavor::Cassandra,
        };
        // Exported from the start, at 0, for the alert on uncertain conditional writes.
        metrics::counter!("storage_cas_unknown_outcomes_total", "service" => options.metrics_service, "engine" => "cassandra").increment(0);
        Ok(CassandraEngine {
            session,
            keyspace: options.keyspace,
            flavor,
            replication,
            site,
            prepared: Mutex::new(HashMap::new()),
            serial_consistency: options.serial_consistency,
            serial_across_sites: options.serial_across_sites,
            metrics_service: options.metrics_service,
            holdings_slices: Mutex::new(HashMap::new()),
            last_ts: AtomicI64::new(i64::MIN),
        })
    }

    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    pub fn keyspace(&self) -> &str {
        &self.keyspace
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    async fn prepare(&self, cql: &str) -> StoreResult<PreparedStatement> {
        if let Some(p) = self.prepared.lock().unwrap_or_else(|p| p.into_inner()).get(cql) {
            return Ok(p.clone());
        }
        let mut prepared = self.session.prepare(cql).await.map_err(prepare_error)?;
        prepared.set_is_idempotent(is_idempotent(cql));
        self.prepared.lock().unwrap_or_else(|p| p.into_inner()).insert(cql.to_owned(), prepared.clone());
        Ok(prepared)
    }

    async fn execute(&self, statement: &Statement) -> StoreResult<QueryResult> {
        self.send(statement).await?.map_err(execution_error)
    }

    /// Runs statements as one batch: unlogged within one partition, logged across partitions.
    async fn batch(&self, statements: &[Statement], single_partition: bool) -> StoreResult<QueryResult> {
        self.send_batch(statements, single_partition).await?.map_err(execution_error)
    }

    /// Sends a statement; the outer error is one before sending (preparing it),
    /// the inner one the request's, for callers that must tell how it failed.
    async fn send(&self, statement: &Statement) -> StoreResult<Result<QueryResult, ExecutionError>> {
        self.send_at(statement, None).await
    }

    /// [`Self::send`], a conditional statement's Paxos run at `serial` when given (the session's otherwise).
    async fn send_at(&self, statement: &Statement, serial: Option<SerialConsistency>) -> StoreResult<Result<QueryResult, ExecutionError>> {
        let mut prepared = self.prepare(&statement.cql).await?;
        if serial.is_some() {
            prepared.set_serial_consistency(serial);
        }
        Ok(self.session.execute_unpaged(&prepared, &statement.values).await)
    }

    async fn send_batch(&self, statements: &[Statement], single_partition: bool) -> StoreResult<Result<QueryResult, ExecutionError>> {
        self.send_batch_at(statements, single_partition, None).await
    }

    /// [`Self::send_batch`], a conditional batch's Paxos run at `serial` when given.
    async fn send_batch_at(
        &self,
        statements: &[Statement],
        single_partition: bool,
        serial: Option<SerialConsistency>,
    ) -> StoreResult<Result<QueryResult, ExecutionError>> {
        let mut batch = Batch::new(if single_partition { BatchType::Unlogged } else { BatchType::Logged });
        if serial.is_some() {
            batch.set_serial_consistency(serial);
        }
        let mut values = Vec::with_capacity(statements.len());
        // Prepare everything first: a statement that cannot be prepared fails the
        // batch before anything is sent.
        for s in statements {
            batch.append_statement(self.prepare(&s.cql).await?);
            values.push(&s.values);
        }
        batch.set_is_idempotent(statements.iter().all(|s| is_idempotent(&s.cql)));
        Ok(self.session.batch(&batch, values).await)
    }

    /// Rows of a result as our rows, by column name; the `[applied]` column is skipped.
    fn rows(&self, result: QueryResult, t: &TableDef) -> StoreResult<Vec<(Option<bool>, Row)>> {
        let rows = result.into_rows_result().map_err(|e| StoreError::Internal(format!("not a rows result: {e}")))?;
        let specs: Vec<String> = rows.column_specs().iter().map(|s| s.name().to_owned()).collect();
        let mut out = Vec::new();
        for row in rows.rows::<scylla::value::Row>().map_err(|e| StoreError::Internal(e.to_string()))? {
            let row = row.map_err(|e| StoreError::Internal(e.to_string()))?;
            let mut applied = None;
            let mut cells = Vec::with_capacity(specs.len());
            for (name, value) in specs.iter().zip(row.columns) {
                if name == "[applied]" {
                    applied = match value {
                        Some(CqlValue::Boolean(b)) => Some(b),
                        _ => None,
                    };
                    continue;
                }
                let Some(column) = t.column(name) else { continue };
                cells.push((column.name, from_cql(column.ty, value)?));
            }
            out.push((applied, Row::new(cells)));
        }
        Ok(out)
    }

    /// Compares a table in the cluster with its declaration.
    /// The declared static and regular columns the cluster's table lacks, if
    /// every column it has is declared as it is (otherwise `check_table` says what differs).
    async fn columns_to_add(&self, t: &TableDef) -> StoreResult<Vec<&'static Column>> {
        let found = self.table_columns(t).await?;
        let declared_as_found = found.iter().all(|(name, _)| t.columns.iter().any(|c| c.name == name));
        if !declared_as_found {
            return Ok(Vec::new());
        }
        Ok(t.columns.iter().filter(|c| matches!(c.kind, ColumnKind::Static | ColumnKind::Regular) && !found.contains_key(c.name)).collect())
    }

    /// Whether the cluster's table has the declared compaction and gc_grace_seconds.
    async fn options_applied(&self, t: &TableDef) -> StoreResult<bool> {
        let result = self
            .session
            .query_unpaged(
                "SELECT compaction, gc_grace_seconds FROM system_schema.tables WHERE keyspace_name = ? AND table_name = ?",
                (&self.keyspace, t.name),
            )
            .await
            .map_err(execution_error)?;
        let rows = result.into_rows_result().map_err(|e| StoreError::Internal(e.to_string()))?;
        let found = rows.maybe_first_row::<(HashMap<String, String>, i32)>().map_err(|e| StoreError::Internal(e.to_string()))?;
        Ok(found.is_some_and(|(compaction, gc_grace)| table_options(t).applied_in(&compaction, gc_grace)))
    }

    /// The columns of the cluster's table: name → (kind, type, clustering order).
    async fn table_columns(&self, t: &TableDef) -> StoreResult<HashMap<String, (String, String, String)>> {
        let result = self
            .session
            .query_unpaged(
                "SELECT column_name, kind, type, clustering_order FROM system_schema.columns WHERE keyspace_name = ? AND table_name = ?",
                (&self.keyspace, t.name),
            )
            .await
            .map_err(execution_error)?;
        let rows = result.into_rows_result().map_err(|e| StoreError::Internal(e.to_string()))?;
        let mut found = HashMap::new();
        for row in rows.rows::<(String, String, String, String)>().map_err(|e| StoreError::Internal(e.to_string()))? {
            let (name, kind, ty, order) = row.map_err(|e| StoreError::Internal(e.to_string()))?;
            found.insert(name, (kind, ty, order));
        }
        Ok(found)
    }

    async fn check_table(&self, t: &TableDef) -> StoreResult<()> {
        let found = self.table_columns(t).await?;
        let mismatch = |what: String| Err(StoreError::SchemaMismatch(format!("table {}.{}: {what}", self.keyspace, t.name)));
        if found.len() != t.columns.len() {
            return mismatch(format!("{} columns in the cluster, {} declared", found.len(), t.columns.len()));
        }
        for c in t.columns {
            let Some((kind, ty, order)) = found.get(c.name) else { return mismatch(format!("column {} is missing", c.name)) };
            let (want_kind, want_order) = match c.kind {
                ColumnKind::PartitionKey => ("partition_key", "none"),
                ColumnKind::Clustering(Order::Asc) => ("clustering", "asc"),
                ColumnKind::Clustering(Order::Desc) => ("clustering", "desc"),
                ColumnKind::Static => ("static", "none"),
                ColumnKind::Regular => ("regular", "none"),
            };
            if kind != want_kind || ty != c.ty.cql() || order != want_order {
                return mismatch(format!("column {} is {kind} {ty} {order}, declared {want_kind} {} {want_order}", c.name, c.ty.cql()));
            }
        }
        Ok(())
    }

    /// Whether the writes are one mutation: one partition key (its values
    /// typed, so the same bytes), in one table or several of the keyspace.
    fn single_partition(writes: &[Write]) -> bool {
        writes.iter().all(|w| w.partition() == writes[0].partition())
    }

    fn statement_for(&self, w: &Write) -> Statement {
        match w {
            Write::Upsert(u) => cql::insert(&self.keyspace, u, false),
            Write::Delete(d) => cql::delete(&self.keyspace, d),
        }
    }

    /// The consistency of a read from every site: EACH_QUORUM where the
    /// keyspace spans several datacenters (ScyllaDB refuses it for reads, and
    /// the read fails saying so); with one, the session's own.
    fn across_sites(&self, wanted: bool) -> Option<Consistency> {
        (wanted && self.site.count > 1).then_some(Consistency::EachQuorum)
    }

    /// [`Engine::read`], at `consistency` when given (the session's otherwise).
    async fn read_at(
        &self,
        query: &ReadQuery,
        after: Option<Vec<Value>>,
        consistency: Option<Consistency>,
    ) -> StoreResult<(Vec<Row>, Option<Row>)> {
        let t = query.table;
        let wanted = |c: &&Column| query.columns.as_ref().is_none_or(|cols| cols.contains(&c.name));
        let regular: Vec<&Column> = t.regular().filter(wanted).collect();
        let statics: Vec<&Column> = t.statics().filter(wanted).collect();
        // Static cells come back with every row that a SELECT naming them
        // returns: read with the rows, in the same snapshot, at no second
        // round trip; only a read that finds no row asks for them apart.
        let selected: Vec<&Column> = regular.iter().chain(statics.iter()).copied().collect();
        let is_static = |name: &str| statics.iter().any(|c| c.name == name);
        let (mut rows, mut with_rows) = (Vec::new(), None);
        for statement in cql::reads(&self.keyspace, t, &query.partition, &query.slice, query.order, after.as_deref(), &selected) {
            let remaining = query.limit.map(|l| (l as usize + query.lookahead()).saturating_sub(rows.len()) as u32);
            if remaining == Some(0) {
                break;
            }
            // `select` asks for one more than the limit; the store trims.
            let found = self.select(statement, remaining.map(|r| r - 1), t, consistency).await?;
            for mut row in found {
                if !statics.is_empty() {
                    let cells = row.split_off(is_static);
                    with_rows.get_or_insert(cells);
                }
                // A partition with static cells but no rows answers with one row whose
                // clustering columns are null: that is not a row.
                if t.clustering().all(|(c, _)| row.get(c.name).is_some()) {
                    rows.push(row);
                }
            }
        }
        if let Some(limit) = query.limit {
            rows.truncate(limit as usize + query.lookahead());
        }
        let static_row = if statics.is_empty() {
            None
        } else if let Some(found) = with_rows {
            Some(found).filter(|r| r.columns().any(|(_, v)| !v.is_null()))
        } else {
            let statement = cql::read_statics(&self.keyspace, t, &query.partition, &statics);
            let mut prepared = self.prepare(&statement.cql).await?;
            if let Some(consistency) = consistency {
                prepared.set_consistency(consistency);
            }
            let result = self.session.execute_unpaged(&prepared, &statement.values).await.map_err(execution_error)?;
            self.rows(result, t)?
                .into_iter()
                .next()
                .map(|(_, r)| Row::new(statics.iter().map(|c| (c.name, r.get(c.name).cloned().unwrap_or(Value::Null))).collect()))
                .filter(|r| r.columns().any(|(_, v)| !v.is_null()))
        };
        Ok((rows, static_row))
    }

    async fn select(
        &self,
        statement: Statement,
        limit: Option<u32>,
        t: &TableDef,
        consistency: Option<Consistency>,
    ) -> StoreResult<Vec<Row>> {
        let mut statement = statement;
        // `LIMIT ?` takes an int; with no limit, the cluster's own maximum.
        statement.values.push(Some(CqlValue::Int(limit.map_or(i32::MAX, |l| l.min(i32::MAX as u32 - 1) as i32 + 1))));
        let mut prepared = self.prepare(&statement.cql).await?;
        if let Some(consistency) = consistency {
            prepared.set_consistency(consistency);
        }
        let mut rows = Vec::new();
        let mut paging = scylla::response::PagingState::start();
        // Large partitions come back in driver pages; the client only ever sees our tokens.
        loop {
            let (result, next) = self.session.execute_single_page(&prepared, &statement.values, paging).await.map_err(execution_error)?;
            rows.extend(self.rows(result, t)?.into_iter().map(|(_, r)| r));
            match next.into_paging_control_flow() {
                std::ops::ControlFlow::Continue(state) => paging = state,
                std::ops::ControlFlow::Break(()) => return Ok(rows),
            }
        }
    }
}

#[async_trait]
impl Engine for CassandraEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Cassandra
    }

    async fn ensure_tables(&self, tables: &[&'static TableDef]) -> StoreResult<()> {
        // A table just created may be unknown yet to the node that takes a
        // later statement (the schema still spreading under load, or replicas
        // of one service creating it at once): once the nodes agree, it is.
        let mut attempt = 0;
        loop {
            match self.ensure_tables_once(tables).await {
                Err(e) if attempt < SCHEMA_RACE_RETRIES && is_schema_race(&e) => {
                    attempt += 1;
                    tracing::info!(keyspace = %self.keyspace, attempt, error = %e, "a table not yet known on every node: waiting for the nodes to agree, then again");
                    self.session.await_schema_agreement().await.map_err(|e| StoreError::Unavailable(format!("schema agreement: {e}")))?;
                    tokio::time::sleep(std::time::Duration::from_secs(u64::from(attempt))).await;
                }
                outcome => return outcome,
            }
        }
    }

    /// Writes without a timestamp of their own are stamped here, once, with
    /// one timestamp for all of them (as a coordinator stamps a batch): the
    /// statement then carries it, so the driver may resend it to another node
    /// when the first fails mid-request without the copy landing later than
    /// the original would have ([`is_idempotent`]). The clock is this
    /// process's, the one the services check tids and skew against.
    fn site(&self) -> crate::Site {
        self.site
    }

    fn now_micros(&self) -> i64 {
        crate::clock::next_timestamp(&self.last_ts, crate::clock::Clock::now_micros(&crate::clock::SystemClock))
    }

    async fn apply(&self, mut writes: Vec<Write>) -> StoreResult<()> {
        if writes.iter().any(|w| w.timestamp().is_none()) {
            let now = self.now_micros();
            for w in &mut writes {
                w.stamp_if_untimed(now);
            }
        }
        let statements: Vec<Statement> = writes.iter().map(|w| self.statement_for(w)).collect();
        if let [only] = statements.as_slice() {
            self.execute(only).await?;
        } else {
            self.batch(&statements, Self::single_partition(&writes)).await?;
        }
        Ok(())
    }

    async fn read(&self, query: &ReadQuery, after: Option<Vec<Value>>) -> StoreResult<(Vec<Row>, Option<Row>)> {
        self.read_at(query, after, self.across_sites(query.across_sites)).await
    }

    async fn cas(&self, c: Cas) -> StoreResult<CasOutcome> {
        self.conditional_write(c).await
    }

    async fn scan(&self, query: &ScanQuery) -> StoreResult<Vec<ScannedPartition>> {
        let t = query.table;
        let pk: Vec<&Column> = t.partition_key().collect();
        let statics: Vec<&Column> = query.statics.iter().filter_map(|name| t.column(name)).collect();
        let limit = query.limit;
        let mut out = Vec::new();
        let mut from = query.range.after;
        if let Some(after) = query.after.as_ref().filter(|p| !p.key.is_empty()) {
            // Partitions sharing the position's token (a hash collision) come first.
            let cql = cql::scan(&self.keyspace, t, &query.statics, true);
            let same = self.scan_page(&pk, &statics, &cql, &[after.token], limit + 1, query.across_sites).await?;
            out.extend(same.into_iter().filter(|p| cmp_keys(&p.key, &after.key).is_gt()));
            from = after.token;
        }
        if let Some(after) = query.after.as_ref().filter(|p| p.key.is_empty()) {
            from = after.token;
        }
        let remaining = (limit as usize + 1).saturating_sub(out.len()) as u32;
        if remaining > 0 && from < query.range.through {
            let cql = cql::scan(&self.keyspace, t, &query.statics, false);
            out.extend(self.scan_page(&pk, &statics, &cql, &[from, query.range.through], remaining, query.across_sites).await?);
        }
        out.sort_by(|a, b| a.token.cmp(&b.token).then_with(|| cmp_keys(&a.key, &b.key)));
        out.truncate(limit as usize + 1);
        Ok(out)
    }

    /// Live holdings, a token slice at a time when need be: a scan reads
    /// through every expired cell in its range before it finds live ones, and
    /// on a table whose rows expired (the grace tables after a quiet period,
    /// until compaction drops them) a scan of a wide range is aborted by
    /// `tombstone_failure_threshold`. A failed scan is retried over a quarter
    /// of the slice, and the slice that worked is remembered for the table.
    async fn holdings(&self, query: &ScanQuery) -> StoreResult<Holdings> {
        let table = query.table.name;
        let mut slice = self.holdings_slices.lock().unwrap_or_else(|p| p.into_inner()).get(table).copied().unwrap_or(u64::MAX);
        loop {
            match crate::holdings::live_holdings(self, query, slice).await {
                Err(StoreError::Unavailable(why)) if slice > MIN_HOLDINGS_SLICE => {
                    slice /= 4;
                    tracing::warn!(table, slice_of_ring = slice as f64 / u64::MAX as f64, error = %why, "holdings scan failed; narrowing its token slice");
                    self.holdings_slices.lock().unwrap_or_else(|p| p.into_inner()).insert(table, slice);
                }
                answer => return answer,
            }
        }
    }

    async fn ping(&self) -> StoreResult<()> {
        self.session.query_unpaged("SELECT release_version FROM system.local", ()).await.map_err(execution_error)?;
        Ok(())
    }

    async fn purge_expired(&self) -> StoreResult<PurgeStats> {
        // Cassandra drops expired cells and old tombstones in compaction.
        Ok(PurgeStats::default())
    }

    async fn disk_usage(&self, table: &'static TableDef) -> StoreResult<Option<DiskUsage>> {
        self.table_disk_usage(table).await
    }

    async fn read_health(&self, table: &'static TableDef) -> StoreResult<Option<ReadHealth>> {
        self.table_read_health(table).await
    }
}

impl CassandraEngine {
    async fn scan_page(
        &self,
        pk: &[&Column],
        statics: &[&Column],
        cql: &str,
        tokens: &[i64],
        limit: u32,
        across_sites: bool,
    ) -> StoreResult<Vec<ScannedPartition>> {
        let mut prepared = self.prepare(cql).await?;
        if let Some(consistency) = self.across_sites(across_sites) {
            prepared.set_consistency(consistency);
        }
        let mut values: Vec<Option<CqlValue>> = tokens.iter().map(|t| Some(CqlValue::BigInt(*t))).collect();
        values.push(Some(CqlValue::Int(limit.min(i32::MAX as u32) as i32)));
        let result = self.session.execute_unpaged(&prepared, &values).await.map_err(execution_error)?;
        let rows = result.into_rows_result().map_err(|e| StoreError::Internal(e.to_string()))?;
        let mut out = Vec::new();
        for row in rows.rows::<scylla::value::Row>().map_err(|e| StoreError::Internal(e.to_string()))? {
            let mut columns = row.map_err(|e| StoreError::Internal(e.to_string()))?.columns.into_iter();
            let token = match columns.next().flatten() {
                Some(CqlValue::BigInt(t)) => t,
                other => return Err(StoreError::Internal(format!("token() returned {other:?}"))),
            };
            let key = pk.iter().zip(columns.by_ref()).map(|(c, v)| from_cql(c.ty, v)).collect::<StoreResult<Vec<_>>>()?;
            let cells = statics.iter().zip(columns).map(|(c, v)| Ok((c.name, from_cql(c.ty, v)?))).collect::<StoreResult<Vec<_>>>()?;
            let statics = (!cells.iter().all(|(_, v)| v.is_null())).then(|| Row::new(cells));
            out.push(ScannedPartition { token, key, statics });
        }
        Ok(out)
    }
}

/// Whether sending `cql` twice does what sending it once does, so the driver
/// may try it on another node when a node fails mid-request (its default
/// policy retries only such requests): reads, and writes with their own
/// timestamp (every plain write: `apply` stamps those that come without). A
/// write without one would take the coordinator's clock, so a retry could land
/// above a later write; a condition must never run twice.
fn is_idempotent(cql: &str) -> bool {
    cql.starts_with("SELECT") || (cql.contains("TIMESTAMP ?") && !cql.contains(" IF "))
}

/// Errors from a request, by who must act.
fn execution_error(e: ExecutionError) -> StoreError {
    match &e {
        ExecutionError::RequestTimeout(_) | ExecutionError::ConnectionPoolError(_) | ExecutionError::EmptyPlan => {
            StoreError::Unavailable(e.to_string())
        }
        ExecutionError::PrepareError(p) => classify_prepare(p, e.to_string()),
        ExecutionError::LastAttemptError(attempt) => classify_attempt(attempt, e.to_string()),
        _ => StoreError::Internal(e.to_string()),
    }
}

fn prepare_error(e: PrepareError) -> StoreError {
    let message = e.to_string();
    classify_prepare(&e, message)
}

fn classify_prepare(e: &PrepareError, message: String) -> StoreError {
    match e {
        PrepareError::ConnectionPoolError(_) => StoreError::Unavailable(message),
        PrepareError::AllAttemptsFailed { first_attempt } => classify_attempt(first_attempt, message),
        _ => StoreError::Internal(message),
    }
}

fn classify_attempt(e: &RequestAttemptError, message: String) -> StoreError {
    use scylla::errors::DbError;
    match e {
        RequestAttemptError::DbError(db, _) => match db {
            DbError::Unavailable { .. } => StoreError::Unavailable(format!("{REPLICAS_DOWN}{message}")),
            DbError::ReadTimeout { .. }
            | DbError::WriteTimeout { .. }
            | DbError::ReadFailure { .. }
            | DbError::WriteFailure { .. }
            | DbError::Overloaded
            | DbError::IsBootstrapping
            | DbError::RateLimitReached { .. } => StoreError::Unavailable(message),
            DbError::Invalid if message.contains("unconfigured table") || message.contains("does not exist") => {
                StoreError::SchemaMismatch(message)
            }
            _ => StoreError::Internal(message),
        },
        RequestAttemptError::BrokenConnectionError(_) | RequestAttemptError::UnableToAllocStreamId => StoreError::Unavailable(message),
        _ => StoreError::Internal(message),
    }
}

/// Begins the message of an unavailable error that the coordinator raised
/// without asking anyone, because it knows too few replicas are alive (a node
/// down, a datacenter cut off): unlike a timeout, asking again in a moment
/// meets the same answer.
const REPLICAS_DOWN: &str = "too few replicas alive: ";

/// Whether `error` is the coordinator's "too few replicas alive".
fn replicas_known_down(error: &StoreError) -> bool {
    matches!(error, StoreError::Unavailable(why) if why.starts_with(REPLICAS_DOWN))
}

/// How often creating the tables is tried again after a node did not know a
/// table yet.
const SCHEMA_RACE_RETRIES: u32 = 3;

/// Whether a schema statement failed because a node did not know a table
/// that another had just created.
fn is_schema_race(error: &StoreError) -> bool {
    let text = error.to_string();
    text.contains("Unknown CF") || text.contains("unconfigured table")
}

impl CassandraEngine {
    async fn ensure_tables_once(&self, tables: &[&'static TableDef]) -> StoreResult<()> {
        let ddl = create_keyspace(&self.keyspace, &self.replication, self.flavor);
        self.session.query_unpaged(ddl, ()).await.map_err(execution_error)?;
        for t in tables {
            self.session.query_unpaged(create_table(&self.keyspace, t), ()).await.map_err(execution_error)?;
            // A newer declaration that only adds columns is applied in place.
            let missing = self.columns_to_add(t).await?;
            for c in &missing {
                self.session.query_unpaged(add_column(&self.keyspace, t, c), ()).await.map_err(execution_error)?;
            }
            // So are its options (compaction, gc_grace_seconds): they change
            // how the nodes keep the data, not what is stored.
            let options_changed = !self.options_applied(t).await?;
            if options_changed {
                self.session.query_unpaged(alter_options(&self.keyspace, t), ()).await.map_err(execution_error)?;
            }
            if !missing.is_empty() || options_changed {
                self.session.await_schema_agreement().await.map_err(|e| StoreError::Unavailable(format!("schema agreement: {e}")))?;
            }
            self.check_table(t).await?;
        }
        self.session.await_schema_agreement().await.map_err(|e| StoreError::Unavailable(format!("schema agreement: {e}")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::KV;
    use crate::ops::Upsert;

    #[test]
    fn a_table_unknown_to_one_node_is_a_schema_race() {
        let unknown = "Database returned an error: Internal server error. Error message: java.lang.IllegalArgumentException: Unknown CF 07cd7520-f03e-11f1-9b51-8378bbd3721a";
        assert!(is_schema_race(&StoreError::Internal(unknown.into())));
        assert!(!is_schema_race(&StoreError::Unavailable("no node answered".into())));
    }

    #[test]
    fn only_the_coordinators_unavailable_says_replicas_are_known_down() {
        use scylla::errors::DbError;
        use scylla::frame::types::Consistency;
        let attempt = |db| RequestAttemptError::DbError(db, "from the node".into());
        let down = DbError::Unavailable { consistency: Consistency::Serial, required: 3, alive: 2 };
        let error = classify_attempt(&attempt(down), "Not enough nodes are alive".into());
        assert!(matches!(error, StoreError::Unavailable(_)) && replicas_known_down(&error), "{error:?}");
        let slow = DbError::ReadTimeout { consistency: Consistency::Serial, received: 1, required: 2, data_present: false };
        let error = classify_attempt(&attempt(slow), "timed out".into());
        assert!(matches!(error, StoreError::Unavailable(_)) && !replicas_known_down(&error), "{error:?}");
    }

    #[test]
    fn only_reads_and_writes_with_their_own_timestamp_may_be_retried_elsewhere() {
        let timed = Upsert::new(&KV, [Value::from("k")]).set("v", "x").timestamp(42);
        let untimed = Upsert::new(&KV, [Value::from("k")]).set("v", "x");
        assert!(is_idempotent(&cql::insert("ks", &timed, false).cql));
        assert!(!is_idempotent(&cql::insert("ks", &untimed, false).cql), "a retry would take a later coordinator timestamp");
        assert!(!is_idempotent(&cql::insert("ks", &timed, true).cql), "a condition never runs twice");
        assert!(!is_idempotent(&cql::conditional_update("ks", &timed, &[("v", Value::from("x"))]).cql));
        assert!(is_idempotent(&cql::read_statics("ks", &KV, &[Value::from("k")], &[]).cql));
    }
}
