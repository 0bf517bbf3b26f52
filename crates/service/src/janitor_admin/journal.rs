//! The journal of changed pages, and the sweeps that visit pages: every page
//! of a table ([`EveryPage`], scope `all`), or only those the journal shows
//! changed since the last completed sweep ([`ChangedPages`], scope
//! `changed`: a routine run's work grows with what changed, not with the
//! wiki).
//!
//! A write of a page records `(at, page)` in `janitor_journal`, partition
//! (service, shard, minute), before the change becomes visible; `at` is the
//! last microsecond of its ten-second slot, so every write of the page in
//! that slot writes the same row (a writer that remembers it wrote it skips
//! it), and the visit comes at most a slot later. A changed sweep reads the rows of a window `(through, to]`:
//! `through` is where the last completed changed sweep of the task ended,
//! `to` is now less the time a change waits for its visit (the grace period,
//! the change retention) and a margin for a late row (clock skew and a
//! storage write's timeout). Nothing in the journal is deleted: rows expire
//! with the table's TTL under time-window compaction, so no read steps over
//! a tombstone. A sweep with no `through`, or one older than the journal
//! keeps, visits every page instead, and ends where that pass began.

use std::collections::HashSet;
use std::ops::Bound;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::TryStreamExt;
use revstore_api::janitor::{Scope, StepReport, Task};
use revstore_keys::murmur3_token;
use revstore_schema::TableDef;
use revstore_schema::tables::janitor::JOURNAL;
use revstore_storage::value::{decode_values, encode_values};
use revstore_storage::{ReadQuery, ScanQuery, Slice, Store, Upsert, Value, Write, slices_after};

use super::checkpoints::Checkpoints;
use super::sweep::{Stepped, Sweep, SweepError, SweepPosition};

/// Partitions per service and minute: a minute's writes spread over a few
/// replica sets, and a routine run reads `JOURNAL_SHARDS` partitions a minute.
const JOURNAL_SHARDS: i64 = 4;
const MINUTE_MICROS: i64 = 60_000_000;
/// The journal's resolution: every change of a page within one slot writes
/// the same row, timed at the slot's end (a minute holds six).
pub const SLOT_MICROS: i64 = 10_000_000;

/// How far back a window may start and still find every row of it: the
/// table's TTL less a day, so that no row of the window has expired.
fn journal_reach() -> Duration {
    Duration::from_secs(u64::from(JOURNAL.default_ttl.unwrap_or(0))).saturating_sub(Duration::from_secs(86_400))
}

/// A service's journal of changed pages.
#[derive(Debug, Clone)]
pub struct Journal {
    store: Store,
    service: &'static str,
}

impl Journal {
    pub fn new(store: Store, service: &'static str) -> Self {
        Journal { store, service }
    }

    /// The row recording that the page whose partition key is `page` changes
    /// now: written with the change, before it is visible.
    pub fn entry(&self, page: &[Value]) -> Write {
        self.entry_in(self.slot_now(), page)
    }

    /// The slot (of [`SLOT_MICROS`]) a change made now is journaled in.
    pub fn slot_now(&self) -> i64 {
        self.store.now_micros().div_euclid(SLOT_MICROS)
    }

    /// The row recording that the page changes in `slot`: the same row for
    /// every change of the page in that slot (its time is the slot's last
    /// microsecond, so the visit it asks for comes no sooner after any of
    /// them than it is due, and at most a slot later), which a writer that
    /// already wrote it need not write again.
    pub fn entry_in(&self, slot: i64, page: &[Value]) -> Write {
        let at = slot * SLOT_MICROS + (SLOT_MICROS - 1);
        let page = encode_values(page);
        let shard = murmur3_token(&page).rem_euclid(JOURNAL_SHARDS);
        Upsert::new(
            &JOURNAL,
            [Value::from(self.service), Value::from(shard), Value::from(at.div_euclid(MINUTE_MICROS)), Value::from(at), Value::Blob(page)],
        )
        .into()
    }
}

/// What a sweep does for one page, the partition `page` of [`PageVisit::table`].
#[async_trait]
pub trait PageVisit: Send + Sync + 'static {
    fn task(&self) -> Task;

    /// The table whose partitions are the pages (scanned by the `all` scope).
    fn table(&self) -> &'static TableDef;

    /// How long after its change a page is due its visit.
    fn due_after(&self) -> Duration;

    /// Visits one page: counts what it changes (or would, dry) into `report`.
    async fn visit(&self, page: &[Value], dry_run: bool, report: &mut StepReport) -> Result<(), SweepError>;
}

/// Scope `all`: every partition of the visit's table, in token order.
#[derive(Debug)]
pub struct EveryPage<V> {
    store: Store,
    visit: std::sync::Arc<V>,
}

impl<V: PageVisit> EveryPage<V> {
    pub fn new(store: Store, visit: std::sync::Arc<V>) -> Self {
        EveryPage { store, visit }
    }
}

