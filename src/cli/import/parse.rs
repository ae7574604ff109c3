//! CSV parsing: `series,time,value` lines, each as a point of a series with its line number
//! and the place where the line after it starts. A first line `series,time,value` (with or
//! without a byte-order mark) is a header; an error names the line and what is wrong.

use std::io::{Read, Seek};

use anyhow::anyhow;

use crate::keys::Ticks;
use crate::series::{Point, SeriesName};

/// A place in the file between two lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Mark {
    pub(super) offset: u64,
    /// Number (1-based) of the line that starts at `offset`.
    pub(super) next_line: u64,
}

impl Mark {
    fn of(position: &csv::Position) -> Mark {
        Mark {
            offset: position.byte(),
            next_line: position.line(),
        }
    }
}

/// One data line, parsed.
#[derive(Debug)]
pub(super) struct ParsedLine {
    pub(super) series: SeriesName,
    pub(super) point: Point,
    pub(super) line: u64,
    /// Where the line after it starts.
    pub(super) end: Mark,
}

/// Reads the data lines of a CSV file, one at a time.
pub(super) struct LineReader<R> {
    reader: csv::Reader<R>,
    record: csv::StringRecord,
    /// Only the file's first line may be a header (or start with a byte-order mark).
    at_file_start: bool,
}

impl<R: Read + Seek> LineReader<R> {
    /// A reader of `input` from `start` on.
    pub(super) fn new(input: R, start: Mark) -> csv::Result<LineReader<R>> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            // Field counts are checked per line, so the error can name the line.
            .flexible(true)
            .trim(csv::Trim::All)
            .from_reader(input);
        if start.offset > 0 {
            let mut position = csv::Position::new();
            position.set_byte(start.offset).set_line(start.next_line);
            reader.seek(position)?;
        }
        Ok(LineReader {
            reader,
            record: csv::StringRecord::new(),
            at_file_start: start.offset == 0,
        })
    }
}

impl<R: Read> LineReader<R> {
    /// Where the reader stands: after the last line read.
    pub(super) fn mark(&self) -> Mark {
        Mark::of(self.reader.position())
    }

    /// The next data line, skipping a header; `None` at the end of the file.
    pub(super) fn read_line(&mut self) -> anyhow::Result<Option<ParsedLine>> {
        loop {
            let more = self
                .reader
                .read_record(&mut self.record)
                .map_err(csv_error)?;
            if !more {
                return Ok(None);
            }
            let line = self.record.position().map_or(0, csv::Position::line);
            let at_file_start = std::mem::replace(&mut self.at_file_start, false);
            if at_file_start && is_header(&self.record) {
                continue;
            }
            let (series, point) = parse_record(&self.record, at_file_start)
                .map_err(|message| anyhow!("line {line}: {message}"))?;
            return Ok(Some(ParsedLine {
                series,
                point,
                line,
                end: Mark::of(self.reader.position()),
            }));
        }
    }
}

fn csv_error(err: csv::Error) -> anyhow::Error {
    let line_opt = err.position().map(csv::Position::line);
    match (err.kind(), line_opt) {
        (csv::ErrorKind::Utf8 { .. }, Some(line)) => anyhow!("line {line}: not valid UTF-8"),
        (_, Some(line)) => anyhow!("line {line}: {err}"),
        (_, None) => anyhow::Error::new(err).context("failed to read the CSV file"),
    }
}

fn is_header(record: &csv::StringRecord) -> bool {
    let fields: Vec<&str> = record
        .iter()
        .map(|field| field.trim_start_matches('\u{feff}'))
        .collect();
    fields.len() == 3
        && fields
            .iter()
            .zip(["series", "time", "value"])
            .all(|(field, name)| field.eq_ignore_ascii_case(name))
}

