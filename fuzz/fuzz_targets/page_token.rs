//! Any string offered as a page token: its payload (only if it was sealed for
//! this scope with this key) or a bad-token error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use revstore_codecs::PageTokenCodec;

fuzz_target!(|data: &[u8]| {
    let codec = PageTokenCodec::new(b"fuzz key");
    let token = String::from_utf8_lossy(data);
    if let Ok(payload) = codec.open(b"scope", &token) {
        // Forging a valid tag by chance would be a broken MAC.
        assert_eq!(codec.seal(b"scope", &payload), token, "accepted a token the codec did not make");
    }
});
