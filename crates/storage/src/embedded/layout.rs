//! How a declared table is laid out in SQLite.
//!
//! A declared table `t` becomes two SQLite tables:
//!
//! - `t$partitions`, the partition registry: one row per partition, holding
//!   its Murmur3 token (`$token`), its partition key, a small local id
//!   (`pid`), and the partition's static cells. A unique index on
//!   (token, key) finds a partition and walks partitions in token order, as a
//!   Cassandra token-range scan does.
//! - `t`, the rows, keyed by (`pid`, clustering columns): the partition key is
//!   stored once in the registry, not again in every row (for old-store's index
//!   of revisions, title and domain would otherwise be most of each row). Rows
//!   of small values are clustered (`WITHOUT ROWID`): a partition's rows stored
//!   together in clustering order, each key stored once. Rows that hold a blob
//!   live in a rowid table with a unique index `t$by_key` (see
//!   [`rows_clustered`]).
//!
//! Every row and static row carries, for each column `c`, its value, write
//! timestamp and expiry (`c`, `c$ts`, `c$exp`), so last-write-wins and TTL
//! work per cell as in Cassandra; a row also has a liveness marker (`$ts`,
//! `$exp`). A live cell of a row written with the row's marker timestamp stores
//! `c$ts` as NULL and means "the marker's"; as most rows are written whole,
//! this saves a timestamp per cell. Tombstone cells (value NULL) always store
//! their timestamp. `$purge` is when the whole row may be dropped (every part
//! of it expired or deleted); an index on it makes purges cheap.
//!
//! A registry row is kept while rows refer to its `pid` (ids are reused only
//! after that), and removed when its partition has neither rows nor static
//! cells left. Row, range and partition deletes are recorded in `$tombstones`
//! so that a write with an older timestamp arriving later stays deleted, until
//! the tombstone's grace period ends. `$tables` keeps the declaration each table
//! was created from, so a changed declaration (even one SQLite cannot see, like
//! a clustering order) is refused; `PRAGMA user_version` names the layout.
//!
//! A cell's `c$exp` means: for a live value, when it expires (NULL: never); for a
//! deleted value (value NULL, `c$ts` set), when its tombstone may be purged.
//!
//! Values are stored so that SQLite's ordering equals Cassandra's: text as TEXT
//! (binary collation compares UTF-8 bytes), integers and timestamps as INTEGER,
//! blobs as BLOB, and timeuuids as a 16-byte BLOB that sorts by time first.

use std::ops::Bound;

use revstore_keys::{composite_key_bytes, murmur3_token};
use revstore_schema::{Column, ColumnKind, ColumnType, Order, TableDef};
use rusqlite::types::{Value as SqlValue, ValueRef};
use uuid::Uuid;

use crate::error::{StoreError, StoreResult};
use crate::ops::Slice;
use crate::value::{Value, decode_values, encode_values};

pub(crate) fn q(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

/// The version of this layout, kept in `PRAGMA user_version`: a database made
/// by a build with another layout is refused rather than misread.
pub(crate) const LAYOUT_VERSION: i64 = 2;

/// The partition registry of `t`: partition keys, their ids, static cells.
pub(crate) fn registry_table(t: &TableDef) -> String {
    registry_of(t.name)
}

/// The partition registry of the rows table named `table`.
pub(crate) fn registry_of(table: &str) -> String {
    format!("{table}$partitions")
}

/// The local id of a partition in the rows table.
pub(crate) const PID: &str = "pid";

pub(crate) fn ts_col(c: &Column) -> String {
    q(&format!("{}$ts", c.name))
}

pub(crate) fn exp_col(c: &Column) -> String {
    q(&format!("{}$exp", c.name))
}

fn sql_type(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Text => "TEXT",
        ColumnType::BigInt | ColumnType::Timestamp | ColumnType::Boolean => "INTEGER",
        ColumnType::Blob | ColumnType::TimeUuid => "BLOB",
    }
}

pub(crate) fn pk_cols(t: &TableDef) -> Vec<&'static Column> {
    t.partition_key().collect()
}

pub(crate) fn ck_cols(t: &TableDef) -> Vec<(&'static Column, Order)> {
    t.clustering().collect()
}

pub(crate) fn regular_cols(t: &TableDef) -> Vec<&'static Column> {
    t.regular().collect()
}

pub(crate) fn static_cols(t: &TableDef) -> Vec<&'static Column> {
    t.statics().collect()
}

