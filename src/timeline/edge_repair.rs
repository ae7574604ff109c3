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
use bytes::Bytes;

use crate::store::{Condition, Item, Key, Store, StoreError, StoreExt as _, Table, Write};

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

/// Brings `author`'s side of the edge (its `subjectFollowers` row, and the mark that says it
/// changed) in line with `follower`'s row, if they disagree.
///
/// The author's two marks are read before the follower's row, and the repair is one group
/// on the author's partition that checks them unchanged. A call's step on the author's side
/// moves one of them, after its step on the follower's row: so a repair that read the
/// follower's row before a later call changed it fails, rather than undo that call's side
/// (it reads again). A mark never written is written first, since a check that a row is
/// absent cannot go in a group on Azure.
pub(super) async fn repair(store: &dyn Store, follower: &str, author: &str) -> JobResult<()> {
    let audience_key = merged_authors::audience_key(author);
    let unfollowed_key = merged_authors::unfollowed_key(author);
    let target_key = Key::new(Table::SubjectFollowers, author, follower);
    // A mark moved: a fresh value, written only over the one read.
    let moved = |key: &Key, condition: Condition| Write::Put {
        table: key.table,
        item: Item::new(
            &key.partition,
            &key.row,
            Bytes::copy_from_slice(uuid::Uuid::now_v7().as_bytes()),
        ),
        condition,
    };
    for _ in 0..CALL_RACES {
        let seen = store
            .get_many(vec![
                audience_key.clone(),
                unfollowed_key.clone(),
                target_key.clone(),
            ])
            .await?;
        let [audience, unfollowed, target] = <[Option<Bytes>; 3]>::try_from(seen)
            .map_err(|_| JobError::Corrupt("a read of three keys".into()))?;
        let (Some(audience), Some(unfollowed)) = (audience, unfollowed) else {
            for key in [&audience_key, &unfollowed_key] {
                match store.write_one(moved(key, Condition::Absent)).await {
                    Ok(()) | Err(StoreError::ConditionFailed) => {}
                    Err(err) => return Err(err.into()),
                }
            }
            continue;
        };
        let row = match store.get(Table::SubjectFollowing, follower, author).await? {
            Some(body) => Some(EdgeRow::decode(author, &body).map_err(JobError::Corrupt)?),
            None => None,
        }
        .filter(|row| !row.gone);
        if row.is_some() == target.is_some() {
            return Ok(());
        }
        let writes = match row {
            Some(row) => vec![
                Write::put(
                    Table::SubjectFollowers,
                    Item::new(author, follower, Edge::encode_since(row.since)),
                ),
                moved(&audience_key, Condition::Equals(audience)),
                Write::check(unfollowed_key.clone(), Condition::Equals(unfollowed)),
            ],
            None => vec![
                Write::delete(Table::SubjectFollowers, author, follower),
                moved(&unfollowed_key, Condition::Equals(unfollowed)),
                Write::check(audience_key.clone(), Condition::Equals(audience)),
            ],
        };
        match store.transact(writes).await {
            Ok(()) => return Ok(()),
            Err(StoreError::ConditionFailed) => {}
            Err(err) => return Err(err.into()),
        }
    }
    Err(JobError::Conflict(format!(
        "the edge {follower} -> {author} kept changing"
    )))
}
