//! The Enterprise layout of a dump (`revstore dump --format enterprise`):
//! the layout of the Wikimedia Enterprise HTML dumps, which researchers'
//! readers and pipelines already take. Per wiki and namespace one
//! `<dbname>-NS<n>-<date>-ENTERPRISE-HTML.json.tar.gz` (history:
//! `…-ENTERPRISE-HTML-HISTORY.json.tar.gz`), a gzipped tar of NDJSON files,
//! one article object per line with the fields of Enterprise's data
//! dictionary that revstore knows.
//!
//! The tarballs are built from the dump's own NDJSON shards once every shard
//! is complete: the shards keep their checkpoints and `--resume`, and the
//! packaging, which only reads them, is done again whole if it is cut.
//!
//! Where each field comes from (`docs/design/dumps.md` says which may be
//! missing and why):
//! - `identifier` (the page id) and `namespace.identifier`: what old-store
//!   keeps of the page (an import takes `<page><id>` and `<ns>` from the XML
//!   dump); else the `mw:pageId` and `mw:pageNamespace` that Parsoid writes in
//!   the head of every render; else, for the namespace, the title's prefix
//!   among MediaWiki's canonical namespace names (none: 0). A page id that is
//!   nowhere (a render made without one) is left out of the article.
//! - `is_part_of.identifier`, `in_language.identifier`, `url`: the wiki's
//!   database name, language and article URL, from its domain the way
//!   Wikimedia names them (`en.wikipedia.org`: `enwiki`, `en`), or
//!   `--dbname` and `--language`.
//! - `date_modified`: the time of the render (an imported revision's render
//!   time is the revision's timestamp).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The wiki a dump is of, as Enterprise articles name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wiki {
    pub domain: String,
    /// The database name (`enwiki`): the tarballs' prefix and `is_part_of`.
    pub dbname: String,
    /// The content language code (`en`).
    pub language: String,
}

/// Wikimedia's projects whose domains are `<language>.<project>.org`, and
/// the suffix of their database names.
const LANGUAGE_PROJECTS: [(&str, &str); 8] = [
    ("wikipedia", "wiki"),
    ("wiktionary", "wiktionary"),
    ("wikibooks", "wikibooks"),
    ("wikinews", "wikinews"),
    ("wikiquote", "wikiquote"),
    ("wikisource", "wikisource"),
    ("wikiversity", "wikiversity"),
    ("wikivoyage", "wikivoyage"),
];

impl Wiki {
    /// The wiki of `domain`: `<lang>.<project>.org` as Wikimedia names its
    /// databases (`zh-min-nan.wikipedia.org`: `zh_min_nanwiki`, language
    /// `zh-min-nan`; `commons.wikimedia.org`: `commonswiki`;
    /// `www.wikidata.org`: `wikidatawiki`); any other domain: its labels
    /// joined by `_`, language `en`. `dbname` and `language` replace what is derived.
    pub fn of(domain: &str, dbname: Option<&str>, language: Option<&str>) -> Result<Wiki, String> {
        let labels: Vec<&str> = domain.split('.').collect();
        let (derived_db, derived_language) = match labels.as_slice() {
            // www.wikidata.org: wikidatawiki; www.mediawiki.org: mediawikiwiki.
            ["www", project, "org"] => (format!("{}wiki", project.replace('-', "_")), "en".to_owned()),
            [language, project, "org"] => match LANGUAGE_PROJECTS.iter().find(|(p, _)| p == project) {
                Some((_, suffix)) => (format!("{}{suffix}", language.replace('-', "_")), (*language).to_owned()),
                None => (format!("{language}wiki"), "en".to_owned()),
            },
            _ => (labels.join("_").replace('-', "_"), "en".to_owned()),
        };
        let dbname = dbname.map_or(derived_db, str::to_owned);
        // The name is the tarballs' prefix, which readers cut at the first `-`.
        if dbname.is_empty() || dbname.len() > 64 || !dbname.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!("database name {dbname:?} is not 1-64 letters, digits and _ (pass --dbname)"));
        }
        let language = language.map_or(derived_language, str::to_owned);
        if language.is_empty() || language.len() > 32 || !language.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(format!("language {language:?} is not a language code (pass --language)"));
        }
        Ok(Wiki { domain: domain.to_owned(), dbname, language })
    }

    /// The article URL of a title (`Main_Page`).
    fn url(&self, title: &str) -> String {
        let path: String = title
            .bytes()
            .map(|b| match b.is_ascii_alphanumeric() || b"-_.~:/!$()*,;@'".contains(&b) {
                true => (b as char).to_string(),
                false => format!("%{b:02X}"),
            })
            .collect();
        format!("https://{}/wiki/{path}", self.domain)
    }
}

