//! Creating and checking the schema, one component (a service's tables) at a
//! time: what `revstore-migrate` runs and what a service checks before it
//! reports ready.

use revstore_schema::Component;
use revstore_schema::tables::meta::SCHEMA_META;

use crate::error::{StoreError, StoreResult};
use crate::ops::Upsert;
use crate::store::Store;
use crate::value::Value;

/// What a migration did to one component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationOutcome {
    /// No version was recorded: the tables were created.
    Created { version: u32 },
    /// An older version was recorded: what it lacked was added.
    Upgraded { from: u32, to: u32 },
    /// Already at this version: nothing to do.
    UpToDate { version: u32 },
    /// A newer version this build can work with was recorded: left as it is.
    NewerCompatible { version: u32 },
}

impl std::fmt::Display for MigrationOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MigrationOutcome::Created { version } => write!(f, "created schema version {version}"),
            MigrationOutcome::Upgraded { from, to } => write!(f, "upgraded schema from version {from} to {to}"),
            MigrationOutcome::UpToDate { version } => write!(f, "schema already at version {version}"),
            MigrationOutcome::NewerCompatible { version } => {
                write!(f, "schema at version {version}, newer than this build's and compatible with it: left as it is")
            }
        }
    }
}

/// A component's recorded schema.
struct Recorded {
    version: u32,
    compatible_from: u32,
    fingerprint: String,
}

impl Store {
    /// Creates what is missing of each component's tables (new tables, and
    /// columns a newer declaration adds) and records its version. Safe to run
    /// any number of times; leaves a newer compatible schema as it is, and
    /// refuses a newer incompatible one or a version whose tables differ.
    pub async fn migrate(&self, components: &[&'static Component]) -> StoreResult<Vec<(&'static str, MigrationOutcome)>> {
        self.ensure_tables(&[&SCHEMA_META]).await?;
        let mut outcomes = Vec::with_capacity(components.len());
        for c in components {
            outcomes.push((c.name, self.migrate_component(c).await?));
        }
        Ok(outcomes)
    }

    async fn migrate_component(&self, c: &'static Component) -> StoreResult<MigrationOutcome> {
        let recorded = self.recorded_schema(c.name).await?;
        if let Some(r) = &recorded {
            if r.version > c.version {
                return if r.compatible_from <= c.version {
                    Ok(MigrationOutcome::NewerCompatible { version: r.version })
                } else {
                    Err(StoreError::SchemaMismatch(format!(
                        "{} is at schema version {}, which needs version {} or newer of its code; this build is {}: run a newer revstore",
                        c.name, r.version, r.compatible_from, c.version
                    )))
                };
            }
            if r.version == c.version && r.fingerprint != c.fingerprint() {
                return Err(StoreError::SchemaMismatch(format!(
                    "{} schema version {} was recorded with fingerprint {}, this build has {}",
                    c.name,
                    r.version,
                    r.fingerprint,
                    c.fingerprint()
                )));
            }
        }
        self.ensure_tables(c.tables).await?;
        let outcome = match recorded {
            None => MigrationOutcome::Created { version: c.version },
            Some(r) if r.version == c.version => return Ok(MigrationOutcome::UpToDate { version: r.version }),
            Some(r) => MigrationOutcome::Upgraded { from: r.version, to: c.version },
        };
        self.write(
            Upsert::new(&SCHEMA_META, [Value::from(c.name)])
                .set("version", i64::from(c.version))
                .set("compatible_from", i64::from(c.compatible_from))
                .set("fingerprint", c.fingerprint())
                // The store's clock: the time its writes carry (an injected one in tests).
                .set("applied_at", Value::Timestamp(self.now_micros() / 1000)),
        )
        .await?;
        Ok(outcome)
    }

    /// The component's recorded version, when this build can serve on it:
    /// its own version with the same tables, or a newer one whose
    /// `compatible_from` admits this build (an additive change made by a newer
    /// build during a rolling upgrade).
    pub async fn check_schema(&self, c: &Component) -> StoreResult<u32> {
        let recorded = match self.recorded_schema(c.name).await {
            Ok(Some(r)) => r,
            Ok(None) | Err(StoreError::SchemaMismatch(_)) => {
                return Err(StoreError::SchemaMismatch(format!("no schema recorded for {}: run revstore-migrate", c.name)));
            }
            Err(e) => return Err(e),
        };
        if recorded.version == c.version && recorded.fingerprint == c.fingerprint() {
            return Ok(recorded.version);
        }
        if recorded.version > c.version && recorded.compatible_from <= c.version {
            return Ok(recorded.version);
        }
        Err(StoreError::SchemaMismatch(if recorded.version < c.version {
            format!("{} is at schema version {}, this build needs {}: run revstore-migrate", c.name, recorded.version, c.version)
        } else if recorded.version > c.version {
            format!(
                "{} is at schema version {}, which needs version {} or newer of its code; this build is {}",
                c.name, recorded.version, recorded.compatible_from, c.version
            )
        } else {
            format!("{} schema version {} was recorded with other tables than this build's", c.name, c.version)
        }))
    }

    async fn recorded_schema(&self, component: &str) -> StoreResult<Option<Recorded>> {
        let row = self.get(&SCHEMA_META, vec![Value::from(component)], None).await?;
        Ok(row.and_then(|r| {
            let version = u32::try_from(r.bigint("version")?).ok()?;
            Some(Recorded {
                version,
                // Recorded before the column existed: only its own version's code.
                compatible_from: r.bigint("compatible_from").and_then(|v| u32::try_from(v).ok()).unwrap_or(version),
                fingerprint: r.text("fingerprint")?.to_owned(),
            })
        }))
    }
}
