//! Authors merged into timelines at read time (merged authors).
//!
//! An author with more followers than the merge threshold is not fanned out on write: a
//! flag in `mergedAuthors` says so, and each follower's timeline has a row in
//! `mergedFollowing` naming the author and the oldest of the author's events it shows
//! (`since_row`). A timeline read queries that small partition and merges each named author's
//! `events` partition into the page. Older events, pushed before the author crossed the
//! threshold, are still in the timeline itself; the read merges by row key and drops
//! duplicates, so the two sources overlap safely.
//!
//! The same table holds each author's unfollow mark ([`unfollowed_mark`]), which tells the
//! author's fan-out pages that a reader may have unfollowed under them.

use bytes::Bytes;

use crate::store::{Condition, Item, Key, Query, Store, StoreError, StoreResult, Table, Write};

/// The row of an author's flag in `mergedAuthors`.
const FLAG_ROW: &str = "merged";

/// The row in `mergedAuthors` that every unfollow of the author rewrites (see
/// [`unfollowed_mark`]).
const UNFOLLOWED_ROW: &str = "unfollowed";

/// Most merged authors one timeline read will merge.
pub const MAX_MERGED_PER_TIMELINE: usize = 1000;

/// An author one timeline merges at read time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergedSource {
    pub author: String,
    /// The oldest row key of the author's events the timeline shows (`None`: all).
    pub since_row: Option<String>,
}

impl MergedSource {
    /// Exclusive upper row-key bound of a query of the author's events: row keys grow with
    /// age and all have one length, so `since_row + "!"` is just past `since_row`.
    pub fn end_bound(&self) -> Option<String> {
        self.since_row.as_ref().map(|row| format!("{row}!"))
    }
}

fn since_value(since_row: Option<&str>) -> Bytes {
    Bytes::copy_from_slice(since_row.unwrap_or_default().as_bytes())
}

fn since_of(value: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(value);
    (!text.is_empty()).then(|| text.into_owned())
}

/// Whether `author` is merged at read time, and since which of its events.
pub async fn author_flag(store: &dyn Store, author: &str) -> StoreResult<Option<String>> {
    let value = store.get(Table::MergedAuthors, author, FLAG_ROW).await?;
    Ok(value.map(|value| flag_since(&value)))
}

/// Where `author`'s flag is, to read many authors' flags at once (see [`flag_since`]).
pub fn flag_key(author: &str) -> Key {
    Key::new(Table::MergedAuthors, author, FLAG_ROW)
}

/// The row of an author's audience mark: moved by every follow, read by the writers that post
/// with no job when they find no follower (see `audience`).
pub(super) const AUDIENCE_ROW: &str = "audience";

/// The write that moves `author`'s audience mark, in every follow's transaction.
pub fn followed_mark(author: &str) -> Write {
    Write::put(
        Table::MergedAuthors,
        Item::new(
            author,
            AUDIENCE_ROW,
            Bytes::copy_from_slice(uuid::Uuid::now_v7().as_bytes()),
        ),
    )
}

/// The write that moves `author`'s unfollow mark, in every unfollow's transaction: a fan-out
/// page reads the mark before its followers and again after its write, and reads its
/// followers' edges again only if the mark moved (see `fanout::edges`). Its value is a fresh
/// UUIDv7, so no two unfollows leave the same mark.
pub fn unfollowed_mark(author: &str) -> Write {
    Write::put(
        Table::MergedAuthors,
        Item::new(
            author,
            UNFOLLOWED_ROW,
            Bytes::copy_from_slice(uuid::Uuid::now_v7().as_bytes()),
        ),
    )
}

/// Where `author`'s audience mark is (the one [`followed_mark`] moves).
pub fn audience_key(author: &str) -> Key {
    Key::new(Table::MergedAuthors, author, AUDIENCE_ROW)
}

/// Where `author`'s unfollow mark is.
pub fn unfollowed_key(author: &str) -> Key {
    Key::new(Table::MergedAuthors, author, UNFOLLOWED_ROW)
}

/// The event since which an author is merged, from its flag's value.
pub fn flag_since(value: &[u8]) -> String {
    String::from_utf8_lossy(value).into_owned()
}

/// Marks `author` as merged at read time from its event `since_row` on, unless it already is.
/// Only one event's job crosses the threshold: `Err` holds the `since_row` of the one that
/// did (two events of an author can race to it).
pub async fn claim_flag(
    store: &dyn Store,
    author: &str,
    since_row: &str,
) -> StoreResult<Result<(), String>> {
    let item = Item::new(author, FLAG_ROW, since_value(Some(since_row)));
    match store
        .put(Table::MergedAuthors, item, Condition::Absent)
        .await
    {
        Ok(()) => Ok(Ok(())),
        Err(StoreError::ConditionFailed) => {
            let winner = author_flag(store, author).await?.unwrap_or_default();
            // Our own claim, made before a crash.
            Ok(if winner == since_row {
                Ok(())
            } else {
                Err(winner)
            })
        }
        Err(err) => Err(err),
    }
}

/// Ends merging `author` at read time.
pub fn unflag_author(author: &str) -> Write {
    Write::delete(Table::MergedAuthors, author, FLAG_ROW)
}

/// Makes `follower`'s timeline merge `author`'s events from `since_row` on.
pub fn merge_into(follower: &str, author: &str, since_row: Option<&str>) -> Write {
    Write::put(
        Table::MergedFollowing,
        Item::new(follower, author, since_value(since_row)),
    )
}

/// Stops `follower`'s timeline merging `author`.
pub fn stop_merging(follower: &str, author: &str) -> Write {
    Write::delete(Table::MergedFollowing, follower, author)
}

/// Since which row `follower`'s timeline merges `author`; `None` if it does not.
pub async fn merged_since(
    store: &dyn Store,
    follower: &str,
    author: &str,
) -> StoreResult<Option<Option<String>>> {
    let value = store.get(Table::MergedFollowing, follower, author).await?;
    Ok(value.map(|value| since_of(&value)))
}

/// The query for the authors `owner`'s timeline merges at read time: a small partition.
pub fn merged_sources_query(owner: &str) -> Query {
    Query::partition(Table::MergedFollowing, owner, MAX_MERGED_PER_TIMELINE)
}

/// The merged authors in the rows [`merged_sources_query`] read.
pub fn merged_sources(items: Vec<Item>) -> Vec<MergedSource> {
    items
        .into_iter()
        .map(|item| MergedSource {
            since_row: since_of(&item.value),
            author: item.row,
        })
        .collect()
}
