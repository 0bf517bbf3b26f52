//! Dumps of a domain's current renders (issue #30): the latest render of every
//! page of one domain, as NDJSON, in slices of the token ring that clients
//! fetch in parallel.
//!
//! Pages are found through `domain_pages`, an index of each domain's titles
//! in the token order of their `page_renders` partition, split into 256
//! buckets by the token's top byte: slice K of N is the K-th of N equal token
//! ranges, and its dump reads the buckets that range covers — of its own
//! domain only, so the cost of a dump grows with the domain's pages, not with
//! the number of domains sharing the tables. Each page is then read as a
//! reader reads it ([`Pages::latest`]): a page deleted, or whose renders were
//! all suppressed, has none and is left out.
//!
//! Every line carries a sealed cursor (the page's token and title); a dump
//! resumed from it continues after that page, with no duplicate and no gap,
//! because the order is the index's clustering order. Memory is constant: the
//! index is paged, and a bounded number of page reads are in flight.

use std::collections::VecDeque;
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{Stream, StreamExt, TryStreamExt};
use revstore_keys::{Domain, FirstLetterCase, Tid, Title, TitleRules, composite_key_bytes, murmur3_token};
use revstore_schema::tables::current_store::{DOMAIN_PAGES, col};
use revstore_storage::value::{decode_values, encode_values};
use revstore_storage::{Delete, ReadQuery, Row, Slice, Store, StoreError, TokenRange, Upsert, Value};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::error::PagesError;
use crate::pages::{Pages, rendered_at};
use crate::render::{Part, decode_part};

/// Index partitions per domain: a token's top byte.
pub const BUCKETS: i64 = 256;
/// The most slices a dump may be cut into.
pub const MAX_SLICES: u32 = 4096;
/// Index rows read per request.
const INDEX_PAGE: u32 = 1000;
/// Page reads in flight per dump stream (lines keep the index's order).
const READS_IN_FLIGHT: usize = 16;

/// The token of a page's `page_renders` partition (Murmur3, as Cassandra's).
pub fn page_token(domain: &Domain, title: &Title) -> i64 {
    murmur3_token(&composite_key_bytes(&[domain.as_str().as_bytes(), title.as_str().as_bytes()]))
}

/// The index partition of a token: its top byte, so buckets follow token order.
pub fn bucket_of(token: i64) -> i64 {
    ((i128::from(token) - i128::from(i64::MIN)) >> 56) as i64
}

/// The index row of a page, timestamped with the render that writes it (a
/// page's deletion, timestamped after its newest render, removes it).
pub fn index_row(domain: &Domain, title: &Title, render: Tid) -> Upsert {
    let token = page_token(domain, title);
    Upsert::new(
        &DOMAIN_PAGES,
        [Value::from(domain.as_str()), Value::from(bucket_of(token)), Value::from(token), Value::from(title.as_str())],
    )
    .set(col::SINCE, Value::Timestamp(render.unix_micros() / 1000))
    .timestamp(render.unix_micros())
}

/// The removal of a page's index row, timestamped `at` (microseconds).
pub fn index_delete(domain: &Domain, title: &Title, at: i64) -> Delete {
    let token = page_token(domain, title);
    Delete::row(
        &DOMAIN_PAGES,
        [Value::from(domain.as_str()), Value::from(bucket_of(token))],
        [Value::from(token), Value::from(title.as_str())],
    )
    .timestamp(at)
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

/// A page's place in a dump: its token, then its title.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpPosition {
    pub token: i64,
    pub title: String,
}

/// What a dump line holds besides the page's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DumpParts {
    pub html: bool,
    pub data_parsoid: bool,
    pub section_offsets: bool,
}

