//! Splitting a big event's fan-out into part jobs, so several workers deliver it at once.

use super::{FanoutHandler, FanoutJob, FollowerRange, Step, save};
use crate::jobs::{Claimed, JobResult};
use tracing::debug;

use std::sync::Arc;

use crate::store::{Query, StoreExt as _, Table};

/// The followers a fresh job read (or knew) before it knew it would split.
pub(super) struct Preread {
    /// From the first, in row-key order.
    pub followers: Arc<[String]>,
    /// They are all the author's followers (the read asked for more).
    pub complete: bool,
}

impl FanoutHandler {
    /// Splits a big event into part jobs of `split_above` followers each, bounded by follower
    /// row keys (the first part also writes the author's own entry). Each part is enqueued in
    /// one transaction with the root job's progress, so a crash never loses or doubles a part;
    /// the last part goes with the root job's end. `first` holds the first followers if the
    /// caller has read them (at least `split_above + 1`): the parts they cover are cut from
    /// them, and only the followers past them are read again.
    pub(super) async fn split(
        &self,
        job: &mut Claimed,
        state: &mut FanoutJob,
        mut first: Option<Preread>,
    ) -> JobResult<Step> {
        let part_size = self.settings.split_above.max(1);
        // Where the next part starts in `first`.
        let mut cut = 0;
        loop {
            if job.stopping() {
                return Ok(Step::Stopped);
            }
            let mut split = state.split.clone().unwrap_or_default();
            let read;
            let followers: &[String] = match first.as_ref() {
                // A part, and the start of the next (or the end of them all), in hand.
                Some(preread)
                    if preread.followers.len().saturating_sub(cut) > part_size
                        || preread.complete =>
                {
                    preread.followers.get(cut..).unwrap_or_default()
                }
                _ => {
                    first = None;
                    read = self
                        .store
                        .query_rows(
                            Query::partition(Table::SubjectFollowers, &state.author, part_size + 1)
                                .range(split.next.clone(), None),
                        )
                        .await?;
                    &read
                }
            };
            let followers = &followers[..followers.len().min(part_size + 1)];
            cut += part_size;
            let mut part_writes = Vec::new();
            if let Some(first) = followers.first() {
                let end = followers.get(part_size).cloned();
                let part = FanoutJob {
                    action: state.action.clone(),
                    author: state.author.clone(),
                    row_key: state.row_key.clone(),
                    // A part reads the event: one read for a thousand followers or more.
                    entry: None,
                    range: Some(FollowerRange {
                        start: first.clone(),
                        end: end.clone(),
                    }),
                    split: None,
                    cursor: None,
                    edit: None,
                    unfanned: false,
                };
                part_writes.push(job.part_write(split.parts, &part));
                split.parts += 1;
                split.followers += followers.len().min(part_size) as u64;
                split.next = end;
            }
            if split.next.is_some() {
                state.split = Some(split);
                save(job, state, part_writes).await?;
                self.wake.enqueued();
                continue;
            }
            // The last part: the root job hands over to its parts.
            debug!(row_key = %state.row_key, parts = split.parts, followers = split.followers, "fan-out split");
            state.split = Some(split.clone());
            job.set_payload(state);
            return Ok(Step::Split {
                parts: split.parts,
                followers: split.followers,
                last: part_writes,
            });
        }
    }
}
