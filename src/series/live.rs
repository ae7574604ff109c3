//! Live tails of series: the points of each accepted write, told to the tails of that series
//! through [`Notices`], in any process.
//!
//! Points travel in the notice itself (16 bytes a point, in chunks of [`CHUNK`]), so a tail
//! reads nothing from the store; what a tail that fell behind missed is in the series, read
//! by range.

use bytes::{BufMut as _, Bytes, BytesMut};

use super::{Point, Series, SeriesName};
use crate::notices::{Notice, Notices, Subscription};
use crate::timeline::{DomainError, DomainResult};

/// Points a notice carries at most.
const CHUNK: usize = 1_000;
const POINT_BYTES: usize = 16;

/// The topic of a series' tails.
fn series_topic(series: &SeriesName) -> String {
    format!("series/{series}")
}

/// Tells the tails of `series` the points just written, oldest first.
pub(super) fn tell(notices: &Notices, series: &SeriesName, points: &[Point]) {
    let topic = series_topic(series);
    for chunk in points.chunks(CHUNK) {
        notices.publish(&topic, Notice::Message(encode(chunk)));
    }
}

fn encode(points: &[Point]) -> Bytes {
    let mut body = BytesMut::with_capacity(points.len() * POINT_BYTES);
    for point in points {
        body.put_u64(point.at);
        body.put_f64(point.value);
    }
    body.freeze()
}

/// `None` for a body that is not whole points (from a newer build): skipped.
fn decode(body: &[u8]) -> Option<Vec<Point>> {
    if !body.len().is_multiple_of(POINT_BYTES) {
        return None;
    }
    Some(
        body.chunks_exact(POINT_BYTES)
            .map(|chunk| {
                let mut at = [0u8; 8];
                let mut value = [0u8; 8];
                at.copy_from_slice(&chunk[..8]);
                value.copy_from_slice(&chunk[8..]);
                Point {
                    at: u64::from_be_bytes(at),
                    value: f64::from_be_bytes(value),
                }
            })
            .collect(),
    )
}

/// What a tail tells its client.
#[derive(Debug, PartialEq)]
pub enum TailEvent {
    /// The points of one accepted write (or of a part of a large one), oldest first.
    Points(Vec<Point>),
    /// Writes came faster than the tail could hold: some were dropped.
    Lagged,
}

/// One open live tail of a series.
pub struct SeriesTail {
    subscription: Subscription,
}

impl Series {
    /// Opens a live tail of `series`; a 404 for a series that does not exist. `inbox` bounds
    /// the writes a tail holds before it is lagged.
    pub async fn open_tail(&self, series: &SeriesName, inbox: usize) -> DomainResult<SeriesTail> {
        let mut subscription = self.notices.subscribe(inbox);
        subscription.watch(&series_topic(series));
        if !self.exists(series).await? {
            return Err(DomainError::NotFound(format!("no series {series}")));
        }
        Ok(SeriesTail { subscription })
    }
}

impl SeriesTail {
    /// Waits until a write is told. Cancel-safe.
    pub async fn wait(&self) {
        self.subscription.wait().await;
    }

    /// The writes told since the last call, oldest first; a lagged tail gets only
    /// [`TailEvent::Lagged`].
    pub fn take(&self) -> Vec<TailEvent> {
        let pending = self.subscription.take();
        if pending.lagged {
            return vec![TailEvent::Lagged];
        }
        pending
            .messages
            .iter()
            .filter_map(|(_, body)| decode(body))
            .map(TailEvent::Points)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_told_in_chunks_that_decode_to_what_was_written() {
        let notices = Notices::local();
        let name = SeriesName::parse("room/1").expect("name");
        let mut subscription = notices.subscribe(16);
        subscription.watch(&series_topic(&name));
        let tail = SeriesTail { subscription };
        let points: Vec<Point> = (0..2_500u64)
            .map(|at| Point {
                at,
                value: at as f64 / 4.0,
            })
            .collect();
        tell(&notices, &name, &points);
        let events = tail.take();
        assert_eq!(events.len(), 3);
        let told: Vec<Point> = events
            .into_iter()
            .flat_map(|event| match event {
                TailEvent::Points(points) => points,
                TailEvent::Lagged => panic!("not lagged"),
            })
            .collect();
        assert_eq!(told, points);
        assert_eq!(decode(b"short"), None);
    }
}
