//! Timeline lifecycle through the HTTP API: backfill on follow, cleanup on unfollow, delete
//! everywhere, the timeline cap, authors merged at read time, and catch-up reads. Each test
//! drains the job queue (`wait_for_idle`) instead of sleeping.

use std::time::Duration;

use fanline::store::fault::{Calls, Op};
use fanline::store::{Query, Store, Table};
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{Api, Backend, TestApp, TestStore, at, post_at, segment, spawn_app_with};

on_every_backend!(
    following_backfills_the_newest_events_in_time_order,
    unfollow_removes_the_subjects_entries_from_the_follower_timeline,
    a_fan_out_that_writes_after_an_unfollows_cleanup_takes_its_entry_back,
    a_post_whose_own_fan_out_commits_after_a_follow_and_an_unfollow_reaches_just_the_followers,
    follow_and_unfollow_in_quick_succession_end_in_the_state_of_the_last_call,
    deleting_an_event_hides_it_at_once_and_removes_every_copy,
    deleting_a_missing_event_is_a_404_and_deleting_twice_is_idempotent,
    a_timeline_page_stops_at_the_cap_and_says_it_was_truncated,
    merged_timeline_pages_match_a_fully_pushed_timeline_page_by_page,
    an_author_crossing_the_threshold_both_ways_keeps_timelines_whole,
    a_merge_transition_that_writes_after_an_unfollows_cleanup_takes_its_marker_back,
    a_merged_authors_events_are_caught_up_and_deleted_and_the_delete_is_told,
    posts_racing_across_the_threshold_all_reach_every_follower,
    catch_up_reads_return_every_entry_once_oldest_first_even_when_late,
);

async fn app(backend: Backend, adjust: impl FnOnce(&mut fanline::config::Config)) -> TestApp {
    spawn_app_with(TestStore::new(backend).await, |config| {
        config.workers = 4;
        adjust(config);
    })
    .await
}

async fn follow(api: &Api, follower: &str, target: &str) {
    assert_eq!(
        api.follow(follower, target).await.status,
        StatusCode::NO_CONTENT
    );
}

async fn unfollow(api: &Api, follower: &str, target: &str) {
    assert_eq!(
        api.unfollow(follower, target).await.status,
        StatusCode::NO_CONTENT
    );
}

fn texts(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|item| item["payload"]["text"].as_str().expect("text").to_owned())
        .collect()
}

fn row_keys(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|item| item["row_key"].as_str().expect("row_key").to_owned())
        .collect()
}

/// The rows stored in one partition, whatever reads would show.
async fn stored_rows(app: &TestApp, table: Table, partition: &str) -> Vec<String> {
    app.faults
        .query(Query::partition(table, partition, 10_000))
        .await
        .expect("query")
        .into_iter()
        .map(|item| item.row)
        .collect()
}

async fn following_backfills_the_newest_events_in_time_order(backend: Backend) {
    let app = app(backend, |config| config.backfill = 3).await;
    // Posted out of time order: the backfill must land by time, as a fan-out would.
    for (text, seconds) in [("b", 20), ("e", 50), ("a", 10), ("d", 40), ("c", 30)] {
        post_at(&app, "author", text, seconds).await;
    }
    app.wait_for_idle().await;
    follow(&app, "reader", "author").await;
    app.wait_for_idle().await;
    let timeline = app.timeline("reader").await;
    assert_eq!(texts(&timeline), ["e", "d", "c"]);
    let events = app.all_pages("author", "events").await;
    assert_eq!(row_keys(&timeline), row_keys(&events[..3]));
    // Later events are fanned out on top, as usual.
    post_at(&app, "author", "f", 60).await;
    app.wait_for_idle().await;
    assert_eq!(texts(&app.timeline("reader").await), ["f", "e", "d", "c"]);
}

