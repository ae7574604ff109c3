//! InfluxDB line protocol, parsed into fanline series: the text that Telegraf, the InfluxDB
//! client libraries and many devices send (`POST /api/v2/write`, MQTT payloads).
//!
//! ```text
//! measurement[,tag_key=tag_value...] field_key=field_value[,field_key=field_value...] [timestamp]
//! ```
//!
//! Pure: no I/O, no store, so the HTTP route and the MQTT subscriber share it.
//!
//! # The mapping (docs/api.md, "Line protocol")
//!
//! Each measurement, tag set and field is one series, named
//! `{measurement}.{field}` followed by `,{key}={value}` for each tag, sorted by key:
//! `cpu,host=a,cpu=cpu0 usage_idle=99` writes to `cpu.usage_idle,cpu=cpu0,host=a`. The name
//! is deterministic (tags sorted) and unique per measurement, tag set and field: a `\` in any
//! part is written `\\`, and the characters that would end a part are written with a `\`
//! before them (`.` `,` `=` in the measurement; `,` `=` in field keys, tag keys and tag
//! values), so two different lines never share a name by accident. Most names need no escape.
//!
//! The series carries the tags `key:value` (unescaped) for every tag of the line, plus
//! `_measurement:{measurement}` and `_field:{field}` as InfluxDB 2 names them, so
//! `GET /v1/series?tag=host:a` or `?tag=_measurement:cpu` lists them.
//!
//! # Values and times
//!
//! fanline points are `f64`: floats as they are, integers (`1i`) and unsigned integers
//! (`1u`) converted to the nearest `f64` (exact up to 2^53; beyond, rounded to 53 bits of
//! precision), booleans as 1 and 0. String fields are refused (a [`LineError`] naming the
//! line): a series holds numbers, and dropping a field silently would lose data unseen.
//!
//! Timestamps are integers in the request's [`Precision`] since the Unix epoch (negative
//! before 1970) and become ticks (100 ns since 0001-01-01): at nanosecond precision the last
//! two digits are dropped (rounded down), so two points 1 to 99 ns apart fall on one tick
//! and the later in the request wins. A line without a timestamp gets `now`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use super::{MAX_TAGS, Point, SeriesName};
use crate::keys::Ticks;
use crate::timeline::check_printable;

/// The tags every mapped series carries beside its line's own.
const MEASUREMENT_TAG: &str = "_measurement";
const FIELD_TAG: &str = "_field";

/// What a line's timestamp counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    #[default]
    Nanoseconds,
    Microseconds,
    Milliseconds,
    Seconds,
}

impl Precision {
    /// `ns`, `us`, `ms` or `s`, as InfluxDB's `precision` parameter spells them.
    pub fn parse(text: &str) -> Result<Precision, String> {
        match text {
            "ns" => Ok(Precision::Nanoseconds),
            "us" => Ok(Precision::Microseconds),
            "ms" => Ok(Precision::Milliseconds),
            "s" => Ok(Precision::Seconds),
            _ => Err(format!("precision must be ns, us, ms or s; got {text:?}")),
        }
    }

    /// The ticks of `timestamp` units after the Unix epoch, if in fanline's range.
    fn ticks(self, timestamp: i64) -> Option<Ticks> {
        let epoch = i128::from(Ticks::from_unix_millis(0).get());
        let timestamp = i128::from(timestamp);
        let since_epoch = match self {
            // Below 100 ns rounds down (towards the past, also before 1970).
            Precision::Nanoseconds => timestamp.div_euclid(100),
            Precision::Microseconds => timestamp * 10,
            Precision::Milliseconds => timestamp * 10_000,
            Precision::Seconds => timestamp * 10_000_000,
        };
        u64::try_from(epoch + since_epoch).ok().and_then(Ticks::new)
    }
}

/// The points of one series that a text carries.
#[derive(Clone, Debug, PartialEq)]
pub struct LineSeries {
    pub name: SeriesName,
    /// `key:value` per tag of the line, then `_measurement:` and `_field:`.
    pub tags: Arc<[String]>,
    /// In the order of the text (not sorted, times may repeat: the series write merges).
    pub points: Vec<Point>,
    /// The line (from 1) of its first point, for errors about the whole series (a device
    /// token writing to a series not its own).
    pub first_line: usize,
}

