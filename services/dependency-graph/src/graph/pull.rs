//! Changes and the pull check: recording a page's change once, finding the
//! edges a change made stale, and marking a page's edges brought up to date.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;

use futures_util::TryStreamExt;
use revstore_api::graph::{Pending, PendingItem};
use revstore_api::{ChangeKind, ChangeNotice};
use revstore_keys::{Domain, Title, TitleRules};
use revstore_schema::tables::dependency_graph::{CHANGES, DEPENDENCIES, col};
use revstore_storage::value::encode_values;
use revstore_storage::{ReadOrder, ReadQuery, Row, Slice, Upsert, Value, Write};

use revstore_keys::time::rfc3339_millis;

use super::listing::PageFill;
use super::{ANY, FORGOTTEN, Graph, POINT_READ_FRAGMENTS, READ_ROWS};
use crate::edge::{StoredEdge, dependencies_key, kind_name, load_selector};
use crate::error::GraphError;

impl Graph {
    /// Records a change of a page: one write, whatever the number of its
    /// dependents. The latest change per (type, selector) wins, whatever
    /// order changes arrive in; so does the page's latest change of any kind
    /// (the `ANY` row).
    pub async fn record_change(&self, domain: &Domain, notice: &ChangeNotice, titles: TitleRules) -> Result<(), GraphError> {
        let page = Title::parse(&notice.page, titles)?;
        let at = self.not_in_the_future("at", revstore_api::graph::parse_time("at", &notice.at)?)?;
        let selector = match &notice.selector {
            Some(id) => {
                revstore_api::graph::check_selector("selector", std::slice::from_ref(id))?;
                id.clone()
            }
            None => String::new(),
        };
        let partition = Self::changes_key(domain, page.as_str(), notice.kind);
        let change = |selector: &str| -> Write {
            Upsert::new(&CHANGES, partition.iter().cloned().chain([Value::from(selector)]))
                .set(col::CHANGED_AT, Value::Timestamp(at / 1000))
                .timestamp(at)
                .into()
        };
        // Its page is journaled first: the janitor's routine run visits it
        // once the change retention has passed.
        self.store.apply_in_stages(vec![vec![self.journal().entry(&partition)], vec![change(&selector), change(ANY)]]).await?;
        Ok(())
    }

    /// The pull check: the page's dependencies whose parent changed (in a
    /// fragment the edge uses) after the page was last brought up to date
    /// with it, priority ascending (pull first), `limit` items or
    /// [`PAGE_BYTES`] a page. The page's edges are read [`READ_ROWS`] at a
    /// time, and for each only the change rows it needs.
    pub async fn pending(&self, domain: &Domain, child: &Title, limit: u32, cursor: Option<String>) -> Result<Pending, GraphError> {
        let scope = format!("pending|{domain}|{child}");
        let slices = self.resume_after(&scope, cursor.as_deref(), ReadOrder::Reversed)?;
        let _turn = self.listing_turn().await?;
        let key = dependencies_key(domain.as_str(), child.as_str());
        let mut fill = PageFill::new(limit);
        let mut items = Vec::new();
        let mut last: Option<Vec<Value>> = None;
        for slice in slices {
            let mut rows = std::pin::pin!(
                self.store.rows(ReadQuery::new(&DEPENDENCIES, key.clone()).slice(slice).order(ReadOrder::Reversed).limit(READ_ROWS))
            );
            let mut chunk = Vec::with_capacity(READ_ROWS as usize);
            loop {
                let row = rows.try_next().await?;
                let ended = row.is_none();
                if let Some(row) = row {
                    chunk.push(StoredEdge::of(&row)?);
                }
                if chunk.len() < READ_ROWS as usize && !ended {
                    continue;
                }
                let stale = self.stale_among(domain, &chunk).await?;
                for (edge, changed) in std::mem::take(&mut chunk).into_iter().zip(stale) {
                    let Some(changed) = changed else { continue };
                    if !fill.take(edge.weight()) {
                        let next = last.map(|k| self.store.seal_cursor(&scope, &encode_values(&k)));
                        return Ok(Pending { needs_update: true, items, next });
                    }
                    last = Some(edge.clustering());
                    items.push(PendingItem {
                        parent: edge.parent,
                        kind: edge.kind,
                        priority: edge.priority,
                        child_selector: load_selector(edge.child_selector.as_deref()),
                        changed_at: rfc3339_millis(changed),
                    });
                }
                if ended {
                    break;
                }
            }
        }
        Ok(Pending { needs_update: !items.is_empty(), items, next: None })
    }

