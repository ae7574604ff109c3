//! Which of the timelines a fan-out just wrote to lost their edge to the author meanwhile.
//!
//! A fan-out reads the followers, then writes to their timelines. A reader who unfollows in
//! between has the unfollow's cleanup run, perhaps before the write lands, and the entry
//! would stay. So once its write is done, the fan-out takes its write back from each
//! follower whose edge is gone by then. An unfollow after that check is later than the write,
//! and its cleanup (which runs after the unfollow) deletes what the write left. Either way
//! nothing stays, however long the write took.
//!
//! Reading every edge again would cost as much as reading the followers. So a fan-out reads
//! its authors' unfollow marks (`merged_authors::unfollowed_mark`, which every unfollow's
//! transaction moves): before their followers, and again after its write. Only where a mark
//! moved does it read the edges of the followers it wrote to: by key for an event with few
//! (on DynamoDB, `BatchGetItem`s of 100 keys), as one range query for one with more
//! ([`Store::keys_cheaper_than_a_range`]).

use std::collections::HashSet;

use bytes::Bytes;

use crate::store::{Key, Query, Store, StoreResult, Table};
use crate::timeline::merged_authors;

/// An author's unfollow mark as a fan-out last read it.
pub(super) struct Mark {
    author: String,
    seen: Option<Bytes>,
}

impl Mark {
    /// `author`'s mark as read with other keys (`None`: never written).
    pub(super) fn new(author: &str, seen: Option<Bytes>) -> Mark {
        Mark {
            author: author.to_owned(),
            seen,
        }
    }

    /// The mark as last read (`None`: never written).
    pub(super) fn seen(&self) -> Option<&Bytes> {
        self.seen.as_ref()
    }

    /// Where the mark is, to read it with other keys.
    pub(super) fn key(&self) -> Key {
        merged_authors::unfollowed_key(&self.author)
    }

    /// Takes the mark as read after a write: whether an unfollow moved it since the last
    /// read. The next page's followers are read after this read, so it guards them next.
    pub(super) fn moved_to(&mut self, now: Option<Bytes>) -> bool {
        let moved = now != self.seen;
        self.seen = now;
        moved
    }

    /// Reads the mark again after a write (see [`Mark::moved_to`]).
    pub(super) async fn moved(&mut self, store: &dyn Store) -> StoreResult<bool> {
        let key = self.key();
        let now = store.get(key.table, &key.partition, &key.row).await?;
        Ok(self.moved_to(now))
    }
}

/// The timelines one fan-out wrote to: `author`'s followers `followers`.
pub(super) struct Written<'a> {
    pub author: &'a str,
    pub followers: Vec<&'a str>,
}

/// Of each `written`'s followers, those that no longer follow its author, in one round of
/// reads (and a further query for a range that new followers made longer than a page).
pub(super) async fn unfollowed<'a>(
    store: &dyn Store,
    written: &[Written<'a>],
) -> StoreResult<Vec<Vec<&'a str>>> {
    // Few followers are read by key (on DynamoDB all of a batch's in shared requests); more
    // as one range query of their author's followers.
    let by_key_up_to = store.keys_cheaper_than_a_range();
    let by_key = |written: &Written<'_>| written.followers.len() <= by_key_up_to;
    let keys: Vec<Key> = written
        .iter()
        .filter(|written| by_key(written))
        .flat_map(|written| {
            written
                .followers
                .iter()
                .map(|follower| Key::new(Table::SubjectFollowers, written.author, *follower))
        })
        .collect();
    let ranges: Vec<Range<'a>> = written
        .iter()
        .filter(|written| !by_key(written))
        .filter_map(Range::of)
        .collect();
    let (edges, first_pages) = futures::join!(
        async {
            if keys.is_empty() {
                Ok(Vec::new())
            } else {
                store.get_many(keys).await
            }
        },
        store.query_many(ranges.iter().map(|range| range.query(None)).collect()),
    );
    let mut edges = edges?.into_iter();
    let mut first_pages = first_pages?.into_iter().zip(&ranges);
    let mut answers = Vec::with_capacity(written.len());
    for written in written {
        if by_key(written) {
            answers.push(
                written
                    .followers
                    .iter()
                    .copied()
                    .zip(edges.by_ref())
                    .filter_map(|(follower, edge)| edge.is_none().then_some(follower))
                    .collect(),
            );
            continue;
        }
        let Some((mut page, range)) = first_pages.next() else {
            answers.push(Vec::new());
            continue;
        };
        let mut present = HashSet::new();
        loop {
            let more = page.len() >= range.limit
                && page
                    .last()
                    .is_some_and(|last| last.row.as_str() < range.last);
            let after = page.last().map(|last| last.row.clone());
            present.extend(page.into_iter().map(|item| item.row));
            if !more {
                break;
            }
            page = store.query(range.query(after)).await?;
        }
        answers.push(
            written
                .followers
                .iter()
                .copied()
                .filter(|follower| !present.contains(*follower))
                .collect(),
        );
    }
    Ok(answers)
}

