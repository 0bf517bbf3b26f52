//! Many revisions of one page in one zstd frame.
//!
//! Revisions of a page repeat each other almost entirely; compressed together with
//! a long window they shrink to a few percent of their size, while each alone
//! shrinks only to about a third. A block keeps an index in front of the frame,
//! compressed on its own, so a reader finds a revision's offset by decoding a few
//! hundred bytes, then streams the frame up to the end of that revision and stops:
//! the revisions after it are never decoded and the ones before it are never kept.
//!
//! ```text
//! bytes 0-2   magic "RVB"
//! byte 3      format version (2)
//! u32         entry count n
//! u32         length of the compressed index
//! u32         CRC-32 of all the bytes above and the compressed index
//! ...         the index, one zstd frame: per entry, rev as a zigzag varint delta
//!             from the entry before | tid 16 bytes | length varint | CRC-32 u32
//! rest        one zstd frame: the contents, concatenated in index order
//! ```
//! Fixed-width integers are big-endian; an entry's offset is the sum of the
//! lengths before it. Packing the index matters for small pages: 32 bytes per
//! revision uncompressed is a third of what a compressed wikitext revision costs.

use std::io::{self, Read};

use crate::envelope::decompress_bounded;
use crate::{CodecError, take, take_u32};

const MAGIC: &[u8; 3] = b"RVB";
pub const BLOCK_VERSION: u8 = 2;
/// The most bytes one index entry takes packed: two 10-byte varints, tid, CRC.
const MAX_ENTRY_LEN: usize = 10 + 16 + 10 + 4;
/// The largest window a decoder accepts: 128 MiB, enough for the largest wiki pages.
pub const WINDOW_LOG_MAX: u32 = 27;

/// How blocks are compressed and how much a reader will decode.
#[derive(Debug, Clone, Copy)]
pub struct BlockSettings {
    pub level: i32,
    /// log2 of the match window; `WINDOW_LOG_MAX` lets a revision refer to one
    /// 100 MiB back, so multi-megabyte revisions still compress against each other.
    pub window_log: u32,
    /// Threads zstd may use while compressing one block (0 = the calling thread).
    pub workers: u32,
    /// The most a reader decodes from one block, against corrupt or hostile input.
    pub max_decoded: usize,
}

impl Default for BlockSettings {
    fn default() -> Self {
        BlockSettings { level: 6, window_log: WINDOW_LOG_MAX, workers: 0, max_decoded: 1 << 30 }
    }
}

/// One revision's place in a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockEntry {
    pub rev: u64,
    pub tid: [u8; 16],
    pub offset: u64,
    pub len: u32,
    pub crc32: u32,
}

/// Collects revisions, then compresses them into one block.
#[derive(Debug, Default)]
pub struct BlockBuilder {
    settings: BlockSettings,
    entries: Vec<BlockEntry>,
    contents: Vec<u8>,
}

impl BlockBuilder {
    pub fn new(settings: BlockSettings) -> Self {
        BlockBuilder { settings, entries: Vec::new(), contents: Vec::new() }
    }

