//! A render: Parsoid HTML, data-parsoid and section offsets, stored and served
//! as one unit.

use revstore_codecs::{Compression, Envelope};
use revstore_keys::{RevId, Tid};

use revstore_schema::tables::current_store::col;

use crate::error::PagesError;

pub use revstore_api::{Part, RenderBody, Selection};

/// The parts current-store serves (it holds no wikitext).
pub const SERVED: [Part; 3] = [Part::Html, Part::DataParsoid, Part::SectionOffsets];

/// The column a part is stored in.
pub fn column(part: Part) -> Option<&'static str> {
    match part {
        Part::Html => Some(col::HTML),
        Part::DataParsoid => Some(col::DATA_PARSOID),
        Part::SectionOffsets => Some(col::SECTION_OFFSETS),
        Part::Wikitext => None,
    }
}

/// The stored columns a read of `selection` needs.
pub fn columns(selection: Selection) -> &'static [&'static str] {
    match selection {
        Selection::Part(Part::Html) => &[col::TID, col::HTML],
        Selection::Part(Part::DataParsoid) => &[col::TID, col::DATA_PARSOID],
        Selection::Part(Part::SectionOffsets) => &[col::TID, col::SECTION_OFFSETS],
        Selection::Part(Part::Wikitext) => &[col::TID],
        Selection::Bundle => &[col::TID, col::HTML, col::DATA_PARSOID, col::SECTION_OFFSETS],
    }
}

/// A render's parts as stored: each an envelope (zstd) of its bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredParts {
    pub html: Vec<u8>,
    pub data_parsoid: Vec<u8>,
    pub section_offsets: Vec<u8>,
    /// [`body_hash`] of the parts as sent: what tells a retried write of a
    /// render from a different render under the same (rev, tid).
    pub body_hash: i64,
}

/// XXH3 (64 bits, a fixed published function, so every build and replica
/// agrees) of a render's parts, each after its length.
fn body_hash(parts: &[&[u8]]) -> i64 {
    let mut hasher = twox_hash::XxHash3_64::with_seed(0);
    for part in parts {
        std::hash::Hasher::write(&mut hasher, &(part.len() as u64).to_be_bytes());
        std::hash::Hasher::write(&mut hasher, part);
    }
    std::hash::Hasher::finish(&hasher) as i64
}

impl StoredParts {
    pub fn encode(body: &RenderBody) -> StoredParts {
        let envelope = Envelope::default();
        let zstd = Compression::Zstd { level: 3 };
        let json = |v: &serde_json::Value| serde_json::to_vec(v).unwrap_or_default();
        let (data_parsoid, section_offsets) = (json(&body.data_parsoid), json(&body.section_offsets));
        StoredParts {
            body_hash: body_hash(&[body.html.as_bytes(), &data_parsoid, &section_offsets]),
            html: envelope.encode(body.html.as_bytes(), zstd),
            data_parsoid: envelope.encode(&data_parsoid, zstd),
            section_offsets: envelope.encode(&section_offsets, zstd),
        }
    }
}

/// The first bytes of a hand-off: its format marker, so that a payload of
/// any other shape is refused as damaged, never guessed at.
const PARTS_HANDOFF: &[u8; 4] = b"RSP1";

impl StoredParts {
    /// The hand-off of a revision's first render to old-store, as the outbox
    /// queues it: the parts as stored (already compressed), each after its
    /// length, so that a write compresses its content once; the delivery
    /// worker rebuilds the JSON body old-store takes ([`archive_json`]).
    pub fn handoff_payload(&self) -> Vec<u8> {
        let parts = [&self.html, &self.data_parsoid, &self.section_offsets];
        let mut out = Vec::with_capacity(PARTS_HANDOFF.len() + parts.iter().map(|p| 4 + p.len()).sum::<usize>());
        out.extend_from_slice(PARTS_HANDOFF);
        for part in parts {
            out.extend_from_slice(&(part.len() as u32).to_be_bytes());
            out.extend_from_slice(part);
        }
        out
    }
}

