//! A streaming reader of MediaWiki XML dumps (export format 0.10/0.11),
//! plain or packed in 7z, bzip2 or gzip.

use std::cell::RefCell;
use std::io::{BufReader, Read};
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use quick_xml::events::Event;
use revstore_api::PageIdentity;

/// One revision of the dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    /// The page title as the dump gives it (namespace prefix included, spaces).
    pub title: String,
    pub rev_id: u64,
    pub timestamp: SystemTime,
    /// The page's id and namespace number (`<page><id>`, `<ns>`), where the dump gives them.
    pub page: PageIdentity,
    /// `None` when the dump hides the text (deleted or suppressed revisions).
    pub text: Option<String>,
}

/// A revision the dump holds but the import cannot take, and why: said once
/// and counted, and the import goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The page's title, cut to [`SHOWN_TITLE_CHARS`] for messages.
    pub title: String,
    pub rev: String,
    pub reason: String,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "skipped revision {} of {}: {}", shown(&self.rev), self.title, self.reason)
    }
}

/// What the reader hands on for each `<revision>`.
pub type Item = Result<Revision, Skipped>;

/// The most characters of a dump's title (or any text of it) a message repeats.
pub const SHOWN_TITLE_CHARS: usize = 120;

/// `text` for a message: at most [`SHOWN_TITLE_CHARS`] characters, and said
/// how long it was when cut.
pub fn shown(text: &str) -> String {
    cut(text, SHOWN_TITLE_CHARS)
}

/// `text` cut to `chars` characters, saying how long it was when cut.
pub fn cut(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        None => text.to_owned(),
        Some((end, _)) => format!("{}… ({} bytes)", &text[..end], text.len()),
    }
}

/// The largest title MediaWiki stores (`page_title` is 255 bytes).
pub const MAX_TITLE_BYTES: usize = 255;

/// How much of a dump's text the reader holds at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest revision text taken, in bytes of XML (old-store's body
    /// limit bounds what it accepts; Wikipedia's pages are at most 2 MiB).
    /// A larger one is skipped while it is read, never held whole.
    pub max_text_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_text_bytes: 30 * 1024 * 1024 }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("cannot read the dump: {0}")]
    Io(#[from] std::io::Error),
    #[error("cannot read the 7z archive: {0}")]
    Archive(String),
    #[error("malformed XML at byte {position}: {reason}")]
    Xml { position: u64, reason: String },
    /// Not a MediaWiki XML export (empty, another XML document, random bytes).
    #[error("not a MediaWiki XML export: {0}")]
    NotAnExport(String),
    /// The callback asked to stop (its own error is reported by the caller).
    #[error("stopped: {0}")]
    Stopped(String),
}

/// What the dump says about its wiki, and how much it held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DumpInfo {
    /// The `<base>` URL of `<siteinfo>`, e.g. `https://aa.wikipedia.org/wiki/Main_Page`.
    pub base: Option<String>,
    pub pages: u64,
    pub revisions: u64,
    /// Revisions handed on as [`Skipped`].
    pub skipped: u64,
}

impl DumpInfo {
    /// The wiki's domain, from the base URL.
    pub fn domain(&self) -> Option<String> {
        let rest = self.base.as_deref()?.split("://").nth(1)?;
        rest.split('/').next().filter(|h| !h.is_empty()).map(str::to_owned)
    }
}

/// How a dump file is packed, from its name's last extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    Xml,
    SevenZip,
    /// `.bz2`, as Wikimedia publishes most dumps (multistream files included).
    Bzip2,
    Gzip,
}

impl Packing {
    pub fn of(path: &Path) -> Packing {
        let extension = path.extension().and_then(|e| e.to_str()).unwrap_or_default().to_ascii_lowercase();
        match extension.as_str() {
            "7z" => Packing::SevenZip,
            "bz2" => Packing::Bzip2,
            "gz" => Packing::Gzip,
            _ => Packing::Xml,
        }
    }
}