/// Why a text is not line protocol fanline takes; `line` counts from 1.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct LineError {
    pub line: usize,
    pub message: String,
}

/// Parses `text`: every line or an error naming the first bad one. Blank lines and `#`
/// comments are skipped; lines end in `\n` or `\r\n`. Series come in the order their first
/// point appears.
pub fn parse(text: &str, precision: Precision, now: Ticks) -> Result<Vec<LineSeries>, LineError> {
    let mut found: Vec<(Arc<Mapped>, Vec<Point>, usize)> = Vec::new();
    // By name, not by text: tags in another order name the same series.
    let mut index: HashMap<Arc<Mapped>, usize, foldhash::fast::RandomState> = HashMap::default();
    let mut fields: Vec<(&str, f64)> = Vec::new();
    for (number, raw) in text.split('\n').enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let trimmed = line.trim_start_matches([' ', '\t']);
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let fail = |message: String| LineError {
            line: number + 1,
            message,
        };
        let split = split_line(trimmed, &mut fields).map_err(fail)?;
        let at = match split.timestamp {
            None => now,
            Some(timestamp) => precision.ticks(timestamp).ok_or_else(|| {
                fail(format!(
                    "timestamp {timestamp} is outside 0001-01-01 to 9999-12-31 \
                     at precision {precision:?}"
                ))
            })?,
        };
        for (position, (field, value)) in fields.drain(..).enumerate() {
            let mapped = mapped(trimmed, split.key, field, position == 0).map_err(fail)?;
            let point = Point {
                at: at.get(),
                value,
            };
            match index.get(&mapped) {
                Some(&position) => found[position].1.push(point),
                None => {
                    index.insert(mapped.clone(), found.len());
                    found.push((mapped, vec![point], number + 1));
                }
            }
        }
    }
    Ok(found
        .into_iter()
        .map(|(mapped, points, first_line)| LineSeries {
            name: mapped.name.clone(),
            tags: mapped.tags.clone(),
            points,
            first_line,
        })
        .collect())
}

/// A series key (measurement and tags) and field key, as a line writes them, mapped to its
/// series: the same few thousand devices write every batch, and mapping each line anew
/// (unescaping, sorting tags, naming, checking) was most of the parsing.
#[derive(Debug)]
struct Mapped {
    name: SeriesName,
    tags: Arc<[String]>,
}

impl PartialEq for Mapped {
    fn eq(&self, other: &Mapped) -> bool {
        self.name == other.name
    }
}

impl Eq for Mapped {}

impl std::hash::Hash for Mapped {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.as_str().hash(state);
    }
}

/// Bytes of mappings kept (their texts, names and tags): a few MB, however many devices.
const MAPPED_BYTES: u64 = 8 * 1024 * 1024;
/// Bytes a mapping takes beyond its texts (its allocations and the cache's entry).
const MAPPED_OVERHEAD: u64 = 128;

/// The bytes a mapping holds, for the cache's bound.
#[derive(Clone)]
struct MappedBytes;

impl quick_cache::Weighter<String, Arc<Mapped>> for MappedBytes {
    fn weight(&self, text: &String, mapped: &Arc<Mapped>) -> u64 {
        let tags: usize = mapped.tags.iter().map(String::len).sum();
        (text.len() + mapped.name.as_str().len() + tags) as u64 + MAPPED_OVERHEAD
    }
}

/// Mappings made lately, by the text `{series key} {field key}` of a line.
static MAPPINGS: LazyLock<quick_cache::sync::Cache<String, Arc<Mapped>, MappedBytes>> =
    LazyLock::new(|| {
        quick_cache::sync::Cache::with_weighter(
            (MAPPED_BYTES / 256) as usize,
            MAPPED_BYTES,
            MappedBytes,
        )
    });

