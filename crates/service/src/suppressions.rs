//! Suppressions (MediaWiki's revision deletion): revisions hidden from every
//! reader, which an oversighter can lift and set again. current-store
//! (`suppressed`) and old-store (`archive_suppressed`) each keep one, with
//! the columns of [`col`]: a row per revision ever suppressed.
//!
//! A row holds `suppressed_at` and `lifted_at`, each written with its own
//! value as the cell's write timestamp, so the newest of each wins whatever
//! order the writes arrive in. The revision is hidden while `suppressed_at`
//! is later than `lifted_at` (or nothing was lifted). A change reads the row
//! first and writes a time later than the other column's, whatever its own
//! clock says: a lift made after a suppression, or a suppression after a
//! lift, wins however far apart the two writers' clocks are. Two changes at
//! once (two sites during a cut) are ordered by their times; the later one
//! stands everywhere once the sites exchange the row.
//!
//! A page's deletion hides its revisions too, through the newest one
//! deleted: each service keeps that revision in a static cell of the page's
//! partition, written at [`deletion_timestamp`].
//!
//! Nothing is deleted: a lift is a cell, so a suppression's row never turns
//! into a tombstone that reads step over, and a suppression once lifted can
//! be set again.
//!
//! # Across sites
//! A suppression or a deletion is written in the site that made it; the
//! other sites get it by replication, or, for one made while the link was
//! cut, by the hints their nodes keep for each other, for the hint window
//! (3 hours by default). After a longer cut, or with hints lost, another
//! site would serve what was hidden until a repair. So each suppression table
//! also records the page's deletion (the static `deleted_through_rev`, at
//! the deletion's timestamp), and the janitor's `hidden` task ([`HiddenSweep`])
//! reads every partition of the table from every site (EACH_QUORUM) and
//! writes back what it found at the timestamps it found, in the table and in
//! the service's own tables (a page's deletion fence, current-store's
//! suppression flag): idempotent, and never over anything newer.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::TryStreamExt;
use revstore_api::janitor::{StepReport, Task};
use revstore_keys::{Domain, RevId, Title};
use revstore_storage::{ReadQuery, Row, ScanQuery, Store, StoreResult, TableDef, Upsert, Value, Write};

use crate::janitor_admin::{Stepped, Sweep, SweepError, SweepPosition, stored_page};

/// The columns every suppression table declares.
pub mod col {
    pub const DOMAIN: &str = "domain";
    pub const TITLE: &str = "title";
    pub const REV: &str = "rev";
    pub const SUPPRESSED_AT: &str = "suppressed_at";
    pub const LIFTED_AT: &str = "lifted_at";
    /// Static: the page was deleted through this revision.
    pub const DELETED_THROUGH_REV: &str = "deleted_through_rev";
}

/// The write timestamps of page deletions, above every clock's: a deletion
/// of a page through revision R writes what hides the page's revisions at
/// [`deletion_timestamp`]`(R)`, so that no write of a revision up to R (a
/// retried job, a late replica, another site's), timestamped by a clock, is
/// newer, while a deletion through a later revision always wins over an
/// earlier one. (2^61 µs is some 73,000 years.)
const DELETIONS: i64 = 1 << 61;

/// The write timestamp of a page's deletion through `rev`. Revisions past
/// 2^63 - 2^61 (no wiki has them; a request may name them) all take the
/// largest timestamp, where the larger revision still wins: Cassandra (and
/// the embedded engine) break a timestamp tie by the larger value.
pub fn deletion_timestamp(rev: RevId) -> i64 {
    DELETIONS.saturating_add(rev.as_i64())
}

/// Suppressed revisions listed per read (a page has a handful).
const PAGE: u32 = 1000;

/// What a change does to a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Suppress,
    Lift,
}

/// A service's suppression table.
#[derive(Debug, Clone, Copy)]
pub struct Suppressions {
    pub table: &'static TableDef,
}

impl Suppressions {
    /// Suppresses or lifts `rev` of the page; answers the time (milliseconds)
    /// the table records for the change: the one written, or when the
    /// revision already was so, the one it was made so at (`None`: a lift of
    /// a revision never suppressed). Idempotent: suppressing a hidden
    /// revision (or lifting a visible one) writes nothing.
    pub async fn change(&self, store: &Store, domain: &Domain, title: &Title, rev: RevId, change: Change) -> StoreResult<Option<i64>> {
        let key = self.key(domain, title, rev);
        let row = store.get(self.table, key.to_vec(), Some(vec![col::SUPPRESSED_AT, col::LIFTED_AT])).await?;
        let (suppressed_at, lifted_at) = times(row.as_ref());
        let hidden = is_hidden(suppressed_at, lifted_at);
        let (column, after) = match change {
            Change::Suppress if !hidden => (col::SUPPRESSED_AT, lifted_at),
            Change::Lift if hidden => (col::LIFTED_AT, suppressed_at),
            Change::Suppress => return Ok(suppressed_at),
            Change::Lift => return Ok(lifted_at),
        };
        let now = revstore_keys::time::millis(store.now());
        let at = after.map_or(now, |after| now.max(after + 1));
        store.write(Upsert::new(self.table, key).set(column, Value::Timestamp(at)).timestamp(at * 1000)).await?;
        Ok(Some(at))
    }

