//! SQL for reads and scans, and the conditions writes share with them.

use std::ops::Bound;

use revstore_schema::{Column, ColumnType, Order, TableDef};
use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, params_from_iter};

use super::layout::{PID, ck_cols, exp_col, from_sql, partition_token, pk_cols, q, registry_table, regular_cols, static_cols, to_sql};
use crate::error::StoreResult;
use crate::ops::{Holdings, ReadOrder, ReadQuery, ScanPosition, ScanQuery, ScannedPartition, Slice, slices_within_after};
use crate::value::{Row, Value};

/// SQL text with explicitly numbered parameters (`?1`, `?2`, ...), so a value
/// can be bound once and referred to many times.
#[derive(Debug, Default)]
pub(crate) struct Sql {
    pub text: String,
    pub params: Vec<SqlValue>,
}

impl Sql {
    pub fn bind(&mut self, v: SqlValue) -> String {
        self.params.push(v);
        format!("?{}", self.params.len())
    }

    pub fn push(&mut self, s: &str) {
        self.text.push_str(s);
    }

    /// `"a" = ?1 AND "b" = ?2` for the given columns and values.
    pub fn key_eq(&mut self, cols: &[&Column], vals: &[Value]) {
        let parts: Vec<String> = cols.iter().zip(vals).map(|(c, v)| format!("{} = {}", q(c.name), self.bind(to_sql(v)))).collect();
        self.push(&parts.join(" AND "));
    }

    /// `"$token" = ?1 AND "a" = ?2 ...`: one partition's row in the registry,
    /// found by its token first (the registry's unique key starts with it).
    pub fn registry_eq(&mut self, t: &TableDef, partition: &[Value]) {
        let token = self.bind(SqlValue::Integer(partition_token(partition)));
        self.push(&format!("\"$token\" = {token} AND "));
        self.key_eq(&pk_cols(t), partition);
    }

    /// `"pid" = (SELECT "pid" FROM "t$partitions" WHERE ...)`: one partition's
    /// rows, by the id the registry gives its key.
    pub fn partition_eq(&mut self, t: &TableDef, partition: &[Value]) {
        self.push(&format!("{pid} = (SELECT {pid} FROM {} WHERE ", q(&registry_table(t)), pid = q(PID)));
        self.registry_eq(t, partition);
        self.push(")");
    }

    /// The registry rows of a scan's token range, after its position (the
    /// registry's columns unqualified).
    pub fn token_range(&mut self, t: &TableDef, query: &ScanQuery) -> String {
        let after = self.bind(SqlValue::Integer(query.range.after));
        let through = self.bind(SqlValue::Integer(query.range.through));
        let mut cond = format!("\"$token\" > {after} AND \"$token\" <= {through}");
        match &query.after {
            None => {}
            Some(position) if position.key.is_empty() => {
                let tp = self.bind(SqlValue::Integer(position.token));
                cond.push_str(&format!(" AND \"$token\" > {tp}"));
            }
            Some(position) => {
                let pk_list = pk_cols(t).iter().map(|c| q(c.name)).collect::<Vec<_>>().join(", ");
                let tp = self.bind(SqlValue::Integer(position.token));
                let kp: Vec<String> = position.key.iter().map(|v| self.bind(to_sql(v))).collect();
                cond.push_str(&format!(" AND (\"$token\" > {tp} OR (\"$token\" = {tp} AND ({pk_list}) > ({})))", kp.join(", ")));
            }
        }
        cond
    }

    /// ` AND ...` restricting the clustering columns to a slice.
    pub fn slice(&mut self, t: &TableDef, slice: &Slice) {
        let ck = ck_cols(t);
        for ((c, _), v) in ck.iter().zip(&slice.prefix) {
            let p = self.bind(to_sql(v));
            self.push(&format!(" AND {} = {p}", q(c.name)));
        }
        if let Some((c, _)) = ck.get(slice.prefix.len()) {
            for (bound, inclusive, exclusive) in [(&slice.lower, ">=", ">"), (&slice.upper, "<=", "<")] {
                let (op, v) = match bound {
                    Bound::Unbounded => continue,
                    Bound::Included(v) => (inclusive, v),
                    Bound::Excluded(v) => (exclusive, v),
                };
                let p = self.bind(to_sql(v));
                self.push(&format!(" AND {} {op} {p}", q(c.name)));
            }
        }
    }
}

/// A cell's value if it has not expired at `now` (a bound parameter), else NULL.
pub(crate) fn live_value(c: &Column, now: &str) -> String {
    format!("CASE WHEN {exp} IS NULL OR {exp} > {now} THEN {name} END", exp = exp_col(c), name = q(c.name))
}

