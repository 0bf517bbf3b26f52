//! Where each of a service's sweeps resumes: one row per job (`retention`,
//! `audit:dry-run`…), keyed by the service too, since the services of one
//! wiki may share a keyspace (the Kubernetes base points them all at one).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use revstore_keys::Tid;
use revstore_schema::tables::janitor::CHECKPOINTS;
use revstore_storage::{Delete, Store, StoreResult, Upsert, Value};

use super::sweep::SweepPosition;

#[derive(Debug, Clone)]
pub(super) struct Checkpoints {
    store: Store,
    service: &'static str,
}

impl Checkpoints {
    pub(super) fn new(store: Store, service: &'static str) -> Self {
        Checkpoints { store, service }
    }

    fn key(&self, job: &str) -> Value {
        Value::from(format!("{}/{job}", self.service))
    }

    pub(super) async fn load(&self, job: &str) -> StoreResult<Option<SweepPosition>> {
        let row = self.store.get(&CHECKPOINTS, vec![self.key(job)], None).await?;
        let Some(cursor) = row.as_ref().and_then(|r| r.text("cursor")) else { return Ok(None) };
        match URL_SAFE_NO_PAD.decode(cursor).ok().and_then(|bytes| SweepPosition::from_bytes(&bytes).ok()) {
            Some(position) => Ok(Some(position)),
            None => {
                // Only this code writes checkpoints: an unreadable one means an
                // older build's; starting the sweep over is always safe.
                tracing::warn!(service = self.service, job, "unreadable janitor checkpoint: the sweep starts over");
                Ok(None)
            }
        }
    }

    pub(super) async fn save(&self, job: &str, position: &SweepPosition, run: &Tid) -> StoreResult<()> {
        let row = Upsert::new(&CHECKPOINTS, [self.key(job)])
            .set("cursor", URL_SAFE_NO_PAD.encode(position.to_bytes()))
            .set("run_id", Value::TimeUuid(run.uuid()))
            .set("updated_at", Value::Timestamp(revstore_keys::time::millis(self.store.now())));
        self.store.write(row).await
    }

    /// A mark a sweep keeps beyond its passes (where the last completed
    /// changed sweep ended, in microseconds), in the same table.
    pub(super) async fn load_mark(&self, name: &str) -> StoreResult<Option<i64>> {
        let row = self.store.get(&CHECKPOINTS, vec![self.key(name)], None).await?;
        Ok(row.as_ref().and_then(|r| r.text("cursor")).and_then(|text| text.parse().ok()))
    }

    pub(super) async fn save_mark(&self, name: &str, micros: i64) -> StoreResult<()> {
        let row = Upsert::new(&CHECKPOINTS, [self.key(name)])
            .set("cursor", micros.to_string())
            .set("updated_at", Value::Timestamp(revstore_keys::time::millis(self.store.now())));
        self.store.write(row).await
    }

    pub(super) async fn clear(&self, job: &str) -> StoreResult<()> {
        self.store.write(Delete::partition(&CHECKPOINTS, [self.key(job)])).await
    }
}
