//! Keys of revstore: what identifies a page, a revision and a render.
//!
//! # Layout
//! - [`domain`]: the wiki's host name ([`Domain`]).
//! - [`title`]: MediaWiki title normalisation ([`Title`], [`TitleRules`]).
//! - [`rev`]: revision ids ([`RevId`]).
//! - [`tid`]: time-based render ids ([`Tid`]), strictly increasing within a process.
//! - [`token`]: the partition key hash, identical to Cassandra's Murmur3 token.
//!
//! Every parser here takes untrusted input (URL path segments) and answers with a
//! [`KeyError`] that names the problem; none panics.

pub mod domain;
pub mod rev;
pub mod tid;
pub mod time;
pub mod title;
pub mod token;

pub use domain::Domain;
pub use rev::RevId;
pub use tid::{Tid, TidGenerator};
pub use time::{MAX_CLOCK_SKEW, rfc3339};
pub use title::{FirstLetterCase, Title, TitleRules};
pub use token::{composite_key_bytes, murmur3_token};

/// Why a key was rejected. The message is meant for the client that sent it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("invalid domain {input:?}: {reason}")]
    Domain { input: String, reason: &'static str },
    #[error("invalid title {input:?}: {reason}")]
    Title { input: String, reason: String },
    #[error("invalid revision {input:?}: {reason}")]
    Rev { input: String, reason: &'static str },
    #[error("invalid tid {input:?}: {reason}")]
    Tid { input: String, reason: &'static str },
}

/// A page's key from the two path segments that name it: the wiki's domain
/// and the page's title, normalised by the wiki's title rules.
pub fn parse_page(domain: &str, title: &str, rules: TitleRules) -> Result<(Domain, Title), KeyError> {
    Ok((Domain::parse(domain)?, Title::parse(title, rules)?))
}
