//! Reading the latest value of a series: its latest record ([`super::latest`]), with the
//! points of journaled batches not yet folded overlaid, so a write is seen as soon as it
//! is answered.

use super::catalogue::SeriesList;
use super::journal;
use super::latest::{latest_key, stored_point};
use super::layout::{NAMES_PARTITION, markers_query};
use super::retention::{self, retention_key};
use super::scan::END_OF_TIME;
use super::{Point, Series, SeriesName};
use crate::keys::Ticks;
use crate::store::{Item, Key, Table};
use crate::timeline::{DomainError, DomainResult};

/// The latest value of one series, or of one of a listing.
#[derive(Clone, Debug, PartialEq)]
pub struct Latest {
    pub series: String,
    /// `None` when the series has no point, or none within its retention.
    pub point: Option<Point>,
}

/// A page of latest values, in name order.
#[derive(Debug)]
pub struct LatestPage {
    pub items: Vec<Latest>,
    pub next_cursor: Option<String>,
}

impl Series {
    /// The latest point of `series` within its retention; 404 for an unknown series. One
    /// query of its journal markers, then one batch read.
    ///
    /// Markers first: a fold deletes them in the transaction that writes the latest record,
    /// so a record read after them holds whatever they no longer show. Read at once (on a
    /// store without snapshots across reads), a fold landing between the two could hide its
    /// points from both.
    pub async fn latest(&self, series: &SeriesName) -> DomainResult<Latest> {
        let name = series.as_str();
        let markers = self.store.query(markers_query(name)).await?;
        let answers = self
            .store
            .get_many(vec![
                Key::new(Table::SeriesIndex, NAMES_PARTITION, name),
                latest_key(name),
                retention_key(name),
            ])
            .await?;
        let [listed, latest, own] = answers.as_slice() else {
            return Err(DomainError::Corrupt("a short batch read".into()));
        };
        let point = self
            .visible(name, latest.as_deref(), own.as_deref(), markers)
            .await?;
        // A series journaled but not yet folded is listed when it is.
        if listed.is_none() && point.is_none() {
            return Err(DomainError::NotFound(format!("no series {series}")));
        }
        Ok(Latest {
            series: name.to_owned(),
            point,
        })
    }

    /// The latest points of the series of one listing page (`start`, `tag`, `limit` and
    /// `cursor` as [`Series::list`] takes them): the page, then one batch read.
    pub async fn latest_listed(
        &self,
        start: Option<&str>,
        tag: Option<&str>,
        limit: usize,
        cursor: Option<&str>,
    ) -> DomainResult<LatestPage> {
        let SeriesList { items, next_cursor } = self.list(start, tag, limit, cursor).await?;
        let keys = items
            .iter()
            .flat_map(|name| [latest_key(name), retention_key(name)])
            .collect();
        let markers = items.iter().map(|name| markers_query(name)).collect();
        // Markers first, as for one series.
        let markers = self.store.query_many(markers).await?;
        let answers = self.store.get_many(keys).await?;
        let mut latest = Vec::with_capacity(items.len());
        for ((series, pair), markers) in items.into_iter().zip(answers.chunks_exact(2)).zip(markers)
        {
            let point = self
                .visible(&series, pair[0].as_deref(), pair[1].as_deref(), markers)
                .await?;
            latest.push(Latest { series, point });
        }
        Ok(LatestPage {
            items: latest,
            next_cursor,
        })
    }

    /// The newer of a stored latest record's point and the newest point of `series`'
    /// journaled batches not yet folded (which comes after the rows on a tie), unless it
    /// expired under the retention in force.
    async fn visible(
        &self,
        series: &str,
        latest: Option<&[u8]>,
        own: Option<&[u8]>,
        markers: Vec<Item>,
    ) -> DomainResult<Option<Point>> {
        let floor = retention::effective(own, self.default_retention)?.floor(Ticks::now().get());
        let stored = stored_point(latest)?;
        let pending = if markers.is_empty() {
            None
        } else {
            journal::pending_points(self.store.as_ref(), series, markers, floor, END_OF_TIME)
                .await?
                .pop()
        };
        let newest = match (stored, pending) {
            (Some(stored), Some(pending)) if stored.at > pending.at => Some(stored),
            (stored, None) => stored,
            (_, pending) => pending,
        };
        Ok(newest.filter(|point: &Point| point.at >= floor))
    }
}