    /// Appends a revision. Contents over 4 GiB do not fit an entry.
    pub fn push(&mut self, rev: u64, tid: [u8; 16], content: &[u8]) -> Result<(), CodecError> {
        let len = u32::try_from(content.len()).map_err(|_| CodecError::TooLarge {
            what: "block entry",
            size: content.len() as u64,
            limit: u32::MAX as u64,
        })?;
        self.entries.push(BlockEntry { rev, tid, offset: self.contents.len() as u64, len, crc32: crc32fast::hash(content) });
        self.contents.extend_from_slice(content);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of content pushed so far, before compression.
    pub fn raw_bytes(&self) -> usize {
        self.contents.len()
    }

    pub fn finish(self) -> Result<Vec<u8>, CodecError> {
        let mut index = Vec::with_capacity(self.entries.len() * 24);
        let mut previous_rev = 0u64;
        for e in &self.entries {
            put_varint(&mut index, zigzag(e.rev.wrapping_sub(previous_rev) as i64));
            previous_rev = e.rev;
            index.extend_from_slice(&e.tid);
            put_varint(&mut index, u64::from(e.len));
            index.extend_from_slice(&e.crc32.to_be_bytes());
        }
        let index =
            zstd::bulk::compress(&index, 19).map_err(|e| CodecError::Corrupt { what: "block index compression", reason: e.to_string() })?;
        let mut out = Vec::with_capacity(16 + index.len() + self.contents.len() / 8);
        out.extend_from_slice(MAGIC);
        out.push(BLOCK_VERSION);
        out.extend_from_slice(&(self.entries.len() as u32).to_be_bytes());
        out.extend_from_slice(&(index.len() as u32).to_be_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&out);
        crc.update(&index);
        out.extend_from_slice(&crc.finalize().to_be_bytes());
        out.extend_from_slice(&index);
        out.extend_from_slice(&compress(&self.contents, &self.settings)?);
        Ok(out)
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn take_varint(input: &mut &[u8]) -> Result<u64, CodecError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *take(input, 1, "block index entry")?.first().unwrap_or(&0);
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(CodecError::Corrupt { what: "block index", reason: "varint longer than 10 bytes".into() })
}

fn compress(contents: &[u8], s: &BlockSettings) -> Result<Vec<u8>, CodecError> {
    use zstd::zstd_safe::CParameter;
    let fail = |e: io::Error| CodecError::Corrupt { what: "block compression", reason: e.to_string() };
    let mut c = zstd::bulk::Compressor::new(s.level).map_err(fail)?;
    c.set_parameter(CParameter::WindowLog(s.window_log)).map_err(fail)?;
    c.set_parameter(CParameter::EnableLongDistanceMatching(true)).map_err(fail)?;
    if s.workers > 0 {
        c.set_parameter(CParameter::NbWorkers(s.workers)).map_err(fail)?;
    }
    c.include_contentsize(true).map_err(fail)?;
    c.compress(contents).map_err(fail)
}

/// A parsed block: the index is read, the frame is not yet decoded.
#[derive(Debug)]
pub struct BlockReader<'a> {
    entries: Vec<BlockEntry>,
    frame: &'a [u8],
    max_decoded: usize,
}

impl<'a> BlockReader<'a> {
    /// Reads and checks the index. Fails on anything that is not a well-formed block.
    pub fn parse(bytes: &'a [u8], settings: &BlockSettings) -> Result<Self, CodecError> {
        let mut input = bytes;
        let magic = take(&mut input, 4, "block header")?;
        if &magic[..3] != MAGIC {
            return Err(CodecError::Corrupt { what: "block", reason: "bad magic bytes".into() });
        }
        if magic[3] != BLOCK_VERSION {
            return Err(CodecError::UnknownVersion { what: "block", version: magic[3] });
        }
        let count = take_u32(&mut input, "block header")? as usize;
        let index_len = take_u32(&mut input, "block header")? as usize;
        let stored_crc = take_u32(&mut input, "block header")?;
        let packed = take(&mut input, index_len, "block index")?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bytes[..12]);
        crc.update(packed);
        if crc.finalize() != stored_crc {
            return Err(CodecError::ChecksumMismatch { what: "block index" });
        }
        let index = decompress_bounded(packed, count.saturating_mul(MAX_ENTRY_LEN), "block index")?;
        let mut index = &index[..];
        let mut entries = Vec::with_capacity(count.min(1 << 16));
        let mut offset = 0u64;
        let mut rev = 0u64;
        for _ in 0..count {
            rev = rev.wrapping_add(unzigzag(take_varint(&mut index)?) as u64);
            let mut tid = [0u8; 16];
            tid.copy_from_slice(take(&mut index, 16, "block index entry")?);
            let len = u32::try_from(take_varint(&mut index)?)
                .map_err(|_| CodecError::Corrupt { what: "block index", reason: "entry length over 4 GiB".into() })?;
            let crc32 = take_u32(&mut index, "block index entry")?;
            entries.push(BlockEntry { rev, tid, offset, len, crc32 });
            offset += len as u64;
        }
        if !index.is_empty() {
            return Err(CodecError::Corrupt { what: "block index", reason: "bytes after the last entry".into() });
        }
        if offset > settings.max_decoded as u64 {
            return Err(CodecError::TooLarge { what: "block", size: offset, limit: settings.max_decoded as u64 });
        }
        match zstd::zstd_safe::get_frame_content_size(input) {
            Ok(Some(size)) if size == offset => {}
            Ok(Some(size)) => {
                return Err(CodecError::Corrupt { what: "block", reason: format!("index covers {offset} bytes, frame holds {size}") });
            }
            _ => return Err(CodecError::Corrupt { what: "block", reason: "no zstd frame with a content size".into() }),
        }
        Ok(BlockReader { entries, frame: input, max_decoded: settings.max_decoded })
    }

