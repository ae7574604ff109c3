//! The bytes of one row of points.
//!
//! `[version 1][count: varint][count time deltas: varint][count values: f64 LE]`. The first
//! delta is from the row's key time, each next one from the point before, so at 1 Hz a time
//! costs 4 bytes and a point 12. Times are strictly increasing within a row. Values are kept
//! bit for bit.

use super::Point;

const VERSION: u8 = 1;

/// Encodes points sorted by strictly increasing time, none before `base`.
pub fn encode(base: u64, points: &[Point]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(1 + 10 + points.len() * 12);
    bytes.push(VERSION);
    put_varint(&mut bytes, points.len() as u64);
    let mut previous = base;
    for point in points {
        put_varint(&mut bytes, point.at - previous);
        previous = point.at;
    }
    for point in points {
        bytes.extend_from_slice(&point.value.to_le_bytes());
    }
    bytes
}

/// Decodes a row written by [`encode`] with the same `base`.
pub fn decode(base: u64, bytes: &[u8]) -> Result<Vec<Point>, String> {
    let corrupt = || "corrupt series row".to_owned();
    let (&version, mut rest) = bytes.split_first().ok_or_else(corrupt)?;
    if version != VERSION {
        return Err(corrupt());
    }
    let count =
        usize::try_from(take_varint(&mut rest).ok_or_else(corrupt)?).map_err(|_| corrupt())?;
    // Each point takes at least 9 bytes: a bogus count cannot make us allocate much.
    if count > rest.len() / 9 {
        return Err(corrupt());
    }
    let mut times = Vec::with_capacity(count);
    let mut previous = base;
    for index in 0..count {
        let delta = take_varint(&mut rest).ok_or_else(corrupt)?;
        if index > 0 && delta == 0 {
            return Err(corrupt());
        }
        previous = previous.checked_add(delta).ok_or_else(corrupt)?;
        times.push(previous);
    }
    if rest.len() != count * 8 {
        return Err(corrupt());
    }
    Ok(times
        .into_iter()
        .zip(rest.chunks_exact(8))
        .map(|(at, value)| Point {
            at,
            value: f64::from_le_bytes(value.try_into().unwrap_or_default()),
        })
        .collect())
}

pub(super) fn put_varint(bytes: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        bytes.push((value as u8) | 0x80);
        value >>= 7;
    }
    bytes.push(value as u8);
}

pub(super) fn take_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (index, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f).checked_shl(7 * index as u32)?;
        if byte & 0x80 == 0 {
            *bytes = &bytes[index + 1..];
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn rows_round_trip_bit_for_bit(
            base in 0u64..1 << 62,
            steps in proptest::collection::vec((1u64..1 << 40, any::<u64>()), 0..300),
        ) {
            let mut at = base;
            let points: Vec<Point> = steps
                .iter()
                .map(|(step, bits)| {
                    at += step;
                    Point { at, value: f64::from_bits(*bits) }
                })
                .collect();
            let bytes = encode(base, &points);
            let decoded = decode(base, &bytes).expect("decodes");
            prop_assert_eq!(decoded.len(), points.len());
            for (got, want) in decoded.iter().zip(&points) {
                prop_assert_eq!(got.at, want.at);
                prop_assert_eq!(got.value.to_bits(), want.value.to_bits());
            }
        }
    }

    #[test]
    fn a_point_a_second_costs_twelve_bytes() {
        let points: Vec<Point> = (1..=600)
            .map(|i| Point {
                at: i * 10_000_000,
                value: 20.5,
            })
            .collect();
        let bytes = encode(0, &points);
        assert_eq!(bytes.len(), 1 + 2 + 600 * 4 + 600 * 8);
    }

    #[test]
    fn truncated_rows_are_corrupt() {
        let points = [Point { at: 5, value: 1.0 }, Point { at: 9, value: 2.0 }];
        let bytes = encode(0, &points);
        for cut in 0..bytes.len() {
            assert!(decode(0, &bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
