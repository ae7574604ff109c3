//! Notification feeds: events addressed to subjects (`to`), grouped (`group`) per kind and
//! UTC day, with seen and read, deletes and edits reaching them, live over SSE, and bad
//! input and missing rights refused.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::console::subject_token;
use crate::helpers::{Api, Backend, Reply, TestApp, segment, spawn_app};
use crate::streams::Sse;

on_every_backend!(
    likes_of_a_post_are_one_group_and_to_is_shown_nowhere,
    a_delete_leaves_the_group_and_an_edit_shows_in_its_newest_event,
    the_marker_marks_seen_and_read_and_a_stale_version_is_a_409,
    bad_input_and_missing_rights_are_4xx_and_write_nothing,
    a_stream_sends_each_group_change_and_marker_move_and_resumes,
    an_event_without_fanout_reaches_no_followers_stream_edited_or_deleted,
);

fn feed_path(subject: &str) -> String {
    format!("/v1/subjects/{}/notifications", segment(subject))
}

async fn feed(api: &Api, subject: &str) -> Value {
    let reply = api.get(&feed_path(subject)).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body
}

async fn mark(api: &Api, subject: &str, body: Value) -> Reply {
    let path = format!("{}/marker", feed_path(subject));
    api.send(api.client.put(api.url(&path)).json(&body)).await
}

/// `author` likes `post` (an event for `owner`'s feed only).
pub(crate) async fn like(api: &Api, author: &str, post: &str, owner: &str) -> Value {
    let body = json!({
        "kind": "like",
        "payload": {"post": post},
        "to": [owner],
        "group": format!("post:{post}"),
        "fanout": false,
    });
    let reply = api.post_event(author, body).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    reply.body
}

async fn subject_api(app: &TestApp, subject: &str) -> Api {
    let token = subject_token(app, subject).await;
    Api::with_token(&app.address, Some(&token))
}

async fn likes_of_a_post_are_one_group_and_to_is_shown_nowhere(backend: Backend) {
    let app = spawn_app(backend).await;
    assert_eq!(
        app.follow("fan", "ann").await.status,
        StatusCode::NO_CONTENT
    );
    for author in ["ann", "bob", "cy", "ann"] {
        like(&app, author, "p9", "carol").await;
    }
    let mention = app
        .post_event(
            "ann",
            json!({"kind": "mention", "payload": {"text": "hi @carol"}, "to": ["carol", "carol"]}),
        )
        .await;
    assert_eq!(mention.status, StatusCode::CREATED, "{mention:?}");
    app.wait_for_idle().await;

    let page = feed(&app, "carol").await;
    let items = page["items"].as_array().expect("items");
    assert_eq!(items.len(), 2, "{page}");
    assert_eq!(
        (page["unseen"].clone(), page["unread"].clone()),
        (json!(2), json!(2))
    );
    assert_eq!(page["marker"], json!({"version": 0}));
    let likes = items
        .iter()
        .find(|item| item["kind"] == "like")
        .expect("the likes");
    assert_eq!(likes["group"], "post:p9");
    assert_eq!(likes["count"], 4);
    assert_eq!(likes["actor_count"], 3);
    assert_eq!(likes["actors"], json!(["ann", "cy", "bob"]));
    assert_eq!(likes["latest"]["author"], "ann");
    assert_eq!(likes["latest"]["payload"], json!({"post": "p9"}));
    assert_eq!(
        (likes["seen"].clone(), likes["read"].clone()),
        (json!(false), json!(false))
    );
    let mentions = items
        .iter()
        .find(|item| item["kind"] == "mention")
        .expect("the mention");
    assert_eq!(mentions["group"], Value::Null);
    assert_eq!(mentions["count"], 1, "a repeated target counts once");
    assert_eq!(mentions["id"], mention.body["event_id"]);

    // The likes reach no timeline; the mention reaches the author's and the follower's.
    let fan = app.timeline("fan").await;
    assert_eq!(fan.len(), 1, "{fan:?}");
    assert_eq!(fan[0]["kind"], "mention");
    // `to` is on no item: not the post's answer, not the log's, not the timeline's.
    let log = app.page("ann", "events", "").await;
    for item in log.body["items"]
        .as_array()
        .expect("log")
        .iter()
        .chain(&fan)
    {
        assert!(item.get("to").is_none(), "{item}");
    }
    assert!(mention.body.get("to").is_none());
    let logged_like = &log.body["items"][1];
    assert_eq!(logged_like["fanout"], false, "{logged_like}");
    assert!(fan[0].get("fanout").is_none());

    // Carol follows ann and unfollows her: her notifications stay as they were.
    assert_eq!(
        app.follow("carol", "ann").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        app.unfollow("carol", "ann").await.status,
        StatusCode::NO_CONTENT
    );
    app.wait_for_idle().await;
    let after = feed(&app, "carol").await;
    assert_eq!(after["items"], page["items"]);
}