/// One SQLite table of cells: a declared table's rows, which carry liveness
/// markers, or its static cells, which do not.
#[derive(Debug)]
pub(crate) struct CellTable {
    pub def: &'static TableDef,
    pub name: String,
    pub cols: Vec<&'static Column>,
    pub marker: bool,
}

impl CellTable {
    pub fn rows(def: &'static TableDef) -> Self {
        CellTable { def, name: def.name.to_owned(), cols: regular_cols(def), marker: true }
    }

    pub fn statics(def: &'static TableDef) -> Self {
        CellTable { def, name: registry_table(def), cols: static_cols(def), marker: false }
    }

    /// The columns of the SQLite key one row is written under: the partition's
    /// id and the clustering columns for rows, the token and the partition key
    /// (a unique key of the registry) for statics.
    pub fn key_columns(&self) -> Vec<String> {
        if self.marker {
            std::iter::once(PID.to_owned()).chain(ck_cols(self.def).into_iter().map(|(c, _)| c.name.to_owned())).collect()
        } else {
            std::iter::once("$token".to_owned()).chain(pk_cols(self.def).into_iter().map(|c| c.name.to_owned())).collect()
        }
    }
}

/// The Murmur3 token of a partition key, computed over its CQL serialization.
pub(crate) fn partition_token(partition: &[Value]) -> i64 {
    let parts: Vec<Vec<u8>> = partition.iter().map(Value::cql_bytes).collect();
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    murmur3_token(&composite_key_bytes(&refs))
}

/// Whether the rows of `t` are stored clustered by their key (`WITHOUT ROWID`),
/// which stores each key once, or in a rowid table with a unique index on the
/// key. A clustered table is an index b-tree: it keeps only ~1 KB of a row in
/// place, and a seek that meets a longer row reads all of it to compare keys,
/// so rows that hold a blob (renders, block contents) would make every lookup
/// read whole neighbouring blobs. Those tables pay for the separate index.
pub(crate) fn rows_clustered(t: &TableDef) -> bool {
    !regular_cols(t).iter().any(|c| c.ty == ColumnType::Blob)
}

/// Whether a column a newer declaration added can be added to the existing
/// tables: any static, and a regular column unless it is a blob on a table
/// whose rows are clustered (a blob changes the rows table's layout).
pub(crate) fn can_add_column(t: &TableDef, c: &Column) -> bool {
    c.kind == ColumnKind::Static || (c.kind == ColumnKind::Regular && !(c.ty == ColumnType::Blob && rows_clustered_without(t, c)))
}

/// Whether the rows table was created clustered, i.e. before `added` it had no blob column.
fn rows_clustered_without(t: &TableDef, added: &Column) -> bool {
    !regular_cols(t).iter().any(|c| c.ty == ColumnType::Blob && c.name != added.name)
}

/// `ALTER TABLE … ADD COLUMN` for an added column and its timestamp and expiry cells.
pub(crate) fn add_column_statements(t: &TableDef, c: &Column) -> Vec<String> {
    let table = if c.kind == ColumnKind::Static { registry_table(t) } else { t.name.to_owned() };
    [format!("{} {}", q(c.name), sql_type(c.ty)), format!("{} INTEGER", ts_col(c)), format!("{} INTEGER", exp_col(c))]
        .into_iter()
        .map(|column| format!("ALTER TABLE {} ADD COLUMN {column}", q(&table)))
        .collect()
}