    /// For each edge, the time of its parent's change it has not caught up
    /// with, if any (milliseconds).
    async fn stale_among(&self, domain: &Domain, edges: &[StoredEdge]) -> Result<Vec<Option<i64>>, GraphError> {
        // The whole-page, any-change and forgotten rows of each parent (and
        // whether it has fragment rows), in one multi-partition read.
        let parents: Vec<(ChangeKind, String)> =
            edges.iter().map(|e| (e.kind, e.parent.clone())).collect::<BTreeSet<_>>().into_iter().collect();
        // The three summary rows sort first; a fourth row read is a fragment's.
        let queries =
            parents.iter().map(|(kind, parent)| ReadQuery::new(&CHANGES, Self::changes_key(domain, parent, *kind)).limit(4)).collect();
        let summaries: HashMap<(ChangeKind, String), ChangeSummary> =
            parents.into_iter().zip(self.store.read_many(queries).await?).map(|(key, rows)| (key, ChangeSummary::of(&rows))).collect();
        let mut stale = Vec::with_capacity(edges.len());
        for edge in edges {
            let summary = summaries.get(&(edge.kind, edge.parent.clone())).cloned().unwrap_or_default();
            let baseline = edge.baseline();
            let changed = match summary.decide(baseline, load_selector(edge.parent_selector.as_deref()).is_some()) {
                Decision::Stale(at) => Some(at),
                Decision::Fresh => None,
                Decision::ReadFragments => {
                    let uses = load_selector(edge.parent_selector.as_deref());
                    self.latest_fragment_change(domain, edge, uses.as_deref()).await?.filter(|at| *at > baseline)
                }
            };
            stale.push(changed);
        }
        Ok(stale)
    }

    fn changes_key(domain: &Domain, page: &str, kind: ChangeKind) -> [Value; 3] {
        [Value::from(domain.as_str()), Value::from(page), Value::from(kind_name(kind))]
    }

    /// The latest change of the fragments `uses` names (`None`: of any
    /// fragment) of the edge's parent: a read per fragment for a few, else
    /// the parent's fragment rows streamed.
    async fn latest_fragment_change(&self, domain: &Domain, edge: &StoredEdge, uses: Option<&[String]>) -> Result<Option<i64>, GraphError> {
        let key = Self::changes_key(domain, &edge.parent, edge.kind);
        if let Some(ids) = uses.filter(|ids| ids.len() <= POINT_READ_FRAGMENTS) {
            let queries = ids
                .iter()
                .map(|id| ReadQuery::new(&CHANGES, key.clone()).slice(Slice::prefix([Value::from(id.as_str())])).first(1))
                .collect();
            let found = self.store.read_many(queries).await?;
            return Ok(found.iter().flatten().filter_map(|row| row.timestamp(col::CHANGED_AT)).max());
        }
        let fragments = Slice::all().lower(Bound::Excluded(Value::from(FORGOTTEN)));
        let mut rows = std::pin::pin!(self.store.rows(ReadQuery::new(&CHANGES, key).slice(fragments).limit(1000)));
        let mut latest = None;
        while let Some(row) = rows.try_next().await? {
            let used = uses.is_none_or(|ids| row.text(col::SELECTOR).is_some_and(|s| ids.iter().any(|id| id == s)));
            if used {
                latest = latest.max(row.timestamp(col::CHANGED_AT));
            }
        }
        Ok(latest)
    }

    /// Brings the page's edges up to date with a render made at `at`: all of
    /// them for a full render, or those whose child fragments `selectors`
    /// covers, holding the page (an edge removed meanwhile stays removed).
    /// Answers how many edges it updated.
    pub async fn mark_updated(&self, domain: &Domain, child: &Title, at: &str, selectors: Option<&[String]>) -> Result<u64, GraphError> {
        let rendered = self.not_in_the_future("at", revstore_api::graph::parse_time("at", at)?)? / 1000;
        if let Some(ids) = selectors {
            revstore_api::graph::check_selector("selectors", ids)?;
        }
        let selectors = selectors.map(<[String]>::to_vec);
        let (owned_domain, owned_child) = (domain.clone(), child.clone());
        self.changing(domain, child.as_str(), move |graph, clock| async move {
            let (domain, child) = (owned_domain, owned_child);
            let edges = graph.edge_rows_of(&domain, &child).await?;
            let covered = |edge: &StoredEdge| match &selectors {
                None => true,
                Some(ids) => load_selector(edge.child_selector.as_deref()).is_some_and(|uses| uses.iter().all(|u| ids.contains(u))),
            };
            let groups: Vec<Vec<Write>> = edges
                .iter()
                .filter(|edge| covered(edge) && edge.last_updated.is_none_or(|u| u < rendered))
                .map(|edge| {
                    vec![
                        Upsert::new(&DEPENDENCIES, dependencies_key(domain.as_str(), child.as_str()).into_iter().chain(edge.clustering()))
                            .set(col::LAST_UPDATED, Value::Timestamp(rendered))
                            .timestamp(clock)
                            .into(),
                    ]
                })
                .collect();
            let updated = groups.len() as u64;
            graph.store.apply_grouped(groups).await?;
            Ok(updated)
        })
        .await
    }
}

