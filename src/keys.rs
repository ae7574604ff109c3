//! Ticks and event row keys (DESIGN.md §1, the log-tail pattern).
//!
//! A row key is `format!("{:019}", MAX_TICKS - ticks) + "_" + event_id`, so ascending row-key
//! order is newest first and a page of the newest entries is the first rows of a partition.
//! Ticks are .NET `DateTime` ticks (100 ns since 0001-01-01T00:00:00Z), so any tool that reads
//! the tables can decode the time from the key.

use std::fmt;

use time::OffsetDateTime;
use uuid::Uuid;

/// .NET `DateTime.MaxValue.Ticks`: 9999-12-31T23:59:59.9999999Z.
pub const MAX_TICKS: u64 = 3_155_378_975_999_999_999;

/// Seconds from 0001-01-01T00:00:00Z to the Unix epoch.
const UNIX_EPOCH_SECONDS: i64 = 62_135_596_800;
const TICKS_PER_SECOND: u64 = 10_000_000;
const NANOS_PER_TICK: u32 = 100;

/// A point in time with 100 ns precision, from year 1 to year 9999.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticks(u64);

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    #[error("time must be RFC 3339, for example 2026-01-02T03:04:05Z")]
    Malformed,
    #[error("time must lie between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.9999999Z")]
    OutOfRange,
}

impl Ticks {
    pub const MIN: Ticks = Ticks(0);
    pub const MAX: Ticks = Ticks(MAX_TICKS);

    pub fn new(ticks: u64) -> Option<Ticks> {
        (ticks <= MAX_TICKS).then_some(Ticks(ticks))
    }

    /// Ticks read back from storage, clamped into range.
    pub fn clamped(ticks: u64) -> Ticks {
        Ticks(ticks.min(MAX_TICKS))
    }

    pub fn get(self) -> u64 {
        self.0
    }

    pub fn now() -> Ticks {
        // The clock reads a time between years 1 and 9999 on any sane machine.
        Ticks::from_datetime(OffsetDateTime::now_utc()).unwrap_or(Ticks::MIN)
    }

    pub fn from_datetime(datetime: OffsetDateTime) -> Result<Ticks, TimeError> {
        let seconds = datetime.unix_timestamp() + UNIX_EPOCH_SECONDS;
        let seconds = u64::try_from(seconds).map_err(|_| TimeError::OutOfRange)?;
        let ticks = seconds
            .checked_mul(TICKS_PER_SECOND)
            .and_then(|t| t.checked_add(u64::from(datetime.nanosecond() / NANOS_PER_TICK)))
            .ok_or(TimeError::OutOfRange)?;
        Ticks::new(ticks).ok_or(TimeError::OutOfRange)
    }

    /// Parses RFC 3339 (any offset); precision below 100 ns is truncated.
    pub fn parse_rfc3339(text: &str) -> Result<Ticks, TimeError> {
        let datetime = OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
            .map_err(|_| TimeError::Malformed)?;
        Ticks::from_datetime(datetime)
    }

    pub fn to_datetime(self) -> OffsetDateTime {
        let seconds = (self.0 / TICKS_PER_SECOND) as i64 - UNIX_EPOCH_SECONDS;
        let nanos = (self.0 % TICKS_PER_SECOND) as i64 * i64::from(NANOS_PER_TICK);
        // Every value up to MAX_TICKS is inside the range `time` supports.
        OffsetDateTime::from_unix_timestamp(seconds)
            .map(|datetime| datetime + time::Duration::nanoseconds(nanos))
            .unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }

    /// The time `millis` milliseconds after the Unix epoch, clamped to the range.
    pub fn from_unix_millis(millis: i64) -> Ticks {
        let since_year_one = i128::from(millis) + i128::from(UNIX_EPOCH_SECONDS) * 1000;
        Ticks::clamped(u64::try_from(since_year_one.max(0) * 10_000).unwrap_or(u64::MAX))
    }

    /// Milliseconds since the Unix epoch (negative before 1970).
    pub fn unix_millis(self) -> i64 {
        (self.0 / 10_000) as i64 - UNIX_EPOCH_SECONDS * 1000
    }
}

/// RFC 3339 in UTC with all seven digits of the ticks, so the text round-trips exactly:
/// `2026-11-21T10:00:00.0000000Z`. Written digit by digit into a fixed buffer: every post
/// and stored entry formats one, and the formatting machinery's padded integers cost several
/// times more.
impl fmt::Display for Ticks {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let datetime = self.to_datetime();
        let mut text = *b"0000-00-00T00:00:00.0000000Z";
        // Years run from 1 to 9999 (see `MAX_TICKS`).
        put_digits(&mut text[0..4], datetime.year().unsigned_abs());
        put_digits(&mut text[5..7], u8::from(datetime.month()).into());
        put_digits(&mut text[8..10], datetime.day().into());
        put_digits(&mut text[11..13], datetime.hour().into());
        put_digits(&mut text[14..16], datetime.minute().into());
        put_digits(&mut text[17..19], datetime.second().into());
        put_digits(
            &mut text[20..27],
            u32::try_from(self.0 % TICKS_PER_SECOND).unwrap_or(0),
        );
        // Only ASCII digits and separators were written.
        formatter.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
    }
}

