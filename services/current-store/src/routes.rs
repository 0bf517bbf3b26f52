//! current-store's HTTP API (the contract in the architecture brief).
//!
//! Several contract paths have the same shape with different meanings at each
//! position (`/page/{title}/{rev}/{tid}` for writes, `/page/{part}/{title}/{rev}`
//! for reads), which one router cannot hold under different parameter names.
//! The router therefore names positions neutrally and each handler reads them
//! as its route means them; the OpenAPI document describes every route with its
//! real parameter names.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRef, MatchedPath, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use revstore_api::{ArchiveBody, Bundle, Part, Selection, paths};
use revstore_client::{ClientError, OldStoreClient};
use revstore_keys::{Domain, RevId, Tid, Title, TitleRules, parse_page};
use revstore_service::problem::Problem;
use revstore_service::{Access, ApiError, Platform, Routes, WriteAccess};
use utoipa::OpenApi;

use crate::dump::{Dump, DumpParts};
use crate::outbox::{self, DeadLetter, DeadLetterCursor};
use crate::pages::{Found, HeldRender, Pages, Preconditions, rendered_at};
use crate::render::{RenderBody, RenderId, SERVED, column, columns, decode_part};
use revstore_service::dump::{DumpPacer, DumpQuery, ndjson_answer};

#[derive(Debug, Clone)]
pub struct AppState {
    pub platform: Platform,
    pub pages: Pages,
    pub titles: TitleRules,
    /// Where revisions no longer held here are fetched from.
    pub old_store: Option<OldStoreClient>,
    /// The pace all dumps of this replica share.
    pub dumps: std::sync::Arc<DumpPacer>,
}

impl FromRef<AppState> for Access {
    fn from_ref(state: &AppState) -> Access {
        state.platform.access().clone()
    }
}

const PAGE: &str = "/{domain}/v1/page";

/// The service's routes, given their state.
pub fn routes(state: AppState) -> Routes {
    Routes::new()
        .route(&format!("{PAGE}/{{part_or_title}}/{{title_or_rev}}/{{rev_or_tid}}"), get(get_render_of_rev).put(put_render))
        .route(&format!("{PAGE}/{{part_or_title}}/{{title_or_rev}}/{{rev_or_tid}}/{{tid}}"), get(get_render_of_tid))
        .route(&format!("{PAGE}/{{part_or_title}}/{{title_or_rev}}"), get(get_latest).post(post_render))
        .route(&format!("{PAGE}/{{part_or_title}}"), delete(delete_page))
        // A static segment wins over a parameter, so pages named `title` and
        // `revisions` are written through these two routes' POST.
        .route(&format!("{PAGE}/title/{{title_or_rev}}"), get(title_metadata).post(post_render_of_static_page))
        .route(&format!("{PAGE}/revisions/{{title_or_rev}}"), get(list_revisions).post(post_render_of_static_page))
        .route(&format!("{PAGE}/{{part_or_title}}/{{title_or_rev}}/suppress"), post(suppress_revision).delete(lift_suppression))
        .route("/{domain}/v1/dump/current", get(dump_current))
        .route(DEAD_LETTERS, get(list_dead_letters))
        .route(&format!("{DEAD_LETTERS}/redrive"), post(redrive_dead_letters))
        .route(&format!("{DEAD_LETTERS}/{{shard}}/{{id}}/redrive"), post(redrive_dead_letter))
        .with_state(state)
}

/// The admin routes of the outbox's dead letters.
const DEAD_LETTERS: &str = "/admin/outbox/dead-letters";

#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "revstore current-store",
        description = "The latest render of every page; superseded renders stay retrievable for the grace TTL."
    ),
    paths(
        put_render,
        post_render,
        get_latest,
        get_render_of_rev,
        get_render_of_tid,
        title_metadata,
        list_revisions,
        delete_page,
        suppress_revision,
        lift_suppression,
        dump_current,
        list_dead_letters,
        redrive_dead_letters,
        redrive_dead_letter
    ),
    components(schemas(RenderBody, TitleMetadata, HeldRender, RevisionList, DeadLetterList, DeadLetter, Redriven, Problem))
)]
pub struct ApiDoc;