async fn unfollow_removes_the_subjects_entries_from_the_follower_timeline(backend: Backend) {
    let app = app(backend, |_| {}).await;
    follow(&app, "reader", "alice").await;
    follow(&app, "reader", "bob").await;
    app.wait_for_idle().await;
    for (index, seconds) in [1, 3, 5].into_iter().enumerate() {
        post_at(&app, "alice", &format!("alice-{index}"), seconds).await;
        post_at(&app, "bob", &format!("bob-{index}"), seconds + 1).await;
    }
    app.wait_for_idle().await;
    assert_eq!(app.timeline("reader").await.len(), 6);
    unfollow(&app, "reader", "alice").await;
    app.wait_for_idle().await;
    assert_eq!(
        texts(&app.timeline("reader").await),
        ["bob-2", "bob-1", "bob-0"]
    );
    // Gone from storage too, not just hidden; alice's own timeline is untouched.
    assert_eq!(stored_rows(&app, Table::Timelines, "reader").await.len(), 3);
    assert_eq!(app.timeline("alice").await.len(), 3);
}

async fn a_fan_out_that_writes_after_an_unfollows_cleanup_takes_its_entry_back(backend: Backend) {
    // A job's fan-out: a post's own commit is refused by the unfollow instead (`in_post`).
    let app = app(backend, |config| config.fanout_in_post = Some(0)).await;
    follow(&app, "reader", "alice").await;
    app.wait_for_idle().await;
    // The fan-out reads alice's followers (reader among them), then writes their entries.
    let entries = Calls::on(Op::BatchWrite, Table::Timelines);
    unfollow_under_a_held_write(&app, entries, "alice", "reader").await;
    assert_eq!(
        stored_rows(&app, Table::Timelines, "reader").await,
        Vec::<String>::new(),
        "the fan-out took back the entry of a reader who unfollowed"
    );
    assert_eq!(texts(&app.timeline("alice").await), ["hello"]);
}

/// Posts `hello` as `author` and holds the first `calls` write of its fan-out (made after it
/// read the followers) while `reader` unfollows and the unfollow's cleanup runs, finding
/// nothing yet; then lets the write go on and drains the queue.
/// A post that fans out in its own commit, held between reading alice's followers and
/// committing: a follow and an unfollow land meanwhile, and their jobs run (the backfill
/// before the event exists, the cleanup before its entry does). The commit must be refused,
/// and the event go with a job that sees the edges as they are now.
async fn a_post_whose_own_fan_out_commits_after_a_follow_and_an_unfollow_reaches_just_the_followers(
    backend: Backend,
) {
    let app = app(backend, |config| config.fanout_in_post = Some(8)).await;
    follow(&app, "leaver", "alice").await;
    app.wait_for_idle().await;
    post_at(&app, "alice", "first", 1).await;
    app.wait_for_idle().await;
    let commit = app
        .faults
        .hold_nth(1, Calls::on(Op::Transact, Table::Events));
    let poster = Api::new(&app.api.address);
    let second = tokio::spawn(async move { post_at(&poster, "alice", "second", 2).await });
    tokio::time::timeout(Duration::from_secs(30), commit.reached())
        .await
        .expect("the post never made its commit");
    follow(&app, "joiner", "alice").await;
    unfollow(&app, "leaver", "alice").await;
    // On Azure the held post's job waits in the queue, hidden, ahead of its event.
    let held = u64::from(backend == Backend::Azure);
    app.wait_for_queue_depth(held).await;
    assert_eq!(
        texts(&app.timeline("joiner").await),
        ["first"],
        "backfilled"
    );
    commit.open();
    tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("the post was never answered")
        .expect("the post task");
    app.wait_for_idle().await;
    assert_eq!(texts(&app.timeline("joiner").await), ["second", "first"]);
    assert_eq!(
        stored_rows(&app, Table::Timelines, "leaver").await,
        Vec::<String>::new(),
        "nothing of alice's is left with a reader who unfollowed"
    );
    assert_eq!(texts(&app.timeline("alice").await), ["second", "first"]);
}

