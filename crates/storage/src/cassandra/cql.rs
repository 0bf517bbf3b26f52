//! CQL text for each request, and values to and from the driver's types.

use std::ops::Bound;

use revstore_schema::cql::quote as q;
use revstore_schema::{Column, ColumnType, Order, TableDef};
use scylla::value::{CqlTimestamp, CqlTimeuuid, CqlValue};

use crate::error::{StoreError, StoreResult};
use crate::ops::{Delete, DeleteTarget, ReadOrder, Slice, Upsert, slices_within_after};
use crate::value::Value;

/// A statement's text and the values bound to its markers, in order.
#[derive(Debug, Clone)]
pub(crate) struct Statement {
    pub cql: String,
    pub values: Vec<Option<CqlValue>>,
}

pub(crate) fn to_cql(v: &Value) -> Option<CqlValue> {
    Some(match v {
        Value::Null => return None,
        Value::Text(s) => CqlValue::Text(s.clone()),
        Value::BigInt(i) => CqlValue::BigInt(*i),
        Value::Blob(b) => CqlValue::Blob(b.clone()),
        Value::TimeUuid(u) => CqlValue::Timeuuid(CqlTimeuuid::from(*u)),
        Value::Timestamp(ms) => CqlValue::Timestamp(CqlTimestamp(*ms)),
        Value::Boolean(b) => CqlValue::Boolean(*b),
    })
}

pub(crate) fn from_cql(ty: ColumnType, v: Option<CqlValue>) -> StoreResult<Value> {
    let bad = |got: &CqlValue| StoreError::Corrupt(format!("Cassandra returned {got:?} for a {} column", ty.cql()));
    Ok(match (ty, v) {
        (_, None) | (_, Some(CqlValue::Empty)) => Value::Null,
        (ColumnType::Text, Some(CqlValue::Text(s) | CqlValue::Ascii(s))) => Value::Text(s),
        (ColumnType::BigInt, Some(CqlValue::BigInt(i))) => Value::BigInt(i),
        (ColumnType::Blob, Some(CqlValue::Blob(b))) => Value::Blob(b),
        (ColumnType::TimeUuid, Some(CqlValue::Timeuuid(u))) => Value::TimeUuid(u.into()),
        (ColumnType::Timestamp, Some(CqlValue::Timestamp(t))) => Value::Timestamp(t.0),
        (ColumnType::Boolean, Some(CqlValue::Boolean(b))) => Value::Boolean(b),
        (_, Some(other)) => return Err(bad(&other)),
    })
}

fn table_name(keyspace: &str, t: &TableDef) -> String {
    format!("{}.{}", q(keyspace), q(t.name))
}

fn key_columns(t: &TableDef) -> Vec<&'static Column> {
    t.partition_key().chain(t.clustering().map(|(c, _)| c)).collect()
}

/// `"a" = ? AND "b" = ?` for `cols`, binding `vals`.
fn equalities(cols: &[&Column], vals: &[Value], values: &mut Vec<Option<CqlValue>>) -> Vec<String> {
    cols.iter()
        .zip(vals)
        .map(|(c, v)| {
            values.push(to_cql(v));
            format!("{} = ?", q(c.name))
        })
        .collect()
}

/// `INSERT INTO t (...) VALUES (...) [IF NOT EXISTS] [USING TTL ? [AND] TIMESTAMP ?]`:
/// CQL wants the condition before the parameters (the other order is a
/// syntax error, which a conditional insert with a TTL, the janitor's lease,
/// found).
pub(crate) fn insert(keyspace: &str, u: &Upsert, if_not_exists: bool) -> Statement {
    let mut names: Vec<String> = key_columns(u.table).iter().take(u.key.len()).map(|c| q(c.name)).collect();
    let mut values: Vec<Option<CqlValue>> = u.key.iter().map(to_cql).collect();
    for (name, value) in &u.cells {
        names.push(q(name));
        values.push(to_cql(value));
    }
    let markers = vec!["?"; names.len()].join(", ");
    let mut cql = format!("INSERT INTO {} ({}) VALUES ({markers})", table_name(keyspace, u.table), names.join(", "));
    if if_not_exists {
        cql.push_str(" IF NOT EXISTS");
    }
    let mut using = Vec::new();
    if let Some(ttl) = u.ttl {
        using.push("TTL ?");
        values.push(Some(CqlValue::Int(ttl as i32)));
    }
    if let Some(ts) = u.timestamp {
        using.push("TIMESTAMP ?");
        values.push(Some(CqlValue::BigInt(ts)));
    }
    if !using.is_empty() {
        cql.push_str(&format!(" USING {}", using.join(" AND ")));
    }
    Statement { cql, values }
}

