//! The pages a revision's wikitext transcludes: `{{Name|…}}` is a dependency
//! on `Template:Name`, `{{:Page}}` on the article `Page`, `{{Ns:Page}}` on
//! that page, `{{#invoke:Name|…}}` on `Module:Name`.
//!
//! This reads the wikitext as written, without expanding it, so it is an
//! approximation of what MediaWiki's parser records in `templatelinks`:
//! - templates a template transcludes in turn are not followed (the graph
//!   holds them as that template's own dependencies, once it is imported);
//! - a name built at render time (`{{ {{{1}}} }}`, `{{#if:…|A|B}}` choosing a
//!   name, a name with a nested template) is skipped;
//! - parser functions and magic words (`{{#if:…}}`, `{{PAGENAME}}`,
//!   `{{lc:…}}`, `{{DISPLAYTITLE:…}}`) are not pages and are skipped, from a
//!   fixed list of the common ones, so a rare one may come out as a template;
//! - namespaces are the canonical English ones (a localized prefix such as
//!   `Vorlage:` is read as part of a template's name);
//! - text inside `<!-- -->`, `<nowiki>`, `<pre>`, `<syntaxhighlight>`,
//!   `<source>` and `<math>` is ignored; `<noinclude>` and `<includeonly>`
//!   parts are both read (the page's own render shows the former).

use std::collections::BTreeSet;

/// Namespaces a transclusion may name, canonical English spelling.
const NAMESPACES: &[&str] = &[
    "Talk",
    "User",
    "User talk",
    "Wikipedia",
    "Wikipedia talk",
    "Project",
    "Project talk",
    "File",
    "File talk",
    "Image",
    "MediaWiki",
    "MediaWiki talk",
    "Template",
    "Template talk",
    "Help",
    "Help talk",
    "Category",
    "Category talk",
    "Portal",
    "Portal talk",
    "Draft",
    "Draft talk",
    "Module",
    "Module talk",
];

/// Parser functions and magic words written `{{name:argument}}`.
const FUNCTIONS_WITH_ARGUMENT: &[&str] = &[
    "lc",
    "uc",
    "lcfirst",
    "ucfirst",
    "urlencode",
    "anchorencode",
    "fullurl",
    "fullurle",
    "localurl",
    "localurle",
    "canonicalurl",
    "canonicalurle",
    "filepath",
    "ns",
    "nse",
    "formatnum",
    "padleft",
    "padright",
    "plural",
    "grammar",
    "gender",
    "int",
    "displaytitle",
    "defaultsort",
    "defaultsortkey",
    "defaultcategorysort",
    "tag",
    "language",
    "special",
    "speciale",
    "pagesincategory",
    "pagesize",
    "protectionlevel",
    "formatdate",
    "dateformat",
    "bidi",
    "pagename",
    "pagenamee",
    "fullpagename",
    "fullpagenamee",
    "basepagename",
    "subpagename",
    "namespace",
    "talkpagename",
    "numberingroup",
    "revisionid",
    "revisionuser",
    "revisiontimestamp",
];