impl DumpParts {
    /// A comma-separated list of `html`, `data-parsoid`, `section-offsets`
    /// (`all`: the three); absent: the HTML alone.
    pub fn parse(text: Option<&str>) -> Result<DumpParts, String> {
        let Some(text) = text else { return Ok(DumpParts { html: true, data_parsoid: false, section_offsets: false }) };
        let mut parts = DumpParts { html: false, data_parsoid: false, section_offsets: false };
        for name in text.split(',').map(str::trim) {
            match Part::parse(name) {
                _ if name == "all" => parts = DumpParts { html: true, data_parsoid: true, section_offsets: true },
                Some(Part::Html) => parts.html = true,
                Some(Part::DataParsoid) => parts.data_parsoid = true,
                Some(Part::SectionOffsets) => parts.section_offsets = true,
                _ => {
                    return Err(format!(
                        "part {:?} is not one current-store holds: html, data-parsoid, section-offsets or all",
                        name.chars().take(32).collect::<String>()
                    ));
                }
            }
        }
        Ok(parts)
    }

    fn columns(&self) -> Vec<&'static str> {
        let mut columns = vec![col::TID];
        columns.extend(
            [(self.html, col::HTML), (self.data_parsoid, col::DATA_PARSOID), (self.section_offsets, col::SECTION_OFFSETS)]
                .into_iter()
                .filter_map(|(wanted, column)| wanted.then_some(column)),
        );
        columns
    }
}

/// Spaces out the pages every dump of this replica reads, so that dumps
/// together stay under `pages_per_second` and leave the node to live
/// readers. Each page takes the next free slot; `0` is no limit.
#[derive(Debug)]
pub struct DumpPacer {
    interval: Option<Duration>,
    next_slot: tokio::sync::Mutex<Instant>,
}

impl DumpPacer {
    pub fn new(pages_per_second: u32) -> DumpPacer {
        let interval = (pages_per_second > 0).then(|| Duration::from_secs(1) / pages_per_second);
        DumpPacer { interval, next_slot: tokio::sync::Mutex::new(Instant::now()) }
    }

    async fn wait_turn(&self) {
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

/// One dump line.
#[derive(Serialize)]
struct Line<'a> {
    title: &'a str,
    rev: u64,
    tid: String,
    rendered_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    html: Option<&'a str>,
    #[serde(rename = "data-parsoid", skip_serializing_if = "Option::is_none")]
    data_parsoid: Option<&'a RawValue>,
    #[serde(rename = "section-offsets", skip_serializing_if = "Option::is_none")]
    section_offsets: Option<&'a RawValue>,
    cursor: String,
}

/// The line that ends a dump stream: `done` when the slice is exhausted, else
/// the cursor to resume from (the request's `limit` was reached).
#[derive(Serialize)]
struct End {
    done: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    cursor: Option<String>,
}

/// A dump of one slice of one domain's current renders.
#[derive(Debug, Clone)]
pub struct Dump {
    pub domain: Domain,
    pub slice: DumpSlice,
    pub parts: DumpParts,
    /// Resume after this page (`None`: from the slice's start).
    pub after: Option<DumpPosition>,
    /// Pages in this response at most (`None`: the whole slice).
    pub limit: Option<u64>,
}

impl Dump {
    /// The cursors of a dump are valid for its domain and slice only.
    fn scope(domain: &Domain, slice: DumpSlice) -> String {
        format!("dump-current|{domain}|{slice}")
    }

    /// The position a client's cursor names; a forged cursor, or one from
    /// another domain or slice, is refused.
    pub fn open_cursor(store: &Store, domain: &Domain, slice: DumpSlice, cursor: &str) -> Result<DumpPosition, PagesError> {
        let bytes = store.open_cursor(&Self::scope(domain, slice), cursor)?;
        match decode_values(&bytes).ok().as_deref() {
            Some([Value::BigInt(token), Value::Text(title)]) if slice.range().contains(*token) => {
                Ok(DumpPosition { token: *token, title: title.clone() })
            }
            _ => Err(PagesError::Invalid("cursor does not name a page of this slice".into())),
        }
    }

    fn seal(&self, store: &Store, at: &DumpPosition) -> String {
        store.seal_cursor(&Self::scope(&self.domain, self.slice), &encode_values(&[Value::from(at.token), Value::from(at.title.as_str())]))
    }

