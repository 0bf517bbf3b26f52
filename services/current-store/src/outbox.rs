//! Delivers the outbox: renders to old-store, suppressions to old-store, change
//! notices to the dependency graph.
//!
//! Rows are written in the same atomic batch as the render they describe, so
//! nothing acknowledged to a renderer can be lost between the two. Sends are
//! idempotent (old-store's archive writes are; a change notice recorded twice
//! marks the same pages), so a row sent twice — after a crash, or when
//! another replica takes a shard over — does no harm.
//!
//! # Shards, minutes and two positions
//! Rows are spread over [`SHARDS`] shards by page (a page's rows stay
//! in order), and a shard's rows over partitions of one minute each, by the
//! minute of the row's time-UUID id. Each site (datacenter) has shards of
//! its own ([`site_shards`]): a site's replicas queue and deliver only there.
//! A holder moves its position past a minute and deletes the minute's
//! partition once it has read every row of it *its* site has; in another
//! site's shards it would pass rows written there that replication (or a cut
//! link) has not brought over yet, and its deletion, replicated back, would
//! remove them undelivered. One replica at a time delivers a shard:
//! the holder of the shard's row in `outbox_shards`, taken by a conditional
//! write and renewed every [`LEASE_RENEWAL`]. The holder keeps two positions:
//! - how far it has **read**: each round reads the rows after it, minute by
//!   minute up to now, and sends them in order, so a render reaches old-store
//!   within a poll interval (a replica delivers the shards it holds at once,
//!   each in its own order);
//! - how far it has **delivered through**, which trails now by a margin (the
//!   clock skew allowed between replicas, plus a storage write's timeout): a
//!   replica whose clock is behind can queue a row whose id the reader has
//!   already passed, and only within that margin. Each round re-reads the
//!   rows between the two positions (their keys and `delivered_at` only),
//!   sends any not marked delivered, and moves the position on. It is stored
//!   with each renewal; a new holder starts there.
//!
//! A row is marked `delivered_at` once its receiver took it (or it was moved
//! to the dead letters), so a row read again — by the check behind the read
//! position, or by a new holder — is not sent again.
//!
//! Once the delivered-through position has passed a minute, that minute's
//! partition is deleted whole: one partition tombstone that no later read
//! touches. (Deleting each row as it was delivered left row tombstones that
//! every read of the shard stepped over until `gc_grace_seconds` had passed;
//! past 100,000 of them Cassandra aborts the read, and the hand-off stopped.)
//!
//! Failures are of three kinds, and none holds a shard up for long, nor one
//! shard the others:
//! - **transient** (no answer, 502, 503, 504, 408, 429, and 401/403, which
//!   say the sender's token is wrong rather than the row; and a row whose
//!   receiver is not configured): the shard stops for the round, keeping its
//!   order, and pauses before its next round, longer after each failed round,
//!   up to a minute, and at least as long as a receiver's `Retry-After` asked
//!   (an overloaded old-store sheds with 503 and `Retry-After`; coming back
//!   sooner would only be shed again). The other shards go on; the worker
//!   itself pauses only when every shard it tried failed;
//! - **faulty** (any other 5xx: the receiver answered and failed on this
//!   row — a damaged block, a bug): like a transient failure, until the same
//!   row has failed [`FAULTY_ATTEMPTS`] times in a row; then it is moved to
//!   the dead letters as below, and the rows behind it flow on;
//! - **permanent** (any other 4xx, a path no client may send, a row that
//!   cannot be read): retrying cannot change the answer, so the row is copied
//!   to `outbox_dead_letters`, counted in `outbox_dead_letters_total`, logged
//!   once, and the shard goes on. An operator lists and re-drives dead
//!   letters through the admin routes ([`dead_letters`], [`redrive`]).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Bound, Range};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::TryStreamExt;
use http::StatusCode;
use revstore_client::{ClientError, GraphClient, OldStoreClient};
use revstore_keys::time::millis;
use revstore_keys::{Domain, Tid, TidGenerator, Title, composite_key_bytes, murmur3_token};
use revstore_schema::tables::current_store::{OUTBOX, OUTBOX_DEAD_LETTERS, OUTBOX_SHARDS, OUTBOX_SITES, PAGE_RENDERS, col};
use revstore_schema::tables::meta::SCHEMA_META;
use revstore_service::BoxError;
use revstore_service::worker::{Worker, WorkerState};
use revstore_storage::{Cas, Condition, Delete, ReadQuery, Row, Serialized, Site, Slice, Store, StoreError, Upsert, Value, Write};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

/// Where each kind of outbox row goes.
#[derive(Debug, Clone)]
pub struct Receivers {
    pub old_store: Option<OldStoreClient>,
    pub graph: Option<GraphClient>,
}

/// Each site's outbox rows are spread over this many shards.
pub const SHARDS: i64 = 16;

/// The shards a site queues in and delivers.
pub fn site_shards(site: Site) -> Range<i64> {
    let first = i64::from(site.index) * SHARDS;
    first..first + SHARDS
}

/// Checks, and on a datacenter's first start claims, that `site`'s number
/// is its datacenter's alone: a datacenter given another number in another
/// site's setting (`REVSTORE_CASSANDRA_REPLICATION` in another order) would
/// deliver that site's shards, at LOCAL_SERIAL, beside it. The claim is a
/// conditional write across sites, made once; a later start reads the
/// claims at the local consistency, so it needs no link to the other sites.
pub async fn check_site_number(store: &Store, site: Site) -> Result<(), String> {
    let Some(datacenter) = site.datacenter.filter(|_| site.count > 1) else { return Ok(()) };
    let failed = |e: StoreError| format!("the outbox's site numbers could not be read or claimed: {e}");
    let claimed_by = |row: Option<Row>| row.and_then(|r| r.text(col::DATACENTER).map(str::to_owned));
    for other in (0..site.count).filter(|i| *i != site.index) {
        let claimant = claimed_by(store.get(&OUTBOX_SITES, vec![Value::from(i64::from(other))], None).await.map_err(failed)?);
        if claimant.as_deref() == Some(datacenter) {
            return Err(mismatch(datacenter, other, site.index));
        }
    }
    let ours = vec![Value::from(i64::from(site.index))];
    let mut claimant = claimed_by(store.get(&OUTBOX_SITES, ours.clone(), None).await.map_err(failed)?);
    if claimant.is_none() {
        let claim = Upsert::new(&OUTBOX_SITES, ours).set(col::DATACENTER, datacenter);
        let outcome = store.cas(Cas::insert_if_not_exists(claim).across_sites()).await.map_err(failed)?;
        claimant = if outcome.applied { Some(datacenter.to_owned()) } else { claimed_by(outcome.current) };
    }
    match claimant.as_deref() {
        Some(claimant) if claimant == datacenter => Ok(()),
        Some(claimant) => Err(format!(
            "site number {} is datacenter {claimant:?}'s, and this service runs in {datacenter:?}: \
             REVSTORE_CASSANDRA_REPLICATION must name the datacenters in one order in every site",
            site.index
        )),
        None => Err(format!("site number {} could not be claimed for datacenter {datacenter:?}", site.index)),
    }
}