/// The series of `field` on a line of series key `key`. `first`: the line's first field, so
/// that `line` up to the field key is the text it is known by.
fn mapped(line: &str, key: &str, field: &str, first: bool) -> Result<Arc<Mapped>, String> {
    let joined;
    let text = if first {
        // The key, the spaces after it, the field key: one slice of the line.
        let end = field.as_ptr() as usize - line.as_ptr() as usize + field.len();
        &line[..end]
    } else {
        joined = format!("{key} {field}");
        joined.as_str()
    };
    if let Some(known) = MAPPINGS.get(text) {
        return Ok(known);
    }
    let mapped = Arc::new(map_series(key, field)?);
    MAPPINGS.insert(text.to_owned(), mapped.clone());
    Ok(mapped)
}

/// Maps a series key and a field key, as written, to a series name and tags.
fn map_series(key: &str, field: &str) -> Result<Mapped, String> {
    let (measurement, mut tags) = parse_key(key)?;
    let field = unescape(field, KEY_ESCAPES);
    tags.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(pair) = tags.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        return Err(format!("tag key {:?} appears twice", pair[0].0));
    }
    if tags.len() + 2 > MAX_TAGS {
        return Err(format!(
            "a line has at most {} tags (a series carries {MAX_TAGS}, \
             with _measurement and _field)",
            MAX_TAGS - 2
        ));
    }
    let mut name = String::with_capacity(key.len() + field.len() + 1);
    escape_into(&mut name, &measurement, MEASUREMENT_SPECIALS);
    name.push('.');
    escape_into(&mut name, &field, PART_SPECIALS);
    for (key, value) in &tags {
        name.push(',');
        escape_into(&mut name, key, PART_SPECIALS);
        name.push('=');
        escape_into(&mut name, value, PART_SPECIALS);
    }
    let series_name =
        SeriesName::parse(&name).map_err(|message| format!("series {name:?}: {message}"))?;
    Ok(Mapped {
        name: series_name,
        tags: series_tags(&tags, &measurement, &field)?.into(),
    })
}

/// Characters written with a `\` before them in a series name, besides `\` itself.
const MEASUREMENT_SPECIALS: &[char] = &['.', ',', '='];
const PART_SPECIALS: &[char] = &[',', '='];

fn escape_into(out: &mut String, text: &str, specials: &[char]) {
    for char in text.chars() {
        if char == '\\' || specials.contains(&char) {
            out.push('\\');
        }
        out.push(char);
    }
}

fn series_tags(
    tags: &[(Cow<'_, str>, Cow<'_, str>)],
    measurement: &str,
    field: &str,
) -> Result<Vec<String>, String> {
    let all: Vec<String> = tags
        .iter()
        .map(|(key, value)| format!("{key}:{value}"))
        .chain([
            format!("{MEASUREMENT_TAG}:{measurement}"),
            format!("{FIELD_TAG}:{field}"),
        ])
        .collect();
    for tag in &all {
        check_printable("tag", tag, super::MAX_TAG_BYTES)
            .map_err(|message| format!("tag {tag:?}: {message}"))?;
    }
    Ok(all)
}

/// One line, its names as written (escapes kept); its fields go to the caller's buffer.
struct SplitLine<'a> {
    /// The measurement and tags: up to the first space not escaped.
    key: &'a str,
    timestamp: Option<i64>,
}

/// Splits one line (not blank, not a comment, no line break) into its series key, its
/// fields (pushed to `fields`, raw keys) and its timestamp.
fn split_line<'a>(
    line: &'a str,
    fields: &mut Vec<(&'a str, f64)>,
) -> Result<SplitLine<'a>, String> {
    fields.clear();
    let mut cursor = Cursor {
        bytes: line.as_bytes(),
        text: line,
        at: 0,
    };
    let key = cursor.raw_name(b" ", b" ");
    let found = split_fields(&mut cursor, fields);
    if found.is_err() {
        // A fault in the key comes first, as the line reads.
        parse_key(key)?;
    }
    let timestamp = found?;
    Ok(SplitLine { key, timestamp })
}

