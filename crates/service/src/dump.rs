//! What the services' dumps share (`docs/design/dumps.md`):
//! slices of the token ring, a per-domain index of a table's partitions in
//! token order, sealed resume cursors, and the pace all dumps of a replica
//! keep.
//!
//! An index table has the columns of [`TitleIndex`]: partition (domain,
//! bucket), clustering (token, title), and `since`. `token` is the Murmur3
//! token of the indexed (domain, title) partition and `bucket` its top byte,
//! so a domain's titles spread over 256 partitions in token order, and slice
//! K of N — the K-th of N equal token ranges — reads only the buckets its
//! range covers, of its own domain. An index may also keep what the wiki
//! says of each page ([`PageIdentity`]: `page_id`, `namespace`).

use std::collections::VecDeque;
use std::ops::Bound;
use std::time::{Duration, Instant};

use futures_util::{Stream, TryStreamExt};
use revstore_keys::{Domain, Tid, Title, composite_key_bytes, murmur3_token};
use revstore_storage::value::{decode_values, encode_values};
use revstore_storage::{Delete, ReadQuery, Row, Slice, Store, StoreError, TableDef, TokenRange, Upsert, Value};

pub use revstore_api::PageIdentity;

use crate::ApiError;

/// Index partitions per domain: a token's top byte.
pub const BUCKETS: i64 = 256;
/// The most slices a dump may be cut into.
pub const MAX_SLICES: u32 = 4096;
/// Index rows read per request.
const INDEX_PAGE: u32 = 1000;

/// The columns every title index declares.
pub mod col {
    pub const DOMAIN: &str = "domain";
    pub const BUCKET: &str = "bucket";
    pub const TOKEN: &str = "token";
    pub const TITLE: &str = "title";
    pub const SINCE: &str = "since";
    pub const PAGE_ID: &str = "page_id";
    pub const NAMESPACE: &str = "namespace";
}

/// The token of a (domain, title) partition (Murmur3, as Cassandra's).
pub fn partition_token(domain: &Domain, title: &Title) -> i64 {
    murmur3_token(&composite_key_bytes(&[domain.as_str().as_bytes(), title.as_str().as_bytes()]))
}

/// The index partition of a token: its top byte, so buckets follow token order.
pub fn bucket_of(token: i64) -> i64 {
    ((i128::from(token) - i128::from(i64::MIN)) >> 56) as i64
}

/// Slice `k` of `n` equal ranges of the token ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DumpSlice {
    pub k: u32,
    pub n: u32,
}

impl DumpSlice {
    /// `K/N`, with `0 <= K < N <= MAX_SLICES`.
    pub fn parse(text: &str) -> Result<DumpSlice, String> {
        let bad = || format!("slice {:?} is not K/N with 0 <= K < N <= {MAX_SLICES}", text.chars().take(32).collect::<String>());
        let (k, n) = text.split_once('/').ok_or_else(bad)?;
        let (k, n): (u32, u32) = (k.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?);
        if n == 0 || n > MAX_SLICES || k >= n {
            return Err(bad());
        }
        Ok(DumpSlice { k, n })
    }

    pub fn range(&self) -> TokenRange {
        TokenRange::split(self.n)[self.k as usize]
    }
}

impl std::fmt::Display for DumpSlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.k, self.n)
    }
}

/// A title's place in a dump: its partition's token, then the title.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedTitle {
    pub token: i64,
    pub title: String,
    /// What the index keeps of the page (an index that keeps none: empty).
    pub page: PageIdentity,
}

/// A table indexing a domain's (domain, title) partitions for dumps.
#[derive(Debug, Clone, Copy)]
pub struct TitleIndex {
    pub table: &'static TableDef,
    /// Whether the table has the [`PageIdentity`] columns.
    pub identities: bool,
}

impl TitleIndex {
    /// The index row of a title, timestamped with the write that enters it
    /// (a deletion timestamped after the title's newest write removes it).
    pub fn row(&self, domain: &Domain, title: &Title, at: Tid) -> Upsert {
        self.row_written_at(domain, title, at, at.unix_micros())
    }

