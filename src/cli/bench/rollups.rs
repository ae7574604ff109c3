//! The rollups part of `fanline bench series`: one year of a 1 Hz series written through
//! the domain, then a stepped read of the whole year at `step=1d` from rollups and from raw
//! points (rows read and time, and the two answers compared bit for bit), and the bytes per
//! point the rollups add on disk (embedded store only).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::jobs::Wake;
use anyhow::Context;
use async_trait::async_trait;
use bytes::Bytes;
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::sensor::write_seconds_in;
use super::{BenchStore, millis, percentile};
use crate::config::StoreKind;
use crate::cursor::CursorCodec;
use crate::series::layout::{PARTITION_SPAN, day_start};
use crate::series::{Aggregate, Range, Rollups, Series, SeriesName};
use crate::store::{Condition, Item, Key, Query, Store, StoreResult, Table, Write};
use crate::timeline::cursor_key;

/// Points per write: 8 hours at 1 Hz, 48 rows and their rollups, one transaction.
const WRITE_SECONDS: u64 = 8 * 3_600;

/// A store that counts the rows its reads return.
pub(crate) struct CountingStore {
    inner: Arc<dyn Store>,
    rows: AtomicU64,
}

impl CountingStore {
    pub(crate) fn new(inner: Arc<dyn Store>) -> CountingStore {
        CountingStore {
            inner,
            rows: AtomicU64::new(0),
        }
    }

    /// Rows read since the last call.
    pub(crate) fn take_rows(&self) -> u64 {
        self.rows.swap(0, Ordering::Relaxed)
    }

    fn count(&self, rows: usize) {
        self.rows.fetch_add(rows as u64, Ordering::Relaxed);
    }
}

#[async_trait]
impl Store for CountingStore {
    async fn get(&self, table: Table, partition: &str, row: &str) -> StoreResult<Option<Bytes>> {
        let value = self.inner.get(table, partition, row).await?;
        self.count(usize::from(value.is_some()));
        Ok(value)
    }

    async fn get_many(&self, keys: Vec<Key>) -> StoreResult<Vec<Option<Bytes>>> {
        let values = self.inner.get_many(keys).await?;
        self.count(values.iter().flatten().count());
        Ok(values)
    }

    async fn put(&self, table: Table, item: Item, condition: Condition) -> StoreResult<()> {
        self.inner.put(table, item, condition).await
    }

    async fn delete(
        &self,
        table: Table,
        partition: &str,
        row: &str,
        condition: Condition,
    ) -> StoreResult<()> {
        self.inner.delete(table, partition, row, condition).await
    }

    async fn transact(&self, writes: Vec<Write>) -> StoreResult<()> {
        self.inner.transact(writes).await
    }

    async fn batch_write(&self, writes: Vec<Write>) -> StoreResult<()> {
        self.inner.batch_write(writes).await
    }

    async fn query(&self, query: Query) -> StoreResult<Vec<Item>> {
        let items = self.inner.query(query).await?;
        self.count(items.len());
        Ok(items)
    }

    async fn query_many(&self, queries: Vec<Query>) -> StoreResult<Vec<Vec<Item>>> {
        let answers = self.inner.query_many(queries).await?;
        self.count(answers.iter().map(Vec::len).sum());
        Ok(answers)
    }

    async fn ping(&self) -> StoreResult<()> {
        self.inner.ping().await
    }

    fn keys_cheaper_than_a_range(&self) -> usize {
        self.inner.keys_cheaper_than_a_range()
    }

    fn commits_at_once(&self, writes: &[Write]) -> bool {
        self.inner.commits_at_once(writes)
    }

    fn limits(&self) -> crate::store::Limits {
        self.inner.limits()
    }
}

/// Writes `days` days of a 1 Hz series ending before `end_day`, then times the stepped
/// reads and measures the disk.
pub(super) async fn year_read(
    kind: StoreKind,
    dynamodb_endpoint: Option<&str>,
    parent: &std::path::Path,
    days: u64,
    end_day: u64,
    samples: usize,
) -> anyhow::Result<()> {
    let bench_store = BenchStore::open(kind, dynamodb_endpoint, parent).await?;
    let counting = Arc::new(CountingStore::new(bench_store.store.clone()));
    let key = cursor_key(counting.as_ref())
        .await
        .context("failed to read the cursor key")?;
    let series = Series::new(
        counting.clone(),
        CursorCodec::new(&key),
        Wake::without_handoff(),
    );
    let name = SeriesName::parse("bench-rollup-year").map_err(anyhow::Error::msg)?;
    let start = day_start(end_day.saturating_sub(days));
    let seconds = days * 86_400;
    let mut noise = StdRng::seed_from_u64(365);
    let started = Instant::now();
    write_seconds_in(&series, &name, (start, seconds), WRITE_SECONDS, &mut noise)
        .await
        .context("failed to write the year")?;
    println!(
        "rollups: wrote {seconds} points ({days} days at 1 Hz) through Series::write in writes of {WRITE_SECONDS} in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let range = Range::new(Some(start), Some(start + days * PARTITION_SPAN))
        .map_err(|err| anyhow::anyhow!("{err}"))?;
    let mut answers = Vec::new();
    for (label, rollups, runs) in [
        ("rollups", Rollups::Use, samples.max(1)),
        ("raw", Rollups::Bypass, samples.clamp(1, 3)),
    ] {
        let mut times = Vec::with_capacity(runs);
        let mut rows_read = 0;
        let mut items = Vec::new();
        for _ in 0..runs {
            counting.take_rows();
            let began = Instant::now();
            let page = series
                .aggregate_with(
                    &name,
                    range,
                    (PARTITION_SPAN, Aggregate::Avg),
                    1_000,
                    None,
                    rollups,
                )
                .await
                .context("failed to read the year")?;
            times.push(began.elapsed());
            rows_read = counting.take_rows();
            items = page.items;
        }
        times.sort();
        println!(
            "{days}-day read, step=1d agg=avg, {label}: {} rows of answer, {rows_read} rows read, p50 {:.1} ms, max {:.1} ms ({runs} samples)",
            items.len(),
            millis(percentile(&mut times, 50.0)),
            millis(times[times.len() - 1]),
        );
        answers.push(items);
    }
    let same = answers[0].len() == answers[1].len()
        && answers[0]
            .iter()
            .zip(&answers[1])
            .all(|(a, b)| a.0 == b.0 && a.1.to_bits() == b.1.to_bits());
    anyhow::ensure!(same, "the read from rollups differs from the raw read");
    println!("{days}-day read: rollups and raw answers equal bit for bit");

    if let Some((embedded, _)) = &bench_store.embedded {
        let points_bytes = embedded.flushed_disk_space(Table::SeriesPoints).await?;
        let rollup_bytes = embedded.flushed_disk_space(Table::SeriesRollups).await?;
        println!(
            "rollups disk: {rollup_bytes} bytes of rollups beside {points_bytes} bytes of points for {seconds} points = {:.2} bytes/point added ({:.1} % of the points table)",
            rollup_bytes as f64 / seconds as f64,
            rollup_bytes as f64 * 100.0 / points_bytes as f64
        );
    }
    bench_store.close().await
}
