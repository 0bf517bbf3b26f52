//! The block reader on hostile input, two ways, chosen by the first byte:
//! - raw: any bytes parse to a block whose checksums hold, or a typed error;
//! - structured: a valid block built from the input, with one byte flipped;
//!   every read then either fails or returns exactly the original content
//!   (corruption is reported, never served).
#![no_main]

use libfuzzer_sys::fuzz_target;
use revstore_codecs::{BlockBuilder, BlockReader, BlockSettings};

fuzz_target!(|data: &[u8]| {
    let settings = BlockSettings { level: 1, max_decoded: 16 * 1024 * 1024, ..BlockSettings::default() };
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode & 1 == 0 {
        if let Ok(reader) = BlockReader::parse(rest, &settings) {
            let _ = reader.read_all();
            for entry in reader.entries().iter().take(16) {
                let _ = reader.read(entry);
            }
        }
        return;
    }
    let (position, contents) = rest.split_at(rest.len().min(2));
    let originals: Vec<&[u8]> = contents.chunks(97).take(24).collect();
    let mut builder = BlockBuilder::new(settings);
    for (i, content) in originals.iter().enumerate() {
        builder.push(i as u64 + 1, [i as u8; 16], content).expect("small content fits");
    }
    let mut block = builder.finish().expect("block");
    let at = position.iter().fold(0usize, |acc, b| acc * 256 + *b as usize) % block.len();
    block[at] ^= mode | 1;
    let Ok(reader) = BlockReader::parse(&block, &settings) else { return };
    for (i, original) in originals.iter().enumerate() {
        if let Ok(read) = reader.read_rev(i as u64 + 1, None) {
            assert_eq!(&read[..], *original, "corrupted block served wrong content for entry {i}");
        }
    }
});
