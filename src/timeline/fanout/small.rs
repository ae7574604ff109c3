//! Small fan-outs together: the events of many jobs, each with few followers, are written in
//! one batch, so a job costs a share of a few reads and of two durable writes (the entries,
//! then the runner's round of transactions that ends the jobs). The jobs come unleased (see
//! [`crate::jobs::Handler::runs_unleased`]): everything written here may be written twice.
//!
//! A job is small when it is a fresh delivery whose author is not merged at read time and
//! has at most [`SMALL_FOLLOWERS`] followers (and no more than one page of them, nor than
//! the split and merge thresholds). Anything else, found while looking, runs alone as before.
//! The reads of a batch are two rounds whatever its size: every author's merged flag and two
//! marks, with the events of jobs that carry no entry; then the followers of the authors not
//! known under those marks (see `known`). After the write, one round reads the events and
//! the unfollow marks again: no event was deleted, and no reader unfollowed, unless one moved
//! (see `edges`). Entries are keyed by event row key, so a batch written twice (a retry after
//! a failed write) leaves one entry per follower; a failed write fails every job of the
//! batch, and each is retried.

use std::sync::Arc;

use bytes::Bytes;

use super::known::Marks;
use super::{Action, FanoutHandler, FanoutJob, edges};
use crate::jobs::{Claimed, Ending, Handler as _, JobError, JobResult, Outcome};
use crate::keys::parse_event_row_key;
use crate::notices::Notice;
use crate::store::{Item, Key, Query, Table, Write};
use crate::timeline::{Event, live, merged_authors, trim};

/// Most followers of a small fan-out: one page of them.
pub(super) const SMALL_FOLLOWERS: usize = 1000;

/// What the reads found of one small job.
enum Found {
    /// Not small after all (or its author's state asks for the full path).
    Alone,
    /// The event is gone: nothing to deliver.
    Deleted,
    /// The entry, the author's followers (shared with those known), and the author's
    /// unfollow mark as read before the followers.
    Deliver {
        entry: Bytes,
        followers: Arc<[String]>,
        mark: edges::Mark,
    },
}

impl FanoutHandler {
    /// Most followers a job may have to take the small path.
    fn small_limit(&self) -> usize {
        SMALL_FOLLOWERS
            .min(self.settings.page_size.max(1))
            .min(self.settings.split_above)
            .min(self.settings.merge_threshold)
    }

    /// Reads what fresh deliveries need, for all of them at once: their authors' merged flags
    /// and marks, and the events of the jobs that carry no entry; then the followers (up to
    /// one more than the small limit) of the authors not known under those marks.
    async fn look_all(&self, states: &[&FanoutJob]) -> Vec<JobResult<Found>> {
        let store = self.store.as_ref();
        let limit = self.small_limit();
        let authors = states
            .iter()
            .flat_map(|state| {
                let [audience, unfollowed] = Marks::keys(&state.author);
                [
                    merged_authors::flag_key(&state.author),
                    audience,
                    unfollowed,
                ]
            })
            .collect();
        let events = states
            .iter()
            .filter(|state| state.entry.is_none())
            .map(|state| Key::new(Table::Events, &state.author, &state.row_key))
            .collect();
        let (authors, events) = futures::join!(store.get_many(authors), store.get_many(events));
        let (authors, events) = match (authors, events) {
            (Ok(authors), Ok(events)) => (authors, events),
            (Err(err), _) | (_, Err(err)) => {
                return states.iter().map(|_| Err(err.clone().into())).collect();
            }
        };
        let mut authors = authors.into_iter();
        let looks: Vec<_> = states
            .iter()
            .map(|state| {
                let merged = authors.next().flatten().is_some();
                let marks = Marks {
                    audience: authors.next().flatten(),
                    unfollowed: authors.next().flatten(),
                };
                let known = (!merged)
                    .then(|| self.known.get(&state.author, &marks))
                    .flatten();
                (merged, marks, known)
            })
            .collect();
        // Read after the marks: followers that changed since moved one of them.
        let queries = states
            .iter()
            .zip(&looks)
            .filter(|(_, (merged, _, known))| !merged && known.is_none())
            .map(|(state, _)| Query::partition(Table::SubjectFollowers, &state.author, limit + 1))
            .collect();
        let mut read = match store.query_many(queries).await {
            Ok(read) => read.into_iter(),
            Err(err) => return states.iter().map(|_| Err(err.clone().into())).collect(),
        };
        let mut uncarried_events = events.into_iter();
        states
            .iter()
            .zip(looks)
            .map(|(state, (merged, marks, known))| {
                // Taken first, so that each job without an entry gets its own event's answer.
                let event = match state.entry {
                    Some(_) => None,
                    None => uncarried_events.next().flatten(),
                };
                if merged {
                    return Ok(Found::Alone);
                }
                let followers = match known {
                    // Known from a big fan-out of the author's.
                    Some(followers) if followers.len() > limit => return Ok(Found::Alone),
                    Some(followers) => followers,
                    None => {
                        let followers = read.next().unwrap_or_default();
                        if followers.len() > limit {
                            return Ok(Found::Alone);
                        }
                        let followers: Arc<[String]> =
                            followers.into_iter().map(|item| item.row).collect();
                        self.known
                            .remember(&state.author, marks.clone(), followers.clone());
                        followers
                    }
                };
                let entry = match (&state.entry, event) {
                    (Some(carried), _) => carried.bytes(),
                    (None, Some(body)) => {
                        Event::decode(&Self::author_id(&state.author)?, &state.row_key, &body)
                            .map_err(JobError::Corrupt)?
                            .timeline_entry_body()
                    }
                    (None, _) => return Ok(Found::Deleted),
                };
                Ok(Found::Deliver {
                    entry,
                    followers,
                    mark: edges::Mark::new(&state.author, marks.unfollowed),
                })
            })
            .collect()
    }

