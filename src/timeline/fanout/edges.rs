//! Which of the timelines a fan-out just wrote to lost their edge to the author meanwhile.
//!
//! A fan-out reads the followers, then writes to their timelines. A reader who unfollows in
//! between has the unfollow's cleanup run, perhaps before the write lands, and the entry
//! would stay. So once its write is done, the fan-out reads those followers' edges again
//! and undoes its write for each one gone. An unfollow this second read does not see is
//! later than the write, and its cleanup (which runs after the unfollow) deletes what the
//! write left. Either way nothing stays, however long the write took.
//!
//! The second read is one query per author over the range of followers written to: one
//! request for a page of them, and for all the small fan-outs of a batch together.

use std::collections::HashSet;

use crate::store::{Query, Store, StoreResult, Table};

/// The timelines one fan-out wrote to: `author`'s followers `followers`.
pub(super) struct Written<'a> {
    pub author: &'a str,
    pub followers: Vec<&'a str>,
}

/// Of each `written`'s followers, those that no longer follow its author, in one round of
/// queries (and a further query for a range that new followers made longer than a page).
pub(super) async fn unfollowed<'a>(
    store: &dyn Store,
    written: &[Written<'a>],
) -> StoreResult<Vec<Vec<&'a str>>> {
    let ranges: Vec<Option<Range<'a>>> = written.iter().map(Range::of).collect();
    let first_pages = store
        .query_many(
            ranges
                .iter()
                .flatten()
                .map(|range| range.query(None))
                .collect(),
        )
        .await?;
    let mut first_pages = first_pages.into_iter();
    let mut answers = Vec::with_capacity(written.len());
    for (range, written) in ranges.iter().zip(written) {
        let Some(range) = range else {
            answers.push(Vec::new());
            continue;
        };
        let mut page = first_pages.next().unwrap_or_default();
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
    async fn finds_the_followers_gone_however_many_joined_in_their_range() {
        // Written to b, d, f, h of alice; d and h unfollowed since, and many joined between.
        let mut now: Vec<String> = vec!["b".into(), "f".into()];
        now.extend((0..50).map(|n| format!("c{n:02}")));
        now.extend((0..50).map(|n| format!("e{n:02}")));
        now.push("z".into());
        let now: Vec<&str> = now.iter().map(String::as_str).collect();
        let (_dir, store) = store_with_followers("alice", &now).await;
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
                followers: vec!["y"],
            },
        ];
        let gone = unfollowed(store.as_ref(), &written).await.expect("read");
        assert_eq!(gone, vec![vec!["d", "h"], Vec::new(), vec!["y"]]);
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
