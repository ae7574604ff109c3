//! Row keys come back from storage and from clients (cursors, event ids): parsing any text
//! must never panic, and whatever parses is the one spelling of its value.

#![no_main]

use fanline::keys::{event_row_key, parse_event_row_key};
use fanline::series::{codec, layout};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Some((ticks, event_id)) = parse_event_row_key(&text) {
        assert_eq!(event_row_key(ticks, event_id), text);
    }
    if let Some(ticks) = layout::parse_ticks(&text) {
        assert_eq!(layout::row_key(ticks), text);
    }
    if let Some(day) = layout::parse_day(&text) {
        assert_eq!(layout::day_key(day), text);
    }
    // A series row from storage: decoding never panics, and what decodes is in time order.
    if let Ok(points) = codec::decode(0, data) {
        assert!(points.windows(2).all(|pair| pair[0].at < pair[1].at));
    }
});