/// True when the row (or static row, without a marker) has anything alive at `now`.
pub(crate) fn live_condition(cols: &[&Column], marker: bool, now: &str) -> String {
    let mut parts = Vec::new();
    if marker {
        parts.push(format!("(\"$ts\" IS NOT NULL AND (\"$exp\" IS NULL OR \"$exp\" > {now}))"));
    }
    for c in cols {
        parts.push(format!("({} IS NOT NULL AND ({exp} IS NULL OR {exp} > {now}))", q(c.name), exp = exp_col(c)));
    }
    if parts.is_empty() { "0".into() } else { format!("({})", parts.join(" OR ")) }
}

fn order_by(t: &TableDef, order: ReadOrder) -> String {
    let terms: Vec<String> = ck_cols(t)
        .into_iter()
        .map(|(c, o)| {
            let asc = (o == Order::Asc) == (order == ReadOrder::Clustering);
            format!("{} {}", q(c.name), if asc { "ASC" } else { "DESC" })
        })
        .collect();
    if terms.is_empty() { String::new() } else { format!(" ORDER BY {}", terms.join(", ")) }
}

/// Reads rows of one partition: up to `limit` after `after` (and one more,
/// which says a page follows, unless only the first rows are wanted), plus the statics.
pub(crate) fn read_rows(conn: &Connection, query: &ReadQuery, after: Option<&[Value]>, now: i64) -> StoreResult<(Vec<Row>, Option<Row>)> {
    let t = query.table;
    let wanted = |c: &Column| query.columns.as_ref().is_none_or(|cols| cols.contains(&c.name));
    let ck: Vec<&Column> = ck_cols(t).into_iter().map(|(c, _)| c).collect();
    let partition_cells: Vec<(&'static str, Value)> = pk_cols(t).iter().map(|c| c.name).zip(query.partition.iter().cloned()).collect();
    let projected: Vec<&Column> = regular_cols(t).into_iter().filter(|c| wanted(c)).collect();

    // After a key: one plain range after another, each read by seeking,
    // until the limit (and the one more row that says a page follows) is met.
    let slices = match after {
        Some(after) => slices_within_after(t, &query.slice, after, query.order),
        None => vec![query.slice.clone()],
    };
    let mut out = Vec::new();
    for slice in slices {
        let wanted = query.limit.map(|l| (l as usize + query.lookahead()).saturating_sub(out.len()));
        let Some(wanted) = wanted.map_or(Some(usize::MAX), |w| (w > 0).then_some(w)) else { break };
        let sub = ReadQuery { slice, limit: query.limit.map(|_| (wanted - 1) as u32), ..query.clone() };
        let sql = read_rows_sql(&sub, now);
        let mut stmt = conn.prepare_cached(&sql.text)?;
        let mut rows = stmt.query(params_from_iter(sql.params.iter()))?;
        while let Some(r) = rows.next()? {
            let mut cells = Vec::with_capacity(partition_cells.len() + ck.len() + projected.len());
            cells.extend(partition_cells.iter().cloned());
            for (i, c) in ck.iter().chain(projected.iter()).enumerate() {
                cells.push((c.name, from_sql(c.ty, r.get_ref(i + 1)?)?));
            }
            out.push(Row::new(cells));
        }
    }
    let statics: Vec<&Column> = static_cols(t).into_iter().filter(|c| wanted(c)).collect();
    let static_row = if statics.is_empty() { None } else { read_statics(conn, t, &query.partition, &statics, now)? };
    Ok((out, static_row))
}

/// The statement [`read_rows`] runs: its text depends only on the query's
/// shape (table, columns, slice bounds present, limit present), the values are
/// parameters, so one cached statement serves every partition.
pub(crate) fn read_rows_sql(query: &ReadQuery, now: i64) -> Sql {
    let t = query.table;
    let wanted = |c: &Column| query.columns.as_ref().is_none_or(|cols| cols.contains(&c.name));
    let ck: Vec<&Column> = ck_cols(t).into_iter().map(|(c, _)| c).collect();
    let regular = regular_cols(t);
    let projected: Vec<&Column> = regular.iter().copied().filter(|c| wanted(c)).collect();

    let mut sql = Sql::default();
    let now_p = sql.bind(SqlValue::Integer(now));
    // The partition key is not stored with the rows: it is the one asked for.
    let mut select: Vec<String> = vec!["1".into()];
    select.extend(ck.iter().map(|c| q(c.name)));
    select.extend(projected.iter().map(|c| live_value(c, &now_p)));
    sql.push(&format!("SELECT {} FROM {} WHERE ", select.join(", "), q(t.name)));
    sql.partition_eq(t, &query.partition);
    sql.slice(t, &query.slice);
    sql.push(&format!(" AND {}", live_condition(&regular, true, &now_p)));
    sql.push(&order_by(t, query.order));
    if let Some(limit) = query.limit {
        let p = sql.bind(SqlValue::Integer(limit as i64 + 1));
        sql.push(&format!(" LIMIT {p}"));
    }
    sql
}

/// The live static cells of a partition, or `None` when none is set.
pub(crate) fn read_statics(conn: &Connection, t: &TableDef, partition: &[Value], cols: &[&Column], now: i64) -> StoreResult<Option<Row>> {
    let mut sql = Sql::default();
    let now_p = sql.bind(SqlValue::Integer(now));
    let select: Vec<String> = cols.iter().map(|c| live_value(c, &now_p)).collect();
    sql.push(&format!("SELECT {} FROM {} WHERE ", select.join(", "), q(&registry_table(t))));
    sql.registry_eq(t, partition);
    let mut stmt = conn.prepare_cached(&sql.text)?;
    let mut rows = stmt.query(params_from_iter(sql.params.iter()))?;
    let Some(r) = rows.next()? else { return Ok(None) };
    let mut cells = Vec::with_capacity(cols.len());
    for (i, c) in cols.iter().enumerate() {
        cells.push((c.name, from_sql(c.ty, r.get_ref(i)?)?));
    }
    Ok(if cells.iter().all(|(_, v)| v.is_null()) { None } else { Some(Row::new(cells)) })
}

/// Partitions with live data in the query's token range, in (token, key)
/// order, after its position, with the static columns it names.
pub(crate) fn scan_partitions(conn: &Connection, query: &ScanQuery, now: i64) -> StoreResult<Vec<ScannedPartition>> {
    let t = query.table;
    let pk = pk_cols(t);
    let pk_list = pk.iter().map(|c| q(c.name)).collect::<Vec<_>>().join(", ");
    let statics: Vec<&Column> = query.statics.iter().filter_map(|name| t.column(name)).collect();
    let mut sql = Sql::default();
    let now_p = sql.bind(SqlValue::Integer(now));
    let in_range = sql.token_range(t, query);
    // A partition is listed when a static cell or a row of it is alive.
    let has_live_row = format!(
        "EXISTS (SELECT 1 FROM {rows} WHERE {rows}.{pid} = p.{pid} AND {})",
        live_condition(&regular_cols(t), true, &now_p),
        rows = q(t.name),
        pid = q(PID)
    );
    let order: Vec<String> = std::iter::once("\"$token\"".to_owned()).chain(pk.iter().map(|c| q(c.name))).collect();
    let static_values: String = statics.iter().map(|c| format!(", {}", live_value(c, &now_p))).collect();
    let limit_p = sql.bind(SqlValue::Integer(query.limit as i64 + 1));
    sql.push(&format!(
        "SELECT \"$token\", {pk_list}{static_values} FROM {} AS p \
         WHERE {in_range} AND ({} OR {has_live_row}) ORDER BY {} LIMIT {limit_p}",
        q(&registry_table(t)),
        live_condition(&static_cols(t), false, &now_p),
        order.join(", ")
    ));
    let mut stmt = conn.prepare_cached(&sql.text)?;
    let mut rows = stmt.query(params_from_iter(sql.params.iter()))?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let token: i64 = r.get(0)?;
        let mut key = Vec::with_capacity(pk.len());
        for (i, c) in pk.iter().enumerate() {
            key.push(from_sql(c.ty, r.get_ref(i + 1)?)?);
        }
        let mut cells = Vec::with_capacity(statics.len());
        for (i, c) in statics.iter().enumerate() {
            cells.push((c.name, from_sql(c.ty, r.get_ref(1 + pk.len() + i)?)?));
        }
        let statics = (!cells.iter().all(|(_, v)| v.is_null())).then(|| Row::new(cells));
        out.push(ScannedPartition { token, key, statics });
    }
    Ok(out)
}

