//! Read markers, after Mastodon's: how far a subject has read its timeline, shared by all its
//! devices.
//!
//! A marker is one item of `readMarkers` (partition: the subject, row `marker`), JSON with
//! the point read, a version and when it was set. The point is kept as a row key whatever
//! form the client gave it in (see [`Timelines::put_marker`]), so the unread count is one
//! merged read of the timeline above it. Every write names the version it replaces and is
//! conditional on the stored bytes, so two devices moving the marker at once cannot lose an
//! update: one wins, the other is told the version to read again.

use serde::{Deserialize, Serialize};

use super::live::{self, LiveMessage};
use super::merge::Window;
use super::{DomainError, DomainResult, SubjectId, Timelines};
use crate::keys::Ticks;
use crate::store::{Condition, Item, StoreError, Table};

/// The row of a subject's marker in its `readMarkers` partition.
const MARKER_ROW: &str = "marker";

/// The largest version a client may name: the largest integer every JSON client reads
/// exactly (2^53 - 1). A marker would need that many writes to get there.
pub const MAX_MARKER_VERSION: u64 = (1 << 53) - 1;

/// Why a `last_read` is refused.
const INVALID_LAST_READ: &str = "last_read must be the row_key of an entry, a next_cursor of \
    this timeline (of a page or of a catch-up read), or an RFC 3339 time";

/// How far a subject has read its timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marker {
    /// The newest point read, as a row key: entries whose row keys sort before it are newer,
    /// and unread. `None` until the marker is first set.
    pub last_read: Option<String>,
    /// 0 until the marker is first set; each write adds one.
    pub version: u64,
    /// Entries of the timeline newer than `last_read` (all of them without one), counted up
    /// to the timeline cap.
    pub unread: usize,
    /// When the marker was last set.
    pub updated_at: Option<Ticks>,
}

impl Marker {
    /// The marker as `GET …/marker` answers it, for the live streams of its timeline.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "last_read": self.last_read,
            "version": self.version,
            "unread": self.unread,
            "updated_at": self.updated_at.map(|at| at.to_string()),
        })
    }
}

/// What a marker write did.
#[derive(Debug, PartialEq, Eq)]
pub enum MarkerWrite {
    /// The marker moved; it is now this.
    Written(Marker),
    /// The version named is not the stored one (another write came first): nothing was
    /// written. `current` is the stored version (0 if the marker was never set).
    Stale { current: u64 },
}

/// A marker as stored.
#[derive(Debug, Serialize, Deserialize)]
struct StoredMarker {
    last_read: String,
    version: u64,
    /// RFC 3339.
    updated_at: String,
}

impl StoredMarker {
    fn decode(owner: &SubjectId, body: &[u8]) -> DomainResult<StoredMarker> {
        serde_json::from_slice(body)
            .map_err(|err| DomainError::Corrupt(format!("the marker of {owner}: {err}")))
    }

    fn updated_at(&self, owner: &SubjectId) -> DomainResult<Ticks> {
        Ticks::parse_rfc3339(&self.updated_at).map_err(|err| {
            DomainError::Corrupt(format!("the marker of {owner}: updated_at: {err}"))
        })
    }
}

impl Timelines {
    /// `owner`'s read marker; version 0 and no `last_read` if it was never set.
    pub async fn marker(&self, owner: &SubjectId) -> DomainResult<Marker> {
        let stored = self.stored_marker(owner).await?;
        match stored {
            None => Ok(Marker {
                last_read: None,
                version: 0,
                unread: self.unread(owner, None).await?,
                updated_at: None,
            }),
            Some((_, stored)) => {
                let updated_at = stored.updated_at(owner)?;
                Ok(Marker {
                    unread: self.unread(owner, Some(&stored.last_read)).await?,
                    last_read: Some(stored.last_read),
                    version: stored.version,
                    updated_at: Some(updated_at),
                })
            }
        }
    }

