//! Delivers the outbox: renders to old-store, suppressions to old-store, change
//! notices to the dependency graph.
//!
//! Rows are written in the same atomic batch as the render they describe, so
//! nothing acknowledged to a renderer can be lost between the two. This worker
//! reads each shard oldest first, sends, and deletes a row only once the
//! receiver has answered with success. Sends are idempotent (old-store's
//! archive writes are), so a row delivered twice after a crash does no harm.
//! Rows live four weeks (the table's TTL): old-store may be down for hours,
//! not for a month.
//!
//! Failures are of two kinds, and only one may hold a shard up:
//! - **transient** (no answer, 5xx, 408, 429, and 401/403, which say the
//!   sender's token is wrong rather than the row): the shard stops for the
//!   round, keeping its order, and the worker pauses before the next round,
//!   longer after each failed round, up to a minute, and at least as long as
//!   a receiver's `Retry-After` asked (an overloaded old-store sheds with 503
//!   and `Retry-After`; coming back sooner would only be shed again);
//! - **permanent** (any other 4xx, a path no client may send, a row that
//!   cannot be read): retrying cannot change the answer, so the row is moved
//!   to `outbox_dead_letters` in one atomic batch, counted in
//!   `outbox_dead_letters_total`, logged once, and the shard goes on. An
//!   operator lists and re-drives dead letters through the admin routes
//!   ([`dead_letters`], [`redrive`]).

use std::time::Duration;

use http::StatusCode;
use revstore_client::{ClientError, GraphClient, OldStoreClient};
use revstore_keys::Tid;
use revstore_schema::tables::current_store::{OUTBOX, OUTBOX_DEAD_LETTERS, col};
use revstore_service::BoxError;
use revstore_service::worker::{Worker, WorkerState};
use revstore_storage::{Delete, ReadQuery, Row, Store, StoreError, Upsert, Value, Write};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

/// Where each kind of outbox row goes.
#[derive(Debug, Clone)]
pub struct Receivers {
    pub old_store: Option<OldStoreClient>,
    pub graph: Option<GraphClient>,
}

const BATCH: u32 = 100;
/// The columns an outbox row and its dead letter share (besides `attempts`).
const ROW_COLUMNS: [&str; 7] = [col::KIND, col::DOMAIN, col::TITLE, col::REV, col::TID, col::PAYLOAD, col::TRACE];

/// Why a delivery failed, and so what happens to the row.
#[derive(Debug)]
enum Failure {
    /// Try again later, in order; not before `retry_after` when the receiver said so.
    Transient { reason: String, retry_after: Option<Duration> },
    /// The receiver (or the row itself) rules out success: move the row aside.
    Permanent { status: Option<u16>, reason: String },
}

impl Failure {
    fn of(error: ClientError) -> Failure {
        match &error {
            ClientError::Status { status, .. } if status.is_client_error() && !is_retryable_client_error(*status) => {
                Failure::Permanent { status: Some(status.as_u16()), reason: error.to_string() }
            }
            ClientError::DotSegment { .. } | ClientError::Config(_) => Failure::Permanent { status: None, reason: error.to_string() },
            _ => Failure::Transient { reason: error.to_string(), retry_after: error.retry_after() },
        }
    }

    fn unreadable(reason: String) -> Failure {
        Failure::Permanent { status: None, reason }
    }
}

