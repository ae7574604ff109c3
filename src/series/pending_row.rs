//! The bytes of one journal row: the points one batch brings to some of the series of one
//! pending shard.
//!
//! A batch writes one row (more when large) per shard its series hash to, not one per series:
//! a write spanning 5,000 series is a few dozen appends, and a fold of a shard reads many
//! batches of many series in one query.
//!
//! `[entry]*`, each `[name length: u16 LE][name][points length: u32 LE][points]`, the points
//! as [`codec`] encodes a row with base 0. A series' points in one row are in time order;
//! a series may go on in the batch's next row.

use super::layout::markers_query;
use super::{Point, codec};
use crate::store::Item;

/// Worst-case bytes of one encoded point (a 10-byte time delta and 8 value bytes).
const POINT_BYTES: usize = 18;
/// Bytes an entry takes beyond its name and points.
const ENTRY_OVERHEAD: usize = 2 + 4 + 1 + 10;

/// Splits `series` (each one's points in time order) into rows of at most `row_bytes`
/// (worst case), a series' points going on in the next row when they do not fit.
pub fn encode_rows<'a>(
    series: impl IntoIterator<Item = (&'a str, &'a [Point])>,
    row_bytes: usize,
) -> Vec<Vec<u8>> {
    let mut rows = vec![Vec::new()];
    let mut room = row_bytes;
    for (name, mut points) in series {
        while !points.is_empty() {
            let fixed = ENTRY_OVERHEAD + name.len();
            let started = rows.last().is_some_and(|row| !row.is_empty());
            if room < fixed + POINT_BYTES && started {
                rows.push(Vec::new());
                room = row_bytes;
            }
            let take = points.len().min((room - fixed) / POINT_BYTES).max(1);
            let (now, later) = points.split_at(take);
            let encoded = codec::encode(0, now);
            let row = rows.last_mut().expect("rows start with one");
            row.extend_from_slice(&(name.len() as u16).to_le_bytes());
            row.extend_from_slice(name.as_bytes());
            row.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
            row.extend_from_slice(&encoded);
            room = room.saturating_sub(fixed + take * POINT_BYTES);
            points = later;
        }
    }
    rows
}

/// The entries of a row, in order: each series' name and its encoded points.
fn entries(row: &[u8]) -> impl Iterator<Item = Result<(&str, &[u8]), String>> {
    let mut rest = row;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let corrupt = || Err("corrupt journal row".to_owned());
        let Some((length, tail)) = rest.split_first_chunk::<2>() else {
            rest = &[];
            return Some(corrupt());
        };
        let length = usize::from(u16::from_le_bytes(*length));
        let Some((name, tail)) = tail.split_at_checked(length) else {
            rest = &[];
            return Some(corrupt());
        };
        let Some((size, tail)) = tail.split_first_chunk::<4>() else {
            rest = &[];
            return Some(corrupt());
        };
        let Some((points, tail)) = tail.split_at_checked(u32::from_le_bytes(*size) as usize) else {
            rest = &[];
            return Some(corrupt());
        };
        rest = tail;
        match std::str::from_utf8(name) {
            Ok(name) => Some(Ok((name, points))),
            Err(_) => {
                rest = &[];
                Some(corrupt())
            }
        }
    })
}

/// Every series of a row with its points.
pub fn decode(row: &[u8]) -> Result<Vec<(&str, Vec<Point>)>, String> {
    entries(row)
        .map(|entry| {
            let (name, points) = entry?;
            Ok((name, codec::decode(0, points)?))
        })
        .collect()
}

/// `series`' points in a row (empty when the row has none of them).
pub fn points_of(row: &[u8], series: &str) -> Result<Vec<Point>, String> {
    let mut found = Vec::new();
    for entry in entries(row) {
        let (name, points) = entry?;
        if name == series {
            found.extend(codec::decode(0, points)?);
        }
    }
    Ok(found)
}

/// Whether a row holds points of `series`.
pub fn mentions(row: &[u8], series: &str) -> bool {
    entries(row).any(|entry| entry.is_ok_and(|(name, _)| name == series))
}

/// Whether `rows`, a first page of `series`' shard (read with [`markers_query`]), may hold
/// batches for it not yet applied: a write must apply them first to come after them.
pub fn may_be_pending(series: &str, rows: &[Item]) -> bool {
    rows.len() >= markers_query(series).limit || rows.iter().any(|row| mentions(&row.value, series))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(count: u64) -> Vec<Point> {
        (0..count)
            .map(|at| Point {
                at: at * 10,
                value: at as f64,
            })
            .collect()
    }

    #[test]
    fn rows_hold_every_series_whole_and_in_order_however_they_split() {
        let a = points(3);
        let b = points(1000);
        let c = points(1);
        let series = [("a", &a[..]), ("bb", &b[..]), ("c", &c[..])];
        for row_bytes in [64, 1000, 4096, 1 << 20] {
            let rows = encode_rows(series, row_bytes);
            if row_bytes < 1 << 20 {
                assert!(rows.len() > 1, "{row_bytes}: split");
            }
            for row in &rows {
                assert!(row.len() <= row_bytes.max(64), "{row_bytes}: {}", row.len());
            }
            for (name, expected) in series {
                let mut got = Vec::new();
                for row in &rows {
                    got.extend(points_of(row, name).expect("row"));
                }
                assert_eq!(got, expected, "{name} at {row_bytes}");
            }
            let names: Vec<&str> = rows
                .iter()
                .flat_map(|row| decode(row).expect("row"))
                .map(|(name, _)| name)
                .collect();
            assert!(names.windows(2).all(|pair| pair[0] <= pair[1]));
            assert!(rows.iter().any(|row| mentions(row, "c")));
            assert!(!rows.iter().any(|row| mentions(row, "d")));
        }
    }

    #[test]
    fn a_cut_row_is_corrupt_not_a_panic() {
        let a = points(5);
        let row = encode_rows([("a", &a[..])], 4096).remove(0);
        for cut in 0..row.len() {
            let short = &row[..cut];
            if cut > 0 {
                assert!(decode(short).is_err(), "cut at {cut}");
            }
            let _ = points_of(short, "a");
            let _ = mentions(short, "a");
        }
    }
}
