//! The followers of authors whose fan-outs ran lately, kept with the two marks they were read
//! under, so that a fan-out of the same author reads two rows, not a range: a small one, a
//! big one's first job, and each part of a split one (see `held`).
//!
//! Every change to an author's `subjectFollowers` moves one of the author's two marks in its
//! own transaction: a follow the audience mark, an unfollow the unfollow mark, an edge repair
//! the one its change needs (see `edge_repair`). Each move writes a fresh UUIDv7, so a mark
//! never reads as an earlier value again. Followers read after both marks are therefore the
//! author's followers for as long as both marks read as they were: a fan-out that reads the
//! marks and finds them as they were when the followers were read has the followers it would
//! read now, whichever process changed them.

use std::sync::Arc;

use bytes::Bytes;

use crate::store::{Key, Store, StoreResult};
use crate::timeline::merged_authors;

/// Bytes of followers kept: at 50 followers of 12 bytes each, about 4,000 authors; at 10,000,
/// about 40 (an author heavier than the cache's share of a shard is not kept).
const KNOWN_BYTES: u64 = 16 * 1024 * 1024;
/// Bytes an author's entry takes beyond its texts (the cache's entry, the two marks).
const ENTRY_OVERHEAD: u64 = 160;
/// Bytes a follower takes beyond its text (its `String` in the list).
const FOLLOWER_OVERHEAD: u64 = 24;

/// An author's two marks as read: `None` for one never written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Marks {
    pub audience: Option<Bytes>,
    pub unfollowed: Option<Bytes>,
}

impl Marks {
    /// Where `author`'s marks are: the audience mark, then the unfollow mark.
    pub fn keys(author: &str) -> [Key; 2] {
        [
            merged_authors::audience_key(author),
            merged_authors::unfollowed_key(author),
        ]
    }

    /// Reads `author`'s marks, in one round.
    pub async fn read(store: &dyn Store, author: &str) -> StoreResult<Marks> {
        let mut marks = store
            .get_many(Marks::keys(author).into())
            .await?
            .into_iter();
        Ok(Marks {
            audience: marks.next().flatten(),
            unfollowed: marks.next().flatten(),
        })
    }
}

struct Known {
    marks: Marks,
    followers: Arc<[String]>,
}

/// The bytes an author's entry holds, for the cache's bound.
#[derive(Clone)]
struct KnownBytes;

impl quick_cache::Weighter<String, Arc<Known>> for KnownBytes {
    fn weight(&self, author: &String, known: &Arc<Known>) -> u64 {
        let followers: u64 = known
            .followers
            .iter()
            .map(|follower| follower.len() as u64 + FOLLOWER_OVERHEAD)
            .sum();
        author.len() as u64 + followers + ENTRY_OVERHEAD
    }
}

/// Followers as last read, per author; cheap to clone (clones share the entries).
#[derive(Clone)]
pub(super) struct KnownFollowers(Arc<quick_cache::sync::Cache<String, Arc<Known>, KnownBytes>>);

impl KnownFollowers {
    pub fn new() -> Self {
        Self::with_bytes(KNOWN_BYTES)
    }

    fn with_bytes(bytes: u64) -> Self {
        KnownFollowers(Arc::new(quick_cache::sync::Cache::with_weighter(
            (bytes / 1024) as usize,
            bytes,
            KnownBytes,
        )))
    }

    /// `author`'s followers, if they were read under `marks` as they read now.
    pub fn get(&self, author: &str, marks: &Marks) -> Option<Arc<[String]>> {
        self.0
            .get(author)
            .filter(|known| known.marks == *marks)
            .map(|known| known.followers.clone())
    }

    /// Keeps `followers` of `author`'s, read after `marks` were.
    pub fn remember(&self, author: &str, marks: Marks, followers: Arc<[String]>) {
        self.0
            .insert(author.to_owned(), Arc::new(Known { marks, followers }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks(audience: &'static [u8], unfollowed: Option<&'static [u8]>) -> Marks {
        Marks {
            audience: Some(Bytes::from_static(audience)),
            unfollowed: unfollowed.map(Bytes::from_static),
        }
    }

    #[test]
    fn followers_are_known_only_under_the_marks_they_were_read_under() {
        let known = KnownFollowers::new();
        let read_under = marks(b"a1", None);
        known.remember(
            "alice",
            read_under.clone(),
            ["bob".into(), "carol".into()].into(),
        );
        assert_eq!(
            known.get("alice", &read_under).as_deref(),
            Some(&["bob".to_owned(), "carol".to_owned()][..])
        );
        // A follow moved the audience mark; an unfollow wrote the first unfollow mark.
        assert_eq!(known.get("alice", &marks(b"a2", None)), None);
        assert_eq!(known.get("alice", &marks(b"a1", Some(b"u1"))), None);
        assert_eq!(known.get("bob", &read_under), None);
    }

    #[test]
    fn the_followers_kept_stay_within_their_bytes() {
        let known = KnownFollowers::with_bytes(64 * 1024);
        let followers: Arc<[String]> = (0..100).map(|n| format!("follower-{n:04}")).collect();
        for author in 0..1000 {
            known.remember(
                &format!("author-{author}"),
                marks(b"a", None),
                followers.clone(),
            );
        }
        let kept: u64 = (0..1000)
            .filter_map(|author| known.get(&format!("author-{author}"), &marks(b"a", None)))
            .map(|followers| followers.len() as u64)
            .sum();
        // An author's entry weighs 100 * (13 + 24) + 11 + 160 bytes.
        assert!(kept > 0, "nothing kept");
        assert!(kept * (13 + 24) <= 64 * 1024, "{kept} followers kept");
    }
}