    /// Records a change at the time another store recorded it (`at`,
    /// milliseconds): old-store's rows then hold current-store's times, so
    /// the two tables agree whatever order the changes arrive in and however
    /// often one is sent again (the newest time of each column wins).
    pub async fn record(&self, store: &Store, domain: &Domain, title: &Title, rev: RevId, change: Change, at: i64) -> StoreResult<()> {
        let column = match change {
            Change::Suppress => col::SUPPRESSED_AT,
            Change::Lift => col::LIFTED_AT,
        };
        let key = self.key(domain, title, rev);
        store.write(Upsert::new(self.table, key).set(column, Value::Timestamp(at)).timestamp(at.saturating_mul(1000))).await
    }

    /// Whether `rev` of the page is hidden.
    pub async fn is_suppressed(&self, store: &Store, domain: &Domain, title: &Title, rev: RevId) -> StoreResult<bool> {
        let row = store.get(self.table, self.key(domain, title, rev).to_vec(), Some(vec![col::SUPPRESSED_AT, col::LIFTED_AT])).await?;
        let (suppressed_at, lifted_at) = times(row.as_ref());
        Ok(is_hidden(suppressed_at, lifted_at))
    }

    /// Every hidden revision of the page.
    pub async fn revisions(&self, store: &Store, domain: &Domain, title: &Title) -> StoreResult<BTreeSet<RevId>> {
        let partition = [Value::from(domain.as_str()), Value::from(title.as_str())];
        let query = ReadQuery::new(self.table, partition).columns([col::SUPPRESSED_AT, col::LIFTED_AT]).limit(PAGE);
        let rows: Vec<Row> = store.rows(query).try_collect().await?;
        Ok(rows
            .iter()
            .filter(|row| {
                let (suppressed_at, lifted_at) = times(Some(row));
                is_hidden(suppressed_at, lifted_at)
            })
            .filter_map(|row| row.bigint(col::REV).and_then(|r| RevId::new(r as u64).ok()))
            .collect())
    }

    /// The write that records the page's deletion through `through` in the
    /// table (at its deletion timestamp), where the `hidden` task finds it.
    pub fn deletion_record(&self, domain: &Domain, title: &Title, through: RevId) -> Write {
        Upsert::new(self.table, [Value::from(domain.as_str()), Value::from(title.as_str())])
            .set(col::DELETED_THROUGH_REV, through.as_i64())
            .timestamp(deletion_timestamp(through))
            .into()
    }

    /// What the table holds of one page, read from every site, written back
    /// at the timestamps it holds: each suppression's and lift's time, the
    /// deletion record. A site that missed any of it has it once the write
    /// replicates; a site with something newer keeps it.
    pub async fn resync(&self, store: &Store, page: &[Value]) -> StoreResult<Hidden> {
        let statics = ReadQuery::new(self.table, page.iter().cloned()).columns([col::DELETED_THROUGH_REV]).first(1).across_sites();
        let statics = store.read(&statics).await?.statics;
        let deleted_through = statics.as_ref().and_then(|s| s.bigint(col::DELETED_THROUGH_REV)).and_then(|r| RevId::new(r as u64).ok());
        let rows =
            ReadQuery::new(self.table, page.iter().cloned()).columns([col::SUPPRESSED_AT, col::LIFTED_AT]).limit(PAGE).across_sites();
        let rows: Vec<Row> = store.rows(rows).try_collect().await?;
        let mut writes: Vec<Write> = Vec::new();
        if let Some(through) = deleted_through {
            let record = Upsert::new(self.table, page.iter().cloned()).set(col::DELETED_THROUGH_REV, through.as_i64());
            writes.push(record.timestamp(deletion_timestamp(through)).into());
        }
        let mut hidden = Hidden { deleted_through, rows: rows.len(), ..Hidden::default() };
        for row in &rows {
            let Some(rev) = row.bigint(col::REV) else { continue };
            if let Ok(id) = RevId::new(rev as u64) {
                hidden.changes.push((id, row.timestamp(col::SUPPRESSED_AT), row.timestamp(col::LIFTED_AT)));
            }
            let key: Vec<Value> = page.iter().cloned().chain([Value::from(rev)]).collect();
            for column in [col::SUPPRESSED_AT, col::LIFTED_AT] {
                if let Some(at) = row.timestamp(column) {
                    writes.push(Upsert::new(self.table, key.clone()).set(column, Value::Timestamp(at)).timestamp(at * 1000).into());
                }
            }
            let (suppressed_at, lifted_at) = times(Some(row));
            if is_hidden(suppressed_at, lifted_at) {
                hidden.revisions.extend(RevId::new(rev as u64).ok());
            }
        }
        hidden.writes = writes;
        Ok(hidden)
    }