fn part(s: &str) -> Result<Selection, ApiError> {
    Selection::parse(s, &SERVED).ok_or_else(|| ApiError::not_found(format!("no part {s:?}: {}", Selection::choices(&SERVED))))
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn preconditions(headers: &HeaderMap) -> Result<Preconditions, ApiError> {
    let if_unmodified_since = match header_str(headers, header::IF_UNMODIFIED_SINCE) {
        Some(date) => Some(
            httpdate::parse_http_date(date)
                .map_err(|_| ApiError::bad_request(format!("If-Unmodified-Since {date:?} is not an HTTP date")))?,
        ),
        None => None,
    };
    Ok(Preconditions { if_match: header_str(headers, header::IF_MATCH).map(str::to_owned), if_unmodified_since })
}

/// A render part as an HTTP response, honouring `If-None-Match`.
fn serve_part(found: &Found, selection: Selection, request: &HeaderMap, cache_control: &'static str) -> Result<Response, ApiError> {
    let etag = found.id.etag();
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, HeaderValue::from_str(&etag).map_err(ApiError::internal)?);
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache_control));
    if revstore_service::not_modified(request, &etag) {
        return Ok((StatusCode::NOT_MODIFIED, headers).into_response());
    }
    let decoded = |part: Part| -> Result<Vec<u8>, ApiError> {
        let column = column(part).ok_or_else(|| ApiError::not_found(format!("current-store holds no {}", part.name())))?;
        let stored = found.row.blob(column).ok_or_else(|| ApiError::internal(format!("render {etag} has no {column}")))?;
        Ok(decode_part(stored, part.name())?)
    };
    let body: Vec<u8> = match selection {
        Selection::Part(part) => decoded(part)?,
        Selection::Bundle => {
            let json = |part: Part| -> Result<serde_json::Value, ApiError> {
                serde_json::from_slice(&decoded(part)?).map_err(|e| ApiError::internal(format!("stored {} is not JSON: {e}", part.name())))
            };
            let html = String::from_utf8(decoded(Part::Html)?).map_err(|e| ApiError::internal(format!("stored html is not UTF-8: {e}")))?;
            let parts = ArchiveBody {
                html: Some(html),
                data_parsoid: Some(json(Part::DataParsoid)?),
                section_offsets: Some(json(Part::SectionOffsets)?),
                wikitext: None,
                page: None,
            };
            serde_json::to_vec(&Bundle { rev: found.id.rev.get(), tid: found.id.tid.to_string(), parts }).map_err(ApiError::internal)?
        }
    };
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(selection.content_type()));
    Ok((StatusCode::OK, headers, body).into_response())
}

/// The latest render may change at any moment: caches must revalidate (cheap with the ETag).
const LATEST_CACHE: &str = "max-age=0, must-revalidate";
/// A given render never changes; it can only be hidden, so caches keep it a day.
const FIXED_CACHE: &str = "max-age=86400";

/// Fetches a revision from old-store; `Ok(None)` when old-store does not have it either.
async fn from_old_store(
    state: &AppState,
    domain: &Domain,
    title: &Title,
    selection: Selection,
    rev: RevId,
    tid: Option<Tid>,
) -> Result<Option<Response>, ApiError> {
    let Some(old) = &state.old_store else { return Ok(None) };
    let tid = tid.map(|t| t.to_string());
    match old.read(domain.as_str(), selection, title.as_str(), rev.get(), tid.as_deref()).await {
        Ok(Some(answer)) => {
            let mut headers = HeaderMap::new();
            for name in [header::CONTENT_TYPE, header::ETAG] {
                if let Some(v) = answer.headers.get(&name) {
                    headers.insert(name, v.clone());
                }
            }
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(FIXED_CACHE));
            Ok(Some((StatusCode::OK, headers, answer.body).into_response()))
        }
        Ok(None) => Ok(None),
        // A refusal (a 4xx for a request old-store will never answer) means
        // old-store does not have it: not found, as if never archived.
        Err(e) if e.status().is_some_and(|s| s.is_client_error()) => {
            tracing::debug!(error = %e, "old-store refused the fallback read");
            Ok(None)
        }
        Err(e @ (ClientError::Status { .. } | ClientError::Transport { .. } | ClientError::Decode { .. })) => {
            Err(ApiError::dependency_unavailable("old-store", e))
        }
        Err(e) => Err(ApiError::internal(e)),
    }
}

#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
struct TitleMetadata {
    domain: String,
    title: String,
    rev: u64,
    tid: String,
    rendered_at: String,
}

#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
struct RevisionList {
    items: Vec<HeldRender>,
    next: Option<String>,
}

#[derive(Debug, serde::Serialize)]
struct Stored {
    rev: u64,
    tid: String,
    stored: bool,
}

