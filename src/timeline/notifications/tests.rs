//! Notification feeds on the embedded store and on an Azure-shaped one (one partition a
//! transaction, jobs enqueued ahead): addressing, grouping, deletes, edits, seen and read,
//! the cap, and a randomized run of concurrent likes, unlikes and marker writes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::{Rng as _, SeedableRng as _};
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::feed::group_id;
use super::*;
use crate::config::Config;
use crate::cursor::CursorCodec;
use crate::jobs::{Processed, Wake, Worker};
use crate::keys::Ticks;
use crate::notices::Notices;
use crate::store::fault::{Calls, Fault, FaultyStore, Op};
use crate::store::{EmbeddedStore, Query, Store, StoreExt as _, Table};
use crate::timeline::event_index::EventIndex;
use crate::timeline::{Event, NewEvent, Posted, TimelineEntry, Timelines, job_handlers};

struct Rig {
    _dir: tempfile::TempDir,
    store: EmbeddedStore,
    shaped: Arc<FaultyStore>,
    timelines: Arc<Timelines>,
    max_groups: usize,
}

async fn rig(azure: bool, max_groups: usize) -> Rig {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open_async(dir.path()).await.expect("open");
    let faulty = FaultyStore::new(Arc::new(store.clone()));
    let shaped = Arc::new(if azure { faulty.azure_shaped() } else { faulty });
    let mut settings = Config::defaults().timeline_settings();
    settings.max_notification_groups = max_groups;
    let timelines = Arc::new(Timelines::new(
        shaped.clone(),
        CursorCodec::new(b"test"),
        settings,
        Wake::without_handoff(),
    ));
    Rig {
        _dir: dir,
        store,
        shaped,
        timelines,
        max_groups,
    }
}

fn id(text: &str) -> SubjectId {
    SubjectId::parse(text).expect("id")
}

fn addressed(to: &[&str], group: Option<&str>, fanout: bool) -> Addressing {
    Addressing {
        to: to.iter().map(|target| (*target).to_owned()).collect(),
        group: group.map(str::to_owned),
        fanout,
    }
}

fn new_event(kind: &str, payload: &str, addressing: Addressing) -> NewEvent {
    NewEvent {
        client_id: None,
        kind: Some(kind.to_owned()),
        payload: RawValue::from_string(payload.to_owned()).expect("json"),
        at: None,
        addressing,
    }
}

impl Rig {
    fn worker(&self) -> Worker {
        let store: Arc<dyn Store> = self.shaped.clone();
        let mut settings = Config::defaults().fanout_settings();
        settings.max_notification_groups = self.max_groups;
        let handlers = job_handlers(
            &store,
            settings,
            crate::timeline::fanout::FanoutMetrics::default(),
            &Wake::without_handoff(),
            &Notices::local(),
        );
        Worker::patient_and_quick(store, handlers)
    }

    async fn post(&self, author: &str, kind: &str, addressing: Addressing) -> Event {
        match self
            .timelines
            .post_event(&id(author), new_event(kind, "{}", addressing))
            .await
            .expect("post")
        {
            Posted::Created(event) | Posted::Existing(event) => event,
        }
    }

    async fn like(&self, author: &str, post: &str, owner: &str) -> Event {
        self.post(author, "like", addressed(&[owner], Some(post), false))
            .await
    }

    async fn queued(&self) -> u64 {
        crate::jobs::depth(&self.store, 10_000)
            .await
            .expect("queue")
    }

    /// Runs every job, hidden ones too, on a store without faults.
    async fn settle(&self) {
        self.shaped.clear();
        crate::jobs::show_hidden_jobs(&self.store).await;
        let mut worker = self.worker();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.queued().await > 0 && Instant::now() < deadline {
            match worker.try_process_one().await {
                Ok(Processed::Job) => {}
                Ok(Processed::Idle) | Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
            }
        }
        assert_eq!(self.queued().await, 0, "the queue drained");
    }

    async fn page(&self, owner: &str) -> NotificationPage {
        self.timelines
            .notifications(&id(owner), 250, None)
            .await
            .expect("page")
    }
}