/// The JSON body of old-store's archive write from a queued hand-off
/// ([`StoredParts::handoff_payload`]).
pub fn archive_json(payload: &[u8]) -> Result<Vec<u8>, PagesError> {
    let Some(mut rest) = payload.strip_prefix(PARTS_HANDOFF.as_slice()) else {
        return Err(PagesError::Corrupt("hand-off without its format marker".into()));
    };
    let mut next = |what: &str| -> Result<Vec<u8>, PagesError> {
        let truncated = || PagesError::Corrupt(format!("hand-off truncated in its {what}"));
        let (len, after) = rest.split_first_chunk::<4>().ok_or_else(truncated)?;
        let len = u32::from_be_bytes(*len) as usize;
        let (part, after) = after.split_at_checked(len).ok_or_else(truncated)?;
        rest = after;
        decode_part(part, what)
    };
    let (html, data_parsoid, section_offsets) = (next("html")?, next("data-parsoid")?, next("section offsets")?);
    let json = |bytes: &[u8], what: &str| {
        serde_json::from_slice(bytes).map_err(|e| PagesError::Corrupt(format!("hand-off {what} is not JSON: {e}")))
    };
    let body = RenderBody {
        html: String::from_utf8(html).map_err(|_| PagesError::Corrupt("hand-off html is not UTF-8".into()))?,
        data_parsoid: json(&data_parsoid, "data-parsoid")?,
        section_offsets: json(&section_offsets, "section offsets")?,
    };
    serde_json::to_vec(&body).map_err(|e| PagesError::Corrupt(format!("hand-off body: {e}")))
}

/// Decodes one stored part, reporting damage as an internal error.
pub fn decode_part(stored: &[u8], what: &str) -> Result<Vec<u8>, PagesError> {
    Envelope::default().decode(stored).map(|c| c.into_owned()).map_err(|e| PagesError::Corrupt(format!("stored {what} is unreadable: {e}")))
}

/// A render's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderId {
    pub rev: RevId,
    pub tid: Tid,
}

impl RenderId {
    /// `"<rev>/<tid>"`, quoted, as the ETag header carries it.
    pub fn etag(&self) -> String {
        revstore_api::render_etag(self.rev.get(), &self.tid)
    }

    /// Precedence: by revision, then by render time.
    pub fn is_newer_than(&self, other: &RenderId) -> bool {
        (self.rev, self.tid) > (other.rev, other.tid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body() -> RenderBody {
        RenderBody {
            html: "<p>caf\u{e9} \"quoted\"</p>".repeat(50),
            data_parsoid: json!({"ids": {"mwAA": {"dsr": [0, 12, 0, 0]}}}),
            section_offsets: json!({"0": [0, 40]}),
        }
    }

    #[test]
    fn a_handoff_of_stored_parts_yields_the_body_old_store_takes() {
        let payload = StoredParts::encode(&body()).handoff_payload();
        let json = archive_json(&payload).expect("readable");
        assert_eq!(serde_json::from_slice::<RenderBody>(&json).expect("a render body"), body());
    }

    #[test]
    fn a_damaged_handoff_is_refused_not_guessed() {
        let payload = StoredParts::encode(&body()).handoff_payload();
        let json_in_an_envelope = Envelope::default().encode(&serde_json::to_vec(&body()).expect("json"), Compression::Zstd { level: 3 });
        assert!(matches!(archive_json(&json_in_an_envelope), Err(PagesError::Corrupt(_))), "a payload without the marker");
        for cut in [2, 5, 9, payload.len() - 1] {
            assert!(matches!(archive_json(&payload[..cut]), Err(PagesError::Corrupt(_))), "cut at {cut}");
        }
        let mut flipped = payload.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0xff;
        assert!(matches!(archive_json(&flipped), Err(PagesError::Corrupt(_))));
    }
}
