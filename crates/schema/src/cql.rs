//! CQL DDL generated from the declarations, for Cassandra 4/5 and ScyllaDB.

use std::fmt::Write as _;

use crate::model::{Column, ColumnKind, Compaction, Order, TableDef};

/// Which server speaks the CQL: keyspace options differ between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Cassandra,
    /// ScyllaDB before 2025.4 rejects lightweight transactions on tablet
    /// keyspaces, and revstore depends on them: its keyspaces turn tablets off.
    Scylla,
}

/// Keyspace replication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replication {
    /// One replication factor, for single-datacenter and test clusters.
    Simple { factor: u32 },
    /// A factor per datacenter, for production.
    NetworkTopology { datacenters: Vec<(String, u32)> },
}

impl std::str::FromStr for Replication {
    type Err = String;

    /// `3` is SimpleStrategy with factor 3; `eqiad:3,codfw:3` is
    /// NetworkTopologyStrategy with a factor per datacenter.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let factor = |f: &str| {
            f.trim().parse::<u32>().ok().filter(|&n| n > 0).ok_or_else(|| format!("replication factor {f:?} is not a positive integer"))
        };
        if !s.contains(':') {
            return Ok(Replication::Simple { factor: factor(s)? });
        }
        let mut datacenters = Vec::new();
        for part in s.split(',') {
            let (dc, rf) = part.split_once(':').ok_or_else(|| format!("{part:?} is not datacenter:factor"))?;
            if dc.trim().is_empty() {
                return Err(format!("{part:?} names no datacenter"));
            }
            datacenters.push((dc.trim().to_owned(), factor(rf)?));
        }
        Ok(Replication::NetworkTopology { datacenters })
    }
}

/// Double-quotes an identifier, so CQL keywords are safe as names.
pub fn quote(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

pub fn create_keyspace(keyspace: &str, replication: &Replication, flavor: Flavor) -> String {
    let replication = match replication {
        Replication::Simple { factor } => format!("{{'class': 'SimpleStrategy', 'replication_factor': {factor}}}"),
        Replication::NetworkTopology { datacenters } => {
            let dcs: Vec<String> = datacenters.iter().map(|(dc, rf)| format!("'{}': {rf}", dc.replace('\'', "''"))).collect();
            format!("{{'class': 'NetworkTopologyStrategy', {}}}", dcs.join(", "))
        }
    };
    let mut ddl = format!("CREATE KEYSPACE IF NOT EXISTS {} WITH replication = {replication}", quote(keyspace));
    if flavor == Flavor::Scylla {
        ddl.push_str(" AND tablets = {'enabled': false}");
    }
    ddl
}

/// `CREATE TABLE IF NOT EXISTS` for one declaration.
/// A column as it appears in `CREATE TABLE` (and after `ALTER TABLE … ADD`).
pub fn column_definition(c: &Column) -> String {
    let statik = if c.kind == ColumnKind::Static { " static" } else { "" };
    format!("{} {}{statik}", quote(c.name), c.ty.cql())
}

/// `ALTER TABLE … ADD` for a column a newer declaration added.
pub fn add_column(keyspace: &str, table: &TableDef, c: &Column) -> String {
    format!("ALTER TABLE {}.{} ADD {}", quote(keyspace), quote(table.name), column_definition(c))
}

/// The columns `table` declares beyond `before` (a [`create_table`] of an
/// earlier declaration, same keyspace), if that is the only difference:
/// static or regular columns added, nothing else changed. `None` for any
/// other change (a type, a key, an option): those are not migrated in place.
pub fn added_columns(keyspace: &str, before: &str, table: &TableDef) -> Option<Vec<&'static Column>> {
    let line = |c: &Column| format!("    {},\n", column_definition(c));
    let added: Vec<&'static Column> =
        table.columns.iter().filter(|c| matches!(c.kind, ColumnKind::Static | ColumnKind::Regular) && !before.contains(&line(c))).collect();
    let mut without = create_table(keyspace, table);
    for c in &added {
        without = without.replacen(&line(c), "", 1);
    }
    (structure(&without) == structure(before)).then_some(added)
}

