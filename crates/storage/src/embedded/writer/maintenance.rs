//! Purging what expired or was deleted past its grace period, and giving
//! the space back to the file system.

use std::collections::BTreeSet;

use crate::embedded::layout::{PID, q, registry_of};
use crate::error::{StoreError, StoreResult};
use crate::ops::PurgeStats;

use super::{Writer, step_to_end};

impl Writer {
    /// A purge on the engine's own schedule: counted and logged here, as
    /// nobody waits for its answer.
    pub(super) fn purge_and_report(&mut self) {
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

    pub(super) fn purge(&mut self) -> StoreResult<PurgeStats> {
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

    pub(super) fn file_bytes(&self) -> u64 {
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
