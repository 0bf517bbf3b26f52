//! What tests need beyond the service's API (the `testsuite` feature): where
//! a page's outbox rows go, to find them or queue one no request could, and
//! the outbox's delivery, to drive it round by round on an injected clock.

pub use crate::outbox::minute_of as outbox_minute;
pub use crate::outbox::outbox_shard;
pub use crate::outbox::{Delivery, FAULTY_ATTEMPTS, Receivers, SETTLE, check_site_number, dead_letters};