    /// The index reads that list the slice's pages after `after`, in order:
    /// within the bucket of the resume point, first the titles after it with
    /// its token, then the tokens after it; then each later bucket the range
    /// reaches.
    fn index_reads(&self) -> Vec<ReadQuery> {
        let range = self.slice.range();
        let domain = Value::from(self.domain.as_str());
        let in_bucket = |bucket: i64, slice: Slice| {
            ReadQuery::new(&DOMAIN_PAGES, [domain.clone(), Value::from(bucket)]).slice(slice).columns([col::SINCE]).limit(INDEX_PAGE)
        };
        let mut reads = Vec::new();
        let after_token = match &self.after {
            Some(at) => {
                let same_token = Slice::prefix([Value::from(at.token)]).lower(Bound::Excluded(Value::from(at.title.as_str())));
                reads.push(in_bucket(bucket_of(at.token), same_token));
                at.token
            }
            None => range.after,
        };
        if after_token < range.through {
            for bucket in bucket_of(after_token + 1)..=bucket_of(range.through) {
                let tokens =
                    Slice::all().lower(Bound::Excluded(Value::from(after_token))).upper(Bound::Included(Value::from(range.through)));
                reads.push(in_bucket(bucket, tokens));
            }
        }
        reads
    }

    /// The slice's pages after the resume point, in (token, title) order, an
    /// index page at a time.
    fn positions(&self, store: &Store) -> impl Stream<Item = Result<DumpPosition, StoreError>> + Send + use<> {
        let reads: VecDeque<ReadQuery> = self.index_reads().into();
        futures_util::stream::try_unfold((store.clone(), reads), |(store, mut reads)| async move {
            while let Some(query) = reads.pop_front() {
                let page = store.read(&query).await?;
                if let Some(token) = page.next {
                    reads.push_front(query.page_token(Some(token)));
                }
                if !page.rows.is_empty() {
                    let positions: Vec<DumpPosition> = page.rows.iter().map(position).collect::<Result<_, _>>()?;
                    return Ok::<_, StoreError>(Some((futures_util::stream::iter(positions.into_iter().map(Ok)), (store, reads))));
                }
            }
            Ok(None)
        })
        .try_flatten()
    }

    /// The dump as NDJSON lines: one per page with a render, then the end
    /// line. The first index read happens before this returns, so that an
    /// unreachable store is an error answer rather than an empty stream.
    pub async fn lines(
        self,
        pages: Pages,
        pacer: Arc<DumpPacer>,
    ) -> Result<impl Stream<Item = Result<Vec<u8>, PagesError>> + Send + 'static, PagesError> {
        let mut positions = Box::pin(self.positions(&pages.store));
        let first = positions.next().await.transpose()?;
        let limit = self.limit.unwrap_or(u64::MAX);
        let dump = Arc::new(self);
        let store = pages.store.clone();
        let renders = futures_util::stream::iter(first.map(Ok))
            .chain(positions)
            .map_err(PagesError::from)
            .map_ok({
                let dump = dump.clone();
                move |at| {
                    let (dump, pages, pacer) = (dump.clone(), pages.clone(), pacer.clone());
                    async move {
                        pacer.wait_turn().await;
                        dump.line(&pages, &at).await.map(|line| (at, line))
                    }
                }
            })
            .try_buffered(READS_IN_FLIGHT)
            .try_filter_map(|(at, line)| std::future::ready(Ok(line.map(|l| (at, l)))));
        // Stop after `limit` lines, then say where to resume; the end line
        // follows the last page of the slice.
        let end = futures_util::stream::unfold(
            (Box::pin(renders), 0u64, None::<DumpPosition>, false),
            move |(mut renders, sent, last, ended)| {
                let (dump, store) = (dump.clone(), store.clone());
                async move {
                    if ended {
                        return None;
                    }
                    if sent >= limit {
                        let end = End { done: false, cursor: last.as_ref().map(|at| dump.seal(&store, at)) };
                        return Some((Ok(json_line(&end)), (renders, sent, last, true)));
                    }
                    match renders.next().await {
                        Some(Ok((at, line))) => Some((Ok(line), (renders, sent + 1, Some(at), false))),
                        Some(Err(e)) => Some((Err(e), (renders, sent, last, true))),
                        None => Some((Ok(json_line(&End { done: true, cursor: None })), (renders, sent, last, true))),
                    }
                }
            },
        );
        Ok(end)
    }