/// Up to `budget` partitions of the visit's table after `from.after`, each visited.
async fn scan_step<V: PageVisit>(
    store: &Store,
    visit: &V,
    from: &SweepPosition,
    budget: u32,
    dry_run: bool,
) -> Result<Stepped, SweepError> {
    let scanned = store.scan_range(&ScanQuery::new(visit.table(), budget).after(from.after.clone())).await?;
    let mut report = StepReport { partitions: scanned.partitions.len() as u64, ..StepReport::default() };
    for partition in &scanned.partitions {
        visit.visit(&partition.key, dry_run, &mut report).await?;
    }
    let next = scanned.next.map(|p| SweepPosition { after: Some(p), cursor: from.cursor.clone(), ..SweepPosition::default() });
    Ok(Stepped { report, next })
}

#[async_trait]
impl<V: PageVisit> Sweep for EveryPage<V> {
    fn task(&self) -> Task {
        self.visit.task()
    }

    async fn step(&self, from: SweepPosition, budget: u32, dry_run: bool) -> Result<Stepped, SweepError> {
        scan_step(&self.store, self.visit.as_ref(), &SweepPosition { cursor: Vec::new(), ..from }, budget, dry_run).await
    }
}

/// Scope `changed`: the pages the journal shows changed in the window since
/// the last completed sweep (see the module documentation).
#[derive(Debug)]
pub struct ChangedPages<V> {
    store: Store,
    service: &'static str,
    visit: std::sync::Arc<V>,
    late_margin: Duration,
    marks: Checkpoints,
}

impl<V: PageVisit> ChangedPages<V> {
    /// `late_margin`: how late a journal row can land behind its `at` (the
    /// clock skew between the service's replicas and a storage write's timeout).
    pub fn new(journal: &Journal, visit: std::sync::Arc<V>, late_margin: Duration) -> Self {
        let store = journal.store.clone();
        ChangedPages { marks: Checkpoints::new(store.clone(), journal.service), store, service: journal.service, visit, late_margin }
    }

    /// Where the last completed changed sweep of the task ended (in this site).
    fn mark(&self) -> String {
        super::in_this_site(format!("{}:changed-through", self.visit.task()), self.store.site())
    }
}

/// A changed sweep's place, kept in [`SweepPosition::cursor`].
#[derive(Debug, Clone, PartialEq)]
enum Place {
    /// Reading the journal over `(from, to]`: in the partition of `minute`
    /// and `shard`, after the row `last` when set.
    Journal { from: i64, to: i64, minute: i64, shard: i64, last: Option<(i64, Vec<u8>)> },
    /// Visiting every page (no usable `through`); the pass ends at `to`. The
    /// scan's own position is the rest of the sweep position.
    EveryPage { to: i64 },
}

impl Place {
    fn to_cursor(&self) -> Vec<Value> {
        match self {
            Place::Journal { from, to, minute, shard, last } => {
                let (at, page) = match last {
                    Some((at, page)) => (Value::from(*at), Value::Blob(page.clone())),
                    None => (Value::Null, Value::Null),
                };
                vec![Value::from(*from), Value::from(*to), Value::from(*minute), Value::from(*shard), at, page]
            }
            Place::EveryPage { to } => vec![Value::from("every-page"), Value::from(*to)],
        }
    }

    fn of_cursor(cursor: &[Value]) -> Option<Place> {
        match cursor {
            [Value::BigInt(from), Value::BigInt(to), Value::BigInt(minute), Value::BigInt(shard), at, page] => {
                let last = match (at, page) {
                    (Value::BigInt(at), Value::Blob(page)) => Some((*at, page.clone())),
                    (Value::Null, Value::Null) => None,
                    _ => return None,
                };
                Some(Place::Journal { from: *from, to: *to, minute: *minute, shard: *shard, last })
            }
            [Value::Text(kind), Value::BigInt(to)] if kind == "every-page" => Some(Place::EveryPage { to: *to }),
            _ => None,
        }
    }
}

#[async_trait]
impl<V: PageVisit> Sweep for ChangedPages<V> {
    fn task(&self) -> Task {
        self.visit.task()
    }

    fn scope(&self) -> Scope {
        Scope::Changed
    }

    async fn step(&self, from: SweepPosition, budget: u32, dry_run: bool) -> Result<Stepped, SweepError> {
        let place = match Place::of_cursor(&from.cursor) {
            Some(place) => place,
            None => match self.start().await? {
                Some(place) => place,
                // Nothing is due since the last sweep ended.
                None => return Ok(Stepped::default()),
            },
        };
        let to = match place {
            Place::EveryPage { to } | Place::Journal { to, .. } => to,
        };
        let stepped = match place {
            Place::EveryPage { .. } => {
                let position = SweepPosition { cursor: place.to_cursor(), ..from };
                scan_step(&self.store, self.visit.as_ref(), &position, budget, dry_run).await?
            }
            Place::Journal { from, to, minute, shard, last } => self.journal_step(from, to, minute, shard, last, budget, dry_run).await?,
        };
        if stepped.next.is_none() && !dry_run {
            self.marks.save_mark(&self.mark(), to).await?;
        }
        Ok(stepped)
    }
}