/// The fields and timestamp after a line's series key.
fn split_fields<'a>(
    cursor: &mut Cursor<'a>,
    fields: &mut Vec<(&'a str, f64)>,
) -> Result<Option<i64>, String> {
    if !cursor.skip_spaces() || cursor.done() {
        return Err("missing fields".into());
    }
    loop {
        let key = cursor.raw_name(b"=, ", KEY_ESCAPES);
        if key.is_empty() {
            return Err("missing field key".into());
        }
        if !cursor.eat(b'=') {
            return Err(format!(
                "missing field value of field {:?}",
                unescape(key, KEY_ESCAPES)
            ));
        }
        let value = cursor.field_value(&unescape(key, KEY_ESCAPES))?;
        fields.push((key, value));
        if !cursor.eat(b',') {
            break;
        }
    }
    let timestamp = if cursor.skip_spaces() && !cursor.done() {
        let text = cursor.until(b" \t");
        let timestamp = parse_timestamp(text)?;
        cursor.skip_spaces();
        Some(timestamp)
    } else {
        None
    };
    if !cursor.done() {
        return Err(format!(
            "unexpected text after the timestamp: {:?}",
            cursor.rest()
        ));
    }
    Ok(timestamp)
}

/// A measurement and its tags (as written), unescaped.
type ParsedKey<'a> = (Cow<'a, str>, Vec<(Cow<'a, str>, Cow<'a, str>)>);

/// Reads a series key: the measurement, then `,key=value` per tag.
fn parse_key(key: &str) -> Result<ParsedKey<'_>, String> {
    let mut cursor = Cursor {
        bytes: key.as_bytes(),
        text: key,
        at: 0,
    };
    let measurement = unescape(cursor.raw_name(b", ", b", "), b", ");
    if measurement.is_empty() {
        return Err("missing measurement".into());
    }
    let mut tags = Vec::new();
    while cursor.eat(b',') {
        let key = unescape(cursor.raw_name(b"=, ", KEY_ESCAPES), KEY_ESCAPES);
        if key.is_empty() {
            return Err("missing tag key".into());
        }
        if !cursor.eat(b'=') {
            return Err(format!("missing tag value of tag {key:?}"));
        }
        let value = unescape(cursor.raw_name(b", ", KEY_ESCAPES), KEY_ESCAPES);
        if value.is_empty() {
            return Err(format!("missing tag value of tag {key:?}"));
        }
        tags.push((key, value));
    }
    if !cursor.done() {
        // The key ended at a space: only the fields can follow it.
        return Err("missing fields".into());
    }
    Ok((measurement, tags))
}

/// `raw` unescaped: a `\` before one of `escapes` stands for that character; any other `\`
/// is itself.
fn unescape<'a>(raw: &'a str, escapes: &[u8]) -> Cow<'a, str> {
    if !raw.contains('\\') {
        return Cow::Borrowed(raw);
    }
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let (mut at, mut copied) = (0, 0);
    while at < bytes.len() {
        if bytes[at] == b'\\'
            && let Some(next) = bytes.get(at + 1).filter(|b| escapes.contains(b))
        {
            out.push_str(&raw[copied..at]);
            out.push(char::from(*next));
            at += 2;
            copied = at;
            continue;
        }
        at += 1;
    }
    out.push_str(&raw[copied..]);
    Cow::Owned(out)
}

/// What a `\` escapes in tag keys, tag values and field keys.
const KEY_ESCAPES: &[u8] = b", =";

fn parse_timestamp(text: &str) -> Result<i64, String> {
    whole::<i64>(text, true)
        .ok_or_else(|| format!("invalid timestamp {text:?}: an integer is expected"))?
        .map_err(|_| format!("timestamp {text} is out of range"))
}