    /// Moves `owner`'s marker to `last_read`, if its stored version is `version` (0: it was
    /// never set); the new version is `version + 1`. The marker may move back (a reader
    /// marking entries unread again).
    ///
    /// `last_read` is what a client holds, as `after` on a catch-up read: the `row_key` of an
    /// entry, a `next_cursor` of a page or of a catch-up read of this timeline, or an RFC
    /// 3339 time. It is kept as a row key: the entry's; the newest entry the page walk had
    /// seen; the newest entry the catch-up reads had returned (by its time), or where they
    /// started if they returned none; for a time, the row key of that time with the nil event
    /// id, which every entry of that time sorts after. Anything else is `invalid_cursor`.
    ///
    /// The new marker is told to the timeline's live streams.
    pub async fn put_marker(
        &self,
        owner: &SubjectId,
        last_read: &str,
        version: u64,
    ) -> DomainResult<MarkerWrite> {
        let point = self
            .point_after(owner, last_read)
            .map_err(|err| match err {
                DomainError::InvalidCursor(_) | DomainError::InvalidInput { .. } => {
                    DomainError::invalid("invalid_cursor", INVALID_LAST_READ)
                }
                other => other,
            })?;
        if version > MAX_MARKER_VERSION {
            return Err(DomainError::invalid(
                "invalid_version",
                format!("version must be 0 to {MAX_MARKER_VERSION}"),
            ));
        }
        let condition = if version == 0 {
            Condition::Absent
        } else {
            match self.stored_marker(owner).await? {
                Some((bytes, stored)) if stored.version == version => Condition::Equals(bytes),
                Some((_, stored)) => {
                    return Ok(MarkerWrite::Stale {
                        current: stored.version,
                    });
                }
                None => return Ok(MarkerWrite::Stale { current: 0 }),
            }
        };
        // Counted before the write: a count that fails leaves the marker where it was, and
        // a marker written is always told.
        let unread = self.unread(owner, Some(&point)).await?;
        let updated_at = Ticks::now();
        let stored = StoredMarker {
            last_read: point,
            version: version + 1,
            updated_at: updated_at.to_string(),
        };
        let body = serde_json::to_vec(&stored)
            .map_err(|err| DomainError::Corrupt(format!("a marker that does not encode: {err}")))?;
        let item = Item::new(owner.as_str(), MARKER_ROW, body);
        match self.store.put(Table::Markers, item, condition).await {
            Ok(()) => {}
            Err(StoreError::ConditionFailed) => {
                let current = self
                    .stored_marker(owner)
                    .await?
                    .map_or(0, |(_, stored)| stored.version);
                return Ok(MarkerWrite::Stale { current });
            }
            Err(err) => return Err(err.into()),
        }
        let marker = Marker {
            last_read: Some(stored.last_read),
            version: stored.version,
            unread,
            updated_at: Some(updated_at),
        };
        live::tell(
            &self.notices,
            owner,
            &LiveMessage::Marker {
                marker: marker.to_json(),
            },
        );
        Ok(MarkerWrite::Written(marker))
    }

    /// The stored marker of `owner`, with its bytes (for a conditional write).
    async fn stored_marker(
        &self,
        owner: &SubjectId,
    ) -> DomainResult<Option<(bytes::Bytes, StoredMarker)>> {
        let Some(bytes) = self
            .store
            .get(Table::Markers, owner.as_str(), MARKER_ROW)
            .await?
        else {
            return Ok(None);
        };
        let stored = StoredMarker::decode(owner, &bytes)?;
        Ok(Some((bytes, stored)))
    }

    /// Entries of `owner`'s timeline, pushed or merged at read time, whose row keys sort
    /// before `last_read` (all of them without it), up to the timeline cap. A read of the
    /// unread entries only, newest first: it costs what they are.
    async fn unread(&self, owner: &SubjectId, last_read: Option<&str>) -> DomainResult<usize> {
        let cap = self.settings.max_timeline_len;
        let store = self.store.as_ref();
        let window = Window {
            end: last_read.map(str::to_owned),
            ..Window::default()
        };
        let mut rows = self.merged(owner, &window, cap.max(1)).await?;
        let mut unread = 0;
        while unread < cap && rows.next(store).await?.is_some() {
            unread += 1;
        }
        Ok(unread)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use serde_json::json;
    use uuid::Uuid;

    use super::*;
    use crate::cursor::CursorCodec;
    use crate::keys::event_row_key;
    use crate::notices::Notices;
    use crate::store::{EmbeddedStore, Store, Write};
    use crate::timeline::Settings;

    const CAP: usize = 4;

    struct Fixture {
        _dir: tempfile::TempDir,
        store: Arc<dyn Store>,
        timelines: Timelines,
        notices: Notices,
        owner: SubjectId,
    }

    async fn fixture() -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let store: Arc<dyn Store> =
            Arc::new(EmbeddedStore::open_async(dir.path()).await.expect("open"));
        let notices = Notices::local();
        let timelines = Timelines::new(
            store.clone(),
            CursorCodec::new(b"a test key of thirty-two bytes!!"),
            Settings {
                max_payload_bytes: 1024,
                max_timeline_len: CAP,
                backfill: 100,
                catch_up_window: Duration::from_secs(60),
                max_notification_groups: 200,
            },
            crate::jobs::Wake::without_handoff(),
        )
        .with_notices(notices.clone());
        Fixture {
            _dir: dir,
            store,
            timelines,
            notices,
            owner: SubjectId::parse("reader").expect("owner"),
        }
    }

