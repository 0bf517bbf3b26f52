//! Dumps of a domain's current renders: the latest render of every
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

use std::sync::Arc;

use futures_util::{Stream, StreamExt, TryStreamExt};
use revstore_keys::{Domain, FirstLetterCase, Title, TitleRules};
use revstore_schema::tables::current_store::col;
use revstore_service::dump::{DumpCursors, DumpPacer, DumpSlice, IndexedTitle, json_line, with_end_line};
use revstore_storage::{Store, Value};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::error::PagesError;
use crate::pages::{PAGE_INDEX, Pages, rendered_at};
use crate::render::{Part, decode_part};

/// Page reads in flight per dump stream (lines keep the index's order).
const READS_IN_FLIGHT: usize = 16;

const CURSORS: DumpCursors = DumpCursors { kind: "current" };

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

/// A dump of one slice of one domain's current renders.
#[derive(Debug, Clone)]
pub struct Dump {
    pub domain: Domain,
    pub slice: DumpSlice,
    pub parts: DumpParts,
    /// Resume after this page (`None`: from the slice's start).
    pub after: Option<IndexedTitle>,
    /// Pages in this response at most (`None`: the whole slice).
    pub limit: Option<u64>,
}

impl Dump {
    /// The position a client's cursor names; a forged cursor, or one from
    /// another domain or slice, is refused.
    pub fn open_cursor(store: &Store, domain: &Domain, slice: DumpSlice, cursor: &str) -> Result<IndexedTitle, PagesError> {
        Ok(CURSORS.open(store, domain, slice, cursor)?.0)
    }

    fn seal(&self, store: &Store, at: &IndexedTitle) -> String {
        CURSORS.seal(store, &self.domain, self.slice, &[Value::from(at.token), Value::from(at.title.as_str())])
    }

    /// The dump as NDJSON lines: one per page with a render, then the end
    /// line. The first index read happens before this returns, so that an
    /// unreachable store is an error answer rather than an empty stream.
    pub async fn lines(
        self,
        pages: Pages,
        pacer: Arc<DumpPacer>,
    ) -> Result<impl Stream<Item = Result<Vec<u8>, PagesError>> + Send + 'static, PagesError> {
        let mut positions = Box::pin(PAGE_INDEX.titles(&pages.store, &self.domain, self.slice, self.after.as_ref()));
        let first = positions.next().await.transpose()?;
        let limit = self.limit;
        let dump = Arc::new(self);
        let lines = futures_util::stream::iter(first.map(Ok))
            .chain(positions)
            .map_err(PagesError::from)
            .map_ok(move |at| {
                let (dump, pages, pacer) = (dump.clone(), pages.clone(), pacer.clone());
                async move {
                    pacer.wait_turn().await;
                    dump.line(&pages, &at).await
                }
            })
            .try_buffered(READS_IN_FLIGHT)
            .try_filter_map(|line| std::future::ready(Ok(line)));
        Ok(with_end_line(lines, limit))
    }

    /// The line of one page and its cursor, or `None` when it has no render to show.
    async fn line(&self, pages: &Pages, at: &IndexedTitle) -> Result<Option<(String, Vec<u8>)>, PagesError> {
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
        Ok(Some((line.cursor.clone(), json_line(&line))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_parse_and_refuse_what_is_not_held() {
        assert_eq!(DumpParts::parse(None), Ok(DumpParts { html: true, data_parsoid: false, section_offsets: false }));
        assert_eq!(DumpParts::parse(Some("all")), Ok(DumpParts { html: true, data_parsoid: true, section_offsets: true }));
        assert_eq!(DumpParts::parse(Some("data-parsoid")), Ok(DumpParts { html: false, data_parsoid: true, section_offsets: false }));
        assert!(DumpParts::parse(Some("wikitext")).is_err());
        assert!(DumpParts::parse(Some("html,bogus")).is_err());
    }
}
