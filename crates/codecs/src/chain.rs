//! One revision compressed against the revision before it.
//!
//! old-store appends a revision to a page's open block without rewriting what
//! the block already holds: the new revision is compressed on its own, with the
//! previous revision of the block as a zstd prefix (a raw-content dictionary).
//! Consecutive revisions share almost everything, so a link costs a few percent
//! of the revision; decoding it needs the previous revision's content, which a
//! reader walking the block in order already has.
//!
//! ```text
//! bytes 0-2   magic "RVC"
//! byte 3      format version (1)
//! u32         length of the content
//! u32         CRC-32 of the content
//! rest        one zstd frame, compressed with the previous content as prefix
//! ```

use zstd::zstd_safe::{CCtx, CParameter, DCtx, DParameter};

use crate::block::WINDOW_LOG_MAX;
use crate::{CodecError, take, take_u32};

const MAGIC: &[u8; 3] = b"RVC";
pub const CHAIN_VERSION: u8 = 1;

fn corrupt(reason: impl std::fmt::Display) -> CodecError {
    CodecError::Corrupt { what: "chained revision", reason: reason.to_string() }
}

/// Compresses `content` with `previous` (if any) as the reference it may copy from.
pub fn encode_chained(previous: Option<&[u8]>, content: &[u8], level: i32) -> Result<Vec<u8>, CodecError> {
    let len = u32::try_from(content.len()).map_err(|_| CodecError::TooLarge {
        what: "chained revision",
        size: content.len() as u64,
        limit: u32::MAX as u64,
    })?;
    let mut cctx = CCtx::try_create().ok_or_else(|| corrupt("cannot allocate a compressor"))?;
    let code = |e: usize| corrupt(zstd::zstd_safe::get_error_name(e));
    cctx.set_parameter(CParameter::CompressionLevel(level)).map_err(code)?;
    cctx.set_parameter(CParameter::WindowLog(window_log_for(previous.map_or(0, <[u8]>::len) + content.len()))).map_err(code)?;
    // At the fast levels the match finder's tables hold a sliver of a
    // megabyte-sized previous revision; long-distance matching finds the
    // long repeats anywhere in it (a 4 MB revision chained on its
    // predecessor: a few KB instead of most of a standalone compression).
    cctx.set_parameter(CParameter::EnableLongDistanceMatching(true)).map_err(code)?;
    if let Some(previous) = previous {
        cctx.ref_prefix(previous).map_err(code)?;
    }
    let mut out = Vec::with_capacity(12 + zstd::zstd_safe::compress_bound(content.len()));
    out.extend_from_slice(MAGIC);
    out.push(CHAIN_VERSION);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&crc32fast::hash(content).to_be_bytes());
    let mut frame = Vec::with_capacity(zstd::zstd_safe::compress_bound(content.len()));
    cctx.compress2(&mut frame, content).map_err(code)?;
    out.extend_from_slice(&frame);
    Ok(out)
}

/// The smallest window that lets the content refer back to the start of the prefix.
fn window_log_for(span: usize) -> u32 {
    let needed = usize::BITS - span.max(1).leading_zeros();
    needed.clamp(10, WINDOW_LOG_MAX)
}

/// The content length a chained revision declares, without decoding it.
pub fn chained_len(bytes: &[u8]) -> Result<u32, CodecError> {
    let mut input = bytes;
    header(&mut input).map(|(len, _)| len)
}

fn header(input: &mut &[u8]) -> Result<(u32, u32), CodecError> {
    let magic = take(input, 4, "chained revision header")?;
    if &magic[..3] != MAGIC {
        return Err(corrupt("bad magic bytes"));
    }
    if magic[3] != CHAIN_VERSION {
        return Err(CodecError::UnknownVersion { what: "chained revision", version: magic[3] });
    }
    Ok((take_u32(input, "chained revision header")?, take_u32(input, "chained revision header")?))
}

/// Decodes a chained revision, given the content it was compressed against.
/// Fails (never returns garbage) when the bytes or the prefix are not the ones
/// it was written with: the content's checksum is checked.
pub fn decode_chained(previous: Option<&[u8]>, bytes: &[u8], max_len: usize) -> Result<Vec<u8>, CodecError> {
    let mut input = bytes;
    let (len, crc) = header(&mut input)?;
    if len as usize > max_len {
        return Err(CodecError::TooLarge { what: "chained revision", size: len as u64, limit: max_len as u64 });
    }
    match zstd::zstd_safe::get_frame_content_size(input) {
        Ok(Some(size)) if size == len as u64 => {}
        _ => return Err(corrupt("frame does not hold the declared length")),
    }
    let mut dctx = DCtx::try_create().ok_or_else(|| corrupt("cannot allocate a decompressor"))?;
    let code = |e: usize| corrupt(zstd::zstd_safe::get_error_name(e));
    dctx.set_parameter(DParameter::WindowLogMax(WINDOW_LOG_MAX)).map_err(code)?;
    if let Some(previous) = previous {
        dctx.ref_prefix(previous).map_err(code)?;
    }
    let mut out = Vec::with_capacity(len as usize);
    dctx.decompress(&mut out, input).map_err(code)?;
    if out.len() != len as usize || crc32fast::hash(&out) != crc {
        return Err(CodecError::ChecksumMismatch { what: "chained revision" });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_real_history_chains_small_and_reads_back() {
        let revisions = revstore_testdata::history("enwiki_Anarchism.html", "html");
        let (mut raw, mut stored) = (0, 0);
        let mut previous: Option<&[u8]> = None;
        let mut links = Vec::new();
        for r in &revisions {
            let link = encode_chained(previous, r.as_bytes(), 3).unwrap();
            raw += r.len();
            stored += link.len();
            links.push(link);
            previous = Some(r.as_bytes());
        }
        // Each revision alone compresses to ~29%; chained, to a few percent.
        assert!(stored * 100 < raw * 5, "chained {stored} of {raw}");
        let mut previous: Option<Vec<u8>> = None;
        for (link, r) in links.iter().zip(&revisions) {
            let content = decode_chained(previous.as_deref(), link, 1 << 30).unwrap();
            assert_eq!(content, r.as_bytes());
            assert_eq!(chained_len(link).unwrap() as usize, r.len());
            previous = Some(content);
        }
    }

    #[test]
    fn the_wrong_prefix_is_an_error_not_garbage() {
        let a = "<p>first revision of the page</p>".repeat(50);
        let b = format!("{a}<p>an edit</p>");
        let c = "<p>a different page entirely</p>".repeat(50);
        let link = encode_chained(Some(a.as_bytes()), b.as_bytes(), 3).unwrap();
        assert!(decode_chained(Some(c.as_bytes()), &link, 1 << 20).is_err());
        assert!(decode_chained(None, &link, 1 << 20).is_err());
        assert_eq!(decode_chained(Some(a.as_bytes()), &link, 1 << 20).unwrap(), b.as_bytes());
        assert!(matches!(decode_chained(Some(a.as_bytes()), &link, 10), Err(CodecError::TooLarge { .. })));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300), prefix in proptest::collection::vec(any::<u8>(), 0..50)) {
            let _ = decode_chained(Some(&prefix), &bytes, 1 << 20);
            let _ = decode_chained(None, &bytes, 1 << 20);
        }

        #[test]
        fn round_trips(previous in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..2000)), content in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let link = encode_chained(previous.as_deref(), &content, 1).unwrap();
            prop_assert_eq!(decode_chained(previous.as_deref(), &link, 1 << 20).unwrap(), content);
        }
    }
}
