//! MediaWiki page titles, normalised the way MediaWiki stores them (the "DB key").
//!
//! Normalisation, in order: the text is put in Unicode NFC (as MediaWiki
//! does first: `e` + combining acute and `é` are one page), Unicode spaces and underscores become one space,
//! directional marks are dropped (and the text composed again where that
//! brought combining characters together), runs of spaces fold into one, surrounding
//! space is trimmed, the first letter is upper-cased where the site says so,
//! and spaces become underscores. `Main page`, `main_page` and ` Main__page `
//! all become `Main_page` on a first-letter-upper site.
//!
//! Validity follows MediaWiki's title codec, so that revstore never stores a
//! page MediaWiki could not have: no forbidden characters, no percent-escape
//! or HTML-entity look-alikes, no leading colon, no `~~~` (signature magic),
//! no relative path (`.`, `..`, `./x`, `x/../y`, `x/.`), at most 255 bytes.
//! The relative-path rule also matters to revstore itself: a title is a URL
//! path segment between services, and HTTP clients resolve dot segments away.
//! Namespace rules (a namespace name alone, talk pages of special namespaces)
//! need the wiki's namespace list and are not checked here.

use std::borrow::Cow;
use std::fmt;

use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfc_quick};

use crate::KeyError;
use crate::domain::truncate_for_message;

/// How a site treats the first letter of a title (MediaWiki's `$wgCapitalLinks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FirstLetterCase {
    /// `foo` and `Foo` are the same page (Wikipedia and most wikis).
    #[default]
    Upper,
    /// `foo` and `Foo` are different pages (Wiktionary).
    Sensitive,
}

/// Per-site title rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TitleRules {
    pub first_letter: FirstLetterCase,
}

/// A normalised page title in DB-key form (underscores, not spaces).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct Title(String);

/// MediaWiki's limit on a title's length, in bytes of UTF-8.
pub const MAX_TITLE_BYTES: usize = 255;

impl Title {
    /// Normalises `input` under `rules`, or says why it is not a valid title.
    pub fn parse(input: &str, rules: TitleRules) -> Result<Self, KeyError> {
        let fail = |reason: String| KeyError::Title { input: truncate_for_message(input), reason };
        // Most titles are NFC already: the quick check answers without allocating.
        let composed: Cow<'_, str> = match is_nfc_quick(input.chars()) {
            IsNormalized::Yes => Cow::Borrowed(input),
            IsNormalized::No | IsNormalized::Maybe => Cow::Owned(input.nfc().collect()),
        };
        let mut folded = String::with_capacity(composed.len());
        let mut pending_space = false;
        for c in composed.chars() {
            if is_title_space(c) {
                pending_space = true;
                continue;
            }
            if is_directional_mark(c) {
                continue;
            }
            if let Some(what) = forbidden(c) {
                return Err(fail(format!("it contains {what}")));
            }
            if pending_space && !folded.is_empty() {
                folded.push(' ');
            }
            pending_space = false;
            folded.push(c);
        }
        if folded.is_empty() {
            return Err(fail("it is empty".to_owned()));
        }
        // A dropped mark can bring combining characters together that NFC
        // orders (or composes) differently: compose again, or the title
        // would normalise differently the second time (the fuzzer found it).
        if is_nfc_quick(folded.chars()) != IsNormalized::Yes {
            folded = folded.nfc().collect();
        }
        let cased = match rules.first_letter {
            FirstLetterCase::Sensitive => folded,
            FirstLetterCase::Upper => upper_first(&folded),
        };
        let key = cased.replace(' ', "_");
        if key.len() > MAX_TITLE_BYTES {
            return Err(fail(format!("it is {} bytes long; the limit is {MAX_TITLE_BYTES}", key.len())));
        }
        if let Some(reason) = mediawiki_refuses(&key) {
            return Err(fail(reason.to_owned()));
        }
        Ok(Title(key))
    }

    /// The DB-key form: `Main_Page`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The display form: `Main Page`.
    pub fn display_text(&self) -> String {
        self.0.replace('_', " ")
    }
}

impl fmt::Display for Title {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The first letter upper-cased, composed again: some capitals have no
/// precomposed form (U+1FD3 becomes Ι, U+0308, U+0301), and a title left
/// decomposed would normalise differently the second time (the fuzzer found it).
fn upper_first(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) if first.is_ascii() => first.to_ascii_uppercase().to_string() + chars.as_str(),
        Some(first) => first.to_uppercase().chain(chars).nfc().collect(),
        None => String::new(),
    }
}

/// Space-like characters that MediaWiki folds into one underscore.
fn is_title_space(c: char) -> bool {
    matches!(
        c,
        ' ' | '_' | '\u{00A0}' | '\u{1680}' | '\u{2000}'..='\u{200A}' | '\u{2028}' | '\u{2029}' | '\u{202F}' | '\u{205F}' | '\u{3000}'
    )
}

