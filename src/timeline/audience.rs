//! Events of authors nobody follows, posted without a fan-out job.
//!
//! A sensor series posts a `readings` event at every fold of its points, and most series
//! have no subscribers. Their delivery job would write one entry, the author's own, after a
//! queue write, a poll, a follower query and an ending. Instead the writer of such an event
//! writes that entry in the event's own transaction (whose index row notes the delivery
//! done: the event's fan-out status), guarded by the author's **audience mark**
//! (`mergedAuthors`, row `audience`):
//! - every follow's transaction sets the mark to a fresh UUIDv7;
//! - a writer that found no followers puts `quiet` there, create-if-absent, with the event;
//!   later writers put `quiet` again, compare-and-swap on `quiet`.
//!
//! So a follow that lands between the writer's read and its write fails the write, which
//! then goes again with a job; a follow after the write is later than the event, and its
//! backfill reads the event from the author's log. An author once followed keeps its jobs:
//! no writer puts `quiet` over a follow's mark.
//!
//! Follows made before this mark existed left none: an author without a mark has its
//! followers read (one row) before its first quiet event.

use std::time::Duration;

use bytes::Bytes;

use super::Event;
use crate::jobs::DoneInCommit;
use crate::keys::Ticks;
use crate::notices::Notices;
use crate::store::{Condition, Item, Key, Query, Store, StoreResult, Table, Write};

use super::merged_authors::AUDIENCE_ROW as MARK_ROW;

/// The mark of an author whose writers found no followers.
const QUIET: &[u8] = b"quiet";

/// Where `author`'s audience mark is.
pub fn mark_key(author: &str) -> Key {
    super::merged_authors::audience_key(author)
}

/// Whether an author's event needs a fan-out job.
#[derive(Debug)]
pub enum Audience {
    /// Nobody follows the author: the event may be posted with [`Quiet::event_writes`],
    /// guarded by this write of the mark.
    Quiet(Write),
    /// The author has, or had, followers: the event goes with its delivery job.
    Followed,
}

/// Reads the audience of each of `authors`: their marks in one round, then the first
/// follower of each author without a mark, in another.
pub async fn audiences(store: &dyn Store, authors: &[&str]) -> StoreResult<Vec<Audience>> {
    let marks = store
        .get_many(authors.iter().map(|author| mark_key(author)).collect())
        .await?;
    let unmarked: Vec<&str> = authors
        .iter()
        .zip(&marks)
        .filter(|(_, mark)| mark.is_none())
        .map(|(author, _)| *author)
        .collect();
    let mut first_followers = if unmarked.is_empty() {
        Vec::new()
    } else {
        store
            .query_many(
                unmarked
                    .iter()
                    .map(|author| Query::partition(Table::SubjectFollowers, *author, 1))
                    .collect(),
            )
            .await?
    }
    .into_iter();
    Ok(authors
        .iter()
        .zip(marks)
        .map(|(author, mark)| match mark {
            Some(mark) if mark.as_ref() == QUIET => {
                Audience::Quiet(quiet_mark(author, Condition::Equals(mark)))
            }
            Some(_) => Audience::Followed,
            None => match first_followers.next() {
                Some(followers) if followers.is_empty() => {
                    Audience::Quiet(quiet_mark(author, Condition::Absent))
                }
                _ => Audience::Followed,
            },
        })
        .collect())
}

fn quiet_mark(author: &str, condition: Condition) -> Write {
    Write::Put {
        table: Table::MergedAuthors,
        item: Item::new(author, MARK_ROW, Bytes::from_static(QUIET)),
        condition,
    }
}

/// Posting events of authors nobody follows: what their delivery job would have done.
#[derive(Clone)]
pub struct Quiet {
    notices: Notices,
    trim_turns: super::trim::TrimTurns,
    max_timeline_len: usize,
    status_retention: Duration,
}

impl Quiet {
    pub fn new(notices: Notices, max_timeline_len: usize, status_retention: Duration) -> Self {
        Quiet {
            notices,
            trim_turns: super::trim::TrimTurns::default(),
            max_timeline_len,
            status_retention,
        }
    }

    /// The writes that post `event` (received at `received`) with no job: the event's rows
    /// (its index noting the delivery done, no followers), its author's own timeline entry,
    /// and `guard`, the author's mark as [`audiences`] read it. Only `guard` has a condition:
    /// the writer makes the event's id its own (as a fold's cursor does).
    pub fn event_writes(&self, event: &Event, received: Ticks, guard: Write) -> Vec<Write> {
        let author = event.author.as_str();
        let delivered = DoneInCommit::now(received, 1, Some(0), self.status_retention);
        let mut writes: Vec<Write> = super::posting::event_rows(event, Some(delivered))
            .into_iter()
            .map(Write::unconditional)
            .collect();
        writes.push(Write::put(
            Table::Timelines,
            Item::new(author, &event.row_key, event.timeline_entry_body()),
        ));
        writes.push(guard);
        writes
    }

