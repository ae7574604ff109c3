//! Opaque, authenticated page cursors.
//!
//! A cursor is the last row key of a page plus an HMAC-SHA256 tag over the listing it came
//! from (its scope: table and partition) and that row key. A client cannot forge or edit a
//! cursor, nor replay one against another partition: all of those are `InvalidCursor`. The
//! key is shared by every process (see `timeline::cursor_key`), so any server can continue a
//! page another one started.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of the tag kept in a cursor: 128 bits is ample against forgery, and short.
const TAG_BYTES: usize = 16;

/// Longest cursor accepted before any decoding work (row keys are at most 1 KiB; a catch-up
/// cursor holds up to a few hundred short entry ids).
const MAX_CURSOR_CHARS: usize = 4096;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("cursor is malformed or was not issued for this listing")]
pub struct InvalidCursor;

#[derive(Clone)]
pub struct CursorCodec {
    key: Vec<u8>,
}

impl CursorCodec {
    pub fn new(key: &[u8]) -> Self {
        CursorCodec { key: key.to_vec() }
    }

    fn tag(&self, scope: &str, body: &[u8]) -> HmacSha256 {
        // HMAC takes keys of any length.
        let mut mac = HmacSha256::new_from_slice(&self.key).unwrap_or_else(|_| unreachable!());
        mac.update(&(scope.len() as u64).to_be_bytes());
        mac.update(scope.as_bytes());
        mac.update(body);
        mac
    }

    /// A cursor for `row` of the listing `scope`.
    pub fn encode(&self, scope: &str, row: &str) -> String {
        self.encode_bytes(scope, row.as_bytes())
    }

    /// The row a cursor of `scope` holds.
    pub fn decode(&self, scope: &str, cursor: &str) -> Result<String, InvalidCursor> {
        let body = self.decode_bytes(scope, cursor)?;
        String::from_utf8(body).map_err(|_| InvalidCursor)
    }

    /// A cursor holding any non-empty bytes.
    pub fn encode_bytes(&self, scope: &str, body: &[u8]) -> String {
        let tag = self.tag(scope, body).finalize().into_bytes();
        let mut raw = Vec::with_capacity(TAG_BYTES + body.len());
        raw.extend_from_slice(&tag[..TAG_BYTES]);
        raw.extend_from_slice(body);
        URL_SAFE_NO_PAD.encode(raw)
    }

    pub fn decode_bytes(&self, scope: &str, cursor: &str) -> Result<Vec<u8>, InvalidCursor> {
        if cursor.is_empty() || cursor.len() > MAX_CURSOR_CHARS {
            return Err(InvalidCursor);
        }
        let raw = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| InvalidCursor)?;
        if raw.len() <= TAG_BYTES {
            return Err(InvalidCursor);
        }
        let (tag, body) = raw.split_at(TAG_BYTES);
        self.tag(scope, body)
            .verify_truncated_left(tag)
            .map_err(|_| InvalidCursor)?;
        Ok(body.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn edited_cursors_are_rejected() {
        let codec = CursorCodec::new(b"secret");
        let cursor = codec.encode("timelines/bob", "row-1");
        let mut bytes = URL_SAFE_NO_PAD.decode(&cursor).expect("base64");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let edited = URL_SAFE_NO_PAD.encode(bytes);
        assert_eq!(codec.decode("timelines/bob", &edited), Err(InvalidCursor));
        assert_eq!(
            codec.decode("timelines/bob", "not a cursor"),
            Err(InvalidCursor)
        );
        assert_eq!(codec.decode("timelines/bob", ""), Err(InvalidCursor));
    }

    #[test]
    fn cursors_do_not_work_for_another_listing_or_key() {
        let codec = CursorCodec::new(b"secret");
        let cursor = codec.encode("timelines/bob", "row-1");
        assert_eq!(codec.decode("timelines/eve", &cursor), Err(InvalidCursor));
        assert_eq!(
            CursorCodec::new(b"other").decode("timelines/bob", &cursor),
            Err(InvalidCursor)
        );
    }

    proptest! {
        #[test]
        fn cursors_round_trip(scope in "\\PC{0,40}", row in "\\PC{1,200}") {
            let codec = CursorCodec::new(b"k");
            prop_assert_eq!(codec.decode(&scope, &codec.encode(&scope, &row)), Ok(row));
        }

        #[test]
        fn arbitrary_text_never_panics_and_is_rejected(text in "\\PC{0,300}") {
            let codec = CursorCodec::new(b"k");
            prop_assert!(codec.decode("s", &text).is_err());
        }
    }
}