/// The smallest value of a type: `col >= min` selects every row, which lets a
/// range delete cover a whole partition's rows without touching its statics.
fn minimum(ty: ColumnType) -> Value {
    match ty {
        ColumnType::Text => Value::Text(String::new()),
        ColumnType::BigInt => Value::BigInt(i64::MIN),
        ColumnType::Timestamp => Value::Timestamp(i64::MIN),
        ColumnType::Blob => Value::Blob(Vec::new()),
        ColumnType::Boolean => Value::Boolean(false),
        // Time 0, then the clock sequence and node bytes that sort lowest as signed bytes.
        ColumnType::TimeUuid => {
            Value::TimeUuid(uuid::Uuid::from_bytes([0, 0, 0, 0, 0, 0, 0x10, 0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80]))
        }
    }
}

/// `AND`-joined restrictions selecting a slice's rows.
fn slice_restrictions(t: &TableDef, slice: &Slice, values: &mut Vec<Option<CqlValue>>) -> Vec<String> {
    let ck: Vec<&Column> = t.clustering().map(|(c, _)| c).collect();
    let mut terms = equalities(&ck, &slice.prefix, values);
    if let Some(c) = ck.get(slice.prefix.len()) {
        for (bound, inclusive, exclusive) in [(&slice.lower, ">=", ">"), (&slice.upper, "<=", "<")] {
            match bound {
                Bound::Unbounded => {}
                Bound::Included(v) => {
                    terms.push(format!("{} {inclusive} ?", q(c.name)));
                    values.push(to_cql(v));
                }
                Bound::Excluded(v) => {
                    terms.push(format!("{} {exclusive} ?", q(c.name)));
                    values.push(to_cql(v));
                }
            }
        }
    }
    terms
}

pub(crate) fn delete(keyspace: &str, d: &Delete) -> Statement {
    let t = d.table;
    let mut values = Vec::new();
    let mut cql = format!("DELETE FROM {}", table_name(keyspace, t));
    if let Some(ts) = d.timestamp {
        cql.push_str(" USING TIMESTAMP ?");
        values.push(Some(CqlValue::BigInt(ts)));
    }
    let pk: Vec<&Column> = t.partition_key().collect();
    let mut terms = equalities(&pk, &d.partition, &mut values);
    match &d.target {
        DeleteTarget::Partition => {}
        DeleteTarget::Row(ck) => terms.extend(equalities(&t.clustering().map(|(c, _)| c).collect::<Vec<_>>(), ck, &mut values)),
        DeleteTarget::Range(slice) => {
            let mut slice = slice.clone();
            let unbounded = matches!((&slice.lower, &slice.upper), (Bound::Unbounded, Bound::Unbounded));
            if unbounded && slice.prefix.is_empty() {
                // A range over all rows is not a partition delete: statics stay.
                if let Some((first, _)) = t.clustering().next() {
                    slice.lower = Bound::Included(minimum(first.ty));
                }
            }
            terms.extend(slice_restrictions(t, &slice, &mut values));
        }
    }
    cql.push_str(&format!(" WHERE {}", terms.join(" AND ")));
    Statement { cql, values }
}

/// The sub-queries that together read `slice` in `order` strictly after the row
/// key `after`: CQL has no `OR`, so "after (a, b)" becomes "a = x AND b > y",
/// then "a > x", each in read order.
pub(crate) fn reads(
    keyspace: &str,
    t: &TableDef,
    partition: &[Value],
    slice: &Slice,
    order: ReadOrder,
    after: Option<&[Value]>,
    columns: &[&Column],
) -> Vec<Statement> {
    let ck: Vec<(&Column, Order)> = t.clustering().collect();
    let select: Vec<String> = key_columns(t).iter().chain(columns.iter()).map(|c| q(c.name)).collect();
    let order_by: Vec<String> = ck
        .iter()
        .map(|(c, o)| {
            let asc = (*o == Order::Asc) == (order == ReadOrder::Clustering);
            format!("{} {}", q(c.name), if asc { "ASC" } else { "DESC" })
        })
        .collect();
    let build = |slice: &Slice| {
        let mut values = Vec::new();
        let pk: Vec<&Column> = t.partition_key().collect();
        let mut terms = equalities(&pk, partition, &mut values);
        terms.extend(slice_restrictions(t, slice, &mut values));
        let mut cql = format!("SELECT {} FROM {} WHERE {}", select.join(", "), table_name(keyspace, t), terms.join(" AND "));
        if !order_by.is_empty() {
            cql.push_str(&format!(" ORDER BY {}", order_by.join(", ")));
        }
        cql.push_str(" LIMIT ?");
        Statement { cql, values }
    };
    match after {
        None => vec![build(slice)],
        Some(after) => slices_within_after(t, slice, after, order).iter().map(build).collect(),
    }
}

