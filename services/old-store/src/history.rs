//! Dumps of a domain's archived revisions (`docs/design/dumps.md`):
//! every archived render of every title of one domain whose `archive_meta`
//! partition token falls in a slice of the ring, as NDJSON, in (title order
//! of the index, then revision, tid) order, each block decoded once.
//!
//! Titles are found through `archive_titles` (the shared
//! [`revstore_service::dump::TitleIndex`], [`TITLE_INDEX`]), entered with a title's first archived
//! render. A line's cursor names its title and render;
//! a dump resumed from it continues with the next render of that title.

use std::sync::Arc;

use futures_util::{Stream, StreamExt, TryStreamExt};
use revstore_keys::{Domain, FirstLetterCase, Tid, Title, TitleRules};
use revstore_service::dump::{DumpCursors, DumpPacer, DumpSlice, IndexedTitle, PageIdentity, json_line, with_end_line};
use revstore_storage::{Store, Value};
use serde::Serialize;

use crate::archive::{Archive, TITLE_INDEX};
use crate::block::DecodedEntry;
use crate::body::{Part, StoredParts};
use crate::error::ArchiveError;

const CURSORS: DumpCursors = DumpCursors { kind: "history" };

/// The parts a history line holds (those of them each render has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryParts {
    parts: [bool; 4],
}

impl HistoryParts {
    const ORDER: [Part; 4] = [Part::Html, Part::DataParsoid, Part::SectionOffsets, Part::Wikitext];

    /// Comma-separated part names (`html`, `wikitext`, `data-parsoid`,
    /// `section-offsets`) or `all`; absent: the HTML alone.
    pub fn parse(text: Option<&str>) -> Result<HistoryParts, String> {
        let Some(text) = text else { return Ok(HistoryParts { parts: [true, false, false, false] }) };
        let mut parts = [false; 4];
        for name in text.split(',').map(str::trim) {
            if name == "all" {
                parts = [true; 4];
                continue;
            }
            let part = Part::parse(name).ok_or_else(|| {
                format!(
                    "part {:?} is not one the archive holds: html, data-parsoid, section-offsets, wikitext or all",
                    name.chars().take(32).collect::<String>()
                )
            })?;
            parts[Self::ORDER.iter().position(|p| *p == part).unwrap_or(0)] = true;
        }
        Ok(HistoryParts { parts })
    }

    fn wants(&self, part: Part) -> bool {
        Self::ORDER.iter().position(|p| *p == part).is_some_and(|i| self.parts[i])
    }
}

/// Where a history dump resumes: after this render of this title.
#[derive(Debug, Clone)]
pub struct HistoryPosition {
    pub title: IndexedTitle,
    pub rev: u64,
    pub tid: Tid,
}

/// One history line.
#[derive(Serialize)]
struct Line<'a> {
    title: &'a str,
    rev: u64,
    tid: String,
    /// What an archive write said of the page (MediaWiki's page id and namespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    page_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    html: Option<&'a str>,
    #[serde(rename = "data-parsoid", skip_serializing_if = "Option::is_none")]
    data_parsoid: Option<&'a serde_json::value::RawValue>,
    #[serde(rename = "section-offsets", skip_serializing_if = "Option::is_none")]
    section_offsets: Option<&'a serde_json::value::RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    wikitext: Option<&'a str>,
    cursor: String,
}

/// A dump of one slice of one domain's archived revisions.
#[derive(Debug, Clone)]
pub struct HistoryDump {
    pub domain: Domain,
    pub slice: DumpSlice,
    pub parts: HistoryParts,
    pub after: Option<HistoryPosition>,
    /// Revisions in this response at most (`None`: the whole slice).
    pub limit: Option<u64>,
}

impl HistoryDump {
    /// The position a client's cursor names; a forged cursor, or one from
    /// another domain, slice or kind of dump, is refused.
    pub fn open_cursor(store: &Store, domain: &Domain, slice: DumpSlice, cursor: &str) -> Result<HistoryPosition, ArchiveError> {
        let (title, rest) = CURSORS.open(store, domain, slice, cursor)?;
        match rest.as_slice() {
            [Value::BigInt(rev), Value::TimeUuid(tid)] if *rev > 0 => {
                let tid = Tid::from_uuid(*tid).map_err(|_| revstore_storage::StoreError::invalid("cursor: not a render's tid"))?;
                Ok(HistoryPosition { title, rev: *rev as u64, tid })
            }
            _ => Err(revstore_storage::StoreError::invalid("cursor does not name a render").into()),
        }
    }

