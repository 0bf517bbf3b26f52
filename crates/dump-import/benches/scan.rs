//! The template scan on hostile wikitext: `<pre>` repeated and never closed,
//! at 100 KB, 800 KB and 2 MB (Wikipedia's page limit), beside an ordinary
//! page of each size. Linear means the hostile page costs about what an
//! ordinary one of its size does, and 2 MB about 20x 100 KB.
//!
//! `cargo bench -p revstore-dump-import --bench scan`

use std::time::Instant;

use revstore_dump_import::templates::transclusions;

fn seconds(text: &str) -> f64 {
    // The best of three: the machine is shared.
    (0..3)
        .map(|_| {
            let started = Instant::now();
            std::hint::black_box(transclusions(std::hint::black_box(text)));
            started.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

#[allow(clippy::print_stdout)]
fn main() {
    let ordinary_unit = "Some prose with a {{Cite web|url=https://example.org|title=x}} and <ref>{{Citation needed}}</ref>.\n";
    let mut baseline = None;
    println!("{:>10} {:>12} {:>12} {:>10} {:>14}", "size", "hostile s", "ordinary s", "ratio", "vs 100 KB");
    for size in [100_000usize, 800_000, 2_000_000] {
        let hostile = "<pre>".repeat(size / 5);
        let ordinary = ordinary_unit.repeat(size / ordinary_unit.len());
        let (h, o) = (seconds(&hostile), seconds(&ordinary));
        let first = *baseline.get_or_insert(h);
        println!("{size:>10} {h:>12.4} {o:>12.4} {:>10.2} {:>14.1}", h / o, h / first);
    }
}
