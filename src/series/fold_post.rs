//! A fold's `readings` event on a store that cannot commit it with the fold's cursor: on
//! Azure the event's rows are in the series' subject partition, the cursor in
//! `meta/{series}` and the event's job in a queue shard.
//!
//! The cursor decides, as on any store: it names the batches folded, and the event's id is
//! the fold's first batch's. So the event goes with the cursor as an intent. One transaction
//! on `meta/{series}` advances the cursor and creates the series' pending post, a row that
//! holds the event (created if absent, so that a fold finds the post before it finished
//! first). Then the event is posted (its rows, then its job, each idempotent) and the pending
//! post deleted. A fold of the series that finds a pending post left (its writer died, or
//! failed after the cursor) finishes it before anything else, and the batch's job, retried
//! until the batch's rows are gone, folds the series again: a pending post is always
//! finished.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::catalogue::meta_partition;
use crate::store::{Item, Store, StoreError, StoreExt as _, Table, Write};
use crate::timeline::audience::Quiet;
use crate::timeline::posting::event_rows_then_job;
use crate::timeline::{DomainError, DomainResult, Event, SubjectId};

/// The row of `meta/{series}` that holds a pending post.
const PENDING_POST_ROW: &str = "post";

/// A pending post as stored.
#[derive(Serialize, Deserialize)]
struct PendingPost {
    row_key: String,
    /// The event as its rows store it.
    event: String,
}

/// Whether `store` posts a fold's event in steps (it cannot commit it with the cursor).
pub(super) fn in_steps(store: &dyn Store, series: &str) -> bool {
    // The pending post's row is in the cursor's partition.
    let cursor = Write::put(
        Table::SeriesIndex,
        Item::new(meta_partition(series), PENDING_POST_ROW, ""),
    );
    let event = Write::put(Table::Events, Item::new(series, "event", ""));
    !store.commits_at_once(&[cursor, event])
}

/// The write that creates `series`' pending post of `event`, to go with the cursor.
pub(super) fn intent(series: &str, event: &Event) -> Write {
    let pending = PendingPost {
        row_key: event.row_key.clone(),
        event: String::from_utf8_lossy(&event.encode()).into_owned(),
    };
    let body = Bytes::from(serde_json::to_vec(&pending).unwrap_or_default());
    Write::put_if_absent(
        Table::SeriesIndex,
        Item::new(meta_partition(series), PENDING_POST_ROW, body),
    )
}

/// Posts `event`, the pending post of its series, then deletes the pending post. With
/// `quiet` (its guard, the series' audience mark as read) it posts with no job, unless a
/// follower came meanwhile.
pub(super) async fn post(
    store: &dyn Store,
    quiet: Option<(&Quiet, Write)>,
    event: &Event,
) -> DomainResult<()> {
    let series = event.author.as_str();
    let mut posted_quiet = None;
    if let Some((quiet, guard)) = quiet {
        match store
            .transact(quiet.event_writes(event, event.at, guard))
            .await
        {
            Ok(()) => posted_quiet = Some(quiet),
            // A follower came: posted with a job.
            Err(StoreError::ConditionFailed) => {}
            Err(err) => return Err(err.into()),
        }
    }
    if posted_quiet.is_none() {
        let (rows, job) = event_rows_then_job(event, event.at);
        store
            .transact(rows.into_iter().map(Write::unconditional).collect())
            .await?;
        match store.write_one(job).await {
            Ok(()) | Err(StoreError::ConditionFailed) => {}
            Err(err) => return Err(err.into()),
        }
    }
    store
        .write_one(Write::delete(
            Table::SeriesIndex,
            meta_partition(series),
            PENDING_POST_ROW,
        ))
        .await?;
    if let Some(quiet) = posted_quiet {
        quiet.posted(store, event).await;
    }
    Ok(())
}

/// Finishes `series`' pending post, if one was left.
pub(super) async fn finish_left(store: &dyn Store, series: &str) -> DomainResult<()> {
    let Some(body) = store
        .get(
            Table::SeriesIndex,
            &meta_partition(series),
            PENDING_POST_ROW,
        )
        .await?
    else {
        return Ok(());
    };
    let corrupt = |what: String| DomainError::Corrupt(format!("pending post of {series}: {what}"));
    let pending: PendingPost =
        serde_json::from_slice(&body).map_err(|err| corrupt(err.to_string()))?;
    let author = SubjectId::parse(series).map_err(corrupt)?;
    let event =
        Event::decode(&author, &pending.row_key, pending.event.as_bytes()).map_err(corrupt)?;
    post(store, None, &event).await
}
