//! Cassandra's cell semantics on SQLite: upserts merged cell by cell by
//! write timestamp, deletes as tombstones, and conditional batches.

use revstore_schema::{Column, TableDef};
use rusqlite::types::Value as SqlValue;
use rusqlite::{OptionalExtension, params_from_iter};

use crate::embedded::layout::{
    CellMeta, CellTable, PID, ck_cols, decode_slice, encode_slice, exp_col, from_sql, partition_token, pk_cols, purge_time, q, registry_of,
    registry_table, regular_cols, static_cols, stored_cell, to_sql, ts_col,
};
use crate::embedded::query::{Sql, read_statics};
use crate::error::StoreResult;
use crate::ops::{Cas, CasOutcome, Condition, Delete, DeleteTarget, ReadQuery, Slice, Upsert, Write};
use crate::value::{Row, Value, encode_values};

use super::Writer;

impl Writer {
    pub(super) fn apply(&mut self, writes: &[Write]) -> StoreResult<()> {
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

    pub(super) fn upsert(&mut self, u: &Upsert, ts: i64) -> StoreResult<()> {
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
    pub(super) fn partition_id(&mut self, t: &TableDef, partition: &[Value], token: i64) -> StoreResult<i64> {
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
    pub(super) fn forget_if_empty(&mut self, table: &str, statics: &[String], pid: i64) -> StoreResult<()> {
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
    pub(super) fn merge_cells(
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
    pub(super) fn load_meta(
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

    pub(super) fn load_value(&self, table: &str, key_cols: &[String], key: &[Value], col: &Column) -> StoreResult<Value> {
        let mut sql = Sql::default();
        let cond: Vec<String> = key_cols.iter().zip(key).map(|(c, v)| format!("{} = {}", q(c), sql.bind(to_sql(v)))).collect();
        sql.push(&format!("SELECT {} FROM {} WHERE {}", q(col.name), q(table), cond.join(" AND ")));
        let mut stmt = self.conn.prepare_cached(&sql.text)?;
        let v = stmt.query_row(params_from_iter(sql.params.iter()), |r| Ok(from_sql(col.ty, r.get_ref(0)?))).optional()?;
        v.unwrap_or(Ok(Value::Null))
    }

    /// Tombstones of a partition with a timestamp at or after `ts`: `None` for a
    /// partition tombstone, else the slice it covers.
    pub(super) fn tombstones_since(&self, t: &TableDef, partition: &[Value], ts: i64) -> StoreResult<Vec<Option<Slice>>> {
        let mut stmt = self.conn.prepare_cached("SELECT slice FROM \"$tombstones\" WHERE tbl = ?1 AND pk = ?2 AND ts >= ?3")?;
        let blobs: Vec<Option<Vec<u8>>> =
            stmt.query_map(rusqlite::params![t.name, encode_values(partition), ts], |r| r.get(0))?.collect::<Result<_, _>>()?;
        blobs.into_iter().map(|b| b.map(|b| decode_slice(&b)).transpose()).collect()
    }

    pub(super) fn delete(&mut self, d: &Delete, ts: i64) -> StoreResult<()> {
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
    pub(super) fn delete_cells(&mut self, table: &CellTable, partition: &[Value], slice: Option<&Slice>, ts: i64) -> StoreResult<()> {
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
    pub(super) fn record_tombstone(
        &mut self,
        t: &TableDef,
        partition: &[Value],
        slice: Option<Slice>,
        ts: i64,
        purge: i64,
    ) -> StoreResult<()> {
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

    pub(super) fn cas(&mut self, c: &Cas) -> StoreResult<CasOutcome> {
        let now = self.now();
        let t = c.table;
        let row = match &c.clustering {
            Some(ck) => {
                let query = ReadQuery::new(t, c.partition.iter().cloned())
                    .slice(Slice::prefix(ck.iter().cloned()))
                    .limit(1)
                    .columns(regular_cols(t).iter().map(|c| c.name));
                crate::embedded::query::read_rows(&self.conn, &query, None, now)?.0.into_iter().next()
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
}

/// The cells of `writes` that belong in `table`, as (index in `table.cols`, value, metadata).
fn cells_of<'v>(
    table: &CellTable,
    writes: &'v [(&'static str, Value)],
    meta: impl Fn(&Value) -> CellMeta,
) -> Vec<(usize, &'v Value, CellMeta)> {
    writes.iter().filter_map(|(name, v)| table.cols.iter().position(|c| c.name == *name).map(|i| (i, v, meta(v)))).collect()
}
