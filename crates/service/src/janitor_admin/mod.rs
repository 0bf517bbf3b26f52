//! The janitor's side of every service: the run lease, the sweep steps with
//! the checkpoints they resume from, and the storage purge.
//!
//! The janitor never opens a store (a service owns its store: the embedded
//! engine's directory is locked by one process, and only the service knows
//! what its rows mean). It drives these admin calls instead:
//!
//! - `POST /admin/janitor/lease` takes or renews the lease, `DELETE` gives it
//!   back ([`lease`]).
//! - `POST /admin/janitor/{task}/step` runs one bounded step of one of the
//!   service's [`Sweep`]s ([`sweep`]) from the checkpoint the service keeps
//!   ([`checkpoints`]), and moves the checkpoint on: a run killed at any
//!   point resumes where the last step ended. A dry run keeps a checkpoint of
//!   its own. Every service offers the `audit` sweep ([`audit`]).
//! - `POST /admin/storage/purge` drops expired data the engine still keeps.
//!
//! All need the write token; steps also need the lease. [`routes`] is the
//! only place an error of these becomes an HTTP status.

mod audit;
mod checkpoints;
mod journal;
mod lease;
mod routes;
mod sweep;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::FromRef;
use axum::routing::post;
use revstore_api::janitor::{Lease, LeaseRequest, PurgeReport, Scope, StepReport, StepRequest, TableAudit, Task};
use revstore_storage::Site;
use utoipa::OpenApi;

pub use audit::{AuditSweep, AuditedTable, Entitlement};
pub use journal::{ChangedPages, EveryPage, Journal, PageVisit};
pub use lease::LeaseError;
pub use sweep::{Stepped, Sweep, SweepError, SweepPosition, stored_page};

use crate::problem::Problem;
use crate::{Access, Platform, Routes};

/// The janitor's admin routes of one service, over its sweeps.
#[derive(Clone)]
pub struct JanitorAdmin {
    platform: Platform,
    sweeps: Arc<BTreeMap<(Task, Scope), Arc<dyn Sweep>>>,
    leases: Arc<BTreeMap<Scope, lease::LeaseBook>>,
    checkpoints: checkpoints::Checkpoints,
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
    fn lease(&self, scope: Scope) -> &lease::LeaseBook {
        &self.leases[&scope]
    }

    pub fn new(platform: Platform, sweeps: Vec<Arc<dyn Sweep>>) -> Self {
        let sweeps = sweeps.into_iter().map(|s| ((s.task(), s.scope()), s)).collect();
        let (store, service) = (platform.store().clone(), platform.service());
        JanitorAdmin {
            leases: Arc::new(
                [Scope::All, Scope::Changed].map(|scope| (scope, lease::LeaseBook::new(store.clone(), service, scope))).into(),
            ),
            checkpoints: checkpoints::Checkpoints::new(store, service),
            platform,
            sweeps: Arc::new(sweeps),
        }
    }

    pub fn routes(self) -> Routes {
        Routes::new()
            .route("/admin/janitor/lease", post(routes::take_lease).delete(routes::give_back_lease))
            .route("/admin/janitor/{task}/step", post(routes::step))
            .route("/admin/storage/purge", post(routes::purge))
            .with_state(self)
    }
}

/// The name a routine (`changed`) run's lease, checkpoints and marks take
/// in this site. Routine runs go on in every site at once, each under a
/// lease taken in its own site (what they do to a page, a range delete or an
/// archive PUT, is harmless done twice), so that retention does not stop
/// while the link between sites is cut or a site is lost; each site then
/// keeps its own positions. Full runs are one for all the sites: their names
/// are the bare ones.
fn in_this_site(name: String, site: Site) -> String {
    match (site.count, site.datacenter) {
        (0 | 1, _) => name,
        (_, Some(datacenter)) => format!("{name}@{datacenter}"),
        (_, None) => format!("{name}@site{}", site.index + 1),
    }
}

/// The admin routes' OpenAPI paths, merged into each service's document.
#[derive(Debug, OpenApi)]
#[openapi(
    paths(routes::take_lease, routes::give_back_lease, routes::step, routes::purge),
    components(schemas(LeaseRequest, Lease, StepRequest, Scope, StepReport, TableAudit, PurgeReport, Problem))
)]
pub struct JanitorAdminDoc;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routine_names_are_each_sites_own_only_where_there_are_several() {
        let name = || "current-store:changed".to_owned();
        assert_eq!(in_this_site(name(), Site::ONLY), "current-store:changed");
        let second = Site { index: 1, count: 2, datacenter: Some("codfw") };
        assert_eq!(in_this_site(name(), second), "current-store:changed@codfw");
        let unnamed = Site { index: 1, count: 2, datacenter: None };
        assert_eq!(in_this_site(name(), unnamed), "current-store:changed@site2");
    }
}