/// SQL for a cell's size in [`Value::stored_len`](crate::Value::stored_len)'s unit.
fn stored_len(c: &Column) -> String {
    let v = q(c.name);
    match c.ty {
        ColumnType::Text => format!("coalesce(length(CAST({v} AS BLOB)), 0)"),
        ColumnType::Blob | ColumnType::TimeUuid => format!("coalesce(length({v}), 0)"),
        ColumnType::BigInt | ColumnType::Timestamp => format!("(CASE WHEN {v} IS NULL THEN 0 ELSE 8 END)"),
        ColumnType::Boolean => format!("(CASE WHEN {v} IS NULL THEN 0 ELSE 1 END)"),
    }
}

/// The size of a cell if it is alive at `now`, else 0.
fn live_len(c: &Column, now: &str) -> String {
    format!("(CASE WHEN {exp} IS NULL OR {exp} > {now} THEN {} ELSE 0 END)", stored_len(c), exp = exp_col(c))
}

fn sum_or_zero(parts: Vec<String>) -> String {
    if parts.is_empty() { "0".into() } else { parts.join(" + ") }
}

/// What the database still keeps of up to `limit` partitions of the query's
/// range, live or not: every registry row (a partition whose data all expired
/// stays there until a purge) with its rows, expired and deleted ones included.
pub(crate) fn holdings(conn: &Connection, query: &ScanQuery, now: i64) -> StoreResult<Holdings> {
    let t = query.table;
    let pk = pk_cols(t);
    let ck: Vec<&Column> = ck_cols(t).into_iter().map(|(c, _)| c).collect();
    let regular = regular_cols(t);
    let statics = static_cols(t);
    let mut sql = Sql::default();
    let now_p = sql.bind(SqlValue::Integer(now));
    let in_range = sql.token_range(t, query);
    let limit_p = sql.bind(SqlValue::Integer(query.limit as i64 + 1));
    let pk_list = pk.iter().map(|c| q(c.name)).collect::<Vec<_>>().join(", ");
    let key_bytes = sum_or_zero(ck.iter().map(|c| stored_len(c)).collect());
    let row_held = format!("{key_bytes} + {}", sum_or_zero(regular.iter().map(|c| stored_len(c)).collect()));
    let row_live = format!("{key_bytes} + {}", sum_or_zero(regular.iter().map(|c| live_len(c, &now_p)).collect()));
    let live = live_condition(&regular, true, &now_p);
    let static_held = sum_or_zero(statics.iter().map(|c| stored_len(c)).collect());
    let static_live = sum_or_zero(statics.iter().map(|c| live_len(c, &now_p)).collect());
    // Row columns and registry columns never share a name except `pid` and
    // `$purge`, so the row expressions need no qualification.
    sql.push(&format!(
        "SELECT p.\"$token\", {pk_p}, p.static_held, p.static_live, count(r.{pid}), \
         coalesce(sum({row_held}), 0), coalesce(sum(CASE WHEN {live} THEN 1 ELSE 0 END), 0), \
         coalesce(sum(CASE WHEN {live} THEN {row_live} ELSE 0 END), 0) \
         FROM (SELECT {pid}, \"$token\", {pk_list}, {static_held} AS static_held, {static_live} AS static_live FROM {registry} \
               WHERE {in_range} ORDER BY \"$token\", {pk_list} LIMIT {limit_p}) AS p \
         LEFT JOIN {rows} AS r ON r.{pid} = p.{pid} GROUP BY p.{pid} ORDER BY p.\"$token\", {pk_p}",
        pk_p = pk.iter().map(|c| format!("p.{}", q(c.name))).collect::<Vec<_>>().join(", "),
        pid = q(PID),
        registry = q(&registry_table(t)),
        rows = q(t.name),
    ));
    let mut stmt = conn.prepare_cached(&sql.text)?;
    let mut rows = stmt.query(params_from_iter(sql.params.iter()))?;
    let mut found = Holdings::default();
    let mut last = None;
    while let Some(r) = rows.next()? {
        if found.partitions == u64::from(query.limit) {
            found.next = last.take();
            break;
        }
        let token: i64 = r.get(0)?;
        let mut key = Vec::with_capacity(pk.len());
        for (i, c) in pk.iter().enumerate() {
            key.push(from_sql(c.ty, r.get_ref(i + 1)?)?);
        }
        let n = pk.len() + 1;
        let (static_held, static_live): (i64, i64) = (r.get(n)?, r.get(n + 1)?);
        let (rows_held, bytes_held, rows_live, bytes_live): (i64, i64, i64, i64) =
            (r.get(n + 2)?, r.get(n + 3)?, r.get(n + 4)?, r.get(n + 5)?);
        found.partitions += 1;
        found.rows_held += rows_held as u64;
        found.bytes_held += (bytes_held + static_held) as u64;
        found.rows_live += rows_live as u64;
        found.bytes_live += (bytes_live + static_live) as u64;
        last = Some(ScanPosition { token, key });
    }
    Ok(found)
}