/// Magic words written alone, `{{NAME}}` (variables).
const VARIABLES: &[&str] = &[
    "!",
    "=",
    "PAGENAME",
    "PAGENAMEE",
    "FULLPAGENAME",
    "FULLPAGENAMEE",
    "BASEPAGENAME",
    "ROOTPAGENAME",
    "SUBPAGENAME",
    "ARTICLEPAGENAME",
    "TALKPAGENAME",
    "SUBJECTPAGENAME",
    "NAMESPACE",
    "NAMESPACEE",
    "NAMESPACENUMBER",
    "TALKSPACE",
    "SUBJECTSPACE",
    "ARTICLESPACE",
    "SITENAME",
    "SERVER",
    "SERVERNAME",
    "SCRIPTPATH",
    "STYLEPATH",
    "CONTENTLANGUAGE",
    "CONTENTLANG",
    "DIRECTIONMARK",
    "CURRENTYEAR",
    "CURRENTMONTH",
    "CURRENTMONTH1",
    "CURRENTMONTH2",
    "CURRENTMONTHNAME",
    "CURRENTMONTHNAMEGEN",
    "CURRENTMONTHABBREV",
    "CURRENTDAY",
    "CURRENTDAY2",
    "CURRENTDAYNAME",
    "CURRENTDOW",
    "CURRENTTIME",
    "CURRENTHOUR",
    "CURRENTWEEK",
    "CURRENTTIMESTAMP",
    "LOCALYEAR",
    "LOCALMONTH",
    "LOCALMONTHNAME",
    "LOCALDAY",
    "LOCALDAY2",
    "LOCALDAYNAME",
    "LOCALTIME",
    "LOCALHOUR",
    "LOCALWEEK",
    "LOCALTIMESTAMP",
    "NUMBEROFARTICLES",
    "NUMBEROFPAGES",
    "NUMBEROFFILES",
    "NUMBEROFEDITS",
    "NUMBEROFUSERS",
    "NUMBEROFACTIVEUSERS",
    "NUMBEROFADMINS",
    "REVISIONID",
    "REVISIONDAY",
    "REVISIONDAY2",
    "REVISIONMONTH",
    "REVISIONYEAR",
    "REVISIONTIMESTAMP",
    "REVISIONUSER",
    "REVISIONSIZE",
    "PAGEID",
    "PAGESIZE",
    "NOEXTERNALLANGLINKS",
    "CASCADINGSOURCES",
];

/// Elements whose content the parser does not read for transclusions.
const OPAQUE_ELEMENTS: &[&str] = &["nowiki", "pre", "syntaxhighlight", "source", "math"];

/// The titles (API form: underscores, first letter upper case) the wikitext
/// transcludes, each once, sorted.
pub fn transclusions(wikitext: &str) -> Vec<String> {
    let text = without_opaque_parts(wikitext);
    let bytes = text.as_bytes();
    let mut found = BTreeSet::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'{' {
            i += 1;
            continue;
        }
        let run = bytes[i..].iter().take_while(|&&b| b == b'{').count();
        i += run;
        // `{{{x}}}` is a parameter; a run of 5 is a template named by a
        // parameter, of 4 a template whose name starts with a template:
        // names made at render time either way. Only a run of exactly two
        // opens a template with a written name (nested ones are found as the
        // scan goes on).
        if run != 2 {
            continue;
        }
        let rest = &text[i..];
        // The name runs to the first `|` or `}` (a newline may come before
        // them, as in `{{Infobox\n| name = …}}`). One running into `{` is
        // built at render time; one never closed is text, not a call.
        let Some(end) = rest.find(['|', '}', '{']) else { break };
        let name = rest[..end].trim();
        if !rest[end..].starts_with('{')
            && !name.contains('\n')
            && let Some(title) = title_of(name)
        {
            found.insert(title);
        }
    }
    found.into_iter().collect()
}

/// The page a template call's name refers to, if it refers to one.
fn title_of(name: &str) -> Option<String> {
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    if let Some(invoked) = strip_prefix_ignore_case(name, "#invoke:") {
        return normalized("Module", invoked);
    }
    if name.starts_with('#') || VARIABLES.contains(&name) {
        return None;
    }
    let mut name = name;
    // `subst:` is replaced when the page is saved: what remains in stored
    // wikitext is not a transclusion. `safesubst:`, `msgnl:`, `msg:`, `raw:`
    // transclude as usual.
    if strip_prefix_ignore_case(name, "subst:").is_some() {
        return None;
    }
    for modifier in ["safesubst:", "msgnl:", "msg:", "raw:"] {
        if let Some(rest) = strip_prefix_ignore_case(name, modifier) {
            name = rest.trim_start();
        }
    }
    if let Some(article) = name.strip_prefix(':') {
        return normalized("", article);
    }
    if let Some((prefix, rest)) = name.split_once(':') {
        let prefix = prefix.trim();
        if FUNCTIONS_WITH_ARGUMENT.iter().any(|f| f.eq_ignore_ascii_case(prefix)) {
            return None;
        }
        let spaced = prefix.replace('_', " ");
        if let Some(namespace) = NAMESPACES.iter().find(|ns| ns.eq_ignore_ascii_case(&spaced)) {
            return normalized(namespace, rest);
        }
    }
    normalized("Template", name)
}

