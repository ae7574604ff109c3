//! A message's points: its payload read as the JSON body of
//! `POST /v1/series/{series}/points` (for the topic's series) or, when it is not JSON, as
//! InfluxDB line protocol. Everything the domain would refuse is refused here, per message,
//! so that one bad message never fails the batch it is written with.

use serde::Deserialize;

use crate::keys::{MAX_TICKS, Ticks};
use crate::series::{
    MAX_POINTS_PER_BATCH, MAX_POINTS_PER_SERIES_WRITE, NewPoints, Point, SeriesName,
};

/// Largest payload read, as the HTTP API's largest series body.
pub const MAX_PAYLOAD_BYTES: usize = 16 * 1024 * 1024;

/// Why a message can never be written: it is acknowledged, counted and dropped.
#[derive(Debug, PartialEq, Eq)]
pub struct Invalid(pub String);

/// The JSON body of a write to one series.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PointsBody {
    points: Vec<PointBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PointBody {
    at: String,
    value: f64,
}

/// The points of one message published on a topic whose series level is `series`.
pub fn decode(series: &str, payload: &[u8]) -> Result<Vec<NewPoints>, Invalid> {
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(Invalid(format!(
            "the payload is {} bytes, more than {MAX_PAYLOAD_BYTES}",
            payload.len()
        )));
    }
    let text =
        std::str::from_utf8(payload).map_err(|_| Invalid("the payload is not UTF-8".to_owned()))?;
    if text.trim_start().starts_with('{') {
        decode_json(series, text)
    } else {
        decode_lines(series, text)
    }
}

fn series_name(text: &str) -> Result<SeriesName, Invalid> {
    SeriesName::parse(text).map_err(|message| Invalid(format!("series {text:?}: {message}")))
}

fn decode_json(series: &str, text: &str) -> Result<Vec<NewPoints>, Invalid> {
    let series = series_name(series)?;
    let body: PointsBody = serde_json::from_str(text)
        .map_err(|err| Invalid(format!("not a JSON points body: {err}")))?;
    if body.points.len() > MAX_POINTS_PER_SERIES_WRITE {
        return Err(Invalid(format!(
            "a message holds at most {MAX_POINTS_PER_SERIES_WRITE} points"
        )));
    }
    let points = body
        .points
        .into_iter()
        .enumerate()
        .map(|(index, point)| {
            let at = Ticks::parse_rfc3339(&point.at)
                .map_err(|err| Invalid(format!("points[{index}].at: {err}")))?;
            checked_point(at.get(), point.value)
                .map_err(|message| Invalid(format!("points[{index}]: {message}")))
        })
        .collect::<Result<Vec<Point>, Invalid>>()?;
    Ok(vec![NewPoints { series, points }])
}

/// A point the domain accepts: a finite value at a time in range.
fn checked_point(at: u64, value: f64) -> Result<Point, String> {
    if !value.is_finite() {
        return Err("values must be finite numbers".to_owned());
    }
    if at > MAX_TICKS {
        return Err("times must lie between years 1 and 9999".to_owned());
    }
    Ok(Point { at, value })
}

/// Line protocol is not read yet: the parser comes with `POST /api/v2/write`.
fn decode_lines(_series: &str, _text: &str) -> Result<Vec<NewPoints>, Invalid> {
    let _ = MAX_POINTS_PER_BATCH;
    Err(Invalid(
        "not JSON, and line protocol is not supported yet".to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_body_gives_the_points_of_the_topic_series() {
        let written = decode(
            "room-1",
            br#"{"points":[{"at":"2026-01-01T00:00:00Z","value":1.5},{"at":"2026-01-01T00:00:01Z","value":-2}]}"#,
        )
        .expect("valid");
        assert_eq!(written.len(), 1);
        assert_eq!(written[0].series.as_str(), "room-1");
        let origin = Ticks::parse_rfc3339("2026-01-01T00:00:00Z")
            .expect("time")
            .get();
        assert_eq!(
            written[0].points,
            [
                Point {
                    at: origin,
                    value: 1.5
                },
                Point {
                    at: origin + 10_000_000,
                    value: -2.0
                }
            ]
        );
    }

    #[test]
    fn bad_json_messages_say_why() {
        let cases: [(&str, &[u8], &str); 6] = [
            (
                "s",
                br#"{"points":[{"at":"yesterday","value":1}]}"#,
                "points[0].at",
            ),
            (
                "s",
                br#"{"points":[{"at":"2026-01-01T00:00:00Z","value":"x"}]}"#,
                "not a JSON",
            ),
            ("s", br#"{"points":[],"extra":1}"#, "not a JSON"),
            (
                "s",
                br#"{"points":[{"at":"2026-01-01T00:00:00Z","value":1e999}]}"#,
                "not a JSON",
            ),
            ("", br#"{"points":[]}"#, "series"),
            ("s", b"\xff\xfe", "UTF-8"),
        ];
        for (series, payload, expected) in cases {
            let Invalid(message) = decode(series, payload).expect_err(expected);
            assert!(
                message.contains(expected),
                "{message} should say {expected}"
            );
        }
    }
}
