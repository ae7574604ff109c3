//! Changing one subject's notification feed: events counted into their groups, deleted
//! events taken out, edits of a group's newest event told, and the feed trimmed to its cap.
//!
//! Every change is one transaction in the subject's partition, conditional on the rows it
//! read (the groups, the events' member rows, the actors' counts), so concurrent writers of
//! one feed never lose each other's updates: the loser reads again. An event is counted at
//! most once (its member row is created if absent), and a deleted one never again (its
//! member row becomes a tombstone, which a late delivery finds). Deliveries come in batches:
//! one transaction moves a group once for all its new events, so a hot group costs a write
//! per batch, not one per event.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use uuid::Uuid;

use super::feed::{
    self, Actor, GroupRow, Latest, MAX_ACTORS, MemberRow, UPDATED, UPDATED_END, actor_row,
    change_row, group_row, member_row, read_row, scan_row, updated_row,
};
use crate::jobs::{JobError, JobResult};
use crate::keys::Ticks;
use crate::store::{Condition, Item, Key, Query, Store, StoreError, StoreExt as _, Table, Write};

/// Times a change reads the feed again after losing a race, before the job retries later.
const RACES: usize = 16;

/// Writes one transaction may hold here (under the store's limit of 100).
const MAX_WRITES: usize = 96;

/// An event to count into a feed.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub event_id: Uuid,
    pub author: String,
    /// The event's time (ticks).
    pub at: u64,
    pub group_id: String,
    pub kind: String,
    pub group: Option<String>,
}

/// What a change did to a feed, for its live streams.
#[derive(Debug, Default)]
pub struct Changed {
    /// A group was moved, made, emptied or trimmed.
    pub any: bool,
    /// A group was made: the feed may be over its cap.
    pub made: bool,
}