    /// Runs a batch of jobs, unleased: the small fresh deliveries together; of the rest, one
    /// runs alone (leased by the runner) and the others are left in the queue.
    pub(super) async fn run_together(&self, jobs: &mut [Claimed]) -> Vec<JobResult<Outcome>> {
        let mut results: Vec<Option<JobResult<Outcome>>> = jobs.iter().map(|_| None).collect();
        let mut fresh = Vec::new();
        for (index, job) in jobs.iter().enumerate() {
            match job.payload::<FanoutJob>() {
                Ok(state)
                    if state.action == Action::Deliver
                        && state.range.is_none()
                        && state.split.is_none()
                        && state.cursor.is_none()
                        && job.part().is_none() =>
                {
                    fresh.push((index, state));
                }
                Ok(_) => {}
                Err(err) => results[index] = Some(Err(err)),
            }
        }
        // Jobs enqueued ahead of their events and never confirmed: those whose events were
        // never posted end here (see `ahead`).
        let (unconfirmed, mut fresh): (Vec<_>, Vec<_>) = fresh
            .into_iter()
            .partition(|(index, _)| jobs[*index].unconfirmed());
        if !unconfirmed.is_empty() {
            let checks = unconfirmed
                .iter()
                .map(|(_, state)| self.posted_or_fenced(state));
            let posted = futures::future::join_all(checks).await;
            for ((index, state), posted) in unconfirmed.into_iter().zip(posted) {
                match posted {
                    Ok(true) => {
                        jobs[index].confirm();
                        fresh.push((index, state));
                    }
                    Ok(false) => results[index] = Some(Ok(done(0))),
                    Err(err) => results[index] = Some(Err(err)),
                }
            }
        }
        let states: Vec<&FanoutJob> = fresh.iter().map(|(_, state)| state).collect();
        let looks = self.look_all(&states).await;
        let mut small = Vec::new();
        // The unfollow mark of each of `small`'s authors, as read before its followers.
        let mut marks = Vec::new();
        for ((index, state), found) in fresh.into_iter().zip(looks) {
            match found {
                Ok(Found::Alone) => {}
                Ok(Found::Deleted) => {
                    results[index] = Some(Ok(done(0)));
                }
                Ok(Found::Deliver {
                    entry,
                    followers,
                    mark,
                }) => {
                    small.push((index, state, entry, followers));
                    marks.push(mark);
                }
                Err(err) => results[index] = Some(Err(err)),
            }
        }
        if !small.is_empty() {
            let deliveries: Vec<Delivery<'_>> = small
                .iter()
                .map(|(_, state, entry, followers)| Delivery {
                    author: &state.author,
                    row_key: &state.row_key,
                    entry,
                    owners: followers
                        .iter()
                        .map(String::as_str)
                        .chain([state.author.as_str()])
                        .collect(),
                })
                .collect();
            match self.write_entries(&deliveries, None, &mut marks).await {
                Ok(gone) => {
                    for (position, (index, _, _, followers)) in small.iter().enumerate() {
                        // The followers' entries and the author's own.
                        let written = followers.len() as u64 + 1;
                        jobs[*index].add_progress(written);
                        self.metrics.deliveries.inc_by(written);
                        // An event deleted meanwhile had its copies taken back: its removal
                        // job reports the rest.
                        let followers = if gone.contains(&position) {
                            0
                        } else {
                            written - 1
                        };
                        results[*index] = Some(Ok(done(followers)));
                    }
                }
                Err(err) => {
                    // Every job of the batch is retried: none is half-applied and forgotten.
                    for (index, _, _, _) in &small {
                        results[*index] = Some(Err(match &err {
                            JobError::Store(store) => JobError::Store(store.clone()),
                            other => JobError::Conflict(other.to_string()),
                        }));
                    }
                }
            }
        }
        // A batch with one job that is not small keeps its size (that job runs after the
        // others end); one with several was mostly big ones, polled only to be left: take one
        // at a time until batches are all small again.
        let next_hint = match results.iter().filter(|result| result.is_none()).count() {
            0 => self.batch_size().saturating_mul(2),
            1 => self.batch_size(),
            _ => 1,
        };
        self.batch_hint
            .store(next_hint, std::sync::atomic::Ordering::Relaxed);
        // Of the jobs that are not small, this worker runs one on its own once the small ones
        // have ended; the others go back to the queue at once for other workers, rather than
        // waiting here behind a long fan-out.
        let mut one_alone = false;
        results
            .into_iter()
            .map(|result| match result {
                Some(result) => result,
                None if one_alone => Ok(Outcome::Returned),
                None => {
                    one_alone = true;
                    Ok(Outcome::Alone)
                }
            })
            .collect()
    }

