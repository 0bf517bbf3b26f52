//! What can go wrong in a store call, by who must act on it.

use revstore_codecs::CodecError;

pub type StoreResult<T> = Result<T, StoreError>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The request does not fit the table (wrong column, type or key): a caller bug
    /// or bad client input. Nothing was written.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A page token that was tampered with, truncated or issued for another listing.
    #[error(transparent)]
    BadPageToken(CodecError),
    /// The table is not in the database, or is there with another shape.
    #[error("schema mismatch: {0}")]
    SchemaMismatch(String),
    /// The storage cannot be reached or did not answer in time; retrying later may work.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The storage has no space left for writes (a full disk); reads go on. The
    /// operator must free or add space; writes work again by themselves then.
    #[error("storage full: {0}")]
    StorageFull(String),
    /// Stored bytes failed an integrity check.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// Anything else: a bug or an environment failure. Details are logged by the caller.
    #[error("storage failure: {0}")]
    Internal(String),
}

impl StoreError {
    pub fn invalid(msg: impl Into<String>) -> Self {
        StoreError::Invalid(msg.into())
    }

    /// True when the caller's request, not the storage, is at fault (a 4xx).
    pub fn is_client_error(&self) -> bool {
        matches!(self, StoreError::Invalid(_) | StoreError::BadPageToken(_))
    }
}
