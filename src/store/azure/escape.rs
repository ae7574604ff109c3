//! Keys as Azure Table Storage can hold them, in the same order.
//!
//! Azure refuses `/`, `\`, `#`, `?` and the control characters U+0000–U+001F and
//! U+007F–U+009F in a `PartitionKey` or `RowKey`, and it orders keys by UTF-16 code units
//! (Azurite compares JavaScript strings), where the store's contract orders them by UTF-8
//! bytes, that is by code point: the two disagree only on characters above U+FFFF, which
//! UTF-16 spells with surrogates (U+D800–U+DFFF) below U+E000.
//!
//! So every key is rewritten by a prefix code that keeps order. Each character that Azure
//! cannot hold or would misorder is spelled as a two- or more-character code word that starts
//! with the allowed character just below it, and that character itself is spelled the same
//! way with a lower second character:
//!
//! | character | written |
//! |---|---|
//! | U+0000–U+001F | space, then two lowercase hex digits (`" 00"`–`" 1f"`) |
//! | space | `" ~"` |
//! | `"`, `#` | `"\"0"`, `"\"1"` |
//! | `.`, `/` | `".0"`, `".1"` |
//! | `>`, `?` | `">0"`, `">1"` |
//! | `[`, `\` | `"[0"`, `"[1"` |
//! | `~`, U+007F, U+0080–U+009F | `"~0"`, `"~1"`, `"~2"` then two hex digits |
//! | U+FFFF | U+FFFF then `0` |
//! | above U+FFFF | U+FFFF, then the 20 bits above U+10000 as two characters U+1000–U+13FF |
//!
//! Every other character stands for itself. No code word is a prefix of another and code
//! words keep the order of the characters they spell, so written keys keep the order of the
//! keys (byte order of UTF-8 and code-unit order of UTF-16 agree on them: they hold no
//! surrogates), and a range bound written the same way bounds the same keys.

use std::fmt::Write as _;

/// `key` as Azure holds it.
pub(super) fn escape(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 8);
    for character in key.chars() {
        let code = u32::from(character);
        match character {
            '\u{0}'..='\u{1f}' => {
                let _ = write!(out, " {code:02x}");
            }
            ' ' => out.push_str(" ~"),
            '"' => out.push_str("\"0"),
            '#' => out.push_str("\"1"),
            '.' => out.push_str(".0"),
            '/' => out.push_str(".1"),
            '>' => out.push_str(">0"),
            '?' => out.push_str(">1"),
            '[' => out.push_str("[0"),
            '\\' => out.push_str("[1"),
            '~' => out.push_str("~0"),
            '\u{7f}' => out.push_str("~1"),
            '\u{80}'..='\u{9f}' => {
                let _ = write!(out, "~2{:02x}", code - 0x80);
            }
            '\u{ffff}' => out.push_str("\u{ffff}0"),
            '\u{10000}'.. => {
                let bits = code - 0x10000;
                out.push('\u{ffff}');
                out.extend([high_unit(bits >> 10), high_unit(bits & 0x3ff)]);
            }
            _ => out.push(character),
        }
    }
    out
}

/// The key that `written` holds, or `None` if `written` is not a key [`escape`] wrote.
pub(super) fn unescape(written: &str) -> Option<String> {
    let mut out = String::with_capacity(written.len());
    let mut rest = written.chars();
    while let Some(character) = rest.next() {
        let decoded = match character {
            ' ' => match rest.next()? {
                '~' => ' ',
                high @ ('0' | '1') => {
                    let low = rest.next()?.to_digit(16)?;
                    char::from_u32(high.to_digit(16)? * 16 + low)?
                }
                _ => return None,
            },
            '"' => pick(rest.next()?, '"', '#')?,
            '.' => pick(rest.next()?, '.', '/')?,
            '>' => pick(rest.next()?, '>', '?')?,
            '[' => pick(rest.next()?, '[', '\\')?,
            '~' => match rest.next()? {
                '0' => '~',
                '1' => '\u{7f}',
                '2' => {
                    let code = hex(&mut rest, 2)?;
                    (code < 0x20).then_some(())?;
                    char::from_u32(0x80 + code)?
                }
                _ => return None,
            },
            '\u{ffff}' => match rest.next()? {
                '0' => '\u{ffff}',
                high => {
                    let low = rest.next()?;
                    char::from_u32(0x10000 + (ten_bits(high)? << 10) + ten_bits(low)?)?
                }
            },
            '\u{0}'..='\u{1f}' | '#' | '/' | '?' | '\\' | '\u{7f}'..='\u{9f}' => return None,
            '\u{10000}'.. => return None,
            other => other,
        };
        out.push(decoded);
    }
    Some(out)
}

