//! The change notice recorded by the dependency graph (`POST /{domain}/v1/changes`);
//! current-store sends one when a page gets a new latest revision.

use serde::{Deserialize, Serialize};

/// What happened to a page; also the type of a dependency (which changes of
/// the parent the child cares about).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// A new revision became the page's latest.
    Modification,
    /// The page was created or deleted (links to it turn blue or red).
    Existence,
}

/// One page's change, posted to `/{domain}/v1/changes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChangeNotice {
    /// The page's title (normalised, as current-store keys it).
    pub page: String,
    #[serde(rename = "type")]
    pub kind: ChangeKind,
    /// When the render that carried the change was made (RFC 3339).
    pub at: String,
    /// The fragment of the page that changed; absent: the whole page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_notice_keeps_its_wire_shape() {
        let notice =
            ChangeNotice { page: "Main_Page".into(), kind: ChangeKind::Modification, at: "2026-01-01T00:00:00Z".into(), selector: None };
        assert_eq!(
            serde_json::to_value(&notice).unwrap(),
            serde_json::json!({"page": "Main_Page", "type": "modification", "at": "2026-01-01T00:00:00Z"})
        );
    }
}
