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
}

impl StoredParts {
    pub fn encode(body: &RenderBody) -> StoredParts {
        let envelope = Envelope::default();
        let zstd = Compression::Zstd { level: 3 };
        let json = |v: &serde_json::Value| serde_json::to_vec(v).unwrap_or_default();
        StoredParts {
            html: envelope.encode(body.html.as_bytes(), zstd),
            data_parsoid: envelope.encode(&json(&body.data_parsoid), zstd),
            section_offsets: envelope.encode(&json(&body.section_offsets), zstd),
        }
    }
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
