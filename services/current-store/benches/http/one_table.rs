//! Seed 000's Option 2, built just far enough to be measured beside the
//! copy-on-update design current-store ran until schema 8 (issue #29; the
//! service now runs a full version of it, `src/pages.rs`): every render of
//! a page is one row of one table, clustered by revision then render time,
//! newest first; nothing is copied when a render is superseded, and what has
//! been superseded for longer than the grace period is range-deleted by the
//! next write of the page. No service is involved: the bench process does
//! what the service would (compress the three parts, read, write), so the
//! node's figures are Option 2's and the bench's own CPU is an upper bound of
//! what a service would add, less its HTTP.
//!
//! A write, two round trips (three for a revision's first render):
//! 1. at once: the page's suppressed revisions, and the keys (revision, tid)
//!    of its newest [`HEAD_ROWS`] renders — no content;
//! 2. one single-partition batch (one mutation, atomic): the render's row,
//!    written at its tid's time, plus the range deletes of every render
//!    older (in precedence order) than the newest render stored before
//!    `now − grace` — each of those was superseded at or before that render
//!    was stored, so no reader can still be owed it. When no render of the
//!    revision was found, the hand-off's outbox row is written first, so
//!    that no render is seen before its hand-off is durable (as in the
//!    service): a third round trip for a revision's first render.
//!
//! The seed's own sketch deletes `tid <= now − grace`, which drops a render
//! superseded a minute ago if it was stored two days ago: the retention
//! boundary has to come from when a render's successor was stored, so the
//! write reads the head first. (Here a render's tid is its storing time; a
//! real table would carry the storing time in a column, since a late write
//! can carry an old tid.)

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use revstore_current_store::{RenderBody, StoredParts};
use revstore_keys::Tid;
use scylla::client::session::Session;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimeuuid;

/// How many render keys of a page the write reads to find the retention
/// boundary and whether its revision has a render already.
const HEAD_ROWS: i32 = 32;
const DOMAIN: &str = "en.wikipedia.org";
const OUTBOX_SHARDS: u64 = 16;

type Failure = Box<dyn std::error::Error + Send + Sync>;

pub struct OneTable {
    session: Arc<Session>,
    grace: Duration,
    head: PreparedStatement,
    suppressed: PreparedStatement,
    insert: PreparedStatement,
    delete_revisions_below: PreparedStatement,
    delete_renders_below: PreparedStatement,
    first_of_revision: PreparedStatement,
    outbox: PreparedStatement,
    latest: PreparedStatement,
    of_revision: PreparedStatement,
    by_tid: PreparedStatement,
}

/// What one write did, for the bench's counts.
#[derive(Debug, Default, Clone, Copy)]
pub struct Written {
    pub range_deletes: usize,
    pub handed_off: bool,
}

/// The live rows and tombstones one traced read met, as the node reports
/// them ("Read N live rows and M tombstone cells").
#[derive(Debug, Default, Clone, Copy)]
pub struct ReadCost {
    pub live_rows: u64,
    pub tombstones: u64,
}