fn mismatch(datacenter: &str, claimed: u32, given: u32) -> String {
    format!(
        "datacenter {datacenter:?} is site number {claimed}, but this service was given number {given}: \
         REVSTORE_CASSANDRA_REPLICATION must name the datacenters in one order in every site"
    )
}

/// The shards of every site: where dead letters are listed.
pub fn all_shards(site: Site) -> Range<i64> {
    0..i64::from(site.count) * SHARDS
}

/// The outbox shard of a page in a site: every row of one page queued in
/// the site goes to one shard, in order.
pub fn outbox_shard(site: Site, domain: &Domain, title: &Title) -> i64 {
    let page = murmur3_token(&composite_key_bytes(&[domain.as_str().as_bytes(), title.as_str().as_bytes()])).rem_euclid(SHARDS);
    site_shards(site).start + page
}

/// Rows read per storage read.
const BATCH: u32 = 100;
/// Minute partitions one shard's round reads at most.
const MINUTES_PER_ROUND: usize = 60;
/// The columns an outbox row and its dead letter share (besides `attempts`).
const ROW_COLUMNS: [&str; 7] = [col::KIND, col::DOMAIN, col::TITLE, col::REV, col::TID, col::PAYLOAD, col::TRACE];

/// How long a shard's lease lasts unless renewed.
const LEASE: Duration = Duration::from_secs(30);
/// How often a holder renews its leases (storing where each shard is
/// delivered through), and looks for shards nobody holds.
const LEASE_RENEWAL: Duration = Duration::from_secs(10);
/// How often a round that is still going looks whether its leases are due
/// for renewal.
const RENEWAL_CHECK: Duration = Duration::from_secs(1);

const MINUTE_MICROS: i64 = 60_000_000;

/// The minute (since the Unix epoch) whose outbox partition holds the row with this id.
pub fn minute_of(id: Tid) -> i64 {
    id.unix_micros().div_euclid(MINUTE_MICROS)
}

/// The smallest id of a minute.
fn minute_start(minute: i64) -> Tid {
    Tid::min_at(time_of_micros(minute.saturating_mul(MINUTE_MICROS)))
}

fn time_of_micros(micros: i64) -> SystemTime {
    if micros >= 0 { UNIX_EPOCH + Duration::from_micros(micros as u64) } else { UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs()) }
}

/// A new outbox row for `shard`, its key set (the caller sets the columns).
/// Its id is of the store's time, the clock the deliverer reads by (an
/// injected one in tests).
pub(crate) fn queued(store: &Store, shard: i64) -> Upsert {
    static IDS: std::sync::OnceLock<TidGenerator> = std::sync::OnceLock::new();
    let id = IDS.get_or_init(TidGenerator::new).next_at(store.now());
    Upsert::new(&OUTBOX, [Value::from(shard), Value::from(minute_of(id)), Value::from(id)])
}

/// Why a delivery failed, and so what happens to the row.
#[derive(Debug)]
enum Failure {
    /// Try again later, in order; not before `retry_after` when the receiver said so.
    Transient { reason: String, retry_after: Option<Duration> },
    /// The receiver answered and failed on this row (a 5xx that is not an
    /// outage's 502, 503 or 504: a damaged block, a bug): tried again in
    /// order, and moved aside after [`FAULTY_ATTEMPTS`] such answers in a row,
    /// so that the rows behind it flow on.
    Faulty { status: u16, reason: String },
    /// The receiver (or the row itself) rules out success: move the row aside.
    Permanent { status: Option<u16>, reason: String },
}

/// Answers of a receiver that failed on one row, in a row, before the row is
/// moved to the dead letters. With the shard's pauses between attempts
/// (doubling from a poll interval to a minute) that is some ten minutes.
pub const FAULTY_ATTEMPTS: u32 = 12;

impl Failure {
    fn of(error: ClientError) -> Failure {
        match &error {
            ClientError::Status { status, .. } if status.is_client_error() && !is_retryable_client_error(*status) => {
                Failure::Permanent { status: Some(status.as_u16()), reason: error.to_string() }
            }
            ClientError::Status { status, .. } if status.is_server_error() && !is_outage(*status) => {
                Failure::Faulty { status: status.as_u16(), reason: error.to_string() }
            }
            ClientError::DotSegment { .. } | ClientError::Config(_) => Failure::Permanent { status: None, reason: error.to_string() },
            _ => Failure::Transient { reason: error.to_string(), retry_after: error.retry_after() },
        }
    }

    fn unreadable(reason: String) -> Failure {
        Failure::Permanent { status: None, reason }
    }
}

/// 5xx answers that say the receiver (or what stands before it) is down or
/// overloaded, not that it failed on the row: every row waits for it.
fn is_outage(status: StatusCode) -> bool {
    matches!(status, StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT)
}

