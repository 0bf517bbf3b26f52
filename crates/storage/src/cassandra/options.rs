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

    /// The site this deployment writes in: its datacenter's place among the
    /// replication's datacenters, which number the sites (so every site's
    /// services must be given the same replication setting, and a site added
    /// later goes at its end). With several datacenters the local one must
    /// be named and be among them: unnamed, LOCAL_QUORUM would count in
    /// whichever datacenter each request's coordinator is in (a read need not
    /// see the write before it), and two sites taking one number would share
    /// what each must keep to itself.
    pub fn site(&self) -> Result<crate::Site, String> {
        let datacenters = match &self.replication {
            Replication::NetworkTopology { datacenters } if datacenters.len() > 1 => datacenters,
            _ => return Ok(crate::Site::ONLY),
        };
        let names = datacenters.iter().map(|(dc, _)| dc.as_str()).collect::<Vec<_>>().join(", ");
        let Some(local) = &self.datacenter else {
            return Err(format!(
                "the keyspace is replicated to several datacenters ({names}): name this site's (REVSTORE_CASSANDRA_DATACENTER)"
            ));
        };
        let index = datacenters
            .iter()
            .position(|(dc, _)| dc == local)
            .ok_or_else(|| format!("datacenter {local:?} is not among the replication's ({names}): REVSTORE_CASSANDRA_REPLICATION names every site, in one order everywhere"))?;
        // Named once per engine opened, for the life of the process.
        let datacenter: &'static str = Box::leak(local.clone().into_boxed_str());
        Ok(crate::Site { index: index as u32, count: datacenters.len() as u32, datacenter: Some(datacenter) })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Site;

    fn options(replication: &str, datacenter: Option<&str>) -> CassandraOptions {
        let mut options = CassandraOptions::new(["127.0.0.1"], "revstore");
        options.replication = replication.parse().expect("replication");
        options.datacenter = datacenter.map(str::to_owned);
        options
    }

    #[test]
    fn sites_are_numbered_by_the_replication_setting() {
        assert_eq!(options("3", None).site(), Ok(Site::ONLY));
        assert_eq!(options("3", Some("dc2")).site(), Ok(Site::ONLY));
        assert_eq!(options("dc1:3", Some("dc1")).site(), Ok(Site::ONLY));
        assert_eq!(options("eqiad:3,codfw:3", Some("eqiad")).site(), Ok(Site { index: 0, count: 2, datacenter: Some("eqiad") }));
        assert_eq!(options("eqiad:3,codfw:3", Some("codfw")).site(), Ok(Site { index: 1, count: 2, datacenter: Some("codfw") }));
        // Several sites: this one must be named, and be one of them.
        let unnamed = options("eqiad:3,codfw:3", None).site().unwrap_err();
        assert!(unnamed.contains("REVSTORE_CASSANDRA_DATACENTER"), "{unnamed}");
        let stranger = options("eqiad:3,codfw:3", Some("ulsfo")).site().unwrap_err();
        assert!(stranger.contains("\"ulsfo\"") && stranger.contains("eqiad, codfw"), "{stranger}");
    }
}
