//! The series catalogue: the names of all series, in order, and each series' tags, with an
//! index from tag to series so a listing by tag is one partition read.
//!
//! In `seriesIndex`: `names` -> series; `meta/{series}` -> `tags` (the set, JSON); and
//! `tag/{tag}` -> series. A tag change rewrites the set under a compare-and-swap in the
//! same transaction as its index rows, so concurrent changes never leave the index and the
//! set disagreeing. A store that cannot commit them at once takes them in steps that may
//! leave a row of a tag the series lacks, never miss one: its listings by tag check the
//! sets (see `change_in_steps`).

use bytes::Bytes;

use super::layout::NAMES_PARTITION;
use super::{MAX_TAG_BYTES, MAX_TAGS, Series, SeriesName};
use futures::{StreamExt as _, TryStreamExt as _};

use crate::store::{Condition, Item, Key, Query, StoreError, StoreExt as _, Table, Write};
use crate::timeline::{DomainError, DomainResult, check_printable};

/// Most names in one listing page, and the default.
pub const MAX_LIST_PAGE: usize = 1000;
pub const DEFAULT_LIST_PAGE: usize = 100;
const TAGS_ROW: &str = "tags";
const MAX_ATTEMPTS: u32 = 8;
/// Series tagged at once, at most, when a write adds tags.
const TAG_UPDATES_IN_FLIGHT: usize = 32;

pub fn meta_partition(series: &str) -> String {
    format!("meta/{series}")
}

pub fn tag_partition(tag: &str) -> String {
    format!("tag/{tag}")
}

/// A page of series names.
#[derive(Debug)]
pub struct SeriesList {
    pub items: Vec<String>,
    pub next_cursor: Option<String>,
}

/// The write that lists `series` in the catalogue.
pub fn register(series: &str) -> Write {
    Write::put(
        Table::SeriesIndex,
        Item::new(NAMES_PARTITION, series, Bytes::new()),
    )
}

fn decode_tags(body: &[u8]) -> DomainResult<Vec<String>> {
    serde_json::from_slice(body).map_err(|_| DomainError::Corrupt("series tags".into()))
}

/// A tag change on a store that cannot commit the set with its index rows (on Azure each
/// tag's rows are a partition): the catalogue entry and the rows of added tags first, then
/// the set's compare-and-swap (`writes[0]`, which decides), then the deletes of removed
/// tags' rows. A crash or a lost swap may so leave a row of a tag the series does not
/// carry, never miss one it does: listings by tag on such a store check each series' set
/// (see [`Series::list`]).
async fn change_in_steps(
    store: &dyn crate::store::Store,
    writes: Vec<Write>,
) -> Result<(), StoreError> {
    let mut writes = writes.into_iter();
    let Some(swap) = writes.next() else {
        return Ok(());
    };
    let (deletes, puts): (Vec<Write>, Vec<Write>) =
        writes.partition(|write| matches!(write, Write::Delete { .. }));
    store.batch_write(puts).await?;
    store.write_one(swap).await?;
    if !deletes.is_empty() {
        store.batch_write(deletes).await?;
    }
    Ok(())
}

/// At most [`MAX_TAGS`], each printable and listed once.
fn check_tags(tags: &[String]) -> DomainResult<()> {
    if tags.len() > MAX_TAGS {
        return Err(DomainError::invalid(
            "too_many_tags",
            format!("a series carries at most {MAX_TAGS} tags"),
        ));
    }
    for (index, tag) in tags.iter().enumerate() {
        check_printable("tag", tag, MAX_TAG_BYTES)
            .map_err(|message| DomainError::invalid("invalid_tag", message))?;
        if tags[..index].contains(tag) {
            return Err(DomainError::invalid(
                "duplicate_tag",
                format!("tag {tag:?} is listed twice"),
            ));
        }
    }
    Ok(())
}