/// Writes `value`'s last `out.len()` decimal digits into `out`, zero-padded.
fn put_digits(out: &mut [u8], mut value: u32) {
    for slot in out.iter_mut().rev() {
        *slot = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// The row key of an event in `events` and in every `timelines` partition it reaches.
pub fn event_row_key(at: Ticks, event_id: Uuid) -> String {
    format!("{:019}_{}", MAX_TICKS - at.0, event_id.as_hyphenated())
}

/// `MAX_TICKS` as the 19 digits of a row key: no row key's time part sorts above it.
const MAX_REVERSE_TICKS: &[u8; 19] = b"3155378975999999999";

/// Whether `row_key` is an event row key spelled exactly as [`event_row_key`] spells it (only
/// the canonical spelling is a key: the same event must always map to one row). Checks bytes
/// and allocates nothing, so a page of 250 entries can check each: such a key needs no JSON
/// escaping, and its last 36 bytes are its event id as a page item shows it.
pub fn is_event_row_key(row_key: &str) -> bool {
    let Ok(bytes) = <&[u8; 56]>::try_from(row_key.as_bytes()) else {
        return false;
    };
    // Every position is checked with comparisons against constant masks, no table lookup
    // and no early exit: the loop compiles to a few vector instructions, and a page checks
    // 250 keys.
    let mut misfits = 0u8;
    for (index, &byte) in bytes.iter().enumerate() {
        let digit = u8::from(byte.wrapping_sub(b'0') < 10);
        let hex = digit | u8::from(byte.wrapping_sub(b'a') < 6);
        let fits = (digit & NEEDS_DIGIT[index])
            | (hex & NEEDS_HEX[index])
            | (u8::from(byte == b'_') & NEEDS_UNDERSCORE[index])
            | (u8::from(byte == b'-') & NEEDS_HYPHEN[index]);
        misfits |= fits ^ 1;
    }
    misfits == 0 && bytes[..19] <= MAX_REVERSE_TICKS[..]
}

/// What each position of an event row key holds: 19 digits, `_`, a hyphenated lower-case
/// UUID. One mask a class, 1 where the position needs it.
const NEEDS_DIGIT: [u8; 56] = positions(0, 19, &[]);
const NEEDS_UNDERSCORE: [u8; 56] = positions(19, 20, &[]);
const NEEDS_HYPHEN: [u8; 56] = positions(0, 0, &[28, 33, 38, 43]);
const NEEDS_HEX: [u8; 56] = {
    let mut mask = positions(20, 56, &[]);
    let hyphens = NEEDS_HYPHEN;
    let mut index = 0;
    while index < 56 {
        mask[index] &= hyphens[index] ^ 1;
        index += 1;
    }
    mask
};

/// A mask of 1 at `start..end` and at each of `also`.
const fn positions(start: usize, end: usize, also: &[usize]) -> [u8; 56] {
    let mut mask = [0u8; 56];
    let mut index = start;
    while index < end {
        mask[index] = 1;
        index += 1;
    }
    let mut extra = 0;
    while extra < also.len() {
        mask[also[extra]] = 1;
        extra += 1;
    }
    mask
}

/// Decodes an event row key back into its time and event id.
pub fn parse_event_row_key(row_key: &str) -> Option<(Ticks, Uuid)> {
    if !is_event_row_key(row_key) {
        return None;
    }
    let reverse = row_key.as_bytes()[..19]
        .iter()
        .fold(0u64, |value, digit| value * 10 + u64::from(digit - b'0'));
    let event_id = Uuid::try_parse(&row_key[20..]).ok()?;
    Some((Ticks(MAX_TICKS - reverse), event_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_millis_round_trip() {
        for millis in [0, 1, 1_763_726_400_123, -62_135_596_800_000] {
            assert_eq!(Ticks::from_unix_millis(millis).unix_millis(), millis);
        }
        assert_eq!(Ticks::from_unix_millis(i64::MIN), Ticks::MIN);
    }
    use proptest::prelude::*;

    #[test]
    fn bounds_format_as_year_one_and_year_9999() {
        assert_eq!(Ticks::MIN.to_string(), "0001-01-01T00:00:00.0000000Z");
        assert_eq!(Ticks::MAX.to_string(), "9999-12-31T23:59:59.9999999Z");
        assert_eq!(
            Ticks::parse_rfc3339("9999-12-31T23:59:59.9999999Z"),
            Ok(Ticks::MAX)
        );
        assert_eq!(Ticks::parse_rfc3339("0001-01-01T00:00:00Z"), Ok(Ticks::MIN));
    }

    #[test]
    fn unix_epoch_has_the_dotnet_tick_count() {
        assert_eq!(
            Ticks::parse_rfc3339("1970-01-01T00:00:00Z").map(Ticks::get),
            Ok(621_355_968_000_000_000)
        );
        assert_eq!(
            Ticks::new(621_355_968_000_000_000).map(Ticks::unix_millis),
            Some(0)
        );
    }

    #[test]
    fn offsets_are_converted_to_utc() {
        assert_eq!(
            Ticks::parse_rfc3339("2026-01-01T02:00:00+02:00"),
            Ticks::parse_rfc3339("2026-01-01T00:00:00Z")
        );
    }

    #[test]
    fn times_outside_the_range_are_rejected() {
        assert_eq!(
            Ticks::parse_rfc3339("0001-01-01T00:00:00+00:01"),
            Err(TimeError::OutOfRange)
        );
        assert_eq!(Ticks::parse_rfc3339("yesterday"), Err(TimeError::Malformed));
        assert_eq!(Ticks::new(MAX_TICKS + 1), None);
    }

    #[test]
    fn row_key_of_the_newest_time_is_all_zeros() {
        let id = Uuid::nil();
        assert_eq!(
            event_row_key(Ticks::MAX, id),
            "0000000000000000000_00000000-0000-0000-0000-000000000000"
        );
        assert_eq!(
            event_row_key(Ticks::MIN, id),
            "3155378975999999999_00000000-0000-0000-0000-000000000000"
        );
    }

    #[test]
    fn non_canonical_row_keys_do_not_parse() {
        let key = event_row_key(Ticks::MIN, Uuid::now_v7());
        assert!(parse_event_row_key(&key).is_some());
        assert!(parse_event_row_key(&key.to_uppercase()).is_none());
        assert!(parse_event_row_key(&key[1..]).is_none());
        assert!(
            parse_event_row_key("9999999999999999999_00000000-0000-0000-0000-000000000000")
                .is_none()
        );
        assert!(parse_event_row_key("").is_none());
    }

    #[test]
    fn the_highest_row_key_time_is_max_ticks() {
        assert_eq!(
            format!("{MAX_TICKS:019}").as_bytes(),
            MAX_REVERSE_TICKS.as_slice()
        );
        let newest = event_row_key(Ticks::MIN, Uuid::nil());
        assert_eq!(
            parse_event_row_key(&newest),
            Some((Ticks::MIN, Uuid::nil()))
        );
        let past_the_end = newest.replacen("3155378975999999999", "3155378976000000000", 1);
        assert!(!is_event_row_key(&past_the_end));
    }

    /// What an event row key is, said the slow way: split, parse, and spell the id again.
    fn reference_parse(row_key: &str) -> Option<(Ticks, Uuid)> {
        let (reverse, id) = row_key.split_once('_')?;
        if reverse.len() != 19 || !reverse.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let ticks = MAX_TICKS.checked_sub(reverse.parse().ok()?)?;
        let event_id = Uuid::try_parse(id).ok()?;
        (id == event_id.as_hyphenated().to_string()).then_some((Ticks(ticks), event_id))
    }

    fn any_ticks() -> impl Strategy<Value = Ticks> {
        prop_oneof![
            Just(0u64),
            Just(MAX_TICKS),
            0..=1_000u64,
            (MAX_TICKS - 1_000)..=MAX_TICKS,
            0..=MAX_TICKS,
        ]
        .prop_map(Ticks)
    }

    proptest! {
        #[test]
        fn ticks_round_trip_through_rfc3339(ticks in any_ticks()) {
            prop_assert_eq!(Ticks::parse_rfc3339(&ticks.to_string()), Ok(ticks));
        }

        #[test]
        fn row_keys_round_trip(ticks in any_ticks(), bytes in any::<[u8; 16]>()) {
            let id = Uuid::from_bytes(bytes);
            prop_assert_eq!(parse_event_row_key(&event_row_key(ticks, id)), Some((ticks, id)));
        }

        #[test]
        fn the_byte_check_parses_what_the_slow_way_parses(
            row in "[0-9]{19}_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            flip in 0..56usize,
            to in proptest::sample::select(&['A', 'f', 'g', '-', '_', '0', '9', '{', 'é'][..]),
        ) {
            prop_assert_eq!(parse_event_row_key(&row), reference_parse(&row));
            let mut changed: Vec<char> = row.chars().collect();
            changed[flip] = to;
            let changed: String = changed.into_iter().collect();
            prop_assert_eq!(parse_event_row_key(&changed), reference_parse(&changed), "{}", changed);
            prop_assert_eq!(is_event_row_key(&changed), reference_parse(&changed).is_some());
        }

        #[test]
        fn row_key_order_is_reverse_time_order(a in any_ticks(), b in any_ticks()) {
            let id = Uuid::now_v7();
            let (key_a, key_b) = (event_row_key(a, id), event_row_key(b, id));
            prop_assert_eq!(key_a.cmp(&key_b), b.cmp(&a));
        }
    }
}
