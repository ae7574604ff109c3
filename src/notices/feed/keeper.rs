//! The keeper: this process's registry row, the deletion of its old records, and the sweep of
//! processes gone for long.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Context, FeedStats, PROCESSES, log_partition, seq_row, unix_millis};
use crate::store::{Condition, Item, Query, StoreError, StoreExt, Table, Write};

/// Log rows deleted a page at a time when a process is forgotten.
const SWEEP_PAGE_ROWS: usize = 100;

/// Every `keep_interval` until `stop`: refresh the registry row, delete old records, sweep.
pub(super) async fn run(context: Arc<Context>, stop: CancellationToken) {
    loop {
        register(&context).await;
        delete_old_records(&context).await;
        sweep(&context).await;
        tokio::select! {
            () = tokio::time::sleep(context.settings.keep_interval) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// A registry row's value: when its process was last seen, in milliseconds since the Unix
/// epoch, as decimal text (readable with any tool that reads the table).
fn seen_value(millis: u64) -> Bytes {
    Bytes::from(millis.to_string())
}

/// When a registry row's process was last seen; `None` for a value this build cannot read.
pub(super) fn last_seen(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

async fn register(context: &Context) {
    let row = Item::new(
        PROCESSES,
        context.process_id.clone(),
        seen_value(unix_millis()),
    );
    if let Err(error) = context
        .store
        .put(Table::Notices, row, Condition::None)
        .await
    {
        warn!(%error, "could not refresh this process's row in the notices registry");
    }
}

/// Deletes this process's records older than the retention.
async fn delete_old_records(context: &Context) {
    let Some(cutoff) = Instant::now().checked_sub(context.settings.retention) else {
        return;
    };
    let old: Vec<(u64, Instant)> = {
        let mut written = context.written();
        let keep = written.partition_point(|(_, at)| *at <= cutoff);
        written.drain(..keep).collect()
    };
    if old.is_empty() {
        return;
    }
    let partition = log_partition(&context.process_id);
    let deletes = old
        .iter()
        .map(|(seq, _)| Write::delete(Table::Notices, partition.clone(), seq_row(*seq)))
        .collect();
    match context.store.batch_write(deletes).await {
        Ok(()) => FeedStats::add(&context.stats.records_deleted, old.len() as u64),
        Err(error) => {
            warn!(%error, records = old.len(), "could not delete old notice records; trying again later");
            let mut written = context.written();
            for entry in old.into_iter().rev() {
                written.push_front(entry);
            }
        }
    }
}

/// Forgets the processes not seen for `forget_after`: deletes their logs, then their rows.
/// Any process may do it, several at once: deleting twice is harmless.
async fn sweep(context: &Context) {
    let rows = match context
        .store
        .query_all(Query::partition(Table::Notices, PROCESSES, 1000))
        .await
    {
        Ok(rows) => rows,
        Err(error) => {
            warn!(%error, "could not list the processes publishing notices");
            return;
        }
    };
    let now_millis = unix_millis();
    let forget_millis =
        u64::try_from(context.settings.forget_after.as_millis()).unwrap_or(u64::MAX);
    for row in rows {
        if row.row == context.process_id {
            continue;
        }
        let Some(seen) = last_seen(&row.value) else {
            continue;
        };
        if now_millis.saturating_sub(seen) > forget_millis {
            forget(context, &row.row, row.value).await;
        }
    }
}

async fn forget(context: &Context, process: &str, seen: Bytes) {
    let partition = log_partition(process);
    loop {
        let page = match context
            .store
            .query(Query::partition(
                Table::Notices,
                partition.clone(),
                SWEEP_PAGE_ROWS,
            ))
            .await
        {
            Ok(page) => page,
            Err(error) => {
                warn!(%error, process, "could not read the log of a process gone");
                return;
            }
        };
        if page.is_empty() {
            break;
        }
        let last_page = page.len() < SWEEP_PAGE_ROWS;
        let deletes = page
            .into_iter()
            .map(|item| Write::delete(Table::Notices, partition.clone(), item.row))
            .collect();
        if let Err(error) = context.store.batch_write(deletes).await {
            warn!(%error, process, "could not delete the log of a process gone");
            return;
        }
        if last_page {
            break;
        }
    }
    // Only if not refreshed meanwhile: a process that was merely paused keeps its row.
    match context
        .store
        .delete(Table::Notices, PROCESSES, process, Condition::Equals(seen))
        .await
    {
        Ok(()) => {
            FeedStats::add(&context.stats.processes_swept, 1);
            info!(process, "forgot a process gone for long, and its notices");
        }
        Err(StoreError::ConditionFailed) => {}
        Err(error) => warn!(%error, process, "could not delete the registry row of a process gone"),
    }
}
