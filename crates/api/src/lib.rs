//! The wire contract of revstore's HTTP APIs, in one place for the services
//! that serve it and the clients that call it: what a render's parts are
//! called and which content type each is served with, the bodies of render
//! writes and bundles, the ETag of a render, the change notice sent to the
//! dependency graph and the graph's own bodies ([`graph`]), the janitor's
//! admin calls ([`janitor`]), and the paths of the calls services make to each
//! other.
//!
//! Nothing here knows how a service stores data; that stays in the service.

mod bodies;
pub mod graph;
pub mod janitor;
mod notice;
mod parts;
pub mod paths;

pub use bodies::{ArchiveBody, ArchivedRevision, BodyError, Bundle, PageIdentity, RenderBody, RevisionList};
pub use notice::{ChangeKind, ChangeNotice};
pub use parts::{DATA_PARSOID_PROFILE, HTML_PROFILE, JSON_CONTENT_TYPE, Part, Selection};

/// The ETag of a render: `"<rev>/<tid>"`, quoted. Both services give a
/// render the same one, so a client's cached copy revalidates wherever the
/// render is served from.
pub fn render_etag(rev: u64, tid: &revstore_keys::Tid) -> String {
    format!("\"{rev}/{tid}\"")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_etag_names_revision_and_render() {
        let tid: revstore_keys::Tid = "a1b2c3d4-0000-11ee-8000-000000000000".parse().unwrap();
        assert_eq!(super::render_etag(42, &tid), "\"42/a1b2c3d4-0000-11ee-8000-000000000000\"");
    }
}