async fn a_delete_leaves_the_group_and_an_edit_shows_in_its_newest_event(backend: Backend) {
    let app = spawn_app(backend).await;
    let ann = like(&app, "ann", "p1", "carol").await;
    let bob = like(&app, "bob", "p1", "carol").await;
    app.wait_for_idle().await;
    let path = |author: &str, event: &Value| {
        format!(
            "/v1/subjects/{author}/events/{}",
            event["event_id"].as_str().expect("id")
        )
    };
    let edited = app
        .send(
            app.client
                .patch(app.url(&path("bob", &bob)))
                .json(&json!({"payload": {"post": "p1", "emoji": "tada"}})),
        )
        .await;
    assert_eq!(edited.status, StatusCode::OK, "{edited:?}");
    app.wait_for_idle().await;
    let page = feed(&app, "carol").await;
    let group_id = page["items"][0]["id"].clone();
    assert_eq!(page["items"][0]["latest"]["payload"]["emoji"], "tada");
    assert_eq!(page["items"][0]["latest"]["version"], 2);

    let deleted = app
        .send(app.client.delete(app.url(&path("bob", &bob))))
        .await;
    assert!(deleted.status.is_success(), "{deleted:?}");
    app.wait_for_idle().await;
    let page = feed(&app, "carol").await;
    let group = &page["items"][0];
    assert_eq!(group["id"], group_id, "the same group");
    assert_eq!(
        (group["count"].clone(), group["actors"].clone()),
        (json!(1), json!(["ann"]))
    );
    assert_eq!(group["latest"]["event_id"], ann["event_id"]);

    let deleted = app
        .send(app.client.delete(app.url(&path("ann", &ann))))
        .await;
    assert!(deleted.status.is_success(), "{deleted:?}");
    app.wait_for_idle().await;
    let page = feed(&app, "carol").await;
    assert_eq!(page["items"], json!([]), "an emptied group goes");
    assert_eq!(page["unread"], 0);
}

