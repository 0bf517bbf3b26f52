//! What tests need beyond the service's API (the `testsuite` feature): the
//! deletes of one direction of an edge, to leave the two tables out of step
//! as a lost write or an operator's hand would; and which bucket a dependent is in.

pub use crate::edge::{bucket, dependency_delete, dependent_delete, dependents_partition_of};
