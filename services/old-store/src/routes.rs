//! old-store's HTTP API (the contract in the architecture brief).
//!
//! As in current-store, paths of the same shape mean different things at each
//! position (`/archive/{title}/{rev}/{tid}` to write, `/archive/{part}/{title}/{rev}`
//! to read), so the router names positions neutrally; the OpenAPI document
//! gives every route its real parameter names.

use axum::Json;
use axum::body::Body;
use axum::extract::{FromRef, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use futures_util::{StreamExt, TryStreamExt};
use revstore_keys::{Domain, RevId, Tid, Title, TitleRules, parse_page};
use revstore_service::problem::Problem;
use revstore_service::suppressions::Change;
use revstore_service::{Access, ApiError, Platform, Routes, WriteAccess};
use utoipa::OpenApi;

use crate::archive::{Archive, ArchiveOutcome};
use crate::block::Located;
use revstore_api::{ArchivedRevision, RevisionList, Selection, render_etag};

use crate::body::{ArchiveBody, Part, StoredParts, block_entry, bundle};
use crate::debt::{DebtSweeper, SweepReport};
use crate::error::ArchiveError;

/// A given render never changes; it can only be hidden, so caches keep it a day.
const FIXED_CACHE: &str = "max-age=86400";
const DEFAULT_LIST_LIMIT: u32 = 100;
const MAX_LIST_LIMIT: u32 = 1000;
/// Metadata rows fetched per step of a history stream.
const HISTORY_PAGE: u32 = 256;

#[derive(Debug, Clone)]
pub struct AppState {
    pub platform: Platform,
    pub archive: Archive,
    pub debt: DebtSweeper,
    pub titles: TitleRules,
    /// The pace all history dumps of this replica share.
    pub dumps: std::sync::Arc<revstore_service::dump::DumpPacer>,
}

impl FromRef<AppState> for Access {
    fn from_ref(state: &AppState) -> Access {
        state.platform.access().clone()
    }
}

const ARCHIVE: &str = "/{domain}/v1/archive";

/// The service's routes, given their state.
pub fn routes(state: AppState) -> Routes {
    Routes::new()
        .route(&format!("{ARCHIVE}/{{part_or_title}}/{{title_or_rev}}/{{rev_or_tid}}"), get(get_revision).put(put_render))
        .route(&format!("{ARCHIVE}/{{part_or_title}}/{{title_or_rev}}/{{rev_or_tid}}/{{tid}}"), get(get_render))
        .route(&format!("{ARCHIVE}/{{part_or_title}}/{{title_or_rev}}/suppress"), post(suppress_revision).delete(lift_suppression))
        .route(&format!("{ARCHIVE}/{{part_or_title}}"), delete(delete_page))
        .route(&format!("{ARCHIVE}/revisions/{{title_or_rev}}"), get(list_revisions))
        .route(&format!("{ARCHIVE}/history/{{title_or_rev}}"), get(history))
        .route("/{domain}/v1/dump/history", get(dump_history))
        .route("/admin/compaction", get(compaction_status))
        .route("/admin/compaction/sweep", post(sweep_compaction_debt))
        .with_state(state)
}

#[derive(Debug, OpenApi)]
#[openapi(
    info(title = "revstore old-store", description = "Every old revision, in compressed multi-revision blocks, with random access."),
    paths(
        put_render,
        get_revision,
        get_render,
        list_revisions,
        history,
        dump_history,
        suppress_revision,
        lift_suppression,
        delete_page,
        compaction_status,
        sweep_compaction_debt
    ),
    components(schemas(ArchiveBody, ArchiveAnswer, ArchivedRevision, RevisionList, CompactionStatus, SweepReport, Problem))
)]
pub struct ApiDoc;

/// What a read URL names: old-store serves every part, wikitext included.
fn part(s: &str) -> Result<Selection, ApiError> {
    Selection::parse(s, &Part::ALL).ok_or_else(|| ApiError::not_found(format!("no part {s:?}: {}", Selection::choices(&Part::ALL))))
}

/// The answer to an archive write.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ArchiveAnswer {
    pub rev: u64,
    pub tid: String,
    /// `"stored"` or `"skipped"`.
    pub outcome: String,
    /// Why a render was skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Archive a render; idempotent.
