//! The `readings` event: what a write brought to one series, posted on the series' log and
//! fanned out to its subscribers like any post.

use serde::Serialize;
use serde_json::value::RawValue;
use sha2::{Digest as _, Sha256};
use uuid::Uuid;

use super::{Point, SeriesName};
use crate::keys::{Ticks, event_row_key};
use crate::timeline::{DomainError, DomainResult, Event, SubjectId};

/// The event kind of a series write.
pub const READINGS_KIND: &str = "readings";

/// The payload of a `readings` event.
#[derive(Serialize)]
struct Readings<'a> {
    series: &'a str,
    count: usize,
    first: String,
    last: String,
    last_value: f64,
    min: f64,
    max: f64,
}

/// The `readings` event announcing `points` (sorted by time, not empty) on `series`,
/// received at `received`, under `event_id`.
pub fn readings_event(
    series: &str,
    points: &[Point],
    received: Ticks,
    event_id: Uuid,
) -> DomainResult<Event> {
    let author = SubjectId::parse(series).map_err(DomainError::Corrupt)?;
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return Err(DomainError::Corrupt("an empty series write".into()));
    };
    let (min, max) = points
        .iter()
        .fold((f64::MAX, f64::MIN), |(min, max), point| {
            (min.min(point.value), max.max(point.value))
        });
    let payload = serde_json::to_string(&Readings {
        series,
        count: points.len(),
        first: Ticks::clamped(first.at).to_string(),
        last: Ticks::clamped(last.at).to_string(),
        last_value: last.value,
        min,
        max,
    })
    .map_err(|err| DomainError::Corrupt(err.to_string()))?;
    Ok(Event {
        event_id,
        author,
        kind: READINGS_KIND.to_owned(),
        payload: RawValue::from_string(payload)
            .map_err(|err| DomainError::Corrupt(err.to_string()))?,
        at: received,
        row_key: event_row_key(received, event_id),
        version: 1,
        edited_at: None,
        fanout: true,
    })
}

/// The event of a write made now, under a new id.
pub fn new_readings_event(series: &SeriesName, points: &[Point]) -> DomainResult<Event> {
    readings_event(series.as_str(), points, Ticks::now(), Uuid::now_v7())
}

/// The id of the event that announces the points of journaled batches of `series` folded
/// together, the oldest being `first_batch` (a UUIDv7). The same fold always gets the same
/// id, so a retried fold posts its event once; two series never share one. It keeps the
/// batch's time, so ids still sort as the events were received.
pub fn folded_event_id(series: &str, first_batch: Uuid) -> Uuid {
    let mut bytes = *first_batch.as_bytes();
    let digest = Sha256::digest(series.as_bytes());
    // Bytes 8..16 are random in a UUIDv7 but for the variant's top bits: mixed with the
    // series, the variant kept.
    for (byte, mixed) in bytes[8..].iter_mut().zip(&digest[..8]) {
        *byte ^= mixed;
    }
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    Uuid::from_bytes(bytes)
}

/// When batch `id` (a UUIDv7) was created.
pub fn batch_time(id: Uuid) -> Ticks {
    let millis = id.get_timestamp().map_or(0, |stamp| {
        let (seconds, nanos) = stamp.to_unix();
        seconds * 1000 + u64::from(nanos) / 1_000_000
    });
    Ticks::from_unix_millis(i64::try_from(millis).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folds_event_id_is_the_same_for_one_series_and_batch_and_differs_across_series() {
        let batch = Uuid::now_v7();
        let one = folded_event_id("a", batch);
        assert_eq!(one, folded_event_id("a", batch));
        assert_ne!(one, folded_event_id("b", batch));
        assert_eq!(one.get_version_num(), 7);
        assert_eq!(one.get_timestamp(), batch.get_timestamp());
    }

    #[test]
    fn a_batchs_time_is_its_ids() {
        let batch = Uuid::now_v7();
        let now = Ticks::now().unix_millis();
        assert!((batch_time(batch).unix_millis() - now).abs() < 1000);
    }
}
