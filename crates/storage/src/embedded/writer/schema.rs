//! Creating and checking an embedded database's tables.

use revstore_schema::TableDef;
use rusqlite::OptionalExtension;

use crate::embedded::layout::{ENGINE_TABLES_DDL, LAYOUT_VERSION, create_statements};
use crate::error::{StoreError, StoreResult};

use super::Writer;

impl Writer {
    pub(super) fn ensure(&mut self, tables: &[&'static TableDef]) -> StoreResult<()> {
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
                            .filter(|added| added.iter().all(|c| crate::embedded::layout::can_add_column(t, c)))
                            .ok_or_else(|| {
                                StoreError::SchemaMismatch(format!(
                                    "table {} exists with another declaration; migrate it before running this version",
                                    t.name
                                ))
                            })?;
                        for c in added {
                            for statement in crate::embedded::layout::add_column_statements(t, c) {
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
}