async fn unfollow_under_a_held_write(app: &TestApp, calls: Calls, author: &str, reader: &str) {
    let write = app.faults.hold_nth(1, calls);
    post_at(app, author, "hello", 1).await;
    tokio::time::timeout(Duration::from_secs(30), write.reached())
        .await
        .expect("the fan-out never made the held write");
    unfollow(app, reader, author).await;
    // Only the held fan-out is left in the queue once the unfollow's cleanup has run.
    app.wait_for_queue_depth(1).await;
    assert!(app.timeline(reader).await.is_empty());
    write.open();
    app.wait_for_idle().await;
    assert!(app.timeline(reader).await.is_empty());
}

async fn follow_and_unfollow_in_quick_succession_end_in_the_state_of_the_last_call(
    backend: Backend,
) {
    let app = app(backend, |_| {}).await;
    for seconds in 1..=5 {
        post_at(&app, "author", &format!("post-{seconds}"), seconds).await;
    }
    app.wait_for_idle().await;
    for round in 0..3 {
        // Ends unfollowed: nothing of the author may be left.
        for _ in 0..3 {
            follow(&app, "reader", "author").await;
            unfollow(&app, "reader", "author").await;
        }
        app.wait_for_idle().await;
        assert!(
            app.timeline("reader").await.is_empty(),
            "round {round}: unfollow was last"
        );
        assert!(
            stored_rows(&app, Table::Timelines, "reader")
                .await
                .is_empty()
        );
        // Ends followed: the backfill must be whole.
        for _ in 0..3 {
            unfollow(&app, "reader", "author").await;
            follow(&app, "reader", "author").await;
        }
        app.wait_for_idle().await;
        assert_eq!(
            app.timeline("reader").await.len(),
            5,
            "round {round}: follow was last"
        );
        unfollow(&app, "reader", "author").await;
    }
}

async fn deleting_an_event_hides_it_at_once_and_removes_every_copy(backend: Backend) {
    let app = app(backend, |config| {
        config.max_attempts = 1000;
        config.retry_base_ms = 1;
    })
    .await;
    let readers = ["r1", "r2", "r3"];
    for reader in readers {
        follow(&app, reader, "author").await;
    }
    app.wait_for_idle().await;
    let doomed = post_at(&app, "author", "doomed", 1).await;
    post_at(&app, "author", "kept", 2).await;
    app.wait_for_idle().await;
    assert_eq!(app.timeline("r1").await.len(), 2);

    // Removal cannot write while this lasts: reads must filter the event by themselves.
    app.faults.fail_always(
        fanline::store::fault::Calls::on(fanline::store::fault::Op::BatchWrite, Table::Timelines),
        fanline::store::fault::Fault::Unavailable,
    );
    let path = format!("/v1/subjects/author/events/{doomed}");
    let deleted = app.send(app.client.delete(app.url(&path))).await;
    assert_eq!(deleted.status, StatusCode::ACCEPTED, "{deleted:?}");
    assert_eq!(deleted.body["operation"], "removal");
    assert_ne!(deleted.body["state"], "done");
    assert_eq!(texts(&app.all_pages("author", "events").await), ["kept"]);
    for owner in readers.iter().copied().chain(["author"]) {
        assert_eq!(texts(&app.timeline(owner).await), ["kept"], "{owner}");
        assert_eq!(
            stored_rows(&app, Table::Timelines, owner).await.len(),
            2,
            "{owner}: the copy is still stored, only hidden"
        );
    }

    app.faults.clear();
    app.wait_for_idle().await;
    let status = app
        .get(&format!("/v1/subjects/author/events/{doomed}/fanout"))
        .await;
    assert_eq!(status.body["operation"], "removal", "{status:?}");
    assert_eq!(status.body["state"], "done", "{status:?}");
    assert_eq!(
        status.body["delivered"], 4,
        "three followers and the author"
    );
    for owner in readers.iter().copied().chain(["author"]) {
        assert_eq!(stored_rows(&app, Table::Timelines, owner).await.len(), 1);
    }
    // The markers go with the job.
    for shard in 0..fanline::timeline::removal::SHARDS {
        let markers = stored_rows(&app, Table::Removals, &format!("removals-{shard}")).await;
        assert!(markers.is_empty(), "{markers:?}");
    }
}

