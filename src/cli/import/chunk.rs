//! Chunking: consecutive lines of the file, grouped by series, as one atomic write within the
//! batch limits of [`crate::series::Series::write`] and the server's body limit (a chunk
//! posted with `--server` is a JSON body; its size is bounded before it is encoded).

use std::collections::HashMap;
use std::io::{Read, Seek};

use super::parse::{LineReader, Mark, ParsedLine};
use crate::series::{NewPoints, SeriesName};

/// JSON bytes one chunk may take as a request body: the server refuses series bodies over
/// 16 MiB, and a chunk of 200,000 points with long names and values can come close.
pub(super) const MAX_BODY_BYTES: usize = 15 * 1024 * 1024;
/// Most JSON bytes of one point: `{"at":"` + 28 characters of time + `","value":` + at most
/// 24 characters of number + `},`.
const POINT_BODY_BYTES: usize = 71;
/// JSON bytes around one series' escaped name and its points: `{"name":`, the name's quotes,
/// `,"points":[`, `]},`.
const SERIES_BODY_BYTES: usize = 24;
/// JSON bytes around all series: `{"series":[` and `]}`.
const ENVELOPE_BODY_BYTES: usize = 13;

/// Bounds of one chunk: the batch limits of a write, and the server's body limit.
#[derive(Clone, Copy, Debug)]
pub(super) struct ChunkLimits {
    pub(super) points: usize,
    pub(super) series: usize,
    pub(super) body_bytes: usize,
}

/// Points of consecutive lines, grouped by series: one atomic write.
#[derive(Debug)]
pub(super) struct Chunk {
    pub(super) batch: Vec<NewPoints>,
    /// Index in `batch` of each series.
    index: HashMap<SeriesName, usize>,
    pub(super) points: usize,
    /// Upper bound of the chunk's size as a JSON request body.
    pub(super) body_bytes: usize,
    pub(super) first_line: u64,
    /// Where the first line after the chunk starts: the resume point once it is written.
    pub(super) end: Mark,
}

impl Chunk {
    fn new(first_line: u64, end: Mark) -> Chunk {
        Chunk {
            batch: Vec::new(),
            index: HashMap::new(),
            points: 0,
            body_bytes: ENVELOPE_BODY_BYTES,
            first_line,
            end,
        }
    }

    /// Whether `line` fits within `limits`; any line fits in an empty chunk.
    fn fits(&self, line: &ParsedLine, limits: &ChunkLimits) -> bool {
        if self.points == 0 {
            return true;
        }
        if self.points >= limits.points {
            return false;
        }
        let known = self.index.contains_key(&line.series);
        if !known && self.index.len() >= limits.series {
            return false;
        }
        self.body_bytes + added_body_bytes(line, known) <= limits.body_bytes
    }

    fn push(&mut self, line: ParsedLine) {
        let known = self.index.get(&line.series).copied();
        self.body_bytes += added_body_bytes(&line, known.is_some());
        self.points += 1;
        self.end = line.end;
        match known {
            Some(index) => {
                if let Some(points) = self.batch.get_mut(index) {
                    points.points.push(line.point);
                }
            }
            None => {
                self.index.insert(line.series.clone(), self.batch.len());
                self.batch.push(NewPoints {
                    series: line.series,
                    points: vec![line.point],
                });
            }
        }
    }

    /// The number of the chunk's last line.
    pub(super) fn last_line(&self) -> u64 {
        self.end.next_line.saturating_sub(1)
    }
}

fn added_body_bytes(line: &ParsedLine, known_series: bool) -> usize {
    if known_series {
        return POINT_BODY_BYTES;
    }
    // JSON escapes `"` and `\` in two bytes and control characters in six.
    let name_bytes: usize = line
        .series
        .as_str()
        .chars()
        .map(|character| match character {
            '"' | '\\' => 2,
            character if character.is_control() => 6,
            character => character.len_utf8(),
        })
        .sum();
    POINT_BODY_BYTES + SERIES_BODY_BYTES + name_bytes
}

/// Reads the CSV file a chunk at a time.
pub(super) struct ChunkReader<R> {
    lines: LineReader<R>,
    limits: ChunkLimits,
    /// A line already read that did not fit in the last chunk: the first of the next.
    held_opt: Option<ParsedLine>,
}

