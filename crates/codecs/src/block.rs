//! Many revisions of one page in one zstd frame.
//!
//! Revisions of a page repeat each other almost entirely; compressed together with
//! a long window they shrink to a few percent of their size, while each alone
//! shrinks only to about a third. A block keeps an index in front of the frame,
//! compressed on its own, so a reader finds a revision's offset by decoding a few
//! hundred bytes, then streams the frame up to the end of that revision and stops:
//! the revisions after it are never decoded and the ones before it are never kept.
//!
//! A block may be compressed against a *base*: another revision's content used
//! as a zstd prefix, so the block's first revision is stored as a difference
//! instead of whole. The block names the base only by its length and CRC; which
//! revision it is, the caller records beside the block. A reader must be given
//! the same base ([`BlockReader::with_base`]) to decode it.
//!
//! ```text
//! bytes 0-2   magic "RVB"
//! byte 3      format version (3; version 2 had no base fields and is still read)
//! u32         entry count n
//! u32         length of the compressed index
//! u32         length of the base (0: the block stands alone)       } version 3
//! u32         CRC-32 of the base (0 when there is none)             } only
//! u32         CRC-32 of all the bytes above and the compressed index
//! ...         the index, one zstd frame: per entry, rev as a zigzag varint delta
//!             from the entry before | tid 16 bytes | length varint | CRC-32 u32
//! rest        one zstd frame: the contents, concatenated in index order
//! ```
//! Fixed-width integers are big-endian; an entry's offset is the sum of the
//! lengths before it. Packing the index matters for small pages: 32 bytes per
//! revision uncompressed is a third of what a compressed wikitext revision costs.

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::envelope::decompress_bounded;
use crate::{CodecError, take, take_u32};

const MAGIC: &[u8; 3] = b"RVB";
pub const BLOCK_VERSION: u8 = 3;
/// The version before bases: no base fields in the header.
const BLOCK_VERSION_WITHOUT_BASE: u8 = 2;
/// The most bytes one index entry takes packed: two 10-byte varints, tid, CRC.
const MAX_ENTRY_LEN: usize = 10 + 16 + 10 + 4;
/// From this level up, zstd's own tables (for inputs over 256 KiB) have at
/// least 2^20 entries, the smallest cap: below it a cap would only enlarge them.
pub const CAPPED_FROM_LEVEL: i32 = 9;
pub use crate::envelope::WINDOW_LOG_MAX;

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
    /// At levels 9 and up (`CAPPED_FROM_LEVEL`): the largest log2 of zstd's
    /// match-finder chain table (the hash table gets two less). Level 19 on a
    /// block of many megabytes takes about 80 MiB of tables, level 12 about
    /// 24 MiB on one of 2 MiB; 22 bounds them near 20 MiB, 20 near 5 MiB, for
    /// a little less compression (the long-distance matcher still finds the
    /// repeats between revisions).
    pub table_log_max: Option<u32>,
}

impl Default for BlockSettings {
    fn default() -> Self {
        BlockSettings { level: 6, window_log: WINDOW_LOG_MAX, workers: 0, max_decoded: 1 << 30, table_log_max: None }
    }
}

/// What a block was compressed against: the base content's length and CRC-32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseRef {
    pub len: u32,
    pub crc32: u32,
}

impl BaseRef {
    pub fn of(content: &[u8]) -> Option<BaseRef> {
        Some(BaseRef { len: u32::try_from(content.len()).ok()?, crc32: crc32fast::hash(content) })
    }
}