    /// [`TitleIndex::row`] for a write timestamped `written_at`
    /// (microseconds) rather than with its render's time.
    pub fn row_written_at(&self, domain: &Domain, title: &Title, since: Tid, written_at: i64) -> Upsert {
        let token = partition_token(domain, title);
        Upsert::new(
            self.table,
            [Value::from(domain.as_str()), Value::from(bucket_of(token)), Value::from(token), Value::from(title.as_str())],
        )
        .set(col::SINCE, Value::Timestamp(since.unix_micros() / 1000))
        .timestamp(written_at)
    }

    /// What a write says of a title's page, set on its index row (a row
    /// with no `since` yet is entered by the title's first render), timestamped
    /// like that write: the newest render's word stands.
    pub fn identity(&self, domain: &Domain, title: &Title, page: PageIdentity, at: Tid) -> Option<Upsert> {
        if !self.identities || page.is_empty() {
            return None;
        }
        let token = partition_token(domain, title);
        let mut row = Upsert::new(
            self.table,
            [Value::from(domain.as_str()), Value::from(bucket_of(token)), Value::from(token), Value::from(title.as_str())],
        );
        if let Some(id) = page.id {
            row = row.set(col::PAGE_ID, Value::from(id as i64));
        }
        if let Some(namespace) = page.namespace {
            row = row.set(col::NAMESPACE, Value::from(namespace));
        }
        Some(row.timestamp(at.unix_micros()))
    }

    /// What the index keeps of one title's page.
    pub async fn identity_of(&self, store: &Store, domain: &Domain, title: &str) -> Result<PageIdentity, StoreError> {
        if !self.identities {
            return Ok(PageIdentity::default());
        }
        let token = murmur3_token(&composite_key_bytes(&[domain.as_str().as_bytes(), title.as_bytes()]));
        let query = ReadQuery::new(self.table, [Value::from(domain.as_str()), Value::from(bucket_of(token))])
            .slice(Slice::prefix([Value::from(token), Value::from(title)]))
            .columns([col::PAGE_ID, col::NAMESPACE])
            .first(1);
        Ok(store.read(&query).await?.rows.first().map(identity).unwrap_or_default())
    }

    fn columns(&self) -> &'static [&'static str] {
        match self.identities {
            true => &[col::SINCE, col::PAGE_ID, col::NAMESPACE],
            false => &[col::SINCE],
        }
    }

    /// The removal of a title's index row, timestamped `at` (microseconds).
    pub fn delete(&self, domain: &Domain, title: &Title, at: i64) -> Delete {
        let token = partition_token(domain, title);
        Delete::row(
            self.table,
            [Value::from(domain.as_str()), Value::from(bucket_of(token))],
            [Value::from(token), Value::from(title.as_str())],
        )
        .timestamp(at)
    }

    /// The index reads that list the slice's titles after `after`, in
    /// order: within the bucket of the resume point, first the titles after
    /// it with its token, then the tokens after it; then each later bucket
    /// the range reaches.
    fn reads(&self, domain: &Domain, slice: DumpSlice, after: Option<&IndexedTitle>) -> VecDeque<ReadQuery> {
        let range = slice.range();
        let domain = Value::from(domain.as_str());
        let in_bucket = |bucket: i64, slice: Slice| {
            ReadQuery::new(self.table, [domain.clone(), Value::from(bucket)])
                .slice(slice)
                .columns(self.columns().iter().copied())
                .limit(INDEX_PAGE)
        };
        let mut reads = VecDeque::new();
        let after_token = match after {
            Some(at) => {
                let same_token = Slice::prefix([Value::from(at.token)]).lower(Bound::Excluded(Value::from(at.title.as_str())));
                reads.push_back(in_bucket(bucket_of(at.token), same_token));
                at.token
            }
            None => range.after,
        };
        if after_token < range.through {
            for bucket in bucket_of(after_token + 1)..=bucket_of(range.through) {
                let tokens =
                    Slice::all().lower(Bound::Excluded(Value::from(after_token))).upper(Bound::Included(Value::from(range.through)));
                reads.push_back(in_bucket(bucket, tokens));
            }
        }
        reads
    }

    /// The slice's titles after `after`, in (token, title) order, an index
    /// page at a time (constant memory whatever the domain's size).
    pub fn titles(
        &self,
        store: &Store,
        domain: &Domain,
        slice: DumpSlice,
        after: Option<&IndexedTitle>,
    ) -> impl Stream<Item = Result<IndexedTitle, StoreError>> + Send + use<> {
        futures_util::stream::try_unfold((store.clone(), self.reads(domain, slice, after)), |(store, mut reads)| async move {
            while let Some(query) = reads.pop_front() {
                let page = store.read(&query).await?;
                if let Some(token) = page.next {
                    reads.push_front(query.page_token(Some(token)));
                }
                if !page.rows.is_empty() {
                    let titles: Vec<IndexedTitle> = page.rows.iter().map(indexed).collect::<Result<_, _>>()?;
                    return Ok::<_, StoreError>(Some((futures_util::stream::iter(titles.into_iter().map(Ok)), (store, reads))));
                }
            }
            Ok(None)
        })
        .try_flatten()
    }
}