/// What of a [`create_table`] defines the data: columns, key, clustering
/// order and default TTL — not the compaction strategy or the comment, which
/// may change without touching what is stored.
pub fn structure(ddl: &str) -> String {
    let (head, options) = ddl.split_once("\n) WITH ").unwrap_or((ddl, ""));
    let kept: Vec<&str> =
        options.split("\n    AND ").filter(|o| o.starts_with("CLUSTERING ORDER") || o.starts_with("default_time_to_live")).collect();
    format!("{head}\n) WITH {}", kept.join(" AND "))
}

pub fn create_table(keyspace: &str, table: &TableDef) -> String {
    let mut ddl = format!("CREATE TABLE IF NOT EXISTS {}.{} (\n", quote(keyspace), quote(table.name));
    for c in table.columns {
        let _ = writeln!(ddl, "    {},", column_definition(c));
    }
    let partition: Vec<String> = table.partition_key().map(|c| quote(c.name)).collect();
    let clustering: Vec<String> = table.clustering().map(|(c, _)| quote(c.name)).collect();
    let mut key = format!("({})", partition.join(", "));
    for c in &clustering {
        key.push_str(", ");
        key.push_str(c);
    }
    let _ = write!(ddl, "    PRIMARY KEY ({key})\n)");
    let mut options = Vec::new();
    let orders: Vec<String> =
        table.clustering().map(|(c, order)| format!("{} {}", quote(c.name), if order == Order::Asc { "ASC" } else { "DESC" })).collect();
    if !orders.is_empty() {
        options.push(format!("CLUSTERING ORDER BY ({})", orders.join(", ")));
    }
    if let Some(ttl) = table.default_ttl {
        options.push(format!("default_time_to_live = {ttl}"));
    }
    options.extend(table_options(table).clauses());
    options.push(format!("comment = '{}'", table.comment.replace('\'', "''")));
    let _ = write!(ddl, " WITH {}", options.join("\n    AND "));
    ddl
}

/// How long a table whose rows all expire keeps a tombstone (an expired cell,
/// or the delete of a page's renders) before compaction may drop it: the
/// hint window (`max_hint_window`, 3 hours by default). A replica down for
/// longer misses hints either way and is brought level by repair; what it
/// could bring back is a row that expires by its own TTL within the grace
/// period. Cassandra's default, 10 days, kept ten days of expired grace
/// copies on disk for a day's worth readers are owed (docs/design/current-store-writes.md).
pub const EXPIRING_GC_GRACE_SECS: u32 = 3 * 3600;

/// The table options revstore sets besides its columns and TTL: compaction
/// and its sub-options, and `gc_grace_seconds` where it departs from
/// Cassandra's default. Declared here; applied at creation and, when the
/// cluster's table has others, by [`alter_options`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableOptions {
    /// `class` first (the short name), then sub-options, as CQL strings.
    pub compaction: Vec<(&'static str, String)>,
    pub gc_grace_seconds: Option<u32>,
}

impl TableOptions {
    fn clauses(&self) -> Vec<String> {
        let compaction: Vec<String> = self.compaction.iter().map(|(k, v)| format!("'{k}': '{v}'")).collect();
        let mut clauses = vec![format!("compaction = {{{}}}", compaction.join(", "))];
        if let Some(gc_grace) = self.gc_grace_seconds {
            clauses.push(format!("gc_grace_seconds = {gc_grace}"));
        }
        clauses
    }

    /// Whether a table the cluster describes with these `compaction` map and
    /// `gc_grace_seconds` has the declared options (the cluster names the
    /// class in full and adds defaults of its own, which are not compared).
    pub fn applied_in(&self, compaction: &std::collections::HashMap<String, String>, gc_grace_seconds: i32) -> bool {
        let compaction_applied = self.compaction.iter().all(|(key, want)| match (*key, compaction.get(*key)) {
            ("class", Some(found)) => found == want || found.ends_with(&format!(".{want}")),
            (_, Some(found)) => found.eq_ignore_ascii_case(want),
            (_, None) => false,
        });
        compaction_applied && self.gc_grace_seconds.is_none_or(|want| i64::from(want) == i64::from(gc_grace_seconds))
    }
}

