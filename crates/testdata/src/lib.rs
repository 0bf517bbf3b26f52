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