fn indexed(row: &Row) -> Result<IndexedTitle, StoreError> {
    match (row.bigint(col::TOKEN), row.text(col::TITLE)) {
        (Some(token), Some(title)) => Ok(IndexedTitle { token, title: title.to_owned(), page: identity(row) }),
        _ => Err(StoreError::Corrupt("a title index row without token or title".into())),
    }
}

fn identity(row: &Row) -> PageIdentity {
    PageIdentity { id: row.bigint(col::PAGE_ID).and_then(|id| u64::try_from(id).ok()), namespace: row.bigint(col::NAMESPACE) }
}

/// Resume cursors of one kind of dump (`"current"`, `"history"`): a position
/// (a list of values starting with the title's token and title) sealed with
/// the deployment's page-token key for one domain and slice.
#[derive(Debug, Clone, Copy)]
pub struct DumpCursors {
    pub kind: &'static str,
}

impl DumpCursors {
    fn scope(&self, domain: &Domain, slice: DumpSlice) -> String {
        format!("dump-{}|{domain}|{slice}", self.kind)
    }

    pub fn seal(&self, store: &Store, domain: &Domain, slice: DumpSlice, position: &[Value]) -> String {
        store.seal_cursor(&self.scope(domain, slice), &encode_values(position))
    }

    /// The position a client's cursor names, its title in the slice; a
    /// forged cursor, or one from another domain, slice or kind, is refused.
    pub fn open(&self, store: &Store, domain: &Domain, slice: DumpSlice, cursor: &str) -> Result<(IndexedTitle, Vec<Value>), StoreError> {
        let bytes = store.open_cursor(&self.scope(domain, slice), cursor)?;
        let mut values = decode_values(&bytes)?.into_iter();
        match (values.next(), values.next()) {
            (Some(Value::BigInt(token)), Some(Value::Text(title))) if slice.range().contains(token) => {
                Ok((IndexedTitle { token, title, page: PageIdentity::default() }, values.collect()))
            }
            _ => Err(StoreError::invalid("cursor does not name a title of this slice")),
        }
    }
}

/// A dump request's query: `slice=K/N` (default `0/1`), `after=CURSOR`,
/// `limit=L` (lines in this response at most), `parts=…` (the service's).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct DumpQuery {
    pub slice: Option<String>,
    pub after: Option<String>,
    pub limit: Option<u64>,
    pub parts: Option<String>,
}

impl DumpQuery {
    /// The query, or a 400 saying what is wrong with it.
    pub fn parse(
        query: Result<axum::extract::Query<DumpQuery>, axum::extract::rejection::QueryRejection>,
    ) -> Result<(DumpQuery, DumpSlice), ApiError> {
        let axum::extract::Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
        let slice = DumpSlice::parse(query.slice.as_deref().unwrap_or("0/1")).map_err(ApiError::bad_request)?;
        if query.limit == Some(0) {
            return Err(ApiError::bad_request("limit must be at least 1"));
        }
        Ok((query, slice))
    }
}

/// How a dump stream ends: `{"done":true}` after the slice's last line,
/// `{"done":false,"cursor":…}` after `limit` lines. A stream cut by a
/// failure ends with neither, which is how a client tells it apart.
#[derive(serde::Serialize)]
struct End {
    done: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    cursor: Option<String>,
}

