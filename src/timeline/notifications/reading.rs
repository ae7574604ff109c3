//! Reading a notification feed: its groups newest updated first, each with its newest event
//! as a page item, what is unseen and unread, and the marker that moves those.

use std::collections::HashMap;

use bytes::Bytes;

use super::feed::{
    self, GroupRow, MARKER_ROW, MarkerRow, READS, READS_END, UPDATED, UPDATED_END, group_row,
    read_row,
};
use super::live;
use crate::keys::{Ticks, event_row_key};
use crate::notices::Notice;
use crate::store::{Condition, Item, Key, Query, StoreError, StoreExt as _, Table, Write};
use crate::timeline::model::EntryRef;
use crate::timeline::{
    DomainError, DomainResult, MAX_MARKER_VERSION, SubjectId, TimelineEntry, Timelines,
};

/// Times a marker write without a version reads the marker again after losing a race.
const MARKER_RACES: usize = 8;

/// Most group ids one marker write marks read: the write is one transaction, with the marker.
pub const MAX_READ_IDS: usize = 99;

/// A group as a client sees it.
#[derive(Clone, Debug)]
pub struct GroupItem {
    pub id: String,
    pub group: Option<String>,
    pub kind: String,
    pub count: u64,
    pub actors: Vec<String>,
    pub actor_count: u64,
    /// The newest event, as a timeline page item; `None` if it was deleted and its group not
    /// yet told.
    pub latest: Option<TimelineEntry>,
    pub updated_at: Ticks,
    pub seen: bool,
    pub read: bool,
}

/// What is unseen and unread, and the marker's version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub unseen: usize,
    pub unread: usize,
    pub version: u64,
}

/// A page of a notification feed.
#[derive(Debug)]
pub struct NotificationPage {
    pub items: Vec<GroupItem>,
    pub next_cursor: Option<String>,
    pub counts: Counts,
}

/// What a marker write marks.
#[derive(Clone, Debug, Default)]
pub struct NotificationMarkerWrite {
    /// Seen: every group updated up to this time (the marker never moves back).
    pub seen: Option<Ticks>,
    pub read: Option<ReadMark>,
    /// The version the write replaces; `None`: whatever is current.
    pub version: Option<u64>,
}

/// Which groups a marker write marks read.
#[derive(Clone, Debug)]
pub enum ReadMark {
    All,
    Groups(Vec<String>),
}

/// The outcome of a marker write.
#[derive(Debug)]
pub enum NotificationMarkerWritten {
    Written(Counts),
    /// The marker is at another version than the write named: nothing was written.
    Stale {
        current: u64,
    },
}

/// The feed as the counts and pages read it: the marker, the groups' places (at most the
/// cap, newest updated first) and the groups marked read one by one.
struct Snapshot {
    marker: Option<(Bytes, MarkerRow)>,
    places: Vec<(u64, String, String)>,
    reads: HashMap<String, u64>,
}

impl Snapshot {
    fn marker(&self) -> MarkerRow {
        self.marker
            .as_ref()
            .map(|(_, row)| row.clone())
            .unwrap_or_default()
    }

    fn is_read(&self, marker: &MarkerRow, gid: &str, updated: u64) -> bool {
        updated <= marker.read_until || self.reads.get(gid).is_some_and(|at| *at >= updated)
    }

    fn counts(&self) -> Counts {
        let marker = self.marker();
        let unseen = self
            .places
            .iter()
            .filter(|(updated, _, _)| *updated > marker.seen_until)
            .count();
        let unread = self
            .places
            .iter()
            .filter(|(updated, gid, _)| !self.is_read(&marker, gid, *updated))
            .count();
        Counts {
            unseen,
            unread,
            version: marker.version,
        }
    }
}

fn corrupt(message: String) -> DomainError {
    DomainError::Corrupt(message)
}

fn page_scope(owner: &SubjectId) -> String {
    format!("notifications/{owner}")
}

impl Timelines {
    async fn notification_snapshot(&self, owner: &SubjectId) -> DomainResult<Snapshot> {
        let store = self.store.as_ref();
        let cap = self.settings.max_notification_groups.max(1);
        let prefix = |start: &str, end: &str, limit: usize| {
            Query::partition(Table::Notifications, owner.as_str(), limit)
                .range(Some(start.to_owned()), Some(end.to_owned()))
        };
        let (marker, places, reads) = futures::join!(
            store.get(Table::Notifications, owner.as_str(), MARKER_ROW),
            store.query(prefix(UPDATED, UPDATED_END, cap)),
            store.query_all(prefix(READS, READS_END, 1000)),
        );
        let marker = marker?
            .map(|bytes| MarkerRow::decode(&bytes).map(|row| (bytes, row)))
            .transpose()
            .map_err(corrupt)?;
        let places = places?
            .into_iter()
            .map(|item| {
                feed::parse_updated_row(&item.row)
                    .map(|(updated, gid)| (updated, gid.to_owned(), item.row.clone()))
                    .ok_or_else(|| corrupt(format!("notification place {}", item.row)))
            })
            .collect::<DomainResult<Vec<_>>>()?;
        let mut read_marks = HashMap::new();
        for item in reads? {
            let gid = item.row.strip_prefix(READS).unwrap_or_default().to_owned();
            read_marks.insert(gid, feed::decode_number(&item.value).map_err(corrupt)?);
        }
        Ok(Snapshot {
            marker,
            places,
            reads: read_marks,
        })
    }