/// 4xx answers that a later attempt may turn into a success.
fn is_retryable_client_error(status: StatusCode) -> bool {
    matches!(status, StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS | StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
}

/// The longest `Retry-After` the worker honours (a receiver's answer is not
/// allowed to stop delivery for longer).
const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(60);
/// The longest pause of a shard after failed rounds.
const LONGEST_PAUSE: Duration = Duration::from_secs(60);

/// A shard's round stopped at a row that could not be delivered now.
#[derive(Debug)]
struct ShardFailure {
    reason: String,
    retry_after: Option<Duration>,
}

impl From<StoreError> for ShardFailure {
    fn from(e: StoreError) -> Self {
        ShardFailure { reason: e.to_string(), retry_after: None }
    }
}

/// How far behind the read position a round looks again, keys only, for
/// rows that committed after rows with later ids were read (two writes of
/// one replica, or of two, finishing out of order), while rows are being
/// read and for this long after: a write finishes within its storage
/// timeout (10 s by default), so such a row is delivered at the next round
/// rather than once the margin has passed (one committing later still is
/// delivered then).
const RECHECK: Duration = Duration::from_secs(15);

/// How long the worker waits before looking at an outbox it found empty.
const POLL: Duration = Duration::from_millis(500);

/// A shard this replica delivers, and where it is.
#[derive(Debug)]
struct HeldShard {
    /// Until when (store clock, ms) the lease is ours unless renewed.
    expires_at: i64,
    /// Every row with an id before this has been delivered (or moved to the
    /// dead letters). Stored with each renewal of the lease.
    delivered_through: Tid,
    /// Where the next read starts.
    read_from: Bound<Tid>,
    /// Until when (store clock, µs) each round looks again behind the read
    /// position for rows that committed out of order (see [`RECHECK`]).
    recheck_until: i64,
    /// Minutes in which rows were seen or that the delivered-through
    /// position has passed, not yet settled (see [`SETTLE`]).
    minutes_seen: BTreeSet<i64>,
    /// Since when (µs) rows have been waiting, when the last round did not catch up.
    waiting_since: Option<i64>,
    /// The shard's own pause after failed rounds: not tried before this
    /// (store clock, ms), so that a failing shard waits while the others go on.
    paused_until: i64,
    /// Failed rounds in a row (the pause doubles with each).
    failed_rounds: u32,
    /// The row at the head of the shard that its receiver failed on, and how
    /// many times in a row ([`Failure::Faulty`]).
    faults: Option<(Tid, u32)>,
}

impl HeldShard {
    fn starting_at(delivered_through: Tid, expires_at: i64) -> HeldShard {
        HeldShard {
            expires_at,
            delivered_through,
            read_from: Bound::Included(delivered_through),
            recheck_until: i64::MIN,
            minutes_seen: BTreeSet::new(),
            waiting_since: None,
            paused_until: i64::MIN,
            failed_rounds: 0,
            faults: None,
        }
    }

    /// After a failed round: the shard pauses, doubling from a poll interval
    /// up to a minute, and at least as long as the receiver asked.
    fn pause(&mut self, now: i64, retry_after: Option<Duration>) {
        self.failed_rounds = self.failed_rounds.saturating_add(1);
        let doubled = POLL.saturating_mul(1 << self.failed_rounds.min(7)).min(LONGEST_PAUSE);
        let pause = doubled.max(retry_after.unwrap_or_default().min(LONGEST_RETRY_AFTER));
        self.paused_until = now + pause.as_millis() as i64;
    }

    /// The id the next read starts at (inclusive or not).
    fn read_position(&self) -> Tid {
        match self.read_from {
            Bound::Included(t) | Bound::Excluded(t) => t,
            Bound::Unbounded => self.delivered_through,
        }
    }
}

/// The outbox's delivery, as a background worker: each step is one round
/// over the shards this replica holds.
#[derive(Debug)]
pub struct Delivery {
    store: Store,
    receivers: Receivers,
    /// This replica, as the holder of a lease: its host name and a random suffix.
    holder: String,
    /// How far the delivered-through position trails now.
    margin: Duration,
    /// How long after that position passed a minute it is read once more
    /// and deleted ([`SETTLE`] unless set).
    settle: Duration,
    held: BTreeMap<i64, HeldShard>,
    /// When (store clock, ms) the leases are next renewed and looked for.
    next_lease_round: i64,
}

impl Delivery {
    /// `margin`: the clock skew allowed between replicas plus a storage
    /// write's timeout (see the module's notes).
    pub fn new(store: Store, receivers: Receivers, margin: Duration) -> Self {
        // Exported from the start, at 0, for the dead-letter alert.
        for kind in KINDS {
            metrics::counter!("outbox_dead_letters_total", "service" => crate::SERVICE, "kind" => kind).increment(0);
            metrics::counter!("outbox_repeats_dropped_total", "service" => crate::SERVICE, "kind" => kind).increment(0);
            metrics::counter!("outbox_late_rows_total", "service" => crate::SERVICE, "kind" => kind).increment(0);
        }
        metrics::gauge!("outbox_oldest_pending_seconds", "service" => crate::SERVICE).set(0.0);
        metrics::gauge!("outbox_shards_held", "service" => crate::SERVICE).set(0.0);
        let host = hostname();
        let holder = format!("{host}/{}", &Uuid::new_v4().simple().to_string()[..8]);
        Delivery { store, receivers, holder, margin, settle: SETTLE, held: BTreeMap::new(), next_lease_round: i64::MIN }
    }

    /// Settles each delivered minute this long after the delivered-through
    /// position passed it (`--outbox-settle`), instead of [`SETTLE`].
    pub fn settle_after(self, settle: Duration) -> Self {
        Delivery { settle, ..self }
    }

    /// Renews the leases this replica holds (storing how far each shard is
    /// delivered), lets go of those it lost, and takes shards nobody holds.
    async fn tend_leases(&mut self) -> Result<(), StoreError> {
        let now = millis(self.store.now());
        let expires_at = now + LEASE.as_millis() as i64;
        let positions: Vec<(i64, Tid)> = self.held.iter().map(|(&shard, held)| (shard, held.delivered_through)).collect();
        let renewals = renew_leases(&self.store, &self.holder, &positions, expires_at).await;
        let mut first_error = self.apply_renewals(renewals, now);
        for shard in site_shards(self.store.site()) {
            if self.held.contains_key(&shard) {
                continue;
            }
            match self.take(shard, now, expires_at).await {
                Ok(Some(delivered_through)) => {
                    tracing::info!(service = "current-store", shard, delivered_through = %delivered_through, "outbox shard taken");
                    self.held.insert(shard, HeldShard::starting_at(delivered_through, expires_at));
                }
                Ok(None) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        metrics::gauge!("outbox_shards_held", "service" => crate::SERVICE).set(self.held.len() as f64);
        first_error.map_or(Ok(()), Err)
    }

    /// Keeps what renewals found: a renewed lease's new end, and the shards
    /// another replica now holds let go of. Answers the first error.
    fn apply_renewals(&mut self, renewals: Vec<(i64, Renewal)>, now: i64) -> Option<StoreError> {
        let mut first_error = None;
        for (shard, renewal) in renewals {
            let lost = match renewal {
                Renewal::Renewed { expires_at } => {
                    if let Some(held) = self.held.get_mut(&shard) {
                        held.expires_at = held.expires_at.max(expires_at);
                    }
                    false
                }
                Renewal::Lost => true,
                // Not renewed: delivering on until the lease ends does no harm.
                Renewal::Failed(e) => {
                    first_error.get_or_insert(e);
                    self.held.get(&shard).is_some_and(|held| held.expires_at <= now)
                }
            };
            if lost && self.held.remove(&shard).is_some() {
                tracing::info!(service = "current-store", shard, "outbox shard lease lost: another replica delivers it");
            }
        }
        first_error
    }

    /// Takes `shard` when nobody holds it (or its lease has lapsed); answers
    /// where its delivery starts.
    async fn take(&self, shard: i64, now: i64, expires_at: i64) -> Result<Option<Tid>, StoreError> {
        let current = self.store.get(&OUTBOX_SHARDS, vec![Value::from(shard)], None).await?;
        let (condition, delivered_through) = match &current {
            None => (Condition::NotExists, self.first_position().await?),
            Some(row) if row.timestamp(col::EXPIRES_AT).unwrap_or(0) <= now => {
                let through = row.timeuuid(col::DELIVERED_THROUGH).and_then(|id| Tid::from_uuid(id).ok());
                let through = match through {
                    Some(through) => through,
                    None => self.first_position().await?,
                };
                let seen = [col::OWNER, col::EXPIRES_AT].map(|c| (c, row.get(c).cloned().unwrap_or(Value::Null)));
                (Condition::Equals(seen.to_vec()), through)
            }
            Some(_) => return Ok(None),
        };
        let taking = Cas {
            serialized: Serialized::InSite,
            table: &OUTBOX_SHARDS,
            partition: vec![Value::from(shard)],
            clustering: Some(Vec::new()),
            condition,
            writes: vec![lease_row(shard, &self.holder, expires_at).set(col::DELIVERED_THROUGH, delivered_through).into()],
        };
        Ok(self.store.cas(taking).await?.applied.then_some(delivered_through))
    }

    /// Where a shard that has never been delivered starts: when current-store's
    /// tables were last migrated (no row can be older than its table), but no
    /// further back than [`FIRST_LOOK_BACK`], less the margin. Every replica
    /// delivering takes the free shards within seconds of starting, so a row
    /// in a shard nobody has held is at most that old; a site added to a
    /// deployment years old starts near the present, not at the schema's
    /// creation.
    async fn first_position(&self) -> Result<Tid, StoreError> {
        let schema = self.store.get(&SCHEMA_META, vec![Value::from(crate::SERVICE)], None).await?;
        let applied_at = schema
            .and_then(|row| row.timestamp("applied_at"))
            .ok_or_else(|| StoreError::Internal("no schema recorded for current-store: run revstore-migrate".into()))?;
        let start = time_of_micros(applied_at.saturating_mul(1000)).max(self.store.now() - FIRST_LOOK_BACK);
        Ok(Tid::min_at(start - self.margin))
    }
}

/// What renewing one shard's lease found.
#[derive(Debug)]
enum Renewal {
    Renewed {
        expires_at: i64,
    },
    /// Another replica holds it now.
    Lost,
    Failed(StoreError),
}

/// Renews `holder`'s leases of the shards in `positions` until `expires_at`,
/// storing where each is delivered through, all at once.
async fn renew_leases(store: &Store, holder: &str, positions: &[(i64, Tid)], expires_at: i64) -> Vec<(i64, Renewal)> {
    let renewals = positions.iter().map(|&(shard, delivered_through)| async move {
        let renewal = Cas {
            serialized: Serialized::InSite,
            table: &OUTBOX_SHARDS,
            partition: vec![Value::from(shard)],
            clustering: Some(Vec::new()),
            condition: Condition::Equals(vec![(col::OWNER, Value::from(holder))]),
            writes: vec![lease_row(shard, holder, expires_at).set(col::DELIVERED_THROUGH, delivered_through).into()],
        };
        let outcome = match store.cas(renewal).await {
            Ok(outcome) if outcome.applied => Renewal::Renewed { expires_at },
            Ok(_) => Renewal::Lost,
            Err(e) => Renewal::Failed(e),
        };
        (shard, outcome)
    });
    futures_util::future::join_all(renewals).await
}

/// How far back a shard nobody has held is read from.
const FIRST_LOOK_BACK: Duration = Duration::from_secs(3600);

fn lease_row(shard: i64, holder: &str, expires_at: i64) -> Upsert {
    Upsert::new(&OUTBOX_SHARDS, [Value::from(shard)]).set(col::OWNER, holder).set(col::EXPIRES_AT, Value::Timestamp(expires_at))
}

/// The host's name (the pod's, under Kubernetes), for naming lease holders.
fn hostname() -> String {
    let name = std::env::var("HOSTNAME").ok().or_else(|| std::fs::read_to_string("/etc/hostname").ok()).unwrap_or_default();
    let name: String = name.trim().chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')).take(63).collect();
    if name.is_empty() { "replica".to_owned() } else { name }
}

impl Worker for Delivery {
    fn name(&self) -> &'static str {
        "outbox"
    }

    /// Busy while a shard read a full batch (more is waiting). A shard that
    /// fails pauses on its own ([`HeldShard::pause`]); the round fails, and
    /// the runner pauses, only when every shard tried failed or the leases
    /// could not be tended.
    async fn work(&mut self, _stop: &CancellationToken) -> Result<WorkerState, BoxError> {
        let mut failed = Vec::new();
        if millis(self.store.now()) >= self.next_lease_round {
            if let Err(e) = self.tend_leases().await {
                failed.push(format!("leases: {e}"));
            }
            self.next_lease_round = millis(self.store.now()) + LEASE_RENEWAL.as_millis() as i64;
        }
        let mut delivered = 0usize;
        let mut more = false;
        let now_ms = millis(self.store.now());
        // The shards at once, each in its own order: one slow answer holds up
        // its shard's next row, not every shard's; a failing shard pauses on
        // its own while the others go on.
        // The leases are renewed while the round goes on, however long it
        // takes (a slow receiver, a shard walking many minutes): a lease that
        // lapsed mid-round would hand the shard to another replica, which
        // would send the same rows beside this one.
        let positions: Vec<(i64, Tid)> = self.held.iter().map(|(&shard, held)| (shard, held.delivered_through)).collect();
        let (store, receivers, holder) = (&self.store, &self.receivers, self.holder.as_str());
        let (margin, settle) = (self.margin, self.settle);
        let mut next_lease_round = self.next_lease_round;
        let mut renewed_meanwhile = Vec::new();
        let due = self.held.iter_mut().filter(|(_, held)| held.paused_until <= now_ms);
        let rounds = {
            let mut rounds = std::pin::pin!(futures_util::future::join_all(due.map(|(&shard, held)| async move {
                let result = deliver_shard(store, receivers, shard, held, margin, settle).await;
                (shard, held, result)
            })));
            loop {
                tokio::select! {
                    rounds = &mut rounds => break rounds,
                    () = tokio::time::sleep(RENEWAL_CHECK) => {
                        let now = millis(store.now());
                        if now >= next_lease_round {
                            let expires_at = now + LEASE.as_millis() as i64;
                            renewed_meanwhile.extend(renew_leases(store, holder, &positions, expires_at).await);
                            next_lease_round = now + LEASE_RENEWAL.as_millis() as i64;
                        }
                    }
                }
            }
        };
        let tried = rounds.len();
        let mut shards_failed = Vec::new();
        for (shard, held, result) in rounds {
            match result {
                Ok(round) => {
                    delivered += round.delivered;
                    more |= round.more;
                    held.waiting_since = round.more.then(|| held.read_position().unix_micros());
                    held.failed_rounds = 0;
                }
                Err(ShardFailure { reason, retry_after }) => {
                    held.pause(millis(self.store.now()), retry_after);
                    tracing::warn!(service = "current-store", shard, reason, failed_rounds = held.failed_rounds, "outbox shard paused");
                    shards_failed.push(format!("shard {shard}: {reason}"));
                    // Everything queued since the read position waits, and
                    // keeps waiting (the figure grows) while the shard fails.
                    held.waiting_since = Some(held.read_position().unix_micros());
                }
            }
        }
        if delivered > 0 {
            tracing::info!(service = "current-store", delivered, "outbox delivered");
        }
        self.next_lease_round = next_lease_round;
        if let Some(e) = self.apply_renewals(renewed_meanwhile, millis(self.store.now())) {
            failed.push(format!("leases: {e}"));
        }
        // The backlog's age: a healthy outbox keeps it near zero; a receiver
        // that refuses, or a shard that cannot be read, makes it grow.
        let now = self.store.now_micros();
        let oldest = self.held.values().filter_map(|h| h.waiting_since).min();
        let age_secs = oldest.map_or(0.0, |since| (now - since).max(0) as f64 / 1e6);
        metrics::gauge!("outbox_oldest_pending_seconds", "service" => crate::SERVICE).set(age_secs);
        // The runner pauses the whole worker only when nothing went: every
        // shard tried failed (the receiver is down), or the leases could not
        // be tended.
        if tried > 0 && shards_failed.len() == tried {
            failed.extend(shards_failed);
        }
        if let Some(first) = failed.first() {
            return Err(format!("outbox delivery failed in {} places ({first})", failed.len()).into());
        }
        Ok(if more { WorkerState::Busy } else { WorkerState::Idle })
    }

    async fn wait_for_work(&mut self) {
        tokio::time::sleep(POLL).await;
    }

    /// Gives the leases back, with where each shard is delivered through, so
    /// that another replica takes the shards over at once rather than when
    /// the leases lapse.
    async fn stopped(&mut self) {
        for (&shard, held) in &self.held {
            let release = Cas {
                serialized: Serialized::InSite,
                table: &OUTBOX_SHARDS,
                partition: vec![Value::from(shard)],
                clustering: Some(Vec::new()),
                condition: Condition::Equals(vec![(col::OWNER, Value::from(self.holder.as_str()))]),
                writes: vec![lease_row(shard, &self.holder, 0).set(col::DELIVERED_THROUGH, held.delivered_through).into()],
            };
            if let Err(e) = self.store.cas(release).await {
                tracing::info!(service = "current-store", shard, error = %e, "outbox shard lease not given back: it lapses instead");
            }
        }
        self.held.clear();
        metrics::gauge!("outbox_shards_held", "service" => crate::SERVICE).set(0.0);
    }
}

/// What one shard's round did.
#[derive(Debug, Default)]
struct Round {
    delivered: usize,
    /// A read came back full: more is waiting.
    more: bool,
}

/// One round of one shard: sends what was queued after the read position,
/// then moves the delivered-through position on (sending any row queued
/// behind the read position), then deletes the minutes wholly delivered.
async fn deliver_shard(
    store: &Store,
    receivers: &Receivers,
    shard: i64,
    held: &mut HeldShard,
    margin: Duration,
    settle: Duration,
) -> Result<Round, ShardFailure> {
    let now = store.now();
    let mut round = Round::default();
    // Rows queued after the read position, in order, minute by minute up to
    // the current one. (A row in a later minute, from a clock ahead of this
    // one, waits until this clock gets there.)
    let current_minute = minute_of(Tid::min_at(now));
    let mut minutes_read = 0;
    loop {
        let minute = minute_of(held.read_position());
        if minute > current_minute {
            break;
        }
        // A shard far behind (taken after a long stop) walks its minutes over
        // several rounds, so that the leases are tended between them.
        if minutes_read == MINUTES_PER_ROUND {
            round.more = true;
            return Ok(round);
        }
        minutes_read += 1;
        let slice = Slice::all().lower(held.read_from.map(Value::from));
        let rows = store.read(&ReadQuery::new(&OUTBOX, minute_key(shard, minute)).slice(slice).limit(BATCH)).await?.rows;
        let full = rows.len() == BATCH as usize;
        if !rows.is_empty() {
            held.minutes_seen.insert(minute);
            held.recheck_until = store.now_micros() + RECHECK.as_micros() as i64;
        }
        for row in rows {
            let Some(id) = row.timeuuid(col::ID).and_then(|id| Tid::from_uuid(id).ok()) else { continue };
            if row.timestamp(col::DELIVERED_AT).is_none() {
                deliver_row(store, receivers, shard, minute, id, &row, &mut held.faults).await?;
                round.delivered += 1;
            }
            held.read_from = Bound::Excluded(id);
        }
        if full {
            round.more = true;
            return Ok(round);
        }
        if minute == current_minute {
            break;
        }
        held.read_from = Bound::Included(minute_start(minute + 1));
        // A row of the minute passed may still be committing.
        held.recheck_until = store.now_micros() + RECHECK.as_micros() as i64;
    }
    // Rows that committed after rows with later ids were read (two writes
    // finishing out of order): while rows are being read, the span a write's
    // timeout covers behind the read position is looked at again each round,
    // keys only, so they go within a poll interval, not once the margin has
    // passed.
    let now_micros = store.now_micros();
    if now_micros < held.recheck_until {
        let from = Tid::min_at(now - RECHECK).max(held.delivered_through);
        let to = held.read_position();
        if from < to {
            for (minute, ids) in unmarked_rows(store, shard, from, to).await? {
                for id in ids {
                    let key = [minute_key(shard, minute).to_vec(), vec![Value::from(id)]].concat();
                    if let Some(row) = store.get(&OUTBOX, key, None).await? {
                        deliver_row(store, receivers, shard, minute, id, &row, &mut held.faults).await?;
                        round.delivered += 1;
                    }
                }
            }
        }
    }
    // Rows queued behind the read position by a replica whose clock is
    // behind: every one is within the margin, so once the margin has passed
    // a span, the ids in it are all there to be checked.
    let target = Tid::min_at(now - margin).min(held.read_position());
    if target > held.delivered_through {
        for (minute, ids) in unmarked_rows(store, shard, held.delivered_through, target).await? {
            // Settled later even if empty: a row may still arrive in it late.
            held.minutes_seen.insert(minute);
            for id in ids {
                let key = [minute_key(shard, minute).to_vec(), vec![Value::from(id)]].concat();
                if let Some(row) = store.get(&OUTBOX, key, None).await? {
                    if let Err(e) = deliver_row(store, receivers, shard, minute, id, &row, &mut held.faults).await {
                        held.delivered_through = id;
                        return Err(e);
                    }
                    round.delivered += 1;
                    tracing::info!(service = "current-store", shard, id = %id, "outbox row queued behind the read position delivered");
                }
            }
        }
        held.delivered_through = target;
    }
    // Minutes the delivered-through position passed `settle` ago: read
    // once more for rows that arrived late, then deleted whole (one
    // partition delete each) if anything is in them.
    let settled = (held.delivered_through.unix_micros() - settle.as_micros() as i64).div_euclid(MINUTE_MICROS);
    let done: Vec<i64> = held.minutes_seen.range(..settled).copied().collect();
    for minute in done {
        let (late, rows) = deliver_late_rows(store, receivers, shard, minute, &mut held.faults).await?;
        round.delivered += late;
        if rows > 0 {
            store.write(Delete::partition(&OUTBOX, minute_key(shard, minute))).await?;
        }
        held.minutes_seen.remove(&minute);
    }
    Ok(round)
}

/// How long after the delivered-through position passed a minute it is read
/// once more for rows that arrived late, and deleted: a row arriving later
/// than the margin and within this is still delivered (and counted). The
/// default of `--outbox-settle`.
pub const SETTLE: Duration = Duration::from_secs(600);

/// Delivers the rows of a minute the delivered-through position has passed
/// that are still undelivered: rows that arrived behind it, later than the
/// margin (a replica whose clock is further behind than allowed, a batch
/// replayed from the batchlog). Each is counted in `outbox_late_rows_total`,
/// which the `RevstoreOutboxLateRows` alert watches. Answers the rows
/// delivered and the rows the minute holds. A row arriving after the
/// minute's delete is shadowed by it, unseen (`docs/design/outbox.md`,
/// "Late rows", says what finds its work).
async fn deliver_late_rows(
    store: &Store,
    receivers: &Receivers,
    shard: i64,
    minute: i64,
    faults: &mut Option<(Tid, u32)>,
) -> Result<(usize, usize), ShardFailure> {
    let query = ReadQuery::new(&OUTBOX, minute_key(shard, minute)).columns([col::DELIVERED_AT]);
    let keys: Vec<Row> = store.rows(query).try_collect().await?;
    let undelivered = keys.iter().filter(|row| row.timestamp(col::DELIVERED_AT).is_none());
    let mut delivered = 0;
    for id in undelivered.filter_map(|row| row.timeuuid(col::ID)).filter_map(|id| Tid::from_uuid(id).ok()) {
        let key = [minute_key(shard, minute).to_vec(), vec![Value::from(id)]].concat();
        let Some(row) = store.get(&OUTBOX, key, None).await? else { continue };
        let kind = bounded_kind(row.text(col::KIND).unwrap_or_default());
        metrics::counter!("outbox_late_rows_total", "service" => crate::SERVICE, "kind" => kind).increment(1);
        tracing::warn!(service = "current-store", shard, id = %id, kind, "outbox row arrived behind the delivered-through position; delivered late");
        deliver_row(store, receivers, shard, minute, id, &row, faults).await?;
        delivered += 1;
    }
    Ok((delivered, keys.len()))
}

/// The rows of `shard` with ids in `[from, to)` not marked delivered, by
/// minute, every minute of the span listed (keys and `delivered_at` read, no
/// payload).
async fn unmarked_rows(store: &Store, shard: i64, from: Tid, to: Tid) -> Result<Vec<(i64, Vec<Tid>)>, StoreError> {
    let mut found = Vec::new();
    for minute in minute_of(from)..=minute_of(to) {
        let slice = Slice::all().lower(Bound::Included(Value::from(from))).upper(Bound::Excluded(Value::from(to)));
        let query = ReadQuery::new(&OUTBOX, minute_key(shard, minute)).slice(slice).columns([col::DELIVERED_AT]).limit(BATCH * 10);
        let keys: Vec<Row> = store.rows(query).try_collect().await?;
        let unmarked = keys.iter().filter(|row| row.timestamp(col::DELIVERED_AT).is_none());
        found.push((minute, unmarked.filter_map(|row| row.timeuuid(col::ID)).filter_map(|id| Tid::from_uuid(id).ok()).collect()));
    }
    Ok(found)
}

fn minute_key(shard: i64, minute: i64) -> [Value; 2] {
    [Value::from(shard), Value::from(minute)]
}

/// Sends one row and marks it delivered; a permanent refusal moves it to the
/// dead letters, as does the receiver's failure on it [`FAULTY_ATTEMPTS`]
/// times in a row (`faults` counts them for the shard's head row), and
/// anything else that is not a success holds the shard up.
async fn deliver_row(
    store: &Store,
    receivers: &Receivers,
    shard: i64,
    minute: i64,
    id: Tid,
    row: &Row,
    faults: &mut Option<(Tid, u32)>,
) -> Result<(), ShardFailure> {
    let key = [Value::from(shard), Value::from(minute), Value::from(id)];
    let delivered = Upsert::new(&OUTBOX, key.clone()).set(col::DELIVERED_AT, Value::Timestamp(millis(store.now())));
    // The delivery is a span of the trace that queued the row: one trace
    // follows a render from the renderer's write into old-store and the graph.
    let span = tracing::info_span!("outbox delivery", kind = row.text(col::KIND).unwrap_or_default());
    if let Some(traceparent) = row.text(col::TRACE) {
        revstore_telemetry::adopt_remote_parent(&span, revstore_telemetry::context_from_traceparent(traceparent));
    }
    if repeats_an_earlier_row(store, row).await? {
        let kind = bounded_kind(row.text(col::KIND).unwrap_or_default());
        metrics::counter!("outbox_repeats_dropped_total", "service" => crate::SERVICE, "kind" => kind).increment(1);
        return Ok(store.write(delivered).await?);
    }
    match send(receivers, row).instrument(span).await {
        Ok(true) => Ok(store.write(delivered).await?),
        Ok(false) => Err(ShardFailure {
            reason: format!("no receiver is configured for {} rows", bounded_kind(row.text(col::KIND).unwrap_or_default())),
            retry_after: None,
        }),
        Err(Failure::Permanent { status, reason }) => Ok(move_aside(store, shard, id, row, delivered, status, &reason).await?),
        Err(Failure::Faulty { status, reason }) => {
            let times = match *faults {
                Some((head, times)) if head == id => times + 1,
                _ => 1,
            };
            let attempts = row.bigint(col::ATTEMPTS).unwrap_or(0) + 1;
            if times >= FAULTY_ATTEMPTS {
                *faults = None;
                let reason = format!("failed {times} times in a row, set aside so that its shard goes on: {reason}");
                return Ok(move_aside(store, shard, id, row, delivered, Some(status), &reason).await?);
            }
            *faults = Some((id, times));
            let _ = store.write(Upsert::new(&OUTBOX, key).set(col::ATTEMPTS, attempts)).await;
            Err(ShardFailure { reason, retry_after: None })
        }
        Err(Failure::Transient { reason, retry_after }) => {
            let attempts = row.bigint(col::ATTEMPTS).unwrap_or(0) + 1;
            let _ = store.write(Upsert::new(&OUTBOX, key).set(col::ATTEMPTS, attempts)).await;
            Err(ShardFailure { reason, retry_after })
        }
    }
}

/// Whether a hand-off or change notice repeats one queued before it, and so
/// is marked delivered unsent: a render of its revision older than its own is
/// held (that render's write queued a row of its own, with a tid no newer,
/// before the render could be seen: `pages::WriterMemory`), or, for a change
/// notice, a newer revision is already the page's latest (its own notice
/// covers the page). Writers queue without reading the page, so every
/// instance that has not itself queued a revision's hand-off queues one.
async fn repeats_an_earlier_row(store: &Store, row: &Row) -> Result<bool, StoreError> {
    let kind = row.text(col::KIND);
    let (Some("archive" | "change"), Some(domain), Some(title), Some(rev), Some(tid)) =
        (kind, row.text(col::DOMAIN), row.text(col::TITLE), row.bigint(col::REV), row.timeuuid(col::TID))
    else {
        // Other kinds always go; a malformed row is `send`'s to refuse.
        return Ok(false);
    };
    let page = || vec![Value::from(domain), Value::from(title)];
    let older = Slice::prefix([Value::from(rev)]).upper(Bound::Excluded(Value::TimeUuid(tid)));
    let older = ReadQuery::new(&PAGE_RENDERS, page()).slice(older).columns([col::DELETED_THROUGH_REV]).first(1);
    let older = store.read(&older).await?;
    // A revision deleted with its page (a refused render's first stage): nothing to hand off.
    let deleted_through = older.statics.as_ref().and_then(|s| s.bigint(col::DELETED_THROUGH_REV));
    if !older.rows.is_empty() || deleted_through.is_some_and(|through| rev <= through) {
        return Ok(true);
    }
    if kind == Some("change") {
        let latest = ReadQuery::new(&PAGE_RENDERS, page()).columns(Vec::<&'static str>::new()).first(1);
        let latest_rev = store.read(&latest).await?.rows.first().and_then(|r| r.bigint(col::REV));
        return Ok(latest_rev.is_some_and(|latest| latest > rev));
    }
    Ok(false)
}

/// Copies a refused row to the dead letters, marking it delivered in the same
/// batch, and says so once. (The row itself goes with its minute's partition.)
async fn move_aside(
    store: &Store,
    shard: i64,
    id: Tid,
    row: &Row,
    delivered: Upsert,
    status: Option<u16>,
    reason: &str,
) -> Result<(), StoreError> {
    let kind = row.text(col::KIND).unwrap_or("unknown");
    let mut dead = copy_columns(Upsert::new(&OUTBOX_DEAD_LETTERS, [Value::from(shard), Value::from(id)]), row)
        .set(col::ATTEMPTS, row.bigint(col::ATTEMPTS).unwrap_or(0) + 1)
        .set(col::FAILED_AT, Value::Timestamp(millis(store.now())))
        .set(col::REASON, reason.to_owned());
    if let Some(status) = status {
        dead = dead.set(col::STATUS, i64::from(status));
    }
    store.apply(vec![dead.into(), delivered.into()]).await?;
    metrics::counter!("outbox_dead_letters_total", "service" => crate::SERVICE, "kind" => bounded_kind(kind)).increment(1);
    tracing::warn!(
        service = "current-store",
        shard,
        id = %id,
        kind = bounded_kind(kind),
        domain = row.text(col::DOMAIN).unwrap_or_default(),
        title = row.text(col::TITLE).unwrap_or_default(),
        rev = row.bigint(col::REV).unwrap_or_default(),
        status,
        reason,
        "outbox row refused by its receiver: moved to the dead letters"
    );
    Ok(())
}

/// The kinds of outbox rows: a revision's hand-off to old-store, a
/// suppression, its lift and a page's deletion forwarded to old-store, a
/// change notice to the graph.
const KINDS: [&str; 5] = ["archive", "suppress", "lift", "delete", "change"];

/// The outbox kinds, as metric labels (a stored kind is ours, but bound it anyway).
fn bounded_kind(kind: &str) -> &'static str {
    KINDS.into_iter().find(|k| *k == kind).unwrap_or("other")
}

fn copy_columns(mut upsert: Upsert, row: &Row) -> Upsert {
    for column in ROW_COLUMNS {
        if let Some(value) = row.get(column).filter(|v| !v.is_null()) {
            upsert = upsert.set(column, value.clone());
        }
    }
    upsert
}

/// A suppression's or lift's payload: when current-store recorded it, which
/// old-store records too.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct ChangeTime {
    /// Milliseconds since the epoch.
    at: i64,
}

/// The payload of a suppression's or lift's row (nothing without a time).
pub(crate) fn change_payload(at: Option<i64>) -> Vec<u8> {
    let Some(at) = at else { return Vec::new() };
    let json = serde_json::to_vec(&ChangeTime { at }).unwrap_or_default();
    revstore_codecs::Envelope::default().encode(&json, revstore_codecs::Compression::None)
}

/// The time a suppression's or lift's (decoded) payload carries.
fn change_time(payload: &[u8]) -> Option<i64> {
    serde_json::from_slice::<ChangeTime>(payload).ok().map(|c| c.at)
}

/// Sends one row; `Ok(false)` when nothing is configured to receive it.
async fn send(receivers: &Receivers, row: &Row) -> Result<bool, Failure> {
    let (Some(kind), Some(domain), Some(title), Some(rev)) =
        (row.text(col::KIND), row.text(col::DOMAIN), row.text(col::TITLE), row.bigint(col::REV))
    else {
        return Err(Failure::unreadable("malformed outbox row: kind, domain, title or rev missing".to_owned()));
    };
    // Payloads are stored encoded (hand-offs as the render's stored parts,
    // notices as envelopes); receivers get the JSON.
    let payload = match row.blob(col::PAYLOAD) {
        Some(stored) if !stored.is_empty() && kind == "archive" => {
            crate::render::archive_json(stored).map_err(|e| Failure::unreadable(format!("unreadable outbox payload: {e}")))?
        }
        Some(stored) if !stored.is_empty() => revstore_codecs::Envelope::default()
            .decode(stored)
            .map_err(|e| Failure::unreadable(format!("unreadable outbox payload: {e}")))?
            .into_owned(),
        _ => Vec::new(),
    };
    let rev = u64::try_from(rev).map_err(|_| Failure::unreadable(format!("outbox row with revision {rev}")))?;
    match kind {
        "archive" => {
            let tid = row.timeuuid(col::TID).ok_or_else(|| Failure::unreadable("archive row without tid".to_owned()))?;
            let Some(old_store) = &receivers.old_store else { return Ok(false) };
            old_store.archive_json(domain, title, rev, &tid.to_string(), payload).await.map_err(Failure::of)?;
        }
        "suppress" => {
            let Some(old_store) = &receivers.old_store else { return Ok(false) };
            old_store.suppress(domain, title, rev, change_time(&payload)).await.map_err(Failure::of)?;
        }
        "lift" => {
            let Some(old_store) = &receivers.old_store else { return Ok(false) };
            old_store.lift_suppression(domain, title, rev, change_time(&payload)).await.map_err(Failure::of)?;
        }
        "delete" => {
            let Some(old_store) = &receivers.old_store else { return Ok(false) };
            old_store.delete_page(domain, title, rev).await.map_err(Failure::of)?;
        }
        "change" => {
            let Some(graph) = &receivers.graph else { return Ok(false) };
            graph.notify_json(domain, payload).await.map_err(Failure::of)?;
        }
        other => return Err(Failure::unreadable(format!("unknown outbox kind {:?}", other.chars().take(32).collect::<String>()))),
    }
    Ok(true)
}

/// One dead letter, as the admin listing shows it.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct DeadLetter {
    pub shard: i64,
    /// The outbox row's id (a time-based UUID: when it was queued).
    pub id: String,
    pub kind: String,
    pub domain: String,
    pub title: String,
    pub rev: i64,
    pub tid: Option<String>,
    pub attempts: i64,
    /// When the receiver refused it (RFC 3339).
    pub failed_at: String,
    /// The receiver's HTTP status, when it answered.
    pub status: Option<i64>,
    pub reason: String,
}

