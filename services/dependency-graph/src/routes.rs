//! The HTTP API of the dependency graph (routes under `/{domain}/v1`).

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRef, Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use revstore_api::ChangeNotice;
use revstore_api::graph::{
    Dependency, DependencyList, Dependent, DependentList, EdgeSet, MAX_PRIORITY, Pending, Replaced, UpdatedAnswer, UpdatedBody,
};
use revstore_keys::{TitleRules, parse_page};
use revstore_service::problem::Problem;
use revstore_service::{Access, ApiError, Platform, Routes, WriteAccess};
use utoipa::OpenApi;

use crate::consistency::{ConsistencyStep, Direction, OneSidedEdge};
use crate::graph::{DependentsQuery, Graph};

const DEFAULT_LIST_LIMIT: u32 = 1000;
/// Large pages make a walk through millions of dependents cheap per edge.
const MAX_LIST_LIMIT: u32 = 10_000;

#[derive(Debug, Clone)]
pub struct AppState {
    pub platform: Platform,
    pub graph: Graph,
    pub titles: TitleRules,
    /// Priorities at or above it are push (`?push=true`), below pull.
    pub push_priority: i64,
}

impl FromRef<AppState> for Access {
    fn from_ref(state: &AppState) -> Access {
        state.platform.access().clone()
    }
}

/// The service's routes, given their state.
pub fn routes(state: AppState) -> Routes {
    Routes::new()
        .route("/{domain}/v1/deps/{child}", get(list_dependencies).put(replace_dependencies).delete(remove_page))
        .route("/{domain}/v1/dependents/{parent}", get(list_dependents))
        .route("/{domain}/v1/changes", post(record_change))
        .route("/{domain}/v1/pending/{child}", get(pending))
        .route("/{domain}/v1/updated/{child}", post(mark_updated))
        .route("/admin/graph/consistency", get(check_consistency))
        .with_state(state)
}

#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "revstore dependency-graph",
        description = "The page/template dependency graph as adjacency lists, with push/pull change propagation."
    ),
    paths(replace_dependencies, list_dependencies, remove_page, list_dependents, record_change, pending, mark_updated, check_consistency),
    components(schemas(
        ConsistencyStep,
        OneSidedEdge,
        Direction,
        EdgeSet,
        Replaced,
        Dependency,
        DependencyList,
        Dependent,
        DependentList,
        ChangeNotice,
        Pending,
        UpdatedBody,
        UpdatedAnswer,
        Problem
    ))
)]
pub struct ApiDoc;

fn limit(limit: Option<u32>) -> Result<u32, ApiError> {
    let limit = limit.unwrap_or(DEFAULT_LIST_LIMIT);
    if !(1..=MAX_LIST_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(format!("limit {limit} is not within 1-{MAX_LIST_LIMIT}")));
    }
    Ok(limit)
}

/// Replace a page's dependency set (on each re-render): only the difference
/// with what is stored is written; the same set twice writes nothing.
#[utoipa::path(put, path = "/{domain}/v1/deps/{child}", request_body = EdgeSet,
    params(("domain" = String, Path), ("child" = String, Path, description = "the page's title")),
    responses((status = 200, body = Replaced), (status = 400, body = Problem), (status = 401, body = Problem),
        (status = 403, body = Problem), (status = 413, body = Problem)),
    security(("bearer" = [])))]
async fn replace_dependencies(
    _: WriteAccess,
    State(state): State<AppState>,
    Path((domain, child)): Path<(String, String)>,
    Json(set): Json<EdgeSet>,
) -> Result<Json<Replaced>, ApiError> {
    let (domain, child) = parse_page(&domain, &child, state.titles)?;
    Ok(Json(state.graph.replace(&domain, &child, &set.edges, state.titles).await?))
}

#[derive(Debug, serde::Deserialize)]
struct PageParams {
    limit: Option<u32>,
    cursor: Option<String>,
}

/// What a page depends on, priority descending.
#[utoipa::path(get, path = "/{domain}/v1/deps/{child}",
    params(("domain" = String, Path), ("child" = String, Path),
        ("limit" = Option<u32>, Query, description = "1-10000, default 1000"), ("cursor" = Option<String>, Query)),
    responses((status = 200, body = DependencyList), (status = 400, body = Problem)))]
async fn list_dependencies(
    State(state): State<AppState>,
    Path((domain, child)): Path<(String, String)>,
    params: Result<Query<PageParams>, QueryRejection>,
) -> Result<Json<DependencyList>, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let (domain, child) = parse_page(&domain, &child, state.titles)?;
    Ok(Json(state.graph.dependencies(&domain, &child, limit(params.limit)?, params.cursor).await?))
}

/// Remove a page's dependencies from the graph, in both directions (its
/// dependents keep theirs: record an `existence` change so they learn of it).
#[utoipa::path(delete, path = "/{domain}/v1/deps/{child}",
    params(("domain" = String, Path), ("child" = String, Path)),
    responses((status = 204), (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem)),
    security(("bearer" = [])))]
async fn remove_page(
    _: WriteAccess,
    State(state): State<AppState>,
    Path((domain, child)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let (domain, child) = parse_page(&domain, &child, state.titles)?;
    state.graph.remove_page(&domain, &child).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, serde::Deserialize)]
struct DependentsParams {
    #[serde(rename = "type")]
    kind: Option<String>,
    min_priority: Option<i64>,
    max_priority: Option<i64>,
    push: Option<bool>,
    limit: Option<u32>,
    cursor: Option<String>,
}

