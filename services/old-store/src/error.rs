//! What the archive's operations fail with, without HTTP: the compactor, the
//! debt sweep and a janitor call them as they are; the HTTP edge maps them to
//! problem documents once (`impl From<ArchiveError> for ApiError`).

use revstore_service::ApiError;
use revstore_storage::StoreError;

use crate::block::BlockKey;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Stored bytes failed their checks: never served as content.
    #[error("integrity error in {block}: {what}")]
    Integrity { block: String, what: String },
    /// A render too large for a block entry or a chained revision.
    #[error("{0}")]
    TooLarge(String),
    /// Writers kept taking the title's next slot first.
    #[error("too many concurrent writers to this title; retry later")]
    Contended,
    /// A background task failed (a panic or cancellation in a blocking task).
    #[error("internal: {0}")]
    Internal(String),
}

impl ArchiveError {
    /// An integrity error, counted in `old_store_integrity_errors_total`.
    pub(crate) fn integrity(key: &BlockKey, what: impl std::fmt::Display) -> Self {
        metrics::counter!("old_store_integrity_errors_total", "service" => crate::SERVICE).increment(1);
        ArchiveError::Integrity { block: key.to_string(), what: what.to_string() }
    }

    pub(crate) fn internal(e: impl std::fmt::Display) -> Self {
        ArchiveError::Internal(e.to_string())
    }
}

impl From<ArchiveError> for ApiError {
    fn from(e: ArchiveError) -> Self {
        match e {
            ArchiveError::Store(e) => e.into(),
            ArchiveError::TooLarge(detail) => ApiError::payload_too_large(detail),
            ArchiveError::Contended => ApiError::unavailable(e.to_string()),
            e @ (ArchiveError::Integrity { .. } | ArchiveError::Internal(_)) => ApiError::internal(e),
        }
    }
}