/// The `CREATE` statements for a table: its partition registry, rows table and indexes.
pub(crate) fn create_statements(t: &TableDef) -> Vec<String> {
    let cells = |cols: Vec<&Column>| -> Vec<String> {
        cols.into_iter()
            .flat_map(|c| {
                [format!("{} {}", q(c.name), sql_type(c.ty)), format!("{} INTEGER", ts_col(c)), format!("{} INTEGER", exp_col(c))]
            })
            .collect()
    };
    let not_null = |c: &Column| format!("{} {} NOT NULL", q(c.name), sql_type(c.ty));
    let purge_index = |table: &str| {
        format!("CREATE INDEX IF NOT EXISTS {} ON {} (\"$purge\") WHERE \"$purge\" IS NOT NULL", q(&format!("{table}$by_purge")), q(table))
    };
    let mut stmts = Vec::new();

    // A rowid table: `pid` is the rowid. A table leaf keeps up to ~4 KB of a
    // row in place where an index leaf keeps ~1 KB, so a large static blob
    // (old-store's sealed block) needs fewer overflow pages.
    let registry = registry_table(t);
    let pk_list = pk_cols(t).iter().map(|c| q(c.name)).collect::<Vec<_>>().join(", ");
    let mut cols = vec![format!("{} INTEGER PRIMARY KEY", q(PID)), "\"$token\" INTEGER NOT NULL".to_owned()];
    cols.extend(pk_cols(t).into_iter().map(not_null));
    cols.extend(cells(static_cols(t)));
    cols.push("\"$purge\" INTEGER".into());
    cols.push(format!("UNIQUE (\"$token\", {pk_list})"));
    stmts.push(format!("CREATE TABLE IF NOT EXISTS {} ({})", q(&registry), cols.join(", ")));
    stmts.push(purge_index(&registry));

    // The key in clustering order, so that reads in either direction walk it
    // without sorting.
    let key: Vec<String> = std::iter::once(q(PID))
        .chain(ck_cols(t).into_iter().map(|(c, o)| format!("{}{}", q(c.name), if o == Order::Desc { " DESC" } else { "" })))
        .collect();
    let mut cols = vec![format!("{} INTEGER NOT NULL", q(PID))];
    cols.extend(ck_cols(t).into_iter().map(|(c, _)| not_null(c)));
    cols.push("\"$ts\" INTEGER".into());
    cols.push("\"$exp\" INTEGER".into());
    cols.extend(cells(regular_cols(t)));
    cols.push("\"$purge\" INTEGER".into());
    if rows_clustered(t) {
        cols.push(format!("PRIMARY KEY ({})", key.join(", ")));
        stmts.push(format!("CREATE TABLE IF NOT EXISTS {} ({}) WITHOUT ROWID", q(t.name), cols.join(", ")));
    } else {
        stmts.push(format!("CREATE TABLE IF NOT EXISTS {} ({})", q(t.name), cols.join(", ")));
        stmts.push(format!("CREATE UNIQUE INDEX IF NOT EXISTS {} ON {} ({})", q(&format!("{}$by_key", t.name)), q(t.name), key.join(", ")));
    }
    stmts.push(purge_index(t.name));
    stmts
}

/// Engine-wide bookkeeping: the declaration each table was created from, and tombstones.
pub(crate) const ENGINE_TABLES_DDL: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS \"$tables\" (name TEXT PRIMARY KEY, declaration TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS \"$tombstones\" (tbl TEXT NOT NULL, pk BLOB NOT NULL, slice BLOB, ts INTEGER NOT NULL, \"$purge\" INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS \"$tombstones$by_partition\" ON \"$tombstones\" (tbl, pk, ts)",
    "CREATE INDEX IF NOT EXISTS \"$tombstones$by_purge\" ON \"$tombstones\" (\"$purge\")",
];

/// A value as SQLite stores it.
pub(crate) fn to_sql(v: &Value) -> SqlValue {
    match v {
        Value::Null => SqlValue::Null,
        Value::Text(s) => SqlValue::Text(s.clone()),
        Value::BigInt(i) | Value::Timestamp(i) => SqlValue::Integer(*i),
        Value::Blob(b) => SqlValue::Blob(b.clone()),
        Value::TimeUuid(u) => SqlValue::Blob(sortable_timeuuid(u).to_vec()),
        Value::Boolean(b) => SqlValue::Integer(*b as i64),
    }
}

/// A value read back from SQLite, for a column of type `ty`.
pub(crate) fn from_sql(ty: ColumnType, v: ValueRef<'_>) -> StoreResult<Value> {
    let bad = || StoreError::Corrupt(format!("stored value does not fit a {} column", ty.cql()));
    Ok(match (ty, v) {
        (_, ValueRef::Null) => Value::Null,
        (ColumnType::Text, ValueRef::Text(t)) => Value::Text(String::from_utf8(t.to_vec()).map_err(|_| bad())?),
        (ColumnType::BigInt, ValueRef::Integer(i)) => Value::BigInt(i),
        (ColumnType::Timestamp, ValueRef::Integer(i)) => Value::Timestamp(i),
        (ColumnType::Boolean, ValueRef::Integer(i)) => Value::Boolean(i != 0),
        (ColumnType::Blob, ValueRef::Blob(b)) => Value::Blob(b.to_vec()),
        (ColumnType::TimeUuid, ValueRef::Blob(b)) => Value::TimeUuid(timeuuid_from_sortable(b).ok_or_else(bad)?),
        _ => return Err(bad()),
    })
}