    /// What is unseen and unread in `owner`'s feed.
    pub async fn notification_counts(&self, owner: &SubjectId) -> DomainResult<Counts> {
        Ok(self.notification_snapshot(owner).await?.counts())
    }

    /// A page of `owner`'s notification feed, newest updated first: `limit` groups after
    /// `cursor` (the `next_cursor` of the page before).
    pub async fn notifications(
        &self,
        owner: &SubjectId,
        limit: usize,
        cursor: Option<&str>,
    ) -> DomainResult<NotificationPage> {
        crate::timeline::reading::check_limit(limit)?;
        let scope = page_scope(owner);
        let after = cursor
            .map(|cursor| self.cursors.decode(&scope, cursor))
            .transpose()?;
        let snapshot = self.notification_snapshot(owner).await?;
        let start = match &after {
            // The places after the cursor's (a group that moved since is above it now).
            Some(after) => snapshot.places.partition_point(|(_, _, row)| row <= after),
            None => 0,
        };
        let shown = &snapshot.places[start.min(snapshot.places.len())..];
        let page = &shown[..limit.min(shown.len())];
        let next_cursor = (shown.len() > limit)
            .then(|| {
                page.last()
                    .map(|(_, _, row)| self.cursors.encode(&scope, row))
            })
            .flatten();
        let gids: Vec<&str> = page.iter().map(|(_, gid, _)| gid.as_str()).collect();
        let items = self.group_items(owner, &gids, &snapshot).await?;
        Ok(NotificationPage {
            items: items.into_iter().flatten().collect(),
            next_cursor,
            counts: snapshot.counts(),
        })
    }

    /// The items of the groups `gids` of `owner`'s feed, in order; `None` for a group gone,
    /// or one whose only event was deleted and is not yet taken out.
    async fn group_items(
        &self,
        owner: &SubjectId,
        gids: &[&str],
        snapshot: &Snapshot,
    ) -> DomainResult<Vec<Option<GroupItem>>> {
        let store = self.store.as_ref();
        let bodies = store
            .get_many(
                gids.iter()
                    .map(|gid| Key::new(Table::Notifications, owner.as_str(), group_row(gid)))
                    .collect(),
            )
            .await?;
        let rows = bodies
            .iter()
            .map(|body| body.as_deref().map(GroupRow::decode).transpose())
            .collect::<Result<Vec<_>, String>>()
            .map_err(corrupt)?;
        let refs: Vec<EntryRef> = rows
            .iter()
            .flatten()
            .map(|row| EntryRef {
                author: row.latest.author.as_str().into(),
                row_key: event_row_key(Ticks::clamped(row.latest.at), row.latest.event_id),
            })
            .collect();
        let bodies = self.events.read(store, &refs).await?;
        let mut events = refs.into_iter().zip(bodies);
        let marker = snapshot.marker();
        let mut items = Vec::with_capacity(gids.len());
        for (gid, row) in gids.iter().zip(rows) {
            let Some(row) = row else {
                items.push(None);
                continue;
            };
            let latest = match events.next() {
                Some((reference, Some(body))) => Some(
                    TimelineEntry::from_event_row(&reference.author, reference.row_key, body)
                        .map_err(corrupt)?,
                ),
                Some((_, None)) if row.count <= 1 => {
                    items.push(None);
                    continue;
                }
                _ => None,
            };
            items.push(Some(GroupItem {
                id: (*gid).to_owned(),
                group: row.group.clone(),
                kind: row.kind.clone(),
                count: row.count,
                actors: row.actors.iter().map(|actor| actor.name.clone()).collect(),
                actor_count: row.actor_count,
                latest,
                updated_at: Ticks::clamped(row.updated),
                seen: row.updated <= marker.seen_until,
                read: snapshot.is_read(&marker, gid, row.updated),
            }));
        }
        Ok(items)
    }