/// 4xx answers that a later attempt may turn into a success.
fn is_retryable_client_error(status: StatusCode) -> bool {
    matches!(status, StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS | StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
}

/// The longest `Retry-After` the worker honours (a receiver's answer is not
/// allowed to stop delivery for longer).
const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(60);

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

/// How long the worker waits before looking at an outbox it found empty.
const POLL: Duration = Duration::from_millis(500);

/// The outbox's delivery, as a background worker: each step is one round
/// over every shard.
#[derive(Debug)]
pub struct Delivery {
    store: Store,
    receivers: Receivers,
}

impl Delivery {
    pub fn new(store: Store, receivers: Receivers) -> Self {
        // Exported from the start, at 0, for the dead-letter alert.
        for kind in ["archive", "change", "suppress"] {
            metrics::counter!("outbox_dead_letters_total", "service" => crate::SERVICE, "kind" => kind).increment(0);
        }
        metrics::gauge!("outbox_oldest_pending_seconds", "service" => crate::SERVICE).set(0.0);
        Delivery { store, receivers }
    }
}

impl Worker for Delivery {
    fn name(&self) -> &'static str {
        "outbox"
    }

    /// Busy while a shard gave a full batch (more is waiting); a round in
    /// which a shard failed fails (the others were still delivered), so the
    /// runner pauses before the next.
    async fn work(&mut self, stop: &CancellationToken) -> Result<WorkerState, BoxError> {
        let mut failed = Vec::new();
        let mut delivered = 0usize;
        let mut full_batch = false;
        let mut asked_to_wait = None;
        let mut oldest_micros = None;
        for shard in 0..crate::pages::OUTBOX_SHARDS {
            match deliver_shard(&self.store, &self.receivers, shard, &mut oldest_micros).await {
                Ok(round) => {
                    delivered += round.delivered;
                    full_batch |= round.read == BATCH as usize && round.delivered > 0;
                }
                Err(ShardFailure { reason, retry_after }) => {
                    failed.push(format!("shard {shard}: {reason}"));
                    asked_to_wait = asked_to_wait.max(retry_after);
                }
            }
        }
        if delivered > 0 {
            tracing::info!(service = "current-store", delivered, "outbox delivered");
        }
        // The backlog's age: a healthy outbox keeps it near the poll interval;
        // a receiver that refuses or a shard that fails makes it grow.
        let age_secs = oldest_micros.map_or(0.0, |oldest: i64| (self.store.now_micros() - oldest).max(0) as f64 / 1e6);
        metrics::gauge!("outbox_oldest_pending_seconds", "service" => crate::SERVICE).set(age_secs);
        if let Some(wait) = asked_to_wait {
            // The runner's own pause follows; together at least what was asked.
            tokio::select! {
                () = tokio::time::sleep(wait.min(LONGEST_RETRY_AFTER)) => {}
                () = stop.cancelled() => {}
            }
        }
        if let Some(first) = failed.first() {
            return Err(format!("outbox delivery failed in {} shards ({first})", failed.len()).into());
        }
        Ok(if full_batch { WorkerState::Busy } else { WorkerState::Idle })
    }

    async fn wait_for_work(&mut self) {
        tokio::time::sleep(POLL).await;
    }
}

/// What one shard's round did: rows read, rows delivered.
struct Round {
    read: usize,
    delivered: usize,
}

/// Delivers one shard's oldest rows; `oldest_micros` takes the time of the
/// oldest row found waiting (rows are ordered by their time-UUID ids).
async fn deliver_shard(store: &Store, receivers: &Receivers, shard: i64, oldest_micros: &mut Option<i64>) -> Result<Round, ShardFailure> {
    let rows = store.read(&ReadQuery::new(&OUTBOX, [Value::from(shard)]).limit(BATCH)).await?.rows;
    let read = rows.len();
    if let Some(first) = rows.first().and_then(|r| r.timeuuid(col::ID)).and_then(|id| Tid::from_uuid(id).ok()) {
        *oldest_micros = Some(oldest_micros.map_or(first.unix_micros(), |o: i64| o.min(first.unix_micros())));
    }
    let mut delivered = 0;
    for row in rows {
        let Some(id) = row.timeuuid(col::ID) else { continue };
        // The delivery is a span of the trace that queued the row: one trace
        // follows a render from the renderer's write into old-store and the graph.
        let span = tracing::info_span!("outbox delivery", kind = row.text(col::KIND).unwrap_or_default());
        if let Some(traceparent) = row.text(col::TRACE) {
            revstore_telemetry::adopt_remote_parent(&span, revstore_telemetry::context_from_traceparent(traceparent));
        }
        match send(receivers, &row).instrument(span).await {
            Ok(true) => {
                store.write(Delete::row(&OUTBOX, [Value::from(shard)], [Value::TimeUuid(id)])).await?;
                delivered += 1;
            }
            // No receiver configured for this kind: keep the row for when there is one.
            Ok(false) => {}
            Err(Failure::Permanent { status, reason }) => {
                move_aside(store, shard, id, &row, status, &reason).await?;
            }
            Err(Failure::Transient { reason, retry_after }) => {
                let attempts = row.bigint(col::ATTEMPTS).unwrap_or(0) + 1;
                let _ = store.write(Upsert::new(&OUTBOX, [Value::from(shard), Value::TimeUuid(id)]).set(col::ATTEMPTS, attempts)).await;
                return Err(ShardFailure { reason, retry_after });
            }
        }
    }
    Ok(Round { read, delivered })
}