impl DeadLetter {
    fn of(shard: i64, row: &Row) -> Option<DeadLetter> {
        let millis = row.timestamp(col::FAILED_AT).unwrap_or(0).max(0) as u64;
        Some(DeadLetter {
            shard,
            id: row.timeuuid(col::ID)?.to_string(),
            kind: row.text(col::KIND).unwrap_or_default().to_owned(),
            domain: row.text(col::DOMAIN).unwrap_or_default().to_owned(),
            title: row.text(col::TITLE).unwrap_or_default().to_owned(),
            rev: row.bigint(col::REV).unwrap_or_default(),
            tid: row.timeuuid(col::TID).map(|t| t.to_string()),
            attempts: row.bigint(col::ATTEMPTS).unwrap_or_default(),
            failed_at: revstore_keys::rfc3339(std::time::UNIX_EPOCH + Duration::from_millis(millis)),
            status: row.bigint(col::STATUS),
            reason: row.text(col::REASON).unwrap_or_default().to_owned(),
        })
    }
}

/// Where a dead-letter listing goes on: a shard, and the page token within it.
/// Shown to clients as an opaque string `<shard>` or `<shard>:<page token>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterCursor {
    pub shard: i64,
    pub page_token: Option<String>,
}

impl DeadLetterCursor {
    /// `shards`: where dead letters may be ([`all_shards`]).
    pub fn parse(text: &str, shards: Range<i64>) -> Option<DeadLetterCursor> {
        let (shard, page_token) = match text.split_once(':') {
            Some((shard, token)) if !token.is_empty() => (shard, Some(token.to_owned())),
            Some(_) => return None,
            None => (text, None),
        };
        let shard: i64 = shard.parse().ok()?;
        shards.contains(&shard).then_some(DeadLetterCursor { shard, page_token })
    }