impl OneTable {
    /// Creates Option 2's tables in `keyspace` (renders: leveled compaction,
    /// as `current`; the 3-hour `gc_grace_seconds` of the expiring tables,
    /// since a resurrected superseded render is shadowed in precedence by
    /// the newer one anyway) and prepares its statements.
    pub async fn create(session: Arc<Session>, keyspace: &str, grace: Duration) -> Result<OneTable, Failure> {
        for ddl in [
            format!(
                "CREATE TABLE IF NOT EXISTS \"{keyspace}\".one_table_renders (domain text, title text, rev bigint, tid timeuuid, \
                 html blob, data_parsoid blob, section_offsets blob, PRIMARY KEY ((domain, title), rev, tid)) \
                 WITH CLUSTERING ORDER BY (rev DESC, tid DESC) \
                 AND compaction = {{'class': 'LeveledCompactionStrategy'}} AND gc_grace_seconds = 10800"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS \"{keyspace}\".one_table_suppressed (domain text, title text, rev bigint, \
                 PRIMARY KEY ((domain, title), rev))"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS \"{keyspace}\".one_table_outbox (shard bigint, id timeuuid, payload blob, \
                 PRIMARY KEY (shard, id))"
            ),
        ] {
            session.query_unpaged(ddl, ()).await?;
        }
        let renders = format!("\"{keyspace}\".one_table_renders");
        let prepare = |cql: String| {
            let session = session.clone();
            async move { session.prepare(cql).await }
        };
        Ok(OneTable {
            head: prepare(format!("SELECT rev, tid FROM {renders} WHERE domain = ? AND title = ? LIMIT {HEAD_ROWS}")).await?,
            suppressed: prepare(format!("SELECT rev FROM \"{keyspace}\".one_table_suppressed WHERE domain = ? AND title = ?")).await?,
            insert: prepare(format!(
                "INSERT INTO {renders} (domain, title, rev, tid, html, data_parsoid, section_offsets) VALUES (?, ?, ?, ?, ?, ?, ?) \
                 USING TIMESTAMP ?"
            ))
            .await?,
            delete_revisions_below: prepare(format!("DELETE FROM {renders} WHERE domain = ? AND title = ? AND rev < ?")).await?,
            delete_renders_below: prepare(format!("DELETE FROM {renders} WHERE domain = ? AND title = ? AND rev = ? AND tid < ?")).await?,
            first_of_revision: prepare(format!("SELECT tid FROM {renders} WHERE domain = ? AND title = ? AND rev = ? LIMIT 1")).await?,
            outbox: prepare(format!("INSERT INTO \"{keyspace}\".one_table_outbox (shard, id, payload) VALUES (?, ?, ?)")).await?,
            latest: prepare(format!("SELECT rev, tid, html FROM {renders} WHERE domain = ? AND title = ? LIMIT 1")).await?,
            of_revision: prepare(format!("SELECT tid, html FROM {renders} WHERE domain = ? AND title = ? AND rev = ? LIMIT 1")).await?,
            by_tid: prepare(format!("SELECT html FROM {renders} WHERE domain = ? AND title = ? AND rev = ? AND tid = ?")).await?,
            session,
            grace,
        })
    }

    /// Stores a render as Option 2 would: see the module's note.
    pub async fn write(&self, title: &str, rev: i64, tid: Tid, body: &RenderBody) -> Result<Written, Failure> {
        // What the service does with a request's body before storing it.
        let received: RenderBody = serde_json::from_slice(&serde_json::to_vec(body)?)?;
        let parts = StoredParts::encode(&received);
        let (head, suppressed) = tokio::try_join!(
            self.session.execute_unpaged(&self.head, (DOMAIN, title)),
            self.session.execute_unpaged(&self.suppressed, (DOMAIN, title)),
        )?;
        if suppressed.into_rows_result()?.rows::<(i64,)>()?.any(|r| r.is_ok_and(|(r,)| r == rev)) {
            return Ok(Written::default());
        }
        let head: Vec<(i64, CqlTimeuuid)> = head.into_rows_result()?.rows::<(i64, CqlTimeuuid)>()?.collect::<Result<_, _>>()?;
        let first_of_revision = match head.iter().any(|(r, _)| *r == rev) {
            true => false,
            // Beyond the head (a render of an older revision arriving late): ask.
            false if head.len() == HEAD_ROWS as usize && head.last().is_some_and(|(r, _)| *r > rev) => self
                .session
                .execute_unpaged(&self.first_of_revision, (DOMAIN, title, rev))
                .await?
                .into_rows_result()?
                .rows::<(CqlTimeuuid,)>()?
                .next()
                .is_none(),
            false => true,
        };
        // The newest render stored before the grace period began: everything
        // older than it was superseded no later than it was stored.
        let cutoff = micros(SystemTime::now()) - self.grace.as_micros() as i64;
        let boundary = head.iter().position(|(_, t)| Tid::from_uuid((*t).into()).is_ok_and(|t| t.unix_micros() <= cutoff));
        let older = boundary.map(|b| &head[b + 1..]).unwrap_or_default();
        let (revisions_below, renders_below) = match boundary {
            Some(b) => {
                let (b_rev, b_tid) = head[b];
                (older.iter().any(|(r, _)| *r < b_rev), older.iter().any(|(r, _)| *r == b_rev).then_some((b_rev, b_tid)))
            }
            None => (false, None),
        };
        let tid_value = CqlTimeuuid::from(tid.uuid());
        let row = (DOMAIN, title, rev, tid_value, &parts.html, &parts.data_parsoid, &parts.section_offsets, tid.unix_micros());
        let mut batch = Batch::new(BatchType::Unlogged);
        batch.append_statement(self.insert.clone());
        let b_rev = boundary.map_or(0, |b| head[b].0);
        let range_deletes = usize::from(revisions_below) + usize::from(renders_below.is_some());
        let store = async move {
            match (revisions_below, renders_below) {
                (false, None) => self.session.batch(&batch, (row,)).await,
                (true, None) => {
                    batch.append_statement(self.delete_revisions_below.clone());
                    self.session.batch(&batch, (row, (DOMAIN, title, b_rev))).await
                }
                (false, Some(below)) => {
                    batch.append_statement(self.delete_renders_below.clone());
                    self.session.batch(&batch, (row, (DOMAIN, title, below.0, below.1))).await
                }
                (true, Some(below)) => {
                    batch.append_statement(self.delete_revisions_below.clone());
                    batch.append_statement(self.delete_renders_below.clone());
                    self.session.batch(&batch, (row, (DOMAIN, title, b_rev), (DOMAIN, title, below.0, below.1))).await
                }
            }
        };
        let hand_off = async {
            if first_of_revision {
                let shard = (tid.unix_micros() as u64) % OUTBOX_SHARDS;
                self.session.execute_unpaged(&self.outbox, (shard as i64, tid_value, &parts.html)).await.map(|_| ())
            } else {
                Ok(())
            }
        };
        // The hand-off is durable before the render can be seen (as in the
        // service): a third round trip for a revision's first render.
        hand_off.await?;
        store.await?;
        Ok(Written { range_deletes, handed_off: first_of_revision })
    }