async fn deleting_a_missing_event_is_a_404_and_deleting_twice_is_idempotent(backend: Backend) {
    let app = app(backend, |_| {}).await;
    follow(&app, "reader", "author").await;
    let id = post_at(&app, "author", "once", 1).await;
    let path = format!("/v1/subjects/author/events/{id}");
    let first = app.send(app.client.delete(app.url(&path))).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{first:?}");
    let second = app.send(app.client.delete(app.url(&path))).await;
    assert_eq!(second.status, StatusCode::ACCEPTED, "{second:?}");
    assert_eq!(second.body["operation"], "removal");
    app.wait_for_idle().await;
    let third = app.send(app.client.delete(app.url(&path))).await;
    assert_eq!(third.status, StatusCode::ACCEPTED);
    assert_eq!(third.body["state"], "done");
    assert!(app.timeline("reader").await.is_empty());

    let missing = format!("/v1/subjects/author/events/{}", uuid::Uuid::now_v7());
    let reply = app.send(app.client.delete(app.url(&missing))).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{reply:?}");
    assert_eq!(reply.error_code(), "not_found");
    // Another author's event is not this author's to delete.
    let other = format!("/v1/subjects/someone-else/events/{id}");
    let reply = app.send(app.client.delete(app.url(&other))).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    let reply = app
        .send(
            app.client
                .delete(app.url("/v1/subjects/author/events/not-a-uuid")),
        )
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.error_code(), "invalid_event_id");
}