/// Reads the dump at `path` (`.7z`, `.bz2`, `.gz` or plain `.xml`), calling
/// `each` for every revision in dump order. `progress` gets the bytes read so
/// far and the total when known: uncompressed bytes of a 7z entry, bytes of
/// the file otherwise (compressed ones for `.bz2` and `.gz`).
pub fn read_dump(
    path: &Path,
    limits: Limits,
    mut progress: impl FnMut(u64, Option<u64>),
    mut each: impl FnMut(&DumpInfo, Item) -> Result<(), String>,
) -> Result<DumpInfo, DumpError> {
    let packing = Packing::of(path);
    if packing != Packing::SevenZip {
        let file = std::fs::File::open(path)?;
        let total = file.metadata().ok().map(|m| m.len());
        let counted = Counted { inner: file, read: 0, report: |n| progress(n, total) };
        let xml: Box<dyn Read + '_> = match packing {
            Packing::Bzip2 => Box::new(bzip2::read::MultiBzDecoder::new(counted)),
            Packing::Gzip => Box::new(flate2::read::MultiGzDecoder::new(counted)),
            Packing::Xml | Packing::SevenZip => Box::new(counted),
        };
        return parse(xml, limits, &mut each);
    }
    let mut archive =
        sevenz_rust2::ArchiveReader::open(path, sevenz_rust2::Password::empty()).map_err(|e| DumpError::Archive(e.to_string()))?;
    let mut info = DumpInfo::default();
    let mut failure = None;
    archive
        .for_each_entries(|entry, reader| {
            if entry.is_directory() {
                return Ok(true);
            }
            let total = Some(entry.size());
            let counted = Counted { inner: reader, read: 0, report: |n| progress(n, total) };
            match parse(counted, limits, &mut each) {
                Ok(found) => {
                    info.base = info.base.take().or(found.base);
                    info.pages += found.pages;
                    info.revisions += found.revisions;
                    info.skipped += found.skipped;
                    Ok(true)
                }
                Err(e) => {
                    failure = Some(e);
                    Ok(false)
                }
            }
        })
        .map_err(|e| DumpError::Archive(e.to_string()))?;
    match failure {
        Some(e) => Err(e),
        None => Ok(info),
    }
}

/// Checks that the dump at `path` opens and starts as a MediaWiki export,
/// reading only up to its first element: a wrong file is said at once, before
/// anything is sent anywhere.
pub fn check_export(path: &Path) -> Result<(), DumpError> {
    let stop = "the export's first element was read";
    match read_dump(path, Limits::default(), |_, _| {}, |_, _| Err(stop.to_owned())) {
        Err(DumpError::Stopped(why)) if why == stop => Ok(()),
        Err(e) => Err(e),
        // A root with no revision at all is an (empty) export.
        Ok(_) => Ok(()),
    }
}

/// A reader that reports how many bytes went through it.
struct Counted<R, F> {
    inner: R,
    read: u64,
    report: F,
}

impl<R: Read, F: FnMut(u64)> Read for Counted<R, F> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        (self.report)(self.read);
        Ok(n)
    }
}

/// The element a text event belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Base,
    Title,
    PageId,
    Namespace,
    RevId,
    Timestamp,
    Text,
    Other,
}

/// A reader that keeps any run of bytes between two `<` to `limit` bytes:
/// XML text holds no literal `<`, so this bounds every text node (a 200 MB
/// revision, a 64 MB title) while it is read. The rest of a run is dropped,
/// and where that happened (in the bytes handed on) is noted for the parser.
struct BoundedRuns<R> {
    inner: R,
    limit: usize,
    run: usize,
    /// Bytes handed on so far.
    handed: u64,
    /// Where runs were cut, in bytes handed on; the parser takes them.
    cuts: Rc<RefCell<Vec<u64>>>,
    scratch: Vec<u8>,
}

impl<R: Read> Read for BoundedRuns<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        loop {
            self.scratch.resize(out.len().max(1), 0);
            let n = self.inner.read(&mut self.scratch)?;
            if n == 0 {
                return Ok(0);
            }
            let mut written = 0;
            for &byte in &self.scratch[..n] {
                if byte == b'<' {
                    self.run = 0;
                }
                self.run += 1;
                if self.run <= self.limit {
                    out[written] = byte;
                    written += 1;
                } else if self.run == self.limit + 1 {
                    self.cuts.borrow_mut().push(self.handed + written as u64);
                }
            }
            self.handed += written as u64;
            // A read that dropped everything is not the end of the input.
            if written > 0 {
                return Ok(written);
            }
        }
    }
}