impl<R: Read + Seek> ChunkReader<R> {
    /// A reader of `input` from `start` on.
    pub(super) fn new(input: R, limits: ChunkLimits, start: Mark) -> csv::Result<ChunkReader<R>> {
        Ok(ChunkReader {
            lines: LineReader::new(input, start)?,
            limits,
            held_opt: None,
        })
    }
}

impl<R: Read> ChunkReader<R> {
    /// The next chunk, or `None` at the end of the file. A bad line fails the chunk it falls
    /// in (chunks before it came back already), with an error naming the line.
    pub(super) fn next_chunk(&mut self) -> anyhow::Result<Option<Chunk>> {
        let mut chunk_opt: Option<Chunk> = None;
        loop {
            let line = match self.held_opt.take() {
                Some(line) => line,
                None => match self.lines.read_line()? {
                    Some(line) => line,
                    None => return Ok(chunk_opt),
                },
            };
            let chunk = chunk_opt.get_or_insert_with(|| Chunk::new(line.line, line.end));
            if !chunk.fits(&line, &self.limits) {
                self.held_opt = Some(line);
                return Ok(chunk_opt);
            }
            chunk.push(line);
            // A full chunk goes at once, so a bad line after it cannot hold it back.
            if chunk.points >= self.limits.points {
                return Ok(chunk_opt);
            }
        }
    }

