//! Delivers the outbox: renders to old-store, suppressions to old-store, change
//! notices to the dependency graph.
//!
//! Rows are written in the same atomic batch as the render they describe, so
//! nothing acknowledged to a renderer can be lost between the two. This worker
//! reads each shard oldest first, sends, and deletes a row only once the
//! receiver has answered with success; a failure stops that shard for the
//! round (order within a shard is kept) and the next round waits longer, up to
//! a minute. Sends are idempotent (old-store's archive writes are), so a row
//! delivered twice after a crash does no harm. Rows live four weeks (the
//! table's TTL): old-store may be down for hours, not for a month.

use std::time::Duration;

use revstore_client::{HttpClient, path_segment};
use revstore_schema::tables::current_store::OUTBOX;
use revstore_storage::{Delete, ReadQuery, Row, Store, Upsert, Value};
use tokio_util::sync::CancellationToken;

/// Where each kind of outbox row goes.
#[derive(Debug, Clone)]
pub struct Receivers {
    pub old_store: Option<HttpClient>,
    pub graph: Option<HttpClient>,
}

const BATCH: u32 = 100;
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Runs until `stop` is cancelled.
pub async fn deliver(store: Store, receivers: Receivers, stop: CancellationToken) {
    let mut backoff = Duration::from_millis(500);
    loop {
        let mut failed = false;
        let mut delivered = 0usize;
        for shard in 0..crate::pages::OUTBOX_SHARDS {
            match deliver_shard(&store, &receivers, shard).await {
                Ok(n) => delivered += n,
                Err(e) => {
                    failed = true;
                    tracing::warn!(shard, error = %e, "outbox delivery failed; will retry");
                }
            }
        }
        if delivered > 0 {
            tracing::info!(delivered, "outbox delivered");
        }
        backoff = if failed { (backoff * 2).min(MAX_BACKOFF) } else { Duration::from_millis(500) };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
    }
}

async fn deliver_shard(store: &Store, receivers: &Receivers, shard: i64) -> Result<usize, String> {
    let rows = store.read(&ReadQuery::new(&OUTBOX, [Value::from(shard)]).limit(BATCH)).await.map_err(|e| e.to_string())?.rows;
    let mut delivered = 0;
    for row in rows {
        let Some(id) = row.timeuuid("id") else { continue };
        match send(receivers, &row).await {
            Ok(true) => {
                store.write(Delete::row(&OUTBOX, [Value::from(shard)], [Value::TimeUuid(id)])).await.map_err(|e| e.to_string())?;
                delivered += 1;
            }
            // No receiver configured for this kind: keep the row for when there is one.
            Ok(false) => {}
            Err(e) => {
                let attempts = row.bigint("attempts").unwrap_or(0) + 1;
                let _ = store.write(Upsert::new(&OUTBOX, [Value::from(shard), Value::TimeUuid(id)]).set("attempts", attempts)).await;
                return Err(e);
            }
        }
    }
    Ok(delivered)
}

/// Sends one row; `Ok(false)` when nothing is configured to receive it.
async fn send(receivers: &Receivers, row: &Row) -> Result<bool, String> {
    let (Some(kind), Some(domain), Some(title), Some(rev)) = (row.text("kind"), row.text("domain"), row.text("title"), row.bigint("rev"))
    else {
        return Err(format!("malformed outbox row {row:?}"));
    };
    let title = path_segment(title);
    // Payloads are stored as envelopes (compressed); receivers get the JSON.
    let payload = match row.blob("payload") {
        Some(stored) if !stored.is_empty() => {
            revstore_codecs::Envelope::default().decode(stored).map_err(|e| format!("unreadable outbox payload: {e}"))?.into_owned()
        }
        _ => Vec::new(),
    };
    let json = http::HeaderMap::from_iter([(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"))]);
    let (client, method, path, body) = match kind {
        "archive" => {
            let tid = row.timeuuid("tid").ok_or("archive row without tid")?;
            (&receivers.old_store, http::Method::PUT, format!("/{domain}/v1/archive/{title}/{rev}/{tid}"), Some(payload))
        }
        "suppress" => (&receivers.old_store, http::Method::POST, format!("/{domain}/v1/archive/{title}/{rev}/suppress"), None),
        "change" => (&receivers.graph, http::Method::POST, format!("/{domain}/v1/changes"), Some(payload)),
        other => return Err(format!("unknown outbox kind {other:?}")),
    };
    let Some(client) = client else { return Ok(false) };
    client.send(method, &path, json, body).await.map_err(|e| e.to_string())?;
    Ok(true)
}