    pub fn render(&self) -> String {
        match &self.page_token {
            Some(token) => format!("{}:{token}", self.shard),
            None => self.shard.to_string(),
        }
    }
}

/// Up to `limit` dead letters of every site from `from` on (shard by shard,
/// oldest first in each), and where to go on.
pub async fn dead_letters(
    store: &Store,
    from: Option<DeadLetterCursor>,
    limit: u32,
) -> Result<(Vec<DeadLetter>, Option<DeadLetterCursor>), StoreError> {
    let shards = all_shards(store.site());
    let mut at = from.unwrap_or(DeadLetterCursor { shard: shards.start, page_token: None });
    let mut items = Vec::new();
    while items.len() < limit as usize {
        let want = limit - items.len() as u32;
        let page =
            store.read(&ReadQuery::new(&OUTBOX_DEAD_LETTERS, [Value::from(at.shard)]).limit(want).page_token(at.page_token.take())).await?;
        items.extend(page.rows.iter().filter_map(|row| DeadLetter::of(at.shard, row)));
        match page.next {
            Some(token) => at.page_token = Some(token),
            None if at.shard + 1 < shards.end => at = DeadLetterCursor { shard: at.shard + 1, page_token: None },
            None => return Ok((items, None)),
        }
    }
    Ok((items, Some(at)))
}