    fn key(&self, domain: &Domain, title: &Title, rev: RevId) -> [Value; 3] {
        [Value::from(domain.as_str()), Value::from(title.as_str()), Value::from(rev.as_i64())]
    }
}

/// What a page's partition of a suppression table says, read from every
/// site ([`Suppressions::resync`]), and the writes that put it back.
#[derive(Debug, Default)]
pub struct Hidden {
    /// The page was deleted through this revision.
    pub deleted_through: Option<RevId>,
    /// Its revisions hidden now.
    pub revisions: BTreeSet<RevId>,
    /// Its suppression rows, hidden or lifted.
    pub rows: usize,
    /// Each row's revision and times (milliseconds): when it was last
    /// suppressed and last lifted.
    pub changes: Vec<(RevId, Option<i64>, Option<i64>)>,
    /// The table's own cells, at the timestamps they were read with.
    pub writes: Vec<Write>,
}

/// What a service writes again, in its own tables, to hide what a page's
/// suppression partition says is hidden.
#[async_trait]
pub trait Hiding: Send + Sync + std::fmt::Debug + 'static {
    /// The service's suppression table.
    fn suppressions(&self) -> Suppressions;

    /// The writes that hide `hidden` in the service's other tables (a
    /// deletion's fence at its deletion timestamp, a page's flag): each at a
    /// timestamp of its own, so writing them again changes nothing anywhere
    /// that already has them.
    fn hiding_writes(&self, domain: &Domain, title: &Title, hidden: &Hidden) -> Vec<Write>;

    /// Sends `hidden` on to a service that hides the same revisions (current-
    /// store to old-store), once it is written here: the backstop for a
    /// hand-off that never arrived. Idempotent; nothing by default.
    async fn forward(&self, _domain: &Domain, _title: &Title, _hidden: &Hidden) -> Result<(), SweepError> {
        Ok(())
    }
}

/// The janitor's `hidden` task in a service: every partition of its
/// suppression table, scanned and read from every site, written back with
/// what hides it in the service's own tables (see the module documentation).
/// Scope `all` only: it reads every row it checks, from every site.
#[derive(Debug)]
pub struct HiddenSweep<H> {
    store: Store,
    hiding: Arc<H>,
}

impl<H: Hiding> HiddenSweep<H> {
    pub fn new(store: Store, hiding: Arc<H>) -> Self {
        HiddenSweep { store, hiding }
    }
}

#[async_trait]
impl<H: Hiding> Sweep for HiddenSweep<H> {
    fn task(&self) -> Task {
        Task::Hidden
    }

    async fn step(&self, from: SweepPosition, budget: u32, dry_run: bool) -> Result<Stepped, SweepError> {
        let suppressions = self.hiding.suppressions();
        let scan = ScanQuery::new(suppressions.table, budget).after(from.after.clone()).across_sites();
        let scanned = self.store.scan_range(&scan).await?;
        let mut report = StepReport { partitions: scanned.partitions.len() as u64, ..StepReport::default() };
        for partition in &scanned.partitions {
            let (domain, title) = stored_page(&partition.key)?;
            let mut hidden = suppressions.resync(&self.store, &partition.key).await?;
            report.rows += hidden.rows as u64 + u64::from(hidden.deleted_through.is_some());
            if dry_run {
                continue;
            }
            let mut writes = std::mem::take(&mut hidden.writes);
            writes.extend(self.hiding.hiding_writes(&domain, &title, &hidden));
            if !writes.is_empty() {
                self.store.apply(writes).await?;
            }
            self.hiding.forward(&domain, &title, &hidden).await?;
        }
        let next = scanned.next.map(|p| SweepPosition { after: Some(p), ..SweepPosition::default() });
        Ok(Stepped { report, next })
    }
}

fn times(row: Option<&Row>) -> (Option<i64>, Option<i64>) {
    row.map_or((None, None), |row| (row.timestamp(col::SUPPRESSED_AT), row.timestamp(col::LIFTED_AT)))
}

fn is_hidden(suppressed_at: Option<i64>, lifted_at: Option<i64>) -> bool {
    match (suppressed_at, lifted_at) {
        (Some(suppressed), Some(lifted)) => suppressed > lifted,
        (suppressed, _) => suppressed.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletions_through_later_revisions_are_later_whatever_the_revision() {
        let at = |rev: u64| deletion_timestamp(RevId::new(rev).expect("rev"));
        assert!(at(1) < at(2));
        assert!(at(2) > 4_102_444_800_000_000, "below a clock's write in 2100");
        assert_eq!(at(RevId::MAX), i64::MAX, "a request's largest revision");
    }

    #[test]
    fn a_revision_is_hidden_while_its_suppression_is_later_than_its_lift() {
        assert!(!is_hidden(None, None));
        assert!(is_hidden(Some(5), None));
        assert!(!is_hidden(Some(5), Some(6)), "lifted");
        assert!(is_hidden(Some(7), Some(6)), "suppressed again");
        assert!(!is_hidden(None, Some(6)));
    }
}