async fn the_marker_marks_seen_and_read_and_a_stale_version_is_a_409(backend: Backend) {
    let app = spawn_app(backend).await;
    for post in ["p1", "p2", "p3"] {
        like(&app, "ann", post, "carol").await;
    }
    app.wait_for_idle().await;
    let seen = mark(&app, "carol", json!({"seen": true, "version": 0})).await;
    assert_eq!(seen.status, StatusCode::OK, "{seen:?}");
    assert_eq!(seen.body, json!({"unseen": 0, "unread": 3, "version": 1}));

    let stale = mark(&app, "carol", json!({"read": "all", "version": 0})).await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{stale:?}");
    assert_eq!(stale.error_code(), "marker_conflict");
    assert_eq!(feed(&app, "carol").await["unread"], 3, "nothing written");

    let page = feed(&app, "carol").await;
    let p2 = page["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|item| item["group"] == "post:p2")
        .expect("p2")
        .clone();
    let read = mark(&app, "carol", json!({"read": [p2["id"]]})).await;
    assert_eq!(
        read.body,
        json!({"unseen": 0, "unread": 2, "version": 2}),
        "{read:?}"
    );
    let page = feed(&app, "carol").await;
    let marked = page["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|item| item["id"] == p2["id"])
        .expect("p2")
        .clone();
    assert_eq!(
        (marked["seen"].clone(), marked["read"].clone()),
        (json!(true), json!(true))
    );

    // A new like of p2 makes its group unseen and unread again, on top.
    like(&app, "bob", "p2", "carol").await;
    app.wait_for_idle().await;
    let page = feed(&app, "carol").await;
    assert_eq!(page["items"][0]["id"], p2["id"]);
    assert_eq!(
        (page["unseen"].clone(), page["unread"].clone()),
        (json!(1), json!(3))
    );
    // Seen up to what the client showed: the older groups' time.
    let until = page["items"][1]["updated_at"].clone();
    let shown = mark(&app, "carol", json!({"seen_until": until, "read": "all"})).await;
    assert_eq!(
        shown.body,
        json!({"unseen": 1, "unread": 0, "version": 3}),
        "{shown:?}"
    );
}

async fn bad_input_and_missing_rights_are_4xx_and_write_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let targets: Vec<String> = (0..101).map(|n| format!("s{n}")).collect();
    let cases = [
        (json!({"payload": 1, "to": targets}), "too_many_targets"),
        (
            json!({"payload": 1, "to": ["ok", "a\u{0}b"]}),
            "invalid_target",
        ),
        (
            json!({"payload": 1, "to": ["ok", "../up"]}),
            "invalid_target",
        ),
        (
            json!({"payload": 1, "to": ["ok"], "group": ""}),
            "invalid_group",
        ),
        (
            json!({"payload": 1, "to": ["ok"], "group": "x".repeat(257)}),
            "invalid_group",
        ),
    ];
    for (body, code) in cases {
        let reply = app.post_event("ann", body.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}: {reply:?}");
        assert_eq!(reply.error_code(), code, "{body}");
    }
    let wrong_type = app
        .post_event("ann", json!({"payload": 1, "to": "carol"}))
        .await;
    assert!(wrong_type.status.is_client_error(), "{wrong_type:?}");
    assert_eq!(app.page("ann", "events", "").await.body["items"], json!([]));
    assert_eq!(feed(&app, "ok").await["items"], json!([]));

    // Nothing to mark: the counts, the marker unmoved.
    for body in [json!({}), json!({"seen": false, "read": null})] {
        let reply = mark(&app, "carol", body.clone()).await;
        assert_eq!(reply.status, StatusCode::OK, "{body}: {reply:?}");
        assert_eq!(reply.body, json!({"unseen": 0, "unread": 0, "version": 0}));
    }
    let too_many: Vec<String> = (0..100).map(|n| format!("{n:032x}")).collect();
    for body in [
        json!({"seen_until": "yesterday"}),
        json!({"seen_until": "0000-01-01T00:00:00Z"}),
        json!({"read": ["not a group id"]}),
        json!({"read": too_many}),
    ] {
        let reply = mark(&app, "carol", body.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}: {reply:?}");
        assert_eq!(reply.error_code(), "invalid_marker", "{body}");
    }
    for body in [
        json!({"read": "some"}),
        json!({"seen": true, "extra": 1}),
        json!([1]),
    ] {
        let reply = mark(&app, "carol", body.clone()).await;
        assert!(reply.status.is_client_error(), "{body}: {reply:?}");
    }
    let bad_cursor = app
        .get(&format!("{}?cursor=garbage", feed_path("carol")))
        .await;
    assert_eq!(bad_cursor.status, StatusCode::BAD_REQUEST);

    // Carol reads her own feed only; anyone who may post as an author addresses anyone.
    let carol = subject_api(&app, "carol").await;
    assert_eq!(carol.get(&feed_path("carol")).await.status, StatusCode::OK);
    assert_eq!(
        carol.get(&feed_path("dave")).await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        mark(&carol, "dave", json!({"seen": true})).await.status,
        StatusCode::FORBIDDEN
    );
    let stream = Sse::open(&carol, &format!("{}/stream", feed_path("dave")), None).await;
    assert_eq!(stream.err().expect("refused").status, StatusCode::FORBIDDEN);
    let liked = carol
        .post_event(
            "carol",
            json!({"payload": 1, "to": ["dave"], "kind": "like"}),
        )
        .await;
    assert_eq!(liked.status, StatusCode::CREATED, "{liked:?}");
    let anonymous = Api::with_token(&app.address, None);
    assert_eq!(
        anonymous.get(&feed_path("carol")).await.status,
        StatusCode::UNAUTHORIZED
    );
}

async fn a_stream_sends_each_group_change_and_marker_move_and_resumes(backend: Backend) {
    let app = spawn_app(backend).await;
    let path = format!("{}/stream", feed_path("carol"));
    let mut stream = Sse::open(&app, &path, None).await.expect("open");
    let first = stream.expect("marker", 1).await;
    let counts: Value = serde_json::from_str(&first[0].data).expect("json");
    assert_eq!(counts, json!({"unseen": 0, "unread": 0, "version": 0}));

    like(&app, "ann", "p1", "carol").await;
    let group = next_group(&mut stream).await;
    assert_eq!(
        (group["count"].clone(), group["actors"].clone()),
        (json!(1), json!(["ann"]))
    );
    like(&app, "bob", "p1", "carol").await;
    let group = next_group(&mut stream).await;
    assert_eq!(group["count"], 2, "{group}");
    assert_eq!(group["actors"], json!(["bob", "ann"]));
    let resume_after = group["_id"].as_str().expect("id").to_owned();

    // Another device marks it read: every stream hears.
    assert_eq!(
        mark(&app, "carol", json!({"read": "all"})).await.status,
        StatusCode::OK
    );
    let moved = next_of(&mut stream, "marker").await;
    let moved: Value = serde_json::from_str(&moved.data).expect("json");
    assert_eq!(
        (moved["unread"].clone(), moved["version"].clone()),
        (json!(0), json!(1))
    );
    drop(stream);

    // Missed while away: a new group, then its delete; a resumed stream is told both.
    let missed = like(&app, "cy", "p2", "carol").await;
    app.wait_for_idle().await;
    let event = missed["event_id"].as_str().expect("id");
    let deleted = app
        .send(
            app.client
                .delete(app.url(&format!("/v1/subjects/cy/events/{event}"))),
        )
        .await;
    assert!(deleted.status.is_success(), "{deleted:?}");
    app.wait_for_idle().await;
    let mut resumed = Sse::open(&app, &path, Some(&resume_after))
        .await
        .expect("resume");
    let removed = next_of(&mut resumed, "removed").await;
    let removed: Value = serde_json::from_str(&removed.data).expect("json");
    assert!(removed["id"].is_string(), "{removed}");
    assert!(!removed["id"].as_str().unwrap_or_default().is_empty());

    let bad = Sse::open(&app, &path, Some("garbage")).await;
    assert_eq!(bad.err().expect("refused").error_code(), "invalid_cursor");
}

/// The next event of `kind`, skipping others (counts sent between group changes).
async fn next_of(stream: &mut Sse, kind: &str) -> eventsource_stream::Event {
    loop {
        let event = stream.next().await.expect("the stream is open");
        if event.event == kind {
            return event;
        }
    }
}

async fn next_group(stream: &mut Sse) -> Value {
    let event = next_of(stream, "group").await;
    assert!(!event.id.is_empty(), "a group change has a resume id");
    let mut group: Value = serde_json::from_str(&event.data).expect("json");
    group["_id"] = json!(event.id);
    group
}

on_every_backend!(
    concurrent_likes_unlikes_and_marker_writes_leave_each_group_as_its_live_likes_say
);

/// Four clients like and unlike three posts as ten authors and move the owner's marker, all
/// at once: at quiet, each group counts exactly the live likes of its post, names their
/// latest distinct authors and shows the newest.
async fn concurrent_likes_unlikes_and_marker_writes_leave_each_group_as_its_live_likes_say(
    backend: Backend,
) {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use rand::{Rng as _, SeedableRng as _};

    let app = Arc::new(spawn_app(backend).await);
    let seconds = Arc::new(AtomicU32::new(0));
    let seed = rand::random::<u64>();
    let mut clients = Vec::new();
    for client in 0..4u64 {
        let (app, seconds) = (app.clone(), seconds.clone());
        clients.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ client);
            // (post, author, event id, at): this client's live likes.
            let mut live: Vec<(u32, String, String, u32)> = Vec::new();
            for _ in 0..30 {
                match rng.random_range(0..10) {
                    0..6 => {
                        let post = rng.random_range(0..3u32);
                        let author = format!("a{}", rng.random_range(0..10));
                        let second = seconds.fetch_add(1, Ordering::SeqCst);
                        let body = json!({
                            "kind": "like", "payload": {"post": post}, "to": ["owner"],
                            "group": format!("post:p{post}"), "fanout": false,
                            "at": format!("2026-11-30T10:{:02}:{:02}Z", second / 60, second % 60),
                        });
                        let reply = app.post_event(&author, body).await;
                        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
                        let id = reply.body["event_id"].as_str().expect("id").to_owned();
                        live.push((post, author, id, second));
                    }
                    6..8 if !live.is_empty() => {
                        let (_, author, id, _) = live.swap_remove(rng.random_range(0..live.len()));
                        let path = format!("/v1/subjects/{author}/events/{id}");
                        let reply = app.send(app.client.delete(app.url(&path))).await;
                        assert!(reply.status.is_success(), "{reply:?}");
                    }
                    _ => {
                        let body = if rng.random_bool(0.5) {
                            json!({"seen": true})
                        } else {
                            json!({"read": "all", "version": rng.random_range(0..4)})
                        };
                        let reply = mark(&app, "owner", body).await;
                        assert!(
                            matches!(reply.status, StatusCode::OK | StatusCode::CONFLICT),
                            "{reply:?}"
                        );
                    }
                }
            }
            live
        }));
    }
    let mut live = Vec::new();
    for client in clients {
        live.extend(client.await.expect("client"));
    }
    app.wait_for_idle().await;

    let page = feed(&app, "owner").await;
    let shown: BTreeMap<String, Value> = page["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| {
            (
                item["group"].as_str().expect("group").to_owned(),
                item.clone(),
            )
        })
        .collect();
    let mut expected: BTreeMap<String, Vec<&(u32, String, String, u32)>> = BTreeMap::new();
    for like in &live {
        expected
            .entry(format!("post:p{}", like.0))
            .or_default()
            .push(like);
    }
    assert_eq!(
        shown.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "seed {seed}: the groups are those of the live likes"
    );
    for (group, mut likes) in expected {
        let item = &shown[&group];
        likes.sort_by_key(|like| std::cmp::Reverse(like.3));
        let mut actors: Vec<&str> = Vec::new();
        for like in &likes {
            if !actors.contains(&like.1.as_str()) {
                actors.push(&like.1);
            }
        }
        assert_eq!(item["count"], likes.len(), "seed {seed}: {group}: {item}");
        assert_eq!(item["actor_count"], actors.len(), "seed {seed}: {group}");
        actors.truncate(10);
        assert_eq!(item["actors"], json!(actors), "seed {seed}: {group}");
        assert_eq!(
            item["latest"]["event_id"], likes[0].2,
            "seed {seed}: {group}"
        );
    }
    let cleared = mark(&app, "owner", json!({"seen": true, "read": "all"})).await;
    assert_eq!(cleared.status, StatusCode::OK, "{cleared:?}");
    assert_eq!(
        (
            cleared.body["unseen"].clone(),
            cleared.body["unread"].clone()
        ),
        (json!(0), json!(0))
    );
}

