//! What the nodes keep on disk for a table, for the storage audit.
//!
//! Cassandra 5 exposes each node's own figure over CQL in the virtual table
//! `system_views.disk_usage`: the table's `TotalDiskSpaceUsed` metric (every
//! SSTable the node still keeps, compacted-away ones not yet deleted
//! included), in mebibytes rounded up. A virtual table answers for the node
//! that is asked only, so every node is asked in turn, with a load-balancing
//! policy that targets it alone. The nodes' sum over the keyspace's
//! replication factor is one copy of the data.
//!
//! ScyllaDB has no such table; there the figure is not reported.

use std::collections::HashMap;
use std::time::Duration;

use revstore_schema::TableDef;
use revstore_schema::cql::Flavor;
use scylla::client::execution_profile::ExecutionProfile;
use scylla::frame::types::Consistency;
use scylla::policies::load_balancing::{NodeIdentifier, SingleTargetLoadBalancingPolicy};
use scylla::statement::unprepared::Statement as CqlStatement;

use super::{CassandraEngine, execution_error};
use crate::error::{StoreError, StoreResult};
use crate::ops::DiskUsage;

const MIB: u64 = 1 << 20;

/// A node that does not answer within this long leaves the figure unknown.
const NODE_TIMEOUT: Duration = Duration::from_secs(10);

impl CassandraEngine {
    pub(super) async fn table_disk_usage(&self, table: &'static TableDef) -> StoreResult<Option<DiskUsage>> {
        if self.flavor == Flavor::Scylla {
            return Ok(None);
        }
        let copies = self.copies().await?;
        let nodes = self.session.get_cluster_state().get_nodes_info().to_vec();
        let mut mebibytes = 0u64;
        for node in &nodes {
            let policy = SingleTargetLoadBalancingPolicy::new(NodeIdentifier::Node(node.clone()), None);
            let profile = ExecutionProfile::builder()
                .consistency(Consistency::One)
                .request_timeout(Some(NODE_TIMEOUT))
                .load_balancing_policy(policy)
                .build();
            let mut statement =
                CqlStatement::new("SELECT mebibytes FROM system_views.disk_usage WHERE keyspace_name = ? AND table_name = ?");
            statement.set_execution_profile_handle(Some(profile.into_handle()));
            let result = self.session.query_unpaged(statement, (&self.keyspace, table.name)).await.map_err(|e| {
                StoreError::Unavailable(format!("node {} did not report its disk usage: {}", node.address, execution_error(e)))
            })?;
            let rows = result.into_rows_result().map_err(|e| StoreError::Internal(format!("system_views.disk_usage: {e}")))?;
            // No row: the node has no SSTable of the table (nothing flushed yet).
            for row in rows.rows::<(i64,)>().map_err(|e| StoreError::Internal(format!("system_views.disk_usage: {e}")))? {
                let (mib,) = row.map_err(|e| StoreError::Internal(format!("system_views.disk_usage: {e}")))?;
                mebibytes += u64::try_from(mib).unwrap_or(0);
            }
        }
        let nodes = u32::try_from(nodes.len()).unwrap_or(u32::MAX);
        Ok(Some(DiskUsage {
            bytes: mebibytes * MIB / copies,
            // Each node rounds up to a whole MiB.
            resolution: u64::from(nodes) * MIB / copies,
            nodes,
        }))
    }
}

impl CassandraEngine {
    /// Copies of every row the keyspace keeps, as the cluster's schema says
    /// (the keyspace may have been altered since this process created it).
    async fn copies(&self) -> StoreResult<u64> {
        let result = self
            .session
            .query_unpaged("SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = ?", (&self.keyspace,))
            .await
            .map_err(execution_error)?;
        let rows = result.into_rows_result().map_err(|e| StoreError::Internal(format!("system_schema.keyspaces: {e}")))?;
        let (replication,) = rows
            .maybe_first_row::<(HashMap<String, String>,)>()
            .map_err(|e| StoreError::Internal(format!("system_schema.keyspaces: {e}")))?
            .ok_or_else(|| StoreError::Internal(format!("keyspace {} is not in system_schema.keyspaces", self.keyspace)))?;
        Ok(copies(&replication))
    }
}

/// Copies of every row a keyspace's `replication` option keeps: its factors
/// summed over datacenters (`'replication_factor': '3'` for SimpleStrategy,
/// one entry per datacenter for NetworkTopologyStrategy; a transient
/// factor `3/1` keeps 3 replicas, one of them transient, counted as full).
fn copies(replication: &HashMap<String, String>) -> u64 {
    let factor: u64 = replication
        .iter()
        .filter(|(option, _)| option.as_str() != "class")
        .filter_map(|(_, value)| value.split('/').next()?.trim().parse::<u64>().ok())
        .sum();
    factor.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_copy_is_the_sum_of_every_datacenters_factor() {
        let options = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let simple = options(&[("class", "org.apache.cassandra.locator.SimpleStrategy"), ("replication_factor", "3")]);
        assert_eq!(copies(&simple), 3);
        let two_dcs = options(&[("class", "org.apache.cassandra.locator.NetworkTopologyStrategy"), ("eqiad", "3"), ("codfw", "2")]);
        assert_eq!(copies(&two_dcs), 5);
        assert_eq!(copies(&options(&[("class", "NetworkTopologyStrategy"), ("dc1", "3/1")])), 3);
    }
}
