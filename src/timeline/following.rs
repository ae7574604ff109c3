//! Following and unfollowing. Both edge tables change in one transaction, so the two
//! directions never disagree; both calls are idempotent. A call that changes the edge
//! enqueues, in the same transaction, a job that backfills or cleans up the follower's
//! timeline (`timeline::reconcile`), so the call answers without waiting for it.

use super::live::{self, LiveMessage};
use super::{DomainError, DomainResult, Edge, SubjectId, Timelines};
use super::{merged_authors, reconcile};
use crate::keys::Ticks;
use crate::store::{Item, StoreError, Table, Write};

impl Timelines {
    /// `follower` follows `target`. Following again keeps the original `since`.
    pub async fn follow(&self, follower: &SubjectId, target: &SubjectId) -> DomainResult<()> {
        if follower == target {
            return Err(DomainError::invalid(
                "cannot_follow_self",
                "a subject cannot follow itself",
            ));
        }
        let since = Edge::encode_since(Ticks::now());
        let writes = vec![
            Write::put_if_absent(
                Table::SubjectFollowers,
                Item::new(target.as_str(), follower.as_str(), since.clone()),
            ),
            Write::put_if_absent(
                Table::SubjectFollowing,
                Item::new(follower.as_str(), target.as_str(), since),
            ),
            reconcile::job(follower.as_str(), target.as_str()),
            // Writers of the target's events that found no one to fan out to look again.
            merged_authors::followed_mark(target.as_str()),
        ];
        if !self.store.commits_at_once(&writes) {
            return self.follow_in_steps(follower, target).await;
        }
        let followed = self.store.transact(writes).await;
        // Posts of the target's read its followers again (those of other processes learn it
        // from the mark).
        self.fanout_in_post.forget(target.as_str());
        match followed {
            Ok(()) => {
                self.wake_workers.enqueued();
                Ok(())
            }
            // Both directions are always written together: one present means both are.
            Err(StoreError::ConditionFailed) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// `follower` stops following `target`; a no-op if it did not follow.
    pub async fn unfollow(&self, follower: &SubjectId, target: &SubjectId) -> DomainResult<()> {
        if !self
            .store
            .commits_at_once(&unfollow_writes(follower, target))
        {
            return self.unfollow_in_steps(follower, target).await;
        }
        let edge = self
            .store
            .get(Table::SubjectFollowing, follower.as_str(), target.as_str())
            .await?;
        if edge.is_none() {
            return Ok(());
        }
        let unfollowed = self.store.transact(unfollow_writes(follower, target)).await;
        self.fanout_in_post.forget(target.as_str());
        unfollowed?;
        self.wake_workers.enqueued();
        live::tell(
            &self.notices,
            follower,
            &LiveMessage::Unfollowed {
                author: target.as_str().to_owned(),
            },
        );
        Ok(())
    }
}

/// The writes of an unfollow, in one transaction where the store can.
fn unfollow_writes(follower: &SubjectId, target: &SubjectId) -> Vec<Write> {
    let (follower, target) = (follower.as_str(), target.as_str());
    vec![
        Write::delete(Table::SubjectFollowers, target, follower),
        Write::delete(Table::SubjectFollowing, follower, target),
        // A merged author leaves the timeline at once; pushed entries go with the job.
        merged_authors::stop_merging(follower, target),
        // Fan-out pages of the target written meanwhile see it and look again.
        merged_authors::unfollowed_mark(target),
        reconcile::job(follower, target),
    ]
}