/// A stored render's answer: 201, the same for a repeated write of the same
/// render (the write does not read what is there).
fn written(domain: &Domain, title: &Title, id: RenderId) -> Result<Response, ApiError> {
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, HeaderValue::from_str(&id.etag()).map_err(ApiError::internal)?);
    let location = paths::page_render(domain.as_str(), Selection::Part(Part::Html), title.as_str(), id.rev.get(), &id.tid.to_string());
    headers.insert(header::LOCATION, HeaderValue::from_str(&location).map_err(ApiError::internal)?);
    let body = Stored { rev: id.rev.get(), tid: id.tid.to_string(), stored: true };
    Ok((StatusCode::CREATED, headers, Json(body)).into_response())
}

/// Store a render with the renderer's tid (idempotent: a repeated write answers
/// 201 as the first did). A render of a revision deleted with the page or
/// suppressed, or another body under a stored (rev, tid), is refused (409)
/// and nothing of it is stored.
#[utoipa::path(put, path = "/{domain}/v1/page/{title}/{rev}/{tid}", request_body = RenderBody,
    params(("domain" = String, Path), ("title" = String, Path, description = "percent-encoded"), ("rev" = u64, Path), ("tid" = String, Path, description = "time-based UUID"),
        ("If-Match" = Option<String>, Header, description = "ETag of the latest render this one is based on"),
        ("If-Unmodified-Since" = Option<String>, Header, description = "no render of the page may be newer")),
    responses((status = 201, description = "stored (also when the same render was stored before); ETag \"rev/tid\""),
        (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 409, body = Problem, description = "not stored: the revision was deleted with the page (page-deleted) or is suppressed (revision-suppressed), or another body is stored under this rev and tid (render-conflict)"),
        (status = 412, body = Problem)),
    security(("bearer" = [])))]
async fn put_render(
    _: WriteAccess,
    State(state): State<AppState>,
    Path((domain, title, rev, tid)): Path<(String, String, String, String)>,
    headers: HeaderMap,
    Json(body): Json<RenderBody>,
) -> Result<Response, ApiError> {
    let (domain, title) = parse_page(&domain, &title, state.titles)?;
    let id = RenderId { rev: RevId::parse(&rev)?, tid: Tid::parse(&tid)? };
    state.pages.put(&domain, &title, id, &body, &preconditions(&headers)?).await?;
    written(&domain, &title, id)
}

/// Store a render; the service assigns its tid.
#[utoipa::path(post, path = "/{domain}/v1/page/{title}/{rev}", request_body = RenderBody,
    params(("domain" = String, Path), ("title" = String, Path), ("rev" = u64, Path)),
    responses((status = 201, description = "stored; ETag and Location name the render"), (status = 400, body = Problem), (status = 401, body = Problem),
        (status = 403, body = Problem),
        (status = 409, body = Problem, description = "not stored: the revision was deleted with the page (page-deleted) or is suppressed (revision-suppressed)"),
        (status = 412, body = Problem)),
    security(("bearer" = [])))]
async fn post_render(
    _: WriteAccess,
    State(state): State<AppState>,
    Path((domain, title, rev)): Path<(String, String, String)>,
    headers: HeaderMap,
    Json(body): Json<RenderBody>,
) -> Result<Response, ApiError> {
    let (domain, title) = parse_page(&domain, &title, state.titles)?;
    let id = RenderId { rev: RevId::parse(&rev)?, tid: Tid::now() };
    state.pages.put(&domain, &title, id, &body, &preconditions(&headers)?).await?;
    written(&domain, &title, id)
}

/// `POST /{domain}/v1/page/title/{rev}` and `…/page/revisions/{rev}`: a render
/// of the page named `title` or `revisions`, the static segment of the route.
async fn post_render_of_static_page(
    access: WriteAccess,
    state: State<AppState>,
    route: MatchedPath,
    Path((domain, rev)): Path<(String, String)>,
    headers: HeaderMap,
    body: Json<RenderBody>,
) -> Result<Response, ApiError> {
    let page = route.as_str().strip_prefix(PAGE).and_then(|rest| rest.split('/').nth(1)).unwrap_or_default().to_owned();
    post_render(access, state, Path((domain, page, rev)), headers, body).await
}

