//! What the graph's operations fail with, without HTTP; mapped to problem
//! documents once (`impl From<GraphError> for ApiError`).

use revstore_service::ApiError;
use revstore_storage::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An edge, a change or a query that is not acceptable (nothing was written).
    #[error("{0}")]
    Invalid(String),
    /// A dependency set over the configured limit.
    #[error("{given} edges is more than the {max} one page may have (REVSTORE_GRAPH_MAX_EDGES)")]
    TooManyEdges { given: usize, max: usize },
    /// The page's edges stayed held by other writers for as long as a writer waits.
    #[error("the page's dependencies are being changed by other writers; retry shortly")]
    Busy,
    /// A stored row that does not decode.
    #[error("{0}")]
    Corrupt(String),
    #[error("internal: {0}")]
    Internal(String),
}

impl GraphError {
    pub(crate) fn internal(e: impl std::fmt::Display) -> Self {
        GraphError::Internal(e.to_string())
    }
}

impl From<revstore_keys::KeyError> for GraphError {
    fn from(e: revstore_keys::KeyError) -> Self {
        GraphError::Invalid(e.to_string())
    }
}

impl From<revstore_api::BodyError> for GraphError {
    fn from(e: revstore_api::BodyError) -> Self {
        GraphError::Invalid(e.0)
    }
}

impl From<GraphError> for ApiError {
    fn from(e: GraphError) -> Self {
        match e {
            GraphError::Store(e) => e.into(),
            GraphError::Invalid(detail) => ApiError::bad_request(detail),
            e @ GraphError::TooManyEdges { .. } => ApiError::payload_too_large(e.to_string()),
            e @ GraphError::Busy => ApiError::unavailable(e.to_string()).with_retry_after(1),
            e @ (GraphError::Corrupt(_) | GraphError::Internal(_)) => ApiError::internal(e),
        }
    }
}

/// In a janitor sweep, anything but the store's own failures is stored data
/// the sweep cannot use (the graph's sweeps take no client input).
impl From<GraphError> for revstore_service::janitor_admin::SweepError {
    fn from(e: GraphError) -> Self {
        match e {
            GraphError::Store(e) => e.into(),
            e @ GraphError::Busy => revstore_service::janitor_admin::SweepError::Busy(e.to_string()),
            e => revstore_service::janitor_admin::SweepError::corrupt(e),
        }
    }
}