impl<V: PageVisit> ChangedPages<V> {
    /// A new pass: its window, or every page when the journal cannot show
    /// what changed since the last one; `None` when nothing is due yet.
    async fn start(&self) -> Result<Option<Place>, SweepError> {
        let now = self.store.now_micros();
        let to = now - (self.visit.due_after() + self.late_margin).as_micros() as i64;
        let reach = now - journal_reach().as_micros() as i64;
        Ok(match self.marks.load_mark(&self.mark()).await? {
            Some(through) if through >= to => None,
            Some(through) if through >= reach => {
                Some(Place::Journal { from: through, to, minute: through.div_euclid(MINUTE_MICROS), shard: 0, last: None })
            }
            known => {
                tracing::info!(
                    service = self.service,
                    task = %self.visit.task(),
                    last = ?known,
                    "no changed sweep within the journal's reach: this pass visits every page"
                );
                Some(Place::EveryPage { to })
            }
        })
    }

    /// Journal rows of `(from, to]` from the partition `(minute, shard)` on,
    /// after `last`: their pages visited, once each in the step, until
    /// `budget` partitions (journal partitions read and pages visited) are spent.
    #[allow(clippy::too_many_arguments)]
    async fn journal_step(
        &self,
        from: i64,
        to: i64,
        mut minute: i64,
        mut shard: i64,
        mut last: Option<(i64, Vec<u8>)>,
        budget: u32,
        dry_run: bool,
    ) -> Result<Stepped, SweepError> {
        let last_minute = to.div_euclid(MINUTE_MICROS);
        let mut report = StepReport::default();
        let mut visited: HashSet<Vec<u8>> = HashSet::new();
        let mut spent = 0u64;
        let budget = u64::from(budget.max(1));
        while minute <= last_minute {
            let key = [Value::from(self.service), Value::from(shard), Value::from(minute)];
            let window = Slice::all().lower(Bound::Excluded(Value::from(from))).upper(Bound::Included(Value::from(to)));
            let slices = match &last {
                // The rest of the row's instant, then what comes after it in the window.
                Some((at, page)) => {
                    let mut slices = slices_after(&JOURNAL, &[Value::from(*at), Value::Blob(page.clone())], Default::default());
                    if let Some(later) = slices.last_mut() {
                        later.upper = Bound::Included(Value::from(to));
                    }
                    slices
                }
                None => vec![window],
            };
            spent += 1;
            report.partitions += 1;
            for slice in slices {
                let query = ReadQuery::new(&JOURNAL, key.to_vec()).slice(slice).limit(budget.min(1000) as u32);
                let mut rows = std::pin::pin!(self.store.rows(query));
                while let Some(row) = rows.try_next().await? {
                    let (Some(at), Some(page)) = (row.bigint("at"), row.blob("page")) else {
                        return Err(SweepError::corrupt("a janitor journal row without its key"));
                    };
                    if visited.insert(page.to_vec()) {
                        let values = decode_values(page).map_err(|_| SweepError::corrupt("a janitor journal row's page is not a key"))?;
                        self.visit.visit(&values, dry_run, &mut report).await?;
                        report.partitions += 1;
                        spent += 1;
                    }
                    if spent >= budget {
                        let place = Place::Journal { from, to, minute, shard, last: Some((at, page.to_vec())) };
                        return Ok(Stepped { report, next: Some(SweepPosition { cursor: place.to_cursor(), ..SweepPosition::default() }) });
                    }
                }
            }
            last = None;
            shard += 1;
            if shard == JOURNAL_SHARDS {
                (shard, minute) = (0, minute + 1);
            }
            if spent >= budget && minute <= last_minute {
                let place = Place::Journal { from, to, minute, shard, last: None };
                return Ok(Stepped { report, next: Some(SweepPosition { cursor: place.to_cursor(), ..SweepPosition::default() }) });
            }
        }
        Ok(Stepped { report, next: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_round_trip_through_a_cursor() {
        for place in [
            Place::Journal { from: -5, to: 90, minute: 1, shard: 3, last: None },
            Place::Journal { from: 0, to: 90, minute: 1, shard: 0, last: Some((77, vec![1, 2, 3])) },
            Place::EveryPage { to: 1_700_000_000_000_000 },
        ] {
            assert_eq!(Place::of_cursor(&place.to_cursor()), Some(place));
        }
        assert_eq!(Place::of_cursor(&[]), None);
        assert_eq!(Place::of_cursor(&[Value::from("every-page")]), None);
    }
}
