//! The janitor's side of every service: the run lease, the sweep steps with
//! the checkpoints they resume from, and the storage purge.
//!
//! The janitor never opens a store (a service owns its store: the embedded
//! engine's directory is locked by one process, and only the service knows
//! what its rows mean). It drives these admin calls instead:
//!
//! - `POST /admin/janitor/lease` takes or renews the lease, `DELETE` gives it
//!   back: a row with a TTL, taken by a conditional insert, so two runs never
//!   overlap and a crashed run blocks the next one only until the TTL ends.
//! - `POST /admin/janitor/{task}/step` runs one bounded step of one of the
//!   service's [`Sweep`]s from the checkpoint the service keeps, and moves the
//!   checkpoint on: a run killed at any point resumes where the last step
//!   ended. A dry run keeps a checkpoint of its own.
//! - `POST /admin/storage/purge` drops expired data the engine still keeps.
//!
//! All need the write token; steps also need the lease.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use axum::Json;
use axum::extract::{FromRef, Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use revstore_api::janitor::{Lease, LeaseRequest, PurgeReport, StepReport, StepRequest, TableAudit, check_holder};
use revstore_keys::Tid;
use revstore_schema::TableDef;
use revstore_schema::tables::janitor::{CHECKPOINTS, LEASES};
use revstore_storage::{Cas, Condition, Delete, ScanPosition, ScanQuery, ScannedPartition, Store, StoreError, TokenRange, Upsert, Value};
use serde::Deserialize;
use utoipa::OpenApi;

use crate::problem::Problem;
use crate::{Access, ApiError, Platform, Routes, WriteAccess};

/// The row keys of a service's lease and checkpoints carry the service's
/// name: the services of one wiki may share a keyspace (the Kubernetes base
/// points them all at one), and each keeps its own positions there. The lease
/// is the service's name; a checkpoint is `service/job`.
fn lease_key(service: &str) -> Value {
    Value::from(service)
}

fn checkpoint_key(service: &str, job: &str) -> Value {
    Value::from(format!("{service}/{job}"))
}

/// One step's result: the report, and where the next step starts (`None`:
/// the sweep is complete).
#[derive(Debug, Clone, Default)]
pub struct Stepped {
    pub report: StepReport,
    pub next: Option<Vec<u8>>,
}

/// A sweep a service offers the janitor: resumable, bounded steps over its
/// tables. The position is the sweep's own (the service stores it as the
/// checkpoint and hands it back), so a sweep over several tables can say
/// which one it is in.
#[async_trait]
pub trait Sweep: Send + Sync + 'static {
    /// The task it belongs to: `retention`, `archive`, `graph` or `audit`.
    fn task(&self) -> &'static str;

    /// Visits up to `budget` partitions after `from` (`None`: from the
    /// start); with `dry_run`, counts what it would change and changes nothing.
    async fn step(&self, from: Option<Vec<u8>>, budget: u32, dry_run: bool) -> Result<Stepped, ApiError>;
}

/// The janitor's admin routes of one service, over its sweeps.
#[derive(Clone)]
pub struct JanitorAdmin {
    platform: Platform,
    sweeps: Arc<BTreeMap<&'static str, Arc<dyn Sweep>>>,
}

impl std::fmt::Debug for JanitorAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JanitorAdmin").field("sweeps", &self.sweeps.keys().collect::<Vec<_>>()).finish()
    }
}

impl FromRef<JanitorAdmin> for Access {
    fn from_ref(admin: &JanitorAdmin) -> Access {
        admin.platform.access().clone()
    }
}

impl JanitorAdmin {
    pub fn new(platform: Platform, sweeps: Vec<Arc<dyn Sweep>>) -> Self {
        let sweeps = sweeps.into_iter().map(|s| (s.task(), s)).collect();
        JanitorAdmin { platform, sweeps: Arc::new(sweeps) }
    }

    pub fn routes(self) -> Routes {
        Routes::new()
            .route("/admin/janitor/lease", post(take_lease).delete(give_back_lease))
            .route("/admin/janitor/{task}/step", post(step))
            .route("/admin/storage/purge", post(purge))
            .with_state(self)
    }

    fn store(&self) -> &Store {
        self.platform.store()
    }

