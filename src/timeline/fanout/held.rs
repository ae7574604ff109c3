//! Followers a fan-out job works through from memory, rather than page by page from the
//! store.
//!
//! A job holds them when it read them all at its start (a fresh job's one read, which also
//! tells whether to split), or when its author's followers are known under the two marks it
//! read first (see `known`): a part of a split event, or a job resumed from its checkpoint,
//! then takes its range of them and reads none.
//!
//! They hold for as long as the author's unfollow mark reads as it did before they were
//! read. Once the check after a page's write finds that an unfollow moved it, the rest are
//! read from the store, after that read of the mark, so that the check after each of their
//! pages guards them. A follow since needs nothing: the new reader's backfill copies the
//! events posted before the follow, this one among them.

use std::sync::Arc;

use bytes::Bytes;

/// A job's followers in memory, and how far it has got through them.
pub(super) struct HeldFollowers {
    /// In row-key order.
    followers: Arc<[String]>,
    /// The next one to work on.
    next: usize,
    /// Past the last one the job works on.
    end: usize,
    /// Whether they are all the followers the job has left: if not, it reads on past them.
    complete: bool,
    /// The unfollow mark as read before them.
    under: Option<Bytes>,
}

impl HeldFollowers {
    /// `followers` read after the unfollow mark read `under`; `complete` if they are all
    /// the followers the job works on.
    pub fn all(followers: Arc<[String]>, complete: bool, under: Option<Bytes>) -> Self {
        let end = followers.len();
        HeldFollowers {
            followers,
            next: 0,
            end,
            complete,
            under,
        }
    }

    /// The followers left to a job whose range of followers starts at `start` (included)
    /// and ends before `end`, with `cursor` the last one it worked on: all it has left, cut
    /// from an author's `known` followers.
    pub fn left_of(
        known: Arc<[String]>,
        (start, end): (Option<&str>, Option<&str>),
        cursor: Option<&str>,
        under: Option<Bytes>,
    ) -> Self {
        let first = start.map_or(0, |start| {
            known.partition_point(|follower| follower.as_str() < start)
        });
        let past_cursor = cursor.map_or(0, |cursor| {
            known.partition_point(|follower| follower.as_str() <= cursor)
        });
        let end = end.map_or(known.len(), |end| {
            known.partition_point(|follower| follower.as_str() < end)
        });
        HeldFollowers {
            next: first.max(past_cursor).min(end),
            end,
            complete: true,
            under,
            followers: known,
        }
    }

    /// The next page of up to `size` followers, and whether it is the job's last; `None`
    /// once those in hand are spent and the rest must be read.
    pub fn page(&self, size: usize) -> Option<(&[String], bool)> {
        if self.next >= self.end && !self.complete {
            return None;
        }
        let to = self.next.saturating_add(size).min(self.end);
        let page = self.followers.get(self.next..to).unwrap_or_default();
        Some((page, to == self.end && self.complete))
    }

    /// Moves past the page just worked on.
    pub fn took(&mut self, count: usize) {
        self.next = self.next.saturating_add(count).min(self.end);
    }

    /// Whether they still hold, the author's unfollow mark having last read `seen`.
    pub fn holds(&self, seen: Option<&Bytes>) -> bool {
        self.under.as_ref() == seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> Arc<[String]> {
        ["a", "c", "e", "g", "i"]
            .into_iter()
            .map(String::from)
            .collect()
    }

    fn pages(mut hand: HeldFollowers, size: usize) -> Vec<(Vec<String>, bool)> {
        let mut pages = Vec::new();
        while let Some((page, last)) = hand.page(size) {
            let taken = page.len();
            pages.push((page.to_vec(), last));
            if last {
                break;
            }
            hand.took(taken);
        }
        pages
    }

    fn texts(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn a_range_past_a_cursor_is_cut_from_the_known_followers() {
        // Range [c, i), resumed after "c": e and g are left.
        let hand = HeldFollowers::left_of(known(), (Some("c"), Some("i")), Some("c"), None);
        assert_eq!(pages(hand, 10), vec![(texts(&["e", "g"]), true)]);
        // Bounds between names, and a cursor before the range's start.
        let hand = HeldFollowers::left_of(known(), (Some("b"), Some("f")), Some("a"), None);
        assert_eq!(
            pages(hand, 1),
            vec![(texts(&["c"]), false), (texts(&["e"]), true)]
        );
        // Nothing left: one empty last page, so the job still ends (and writes the author's
        // own entry if it is the event's first).
        let hand = HeldFollowers::left_of(known(), (None, None), Some("i"), None);
        assert_eq!(pages(hand, 10), vec![(Vec::new(), true)]);
    }

    #[test]
    fn followers_read_first_that_are_not_all_give_way_to_reads() {
        let hand = HeldFollowers::all(known(), false, None);
        // Two full pages, then nothing: the job reads on past "i".
        assert_eq!(pages(hand, 3).len(), 2);
        let mut hand = HeldFollowers::all(known(), false, None);
        hand.took(5);
        assert!(hand.page(3).is_none());
    }

    #[test]
    fn they_hold_only_under_the_mark_they_were_read_under() {
        let hand = HeldFollowers::all(known(), true, Some(Bytes::from_static(b"u1")));
        assert!(hand.holds(Some(&Bytes::from_static(b"u1"))));
        assert!(!hand.holds(Some(&Bytes::from_static(b"u2"))));
        assert!(!hand.holds(None));
    }
}
