//! Typed clients of the services revstore services call: old-store (archive
//! writes, suppressions, fallback reads), the dependency graph (change
//! notices), and every service as the janitor calls it. Paths and bodies come from the wire contract (`revstore-api`);
//! each client lists the routes it calls (`ROUTES`) so tests check them
//! against the service's OpenAPI document.

use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use revstore_api::graph::{Dependency, DependencyList, EdgeSet};
use revstore_api::janitor::{self, Lease, LeaseRequest, PurgeReport, StepReport, StepRequest};
use revstore_api::{ArchiveBody, RevisionList, Selection, paths};

use crate::{Answer, ClientError, HttpClient};

fn json_headers() -> HeaderMap {
    HeaderMap::from_iter([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))])
}

/// What an archive write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Archived {
    /// Stored now (201).
    Created,
    /// Already stored, or skipped by old-store's update policy (200).
    Unchanged,
}

/// old-store, as current-store and dump-import call it.
#[derive(Debug, Clone)]
pub struct OldStoreClient {
    http: HttpClient,
}

impl OldStoreClient {
    /// The routes this client calls, as old-store documents them.
    pub const ROUTES: [(Method, &'static str); 7] = [
        (Method::PUT, "/{domain}/v1/archive/{title}/{rev}/{tid}"),
        (Method::POST, "/{domain}/v1/archive/{title}/{rev}/suppress"),
        (Method::DELETE, "/{domain}/v1/archive/{title}/{rev}/suppress"),
        (Method::DELETE, "/{domain}/v1/archive/{title}"),
        (Method::GET, "/{domain}/v1/archive/revisions/{title}"),
        (Method::GET, "/{domain}/v1/archive/{part}/{title}/{rev}"),
        (Method::GET, "/{domain}/v1/archive/{part}/{title}/{rev}/{tid}"),
    ];

    pub fn new(http: HttpClient) -> Self {
        OldStoreClient { http }
    }

    pub fn base_url(&self) -> &str {
        self.http.base_url()
    }

    /// Archives a render (idempotent: PUT, retried on transient failures).
    pub async fn archive(&self, domain: &str, title: &str, rev: u64, tid: &str, body: &ArchiveBody) -> Result<Archived, ClientError> {
        let json = serde_json::to_vec(body).map_err(|e| ClientError::Config(format!("cannot encode the body: {e}")))?;
        self.archive_json(domain, title, rev, tid, json).await
    }

    /// Archives a render whose body is already JSON (an [`ArchiveBody`]), as
    /// current-store's outbox keeps it.
    pub async fn archive_json(&self, domain: &str, title: &str, rev: u64, tid: &str, json: Vec<u8>) -> Result<Archived, ClientError> {
        let answer = self.http.send(Method::PUT, &paths::archive_render(domain, title, rev, tid), json_headers(), Some(json)).await?;
        Ok(if answer.status == StatusCode::CREATED { Archived::Created } else { Archived::Unchanged })
    }

    /// Hides a revision from every read; `at`: when current-store recorded
    /// the suppression (milliseconds), which old-store records too.
    pub async fn suppress(&self, domain: &str, title: &str, rev: u64, at: Option<i64>) -> Result<(), ClientError> {
        self.http.send(Method::POST, &suppression_path(domain, title, rev, at), HeaderMap::new(), None).await?;
        Ok(())
    }

    /// Lifts a revision's suppression; `at` as for [`Self::suppress`].
    pub async fn lift_suppression(&self, domain: &str, title: &str, rev: u64, at: Option<i64>) -> Result<(), ClientError> {
        self.http.send(Method::DELETE, &suppression_path(domain, title, rev, at), HeaderMap::new(), None).await?;
        Ok(())
    }

    /// Hides every revision of the page up to `through` (the page deleted).
    pub async fn delete_page(&self, domain: &str, title: &str, through: u64) -> Result<(), ClientError> {
        let path = format!("{}?rev={through}", paths::archive_page(domain, title));
        self.http.send(Method::DELETE, &path, HeaderMap::new(), None).await?;
        Ok(())
    }

    /// A page of the title's archived revisions from revision `from` on, in
    /// revision order.
    pub async fn revisions(
        &self,
        domain: &str,
        title: &str,
        from: u64,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<RevisionList, ClientError> {
        let mut path = format!("{}?from={from}&limit={limit}", paths::archive_revisions(domain, title));
        if let Some(cursor) = cursor {
            path.push_str(&format!("&cursor={}", paths::path_segment(cursor)));
        }
        self.http.get_json(&path).await
    }

    /// Reads a revision's first render (or the render `tid`): the answer with
    /// its `Content-Type` and `ETag`, or `None` when old-store does not have it.
    pub async fn read(
        &self,
        domain: &str,
        selection: Selection,
        title: &str,
        rev: u64,
        tid: Option<&str>,
    ) -> Result<Option<Answer>, ClientError> {
        match self.http.send(Method::GET, &paths::archive_read(domain, selection, title, rev, tid), HeaderMap::new(), None).await {
            Ok(answer) => Ok(Some(answer)),
            Err(e) if e.status() == Some(StatusCode::NOT_FOUND) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The dependency graph, as current-store (change notices) and dump-import
/// (dependency sets) call it.
#[derive(Debug, Clone)]
pub struct GraphClient {
    http: HttpClient,
}

impl GraphClient {
    /// The routes this client calls, as the graph documents them.
    pub const ROUTES: [(Method, &'static str); 3] =
        [(Method::POST, "/{domain}/v1/changes"), (Method::PUT, "/{domain}/v1/deps/{child}"), (Method::GET, "/{domain}/v1/deps/{child}")];

    pub fn new(http: HttpClient) -> Self {
        GraphClient { http }
    }

    pub fn base_url(&self) -> &str {
        self.http.base_url()
    }

    /// Posts a change notice (a [`revstore_api::ChangeNotice`], already JSON).
    pub async fn notify_json(&self, domain: &str, json: Vec<u8>) -> Result<(), ClientError> {
        self.http.send(Method::POST, &paths::graph_changes(domain), json_headers(), Some(json)).await?;
        Ok(())
    }

    /// Replaces the page's whole dependency set (idempotent: PUT).
    pub async fn replace_dependencies(&self, domain: &str, child: &str, edges: &EdgeSet) -> Result<(), ClientError> {
        self.http.put_json(&paths::graph_dependencies(domain, child), edges).await?;
        Ok(())
    }

    /// Every dependency of the page, all pages of the listing read.
    pub async fn dependencies(&self, domain: &str, child: &str) -> Result<Vec<Dependency>, ClientError> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("{}?limit=1000", paths::graph_dependencies(domain, child));
            if let Some(cursor) = &cursor {
                path.push_str(&format!("&cursor={}", paths::path_segment(cursor)));
            }
            let page: DependencyList = self.http.get_json(&path).await?;
            all.extend(page.items);
            match page.next {
                Some(next) => cursor = Some(next),
                None => return Ok(all),
            }
        }
    }
}

/// Any service, as the janitor calls it: the run lease, sweep steps and the
/// storage purge (`revstore_api::janitor`).
#[derive(Debug, Clone)]
pub struct JanitorClient {
    http: HttpClient,
}

impl JanitorClient {
    /// The routes this client calls, as every service documents them.
    pub const ROUTES: [(Method, &'static str); 4] = [
        (Method::POST, "/admin/janitor/lease"),
        (Method::DELETE, "/admin/janitor/lease"),
        (Method::POST, "/admin/janitor/{task}/step"),
        (Method::POST, "/admin/storage/purge"),
    ];

    pub fn new(http: HttpClient) -> Self {
        JanitorClient { http }
    }

    pub fn base_url(&self) -> &str {
        self.http.base_url()
    }

    fn decode<T: serde::de::DeserializeOwned>(&self, path: &str, answer: Answer) -> Result<T, ClientError> {
        answer.json().map_err(|e| ClientError::Decode {
            method: Method::POST,
            url: format!("{}{path}", self.http.base_url()),
            reason: e.to_string(),
        })
    }

    /// Takes or renews the lease; a 409 means another run holds it.
    pub async fn take_lease(&self, request: &LeaseRequest) -> Result<Lease, ClientError> {
        let answer = self.http.post_json(janitor::paths::LEASE, request).await?;
        self.decode(janitor::paths::LEASE, answer)
    }

    /// Gives the lease of `scope` back (nothing happens when `holder` does not hold it).
    pub async fn give_back_lease(&self, holder: &str, scope: janitor::Scope) -> Result<(), ClientError> {
        // A holder is a UUID and a scope a word: nothing in them needs escaping in a query.
        let path = format!("{}?holder={holder}&scope={}", janitor::paths::LEASE, scope.name());
        self.http.send(Method::DELETE, &path, HeaderMap::new(), None).await?;
        Ok(())
    }

    /// One step of one of the service's sweeps. Not retried here: the caller
    /// decides (a step is safe to repeat, it resumes from the checkpoint).
    pub async fn step(&self, task: janitor::Task, request: &StepRequest) -> Result<StepReport, ClientError> {
        let path = janitor::paths::step(task);
        let answer = self.http.post_json(&path, request).await?;
        self.decode(&path, answer)
    }

    pub async fn purge(&self) -> Result<PurgeReport, ClientError> {
        let answer = self.http.send(Method::POST, janitor::paths::PURGE, HeaderMap::new(), None).await?;
        self.decode(janitor::paths::PURGE, answer)
    }
}

/// A revision's suppression route, with the change's time when given.
fn suppression_path(domain: &str, title: &str, rev: u64, at: Option<i64>) -> String {
    let path = paths::archive_suppress(domain, title, rev);
    match at {
        Some(at) => format!("{path}?at={at}"),
        None => path,
    }
}