/// A line of the dump's own NDJSON, as the article needs it.
#[derive(Debug, Deserialize)]
struct DumpLine {
    title: String,
    rev: u64,
    tid: String,
    page_id: Option<u64>,
    namespace: Option<i64>,
    html: Option<String>,
    wikitext: Option<String>,
}

#[derive(Serialize)]
struct Identifier<T> {
    identifier: T,
}

#[derive(Serialize)]
struct ArticleBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    html: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    wikitext: Option<&'a str>,
}

#[derive(Serialize)]
struct License {
    name: &'static str,
    identifier: &'static str,
    url: &'static str,
}

/// The license of Wikimedia wikis' text (and so of their renders).
const LICENSE: License = License {
    name: "Creative Commons Attribution-ShareAlike License 4.0",
    identifier: "CC-BY-SA-4.0",
    url: "https://creativecommons.org/licenses/by-sa/4.0/",
};

/// One article, in the fields of Enterprise's data dictionary.
#[derive(Serialize)]
struct Article<'a> {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    identifier: Option<u64>,
    date_modified: String,
    version: Identifier<u64>,
    url: String,
    namespace: Identifier<i64>,
    in_language: Identifier<&'a str>,
    is_part_of: Identifier<&'a str>,
    article_body: ArticleBody<'a>,
    license: [License; 1],
}

/// A tarball written, for the manifest.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Tarball {
    pub file: String,
    pub namespace: i64,
    pub articles: u64,
}

/// MediaWiki's canonical namespace names (and the common aliases), for a
/// title no write said the namespace of.
const CANONICAL_NAMESPACES: [(&str, i64); 19] = [
    ("Media", -2),
    ("Special", -1),
    ("Talk", 1),
    ("User", 2),
    ("User_talk", 3),
    ("Project", 4),
    ("Project_talk", 5),
    ("File", 6),
    ("Image", 6),
    ("File_talk", 7),
    ("Image_talk", 7),
    ("MediaWiki", 8),
    ("MediaWiki_talk", 9),
    ("Template", 10),
    ("Template_talk", 11),
    ("Help", 12),
    ("Help_talk", 13),
    ("Category", 14),
    ("Category_talk", 15),
];

fn namespace_of_title(title: &str) -> i64 {
    let Some((prefix, _)) = title.split_once(':') else { return 0 };
    CANONICAL_NAMESPACES.iter().find(|(name, _)| name.eq_ignore_ascii_case(prefix)).map_or(0, |(_, ns)| *ns)
}

/// The `content` of the `<meta property="…">` in a Parsoid document's head.
fn head_meta<'a>(html: &'a str, property: &str) -> Option<&'a str> {
    // The head is small; a render's body is not searched.
    let head = &html[..html.find("<body").unwrap_or(html.len()).min(html.len())];
    let at = head.find(&format!("property=\"{property}\""))?;
    let start = head[..at].rfind('<')?;
    let end = at + head[at..].find('>')?;
    let tag = &head[start..end];
    let value = tag.split_once("content=\"")?.1;
    value.split_once('"').map(|(v, _)| v)
}

/// `2004-08-13T06:24:53Z`: Enterprise's times, to the second.
fn date_modified(tid: &str) -> Result<String, String> {
    let tid = revstore_keys::Tid::parse(tid).map_err(|e| format!("a line's tid: {e}"))?;
    let shown = revstore_keys::rfc3339(tid.time());
    Ok(format!("{}Z", &shown[..19]))
}

/// One dump line as an article, and its namespace.
fn article(wiki: &Wiki, line: &str) -> Result<(i64, Vec<u8>), String> {
    let line: DumpLine = serde_json::from_str(line).map_err(|e| format!("a shard line: {e}"))?;
    let html = line.html.as_deref();
    let meta = |property| html.and_then(|h| head_meta(h, property)).and_then(|v| v.trim().parse::<i64>().ok());
    let identifier = line.page_id.or_else(|| meta("mw:pageId").and_then(|id| u64::try_from(id).ok()).filter(|&id| id > 0));
    let namespace = line.namespace.or_else(|| meta("mw:pageNamespace")).unwrap_or_else(|| namespace_of_title(&line.title));
    let article = Article {
        name: line.title.replace('_', " "),
        identifier,
        date_modified: date_modified(&line.tid)?,
        version: Identifier { identifier: line.rev },
        url: wiki.url(&line.title),
        namespace: Identifier { identifier: namespace },
        in_language: Identifier { identifier: &wiki.language },
        is_part_of: Identifier { identifier: &wiki.dbname },
        article_body: ArticleBody { html, wikitext: line.wikitext.as_deref() },
        license: [LICENSE],
    };
    let mut bytes = serde_json::to_vec(&article).map_err(|e| e.to_string())?;
    bytes.push(b'\n');
    Ok((namespace, bytes))
}

