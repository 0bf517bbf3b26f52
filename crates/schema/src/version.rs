//! Schema versions, one per component (each service's tables, and later the
//! janitor's), so that a change to one service's tables does not make the
//! others unready.
//!
//! A [`Component`] names its tables, its `version`, and `compatible_from`: the
//! oldest version of the component's code that still works on tables at
//! `version`. An additive change (a new table or column) bumps `version` and
//! keeps `compatible_from`, so replicas of the previous build stay ready while
//! a rolling upgrade replaces them; a change the previous code cannot live
//! with raises `compatible_from` to `version`. Each component's fingerprint is
//! derived from its declarations, so a table change that forgets to bump the
//! version fails the test below instead of reaching a cluster unannounced.

use sha2::{Digest, Sha256};

use crate::cql::create_table;
use crate::model::TableDef;
use crate::tables::{current_store, dependency_graph, janitor, old_store};

/// A set of tables versioned together.
#[derive(Debug)]
pub struct Component {
    /// The name its version is recorded under in `schema_meta` (a service's name).
    pub name: &'static str,
    pub version: u32,
    /// The oldest version of this component's code that works on its tables at `version`.
    pub compatible_from: u32,
    pub tables: &'static [&'static TableDef],
}

impl Component {
    /// A short digest of the component's DDL.
    pub fn fingerprint(&self) -> String {
        fingerprint_of(self.tables)
    }
}

fn fingerprint_of(tables: &[&TableDef]) -> String {
    let mut hash = Sha256::new();
    for table in tables {
        hash.update(create_table("ks", table).as_bytes());
        hash.update(b"\n");
    }
    hash.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

// Version 1 is the layout of the first release. A later change adds a line
// here saying what changed and whether the previous version's code still
// works on it (see `compatible_from`).
//
// current-store 2: the outbox in partitions of one shard and one minute
// (`outbox_by_minute`), each shard delivered by the holder of its row in
// `outbox_shards` from where it delivered through. Version 1's code queued
// into `outbox`, which version 2 does not read: drain it (the outbox backlog
// at 0) before the upgrade.
//
// current-store 3: `page_renders.has_suppressed_revs`, a static cell set on
// the pages that have a suppressed revision (read with a page's first row,
// so that a render write need not check suppression). Version 2's code
// neither reads nor writes it and still works; `revstore-migrate` sets it for
// the suppressions made before (run it again once no version 2 replica is
// left, for those made during the roll).
pub static CURRENT_STORE: Component = Component { name: "current-store", version: 3, compatible_from: 2, tables: &current_store::TABLES };
//
// old-store 2: compaction debt in partitions of one shard and one hour
// (`archive_debt_by_hour`), each shard swept from the first hour that may
// still hold debt (`archive_debt_shards`). Version 1's code marked debt in
// `archive_compaction_debt`, which version 2 does not read: upgrade when
// `old_store_compaction_debt_markers` is 0 (debt is discharged within the
// settle period of the last append).
//
// old-store 3: `archive_blocks` compacts leveled (size-tiered kept rows a
// block's seal had deleted on disk). Options only: version 2's code works on
// it.
//
// old-store 4: `archive_titles` keeps the page id and namespace number an
// archive write names (an import takes them from the XML dump), for history
// dumps in the Enterprise layout. Additive: version 3's code neither reads
// nor writes them.
pub static OLD_STORE: Component = Component { name: "old-store", version: 4, compatible_from: 2, tables: &old_store::TABLES };
//
// dependency-graph 2: a parent's dependents in `graph_parent_dependents`,
// partitioned by bucket alone and clustered by (priority descending, child),
// with `graph_parent_buckets` listing the buckets in use; a listing merges
// the buckets, so its reads no longer grow with the spread of priorities.
// Version 1's code read `graph_dependents` and `graph_dependent_buckets`
// (priority in the partition key), which version 2 neither reads nor writes:
// the by-parent rows are rebuilt from `graph_dependencies` by the janitor's
// `graph` task (OPERATIONS, "Schema versions and upgrades").
pub static DEPENDENCY_GRAPH: Component =
    Component { name: "dependency-graph", version: 2, compatible_from: 2, tables: &dependency_graph::TABLES };
//
// janitor 2: `janitor_journal`, the pages each service changed by minute, for
// routine runs. Additive: version 1's code ignores it (its runs visit every
// page).
pub static JANITOR: Component = Component { name: "janitor", version: 2, compatible_from: 1, tables: &janitor::TABLES };

/// Every component, in a stable order.
pub static COMPONENTS: [&Component; 4] = [&CURRENT_STORE, &OLD_STORE, &DEPENDENCY_GRAPH, &JANITOR];

/// The component of this name.
pub fn component(name: &str) -> Option<&'static Component> {
    COMPONENTS.iter().copied().find(|c| c.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tables::meta;

    /// The fingerprints the declarations had when each version was set: a change
    /// to a component's tables must come with a new version and a new line here.
    const EXPECTED_FINGERPRINTS: [(&str, u32, &str); 4] = [
        ("current-store", 3, "e14cdbc893f99f76"),
        ("old-store", 4, "59c409a2e1b2af7c"),
        ("dependency-graph", 2, "220a19126096aaf9"),
        ("janitor", 2, "a3cc7d4db6c7255b"),
    ];

    /// `schema_meta`'s own declaration, which every migration applies first.
    const EXPECTED_META_FINGERPRINT: &str = "2574f95c24b28d5e";

    #[test]
    fn declarations_match_their_component_versions() {
        for (c, (name, version, expected)) in COMPONENTS.iter().zip(EXPECTED_FINGERPRINTS) {
            assert_eq!((c.name, c.version), (name, version), "EXPECTED_FINGERPRINTS follows COMPONENTS");
            assert_eq!(
                c.fingerprint(),
                expected,
                "the tables of {name} changed: bump its version (and compatible_from if the previous code cannot use them) and set its expected fingerprint"
            );
            assert!(c.compatible_from <= c.version);
        }
        assert_eq!(
            fingerprint_of(&[&meta::SCHEMA_META]),
            EXPECTED_META_FINGERPRINT,
            "schema_meta changed: only additive changes are possible"
        );
    }

    #[test]
    fn every_table_belongs_to_one_component() {
        let mut seen = std::collections::HashSet::new();
        for c in COMPONENTS {
            assert!(component(c.name).is_some());
            for t in c.tables {
                assert!(seen.insert(t.name), "table {} is in two components", t.name);
            }
        }
        assert_eq!(seen.len() + 1, crate::ALL_TABLES.len(), "ALL_TABLES is schema_meta and every component's tables");
    }
}