#[utoipa::path(put, path = "/{domain}/v1/archive/{title}/{rev}/{tid}",
    params(("domain" = String, Path), ("title" = String, Path), ("rev" = u64, Path), ("tid" = String, Path, description = "version 1 UUID of the render")),
    request_body = ArchiveBody,
    responses(
        (status = 201, description = "stored", body = ArchiveAnswer),
        (status = 200, description = "already stored, or skipped by the update policy", body = ArchiveAnswer),
        (status = 400, body = Problem), (status = 401, body = Problem), (status = 413, body = Problem)),
    security(("bearer" = [])))]
async fn put_render(
    _: WriteAccess,
    State(state): State<AppState>,
    Path((domain, title, rev, tid)): Path<(String, String, String, String)>,
    body: Result<Json<ArchiveBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let (domain, title) = parse_page(&domain, &title, state.titles)?;
    let rev = RevId::parse(&rev)?;
    let tid = Tid::parse(&tid)?;
    let Json(body) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    crate::body::check(&body)?;
    tid.check_render_time(state.archive.store().now())?;
    let outcome = state.archive.archive(&domain, &title, rev, tid, block_entry(&body)).await?;
    if let (ArchiveOutcome::Stored | ArchiveOutcome::AlreadyStored, Some(page)) = (&outcome, body.page) {
        state.archive.note_page(&domain, &title, page, tid).await?;
    }
    let (status, outcome, reason) = match outcome {
        ArchiveOutcome::Stored => (StatusCode::CREATED, "stored", None),
        ArchiveOutcome::AlreadyStored => (StatusCode::OK, "stored", None),
        ArchiveOutcome::Skipped(why) => (StatusCode::OK, "skipped", Some(why.to_owned())),
    };
    let answer = ArchiveAnswer { rev: rev.get(), tid: tid.to_string(), outcome: outcome.into(), reason };
    let mut headers = HeaderMap::new();
    if status == StatusCode::CREATED || answer.reason.is_none() {
        headers.insert(header::ETAG, etag(rev.get(), tid)?);
    }
    Ok((status, headers, Json(answer)).into_response())
}

fn etag(rev: u64, tid: Tid) -> Result<HeaderValue, ApiError> {
    HeaderValue::from_str(&render_etag(rev, &tid)).map_err(ApiError::internal)
}

/// Read a revision's first archived render.
#[utoipa::path(get, path = "/{domain}/v1/archive/{part}/{title}/{rev}",
    params(("domain" = String, Path), ("part" = String, Path, description = "html, data-parsoid, section-offsets, wikitext or bundle"),
        ("title" = String, Path), ("rev" = u64, Path)),
    responses((status = 200, description = "the part"), (status = 304), (status = 404, body = Problem)))]
async fn get_revision(
    State(state): State<AppState>,
    Path((domain, part_name, title, rev)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    read(&state, &domain, &part_name, &title, &rev, None, &headers).await
}

/// Read one render of a revision.
#[utoipa::path(get, path = "/{domain}/v1/archive/{part}/{title}/{rev}/{tid}",
    params(("domain" = String, Path), ("part" = String, Path), ("title" = String, Path), ("rev" = u64, Path), ("tid" = String, Path)),
    responses((status = 200, description = "the part"), (status = 304), (status = 404, body = Problem)))]