/// What packaging needs to know of the dump.
pub struct Packaging<'a> {
    pub wiki: &'a Wiki,
    pub out: &'a Path,
    pub date: &'a str,
    /// `current` or `history`.
    pub kind: &'a str,
    /// The dump's complete shards, in slice order.
    pub shards: Vec<PathBuf>,
}

impl Packaging<'_> {
    fn tarball_name(&self, namespace: i64) -> String {
        let suffix = if self.kind == "history" { "-HISTORY" } else { "" };
        format!("{}-NS{namespace}-{}-ENTERPRISE-HTML{suffix}.json.tar.gz", self.wiki.dbname, self.date)
    }

    /// Writes one tarball per namespace from the shards. Each shard's
    /// articles of a namespace are one NDJSON file of its tarball
    /// (`<dbname>_<K>.ndjson`), staged beside the output first (a tar
    /// member's size comes before its bytes) and appended once the shard is
    /// read, so staging holds one shard's articles at most. Tarballs are
    /// written under a temporary name and renamed whole at the end.
    pub fn write(&self) -> Result<Vec<Tarball>, String> {
        let staging = self.out.join(format!(".{}-{}-{}-enterprise", self.wiki.dbname, self.date, self.kind));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging).map_err(|e| format!("{}: {e}", staging.display()))?;
        let written = self.stage_and_pack(&staging);
        let _ = std::fs::remove_dir_all(&staging);
        written
    }

    fn stage_and_pack(&self, staging: &Path) -> Result<Vec<Tarball>, String> {
        let mut tarballs: BTreeMap<i64, Open> = BTreeMap::new();
        for (k, shard) in self.shards.iter().enumerate() {
            let file = std::fs::File::open(shard).map_err(|e| format!("{}: {e}", shard.display()))?;
            let mut lines = BufReader::new(zstd::stream::read::Decoder::new(file).map_err(|e| e.to_string())?);
            let mut staged: BTreeMap<i64, (PathBuf, std::io::BufWriter<std::fs::File>)> = BTreeMap::new();
            let mut line = String::new();
            loop {
                line.clear();
                if lines.read_line(&mut line).map_err(|e| format!("{}: {e}", shard.display()))? == 0 {
                    break;
                }
                let (namespace, bytes) = article(self.wiki, &line)?;
                let member = match staged.entry(namespace) {
                    std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                    std::collections::btree_map::Entry::Vacant(v) => {
                        let path = staging.join(format!("{namespace}.ndjson"));
                        let file = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                        v.insert((path, std::io::BufWriter::new(file)))
                    }
                };
                member.1.write_all(&bytes).map_err(|e| e.to_string())?;
                if let Some(open) = tarballs.get_mut(&namespace) {
                    open.articles += 1;
                } else {
                    tarballs.insert(namespace, Open::create(self.out, &self.tarball_name(namespace), 1)?);
                }
            }
            for (namespace, (path, member)) in staged {
                member.into_inner().map_err(|e| e.into_error().to_string())?;
                let open = tarballs.get_mut(&namespace).ok_or("a staged namespace without its tarball")?;
                open.append(&format!("{}_{k}.ndjson", self.wiki.dbname), &path)?;
                std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            }
        }
        tarballs.into_iter().map(|(namespace, open)| open.finish(self.out, namespace)).collect()
    }
}

/// A tarball being written: a gzipped tar under a temporary name.
struct Open {
    name: String,
    temporary: PathBuf,
    articles: u64,
    tar: tar::Builder<flate2::write::GzEncoder<std::io::BufWriter<std::fs::File>>>,
}