/// The options of a table (see [`TableOptions`]). A time-window table is one
/// whose rows all expire by TTL: windows of a 24th of its TTL (an hour for
/// the day-long grace period), so that a window's SSTable is dropped whole
/// about an hour after its last row expires, instead of compacting expired
/// rows with live ones; single-SSTable tombstone compactions once a window
/// is that old, without the overlap pre-check (every SSTable of a hashed
/// key space overlaps every other); tombstones kept [`EXPIRING_GC_GRACE_SECS`].
pub fn table_options(table: &TableDef) -> TableOptions {
    match table.compaction {
        Compaction::SizeTiered => {
            TableOptions { compaction: vec![("class", "SizeTieredCompactionStrategy".into())], gc_grace_seconds: None }
        }
        Compaction::Leveled => TableOptions { compaction: vec![("class", "LeveledCompactionStrategy".into())], gc_grace_seconds: None },
        Compaction::TimeWindow => {
            let window_hours = (table.default_ttl.unwrap_or(86_400) / 86_400).max(1);
            TableOptions {
                compaction: vec![
                    ("class", "TimeWindowCompactionStrategy".into()),
                    ("compaction_window_unit", "HOURS".into()),
                    ("compaction_window_size", window_hours.to_string()),
                    ("unchecked_tombstone_compaction", "true".into()),
                    ("tombstone_compaction_interval", (window_hours * 3600).to_string()),
                ],
                gc_grace_seconds: Some(EXPIRING_GC_GRACE_SECS),
            }
        }
    }
}