/// Moves a refused row to the dead letters, atomically, and says so once.
async fn move_aside(store: &Store, shard: i64, id: Uuid, row: &Row, status: Option<u16>, reason: &str) -> Result<(), StoreError> {
    let kind = row.text(col::KIND).unwrap_or("unknown");
    let mut dead = copy_columns(Upsert::new(&OUTBOX_DEAD_LETTERS, [Value::from(shard), Value::TimeUuid(id)]), row)
        .set(col::ATTEMPTS, row.bigint(col::ATTEMPTS).unwrap_or(0) + 1)
        .set(col::FAILED_AT, Value::Timestamp(revstore_keys::time::millis(store.now())))
        .set(col::REASON, reason.to_owned());
    if let Some(status) = status {
        dead = dead.set(col::STATUS, i64::from(status));
    }
    store.apply(vec![dead.into(), Delete::row(&OUTBOX, [Value::from(shard)], [Value::TimeUuid(id)]).into()]).await?;
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

/// The outbox kinds, as metric labels (a stored kind is ours, but bound it anyway).
fn bounded_kind(kind: &str) -> &'static str {
    match kind {
        "archive" => "archive",
        "suppress" => "suppress",
        "change" => "change",
        _ => "other",
    }
}

fn copy_columns(mut upsert: Upsert, row: &Row) -> Upsert {
    for column in ROW_COLUMNS {
        if let Some(value) = row.get(column).filter(|v| !v.is_null()) {
            upsert = upsert.set(column, value.clone());
        }
    }
    upsert
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
            old_store.suppress(domain, title, rev).await.map_err(Failure::of)?;
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
    pub fn parse(text: &str) -> Option<DeadLetterCursor> {
        let (shard, page_token) = match text.split_once(':') {
            Some((shard, token)) if !token.is_empty() => (shard, Some(token.to_owned())),
            Some(_) => return None,
            None => (text, None),
        };
        let shard: i64 = shard.parse().ok()?;
        (0..crate::pages::OUTBOX_SHARDS).contains(&shard).then_some(DeadLetterCursor { shard, page_token })
    }

    pub fn render(&self) -> String {
        match &self.page_token {
            Some(token) => format!("{}:{token}", self.shard),
            None => self.shard.to_string(),
        }
    }
}

/// Up to `limit` dead letters from `from` on (shard by shard, oldest first in
/// each), and where to go on.
pub async fn dead_letters(
    store: &Store,
    from: Option<DeadLetterCursor>,
    limit: u32,
) -> Result<(Vec<DeadLetter>, Option<DeadLetterCursor>), StoreError> {
    let mut at = from.unwrap_or(DeadLetterCursor { shard: 0, page_token: None });
    let mut items = Vec::new();
    while items.len() < limit as usize {
        let want = limit - items.len() as u32;
        let page =
            store.read(&ReadQuery::new(&OUTBOX_DEAD_LETTERS, [Value::from(at.shard)]).limit(want).page_token(at.page_token.take())).await?;
        items.extend(page.rows.iter().filter_map(|row| DeadLetter::of(at.shard, row)));
        match page.next {
            Some(token) => at.page_token = Some(token),
            None if at.shard + 1 < crate::pages::OUTBOX_SHARDS => at = DeadLetterCursor { shard: at.shard + 1, page_token: None },
            None => return Ok((items, None)),
        }
    }
    Ok((items, Some(at)))
}

/// Puts dead letters back at their place in the outbox (same shard, same id,
/// attempts reset), so the worker delivers them again in their original order.
/// With `only`, just that one (`Ok(0)` when it is not a dead letter); without,
/// up to `limit` of them, oldest first per shard. Answers how many moved.
pub async fn redrive(store: &Store, only: Option<(i64, Uuid)>, limit: u32) -> Result<usize, StoreError> {
    let rows: Vec<(i64, Row)> = match only {
        Some((shard, id)) => match store.get(&OUTBOX_DEAD_LETTERS, vec![Value::from(shard), Value::TimeUuid(id)], None).await? {
            Some(row) => vec![(shard, row)],
            None => Vec::new(),
        },
        None => {
            let mut rows = Vec::new();
            for shard in 0..crate::pages::OUTBOX_SHARDS {
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
        let back: Write =
            copy_columns(Upsert::new(&OUTBOX, [Value::from(shard), Value::TimeUuid(id)]), &row).set(col::ATTEMPTS, 0i64).into();
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
        for code in [401, 403, 408, 429, 500, 502, 503, 504] {
            assert!(matches!(Failure::of(status(code)), Failure::Transient { .. }), "{code}");
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
    fn cursors_round_trip_and_refuse_junk() {
        for cursor in [DeadLetterCursor { shard: 0, page_token: None }, DeadLetterCursor { shard: 15, page_token: Some("abc:d".into()) }] {
            assert_eq!(DeadLetterCursor::parse(&cursor.render()), Some(cursor));
        }
        for junk in ["", "16", "-1", "x", "3:", "99999999999999999999"] {
            assert_eq!(DeadLetterCursor::parse(junk), None, "{junk}");
        }
    }
}