    /// Keys of a page's newest renders (what a write reads first).
    pub async fn head(&self, title: &str) -> Result<Vec<(i64, Tid)>, Failure> {
        let rows = self.session.execute_unpaged(&self.head, (DOMAIN, title)).await?.into_rows_result()?;
        let keys = rows.rows::<(i64, CqlTimeuuid)>()?.collect::<Result<Vec<_>, _>>()?;
        Ok(keys.into_iter().filter_map(|(r, t)| Tid::from_uuid(t.into()).ok().map(|t| (r, t))).collect())
    }

    /// One read of each kind a reader makes, traced: the latest render, the
    /// newest render of `rev`, the render `(rev, tid)`, and the write's head
    /// read; the live rows and tombstones each met.
    pub async fn traced_reads(&self, title: &str, rev: i64, tid: Tid) -> Result<[ReadCost; 4], Failure> {
        let t = CqlTimeuuid::from(tid.uuid());
        let latest = self.traced(&self.latest, (DOMAIN, title)).await?;
        let of_revision = self.traced(&self.of_revision, (DOMAIN, title, rev)).await?;
        let by_tid = self.traced(&self.by_tid, (DOMAIN, title, rev, t)).await?;
        let head = self.traced(&self.head, (DOMAIN, title)).await?;
        Ok([latest, of_revision, by_tid, head])
    }

    async fn traced(&self, statement: &PreparedStatement, values: impl scylla::serialize::row::SerializeRow) -> Result<ReadCost, Failure> {
        traced_read(&self.session, statement, values).await
    }
}

/// Runs `statement` with tracing on and reads back from the node's trace
/// what the read met.
pub async fn traced_read(
    session: &Session,
    statement: &PreparedStatement,
    values: impl scylla::serialize::row::SerializeRow,
) -> Result<ReadCost, Failure> {
    let mut statement = statement.clone();
    statement.set_tracing(true);
    let result = session.execute_unpaged(&statement, values).await?;
    let id = result.tracing_id().ok_or("no tracing id")?;
    let trace = session.get_tracing_info(&id).await?;
    let mut cost = ReadCost::default();
    for activity in trace.events.iter().filter_map(|e| e.activity.as_deref()) {
        // "Read 1 live rows and 3 tombstone cells" (one per replica read).
        let Some(rest) = activity.strip_prefix("Read ") else { continue };
        let words: Vec<&str> = rest.split_whitespace().collect();
        if let (Some(live), Some(dead)) =
            (words.first().and_then(|w| w.parse::<u64>().ok()), words.get(4).and_then(|w| w.parse::<u64>().ok()))
        {
            cost.live_rows += live;
            cost.tombstones += dead;
        }
    }
    Ok(cost)
}

fn micros(time: SystemTime) -> i64 {
    time.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}
