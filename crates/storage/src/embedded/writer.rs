//! The one writer of an embedded database.
//!
//! SQLite allows one writer at a time, so every write goes through this thread.
//! It commits in groups: it takes every job waiting in its queue (up to a
//! bound), runs each inside its own savepoint of one transaction, commits once,
//! and only then answers each job. One fsync is shared by many writers, and a
//! job that fails rolls back to its savepoint without touching the others. A
//! caller is answered `Ok` only after the commit that holds its write.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::Receiver;

use revstore_schema::{Column, TableDef};
use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OptionalExtension, params_from_iter};
use tokio::sync::oneshot;

use super::layout::{
    CellMeta, CellTable, ENGINE_TABLES_DDL, LAYOUT_VERSION, PID, ck_cols, create_statements, decode_slice, encode_slice, exp_col, from_sql,
    partition_token, pk_cols, purge_time, q, registry_of, registry_table, regular_cols, static_cols, stored_cell, to_sql, ts_col,
};
use super::query::{Sql, read_statics};
use crate::clock::Clock;
use crate::error::{StoreError, StoreResult};
use crate::ops::{Cas, CasOutcome, Condition, Delete, DeleteTarget, PurgeStats, ReadQuery, Slice, Upsert, Write};
use crate::value::{Row, Value, encode_values};

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

    fn ensure(&mut self, tables: &[&'static TableDef]) -> StoreResult<()> {
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let result = (|| {
            let layout: i64 = self.conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            let in_use: bool = self.conn.query_row("SELECT count(*) > 0 FROM sqlite_master WHERE name = '$tables'", [], |r| r.get(0))?;
            if in_use && layout != LAYOUT_VERSION {
                return Err(StoreError::SchemaMismatch(format!(
                    "the database has embedded layout {layout}, this build reads layout {LAYOUT_VERSION}; \
                     start from an empty data directory (re-import old-store's history with `revstore import`)"
                )));
            }
            // Written only when it changes: a start with nothing to create
            // writes nothing, so a service can start on a full disk.
            if layout != LAYOUT_VERSION {
                self.conn.execute_batch(&format!("PRAGMA user_version = {LAYOUT_VERSION}"))?;
            }
            for ddl in ENGINE_TABLES_DDL {
                self.conn.execute_batch(ddl)?;
            }
            for t in tables {
                // The declaration as CQL: clustering order and TTL included,
                // which the SQLite layout alone does not show.
                let declaration = revstore_schema::cql::create_table("embedded", t);
                let known: Option<String> =
                    self.conn.query_row("SELECT declaration FROM \"$tables\" WHERE name = ?1", [t.name], |r| r.get(0)).optional()?;
                match known {
                    Some(known) if known == declaration => {}
                    Some(known) if revstore_schema::cql::structure(&known) == revstore_schema::cql::structure(&declaration) => {
                        // A new comment or compaction strategy: nothing stored changes.
                        self.conn.execute("UPDATE \"$tables\" SET declaration = ?2 WHERE name = ?1", [t.name, declaration.as_str()])?;
                    }
                    Some(known) => {
                        // A newer declaration that only adds columns is applied
                        // in place (in this transaction); anything else is refused.
                        let added = revstore_schema::cql::added_columns("embedded", &known, t)
                            .filter(|added| added.iter().all(|c| super::layout::can_add_column(t, c)))
                            .ok_or_else(|| {
                                StoreError::SchemaMismatch(format!(
                                    "table {} exists with another declaration; migrate it before running this version",
                                    t.name
                                ))
                            })?;
                        for c in added {
                            for statement in super::layout::add_column_statements(t, c) {
                                self.conn.execute_batch(&statement)?;
                            }
                        }
                        self.conn.execute("UPDATE \"$tables\" SET declaration = ?2 WHERE name = ?1", [t.name, declaration.as_str()])?;
                    }
                    None => {
                        for s in create_statements(t) {
                            self.conn.execute_batch(&s)?;
                        }
                        self.conn.execute("INSERT INTO \"$tables\" (name, declaration) VALUES (?1, ?2)", [t.name, declaration.as_str()])?;
                    }
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => self.conn.execute_batch("COMMIT")?,
            Err(_) => self.conn.execute_batch("ROLLBACK")?,
        }
        result
    }

    fn apply(&mut self, writes: &[Write]) -> StoreResult<()> {
        for w in writes {
            match w {
                Write::Upsert(u) => {
                    let ts = match u.timestamp {
                        Some(ts) => ts,
                        None => self.next_ts(),
                    };
                    self.upsert(u, ts)?;
                }
                Write::Delete(d) => {
                    let ts = match d.timestamp {
                        Some(ts) => ts,
                        None => self.next_ts(),
                    };
                    self.delete(d, ts)?;
                }
            }
        }
        Ok(())
    }

    fn upsert(&mut self, u: &Upsert, ts: i64) -> StoreResult<()> {
        let t = u.table;
        let now = self.now();
        let pk_len = pk_cols(t).len();
        let (partition, clustering) = u.key.split_at(pk_len);
        let exp = match u.ttl.or(t.default_ttl) {
            None | Some(0) => None,
            Some(secs) => Some(now + secs as i64 * 1_000_000),
        };
        let tombstone_purge = now + self.gc_grace_micros;
        let cell_meta = |v: &Value| CellMeta { ts, exp: if v.is_null() { Some(tombstone_purge) } else { exp }, tombstone: v.is_null() };

        let shadows = self.tombstones_since(t, partition, ts)?;
        let token = partition_token(partition);
        let full_key = clustering.len() == t.clustering().count();
        if full_key && !shadows.iter().any(|s| s.as_ref().is_none_or(|slice| slice.contains(clustering))) {
            let rows = CellTable::rows(t);
            let cells = cells_of(&rows, &u.cells, cell_meta);
            let marker = CellMeta { ts, exp, tombstone: false };
            let pid = self.partition_id(t, partition, token)?;
            let key: Vec<Value> = std::iter::once(Value::BigInt(pid)).chain(clustering.iter().cloned()).collect();
            self.merge_cells(&rows, &key, Some(marker), cells)?;
        }
        let statics = CellTable::statics(t);
        let static_cells = cells_of(&statics, &u.cells, cell_meta);
        if !static_cells.is_empty() && !shadows.iter().any(Option::is_none) {
            let key: Vec<Value> = std::iter::once(Value::BigInt(token)).chain(partition.iter().cloned()).collect();
            self.merge_cells(&statics, &key, None, static_cells)?;
        }
        Ok(())
    }

    /// The registry id of a partition, registering the partition if it is new.
    fn partition_id(&mut self, t: &TableDef, partition: &[Value], token: i64) -> StoreResult<i64> {
        let registry = q(&registry_table(t));
        let pk: Vec<&Column> = pk_cols(t);
        let mut sql = Sql::default();
        sql.push(&format!("SELECT {} FROM {registry} WHERE ", q(PID)));
        sql.registry_eq(t, partition);
        let found: Option<i64> =
            self.conn.prepare_cached(&sql.text)?.query_row(params_from_iter(sql.params.iter()), |r| r.get(0)).optional()?;
        if let Some(pid) = found {
            return Ok(pid);
        }
        let mut sql = Sql::default();
        let mut values = vec![sql.bind(SqlValue::Integer(token))];
        values.extend(partition.iter().map(|v| sql.bind(to_sql(v))));
        let names: Vec<String> = std::iter::once("\"$token\"".to_owned()).chain(pk.iter().map(|c| q(c.name))).collect();
        sql.push(&format!("INSERT INTO {registry} ({}) VALUES ({})", names.join(", "), values.join(", ")));
        self.conn.prepare_cached(&sql.text)?.execute(params_from_iter(sql.params.iter()))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Drops a partition's registry row once it has neither static cells nor
    /// rows. `table` is the rows table; `statics` names its static columns.
    fn forget_if_empty(&mut self, table: &str, statics: &[String], pid: i64) -> StoreResult<()> {
        let no_statics: Vec<String> = statics.iter().map(|c| format!("{} IS NULL", q(&format!("{c}$ts")))).collect();
        let no_statics = if no_statics.is_empty() { "1".to_owned() } else { no_statics.join(" AND ") };
        let sql = format!(
            "DELETE FROM {} WHERE {pid} = ?1 AND {no_statics} AND NOT EXISTS (SELECT 1 FROM {} WHERE {pid} = ?1)",
            q(&registry_of(table)),
            q(table),
            pid = q(PID)
        );
        self.conn.prepare_cached(&sql)?.execute([pid])?;
        Ok(())
    }

    /// Writes the cells that win against what is stored (per-cell last write wins).
    /// `key` is the SQLite key of `table` (see [`CellTable::key_columns`]);
    /// `cells` are (index in `table.cols`, value, metadata).
    fn merge_cells(
        &mut self,
        table: &CellTable,
        key: &[Value],
        marker: Option<CellMeta>,
        cells: Vec<(usize, &Value, CellMeta)>,
    ) -> StoreResult<()> {
        let cols = &table.cols;
        let key_cols = table.key_columns();
        let existing = self.load_meta(table, &key_cols, key)?;
        let (old_marker, mut old_cells) = existing.unwrap_or((None, vec![None; cols.len()]));
        let marker_wins = match (marker, old_marker) {
            (Some(new), Some(old)) => new.marker_supersedes(&old),
            (Some(_), None) => true,
            (None, _) => false,
        };
        let mut winners = Vec::new();
        for (i, value, meta) in cells {
            let wins = match old_cells[i] {
                None => true,
                Some((old, _)) => meta.supersedes(&old, || {
                    let stored = self.load_value(&table.name, &key_cols, key, cols[i]).unwrap_or(Value::Null);
                    value.cql_bytes().cmp(&stored.cql_bytes())
                }),
            };
            if wins {
                old_cells[i] = None;
                winners.push((i, value, meta));
            }
        }
        if winners.is_empty() && !marker_wins {
            return Ok(());
        }
        let new_marker = if marker_wins { marker } else { old_marker };
        // A live cell written at the marker's timestamp does not store its own.
        let implicit = |meta: &CellMeta| table.marker && !meta.tombstone && new_marker.is_some_and(|m| m.ts == meta.ts);
        let purge =
            purge_time(new_marker.iter().chain(old_cells.iter().flatten().map(|(m, _)| m)).chain(winners.iter().map(|(_, _, m)| m)));

        let mut sql = Sql::default();
        let mut names: Vec<String> = key_cols.iter().map(|c| q(c)).collect();
        let mut values: Vec<String> = key.iter().map(|v| sql.bind(to_sql(v))).collect();
        let mut updates = Vec::new();
        if let Some(m) = marker {
            names.extend(["\"$ts\"".to_owned(), "\"$exp\"".to_owned()]);
            values.push(sql.bind(SqlValue::Integer(m.ts)));
            values.push(sql.bind(m.exp.map_or(SqlValue::Null, SqlValue::Integer)));
            if marker_wins {
                updates.extend(["\"$ts\" = excluded.\"$ts\"".to_owned(), "\"$exp\" = excluded.\"$exp\"".to_owned()]);
            }
        }
        for (i, value, meta) in &winners {
            let c = cols[*i];
            for name in [q(c.name), ts_col(c), exp_col(c)] {
                updates.push(format!("{name} = excluded.{name}"));
                names.push(name);
            }
            values.push(sql.bind(to_sql(value)));
            values.push(sql.bind(if implicit(meta) { SqlValue::Null } else { SqlValue::Integer(meta.ts) }));
            values.push(sql.bind(meta.exp.map_or(SqlValue::Null, SqlValue::Integer)));
        }
        // Cells that kept the old marker's timestamp keep it, now explicitly.
        for (c, old) in cols.iter().zip(&old_cells) {
            if let Some((meta, true)) = old
                && !implicit(meta)
            {
                updates.push(format!("{} = {}", ts_col(c), sql.bind(SqlValue::Integer(meta.ts))));
            }
        }
        names.push("\"$purge\"".into());
        values.push(sql.bind(purge.map_or(SqlValue::Null, SqlValue::Integer)));
        updates.push("\"$purge\" = excluded.\"$purge\"".into());
        sql.push(&format!(
            "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) DO UPDATE SET {}",
            q(&table.name),
            names.join(", "),
            values.join(", "),
            key_cols.iter().map(|c| q(c)).collect::<Vec<_>>().join(", "),
            updates.join(", ")
        ));
        self.conn.prepare_cached(&sql.text)?.execute(params_from_iter(sql.params.iter()))?;
        Ok(())
    }

    /// The stored write metadata of one row: its marker and each cell's, with
    /// whether the cell's timestamp is the marker's.
    #[allow(clippy::type_complexity)]
    fn load_meta(
        &self,
        table: &CellTable,
        key_cols: &[String],
        key: &[Value],
    ) -> StoreResult<Option<(Option<CellMeta>, Vec<Option<(CellMeta, bool)>>)>> {
        let cols = &table.cols;
        let mut select = vec!["\"$ts\"".to_owned(), "\"$exp\"".to_owned()];
        if !table.marker {
            select = vec!["NULL".into(), "NULL".into()];
        }
        for c in cols {
            select.push(format!("{} IS NULL", q(c.name)));
            select.push(ts_col(c));
            select.push(exp_col(c));
        }
        let mut sql = Sql::default();
        let cond: Vec<String> = key_cols.iter().zip(key).map(|(c, v)| format!("{} = {}", q(c), sql.bind(to_sql(v)))).collect();
        sql.push(&format!("SELECT {} FROM {} WHERE {}", select.join(", "), q(&table.name), cond.join(" AND ")));
        let mut stmt = self.conn.prepare_cached(&sql.text)?;
        let mut rows = stmt.query(params_from_iter(sql.params.iter()))?;
        let Some(r) = rows.next()? else { return Ok(None) };
        let marker_ts: Option<i64> = r.get(0)?;
        let marker = marker_ts.map(|ts| Ok::<_, rusqlite::Error>(CellMeta { ts, exp: r.get(1)?, tombstone: false })).transpose()?;
        let mut cells = Vec::with_capacity(cols.len());
        for i in 0..cols.len() {
            let base = 2 + i * 3;
            cells.push(stored_cell(r.get(base)?, r.get(base + 1)?, r.get(base + 2)?, marker_ts)?);
        }
        Ok(Some((marker, cells)))
    }

    fn load_value(&self, table: &str, key_cols: &[String], key: &[Value], col: &Column) -> StoreResult<Value> {
        let mut sql = Sql::default();
        let cond: Vec<String> = key_cols.iter().zip(key).map(|(c, v)| format!("{} = {}", q(c), sql.bind(to_sql(v)))).collect();
        sql.push(&format!("SELECT {} FROM {} WHERE {}", q(col.name), q(table), cond.join(" AND ")));
        let mut stmt = self.conn.prepare_cached(&sql.text)?;
        let v = stmt.query_row(params_from_iter(sql.params.iter()), |r| Ok(from_sql(col.ty, r.get_ref(0)?))).optional()?;
        v.unwrap_or(Ok(Value::Null))
    }

    /// Tombstones of a partition with a timestamp at or after `ts`: `None` for a
    /// partition tombstone, else the slice it covers.
    fn tombstones_since(&self, t: &TableDef, partition: &[Value], ts: i64) -> StoreResult<Vec<Option<Slice>>> {
        let mut stmt = self.conn.prepare_cached("SELECT slice FROM \"$tombstones\" WHERE tbl = ?1 AND pk = ?2 AND ts >= ?3")?;
        let blobs: Vec<Option<Vec<u8>>> =
            stmt.query_map(rusqlite::params![t.name, encode_values(partition), ts], |r| r.get(0))?.collect::<Result<_, _>>()?;
        blobs.into_iter().map(|b| b.map(|b| decode_slice(&b)).transpose()).collect()
    }

    fn delete(&mut self, d: &Delete, ts: i64) -> StoreResult<()> {
        let t = d.table;
        let purge = self.now() + self.gc_grace_micros;
        let slice = match &d.target {
            DeleteTarget::Partition => None,
            DeleteTarget::Row(ck) => Some(Slice::prefix(ck.iter().cloned())),
            DeleteTarget::Range(s) => Some(s.clone()),
        };
        self.delete_cells(&CellTable::rows(t), &d.partition, slice.as_ref(), ts)?;
        if slice.is_none() && t.has_statics() {
            self.delete_cells(&CellTable::statics(t), &d.partition, None, ts)?;
        }
        let mut sql = Sql::default();
        sql.push(&format!("SELECT {} FROM {} WHERE ", q(PID), q(&registry_table(t))));
        sql.registry_eq(t, &d.partition);
        let pid: Option<i64> =
            self.conn.prepare_cached(&sql.text)?.query_row(params_from_iter(sql.params.iter()), |r| r.get(0)).optional()?;
        if let Some(pid) = pid {
            let statics: Vec<String> = static_cols(t).iter().map(|c| c.name.to_owned()).collect();
            self.forget_if_empty(t.name, &statics, pid)?;
        }
        self.record_tombstone(t, &d.partition, slice, ts, purge)
    }

    /// Removes every cell (and marker) written at or before `ts` in the slice:
    /// whole rows where nothing newer remains, single cells elsewhere. The
    /// statics' registry row stays (rows may refer to it) with its cells cleared.
    fn delete_cells(&mut self, table: &CellTable, partition: &[Value], slice: Option<&Slice>, ts: i64) -> StoreResult<()> {
        let (t, cols, marker) = (table.def, &table.cols, table.marker);
        let table = table.name.as_str();
        let mut ts_cols: Vec<String> = cols.iter().map(|c| ts_col(c)).collect();
        if marker {
            ts_cols.push("\"$ts\"".into());
        }
        let where_clause = |sql: &mut Sql| {
            if marker {
                sql.partition_eq(t, partition);
            } else {
                sql.registry_eq(t, partition);
            }
            if let Some(s) = slice {
                sql.slice(t, s);
            }
        };
        // The clustering columns identify a row within the partition (statics have none).
        let ck: Vec<&Column> = if marker { ck_cols(t).into_iter().map(|(c, _)| c).collect() } else { Vec::new() };
        if marker {
            // Rows with nothing newer than the delete go at once. (A cell
            // without a timestamp of its own has the marker's.)
            let mut sql = Sql::default();
            sql.push(&format!("DELETE FROM {} WHERE ", q(table)));
            where_clause(&mut sql);
            let ts_p = sql.bind(SqlValue::Integer(ts));
            let newest: Vec<String> = ts_cols.iter().map(|c| format!("coalesce({c}, -9223372036854775808)")).collect();
            let newest = if newest.len() == 1 { newest[0].clone() } else { format!("max({})", newest.join(", ")) };
            sql.push(&format!(" AND {newest} <= {ts_p}"));
            self.conn.prepare_cached(&sql.text)?.execute(params_from_iter(sql.params.iter()))?;
        }

        // Rows that keep some newer cells lose only the older ones.
        let mut sql = Sql::default();
        let mut select: Vec<String> = ck.iter().map(|c| q(c.name)).collect();
        if marker {
            select.extend(["\"$ts\"".to_owned(), "\"$exp\"".to_owned()]);
        }
        for c in cols {
            select.extend([format!("{} IS NULL", q(c.name)), ts_col(c), exp_col(c)]);
        }
        sql.push(&format!("SELECT {} FROM {} WHERE ", select.join(", "), q(table)));
        where_clause(&mut sql);
        let ts_p = sql.bind(SqlValue::Integer(ts));
        let older: Vec<String> = ts_cols.iter().map(|c| format!("{c} <= {ts_p}")).collect();
        if older.is_empty() {
            return Ok(());
        }
        sql.push(&format!(" AND ({})", older.join(" OR ")));
        let mut stmt = self.conn.prepare_cached(&sql.text)?;
        // (clustering key, marker, cells) of each row that keeps something.
        #[allow(clippy::type_complexity)]
        let mut partial: Vec<(Vec<Value>, Option<CellMeta>, Vec<Option<(CellMeta, bool)>>)> = Vec::new();
        let mut rows = stmt.query(params_from_iter(sql.params.iter()))?;
        while let Some(r) = rows.next()? {
            let mut clustering = Vec::with_capacity(ck.len());
            for (i, c) in ck.iter().enumerate() {
                clustering.push(from_sql(c.ty, r.get_ref(i)?)?);
            }
            let mut i = ck.len();
            let (marker_ts, marker_meta) = if marker {
                i += 2;
                let mts: Option<i64> = r.get(i - 2)?;
                (mts, mts.map(|mts| Ok::<_, rusqlite::Error>(CellMeta { ts: mts, exp: r.get(i - 1)?, tombstone: false })).transpose()?)
            } else {
                (None, None)
            };
            let mut cells = Vec::with_capacity(cols.len());
            for _ in cols {
                cells.push(stored_cell(r.get(i)?, r.get(i + 1)?, r.get(i + 2)?, marker_ts)?);
                i += 3;
            }
            partial.push((clustering, marker_meta, cells));
        }
        drop(rows);
        drop(stmt);
        for (clustering, mut marker_meta, mut cells) in partial {
            let mut sets = Vec::new();
            if marker_meta.is_some_and(|m| m.ts <= ts) {
                marker_meta = None;
                sets.push("\"$ts\" = NULL, \"$exp\" = NULL".to_owned());
            }
            for (c, cell) in cols.iter().zip(cells.iter_mut()) {
                // A cell that had the marker's timestamp is as old as the
                // marker: it goes with it, so none is left implicit without one.
                if cell.is_some_and(|(m, _)| m.ts <= ts) {
                    *cell = None;
                    sets.push(format!("{} = NULL, {} = NULL, {} = NULL", q(c.name), ts_col(c), exp_col(c)));
                }
            }
            let purge_at = purge_time(marker_meta.iter().chain(cells.iter().flatten().map(|(m, _)| m)));
            let mut sql = Sql::default();
            let purge_p = sql.bind(if marker || cells.iter().any(Option::is_some) {
                purge_at.map_or(SqlValue::Null, SqlValue::Integer)
            } else {
                // A registry row with no static cells left is not purged by
                // time but dropped with its last row.
                SqlValue::Null
            });
            sets.push(format!("\"$purge\" = {purge_p}"));
            sql.push(&format!("UPDATE {} SET {} WHERE ", q(table), sets.join(", ")));
            if marker {
                sql.partition_eq(t, partition);
            } else {
                sql.registry_eq(t, partition);
            }
            if !ck.is_empty() {
                sql.push(" AND ");
                sql.key_eq(&ck, &clustering);
            }
            self.conn.prepare_cached(&sql.text)?.execute(params_from_iter(sql.params.iter()))?;
        }
        Ok(())
    }

    /// Keeps the delete so later-arriving older writes stay deleted. A tombstone
    /// made redundant by a newer one covering as much is not kept.
    fn record_tombstone(&mut self, t: &TableDef, partition: &[Value], slice: Option<Slice>, ts: i64, purge: i64) -> StoreResult<()> {
        let pk = encode_values(partition);
        let mut stmt = self.conn.prepare_cached("SELECT rowid, slice, ts FROM \"$tombstones\" WHERE tbl = ?1 AND pk = ?2")?;
        let existing: Vec<(i64, Option<Vec<u8>>, i64)> =
            stmt.query_map(rusqlite::params![t.name, pk], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect::<Result<_, _>>()?;
        drop(stmt);
        let covers = |outer: &Option<Slice>, inner: &Option<Slice>| match (outer, inner) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(o), Some(i)) => o.covers(i),
        };
        let mut redundant = Vec::new();
        for (rowid, blob, old_ts) in existing {
            let old = blob.map(|b| decode_slice(&b)).transpose()?;
            if old_ts >= ts && covers(&old, &slice) {
                return Ok(());
            }
            if old_ts <= ts && covers(&slice, &old) {
                redundant.push(rowid);
            }
        }
        for rowid in redundant {
            self.conn.prepare_cached("DELETE FROM \"$tombstones\" WHERE rowid = ?1")?.execute([rowid])?;
        }
        self.conn
            .prepare_cached("INSERT INTO \"$tombstones\" (tbl, pk, slice, ts, \"$purge\") VALUES (?1, ?2, ?3, ?4, ?5)")?
            .execute(rusqlite::params![t.name, pk, slice.as_ref().map(encode_slice), ts, purge])?;
        Ok(())
    }

    fn cas(&mut self, c: &Cas) -> StoreResult<CasOutcome> {
        let now = self.now();
        let t = c.table;
        let row = match &c.clustering {
            Some(ck) => {
                let query = ReadQuery::new(t, c.partition.iter().cloned())
                    .slice(Slice::prefix(ck.iter().cloned()))
                    .limit(1)
                    .columns(regular_cols(t).iter().map(|c| c.name));
                super::query::read_rows(&self.conn, &query, None, now)?.0.into_iter().next()
            }
            None => None,
        };
        let statics = if t.has_statics() { read_statics(&self.conn, t, &c.partition, &static_cols(t), now)? } else { None };
        let lookup = |name: &str| -> Value {
            row.as_ref().and_then(|r| r.get(name)).or_else(|| statics.as_ref().and_then(|s| s.get(name))).cloned().unwrap_or(Value::Null)
        };
        let applied = match &c.condition {
            Condition::NotExists => match &c.clustering {
                Some(_) => row.is_none(),
                None => statics.is_none(),
            },
            Condition::Equals(expected) => expected.iter().all(|(name, v)| lookup(name) == *v),
        };
        if !applied {
            let mut cells: Vec<(&'static str, Value)> = Vec::new();
            if let Some(r) = &row {
                cells.extend(r.columns().map(|(n, v)| (n, v.clone())));
            }
            if let Some(s) = &statics {
                cells.extend(s.columns().map(|(n, v)| (n, v.clone())));
            }
            let current = if row.is_none() && statics.is_none() { None } else { Some(Row::new(cells)) };
            return Ok(CasOutcome { applied: false, current });
        }
        let ts = self.next_ts();
        for w in &c.writes {
            match w {
                Write::Upsert(u) => self.upsert(u, ts)?,
                Write::Delete(d) => self.delete(d, ts)?,
            }
        }
        Ok(CasOutcome { applied: true, current: None })
    }

    /// A purge on the engine's own schedule: counted and logged here, as
    /// nobody waits for its answer.
    fn purge_and_report(&mut self) {
        match self.purge() {
            Ok(stats) => {
                metrics::counter!("storage_purged_rows_total", "service" => self.metrics_service, "engine" => "embedded")
                    .increment(stats.rows);
                metrics::counter!("storage_purged_tombstones_total", "service" => self.metrics_service, "engine" => "embedded")
                    .increment(stats.tombstones);
                if stats.rows > 0 || stats.tombstones > 0 {
                    tracing::info!(
                        rows = stats.rows,
                        tombstones = stats.tombstones,
                        bytes_freed = stats.bytes_freed,
                        "purged expired data"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "purging expired data failed"),
        }
    }

    fn purge(&mut self) -> StoreResult<PurgeStats> {
        let before = self.file_bytes();
        let now = self.now();
        let mut stats = PurgeStats::default();
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let result = (|| {
            let has_engine_tables: bool =
                self.conn.query_row("SELECT count(*) = 2 FROM sqlite_master WHERE name IN ('$tombstones', '$tables')", [], |r| r.get(0))?;
            if !has_engine_tables {
                return Ok(());
            }
            let tables: Vec<String> =
                self.conn.prepare("SELECT name FROM \"$tables\"")?.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?;
            for table in tables {
                let registry = registry_of(&table);
                // Partitions that lost rows or static cells may now be empty.
                let mut touched: BTreeSet<i64> = BTreeSet::new();
                let mut stmt = self.conn.prepare(&format!("DELETE FROM {} WHERE \"$purge\" <= ?1 RETURNING {}", q(&table), q(PID)))?;
                let mut rows = stmt.query([now])?;
                while let Some(r) = rows.next()? {
                    touched.insert(r.get(0)?);
                    stats.rows += 1;
                }
                drop(rows);
                drop(stmt);
                // Static cells are the registry's columns with a timestamp beside them.
                let statics: Vec<String> = self
                    .conn
                    .prepare("SELECT substr(name, 1, length(name) - 3) FROM pragma_table_info(?1) WHERE name LIKE '%$ts'")?
                    .query_map([&registry], |r| r.get(0))?
                    .collect::<Result<_, _>>()?;
                if !statics.is_empty() {
                    let clear: Vec<String> = statics
                        .iter()
                        .flat_map(|c| [c.clone(), format!("{c}$ts"), format!("{c}$exp")])
                        .map(|c| format!("{} = NULL", q(&c)))
                        .collect();
                    let sql = format!(
                        "UPDATE {} SET {}, \"$purge\" = NULL WHERE \"$purge\" <= ?1 RETURNING {}",
                        q(&registry),
                        clear.join(", "),
                        q(PID)
                    );
                    let mut stmt = self.conn.prepare(&sql)?;
                    let mut rows = stmt.query([now])?;
                    while let Some(r) = rows.next()? {
                        touched.insert(r.get(0)?);
                        stats.rows += 1;
                    }
                }
                for pid in touched {
                    self.forget_if_empty(&table, &statics, pid)?;
                }
            }
            stats.tombstones = self.conn.execute("DELETE FROM \"$tombstones\" WHERE \"$purge\" <= ?1", [now])? as u64;
            Ok::<_, StoreError>(())
        })();
        match result {
            Ok(()) => self.conn.execute_batch("COMMIT")?,
            Err(e) => {
                self.conn.execute_batch("ROLLBACK")?;
                return Err(e);
            }
        }
        // Hand freed pages back to the file system: move them to the end of the
        // file and truncate it, then fold the WAL into the database. The vacuum
        // frees pages as it is stepped, so it must be stepped to the end.
        step_to_end(&self.conn, "PRAGMA incremental_vacuum")?;
        step_to_end(&self.conn, "PRAGMA wal_checkpoint(TRUNCATE)")?;
        stats.bytes_freed = before.saturating_sub(self.file_bytes());
        Ok(stats)
    }

    fn file_bytes(&self) -> u64 {
        ["", "-wal"]
            .iter()
            .filter_map(|suffix| {
                let mut p = self.db_path.clone().into_os_string();
                p.push(suffix);
                std::fs::metadata(p).ok().map(|m| m.len())
            })
            .sum()
    }
}

/// The cells of `writes` that belong in `table`, as (index in `table.cols`, value, metadata).
fn cells_of<'v>(
    table: &CellTable,
    writes: &'v [(&'static str, Value)],
    meta: impl Fn(&Value) -> CellMeta,
) -> Vec<(usize, &'v Value, CellMeta)> {
    writes.iter().filter_map(|(name, v)| table.cols.iter().position(|c| c.name == *name).map(|i| (i, v, meta(v)))).collect()
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