/// `ALTER TABLE` to the declared options (see [`TableOptions::applied_in`]).
pub fn alter_options(keyspace: &str, table: &TableDef) -> String {
    format!("ALTER TABLE {}.{} WITH {}", quote(keyspace), quote(table.name), table_options(table).clauses().join(" AND "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structure_ignores_the_comment_and_compaction_but_not_ttl_or_order() {
        use crate::tables::current_store::OUTBOX;
        let ddl = create_table("ks", &OUTBOX);
        let edited = ddl.replace(OUTBOX.comment, "another comment").replace("LeveledCompactionStrategy", "SizeTieredCompactionStrategy");
        assert_ne!(ddl, edited);
        assert_eq!(structure(&ddl), structure(&edited));
        let ttl = OUTBOX.default_ttl.expect("the outbox expires");
        assert_ne!(structure(&ddl), structure(&ddl.replace(&format!("default_time_to_live = {ttl}"), "default_time_to_live = 1")));
        assert_ne!(structure(&ddl), structure(&ddl.replace("ASC", "DESC")));
    }
    use crate::model::Column as C;
    use crate::model::ColumnType::{BigInt, Blob, Text, TimeUuid};
    use crate::tables::{current_store, old_store};

    /// Rows kept a day, then expired: the table shape that compacts by time windows.
    static EXPIRING: TableDef = TableDef {
        name: "expiring",
        columns: &[
            C::partition("domain", Text),
            C::partition("title", Text),
            C::partition("rev", BigInt),
            C::partition("tid", TimeUuid),
            C::regular("html", Blob),
        ],
        default_ttl: Some(86_400),
        compaction: Compaction::TimeWindow,
        comment: "rows that only expire",
    };

    #[test]
    fn page_renders_ddl() {
        assert_eq!(
            create_table("revstore", &current_store::PAGE_RENDERS),
            r#"CREATE TABLE IF NOT EXISTS "revstore"."page_renders" (
    "domain" text,
    "title" text,
    "rev" bigint,
    "tid" timeuuid,
    "has_suppressed_revs" boolean static,
    "deleted_through_rev" bigint static,
    "stored_at" timestamp,
    "body_hash" bigint,
    "stored_bytes" bigint,
    "html" blob,
    "data_parsoid" blob,
    "section_offsets" blob,
    PRIMARY KEY (("domain", "title"), "rev", "tid")
) WITH CLUSTERING ORDER BY ("rev" DESC, "tid" DESC)
    AND compaction = {'class': 'LeveledCompactionStrategy'}
    AND comment = 'every render of a page, newest first, kept until superseded for the grace period'"#
        );
    }

    #[test]
    fn statics_ttl_and_composite_keys() {
        let meta = create_table("ks", &old_store::ARCHIVE_META);
        assert!(meta.contains("\"rev_count\" bigint static,"), "{meta}");
        assert!(meta.contains("PRIMARY KEY ((\"domain\", \"title\"), \"rev\", \"tid\")"), "{meta}");
        let expiring = create_table("ks", &EXPIRING);
        assert!(expiring.contains("PRIMARY KEY ((\"domain\", \"title\", \"rev\", \"tid\"))"), "{expiring}");
        assert!(expiring.contains("default_time_to_live = 86400"), "{expiring}");
        assert!(!expiring.contains("CLUSTERING ORDER"), "{expiring}");
    }

    #[test]
    fn expiring_tables_compact_by_hour_windows_and_keep_tombstones_three_hours() {
        let expiring = create_table("ks", &EXPIRING);
        assert!(
            expiring.contains(
                "compaction = {'class': 'TimeWindowCompactionStrategy', 'compaction_window_unit': 'HOURS', \
                 'compaction_window_size': '1', 'unchecked_tombstone_compaction': 'true', 'tombstone_compaction_interval': '3600'}"
            ),
            "{expiring}"
        );
        assert!(expiring.contains("gc_grace_seconds = 10800"), "{expiring}");
        assert_eq!(
            alter_options("ks", &EXPIRING),
            "ALTER TABLE \"ks\".\"expiring\" WITH compaction = {'class': 'TimeWindowCompactionStrategy', 'compaction_window_unit': 'HOURS', \
             'compaction_window_size': '1', 'unchecked_tombstone_compaction': 'true', 'tombstone_compaction_interval': '3600'} \
             AND gc_grace_seconds = 10800"
        );
        // Tables that are not TTL-only keep Cassandra's gc_grace_seconds.
        assert!(!create_table("ks", &current_store::PAGE_RENDERS).contains("gc_grace_seconds"));
    }

    #[test]
    fn options_are_compared_with_what_the_cluster_describes() {
        let options = table_options(&EXPIRING);
        let described = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let applied = described(&[
            ("class", "org.apache.cassandra.db.compaction.TimeWindowCompactionStrategy"),
            ("compaction_window_unit", "HOURS"),
            ("compaction_window_size", "1"),
            ("unchecked_tombstone_compaction", "true"),
            ("tombstone_compaction_interval", "3600"),
            ("max_threshold", "32"),
        ]);
        assert!(options.applied_in(&applied, 10_800));
        assert!(!options.applied_in(&applied, 864_000), "Cassandra's default gc_grace_seconds");
        let before = described(&[("class", "org.apache.cassandra.db.compaction.TimeWindowCompactionStrategy"), ("max_threshold", "32")]);
        assert!(!options.applied_in(&before, 10_800), "windows of a day, Cassandra's default");
        let leveled = table_options(&current_store::PAGE_RENDERS);
        assert!(leveled.applied_in(&described(&[("class", "org.apache.cassandra.db.compaction.LeveledCompactionStrategy")]), 864_000));
    }

    #[test]
    fn replication_parses_from_settings() {
        assert_eq!("3".parse(), Ok(Replication::Simple { factor: 3 }));
        assert_eq!(
            "eqiad:3, codfw:2".parse(),
            Ok(Replication::NetworkTopology { datacenters: vec![("eqiad".into(), 3), ("codfw".into(), 2)] })
        );
        for bad in ["", "0", "x", "eqiad:", ":3", "eqiad:3,codfw"] {
            assert!(bad.parse::<Replication>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn keyspace_ddl_branches_on_the_server() {
        let simple = Replication::Simple { factor: 1 };
        assert_eq!(
            create_keyspace("rs", &simple, Flavor::Cassandra),
            r#"CREATE KEYSPACE IF NOT EXISTS "rs" WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}"#
        );
        assert!(create_keyspace("rs", &simple, Flavor::Scylla).ends_with("AND tablets = {'enabled': false}"));
        let nts = Replication::NetworkTopology { datacenters: vec![("eqiad".into(), 3), ("codfw".into(), 3)] };
        assert!(create_keyspace("rs", &nts, Flavor::Cassandra).contains("'NetworkTopologyStrategy', 'eqiad': 3, 'codfw': 3"));
    }
}
