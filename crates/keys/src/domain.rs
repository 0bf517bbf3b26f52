//! The wiki's host name, for example `en.wikipedia.org`.

use std::fmt;

use crate::KeyError;

/// A validated, lower-cased DNS host name (RFC 1123 labels).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct Domain(String);

const MAX_LEN: usize = 253;
const MAX_LABEL_LEN: usize = 63;

impl Domain {
    /// Validates `input` as a host name. Host names are case-insensitive, so the
    /// stored form is lower case.
    pub fn parse(input: &str) -> Result<Self, KeyError> {
        let fail = |reason| KeyError::Domain { input: truncate_for_message(input), reason };
        if input.is_empty() {
            return Err(fail("it is empty"));
        }
        if input.len() > MAX_LEN {
            return Err(fail("it is longer than 253 bytes"));
        }
        for label in input.split('.') {
            if label.is_empty() {
                return Err(fail("it has an empty label (leading, trailing or doubled dot)"));
            }
            if label.len() > MAX_LABEL_LEN {
                return Err(fail("a label is longer than 63 bytes"));
            }
            if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Err(fail("only ASCII letters, digits, '-' and '.' are allowed"));
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err(fail("a label starts or ends with '-'"));
            }
        }
        Ok(Domain(input.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Domain {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Domain::parse(s)
    }
}

/// Error messages echo the input, but never more than a screenful of it.
pub(crate) fn truncate_for_message(input: &str) -> String {
    const MAX: usize = 100;
    if input.len() <= MAX {
        return input.to_owned();
    }
    let mut end = MAX;
    while !input.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &input[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_wiki_hosts_and_lowercases() {
        assert_eq!(Domain::parse("en.wikipedia.org").unwrap().as_str(), "en.wikipedia.org");
        assert_eq!(Domain::parse("EN.Wikipedia.ORG").unwrap().as_str(), "en.wikipedia.org");
        assert_eq!(Domain::parse("localhost").unwrap().as_str(), "localhost");
        assert_eq!(Domain::parse("zh-min-nan.wikipedia.org").unwrap().as_str(), "zh-min-nan.wikipedia.org");
    }

    #[test]
    fn rejects_malformed_hosts_with_a_reason() {
        for (bad, reason) in [
            ("", "empty"),
            (".wikipedia.org", "empty label"),
            ("en..wikipedia.org", "empty label"),
            ("en.wikipedia.org.", "empty label"),
            ("en_wiki.org", "only ASCII"),
            ("en wiki.org", "only ASCII"),
            ("-en.wiki.org", "starts or ends"),
            ("ünï.org", "only ASCII"),
            ("../etc", "empty label"),
        ] {
            let err = Domain::parse(bad).unwrap_err().to_string();
            assert!(err.contains(reason), "{bad:?}: {err}");
        }
        assert!(Domain::parse(&"a".repeat(64)).is_err());
        assert!(Domain::parse(&["a"; 130].join(".")).is_err());
    }
}