/// The number a field value stands for.
fn number(key: &str, text: &str) -> Result<f64, String> {
    let invalid = || format!("invalid value {text:?} of field {key:?}");
    match text {
        "t" | "T" | "true" | "True" | "TRUE" => return Ok(1.0),
        "f" | "F" | "false" | "False" | "FALSE" => return Ok(0.0),
        _ => {}
    }
    // Integers become the nearest double: exact up to 2^53, rounded beyond.
    if let Some(digits) = text.strip_suffix('i') {
        return whole::<i64>(digits, true)
            .ok_or_else(invalid)?
            .map(|value| value as f64)
            .map_err(|_| format!("integer {text} of field {key:?} is out of range"));
    }
    if let Some(digits) = text.strip_suffix('u') {
        return whole::<u64>(digits, false)
            .ok_or_else(invalid)?
            .map(|value| value as f64)
            .map_err(|_| format!("unsigned integer {text} of field {key:?} is out of range"));
    }
    // Rust also reads `inf`, `NaN` and `infinity`: line protocol has none of them.
    let float_like = text.bytes().any(|byte| byte.is_ascii_digit())
        && text
            .bytes()
            .all(|byte| byte.is_ascii_digit() || matches!(byte, b'.' | b'e' | b'E' | b'+' | b'-'));
    if !float_like {
        return Err(invalid());
    }
    let value: f64 = text.parse().map_err(|_| invalid())?;
    if !value.is_finite() {
        return Err(format!(
            "float {text} of field {key:?} is too large for a double"
        ));
    }
    Ok(value)
}

/// `digits` as a whole number: `None` if not digits (with a `-` first when `signed`), an
/// error if out of `T`'s range.
fn whole<T: std::str::FromStr>(digits: &str, signed: bool) -> Option<Result<T, T::Err>> {
    let unsigned = if signed {
        digits.strip_prefix('-').unwrap_or(digits)
    } else {
        digits
    };
    (!unsigned.is_empty() && unsigned.bytes().all(|byte| byte.is_ascii_digit()))
        .then(|| digits.parse())
}

