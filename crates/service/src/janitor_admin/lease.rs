//! The run lease: a row with a TTL, taken by a conditional insert, so two
//! janitor runs of one scope never overlap and a crashed run blocks the next
//! one only until the TTL ends. Its key is the service's name (the services
//! of one wiki may share a keyspace, and each keeps its own lease there),
//! with `:changed` for routine runs: a full run may take days, and the hourly
//! routine runs go on beside it (their work is idempotent with its).
//!
//! Where the keyspaces span several sites, a full run's lease is serialised
//! across them (one full run anywhere: its graph repair and `hidden` task
//! read and write what every site holds), and a routine run's is each
//! site's own, named after its datacenter and serialised in the site: the
//! routine runs of two sites may overlap, and both go on while the link
//! between them is cut or the other site is lost.

use std::time::Duration;

use revstore_api::janitor::Scope;
use revstore_keys::time::millis;
use revstore_schema::tables::janitor::LEASES;
use revstore_storage::{Cas, Condition, Delete, Serialized, Store, StoreError, Upsert, Value};

/// Why a lease was not granted, or a step not allowed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Another run holds it (until `until`, milliseconds since the epoch).
    #[error("another janitor run ({holder}) holds the lease until {}", revstore_keys::time::rfc3339_millis(*until))]
    Held { holder: String, until: i64 },
    /// Nobody holds it: a step needs it taken first.
    #[error("no janitor run holds the lease: take it first")]
    NotTaken,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The lease of one service, for runs of one scope.
#[derive(Debug, Clone)]
pub(super) struct LeaseBook {
    store: Store,
    name: String,
    serialized: Serialized,
}

impl LeaseBook {
    pub(super) fn new(store: Store, service: &'static str, scope: Scope) -> Self {
        let (name, serialized) = match scope {
            Scope::All => (service.to_owned(), Serialized::AcrossSites),
            Scope::Changed => (super::in_this_site(format!("{service}:changed"), store.site()), Serialized::InSite),
        };
        LeaseBook { store, name, serialized }
    }

    fn key(&self) -> Value {
        Value::from(self.name.as_str())
    }

    /// The lease's holder and expiry (milliseconds), if anyone holds it.
    pub(super) async fn current(&self) -> Result<Option<(String, i64)>, StoreError> {
        let row = self.store.get(&LEASES, vec![self.key()], None).await?;
        Ok(row.and_then(|r| Some((r.text("owner")?.to_owned(), r.timestamp("expires_at").unwrap_or(0)))))
    }

    /// Takes the lease for `ttl`, or renews it when `holder` holds it already.
    /// Answers when it expires (milliseconds, by the store's clock, which
    /// also ends the row's TTL).
    pub(super) async fn take(&self, holder: &str, ttl: Duration) -> Result<i64, LeaseError> {
        let now = self.store.now();
        let expires_at = millis(now + ttl);
        let lease_row = |acquired_at: i64| {
            Upsert::new(&LEASES, [self.key()])
                .set("owner", holder)
                .set("acquired_at", Value::Timestamp(acquired_at))
                .set("expires_at", Value::Timestamp(expires_at))
                .ttl(ttl.as_secs() as u32)
        };
        let taken = self.store.cas(Cas { serialized: self.serialized, ..Cas::insert_if_not_exists(lease_row(millis(now))) }).await?;
        if taken.applied {
            return Ok(expires_at);
        }
        let current = taken.current.as_ref();
        let owner = current.and_then(|r| r.text("owner")).unwrap_or_default().to_owned();
        if owner != holder {
            return Err(LeaseError::Held { holder: owner, until: current.and_then(|r| r.timestamp("expires_at")).unwrap_or(0) });
        }
        // Ours: renew it, only if it is still ours.
        let acquired_at = current.and_then(|r| r.timestamp("acquired_at")).unwrap_or(millis(now));
        let renewal = Cas {
            serialized: self.serialized,
            table: &LEASES,
            partition: vec![self.key()],
            clustering: Some(Vec::new()),
            condition: Condition::Equals(vec![("owner", Value::from(holder))]),
            writes: vec![lease_row(acquired_at).into()],
        };
        if self.store.cas(renewal).await?.applied {
            return Ok(expires_at);
        }
        let (holder, until) = self.current().await?.unwrap_or_default();
        Err(LeaseError::Held { holder, until })
    }

    /// Gives the lease back when `holder` holds it; otherwise changes nothing.
    pub(super) async fn give_back(&self, holder: &str) -> Result<(), StoreError> {
        let release = Cas {
            serialized: self.serialized,
            table: &LEASES,
            partition: vec![self.key()],
            clustering: Some(Vec::new()),
            condition: Condition::Equals(vec![("owner", Value::from(holder))]),
            writes: vec![Delete::partition(&LEASES, [self.key()]).into()],
        };
        self.store.cas(release).await?;
        Ok(())
    }

    /// Whether `holder` holds the lease now.
    pub(super) async fn check(&self, holder: &str) -> Result<(), LeaseError> {
        match self.current().await? {
            Some((owner, _)) if owner == holder => Ok(()),
            Some((owner, until)) => Err(LeaseError::Held { holder: owner, until }),
            None => Err(LeaseError::NotTaken),
        }
    }
}
