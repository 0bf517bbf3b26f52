//! The copy-on-update tables of current-store's schema 7 and earlier, read
//! (never written) while a deployment upgraded to schema 8 still holds
//! renders there: `current` (the latest render of each page not written
//! since the upgrade) and `by_tid` with its `renders` index (renders
//! superseded before the upgrade, until their grace TTL ends). A page moves
//! to `page_renders` with its first write after the upgrade, or with the
//! janitor's retention sweep, whichever comes first; `by_tid` and `renders`
//! are empty one grace TTL after the upgrade, and a later schema drops them
//! with this module. docs/design/current-store-writes.md, "Seed 000's Option 2".

use revstore_keys::{Domain, RevId, Tid, Title};
use revstore_schema::tables::current_store::{BY_REV, BY_TID, CURRENT, PAGE_RENDERS, RENDERS, col};
use revstore_storage::{Delete, ReadQuery, Slice, Store, Upsert, Value, Write};

use crate::error::PagesError;
use crate::pages::{Found, found, key, render_id};

/// The page's latest render in `current`, if it has not moved yet.
pub(crate) async fn latest(store: &Store, domain: &Domain, title: &Title, columns: &[&'static str]) -> Result<Option<Found>, PagesError> {
    let query = ReadQuery::new(&CURRENT, key(domain, title)).limit(1).columns(cells(columns));
    found(store.read(&query).await?.rows.into_iter().next())
}

/// The newest render of `rev` in the old tables: its `current` row, or its
/// newest grace-period render.
pub(crate) async fn of_rev(
    store: &Store,
    domain: &Domain,
    title: &Title,
    rev: RevId,
    columns: &[&'static str],
) -> Result<Option<Found>, PagesError> {
    let [d, t] = key(domain, title);
    let r = Value::from(rev.as_i64());
    let newest_in_grace = ReadQuery::new(&RENDERS, [d.clone(), t.clone()]).slice(Slice::prefix([r.clone()])).limit(1);
    let (in_current, in_grace) =
        tokio::try_join!(store.get(&CURRENT, vec![d.clone(), t.clone(), r.clone()], Some(cells(columns))), store.read(&newest_in_grace),)?;
    let in_current = found(in_current)?;
    match (in_current, in_grace.rows.first().map(render_id).transpose()?) {
        (Some(current), Some(grace)) if !grace.is_newer_than(&current.id) => Ok(Some(current)),
        (current, Some(grace)) => Ok(of_tid(store, domain, title, rev, grace.tid, columns).await?.or(current)),
        (current, None) => Ok(current),
    }
}

/// One render of the old tables, by revision and tid.
pub(crate) async fn of_tid(
    store: &Store,
    domain: &Domain,
    title: &Title,
    rev: RevId,
    tid: Tid,
    columns: &[&'static str],
) -> Result<Option<Found>, PagesError> {
    let [d, t] = key(domain, title);
    let r = Value::from(rev.as_i64());
    if let Some(row) = store.get(&CURRENT, vec![d.clone(), t.clone(), r.clone()], Some(cells(columns))).await?
        && row.timeuuid(col::TID) == Some(tid.uuid())
    {
        return found(Some(row));
    }
    found(store.get(&BY_TID, vec![d, t, r, Value::from(tid)], Some(content(columns))).await?)
}

/// The grace-period renders the old index lists for a page.
pub(crate) async fn in_grace(store: &Store, domain: &Domain, title: &Title, slice: Slice) -> Result<Vec<crate::RenderId>, PagesError> {
    let rows = store.read(&ReadQuery::new(&RENDERS, key(domain, title)).slice(slice).limit(1000)).await?.rows;
    rows.iter().map(render_id).collect()
}

/// Moves a page's `current` rows (`rows`: read with every content column)
/// into `page_renders` and deletes the `current` partition: writes of the
/// page's partition key, so one mutation. Each moved render counts as stored
/// `now`: a superseded one (a leftover of a race) keeps its grace period from
/// here.
pub(crate) fn move_writes(domain: &Domain, title: &Title, rows: &[Found], now: i64) -> Vec<Write> {
    let [d, t] = key(domain, title);
    let mut writes: Vec<Write> = rows
        .iter()
        .map(|f| {
            let blob = |c: &str| f.row.blob(c).unwrap_or_default().to_vec();
            Upsert::new(&PAGE_RENDERS, [d.clone(), t.clone(), Value::from(f.id.rev.as_i64()), Value::from(f.id.tid)])
                .set(col::STORED_AT, Value::Timestamp(now / 1000))
                .set(col::HTML, blob(col::HTML))
                .set(col::DATA_PARSOID, blob(col::DATA_PARSOID))
                .set(col::SECTION_OFFSETS, blob(col::SECTION_OFFSETS))
                .timestamp(f.id.tid.unix_micros())
                .into()
        })
        .collect();
    let at = rows.iter().map(|f| f.id.tid.unix_micros() + 1).fold(now, i64::max);
    writes.push(Delete::partition(&CURRENT, [d, t]).timestamp(at).into());
    writes
}

/// Every `current` row of a page, with its content (normally one; more are
/// leftovers of racing writers).
pub(crate) async fn current_rows(store: &Store, domain: &Domain, title: &Title) -> Result<Vec<Found>, PagesError> {
    let query = ReadQuery::new(&CURRENT, key(domain, title)).limit(64);
    store.read(&query).await?.rows.into_iter().map(|row| Ok(Found { id: render_id(&row)?, row })).collect()
}

/// The deletes of everything the old tables hold for a page (or, with
/// `rev`, for one revision of it), timestamped `at`.
pub(crate) async fn delete_writes(
    store: &Store,
    domain: &Domain,
    title: &Title,
    rev: Option<RevId>,
    at: i64,
) -> Result<Vec<Write>, PagesError> {
    let [d, t] = key(domain, title);
    let slice = rev.map_or_else(Slice::all, |r| Slice::prefix([Value::from(r.as_i64())]));
    let listed = in_grace(store, domain, title, slice.clone()).await?;
    let mut writes: Vec<Write> = match rev {
        None => vec![
            Delete::partition(&CURRENT, [d.clone(), t.clone()]).timestamp(at).into(),
            Delete::partition(&RENDERS, [d.clone(), t.clone()]).timestamp(at).into(),
        ],
        Some(rev) => vec![
            Delete::row(&CURRENT, [d.clone(), t.clone()], [Value::from(rev.as_i64())]).timestamp(at).into(),
            Delete::range(&RENDERS, [d.clone(), t.clone()], slice).timestamp(at).into(),
        ],
    };
    for id in listed {
        let r = Value::from(id.rev.as_i64());
        writes.push(Delete::partition(&BY_REV, [d.clone(), t.clone(), r.clone()]).timestamp(at).into());
        writes.push(Delete::partition(&BY_TID, [d.clone(), t.clone(), r, Value::from(id.tid)]).timestamp(at).into());
    }
    Ok(writes)
}

/// The cells a read of `current` asks for (its tid is a cell there).
fn cells(columns: &[&'static str]) -> Vec<&'static str> {
    let mut cells: Vec<&'static str> = columns.iter().copied().filter(|c| *c != col::REV).collect();
    if !cells.contains(&col::TID) {
        cells.push(col::TID);
    }
    cells
}

/// The content columns of a `by_tid` read (its tid is part of the key).
fn content(columns: &[&'static str]) -> Vec<&'static str> {
    columns.iter().copied().filter(|c| *c != col::TID && *c != col::REV).collect()
}