    /// The items of the groups `gids`, for a stream: as [`Self::notifications`] shows them.
    pub(crate) async fn notification_groups(
        &self,
        owner: &SubjectId,
        gids: &[&str],
    ) -> DomainResult<(Vec<Option<GroupItem>>, Counts)> {
        let snapshot = self.notification_snapshot(owner).await?;
        let items = self.group_items(owner, gids, &snapshot).await?;
        Ok((items, snapshot.counts()))
    }

    /// Moves `owner`'s notification marker: marks groups seen, read, or both. The marker's
    /// version goes up by one; a write naming another version than the stored one changes
    /// nothing. Every stream of the feed is told.
    pub async fn put_notification_marker(
        &self,
        owner: &SubjectId,
        write: NotificationMarkerWrite,
    ) -> DomainResult<NotificationMarkerWritten> {
        if let Some(ReadMark::Groups(ids)) = &write.read {
            if ids.len() > MAX_READ_IDS {
                return Err(DomainError::invalid(
                    "invalid_marker",
                    format!(
                        "read names {} groups; at most {MAX_READ_IDS} at once",
                        ids.len()
                    ),
                ));
            }
            if let Some(bad) = ids.iter().find(|id| !feed::is_group_id(id)) {
                return Err(DomainError::invalid(
                    "invalid_marker",
                    format!("{bad:?} is not a group id"),
                ));
            }
        }
        if write
            .version
            .is_some_and(|version| version > MAX_MARKER_VERSION)
        {
            return Err(DomainError::invalid(
                "invalid_version",
                format!("version must be 0 to {MAX_MARKER_VERSION}"),
            ));
        }
        let store = self.store.as_ref();
        for _ in 0..MARKER_RACES {
            let mut snapshot = self.notification_snapshot(owner).await?;
            let current = snapshot.marker();
            if let Some(version) = write.version
                && version != current.version
            {
                return Ok(NotificationMarkerWritten::Stale {
                    current: current.version,
                });
            }
            if write.seen.is_none() && write.read.is_none() {
                // Nothing to mark: the counts as they are, the marker unmoved.
                return Ok(NotificationMarkerWritten::Written(snapshot.counts()));
            }
            let now = Ticks::now().get();
            let mut marker = MarkerRow {
                version: current.version + 1,
                ..current.clone()
            };
            if let Some(until) = write.seen {
                marker.seen_until = marker.seen_until.max(until.get());
            }
            let mut writes = Vec::new();
            // The groups marked read one by one, as of their `updated`.
            let mut marked = Vec::new();
            match &write.read {
                Some(ReadMark::All) => marker.read_until = marker.read_until.max(now),
                Some(ReadMark::Groups(ids)) => {
                    let mut ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                    ids.sort_unstable();
                    ids.dedup();
                    let groups = store
                        .get_many(
                            ids.iter()
                                .map(|gid| {
                                    Key::new(Table::Notifications, owner.as_str(), group_row(gid))
                                })
                                .collect(),
                        )
                        .await?;
                    for (gid, body) in ids.iter().zip(groups) {
                        // A group gone (or never there) has nothing to mark.
                        let Some(body) = body else { continue };
                        let row = GroupRow::decode(&body).map_err(corrupt)?;
                        marked.push(((*gid).to_owned(), row.updated));
                        writes.push(Write::put(
                            Table::Notifications,
                            Item::new(
                                owner.as_str(),
                                read_row(gid),
                                feed::encode_number(row.updated),
                            ),
                        ));
                    }
                }
                None => {}
            }
            let condition = match &snapshot.marker {
                Some((bytes, _)) => Condition::Equals(bytes.clone()),
                None => Condition::Absent,
            };
            writes.push(Write::Put {
                table: Table::Notifications,
                item: Item::new(owner.as_str(), MARKER_ROW, marker.encode()),
                condition,
            });
            match store.transact(writes).await {
                Ok(()) => {
                    self.notices
                        .publish(&live::notifications_topic(owner.as_str()), Notice::Changed);
                    // The feed as read, with what this write marked.
                    snapshot.marker = Some((marker.encode(), marker));
                    snapshot.reads.extend(marked);
                    return Ok(NotificationMarkerWritten::Written(snapshot.counts()));
                }
                Err(StoreError::ConditionFailed) if write.version.is_none() => {}
                Err(StoreError::ConditionFailed) => {
                    let current = match store
                        .get(Table::Notifications, owner.as_str(), MARKER_ROW)
                        .await?
                    {
                        Some(body) => MarkerRow::decode(&body).map_err(corrupt)?.version,
                        None => 0,
                    };
                    return Ok(NotificationMarkerWritten::Stale { current });
                }
                Err(err) => return Err(err.into()),
            }
        }
        Err(DomainError::Conflict(format!(
            "the notification marker of {owner} is being moved by others; retry"
        )))
    }
}
