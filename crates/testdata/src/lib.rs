//! Real wiki data for tests and benchmarks: the project's `shared/data`, which
//! lies beside the checkout (as CI lays it out), or wherever
//! `REVSTORE_SHARED_DATA` points. Tests use it instead of invented text.

use std::path::PathBuf;

/// The `shared/data` directory.
pub fn shared_data() -> PathBuf {
    std::env::var_os("REVSTORE_SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data"))
}

/// The revisions of a page history in `histories/<name>`, oldest first, each
/// file ending in `.<extension>` (an empty extension: files without one). Panics, naming the directory, when the data
/// is not there: a test that needs it cannot say anything without it.
pub fn history(name: &str, extension: &str) -> Vec<String> {
    let dir = shared_data().join("histories").join(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e} (set REVSTORE_SHARED_DATA to the shared/data directory)", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| match p.extension() {
            Some(x) => x == extension,
            None => extension.is_empty(),
        })
        .collect();
    files.sort();
    files.iter().map(|f| std::fs::read_to_string(f).unwrap_or_else(|e| panic!("cannot read {}: {e}", f.display()))).collect()
}

/// English Wikipedia's "Anarchism", 97 revisions rendered to Parsoid HTML.
pub fn anarchism_html() -> Vec<String> {
    history("enwiki_Anarchism.html", "html")
}

/// A history of a large page, made from the Anarchism HTML history, for
/// measuring what multi-megabyte revisions cost (shared/data has no such page).
///
/// The page is `sections` sections, each a real Anarchism revision, and each
/// revision of the page is the one before with one section advanced to its
/// next real revision: one real edit per revision, as on a real page. So that
/// the sections do not simply repeat one another (which would make the page
/// far more compressible than a real one), each section's text — everything
/// outside tags — has its letters permuted by a key of its own; the markup is
/// left as it is, as a real page repeats its markup. One revision alone then
/// compresses to about 16% with `zstd -19`, like real Parsoid HTML.
///
/// 150 sections make revisions of about 4.4 MB. Deterministic: the same
/// arguments always give the same history.
pub fn large_page_history(sections: usize, revisions: usize) -> Vec<String> {
    let html = anarchism_html();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let keys: Vec<[u8; 26]> = (0..sections)
        .map(|_| {
            let mut key: [u8; 26] = std::array::from_fn(|i| b'a' + i as u8);
            for i in (1..26).rev() {
                key.swap(i, rng.below(i + 1));
            }
            key
        })
        .collect();
    // Each section starts somewhere in the first 60 revisions, so that there are edits left to make.
    let mut at: Vec<usize> = (0..sections).map(|_| rng.below(60)).collect();
    let mut out = Vec::with_capacity(revisions);
    for _ in 0..revisions {
        out.push(at.iter().zip(&keys).map(|(&r, key)| permute_text(&html[r], key)).collect::<String>());
        // One edit: a section with revisions left moves to its next one.
        loop {
            let j = rng.below(sections);
            if at[j] + 1 < html.len() {
                at[j] += 1;
                break;
            }
        }
    }
    out
}

/// The letters of the text outside tags mapped through `key` (case kept).
fn permute_text(html: &str, key: &[u8; 26]) -> String {
    let mut in_tag = false;
    html.chars()
        .map(|c| match c {
            '<' => {
                in_tag = true;
                c
            }
            '>' => {
                in_tag = false;
                c
            }
            'a'..='z' if !in_tag => key[(c as u8 - b'a') as usize] as char,
            'A'..='Z' if !in_tag => key[(c as u8 - b'A') as usize].to_ascii_uppercase() as char,
            _ => c,
        })
        .collect()
}

/// A small deterministic generator (xorshift64), so the data needs no crate.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_large_page_changes_one_section_per_revision() {
        let pages = super::large_page_history(8, 5);
        assert_eq!(pages.len(), 5);
        assert!(pages[0].len() > 8 * 10_000);
        assert_ne!(pages[0], pages[1]);
        assert_eq!(super::large_page_history(8, 5), pages, "deterministic");
        // The markup is kept: the page still has as many tags as its sections.
        let tags = |s: &str| s.matches('<').count();
        let html = super::anarchism_html();
        assert!(tags(&pages[0]) > 8 * tags(&html[0]));
    }
}