/// Parses one XML document of the dump format, handing on each revision, or
/// why it is skipped (a bad id or time, a text over `limits`, a title over
/// [`MAX_TITLE_BYTES`]).
pub fn parse<R: Read>(
    input: R,
    limits: Limits,
    each: &mut impl FnMut(&DumpInfo, Item) -> Result<(), String>,
) -> Result<DumpInfo, DumpError> {
    let cuts = Rc::new(RefCell::new(Vec::new()));
    let bounded =
        BoundedRuns { inner: input, limit: limits.max_text_bytes.max(1024), run: 0, handed: 0, cuts: cuts.clone(), scratch: Vec::new() };
    let mut reader = quick_xml::Reader::from_reader(BufReader::with_capacity(1 << 16, bounded));
    let mut buf = Vec::with_capacity(1 << 16);
    let mut info = DumpInfo::default();
    let mut path: Vec<Vec<u8>> = Vec::new();
    let mut field = Field::Other;
    let mut field_started = 0u64;
    let mut text = String::new();
    let mut title = String::new();
    let mut page = PageIdentity::default();
    let mut title_problem: Option<String> = None;
    let mut text_cut = false;
    let mut root_seen = false;
    let (mut rev_id, mut timestamp, mut rev_text): (Option<String>, Option<String>, Option<String>) = (None, None, None);
    let xml_error = |reader: &quick_xml::Reader<_>, e: &dyn std::fmt::Display| DumpError::Xml {
        position: reader.buffer_position(),
        reason: e.to_string(),
    };
    // Whether a run was cut between `from` and here; forgets cuts before here.
    let cut_since = |from: u64, here: u64| {
        let mut cuts = cuts.borrow_mut();
        let found = cuts.iter().any(|&c| c >= from && c <= here);
        cuts.retain(|&c| c > here);
        found
    };
    loop {
        let event = match reader.read_event_into(&mut buf) {
            Ok(event) => event,
            Err(e) if !root_seen => return Err(DumpError::NotAnExport(e.to_string())),
            Err(e) => return Err(xml_error(&reader, &e)),
        };
        match event {
            Event::Start(e) => {
                let name = e.local_name().as_ref().to_vec();
                if path.is_empty() && name.as_slice() != b"mediawiki" {
                    return Err(DumpError::NotAnExport(format!(
                        "its root element is <{}>, not <mediawiki>",
                        shown(&String::from_utf8_lossy(&name))
                    )));
                }
                root_seen = true;
                let parent = path.last().map(Vec::as_slice);
                field = match (parent, name.as_slice()) {
                    (Some(b"siteinfo"), b"base") => Field::Base,
                    (Some(b"page"), b"title") => Field::Title,
                    (Some(b"page"), b"id") => Field::PageId,
                    (Some(b"page"), b"ns") => Field::Namespace,
                    (Some(b"revision"), b"id") => Field::RevId,
                    (Some(b"revision"), b"timestamp") => Field::Timestamp,
                    (Some(b"revision"), b"text") => Field::Text,
                    _ => Field::Other,
                };
                field_started = reader.buffer_position();
                if name.as_slice() == b"revision" {
                    (rev_id, timestamp, rev_text, text_cut) = (None, None, None, false);
                }
                if name.as_slice() == b"page" {
                    title.clear();
                    title_problem = None;
                    page = PageIdentity::default();
                    info.pages += 1;
                }
                text.clear();
                path.push(name);
            }
            Event::Empty(e) if path.is_empty() => {
                return Err(DumpError::NotAnExport(format!(
                    "its root element is <{}/>",
                    shown(&String::from_utf8_lossy(e.local_name().as_ref()))
                )));
            }
            // `<text ... />`: an empty text, or a hidden one (`deleted="deleted"`).
            Event::Empty(e) if e.local_name().as_ref() == b"text" && path.last().map(Vec::as_slice) == Some(b"revision") => {
                let hidden = e.attributes().flatten().any(|a| a.key.as_ref() == b"deleted");
                rev_text = if hidden { None } else { Some(String::new()) };
            }
            Event::Text(e) if field != Field::Other => {
                text.push_str(&e.unescape().map_err(|err| xml_error(&reader, &err))?);
            }
            Event::CData(e) if field != Field::Other => {
                text.push_str(&String::from_utf8_lossy(&e));
            }
            Event::End(e) => {
                let name = e.local_name().as_ref().to_vec();
                let cut = field != Field::Other && cut_since(field_started, reader.buffer_position());
                match (field, name.as_slice()) {
                    (Field::Base, b"base") => info.base = Some(std::mem::take(&mut text)),
                    (Field::Title, b"title") => {
                        title = std::mem::take(&mut text);
                        if cut || title.len() > MAX_TITLE_BYTES {
                            title_problem = Some(format!(
                                "the title is {}{} bytes, above the {MAX_TITLE_BYTES} a title may have",
                                if cut { "over " } else { "" },
                                title.len()
                            ));
                        }
                    }
                    (Field::RevId, b"id") => rev_id = Some(std::mem::take(&mut text)),
                    // An id or namespace that is not a number is left out, not fatal: the revision stands without it.
                    (Field::PageId, b"id") => page.id = text.trim().parse::<u64>().ok().filter(|&id| id > 0 && id <= i64::MAX as u64),
                    (Field::Namespace, b"ns") => {
                        page.namespace = text.trim().parse::<i64>().ok().filter(|ns| (-2..=PageIdentity::MAX_NAMESPACE).contains(ns))
                    }
                    (Field::Timestamp, b"timestamp") => timestamp = Some(std::mem::take(&mut text)),
                    (Field::Text, b"text") => {
                        text_cut = cut;
                        rev_text = if cut { None } else { Some(std::mem::take(&mut text)) };
                        text.clear();
                    }
                    _ => {}
                }
                field = Field::Other;
                path.pop();
                if name.as_slice() == b"revision" {
                    info.revisions += 1;
                    let rev = rev_id.clone().unwrap_or_default();
                    let skip = |reason: String| Skipped { title: shown(&title), rev: rev.clone(), reason };
                    let id = rev_id.as_deref().and_then(|s| s.trim().parse::<u64>().ok());
                    let at = timestamp.as_deref().and_then(parse_timestamp);
                    let item = match (id, at) {
                        _ if title_problem.is_some() => Err(skip(title_problem.clone().unwrap_or_default())),
                        _ if text_cut => Err(skip(format!(
                            "its text is over {} bytes, above what old-store takes (--max-revision-bytes)",
                            limits.max_text_bytes
                        ))),
                        (None, _) => Err(skip("no numeric revision id".into())),
                        (_, None) => {
                            Err(skip(format!("no ISO 8601 timestamp (it has {:?})", shown(timestamp.as_deref().unwrap_or_default()))))
                        }
                        (Some(rev_id), Some(timestamp)) => {
                            Ok(Revision { title: title.clone(), rev_id, timestamp, page, text: rev_text.take() })
                        }
                    };
                    if item.is_err() {
                        info.skipped += 1;
                    }
                    each(&info, item).map_err(DumpError::Stopped)?;
                }
            }
            Event::Eof if !root_seen => {
                return Err(DumpError::NotAnExport("it holds no <mediawiki> element".into()));
            }
            Event::Eof => return Ok(info),
            _ => {}
        }
        buf.clear();
    }
}

