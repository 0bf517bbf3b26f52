//! What an engine holds of a table, counted from what reads see (the
//! default of [`Engine::holdings`](crate::Engine::holdings)), and the byte
//! measure audits use.

use revstore_schema::{ColumnKind, TableDef};

use crate::error::StoreResult;
use crate::ops::{Holdings, ReadQuery, ScanPosition, ScanQuery};
use crate::store::Engine;
use crate::value::{Row, Value, clustering_key};

/// Rows read per page when counting a partition's holdings.
const HOLDINGS_PAGE: u32 = 1000;

/// [`Engine::holdings`] from what reads see: up to `limit` live partitions
/// found by a scan of at most `slice` tokens of the ring from the query's
/// position (`u64::MAX`: the rest of its range), each read whole.
pub(crate) async fn live_holdings<E: Engine + ?Sized>(engine: &E, query: &ScanQuery, slice: u64) -> StoreResult<Holdings> {
    let table = query.table;
    let statics: Vec<&'static str> = table.columns.iter().filter(|c| c.kind == ColumnKind::Static).map(|c| c.name).collect();
    let start = query.after.as_ref().map_or(query.range.after, |p| p.token);
    let slice_end = (i128::from(start) + i128::from(slice)).min(i128::from(query.range.through)) as i64;
    let range = crate::ops::TokenRange { after: query.range.after, through: slice_end };
    let mut found = engine.scan(&ScanQuery { statics, range, ..query.clone() }).await?;
    let more = found.len() > query.limit as usize;
    found.truncate(query.limit as usize);
    let mut held = Holdings::default();
    // The first page of every partition at once; the rest of the large ones after.
    let first_pages = engine.read_many(found.iter().map(|p| ReadQuery::new(table, p.key.clone()).limit(HOLDINGS_PAGE)).collect()).await?;
    for (partition, first) in found.iter().zip(first_pages) {
        held.partitions += 1;
        held.bytes_live += partition.statics.as_ref().map_or(0, |s| s.columns().map(|(_, v)| v.stored_len()).sum());
        let mut rows = first;
        loop {
            let more_rows = rows.len() > HOLDINGS_PAGE as usize;
            for row in rows.iter().take(HOLDINGS_PAGE as usize) {
                held.rows_live += 1;
                held.bytes_live += row_bytes(table, row);
            }
            match rows.get(HOLDINGS_PAGE as usize - 1) {
                Some(last) if more_rows => {
                    let after = Some(clustering_key(table, last));
                    rows = engine.read(&ReadQuery::new(table, partition.key.clone()).limit(HOLDINGS_PAGE), after).await?.0;
                }
                _ => break,
            }
        }
    }
    held.rows_held = held.rows_live;
    held.bytes_held = held.bytes_live;
    held.next = if more {
        found.last().map(|p| p.position())
    } else if slice_end < query.range.through {
        // The slice is done: on after every partition of its last token.
        Some(ScanPosition { token: slice_end, key: Vec::new() })
    } else {
        None
    };
    Ok(held)
}

/// A row's clustering and regular cells in [`Value::stored_len`]'s unit: what
/// [`Holdings`] counts for it.
pub fn row_bytes(table: &TableDef, row: &Row) -> u64 {
    table
        .columns
        .iter()
        .filter(|c| matches!(c.kind, ColumnKind::Clustering(_) | ColumnKind::Regular))
        .filter_map(|c| row.get(c.name))
        .map(Value::stored_len)
        .sum()
}
