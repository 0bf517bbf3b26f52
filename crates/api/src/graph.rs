//! The dependency graph's wire types: edges, listings, pull checks, updates.

use serde::{Deserialize, Serialize};

use crate::{BodyError, ChangeKind};

/// The most urgent priority (priorities run from 0, the least urgent).
pub const MAX_PRIORITY: i64 = 1000;
/// The most fragment ids one selector may name.
pub const MAX_SELECTOR_IDS: usize = 256;
/// The longest fragment id, in bytes.
pub const MAX_FRAGMENT_ID_BYTES: usize = 256;

/// One dependency of a child page on a parent page, as a client writes it.
/// One edge per (parent, child, type): every fragment of the pair is named in
/// the selectors, so that one change of the parent is one update of the child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Edge {
    /// The page depended on (a title).
    pub parent: String,
    /// Which changes of the parent matter: `modification` or `existence`.
    #[serde(rename = "type")]
    pub kind: ChangeKind,
    /// 0 (pull: re-render when read) to 1000 (push: re-render at once).
    pub priority: i64,
    /// The parent's fragments the child uses; absent: the whole parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_selector: Option<Vec<String>>,
    /// The child's fragments that use the parent; absent: the whole child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_selector: Option<Vec<String>>,
}

impl Edge {
    /// Checks everything but the parent's title (the service's title rules do that).
    pub fn validate(&self) -> Result<(), BodyError> {
        if !(0..=MAX_PRIORITY).contains(&self.priority) {
            return Err(BodyError(format!("priority {} is not within 0-{MAX_PRIORITY}", self.priority)));
        }
        for (name, selector) in [("parent_selector", &self.parent_selector), ("child_selector", &self.child_selector)] {
            if let Some(ids) = selector {
                check_selector(name, ids)?;
            }
        }
        Ok(())
    }
}

/// A selector names 1 to 256 fragment ids, each 1 to 256 bytes without
/// control characters.
pub fn check_selector(name: &str, ids: &[String]) -> Result<(), BodyError> {
    if ids.is_empty() || ids.len() > MAX_SELECTOR_IDS {
        return Err(BodyError(format!("{name} must name 1 to {MAX_SELECTOR_IDS} fragment ids")));
    }
    for id in ids {
        check_fragment_id(name, id)?;
    }
    Ok(())
}

fn check_fragment_id(name: &str, id: &str) -> Result<(), BodyError> {
    if id.is_empty() || id.len() > MAX_FRAGMENT_ID_BYTES || id.chars().any(char::is_control) {
        let shown: String = id.chars().take(40).collect();
        return Err(BodyError(format!("{name}: fragment id {shown:?} must be 1 to {MAX_FRAGMENT_ID_BYTES} bytes, no control characters")));
    }
    Ok(())
}

/// The body of `PUT /{domain}/v1/deps/{child}`: the child's whole dependency set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EdgeSet {
    pub edges: Vec<Edge>,
}

/// What replacing a dependency set changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Replaced {
    pub added: u64,
    pub removed: u64,
    /// Edges whose priority or selectors changed.
    pub changed: u64,
    pub unchanged: u64,
}

/// One dependency of a page, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Dependency {
    pub parent: String,
    #[serde(rename = "type")]
    pub kind: ChangeKind,
    pub priority: i64,
    pub parent_selector: Option<Vec<String>>,
    pub child_selector: Option<Vec<String>>,
    /// When the child was last brought up to date with this parent (RFC 3339).
    pub last_updated: Option<String>,
    /// When the edge was first written (RFC 3339).
    pub created: Option<String>,
}

/// One dependent of a page, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Dependent {
    pub child: String,
    #[serde(rename = "type")]
    pub kind: ChangeKind,
    pub priority: i64,
    pub parent_selector: Option<Vec<String>>,
    pub child_selector: Option<Vec<String>>,
}

