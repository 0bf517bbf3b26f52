//! The paths of the calls services make to each other. A title is always one
//! percent-encoded segment ([`path_segment`]).

use crate::Selection;

/// Percent-encodes one path segment (a title may contain `/`, `?`, `#`, `%`, spaces).
pub fn path_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        match b {
            b'A'..=b'Z'
            | b'a'..=b'z'
            | b'0'..=b'9'
            | b'-'
            | b'.'
            | b'_'
            | b'~'
            | b':'
            | b'@'
            | b'!'
            | b'$'
            | b'&'
            | b'\''
            | b'('
            | b')'
            | b'*'
            | b'+'
            | b','
            | b';'
            | b'=' => out.push(b as char),
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

/// old-store: archive a render (`PUT`).
pub fn archive_render(domain: &str, title: &str, rev: u64, tid: &str) -> String {
    format!("/{domain}/v1/archive/{}/{rev}/{tid}", path_segment(title))
}

/// old-store: hide a revision (`POST`).
pub fn archive_suppress(domain: &str, title: &str, rev: u64) -> String {
    format!("/{domain}/v1/archive/{}/{rev}/suppress", path_segment(title))
}

/// old-store: a page's archive, deleted through a revision (`DELETE`, query `rev`).
pub fn archive_page(domain: &str, title: &str) -> String {
    format!("/{domain}/v1/archive/{}", path_segment(title))
}

/// old-store: read a revision's first render, or one render by tid (`GET`).
pub fn archive_read(domain: &str, selection: Selection, title: &str, rev: u64, tid: Option<&str>) -> String {
    let mut path = format!("/{domain}/v1/archive/{}/{}/{rev}", selection.name(), path_segment(title));
    if let Some(tid) = tid {
        path.push('/');
        path.push_str(tid);
    }
    path
}

/// old-store: a title's archived revisions, in revision order (`GET`; query
/// `from`, `limit`, `cursor`).
pub fn archive_revisions(domain: &str, title: &str) -> String {
    format!("/{domain}/v1/archive/revisions/{}", path_segment(title))
}

/// current-store: one render's part (`GET`; the `Location` of a write).
pub fn page_render(domain: &str, selection: Selection, title: &str, rev: u64, tid: &str) -> String {
    format!("/{domain}/v1/page/{}/{}/{rev}/{tid}", selection.name(), path_segment(title))
}

/// dependency graph: a page's change notice (`POST`).
pub fn graph_changes(domain: &str) -> String {
    format!("/{domain}/v1/changes")
}

/// A page's dependency set in the graph (`GET`, `PUT`, `DELETE`).
pub fn graph_dependencies(domain: &str, child: &str) -> String {
    format!("/{domain}/v1/deps/{}", path_segment(child))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Part;

    #[test]
    fn titles_are_one_path_segment() {
        assert_eq!(path_segment("AC/DC"), "AC%2FDC");
        assert_eq!(path_segment("Main Page?x#y%"), "Main%20Page%3Fx%23y%25");
        assert_eq!(path_segment("Ünï"), "%C3%9Cn%C3%AF");
        assert_eq!(path_segment("User:Foo_(bar)"), "User:Foo_(bar)");
    }

    #[test]
    fn paths_follow_the_documented_templates() {
        assert_eq!(archive_render("d", "AC/DC", 7, "t"), "/d/v1/archive/AC%2FDC/7/t");
        assert_eq!(archive_suppress("d", "A", 7), "/d/v1/archive/A/7/suppress");
        assert_eq!(archive_read("d", Selection::Bundle, "A", 7, None), "/d/v1/archive/bundle/A/7");
        assert_eq!(archive_read("d", Selection::Part(Part::Wikitext), "A", 7, Some("t")), "/d/v1/archive/wikitext/A/7/t");
        assert_eq!(page_render("d", Selection::Part(Part::Html), "A", 7, "t"), "/d/v1/page/html/A/7/t");
        assert_eq!(graph_changes("d"), "/d/v1/changes");
        assert_eq!(graph_dependencies("d", "AC/DC?"), "/d/v1/deps/AC%2FDC%3F");
    }
}