    /// Once the writes of `event` have committed: tells the author's live streams, and trims
    /// the author's timeline and sweeps its status records as often as a delivery would
    /// (nothing here fails: the event has landed).
    pub async fn posted(&self, store: &dyn Store, event: &Event) {
        super::fanout::after_delivery(
            store,
            (&self.notices, &self.trim_turns),
            &[event.author.as_str()],
            event,
            (self.max_timeline_len, self.status_retention),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::value::RawValue;
    use uuid::Uuid;

    use super::*;
    use crate::cursor::CursorCodec;
    use crate::jobs::Wake;
    use crate::keys::event_row_key;
    use crate::store::{EmbeddedStore, StoreError};
    use crate::timeline::{SubjectId, Timelines};

    async fn store() -> (tempfile::TempDir, EmbeddedStore) {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        (dir, store)
    }

    fn timelines(store: &EmbeddedStore) -> Timelines {
        Timelines::new(
            Arc::new(store.clone()),
            CursorCodec::new(b"test"),
            crate::config::Config::defaults().timeline_settings(),
            Wake::without_handoff(),
        )
    }

    fn quiet() -> Quiet {
        Quiet::new(Notices::local(), 800, Duration::from_secs(3600))
    }

    fn event(author: &str) -> Event {
        let (at, event_id) = (Ticks::now(), Uuid::now_v7());
        Event {
            event_id,
            author: SubjectId::parse(author).expect("id"),
            kind: "readings".into(),
            payload: RawValue::from_string("{}".into()).expect("json"),
            at,
            row_key: event_row_key(at, event_id),
            version: 1,
            edited_at: None,
            fanout: true,
        }
    }

    async fn audience_of(store: &EmbeddedStore, author: &str) -> Audience {
        audiences(store, &[author])
            .await
            .expect("audiences")
            .pop()
            .expect("one")
    }

    /// Posts `event` with no job, guarded as a fresh read of its author's audience says.
    async fn post_quietly(store: &EmbeddedStore, event: &Event) -> StoreResult<()> {
        let Audience::Quiet(guard) = audience_of(store, event.author.as_str()).await else {
            panic!("{} has followers", event.author);
        };
        store
            .transact(quiet().event_writes(event, event.at, guard))
            .await
    }

    #[tokio::test]
    async fn an_author_nobody_follows_is_quiet_and_its_event_is_its_own_entry_and_done() {
        let (_dir, store) = store().await;
        let first = event("probe");
        post_quietly(&store, &first).await.expect("first");
        // Marked quiet now: the next writer swaps on the mark instead of reading followers.
        let second = event("probe");
        post_quietly(&store, &second).await.expect("second");

        let own = store
            .query(Query::partition(Table::Timelines, "probe", 10))
            .await
            .expect("timeline");
        let rows: Vec<&str> = own.iter().map(|item| item.row.as_str()).collect();
        assert_eq!(rows, [second.row_key.as_str(), first.row_key.as_str()]);
        let status = crate::timeline::fanout::status::lookup(&store, "probe", first.event_id)
            .await
            .expect("lookup")
            .expect("a record");
        assert_eq!(
            status.state,
            crate::timeline::fanout::status::FanoutState::Done
        );
        assert_eq!((status.followers_total, status.delivered), (Some(0), 1));
        let jobs = crate::jobs::depth(&store, 100).await.expect("depth");
        assert_eq!(jobs, 0, "no job was enqueued");
    }

    #[tokio::test]
    async fn a_follow_between_the_read_and_the_write_fails_the_write() {
        let (_dir, store) = store().await;
        // Both first (mark absent) and later (mark quiet) writers lose to a follow.
        for marked in [false, true] {
            let author = format!("probe-{marked}");
            if marked {
                post_quietly(&store, &event(&author)).await.expect("quiet");
            }
            let Audience::Quiet(guard) = audience_of(&store, &author).await else {
                panic!("followed already");
            };
            let follower = SubjectId::parse("farmer").expect("id");
            timelines(&store)
                .follow(&follower, &SubjectId::parse(&author).expect("id"))
                .await
                .expect("follow");
            let late = event(&author);
            let refused = store
                .transact(quiet().event_writes(&late, late.at, guard))
                .await;
            assert!(
                matches!(refused, Err(StoreError::ConditionFailed)),
                "{author}: {refused:?}"
            );
            assert!(
                matches!(audience_of(&store, &author).await, Audience::Followed),
                "{author}: a follow's mark is never quiet again"
            );
        }
    }

    #[tokio::test]
    async fn followers_from_before_the_mark_are_found_by_reading_them() {
        let (_dir, store) = store().await;
        // An edge as a build without the mark wrote it: no mark.
        store
            .batch_write(vec![Write::put(
                Table::SubjectFollowers,
                Item::new("old", "farmer", Bytes::new()),
            )])
            .await
            .expect("edge");
        let found = audiences(&store, &["old", "new"]).await.expect("audiences");
        assert!(matches!(found[0], Audience::Followed), "{found:?}");
        assert!(matches!(found[1], Audience::Quiet(_)), "{found:?}");
    }
}
