//! The retention of `graph_changes`: the janitor's `retention` task, page by
//! page (every page, or those whose changes the journal shows came due).
//!
//! A change of a fragment is one row, kept so pull checks can compare it with
//! their edges' update times; a template edited in many fragments over years
//! would keep them all. The task removes the fragment rows older than the
//! change retention (`REVSTORE_GRAPH_CHANGE_RETENTION_SECS`) and raises the
//! page's `FORGOTTEN` row to the newest change it removed first, so an edge
//! not brought up to date since then is still found stale (a re-render too
//! many, never one missed). The whole-page row and the `ANY` row stay (one
//! each per page and type); `ANY` is also written where changes recorded
//! before it existed lack it.
//!
//! Each delete is written at its row's own change time, so a newer change of
//! the same fragment recorded meanwhile stays.

use std::time::Duration;

use futures_util::TryStreamExt;
use revstore_schema::tables::dependency_graph::{CHANGES, col};
use revstore_storage::{Delete, ReadQuery, Upsert, Value, Write};

use crate::error::GraphError;
use crate::graph::{ANY, FORGOTTEN, Graph};

/// Change rows of one partition handled per batch.
const CHUNK: usize = 500;

/// What forgetting a page's old changes did.
#[derive(Debug, Default)]
pub(crate) struct Forgotten {
    /// Fragment rows removed (dry run: that would be).
    pub rows: u64,
    pub bytes: u64,
}

impl Graph {
    /// The fragment rows of one page's changes (`key`, a partition of
    /// `graph_changes`) older than `keep` removed, unless `dry_run`.
    pub(crate) async fn forget_page_changes(&self, key: &[Value], keep: Duration, dry_run: bool) -> Result<Forgotten, GraphError> {
        let horizon = (self.store().now_micros() - keep.as_micros() as i64) / 1000;
        let mut step = Forgotten::default();
        let mut rows = std::pin::pin!(self.store().rows(ReadQuery::new(&CHANGES, key.to_vec()).limit(CHUNK as u32)));
        let mut chunk = Vec::with_capacity(CHUNK);
        loop {
            let row = rows.try_next().await?;
            let ended = row.is_none();
            if let Some(row) = row
                && let (Some(selector), Some(at)) = (row.text(col::SELECTOR), row.timestamp(col::CHANGED_AT))
            {
                chunk.push((selector.to_owned(), at));
            }
            if chunk.len() == CHUNK || (ended && !chunk.is_empty()) {
                let writes = forget_chunk(key, &std::mem::take(&mut chunk), horizon, &mut step);
                if !dry_run && !writes.is_empty() {
                    // The summary rows first: a step cut after them forgot nothing yet.
                    self.store().apply(writes).await?;
                }
            }
            if ended {
                return Ok(step);
            }
        }
    }
}

/// The writes that forget a chunk's old fragment rows: `ANY` and `FORGOTTEN`
/// raised first, then the deletes.
fn forget_chunk(key: &[Value], chunk: &[(String, i64)], horizon: i64, step: &mut Forgotten) -> Vec<Write> {
    let is_fragment = |selector: &str| !selector.is_empty() && selector != ANY && selector != FORGOTTEN;
    let latest = chunk.iter().filter(|(s, _)| s != ANY && s != FORGOTTEN).map(|(_, at)| *at).max();
    let old: Vec<&(String, i64)> = chunk.iter().filter(|(s, at)| is_fragment(s) && *at < horizon).collect();
    let summary = |selector: &str, at: i64| -> Write {
        // Written at the change's own time: the latest of them wins, whoever writes it.
        Upsert::new(&CHANGES, key.iter().cloned().chain([Value::from(selector)]))
            .set(col::CHANGED_AT, Value::Timestamp(at))
            .timestamp(at * 1000 + 999)
            .into()
    };
    let mut writes = Vec::new();
    let any_known = chunk.iter().find(|(s, _)| s == ANY).map(|(_, at)| *at);
    if let Some(latest) = latest.filter(|l| any_known.is_none_or(|any| any < *l)) {
        writes.push(summary(ANY, latest));
    }
    if let Some(newest_old) = old.iter().map(|(_, at)| *at).max() {
        writes.push(summary(FORGOTTEN, newest_old));
    }
    for (selector, at) in old {
        step.rows += 1;
        step.bytes += selector.len() as u64 + 8;
        writes.push(Delete::row(&CHANGES, key.iter().cloned(), [Value::from(selector.as_str())]).timestamp(at * 1000 + 999).into());
    }
    writes
}
