//! Backup and restore of embedded data directories.
//!
//! A backup is taken while the services run: each database is copied with
//! SQLite's `VACUUM INTO`, one read transaction, so the copy is the database
//! as of one instant (writes go on meanwhile; the WAL keeps them apart). A
//! data directory is a service's own (`DIR/revstore.db`) or `revstore up`'s
//! (`DIR/<service>/revstore.db`); both are found. Each database is
//! consistent on its own; services are not frozen together, so a render
//! written during the backup may be in current-store's copy and not yet in
//! old-store's — the outbox delivers it again after a restore, as after any
//! restart.
//!
//! A restore needs the services stopped (it takes each directory's `LOCK`,
//! which a running engine holds) and an empty destination, so it can never
//! overwrite live data.

use std::path::{Path, PathBuf};

use rusqlite::Connection;

use super::DATABASE_FILE;
use crate::error::{StoreError, StoreResult};

/// What a backup or a restore copied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Copied {
    /// The databases copied, as paths relative to the data directory
    /// (`revstore.db`, `old-store/revstore.db`, …).
    pub databases: Vec<PathBuf>,
    pub bytes: u64,
}

/// Files kept beside the databases that a restore needs too (`revstore up`'s write token).
const KEPT_FILES: [&str; 1] = ["write-token"];

fn unavailable(what: &str, path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("{what} {}: {e}", path.display()))
}

/// The databases of a data directory: its own, and its subdirectories'.
fn databases_in(data_dir: &Path) -> StoreResult<Vec<PathBuf>> {
    let mut found = Vec::new();
    if data_dir.join(DATABASE_FILE).is_file() {
        found.push(PathBuf::from(DATABASE_FILE));
    }
    let entries = std::fs::read_dir(data_dir).map_err(|e| unavailable("cannot read", data_dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| unavailable("cannot read", data_dir, e))?;
        if entry.path().join(DATABASE_FILE).is_file() {
            found.push(PathBuf::from(entry.file_name()).join(DATABASE_FILE));
        }
    }
    found.sort();
    Ok(found)
}

/// An empty (or new) directory to copy into; refuses one that holds anything.
fn empty_destination(dir: &Path) -> StoreResult<()> {
    std::fs::create_dir_all(dir).map_err(|e| unavailable("cannot create", dir, e))?;
    let mut entries = std::fs::read_dir(dir).map_err(|e| unavailable("cannot read", dir, e))?;
    if entries.next().is_some() {
        return Err(StoreError::Invalid(format!("{} is not empty: copy into a new directory", dir.display())));
    }
    Ok(())
}

/// Runs SQLite's full integrity check on the database at `path` (read-only):
/// a truncated, zeroed or foreign file is refused, named, as `Invalid`.
pub fn check_integrity(path: &Path) -> StoreResult<()> {
    use rusqlite::OpenFlags;
    let corrupt = |why: String| StoreError::Invalid(format!("{} is not a sound database: {why}", path.display()));
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(|e| corrupt(e.to_string()))?;
    // The first problems SQLite finds; it stops after this many.
    let mut statement = conn.prepare("PRAGMA integrity_check(5)").map_err(|e| corrupt(e.to_string()))?;
    let findings: Vec<String> =
        statement.query_map([], |row| row.get::<_, String>(0)).and_then(|rows| rows.collect()).map_err(|e| corrupt(e.to_string()))?;
    match findings.as_slice() {
        [ok] if ok == "ok" => Ok(()),
        // A finding names pages and tables, never row content; kept short.
        _ => Err(corrupt(findings.join("; ").chars().take(500).collect())),
    }
}

/// Copies every database of `data_dir` into `destination` (new or empty),
/// while the services may run. Each copy is integrity-checked before it is
/// given its name, so a backup that exists is a sound one.
pub fn backup(data_dir: &Path, destination: &Path) -> StoreResult<Copied> {
    let databases = databases_in(data_dir)?;
    if databases.is_empty() {
        return Err(StoreError::Invalid(format!("no revstore database in {} or its subdirectories", data_dir.display())));
    }
    empty_destination(destination)?;
    let mut copied = Copied::default();
    for relative in databases {
        let source = data_dir.join(&relative);
        let target = destination.join(&relative);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| unavailable("cannot create", parent, e))?;
        }
        let conn = Connection::open(&source)?;
        // A reader beside the running engine: it waits out the writer's
        // checkpoints instead of failing. (`query_only` would refuse VACUUM
        // INTO, which writes only the new file.)
        conn.execute_batch("PRAGMA busy_timeout = 10000;")?;
        let partial = target.with_extension("db.partial");
        let _ = std::fs::remove_file(&partial);
        conn.execute("VACUUM INTO ?1", [partial.to_string_lossy()])?;
        drop(conn);
        std::fs::File::open(&partial).and_then(|f| f.sync_all()).map_err(|e| unavailable("cannot sync", &partial, e))?;
        if let Err(e) = check_integrity(&partial) {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
        std::fs::rename(&partial, &target).map_err(|e| unavailable("cannot rename", &partial, e))?;
        copied.bytes += std::fs::metadata(&target).map(|m| m.len()).unwrap_or(0);
        copied.databases.push(relative);
    }
    copy_kept_files(data_dir, destination)?;
    Ok(copied)
}

