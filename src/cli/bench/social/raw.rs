//! The bound the 10,000-follower fan-out is held against: a bare fjall loop writing the same
//! timeline entries (same keys, same values, as the embedded store lays them out) in batches
//! of one fan-out page, each batch committed and fsync'd as the embedded store's writer does
//! (`manual_journal_persist`, `commit`, then `persist(SyncAll)`, into a keyspace laid out
//! as the store's timelines are), one thread, nothing else.

use std::time::{Duration, Instant};

use anyhow::Context;
use fjall::{Database, PersistMode};

/// One entry to write: the owner's timeline, the row key and the stored value.
pub(in crate::cli::bench) struct RawEntry {
    pub row: String,
    pub value: Vec<u8>,
}

/// What the loop did.
#[derive(Debug)]
pub(in crate::cli::bench) struct RawRun {
    pub entries: u64,
    pub elapsed: Duration,
    pub batch: usize,
}

/// Writes every entry of `events` to every owner's timeline, event by event, `batch`
/// entries a commit, into a fresh database in `dir`. Blocking: run it off the executor.
pub(in crate::cli::bench) fn insert_loop(
    dir: &std::path::Path,
    owners: &[String],
    events: &[RawEntry],
    batch: usize,
) -> anyhow::Result<RawRun> {
    let batch = batch.max(1);
    // Opened as the embedded store opens its database, so that the comparison is fair.
    let db = crate::store::open_database(
        Database::builder(dir)
            .manual_journal_persist(true)
            .worker_threads(crate::store::FJALL_WORKER_THREADS),
    )
    .context("failed to open the raw fjall database")?;
    let keyspace = db
        .keyspace("timelines", || {
            crate::store::keyspace_options(crate::store::Table::Timelines)
        })
        .context("failed to open the raw keyspace")?;
    let started = Instant::now();
    let mut entries = 0u64;
    let mut pending = db.batch();
    let mut in_batch = 0;
    for event in events {
        for owner in owners {
            pending.insert(&keyspace, entry_key(owner, &event.row), event.value.clone());
            in_batch += 1;
            if in_batch == batch {
                std::mem::replace(&mut pending, db.batch())
                    .commit()
                    .context("a raw commit failed")?;
                db.persist(PersistMode::SyncAll)
                    .context("a raw fsync failed")?;
                entries += in_batch as u64;
                in_batch = 0;
            }
        }
    }
    if in_batch > 0 {
        pending.commit().context("a raw commit failed")?;
        db.persist(PersistMode::SyncAll)
            .context("a raw fsync failed")?;
        entries += in_batch as u64;
    }
    Ok(RawRun {
        entries,
        elapsed: started.elapsed(),
        batch,
    })
}

/// The embedded store's key: the partition's length (u16, big-endian), the partition, the
/// row key.
fn entry_key(partition: &str, row: &str) -> Vec<u8> {
    let length = u16::try_from(partition.len()).unwrap_or(u16::MAX);
    let mut key = Vec::with_capacity(2 + partition.len() + row.len());
    key.extend_from_slice(&length.to_be_bytes());
    key.extend_from_slice(partition.as_bytes());
    key.extend_from_slice(row.as_bytes());
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_raw_loop_writes_every_entry_of_every_owner() {
        let dir = tempfile::tempdir().expect("temp dir");
        let owners: Vec<String> = (0..7).map(|i| format!("owner-{i}")).collect();
        let events: Vec<RawEntry> = (0..3)
            .map(|i| RawEntry {
                row: format!("row-{i}"),
                value: vec![b'x'; 40],
            })
            .collect();
        let run = insert_loop(dir.path(), &owners, &events, 5).expect("loop");
        assert_eq!(run.entries, 21);
        // Through the store's opener, as every database of this process: the store's tests
        // check that every fjall thread runs lowered.
        let db = crate::store::open_database(Database::builder(dir.path())).expect("reopen");
        let keyspace = db
            .keyspace("timelines", fjall::KeyspaceCreateOptions::default)
            .expect("keyspace");
        assert_eq!(keyspace.iter().count(), 21);
    }
}