/// A version 1 UUID rearranged so that byte order is Cassandra's timeuuid order:
/// the 60-bit timestamp (big-endian, version nibble on top), then the clock
/// sequence and node with each byte's sign bit flipped (Cassandra compares
/// those as signed bytes).
pub(crate) fn sortable_timeuuid(u: &Uuid) -> [u8; 16] {
    let b = u.as_bytes();
    let mut out = [0u8; 16];
    // time_hi_and_version (bytes 6-7), time_mid (4-5), time_low (0-3)
    out[0..2].copy_from_slice(&b[6..8]);
    out[2..4].copy_from_slice(&b[4..6]);
    out[4..8].copy_from_slice(&b[0..4]);
    for i in 8..16 {
        out[i] = b[i] ^ 0x80;
    }
    out
}

fn timeuuid_from_sortable(s: &[u8]) -> Option<Uuid> {
    if s.len() != 16 {
        return None;
    }
    let mut b = [0u8; 16];
    b[6..8].copy_from_slice(&s[0..2]);
    b[4..6].copy_from_slice(&s[2..4]);
    b[0..4].copy_from_slice(&s[4..8]);
    for i in 8..16 {
        b[i] = s[i] ^ 0x80;
    }
    Some(Uuid::from_bytes(b))
}

/// Tombstone slices as bytes: the prefix, then each bound as a tag (0 unbounded,
/// 1 included, 2 excluded) and its value.
pub(crate) fn encode_slice(s: &Slice) -> Vec<u8> {
    let prefix = encode_values(&s.prefix);
    let mut out = (prefix.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&prefix);
    for bound in [&s.lower, &s.upper] {
        let (tag, value) = match bound {
            Bound::Unbounded => (0u8, Value::Null),
            Bound::Included(v) => (1, v.clone()),
            Bound::Excluded(v) => (2, v.clone()),
        };
        let encoded = encode_values(std::slice::from_ref(&value));
        out.push(tag);
        out.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
        out.extend_from_slice(&encoded);
    }
    out
}

pub(crate) fn decode_slice(bytes: &[u8]) -> StoreResult<Slice> {
    let corrupt = || StoreError::Corrupt("unreadable tombstone slice".into());
    let mut input = bytes;
    let mut take = |n: usize| -> StoreResult<&[u8]> {
        if input.len() < n {
            return Err(corrupt());
        }
        let (head, rest) = input.split_at(n);
        input = rest;
        Ok(head)
    };
    let len = u32::from_be_bytes(take(4)?.try_into().map_err(|_| corrupt())?) as usize;
    let prefix = decode_values(take(len)?)?;
    let mut bounds = Vec::with_capacity(2);
    for _ in 0..2 {
        let tag = take(1)?[0];
        let len = u32::from_be_bytes(take(4)?.try_into().map_err(|_| corrupt())?) as usize;
        let mut value = decode_values(take(len)?)?;
        let value = value.pop().ok_or_else(corrupt)?;
        bounds.push(match tag {
            0 => Bound::Unbounded,
            1 => Bound::Included(value),
            2 => Bound::Excluded(value),
            _ => return Err(corrupt()),
        });
    }
    let upper = bounds.pop().ok_or_else(corrupt)?;
    let lower = bounds.pop().ok_or_else(corrupt)?;
    Ok(Slice { prefix, lower, upper })
}

/// The write metadata of one cell (or of a row's liveness marker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CellMeta {
    pub ts: i64,
    /// Expiry of a live value, or purge time of a tombstone.
    pub exp: Option<i64>,
    /// A deleted cell (written as null).
    pub tombstone: bool,
}

impl CellMeta {
    /// Alive for ever: keeps its row from ever being purged.
    pub fn is_permanent(&self) -> bool {
        !self.tombstone && self.exp.is_none()
    }

    /// Cassandra's rule for two versions of one cell (`Cells.reconcile`): the
    /// higher timestamp wins; on a tie a tombstone beats an expiring value, which
    /// beats a permanent one; two expiring values go to the later expiry; what is
    /// left is decided by comparing the values' bytes (`values_cmp`, new vs old).
    pub fn supersedes(&self, old: &CellMeta, values_cmp: impl FnOnce() -> std::cmp::Ordering) -> bool {
        if self.ts != old.ts {
            return self.ts > old.ts;
        }
        let rank = |m: &CellMeta| {
            if m.tombstone {
                2
            } else if m.exp.is_some() {
                1
            } else {
                0
            }
        };
        if rank(self) != rank(old) {
            return rank(self) > rank(old);
        }
        if self.tombstone {
            return false;
        }
        if self.exp != old.exp {
            return self.exp > old.exp;
        }
        values_cmp().is_gt()
    }