/// The static cells of a partition.
pub(crate) fn read_statics(keyspace: &str, t: &TableDef, partition: &[Value], statics: &[&Column]) -> Statement {
    let mut values = Vec::new();
    let pk: Vec<&Column> = t.partition_key().collect();
    let terms = equalities(&pk, partition, &mut values);
    let select: Vec<String> = pk.iter().chain(statics.iter()).map(|c| q(c.name)).collect();
    Statement {
        cql: format!("SELECT DISTINCT {} FROM {} WHERE {}", select.join(", "), table_name(keyspace, t), terms.join(" AND ")),
        values,
    }
}

/// `SELECT DISTINCT token(pk), pk FROM t WHERE token(pk) > ? LIMIT ?` (or `= ?`).
/// Partition keys (and the named static columns) in token order: at one
/// token (`same_token`), or in `(?, ?]`; the limit bound last.
pub(crate) fn scan(keyspace: &str, t: &TableDef, statics: &[&str], same_token: bool) -> String {
    let pk: Vec<String> = t.partition_key().map(|c| q(c.name)).collect();
    let token = format!("token({})", pk.join(", "));
    let columns: Vec<String> = pk.iter().cloned().chain(statics.iter().map(|s| q(s))).collect();
    let range = if same_token { format!("{token} = ?") } else { format!("{token} > ? AND {token} <= ?") };
    format!("SELECT DISTINCT {token}, {} FROM {} WHERE {range} LIMIT ?", columns.join(", "), table_name(keyspace, t))
}

/// `col = ? AND ...` for a condition, binding the expected values (null: unset).
fn if_clause(expected: &[(&'static str, Value)], values: &mut Vec<Option<CqlValue>>) -> String {
    let terms: Vec<String> = expected
        .iter()
        .map(|(name, v)| {
            values.push(to_cql(v));
            format!("{} = ?", q(name))
        })
        .collect();
    terms.join(" AND ")
}

/// `UPDATE t [USING TTL ?] SET <the upsert's cells> WHERE <its key> IF col = ? AND ...`:
/// the upsert itself, carrying the batch's condition.
pub(crate) fn conditional_update(keyspace: &str, u: &Upsert, expected: &[(&'static str, Value)]) -> Statement {
    let mut values = Vec::new();
    let mut cql = format!("UPDATE {}", table_name(keyspace, u.table));
    if let Some(ttl) = u.ttl {
        cql.push_str(" USING TTL ?");
        values.push(Some(CqlValue::Int(ttl as i32)));
    }
    let sets: Vec<String> = u
        .cells
        .iter()
        .map(|(name, v)| {
            values.push(to_cql(v));
            format!("{} = ?", q(name))
        })
        .collect();
    let key_cols: Vec<&Column> = key_columns(u.table).into_iter().take(u.key.len()).collect();
    let terms = equalities(&key_cols, &u.key, &mut values);
    let conditions = if_clause(expected, &mut values);
    cql.push_str(&format!(" SET {} WHERE {} IF {conditions}", sets.join(", "), terms.join(" AND ")));
    Statement { cql, values }
}

/// `DELETE FROM t WHERE <its key> IF col = ? AND ...`: the delete of the
/// condition row itself, carrying the batch's condition (a carrier `UPDATE`
/// beside it would write the condition column back with the same Paxos
/// timestamp, and Cassandra keeps that cell). Conditional writes take the
/// server's timestamp, so the delete's own is not used.
pub(crate) fn conditional_delete(keyspace: &str, d: &Delete, expected: &[(&'static str, Value)]) -> Statement {
    let t = d.table;
    let mut values = Vec::new();
    let pk: Vec<&Column> = t.partition_key().collect();
    let mut terms = equalities(&pk, &d.partition, &mut values);
    if let DeleteTarget::Row(ck) = &d.target {
        terms.extend(equalities(&t.clustering().map(|(c, _)| c).collect::<Vec<_>>(), ck, &mut values));
    }
    let conditions = if_clause(expected, &mut values);
    Statement { cql: format!("DELETE FROM {} WHERE {} IF {conditions}", table_name(keyspace, t), terms.join(" AND ")), values }
}

/// A conditional `UPDATE` that carries `IF col = ? AND ...` for a batch none of
/// whose writes targets the condition row: it sets the first condition column
/// to the value the condition requires, which changes nothing when it holds.
pub(crate) fn condition_carrier(keyspace: &str, t: &TableDef, key: &[Value], expected: &[(&'static str, Value)]) -> Statement {
    let mut values = Vec::new();
    let (first_name, first_value) = &expected[0];
    values.push(to_cql(first_value));
    let key_cols: Vec<&Column> = key_columns(t).into_iter().take(key.len()).collect();
    let terms = equalities(&key_cols, key, &mut values);
    let conditions = if_clause(expected, &mut values);
    Statement {
        cql: format!("UPDATE {} SET {} = ? WHERE {} IF {conditions}", table_name(keyspace, t), q(first_name), terms.join(" AND "),),
        values,
    }
}