/// Commits a change's `writes`: what it changed once they land (`made`: a group was made),
/// `None` if a condition failed and the change must read the feed again.
async fn commit(store: &dyn Store, writes: Vec<Write>, made: bool) -> JobResult<Option<Changed>> {
    match store.transact(writes).await {
        Ok(()) => Ok(Some(Changed { any: true, made })),
        Err(StoreError::ConditionFailed) => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// A change that lost its race [`RACES`] times: the job retries later.
fn kept_changing(owner: &str) -> JobError {
    JobError::Conflict(format!("the notification feed of {owner} kept changing"))
}

fn corrupt(message: String) -> JobError {
    JobError::Corrupt(message)
}

fn put(owner: &str, row: String, value: Bytes, condition: Condition) -> Write {
    Write::Put {
        table: Table::Notifications,
        item: Item::new(owner, row, value),
        condition,
    }
}

fn delete(owner: &str, row: String) -> Write {
    Write::delete(Table::Notifications, owner, row)
}

fn condition_of(seen: &Option<Bytes>) -> Condition {
    match seen {
        Some(bytes) => Condition::Equals(bytes.clone()),
        None => Condition::Absent,
    }
}

/// A time after `floor`, now if the clock allows: a group's times only move forward, even
/// when writers' clocks disagree.
fn after(floor: u64) -> u64 {
    Ticks::now().get().max(floor + 1)
}

/// The writes that move `group` from where `old` had it (in the `u/` and `c/` ranges) to
/// where it is now.
fn moved(owner: &str, gid: &str, old: Option<&GroupRow>, group: &GroupRow) -> Vec<Write> {
    let mut writes = Vec::with_capacity(4);
    if let Some(old) = old {
        if old.updated != group.updated {
            writes.push(delete(owner, updated_row(old.updated, gid)));
        }
        writes.push(delete(owner, change_row(old.changed, gid)));
    }
    if old.is_none_or(|old| old.updated != group.updated) {
        writes.push(put(
            owner,
            updated_row(group.updated, gid),
            Bytes::new(),
            Condition::None,
        ));
    }
    writes.push(put(
        owner,
        change_row(group.changed, gid),
        Bytes::from_static(b"1"),
        Condition::None,
    ));
    writes
}

/// The writes that store `group` over `old` (read as `seen`, and still so) and move it.
fn rewritten(owner: &str, gid: &str, old: &GroupRow, group: &GroupRow, seen: Bytes) -> Vec<Write> {
    let mut writes = vec![put(
        owner,
        group_row(gid),
        group.encode(),
        Condition::Equals(seen),
    )];
    writes.extend(moved(owner, gid, Some(old), group));
    writes
}

/// The writes that remove `group` (stored as `seen`) from the feed: its row, its places, and
/// its read mark; the streams are told it is gone.
fn removed(owner: &str, gid: &str, group: &GroupRow, seen: Bytes) -> Vec<Write> {
    vec![
        Write::Delete {
            table: Table::Notifications,
            partition: owner.to_owned(),
            row: group_row(gid),
            condition: Condition::Equals(seen),
        },
        delete(owner, updated_row(group.updated, gid)),
        delete(owner, change_row(group.changed, gid)),
        put(
            owner,
            change_row(after(group.changed), gid),
            Bytes::from_static(b"0"),
            Condition::None,
        ),
        delete(owner, read_row(gid)),
    ]
}

/// Splits `deliveries` into transactions: each group's events together where they fit, the
/// groups in the order of their newest events (each transaction puts its groups above the
/// last one's).
fn transactions(deliveries: Vec<Delivery>) -> Vec<Vec<Delivery>> {
    // Per event: its member and scan rows and at most one actor row; per group: its row and
    // at most four moves.
    const PER_EVENT: usize = 3;
    const PER_GROUP: usize = 5;
    let mut by_group: BTreeMap<String, Vec<Delivery>> = BTreeMap::new();
    let mut ids = std::collections::HashSet::new();
    for delivery in deliveries {
        if ids.insert(delivery.event_id) {
            by_group
                .entry(delivery.group_id.clone())
                .or_default()
                .push(delivery);
        }
    }
    let mut groups: Vec<Vec<Delivery>> = by_group.into_values().collect();
    groups.sort_by_key(|events| newest(events));
    let mut chunks = Vec::new();
    let mut chunk: Vec<Delivery> = Vec::new();
    let mut cost = 0;
    for events in groups {
        for slice in events.chunks((MAX_WRITES - PER_GROUP) / PER_EVENT) {
            let slice_cost = PER_GROUP + PER_EVENT * slice.len();
            if cost + slice_cost > MAX_WRITES && !chunk.is_empty() {
                chunks.push(std::mem::take(&mut chunk));
                cost = 0;
            }
            chunk.extend_from_slice(slice);
            cost += slice_cost;
        }
        // A group's slices never share a transaction with each other.
        if !chunk.is_empty() {
            chunks.push(std::mem::take(&mut chunk));
            cost = 0;
        }
    }
    chunks
}

/// An empty group of the kind and group of `first`, its first event.
fn new_group(first: &Delivery, generation: u64) -> GroupRow {
    GroupRow {
        generation,
        kind: first.kind.clone(),
        group: first.group.clone(),
        count: 0,
        actor_count: 0,
        actors: Vec::new(),
        latest: Latest {
            author: first.author.clone(),
            event_id: first.event_id,
            at: first.at,
        },
        updated: 0,
        changed: 0,
    }
}

/// The newest of `events`, by time then id.
fn newest<D: std::borrow::Borrow<Delivery>>(events: &[D]) -> (u64, Uuid) {
    events
        .iter()
        .map(|delivery| (delivery.borrow().at, delivery.borrow().event_id))
        .max()
        .unwrap_or_default()
}

/// Counts `deliveries` into `owner`'s feed: each event once, in its group.
pub async fn deliver(
    store: &dyn Store,
    owner: &str,
    deliveries: Vec<Delivery>,
) -> JobResult<Changed> {
    let mut changed = Changed::default();
    for chunk in transactions(deliveries) {
        let done = deliver_chunk(store, owner, &chunk).await?;
        changed.any |= done.any;
        changed.made |= done.made;
    }
    Ok(changed)
}

async fn deliver_chunk(store: &dyn Store, owner: &str, chunk: &[Delivery]) -> JobResult<Changed> {
    for _ in 0..RACES {
        let members = store
            .get_many(
                chunk
                    .iter()
                    .map(|delivery| {
                        Key::new(Table::Notifications, owner, member_row(delivery.event_id))
                    })
                    .collect(),
            )
            .await?;
        // Counted already, or deleted: not again.
        let fresh: Vec<&Delivery> = chunk
            .iter()
            .zip(&members)
            .filter(|(_, member)| member.is_none())
            .map(|(delivery, _)| delivery)
            .collect();
        if fresh.is_empty() {
            return Ok(Changed::default());
        }
        let mut gids: Vec<&str> = fresh
            .iter()
            .map(|delivery| delivery.group_id.as_str())
            .collect();
        gids.sort_unstable();
        gids.dedup();
        // Updated in the order of their newest events, a tick apart.
        gids.sort_by_key(|gid| {
            newest(
                &fresh
                    .iter()
                    .filter(|delivery| delivery.group_id == *gid)
                    .copied()
                    .collect::<Vec<_>>(),
            )
        });
        let now = Ticks::now().get();
        let seen_groups = store
            .get_many(
                gids.iter()
                    .map(|gid| Key::new(Table::Notifications, owner, group_row(gid)))
                    .collect(),
            )
            .await?;
        let mut groups: HashMap<&str, (Option<Bytes>, Option<GroupRow>)> = HashMap::new();
        for (gid, seen) in gids.iter().zip(seen_groups) {
            let row = seen
                .as_ref()
                .map(|body| GroupRow::decode(body))
                .transpose()
                .map_err(corrupt)?;
            groups.insert(gid, (seen, row));
        }
        // Each group's generation: its own, or a new one for a group made now.
        let generation_of = |gid: &str| -> u64 {
            groups
                .get(gid)
                .and_then(|(_, row)| row.as_ref())
                .map_or_else(rand::random::<u64>, |row| row.generation)
        };
        let generations: HashMap<&str, u64> =
            gids.iter().map(|gid| (*gid, generation_of(gid))).collect();
        let mut actor_keys: Vec<(&str, &str)> = fresh
            .iter()
            .map(|delivery| (delivery.group_id.as_str(), delivery.author.as_str()))
            .collect();
        actor_keys.sort_unstable();
        actor_keys.dedup();
        let seen_actors = store
            .get_many(
                actor_keys
                    .iter()
                    .map(|(gid, author)| {
                        Key::new(
                            Table::Notifications,
                            owner,
                            actor_row(gid, generations[gid], author),
                        )
                    })
                    .collect(),
            )
            .await?;

        let mut writes = Vec::new();
        // Authors new to each group, whose counts start now.
        let mut new_actors: HashMap<&str, u64> = HashMap::new();
        for (&(gid, author), seen) in actor_keys.iter().zip(&seen_actors) {
            let before = seen
                .as_deref()
                .map(feed::decode_number)
                .transpose()
                .map_err(corrupt)?;
            let added = fresh
                .iter()
                .filter(|delivery| delivery.group_id == gid && delivery.author == author)
                .count() as u64;
            writes.push(put(
                owner,
                actor_row(gid, generations[gid], author),
                feed::encode_number(before.unwrap_or(0) + added),
                condition_of(seen),
            ));
            if before.is_none() {
                *new_actors.entry(gid).or_default() += 1;
            }
        }
        let mut made = false;
        for (rank, gid) in gids.iter().enumerate() {
            let generation = generations[gid];
            let (seen, old) = groups.remove(gid).unwrap_or((None, None));
            let events: Vec<&Delivery> = fresh
                .iter()
                .copied()
                .filter(|delivery| delivery.group_id == *gid)
                .collect();
            let mut group = match &old {
                Some(row) => row.clone(),
                None => {
                    made = true;
                    new_group(events[0], generation)
                }
            };
            group.actor_count += new_actors.get(gid).copied().unwrap_or(0);
            for delivery in &events {
                group.add(&delivery.author, delivery.at, delivery.event_id);
                let member = MemberRow::Member {
                    group: (*gid).to_owned(),
                    generation,
                    author: delivery.author.clone(),
                    at: delivery.at,
                };
                writes.push(put(
                    owner,
                    member_row(delivery.event_id),
                    member.encode(),
                    Condition::Absent,
                ));
                writes.push(put(
                    owner,
                    scan_row(gid, generation, delivery.at, delivery.event_id),
                    Bytes::from(delivery.author.clone()),
                    Condition::None,
                ));
            }
            // Now, when its event lands: the group goes to the top, and is unseen even if
            // the marker moved between the event's post and its landing. Never down, so a
            // walk of pages never meets a group twice.
            let floor = old.as_ref().map_or(0, |row| row.updated.max(row.changed));
            group.updated = (now + rank as u64).max(floor + 1);
            group.changed = group.updated;
            writes.push(put(
                owner,
                group_row(gid),
                group.encode(),
                condition_of(&seen),
            ));
            writes.extend(moved(owner, gid, old.as_ref(), &group));
        }
        if let Some(changed) = commit(store, writes, made).await? {
            return Ok(changed);
        }
    }
    Err(kept_changing(owner))
}

/// Takes the deleted event `event_id` out of `owner`'s feed, and leaves a tombstone so that
/// a delivery still on its way does not count it again.
pub async fn remove(store: &dyn Store, owner: &str, event_id: Uuid) -> JobResult<Changed> {
    let member_key = member_row(event_id);
    for _ in 0..RACES {
        let seen = store.get(Table::Notifications, owner, &member_key).await?;
        let Some(seen) = seen else {
            let tombstone = put(
                owner,
                member_key.clone(),
                MemberRow::gone().encode(),
                Condition::Absent,
            );
            match store.write_one(tombstone).await {
                Ok(()) => return Ok(Changed::default()),
                Err(StoreError::ConditionFailed) => continue,
                Err(err) => return Err(err.into()),
            }
        };
        let (gid, generation, author, at) = match MemberRow::decode(&seen).map_err(corrupt)? {
            MemberRow::Gone { .. } => return Ok(Changed::default()),
            MemberRow::Member {
                group,
                generation,
                author,
                at,
            } => (group, generation, author, at),
        };
        let tombstone = put(
            owner,
            member_key.clone(),
            MemberRow::gone().encode(),
            Condition::Equals(seen),
        );
        let scan = delete(owner, scan_row(&gid, generation, at, event_id));
        let group_seen = store
            .get(Table::Notifications, owner, &group_row(&gid))
            .await?;
        let group_old = group_seen
            .as_deref()
            .map(GroupRow::decode)
            .transpose()
            .map_err(corrupt)?;
        let (Some(group_seen), Some(old)) =
            (group_seen, group_old.filter(|g| g.generation == generation))
        else {
            // Its group was trimmed off the feed (or made again since): nothing counts it.
            match store.transact(vec![tombstone, scan]).await {
                Ok(()) => return Ok(Changed::default()),
                Err(StoreError::ConditionFailed) => continue,
                Err(err) => return Err(err.into()),
            }
        };
        let actor_key = actor_row(&gid, generation, &author);
        let actor_seen = store.get(Table::Notifications, owner, &actor_key).await?;
        let by_author = actor_seen
            .as_deref()
            .map(feed::decode_number)
            .transpose()
            .map_err(corrupt)?
            .unwrap_or(0);
        let mut writes = vec![tombstone, scan];
        let mut group = old.clone();
        group.count = group.count.saturating_sub(1);
        let actor_condition = condition_of(&actor_seen);
        if actor_seen.is_none() {
            // No count to take it from: the group's own is all there is.
        } else if by_author <= 1 {
            group.actor_count = group.actor_count.saturating_sub(1);
            writes.push(Write::Delete {
                table: Table::Notifications,
                partition: owner.to_owned(),
                row: actor_key,
                condition: actor_condition,
            });
        } else {
            writes.push(put(
                owner,
                actor_key,
                feed::encode_number(by_author - 1),
                actor_condition,
            ));
        }
        if group.count == 0 {
            writes.extend(removed(owner, &gid, &old, group_seen));
        } else {
            if group.latest.event_id == event_id
                || group.actors.iter().any(|actor| actor.name == author)
            {
                let (actors, latest) = scanned(store, owner, &gid, generation, event_id).await?;
                group.actors = actors;
                if let Some(latest) = latest {
                    group.latest = latest;
                }
            }
            group.changed = after(old.changed.max(old.updated));
            writes.extend(rewritten(owner, &gid, &old, &group, group_seen));
        }
        if let Some(changed) = commit(store, writes, false).await? {
            return Ok(changed);
        }
    }
    Err(kept_changing(owner))
}

/// A group's latest distinct authors and its newest event, read from its events, leaving
/// out `without` (being removed).
async fn scanned(
    store: &dyn Store,
    owner: &str,
    gid: &str,
    generation: u64,
    without: Uuid,
) -> JobResult<(Vec<Actor>, Option<Latest>)> {
    const PAGE: usize = 500;
    let prefix = feed::members_prefix(gid, generation);
    let end = feed::prefix_end(&prefix);
    let mut actors: Vec<Actor> = Vec::new();
    let mut latest = None;
    let mut cursor = None;
    loop {
        let page = store
            .query(
                Query::partition(Table::Notifications, owner, PAGE)
                    .range(Some(prefix.clone()), Some(end.clone()))
                    .after(cursor.take()),
            )
            .await?;
        for item in &page {
            let Some((at, event_id)) = feed::parse_scan_row(&item.row) else {
                return Err(corrupt(format!("notification event row {}", item.row)));
            };
            if event_id == without {
                continue;
            }
            let author = String::from_utf8_lossy(&item.value).into_owned();
            if latest.is_none() {
                latest = Some(Latest {
                    author: author.clone(),
                    event_id,
                    at,
                });
            }
            if !actors.iter().any(|actor| actor.name == author) {
                actors.push(Actor { name: author, at });
                if actors.len() == MAX_ACTORS {
                    return Ok((actors, latest));
                }
            }
        }
        if page.len() < PAGE {
            return Ok((actors, latest));
        }
        cursor = page.last().map(|item| item.row.clone());
    }
}

/// Tells `owner`'s streams that the newest event of the group of `event_id` was edited, by
/// moving the group's `changed` (its place stays): streams send the group again.
pub async fn touch(store: &dyn Store, owner: &str, event_id: Uuid) -> JobResult<Changed> {
    for _ in 0..RACES {
        let Some(seen) = store
            .get(Table::Notifications, owner, &member_row(event_id))
            .await?
        else {
            return Ok(Changed::default());
        };
        let MemberRow::Member {
            group: gid,
            generation,
            ..
        } = MemberRow::decode(&seen).map_err(corrupt)?
        else {
            return Ok(Changed::default());
        };
        let Some(group_seen) = store
            .get(Table::Notifications, owner, &group_row(&gid))
            .await?
        else {
            return Ok(Changed::default());
        };
        let old = GroupRow::decode(&group_seen).map_err(corrupt)?;
        if old.generation != generation || old.latest.event_id != event_id {
            return Ok(Changed::default());
        }
        let mut group = old.clone();
        group.changed = after(old.changed.max(old.updated));
        let writes = rewritten(owner, &gid, &old, &group, group_seen);
        if let Some(changed) = commit(store, writes, false).await? {
            return Ok(changed);
        }
    }
    Err(kept_changing(owner))
}

/// Removes the groups of `owner`'s feed past its newest `max_groups`, with what counted
/// them. A group that changed meanwhile is left (it is no longer the oldest).
pub async fn trim(store: &dyn Store, owner: &str, max_groups: usize) -> JobResult<bool> {
    const SLACK: usize = 64;
    let places = store
        .query(
            Query::partition(Table::Notifications, owner, max_groups + SLACK)
                .range(Some(UPDATED.to_owned()), Some(UPDATED_END.to_owned())),
        )
        .await?;
    if places.len() <= max_groups {
        return Ok(false);
    }
    let mut trimmed = false;
    for place in &places[max_groups..] {
        let Some((_, gid)) = feed::parse_updated_row(&place.row) else {
            return Err(corrupt(format!("notification place {}", place.row)));
        };
        let Some(seen) = store
            .get(Table::Notifications, owner, &group_row(gid))
            .await?
        else {
            // A place left by a writer that lost its race: nothing to count.
            store.write_one(delete(owner, place.row.clone())).await?;
            continue;
        };
        let group = GroupRow::decode(&seen).map_err(corrupt)?;
        match store.transact(removed(owner, gid, &group, seen)).await {
            Ok(()) => trimmed = true,
            Err(StoreError::ConditionFailed) => {}
            Err(err) => return Err(err.into()),
        }
        erase(store, owner, gid, &group).await?;
    }
    Ok(trimmed)
}

/// Deletes what counted a removed group: its events' rows and its actors' counts, so a feed
/// takes no more room than its groups. What a crash leaves of them is of an old generation,
/// never counted again.
async fn erase(store: &dyn Store, owner: &str, gid: &str, group: &GroupRow) -> JobResult<()> {
    for prefix in [
        feed::members_prefix(gid, group.generation),
        feed::actors_prefix(gid, group.generation),
    ] {
        let end = feed::prefix_end(&prefix);
        let rows = store
            .query_all(
                Query::partition(Table::Notifications, owner, 1000)
                    .range(Some(prefix.clone()), Some(end)),
            )
            .await?;
        let mut writes = Vec::with_capacity(rows.len() * 2);
        for row in rows {
            if let Some((_, event_id)) = feed::parse_scan_row(&row.row)
                && row.row.starts_with("m/")
            {
                writes.push(delete(owner, member_row(event_id)));
            }
            writes.push(delete(owner, row.row));
        }
        for batch in writes.chunks(MAX_WRITES) {
            store.batch_write(batch.to_vec()).await?;
        }
    }
    Ok(())
}
