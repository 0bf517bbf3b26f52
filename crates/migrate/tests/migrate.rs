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

/// The dependency graph's upgrade to version 2: its by-child table kept, its
/// by-parent rows in new tables that start empty. `--rebuild-graph-dependents`
/// fills them from the by-child rows; run again, it changes nothing.
#[test]
fn the_graph_dependents_are_rebuilt_from_the_pages_dependencies() {
    use revstore_api::ChangeKind;
    use revstore_dependency_graph::{DependentsQuery, Graph};
    use revstore_schema::tables::dependency_graph::DEPENDENCIES;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf-8 path");
    let settings = || StorageSettings::Embedded { data_dir: dir.path().to_owned(), options: EmbeddedOptions::default() };
    let expected: Vec<(i64, String)> = runtime().block_on(async {
        let store = revstore_storage::open(settings()).await.expect("open");
        store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
        // A version 1 graph as the upgrade finds it: each page's edges by child,
        // recorded at version 1.
        let mut expected = Vec::new();
        for i in 0..500i64 {
            let (child, priority) = (format!("Page_{i}"), i * 7 % 1001);
            let row = Upsert::new(
                &DEPENDENCIES,
                [
                    Value::from("en.wikipedia.org"),
                    Value::from(child.as_str()),
                    Value::from(priority),
                    Value::from("modification"),
                    Value::from("Template:Infobox"),
                ],
            )
            .set("child_selector", "[\"mw1\"]")
            .set("created", Value::Timestamp(1_700_000_000_000));
            store.write(row).await.expect("edge");
            expected.push((priority, child));
        }
        store
            .write(Upsert::new(&SCHEMA_META, [Value::from("dependency-graph")]).set("version", 1i64).set("compatible_from", 1i64))
            .await
            .expect("v1");
        expected.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        expected
    });
    let listed = || {
        runtime().block_on(async {
            let graph = Graph::new(revstore_storage::open(settings()).await.expect("open"), 10_000);
            let (domain, parent) = (
                revstore_keys::Domain::parse("en.wikipedia.org").expect("domain"),
                revstore_keys::Title::parse("Template:Infobox", revstore_keys::TitleRules::default()).expect("title"),
            );
            let (mut listed, mut cursor) = (Vec::new(), None);
            loop {
                let query = DependentsQuery { kind: ChangeKind::Modification, min_priority: 0, max_priority: 1000, limit: 64, cursor };
                let page = graph.dependents(&domain, &parent, query).await.expect("list");
                listed.extend(page.items.into_iter().map(|d| {
                    assert_eq!(d.child_selector, Some(vec!["mw1".to_owned()]));
                    (d.priority, d.child)
                }));
                match page.next {
                    Some(next) => cursor = Some(next),
                    None => return listed,
                }
            }
        })
    };
    assert!(listed().is_empty(), "the new tables start empty");
    let (code, said) = migrate(&["--data-dir", data, "--rebuild-graph-dependents"], &[]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("dependency-graph: upgraded schema from version 1 to 2"), "{said}");
    assert!(said.contains("rebuilt the dependents of 500 edges of 500 pages"), "{said}");
    assert_eq!(listed(), expected);
    let (code, said) = migrate(&["--data-dir", data, "--rebuild-graph-dependents"], &[]);
    assert_eq!(code, 0, "{said}");
    assert_eq!(listed(), expected, "a second rebuild changes nothing");
}
