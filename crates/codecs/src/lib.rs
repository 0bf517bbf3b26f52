//! How revstore lays values out as bytes.
//!
//! # Layout
//! - [`envelope`]: the versioned wrapper around every stored value (format
//!   version, compression, checksum).
//! - [`block`]: many revisions of one page in one zstd frame, with an index so one
//!   revision can be decoded without keeping the others.
//! - [`chain`]: one revision compressed against the one before it, the way
//!   old-store appends to a block without rewriting it.
//! - [`page_token`]: opaque, tamper-evident cursors handed to clients.
//!
//! Every decoder accepts any byte string and answers with a [`CodecError`]
//! rather than panicking; `fuzz/` holds a cargo-fuzz target for each, and the
//! `fuzz_smoke` tests run the same entry points on stable Rust in CI.

pub mod block;
pub mod chain;
pub mod envelope;
pub mod page_token;

pub use block::{BaseRef, BlockBuilder, BlockEntry, BlockReader, BlockSettings};
pub use chain::{decode_chained, encode_chained};
pub use envelope::{Compression, Envelope};
pub use page_token::PageTokenCodec;

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("truncated {what}: need {needed} bytes, have {available}")]
    Truncated { what: &'static str, needed: usize, available: usize },
    #[error("unknown {what} format version {version}")]
    UnknownVersion { what: &'static str, version: u8 },
    #[error("unknown compression code {0}")]
    UnknownCompression(u8),
    #[error("checksum mismatch in {what}")]
    ChecksumMismatch { what: &'static str },
    #[error("{what} is {size} bytes decoded, over the limit of {limit}")]
    TooLarge { what: &'static str, size: u64, limit: u64 },
    #[error("corrupt {what}: {reason}")]
    Corrupt { what: &'static str, reason: String },
    #[error("no entry for revision {rev} in block")]
    NoSuchEntry { rev: u64 },
    #[error("the block was compressed against another base than the one given")]
    WrongBase,
    #[error("cancelled")]
    Cancelled,
    #[error("invalid page token: {0}")]
    BadPageToken(&'static str),
}

/// Reads a big-endian integer field, or says the input was too short.
pub(crate) fn take<'a>(input: &mut &'a [u8], n: usize, what: &'static str) -> Result<&'a [u8], CodecError> {
    if input.len() < n {
        return Err(CodecError::Truncated { what, needed: n, available: input.len() });
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Ok(head)
}

pub(crate) fn take_u32(input: &mut &[u8], what: &'static str) -> Result<u32, CodecError> {
    let b = take(input, 4, what)?;
    Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}