/// Copies a backup into `data_dir`, which must hold no database (stop the
/// services first; a new directory is simplest).
pub fn restore(backup: &Path, data_dir: &Path) -> StoreResult<Copied> {
    let databases = databases_in(backup)?;
    if databases.is_empty() {
        return Err(StoreError::Invalid(format!("{} holds no revstore database: not a backup", backup.display())));
    }
    // Every database checked before anything is copied: a corrupt backup
    // changes nothing, instead of restoring a system that cannot start or
    // answers 500s.
    for relative in &databases {
        check_integrity(&backup.join(relative))?;
    }
    std::fs::create_dir_all(data_dir).map_err(|e| unavailable("cannot create", data_dir, e))?;
    let mut copied = Copied::default();
    for relative in databases {
        let target = data_dir.join(&relative);
        let dir = target.parent().unwrap_or(data_dir).to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|e| unavailable("cannot create", &dir, e))?;
        // The engine's own lock: held by a running service, it refuses.
        let lock = std::fs::File::create(dir.join("LOCK")).map_err(|e| unavailable("cannot create the lock file in", &dir, e))?;
        lock.try_lock().map_err(|_| StoreError::Unavailable(format!("{} is in use: stop the service first", dir.display())))?;
        if target.exists() {
            return Err(StoreError::Invalid(format!("{} already exists: restore into an empty data directory", target.display())));
        }
        let partial = target.with_extension("db.partial");
        std::fs::copy(backup.join(&relative), &partial).map_err(|e| unavailable("cannot copy into", &partial, e))?;
        std::fs::File::open(&partial).and_then(|f| f.sync_all()).map_err(|e| unavailable("cannot sync", &partial, e))?;
        // A database from VACUUM INTO is whole: no WAL belongs to it.
        for stale in ["revstore.db-wal", "revstore.db-shm"] {
            let _ = std::fs::remove_file(dir.join(stale));
        }
        std::fs::rename(&partial, &target).map_err(|e| unavailable("cannot rename", &partial, e))?;
        copied.bytes += std::fs::metadata(&target).map(|m| m.len()).unwrap_or(0);
        copied.databases.push(relative);
    }
    copy_kept_files(backup, data_dir)?;
    Ok(copied)
}

