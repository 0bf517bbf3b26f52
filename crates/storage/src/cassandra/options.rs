//! What an operator sets for the Cassandra engine: how to reach the cluster,
//! its keyspace, replication and consistency, timeouts, credentials and TLS.

use std::time::Duration;

use revstore_schema::cql::Replication;
use scylla::frame::types::{Consistency, SerialConsistency};

use super::tls::CassandraTls;

/// The consistency of reads and writes as operators name it
/// (`REVSTORE_CASSANDRA_CONSISTENCY`): the engine's own setting, so no code
/// above the engine depends on the driver's types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsistencyLevel {
    One,
    LocalOne,
    Quorum,
    LocalQuorum,
    EachQuorum,
    All,
}

impl std::str::FromStr for ConsistencyLevel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "one" => ConsistencyLevel::One,
            "local_one" => ConsistencyLevel::LocalOne,
            "quorum" => ConsistencyLevel::Quorum,
            "local_quorum" => ConsistencyLevel::LocalQuorum,
            "each_quorum" => ConsistencyLevel::EachQuorum,
            "all" => ConsistencyLevel::All,
            other => return Err(format!("unknown consistency {other:?}")),
        })
    }
}

impl From<ConsistencyLevel> for Consistency {
    fn from(level: ConsistencyLevel) -> Self {
        match level {
            ConsistencyLevel::One => Consistency::One,
            ConsistencyLevel::LocalOne => Consistency::LocalOne,
            ConsistencyLevel::Quorum => Consistency::Quorum,
            ConsistencyLevel::LocalQuorum => Consistency::LocalQuorum,
            ConsistencyLevel::EachQuorum => Consistency::EachQuorum,
            ConsistencyLevel::All => Consistency::All,
        }
    }
}

/// How to reach and use a cluster.
#[derive(Clone)]
pub struct CassandraOptions {
    /// `host` or `host:port` of one or more nodes.
    pub contact_points: Vec<String>,
    pub keyspace: String,
    /// Prefer nodes of this datacenter (with LOCAL_* consistency).
    pub datacenter: Option<String>,
    pub credentials: Option<(String, String)>,
    /// CQL over TLS, the nodes checked against this CA; `None`: plain TCP.
    pub tls: Option<CassandraTls>,
    /// Used when the keyspace has to be created.
    pub replication: Replication,
    pub consistency: ConsistencyLevel,
    /// Of conditional writes serialised within the site ([`crate::Serialized::InSite`]).
    pub serial_consistency: SerialConsistency,
    /// Whether conditional writes serialised across sites
    /// ([`crate::Serialized::AcrossSites`]) run at SERIAL; false runs them at
    /// `serial_consistency`, for a switchover while every other site is down.
    pub serial_across_sites: bool,
    /// Client-side bound on every request.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// The `service` label of the engine's own metrics.
    pub metrics_service: &'static str,
}

impl std::fmt::Debug for CassandraOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CassandraOptions")
            .field("contact_points", &self.contact_points)
            .field("keyspace", &self.keyspace)
            .field("datacenter", &self.datacenter)
            .field("credentials", &self.credentials.as_ref().map(|(user, _)| (user, "<redacted>")))
            .field("tls", &self.tls)
            .field("replication", &self.replication)
            .field("consistency", &self.consistency)
            .field("serial_consistency", &self.serial_consistency)
            .field("serial_across_sites", &self.serial_across_sites)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

impl CassandraOptions {
    pub fn new(contact_points: impl IntoIterator<Item = impl Into<String>>, keyspace: impl Into<String>) -> Self {
        CassandraOptions {
            contact_points: contact_points.into_iter().map(Into::into).collect(),
            keyspace: keyspace.into(),
            datacenter: None,
            credentials: None,
            tls: None,
            replication: Replication::Simple { factor: 1 },
            consistency: ConsistencyLevel::LocalQuorum,
            serial_consistency: SerialConsistency::LocalSerial,
            serial_across_sites: true,
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            metrics_service: "revstore",
        }
    }

    /// The replication a keyspace created here gets. A bare factor with a
    /// datacenter named means that factor in that datacenter
    /// (NetworkTopologyStrategy): SimpleStrategy knows no datacenters, and the
    /// driver, told to prefer one, warns on every query to such a keyspace.
    pub fn keyspace_replication(&self) -> Replication {
        match (&self.replication, &self.datacenter) {
            (Replication::Simple { factor }, Some(dc)) => Replication::NetworkTopology { datacenters: vec![(dc.clone(), *factor)] },
            (replication, _) => replication.clone(),
        }
    }
}
