//! The start-up check that the queue holds only jobs this build can read.
//!
//! Jobs outlive the process that wrote them. A build that misread a job of another format
//! could deliver the wrong thing or lose it, so the store records the job format in `meta`
//! on first start, and a process whose format differs refuses to start, saying why. The
//! head of each shard is also looked at, for queues written before the format was recorded.

use bytes::Bytes;

use super::job::{FORMAT, Job, SHARDS, shard_name};
use super::queue::SCAN_LIMIT;
use super::{JobError, JobResult};
use crate::store::{Condition, Item, Query, Store, StoreError, Table};

const PARTITION: &str = "settings";
const ROW: &str = "job-format";

/// Checks that every job the queue holds is of this build's format (recording it on first
/// start). A clear error if not, naming the format found.
pub async fn check(store: &dyn Store) -> JobResult<()> {
    let recorded = match store.get(Table::Meta, PARTITION, ROW).await? {
        Some(value) => value,
        None => {
            let ours = Bytes::from(FORMAT.to_string());
            let item = Item::new(PARTITION, ROW, ours.clone());
            match store.put(Table::Meta, item, Condition::Absent).await {
                Ok(()) => ours,
                Err(StoreError::ConditionFailed) => store
                    .get(Table::Meta, PARTITION, ROW)
                    .await?
                    .unwrap_or(ours),
                Err(err) => return Err(err.into()),
            }
        }
    };
    let found = String::from_utf8_lossy(&recorded)
        .trim()
        .parse::<u32>()
        .map_err(|_| JobError::Corrupt(format!("job format in meta: {recorded:?}")))?;
    if found != FORMAT {
        return Err(JobError::UnknownFormat { found });
    }
    for shard in 0..SHARDS {
        let head = store
            .query(Query::partition(Table::Jobs, shard_name(shard), SCAN_LIMIT))
            .await?;
        for item in head {
            Job::decode(&item.row, &item.value)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{EmbeddedStore, Write};

    #[tokio::test]
    async fn a_store_with_jobs_of_an_unknown_format_is_refused_at_start() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
        check(&store)
            .await
            .expect("a fresh store records our format");
        check(&store).await.expect("and accepts it again");

        // A job left by an older build, which wrote no format.
        store
            .batch_write(vec![Write::put(
                Table::Jobs,
                Item::new(
                    shard_name(3),
                    "old-job",
                    &br#"{"author":"a","enqueued_at":1}"#[..],
                ),
            )])
            .await
            .expect("old job");
        let refused = check(&store).await.expect_err("refused");
        assert!(matches!(refused, JobError::UnknownFormat { found: 0 }));
        assert!(refused.to_string().contains("format 0"), "{refused}");

        // A store a newer build has recorded its format in.
        let newer = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open_async(newer.path()).await.expect("open");
        store
            .put(
                Table::Meta,
                Item::new(PARTITION, ROW, &b"2"[..]),
                Condition::None,
            )
            .await
            .expect("meta");
        assert!(matches!(
            check(&store).await,
            Err(JobError::UnknownFormat { found: 2 })
        ));
    }
}
