//! Opaque page tokens: the cursors a client hands back to resume a listing.
//!
//! A token is `base64url(version | payload | tag)`, where the tag is an
//! HMAC-SHA-256 (first 16 bytes) over the version, the listing's *scope* and the
//! payload. The scope is not in the token: it is what the server knows about the
//! listing being resumed (table, partition, bounds, order). A token from another
//! listing, a truncated one or an edited one fails the tag check and is rejected
//! as bad input; it never moves a cursor somewhere unintended.
//!
//! The key makes tokens tamper-evident. Services that run several replicas must
//! share it (a token issued by one is resumed by another); a token does not
//! carry anything secret, so the key protects integrity, not confidentiality.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::CodecError;

const TOKEN_VERSION: u8 = 1;
const TAG_LEN: usize = 16;
/// Tokens longer than this (in base64 characters) are refused before decoding.
pub const MAX_TOKEN_LEN: usize = 4096;

#[derive(Clone)]
pub struct PageTokenCodec {
    key: Vec<u8>,
}

impl std::fmt::Debug for PageTokenCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageTokenCodec").field("key", &"<redacted>").finish()
    }
}

impl PageTokenCodec {
    pub fn new(key: &[u8]) -> Self {
        PageTokenCodec { key: key.to_vec() }
    }

    fn tag(&self, scope: &[u8], payload: &[u8]) -> [u8; TAG_LEN] {
        // HMAC accepts keys of any length.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key).unwrap_or_else(|_| unreachable!("hmac takes any key length"));
        mac.update(&[TOKEN_VERSION]);
        mac.update(&(scope.len() as u64).to_be_bytes());
        mac.update(scope);
        mac.update(payload);
        let full = mac.finalize().into_bytes();
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        tag
    }

    /// Wraps `payload` into a token valid only for `scope`.
    pub fn seal(&self, scope: &[u8], payload: &[u8]) -> String {
        let mut raw = Vec::with_capacity(1 + payload.len() + TAG_LEN);
        raw.push(TOKEN_VERSION);
        raw.extend_from_slice(payload);
        raw.extend_from_slice(&self.tag(scope, payload));
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// Returns the payload of a token sealed for `scope`, or why it is refused.
    pub fn open(&self, scope: &[u8], token: &str) -> Result<Vec<u8>, CodecError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(CodecError::BadPageToken("it is too long"));
        }
        let raw = URL_SAFE_NO_PAD.decode(token).map_err(|_| CodecError::BadPageToken("it is not base64url"))?;
        if raw.len() < 1 + TAG_LEN {
            return Err(CodecError::BadPageToken("it is truncated"));
        }
        if raw[0] != TOKEN_VERSION {
            return Err(CodecError::BadPageToken("it has an unknown version"));
        }
        let (payload, tag) = raw[1..].split_at(raw.len() - 1 - TAG_LEN);
        // Constant-time comparison, through the MAC's own verifier.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key).unwrap_or_else(|_| unreachable!("hmac takes any key length"));
        mac.update(&[TOKEN_VERSION]);
        mac.update(&(scope.len() as u64).to_be_bytes());
        mac.update(scope);
        mac.update(payload);
        mac.verify_truncated_left(tag).map_err(|_| CodecError::BadPageToken("it was altered or belongs to another listing"))?;
        Ok(payload.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips_within_its_scope_only() {
        let codec = PageTokenCodec::new(b"secret");
        let token = codec.seal(b"by_parent|enwiki|Template:Cite", b"\x00\x05cursor");
        assert_eq!(codec.open(b"by_parent|enwiki|Template:Cite", &token).unwrap(), b"\x00\x05cursor");
        let foreign = codec.open(b"by_parent|enwiki|Template:Reflist", &token).unwrap_err();
        assert!(foreign.to_string().contains("another listing"), "{foreign}");
        assert!(PageTokenCodec::new(b"other key").open(b"by_parent|enwiki|Template:Cite", &token).is_err());
    }

    #[test]
    fn rejects_tampered_truncated_and_garbage_tokens() {
        let codec = PageTokenCodec::new(b"k");
        let token = codec.seal(b"s", b"payload");
        let mut chars: Vec<char> = token.chars().collect();
        chars[3] = if chars[3] == 'A' { 'B' } else { 'A' };
        let tampered: String = chars.into_iter().collect();
        for bad in [tampered.as_str(), &token[..token.len() - 2], "", "!!!!", "AAAA", &"A".repeat(5000)] {
            assert!(matches!(codec.open(b"s", bad), Err(CodecError::BadPageToken(_))), "{bad:?} accepted");
        }
    }

    proptest! {
        #[test]
        fn any_string_is_a_token_or_an_error(s in "\\PC{0,200}") {
            let _ = PageTokenCodec::new(b"k").open(b"scope", &s);
        }

        #[test]
        fn payloads_round_trip(payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let codec = PageTokenCodec::new(b"k");
            prop_assert_eq!(codec.open(b"scope", &codec.seal(b"scope", &payload)).unwrap(), payload);
        }
    }
}