async fn get_render(
    State(state): State<AppState>,
    Path((domain, part_name, title, rev, tid)): Path<(String, String, String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    read(&state, &domain, &part_name, &title, &rev, Some(&tid), &headers).await
}

async fn read(
    state: &AppState,
    domain: &str,
    part_name: &str,
    title: &str,
    rev: &str,
    tid: Option<&str>,
    request: &HeaderMap,
) -> Result<Response, ApiError> {
    let part = part(part_name)?;
    let (domain, title) = parse_page(domain, title, state.titles)?;
    let rev = RevId::parse(rev)?;
    let tid = tid.map(Tid::parse).transpose()?;
    let archive = &state.archive;
    let (suppressed, located) = tokio::join!(archive.hides(&domain, &title, rev), archive.locate(&domain, &title, rev, tid));
    let located = match (suppressed?, located?) {
        (false, Some(l)) => l,
        _ => {
            let which = tid.map_or(String::new(), |t| format!(" render {t}"));
            return Err(ApiError::not_found(format!("revision {rev}{which} of {title} is not archived")));
        }
    };
    let etag = etag(located.rev, located.tid)?;
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag.clone());
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(FIXED_CACHE));
    if revstore_service::not_modified(request, etag.to_str().unwrap_or_default()) {
        return Ok((StatusCode::NOT_MODIFIED, headers).into_response());
    }
    let entry = archive.content(&domain, &title, &located).await?;
    let parts = StoredParts::parse(&entry.content).map_err(ApiError::internal)?;
    let body = match part {
        Selection::Part(part) => {
            parts.get(part).ok_or_else(|| ApiError::not_found(format!("revision {rev} of {title} has no {}", part.name())))?.to_vec()
        }
        Selection::Bundle => {
            let b = bundle(located.rev, &located.tid.to_string(), &parts).map_err(ApiError::internal)?;
            serde_json::to_vec(&b).map_err(ApiError::internal)?
        }
    };
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(part.content_type()));
    Ok((StatusCode::OK, headers, body).into_response())
}

#[derive(Debug, serde::Deserialize)]
struct ListParams {
    limit: Option<u32>,
    cursor: Option<String>,
    from: Option<u64>,
}

/// The archived renders of a title, in revision order, paged with cursors.
#[utoipa::path(get, path = "/{domain}/v1/archive/revisions/{title}",
    params(("domain" = String, Path), ("title" = String, Path),
        ("limit" = Option<u32>, Query, description = "1-1000, default 100"), ("cursor" = Option<String>, Query),
        ("from" = Option<u64>, Query, description = "start at this revision (a cursor continues the same listing)")),
    responses((status = 200, body = RevisionList), (status = 400, body = Problem)))]
async fn list_revisions(
    State(state): State<AppState>,
    Path((domain, title)): Path<(String, String)>,
    params: Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<RevisionList>, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let (domain, title) = parse_page(&domain, &title, state.titles)?;
    let limit = params.limit.unwrap_or(DEFAULT_LIST_LIMIT);
    if !(1..=MAX_LIST_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(format!("limit {limit} is not within 1-{MAX_LIST_LIMIT}")));
    }
    let hidden = state.archive.hidden_revisions(&domain, &title).await?;
    let (rows, next) = state.archive.list(&domain, &title, params.from, limit, params.cursor).await?;
    let items = rows
        .into_iter()
        .filter(|l| !hidden.contains(&l.rev))
        .map(|l| ArchivedRevision { rev: l.rev, tid: l.tid.to_string(), rendered_at: revstore_keys::rfc3339(l.tid.time()) })
        .collect();
    Ok(Json(RevisionList { items, next }))
}

/// Every archived render of a title, as NDJSON: one bundle per line, in
/// revision order. Streamed: memory stays bounded whatever the history's size.
#[utoipa::path(get, path = "/{domain}/v1/archive/history/{title}",
    params(("domain" = String, Path), ("title" = String, Path)),
    responses((status = 200, description = "application/x-ndjson, one bundle per line"), (status = 400, body = Problem)))]
async fn history(State(state): State<AppState>, Path((domain, title)): Path<(String, String)>) -> Result<Response, ApiError> {
    let (domain, title) = parse_page(&domain, &title, state.titles)?;
    let hidden = state.archive.hidden_revisions(&domain, &title).await?;
    let mut locations = Box::pin(state.archive.locations(&domain, &title, HISTORY_PAGE));
    // The first revision before answering, so an unreachable store is a clean error.
    let first = locations.next().await.transpose()?;
    let archive = state.archive.clone();
    let lines = futures_util::stream::iter(first.map(Ok))
        .chain(locations)
        .try_filter(move |at| std::future::ready(!hidden.contains(&at.rev)))
        .and_then(move |at| history_line(archive.clone(), domain.clone(), title.clone(), at))
        // An error ends the body early (the status line is already sent): the
        // client sees a truncated stream; the cause goes to the log.
        .map_err(|e| {
            tracing::error!(service = "old-store", error = %e, "history stream stopped");
            std::io::Error::other("history stream stopped")
        });
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    Ok((StatusCode::OK, headers, Body::from_stream(lines)).into_response())
}