/// The latest render of the latest revision.
#[utoipa::path(get, path = "/{domain}/v1/page/{part}/{title}",
    params(("domain" = String, Path), ("part" = String, Path, description = "html, data-parsoid, section-offsets or bundle"), ("title" = String, Path)),
    responses((status = 200, description = "the part; ETag \"rev/tid\""), (status = 304), (status = 404, body = Problem)))]
async fn get_latest(
    State(state): State<AppState>,
    Path((domain, part_name, title)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let part = part(&part_name)?;
    let (domain, title) = parse_page(&domain, &title, state.titles)?;
    match state.pages.latest(&domain, &title, columns(part)).await? {
        Some(found) => serve_part(&found, part, &headers, LATEST_CACHE),
        None => Err(ApiError::not_found(format!("no render of {title} on {domain}"))),
    }
}

/// The latest render of a revision.
#[utoipa::path(get, path = "/{domain}/v1/page/{part}/{title}/{rev}",
    params(("domain" = String, Path), ("part" = String, Path), ("title" = String, Path), ("rev" = u64, Path)),
    responses((status = 200, description = "the part"), (status = 304), (status = 404, body = Problem)))]
async fn get_render_of_rev(
    State(state): State<AppState>,
    Path((domain, part_name, title, rev)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let part = part(&part_name)?;
    let (domain, title) = parse_page(&domain, &title, state.titles)?;
    let rev = RevId::parse(&rev)?;
    if let Some(found) = state.pages.of_rev(&domain, &title, rev, columns(part)).await? {
        return serve_part(&found, part, &headers, FIXED_CACHE);
    }
    if state.pages.hides(&domain, &title, rev).await? {
        return Err(ApiError::not_found(format!("no render of revision {rev} of {title}")));
    }
    match from_old_store(&state, &domain, &title, part, rev, None).await? {
        Some(response) => Ok(response),
        None => Err(ApiError::not_found(format!("no render of revision {rev} of {title}"))),
    }
}

/// A given render of a revision.
#[utoipa::path(get, path = "/{domain}/v1/page/{part}/{title}/{rev}/{tid}",
    params(("domain" = String, Path), ("part" = String, Path), ("title" = String, Path), ("rev" = u64, Path), ("tid" = String, Path)),
    responses((status = 200, description = "the part"), (status = 304), (status = 404, body = Problem)))]
async fn get_render_of_tid(
    State(state): State<AppState>,
    Path((domain, part_name, title, rev, tid)): Path<(String, String, String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let part = part(&part_name)?;
    let (domain, title) = parse_page(&domain, &title, state.titles)?;
    let (rev, tid) = (RevId::parse(&rev)?, Tid::parse(&tid)?);
    if let Some(found) = state.pages.of_tid(&domain, &title, rev, tid, columns(part)).await? {
        return serve_part(&found, part, &headers, FIXED_CACHE);
    }
    if state.pages.hides(&domain, &title, rev).await? {
        return Err(ApiError::not_found(format!("no render {tid} of revision {rev} of {title}")));
    }
    match from_old_store(&state, &domain, &title, part, rev, Some(tid)).await? {
        Some(response) => Ok(response),
        None => Err(ApiError::not_found(format!("no render {tid} of revision {rev} of {title}"))),
    }
}

/// Metadata of the latest render.
#[utoipa::path(get, path = "/{domain}/v1/page/title/{title}",
    params(("domain" = String, Path), ("title" = String, Path)),
    responses((status = 200, body = TitleMetadata), (status = 404, body = Problem)))]
async fn title_metadata(
    State(state): State<AppState>,
    Path((domain, title)): Path<(String, String)>,
) -> Result<Json<TitleMetadata>, ApiError> {
    let (domain, title) = parse_page(&domain, &title, state.titles)?;
    let found = state
        .pages
        .latest(&domain, &title, &["tid"])
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no render of {title} on {domain}")))?;
    Ok(Json(TitleMetadata {
        domain: domain.to_string(),
        title: title.to_string(),
        rev: found.id.rev.get(),
        tid: found.id.tid.to_string(),
        rendered_at: rendered_at(found.id.tid),
    }))
}

/// The revisions and renders current-store holds for a title, newest first.
#[utoipa::path(get, path = "/{domain}/v1/page/revisions/{title}",
    params(("domain" = String, Path), ("title" = String, Path)),
    responses((status = 200, body = RevisionList)))]
