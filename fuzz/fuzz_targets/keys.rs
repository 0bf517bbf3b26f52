//! Any text as a domain, title, revision or tid: a key or an error naming the
//! problem; a normalised title normalises to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use revstore_keys::{Domain, FirstLetterCase, RevId, Tid, Title, TitleRules};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = Domain::parse(&text);
    let _ = RevId::parse(&text);
    if let Ok(tid) = Tid::parse(&text) {
        assert_eq!(Tid::parse(&tid.to_string()).expect("canonical form parses"), tid);
    }
    for first_letter in [FirstLetterCase::Upper, FirstLetterCase::Sensitive] {
        let rules = TitleRules { first_letter };
        if let Ok(title) = Title::parse(&text, rules) {
            let again = Title::parse(title.as_str(), rules).expect("a normalised title is valid");
            assert_eq!(again, title, "normalisation is not idempotent");
        }
    }
});