/// Left-to-right and right-to-left marks and embeddings, which MediaWiki strips.
fn is_directional_mark(c: char) -> bool {
    matches!(c, '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}')
}

/// The rules MediaWiki applies to a whole DB key, beyond single characters.
fn mediawiki_refuses(key: &str) -> Option<&'static str> {
    if key.starts_with(':') {
        return Some("it starts with ':' (send the title without the main-namespace colon)");
    }
    if key == "."
        || key == ".."
        || key.starts_with("./")
        || key.starts_with("../")
        || key.contains("/./")
        || key.contains("/../")
        || key.ends_with("/.")
        || key.ends_with("/..")
    {
        return Some("it is a relative path ('.' or '..' as a path component)");
    }
    if key.contains("~~~") {
        return Some("it contains '~~~' (signature syntax)");
    }
    if has_percent_escape(key) {
        return Some("it contains a percent-escape such as '%41' (decode it before sending)");
    }
    if has_html_entity(key) {
        return Some("it contains an HTML entity such as '&amp;' (decode it before sending)");
    }
    None
}

/// `%` followed by two hex digits.
fn has_percent_escape(key: &str) -> bool {
    key.as_bytes().windows(3).any(|w| w[0] == b'%' && w[1].is_ascii_hexdigit() && w[2].is_ascii_hexdigit())
}

/// `&name;`: `&`, then letters, digits or non-ASCII, then `;`. (Numeric
/// entities, `&#123;`, are already refused for their `#`.)
fn has_html_entity(key: &str) -> bool {
    key.match_indices('&').any(|(at, _)| {
        let name = &key[at + 1..];
        let len = name.find(|c: char| c.is_ascii() && !c.is_ascii_alphanumeric()).unwrap_or(name.len());
        len > 0 && name[len..].starts_with(';')
    })
}