/// `series,time,value` as a point; the error says what is wrong, without the line number.
fn parse_record(
    record: &csv::StringRecord,
    at_file_start: bool,
) -> Result<(SeriesName, Point), String> {
    let (Some(raw_name), Some(time), Some(value_text), None) =
        (record.get(0), record.get(1), record.get(2), record.get(3))
    else {
        return Err(format!(
            "expected 3 fields (series,time,value), found {}",
            record.len()
        ));
    };
    let name = if at_file_start {
        raw_name.trim_start_matches('\u{feff}')
    } else {
        raw_name
    };
    let series = SeriesName::parse(name)
        .map_err(|message| format!("invalid series name {name:?}: {message}"))?;
    let at = Ticks::parse_rfc3339(time)
        .map_err(|err| format!("invalid time {time:?}: {err}"))?
        .get();
    let value: f64 = value_text
        .parse()
        .map_err(|_| format!("invalid value {value_text:?}: not a number"))?;
    if !value.is_finite() {
        return Err(format!(
            "invalid value {value_text:?}: values must be finite"
        ));
    }
    Ok((series, Point { at, value }))
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    fn start() -> Mark {
        Mark {
            offset: 0,
            next_line: 1,
        }
    }

    fn reader(text: &str) -> LineReader<Cursor<Vec<u8>>> {
        LineReader::new(Cursor::new(text.as_bytes().to_vec()), start()).expect("reader")
    }

    fn all_lines(text: &str) -> Vec<ParsedLine> {
        let mut lines = reader(text);
        let mut all = Vec::new();
        while let Some(line) = lines.read_line().expect("line") {
            all.push(line);
        }
        all
    }

    fn ticks(text: &str) -> u64 {
        Ticks::parse_rfc3339(text).expect("time").get()
    }

    #[test]
    fn the_header_is_skipped_and_quoted_names_keep_their_commas() {
        let header = "\u{feff}series,time,value\n";
        let first = "\"plant 1, line 2\",2026-01-02T03:04:05Z,1.5\n";
        let text = format!("{header}{first}b,2026-01-02T03:04:06.5Z,-2\n");
        let lines = all_lines(&text);
        let names: Vec<&str> = lines.iter().map(|line| line.series.as_str()).collect();
        assert_eq!(names, ["plant 1, line 2", "b"]);
        assert_eq!(
            lines[0].point,
            Point {
                at: ticks("2026-01-02T03:04:05Z"),
                value: 1.5
            }
        );
        assert_eq!(lines[1].point.at, ticks("2026-01-02T03:04:06.5Z"));
        assert_eq!(lines[1].point.value, -2.0);
        let numbers: Vec<u64> = lines.iter().map(|line| line.line).collect();
        assert_eq!(numbers, [2, 3]);
        assert_eq!(
            lines[0].end,
            Mark {
                offset: (header.len() + first.len()) as u64,
                next_line: 3
            }
        );
        assert_eq!(
            lines[1].end,
            Mark {
                offset: text.len() as u64,
                next_line: 4
            }
        );
    }

    #[test]
    fn a_file_without_header_keeps_its_first_line() {
        let lines = all_lines("a,2026-01-01T00:00:00Z,1\n");
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].line, 1);
    }

    #[test]
    fn a_header_later_than_the_first_line_is_a_bad_line() {
        let mut lines = reader("a,2026-01-01T00:00:00Z,1\nseries,time,value\n");
        assert!(lines.read_line().expect("first").is_some());
        let err = lines.read_line().expect_err("bad line");
        assert!(err.to_string().starts_with("line 2: invalid time"), "{err}");
    }

    #[test]
    fn a_bad_line_names_its_line_number_and_what_is_wrong() {
        let cases = [
            ("a,2026-01-01T00:00:00Z\n", "line 3: expected 3 fields"),
            ("a,2026-01-01T00:00:00Z,1,2\n", "line 3: expected 3 fields"),
            ("a,yesterday,1\n", "line 3: invalid time \"yesterday\""),
            (
                "a,2026-01-01T00:00:00Z,NaN\n",
                "line 3: invalid value \"NaN\": values must be finite",
            ),
            (
                "a,2026-01-01T00:00:00Z,inf\n",
                "line 3: invalid value \"inf\": values must be finite",
            ),
            (
                "a,2026-01-01T00:00:00Z,1.2.3\n",
                "line 3: invalid value \"1.2.3\": not a number",
            ),
            (
                "\"\",2026-01-01T00:00:00Z,1\n",
                "line 3: invalid series name \"\"",
            ),
            ("a,2026-01-01T00:00:00Z,\u{ff}\n", "line 3: invalid value"),
        ];
        for (bad, expected) in cases {
            let text = format!("series,time,value\nok,2026-01-01T00:00:00Z,1\n{bad}");
            let mut lines = reader(&text);
            assert!(lines.read_line().expect("the good line").is_some());
            let err = lines.read_line().expect_err(bad);
            assert!(err.to_string().starts_with(expected), "{bad:?} gave {err}");
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_name_their_line() {
        let mut text = b"a,2026-01-01T00:00:00Z,1\n".to_vec();
        text.extend_from_slice(b"\xff\xfe,2026-01-01T00:00:00Z,1\n");
        let mut lines = LineReader::new(Cursor::new(text), start()).expect("reader");
        assert!(lines.read_line().expect("the good line").is_some());
        let err = lines.read_line().expect_err("not UTF-8");
        assert_eq!(err.to_string(), "line 2: not valid UTF-8");
    }

    #[test]
    fn the_end_mark_covers_trailing_blank_lines() {
        let text = "a,2026-01-01T00:00:00Z,1\n\n\n";
        let mut lines = reader(text);
        assert!(lines.read_line().expect("line").is_some());
        assert!(lines.read_line().expect("end").is_none());
        assert_eq!(lines.mark().offset, text.len() as u64);
    }
}