    pub fn entries(&self) -> &[BlockEntry] {
        &self.entries
    }

    /// The entry of `rev` (the first one, if a revision was pushed twice) and,
    /// when `tid` is given, of that render.
    pub fn find(&self, rev: u64, tid: Option<&[u8; 16]>) -> Option<&BlockEntry> {
        self.entries.iter().find(|e| e.rev == rev && tid.is_none_or(|t| &e.tid == t))
    }

    /// Decodes one entry's content: streams the frame up to the entry's end,
    /// discarding what comes before it, and checks the content's checksum.
    pub fn read(&self, entry: &BlockEntry) -> Result<Vec<u8>, CodecError> {
        let corrupt = |e: io::Error| CodecError::Corrupt { what: "block content", reason: e.to_string() };
        let mut decoder = zstd::stream::read::Decoder::with_buffer(self.frame).map_err(corrupt)?;
        decoder.window_log_max(WINDOW_LOG_MAX).map_err(corrupt)?;
        io::copy(&mut (&mut decoder).take(entry.offset), &mut io::sink()).map_err(corrupt)?;
        let mut content = vec![0u8; entry.len as usize];
        decoder.read_exact(&mut content).map_err(corrupt)?;
        if crc32fast::hash(&content) != entry.crc32 {
            return Err(CodecError::ChecksumMismatch { what: "block content" });
        }
        Ok(content)
    }

    /// The content of `rev` (see [`BlockReader::find`]).
    pub fn read_rev(&self, rev: u64, tid: Option<&[u8; 16]>) -> Result<Vec<u8>, CodecError> {
        let entry = *self.find(rev, tid).ok_or(CodecError::NoSuchEntry { rev })?;
        self.read(&entry)
    }

    /// Decodes the first `count` entries, streaming the frame and stopping at the
    /// end of the last one: what a reader of one revision gets for free on the
    /// way to it, and keeps for the revisions next to it.
    pub fn read_first(&self, count: usize) -> Result<Vec<(BlockEntry, Vec<u8>)>, CodecError> {
        let corrupt = |e: io::Error| CodecError::Corrupt { what: "block content", reason: e.to_string() };
        let entries = self.entries.get(..count).ok_or(CodecError::Corrupt { what: "block", reason: format!("no entry {count}") })?;
        let mut decoder = zstd::stream::read::Decoder::with_buffer(self.frame).map_err(corrupt)?;
        decoder.window_log_max(WINDOW_LOG_MAX).map_err(corrupt)?;
        let mut out = Vec::with_capacity(count);
        for e in entries {
            let mut content = vec![0u8; e.len as usize];
            decoder.read_exact(&mut content).map_err(corrupt)?;
            if crc32fast::hash(&content) != e.crc32 {
                return Err(CodecError::ChecksumMismatch { what: "block content" });
            }
            out.push((*e, content));
        }
        Ok(out)
    }