async fn a_timeline_page_stops_at_the_cap_and_says_it_was_truncated(backend: Backend) {
    let app = app(backend, |config| config.max_timeline_len = 5).await;
    follow(&app, "reader", "author").await;
    follow(&app, "short", "other").await;
    app.wait_for_idle().await;
    for seconds in 1..=8 {
        post_at(&app, "author", &format!("post-{seconds}"), seconds).await;
    }
    post_at(&app, "other", "only", 1).await;
    app.wait_for_idle().await;

    let mut pages = Vec::new();
    let mut query = "limit=2".to_owned();
    loop {
        let reply = app.page("reader", "timeline", &query).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        pages.push(reply.body.clone());
        match reply.body["next_cursor"].as_str() {
            Some(cursor) => query = format!("limit=2&cursor={cursor}"),
            None => break,
        }
    }
    let sizes: Vec<usize> = pages
        .iter()
        .map(|page| page["items"].as_array().expect("items").len())
        .collect();
    assert_eq!(sizes, [2, 2, 1]);
    let last = pages.last().expect("a page");
    assert_eq!(last["truncated"], true);
    assert!(pages[..2].iter().all(|page| page["truncated"] == false));
    let kept: Vec<Value> = pages
        .iter()
        .flat_map(|page| page["items"].as_array().expect("items").clone())
        .collect();
    assert_eq!(
        texts(&kept),
        ["post-8", "post-7", "post-6", "post-5", "post-4"]
    );
    // A short timeline ends with its history: not truncated.
    let short = app.page("short", "timeline", "").await;
    assert_eq!(short.body["truncated"], false);
    assert_eq!(short.body["next_cursor"], Value::Null);
    // The read that reached the cap trims what lies past it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while stored_rows(&app, Table::Timelines, "reader").await.len() > 5 {
        assert!(std::time::Instant::now() < deadline, "never trimmed");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// The same posts and follows on an app that merges `big-author` at read time and on one that
/// pushes everything; returns each app's pages of `reader`'s timeline (texts, cursor given).
async fn timeline_pages(backend: Backend, threshold: u32) -> Vec<(Vec<String>, bool, bool)> {
    let app = app(backend, |config| {
        config.merge_threshold = threshold;
        config.max_timeline_len = 11;
        config.backfill = 2;
    })
    .await;
    for fan in ["fan-1", "fan-2", "fan-3"] {
        follow(&app, fan, "big-author").await;
    }
    follow(&app, "reader", "friend").await;
    app.wait_for_idle().await;
    // Interleaved times, none shared (ties would fall to random event ids).
    let post_both = |step: u32| {
        let api = &app.api;
        async move {
            post_at(
                api,
                "big-author",
                &format!("big-author-{step}"),
                step * 10 + 5,
            )
            .await;
            post_at(
                api,
                "friend",
                &format!("friend-{step}"),
                step * 10 + (step % 3) * 3,
            )
            .await;
        }
    };
    for step in 0..4 {
        post_both(step).await;
    }
    app.wait_for_idle().await;
    // Following a merged author: the backfill is a merge from its 2nd newest event.
    follow(&app, "reader", "big-author").await;
    app.wait_for_idle().await;
    for step in 4..8 {
        post_both(step).await;
    }
    // An author pushed to start with, backfilled, that crosses the threshold later.
    for step in 0..4u32 {
        post_at(&app, "star", &format!("star-{step}"), step * 20 + 7).await;
    }
    for fan in ["fan-1", "fan-2"] {
        follow(&app, fan, "star").await;
    }
    app.wait_for_idle().await;
    follow(&app, "reader", "star").await;
    app.wait_for_idle().await;
    post_at(&app, "star", "star-late", 79).await;
    app.wait_for_idle().await;

    let mut pages = Vec::new();
    let mut query = "limit=3".to_owned();
    loop {
        let reply = app.page("reader", "timeline", &query).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        let items = reply.body["items"].as_array().expect("items").clone();
        let cursor = reply.body["next_cursor"].as_str().map(str::to_owned);
        pages.push((
            texts(&items),
            cursor.is_some(),
            reply.body["truncated"] == true,
        ));
        match cursor {
            Some(cursor) => query = format!("limit=3&cursor={cursor}"),
            None => break,
        }
    }
    if threshold < 3 {
        // The big author's later posts really were merged, not pushed.
        let stored = stored_rows(&app, Table::Timelines, "fan-1").await;
        assert!(stored.len() < 8, "fan-1 holds {} pushed rows", stored.len());
        let merged = stored_rows(&app, Table::MergedFollowing, "reader").await;
        assert_eq!(merged, ["big-author", "star"]);
    }
    pages
}

async fn merged_timeline_pages_match_a_fully_pushed_timeline_page_by_page(backend: Backend) {
    let pushed = timeline_pages(backend, 100_000).await;
    let merged = timeline_pages(backend, 2).await;
    assert_eq!(merged, pushed);
    let total: usize = pushed.iter().map(|(texts, _, _)| texts.len()).sum();
    assert_eq!(total, 11, "the cap applies to both sources");
    assert!(pushed.last().expect("a page").2, "truncated at the cap");
}

async fn an_author_crossing_the_threshold_both_ways_keeps_timelines_whole(backend: Backend) {
    let app = app(backend, |config| config.merge_threshold = 2).await;
    follow(&app, "reader", "rising").await;
    follow(&app, "fan", "rising").await;
    app.wait_for_idle().await;
    post_at(&app, "rising", "p1", 1).await;
    app.wait_for_idle().await;
    // A third follower: the next post crosses the threshold upwards.
    follow(&app, "newcomer", "rising").await;
    app.wait_for_idle().await;
    let p2 = post_at(&app, "rising", "p2", 2).await;
    app.wait_for_idle().await;
    let p3 = post_at(&app, "rising", "p3", 3).await;
    app.wait_for_idle().await;
    let status = app
        .get(&format!("/v1/subjects/rising/events/{p3}/fanout"))
        .await;
    assert_eq!(status.body["merged_at_read"], true, "{status:?}");
    assert_eq!(status.body["state"], "done");
    assert_eq!(
        stored_rows(&app, Table::MergedFollowing, "reader").await,
        ["rising"]
    );
    assert_eq!(stored_rows(&app, Table::Timelines, "reader").await.len(), 1);
    for owner in ["reader", "fan"] {
        assert_eq!(
            texts(&app.timeline(owner).await),
            ["p3", "p2", "p1"],
            "{owner}"
        );
    }
    assert_eq!(texts(&app.timeline("newcomer").await), ["p3", "p2", "p1"]);
    assert!(p2 != p3);

    // Back under the threshold: the next post pushes again, and copies in what was merged.
    unfollow(&app, "newcomer", "rising").await;
    app.wait_for_idle().await;
    post_at(&app, "rising", "p4", 4).await;
    app.wait_for_idle().await;
    for owner in ["reader", "fan"] {
        assert_eq!(
            texts(&app.timeline(owner).await),
            ["p4", "p3", "p2", "p1"],
            "{owner}"
        );
        assert_eq!(stored_rows(&app, Table::Timelines, owner).await.len(), 4);
        assert!(
            stored_rows(&app, Table::MergedFollowing, owner)
                .await
                .is_empty()
        );
    }
    assert!(app.timeline("newcomer").await.is_empty());
    let flag = app
        .faults
        .get(Table::MergedAuthors, "rising", "merged")
        .await
        .expect("get");
    assert_eq!(flag, None);
}

async fn a_merge_transition_that_writes_after_an_unfollows_cleanup_takes_its_marker_back(
    backend: Backend,
) {
    let app = app(backend, |config| config.merge_threshold = 2).await;
    for follower in ["reader", "fan", "newcomer"] {
        follow(&app, follower, "rising").await;
    }
    app.wait_for_idle().await;
    // The post crosses the threshold: its job marks every follower's timeline to merge the
    // author.
    let marks = Calls::on(Op::BatchWrite, Table::MergedFollowing);
    unfollow_under_a_held_write(&app, marks, "rising", "fan").await;
    assert!(
        stored_rows(&app, Table::MergedFollowing, "fan")
            .await
            .is_empty(),
        "the transition took back the mark of a reader who unfollowed"
    );
    assert_eq!(texts(&app.timeline("reader").await), ["hello"]);
}

async fn a_merged_authors_events_are_caught_up_and_deleted_and_the_delete_is_told(
    backend: Backend,
) {
    let app = app(backend, |config| config.merge_threshold = 1).await;
    follow(&app, "reader", "star").await;
    follow(&app, "fan", "star").await;
    follow(&app, "reader", "friend").await;
    app.wait_for_idle().await;
    post_at(&app, "star", "s1", 10).await;
    // s1 crosses the threshold; events posted after that are merged, not fanned out (events
    // racing s1's job could be fanned out, see the racing test).
    app.wait_for_idle().await;
    post_at(&app, "friend", "f1", 15).await;
    let doomed = post_at(&app, "star", "s2", 20).await;
    post_at(&app, "star", "s3", 30).await;
    app.wait_for_idle().await;
    assert_eq!(
        texts(&app.timeline("reader").await),
        ["s3", "s2", "f1", "s1"]
    );
    let (caught, cursor) = catch_up(&app, "reader", &at(0), 250).await;
    assert_eq!(caught, ["s1", "f1", "s2", "s3"]);

    let path = format!("/v1/subjects/star/events/{doomed}");
    let deleted = app.send(app.client.delete(app.url(&path))).await;
    assert_eq!(deleted.status, StatusCode::ACCEPTED, "{deleted:?}");
    assert_eq!(texts(&app.timeline("reader").await), ["s3", "f1", "s1"]);
    app.wait_for_idle().await;
    let status = app
        .get(&format!("/v1/subjects/star/events/{doomed}/fanout"))
        .await;
    assert_eq!(status.body["operation"], "removal");
    assert_eq!(status.body["state"], "done");
    // The removal visits every follower though none holds a reference: each timeline's
    // change log records the delete, for catch-up readers that hold the entry.
    assert_eq!(
        status.body["delivered"], 3,
        "the author and both followers: {status:?}"
    );
    assert_eq!(texts(&app.timeline("fan").await), ["s3", "s1"]);
    assert_eq!(texts(&app.timeline("star").await), ["s3", "s1"]);
    post_at(&app, "star", "s4", 40).await;
    app.wait_for_idle().await;
    let (more, _) = catch_up(&app, "reader", &cursor, 250).await;
    assert_eq!(more, ["s4"]);
    let told = app
        .page("reader", "timeline", &format!("after={}", segment(&cursor)))
        .await;
    assert_eq!(
        told.body["removed"],
        serde_json::json!([doomed]),
        "{told:?}"
    );
}

async fn posts_racing_across_the_threshold_all_reach_every_follower(backend: Backend) {
    let app = app(backend, |config| config.merge_threshold = 1).await;
    for round in 0..3u32 {
        let author = format!("racer-{round}");
        follow(&app, "reader", &author).await;
        follow(&app, "fan", &author).await;
        app.wait_for_idle().await;
        // Six events posted at once: their jobs race to cross the threshold.
        let posts = (0..6u32).map(|step| {
            let api = &app.api;
            let author = author.clone();
            async move { post_at(api, &author, &format!("{author}-{step}"), 100 - step).await }
        });
        futures::future::join_all(posts).await;
        app.wait_for_idle().await;
        let expected: Vec<String> = (0..6).map(|step| format!("{author}-{step}")).collect();
        for owner in ["reader", "fan"] {
            let texts_of_round: Vec<String> = texts(&app.timeline(owner).await)
                .into_iter()
                .filter(|text| text.starts_with(&author))
                .collect();
            assert_eq!(texts_of_round, expected, "{owner}, round {round}");
        }
    }
}

/// One catch-up read; returns its texts and the cursor to go on with.
async fn catch_up(api: &Api, owner: &str, after: &str, limit: usize) -> (Vec<String>, String) {
    let query = format!("after={}&limit={limit}", segment(after));
    let reply = api.page(owner, "timeline", &query).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let items = reply.body["items"].as_array().expect("items").clone();
    let cursor = reply.body["next_cursor"]
        .as_str()
        .expect("a catch-up page always has a cursor")
        .to_owned();
    (texts(&items), cursor)
}

async fn catch_up_reads_return_every_entry_once_oldest_first_even_when_late(backend: Backend) {
    let app = app(backend, |config| config.catch_up_window_secs = 60).await;
    follow(&app, "consumer", "device").await;
    app.wait_for_idle().await;
    for seconds in [100, 110, 120] {
        post_at(&app, "device", &format!("t{seconds}"), seconds).await;
    }
    app.wait_for_idle().await;
    let (first, cursor) = catch_up(&app, "consumer", &at(0), 2).await;
    assert_eq!(first, ["t100", "t110"]);
    let (second, cursor) = catch_up(&app, "consumer", &cursor, 2).await;
    assert_eq!(second, ["t120"]);
    let (nothing, cursor) = catch_up(&app, "consumer", &cursor, 2).await;
    assert!(nothing.is_empty());

    // Late arrivals: older than what was read, but within the window of it.
    post_at(&app, "device", "t115", 115).await;
    post_at(&app, "device", "t130", 130).await;
    post_at(&app, "device", "t105", 105).await;
    // Later than the window allows (more than 60 s below the newest entry read).
    post_at(&app, "device", "t30", 30).await;
    app.wait_for_idle().await;
    let (late, cursor) = catch_up(&app, "consumer", &cursor, 250).await;
    assert_eq!(late, ["t105", "t115", "t130"]);
    let (again, _) = catch_up(&app, "consumer", &cursor, 250).await;
    assert!(again.is_empty(), "{again:?}");

    // A page cursor as `after` stands for what its walk has seen: here, everything.
    let paged = app.page("consumer", "timeline", "limit=1").await;
    let page_cursor = paged.body["next_cursor"].as_str().expect("cursor");
    let (since_page, _) = catch_up(&app, "consumer", page_cursor, 250).await;
    assert!(since_page.is_empty(), "{since_page:?}");
    // Paging and catching up at once is a 400.
    let reply = app
        .page(
            "consumer",
            "timeline",
            &format!("after={}&cursor={page_cursor}", segment(&at(0))),
        )
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    // A cursor is bound to its timeline.
    let reply = app
        .page("someone-else", "timeline", &format!("after={cursor}"))
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
}
