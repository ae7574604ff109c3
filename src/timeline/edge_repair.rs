//! The reconcile job's side of edges changed in steps (see `following_in_steps`): what the
//! call that enqueued it ahead of its edge write does, the fence a job its call never
//! confirmed puts in that write's way ([`settle`]), and bringing the author's side of the
//! edge in line with the follower's row ([`repair`]).

use serde::{Deserialize, Serialize};

use super::merged_authors;
use super::model::EdgeRow;
use super::{DomainError, DomainResult, Edge};
use crate::jobs::{JobError, JobResult};
use crate::keys::Ticks;
use crate::store::{Condition, Item, Store, StoreError, StoreExt as _, Table, Write};

/// What the call that enqueued a reconcile job ahead of its edge write does to the edge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Change {
    Follow,
    /// Deletes the follower's row if it is still `seen` (its stored text).
    Unfollow {
        seen: String,
    },
}

/// Times a call starts over because the edge changed under it.
pub(super) const CALL_RACES: usize = 8;

/// Whether `follower`'s row says it follows `author`.
pub(super) async fn following(
    store: &dyn Store,
    follower: &str,
    author: &str,
) -> DomainResult<bool> {
    match store.get(Table::SubjectFollowing, follower, author).await? {
        Some(body) => Ok(!EdgeRow::decode(author, &body)
            .map_err(DomainError::Corrupt)?
            .gone),
        None => Ok(false),
    }
}

/// For a reconcile job `op` whose call never confirmed it: makes sure the call's decisive
/// write, if still in flight, can never land (see the module doc).
pub(super) async fn settle(
    store: &dyn Store,
    op: &str,
    follower: &str,
    author: &str,
    change: &Change,
) -> JobResult<()> {
    for _ in 0..CALL_RACES {
        let seen = store.get(Table::SubjectFollowing, follower, author).await?;
        let fence = match (change, seen) {
            (Change::Follow, Some(body)) => {
                let row = EdgeRow::decode(author, &body).map_err(JobError::Corrupt)?;
                if !row.gone || row.op.as_deref() == Some(op) {
                    // Followed (by the call, or another), or fenced already.
                    return Ok(());
                }
                // "Not followed" by another call: the call would replace it, unless it is
                // this job's.
                Write::Put {
                    table: Table::SubjectFollowing,
                    item: Item::new(
                        follower,
                        author,
                        Edge::encode_stored(row.since, Some(op), true),
                    ),
                    condition: Condition::Equals(body),
                }
            }
            (Change::Follow, None) => Write::put_if_absent(
                Table::SubjectFollowing,
                Item::new(
                    follower,
                    author,
                    Edge::encode_stored(Ticks::now(), Some(op), true),
                ),
            ),
            (Change::Unfollow { seen: expected }, Some(body)) if body == expected.as_bytes() => {
                let row = EdgeRow::decode(author, &body).map_err(JobError::Corrupt)?;
                Write::Put {
                    table: Table::SubjectFollowing,
                    item: Item::new(
                        follower,
                        author,
                        Edge::encode_stored(row.since, Some(op), row.gone),
                    ),
                    condition: Condition::Equals(body),
                }
            }
            // Deleted (by the call or another), or changed: the delete cannot land now.
            (Change::Unfollow { .. }, _) => return Ok(()),
        };
        match store.write_one(fence).await {
            Ok(()) => return Ok(()),
            Err(StoreError::ConditionFailed) => {}
            Err(err) => return Err(err.into()),
        }
    }
    Err(JobError::Conflict(format!(
        "the edge {follower} -> {author} kept changing"
    )))
}

/// Brings `author`'s side of the edge (its `subjectFollowers` row and audience marks) in
/// line with `follower`'s row as read (`seen`).
pub(super) async fn repair(
    store: &dyn Store,
    follower: &str,
    author: &str,
    seen: Option<&[u8]>,
) -> JobResult<()> {
    let row = seen
        .map(|body| EdgeRow::decode(author, body))
        .transpose()
        .map_err(JobError::Corrupt)?
        .filter(|row| !row.gone);
    let writes = match row {
        Some(row) => vec![
            Write::put(
                Table::SubjectFollowers,
                Item::new(author, follower, Edge::encode_since(row.since)),
            ),
            merged_authors::followed_mark(author),
        ],
        None => vec![
            Write::delete(Table::SubjectFollowers, author, follower),
            merged_authors::unfollowed_mark(author),
        ],
    };
    Ok(store.transact_or_in_order(writes).await?)
}
