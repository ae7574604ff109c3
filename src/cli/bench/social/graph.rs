//! The follow graph of the social workload: a power law of follower counts (Zipf's, with
//! exponent 1), deterministic from a seed, written straight into the edge tables.

use futures::{StreamExt, TryStreamExt};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::keys::Ticks;
use crate::store::{Item, Store, Table, Write};
use crate::timeline::Edge;

/// Edge writes per store batch while the graph is written, and batches in flight at once
/// (so the embedded store's writer commits several per fsync).
const EDGE_BATCH: usize = 5_000;
const BATCHES_IN_FLIGHT: usize = 4;

/// Who follows whom: `users` subjects, the first `authors` of which post.
pub(super) struct Graph {
    /// Followers of each author, by author index.
    pub followers: Vec<u32>,
    /// Subjects in all: authors, and readers who only follow.
    pub users: usize,
}

impl Graph {
    /// The author with the `r`-th most followers (from 1) has `max_followers / r` of them,
    /// at least 1: with 20,000 authors and 30,000 at the top, half have 1 or 2, 98.5 % have
    /// at most 100 and three have 10,000 or more. Ranks are dealt to authors at random.
    pub fn power_law(authors: usize, max_followers: usize, seed: u64) -> Graph {
        let users = authors.max(max_followers + 1);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut ranks: Vec<usize> = (1..=authors).collect();
        ranks.shuffle(&mut rng);
        let followers = ranks
            .into_iter()
            .map(|rank| {
                let count = (max_followers / rank).clamp(1, users - 1);
                u32::try_from(count).unwrap_or(u32::MAX)
            })
            .collect();
        Graph { followers, users }
    }

    pub fn authors(&self) -> usize {
        self.followers.len()
    }

    pub fn edges(&self) -> u64 {
        self.followers.iter().map(|count| u64::from(*count)).sum()
    }

    /// Authors with at least `count` followers.
    pub fn authors_with_at_least(&self, count: u32) -> usize {
        self.followers.iter().filter(|&&have| have >= count).count()
    }

    /// Writes both directions of every edge, in plain batch writes: the edge items the
    /// domain's follow writes (without its transaction, backfill or merge bookkeeping, which
    /// a fresh graph does not need). Author `a`'s followers are the users at `start + k *
    /// stride` (mod users), for random `start` and a `stride` prime to `users`, skipping `a`.
    pub async fn write(&self, store: &dyn Store, seed: u64) -> anyhow::Result<()> {
        let since = Edge::encode_since(Ticks::now());
        let users = self.users;
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_f011);
        let mut batches: Vec<Vec<Write>> = Vec::new();
        let mut writes = Vec::with_capacity(EDGE_BATCH);
        for (author, &count) in self.followers.iter().enumerate() {
            let start = rng.random_range(0..users);
            let stride = loop {
                let candidate = rng.random_range(1..users.max(2));
                if gcd(candidate, users) == 1 {
                    break candidate;
                }
            };
            let author_name = user_name(author);
            let mut taken = 0;
            let mut step = 0;
            while taken < count as usize {
                let follower = (start + step * stride) % users;
                step += 1;
                if follower == author {
                    continue;
                }
                taken += 1;
                let follower_name = user_name(follower);
                writes.push(Write::put(
                    Table::SubjectFollowers,
                    Item::new(&author_name, &follower_name, since.clone()),
                ));
                writes.push(Write::put(
                    Table::SubjectFollowing,
                    Item::new(&follower_name, &author_name, since.clone()),
                ));
                if writes.len() >= EDGE_BATCH {
                    batches.push(std::mem::replace(
                        &mut writes,
                        Vec::with_capacity(EDGE_BATCH),
                    ));
                }
            }
        }
        if !writes.is_empty() {
            batches.push(writes);
        }
        futures::stream::iter(batches)
            .map(|batch| store.batch_write(batch))
            .buffer_unordered(BATCHES_IN_FLIGHT)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }
}

/// The subject id of user `index` (authors are the first users).
pub(super) fn user_name(index: usize) -> String {
    format!("user-{index:06}")
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_graph_has_most_authors_under_100_followers_and_a_few_over_10000() {
        let graph = Graph::power_law(20_000, 30_000, 1);
        assert_eq!(graph.authors(), 20_000);
        assert_eq!(graph.users, 30_001);
        assert_eq!(graph.authors_with_at_least(10_000), 3);
        let at_most_100 = graph
            .followers
            .iter()
            .filter(|&&count| count <= 100)
            .count();
        assert!(at_most_100 * 100 >= 98 * graph.authors(), "{at_most_100}");
        assert!(graph.followers.iter().all(|&count| count >= 1));
        assert_eq!(
            graph.followers,
            Graph::power_law(20_000, 30_000, 1).followers,
            "the same seed deals the same ranks"
        );
    }

    #[tokio::test]
    async fn every_author_gets_its_count_of_distinct_followers_never_itself() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = crate::store::EmbeddedStore::open_async(dir.path())
            .await
            .expect("open");
        let graph = Graph::power_law(30, 12, 3);
        graph.write(&store, 3).await.expect("write");
        for (author, &count) in graph.followers.iter().enumerate() {
            let rows = store
                .query(crate::store::Query::partition(
                    Table::SubjectFollowers,
                    user_name(author),
                    1_000,
                ))
                .await
                .expect("query");
            assert_eq!(rows.len(), count as usize, "author {author}");
            assert!(rows.iter().all(|item| item.row != user_name(author)));
        }
    }
}