    fn seal(&self, store: &Store, title: &IndexedTitle, entry: &DecodedEntry) -> String {
        let position = [Value::from(title.token), Value::from(title.title.as_str()), Value::from(entry.rev as i64), Value::from(entry.tid)];
        CURSORS.seal(store, &self.domain, self.slice, &position)
    }

    /// The dump as NDJSON lines: one per archived render (suppressed
    /// revisions left out), then the end line. The first index read happens
    /// before this returns, so that an unreachable store is an error answer.
    pub async fn lines(
        self,
        archive: Archive,
        pacer: Arc<DumpPacer>,
    ) -> Result<impl Stream<Item = Result<Vec<u8>, ArchiveError>> + Send + 'static, ArchiveError> {
        let store = archive.store().clone();
        let resume_title = self.after.as_ref().map(|a| a.title.clone());
        let mut titles = Box::pin(TITLE_INDEX.titles(&store, &self.domain, self.slice, resume_title.as_ref()));
        let first = titles.next().await.transpose()?;
        let dump = Arc::new(self);
        // The resume point's own title first (its renders after the cursor), then the titles after it.
        let resumed = dump.after.clone().map(|at| (at.title.clone(), Some((at.rev, at.tid))));
        let titles = futures_util::stream::iter(resumed.map(Ok))
            .chain(futures_util::stream::iter(first.map(Ok)).chain(titles).map_ok(|t| (t, None)))
            .map_err(ArchiveError::from);
        let renders = titles
            .map_ok({
                let (dump, archive) = (dump.clone(), archive.clone());
                move |(title, after)| dump.clone().title_lines(archive.clone(), pacer.clone(), title, after)
            })
            .try_flatten();
        Ok(with_end_line(renders, dump.limit))
    }

    /// The lines of one title's renders after `after`: (cursor, line).
    fn title_lines(
        self: Arc<Self>,
        archive: Archive,
        pacer: Arc<DumpPacer>,
        indexed: IndexedTitle,
        after: Option<(u64, Tid)>,
    ) -> impl Stream<Item = Result<(String, Vec<u8>), ArchiveError>> + Send + 'static {
        futures_util::stream::once(async move {
            // Stored titles are normalised already; case-sensitive rules keep them as they are.
            let title = Title::parse(&indexed.title, TitleRules { first_letter: FirstLetterCase::Sensitive })
                .map_err(|e| ArchiveError::internal(format!("indexed title: {e}")))?;
            let hidden = archive.hidden_revisions(&self.domain, &title).await?;
            // A title resumed from a cursor was not read from the index: its page is looked up.
            let page = match after {
                Some(_) => TITLE_INDEX.identity_of(archive.store(), &self.domain, &indexed.title).await?,
                None => indexed.page,
            };
            let entries = archive.history(&self.domain, &title, after).try_filter(move |e| std::future::ready(!hidden.contains(&e.rev)));
            let store = archive.store().clone();
            Ok::<_, ArchiveError>(entries.and_then(move |entry| {
                let (dump, store, pacer, indexed) = (self.clone(), store.clone(), pacer.clone(), indexed.clone());
                async move {
                    pacer.wait_turn().await;
                    let cursor = dump.seal(&store, &indexed, &entry);
                    let line = dump.line(&indexed.title, page, &entry, &cursor)?;
                    Ok((cursor, line))
                }
            }))
        })
        .try_flatten()
    }

    fn line(&self, title: &str, page: PageIdentity, entry: &DecodedEntry, cursor: &str) -> Result<Vec<u8>, ArchiveError> {
        let parts = StoredParts::parse(&entry.content).map_err(ArchiveError::internal)?;
        let wanted = |part: Part| parts.get(part).filter(|_| self.parts.wants(part));
        let text = |part: Part| {
            wanted(part)
                .map(std::str::from_utf8)
                .transpose()
                .map_err(|_| ArchiveError::internal(format!("stored {} is not UTF-8", part.name())))
        };
        let json = |part: Part| {
            wanted(part)
                .map(serde_json::from_slice::<&serde_json::value::RawValue>)
                .transpose()
                .map_err(|e| ArchiveError::internal(format!("stored {} is not JSON: {e}", part.name())))
        };
        let line = Line {
            title,
            rev: entry.rev,
            tid: entry.tid.to_string(),
            page_id: page.id,
            namespace: page.namespace,
            html: text(Part::Html)?,
            data_parsoid: json(Part::DataParsoid)?,
            section_offsets: json(Part::SectionOffsets)?,
            wikitext: text(Part::Wikitext)?,
            cursor: cursor.to_owned(),
        };
        Ok(json_line(&line))
    }
}