    /// The line of one page, or `None` when it has no render to show.
    async fn line(&self, pages: &Pages, at: &DumpPosition) -> Result<Option<Vec<u8>>, PagesError> {
        // Stored titles are normalised already; case-sensitive rules keep them as they are.
        let title = Title::parse(&at.title, TitleRules { first_letter: FirstLetterCase::Sensitive })
            .map_err(|e| PagesError::Corrupt(format!("indexed title: {e}")))?;
        let Some(found) = pages.latest(&self.domain, &title, &self.parts.columns()).await? else { return Ok(None) };
        let part = |wanted: bool, column: &'static str| -> Result<Option<Vec<u8>>, PagesError> {
            match wanted {
                true => found.row.blob(column).map(|stored| decode_part(stored, column)).transpose(),
                false => Ok(None),
            }
        };
        let html = part(self.parts.html, col::HTML)?
            .map(String::from_utf8)
            .transpose()
            .map_err(|_| PagesError::Corrupt("stored html is not UTF-8".into()))?;
        let json = |bytes: &Option<Vec<u8>>| -> Result<Option<Box<RawValue>>, PagesError> {
            bytes
                .as_ref()
                .map(|b| {
                    let text = String::from_utf8(b.clone()).map_err(|_| PagesError::Corrupt("a stored JSON part is not UTF-8".into()))?;
                    RawValue::from_string(text).map_err(|e| PagesError::Corrupt(format!("a stored JSON part: {e}")))
                })
                .transpose()
        };
        let data_parsoid = json(&part(self.parts.data_parsoid, col::DATA_PARSOID)?)?;
        let section_offsets = json(&part(self.parts.section_offsets, col::SECTION_OFFSETS)?)?;
        let line = Line {
            title: title.as_str(),
            rev: found.id.rev.get(),
            tid: found.id.tid.to_string(),
            rendered_at: rendered_at(found.id.tid),
            html: html.as_deref(),
            data_parsoid: data_parsoid.as_deref(),
            section_offsets: section_offsets.as_deref(),
            cursor: self.seal(&pages.store, at),
        };
        Ok(Some(json_line(&line)))
    }
}

fn position(row: &Row) -> Result<DumpPosition, StoreError> {
    match (row.bigint(col::TOKEN), row.text(col::TITLE)) {
        (Some(token), Some(title)) => Ok(DumpPosition { token, title: title.to_owned() }),
        _ => Err(StoreError::Corrupt("a domain_pages row without token or title".into())),
    }
}

fn json_line(value: &impl Serialize) -> Vec<u8> {
    let mut line = serde_json::to_vec(value).unwrap_or_default();
    line.push(b'\n');
    line
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
    fn slices_parse_strictly() {
        assert_eq!(DumpSlice::parse("0/1"), Ok(DumpSlice { k: 0, n: 1 }));
        assert_eq!(DumpSlice::parse("3/4"), Ok(DumpSlice { k: 3, n: 4 }));
        for bad in ["", "1", "4/4", "0/0", "-1/4", "1/4097", "a/b", "1/2/3", " 1/2"] {
            assert!(DumpSlice::parse(bad).is_err(), "{bad:?}");
        }
        let whole: Vec<TokenRange> = (0..4).map(|k| DumpSlice { k, n: 4 }.range()).collect();
        assert_eq!((whole[0].after, whole[3].through), (i64::MIN, i64::MAX));
        assert!(whole.windows(2).all(|w| w[0].through == w[1].after));
    }

    #[test]
    fn parts_parse_and_refuse_what_is_not_held() {
        assert_eq!(DumpParts::parse(None), Ok(DumpParts { html: true, data_parsoid: false, section_offsets: false }));
        assert_eq!(DumpParts::parse(Some("all")), Ok(DumpParts { html: true, data_parsoid: true, section_offsets: true }));
        assert_eq!(DumpParts::parse(Some("data-parsoid")), Ok(DumpParts { html: false, data_parsoid: true, section_offsets: false }));
        assert!(DumpParts::parse(Some("wikitext")).is_err());
        assert!(DumpParts::parse(Some("html,bogus")).is_err());
    }
}
