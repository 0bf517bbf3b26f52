//! Creating and checking the schema: what `revstore-migrate` runs and what a
//! service checks before it reports ready.

use revstore_schema::tables::meta::SCHEMA_META;
use revstore_schema::{SCHEMA_VERSION, TableDef, fingerprint};

use crate::clock::{Clock, SystemClock};
use crate::error::{StoreError, StoreResult};
use crate::ops::Upsert;
use crate::store::Store;
use crate::value::Value;

/// The `schema_meta` row revstore's own tables are recorded under.
pub const SCHEMA_COMPONENT: &str = "revstore";

/// What a migration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationOutcome {
    /// No schema was recorded: the tables were created.
    Created { version: u32 },
    /// An older version was recorded: new tables were created.
    Upgraded { from: u32, to: u32 },
    /// Already at this version: nothing to do.
    UpToDate { version: u32 },
}

impl std::fmt::Display for MigrationOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MigrationOutcome::Created { version } => write!(f, "created schema version {version}"),
            MigrationOutcome::Upgraded { from, to } => write!(f, "upgraded schema from version {from} to {to}"),
            MigrationOutcome::UpToDate { version } => write!(f, "schema already at version {version}"),
        }
    }
}

impl Store {
    /// Creates what is missing of `tables` and records this build's schema
    /// version. Safe to run any number of times; refuses a database whose
    /// recorded schema is newer than this build's.
    pub async fn migrate(&self, tables: &[&'static TableDef]) -> StoreResult<MigrationOutcome> {
        self.ensure_tables(&[&SCHEMA_META]).await?;
        let recorded = self.recorded_schema().await?;
        if let Some((version, recorded_fingerprint)) = &recorded {
            if *version > SCHEMA_VERSION {
                return Err(StoreError::SchemaMismatch(format!(
                    "the database is at schema version {version}, newer than this build's {SCHEMA_VERSION}: run a newer revstore"
                )));
            }
            if *version == SCHEMA_VERSION && *recorded_fingerprint != fingerprint() {
                return Err(StoreError::SchemaMismatch(format!(
                    "schema version {version} was recorded with fingerprint {recorded_fingerprint}, this build has {}",
                    fingerprint()
                )));
            }
        }
        self.ensure_tables(tables).await?;
        let outcome = match recorded {
            None => MigrationOutcome::Created { version: SCHEMA_VERSION },
            Some((version, _)) if version == SCHEMA_VERSION => return Ok(MigrationOutcome::UpToDate { version }),
            Some((from, _)) => MigrationOutcome::Upgraded { from, to: SCHEMA_VERSION },
        };
        self.write(
            Upsert::new(&SCHEMA_META, [Value::from(SCHEMA_COMPONENT)])
                .set("version", SCHEMA_VERSION as i64)
                .set("fingerprint", fingerprint())
                .set("applied_at", Value::Timestamp(SystemClock.now_micros() / 1000)),
        )
        .await?;
        Ok(outcome)
    }

    /// Succeeds when the database holds exactly this build's schema.
    pub async fn check_schema(&self) -> StoreResult<u32> {
        match self.recorded_schema().await {
            Ok(Some((version, recorded))) if version == SCHEMA_VERSION && recorded == fingerprint() => Ok(version),
            Ok(Some((version, _))) => Err(StoreError::SchemaMismatch(format!(
                "the database is at schema version {version}, this build needs {SCHEMA_VERSION}: run revstore-migrate"
            ))),
            Ok(None) | Err(StoreError::SchemaMismatch(_)) => {
                Err(StoreError::SchemaMismatch("no schema recorded: run revstore-migrate".into()))
            }
            Err(e) => Err(e),
        }
    }

    async fn recorded_schema(&self) -> StoreResult<Option<(u32, String)>> {
        let row = self.get(&SCHEMA_META, vec![Value::from(SCHEMA_COMPONENT)], None).await?;
        Ok(row.and_then(|r| Some((u32::try_from(r.bigint("version")?).ok()?, r.text("fingerprint")?.to_owned()))))
    }
}