    /// Cassandra's rule for two row liveness markers (`LivenessInfo.supersedes`).
    pub fn marker_supersedes(&self, old: &CellMeta) -> bool {
        if self.ts != old.ts {
            return self.ts > old.ts;
        }
        match (self.exp, old.exp) {
            (Some(a), Some(b)) => a > b,
            (a, b) => a.is_some() && b.is_none(),
        }
    }
}

/// A stored cell's write metadata, from its columns as read (is the value
/// NULL, `c$ts`, `c$exp`) and its row's marker timestamp, which a live cell
/// with no timestamp of its own was written with. The flag says the timestamp
/// is the marker's (see the module notes). `None`: no cell.
pub(crate) fn stored_cell(
    value_is_null: bool,
    ts: Option<i64>,
    exp: Option<i64>,
    marker_ts: Option<i64>,
) -> StoreResult<Option<(CellMeta, bool)>> {
    Ok(match (ts, value_is_null) {
        (Some(ts), tombstone) => Some((CellMeta { ts, exp, tombstone }, false)),
        (None, true) => None,
        (None, false) => {
            let ts = marker_ts.ok_or_else(|| StoreError::Corrupt("a cell takes its timestamp from a row marker that is gone".into()))?;
            Some((CellMeta { ts, exp, tombstone: false }, true))
        }
    })
}

/// When a row whose parts carry this metadata may be dropped: never while any
/// part lives for ever, else when the last part expires or its tombstone's grace ends.
pub(crate) fn purge_time<'a>(parts: impl IntoIterator<Item = &'a CellMeta>) -> Option<i64> {
    let mut latest = i64::MIN;
    for p in parts {
        if p.is_permanent() {
            return None;
        }
        latest = latest.max(p.exp.unwrap_or(i64::MIN));
    }
    Some(latest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use revstore_keys::{Tid, TidGenerator};
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn sortable_timeuuids_sort_as_cassandra_and_round_trip() {
        let base = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut tids: Vec<Tid> = (0..200).map(|i| TidGenerator::new().next_at(base + Duration::from_micros(i % 17))).collect();
        tids.sort();
        let encoded: Vec<[u8; 16]> = tids.iter().map(|t| sortable_timeuuid(&t.uuid())).collect();
        assert!(encoded.windows(2).all(|w| w[0] <= w[1]));
        for t in &tids {
            assert_eq!(timeuuid_from_sortable(&sortable_timeuuid(&t.uuid())), Some(t.uuid()));
        }
    }

    #[test]
    fn slices_round_trip() {
        let s = Slice::prefix([Value::BigInt(3)])
            .lower(Bound::Excluded(Value::Text("a".into())))
            .upper(Bound::Included(Value::Text("z".into())));
        assert_eq!(decode_slice(&encode_slice(&s)).unwrap(), s);
        assert_eq!(decode_slice(&encode_slice(&Slice::all())).unwrap(), Slice::all());
        assert!(decode_slice(&[0, 0, 0, 9]).is_err());
    }

    #[test]
    fn reconcile_follows_cassandra() {
        let live = |ts| CellMeta { ts, exp: None, tombstone: false };
        let expiring = |ts, exp| CellMeta { ts, exp: Some(exp), tombstone: false };
        let tomb = |ts| CellMeta { ts, exp: Some(0), tombstone: true };
        let never = || panic!("values compared needlessly");
        assert!(live(2).supersedes(&live(1), never));
        assert!(!live(1).supersedes(&tomb(2), never));
        assert!(tomb(5).supersedes(&live(5), never));
        assert!(tomb(5).supersedes(&expiring(5, 100), never));
        assert!(expiring(5, 10).supersedes(&live(5), never));
        assert!(expiring(5, 11).supersedes(&expiring(5, 10), never));
        assert!(live(5).supersedes(&live(5), || std::cmp::Ordering::Greater));
        assert!(!live(5).supersedes(&live(5), || std::cmp::Ordering::Equal));
        assert!(expiring(5, 9).marker_supersedes(&live(5)));
        assert!(!live(5).marker_supersedes(&expiring(5, 9)));
    }
}