async fn an_event_without_fanout_reaches_no_followers_stream_edited_or_deleted(backend: Backend) {
    let app = spawn_app(backend).await;
    assert_eq!(
        app.follow("fan", "ann").await.status,
        StatusCode::NO_CONTENT
    );
    app.wait_for_idle().await;
    let mut stream = Sse::open(&app, "/v1/subjects/fan/timeline/stream", None)
        .await
        .expect("open");
    let liked = like(&app, "ann", "p1", "carol").await;
    app.wait_for_idle().await;
    let path = format!(
        "/v1/subjects/ann/events/{}",
        liked["event_id"].as_str().expect("id")
    );
    let edited = app
        .send(
            app.client
                .patch(app.url(&path))
                .json(&json!({"payload": {"post": "p2"}})),
        )
        .await;
    assert_eq!(edited.status, StatusCode::OK, "{edited:?}");
    app.wait_for_idle().await;
    let deleted = app.send(app.client.delete(app.url(&path))).await;
    assert!(deleted.status.is_success(), "{deleted:?}");
    app.wait_for_idle().await;
    let post = app.post_text("ann", "a post").await;
    assert_eq!(post.status, StatusCode::CREATED, "{post:?}");
    // The first thing the follower's stream sends is the post: nothing of the like, its
    // edit or its delete.
    let first = stream.next().await.expect("an event");
    assert_eq!(first.event, "entry", "{first:?}");
    let entry: Value = serde_json::from_str(&first.data).expect("json");
    assert_eq!(entry["event_id"], post.body["event_id"], "{entry}");
}