fn copy_kept_files(from: &Path, to: &Path) -> StoreResult<()> {
    for name in KEPT_FILES {
        let source = from.join(name);
        if source.is_file() && !to.join(name).exists() {
            std::fs::copy(&source, to.join(name)).map_err(|e| unavailable("cannot copy", &source, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::embedded::{EmbeddedEngine, EmbeddedOptions};
    use crate::{Store, Upsert, Value};
    use revstore_schema::tables::current_store::{PAGE_RENDERS, col};

    async fn open(dir: &Path) -> Store {
        let store = Store::new(Arc::new(EmbeddedEngine::open(dir, EmbeddedOptions::default()).expect("open")));
        store.migrate(&revstore_schema::COMPONENTS).await.expect("migrate");
        store
    }

    /// One render's tid (a time-based UUID) for every page.
    const TID: uuid::Uuid = uuid::Uuid::from_u128(0x1c8f_2e00_d0a1_11ef_8000_0000_0000_0001);

    fn key(i: usize) -> Vec<Value> {
        vec![Value::from("en.wikipedia.org"), Value::from(format!("p{i}").as_str()), Value::from(1i64), Value::TimeUuid(TID)]
    }

    fn page(i: usize) -> Upsert {
        Upsert::new(&PAGE_RENDERS, key(i)).set(col::HTML, format!("page {i}").into_bytes())
    }

    /// How many of the pages p0..p299 the store holds.
    async fn pages(store: &Store) -> usize {
        let mut n = 0;
        for i in 0..300 {
            if store.get(&PAGE_RENDERS, key(i), None).await.expect("get").is_some() {
                n += 1;
            }
        }
        n
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_backup_taken_while_writing_restores_a_consistent_database() {
        let live = tempfile::tempdir().expect("tempdir");
        let service_dir = live.path().join("current-store");
        let store = open(&service_dir).await;
        for i in 0..100 {
            store.write(page(i)).await.expect("write");
        }
        std::fs::write(live.path().join("write-token"), "token\n").expect("token");
        // Writes go on during the backup: the copy holds the first hundred and a prefix of the rest.
        let writer = {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 100..300 {
                    store.write(page(i)).await.expect("write");
                }
            })
        };
        let backups = tempfile::tempdir().expect("tempdir");
        let destination = backups.path().join("b1");
        let copied = tokio::task::spawn_blocking({
            let (from, to) = (live.path().to_path_buf(), destination.clone());
            move || backup(&from, &to)
        })
        .await
        .expect("join")
        .expect("backup");
        writer.await.expect("writer");
        assert_eq!(copied.databases, [PathBuf::from("current-store/revstore.db")]);
        assert!(copied.bytes > 0);

        // Copying over a backup or into a running service's directory is refused.
        assert!(matches!(backup(live.path(), &destination), Err(StoreError::Invalid(_))));
        assert!(matches!(restore(&destination, live.path()), Err(StoreError::Unavailable(_))), "the running service holds its lock");

        let restored = backups.path().join("restored");
        assert_eq!(restore(&destination, &restored).expect("restore").databases, copied.databases);
        assert!(matches!(restore(&destination, &restored), Err(StoreError::Invalid(_))), "never over existing data");
        assert_eq!(std::fs::read_to_string(restored.join("write-token")).expect("token"), "token\n");
        let back = open(&restored.join("current-store")).await;
        let n = pages(&back).await;
        assert!((100..=300).contains(&n), "{n} pages restored");
        // One instant: the writes are sequential, so the restored pages are p0..p(n-1).
        for i in [0, n - 1] {
            assert!(back.get(&PAGE_RENDERS, key(i), None).await.expect("get").is_some(), "p{i}");
        }
        assert_eq!(pages(&store).await, 300, "the live database is untouched");
    }

    /// The probe's corrupt backups: one truncated to half restored with exit
    /// 0 (and `revstore up` then refused to start); one with 64 KiB zeroed
    /// restored, was ready, and answered 500 to nearly every read. Both are
    /// refused now, naming the file, and the destination stays empty.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_corrupt_backup_is_refused_and_restores_nothing() {
        let live = tempfile::tempdir().expect("tempdir");
        let store = open(&live.path().join("old-store")).await;
        for i in 0..300 {
            store.write(page(i).set(col::DATA_PARSOID, vec![b'x'; 2000])).await.expect("write");
        }
        let backups = tempfile::tempdir().expect("tempdir");
        let sound = backups.path().join("sound");
        backup(live.path(), &sound).expect("backup");
        let database = PathBuf::from("old-store/revstore.db");
        check_integrity(&sound.join(&database)).expect("a fresh backup is sound");
        let bytes = std::fs::read(sound.join(&database)).expect("read");
        assert!(bytes.len() > 256 * 1024, "{} bytes: too small to damage the middle", bytes.len());

        let damaged = |name: &str, damage: &dyn Fn(&mut Vec<u8>)| {
            let dir = backups.path().join(name);
            std::fs::create_dir_all(dir.join("old-store")).expect("mkdir");
            let mut copy = bytes.clone();
            damage(&mut copy);
            std::fs::write(dir.join(&database), copy).expect("write");
            dir
        };
        let truncated = damaged("truncated", &|b| b.truncate(b.len() / 2));
        let zeroed = damaged("zeroed", &|b| {
            let middle = b.len() / 2 / 4096 * 4096;
            b[middle..middle + 64 * 1024].fill(0);
        });
        let foreign = damaged("foreign", &|b| b.iter_mut().for_each(|x| *x = 0x5a));
        for backup_dir in [truncated, zeroed, foreign] {
            let into = backups.path().join(format!("{}-restored", backup_dir.file_name().unwrap().to_string_lossy()));
            let refused = restore(&backup_dir, &into).expect_err("a corrupt backup restores");
            assert!(matches!(refused, StoreError::Invalid(_)), "{refused:?}");
            assert!(refused.to_string().contains("old-store/revstore.db"), "the file is named: {refused}");
            assert!(!into.join(&database).exists(), "{} was restored", backup_dir.display());
        }
        assert!(restore(&sound, &backups.path().join("restored")).is_ok());
    }
}