/// `Namespace:Title` in the API's form, or `None` when the title cannot be one.
fn normalized(namespace: &str, title: &str) -> Option<String> {
    let words: Vec<&str> = title.split(|c: char| c == '_' || c.is_whitespace()).filter(|w| !w.is_empty()).collect();
    let title = words.join("_");
    // Characters MediaWiki never allows in a title; a name with them is not a page.
    if title.is_empty() || title.contains(['#', '<', '>', '[', ']', '{', '}', '|']) || title.chars().any(char::is_control) {
        return None;
    }
    let mut chars = title.chars();
    let first: String = chars.next().map(|c| c.to_uppercase().collect()).unwrap_or_default();
    let title = format!("{first}{}", chars.as_str());
    Some(if namespace.is_empty() { title } else { format!("{}:{title}", namespace.replace(' ', "_")) })
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then(|| &s[prefix.len()..])
}

/// The next occurrence of one needle at or after a position, for a scan that
/// only moves forward: a found position is kept until the scan passes it, and
/// "none after here" stays true further on. So a text of a million unclosed
/// `<pre>` costs one pass per needle, not one per `<pre>`.
struct Next<'a> {
    haystack: &'a str,
    needle: String,
    /// The last search: where it started and what it found.
    last: Option<(usize, Option<usize>)>,
}

impl<'a> Next<'a> {
    fn new(haystack: &'a str, needle: impl Into<String>) -> Self {
        Next { haystack, needle: needle.into(), last: None }
    }

    fn at_or_after(&mut self, from: usize) -> Option<usize> {
        match self.last {
            Some((searched_from, Some(found))) if searched_from <= from && found >= from => return Some(found),
            Some((searched_from, None)) if searched_from <= from => return None,
            _ => {}
        }
        let found = self.haystack.get(from..).and_then(|rest| rest.find(self.needle.as_str())).map(|at| from + at);
        self.last = Some((from, found));
        found
    }
}

