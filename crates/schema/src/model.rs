//! The vocabulary of a Cassandra-style table.

/// A column's value type. Each maps to one CQL type and one SQLite storage class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnType {
    /// UTF-8 text (CQL `text`).
    Text,
    /// Signed 64-bit integer (CQL `bigint`).
    BigInt,
    /// Bytes (CQL `blob`).
    Blob,
    /// Version 1 UUID, ordered by time (CQL `timeuuid`).
    TimeUuid,
    /// Milliseconds since the Unix epoch (CQL `timestamp`).
    Timestamp,
    /// CQL `boolean`.
    Boolean,
}

impl ColumnType {
    pub fn cql(self) -> &'static str {
        match self {
            ColumnType::Text => "text",
            ColumnType::BigInt => "bigint",
            ColumnType::Blob => "blob",
            ColumnType::TimeUuid => "timeuuid",
            ColumnType::Timestamp => "timestamp",
            ColumnType::Boolean => "boolean",
        }
    }
}

/// Clustering order of a clustering column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Order {
    Asc,
    Desc,
}

/// The role of a column in its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnKind {
    /// Part of the partition key, in declaration order.
    PartitionKey,
    /// Part of the clustering key, in declaration order.
    Clustering(Order),
    /// One value per partition, shared by its rows.
    Static,
    /// An ordinary cell of a row.
    Regular,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Column {
    pub name: &'static str,
    pub ty: ColumnType,
    pub kind: ColumnKind,
}

impl Column {
    pub const fn partition(name: &'static str, ty: ColumnType) -> Column {
        Column { name, ty, kind: ColumnKind::PartitionKey }
    }
    pub const fn clustering(name: &'static str, ty: ColumnType, order: Order) -> Column {
        Column { name, ty, kind: ColumnKind::Clustering(order) }
    }
    pub const fn statik(name: &'static str, ty: ColumnType) -> Column {
        Column { name, ty, kind: ColumnKind::Static }
    }
    pub const fn regular(name: &'static str, ty: ColumnType) -> Column {
        Column { name, ty, kind: ColumnKind::Regular }
    }
}

/// Compaction strategy hint for Cassandra; the embedded engine ignores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compaction {
    /// Size-tiered, Cassandra's default: write-heavy, rarely read back.
    SizeTiered,
    /// Leveled: read-heavy tables whose rows are overwritten.
    Leveled,
    /// Time-window: rows that all expire by TTL (the windows, tombstone
    /// compaction and `gc_grace_seconds` that go with it: [`crate::cql::table_options`]).
    TimeWindow,
}

/// One table: its columns (partition key first, then clustering, then the rest),
/// default TTL and purpose.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TableDef {
    pub name: &'static str,
    pub columns: &'static [Column],
    /// Seconds a row lives when a write gives no TTL; `None` for no expiry.
    pub default_ttl: Option<u32>,
    pub compaction: Compaction,
    pub comment: &'static str,
}

impl TableDef {
    pub fn column(&self, name: &str) -> Option<&'static Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    pub fn partition_key(&self) -> impl Iterator<Item = &'static Column> + '_ {
        self.columns.iter().filter(|c| c.kind == ColumnKind::PartitionKey)
    }

    pub fn clustering(&self) -> impl Iterator<Item = (&'static Column, Order)> + '_ {
        self.columns.iter().filter_map(|c| match c.kind {
            ColumnKind::Clustering(order) => Some((c, order)),
            _ => None,
        })
    }

    pub fn statics(&self) -> impl Iterator<Item = &'static Column> + '_ {
        self.columns.iter().filter(|c| c.kind == ColumnKind::Static)
    }

    pub fn regular(&self) -> impl Iterator<Item = &'static Column> + '_ {
        self.columns.iter().filter(|c| c.kind == ColumnKind::Regular)
    }

    pub fn has_statics(&self) -> bool {
        self.statics().next().is_some()
    }

    /// Checks the declaration itself: names unique and CQL-safe, at least one
    /// partition key column, key columns before the others, statics only with
    /// clustering columns.
    pub fn validate(&self) -> Result<(), String> {
        let problem = |what: String| Err(format!("table {}: {what}", self.name));
        if !is_identifier(self.name) {
            return problem("name is not a lower-case identifier".into());
        }
        if self.partition_key().next().is_none() {
            return problem("no partition key column".into());
        }
        let mut seen = std::collections::HashSet::new();
        let mut phase = 0; // 0 partition, 1 clustering, 2 other
        for c in self.columns {
            if !is_identifier(c.name) || c.name.starts_with('$') {
                return problem(format!("column {:?} is not a lower-case identifier", c.name));
            }
            if !seen.insert(c.name) {
                return problem(format!("column {} declared twice", c.name));
            }
            let p = match c.kind {
                ColumnKind::PartitionKey => 0,
                ColumnKind::Clustering(_) => 1,
                _ => 2,
            };
            if p < phase {
                return problem(format!("column {} is declared after columns of a later kind", c.name));
            }
            phase = p;
        }
        if self.has_statics() && self.clustering().next().is_none() {
            return problem("static columns need clustering columns".into());
        }
        Ok(())
    }
}

/// Whether `s` is a name revstore gives a keyspace, table or column: lower
/// case, starting with a letter, at most 48 characters (CQL's limit).
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some('a'..='z')) && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_')) && s.len() <= 48
}
