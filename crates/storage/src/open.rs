//! Opening a store from settings: the one place that chooses the engine.

use std::path::PathBuf;
use std::sync::Arc;

use crate::cassandra::{CassandraEngine, CassandraOptions};
use crate::embedded::{EmbeddedEngine, EmbeddedOptions};
use crate::error::StoreResult;
use crate::store::Store;

/// Which engine, and how to reach it.
#[derive(Debug, Clone)]
pub enum StorageSettings {
    /// SQLite under `data_dir` (the default: no server to run).
    Embedded { data_dir: PathBuf, options: EmbeddedOptions },
    /// A Cassandra or ScyllaDB cluster.
    Cassandra(CassandraOptions),
}

impl StorageSettings {
    pub fn engine_name(&self) -> &'static str {
        match self {
            StorageSettings::Embedded { .. } => "embedded",
            StorageSettings::Cassandra(_) => "cassandra",
        }
    }

    /// How long after it was sent a write may still land: the request
    /// timeout on Cassandra; the embedded engine's writes are in order, none
    /// in flight behind another.
    pub fn write_timeout(&self) -> std::time::Duration {
        match self {
            StorageSettings::Cassandra(options) => options.request_timeout,
            StorageSettings::Embedded { .. } => std::time::Duration::ZERO,
        }
    }
}

/// Opens the engine the settings name.
pub async fn open(settings: StorageSettings) -> StoreResult<Store> {
    Ok(match settings {
        StorageSettings::Embedded { data_dir, options } => Store::new(Arc::new(EmbeddedEngine::open(&data_dir, options)?)),
        StorageSettings::Cassandra(options) => Store::new(Arc::new(CassandraEngine::connect(options).await?)),
    })
}