/// Ten bits as one of the characters U+1000–U+13FF.
fn high_unit(bits: u32) -> char {
    char::from_u32(0x1000 + bits).unwrap_or('\u{1000}')
}

/// The ten bits a character U+1000–U+13FF stands for.
fn ten_bits(unit: char) -> Option<u32> {
    let code = u32::from(unit);
    (0x1000..0x1400).contains(&code).then(|| code - 0x1000)
}

/// The first character of a pair for `0`, the second for `1`.
fn pick(code: char, first: char, second: char) -> Option<char> {
    match code {
        '0' => Some(first),
        '1' => Some(second),
        _ => None,
    }
}

/// `digits` lowercase hex digits as a number.
fn hex(rest: &mut std::str::Chars<'_>, digits: usize) -> Option<u32> {
    let mut value = 0;
    for _ in 0..digits {
        let digit = rest.next()?;
        if digit.is_ascii_uppercase() {
            return None;
        }
        value = value * 16 + digit.to_digit(16)?;
    }
    Some(value)
}

/// Whether Azure can hold `written` as a key: none of its forbidden characters, and no
/// surrogates (a `str` holds none).
#[cfg(test)]
fn azure_accepts(written: &str) -> bool {
    !written.chars().any(|character| {
        matches!(character, '/' | '\\' | '#' | '?' | '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every character the code treats apart, its neighbours, and some plain ones.
    fn interesting() -> Vec<char> {
        let mut characters: Vec<char> = (0u32..=0xa0).filter_map(char::from_u32).collect();
        characters.extend([
            'é', '日', '\u{d7ff}', '\u{e000}', '\u{fffd}', '\u{fffe}', '\u{ffff}',
        ]);
        characters.extend(['\u{10000}', '😀', '\u{10ffff}']);
        characters
    }

    fn utf16(key: &str) -> Vec<u16> {
        key.encode_utf16().collect()
    }

    #[test]
    fn every_character_round_trips_and_is_written_as_azure_accepts() {
        for character in interesting() {
            let key = format!("a{character}z");
            let written = escape(&key);
            assert!(azure_accepts(&written), "{key:?} written as {written:?}");
            assert_eq!(
                unescape(&written).as_deref(),
                Some(key.as_str()),
                "{written:?}"
            );
        }
    }

    #[test]
    fn written_keys_keep_the_byte_order_of_keys_in_utf8_and_in_utf16() {
        let characters = interesting();
        let mut keys = Vec::new();
        for &first in &characters {
            keys.push(first.to_string());
            for &second in ['\u{0}', ' ', '/', 'a', '~', '\u{ffff}', '😀'].iter() {
                keys.push(format!("{first}{second}"));
            }
        }
        keys.push(String::new());
        keys.sort();
        keys.dedup();
        let written: Vec<String> = keys.iter().map(|key| escape(key)).collect();
        for pair in written.windows(2) {
            assert!(pair[0] < pair[1], "{:?} !< {:?} in UTF-8", pair[0], pair[1]);
            assert!(
                utf16(&pair[0]) < utf16(&pair[1]),
                "{:?} !< {:?} in UTF-16",
                pair[0],
                pair[1]
            );
        }
    }

    #[test]
    fn a_character_above_u_ffff_takes_three_units() {
        assert_eq!(escape("😀").encode_utf16().count(), 3);
        assert_eq!(escape("\u{10ffff}").encode_utf16().count(), 3);
    }

    #[test]
    fn plain_keys_are_written_as_they_are() {
        let key = "3155378975999999999_0192b3c4-d5e6-7f80-9a1b-2c3d4e5f6a7b";
        assert_eq!(escape(key), key);
        assert_eq!(escape("alice"), "alice");
    }

    #[test]
    fn strings_no_escape_wrote_are_refused() {
        for written in [
            "a/b",
            " 2",
            " 0",
            "\"2",
            "~",
            "~220",
            "~2G0",
            "\u{ffff}1",
            "\u{ffff}\u{1000}a",
            "😀",
        ] {
            assert_eq!(unescape(written), None, "{written:?}");
        }
    }
}