async fn list_revisions(
    State(state): State<AppState>,
    Path((domain, title)): Path<(String, String)>,
) -> Result<Json<RevisionList>, ApiError> {
    let (domain, title) = parse_page(&domain, &title, state.titles)?;
    // A title holds a handful of renders (the latest, and those within the grace period): one page.
    Ok(Json(RevisionList { items: state.pages.held(&domain, &title).await?, next: None }))
}

/// `DELETE /{domain}/v1/page/{title}`'s query.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
struct DeleteQuery {
    /// The page's newest revision as the wiki knows it: the page is deleted
    /// through it even when current-store holds no render of it yet.
    rev: Option<String>,
}

/// Delete the page through its newest revision (the one given as `rev`, or,
/// without it, the newest held here): none of those revisions is served
/// again, by any route or through old-store, and their renders are refused
/// (409) from then on, whenever they arrive. The render of a newer revision
/// re-creates the page, also one written while the deletion was in flight or
/// before a retried deletion arrived.
#[utoipa::path(delete, path = "/{domain}/v1/page/{title}",
    params(("domain" = String, Path), ("title" = String, Path), DeleteQuery),
    responses((status = 204), (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem)),
    security(("bearer" = [])))]
async fn delete_page(
    _: WriteAccess,
    State(state): State<AppState>,
    Path((domain, title)): Path<(String, String)>,
    query: Result<Query<DeleteQuery>, QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let (domain, title) = parse_page(&domain, &title, state.titles)?;
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let through = query.rev.as_deref().map(RevId::parse).transpose()?;
    state.pages.delete(&domain, &title, through).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Hide a revision everywhere: never served again, here or through
/// old-store, and its renders refused (409), until the suppression is lifted.
#[utoipa::path(post, path = "/{domain}/v1/page/{title}/{rev}/suppress",
    params(("domain" = String, Path), ("title" = String, Path), ("rev" = u64, Path)),
    responses((status = 204), (status = 401, body = Problem), (status = 403, body = Problem)),
    security(("bearer" = [])))]
async fn suppress_revision(
    _: WriteAccess,
    State(state): State<AppState>,
    Path((domain, title, rev)): Path<(String, String, String)>,
) -> Result<StatusCode, ApiError> {
    let (domain, title) = parse_page(&domain, &title, state.titles)?;
    state.pages.suppress(&domain, &title, RevId::parse(&rev)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Lift a revision's suppression, here and in old-store: its renders are
/// stored and served again (those the suppression removed are read from
/// old-store). Suppressing it again afterwards hides it again.
#[utoipa::path(delete, path = "/{domain}/v1/page/{title}/{rev}/suppress",
    params(("domain" = String, Path), ("title" = String, Path), ("rev" = u64, Path)),
    responses((status = 204), (status = 401, body = Problem), (status = 403, body = Problem)),
    security(("bearer" = [])))]
async fn lift_suppression(
    _: WriteAccess,
    State(state): State<AppState>,
    Path((domain, title, rev)): Path<(String, String, String)>,
) -> Result<StatusCode, ApiError> {
    let (domain, title) = parse_page(&domain, &title, state.titles)?;
    state.pages.lift_suppression(&domain, &title, RevId::parse(&rev)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
struct DeadLetterList {
    items: Vec<DeadLetter>,
    /// Pass back as `cursor` for the next page; `null` at the end.
    next: Option<String>,
}

/// The latest render of every page of the domain whose partition token falls
/// in slice K of N of the ring, as NDJSON: a line per page (title, rev, tid,
/// rendered_at, the parts asked for, and `cursor`), then `{"done":true}` at
/// the slice's end, or `{"done":false,"cursor":…}` when `limit` pages were
/// sent. Resume with `after=<cursor>`: no page twice, none missed. Deleted
/// and suppressed renders are left out. A stream cut short by a failure ends
/// without the `done` line.
#[utoipa::path(get, path = "/{domain}/v1/dump/current",
    params(
        ("domain" = String, Path),
        ("slice" = Option<String>, Query, description = "K/N (default 0/1: the whole domain)"),
        ("after" = Option<String>, Query, description = "a cursor from an earlier line"),
        ("limit" = Option<u64>, Query, description = "pages in this response at most"),
        ("parts" = Option<String>, Query, description = "html (default), data-parsoid, section-offsets, comma-separated, or all")),
    responses((status = 200, description = "application/x-ndjson"), (status = 400, body = Problem), (status = 401, body = Problem)))]