/// What depends on a page, for one type, priority descending (push first).
/// `push=true` keeps the priorities at or above the push threshold,
/// `push=false` those below it.
#[utoipa::path(get, path = "/{domain}/v1/dependents/{parent}",
    params(("domain" = String, Path), ("parent" = String, Path),
        ("type" = Option<String>, Query, description = "modification (default) or existence"),
        ("min_priority" = Option<i64>, Query, description = "0-1000"), ("max_priority" = Option<i64>, Query, description = "0-1000"),
        ("push" = Option<bool>, Query, description = "only push (true) or only pull (false) priorities"),
        ("limit" = Option<u32>, Query, description = "1-10000, default 1000"), ("cursor" = Option<String>, Query)),
    responses((status = 200, body = DependentList), (status = 400, body = Problem)))]
async fn list_dependents(
    State(state): State<AppState>,
    Path((domain, parent)): Path<(String, String)>,
    params: Result<Query<DependentsParams>, QueryRejection>,
) -> Result<Json<DependentList>, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let (domain, parent) = parse_page(&domain, &parent, state.titles)?;
    let kind = match params.kind.as_deref() {
        None | Some("modification") => revstore_api::ChangeKind::Modification,
        Some("existence") => revstore_api::ChangeKind::Existence,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "type {:?} is not modification or existence",
                other.chars().take(40).collect::<String>()
            )));
        }
    };
    let mut min_priority = params.min_priority.unwrap_or(0);
    let mut max_priority = params.max_priority.unwrap_or(MAX_PRIORITY);
    for (name, value) in [("min_priority", min_priority), ("max_priority", max_priority)] {
        if !(0..=MAX_PRIORITY).contains(&value) {
            return Err(ApiError::bad_request(format!("{name} {value} is not within 0-{MAX_PRIORITY}")));
        }
    }
    match params.push {
        Some(true) => min_priority = min_priority.max(state.push_priority),
        Some(false) => max_priority = max_priority.min(state.push_priority - 1),
        None => {}
    }
    if min_priority > max_priority {
        return Ok(Json(DependentList { items: Vec::new(), next: None }));
    }
    let query = DependentsQuery { kind, min_priority, max_priority, limit: limit(params.limit)?, cursor: params.cursor };
    Ok(Json(state.graph.dependents(&domain, &parent, query).await?))
}

/// Record a change of a page: one write, whatever the number of its
/// dependents. Push consumers then list the dependents above the push
/// threshold; the others find the change in their pull check.
#[utoipa::path(post, path = "/{domain}/v1/changes", request_body = ChangeNotice,
    params(("domain" = String, Path)),
    responses((status = 204), (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem)),
    security(("bearer" = [])))]
async fn record_change(
    _: WriteAccess,
    State(state): State<AppState>,
    Path(domain): Path<String>,
    Json(notice): Json<ChangeNotice>,
) -> Result<StatusCode, ApiError> {
    let domain = revstore_keys::Domain::parse(&domain)?;
    state.graph.record_change(&domain, &notice, state.titles).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The pull check: is anything the page depends on newer than its last
/// update, and which of its dependencies, priority ascending (pull first).
/// Paged like the listings: `next` when more stale items follow.
#[utoipa::path(get, path = "/{domain}/v1/pending/{child}",
    params(("domain" = String, Path), ("child" = String, Path),
        ("limit" = Option<u32>, Query, description = "1-10000, default 1000"), ("cursor" = Option<String>, Query)),
    responses((status = 200, body = Pending), (status = 400, body = Problem)))]
async fn pending(
    State(state): State<AppState>,
    Path((domain, child)): Path<(String, String)>,
    params: Result<Query<PageParams>, QueryRejection>,
) -> Result<Json<Pending>, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let (domain, child) = parse_page(&domain, &child, state.titles)?;
    Ok(Json(state.graph.pending(&domain, &child, limit(params.limit)?, params.cursor).await?))
}

/// Mark a page updated by a render made at `at`: every dependency for a full
/// render, or those whose child fragments `selectors` covers.
#[utoipa::path(post, path = "/{domain}/v1/updated/{child}", request_body = UpdatedBody,
    params(("domain" = String, Path), ("child" = String, Path)),
    responses((status = 200, body = UpdatedAnswer), (status = 400, body = Problem), (status = 401, body = Problem),
        (status = 403, body = Problem)),
    security(("bearer" = [])))]
async fn mark_updated(
    _: WriteAccess,
    State(state): State<AppState>,
    Path((domain, child)): Path<(String, String)>,
    Json(body): Json<UpdatedBody>,
) -> Result<Json<UpdatedAnswer>, ApiError> {
    let (domain, child) = parse_page(&domain, &child, state.titles)?;
    let updated = state.graph.mark_updated(&domain, &child, &body.at, body.selectors.as_deref()).await?;
    Ok(Json(UpdatedAnswer { updated }))
}

#[derive(Debug, serde::Deserialize)]
struct ConsistencyParams {
    direction: Direction,
    after: Option<String>,
    limit: Option<u32>,
}

/// One bounded step of the check of the graph's two directions against each
/// other (the janitor's): up to `limit` partitions (1-1000, default 100) of
/// the `direction` table from `after`, each edge looked up in the other table.
#[utoipa::path(get, path = "/admin/graph/consistency",
    params(("direction" = Direction, Query), ("after" = Option<String>, Query, description = "the `next` of the previous step"),
        ("limit" = Option<u32>, Query, description = "partitions, 1-1000, default 100")),
    responses((status = 200, body = ConsistencyStep), (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem)),
    security(("bearer" = [])))]
async fn check_consistency(
    _: WriteAccess,
    State(state): State<AppState>,
    params: Result<Query<ConsistencyParams>, QueryRejection>,
) -> Result<Json<ConsistencyStep>, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let limit = params.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request(format!("limit {limit} is not within 1-1000")));
    }
    Ok(Json(state.graph.check(params.direction, params.after.as_deref(), limit).await?))
}
