//! The wide-column store every revstore service is written against.
//!
//! One model, Cassandra's: tables with a partition key, ordered clustering
//! columns, static and regular columns; cells with a write timestamp (last write
//! wins) and an optional TTL; row, range and partition deletes that shadow older
//! writes; conditional writes; atomic batches; token-ordered partition scans.
//! Each engine implements [`Engine`]; services hold a [`Store`], which validates
//! every request against the table declarations before an engine sees it.
//!
//! # Layout
//! - [`value`]: cell values, rows, and their byte encodings.
//! - [`ops`]: the requests (writes, reads, conditional writes, scans) and their results.
//! - [`store`]: the [`Engine`] trait, the [`Store`] handle and request validation.
//! - [`embedded`]: the SQLite engine (one directory, no server; the default).
//! - [`cassandra`]: the Cassandra/ScyllaDB engine.
//! - [`open`]: settings in, a [`Store`] out: the one place that picks the engine.
//! - [`migrate`]: creating the schema and checking its version.
//! - [`clock`]: injectable time, so TTL behaviour is tested without sleeping.
//! - [`conformance`]: the behaviour every engine must show, as a test suite that
//!   each engine's tests instantiate with [`conformance_suite!`].
//! - [`testing`]: a Cassandra keyspace of a test's own, dropped even when it fails.

pub mod cassandra;
pub mod clock;
#[cfg(feature = "testsuite")]
pub mod conformance;
pub mod embedded;
pub mod error;
mod holdings;
pub mod migrate;
pub mod open;
pub mod ops;
pub mod store;
#[cfg(feature = "testsuite")]
pub mod testing;
mod validate;
pub mod value;

pub use cassandra::{CassandraEngine, CassandraOptions, CassandraTls, ConsistencyLevel};
pub use clock::{Clock, ManualClock, SystemClock};
pub use embedded::{Durability, EmbeddedEngine, EmbeddedOptions};
pub use error::{StoreError, StoreResult};
pub use holdings::row_bytes;
pub use migrate::MigrationOutcome;
pub use open::{StorageSettings, open};
pub use ops::{
    Cas, CasOutcome, Condition, Delete, DeleteTarget, DiskUsage, Holdings, Page, PurgeStats, ReadHealth, ReadOrder, ReadQuery,
    ScanPosition, ScanQuery, ScanRows, ScannedPartition, Serialized, Site, Slice, TokenRange, Upsert, Write, slices_after,
    slices_within_after,
};
pub use revstore_schema::{ColumnType, TableDef};
pub use store::{Engine, EngineKind, Store};
pub use value::{Row, Value, clustering_key};