/// The follower rows from the first to the last written to, read a page at a time.
struct Range<'a> {
    author: &'a str,
    first: &'a str,
    last: &'a str,
    limit: usize,
}

impl<'a> Range<'a> {
    fn of(written: &Written<'a>) -> Option<Range<'a>> {
        let first = written.followers.iter().copied().min()?;
        let last = written.followers.iter().copied().max()?;
        Some(Range {
            author: written.author,
            first,
            last,
            // As many as were written: one page unless followers joined in the range.
            limit: written.followers.len(),
        })
    }

    fn query(&self, after: Option<String>) -> Query {
        Query::partition(Table::SubjectFollowers, self.author, self.limit)
            .range(Some(self.first.to_owned()), None)
            .after(after)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::{Item, Write};

    async fn store_with_followers(
        author: &str,
        followers: &[&str],
    ) -> (tempfile::TempDir, Arc<dyn Store>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let store: Arc<dyn Store> = Arc::new(
            crate::store::EmbeddedStore::open_async(dir.path())
                .await
                .expect("open"),
        );
        let writes = followers
            .iter()
            .map(|follower| {
                Write::put(
                    Table::SubjectFollowers,
                    Item::new(author, *follower, bytes::Bytes::new()),
                )
            })
            .collect();
        store.batch_write(writes).await.expect("followers");
        (dir, store)
    }

    #[tokio::test]
    async fn finds_the_followers_gone_of_each_small_fan_out_by_key() {
        let (_dir, store) = store_with_followers("alice", &["b", "f"]).await;
        let written = [
            Written {
                author: "alice",
                followers: vec!["b", "d", "f", "h"],
            },
            Written {
                author: "nobody",
                followers: Vec::new(),
            },
            Written {
                author: "carol",
                followers: vec!["b"],
            },
        ];
        let gone = unfollowed(store.as_ref(), &written).await.expect("read");
        assert_eq!(gone, vec![vec!["d", "h"], Vec::new(), vec!["b"]]);
    }

    #[tokio::test]
    async fn finds_the_followers_gone_of_a_page_however_many_joined_in_its_range() {
        // A page written to 150 followers; two of them unfollowed since, and 120 joined
        // between them (past the page's length), and some after.
        let page: Vec<String> = (0..150).map(|n| format!("f{n:03}")).collect();
        let gone_since = ["f010", "f149"];
        let mut now: Vec<String> = page
            .iter()
            .filter(|follower| !gone_since.contains(&follower.as_str()))
            .cloned()
            .collect();
        now.extend((0..120).map(|n| format!("f050-{n:03}")));
        now.extend(["g", "h"].map(String::from));
        let now: Vec<&str> = now.iter().map(String::as_str).collect();
        let (_dir, store) = store_with_followers("alice", &now).await;
        let written = [
            Written {
                author: "alice",
                followers: page.iter().map(String::as_str).collect(),
            },
            Written {
                author: "alice",
                followers: vec!["f000", "f010"],
            },
        ];
        let gone = unfollowed(store.as_ref(), &written).await.expect("read");
        assert_eq!(gone, vec![gone_since.to_vec(), vec!["f010"]]);
    }

    /// A failed read is the write's failure (its jobs are retried), never "no one left".
    #[tokio::test]
    async fn a_failed_read_of_the_edges_is_an_error_by_key_and_by_range() {
        use crate::store::fault::{Calls, Fault, FaultyStore, Op};
        let (_dir, store) = store_with_followers("alice", &["a", "b"]).await;
        let few = [Written {
            author: "alice",
            followers: vec!["a", "b"],
        }];
        let page_of: Vec<String> = (0..=store.keys_cheaper_than_a_range())
            .map(|n| format!("f{n:03}"))
            .collect();
        let page = [Written {
            author: "alice",
            followers: page_of.iter().map(String::as_str).collect(),
        }];
        for (written, calls) in [
            (&few, Calls::on(Op::Get, Table::SubjectFollowers)),
            (&page, Calls::on(Op::Query, Table::SubjectFollowers)),
        ] {
            let faulty = FaultyStore::new(store.clone());
            faulty.fail_always(calls, Fault::Unavailable);
            let read = unfollowed(&faulty, written).await;
            assert!(
                matches!(read, Err(crate::store::StoreError::Unavailable(_))),
                "{calls:?}: {:?}",
                read.map(|gone| gone.len())
            );
        }
    }

    #[tokio::test]
    async fn finds_no_one_gone_when_every_edge_stays() {
        let (_dir, store) = store_with_followers("alice", &["a", "b", "c"]).await;
        let written = [Written {
            author: "alice",
            followers: vec!["c", "a"],
        }];
        let gone = unfollowed(store.as_ref(), &written).await.expect("read");
        assert_eq!(gone, vec![Vec::<&str>::new()]);
    }
}