    /// The time `seconds` after a fixed origin.
    fn at(seconds: u64) -> Ticks {
        Ticks::new(639_000_000_000_000_000 + seconds * 10_000_000).expect("ticks")
    }

    /// Delivers an entry at `seconds` to the reader's timeline; returns its row key.
    async fn deliver(fixture: &Fixture, seconds: u64) -> String {
        let event = crate::timeline::Event {
            event_id: Uuid::now_v7(),
            author: SubjectId::parse("writer").expect("author"),
            kind: "post".into(),
            payload: serde_json::value::RawValue::from_string("{}".into()).expect("payload"),
            at: at(seconds),
            row_key: String::new(),
            version: 1,
            edited_at: None,
            fanout: true,
        };
        let row_key = event_row_key(at(seconds), event.event_id);
        let event = crate::timeline::Event {
            row_key: row_key.clone(),
            ..event
        };
        fixture
            .store
            .batch_write(vec![
                Write::put(Table::Events, Item::new("writer", &row_key, event.encode())),
                Write::put(
                    Table::Timelines,
                    Item::new("reader", &row_key, event.timeline_entry_body()),
                ),
            ])
            .await
            .expect("deliver");
        row_key
    }

    /// Moves the reader's marker to `last_read` from `version`, which must succeed.
    async fn mark(fixture: &Fixture, last_read: &str, version: u64) -> Marker {
        let write = fixture
            .timelines
            .put_marker(&fixture.owner, last_read, version)
            .await
            .expect("put");
        match write {
            MarkerWrite::Written(marker) => marker,
            MarkerWrite::Stale { current } => panic!("stale, at version {current}"),
        }
    }

    #[tokio::test]
    async fn a_marker_counts_the_entries_above_its_point_up_to_the_cap() {
        let fixture = fixture().await;
        let timelines = &fixture.timelines;
        let owner = &fixture.owner;
        let mut rows = Vec::new();
        for seconds in [10, 20, 30] {
            rows.push(deliver(&fixture, seconds).await);
        }
        let unset = timelines.marker(owner).await.expect("marker");
        assert_eq!((unset.last_read, unset.version, unset.unread), (None, 0, 3));

        let first = mark(&fixture, &rows[0], 0).await;
        assert_eq!(first.last_read.as_deref(), Some(rows[0].as_str()));
        assert_eq!((first.version, first.unread), (1, 2));
        assert_eq!(timelines.marker(owner).await.expect("marker"), first);

        // A time: entries of that very time are read.
        let by_time = mark(&fixture, &at(20).to_string(), 1).await;
        assert_eq!(by_time.last_read, Some(event_row_key(at(20), Uuid::nil())));
        assert_eq!((by_time.version, by_time.unread), (2, 1));

        // Back before everything: all unread, but never more than the cap.
        for seconds in [40, 50, 60] {
            deliver(&fixture, seconds).await;
        }
        let back = mark(&fixture, &at(0).to_string(), 2).await;
        assert_eq!((back.version, back.unread), (3, CAP));
    }