impl Open {
    fn create(out: &Path, name: &str, articles: u64) -> Result<Open, String> {
        let temporary = out.join(format!("{name}.tmp"));
        let file = std::fs::File::create(&temporary).map_err(|e| format!("{}: {e}", temporary.display()))?;
        let gzip = flate2::write::GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::default());
        Ok(Open { name: name.to_owned(), temporary, articles, tar: tar::Builder::new(gzip) })
    }

    /// Appends the staged file at `path` as the member `member`.
    fn append(&mut self, member: &str, path: &Path) -> Result<(), String> {
        let failed = |e: std::io::Error| format!("{}: {e}", self.temporary.display());
        let mut file = std::fs::File::open(path).map_err(failed)?;
        let mut header = tar::Header::new_gnu();
        header.set_size(file.metadata().map_err(failed)?.len());
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_cksum();
        self.tar.append_data(&mut header, member, &mut file).map_err(failed)
    }

    /// Ends the tar and the gzip stream, syncs, and renames the file to its name.
    fn finish(self, out: &Path, namespace: i64) -> Result<Tarball, String> {
        let failed = |e: std::io::Error| format!("{}: {e}", self.temporary.display());
        let file = self.tar.into_inner().map_err(failed)?.finish().map_err(failed)?.into_inner().map_err(|e| failed(e.into_error()))?;
        file.sync_data().map_err(failed)?;
        drop(file);
        let path = out.join(&self.name);
        std::fs::rename(&self.temporary, &path).map_err(failed)?;
        Ok(Tarball { file: self.name, namespace, articles: self.articles })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wikis_are_named_as_wikimedia_names_them() {
        let wiki = |domain| Wiki::of(domain, None, None).map(|w| (w.dbname, w.language));
        assert_eq!(wiki("en.wikipedia.org"), Ok(("enwiki".into(), "en".into())));
        assert_eq!(wiki("aa.wikipedia.org"), Ok(("aawiki".into(), "aa".into())));
        assert_eq!(wiki("zh-min-nan.wikipedia.org"), Ok(("zh_min_nanwiki".into(), "zh-min-nan".into())));
        assert_eq!(wiki("fr.wiktionary.org"), Ok(("frwiktionary".into(), "fr".into())));
        assert_eq!(wiki("commons.wikimedia.org"), Ok(("commonswiki".into(), "en".into())));
        assert_eq!(wiki("www.wikidata.org"), Ok(("wikidatawiki".into(), "en".into())));
        assert_eq!(wiki("docs.example-wiki.net"), Ok(("docs_example_wiki_net".into(), "en".into())));
        assert_eq!(
            Wiki::of("en.wikipedia.org", Some("mywiki"), Some("de")).map(|w| (w.dbname, w.language)),
            Ok(("mywiki".into(), "de".into()))
        );
        assert!(Wiki::of("en.wikipedia.org", Some("my-wiki"), None).is_err(), "a - in the name would cut the prefix readers take");
        assert!(Wiki::of("en.wikipedia.org", None, Some("e n")).is_err());
    }

    #[test]
    fn an_article_takes_what_the_line_and_the_render_say_of_the_page() {
        let wiki = Wiki::of("en.wikipedia.org", None, None).unwrap();
        let tid = revstore_keys::Tid::min_at(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_092_378_293)).to_string();
        let head = r#"<!DOCTYPE html><html><head><meta property="mw:pageNamespace" content="4"/><meta property="mw:pageId" content="77"/></head><body><p>x</p></body></html>"#;
        let parse = |line: serde_json::Value| {
            let (ns, bytes) = article(&wiki, &line.to_string()).unwrap();
            (ns, serde_json::from_slice::<serde_json::Value>(&bytes).unwrap())
        };
        // What old-store kept wins over the render's head.
        let (ns, a) = parse(serde_json::json!({"title": "Main_Page", "rev": 10, "tid": tid, "page_id": 1, "namespace": 0, "html": head}));
        assert_eq!(ns, 0);
        assert_eq!(a["name"], "Main Page");
        assert_eq!(a["identifier"], 1);
        assert_eq!(a["date_modified"], "2004-08-13T06:24:53Z");
        assert_eq!(a["version"]["identifier"], 10);
        assert_eq!(a["url"], "https://en.wikipedia.org/wiki/Main_Page");
        assert_eq!((a["in_language"]["identifier"].as_str(), a["is_part_of"]["identifier"].as_str()), (Some("en"), Some("enwiki")));
        assert_eq!(a["article_body"]["html"], head);
        assert!(a["article_body"].get("wikitext").is_none());
        // A render alone: Parsoid's head.
        let (ns, a) = parse(serde_json::json!({"title": "Wikipedia:About", "rev": 3, "tid": tid, "html": head}));
        assert_eq!((ns, a["identifier"].as_u64()), (4, Some(77)));
        // Neither: the title's canonical prefix, and no page id (Parsoid's -1 for a page it did not know is none).
        let unknown = head.replace("content=\"77\"", "content=\"-1\"").replace("<meta property=\"mw:pageNamespace\" content=\"4\"/>", "");
        let (ns, a) = parse(serde_json::json!({"title": "Template_talk:Cite_web?", "rev": 3, "tid": tid, "html": unknown}));
        assert_eq!((ns, a.get("identifier")), (11, None));
        assert_eq!(a["url"], "https://en.wikipedia.org/wiki/Template_talk:Cite_web%3F");
        let (ns, _) = parse(serde_json::json!({"title": "Not_a_namespace:X", "rev": 1, "tid": tid, "wikitext": "x"}));
        assert_eq!(ns, 0);
        assert!(article(&wiki, "{\"title\": 1}").is_err());
    }
}
