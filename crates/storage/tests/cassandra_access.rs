//! Reaching a Cassandra that accepts CQL only over TLS, only from clients with
//! a certificate from its CA, and only with a login: what works, and that every
//! way in with plain TCP, without the right CA, without a client certificate or
//! with a wrong password is refused at connect, saying why.
//!
//! `scripts/test` starts such a node (`REVSTORE_CASSANDRA_TLS=mutual
//! REVSTORE_CASSANDRA_AUTH=password deploy/cassandra/cassandra-local start`) and
//! sets `REVSTORE_TEST_CASSANDRA`, `REVSTORE_TEST_CASSANDRA_TLS_CA`,
//! `REVSTORE_TEST_CASSANDRA_TLS_CERT`, `REVSTORE_TEST_CASSANDRA_TLS_KEY`,
//! `REVSTORE_TEST_CASSANDRA_USER` and `REVSTORE_TEST_CASSANDRA_PASSWORD`.

use std::process::Command;
use std::sync::Arc;

use revstore_storage::conformance::{KV, TABLES};
use revstore_storage::testing::TestKeyspace;
use revstore_storage::{CassandraEngine, CassandraOptions, CassandraTls, Store, Upsert, Value};

const IGNORE: &str = "needs Cassandra with TLS and passwords: scripts/test runs it";

fn options() -> (TestKeyspace, CassandraOptions) {
    let keyspace = TestKeyspace::new("access");
    let options = keyspace.options();
    assert!(options.tls.is_some(), "REVSTORE_TEST_CASSANDRA_TLS_CA must name the node's CA ({IGNORE})");
    assert!(options.credentials.is_some(), "REVSTORE_TEST_CASSANDRA_USER must name a login ({IGNORE})");
    (keyspace, options)
}

async fn refusal(options: CassandraOptions) -> String {
    match CassandraEngine::connect(options).await {
        Ok(_) => panic!("connected where it must not"),
        Err(e) => {
            eprintln!("refused, as it must be: {e}");
            e.to_string()
        }
    }
}

#[tokio::test]
#[ignore = "needs Cassandra with TLS and passwords: scripts/test runs it"]
async fn tls_login_the_store_writes_and_reads() {
    let (keyspace, options) = options();
    let store = Store::new(Arc::new(CassandraEngine::connect(options).await.expect("connect over TLS with the login")));
    store.ensure_tables(&TABLES).await.expect("tables");
    store.write(Upsert::new(&KV, [Value::from("over TLS")]).set("v", "kept")).await.expect("write");
    let row = store.get(&KV, vec![Value::from("over TLS")], None).await.expect("read").expect("the row");
    assert_eq!(row.text("v"), Some("kept"));
    drop(keyspace);
}

#[tokio::test]
#[ignore = "needs Cassandra with TLS and passwords: scripts/test runs it"]
async fn tls_login_plain_tcp_another_ca_no_client_certificate_a_wrong_password_and_none_are_refused() {
    let (_keyspace, options) = options();

    let mut plain = options.clone();
    plain.tls = None;
    let error = refusal(plain).await;
    assert!(error.contains("cannot connect to Cassandra"), "plain TCP to a TLS-only node: {error}");

    // A CA of our own, which did not sign the node's certificate.
    let dir = tempfile::tempdir().expect("tempdir");
    let other_ca = dir.path().join("other-ca.pem");
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=not the node's CA"])
        .arg("-keyout")
        .arg(dir.path().join("other-ca.key"))
        .arg("-out")
        .arg(&other_ca)
        .output()
        .expect("run openssl");
    assert!(made.status.success(), "openssl: {}", String::from_utf8_lossy(&made.stderr));
    let mut untrusted = options.clone();
    untrusted.tls = untrusted.tls.map(|tls| CassandraTls { ca_file: other_ca, ..tls });
    let error = refusal(untrusted).await;
    assert!(error.contains("certificate") || error.contains("UnknownIssuer"), "a node certificate from another CA: {error}");

    if options.tls.as_ref().is_some_and(|tls| tls.client_identity.is_some()) {
        let mut no_certificate = options.clone();
        no_certificate.tls = no_certificate.tls.map(|tls| CassandraTls { client_identity: None, ..tls });
        let error = refusal(no_certificate).await;
        assert!(error.contains("cannot connect to Cassandra"), "no client certificate to a node that requires one: {error}");
    }

    let mut wrong = options.clone();
    wrong.credentials = wrong.credentials.map(|(user, _)| (user, "not the password".to_owned()));
    let error = refusal(wrong).await;
    assert!(error.to_lowercase().contains("authentication") || error.contains("credentials"), "a wrong password: {error}");

    let mut anonymous = options;
    anonymous.credentials = None;
    let error = refusal(anonymous).await;
    assert!(error.contains("cannot connect to Cassandra"), "no login: {error}");
}
