//! The bodies of render writes, and the bundle a read of all parts answers.

use serde::{Deserialize, Serialize};

/// Why a body cannot be stored (the services answer it 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BodyError(pub String);

fn must_be_an_object(name: &str, value: Option<&serde_json::Value>) -> Result<(), BodyError> {
    match value {
        Some(v) if !v.is_object() => Err(BodyError(format!("{name} must be a JSON object"))),
        _ => Ok(()),
    }
}

/// The body of a render write to current-store: all three parts.
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
    pub fn validate(&self) -> Result<(), BodyError> {
        if self.html.is_empty() {
            return Err(BodyError("html is empty".into()));
        }
        must_be_an_object("data-parsoid", Some(&self.data_parsoid))?;
        must_be_an_object("section-offsets", Some(&self.section_offsets))
    }
}

/// What the wiki says of a page, where a write named it: MediaWiki's page
/// id and namespace number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PageIdentity {
    /// MediaWiki's page id (`page_id`, `<page><id>` in an XML dump).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 9_223_372_036_854_775_807_u64)]
    pub id: Option<u64>,
    /// The namespace number (`<page><ns>`): 0 for articles, 10 for templates, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = -2, maximum = 1_048_576)]
    pub namespace: Option<i64>,
}

impl PageIdentity {
    /// The most a namespace number may be (MediaWiki's are small integers;
    /// extensions use up to a few thousand).
    pub const MAX_NAMESPACE: i64 = 1 << 20;

    pub fn is_empty(&self) -> bool {
        self.id.is_none() && self.namespace.is_none()
    }

    /// A page id from 1 to 2^63-1 and a namespace from -2 to [`Self::MAX_NAMESPACE`].
    pub fn validate(&self) -> Result<(), BodyError> {
        if self.id.is_some_and(|id| id == 0 || id > i64::MAX as u64) {
            return Err(BodyError("page.id must be from 1 to 2^63-1".into()));
        }
        if self.namespace.is_some_and(|ns| !(-2..=Self::MAX_NAMESPACE).contains(&ns)) {
            return Err(BodyError(format!("page.namespace must be from -2 to {}", Self::MAX_NAMESPACE)));
        }
        Ok(())
    }
}

/// The body of an archive write to old-store: the render's parts, each
/// optional, plus the revision's wikitext where the caller has it (a dump
/// import has only that).
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
    /// What the wiki says of the page (an import takes it from the XML
    /// dump), kept per title for history dumps; not part of the render.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page: Option<PageIdentity>,
}

impl ArchiveBody {
    pub fn validate(&self) -> Result<(), BodyError> {
        if self.html.is_none() && self.wikitext.is_none() {
            return Err(BodyError("a render needs html or wikitext".into()));
        }
        if self.html.as_deref() == Some("") {
            return Err(BodyError("html is empty".into()));
        }
        must_be_an_object("data-parsoid", self.data_parsoid.as_ref())?;
        must_be_an_object("section-offsets", self.section_offsets.as_ref())?;
        self.page.as_ref().map_or(Ok(()), PageIdentity::validate)
    }
}

impl From<RenderBody> for ArchiveBody {
    fn from(body: RenderBody) -> Self {
        ArchiveBody {
            html: Some(body.html),
            data_parsoid: Some(body.data_parsoid),
            section_offsets: Some(body.section_offsets),
            wikitext: None,
            page: None,
        }
    }
}

/// All the parts of one render in one JSON document, with its identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bundle {
    pub rev: u64,
    pub tid: String,
    #[serde(flatten)]
    pub parts: ArchiveBody,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_problem() {
        assert!(ArchiveBody::default().validate().unwrap_err().0.contains("html or wikitext"));
        let bad = ArchiveBody { html: Some("x".into()), data_parsoid: Some(serde_json::json!([1])), ..Default::default() };
        assert!(bad.validate().unwrap_err().0.contains("data-parsoid"));
        let render = RenderBody { html: String::new(), data_parsoid: serde_json::json!({}), section_offsets: serde_json::json!({}) };
        assert_eq!(render.validate().unwrap_err().0, "html is empty");
        let render = RenderBody { html: "<p/>".into(), section_offsets: serde_json::json!("x"), ..render };
        assert!(render.validate().unwrap_err().0.contains("section-offsets"));
    }

    #[test]
    fn a_bundle_is_the_body_with_rev_and_tid() {
        let parts = ArchiveBody { html: Some("<p/>".into()), data_parsoid: Some(serde_json::json!({"ids": {}})), ..Default::default() };
        let bundle = Bundle { rev: 7, tid: "t".into(), parts: parts.clone() };
        let json = serde_json::to_value(&bundle).unwrap();
        assert_eq!(json, serde_json::json!({"rev": 7, "tid": "t", "html": "<p/>", "data-parsoid": {"ids": {}}}));
        assert_eq!(serde_json::from_value::<Bundle>(json).unwrap(), bundle);
    }
}

/// One archived render in old-store's listing of a title's revisions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ArchivedRevision {
    pub rev: u64,
    pub tid: String,
    pub rendered_at: String,
}

/// A page of old-store's listing of a title's revisions, in revision order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RevisionList {
    pub items: Vec<ArchivedRevision>,
    /// Pass back as `cursor` for the next page; `null` at the end.
    pub next: Option<String>,
}
