//! Where each queue shard's live jobs start, so that polls and counts need not read through
//! every job deleted before them.

use std::time::{Duration, Instant};

/// Where each queue shard's live jobs start. Jobs are keyed by time-ordered ids and deleted
/// when done, and on an LSM store (and on DynamoDB's partitions) a read from a shard's start
/// wades through every deletion not yet compacted: reads start from the first job the last
/// read of the shard found instead. Jobs can appear below that floor (a dead letter
/// re-queued, a job enqueued by a process whose clock is behind): a read from the very start
/// every so often (`full_scan_every`) finds them.
#[derive(Debug)]
pub struct Floors {
    full_scan_every: Duration,
    shards: std::collections::HashMap<u32, Floor>,
}

#[derive(Debug)]
struct Floor {
    row: Option<String>,
    full_scan_at: Instant,
}

impl Floors {
    /// Floors that send a read of each shard to its start every `full_scan_every`.
    pub fn new(full_scan_every: Duration) -> Floors {
        Floors {
            full_scan_every,
            shards: std::collections::HashMap::new(),
        }
    }

    /// Where the next read of `shard` starts: `None` for its start.
    pub fn from(&self, shard: u32, now: Instant) -> Option<String> {
        let floor = self.shards.get(&shard)?;
        if now.saturating_duration_since(floor.full_scan_at) >= self.full_scan_every {
            return None;
        }
        floor.row.clone()
    }

    /// Whether `shard` was last read from its start at least `every` before `now` (or never).
    pub fn read_whole_since(&self, shard: u32, now: Instant, every: Duration) -> bool {
        self.shards
            .get(&shard)
            .is_none_or(|floor| now.saturating_duration_since(floor.full_scan_at) >= every)
    }

    /// Notes what a read of `shard` found first (`full`: it read from the start).
    pub fn polled(&mut self, shard: u32, full: bool, first: Option<String>, now: Instant) {
        let floor = self.shards.entry(shard).or_insert_with(|| Floor {
            row: None,
            full_scan_at: now,
        });
        if full {
            floor.full_scan_at = now;
            floor.row = first;
        } else if first.is_some() {
            floor.row = first;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_start_at_the_first_job_last_read_and_from_the_start_every_so_often() {
        let start = Instant::now();
        let every = Duration::from_millis(500);
        let mut floors = Floors::new(every);
        assert_eq!(
            floors.from(3, start),
            None,
            "an unknown shard is read whole"
        );
        floors.polled(3, true, Some("job-b".into()), start);
        assert_eq!(floors.from(3, start).as_deref(), Some("job-b"));
        assert_eq!(floors.from(4, start), None, "each shard has its own floor");
        // A poll that read nothing keeps the floor; one that read a later job raises it.
        floors.polled(3, false, None, start);
        assert_eq!(floors.from(3, start).as_deref(), Some("job-b"));
        floors.polled(3, false, Some("job-d".into()), start);
        assert_eq!(floors.from(3, start).as_deref(), Some("job-d"));
        // Jobs may appear below the floor: the shard is read whole again after a while,
        // and that read sets the floor wherever its first job is.
        let soon = start + every / 10;
        assert!(!floors.read_whole_since(3, soon, every / 5));
        assert!(floors.read_whole_since(3, soon, every / 10));
        assert!(floors.read_whole_since(5, soon, every), "never read whole");
        let later = start + every;
        assert_eq!(floors.from(3, later), None);
        floors.polled(3, true, Some("job-a".into()), later);
        assert_eq!(floors.from(3, later).as_deref(), Some("job-a"));
    }
}