    /// Decodes every entry at once, for sequential reads and caches.
    pub fn read_all(&self) -> Result<Vec<(BlockEntry, Vec<u8>)>, CodecError> {
        let all = decompress_bounded(self.frame, self.max_decoded, "block content")?;
        self.entries
            .iter()
            .map(|e| {
                let start = e.offset as usize;
                let content = all
                    .get(start..start + e.len as usize)
                    .ok_or(CodecError::Corrupt { what: "block content", reason: "entry past the end of the frame".into() })?;
                if crc32fast::hash(content) != e.crc32 {
                    return Err(CodecError::ChecksumMismatch { what: "block content" });
                }
                Ok((*e, content.to_vec()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn revisions() -> Vec<(u64, [u8; 16], Vec<u8>)> {
        (1..=40u64)
            .map(|rev| {
                let body = format!(
                    "<html><body><h1>Revision {rev}</h1>{}</body></html>",
                    "<p>Lorem ipsum dolor sit amet.</p>".repeat(100 + rev as usize)
                );
                (rev * 10, [rev as u8; 16], body.into_bytes())
            })
            .collect()
    }

    fn build(revs: &[(u64, [u8; 16], Vec<u8>)]) -> Vec<u8> {
        let mut b = BlockBuilder::new(BlockSettings::default());
        for (rev, tid, content) in revs {
            b.push(*rev, *tid, content).unwrap();
        }
        b.finish().unwrap()
    }

    #[test]
    fn any_revision_reads_back_alone_and_all_together() {
        let revs = revisions();
        let block = build(&revs);
        let reader = BlockReader::parse(&block, &BlockSettings::default()).unwrap();
        assert_eq!(reader.entries().len(), revs.len());
        for (rev, tid, content) in &revs {
            assert_eq!(&reader.read_rev(*rev, None).unwrap(), content);
            assert_eq!(&reader.read_rev(*rev, Some(tid)).unwrap(), content);
        }
        let all = reader.read_all().unwrap();
        assert!(all.iter().zip(&revs).all(|((e, c), (rev, _, content))| e.rev == *rev && c == content));
        assert_eq!(reader.read_first(7).unwrap(), all[..7].to_vec());
        assert!(reader.read_first(revs.len() + 1).is_err());
        assert_eq!(reader.read_rev(11, None), Err(CodecError::NoSuchEntry { rev: 11 }));
        assert_eq!(reader.read_rev(10, Some(&[9; 16])), Err(CodecError::NoSuchEntry { rev: 10 }));
    }

    #[test]
    fn similar_revisions_compress_together() {
        let revs = revisions();
        let raw: usize = revs.iter().map(|r| r.2.len()).sum();
        let block = build(&revs);
        assert!(block.len() * 50 < raw, "block {} bytes for {raw} raw", block.len());
    }

    #[test]
    fn an_empty_block_is_valid() {
        let block = build(&[]);
        let reader = BlockReader::parse(&block, &BlockSettings::default()).unwrap();
        assert!(reader.entries().is_empty());
        assert!(reader.read_all().unwrap().is_empty());
    }

    #[test]
    fn corruption_anywhere_is_an_error_not_garbage() {
        let revs = revisions();
        let block = build(&revs);
        let settings = BlockSettings::default();
        // Flip one bit at positions across the header, index and frame.
        for pos in (0..block.len()).step_by(97) {
            let mut bad = block.clone();
            bad[pos] ^= 0x10;
            let Ok(reader) = BlockReader::parse(&bad, &settings) else { continue };
            for (rev, _, content) in &revs {
                // An error is the right answer to corruption; a different content never is.
                if let Ok(decoded) = reader.read_rev(*rev, None) {
                    assert_eq!(&decoded, content, "garbage returned for rev {rev} (bit flipped at {pos})");
                }
            }
        }
        for cut in [0, 3, 8, 20, block.len() / 2, block.len() - 1] {
            let reader = BlockReader::parse(&block[..cut], &settings);
            if let Ok(reader) = reader {
                assert!(reader.read_all().is_err());
            }
        }
    }

    #[test]
    fn unknown_versions_are_typed_errors() {
        let mut block = build(&revisions()[..2]);
        block[3] = 7;
        assert_eq!(
            BlockReader::parse(&block, &BlockSettings::default()).unwrap_err(),
            CodecError::UnknownVersion { what: "block", version: 7 }
        );
    }

    #[test]
    fn a_huge_stated_entry_count_is_refused_without_allocating() {
        // A well-formed header and checksum claiming 4 billion entries over an empty index.
        let index = zstd::bulk::compress(b"", 1).unwrap();
        let mut bytes = b"RVB\x02".to_vec();
        bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        bytes.extend_from_slice(&(index.len() as u32).to_be_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bytes);
        crc.update(&index);
        bytes.extend_from_slice(&crc.finalize().to_be_bytes());
        bytes.extend_from_slice(&index);
        assert!(matches!(BlockReader::parse(&bytes, &BlockSettings::default()), Err(CodecError::Truncated { .. })));
    }

    proptest! {
        #[test]
        fn round_trip_arbitrary_contents(contents in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..2000), 0..12)) {
            let revs: Vec<_> = contents.into_iter().enumerate().map(|(i, c)| (i as u64 + 1, [i as u8; 16], c)).collect();
            let block = build(&revs);
            let reader = BlockReader::parse(&block, &BlockSettings::default()).unwrap();
            for (rev, _, content) in &revs {
                prop_assert_eq!(&reader.read_rev(*rev, None).unwrap(), content);
            }
        }

        #[test]
        fn any_bytes_parse_to_a_block_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(reader) = BlockReader::parse(&bytes, &BlockSettings::default()) {
                let _ = reader.read_all();
            }
        }
    }
}