    /// Where the reader stands (after the held line, if any).
    pub(super) fn mark(&self) -> Mark {
        self.lines.mark()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;
    use crate::cli::import::client::batch_body;
    use crate::series::{MAX_POINTS_PER_BATCH, MAX_SERIES_PER_BATCH};

    const SMALL: ChunkLimits = ChunkLimits {
        points: 1000,
        series: MAX_SERIES_PER_BATCH,
        body_bytes: MAX_BODY_BYTES,
    };

    fn start() -> Mark {
        Mark {
            offset: 0,
            next_line: 1,
        }
    }

    fn reader(text: &str, limits: ChunkLimits) -> ChunkReader<Cursor<Vec<u8>>> {
        ChunkReader::new(Cursor::new(text.as_bytes().to_vec()), limits, start()).expect("reader")
    }

    fn all_chunks(text: &str, limits: ChunkLimits) -> Vec<Chunk> {
        let mut chunks = reader(text, limits);
        let mut all = Vec::new();
        while let Some(chunk) = chunks.next_chunk().expect("chunk") {
            all.push(chunk);
        }
        all
    }

    fn names(chunk: &Chunk) -> Vec<&str> {
        chunk.batch.iter().map(|one| one.series.as_str()).collect()
    }

    /// `count` lines, one point each, of series `s0`, `s1`, ... cycling over `series`.
    fn lines(count: usize, series: usize) -> String {
        (0..count)
            .map(|index| {
                format!(
                    "s{},2026-01-01T00:00:{:02}Z,{index}\n",
                    index % series,
                    index % 60
                )
            })
            .collect()
    }

    #[test]
    fn a_bad_line_fails_only_its_own_chunk() {
        let text = format!("{}a,never,1\n{}", lines(5, 1), lines(2, 1));
        let limits = ChunkLimits { points: 2, ..SMALL };
        let mut chunks = reader(&text, limits);
        assert_eq!(
            chunks.next_chunk().expect("first").map(|c| c.points),
            Some(2)
        );
        assert_eq!(
            chunks.next_chunk().expect("second").map(|c| c.points),
            Some(2)
        );
        let err = chunks.next_chunk().expect_err("third holds line 6");
        assert!(err.to_string().starts_with("line 6:"), "{err}");
    }

    #[test]
    fn chunks_hold_at_most_the_point_limit_and_end_where_the_next_begins() {
        let text = lines(10, 3);
        let chunks = all_chunks(&text, ChunkLimits { points: 3, ..SMALL });
        let sizes: Vec<usize> = chunks.iter().map(|chunk| chunk.points).collect();
        assert_eq!(sizes, [3, 3, 3, 1]);
        let firsts: Vec<u64> = chunks.iter().map(|chunk| chunk.first_line).collect();
        assert_eq!(firsts, [1, 4, 7, 10]);
        for pair in chunks.windows(2) {
            assert_eq!(pair[0].end.next_line, pair[1].first_line);
        }
        assert_eq!(chunks[3].end.offset, text.len() as u64);
        let total: usize = chunks
            .iter()
            .flat_map(|chunk| &chunk.batch)
            .map(|one| one.points.len())
            .sum();
        assert_eq!(total, 10);
    }

    #[test]
    fn points_of_a_series_are_grouped_in_one_entry() {
        let chunks = all_chunks(&lines(9, 3), SMALL);
        assert_eq!(names(&chunks[0]), ["s0", "s1", "s2"]);
        assert!(chunks[0].batch.iter().all(|one| one.points.len() == 3));
    }

    #[test]
    fn a_chunk_ends_early_at_the_series_limit() {
        let count = MAX_SERIES_PER_BATCH + 5;
        let chunks = all_chunks(
            &lines(count, count),
            ChunkLimits {
                points: MAX_POINTS_PER_BATCH,
                ..SMALL
            },
        );
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0].batch.len(), MAX_SERIES_PER_BATCH);
        assert_eq!(chunks[1].batch.len(), 5);
        assert_eq!(chunks[1].first_line, MAX_SERIES_PER_BATCH as u64 + 1);
    }

    #[test]
    fn a_known_series_still_fits_at_the_series_limit() {
        let limits = ChunkLimits { series: 2, ..SMALL };
        let chunks = all_chunks(&lines(6, 2), limits);
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].points, 6);
        let chunks = all_chunks(&lines(6, 3), limits);
        let sizes: Vec<usize> = chunks.iter().map(|chunk| chunk.batch.len()).collect();
        assert_eq!(sizes, [2, 2, 2]);
    }

    #[test]
    fn a_chunk_ends_early_at_the_body_budget_and_the_budget_bounds_the_json() {
        let limits = ChunkLimits {
            body_bytes: 1000,
            ..SMALL
        };
        let chunks = all_chunks(&lines(100, 7), limits);
        assert!(chunks.len() > 1);
        for chunk in &chunks {
            assert!(chunk.body_bytes <= 1000);
            let json = batch_body(chunk).expect("json");
            assert!(
                json.len() <= chunk.body_bytes,
                "{} > {}",
                json.len(),
                chunk.body_bytes
            );
        }
    }

    #[test]
    fn the_body_estimate_covers_the_longest_numbers_and_escaped_names() {
        let name = format!("\"\\{}", "x".repeat(250));
        let text = format!(
            "{},9999-12-31T23:59:59.9999999Z,-2.2250738585072014e-308\n",
            csv_quote(&name)
        );
        let chunks = all_chunks(&text, SMALL);
        let json = batch_body(&chunks[0]).expect("json");
        assert!(json.len() <= chunks[0].body_bytes, "{}", json.len());
    }

    fn csv_quote(text: &str) -> String {
        format!("\"{}\"", text.replace('"', "\"\""))
    }

    #[test]
    fn a_reader_resumed_at_a_chunk_end_reads_the_next_lines_with_their_numbers() {
        let text = format!("series,time,value\n{}a,never,1\n", lines(4, 2));
        let limits = ChunkLimits { points: 2, ..SMALL };
        let first = reader(&text, limits)
            .next_chunk()
            .expect("chunk")
            .expect("some");
        assert_eq!(first.end.next_line, 4);
        let mut resumed =
            ChunkReader::new(Cursor::new(text.as_bytes().to_vec()), limits, first.end)
                .expect("seek");
        let second = resumed.next_chunk().expect("chunk").expect("some");
        assert_eq!(second.first_line, 4);
        assert_eq!(second.batch[0].points[0].value, 2.0);
        let err = resumed.next_chunk().expect_err("bad line");
        assert!(err.to_string().starts_with("line 6:"), "{err}");
    }

    #[test]
    fn the_end_mark_after_the_last_chunk_covers_trailing_blank_lines() {
        let text = "a,2026-01-01T00:00:00Z,1\n\n\n";
        let mut chunks = reader(text, SMALL);
        assert!(chunks.next_chunk().expect("chunk").is_some());
        assert!(chunks.next_chunk().expect("end").is_none());
        assert_eq!(chunks.mark().offset, text.len() as u64);
    }
}
