//! A render's parts, as URLs name them and as they are served.

/// The profile of Parsoid HTML (a `profile` parameter of its content type).
pub const HTML_PROFILE: &str = "https://www.mediawiki.org/wiki/Specs/HTML/2.8.0";
/// The profile of data-parsoid.
pub const DATA_PARSOID_PROFILE: &str = "https://www.mediawiki.org/wiki/Specs/data-parsoid/0.0.1";
/// Section offsets and bundles.
pub const JSON_CONTENT_TYPE: &str = "application/json; charset=utf-8";

const HTML_CONTENT_TYPE: &str = "text/html; charset=utf-8; profile=\"https://www.mediawiki.org/wiki/Specs/HTML/2.8.0\"";
const DATA_PARSOID_CONTENT_TYPE: &str =
    "application/json; charset=utf-8; profile=\"https://www.mediawiki.org/wiki/Specs/data-parsoid/0.0.1\"";
const WIKITEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// One part of a render.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// The Parsoid HTML document.
    Html,
    /// data-parsoid, a JSON object.
    DataParsoid,
    /// Section offsets, a JSON object.
    SectionOffsets,
    /// The revision's wikitext (old-store only: a dump import has nothing else).
    Wikitext,
}

impl Part {
    pub const ALL: [Part; 4] = [Part::Html, Part::DataParsoid, Part::SectionOffsets, Part::Wikitext];

    /// The part a URL segment names.
    pub fn parse(name: &str) -> Option<Part> {
        Part::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Its name in URLs and in bundles.
    pub fn name(self) -> &'static str {
        match self {
            Part::Html => "html",
            Part::DataParsoid => "data-parsoid",
            Part::SectionOffsets => "section-offsets",
            Part::Wikitext => "wikitext",
        }
    }

    /// The content type it is served with, wherever it is served from.
    pub fn content_type(self) -> &'static str {
        match self {
            Part::Html => HTML_CONTENT_TYPE,
            Part::DataParsoid => DATA_PARSOID_CONTENT_TYPE,
            Part::SectionOffsets => JSON_CONTENT_TYPE,
            Part::Wikitext => WIKITEXT_CONTENT_TYPE,
        }
    }

    /// Whether it is JSON (an object in a bundle), rather than text (a string).
    pub fn is_json(self) -> bool {
        matches!(self, Part::DataParsoid | Part::SectionOffsets)
    }
}

/// What a read names: one part, or the bundle of all a render has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    Part(Part),
    Bundle,
}

impl Selection {
    /// The selection a URL segment names, among the parts `served`.
    pub fn parse(name: &str, served: &[Part]) -> Option<Selection> {
        if name == "bundle" {
            return Some(Selection::Bundle);
        }
        Part::parse(name).filter(|p| served.contains(p)).map(Selection::Part)
    }

    pub fn name(self) -> &'static str {
        match self {
            Selection::Part(part) => part.name(),
            Selection::Bundle => "bundle",
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Selection::Part(part) => part.content_type(),
            Selection::Bundle => JSON_CONTENT_TYPE,
        }
    }

    /// `one of html, data-parsoid, …, bundle`, for error messages.
    pub fn choices(served: &[Part]) -> String {
        let names: Vec<&str> = served.iter().map(|p| p.name()).chain(["bundle"]).collect();
        format!("one of {}", names.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_profiles_are_in_the_content_types() {
        for part in Part::ALL {
            assert_eq!(Part::parse(part.name()), Some(part));
        }
        assert!(Part::Html.content_type().contains(HTML_PROFILE));
        assert!(Part::DataParsoid.content_type().contains(DATA_PARSOID_PROFILE));
        assert_eq!(Part::parse("xml"), None);
    }

    #[test]
    fn a_selection_is_limited_to_the_parts_served() {
        let served = [Part::Html, Part::DataParsoid, Part::SectionOffsets];
        assert_eq!(Selection::parse("bundle", &served), Some(Selection::Bundle));
        assert_eq!(Selection::parse("html", &served), Some(Selection::Part(Part::Html)));
        assert_eq!(Selection::parse("wikitext", &served), None);
        assert_eq!(Selection::parse("wikitext", &Part::ALL), Some(Selection::Part(Part::Wikitext)));
        assert_eq!(Selection::choices(&served), "one of html, data-parsoid, section-offsets, bundle");
    }
}
