//! `revstore-migrate` as an operator runs it: twice, and against a database
//! whose schema it must not touch.

use std::process::Command;

use revstore_schema::tables::meta::SCHEMA_META;
use revstore_schema::version::OLD_STORE;
use revstore_storage::testing::TestKeyspace;
use revstore_storage::{EmbeddedOptions, StorageSettings, Upsert, Value};

fn migrate(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_revstore-migrate"));
    cmd.args(args).env_remove("REVSTORE_CASSANDRA").env_remove("REVSTORE_DATA_DIR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run revstore-migrate");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn embedded_migration_is_safe_to_run_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf-8 path");
    let (code, said) = migrate(&["--data-dir", data], &[]);
    assert_eq!(code, 0, "{said}");
    for c in revstore_schema::COMPONENTS {
        assert!(said.contains(&format!("embedded: {}: created schema version {}", c.name, c.version)), "{said}");
    }
    let (code, said) = migrate(&[], &[("REVSTORE_DATA_DIR", data)]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains(&format!("old-store: schema already at version {}", OLD_STORE.version)), "{said}");
}

/// As a newer revstore would have recorded old-store's schema.
fn record_old_store(dir: &std::path::Path, version: i64, compatible_from: i64) {
    runtime().block_on(async {
        let settings = StorageSettings::Embedded { data_dir: dir.to_owned(), options: EmbeddedOptions::default() };
        let store = revstore_storage::open(settings).await.expect("open");
        store.ensure_tables(&[&SCHEMA_META]).await.expect("table");
        let row = Upsert::new(&SCHEMA_META, [Value::from("old-store")]).set("version", version).set("compatible_from", compatible_from);
        store.write(row).await.expect("write");
    });
}

#[test]
fn a_newer_schema_is_left_alone_when_compatible_and_refused_when_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf-8 path");
    assert_eq!(migrate(&["--data-dir", data], &[]).0, 0);
    let ours = i64::from(OLD_STORE.version);
    // A newer revstore added to old-store's tables, in a way this build can use.
    record_old_store(dir.path(), ours + 1, ours);
    let (code, said) = migrate(&["--data-dir", data], &[]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains(&format!("old-store: schema at version {}, newer than this build's and compatible", ours + 1)), "{said}");
    // One this build cannot use.
    record_old_store(dir.path(), ours + 2, ours + 2);
    let (code, said) = migrate(&["--data-dir", data], &[]);
    assert_eq!(code, 65, "{said}");
    assert!(said.contains("run a newer revstore"), "{said}");
}

#[test]
fn bad_settings_exit_64() {
    let (code, said) = migrate(&["--cassandra", "127.0.0.1:1", "--cassandra-replication", "zero"], &[]);
    assert_eq!(code, 2, "clap rejects a bad value before we run: {said}");
    let (code, said) = migrate(&["--cassandra", "127.0.0.1:1", "--cassandra-username", "u"], &[]);
    assert_eq!(code, 64, "{said}");
    assert!(said.contains("go together"), "{said}");
}

#[test]
fn an_unreachable_cluster_exits_69() {
    let (code, said) = migrate(&["--cassandra", "127.0.0.1:1"], &[]);
    assert_eq!(code, 69, "{said}");
    assert!(said.contains("cannot connect"), "{said}");
}

#[test]
#[ignore = "needs Cassandra: run scripts/test, or set REVSTORE_TEST_CASSANDRA and pass --ignored"]
fn cassandra_migration_is_safe_to_run_twice() {
    let keyspace = TestKeyspace::new("migrate");
    let args = ["--cassandra", keyspace.node(), "--keyspace", keyspace.name()];
    let (code, said) = migrate(&args, &[]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains(&format!("cassandra: old-store: created schema version {}", OLD_STORE.version)), "{said}");
    let (code, said) = migrate(&args, &[]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains(&format!("old-store: schema already at version {}", OLD_STORE.version)), "{said}");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}
