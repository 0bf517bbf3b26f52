//! How much the real page histories shrink under each candidate block layout,
//! and what each costs: the measurements behind old-store's block design
//! (docs/design/old-store-blocks.md).
//!
//! ```text
//! cargo run --release -p revstore-codecs --example block_layouts
//! ```

#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::time::Instant;

use zstd::zstd_safe::CParameter;

fn one_frame(revisions: &[&[u8]], level: i32) -> usize {
    let mut c = zstd::bulk::Compressor::new(level).unwrap();
    c.set_parameter(CParameter::WindowLog(27)).unwrap();
    c.set_parameter(CParameter::EnableLongDistanceMatching(true)).unwrap();
    c.compress(&revisions.concat()).unwrap().len()
}

/// Each revision compressed with the one before it as a raw-content dictionary.
fn chained(revisions: &[&[u8]], level: i32) -> usize {
    let mut total = zstd::bulk::compress(revisions[0], level).unwrap().len();
    for pair in revisions.windows(2) {
        total += zstd::bulk::Compressor::with_dictionary(level, pair[0]).unwrap().compress(pair[1]).unwrap().len();
    }
    total
}

fn main() {
    let histories = [
        ("Anarchism, Parsoid HTML", revstore_testdata::history("enwiki_Anarchism.html", "html")),
        ("Anarchism, wikitext", revstore_testdata::history("enwiki_Anarchism.wikitext", "wikitext")),
    ];
    println!("| history | layout | % of raw | time |\n|---|---|---|---|");
    for (name, revisions) in &histories {
        let revs: Vec<&[u8]> = revisions.iter().map(|r| r.as_bytes()).collect();
        let raw: usize = revs.iter().map(|r| r.len()).sum();
        let row = |layout: String, size: usize, started: Instant| {
            println!(
                "| {name} ({} revisions, {} KB) | {layout} | {:.2} | {:.0?} |",
                revs.len(),
                raw / 1000,
                100.0 * size as f64 / raw as f64,
                started.elapsed()
            );
        };
        let t = Instant::now();
        row("each revision alone, level 3".into(), revs.iter().map(|r| zstd::bulk::compress(r, 3).unwrap().len()).sum(), t);
        for (n, level) in [(8, 6), (32, 6), (32, 19), (64, 19)] {
            let t = Instant::now();
            row(format!("blocks of {n} revisions, level {level}"), revs.chunks(n).map(|c| one_frame(c, level)).sum(), t);
        }
        for level in [6, 12, 15, 16, 19] {
            let t = Instant::now();
            row(format!("whole history in one block, level {level}"), one_frame(&revs, level), t);
        }
        for level in [3, 6, 19] {
            let t = Instant::now();
            row(format!("chained on the previous revision, level {level}"), chained(&revs, level), t);
        }
    }
}
