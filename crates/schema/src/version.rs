//! The schema version every service records and checks.
//!
//! [`SCHEMA_VERSION`] is what operators see; the [`fingerprint`] is derived from
//! the declarations, so a table change that forgets to bump the version fails the
//! test below instead of reaching a cluster unannounced.

use sha2::{Digest, Sha256};

use crate::cql::create_table;
use crate::tables::ALL_TABLES;

/// Bump when a declaration changes, together with [`EXPECTED_FINGERPRINT`].
pub const SCHEMA_VERSION: u32 = 5;

/// The fingerprint of the declarations at [`SCHEMA_VERSION`].
pub const EXPECTED_FINGERPRINT: &str = "428bc49c215b7e56";

/// A short digest of every table's DDL.
pub fn fingerprint() -> String {
    let mut hash = Sha256::new();
    for table in ALL_TABLES {
        hash.update(create_table("ks", table).as_bytes());
        hash.update(b"\n");
    }
    hash.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations_match_the_schema_version() {
        assert_eq!(
            fingerprint(),
            EXPECTED_FINGERPRINT,
            "the table declarations changed: bump SCHEMA_VERSION and set EXPECTED_FINGERPRINT to the new fingerprint"
        );
    }
}
