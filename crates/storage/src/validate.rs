//! Every request is checked against its table before an engine sees it:
//! keys whole and well typed, columns known, TTLs and key sizes within
//! Cassandra's limits, conditional batches inside one partition.

use std::ops::Bound;

use revstore_schema::{ColumnKind, ColumnType, TableDef};

use crate::error::{StoreError, StoreResult};
use crate::ops::{Cas, Condition, DeleteTarget, ReadQuery, ScanQuery, Slice, Upsert, Write};
use crate::value::Value;

/// The longest TTL Cassandra accepts: 20 years.
pub const MAX_TTL_SECS: u32 = 20 * 365 * 86_400;
/// Cassandra's limit on one key component.
const MAX_KEY_COMPONENT_BYTES: usize = 65_535;

pub(crate) fn check_value(table: &TableDef, column: &str, ty: ColumnType, value: &Value, nullable: bool) -> StoreResult<()> {
    let fail = |what: String| Err(StoreError::invalid(format!("{}.{column}: {what}", table.name)));
    match value.column_type() {
        None if nullable => Ok(()),
        None => fail("a key column cannot be null".into()),
        Some(t) if t != ty => fail(format!("expected a {} value, got {}", ty.cql(), t.cql())),
        Some(_) => match value {
            Value::TimeUuid(u) if u.get_version_num() != 1 => fail("not a time-based (version 1) UUID".into()),
            _ => Ok(()),
        },
    }
}