/// How much input the compressor takes between checks of its cancel flag: a
/// stop request waits for at most this much level-19 work (about a second).
const COMPRESS_CHUNK: usize = 1 << 20;

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

    /// A builder for `revisions` revisions of `bytes` raw bytes in all, its
    /// buffers allocated once at their size (a compaction's memory is part
    /// of a budget; growing by doubling would take up to twice the bytes).
    pub fn with_capacity(settings: BlockSettings, revisions: usize, bytes: usize) -> Self {
        BlockBuilder { settings, entries: Vec::with_capacity(revisions), contents: Vec::with_capacity(bytes) }
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

    /// Compresses the block on its own.
    pub fn finish(self) -> Result<Vec<u8>, CodecError> {
        self.finish_against(None, &AtomicBool::new(false))
    }

    /// Compresses the block with `base` (if any) as the content its first
    /// revision may refer to. Checks `cancel` between chunks of input and
    /// answers [`CodecError::Cancelled`] once it is set, so a shutting-down
    /// process need not finish a compression that takes seconds.
    pub fn finish_against(self, base: Option<&[u8]>, cancel: &AtomicBool) -> Result<Vec<u8>, CodecError> {
        let base_ref = match base {
            Some(b) => {
                Some(BaseRef::of(b).ok_or(CodecError::TooLarge { what: "block base", size: b.len() as u64, limit: u32::MAX as u64 })?)
            }
            None => None,
        };
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
        let mut out = Vec::with_capacity(24 + index.len() + self.contents.len() / 8);
        out.extend_from_slice(MAGIC);
        out.push(BLOCK_VERSION);
        out.extend_from_slice(&(self.entries.len() as u32).to_be_bytes());
        out.extend_from_slice(&(index.len() as u32).to_be_bytes());
        out.extend_from_slice(&base_ref.map_or(0, |b| b.len).to_be_bytes());
        out.extend_from_slice(&base_ref.map_or(0, |b| b.crc32).to_be_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&out);
        crc.update(&index);
        out.extend_from_slice(&crc.finalize().to_be_bytes());
        out.extend_from_slice(&index);
        compress(&self.contents, base, &self.settings, cancel, &mut out)?;
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

/// A compression context set up for one block of `len` bytes.
fn block_compressor(s: &BlockSettings, len: usize) -> Result<zstd::zstd_safe::CCtx<'static>, CodecError> {
    use zstd::zstd_safe::{CCtx, CParameter, ResetDirective, get_error_name};
    let fail = |e: usize| CodecError::Corrupt { what: "block compression", reason: get_error_name(e).to_owned() };
    let mut cctx = CCtx::try_create().ok_or(CodecError::Corrupt { what: "block compression", reason: "cannot allocate".into() })?;
    cctx.reset(ResetDirective::SessionAndParameters).map_err(fail)?;
    cctx.set_parameter(CParameter::CompressionLevel(s.level)).map_err(fail)?;
    cctx.set_parameter(CParameter::WindowLog(s.window_log)).map_err(fail)?;
    cctx.set_parameter(CParameter::EnableLongDistanceMatching(true)).map_err(fail)?;
    cctx.set_parameter(CParameter::ContentSizeFlag(true)).map_err(fail)?;
    if let Some(cap) = s.table_log_max.filter(|_| s.level >= CAPPED_FROM_LEVEL) {
        cctx.set_parameter(CParameter::ChainLog(cap)).map_err(fail)?;
        cctx.set_parameter(CParameter::HashLog(cap.saturating_sub(2))).map_err(fail)?;
    }
    if s.workers > 0 {
        cctx.set_parameter(CParameter::NbWorkers(s.workers)).map_err(fail)?;
    }
    cctx.set_pledged_src_size(Some(len as u64)).map_err(fail)?;
    Ok(cctx)
}

/// Compresses `contents` into `out` as one frame, streaming it a chunk at a
/// time so that `cancel` is noticed. The pledged size puts the content size in
/// the frame header, which readers check against the index.
fn compress(contents: &[u8], base: Option<&[u8]>, s: &BlockSettings, cancel: &AtomicBool, out: &mut Vec<u8>) -> Result<(), CodecError> {
    use zstd::zstd_safe::{CCtx, InBuffer, OutBuffer, get_error_name};
    let fail = |e: usize| CodecError::Corrupt { what: "block compression", reason: get_error_name(e).to_owned() };
    let mut cctx = block_compressor(s, contents.len())?;
    if let Some(base) = base {
        cctx.ref_prefix(base).map_err(fail)?;
    }
    let mut buffer = vec![0u8; CCtx::out_size()];
    let mut chunks = contents.chunks(COMPRESS_CHUNK).peekable();
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Err(CodecError::Cancelled);
        }
        let (chunk, last) = match chunks.next() {
            Some(c) => (c, chunks.peek().is_none()),
            None => (&[][..], true),
        };
        let mut input = InBuffer::around(chunk);
        loop {
            let mut output = OutBuffer::around(&mut buffer[..]);
            let remaining = if last {
                cctx.compress_stream2(&mut output, &mut input, zstd::zstd_safe::zstd_sys::ZSTD_EndDirective::ZSTD_e_end).map_err(fail)?
            } else {
                cctx.compress_stream2(&mut output, &mut input, zstd::zstd_safe::zstd_sys::ZSTD_EndDirective::ZSTD_e_continue)
                    .map_err(fail)?
            };
            out.extend_from_slice(output.as_slice());
            let drained = if last { remaining == 0 } else { input.pos() == chunk.len() };
            if drained {
                break;
            }
        }
        if last {
            return Ok(());
        }
    }
}

/// A parsed block: the index is read, the frame is not yet decoded.
#[derive(Debug)]
pub struct BlockReader<'a> {
    entries: Vec<BlockEntry>,
    frame: &'a [u8],
    /// What the frame was compressed against, and, once given, its content.
    base: Option<(BaseRef, Option<&'a [u8]>)>,
}