    fn service(&self) -> &'static str {
        self.platform.service()
    }

    /// The lease's holder and expiry, if anyone holds it.
    async fn lease(&self) -> Result<Option<(String, i64)>, StoreError> {
        let row = self.store().get(&LEASES, vec![lease_key(self.service())], None).await?;
        Ok(row.and_then(|r| Some((r.text("owner")?.to_owned(), r.timestamp("expires_at").unwrap_or(0)))))
    }
}

/// The admin routes' OpenAPI paths, merged into each service's document.
#[derive(Debug, OpenApi)]
#[openapi(
    paths(take_lease, give_back_lease, step, purge),
    components(schemas(LeaseRequest, Lease, StepRequest, StepReport, TableAudit, PurgeReport, Problem))
)]
pub struct JanitorAdminDoc;

fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn rfc3339_millis(ms: i64) -> String {
    revstore_keys::rfc3339(UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
}

fn refused(holder: &str, expires_at: i64) -> ApiError {
    ApiError::conflict(format!("another janitor run ({holder}) holds the lease until {}", rfc3339_millis(expires_at)))
}

/// Take the janitor lease, or renew it when this run holds it already. 409
/// when another run holds it.
#[utoipa::path(post, path = "/admin/janitor/lease", request_body = LeaseRequest,
    responses((status = 200, body = Lease), (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 409, description = "another run holds the lease", body = Problem)),
    security(("bearer" = [])))]
async fn take_lease(_: WriteAccess, State(admin): State<JanitorAdmin>, Json(request): Json<LeaseRequest>) -> Result<Json<Lease>, ApiError> {
    let holder = request.validate().map_err(|e| ApiError::bad_request(e.0))?.to_string();
    let now = SystemTime::now();
    let expires_at = millis(now + Duration::from_secs(request.ttl_secs));
    let lease_row = |acquired_at: i64| {
        Upsert::new(&LEASES, [lease_key(admin.service())])
            .set("owner", holder.clone())
            .set("acquired_at", Value::Timestamp(acquired_at))
            .set("expires_at", Value::Timestamp(expires_at))
            .ttl(request.ttl_secs as u32)
    };
    let store = admin.store();
    let taken = store.cas(Cas::insert_if_not_exists(lease_row(millis(now)))).await?;
    let granted = if taken.applied {
        true
    } else {
        let current = taken.current.as_ref();
        let owner = current.and_then(|r| r.text("owner")).unwrap_or_default().to_owned();
        if owner != holder {
            return Err(refused(&owner, current.and_then(|r| r.timestamp("expires_at")).unwrap_or(0)));
        }
        // Ours: renew it, only if it is still ours.
        let acquired_at = current.and_then(|r| r.timestamp("acquired_at")).unwrap_or(millis(now));
        let renewal = Cas {
            table: &LEASES,
            partition: vec![lease_key(admin.service())],
            clustering: Some(Vec::new()),
            condition: Condition::Equals(vec![("owner", Value::from(holder.as_str()))]),
            writes: vec![lease_row(acquired_at).into()],
        };
        store.cas(renewal).await?.applied
    };
    if !granted {
        let (owner, until) = admin.lease().await?.unwrap_or_default();
        return Err(refused(&owner, until));
    }
    Ok(Json(Lease { holder, expires_at: rfc3339_millis(expires_at) }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
struct HolderQuery {
    /// The run giving the lease back.
    holder: String,
}

/// Give the lease back (when this run holds it; otherwise nothing changes).
#[utoipa::path(delete, path = "/admin/janitor/lease", params(HolderQuery),
    responses((status = 204), (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem)),
    security(("bearer" = [])))]
async fn give_back_lease(
    _: WriteAccess,
    State(admin): State<JanitorAdmin>,
    axum::extract::Query(query): axum::extract::Query<HolderQuery>,
) -> Result<StatusCode, ApiError> {
    let holder = check_holder(&query.holder).map_err(|e| ApiError::bad_request(e.0))?.to_string();
    let release = Cas {
        table: &LEASES,
        partition: vec![lease_key(admin.service())],
        clustering: Some(Vec::new()),
        condition: Condition::Equals(vec![("owner", Value::from(holder.as_str()))]),
        writes: vec![Delete::partition(&LEASES, [lease_key(admin.service())]).into()],
    };
    admin.store().cas(release).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// One step of one of the service's sweeps, from its checkpoint.
#[utoipa::path(post, path = "/admin/janitor/{task}/step", request_body = StepRequest,
    params(("task" = String, Path, description = "retention, archive, graph or audit (those the service has)")),
    responses((status = 200, body = StepReport), (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, description = "the service has no such task", body = Problem),
        (status = 409, description = "the caller does not hold the lease", body = Problem)),
    security(("bearer" = [])))]