#[tokio::test]
async fn likes_of_one_post_are_one_group_with_its_count_latest_actors_and_newest_event() {
    for azure in [false, true] {
        let rig = rig(azure, 200).await;
        let mut last = None;
        for _round in 0..3 {
            for liker in 0..12 {
                last = Some(rig.like(&format!("liker{liker}"), "post:p9", "carol").await);
            }
        }
        rig.settle().await;
        rig.post("dave", "reply", addressed(&["carol"], None, true))
            .await;
        rig.settle().await;
        let page = rig.page("carol").await;
        assert_eq!(
            page.items.len(),
            2,
            "azure {azure}: the likes and the reply"
        );
        let reply = &page.items[0];
        assert_eq!(
            (reply.kind.as_str(), reply.group.as_deref()),
            ("reply", None)
        );
        let likes = &page.items[1];
        assert_eq!(likes.group.as_deref(), Some("post:p9"));
        assert_eq!((likes.count, likes.actor_count), (36, 12));
        // The last round's likers, newest first.
        let expected: Vec<String> = (2..12).rev().map(|n| format!("liker{n}")).collect();
        assert_eq!(likes.actors, expected);
        let last = last.expect("liked");
        let latest = likes.latest.as_ref().expect("latest");
        assert_eq!(latest.event_id(), last.event_id);
        assert!(!likes.seen && !likes.read);
        assert_eq!((page.counts.unseen, page.counts.unread), (2, 2));
        // `to` is on no item: not on the author's log, not on the reply's timelines.
        let mut json = Vec::new();
        latest.write_json("author", &mut json);
        assert!(!String::from_utf8_lossy(&json).contains("carol"));
        // A like reaches no timeline, not even its author's.
        let timeline = rig
            .timelines
            .timeline(&id("liker0"), 250, None)
            .await
            .expect("read");
        assert!(timeline.items.is_empty(), "azure {azure}");
        let log = rig
            .timelines
            .events(&id("liker0"), 250, None)
            .await
            .expect("log");
        assert_eq!(log.items.len(), 3);
    }
}

#[tokio::test]
async fn a_deleted_event_leaves_its_group_and_a_group_emptied_goes() {
    for azure in [false, true] {
        let rig = rig(azure, 200).await;
        let ann = rig.like("ann", "post:p1", "carol").await;
        let bob = rig.like("bob", "post:p1", "carol").await;
        let solo = rig
            .post("ann", "mention", addressed(&["carol"], None, true))
            .await;
        rig.settle().await;
        assert_eq!(rig.page("carol").await.items.len(), 2);
        // Bob's like, the group's newest, goes: Ann's is the newest again.
        rig.timelines
            .delete_event(&id("bob"), &bob.event_id.to_string())
            .await
            .expect("delete");
        rig.timelines
            .delete_event(&id("ann"), &solo.event_id.to_string())
            .await
            .expect("delete");
        rig.settle().await;
        let page = rig.page("carol").await;
        assert_eq!(
            page.items.len(),
            1,
            "azure {azure}: the mention's group is gone"
        );
        let likes = &page.items[0];
        assert_eq!((likes.count, likes.actor_count), (1, 1));
        assert_eq!(likes.actors, ["ann"]);
        assert_eq!(
            likes.latest.as_ref().map(TimelineEntry::event_id),
            Some(ann.event_id)
        );
    }
}

#[tokio::test]
async fn a_delete_that_runs_before_its_delivery_keeps_the_event_out() {
    for azure in [false, true] {
        let rig = rig(azure, 200).await;
        let like = rig.like("ann", "post:p1", "carol").await;
        // The delete's jobs run first: they leave a tombstone, which the delivery finds.
        rig.timelines
            .delete_event(&id("ann"), &like.event_id.to_string())
            .await
            .expect("delete");
        let store: Arc<dyn Store> = rig.shaped.clone();
        let removal = super::apply::remove(store.as_ref(), "carol", like.event_id)
            .await
            .expect("remove");
        assert!(!removal.any);
        // Its job is done: only the delivery is left to run.
        let job = crate::jobs::JobKey::new(like.event_id, ".nr");
        rig.store
            .delete(
                Table::Jobs,
                &job.shard_name(),
                &job.id,
                crate::store::Condition::None,
            )
            .await
            .expect("drop the removal job");
        rig.settle().await;
        assert!(rig.page("carol").await.items.is_empty(), "azure {azure}");
        let rows = rig
            .store
            .query_all(Query::partition(Table::Notifications, "carol", 100))
            .await
            .expect("rows");
        let rows: Vec<&str> = rows.iter().map(|item| item.row.as_str()).collect();
        assert_eq!(rows, [format!("e/{}", like.event_id)], "only the tombstone");
    }
}