/// One line of a history stream: the render's bundle as JSON.
async fn history_line(archive: Archive, domain: Domain, title: Title, at: Located) -> Result<Vec<u8>, ArchiveError> {
    let entry = archive.content(&domain, &title, &at).await?;
    let parts = StoredParts::parse(&entry.content).map_err(ArchiveError::internal)?;
    let b = bundle(at.rev, &at.tid.to_string(), &parts).map_err(ArchiveError::internal)?;
    let mut line = serde_json::to_vec(&b).map_err(ArchiveError::internal)?;
    line.push(b'\n');
    Ok(line)
}

/// Every archived render of every title of the domain whose partition token
/// falls in slice K of N of the ring, as NDJSON: a line per render (title,
/// rev, tid, the parts asked for that it has, and `cursor`), a title's renders
/// in revision order, each block decoded once; then `{"done":true}` at the
/// slice's end, or `{"done":false,"cursor":…}` when `limit` renders were sent.
/// Resume with `after=<cursor>`. Suppressed revisions are left out; a stream
/// cut short by a failure ends without the `done` line.
#[utoipa::path(get, path = "/{domain}/v1/dump/history",
    params(
        ("domain" = String, Path),
        ("slice" = Option<String>, Query, description = "K/N (default 0/1: the whole domain)"),
        ("after" = Option<String>, Query, description = "a cursor from an earlier line"),
        ("limit" = Option<u64>, Query, description = "renders in this response at most"),
        ("parts" = Option<String>, Query, description = "html (default), wikitext, data-parsoid, section-offsets, comma-separated, or all")),
    responses((status = 200, description = "application/x-ndjson"), (status = 400, body = Problem), (status = 401, body = Problem)))]
async fn dump_history(
    State(state): State<AppState>,
    Path(domain): Path<String>,
    query: Result<Query<revstore_service::dump::DumpQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    use crate::history::{HistoryDump, HistoryParts};
    let (query, slice) = revstore_service::dump::DumpQuery::parse(query)?;
    let domain = Domain::parse(&domain)?;
    let parts = HistoryParts::parse(query.parts.as_deref()).map_err(ApiError::bad_request)?;
    let after = match &query.after {
        Some(cursor) => Some(HistoryDump::open_cursor(state.archive.store(), &domain, slice, cursor)?),
        None => None,
    };
    let dump = HistoryDump { domain, slice, parts, after, limit: query.limit };
    Ok(revstore_service::dump::ndjson_answer("old-store", dump.lines(state.archive.clone(), state.dumps.clone()).await?))
}

/// The query of a suppression or its lift.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
struct SuppressionQuery {
    /// When current-store recorded the change (milliseconds since the
    /// epoch): old-store records the same time, so both stores agree
    /// whatever order changes arrive in and however often one is sent again
    /// (the latest suppression and the latest lift are compared, as in
    /// current-store). Without it, old-store's own clock.
    at: Option<String>,
}

/// A change's time from its query: milliseconds since the epoch, not later
/// than [`LATEST_CHANGE_AHEAD`] past this store's clock (a time far ahead
/// would outrank every later change).
fn change_time(
    state: &AppState,
    query: Result<Query<SuppressionQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Option<i64>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let Some(at) = query.at else { return Ok(None) };
    let latest = revstore_keys::time::millis(state.archive.store().now() + LATEST_CHANGE_AHEAD);
    match at.parse::<i64>() {
        Ok(at) if (1..=latest).contains(&at) => Ok(Some(at)),
        _ => Err(ApiError::bad_request(format!(
            "at {:?} is not a time in milliseconds since the epoch, at most {} s ahead of this store's clock",
            at.chars().take(32).collect::<String>(),
            LATEST_CHANGE_AHEAD.as_secs()
        ))),
    }
}

/// How far ahead of old-store's clock a forwarded change's time may be
/// (current-store records a lift at least a millisecond after the
/// suppression it lifts, so its times can run a little ahead of any clock).
const LATEST_CHANGE_AHEAD: std::time::Duration = std::time::Duration::from_secs(3600);

