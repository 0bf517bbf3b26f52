//! The chained-revision decoder on hostile input: any bytes, with any prefix,
//! decode to a typed error or to content whose checksum holds; and a real link
//! with one byte flipped never decodes to anything but the original.
#![no_main]

use libfuzzer_sys::fuzz_target;
use revstore_codecs::{decode_chained, encode_chained};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let (prefix, body) = rest.split_at(rest.len() / 3);
    if mode & 1 == 0 {
        let _ = decode_chained(Some(prefix), body, 1 << 20);
        let _ = decode_chained(None, body, 1 << 20);
        return;
    }
    let mut link = encode_chained(Some(prefix), body, 1).expect("encode");
    let at = (mode as usize * 7919) % link.len();
    link[at] ^= 0x40;
    if let Ok(decoded) = decode_chained(Some(prefix), &link, 1 << 20) {
        assert_eq!(decoded, body, "a corrupted link decoded to different content");
    }
});
