//! For tests against a real Cassandra: a keyspace of the test's own.

use crate::cassandra::{CassandraEngine, CassandraOptions};

/// A uniquely named keyspace on the node `REVSTORE_TEST_CASSANDRA` names
/// (`host:port`, or several, comma-separated, for a cluster), created with
/// the replication `REVSTORE_CASSANDRA_REPLICATION` gives (as the services
/// read it; default 1, and `datacenter1:3` on the local three-node cluster;
/// with several datacenters, the node is taken to be in the first),
/// dropped when the guard is — when the test ends, and when it fails too
/// (drop runs while a panic unwinds).
#[derive(Debug)]
pub struct TestKeyspace {
    node: String,
    name: String,
}

impl TestKeyspace {
    /// Panics, saying what to set, when `REVSTORE_TEST_CASSANDRA` is not set:
    /// a Cassandra test without a Cassandra cannot say anything.
    pub fn new(prefix: &str) -> TestKeyspace {
        let node = std::env::var("REVSTORE_TEST_CASSANDRA")
            .expect("REVSTORE_TEST_CASSANDRA must name the Cassandra node to test against (scripts/test starts one)");
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        TestKeyspace { node, name: format!("{}_{}", prefix.replace('-', "_"), &suffix[..12]) }
    }

    /// `host:port` of the node (or the nodes, comma-separated, as a
    /// service's `--cassandra` takes them).
    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn options(&self) -> CassandraOptions {
        let mut options = CassandraOptions::new(self.node.split(',').map(str::trim), self.name.clone());
        if let Ok(replication) = std::env::var("REVSTORE_CASSANDRA_REPLICATION") {
            options.replication = replication.parse().unwrap_or_else(|e| panic!("REVSTORE_CASSANDRA_REPLICATION: {e}"));
        }
        // Several datacenters: the node named is in the first (the sites
        // test's REVSTORE_TEST_CASSANDRA is the first site's).
        if let revstore_schema::cql::Replication::NetworkTopology { datacenters } = &options.replication {
            options.datacenter = datacenters.first().map(|(dc, _)| dc.clone());
        }
        let access = TestAccess::from_env();
        options.credentials = access.credentials;
        options.tls =
            access.tls_ca_file.map(|ca_file| crate::CassandraTls { ca_file, verify_name: true, client_identity: access.tls_client });
        options
    }

    /// An engine on this keyspace (created on first use of the schema).
    pub async fn connect(&self) -> CassandraEngine {
        CassandraEngine::connect(self.options()).await.unwrap_or_else(|e| panic!("cannot reach Cassandra at {}: {e}", self.node))
    }
}

impl Drop for TestKeyspace {
    fn drop(&mut self) {
        let (options, name) = (self.options(), self.name.clone());
        // A runtime of its own on a thread of its own: drop may run inside a
        // runtime (which cannot block) or outside any.
        let dropped = std::thread::spawn(move || -> Result<(), String> {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let engine = CassandraEngine::connect(options).await.map_err(|e| e.to_string())?;
                engine.session().query_unpaged(format!("DROP KEYSPACE IF EXISTS \"{name}\""), ()).await.map_err(|e| e.to_string())?;
                Ok(())
            })
        })
        .join();
        // Never panic here: a panic while a failed test unwinds aborts the run.
        if let Ok(Err(e)) | Err(e) = dropped.map_err(|_| "the cleanup thread panicked".to_owned()) {
            eprintln!("could not drop the test keyspace {}: {e}", self.name);
        }
    }
}

/// How tests reach a Cassandra that wants TLS or a login, from the
/// environment `scripts/test` sets for its TLS stage:
/// `REVSTORE_TEST_CASSANDRA_TLS_CA` (the CA's PEM file), with
/// `REVSTORE_TEST_CASSANDRA_TLS_CERT` and `_KEY` (a client certificate), and
/// `REVSTORE_TEST_CASSANDRA_USER` with `REVSTORE_TEST_CASSANDRA_PASSWORD`.
#[derive(Debug, Clone, Default)]
pub struct TestAccess {
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// A client certificate and its key, for a node that requires one.
    pub tls_client: Option<(std::path::PathBuf, std::path::PathBuf)>,
    pub credentials: Option<(String, String)>,
}

impl TestAccess {
    pub fn from_env() -> TestAccess {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        TestAccess {
            tls_ca_file: var("REVSTORE_TEST_CASSANDRA_TLS_CA").map(Into::into),
            tls_client: var("REVSTORE_TEST_CASSANDRA_TLS_CERT")
                .zip(var("REVSTORE_TEST_CASSANDRA_TLS_KEY"))
                .map(|(c, k)| (c.into(), k.into())),
            credentials: var("REVSTORE_TEST_CASSANDRA_USER")
                .map(|user| (user, var("REVSTORE_TEST_CASSANDRA_PASSWORD").unwrap_or_default())),
        }
    }
}