/// Hide a revision: never served again (forwarded by current-store's suppression).
#[utoipa::path(post, path = "/{domain}/v1/archive/{title}/{rev}/suppress",
    params(("domain" = String, Path), ("title" = String, Path), ("rev" = u64, Path), SuppressionQuery),
    responses((status = 204), (status = 400, body = Problem), (status = 401, body = Problem)),
    security(("bearer" = [])))]
async fn suppress_revision(
    _: WriteAccess,
    State(state): State<AppState>,
    Path((domain, title, rev)): Path<(String, String, String)>,
    query: Result<Query<SuppressionQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let (domain, title) = parse_page(&domain, &title, state.titles)?;
    let (rev, at) = (RevId::parse(&rev)?, change_time(&state, query)?);
    state.archive.change_suppression(&domain, &title, rev, Change::Suppress, at).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Lift a revision's suppression: it is served again (forwarded by
/// current-store's lift). Suppressing it again hides it again.
#[utoipa::path(delete, path = "/{domain}/v1/archive/{title}/{rev}/suppress",
    params(("domain" = String, Path), ("title" = String, Path), ("rev" = u64, Path), SuppressionQuery),
    responses((status = 204), (status = 400, body = Problem), (status = 401, body = Problem)),
    security(("bearer" = [])))]
async fn lift_suppression(
    _: WriteAccess,
    State(state): State<AppState>,
    Path((domain, title, rev)): Path<(String, String, String)>,
    query: Result<Query<SuppressionQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let (domain, title) = parse_page(&domain, &title, state.titles)?;
    let (rev, at) = (RevId::parse(&rev)?, change_time(&state, query)?);
    state.archive.change_suppression(&domain, &title, rev, Change::Lift, at).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /{domain}/v1/archive/{title}`'s query.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
struct DeleteQuery {
    /// The newest revision deleted with the page.
    rev: String,
}

/// Hide every archived revision of the page up to `rev` (the page deleted;
/// forwarded by current-store's page deletion). A later deletion through a
/// newer revision wins; revisions after `rev` (the page re-created) are
/// served.
#[utoipa::path(delete, path = "/{domain}/v1/archive/{title}",
    params(("domain" = String, Path), ("title" = String, Path), DeleteQuery),
    responses((status = 204), (status = 400, body = Problem), (status = 401, body = Problem)),
    security(("bearer" = [])))]
async fn delete_page(
    _: WriteAccess,
    State(state): State<AppState>,
    Path((domain, title)): Path<(String, String)>,
    query: Result<Query<DeleteQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let (domain, title) = parse_page(&domain, &title, state.titles)?;
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    state.archive.delete_page(&domain, &title, RevId::parse(&query.rev)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The compactor's state: what this replica has queued, and what the last
/// sweep of the debt table (shared by all replicas) found.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct CompactionStatus {
    /// Blocks in this replica's queue, waiting or settling.
    pub pending: usize,
    /// Whether this replica is compacting a block now.
    pub compacting: bool,
    /// The last sweep's report; absent until the first sweep has finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_sweep: Option<SweepReport>,
}

/// The compaction queue and the debt the last sweep found (for the janitor and operators).
#[utoipa::path(get, path = "/admin/compaction",
    responses((status = 200, body = CompactionStatus), (status = 401, body = Problem), (status = 403, body = Problem)),
    security(("bearer" = [])))]
async fn compaction_status(_: WriteAccess, State(state): State<AppState>) -> Json<CompactionStatus> {
    let queue = state.archive.queue();
    Json(CompactionStatus { pending: queue.pending(), compacting: queue.compacting(), last_sweep: state.debt.last_sweep() })
}

/// Sweep the compaction debt table now: every block still owed a seal-level
/// compaction goes into this replica's queue. Answers when the sweep is done.
#[utoipa::path(post, path = "/admin/compaction/sweep",
    responses((status = 200, body = SweepReport), (status = 401, body = Problem), (status = 403, body = Problem), (status = 503, body = Problem)),
    security(("bearer" = [])))]
async fn sweep_compaction_debt(_: WriteAccess, State(state): State<AppState>) -> Result<Json<SweepReport>, ApiError> {
    Ok(Json(state.debt.sweep().await?))
}