async fn step(
    _: WriteAccess,
    State(admin): State<JanitorAdmin>,
    Path(task): Path<String>,
    Json(request): Json<StepRequest>,
) -> Result<Json<StepReport>, ApiError> {
    let Some(sweep) = admin.sweeps.get(task.as_str()).cloned() else {
        let offered: Vec<&str> = admin.sweeps.keys().copied().collect();
        return Err(ApiError::not_found(format!("no such task here; this service sweeps: {}", offered.join(", "))));
    };
    let holder = request.validate().map_err(|e| ApiError::bad_request(e.0))?;
    match admin.lease().await? {
        Some((owner, _)) if owner == holder.to_string() => {}
        Some((owner, until)) => return Err(refused(&owner, until)),
        None => return Err(ApiError::conflict("no janitor run holds the lease: take it first")),
    }
    let checkpoints = Checkpoints { store: admin.store().clone(), service: admin.service() };
    let job = if request.dry_run { format!("{}:dry-run", sweep.task()) } else { sweep.task().to_owned() };
    let from = if request.restart { None } else { checkpoints.load(&job).await? };
    let resumed = from.is_some();
    let stepped = sweep.step(from, request.budget, request.dry_run).await?;
    match &stepped.next {
        Some(position) => checkpoints.save(&job, position, &holder).await?,
        None => checkpoints.clear(&job).await?,
    }
    Ok(Json(StepReport { done: stepped.next.is_none(), resumed, ..stepped.report }))
}

/// Drop data past its TTL and tombstones past their grace period that the
/// engine still keeps (the embedded engine also purges on its own, on a
/// timer). Cassandra does this by compaction: nothing to report there.
#[utoipa::path(post, path = "/admin/storage/purge",
    responses((status = 200, body = PurgeReport), (status = 401, body = Problem), (status = 403, body = Problem), (status = 503, body = Problem)),
    security(("bearer" = [])))]
async fn purge(_: WriteAccess, State(admin): State<JanitorAdmin>) -> Result<Json<PurgeReport>, ApiError> {
    let stats = admin.store().purge_expired().await?;
    Ok(Json(PurgeReport { rows: stats.rows, tombstones: stats.tombstones, bytes_freed: stats.bytes_freed }))
}

/// Where each of the service's sweeps resumes, one row per job (`retention`,
/// `audit:dry-run`…), keyed by the service too.
struct Checkpoints {
    store: Store,
    service: &'static str,
}

impl Checkpoints {
    async fn load(&self, job: &str) -> Result<Option<Vec<u8>>, ApiError> {
        let row = self.store.get(&CHECKPOINTS, vec![checkpoint_key(self.service, job)], None).await?;
        let Some(cursor) = row.as_ref().and_then(|r| r.text("cursor")) else { return Ok(None) };
        match URL_SAFE_NO_PAD.decode(cursor) {
            Ok(position) => Ok(Some(position)),
            Err(_) => {
                // Only this code writes checkpoints: an unreadable one means an
                // older build's; starting the sweep over is always safe.
                tracing::warn!(service = self.service, job, "unreadable janitor checkpoint: the sweep starts over");
                Ok(None)
            }
        }
    }

    async fn save(&self, job: &str, position: &[u8], run: &Tid) -> Result<(), ApiError> {
        let row = Upsert::new(&CHECKPOINTS, [checkpoint_key(self.service, job)])
            .set("cursor", URL_SAFE_NO_PAD.encode(position))
            .set("run_id", Value::TimeUuid(run.uuid()))
            .set("updated_at", Value::Timestamp(millis(SystemTime::now())));
        Ok(self.store.write(row).await?)
    }

    async fn clear(&self, job: &str) -> Result<(), ApiError> {
        Ok(self.store.write(Delete::partition(&CHECKPOINTS, [checkpoint_key(self.service, job)])).await?)
    }
}

/// What readers are entitled to in a table, when that is less than all of its
/// live data (current-store's `current` holds one latest render per title;
/// older rows there are the janitor's to move out).
#[async_trait]
pub trait Entitlement: Send + Sync + 'static {
    /// Rows and value bytes readers are entitled to in these live partitions.
    async fn ideal(&self, store: &Store, partitions: &[ScannedPartition]) -> Result<(u64, u64), ApiError>;
}