#[tokio::test]
async fn an_edit_changes_the_newest_event_shown_and_never_its_group() {
    for azure in [false, true] {
        let rig = rig(azure, 200).await;
        let like = rig.like("ann", "post:p1", "carol").await;
        rig.settle().await;
        let before = rig.page("carol").await.items[0].id.clone();
        let edit = crate::timeline::EventEdit {
            payload: RawValue::from_string(r#"{"emoji":"tada"}"#.into()).expect("json"),
            version: None,
        };
        rig.timelines
            .edit_event(&id("ann"), &like.event_id.to_string(), edit)
            .await
            .expect("edit");
        rig.settle().await;
        let page = rig.page("carol").await;
        assert_eq!(page.items.len(), 1);
        assert_eq!(page.items[0].id, before, "azure {azure}");
        let mut json = Vec::new();
        page.items[0]
            .latest
            .as_ref()
            .expect("latest")
            .write_json("author", &mut json);
        assert!(String::from_utf8_lossy(&json).contains("tada"));
    }
}

#[tokio::test]
async fn seen_and_read_count_groups_and_a_new_event_makes_its_group_unseen_and_unread_again() {
    for azure in [false, true] {
        let rig = rig(azure, 200).await;
        let carol = id("carol");
        rig.like("ann", "post:p1", "carol").await;
        rig.like("ann", "post:p2", "carol").await;
        rig.like("ann", "post:p3", "carol").await;
        rig.settle().await;
        let page = rig.page("carol").await;
        assert_eq!((page.counts.unseen, page.counts.unread), (3, 3));
        let write = |seen, read, version| NotificationMarkerWrite {
            seen,
            read,
            version,
        };
        let counts = match rig
            .timelines
            .put_notification_marker(&carol, write(Some(Ticks::now()), None, Some(0)))
            .await
            .expect("mark")
        {
            NotificationMarkerWritten::Written(counts) => counts,
            stale => panic!("{stale:?}"),
        };
        assert_eq!((counts.unseen, counts.unread, counts.version), (0, 3, 1));
        // A stale version changes nothing.
        let stale = rig
            .timelines
            .put_notification_marker(&carol, write(None, Some(ReadMark::All), Some(0)))
            .await
            .expect("mark");
        assert!(matches!(
            stale,
            NotificationMarkerWritten::Stale { current: 1 }
        ));
        let one = page
            .items
            .iter()
            .find(|item| item.group.as_deref() == Some("post:p2"))
            .expect("p2")
            .id
            .clone();
        let counts = match rig
            .timelines
            .put_notification_marker(
                &carol,
                write(None, Some(ReadMark::Groups(vec![one.clone()])), None),
            )
            .await
            .expect("mark")
        {
            NotificationMarkerWritten::Written(counts) => counts,
            stale => panic!("{stale:?}"),
        };
        assert_eq!((counts.unseen, counts.unread, counts.version), (0, 2, 2));
        let page = rig.page("carol").await;
        let marked = page
            .items
            .iter()
            .find(|item| item.id == one)
            .expect("group");
        assert!(marked.seen && marked.read);
        // Bob's like of that post moves its group up, unseen and unread.
        rig.like("bob", "post:p2", "carol").await;
        rig.settle().await;
        let page = rig.page("carol").await;
        assert_eq!(page.items[0].id, one, "azure {azure}: moved to the top");
        assert!(!page.items[0].seen && !page.items[0].read);
        assert_eq!((page.counts.unseen, page.counts.unread), (1, 3));
        // `seen_until` an item's time marks seen what is no newer.
        let until = page.items[1].updated_at;
        rig.timelines
            .put_notification_marker(&carol, write(Some(until), Some(ReadMark::All), None))
            .await
            .expect("mark");
        let counts = rig
            .timelines
            .notification_counts(&carol)
            .await
            .expect("counts");
        assert_eq!((counts.unseen, counts.unread), (1, 0));
    }
}

#[tokio::test]
async fn a_feed_keeps_its_newest_groups_and_pages_show_each_once() {
    for azure in [false, true] {
        let rig = rig(azure, 5).await;
        for post in 0..8 {
            rig.like("ann", &format!("post:p{post}"), "carol").await;
            rig.settle().await;
        }
        let page = rig.page("carol").await;
        let groups: Vec<&str> = page
            .items
            .iter()
            .filter_map(|item| item.group.as_deref())
            .collect();
        assert_eq!(
            groups,
            ["post:p7", "post:p6", "post:p5", "post:p4", "post:p3"],
            "azure {azure}"
        );
        // A trim (which changes that make groups run now and then) leaves nothing of the
        // trimmed groups but the rows of those kept.
        let store: Arc<dyn Store> = rig.shaped.clone();
        super::apply::trim(store.as_ref(), "carol", 5)
            .await
            .expect("trim");
        let rows = rig
            .store
            .query_all(Query::partition(Table::Notifications, "carol", 1000))
            .await
            .expect("rows");
        let members = rows
            .iter()
            .filter(|item| item.row.starts_with("m/"))
            .count();
        assert_eq!(members, 5);
        // Pages of two: each group once, in order, though one moves during the walk.
        let carol = id("carol");
        let first = rig
            .timelines
            .notifications(&carol, 2, None)
            .await
            .expect("page");
        rig.like("bob", "post:p3", "carol").await;
        rig.settle().await;
        let mut seen: Vec<String> = first.items.iter().map(|item| item.id.clone()).collect();
        let mut cursor = first.next_cursor;
        while let Some(at) = cursor {
            let next = rig
                .timelines
                .notifications(&carol, 2, Some(&at))
                .await
                .expect("page");
            seen.extend(next.items.iter().map(|item| item.id.clone()));
            cursor = next.next_cursor;
        }
        let unique: HashSet<&String> = seen.iter().collect();
        assert_eq!(unique.len(), seen.len(), "no group twice");
        assert_eq!(seen.len(), 4, "the moved group is on the next first page");
    }
}

#[tokio::test]
async fn bad_addressing_is_refused_before_anything_is_written() {
    let rig = rig(false, 200).await;
    let too_many: Vec<String> = (0..101).map(|n| format!("s{n}")).collect();
    let cases = [
        (
            Addressing {
                to: too_many,
                ..Addressing::default()
            },
            "too_many_targets",
        ),
        (addressed(&["ok", "../x"], None, true), "invalid_target"),
        (addressed(&["ok"], Some(""), true), "invalid_group"),
        (addressed(&["ok"], Some("a\u{7}b"), true), "invalid_group"),
    ];
    for (addressing, code) in cases {
        match rig
            .timelines
            .post_event(&id("ann"), new_event("like", "{}", addressing))
            .await
        {
            Err(DomainError::InvalidInput { code: got, .. }) => assert_eq!(got, code),
            other => panic!("{code}: {other:?}"),
        }
    }
    let log = rig
        .timelines
        .events(&id("ann"), 250, None)
        .await
        .expect("log");
    assert!(log.items.is_empty());
    assert_eq!(rig.queued().await, 0);
}

/// Likes and unlikes of three posts by a dozen authors and marker writes, from four clients
/// at once, with two workers running and transactions failing now and then: at quiet, each
/// group holds exactly what the live events addressed to the feed say.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_likes_unlikes_and_marker_writes_leave_each_group_as_its_live_events_say() {
    for (azure, seed) in [(false, 11u64), (true, 12), (false, 13), (true, 14)] {
        let rig = Arc::new(rig(azure, 200).await);
        rig.shaped
            .fail_every(13, Calls::op(Op::Transact), Fault::Unavailable);
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        for _ in 0..2 {
            let (rig, stop) = (rig.clone(), stop.clone());
            workers.push(tokio::spawn(async move {
                let mut worker = rig.worker();
                while !stop.load(Ordering::SeqCst) {
                    match worker.try_process_one().await {
                        Ok(Processed::Job) => {}
                        Ok(Processed::Idle) | Err(_) => tokio::task::yield_now().await,
                    }
                }
            }));
        }
        let mut clients = Vec::new();
        for client in 0..4u64 {
            let rig = rig.clone();
            clients.push(tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 10 + client);
                let mut mine: Vec<(String, String)> = Vec::new();
                for _ in 0..60 {
                    let author = format!("a{}", rng.random_range(0..12));
                    match rng.random_range(0..10) {
                        0..6 => {
                            let post = format!("post:p{}", rng.random_range(0..3));
                            let addressing = addressed(&["t"], Some(&post), false);
                            if let Ok(Posted::Created(event)) = rig
                                .timelines
                                .post_event(&id(&author), new_event("like", "{}", addressing))
                                .await
                            {
                                mine.push((author, event.event_id.to_string()));
                            }
                        }
                        6..8 if !mine.is_empty() => {
                            let (author, event) = mine.swap_remove(rng.random_range(0..mine.len()));
                            let _ = rig.timelines.delete_event(&id(&author), &event).await;
                        }
                        _ => {
                            let write = NotificationMarkerWrite {
                                seen: rng.random_bool(0.5).then(Ticks::now),
                                read: Some(ReadMark::All),
                                version: None,
                            };
                            let _ = rig.timelines.put_notification_marker(&id("t"), write).await;
                        }
                    }
                }
            }));
        }
        for client in clients {
            client.await.expect("client");
        }
        stop.store(true, Ordering::SeqCst);
        for worker in workers {
            worker.await.expect("worker");
        }
        assert!(rig.shaped.injected() > 0, "faults were injected");
        rig.settle().await;
        assert_groups_match_live_events(&rig, "t", 12).await;
    }
}

