//! What tests need beyond the service's API (the `testsuite` feature): where
//! a page's outbox rows go, to find or take them away as a lost hand-off.

pub use crate::pages::outbox_shard;
