//! A message's points: its payload read as the JSON body of
//! `POST /v1/series/{series}/points` (for the topic's series) or, when it is not JSON, as
//! InfluxDB line protocol. Everything the domain would refuse is refused here, per message,
//! so that one bad message never fails the batch it is written with.
//!
//! Line protocol maps each line to series as `POST /api/v2/write` does
//! ([`crate::series::line_protocol`]), at nanosecond precision, within the topic's scope:
//! every series a message maps to must be the topic's series or one under it (its name
//! followed by `.` or `,`), so `fanline/series/cpu/points` takes any line of measurement
//! `cpu`, and the broker's topic ACLs say who may write what. Every line needs a timestamp:
//! a message comes again after a crash, and a line stamped on arrival would then write its
//! point twice, at two times.

use std::sync::Arc;

use serde::Deserialize;

use crate::keys::{MAX_TICKS, Ticks};
use crate::series::line_protocol::{self, Precision};
use crate::series::{
    MAX_POINTS_PER_BATCH, MAX_POINTS_PER_SERIES_WRITE, MAX_SERIES_PER_BATCH, NewPoints, Point,
    SeriesName,
};

/// Largest payload read, as the HTTP API's largest series body.
pub const MAX_PAYLOAD_BYTES: usize = 16 * 1024 * 1024;

/// What a message writes: points, and the tags its series carry (line protocol only; they
/// are added to those the series has).
#[derive(Debug, Default)]
pub struct Decoded {
    pub writes: Vec<NewPoints>,
    pub tags: Vec<(SeriesName, Arc<[String]>)>,
}

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
pub fn decode(series: &str, payload: &[u8]) -> Result<Decoded, Invalid> {
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

fn decode_json(series: &str, text: &str) -> Result<Decoded, Invalid> {
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
    Ok(Decoded {
        writes: vec![NewPoints { series, points }],
        tags: Vec::new(),
    })
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

/// The series of line protocol `text`, every one of them in the scope of `topic_series`.
fn decode_lines(topic_series: &str, text: &str) -> Result<Decoded, Invalid> {
    // A line without a timestamp gets `now`: the greatest time, which no nanosecond
    // timestamp reaches (an i64 of them ends in 2262), marks it.
    let lines = line_protocol::parse(text, Precision::Nanoseconds, Ticks::MAX)
        .map_err(|err| Invalid(format!("not JSON, nor line protocol: {err}")))?;
    if lines.is_empty() {
        return Err(Invalid("no points: the payload is empty".to_owned()));
    }
    if lines.len() > MAX_SERIES_PER_BATCH {
        return Err(Invalid(format!(
            "a message writes at most {MAX_SERIES_PER_BATCH} series"
        )));
    }
    let points: usize = lines.iter().map(|one| one.points.len()).sum();
    if points > MAX_POINTS_PER_BATCH {
        return Err(Invalid(format!(
            "a message holds at most {MAX_POINTS_PER_BATCH} points"
        )));
    }
    let mut decoded = Decoded::default();
    for one in lines {
        if !in_scope(topic_series, one.name.as_str()) {
            return Err(Invalid(format!(
                "line {} maps to series {:?}, outside the topic's series {topic_series:?} \
                 (which takes {topic_series:?} and the series named after it with . or ,)",
                one.first_line,
                one.name.as_str()
            )));
        }
        if one.points.iter().any(|point| point.at == MAX_TICKS) {
            return Err(Invalid(
                "a line has no timestamp: over MQTT every line needs one, or a message \
                 sent again would write its points a second time"
                    .to_owned(),
            ));
        }
        for point in &one.points {
            checked_point(point.at, point.value).map_err(Invalid)?;
        }
        decoded.tags.push((one.name.clone(), one.tags));
        decoded.writes.push(NewPoints {
            series: one.name,
            points: one.points,
        });
    }
    Ok(decoded)
}

/// Whether `series` is the topic's series or one under it.
fn in_scope(topic_series: &str, series: &str) -> bool {
    match series.strip_prefix(topic_series) {
        Some(rest) => rest.is_empty() || rest.starts_with(['.', ',']),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_body_gives_the_points_of_the_topic_series() {
        let Decoded { writes: written, tags } = decode(
            "room-1",
            br#"{"points":[{"at":"2026-01-01T00:00:00Z","value":1.5},{"at":"2026-01-01T00:00:01Z","value":-2}]}"#,
        )
        .expect("valid");
        assert!(tags.is_empty());
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
    fn line_protocol_goes_to_the_mapped_series_within_the_topic_scope() {
        let text = "cpu,host=a usage_idle=99.5,usage_user=0.5 1767225600000000000\n\
                    cpu,host=a usage_idle=98 1767225601000000000\n";
        let origin = Ticks::parse_rfc3339("2026-01-01T00:00:00Z")
            .expect("time")
            .get();
        for scope in ["cpu", "cpu.usage_idle,host=a"] {
            let writes = decode(scope, text.as_bytes());
            if scope != "cpu" {
                let Invalid(message) = writes.expect_err("usage_user is outside");
                assert!(message.contains("outside the topic"), "{message}");
                continue;
            }
            let Decoded { writes, tags } = writes.expect("valid");
            assert_eq!(tags[0].0.as_str(), "cpu.usage_idle,host=a");
            assert_eq!(
                tags[0].1[..],
                ["host:a", "_measurement:cpu", "_field:usage_idle"]
            );
            let names: Vec<&str> = writes.iter().map(|one| one.series.as_str()).collect();
            assert_eq!(names, ["cpu.usage_idle,host=a", "cpu.usage_user,host=a"]);
            assert_eq!(
                writes[0].points,
                [
                    Point {
                        at: origin,
                        value: 99.5
                    },
                    Point {
                        at: origin + 10_000_000,
                        value: 98.0
                    }
                ]
            );
        }
        assert!(in_scope("cpu", "cpu.x"));
        assert!(in_scope("cpu.x", "cpu.x,host=a"));
        assert!(!in_scope("cpu", "cpus.x"));
        assert!(!in_scope("cpu", "cpu\\.x.y"));
    }

    #[test]
    fn bad_line_protocol_messages_say_why() {
        let cases: [(&str, &str); 4] = [
            ("cpu usage=1", "no timestamp"),
            ("cpu usage=\"text\" 1", "line 1"),
            ("cpu usage=1 1\nmem,host=a used=2 1", "outside the topic"),
            ("\n# nothing\n", "no points"),
        ];
        for (text, expected) in cases {
            let Invalid(message) = decode("cpu", text.as_bytes()).expect_err(expected);
            assert!(
                message.contains(expected),
                "{message} should say {expected}"
            );
        }
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