/// Every group of `owner`'s feed counts exactly the live events addressed to it (of the
/// authors `a0..a{authors}`), names their latest distinct authors, and shows the newest.
async fn assert_groups_match_live_events(rig: &Rig, owner: &str, authors: usize) {
    #[derive(Default, Debug)]
    struct Expected {
        count: u64,
        latest: (u64, uuid::Uuid),
        by_author: HashMap<String, u64>,
    }
    let mut expected: BTreeMap<String, Expected> = BTreeMap::new();
    for author in (0..authors).map(|n| format!("a{n}")) {
        let author_id = id(&author);
        for item in rig
            .store
            .query_all(Query::partition(Table::Events, &author, 1000))
            .await
            .expect("events")
        {
            let event = Event::decode(&author_id, &item.row, &item.value).expect("event");
            let index = rig
                .store
                .get(Table::EventIds, &author, &event.event_id.to_string())
                .await
                .expect("index")
                .expect("an index");
            let index = EventIndex::decode(&index, event.event_id).expect("index");
            let Some(addressed) = index
                .addressed
                .filter(|to| to.to.iter().any(|t| t == owner))
            else {
                continue;
            };
            let gid = group_id(
                event.event_id,
                &event.kind,
                addressed.group.as_deref(),
                event.at,
            );
            let group = expected.entry(gid).or_default();
            group.count += 1;
            group.latest = group.latest.max((event.at.get(), event.event_id));
            let at = group.by_author.entry(author.clone()).or_default();
            *at = (*at).max(event.at.get());
        }
    }
    let page = rig.page(owner).await;
    let shown: BTreeMap<String, &GroupItem> = page
        .items
        .iter()
        .map(|item| (item.id.clone(), item))
        .collect();
    assert_eq!(
        shown.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "the groups are those of the live events"
    );
    for (gid, want) in &expected {
        let item = shown[gid];
        assert_eq!(item.count, want.count, "count of {gid}");
        assert_eq!(
            item.actor_count,
            want.by_author.len() as u64,
            "actors of {gid}"
        );
        let mut actors: Vec<(&String, &u64)> = want.by_author.iter().collect();
        actors.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
        let names: Vec<String> = actors
            .iter()
            .take(10)
            .map(|(name, _)| (*name).clone())
            .collect();
        assert_eq!(item.actors, names, "latest actors of {gid}");
        assert_eq!(
            item.latest.as_ref().map(TimelineEntry::event_id),
            Some(want.latest.1),
            "newest of {gid}"
        );
    }
}
