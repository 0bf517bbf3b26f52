//! Any bytes given to the envelope decoder: a value or a typed error, never a
//! panic; and whatever decodes re-encodes to something that decodes the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use revstore_codecs::{Compression, Envelope};

fuzz_target!(|data: &[u8]| {
    let envelope = Envelope { max_decoded: 16 * 1024 * 1024 };
    if let Ok(payload) = envelope.decode(data) {
        let again = envelope.encode(&payload, Compression::None);
        assert_eq!(envelope.decode(&again).expect("re-encoded envelope decodes").as_ref(), payload.as_ref());
    }
});