impl Series {
    /// Whether `series` is in the catalogue (it has had points or tags).
    pub async fn exists(&self, series: &SeriesName) -> DomainResult<bool> {
        Ok(self
            .store
            .get(Table::SeriesIndex, NAMES_PARTITION, series.as_str())
            .await?
            .is_some())
    }

    /// The tags of `series`, in the order they were set; 404 for an unknown series.
    pub async fn tags(&self, series: &SeriesName) -> DomainResult<Vec<String>> {
        let meta_key = meta_partition(series.as_str());
        let (names, meta) = futures::join!(
            self.exists(series),
            self.store.get(Table::SeriesIndex, &meta_key, TAGS_ROW)
        );
        if !names? {
            return Err(DomainError::NotFound(format!("no series {series}")));
        }
        meta?.map_or(Ok(Vec::new()), |body| decode_tags(&body))
    }

    /// Replaces the tags of `series` (creating it in the catalogue if need be).
    pub async fn set_tags(&self, series: &SeriesName, tags: Vec<String>) -> DomainResult<()> {
        self.change_tags(series, |_| Some(tags.clone())).await
    }

    /// Adds to the tags of `series` those of `tags` it lacks, keeping the others (the line
    /// protocol write names a series' tags on every line; tags set otherwise stay). One read
    /// when it has them all.
    pub async fn add_tags(&self, series: &SeriesName, tags: &[String]) -> DomainResult<()> {
        self.change_tags(series, |old| {
            let missing: Vec<&String> = tags.iter().filter(|tag| !old.contains(tag)).collect();
            (!missing.is_empty()).then(|| old.iter().chain(missing).cloned().collect())
        })
        .await
    }

    /// [`add_tags`](Self::add_tags) for many series: their tags read in one round, and only
    /// those lacking some written.
    pub async fn add_tags_to_many(&self, tags: &[(&SeriesName, &[String])]) -> DomainResult<()> {
        // Series whose tags were read lately and held these already need no read.
        let unknown: Vec<&(&SeriesName, &[String])> = tags
            .iter()
            .filter(|(name, wanted)| {
                !self
                    .recent_tags
                    .get(name.as_str())
                    .is_some_and(|known| wanted.iter().all(|tag| known.contains(tag)))
            })
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        let keys = unknown
            .iter()
            .map(|(name, _)| Key::new(Table::SeriesIndex, meta_partition(name.as_str()), TAGS_ROW))
            .collect();
        let stored = self.store.get_many(keys).await?;
        let mut lacking = Vec::new();
        for ((name, wanted), stored) in unknown.into_iter().zip(stored) {
            let old = stored.map_or(Ok(Vec::new()), |body| decode_tags(&body))?;
            if wanted.iter().any(|tag| !old.contains(tag)) {
                lacking.push(self.add_tags(name, wanted));
            } else {
                self.recent_tags.put(name.as_str(), old.into());
            }
        }
        futures::stream::iter(lacking)
            .buffer_unordered(TAG_UPDATES_IN_FLIGHT)
            .try_collect::<()>()
            .await
    }

