//! Any bytes as an encoded value list (page token payloads, stored keys): the
//! values, which re-encode to the same bytes, or an error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use revstore_storage::value::{decode_values, encode_values};

fuzz_target!(|data: &[u8]| {
    if let Ok(values) = decode_values(data) {
        assert_eq!(encode_values(&values), data, "decoding is not the inverse of encoding");
    }
});
