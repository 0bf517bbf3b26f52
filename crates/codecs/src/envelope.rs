//! The versioned envelope every stored value is wrapped in.
//!
//! ```text
//! byte 0     format version (1)
//! byte 1     compression: 0 none, 1 zstd
//! bytes 2-5  CRC-32 of the decoded payload, big-endian
//! bytes 6..  payload (raw, or one zstd frame with its content size)
//! ```
//! A reader that meets a version it does not know fails with
//! [`CodecError::UnknownVersion`]; it never guesses.

use std::borrow::Cow;

use crate::{CodecError, take, take_u32};

/// The largest window a decoder accepts: 128 MiB, enough for the largest wiki pages.
pub const WINDOW_LOG_MAX: u32 = 27;

pub const ENVELOPE_VERSION: u8 = 1;
const HEADER_LEN: usize = 6;

/// Whether a payload is stored as it is or compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    /// zstd at the given level (1-22; 3 is zstd's default).
    Zstd {
        level: i32,
    },
}

impl Compression {
    fn code(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Zstd { .. } => 1,
        }
    }
}

/// Encoder and decoder of envelopes. `max_decoded` bounds what a decoder will
/// allocate, so a corrupt or hostile length cannot exhaust memory.
#[derive(Debug, Clone, Copy)]
pub struct Envelope {
    pub max_decoded: usize,
}

impl Default for Envelope {
    fn default() -> Self {
        Envelope { max_decoded: 256 * 1024 * 1024 }
    }
}

impl Envelope {
    pub fn encode(&self, payload: &[u8], compression: Compression) -> Vec<u8> {
        let crc = crc32fast::hash(payload);
        let body: Cow<'_, [u8]> = match compression {
            Compression::None => Cow::Borrowed(payload),
            // Compressing from memory cannot fail except on allocation failure.
            Compression::Zstd { level } => match compress_reusing_context(payload, level) {
                Ok(compressed) => Cow::Owned(compressed),
                Err(_) => return self.encode(payload, Compression::None),
            },
        };
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        out.push(ENVELOPE_VERSION);
        out.push(compression.code());
        out.extend_from_slice(&crc.to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    pub fn decode<'a>(&self, bytes: &'a [u8]) -> Result<Cow<'a, [u8]>, CodecError> {
        let mut input = bytes;
        let header = take(&mut input, 2, "envelope header")?;
        if header[0] != ENVELOPE_VERSION {
            return Err(CodecError::UnknownVersion { what: "envelope", version: header[0] });
        }
        let compression = header[1];
        let crc = take_u32(&mut input, "envelope header")?;
        let payload: Cow<'a, [u8]> = match compression {
            0 => Cow::Borrowed(input),
            1 => Cow::Owned(decompress_bounded(input, self.max_decoded, "envelope payload")?),
            other => return Err(CodecError::UnknownCompression(other)),
        };
        if crc32fast::hash(&payload) != crc {
            return Err(CodecError::ChecksumMismatch { what: "envelope payload" });
        }
        Ok(payload)
    }
}

/// Decompresses one zstd frame whose header must state its content size, refusing
/// sizes over `limit` before allocating.
pub(crate) fn decompress_bounded(frame: &[u8], limit: usize, what: &'static str) -> Result<Vec<u8>, CodecError> {
    let corrupt = |reason: String| CodecError::Corrupt { what, reason };
    let size = match zstd::zstd_safe::get_frame_content_size(frame) {
        Ok(Some(size)) => size,
        Ok(None) => return Err(corrupt("zstd frame without a content size".into())),
        Err(_) => return Err(corrupt("not a zstd frame".into())),
    };
    if size > limit as u64 {
        return Err(CodecError::TooLarge { what, size, limit: limit as u64 });
    }
    let out = decompress_reusing_context(frame, size as usize).map_err(|e| corrupt(e.to_string()))?;
    if out.len() as u64 != size {
        return Err(corrupt(format!("frame decoded to {} bytes, header said {size}", out.len())));
    }
    Ok(out)
}

thread_local! {
    /// One zstd compression context per thread, kept between calls: a new
    /// context allocates and zeroes its tables (hundreds of KiB at level 3),
    /// which cost as much as compressing a 20 KB page.
    static COMPRESSOR: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { std::cell::RefCell::new(None) };
}

thread_local! {
    /// One zstd decompression context per thread, for the same reason: on a
    /// latest read, creating one took more of the service's CPU than
    /// decompressing the page did.
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
}