/// A page of a page's dependencies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DependencyList {
    pub items: Vec<Dependency>,
    /// Pass back as `cursor` for the next page; `null` at the end.
    pub next: Option<String>,
}

/// A page of a page's dependents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DependentList {
    pub items: Vec<Dependent>,
    /// Pass back as `cursor` for the next page; `null` at the end.
    pub next: Option<String>,
}

/// One stale dependency of a page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PendingItem {
    pub parent: String,
    #[serde(rename = "type")]
    pub kind: ChangeKind,
    pub priority: i64,
    /// The child's fragments to re-render; absent: the whole child.
    pub child_selector: Option<Vec<String>>,
    /// The parent's latest change that the child has not caught up with (RFC 3339).
    pub changed_at: String,
}

/// The answer of a pull check: whether the page is stale, and what is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Pending {
    /// On the first page: whether anything of the page is stale. On a page
    /// after it: whether this page holds items or others follow.
    pub needs_update: bool,
    /// Priority ascending (pull first); within a priority, by type and parent descending.
    pub items: Vec<PendingItem>,
    /// Present when more stale items follow: pass it back as `cursor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// The body of `POST /{domain}/v1/updated/{child}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdatedBody {
    /// When the render that brought the page up to date started (RFC 3339).
    pub at: String,
    /// The child's fragments that render covered; absent: the whole page.
    #[serde(default)]
    pub selectors: Option<Vec<String>>,
}

/// How many edges an update brought up to date.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UpdatedAnswer {
    pub updated: u64,
}

/// Microseconds since the epoch of an RFC 3339 time (`2026-12-01T08:00:00Z`).
pub fn parse_time(name: &str, text: &str) -> Result<i64, BodyError> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_micros())
        .ok()
        .filter(|micros| *micros > 0)
        .ok_or_else(|| BodyError(format!("{name} {:?} is not an RFC 3339 time after 1970", text.chars().take(40).collect::<String>())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge() -> Edge {
        Edge { parent: "Template:Cite".into(), kind: ChangeKind::Modification, priority: 10, parent_selector: None, child_selector: None }
    }

    #[test]
    fn edges_are_checked() {
        assert!(edge().validate().is_ok());
        assert!(Edge { priority: -1, ..edge() }.validate().unwrap_err().0.contains("priority"));
        assert!(Edge { priority: 1001, ..edge() }.validate().is_err());
        assert!(Edge { child_selector: Some(vec![]), ..edge() }.validate().unwrap_err().0.contains("child_selector"));
        assert!(Edge { parent_selector: Some(vec!["a\nb".into()]), ..edge() }.validate().is_err());
        assert!(Edge { parent_selector: Some(vec!["x".repeat(257)]), ..edge() }.validate().is_err());
        assert!(Edge { parent_selector: Some(vec!["mwAB".into(), "mwAC".into()]), ..edge() }.validate().is_ok());
    }

    #[test]
    fn the_wire_shape_of_an_edge() {
        let json = serde_json::json!({"parent": "Template:Cite", "type": "existence", "priority": 3, "child_selector": ["mwAB"]});
        let parsed: Edge = serde_json::from_value(json).unwrap();
        assert_eq!(parsed.kind, ChangeKind::Existence);
        assert!(serde_json::from_value::<Edge>(serde_json::json!({"parent": "A", "type": "rename", "priority": 1})).is_err());
        assert!(serde_json::from_value::<Edge>(serde_json::json!({"parent": "A", "type": "existence", "priority": 1, "x": 1})).is_err());
    }

    #[test]
    fn times_are_rfc_3339() {
        assert_eq!(parse_time("at", "1970-01-01T00:00:01Z").unwrap(), 1_000_000);
        assert_eq!(parse_time("at", "2026-12-01T08:00:00.5+01:00").unwrap(), 1_796_108_400_500_000);
        assert!(parse_time("at", "yesterday").unwrap_err().0.contains("RFC 3339"));
        assert!(parse_time("at", "1969-12-31T23:59:59Z").is_err());
    }
}
