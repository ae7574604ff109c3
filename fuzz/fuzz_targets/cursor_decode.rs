//! Cursor decoding takes text from any client: it must never panic, must refuse whatever
//! the server did not sign for this scope, and must give back exactly what was signed.

#![no_main]

use fanline::cursor::CursorCodec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let codec = CursorCodec::new(b"fuzzing key, fixed so runs repeat");
    let text = String::from_utf8_lossy(data);
    if let Ok(body) = codec.decode_bytes("scope", &text) {
        // Only a signed cursor decodes, and it is the one encoding of its body.
        assert_eq!(codec.encode_bytes("scope", &body), text);
        // A cursor is signed for its listing alone.
        assert!(codec.decode_bytes("another scope", &text).is_err());
    }
    if !data.is_empty() {
        let cursor = codec.encode_bytes("scope", data);
        if cursor.len() <= 4096 {
            assert_eq!(codec.decode_bytes("scope", &cursor).as_deref(), Ok(data));
        } else {
            // Longer than any cursor the server makes: refused unread.
            assert!(codec.decode_bytes("scope", &cursor).is_err());
        }
        assert!(codec.decode_bytes("other", &cursor).is_err());
    }
});