pub(crate) fn check_key_part(
    table: &TableDef,
    columns: &[&'static revstore_schema::Column],
    values: &[Value],
    what: &str,
) -> StoreResult<()> {
    if values.len() > columns.len() {
        return Err(StoreError::invalid(format!("{}: {} values given for {} {what} columns", table.name, values.len(), columns.len())));
    }
    for (c, v) in columns.iter().zip(values) {
        check_value(table, c.name, c.ty, v, false)?;
        let size = match v {
            Value::Text(s) => s.len(),
            Value::Blob(b) => b.len(),
            _ => 0,
        };
        if size > MAX_KEY_COMPONENT_BYTES {
            return Err(StoreError::invalid(format!("{}.{}: key component over 64 KiB", table.name, c.name)));
        }
    }
    Ok(())
}

pub(crate) fn key_columns(table: &TableDef) -> (Vec<&'static revstore_schema::Column>, Vec<&'static revstore_schema::Column>) {
    (table.partition_key().collect(), table.clustering().map(|(c, _)| c).collect())
}

pub(crate) fn check_partition(table: &TableDef, partition: &[Value]) -> StoreResult<()> {
    let (pk, _) = key_columns(table);
    if partition.len() != pk.len() {
        return Err(StoreError::invalid(format!("{}: the partition key has {} columns, {} given", table.name, pk.len(), partition.len())));
    }
    check_key_part(table, &pk, partition, "partition key")
}

pub(crate) fn check_slice(table: &TableDef, slice: &Slice) -> StoreResult<()> {
    let (_, ck) = key_columns(table);
    check_key_part(table, &ck, &slice.prefix, "clustering")?;
    let bounded = !matches!((&slice.lower, &slice.upper), (Bound::Unbounded, Bound::Unbounded));
    if bounded {
        let Some(next) = ck.get(slice.prefix.len()) else {
            return Err(StoreError::invalid(format!("{}: a range needs a clustering column after the prefix", table.name)));
        };
        for bound in [&slice.lower, &slice.upper] {
            if let Bound::Included(v) | Bound::Excluded(v) = bound {
                check_value(table, next.name, next.ty, v, false)?;
            }
        }
    }
    Ok(())
}

pub(crate) fn check_columns(table: &TableDef, names: impl Iterator<Item = &'static str>) -> StoreResult<()> {
    for name in names {
        match table.column(name) {
            None => return Err(StoreError::invalid(format!("{}: no column {name}", table.name))),
            Some(c) if matches!(c.kind, ColumnKind::PartitionKey | ColumnKind::Clustering(_)) => {
                return Err(StoreError::invalid(format!("{}.{name}: key columns are set through the key", table.name)));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

pub(crate) fn validate_upsert(u: &Upsert) -> StoreResult<()> {
    let (pk, ck) = key_columns(u.table);
    // A key without its clustering part addresses the partition's static cells.
    let static_only = u.key.len() == pk.len() && !ck.is_empty();
    if !static_only && u.key.len() != pk.len() + ck.len() {
        return Err(StoreError::invalid(format!(
            "{}: a write needs the partition key ({} columns) and either no or all {} clustering columns; {} values given",
            u.table.name,
            pk.len(),
            ck.len(),
            u.key.len()
        )));
    }
    check_key_part(u.table, &pk, &u.key[..pk.len()], "partition key")?;
    check_key_part(u.table, &ck, &u.key[pk.len()..], "clustering")?;
    check_columns(u.table, u.cells.iter().map(|(n, _)| *n))?;
    let mut seen = std::collections::HashSet::new();
    for (name, value) in &u.cells {
        if !seen.insert(*name) {
            return Err(StoreError::invalid(format!("{}.{name}: set twice in one write", u.table.name)));
        }
        let Some(c) = u.table.column(name) else { continue };
        if static_only && c.kind != ColumnKind::Static {
            return Err(StoreError::invalid(format!(
                "{}.{name}: a write without clustering key can only set static columns",
                u.table.name
            )));
        }
        check_value(u.table, name, c.ty, value, true)?;
    }
    if static_only && !u.table.has_statics() {
        return Err(StoreError::invalid(format!("{}: the clustering key is missing", u.table.name)));
    }
    if u.ttl.is_some_and(|t| t > MAX_TTL_SECS) {
        return Err(StoreError::invalid(format!("TTL over the maximum of {MAX_TTL_SECS} seconds")));
    }
    Ok(())
}

pub(crate) fn validate_write(w: &Write) -> StoreResult<()> {
    match w {
        Write::Upsert(u) => validate_upsert(u),
        Write::Delete(d) => {
            check_partition(d.table, &d.partition)?;
            let (_, ck) = key_columns(d.table);
            match &d.target {
                DeleteTarget::Partition => Ok(()),
                DeleteTarget::Row(key) if key.len() == ck.len() && !ck.is_empty() => check_key_part(d.table, &ck, key, "clustering"),
                DeleteTarget::Row(_) => Err(StoreError::invalid(format!("{}: a row delete needs the full clustering key", d.table.name))),
                DeleteTarget::Range(slice) => check_slice(d.table, slice),
            }
        }
    }
}

pub(crate) fn validate_read(q: &ReadQuery) -> StoreResult<()> {
    check_partition(q.table, &q.partition)?;
    check_slice(q.table, &q.slice)?;
    if q.limit == Some(0) {
        return Err(StoreError::invalid("limit must be at least 1"));
    }
    if let Some(after) = &q.after {
        if q.page_token.is_some() {
            return Err(StoreError::invalid("a read resumes after a page token or after a key, not both"));
        }
        let (_, ck) = key_columns(q.table);
        if after.len() != ck.len() {
            return Err(StoreError::invalid(format!("a read of {} resumes after a full clustering key", q.table.name)));
        }
        check_key_part(q.table, &ck, after, "clustering")?;
    }
    if let Some(columns) = &q.columns {
        check_columns(q.table, columns.iter().copied())?;
    }
    Ok(())
}

pub(crate) fn validate_scan(q: &ScanQuery) -> StoreResult<()> {
    if q.limit == 0 {
        return Err(StoreError::invalid("scan limit must be at least 1"));
    }
    if q.range.after >= q.range.through {
        return Err(StoreError::invalid("a token range must hold at least one token"));
    }
    if let Some(after) = &q.after {
        if !q.range.contains(after.token) {
            return Err(StoreError::invalid("a scan position must lie in the scan's token range"));
        }
        // No key: after every partition of the token.
        if !after.key.is_empty() {
            check_partition(q.table, &after.key)?;
        }
    }
    for name in &q.statics {
        match q.table.column(name) {
            Some(c) if c.kind == ColumnKind::Static => {}
            _ => return Err(StoreError::invalid(format!("{}.{name} is not a static column", q.table.name))),
        }
    }
    Ok(())
}

pub(crate) fn validate_cas(c: &Cas) -> StoreResult<()> {
    check_partition(c.table, &c.partition)?;
    let (_, ck) = key_columns(c.table);
    if let Some(clustering) = &c.clustering {
        if clustering.len() != ck.len() {
            return Err(StoreError::invalid(format!("{}: a condition on a row needs its full clustering key", c.table.name)));
        }
        check_key_part(c.table, &ck, clustering, "clustering")?;
    }
    if let Condition::Equals(expected) = &c.condition {
        if expected.is_empty() {
            return Err(StoreError::invalid("a condition needs at least one column"));
        }
        check_columns(c.table, expected.iter().map(|(n, _)| *n))?;
        for (name, value) in expected {
            let Some(col) = c.table.column(name) else { continue };
            if col.kind == ColumnKind::Regular && c.clustering.is_none() {
                return Err(StoreError::invalid(format!(
                    "{}.{name}: a condition on a regular column needs the row's clustering key",
                    c.table.name
                )));
            }
            check_value(c.table, name, col.ty, value, true)?;
        }
    }
    if c.writes.is_empty() {
        return Err(StoreError::invalid("a conditional write needs at least one write"));
    }
    if let Condition::Equals(expected) = &c.condition {
        // Cassandra carries the condition on the write to the condition row;
        // without one, a separate carrier would write the first condition
        // column, which no other write of the batch may then set.
        let condition_key: Vec<Value> = c.partition.iter().cloned().chain(c.clustering.iter().flatten().cloned()).collect();
        let carried = c.writes.iter().any(|w| matches!(w, Write::Upsert(u) if u.key == condition_key && !u.cells.is_empty()));
        if let (false, Some((first, _))) = (carried, expected.first())
            && c.writes.iter().any(|w| matches!(w, Write::Upsert(u) if u.cells.iter().any(|(n, _)| n == first)))
        {
            return Err(StoreError::invalid(format!("a conditional batch that sets {first} must do so in the write of the condition row")));
        }
    }
    if c.condition == Condition::NotExists {
        let key: Vec<Value> = c.partition.iter().cloned().chain(c.clustering.iter().flatten().cloned()).collect();
        if !c.writes.iter().any(|w| matches!(w, Write::Upsert(u) if u.key == key)) {
            return Err(StoreError::invalid("a not-exists condition needs a write that creates the row it checks"));
        }
    }
    if c.writes.iter().any(|w| match w {
        Write::Upsert(u) => u.timestamp.is_some(),
        Write::Delete(d) => d.timestamp.is_some(),
    }) {
        return Err(StoreError::invalid("conditional writes take their timestamp from the store"));
    }
    for w in &c.writes {
        validate_write(w)?;
        if !std::ptr::eq(w.table(), c.table) || w.partition() != c.partition.as_slice() {
            return Err(StoreError::invalid("a conditional batch must stay in the condition's table and partition"));
        }
    }
    Ok(())
}