/// An audited table, and what of it readers are entitled to (`None`: all of
/// its live data: rows inside their TTL, undelivered hand-offs, edges…).
#[derive(Clone)]
pub struct AuditedTable {
    pub table: &'static TableDef,
    pub entitlement: Option<Arc<dyn Entitlement>>,
}

impl std::fmt::Debug for AuditedTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditedTable")
            .field("table", &self.table.name)
            .field("all_live_data_entitled", &self.entitlement.is_none())
            .finish()
    }
}

impl AuditedTable {
    pub fn live(table: &'static TableDef) -> Self {
        AuditedTable { table, entitlement: None }
    }
}

/// The `audit` task: table by table, what the engine holds (see
/// [`Store::holdings`]) against what readers are entitled to. Changes nothing.
#[derive(Debug)]
pub struct AuditSweep {
    store: Store,
    tables: Vec<AuditedTable>,
}

impl AuditSweep {
    pub fn new(store: Store, tables: Vec<AuditedTable>) -> Self {
        AuditSweep { store, tables }
    }
}

/// A position in a sweep over several tables: the table's index, then the
/// scan position within it (absent at the table's start).
fn table_position(index: usize, within: Option<&ScanPosition>) -> Vec<u8> {
    let mut bytes = vec![index as u8];
    if let Some(p) = within {
        bytes.extend(p.to_bytes());
    }
    bytes
}

fn parse_table_position(bytes: &[u8]) -> Result<(usize, Option<ScanPosition>), ApiError> {
    match bytes.split_first() {
        None => Ok((0, None)),
        Some((index, [])) => Ok((*index as usize, None)),
        Some((index, rest)) => Ok((*index as usize, Some(ScanPosition::from_bytes(rest)?))),
    }
}

#[async_trait]
impl Sweep for AuditSweep {
    fn task(&self) -> &'static str {
        "audit"
    }

    async fn step(&self, from: Option<Vec<u8>>, budget: u32, _dry_run: bool) -> Result<Stepped, ApiError> {
        let (index, after) = parse_table_position(from.as_deref().unwrap_or_default())?;
        let Some(audited) = self.tables.get(index) else { return Ok(Stepped::default()) };
        let table = audited.table;
        let held = self.store.holdings(&ScanQuery::new(table, budget).after(after.clone())).await?;
        let (rows_ideal, bytes_ideal) = match &audited.entitlement {
            None => (held.rows_live, held.bytes_live),
            Some(entitlement) => {
                let partitions = live_partitions_through(&self.store, table, after, held.next.as_ref(), budget).await?;
                entitlement.ideal(&self.store, &partitions).await?
            }
        };
        let audit =
            TableAudit { partitions: held.partitions, rows_held: held.rows_held, bytes_held: held.bytes_held, rows_ideal, bytes_ideal };
        let next = match &held.next {
            Some(position) => Some(table_position(index, Some(position))),
            None if index + 1 < self.tables.len() => Some(table_position(index + 1, None)),
            None => None,
        };
        let report =
            StepReport { partitions: held.partitions, tables: BTreeMap::from([(table.name.to_owned(), audit)]), ..StepReport::default() };
        Ok(Stepped { report, next })
    }
}

/// The live partitions after `after` up to and including `through` (the end
/// of the table when `None`), at most `budget` of them: those a holdings step
/// from `after` visited.
async fn live_partitions_through(
    store: &Store,
    table: &'static TableDef,
    after: Option<ScanPosition>,
    through: Option<&ScanPosition>,
    budget: u32,
) -> Result<Vec<ScannedPartition>, ApiError> {
    let range = TokenRange { after: i64::MIN, through: through.map_or(i64::MAX, |p| p.token) };
    let scanned = store.scan_range(&ScanQuery::new(table, budget).range(range).after(after)).await?;
    let beyond = |p: &ScannedPartition| {
        through.is_some_and(|t| {
            p.token == t.token && p.key.iter().zip(&t.key).map(|(a, b)| a.cmp_same_type(b)).find(|o| o.is_ne()).is_some_and(|o| o.is_gt())
        })
    };
    Ok(scanned.partitions.into_iter().filter(|p| !beyond(p)).collect())
}
