//! What old-store archives for one render, and how it is laid out as bytes.
//!
//! A render arrives as the JSON body of the HTTP contract. It is stored as one
//! block entry: the parts it has, each tagged and length-prefixed, HTML first.
//! Keeping the parts of a render together in one entry lets the block's long
//! window match each part against the same part of the revisions around it.

pub use revstore_api::{ArchiveBody, Part};
use revstore_api::{BodyError, Bundle};

/// The block entry of an archive write's body: `tag u8 | length u32 | bytes`
/// for each part present.
pub fn block_entry(body: &ArchiveBody) -> Vec<u8> {
    let json = |v: &Option<serde_json::Value>| v.as_ref().map(|v| v.to_string().into_bytes());
    let parts = [
        (Part::Html, body.html.as_ref().map(|s| s.as_bytes().to_vec())),
        (Part::DataParsoid, json(&body.data_parsoid)),
        (Part::SectionOffsets, json(&body.section_offsets)),
        (Part::Wikitext, body.wikitext.as_ref().map(|s| s.as_bytes().to_vec())),
    ];
    let mut out = Vec::with_capacity(parts.iter().map(|(_, p)| p.as_ref().map_or(0, |p| p.len() + 5)).sum());
    for (part, bytes) in parts {
        if let Some(bytes) = bytes {
            out.push(tag(part));
            out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
            out.extend_from_slice(&bytes);
        }
    }
    out
}

/// A stored entry, split into its parts without copying.
#[derive(Debug, Default)]
pub struct StoredParts<'a> {
    parts: [Option<&'a [u8]>; 4],
}

impl<'a> StoredParts<'a> {
    /// Splits an entry; fails on bytes [`block_entry`] did not produce.
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
        self.parts[tag(part) as usize - 1]
    }
}

/// A part's tag in a block entry (1-4; never reused).
fn tag(part: Part) -> u8 {
    match part {
        Part::Html => 1,
        Part::DataParsoid => 2,
        Part::SectionOffsets => 3,
        Part::Wikitext => 4,
    }
}

/// The bundle of a stored entry: every part it has, with `rev` and `tid`.
pub fn bundle(rev: u64, tid: &str, parts: &StoredParts<'_>) -> Result<Bundle, String> {
    let text = |part: Part| -> Result<Option<String>, String> {
        parts.get(part).map(|b| String::from_utf8(b.to_vec()).map_err(|e| format!("stored {} is not UTF-8: {e}", part.name()))).transpose()
    };
    let json = |part: Part| -> Result<Option<serde_json::Value>, String> {
        parts.get(part).map(|b| serde_json::from_slice(b).map_err(|e| format!("stored {} is not JSON: {e}", part.name()))).transpose()
    };
    let parts = ArchiveBody {
        html: text(Part::Html)?,
        data_parsoid: json(Part::DataParsoid)?,
        section_offsets: json(Part::SectionOffsets)?,
        wikitext: text(Part::Wikitext)?,
        page: None,
    };
    Ok(Bundle { rev, tid: tid.to_owned(), parts })
}

/// A body old-store cannot archive is a bad request.
pub fn check(body: &ArchiveBody) -> Result<(), revstore_service::ApiError> {
    body.validate().map_err(|BodyError(detail)| revstore_service::ApiError::bad_request(detail))
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
            page: None,
        };
        let only_wikitext = ArchiveBody { wikitext: Some("text".into()), ..Default::default() };
        for body in [full, only_wikitext] {
            let entry = block_entry(&body);
            let parts = StoredParts::parse(&entry).unwrap();
            assert_eq!(parts.get(Part::Html), body.html.as_deref().map(str::as_bytes));
            assert_eq!(parts.get(Part::Wikitext), body.wikitext.as_deref().map(str::as_bytes));
            let b = bundle(7, "t", &parts).unwrap();
            assert_eq!((b.rev, b.tid.as_str()), (7, "t"));
            assert_eq!(b.parts, body);
        }
    }

    #[test]
    fn malformed_entries_are_errors() {
        assert!(StoredParts::parse(&[1, 0, 0]).is_err());
        assert!(StoredParts::parse(&[1, 0, 0, 0, 9, b'a']).is_err());
        assert!(StoredParts::parse(&[9, 0, 0, 0, 0]).is_err());
        assert!(StoredParts::parse(&[0, 0, 0, 0, 0]).is_err());
    }
}