async fn dump_current(
    State(state): State<AppState>,
    Path(domain): Path<String>,
    query: Result<Query<DumpQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (query, slice) = DumpQuery::parse(query)?;
    let domain = Domain::parse(&domain)?;
    let parts = DumpParts::parse(query.parts.as_deref()).map_err(ApiError::bad_request)?;
    let after = match &query.after {
        Some(cursor) => Some(Dump::open_cursor(&state.pages.store, &domain, slice, cursor)?),
        None => None,
    };
    let dump = Dump { domain, slice, parts, after, limit: query.limit };
    Ok(ndjson_answer("current-store", dump.lines(state.pages.clone(), state.dumps.clone()).await?))
}

#[derive(Debug, serde::Deserialize)]
struct DeadLetterQuery {
    limit: Option<u32>,
    cursor: Option<String>,
}

#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
struct Redriven {
    /// How many dead letters went back into the outbox.
    redriven: usize,
}

const DEFAULT_DEAD_LETTER_LIMIT: u32 = 100;
const MAX_DEAD_LETTER_LIMIT: u32 = 1000;

fn dead_letter_limit(limit: Option<u32>) -> Result<u32, ApiError> {
    match limit.unwrap_or(DEFAULT_DEAD_LETTER_LIMIT) {
        n @ 1..=MAX_DEAD_LETTER_LIMIT => Ok(n),
        n => Err(ApiError::bad_request(format!("limit {n} is not within 1-{MAX_DEAD_LETTER_LIMIT}"))),
    }
}

/// Outbox deliveries the receiver refused for good, oldest first per shard.
#[utoipa::path(get, path = "/admin/outbox/dead-letters",
    params(("limit" = Option<u32>, Query, minimum = 1, maximum = 1000), ("cursor" = Option<String>, Query)),
    responses((status = 200, body = DeadLetterList), (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem)),
    security(("bearer" = [])))]
async fn list_dead_letters(
    _: WriteAccess,
    State(state): State<AppState>,
    query: Result<Query<DeadLetterQuery>, QueryRejection>,
) -> Result<Json<DeadLetterList>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let limit = dead_letter_limit(query.limit)?;
    let from = match &query.cursor {
        Some(text) => Some(
            DeadLetterCursor::parse(text, outbox::all_shards(state.pages.store.site()))
                .ok_or_else(|| ApiError::bad_request("cursor: not one this service gave"))?,
        ),
        None => None,
    };
    let (items, next) = outbox::dead_letters(&state.pages.store, from, limit).await?;
    Ok(Json(DeadLetterList { items, next: next.map(|c| c.render()) }))
}

/// Put up to `limit` dead letters back into the outbox, to be delivered again in their original order.
#[utoipa::path(post, path = "/admin/outbox/dead-letters/redrive",
    params(("limit" = Option<u32>, Query, minimum = 1, maximum = 1000)),
    responses((status = 200, body = Redriven), (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem)),
    security(("bearer" = [])))]
async fn redrive_dead_letters(
    _: WriteAccess,
    State(state): State<AppState>,
    query: Result<Query<DeadLetterQuery>, QueryRejection>,
) -> Result<Json<Redriven>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let limit = dead_letter_limit(query.limit)?;
    Ok(Json(Redriven { redriven: outbox::redrive(&state.pages.store, None, limit).await? }))
}

/// Put one dead letter back into the outbox.
#[utoipa::path(post, path = "/admin/outbox/dead-letters/{shard}/{id}/redrive",
    params(("shard" = u32, Path, minimum = 0, description = "0-15 for the first site's outbox, 16-31 for the second's, and so on"), ("id" = String, Path, description = "the dead letter's id (a time-based UUID)")),
    responses((status = 200, body = Redriven), (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem), (status = 404, body = Problem)),
    security(("bearer" = [])))]
async fn redrive_dead_letter(
    _: WriteAccess,
    State(state): State<AppState>,
    Path((shard, id)): Path<(String, String)>,
) -> Result<Json<Redriven>, ApiError> {
    let shards = outbox::all_shards(state.pages.store.site());
    let shard = shard
        .parse::<i64>()
        .ok()
        .filter(|s| shards.contains(s))
        .ok_or_else(|| ApiError::bad_request(format!("shard must be {}-{}", shards.start, shards.end - 1)))?;
    let id = Tid::parse(&id)?.uuid();
    match outbox::redrive(&state.pages.store, Some((shard, id)), 1).await? {
        0 => Err(ApiError::not_found(format!("no dead letter {id} in shard {shard}"))),
        redriven => Ok(Json(Redriven { redriven })),
    }
}