    /// Sets the tags of `series` to `change(old tags)`, unless that is `None`, under a
    /// compare-and-swap so concurrent changes are never lost.
    async fn change_tags(
        &self,
        series: &SeriesName,
        change: impl Fn(&[String]) -> Option<Vec<String>>,
    ) -> DomainResult<()> {
        let name = series.as_str();
        let meta = meta_partition(name);
        // Forgotten before and after: a write path that read the old tags meanwhile must
        // not have the last word in this process.
        self.recent_tags.forget(name);
        for _ in 0..MAX_ATTEMPTS {
            let old_body = self.store.get(Table::SeriesIndex, &meta, TAGS_ROW).await?;
            let old = match &old_body {
                Some(body) => decode_tags(body)?,
                None => Vec::new(),
            };
            let Some(tags) = change(&old) else {
                return Ok(());
            };
            check_tags(&tags)?;
            let body = Bytes::from(serde_json::to_vec(&tags).unwrap_or_default());
            let mut writes = vec![
                Write::Put {
                    table: Table::SeriesIndex,
                    item: Item::new(&meta, TAGS_ROW, body.clone()),
                    condition: old_body.map_or(Condition::Absent, Condition::Equals),
                },
                register(name),
            ];
            for gone in old.iter().filter(|tag| !tags.contains(tag)) {
                writes.push(Write::delete(Table::SeriesIndex, tag_partition(gone), name));
            }
            for added in tags.iter().filter(|tag| !old.contains(tag)) {
                writes.push(Write::put(
                    Table::SeriesIndex,
                    Item::new(tag_partition(added), name, Bytes::new()),
                ));
            }
            let changed = if self.store.commits_at_once(&writes) {
                self.store.transact(writes).await
            } else {
                change_in_steps(self.store.as_ref(), writes).await
            };
            match changed {
                Ok(()) => {
                    self.recent_tags.forget(name);
                    return Ok(());
                }
                Err(StoreError::ConditionFailed) => {}
                Err(err) => return Err(err.into()),
            }
        }
        Err(DomainError::Conflict(
            "the tags kept changing under this write; retry".into(),
        ))
    }

    /// Series names in order from `start` (inclusive); with `tag`, only those carrying it.
    pub async fn list(
        &self,
        start: Option<&str>,
        tag: Option<&str>,
        limit: usize,
        cursor: Option<&str>,
    ) -> DomainResult<SeriesList> {
        if limit == 0 || limit > MAX_LIST_PAGE {
            return Err(DomainError::invalid(
                "invalid_limit",
                format!("limit must be 1 to {MAX_LIST_PAGE}"),
            ));
        }
        if let Some(tag) = tag {
            check_printable("tag", tag, MAX_TAG_BYTES)
                .map_err(|message| DomainError::invalid("invalid_tag", message))?;
        }
        let partition = tag.map_or_else(|| NAMES_PARTITION.to_owned(), tag_partition);
        let scope = format!("series-list/{partition}/{}", start.unwrap_or_default());
        let after = cursor
            .map(|cursor| self.cursors.decode(&scope, cursor))
            .transpose()?;
        let query = Query::partition(Table::SeriesIndex, &partition, limit + 1)
            .range(
                start.filter(|start| !start.is_empty()).map(str::to_owned),
                None,
            )
            .after(after);
        let mut series = self.store.query_rows(query).await?;
        let next_cursor = if series.len() > limit {
            series.truncate(limit);
            series.last().map(|last| self.cursors.encode(&scope, last))
        } else {
            None
        };
        if let Some(tag) = tag
            && !self.store.commits_at_once(&[
                register("a"),
                Write::put(Table::SeriesIndex, Item::new(tag_partition(tag), "a", "")),
            ])
        {
            series = self.carrying(series, tag).await?;
        }
        Ok(SeriesList {
            items: series,
            next_cursor,
        })
    }

    /// Of `series` (listed under `tag`), those whose set carries it, for a store whose tag
    /// changes may leave a row of a tag a series does not carry (see [`change_in_steps`]).
    /// Such a row is left: a change adding the tag back writes it before its set, so a row
    /// deleted here as stale could be that change's.
    async fn carrying(&self, series: Vec<String>, tag: &str) -> DomainResult<Vec<String>> {
        let keys = series
            .iter()
            .map(|name| Key::new(Table::SeriesIndex, meta_partition(name), TAGS_ROW))
            .collect();
        let sets = self.store.get_many(keys).await?;
        let mut carrying = Vec::with_capacity(series.len());
        for (name, set) in series.into_iter().zip(sets) {
            let tags = match set {
                Some(body) => decode_tags(&body)?,
                None => Vec::new(),
            };
            if tags.iter().any(|carried| carried == tag) {
                carrying.push(name);
            }
        }
        Ok(carrying)
    }
}