/// What a parent's summary rows say of its changes.
#[derive(Debug, Clone, Copy, Default)]
struct ChangeSummary {
    whole: Option<i64>,
    any: Option<i64>,
    forgotten: Option<i64>,
    /// Whether any fragment's change is recorded.
    fragments: bool,
}

enum Decision {
    Stale(i64),
    Fresh,
    ReadFragments,
}

impl ChangeSummary {
    fn of(rows: &[Row]) -> Self {
        let mut summary = ChangeSummary::default();
        for row in rows {
            let at = row.timestamp(col::CHANGED_AT);
            match row.text(col::SELECTOR) {
                Some("") => summary.whole = at,
                Some(ANY) => summary.any = at,
                Some(FORGOTTEN) => summary.forgotten = at,
                Some(_) => summary.fragments = true,
                None => {}
            }
        }
        summary
    }

    /// Whether an edge updated at `baseline` is stale, from the summary alone if it can tell.
    fn decide(self, baseline: i64, names_fragments: bool) -> Decision {
        if let Some(at) = self.whole.filter(|at| *at > baseline) {
            return Decision::Stale(at);
        }
        match self.any {
            // Nothing at all changed since: fresh, whatever the edge uses.
            Some(any) if any <= baseline => Decision::Fresh,
            // Uses the whole parent: its latest change of any kind decides.
            Some(any) if !names_fragments => Decision::Stale(any),
            // The fragments it uses may be among those the janitor forgot.
            Some(_) if self.forgotten.is_some_and(|at| at > baseline) => Decision::Stale(self.forgotten.unwrap_or_default()),
            // A fragment changed since: its rows decide.
            Some(_) => Decision::ReadFragments,
            // No fragment change recorded (a whole-page one was decided above).
            None if !self.fragments => Decision::Fresh,
            // Changes recorded before the `ANY` row existed: look.
            None => Decision::ReadFragments,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_rows_decide_what_they_can() {
        let summary = |whole, any, forgotten| ChangeSummary { whole, any, forgotten, fragments: any.is_some() };
        let stale = |d: Decision| match d {
            Decision::Stale(at) => Some(at),
            _ => None,
        };
        // A whole-page change after the baseline: stale, whatever the edge uses.
        assert_eq!(stale(summary(Some(20), Some(20), None).decide(10, true)), Some(20));
        // Nothing changed since the baseline: fresh.
        assert!(matches!(summary(Some(5), Some(9), Some(8)).decide(10, true), Decision::Fresh));
        // An edge on the whole parent takes its latest change of any kind.
        assert_eq!(stale(summary(None, Some(15), None).decide(10, false)), Some(15));
        // An edge naming fragments not updated since a forgotten change: stale.
        assert_eq!(stale(summary(None, Some(30), Some(12)).decide(10, true)), Some(12));
        // Otherwise its fragments' rows decide; so do changes from before `ANY` existed.
        assert!(matches!(summary(None, Some(30), Some(8)).decide(10, true), Decision::ReadFragments));
        // A parent that never changed, or only as a whole before the baseline: fresh.
        assert!(matches!(summary(None, None, None).decide(10, false), Decision::Fresh));
        assert!(matches!(summary(Some(5), None, None).decide(10, true), Decision::Fresh));
        let legacy = ChangeSummary { fragments: true, ..ChangeSummary::default() };
        assert!(matches!(legacy.decide(10, false), Decision::ReadFragments));
        // The reserved selectors sort between the whole page and every fragment id.
        assert!(!ANY.is_empty() && ANY < FORGOTTEN && FORGOTTEN < " " && FORGOTTEN < "!");
    }
}