impl<'a> BlockReader<'a> {
    /// Reads and checks the index. Fails on anything that is not a well-formed block.
    pub fn parse(bytes: &'a [u8], settings: &BlockSettings) -> Result<Self, CodecError> {
        let mut input = bytes;
        let magic = take(&mut input, 4, "block header")?;
        if &magic[..3] != MAGIC {
            return Err(CodecError::Corrupt { what: "block", reason: "bad magic bytes".into() });
        }
        let version = magic[3];
        if version != BLOCK_VERSION && version != BLOCK_VERSION_WITHOUT_BASE {
            return Err(CodecError::UnknownVersion { what: "block", version });
        }
        let count = take_u32(&mut input, "block header")? as usize;
        let index_len = take_u32(&mut input, "block header")? as usize;
        let base = if version == BLOCK_VERSION {
            let len = take_u32(&mut input, "block header")?;
            let crc32 = take_u32(&mut input, "block header")?;
            (len > 0).then_some(BaseRef { len, crc32 })
        } else {
            None
        };
        let header_len = bytes.len() - input.len();
        let stored_crc = take_u32(&mut input, "block header")?;
        let packed = take(&mut input, index_len, "block index")?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bytes[..header_len]);
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
        Ok(BlockReader { entries, frame: input, base: base.map(|b| (b, None)) })
    }

    pub fn entries(&self) -> &[BlockEntry] {
        &self.entries
    }

    /// What the block was compressed against, if anything.
    pub fn base(&self) -> Option<BaseRef> {
        self.base.map(|(b, _)| b)
    }

    /// Gives the reader the base content the block names; refuses content that
    /// is not it (another length or CRC), and any base for a block without one.
    pub fn with_base(mut self, content: &'a [u8]) -> Result<Self, CodecError> {
        match &mut self.base {
            Some((wanted, given)) if BaseRef::of(content) == Some(*wanted) => *given = Some(content),
            _ => return Err(CodecError::WrongBase),
        }
        Ok(self)
    }

    /// A streaming decoder of the frame, primed with the base when there is one.
    fn decoder(&self) -> Result<zstd::stream::read::Decoder<'a, io::BufReader<&'a [u8]>>, CodecError> {
        let corrupt = |e: io::Error| CodecError::Corrupt { what: "block content", reason: e.to_string() };
        let reader = io::BufReader::new(self.frame);
        let mut decoder = match self.base {
            None => zstd::stream::read::Decoder::with_buffer(reader).map_err(corrupt)?,
            Some((_, Some(base))) => zstd::stream::read::Decoder::with_ref_prefix(reader, base).map_err(corrupt)?,
            Some((_, None)) => return Err(CodecError::WrongBase),
        };
        decoder.window_log_max(WINDOW_LOG_MAX).map_err(corrupt)?;
        Ok(decoder.single_frame())
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
        let mut decoder = self.decoder()?;
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
        let mut decoder = self.decoder()?;
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

    /// Decodes every entry, for sequential reads and caches.
    pub fn read_all(&self) -> Result<Vec<(BlockEntry, Vec<u8>)>, CodecError> {
        self.read_first(self.entries.len())
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
    fn a_seal_with_capped_tables_reads_back_and_still_compresses() {
        let revs = revisions();
        let raw: usize = revs.iter().map(|r| r.2.len()).sum();
        for cap in [None, Some(22), Some(20)] {
            let mut b = BlockBuilder::new(BlockSettings { level: 19, table_log_max: cap, ..BlockSettings::default() });
            for (rev, tid, content) in &revs {
                b.push(*rev, *tid, content).unwrap();
            }
            let block = b.finish().unwrap();
            let reader = BlockReader::parse(&block, &BlockSettings::default()).unwrap();
            for (rev, _, content) in &revs {
                assert_eq!(&reader.read_rev(*rev, None).unwrap(), content, "{cap:?}");
            }
            assert!(block.len() * 50 < raw, "{cap:?}: block {} bytes for {raw} raw", block.len());
        }
    }

    #[test]
    fn a_cap_bounds_the_compression_context_at_every_capped_level() {
        use zstd::zstd_safe::{InBuffer, OutBuffer, zstd_sys::ZSTD_EndDirective};
        // 2 MiB of text-like bytes; the context is sized at its first input.
        let contents: Vec<u8> = (0..2u32 << 20).map(|i| b'a' + (i.wrapping_mul(2_654_435_761) >> 29) as u8).collect();
        let context_bytes = |level: i32, cap: Option<u32>| {
            let mut cctx =
                block_compressor(&BlockSettings { level, table_log_max: cap, ..BlockSettings::default() }, contents.len()).unwrap();
            let mut buffer = vec![0u8; 1 << 20];
            let (mut input, mut output) = (InBuffer::around(&contents[..1 << 16]), OutBuffer::around(&mut buffer[..]));
            cctx.compress_stream2(&mut output, &mut input, ZSTD_EndDirective::ZSTD_e_continue).unwrap();
            cctx.sizeof()
        };
        // Capped at 20: the tables near 5 MiB, the window's buffers besides, at the growth level and the seal level.
        for level in [12, 19] {
            let (capped, uncapped) = (context_bytes(level, Some(20)), context_bytes(level, None));
            assert!(capped < 12 << 20, "level {level}: {capped} bytes with the cap");
            assert!(uncapped > 2 * capped, "level {level}: {uncapped} bytes without it, {capped} with");
        }
        // Below the capped levels a cap changes nothing (it would only enlarge the tables).
        assert_eq!(context_bytes(3, Some(20)), context_bytes(3, None));
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
    fn a_block_against_a_base_stores_its_first_revision_as_a_difference() {
        let revisions = revstore_testdata::anarchism_html();
        let base = revisions[40].as_bytes();
        let mut alone = BlockBuilder::new(BlockSettings::default());
        let mut against = BlockBuilder::new(BlockSettings::default());
        for (i, r) in revisions[41..44].iter().enumerate() {
            alone.push(i as u64, [0; 16], r.as_bytes()).unwrap();
            against.push(i as u64, [0; 16], r.as_bytes()).unwrap();
        }
        let alone = alone.finish().unwrap();
        let against = against.finish_against(Some(base), &AtomicBool::new(false)).unwrap();
        // The first revision alone is most of a block of three; against its predecessor, little.
        assert!(against.len() * 4 < alone.len(), "against a base {} bytes, alone {}", against.len(), alone.len());

        let settings = BlockSettings::default();
        let reader = BlockReader::parse(&against, &settings).unwrap();
        assert_eq!(reader.base(), BaseRef::of(base));
        assert_eq!(reader.read_first(1).unwrap_err(), CodecError::WrongBase, "a block with a base cannot be read without it");
        let wrong = revisions[39].as_bytes();
        assert_eq!(BlockReader::parse(&against, &settings).unwrap().with_base(wrong).unwrap_err(), CodecError::WrongBase);
        let reader = reader.with_base(base).unwrap();
        for (i, r) in revisions[41..44].iter().enumerate() {
            assert_eq!(reader.read_rev(i as u64, None).unwrap(), r.as_bytes());
        }
        // A block without a base takes none.
        assert_eq!(BlockReader::parse(&alone, &settings).unwrap().with_base(base).unwrap_err(), CodecError::WrongBase);
    }

    #[test]
    fn a_cancelled_compression_stops_with_an_error() {
        let mut b = BlockBuilder::new(BlockSettings::default());
        b.push(1, [0; 16], &[7u8; 3 << 20]).unwrap();
        assert_eq!(b.finish_against(None, &AtomicBool::new(true)).unwrap_err(), CodecError::Cancelled);
    }

    /// A version-2 header (no base fields) and its compressed index, written by hand.
    fn version_2_header(count: u32, index: &[u8]) -> Vec<u8> {
        let index = zstd::bulk::compress(index, 3).unwrap();
        let mut bytes = b"RVB\x02".to_vec();
        bytes.extend_from_slice(&count.to_be_bytes());
        bytes.extend_from_slice(&(index.len() as u32).to_be_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bytes);
        crc.update(&index);
        bytes.extend_from_slice(&crc.finalize().to_be_bytes());
        bytes.extend_from_slice(&index);
        bytes
    }

    #[test]
    fn version_2_blocks_without_base_fields_still_read() {
        // The version-2 layout, written by hand: header, packed index, frame.
        let content = b"<p>an old block</p>".repeat(20);
        let mut index = vec![2u8]; // rev 1 as a zigzag delta
        index.extend_from_slice(&[3; 16]);
        put_varint(&mut index, content.len() as u64);
        index.extend_from_slice(&crc32fast::hash(&content).to_be_bytes());
        let mut bytes = version_2_header(1, &index);
        bytes.extend_from_slice(&zstd::bulk::compress(&content, 3).unwrap());
        let reader = BlockReader::parse(&bytes, &BlockSettings::default()).unwrap();
        assert_eq!(reader.base(), None);
        assert_eq!(reader.read_rev(1, Some(&[3; 16])).unwrap(), content);
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
        let bytes = version_2_header(u32::MAX, b"");
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