/// A dump's lines — each with the cursor that resumes after it — at most
/// `limit` of them, then the end line.
pub fn with_end_line<E: Send + 'static>(
    lines: impl Stream<Item = Result<(String, Vec<u8>), E>> + Send + 'static,
    limit: Option<u64>,
) -> impl Stream<Item = Result<Vec<u8>, E>> + Send + 'static {
    let limit = limit.unwrap_or(u64::MAX);
    futures_util::stream::unfold((Box::pin(lines), 0u64, None::<String>, false), move |(mut lines, sent, last, ended)| async move {
        if ended {
            return None;
        }
        if sent >= limit {
            return Some((Ok(json_line(&End { done: false, cursor: last.clone() })), (lines, sent, last, true)));
        }
        match futures_util::StreamExt::next(&mut lines).await {
            Some(Ok((cursor, line))) => Some((Ok(line), (lines, sent + 1, Some(cursor), false))),
            Some(Err(e)) => Some((Err(e), (lines, sent, last, true))),
            None => Some((Ok(json_line(&End { done: true, cursor: None })), (lines, sent, last, true))),
        }
    })
}

/// A value as one NDJSON line.
pub fn json_line(value: &impl serde::Serialize) -> Vec<u8> {
    let mut line = serde_json::to_vec(value).unwrap_or_default();
    line.push(b'\n');
    line
}

/// The 200 answer streaming a dump's lines. A failure after the status line
/// is logged and ends the body (without its end line).
pub fn ndjson_answer<E: std::fmt::Display + Send + 'static>(
    service: &'static str,
    lines: impl Stream<Item = Result<Vec<u8>, E>> + Send + 'static,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let body = lines.map_err(move |e| {
        tracing::error!(service, error = %e, "dump stream stopped");
        std::io::Error::other("dump stream stopped")
    });
    let headers = [(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/x-ndjson"))];
    (axum::http::StatusCode::OK, headers, axum::body::Body::from_stream(body)).into_response()
}

/// Spaces out what every dump of this replica reads, so that dumps together
/// stay under a rate and leave the node to live readers. Each item takes the
/// next free slot; a rate of 0 is no limit.
#[derive(Debug)]
pub struct DumpPacer {
    interval: Option<Duration>,
    next_slot: tokio::sync::Mutex<Instant>,
}

impl DumpPacer {
    pub fn new(per_second: u32) -> DumpPacer {
        let interval = (per_second > 0).then(|| Duration::from_secs(1) / per_second);
        DumpPacer { interval, next_slot: tokio::sync::Mutex::new(Instant::now()) }
    }

    pub async fn wait_turn(&self) {
        let Some(interval) = self.interval else { return };
        let slot = {
            let mut next = self.next_slot.lock().await;
            // A quiet spell earns no burst: slots start from now at the earliest.
            let slot = (*next).max(Instant::now());
            *next = slot + interval;
            slot
        };
        tokio::time::sleep_until(slot.into()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_token_order_and_cover_the_ring() {
        assert_eq!(bucket_of(i64::MIN), 0);
        assert_eq!(bucket_of(i64::MAX), BUCKETS - 1);
        assert_eq!(bucket_of(-1), 127);
        assert_eq!(bucket_of(0), 128);
        let tokens = [i64::MIN + 1, -5_000_000_000_000_000_000, -1, 0, 1, 7_000_000_000_000_000_000, i64::MAX];
        assert!(tokens.windows(2).all(|w| bucket_of(w[0]) <= bucket_of(w[1])));
    }

    #[test]
    fn slices_parse_strictly_and_tile_the_ring() {
        assert_eq!(DumpSlice::parse("0/1"), Ok(DumpSlice { k: 0, n: 1 }));
        assert_eq!(DumpSlice::parse("3/4"), Ok(DumpSlice { k: 3, n: 4 }));
        for bad in ["", "1", "4/4", "0/0", "-1/4", "1/4097", "a/b", "1/2/3", " 1/2"] {
            assert!(DumpSlice::parse(bad).is_err(), "{bad:?}");
        }
        let whole: Vec<TokenRange> = (0..4).map(|k| DumpSlice { k, n: 4 }.range()).collect();
        assert_eq!((whole[0].after, whole[3].through), (i64::MIN, i64::MAX));
        assert!(whole.windows(2).all(|w| w[0].through == w[1].after));
    }
}