/// Queues dead letters of every site in this site's outbox again (the same
/// page's shard, a new id, attempts reset), oldest first, so this site's
/// worker delivers them again after what is already waiting. With `only`, just that one (`Ok(0)` when it is not a dead letter); without,
/// up to `limit` of them, oldest first per shard. Answers how many moved.
pub async fn redrive(store: &Store, only: Option<(i64, Uuid)>, limit: u32) -> Result<usize, StoreError> {
    let rows: Vec<(i64, Row)> = match only {
        Some((shard, id)) => match store.get(&OUTBOX_DEAD_LETTERS, vec![Value::from(shard), Value::TimeUuid(id)], None).await? {
            Some(row) => vec![(shard, row)],
            None => Vec::new(),
        },
        None => {
            let mut rows = Vec::new();
            for shard in all_shards(store.site()) {
                let want = limit.saturating_sub(rows.len() as u32);
                if want == 0 {
                    break;
                }
                let page = store.read(&ReadQuery::new(&OUTBOX_DEAD_LETTERS, [Value::from(shard)]).limit(want)).await?;
                rows.extend(page.rows.into_iter().map(|row| (shard, row)));
            }
            rows
        }
    };
    let mut moved = 0;
    for (shard, row) in rows {
        let Some(id) = row.timeuuid(col::ID) else { continue };
        // Queued again now: a position the shard's deliverer has passed is never read again.
        let own = site_shards(store.site()).start + shard.rem_euclid(SHARDS);
        let back: Write = copy_columns(queued(store, own), &row).set(col::ATTEMPTS, 0i64).into();
        store.apply(vec![back, Delete::row(&OUTBOX_DEAD_LETTERS, [Value::from(shard)], [Value::TimeUuid(id)]).into()]).await?;
        metrics::counter!("outbox_redriven_total", "service" => crate::SERVICE, "kind" => bounded_kind(row.text(col::KIND).unwrap_or_default())).increment(1);
        moved += 1;
    }
    if moved > 0 {
        tracing::info!(service = "current-store", moved, "dead letters re-driven into the outbox");
    }
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> ClientError {
        ClientError::Status {
            method: http::Method::PUT,
            url: "http://x/".into(),
            status: StatusCode::from_u16(code).unwrap(),
            problem: None,
            retry_after: None,
        }
    }

    #[test]
    fn only_answers_that_retrying_cannot_change_are_permanent() {
        for code in [400, 404, 405, 409, 410, 413, 415, 422] {
            assert!(matches!(Failure::of(status(code)), Failure::Permanent { status: Some(c), .. } if c == code), "{code}");
        }
        for code in [401, 403, 408, 429, 502, 503, 504] {
            assert!(matches!(Failure::of(status(code)), Failure::Transient { .. }), "{code}");
        }
        // The receiver answered and failed on the row: retried, then set aside.
        for code in [500, 501, 507] {
            assert!(matches!(Failure::of(status(code)), Failure::Faulty { status: c, .. } if c == code), "{code}");
        }
        let transport = ClientError::Transport { method: http::Method::PUT, url: "http://x/".into(), reason: "refused".into() };
        assert!(matches!(Failure::of(transport), Failure::Transient { .. }));
        let dots = ClientError::DotSegment { method: http::Method::PUT, path: "/d/v1/archive/../1".into() };
        assert!(matches!(Failure::of(dots), Failure::Permanent { status: None, .. }));
    }

    #[test]
    fn a_receivers_retry_after_is_kept_for_the_pause() {
        let shed = ClientError::Status {
            method: http::Method::PUT,
            url: "http://x/".into(),
            status: StatusCode::SERVICE_UNAVAILABLE,
            problem: None,
            retry_after: Some(Duration::from_secs(7)),
        };
        assert!(matches!(Failure::of(shed), Failure::Transient { retry_after: Some(d), .. } if d == Duration::from_secs(7)));
        assert!(matches!(Failure::of(status(503)), Failure::Transient { retry_after: None, .. }));
    }

    #[test]
    fn each_site_queues_a_page_in_a_shard_of_its_own() {
        let (domain, title) = (Domain::parse("en.wikipedia.org").unwrap(), Title::parse("Main_Page", Default::default()).unwrap());
        let [one, two] = [0, 1].map(|index| Site { index, count: 2, datacenter: None });
        assert_eq!(outbox_shard(Site::ONLY, &domain, &title), outbox_shard(one, &domain, &title));
        assert_eq!(outbox_shard(two, &domain, &title), outbox_shard(one, &domain, &title) + SHARDS);
        assert_eq!((site_shards(one), site_shards(two), all_shards(two)), (0..16, 16..32, 0..32));
        for t in 0..200 {
            let title = Title::parse(&format!("Page_{t}"), Default::default()).unwrap();
            assert!(site_shards(two).contains(&outbox_shard(two, &domain, &title)));
        }
    }

    #[test]
    fn cursors_round_trip_and_refuse_junk() {
        for cursor in [DeadLetterCursor { shard: 0, page_token: None }, DeadLetterCursor { shard: 15, page_token: Some("abc:d".into()) }] {
            assert_eq!(DeadLetterCursor::parse(&cursor.render(), 0..16), Some(cursor));
        }
        for junk in ["", "16", "-1", "x", "3:", "99999999999999999999"] {
            assert_eq!(DeadLetterCursor::parse(junk, 0..16), None, "{junk}");
        }
        // Two sites: the second's shards too.
        assert_eq!(DeadLetterCursor::parse("31", 0..32), Some(DeadLetterCursor { shard: 31, page_token: None }));
        assert_eq!(DeadLetterCursor::parse("32", 0..32), None);
    }
}
