//! The janitor's admin routes: the only place a lease or sweep error becomes
//! an HTTP status. The two refusals the janitor acts on carry problem kinds
//! of their own (`revstore_api::janitor::problems`), so a wrong URL's plain
//! 404 is never read as "no such sweep here".

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use revstore_api::janitor::{Lease, LeaseRequest, PurgeReport, Scope, StepReport, StepRequest, Task, check_holder, problems};
use revstore_keys::time::rfc3339_millis;
use serde::Deserialize;

use super::JanitorAdmin;
use super::lease::LeaseError;
use super::sweep::SweepError;
use crate::problem::Problem;
use crate::{ApiError, WriteAccess};

impl From<LeaseError> for ApiError {
    fn from(e: LeaseError) -> Self {
        match e {
            LeaseError::Store(e) => e.into(),
            e @ (LeaseError::Held { .. } | LeaseError::NotTaken) => ApiError::conflict(e.to_string()).with_kind(problems::LEASE_HELD),
        }
    }
}

impl From<SweepError> for ApiError {
    fn from(e: SweepError) -> Self {
        match e {
            SweepError::Store(e) => e.into(),
            SweepError::Dependency { service, cause } => ApiError::dependency_unavailable(service, cause),
            e @ SweepError::Busy(_) => ApiError::unavailable(e.to_string()).with_retry_after(1),
            e @ SweepError::Corrupt(_) => ApiError::internal(e),
        }
    }
}

/// Take the janitor lease, or renew it when this run holds it already. 409
/// (`urn:revstore:problem:janitor-lease-held`) when another run holds it.
#[utoipa::path(post, path = "/admin/janitor/lease", request_body = LeaseRequest,
    responses((status = 200, body = Lease), (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 409, description = "another run holds the lease (problem kind janitor-lease-held)", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn take_lease(
    _: WriteAccess,
    State(admin): State<JanitorAdmin>,
    Json(request): Json<LeaseRequest>,
) -> Result<Json<Lease>, ApiError> {
    let holder = request.validate().map_err(|e| ApiError::bad_request(e.0))?.to_string();
    let expires_at = admin.lease(request.scope).take(&holder, Duration::from_secs(request.ttl_secs)).await?;
    Ok(Json(Lease { holder, expires_at: rfc3339_millis(expires_at) }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(super) struct HolderQuery {
    /// The run giving the lease back.
    holder: String,
    /// The scope of the lease (`all` when absent).
    #[serde(default)]
    scope: Scope,
}

/// Give the lease back (when this run holds it; otherwise nothing changes).
#[utoipa::path(delete, path = "/admin/janitor/lease", params(HolderQuery),
    responses((status = 204), (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn give_back_lease(
    _: WriteAccess,
    State(admin): State<JanitorAdmin>,
    Query(query): Query<HolderQuery>,
) -> Result<StatusCode, ApiError> {
    let holder = check_holder(&query.holder).map_err(|e| ApiError::bad_request(e.0))?.to_string();
    admin.lease(query.scope).give_back(&holder).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// One step of one of the service's sweeps, from its checkpoint.
#[utoipa::path(post, path = "/admin/janitor/{task}/step", request_body = StepRequest,
    params(("task" = String, Path, description = "hidden, retention, archive, graph or audit (those the service has, in the scope asked for)")),
    responses((status = 200, body = StepReport), (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, description = "the service offers no sweep of this task (problem kind janitor-task-not-offered)", body = Problem),
        (status = 409, description = "the caller does not hold the lease (problem kind janitor-lease-held)", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn step(
    _: WriteAccess,
    State(admin): State<JanitorAdmin>,
    Path(task): Path<String>,
    Json(request): Json<StepRequest>,
) -> Result<Json<StepReport>, ApiError> {
    let not_offered = |detail: String| {
        let offered: Vec<String> = admin.sweeps.keys().map(|(t, s)| format!("{t} ({})", s.name())).collect();
        ApiError::not_found(format!("{detail}; this service sweeps: {}", offered.join(", "))).with_kind(problems::TASK_NOT_OFFERED)
    };
    let task: Task = task.parse().map_err(not_offered)?;
    let scope = request.scope;
    let Some(sweep) = admin.sweeps.get(&(task, scope)).cloned() else {
        return Err(not_offered(format!("no {task} sweep of scope {} here", scope.name())));
    };
    let holder = request.validate().map_err(|e| ApiError::bad_request(e.0))?;
    admin.lease(scope).check(&holder.to_string()).await?;
    // Each scope, and dry runs, keep checkpoints of their own (routine runs
    // one per site).
    let site = admin.platform.store().site();
    let job = match (scope, request.dry_run) {
        (Scope::All, false) => task.name().to_owned(),
        (Scope::All, true) => format!("{task}:dry-run"),
        (Scope::Changed, false) => super::in_this_site(format!("{task}:changed"), site),
        (Scope::Changed, true) => super::in_this_site(format!("{task}:changed:dry-run"), site),
    };
    let from = if request.restart { None } else { admin.checkpoints.load(&job).await? };
    let resumed = from.is_some();
    let stepped = sweep.step(from.unwrap_or_default(), request.budget, request.dry_run).await?;
    match &stepped.next {
        Some(position) => admin.checkpoints.save(&job, position, &holder).await?,
        None => admin.checkpoints.clear(&job).await?,
    }
    Ok(Json(StepReport { done: stepped.next.is_none(), resumed, ..stepped.report }))
}

/// Drop data past its TTL and tombstones past their grace period that the
/// engine still keeps (the embedded engine also purges on its own, on a
/// timer). Cassandra does this by compaction: nothing to report there.
#[utoipa::path(post, path = "/admin/storage/purge",
    responses((status = 200, body = PurgeReport), (status = 401, body = Problem), (status = 403, body = Problem), (status = 503, body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn purge(_: WriteAccess, State(admin): State<JanitorAdmin>) -> Result<Json<PurgeReport>, ApiError> {
    let stats = admin.platform.store().purge_expired().await?;
    Ok(Json(PurgeReport { rows: stats.rows, tombstones: stats.tombstones, bytes_freed: stats.bytes_freed }))
}