/// Characters that can never appear in a title, with their name for the error message.
fn forbidden(c: char) -> Option<&'static str> {
    Some(match c {
        '#' => "'#' (a fragment marker)",
        '<' | '>' => "'<' or '>'",
        '[' | ']' => "'[' or ']'",
        '|' => "'|'",
        '{' | '}' => "'{' or '}'",
        '\u{FFFD}' => "U+FFFD (an undecodable character)",
        c if c.is_control() => "a control character",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const UPPER: TitleRules = TitleRules { first_letter: FirstLetterCase::Upper };
    const SENSITIVE: TitleRules = TitleRules { first_letter: FirstLetterCase::Sensitive };

    fn norm(s: &str) -> String {
        Title::parse(s, UPPER).unwrap().as_str().to_owned()
    }

    #[test]
    fn decomposed_and_composed_forms_are_one_title() {
        // "Café" with a combining acute accent (NFD) and with "é" (NFC).
        let nfd = "Cafe\u{301}_cre\u{300}me";
        assert_eq!(norm(nfd), "Caf\u{e9}_cr\u{e8}me");
        assert_eq!(norm(nfd), norm("Caf\u{e9} cr\u{e8}me"));
        // The first letter too: a decomposed lower-case first letter is upper-cased whole.
        assert_eq!(norm("e\u{301}cole"), "\u{c9}cole");
        // Hangul, composed by NFC from its jamo.
        assert_eq!(norm("\u{1112}\u{1161}\u{11ab}"), "\u{d55c}");
    }

    #[test]
    fn a_dropped_directional_mark_leaves_the_title_composed() {
        // The fuzzer's input: a pop-directional mark between Hebrew points
        // (classes 10 and 220); dropped, the points meet out of canonical order.
        let found = "!\u{451}\u{5b0}\u{5a2}\u{202c}\u{5b0} ";
        let once = Title::parse(found, UPPER).unwrap();
        assert_eq!(Title::parse(once.as_str(), UPPER).unwrap(), once);
        // A mark between a letter and its accent: one title with "é".
        assert_eq!(norm("Cafe\u{200e}\u{301}"), "Caf\u{e9}");
    }

    #[test]
    fn unifies_spaces_and_underscores() {
        assert_eq!(norm("Main Page"), "Main_Page");
        assert_eq!(norm("Main_Page"), "Main_Page");
        assert_eq!(norm("  Main __ Page  "), "Main_Page");
        assert_eq!(norm("Main\u{00A0}Page"), "Main_Page");
        assert_eq!(norm("\u{200E}Main Page\u{200F}"), "Main_Page");
        assert_eq!(Title::parse("Main Page", UPPER).unwrap().display_text(), "Main Page");
    }

    #[test]
    fn a_capital_without_a_precomposed_form_normalises_once() {
        let once = Title::parse("\u{1FD3}", TitleRules::default()).expect("title");
        let twice = Title::parse(once.as_str(), TitleRules::default()).expect("title");
        assert_eq!(once, twice);
    }

    #[test]
    fn first_letter_case_follows_the_site() {
        assert_eq!(norm("anarchism"), "Anarchism");
        assert_eq!(norm("éclair"), "Éclair");
        assert_eq!(norm("iPhone"), "IPhone");
        assert_eq!(Title::parse("iPhone", SENSITIVE).unwrap().as_str(), "iPhone");
        // Only the first letter changes.
        assert_eq!(norm("aBC def"), "ABC_def");
    }

    #[test]
    fn keeps_slashes_colons_and_unicode() {
        assert_eq!(norm("User:Foo/Sandbox"), "User:Foo/Sandbox");
        assert_eq!(norm("東京"), "東京");
        assert_eq!(norm("css/properties/font-size"), "Css/properties/font-size");
    }

    #[test]
    fn rejects_forbidden_characters_with_their_name() {
        for (bad, named) in [
            ("Foo#bar", "'#'"),
            ("a<b", "'<'"),
            ("a>b", "'<' or '>'"),
            ("[[Link]]", "'['"),
            ("a|b", "'|'"),
            ("{{Template}}", "'{'"),
            ("a\u{0007}b", "control"),
            ("a\nb", "control"),
            ("a\u{7f}b", "control"),
            ("a\u{FFFD}b", "U+FFFD"),
        ] {
            let err = Title::parse(bad, UPPER).unwrap_err().to_string();
            assert!(err.contains(named), "{bad:?}: {err}");
        }
    }

    #[test]
    fn rejects_empty_and_overlong_titles() {
        for empty in ["", " ", "___", "\u{200E}", " _ \u{3000}"] {
            assert!(Title::parse(empty, UPPER).unwrap_err().to_string().contains("empty"));
        }
        assert!(Title::parse(&"a".repeat(255), UPPER).is_ok());
        let err = Title::parse(&"a".repeat(256), UPPER).unwrap_err().to_string();
        assert!(err.contains("256 bytes"), "{err}");
        // 85 three-byte characters are 255 bytes; 86 are too many.
        assert!(Title::parse(&"東".repeat(85), UPPER).is_ok());
        assert!(Title::parse(&"東".repeat(86), UPPER).is_err());
    }

    #[test]
    fn rejects_what_mediawiki_rejects() {
        for (bad, named) in [
            (".", "relative path"),
            ("..", "relative path"),
            ("./Foo", "relative path"),
            ("../Foo", "relative path"),
            ("Foo/./Bar", "relative path"),
            ("Foo/../Bar", "relative path"),
            ("Foo/.", "relative path"),
            ("Foo/..", "relative path"),
            (" .. ", "relative path"),
            (":Foo", "':'"),
            ("Foo~~~", "'~~~'"),
            ("A%41B", "percent-escape"),
            ("A%2e", "percent-escape"),
            ("Tom &amp; Jerry", "HTML entity"),
            ("&#123;", "'#'"),
            ("&é;", "HTML entity"),
        ] {
            let err = Title::parse(bad, UPPER).map(|t| t.to_string()).unwrap_err().to_string();
            assert!(err.contains(named), "{bad:?}: {err}");
        }
        // What MediaWiki allows stays allowed.
        for good in ["...", ".Foo", "Foo.", "Foo/.bar", "Foo/..bar", "A.B/C", "Foo:Bar", "~~", "100%", "%zz", "Tom & Jerry", "&;", "A & B;"]
        {
            assert!(Title::parse(good, UPPER).is_ok(), "{good:?} must be accepted");
        }
    }

    proptest! {
        #[test]
        fn normalisation_is_idempotent(input in "\\PC{0,60}", sensitive in any::<bool>()) {
            let rules = if sensitive { SENSITIVE } else { UPPER };
            if let Ok(once) = Title::parse(&input, rules) {
                let twice = Title::parse(once.as_str(), rules).expect("a normalised title is valid");
                prop_assert_eq!(once.as_str(), twice.as_str());
                let from_display = Title::parse(&once.display_text(), rules).expect("display form is valid");
                prop_assert_eq!(once.as_str(), from_display.as_str());
            }
        }

        #[test]
        fn normalised_titles_have_no_spaces_at_the_ends(input in "[ _a-zA-Z\u{00A0}]{0,30}") {
            if let Ok(t) = Title::parse(&input, UPPER) {
                prop_assert!(!t.as_str().starts_with('_') && !t.as_str().ends_with('_'));
                prop_assert!(!t.as_str().contains("__") && !t.as_str().contains(' '));
            }
        }
    }
}
