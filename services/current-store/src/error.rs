//! What the page operations fail with, without HTTP: the outbox worker and a
//! janitor call them as they are; the HTTP edge maps them to problem
//! documents once (`impl From<PagesError> for ApiError`).

use revstore_service::ApiError;
use revstore_storage::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum PagesError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The render or its key is not acceptable (nothing was written).
    #[error("{0}")]
    Invalid(String),
    /// An `If-Match` or `If-Unmodified-Since` the latest render does not meet.
    #[error("{0}")]
    PreconditionFailed(String),
    /// A write that would not be kept, refused so that no 201 is ever for a
    /// render nobody can read (nothing of the render was written).
    #[error("{detail}")]
    Refused { kind: Refusal, detail: String },
    /// A stored row or part that does not decode: never served as content.
    #[error("{0}")]
    Corrupt(String),
}

impl From<PagesError> for ApiError {
    fn from(e: PagesError) -> Self {
        match e {
            PagesError::Store(e) => e.into(),
            PagesError::Invalid(detail) => ApiError::bad_request(detail),
            PagesError::PreconditionFailed(detail) => ApiError::precondition_failed(detail),
            PagesError::Refused { kind, detail } => ApiError::conflict(detail).with_kind(kind.problem_kind()),
            e @ PagesError::Corrupt(_) => ApiError::internal(e),
        }
    }
}

/// Why a render write is refused with 409.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its revision was deleted with the page (a new revision re-creates it).
    PageDeleted,
    /// Its revision is suppressed.
    RevisionSuppressed,
    /// Another body is stored under the same (rev, tid).
    OtherBody,
}

impl Refusal {
    /// The problem document's kind (`urn:revstore:problem:<kind>`).
    pub fn problem_kind(self) -> &'static str {
        match self {
            Refusal::PageDeleted => "page-deleted",
            Refusal::RevisionSuppressed => "revision-suppressed",
            Refusal::OtherBody => "render-conflict",
        }
    }
}

impl From<revstore_keys::KeyError> for PagesError {
    fn from(e: revstore_keys::KeyError) -> Self {
        PagesError::Invalid(e.to_string())
    }
}

impl From<revstore_api::BodyError> for PagesError {
    fn from(e: revstore_api::BodyError) -> Self {
        PagesError::Invalid(e.0)
    }
}

/// In a janitor sweep, anything but the store's own failures is stored data
/// the sweep cannot use.
impl From<PagesError> for revstore_service::janitor_admin::SweepError {
    fn from(e: PagesError) -> Self {
        match e {
            PagesError::Store(e) => e.into(),
            e => revstore_service::janitor_admin::SweepError::corrupt(e),
        }
    }
}