    #[tokio::test]
    async fn a_catch_up_cursor_marks_read_what_its_reads_returned() {
        let fixture = fixture().await;
        let timelines = &fixture.timelines;
        let owner = &fixture.owner;
        for seconds in [10, 20, 30] {
            deliver(&fixture, seconds).await;
        }
        // Two of three returned, oldest first: one is unread.
        let read = timelines
            .catch_up(owner, 2, &at(0).to_string())
            .await
            .expect("catch up");
        let marker = mark(&fixture, &read.next_cursor, 0).await;
        assert_eq!(marker.unread, 1);
        // A cursor that returned nothing stands where its read started.
        let nothing = timelines
            .catch_up(owner, 250, &at(30).to_string())
            .await
            .expect("catch up");
        assert!(nothing.items.is_empty());
        let marker = mark(&fixture, &nothing.next_cursor, 1).await;
        assert_eq!(marker.unread, 0);
        let from_entry = timelines
            .catch_up(owner, 250, &read.items[0].row_key)
            .await
            .expect("catch up");
        assert_eq!(from_entry.items.len(), 2);
        let again = timelines
            .catch_up(owner, 250, &from_entry.next_cursor)
            .await
            .expect("catch up");
        let marker = mark(&fixture, &again.next_cursor, 2).await;
        assert_eq!(marker.unread, 0, "{marker:?}");
    }

    #[tokio::test]
    async fn a_write_naming_an_old_version_is_stale_and_changes_nothing() {
        let fixture = fixture().await;
        let timelines = &fixture.timelines;
        let owner = &fixture.owner;
        let row = deliver(&fixture, 10).await;
        let time = at(5).to_string();
        assert_eq!(
            timelines.put_marker(owner, &time, 1).await.expect("put"),
            MarkerWrite::Stale { current: 0 }
        );
        let first = mark(&fixture, &row, 0).await;
        for version in [0, 2, 7] {
            assert_eq!(
                timelines
                    .put_marker(owner, &time, version)
                    .await
                    .expect("put"),
                MarkerWrite::Stale { current: 1 }
            );
        }
        assert_eq!(timelines.marker(owner).await.expect("marker"), first);
        let too_large = timelines
            .put_marker(owner, &time, MAX_MARKER_VERSION + 1)
            .await;
        assert!(
            matches!(
                too_large,
                Err(DomainError::InvalidInput {
                    code: "invalid_version",
                    ..
                })
            ),
            "{too_large:?}"
        );
        for garbage in ["", "x", "2026-13-01T00:00:00Z", &format!("{row}0")] {
            let refused = timelines.put_marker(owner, garbage, 1).await;
            assert!(
                matches!(
                    refused,
                    Err(DomainError::InvalidInput {
                        code: "invalid_cursor",
                        ..
                    })
                ),
                "{garbage}: {refused:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_moved_marker_is_told_to_the_streams_of_its_timeline() {
        let fixture = fixture().await;
        let mut subscription = fixture.notices.subscribe(8);
        subscription.watch(&live::timeline_topic("reader"));
        let mut elsewhere = fixture.notices.subscribe(8);
        elsewhere.watch(&live::timeline_topic("other"));
        let row = deliver(&fixture, 10).await;
        let marker = mark(&fixture, &row, 0).await;
        let pending = subscription.take();
        assert_eq!(pending.messages.len(), 1, "{pending:?}");
        let (topic, body) = &pending.messages[0];
        assert_eq!(topic, "timeline/reader");
        let told = LiveMessage::decode(body).expect("a live message");
        let expected = json!({
            "last_read": row,
            "version": 1,
            "unread": 0,
            "updated_at": marker.updated_at.expect("set").to_string(),
        });
        assert_eq!(told, LiveMessage::Marker { marker: expected });
        assert!(elsewhere.take().messages.is_empty());

        // A stale write tells nothing.
        let stale = fixture
            .timelines
            .put_marker(&fixture.owner, &row, 0)
            .await
            .expect("put");
        assert_eq!(stale, MarkerWrite::Stale { current: 1 });
        assert!(subscription.take().messages.is_empty());
    }

    #[tokio::test]
    async fn of_writes_naming_the_same_version_at_once_exactly_one_wins() {
        let fixture = Arc::new(fixture().await);
        let row = deliver(&fixture, 10).await;
        for version in [0, 1] {
            let writes = (0..8).map(|_| {
                let fixture = fixture.clone();
                let row = row.clone();
                tokio::spawn(async move {
                    fixture
                        .timelines
                        .put_marker(&fixture.owner, &row, version)
                        .await
                        .expect("put")
                })
            });
            let mut won = 0;
            for write in writes.collect::<Vec<_>>() {
                match write.await.expect("joined") {
                    MarkerWrite::Written(marker) => {
                        won += 1;
                        assert_eq!(marker.version, version + 1);
                    }
                    MarkerWrite::Stale { current } => assert_eq!(current, version + 1),
                }
            }
            assert_eq!(won, 1, "at version {version}");
        }
    }
}
