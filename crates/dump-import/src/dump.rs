//! A streaming reader of MediaWiki XML dumps (export format 0.10/0.11),
//! plain or packed in 7z, bzip2 or gzip.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::time::{Duration, SystemTime};

use quick_xml::events::Event;

/// One revision of the dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    /// The page title as the dump gives it (namespace prefix included, spaces).
    pub title: String,
    pub rev_id: u64,
    pub timestamp: SystemTime,
    /// `None` when the dump hides the text (deleted or suppressed revisions).
    pub text: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("cannot read the dump: {0}")]
    Io(#[from] std::io::Error),
    #[error("cannot read the 7z archive: {0}")]
    Archive(String),
    #[error("malformed XML at byte {position}: {reason}")]
    Xml { position: u64, reason: String },
    #[error("revision {rev} of {title:?}: {reason}")]
    Revision { title: String, rev: String, reason: String },
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
    mut progress: impl FnMut(u64, Option<u64>),
    mut each: impl FnMut(&DumpInfo, Revision) -> Result<(), String>,
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
        return parse(BufReader::with_capacity(1 << 16, xml), &mut each);
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
            match parse(BufReader::with_capacity(1 << 16, counted), &mut each) {
                Ok(found) => {
                    info.base = info.base.take().or(found.base);
                    info.pages += found.pages;
                    info.revisions += found.revisions;
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
    RevId,
    Timestamp,
    Text,
    Other,
}

/// Parses one XML document of the dump format.
pub fn parse<R: BufRead>(input: R, each: &mut impl FnMut(&DumpInfo, Revision) -> Result<(), String>) -> Result<DumpInfo, DumpError> {
    let mut reader = quick_xml::Reader::from_reader(input);
    let mut buf = Vec::with_capacity(1 << 16);
    let mut info = DumpInfo::default();
    let mut path: Vec<Vec<u8>> = Vec::new();
    let mut field = Field::Other;
    let mut text = String::new();
    let mut title = String::new();
    let (mut rev_id, mut timestamp, mut rev_text): (Option<String>, Option<String>, Option<String>) = (None, None, None);
    let xml_error = |reader: &quick_xml::Reader<R>, e: &dyn std::fmt::Display| DumpError::Xml {
        position: reader.buffer_position(),
        reason: e.to_string(),
    };
    loop {
        let event = reader.read_event_into(&mut buf).map_err(|e| xml_error(&reader, &e))?;
        match event {
            Event::Start(e) => {
                let name = e.local_name().as_ref().to_vec();
                let parent = path.last().map(Vec::as_slice);
                field = match (parent, name.as_slice()) {
                    (Some(b"siteinfo"), b"base") => Field::Base,
                    (Some(b"page"), b"title") => Field::Title,
                    (Some(b"revision"), b"id") => Field::RevId,
                    (Some(b"revision"), b"timestamp") => Field::Timestamp,
                    (Some(b"revision"), b"text") => Field::Text,
                    _ => Field::Other,
                };
                if name.as_slice() == b"revision" {
                    (rev_id, timestamp, rev_text) = (None, None, None);
                }
                if name.as_slice() == b"page" {
                    title.clear();
                    info.pages += 1;
                }
                text.clear();
                path.push(name);
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
                match (field, name.as_slice()) {
                    (Field::Base, b"base") => info.base = Some(std::mem::take(&mut text)),
                    (Field::Title, b"title") => title = std::mem::take(&mut text),
                    (Field::RevId, b"id") => rev_id = Some(std::mem::take(&mut text)),
                    (Field::Timestamp, b"timestamp") => timestamp = Some(std::mem::take(&mut text)),
                    (Field::Text, b"text") => rev_text = Some(std::mem::take(&mut text)),
                    _ => {}
                }
                field = Field::Other;
                path.pop();
                if name.as_slice() == b"revision" {
                    let bad = |reason: &str| DumpError::Revision {
                        title: title.clone(),
                        rev: rev_id.clone().unwrap_or_default(),
                        reason: reason.to_owned(),
                    };
                    let id = rev_id.as_deref().and_then(|s| s.trim().parse::<u64>().ok()).ok_or_else(|| bad("no numeric revision id"))?;
                    let at = timestamp.as_deref().and_then(parse_timestamp).ok_or_else(|| bad("no ISO 8601 timestamp"))?;
                    info.revisions += 1;
                    let revision = Revision { title: title.clone(), rev_id: id, timestamp: at, text: rev_text.take() };
                    each(&info, revision).map_err(DumpError::Stopped)?;
                }
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
        let info = parse(SAMPLE.as_bytes(), &mut |_, r| {
            seen.push(r);
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
    }

    #[test]
    fn bzip2_and_gzip_dumps_read_as_the_plain_xml_even_in_several_streams() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let titles = |path: &Path| {
            let mut seen = Vec::new();
            read_dump(
                path,
                |_, _| {},
                |_, r| {
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
        assert!(matches!(titles(&fake), Err(DumpError::Xml { .. } | DumpError::Io(_))));
    }

    #[test]
    fn timestamps_parse_as_utc() {
        assert_eq!(parse_timestamp("1970-01-01T00:00:00Z"), Some(SystemTime::UNIX_EPOCH));
        assert_eq!(parse_timestamp("2000-03-01T00:00:01Z"), Some(SystemTime::UNIX_EPOCH + Duration::from_secs(951_868_801)));
        assert_eq!(parse_timestamp("2000-13-01T00:00:00Z"), None);
        assert_eq!(parse_timestamp("yesterday"), None);
    }

    #[test]
    fn malformed_xml_and_revisions_are_errors() {
        let broken = "<mediawiki><page><title>x</title><revision><id>1</id></page></mediawiki>";
        assert!(parse(broken.as_bytes(), &mut |_, _| Ok(())).is_err());
        let no_id = "<mediawiki><page><title>x</title><revision><timestamp>2004-08-13T06:24:53Z</timestamp></revision></page></mediawiki>";
        assert!(matches!(parse(no_id.as_bytes(), &mut |_, _| Ok(())), Err(DumpError::Revision { .. })));
    }

    #[test]
    fn the_sample_wiki_dump_streams_out_of_its_7z_archive() {
        let path = revstore_testdata::shared_data().join("dumps/aawiki-20260101-pages-meta-history.xml.7z");
        let mut titles = std::collections::HashSet::new();
        let mut bytes = 0;
        let info = read_dump(
            &path,
            |_, _| {},
            |_, r| {
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