/// `2026-01-01T12:34:56Z`, as dumps write times.
pub fn parse_timestamp(s: &str) -> Option<SystemTime> {
    let s = s.trim().strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':').map(|p| p.parse::<i64>().ok());
    let (hour, minute, second) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = u64::try_from(days * 86_400 + hour * 3600 + minute * 60 + second).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11">
  <siteinfo><sitename>Wikipedia</sitename><base>https://aa.wikipedia.org/wiki/Main_Page</base></siteinfo>
  <page>
    <title>Main Page</title><ns>0</ns><id>1</id>
    <revision><id>10</id><timestamp>2004-08-13T06:24:53Z</timestamp><text bytes="9" xml:space="preserve">a &amp; &lt;b&gt;</text></revision>
    <revision><id>12</id><parentid>10</parentid><timestamp>2004-08-14T00:00:00Z</timestamp><text deleted="deleted" /></revision>
    <revision><id>13</id><timestamp>2004-08-15T00:00:00Z</timestamp><text bytes="0" /></revision>
  </page>
  <page><title>Talk:X</title><ns>1</ns><id>2</id>
    <revision><id>20</id><timestamp>2005-01-01T00:00:00Z</timestamp><text>x</text></revision>
  </page>
</mediawiki>"#;

    #[test]
    fn revisions_come_out_in_order_with_text_unescaped() {
        let mut seen = Vec::new();
        let info = parse(SAMPLE.as_bytes(), Limits::default(), &mut |_, r| {
            seen.push(r.unwrap());
            Ok(())
        })
        .unwrap();
        assert_eq!((info.pages, info.revisions), (2, 4));
        assert_eq!(info.domain().as_deref(), Some("aa.wikipedia.org"));
        assert_eq!(seen[0].title, "Main Page");
        assert_eq!(seen[0].text.as_deref(), Some("a & <b>"));
        assert_eq!(seen[0].timestamp, parse_timestamp("2004-08-13T06:24:53Z").unwrap());
        assert_eq!(seen[1].text, None, "hidden text");
        assert_eq!(seen[2].text.as_deref(), Some(""), "empty text");
        assert_eq!((seen[3].title.as_str(), seen[3].rev_id), ("Talk:X", 20));
        assert_eq!(seen[0].page, PageIdentity { id: Some(1), namespace: Some(0) });
        assert_eq!(seen[3].page, PageIdentity { id: Some(2), namespace: Some(1) });
    }

    #[test]
    fn bzip2_and_gzip_dumps_read_as_the_plain_xml_even_in_several_streams() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let titles = |path: &Path| {
            let mut seen = Vec::new();
            read_dump(
                path,
                Limits::default(),
                |_, _| {},
                |_, r| {
                    let r = r.unwrap();
                    seen.push((r.title, r.rev_id));
                    Ok(())
                },
            )
            .map(|info| (info.revisions, seen))
        };
        let plain = dir.path().join("dump.xml");
        std::fs::write(&plain, SAMPLE).unwrap();
        let expected = titles(&plain).unwrap();
        assert_eq!(expected.0, 4);
        // Multistream files (Wikimedia's `-multistream.xml.bz2`) are streams laid end to end.
        let (head, tail) = SAMPLE.split_at(SAMPLE.find("<page><title>Talk:X").unwrap());
        let mut bz2 = Vec::new();
        let mut gz = Vec::new();
        for part in [head, tail] {
            let mut encoder = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
            encoder.write_all(part.as_bytes()).unwrap();
            bz2.extend(encoder.finish().unwrap());
            let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            encoder.write_all(part.as_bytes()).unwrap();
            gz.extend(encoder.finish().unwrap());
        }
        for (name, bytes) in [("dump.xml.bz2", &bz2), ("dump.xml.GZ", &gz)] {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            assert_eq!(Packing::of(&path), if name.ends_with("bz2") { Packing::Bzip2 } else { Packing::Gzip });
            assert_eq!(titles(&path).unwrap(), expected, "{name}");
        }
        // A file that is not what its name says is an error, not an empty dump.
        let fake = dir.path().join("fake.xml.bz2");
        std::fs::write(&fake, SAMPLE).unwrap();
        assert!(matches!(titles(&fake), Err(DumpError::Xml { .. } | DumpError::Io(_) | DumpError::NotAnExport(_))));
    }

    #[test]
    fn timestamps_parse_as_utc() {
        assert_eq!(parse_timestamp("1970-01-01T00:00:00Z"), Some(SystemTime::UNIX_EPOCH));
        assert_eq!(parse_timestamp("2000-03-01T00:00:01Z"), Some(SystemTime::UNIX_EPOCH + Duration::from_secs(951_868_801)));
        assert_eq!(parse_timestamp("2000-13-01T00:00:00Z"), None);
        assert_eq!(parse_timestamp("yesterday"), None);
    }

    /// Every item of `xml` read with `limits`: revisions as (title, rev),
    /// skips as their message.
    /// A revision read, as (title, rev), or a skip's message.
    type Seen = Result<(String, u64), String>;

    fn items(xml: &[u8], limits: Limits) -> Result<(DumpInfo, Vec<Seen>), DumpError> {
        let mut seen = Vec::new();
        let info = parse(xml, limits, &mut |_, item| {
            seen.push(item.map(|r| (r.title, r.rev_id)).map_err(|s| s.to_string()));
            Ok(())
        })?;
        Ok((info, seen))
    }

    #[test]
    fn malformed_xml_is_an_error_and_a_bad_revision_is_skipped_not_fatal() {
        let broken = "<mediawiki><page><title>x</title><revision><id>1</id></page></mediawiki>";
        assert!(matches!(items(broken.as_bytes(), Limits::default()), Err(DumpError::Xml { .. })));
        // The probe's dump: one bad timestamp aborted the import after earlier
        // pages were written. Now that revision is skipped, said, and the rest go on.
        let bad = "<mediawiki><page><title>x</title>\
            <revision><id>1</id><timestamp>2004-08-13T06:24:53Z</timestamp><text>a</text></revision>\
            <revision><id>2</id><timestamp>yesterday</timestamp><text>b</text></revision>\
            <revision><timestamp>2004-08-13T06:24:53Z</timestamp><text>c</text></revision>\
            <revision><id>4</id><timestamp>2004-08-15T00:00:00Z</timestamp><text>d</text></revision></page></mediawiki>";
        let (info, seen) = items(bad.as_bytes(), Limits::default()).unwrap();
        assert_eq!((info.revisions, info.skipped), (4, 2));
        assert_eq!(seen[0], Ok(("x".to_owned(), 1)));
        assert!(seen[1].as_ref().unwrap_err().contains("revision 2 of x: no ISO 8601 timestamp"), "{:?}", seen[1]);
        assert!(seen[2].as_ref().unwrap_err().contains("no numeric revision id"), "{:?}", seen[2]);
        assert_eq!(seen[3], Ok(("x".to_owned(), 4)));
    }

    #[test]
    fn a_file_that_is_not_a_mediawiki_export_says_so() {
        let random: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for (what, bytes) in [
            ("empty", &b""[..]),
            ("whitespace", b"  \n\n"),
            ("text", b"just some words"),
            ("another XML", b"<?xml version=\"1.0\"?><html><body>hi</body></html>"),
            ("an empty root", b"<feed/>"),
            ("random bytes", &random),
        ] {
            let refused = items(bytes, Limits::default()).unwrap_err();
            assert!(matches!(refused, DumpError::NotAnExport(_)), "{what}: {refused:?}");
        }
        // An export with no page is one.
        assert_eq!(items(b"<mediawiki><siteinfo/></mediawiki>", Limits::default()).unwrap().0.pages, 0);
    }

    #[test]
    fn an_oversized_text_or_title_is_skipped_while_read_never_held_whole() {
        let limits = Limits { max_text_bytes: 64 * 1024 };
        let huge = "x".repeat(5 * 1024 * 1024);
        let long_title = "T".repeat(300);
        let xml = format!(
            "<mediawiki><page><title>Big</title>\
             <revision><id>1</id><timestamp>2004-08-13T06:24:53Z</timestamp><text>{huge}</text></revision>\
             <revision><id>2</id><timestamp>2004-08-13T06:24:53Z</timestamp><text>small</text></revision></page>\
             <page><title>{long_title}</title><revision><id>3</id><timestamp>2004-08-13T06:24:53Z</timestamp><text>a</text></revision></page>\
             <page><title>{huge}</title><revision><id>4</id><timestamp>2004-08-13T06:24:53Z</timestamp><text>a</text></revision></page>\
             <page><title>After</title><revision><id>5</id><timestamp>2004-08-13T06:24:53Z</timestamp><text>a</text></revision></page></mediawiki>"
        );
        let (info, seen) = items(xml.as_bytes(), limits).unwrap();
        assert_eq!((info.pages, info.revisions, info.skipped), (4, 5, 3));
        assert!(seen[0].as_ref().unwrap_err().contains("its text is over 65536 bytes"), "{:?}", seen[0]);
        assert_eq!(seen[1], Ok(("Big".to_owned(), 2)));
        for skipped in [&seen[2], &seen[3]] {
            let said = skipped.as_ref().unwrap_err();
            assert!(said.contains("above the 255 a title may have") && said.len() < 400, "{said}");
        }
        assert_eq!(seen[4], Ok(("After".to_owned(), 5)));
        // What the parser is handed: no run between two `<` above the limit.
        let cuts = Rc::new(RefCell::new(Vec::new()));
        let mut bounded =
            BoundedRuns { inner: xml.as_bytes(), limit: limits.max_text_bytes, run: 0, handed: 0, cuts: cuts.clone(), scratch: Vec::new() };
        let mut handed = Vec::new();
        bounded.read_to_end(&mut handed).unwrap();
        let longest = handed.split(|&b| b == b'<').map(<[u8]>::len).max().unwrap_or(0);
        assert!(longest < limits.max_text_bytes, "a run of {longest} bytes was handed on");
        assert_eq!(cuts.borrow().len(), 2, "two runs cut: the huge text and the huge title");
    }

    #[test]
    fn the_sample_wiki_dump_streams_out_of_its_7z_archive() {
        let path = revstore_testdata::shared_data().join("dumps/aawiki-20260101-pages-meta-history.xml.7z");
        let mut titles = std::collections::HashSet::new();
        let mut bytes = 0;
        let info = read_dump(
            &path,
            Limits::default(),
            |_, _| {},
            |_, r| {
                let r = r.unwrap();
                titles.insert(r.title);
                bytes += r.text.map_or(0, |t| t.len());
                Ok(())
            },
        )
        .unwrap();
        // shared/data/README.md: 507 pages, 1,307 revisions.
        assert_eq!((info.pages, info.revisions), (507, 1307));
        assert_eq!(titles.len(), 507);
        assert!(bytes > 1_000_000, "{bytes} bytes of wikitext");
    }
}
