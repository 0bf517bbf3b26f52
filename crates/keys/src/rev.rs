//! Revision ids: MediaWiki's positive revision numbers.

use std::fmt;

use crate::KeyError;
use crate::domain::truncate_for_message;

/// A revision id: an integer from 1 to `i64::MAX` (stored as a signed 64-bit
/// column on every engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct RevId(u64);

impl RevId {
    pub const MAX: u64 = i64::MAX as u64;

    pub fn new(value: u64) -> Result<Self, KeyError> {
        let fail = |reason| KeyError::Rev { input: value.to_string(), reason };
        match value {
            0 => Err(fail("revisions start at 1")),
            v if v > Self::MAX => Err(fail("larger than 9223372036854775807")),
            v => Ok(RevId(v)),
        }
    }

    /// Parses the decimal form used in URLs: digits only, no sign, no spaces.
    pub fn parse(input: &str) -> Result<Self, KeyError> {
        let fail = |reason| KeyError::Rev { input: truncate_for_message(input), reason };
        if input.is_empty() || !input.bytes().all(|b| b.is_ascii_digit()) {
            return Err(fail("expected a positive decimal integer"));
        }
        let value: u64 = input.parse().map_err(|_| fail("larger than 9223372036854775807"))?;
        RevId::new(value).map_err(|e| match e {
            KeyError::Rev { reason, .. } => fail(reason),
            other => other,
        })
    }

    pub fn get(self) -> u64 {
        self.0
    }

    /// The value as stored in a `bigint` column.
    pub fn as_i64(self) -> i64 {
        // In range by construction.
        self.0 as i64
    }
}

impl fmt::Display for RevId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::str::FromStr for RevId {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RevId::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_positive_integers_only() {
        assert_eq!(RevId::parse("1").unwrap().get(), 1);
        assert_eq!(RevId::parse("9223372036854775807").unwrap().as_i64(), i64::MAX);
        for bad in ["", "0", "-1", "+1", " 1", "1.0", "1e3", "9223372036854775808", "99999999999999999999", "abc"] {
            assert!(RevId::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(RevId::new(0).is_err());
    }
}
