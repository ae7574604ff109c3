//! The timeline-lifecycle figures of `fanline bench`: unfollow cleanup of a full timeline,
//! the delete-everywhere rate, edits at every follower, and timeline reads with 0, 1 and 5 authors merged at read
//! time, measured in the same run so they can be compared.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::value::RawValue;
use uuid::Uuid;

use super::{Rig, millis, percentile};
use crate::keys::{Ticks, event_row_key};
use crate::store::{Item, Store, Table, Write};
use crate::timeline::merged_authors;
use crate::timeline::reconcile::{self, EdgeSettings};
use crate::timeline::{Event, EventEdit, MAX_PAGE_SIZE, SubjectId, TimelineEntry};

/// Entries of the timelines the cleanup and read figures use (the default cap).
const FULL_TIMELINE: usize = 800;

/// Writes `count` events of `author` straight into its log (and, if `copy_to` is given,
/// into that timeline), one second apart from `start` plus `offset` ticks.
async fn seed_events(
    store: &dyn Store,
    author: &str,
    count: usize,
    offset: u64,
    copy_to: &[&str],
) -> anyhow::Result<()> {
    let author_id = SubjectId::parse(author).map_err(anyhow::Error::msg)?;
    let start = Ticks::now().get() - 10_000_000 * 100_000;
    let mut writes = Vec::new();
    for i in 0..count {
        let at = Ticks::new(start + i as u64 * 10_000_000 + offset).context("time")?;
        let event_id = Uuid::now_v7();
        let event = Event {
            event_id,
            author: author_id.clone(),
            kind: "post".into(),
            payload: RawValue::from_string(format!(r#"{{"text":"seeded post {i}"}}"#))?,
            at,
            row_key: event_row_key(at, event_id),
            version: 1,
            edited_at: None,
            fanout: true,
        };
        writes.push(Write::put(
            Table::Events,
            Item::new(author, &event.row_key, event.encode()),
        ));
        for owner in copy_to {
            writes.push(Write::put(
                Table::Timelines,
                Item::new(*owner, &event.row_key, event.timeline_entry_body()),
            ));
        }
    }
    store.batch_write(writes).await?;
    Ok(())
}

/// Unfollow cleanup: time to delete an author's 800 entries from a timeline, by key.
pub async fn unfollow_cleanup(rig: &Rig, samples: usize) -> anyhow::Result<()> {
    let store = rig.bench_store.store.as_ref();
    let settings = EdgeSettings {
        backfill: 100,
        max_timeline_len: FULL_TIMELINE,
    };
    let mut times = Vec::with_capacity(samples);
    for sample in 0..samples {
        let author = format!("bench-unfollowed-{sample}");
        let reader = format!("bench-unfollower-{sample}");
        seed_events(store, &author, FULL_TIMELINE, 0, &[&reader]).await?;
        let started = Instant::now();
        // No edge: the job cleans up.
        reconcile::reconcile(store, settings, &reader, &author, false).await?;
        times.push(started.elapsed());
        let left = store
            .query(crate::store::Query::partition(
                Table::Timelines,
                &reader,
                10,
            ))
            .await?;
        anyhow::ensure!(left.is_empty(), "cleanup left {} entries", left.len());
    }
    println!(
        "unfollow cleanup of an {FULL_TIMELINE}-entry timeline: p50 {:.1} ms, max {:.1} ms ({samples} samples)",
        millis(percentile(&mut times, 50.0)),
        millis(percentile(&mut times, 100.0)),
    );
    Ok(())
}

/// Delete everywhere: deletes `count` of the rig author's events (each on every follower's
/// timeline) and times their removal jobs.
pub async fn delete_everywhere(rig: &Rig, count: usize) -> anyhow::Result<()> {
    let events = rig
        .timelines
        .events(&rig.author, count.clamp(1, 250), None)
        .await?;
    let doomed: Vec<String> = events
        .items
        .iter()
        .map(|event| event.event_id.as_hyphenated().to_string())
        .collect();
    let removals_before = rig.metrics.deliveries.get();
    let mut workers = rig.start_workers(2);
    let started = Instant::now();
    for event_id in &doomed {
        rig.timelines.delete_event(&rig.author, event_id).await?;
    }
    workers.wait_for(doomed.len()).await?;
    let elapsed = started.elapsed();
    workers.stop().await;
    let removed = rig.metrics.deliveries.get() - removals_before;
    println!(
        "delete everywhere: {} events, {removed} copies removed in {:.2} s = {:.0} removals/s",
        doomed.len(),
        elapsed.as_secs_f64(),
        removed as f64 / elapsed.as_secs_f64()
    );
    Ok(())
}

/// Edits of `count` events at `rig.followers` followers each: how long an edit takes to
/// answer, that a follower's next page shows it (checked, not timed: it reads the one
/// stored version), and how long the job telling every follower's streams and change log
/// takes to end.
pub async fn edit_everywhere(rig: &Rig, count: usize) -> anyhow::Result<()> {
    let events = rig
        .timelines
        .events(&rig.author, count.clamp(1, 250), None)
        .await?;
    let reader = SubjectId::parse(rig.followers.last().map_or("bench-author", String::as_str))
        .map_err(anyhow::Error::msg)?;
    let mut workers = rig.start_workers(2);
    let mut answers = Vec::with_capacity(events.items.len());
    let mut told = Vec::with_capacity(events.items.len());
    for event in &events.items {
        let text = format!(r#"{{"text":"edited {}"}}"#, event.event_id);
        let edit = EventEdit {
            payload: RawValue::from_string(text.clone())?,
            version: Some(event.version),
        };
        let started = Instant::now();
        let edited = rig
            .timelines
            .edit_event(&rig.author, &event.event_id.to_string(), edit)
            .await?;
        answers.push(started.elapsed());
        let page = rig.timelines.timeline(&reader, MAX_PAGE_SIZE, None).await?;
        let shown = page
            .items
            .iter()
            .find(|entry| entry.event_id() == event.event_id)
            .map(TimelineEntry::version);
        anyhow::ensure!(
            shown == Some(edited.version),
            "{reader}'s page shows version {shown:?} of {}, not {}",
            event.event_id,
            edited.version
        );
        workers.wait_for(1).await?;
        told.push(started.elapsed());
    }
    workers.stop().await;
    println!(
        "edit at {} followers: answered p50 {:.2} ms (the page shows it at once), every follower's streams and change log told p50 {:.1} ms ({} edits)",
        rig.followers.len(),
        millis(percentile(&mut answers, 50.0)),
        millis(percentile(&mut told, 50.0)),
        answers.len()
    );
    Ok(())
}

/// Timeline reads of one reader with 0, 1 and 5 authors merged at read time, in one run.
pub async fn merged_reads(rig: &Rig, reads: usize) -> anyhow::Result<()> {
    let store = rig.bench_store.store.as_ref();
    let cases = [0usize, 1, 5];
    let readers: Vec<String> = cases
        .iter()
        .map(|merged| format!("bench-merged-reader-{merged}"))
        .collect();
    let reader_refs: Vec<&str> = readers.iter().map(String::as_str).collect();
    seed_events(store, "bench-pushed", FULL_TIMELINE, 0, &reader_refs).await?;
    let stars: Vec<String> = (0..5).map(|i| format!("bench-star-{i}")).collect();
    for (index, star) in stars.iter().enumerate() {
        // As busy as the pushed author and interleaved with it, a few ticks apart: a page
        // of a timeline merging five holds as many of each author's events as pushed ones.
        seed_events(store, star, FULL_TIMELINE, 1 + index as u64, &[]).await?;
    }
    let mut owners = Vec::new();
    for (merged, reader) in cases.iter().zip(&readers) {
        let marks = stars[..*merged]
            .iter()
            .map(|star| merged_authors::merge_into(reader, star, None))
            .collect::<Vec<_>>();
        if !marks.is_empty() {
            store.batch_write(marks).await?;
        }
        owners.push(SubjectId::parse(reader).map_err(anyhow::Error::msg)?);
    }
    // The cases take turns, so background work of the store (flushes, compactions) weighs on
    // all of them alike.
    let mut latencies = vec![Vec::with_capacity(reads); cases.len()];
    for _ in 0..reads {
        for (owner, times) in owners.iter().zip(&mut latencies) {
            let began = Instant::now();
            let page = rig.timelines.timeline(owner, MAX_PAGE_SIZE, None).await?;
            times.push(began.elapsed());
            anyhow::ensure!(page.items.len() == MAX_PAGE_SIZE, "short page");
        }
    }
    let figures: Vec<(usize, Duration, Duration)> = cases
        .iter()
        .zip(&mut latencies)
        .map(|(merged, times)| (*merged, percentile(times, 50.0), percentile(times, 99.0)))
        .collect();
    let plain = figures[0].1.max(Duration::from_nanos(1));
    for (merged, p50, p99) in &figures {
        println!(
            "timeline read (250 items), {merged} merged author(s): p50 {:.2} ms, p99 {:.2} ms ({:.2}x the plain p50)",
            millis(*p50),
            millis(*p99),
            p50.as_secs_f64() / plain.as_secs_f64()
        );
    }
    Ok(())
}