/// Decompresses one frame of at most `capacity` bytes (the caller bounds it
/// by the frame's stated size). Every call decodes a frame afresh
/// (`ZSTD_decompressDCtx`), whatever the last one met.
fn decompress_reusing_context(frame: &[u8], capacity: usize) -> std::io::Result<Vec<u8>> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let decompressor = match &mut *slot {
            Some(d) => d,
            None => {
                let mut d = zstd::bulk::Decompressor::new()?;
                d.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(WINDOW_LOG_MAX))?;
                slot.insert(d)
            }
        };
        decompressor.decompress(frame, capacity)
    })
}

fn compress_reusing_context(payload: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let compressor = match &mut *slot {
            Some((l, c)) if *l == level => c,
            _ => &mut slot.insert((level, zstd::bulk::Compressor::new(level)?)).1,
        };
        compressor.compress(payload)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips_raw_and_compressed() {
        let env = Envelope::default();
        let html = "<p>Anarchism is a political philosophy</p>".repeat(200);
        for c in [Compression::None, Compression::Zstd { level: 3 }] {
            let encoded = env.encode(html.as_bytes(), c);
            assert_eq!(env.decode(&encoded).unwrap().as_ref(), html.as_bytes());
        }
        let compressed = env.encode(html.as_bytes(), Compression::Zstd { level: 3 });
        assert!(compressed.len() < html.len() / 10, "{} bytes", compressed.len());
        assert_eq!(env.decode(&env.encode(b"", Compression::None)).unwrap().as_ref(), b"");
    }

    #[test]
    fn rejects_unknown_versions_and_compressions() {
        let env = Envelope::default();
        let mut encoded = env.encode(b"hello", Compression::None);
        encoded[0] = 2;
        assert_eq!(env.decode(&encoded), Err(CodecError::UnknownVersion { what: "envelope", version: 2 }));
        encoded[0] = ENVELOPE_VERSION;
        encoded[1] = 9;
        assert_eq!(env.decode(&encoded), Err(CodecError::UnknownCompression(9)));
    }

    #[test]
    fn detects_corruption_and_truncation() {
        let env = Envelope::default();
        let mut encoded = env.encode(b"hello world", Compression::None);
        *encoded.last_mut().unwrap() ^= 1;
        assert_eq!(env.decode(&encoded), Err(CodecError::ChecksumMismatch { what: "envelope payload" }));
        assert!(matches!(env.decode(&[1]), Err(CodecError::Truncated { .. })));
        assert!(matches!(env.decode(&[]), Err(CodecError::Truncated { .. })));
        let zipped = env.encode(&[7u8; 10_000], Compression::Zstd { level: 3 });
        assert!(env.decode(&zipped[..zipped.len() - 3]).is_err());
    }

    #[test]
    fn a_thread_decodes_afresh_after_a_broken_frame() {
        let env = Envelope::default();
        let page = "<p>Anarchism is a political philosophy</p>".repeat(500);
        let zipped = env.encode(page.as_bytes(), Compression::Zstd { level: 3 });
        let mut broken = zipped.clone();
        let middle = broken.len() / 2;
        broken[middle] ^= 0xff;
        for _ in 0..3 {
            assert!(env.decode(&broken).is_err());
            assert!(env.decode(&zipped[..zipped.len() - 5]).is_err());
            assert_eq!(env.decode(&zipped).expect("the context decodes the next frame afresh").as_ref(), page.as_bytes());
        }
    }

    #[test]
    fn refuses_to_inflate_past_the_limit() {
        let big = Envelope::default().encode(&vec![0u8; 1 << 20], Compression::Zstd { level: 1 });
        let small = Envelope { max_decoded: 1024 };
        assert!(matches!(small.decode(&big), Err(CodecError::TooLarge { .. })));
    }

    proptest! {
        #[test]
        fn round_trip_any_payload(payload in proptest::collection::vec(any::<u8>(), 0..4096), zstd in any::<bool>()) {
            let env = Envelope::default();
            let c = if zstd { Compression::Zstd { level: 1 } } else { Compression::None };
            let encoded = env.encode(&payload, c);
            let decoded = env.decode(&encoded).unwrap();
            prop_assert_eq!(decoded.as_ref(), &payload[..]);
        }

        #[test]
        fn any_bytes_decode_to_a_value_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Envelope::default().decode(&bytes);
        }
    }
}