    /// Writes the entries of every delivery in one batch (with `checkpoint_opt`'s checkpoint
    /// after them, in one durable write where the store can), trims the timelines whose
    /// deliveries trim, then takes back the copies of events deleted meanwhile (a delete whose
    /// removal job may have run before these writes) and those of readers who unfollowed
    /// meanwhile: `marks` holds each delivery's author's unfollow mark as read before its
    /// followers, and only where it moved are edges read (see [`edges`]). Returns the
    /// positions of the deleted events. Used for a page of one big fan-out too.
    pub(super) async fn write_entries(
        &self,
        deliveries: &[Delivery<'_>],
        checkpoint_opt: Option<&mut Claimed>,
        marks: &mut [edges::Mark],
    ) -> JobResult<Vec<usize>> {
        let store = self.store.as_ref();
        let puts = deliveries
            .iter()
            .flat_map(|delivery| {
                delivery.owners.iter().map(move |owner| {
                    Write::put(
                        Table::Timelines,
                        Item::new(*owner, delivery.row_key, delivery.entry.clone()),
                    )
                })
            })
            .collect();
        match checkpoint_opt {
            Some(job) => job.checkpoint_after(puts).await?,
            None => store.batch_write(puts).await?,
        }
        // Readable now: live streams of these timelines may read them.
        for owner in deliveries.iter().flat_map(|delivery| &delivery.owners) {
            self.notices
                .publish(&live::timeline_topic(owner), Notice::Changed);
        }
        let trimmed: Vec<&str> = deliveries
            .iter()
            .filter_map(|delivery| {
                let (_, event_id) = parse_event_row_key(delivery.row_key)?;
                Some(
                    delivery
                        .owners
                        .iter()
                        .copied()
                        .filter(move |owner| trim::trims(event_id, owner)),
                )
            })
            .flatten()
            .collect();
        if !trimmed.is_empty() {
            self.trim_all(&trimmed).await?;
        }
        let mut keys: Vec<Key> = deliveries
            .iter()
            .map(|delivery| Key::new(Table::Events, delivery.author, delivery.row_key))
            .collect();
        keys.extend(marks.iter().map(edges::Mark::key));
        debug_assert_eq!(marks.len(), deliveries.len(), "a mark for each delivery");
        let mut still = store.get_many(keys).await?;
        let marks_now = still.split_off(deliveries.len());
        let moved: Vec<bool> = marks
            .iter_mut()
            .zip(marks_now)
            .map(|(mark, now)| mark.moved_to(now))
            .collect();
        // The edges of the deliveries whose author's mark moved: an unfollow came in between.
        let written: Vec<edges::Written<'_>> = deliveries
            .iter()
            .zip(&moved)
            .filter(|(_, moved)| **moved)
            .map(|(delivery, _)| edges::Written {
                author: delivery.author,
                followers: delivery.followers().collect(),
            })
            .collect();
        let mut gone_since = if written.is_empty() {
            Vec::new()
        } else {
            edges::unfollowed(store, &written).await?
        }
        .into_iter();
        let unfollowed: Vec<Vec<&str>> = moved
            .iter()
            .map(|moved| {
                if *moved {
                    gone_since.next().unwrap_or_default()
                } else {
                    Vec::new()
                }
            })
            .collect();
        let gone: Vec<usize> = still
            .iter()
            .enumerate()
            .filter(|(_, body)| body.is_none())
            .map(|(position, _)| position)
            .collect();
        // The copies of an event deleted meanwhile, and those of readers who unfollowed.
        let deletes: Vec<Write> = deliveries
            .iter()
            .zip(&unfollowed)
            .enumerate()
            .flat_map(|(position, (delivery, unfollowed))| {
                let owners = if gone.contains(&position) {
                    &delivery.owners
                } else {
                    unfollowed
                };
                owners
                    .iter()
                    .map(move |owner| Write::delete(Table::Timelines, *owner, delivery.row_key))
            })
            .collect();
        if !deletes.is_empty() {
            store.batch_write(deletes).await?;
        }
        Ok(gone)
    }
}

/// One event's entry and the timelines it goes to.
pub(super) struct Delivery<'a> {
    pub author: &'a str,
    pub row_key: &'a str,
    pub entry: &'a Bytes,
    pub owners: Vec<&'a str>,
}

impl<'a> Delivery<'a> {
    /// The owners that get the entry as followers (all but the author's own timeline).
    fn followers(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.owners
            .iter()
            .copied()
            .filter(|owner| *owner != self.author)
    }
}

/// Done, with its follower count for the status record.
pub(super) fn done(followers: u64) -> Outcome {
    Outcome::Done(Ending {
        total: Some(followers),
        ..Ending::default()
    })
}
