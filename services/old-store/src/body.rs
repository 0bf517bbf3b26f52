//! What old-store archives for one render, and how it is laid out as bytes.
//!
//! A render arrives as the JSON body of the HTTP contract. It is stored as one
//! block entry: the parts it has, each tagged and length-prefixed, HTML first.
//! Keeping the parts of a render together in one entry lets the block's long
//! window match each part against the same part of the revisions around it.

use revstore_service::ApiError;
use serde::{Deserialize, Serialize};

/// The body of an archive write: the current-store render body, plus the
/// revision's wikitext where the caller has it (a dump import has only that).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ArchiveBody {
    /// The Parsoid HTML document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    /// data-parsoid, a JSON object.
    #[serde(rename = "data-parsoid", default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub data_parsoid: Option<serde_json::Value>,
    /// Section offsets, a JSON object.
    #[serde(rename = "section-offsets", default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub section_offsets: Option<serde_json::Value>,
    /// The revision's wikitext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wikitext: Option<String>,
}

impl ArchiveBody {
    pub fn validate(&self) -> Result<(), ApiError> {
        if self.html.is_none() && self.wikitext.is_none() {
            return Err(ApiError::bad_request("a render needs html or wikitext"));
        }
        if self.html.as_deref() == Some("") {
            return Err(ApiError::bad_request("html is empty"));
        }
        for (name, value) in [("data-parsoid", &self.data_parsoid), ("section-offsets", &self.section_offsets)] {
            if value.as_ref().is_some_and(|v| !v.is_object()) {
                return Err(ApiError::bad_request(format!("{name} must be a JSON object")));
            }
        }
        Ok(())
    }

    /// The block entry: `tag u8 | length u32 | bytes` for each part present.
    pub fn encode(&self) -> Vec<u8> {
        let json = |v: &Option<serde_json::Value>| v.as_ref().map(|v| v.to_string().into_bytes());
        let parts = [
            (Part::Html, self.html.as_ref().map(|s| s.as_bytes().to_vec())),
            (Part::DataParsoid, json(&self.data_parsoid)),
            (Part::SectionOffsets, json(&self.section_offsets)),
            (Part::Wikitext, self.wikitext.as_ref().map(|s| s.as_bytes().to_vec())),
        ];
        let mut out = Vec::with_capacity(parts.iter().map(|(_, p)| p.as_ref().map_or(0, |p| p.len() + 5)).sum());
        for (part, bytes) in parts {
            if let Some(bytes) = bytes {
                out.push(part.tag());
                out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
                out.extend_from_slice(&bytes);
            }
        }
        out
    }
}

/// A stored entry, split into its parts without copying.
#[derive(Debug, Default)]
pub struct StoredParts<'a> {
    parts: [Option<&'a [u8]>; 4],
}

impl<'a> StoredParts<'a> {
    /// Splits an entry; fails on bytes `ArchiveBody::encode` did not produce.
    pub fn parse(mut entry: &'a [u8]) -> Result<Self, String> {
        let mut parts = StoredParts::default();
        while !entry.is_empty() {
            if entry.len() < 5 {
                return Err("truncated part header".into());
            }
            let tag = entry[0];
            let len = u32::from_be_bytes([entry[1], entry[2], entry[3], entry[4]]) as usize;
            let bytes = entry.get(5..5 + len).ok_or("part longer than the entry")?;
            let slot = (tag as usize).checked_sub(1).and_then(|i| parts.parts.get_mut(i)).ok_or(format!("unknown part tag {tag}"))?;
            *slot = Some(bytes);
            entry = &entry[5 + len..];
        }
        Ok(parts)
    }

    pub fn get(&self, part: Part) -> Option<&'a [u8]> {
        self.parts[part.tag() as usize - 1]
    }
}

/// One part of an archived render, as named in URLs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Html,
    DataParsoid,
    SectionOffsets,
    Wikitext,
}

pub const HTML_PROFILE: &str = "https://www.mediawiki.org/wiki/Specs/HTML/2.8.0";

impl Part {
    pub const ALL: [Part; 4] = [Part::Html, Part::DataParsoid, Part::SectionOffsets, Part::Wikitext];

    fn tag(self) -> u8 {
        match self {
            Part::Html => 1,
            Part::DataParsoid => 2,
            Part::SectionOffsets => 3,
            Part::Wikitext => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Part::Html => "html",
            Part::DataParsoid => "data-parsoid",
            Part::SectionOffsets => "section-offsets",
            Part::Wikitext => "wikitext",
        }
    }

    pub fn content_type(self) -> String {
        match self {
            Part::Html => format!("text/html; charset=utf-8; profile=\"{HTML_PROFILE}\""),
            Part::DataParsoid | Part::SectionOffsets => "application/json; charset=utf-8".to_owned(),
            Part::Wikitext => "text/plain; charset=utf-8".to_owned(),
        }
    }

    pub fn is_json(self) -> bool {
        matches!(self, Part::DataParsoid | Part::SectionOffsets)
    }
}

/// The bundle of a stored entry: the JSON body with `rev` and `tid` added.
pub fn bundle(rev: u64, tid: &str, parts: &StoredParts<'_>) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let mut out = serde_json::Map::new();
    out.insert("rev".into(), rev.into());
    out.insert("tid".into(), tid.into());
    for part in Part::ALL {
        let Some(bytes) = parts.get(part) else { continue };
        let value = if part.is_json() {
            serde_json::from_slice(bytes).map_err(|e| format!("stored {} is not JSON: {e}", part.name()))?
        } else {
            serde_json::Value::String(String::from_utf8(bytes.to_vec()).map_err(|e| format!("stored {} is not UTF-8: {e}", part.name()))?)
        };
        out.insert(part.name().into(), value);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_with_any_parts() {
        let full = ArchiveBody {
            html: Some("<p>x</p>".into()),
            data_parsoid: Some(serde_json::json!({"ids": {}})),
            section_offsets: Some(serde_json::json!({})),
            wikitext: Some("''x''".into()),
        };
        let only_wikitext = ArchiveBody { wikitext: Some("text".into()), ..Default::default() };
        for body in [full, only_wikitext] {
            let entry = body.encode();
            let parts = StoredParts::parse(&entry).unwrap();
            assert_eq!(parts.get(Part::Html), body.html.as_deref().map(str::as_bytes));
            assert_eq!(parts.get(Part::Wikitext), body.wikitext.as_deref().map(str::as_bytes));
            let b = bundle(7, "t", &parts).unwrap();
            let back: ArchiveBody =
                serde_json::from_value(serde_json::Value::Object(b.into_iter().filter(|(k, _)| k != "rev" && k != "tid").collect()))
                    .unwrap();
            assert_eq!(back, body);
        }
    }

    #[test]
    fn malformed_entries_are_errors() {
        assert!(StoredParts::parse(&[1, 0, 0]).is_err());
        assert!(StoredParts::parse(&[1, 0, 0, 0, 9, b'a']).is_err());
        assert!(StoredParts::parse(&[9, 0, 0, 0, 0]).is_err());
        assert!(StoredParts::parse(&[0, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn validation_names_the_problem() {
        assert!(ArchiveBody::default().validate().unwrap_err().detail().contains("html or wikitext"));
        let bad = ArchiveBody { html: Some("x".into()), data_parsoid: Some(serde_json::json!([1])), ..Default::default() };
        assert!(bad.validate().unwrap_err().detail().contains("data-parsoid"));
    }
}