/// The wikitext with comments and the content of opaque elements removed,
/// in time linear in its length whatever it holds.
fn without_opaque_parts(wikitext: &str) -> String {
    let mut out = String::with_capacity(wikitext.len());
    let lower = wikitext.to_ascii_lowercase();
    let mut tag_end = Next::new(&lower, ">");
    let mut comment_end = Next::new(&lower, "-->");
    let mut closes: Vec<Next<'_>> = OPAQUE_ELEMENTS.iter().map(|name| Next::new(&lower, format!("</{name}"))).collect();
    let mut i = 0;
    while i < wikitext.len() {
        let Some(offset) = lower[i..].find('<') else {
            out.push_str(&wikitext[i..]);
            break;
        };
        let at = i + offset;
        out.push_str(&wikitext[i..at]);
        let here = &lower[at..];
        if here.starts_with("<!--") {
            // An unclosed comment runs to the end, as MediaWiki reads it.
            i = comment_end.at_or_after(at + 4).map_or(wikitext.len(), |end| end + 3);
            continue;
        }
        let opaque = OPAQUE_ELEMENTS.iter().position(|name| {
            here[1..].starts_with(*name) && here[1 + name.len()..].starts_with(|c: char| c == '>' || c == '/' || c.is_whitespace())
        });
        match opaque {
            Some(element) => {
                let open_end = tag_end.at_or_after(at).map_or(wikitext.len(), |e| e + 1);
                if lower[at..open_end].ends_with("/>") {
                    i = open_end;
                } else {
                    i = match closes[element].at_or_after(open_end) {
                        Some(close) => tag_end.at_or_after(close).map_or(wikitext.len(), |e| e + 1),
                        // Unclosed: MediaWiki shows it as text; read it as text.
                        None => open_end,
                    };
                }
            }
            None => {
                out.push('<');
                i = at + 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::transclusions;

    #[test]
    fn templates_modules_and_articles_are_found_once_each() {
        let text = "{{Infobox person|name={{PAGENAME}}|born={{birth date|1900|1|1}}}}\n\
                    {{infobox_person}} {{ Template:Reflist }} {{:Main Page}} {{Wikipedia:Citation needed}}\n\
                    {{#invoke:String|len|x}} {{safesubst:Cite web|url=x}} {{msgnl:Note}}";
        assert_eq!(
            transclusions(text),
            [
                "Main_Page",
                "Module:String",
                "Template:Birth_date",
                "Template:Cite_web",
                "Template:Infobox_person",
                "Template:Note",
                "Template:Reflist",
                "Wikipedia:Citation_needed"
            ]
        );
    }

    #[test]
    fn parameters_parser_functions_and_magic_words_are_not_pages() {
        let text = "{{{1}}} {{{name|default}}} {{#if:{{{1|}}}|yes|no}} {{CURRENTYEAR}} {{lc:ABC}} \
                    {{DISPLAYTITLE:x}} {{DEFAULTSORT:Y}} {{!}} {{subst:Welcome}} {{ {{{1}}} }} {{{{{1}}}}}";
        assert_eq!(transclusions(text), Vec::<String>::new());
    }

    #[test]
    fn templates_inside_parser_functions_are_still_found() {
        assert_eq!(transclusions("{{#if:{{{1|}}}|{{Yes}}|{{No|x}}}}"), ["Template:No", "Template:Yes"]);
    }

    #[test]
    fn comments_nowiki_and_pre_hide_templates() {
        let text = "<!-- {{Hidden}} --> <nowiki>{{Shown as text}}</nowiki> <PRE>{{Pre}}</PRE> <nowiki/>{{Real}} \
                    <syntaxhighlight lang=\"text\">{{Code}}</syntaxhighlight><noinclude>{{Doc}}</noinclude>";
        assert_eq!(transclusions(text), ["Template:Doc", "Template:Real"]);
        assert_eq!(transclusions("{{Before}}<!-- unclosed {{After}}"), ["Template:Before"]);
    }

    #[test]
    fn malformed_wikitext_gives_what_it_can_without_panicking() {
        for text in ["{{", "{{|x}}", "{{}}", "}}{{", "{{Open", "{{a\nb}}", "<nowiki>{{x}}", "{{<}}", "{{Ünïcode}}", "<", "<!--"] {
            let _ = transclusions(text);
        }
        assert_eq!(transclusions("{{ünïcode name}}"), ["Template:Ünïcode_name"]);
        assert_eq!(transclusions("{{Open"), Vec::<String>::new(), "a call never closed is text");
        assert_eq!(transclusions("{{Infobox\n| name = x\n}}{{Two\nlines}}"), ["Template:Infobox"]);
    }

    /// The probe's hostile page: `<pre>` over and over, never closed (once a
    /// scan to the end per `<pre>`: 5 s at 800 KB). Each reads as text, so the
    /// templates between them count; closed ones still hide theirs.
    #[test]
    fn unclosed_opaque_elements_read_as_text_and_closed_ones_hide() {
        let hostile = "<pre>{{X}}".repeat(20_000) + "<pre";
        assert_eq!(transclusions(&hostile), ["Template:X"]);
        // An opening tag runs to the next `>`, as MediaWiki reads it: the
        // `<pre {{Hidden_too}}` one to the next `<pre>`'s.
        let mixed = "<pre>{{Hidden}}</pre>{{Shown}}<pre {{Hidden_too}}".repeat(1_000) + "<nowiki>{{Kept}}";
        assert_eq!(transclusions(&mixed), ["Template:Kept", "Template:Shown"]);
        let comments = "<!-- {{C}} --> {{D}} <!--".repeat(1_000);
        assert_eq!(transclusions(&comments), ["Template:D"]);
    }
}
