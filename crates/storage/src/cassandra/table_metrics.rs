//! What the nodes measure of a table, for the storage audit.
//!
//! Cassandra 5 exposes each node's own table metrics over CQL in virtual
//! tables of `system_views`:
//! - `disk_usage`: the table's `TotalDiskSpaceUsed` (every SSTable the node
//!   still keeps, compacted-away ones not yet deleted included), in mebibytes
//!   rounded up. The nodes' sum over the keyspace's replication factor is one
//!   copy of the data;
//! - `tombstones_per_read`: a histogram (recent reads weigh most) of the
//!   tombstones each read of the table scanned on the node;
//! - `max_partition_size`: the largest partition the node has written to an
//!   SSTable, in mebibytes rounded up.
//!
//! A virtual table answers for the node that is asked only, so every node is
//! asked in turn, with a load-balancing policy that targets it alone. (SSTables
//! per read, the third figure that decays with time, is a JMX histogram only:
//! no virtual table of Cassandra 5.0 exposes it.)
//!
//! ScyllaDB has no such tables; there the figures are not reported.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use revstore_schema::TableDef;
use revstore_schema::cql::Flavor;
use scylla::client::execution_profile::ExecutionProfile;
use scylla::cluster::Node;
use scylla::deserialize::row::DeserializeRow;
use scylla::frame::types::Consistency;
use scylla::policies::load_balancing::{NodeIdentifier, SingleTargetLoadBalancingPolicy};
use scylla::statement::unprepared::Statement as CqlStatement;

use super::{CassandraEngine, execution_error};
use crate::error::{StoreError, StoreResult};
use crate::ops::{DiskUsage, ReadHealth};

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
            // No row: the node has no SSTable of the table (nothing flushed yet).
            let rows: Vec<(i64,)> = self.ask_node(node, "SELECT mebibytes FROM system_views.disk_usage", table).await?;
            mebibytes += rows.iter().map(|(mib,)| u64::try_from(*mib).unwrap_or(0)).sum::<u64>();
        }
        let nodes = u32::try_from(nodes.len()).unwrap_or(u32::MAX);
        Ok(Some(DiskUsage {
            bytes: mebibytes * MIB / copies,
            // Each node rounds up to a whole MiB.
            resolution: u64::from(nodes) * MIB / copies,
            nodes,
        }))
    }

    /// The worst node's figures: a table is as healthy as its sickest replica.
    pub(super) async fn table_read_health(&self, table: &'static TableDef) -> StoreResult<Option<ReadHealth>> {
        if self.flavor == Flavor::Scylla {
            return Ok(None);
        }
        let nodes = self.session.get_cluster_state().get_nodes_info().to_vec();
        let mut health = ReadHealth { nodes: u32::try_from(nodes.len()).unwrap_or(u32::MAX), ..ReadHealth::default() };
        for node in &nodes {
            let tombstones: Vec<(f64, f64)> = self.ask_node(node, "SELECT p99th, max FROM system_views.tombstones_per_read", table).await?;
            for (p99, max) in tombstones {
                health.tombstones_per_read_p99 = health.tombstones_per_read_p99.max(whole(p99));
                health.tombstones_per_read_max = health.tombstones_per_read_max.max(whole(max));
            }
            let partitions: Vec<(i64,)> = self.ask_node(node, "SELECT mebibytes FROM system_views.max_partition_size", table).await?;
            for (mib,) in partitions {
                health.largest_partition_bytes = health.largest_partition_bytes.max(u64::try_from(mib).unwrap_or(0) * MIB);
            }
        }
        Ok(Some(health))
    }

    /// `select` (a query of one `system_views` table, without its `WHERE`)
    /// for `table` of this keyspace, asked of `node` alone.
    async fn ask_node<R>(&self, node: &Arc<Node>, select: &str, table: &'static TableDef) -> StoreResult<Vec<R>>
    where
        R: for<'frame, 'metadata> DeserializeRow<'frame, 'metadata>,
    {
        let policy = SingleTargetLoadBalancingPolicy::new(NodeIdentifier::Node(node.clone()), None);
        let profile = ExecutionProfile::builder()
            .consistency(Consistency::One)
            .request_timeout(Some(NODE_TIMEOUT))
            .load_balancing_policy(policy)
            .build();
        let mut statement = CqlStatement::new(format!("{select} WHERE keyspace_name = ? AND table_name = ?"));
        statement.set_execution_profile_handle(Some(profile.into_handle()));
        let result = self
            .session
            .query_unpaged(statement, (&self.keyspace, table.name))
            .await
            .map_err(|e| StoreError::Unavailable(format!("node {} did not answer {select}: {}", node.address, execution_error(e))))?;
        let rows = result.into_rows_result().map_err(|e| StoreError::Internal(format!("{select}: {e}")))?;
        let rows = rows.rows::<R>().map_err(|e| StoreError::Internal(format!("{select}: {e}")))?;
        rows.collect::<Result<Vec<R>, _>>().map_err(|e| StoreError::Internal(format!("{select}: {e}")))
    }
}

/// A histogram's figure, as a whole count (rounded up: 0.2 tombstones per read is one).
fn whole(figure: f64) -> u64 {
    if figure.is_finite() && figure > 0.0 { figure.ceil() as u64 } else { 0 }
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
