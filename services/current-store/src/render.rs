//! A render: Parsoid HTML, data-parsoid and section offsets, stored and served
//! as one unit.

use revstore_codecs::{Compression, Envelope};
use revstore_keys::{RevId, Tid};

use crate::error::PagesError;
use serde::{Deserialize, Serialize};

/// The body of a render write, as the HTTP API contract gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenderBody {
    /// The Parsoid HTML document.
    pub html: String,
    /// data-parsoid, a JSON object.
    #[serde(rename = "data-parsoid")]
    #[schema(value_type = Object)]
    pub data_parsoid: serde_json::Value,
    /// Section offsets, a JSON object.
    #[serde(rename = "section-offsets")]
    #[schema(value_type = Object)]
    pub section_offsets: serde_json::Value,
}

impl RenderBody {
    pub fn validate(&self) -> Result<(), PagesError> {
        let invalid = |what: &str| Err(PagesError::Invalid(what.to_owned()));
        if self.html.is_empty() {
            return invalid("html is empty");
        }
        if !self.data_parsoid.is_object() {
            return invalid("data-parsoid must be a JSON object");
        }
        if !self.section_offsets.is_object() {
            return invalid("section-offsets must be a JSON object");
        }
        Ok(())
    }
}

/// One part of a render, as named in URLs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Html,
    DataParsoid,
    SectionOffsets,
    /// All three parts in one JSON document, with `rev` and `tid`.
    Bundle,
}

pub const HTML_PROFILE: &str = "https://www.mediawiki.org/wiki/Specs/HTML/2.8.0";
pub const DATA_PARSOID_PROFILE: &str = "https://www.mediawiki.org/wiki/Specs/data-parsoid/0.0.1";

impl Part {
    pub fn parse(s: &str) -> Option<Part> {
        Some(match s {
            "html" => Part::Html,
            "data-parsoid" => Part::DataParsoid,
            "section-offsets" => Part::SectionOffsets,
            "bundle" => Part::Bundle,
            _ => return None,
        })
    }

    pub fn content_type(self) -> String {
        match self {
            Part::Html => format!("text/html; charset=utf-8; profile=\"{HTML_PROFILE}\""),
            Part::DataParsoid => format!("application/json; charset=utf-8; profile=\"{DATA_PARSOID_PROFILE}\""),
            Part::SectionOffsets | Part::Bundle => "application/json; charset=utf-8".to_owned(),
        }
    }

    /// The stored columns a read of this part needs.
    pub fn columns(self) -> &'static [&'static str] {
        match self {
            Part::Html => &["tid", "html"],
            Part::DataParsoid => &["tid", "data_parsoid"],
            Part::SectionOffsets => &["tid", "section_offsets"],
            Part::Bundle => &["tid", "html", "data_parsoid", "section_offsets"],
        }
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
        format!("\"{}/{}\"", self.rev, self.tid)
    }

    /// Precedence: by revision, then by render time.
    pub fn is_newer_than(&self, other: &RenderId) -> bool {
        (self.rev, self.tid) > (other.rev, other.tid)
    }
}