/// A position in one line.
struct Cursor<'a> {
    bytes: &'a [u8],
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn rest(&self) -> &'a str {
        &self.text[self.at..]
    }

    fn eat(&mut self, byte: u8) -> bool {
        if self.bytes.get(self.at) == Some(&byte) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    /// Skips spaces and tabs; whether there were any.
    fn skip_spaces(&mut self) -> bool {
        let start = self.at;
        while matches!(self.bytes.get(self.at), Some(b' ' | b'\t')) {
            self.at += 1;
        }
        self.at > start
    }

    /// The text up to the first of `ends` (not consumed), as written: a `\` before one of
    /// `escapes` makes that character part of the text (see [`unescape`]).
    fn raw_name(&mut self, ends: &[u8], escapes: &[u8]) -> &'a str {
        let start = self.at;
        while let Some(&byte) = self.bytes.get(self.at) {
            if byte == b'\\'
                && self
                    .bytes
                    .get(self.at + 1)
                    .is_some_and(|b| escapes.contains(b))
            {
                self.at += 2;
                continue;
            }
            if ends.contains(&byte) {
                break;
            }
            self.at += 1;
        }
        &self.text[start..self.at]
    }

    /// The raw text up to the first of `ends` or the end of the line (not consumed).
    fn until(&mut self, ends: &[u8]) -> &'a str {
        let start = self.at;
        while self.bytes.get(self.at).is_some_and(|b| !ends.contains(b)) {
            self.at += 1;
        }
        &self.text[start..self.at]
    }

    /// A field value: a number or boolean, or a string, which is refused once read whole.
    fn field_value(&mut self, key: &str) -> Result<f64, String> {
        if self.eat(b'"') {
            loop {
                match self.bytes.get(self.at) {
                    None => return Err(format!("unterminated string value of field {key:?}")),
                    Some(b'\\') => self.at += 2,
                    Some(b'"') => break,
                    Some(_) => self.at += 1,
                }
            }
            return Err(format!(
                "field {key:?} is a string; fanline series hold numbers \
                 (floats, integers, booleans)"
            ));
        }
        let text = self.until(b", \t");
        if text.is_empty() {
            return Err(format!("missing field value of field {key:?}"));
        }
        number(key, text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: u64 = 639_000_000_000_000_000;

    fn now() -> Ticks {
        Ticks::new(NOW).expect("ticks")
    }

    fn parsed(text: &str) -> Vec<LineSeries> {
        parse(text, Precision::Nanoseconds, now()).expect("parses")
    }

    fn error(text: &str) -> LineError {
        parse(text, Precision::Nanoseconds, now()).expect_err("refused")
    }

    fn names(series: &[LineSeries]) -> Vec<&str> {
        series.iter().map(|one| one.name.as_str()).collect()
    }

    fn unix_ticks(seconds: u64) -> u64 {
        Ticks::from_unix_millis(0).get() + seconds * 10_000_000
    }

    #[test]
    fn each_field_of_a_line_is_one_series_named_with_its_sorted_tags() {
        let series =
            parsed("cpu,host=a,cpu=cpu0 usage_idle=99.5,usage_user=0.5 1700000000000000000");
        assert_eq!(
            names(&series),
            [
                "cpu.usage_idle,cpu=cpu0,host=a",
                "cpu.usage_user,cpu=cpu0,host=a"
            ]
        );
        assert_eq!(
            series[0].tags[..],
            [
                "cpu:cpu0",
                "host:a",
                "_measurement:cpu",
                "_field:usage_idle"
            ]
        );
        assert_eq!(
            series[0].points,
            [Point {
                at: unix_ticks(1_700_000_000),
                value: 99.5
            }]
        );
        assert_eq!(series[1].points[0].value, 0.5);
    }

    #[test]
    fn remembered_mappings_give_what_mapping_anew_gives() {
        // A text no other test writes, so its first parse maps every line anew.
        let text = "remembered,b=2,a=1 x=1,y=2 1000000000\n\
                    remembered,a=1,b=2 y=3,x=4 2000000000\n\
                    remembered,b=2,a=1  x=5 3000000000";
        let first = parsed(text);
        let again = parsed(text);
        assert_eq!(first, again);
        assert_eq!(
            names(&first),
            ["remembered.x,a=1,b=2", "remembered.y,a=1,b=2"],
            "tags in any order and any spacing name one series per field"
        );
        let values: Vec<f64> = first[0].points.iter().map(|point| point.value).collect();
        assert_eq!(values, [1.0, 4.0, 5.0]);
        assert_eq!(first[1].points.len(), 2);
        assert_eq!(
            first[1].tags[..],
            ["a:1", "b:2", "_measurement:remembered", "_field:y"]
        );
        // A bad line is refused every time, never remembered as good.
        for _ in 0..2 {
            let err = error("remembered,a=1,a=2 x=1");
            assert!(err.message.contains("appears twice"), "{err}");
        }
    }

    #[test]
    fn lines_of_one_series_gather_their_points_in_order() {
        let series = parsed("m,b=2,a=1 v=1 10\nm,a=1,b=2 v=2 5\nm v=3 7\n");
        assert_eq!(names(&series), ["m.v,a=1,b=2", "m.v"]);
        let first_lines: Vec<usize> = series.iter().map(|one| one.first_line).collect();
        assert_eq!(first_lines, [1, 3]);
        let values: Vec<f64> = series[0].points.iter().map(|point| point.value).collect();
        assert_eq!(values, [1.0, 2.0]);
    }

    #[test]
    fn every_value_type_but_string_becomes_a_double() {
        let series = parsed(
            "m a=1,b=-2.5e3,c=7i,d=-7i,e=18446744073709551615u,f=t,g=FALSE,h=True,i=.5,j=1E2",
        );
        let values: Vec<f64> = series.iter().map(|one| one.points[0].value).collect();
        assert_eq!(
            values,
            [
                1.0,
                -2500.0,
                7.0,
                -7.0,
                u64::MAX as f64,
                1.0,
                0.0,
                1.0,
                0.5,
                100.0
            ]
        );
        // Beyond 2^53 an integer rounds to the nearest double.
        let big = parsed("m v=9007199254740993i");
        assert_eq!(big[0].points[0].value, 9_007_199_254_740_992.0);
    }

    #[test]
    fn string_fields_are_refused_with_their_line() {
        let err = error("m v=1\n\nm s=\"a \\\"quoted\\\" text, with = signs\"\n");
        assert_eq!(err.line, 3);
        assert!(err.message.contains("string"), "{err}");
        assert_eq!(error("m s=\"open").line, 1);
    }

    #[test]
    fn escapes_are_read_and_the_name_escapes_what_would_end_a_part() {
        let series = parsed(r"my\ meas\,x.y,t\ k\=1=v\,a\ l k\=ey\,1=1 1");
        assert_eq!(
            series[0].name.as_str(),
            r"my meas\,x\.y.k\=ey\,1,t k\=1=v\,a l"
        );
        assert_eq!(
            series[0].tags[..],
            ["t k=1:v,a l", "_measurement:my meas,x.y", "_field:k=ey,1"]
        );
        // A backslash before anything else is itself, and doubled in the name.
        let series = parsed(r"a\b v\x=1");
        assert_eq!(series[0].name.as_str(), r"a\\b.v\\x");
    }

    #[test]
    fn dots_in_measurements_and_fields_never_make_two_series_one() {
        let series = parsed("a.b c=1\na b.c=2");
        assert_eq!(names(&series), [r"a\.b.c", "a.b.c"]);
    }

    #[test]
    fn blank_lines_comments_crlf_and_trailing_spaces_are_fine() {
        let series = parsed("# a comment\r\n\r\n  m v=1 1 \r\n\t\n# end");
        assert_eq!(names(&series), ["m.v"]);
        assert_eq!(series[0].points[0].at, Ticks::from_unix_millis(0).get());
    }

    #[test]
    fn a_line_without_a_timestamp_gets_now() {
        let series = parsed("m v=1");
        assert_eq!(series[0].points[0].at, NOW);
    }

    #[test]
    fn precisions_scale_the_timestamp_and_nanoseconds_round_down_to_ticks() {
        let at = |text: &str, precision: &str| {
            let precision = Precision::parse(precision).expect("precision");
            parse(text, precision, now()).expect("parses")[0].points[0].at
        };
        let second = unix_ticks(1_700_000_000);
        assert_eq!(at("m v=1 1700000000", "s"), second);
        assert_eq!(at("m v=1 1700000000000", "ms"), second);
        assert_eq!(at("m v=1 1700000000000000", "us"), second);
        assert_eq!(at("m v=1 1700000000000000099", "ns"), second);
        assert_eq!(at("m v=1 1700000000000000100", "ns"), second + 1);
        assert_eq!(at("m v=1 -1", "ns"), Ticks::from_unix_millis(0).get() - 1);
        assert_eq!(Precision::default(), Precision::Nanoseconds);
        assert!(Precision::parse("h").is_err());
        // Year 10000 is past fanline's range.
        let err = parse("m v=1 253402300800", Precision::Seconds, now()).expect_err("range");
        assert!(err.message.contains("outside"), "{err}");
    }

    #[test]
    fn malformed_lines_name_their_line_and_fault() {
        let cases = [
            ("m", "missing fields"),
            ("m ", "missing fields"),
            (",t=1 v=1", "missing measurement"),
            ("m,t v=1", "missing tag value"),
            // A fault in the key is named before one in the fields, as the line reads.
            ("m,t v", "missing tag value"),
            ("m,t= v=1", "missing tag value"),
            ("m,=1 v=1", "missing tag key"),
            ("m v", "missing field value"),
            ("m v=", "missing field value"),
            ("m =1", "missing field key"),
            ("m v=1,", "missing field key"),
            ("m v=abc", "invalid value"),
            ("m v=inf", "invalid value"),
            ("m v=NaN", "invalid value"),
            ("m v=1e999", "too large"),
            ("m v=1.5i", "invalid value"),
            ("m v=-1u", "invalid value"),
            ("m v=99999999999999999999i", "out of range"),
            ("m v=1 12x", "invalid timestamp"),
            ("m v=1 1 2", "unexpected text"),
            ("m,a=1,a=2 v=1", "appears twice"),
            ("m v=1 99999999999999999999", "out of range"),
            ("m\u{7} v=1", "control characters"),
        ];
        for (index, (line, expected)) in cases.into_iter().enumerate() {
            let text = format!("ok v=1\n{line}\nok v=2");
            let err = error(&text);
            assert_eq!(err.line, 2, "case {index}: {line:?}: {err}");
            assert!(
                err.message.contains(expected),
                "case {index}: {line:?}: {err}"
            );
        }
    }

    #[test]
    fn names_that_break_the_series_rules_are_refused_with_their_line() {
        let long = format!("m v=1\nm,k={} v=1", "x".repeat(300));
        let err = error(&long);
        assert_eq!(err.line, 2);
        assert!(err.message.contains("256"), "{err}");
        let err = error("m,k=a/../b v=1");
        assert!(err.message.contains("segments"), "{err}");
        let many: String = (0..31).map(|i| format!(",t{i}=x")).collect();
        let err = error(&format!("m{many} v=1"));
        assert!(err.message.contains("at most 30 tags"), "{err}");
    }

    /// The line-protocol text of a name part, escaped as a writer escapes it.
    fn lp_escape(text: &str, specials: &[char]) -> String {
        let mut out = String::new();
        for char in text.chars() {
            if specials.contains(&char) {
                out.push('\\');
            }
            out.push(char);
        }
        out
    }

    /// Printable parts with the characters that need escaping, no `\` (whose reading depends
    /// on the character after it) and not starting with `#`.
    fn part() -> impl Strategy<Value = String> {
        "[a-z0-9 ,=.é_/-]{1,8}".prop_filter("not a comment", |text| !text.starts_with('#'))
    }

    /// Measurement, tags, field.
    type SeriesKey = (String, Vec<(String, String)>, String);

    proptest! {
        #[test]
        fn any_text_is_parsed_or_refused_without_panicking(text in "\\PC{0,80}(\n\\PC{0,40}){0,3}") {
            let _ = parse(&text, Precision::Nanoseconds, now());
        }

        #[test]
        fn written_lines_read_back_as_one_series_per_distinct_measurement_tags_and_field(
            lines in proptest::collection::vec(
                (
                    part(),
                    proptest::collection::btree_map(part(), part(), 0..4),
                    proptest::collection::btree_map(part(), -1.0e6f64..1.0e6, 1..4),
                    proptest::option::of(0i64..4_000_000_000_000_000_000),
                ),
                1..6,
            )
        ) {
            let mut text = String::new();
            let mut expected: Vec<(SeriesKey, Vec<Point>)> = Vec::new();
            for (measurement, tags, fields, timestamp) in &lines {
                text.push_str(&lp_escape(measurement, &[',', ' ']));
                for (key, value) in tags {
                    text.push_str(&format!(
                        ",{}={}",
                        lp_escape(key, &[',', '=', ' ']),
                        lp_escape(value, &[',', '=', ' '])
                    ));
                }
                let rendered: Vec<String> = fields
                    .iter()
                    .map(|(key, value)| format!("{}={value:?}", lp_escape(key, &[',', '=', ' '])))
                    .collect();
                text.push(' ');
                text.push_str(&rendered.join(","));
                if let Some(timestamp) = timestamp {
                    text.push_str(&format!(" {timestamp}"));
                }
                text.push('\n');
                let at = timestamp.map_or(NOW, |ns| {
                    Ticks::from_unix_millis(0).get() + (ns / 100) as u64
                });
                let tag_list: Vec<(String, String)> = tags.clone().into_iter().collect();
                for (field, value) in fields {
                    let key = (measurement.clone(), tag_list.clone(), field.clone());
                    let point = Point { at, value: *value };
                    match expected.iter_mut().find(|(known, _)| *known == key) {
                        Some((_, points)) => points.push(point),
                        None => expected.push((key, vec![point])),
                    }
                }
            }
            let series = parse(&text, Precision::Nanoseconds, now());
            let series = match series {
                Ok(series) => series,
                // Only the series-name rules may refuse a well-written line.
                Err(err) => {
                    prop_assert!(err.message.contains("segments"), "{err}\n{text}");
                    return Ok(());
                }
            };
            prop_assert_eq!(series.len(), expected.len(), "{}", text);
            for (one, ((measurement, tags, field), points)) in series.iter().zip(&expected) {
                prop_assert_eq!(&one.points, points);
                let mut want: Vec<String> =
                    tags.iter().map(|(key, value)| format!("{key}:{value}")).collect();
                want.push(format!("_measurement:{measurement}"));
                want.push(format!("_field:{field}"));
                prop_assert_eq!(&one.tags[..], &want[..]);
            }
        }
    }
}
