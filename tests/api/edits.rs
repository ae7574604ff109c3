//! Editing an event: `PATCH /v1/subjects/{s}/events/{id}`. One stored version, read by every
//! timeline through its reference, so every reader sees an edit once it is answered.

use reqwest::StatusCode;
use serde_json::{Value, json};

use fanline::store::fault::{Calls, Fault, Op};

use crate::helpers::{Api, Backend, Reply, TestStore, spawn_app_with};

on_every_backend!(
    an_edit_is_seen_by_every_follower_as_soon_as_it_is_answered,
    a_stale_version_is_a_conflict_and_a_repeated_edit_answers_the_same_event,
    an_edit_of_a_deleted_event_is_a_404_and_a_deleted_event_never_comes_back,
    edits_are_refused_outside_the_authors_rights_and_over_the_payload_limit,
    the_fanout_status_follows_the_latest_operation_on_the_event,
    a_catch_up_reader_learns_of_edits_and_deletes_to_entries_it_holds,
    a_failure_at_any_step_of_an_edit_a_delete_a_follow_and_an_unfollow_converges_on_retry,
);

/// Followers a fan-out reaches in these tests.
const FOLLOWERS: usize = 40;

async fn edit(api: &Api, author: &str, event_id: &str, body: Value) -> Reply {
    api.send(
        api.client
            .patch(api.url(&format!("/v1/subjects/{author}/events/{event_id}")))
            .json(&body),
    )
    .await
}

/// Posts `text` as `author` (with a client id when given); returns the event.
async fn post(api: &Api, author: &str, text: &str, client_id: Option<&str>) -> Value {
    let mut body = json!({"kind": "post", "payload": {"text": text}});
    if let Some(id) = client_id {
        body["id"] = json!(id);
    }
    let reply = api.post_event(author, body).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    reply.body
}

fn event_id(event: &Value) -> String {
    event["event_id"].as_str().expect("event id").to_owned()
}

/// The items of `owner`'s timeline whose event is `event_id`.
async fn copies(api: &Api, owner: &str, event_id: &str) -> Vec<Value> {
    api.timeline(owner)
        .await
        .into_iter()
        .filter(|item| item["event_id"] == event_id)
        .collect()
}

async fn an_edit_is_seen_by_every_follower_as_soon_as_it_is_answered(backend: Backend) {
    let app = spawn_app_with(TestStore::new(backend).await, |_| {}).await;
    let readers: Vec<String> = (0..FOLLOWERS).map(|index| format!("r{index}")).collect();
    for reader in &readers {
        assert_eq!(
            app.follow(reader, "alice").await.status,
            StatusCode::NO_CONTENT
        );
    }
    let posted = post(&app, "alice", "first", Some("c-1")).await;
    assert_eq!(posted["version"], 1);
    assert!(posted.get("edited_at").is_none(), "{posted}");
    let id = event_id(&posted);
    app.wait_for_idle().await;
    let first = copies(&app, "r0", &id).await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0]["version"], 1, "every item says its version");

    let edited = edit(
        &app,
        "alice",
        &id,
        json!({"payload": {"text": "second"}, "version": 1}),
    )
    .await;
    assert_eq!(edited.status, StatusCode::OK, "{edited:?}");
    assert_eq!(edited.body["version"], 2);
    assert_eq!(edited.body["payload"], json!({"text": "second"}));
    for kept in ["event_id", "subject", "kind", "at", "row_key"] {
        assert_eq!(edited.body[kept], posted[kept], "{kept} stays");
    }
    let edited_at = edited.body["edited_at"].as_str().expect("edited_at");
    // No waiting: every reader, and the author's own log, shows the edit at once.
    for owner in readers.iter().map(String::as_str).chain(["alice"]) {
        let items = copies(&app, owner, &id).await;
        assert_eq!(items.len(), 1, "one item in {owner}'s timeline");
        assert_eq!(items[0]["payload"], json!({"text": "second"}), "{owner}");
        assert_eq!(items[0]["version"], 2);
        assert_eq!(items[0]["edited_at"], edited_at);
    }
    let log = app.all_pages("alice", "events").await;
    assert_eq!(log[0]["version"], 2);
    assert_eq!(log[0]["payload"], json!({"text": "second"}));
    // A retried post answers the event as it is now.
    let retried = app
        .post_event(
            "alice",
            json!({"id": "c-1", "kind": "post", "payload": {"text": "first"}}),
        )
        .await;
    assert_eq!(retried.status, StatusCode::OK, "{retried:?}");
    assert_eq!(retried.body["version"], 2);
    assert_eq!(retried.body["payload"], json!({"text": "second"}));
    // A catch-up read shows the current version too.
    let catch_up = app
        .page("r1", "timeline", "after=2000-01-01T00:00:00Z")
        .await;
    assert_eq!(catch_up.body["items"][0]["version"], 2, "{catch_up:?}");
}

async fn a_stale_version_is_a_conflict_and_a_repeated_edit_answers_the_same_event(
    backend: Backend,
) {
    let app = spawn_app_with(TestStore::new(backend).await, |_| {}).await;
    let id = event_id(&post(&app, "alice", "v1", None).await);
    let to_v2 = json!({"payload": {"text": "v2"}, "version": 1});
    let first = edit(&app, "alice", &id, to_v2.clone()).await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    // The answer was lost and the client sends it again: the same event, not a conflict.
    let again = edit(&app, "alice", &id, to_v2).await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert_eq!(again.body, first.body);
    // Another client still at version 1 with another payload: a conflict.
    let stale = edit(
        &app,
        "alice",
        &id,
        json!({"payload": "other", "version": 1}),
    )
    .await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{stale:?}");
    assert_eq!(stale.error_code(), "version_conflict");
    // Without a version the last write wins.
    let blind = edit(&app, "alice", &id, json!({"payload": "v3"})).await;
    assert_eq!(blind.status, StatusCode::OK, "{blind:?}");
    assert_eq!(blind.body["version"], 3);
    let ahead = edit(&app, "alice", &id, json!({"payload": "x", "version": 9})).await;
    assert_eq!(ahead.error_code(), "version_conflict", "{ahead:?}");
    // The author's own entry comes with the fan-out job, which may not have run yet.
    app.wait_for_idle().await;
    let items = app.timeline("alice").await;
    assert_eq!(items[0]["payload"], "v3");
    assert_eq!(items[0]["version"], 3);
}

async fn an_edit_of_a_deleted_event_is_a_404_and_a_deleted_event_never_comes_back(
    backend: Backend,
) {
    let app = spawn_app_with(TestStore::new(backend).await, |_| {}).await;
    assert_eq!(
        app.follow("fan", "alice").await.status,
        StatusCode::NO_CONTENT
    );
    for text in ["one", "two", "three", "four", "five"] {
        post(&app, "alice", text, None).await;
    }
    let sixth = event_id(&post(&app, "alice", "six", None).await);
    app.wait_for_idle().await;
    // The trace of the issue: delete, then unfollow at once.
    let deleted = app
        .send(
            app.client
                .delete(app.url(&format!("/v1/subjects/alice/events/{sixth}"))),
        )
        .await;
    assert_eq!(deleted.status, StatusCode::ACCEPTED, "{deleted:?}");
    assert_eq!(
        app.unfollow("fan", "alice").await.status,
        StatusCode::NO_CONTENT
    );
    let gone = edit(&app, "alice", &sixth, json!({"payload": "back?"})).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND, "{gone:?}");
    app.wait_for_idle().await;
    assert!(copies(&app, "fan", &sixth).await.is_empty());
    assert!(app.timeline("fan").await.is_empty(), "fan follows no one");
    // Following again backfills the live events only.
    assert_eq!(
        app.follow("fan", "alice").await.status,
        StatusCode::NO_CONTENT
    );
    app.wait_for_idle().await;
    let texts: Vec<Value> = app
        .timeline("fan")
        .await
        .iter()
        .map(|item| item["payload"]["text"].clone())
        .collect();
    assert_eq!(texts, ["five", "four", "three", "two", "one"]);
}

async fn edits_are_refused_outside_the_authors_rights_and_over_the_payload_limit(backend: Backend) {
    let app = spawn_app_with(TestStore::new(backend).await, |config| {
        config.max_payload_bytes = 1_000;
    })
    .await;
    let id = event_id(&post(&app, "alice", "mine", None).await);
    let token = |path: &'static str| {
        let app = &app;
        async move {
            let reply = app.post_json(path, &json!({})).await;
            assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
            reply.body["token"].as_str().expect("token").to_owned()
        }
    };
    let own = Api::with_token(
        &app.address,
        Some(&token("/v1/admin/subjects/alice/tokens").await),
    );
    let other = Api::with_token(
        &app.address,
        Some(&token("/v1/admin/subjects/bob/tokens").await),
    );
    let device = Api::with_token(
        &app.address,
        Some(&token("/v1/admin/series/alice/tokens").await),
    );
    let body = json!({"payload": "edited"});
    assert_eq!(
        edit(&other, "alice", &id, body.clone()).await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        edit(&device, "alice", &id, body.clone()).await.status,
        StatusCode::FORBIDDEN
    );
    let big = json!({"payload": "x".repeat(1_200)});
    let too_large = edit(&own, "alice", &id, big).await;
    assert_eq!(
        too_large.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{too_large:?}"
    );
    let bad_id = edit(&own, "alice", "not-a-uuid", body.clone()).await;
    assert_eq!(bad_id.status, StatusCode::BAD_REQUEST, "{bad_id:?}");
    let missing = edit(
        &own,
        "alice",
        &uuid::Uuid::now_v7().to_string(),
        body.clone(),
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{missing:?}");
    let unknown_field = edit(&own, "alice", &id, json!({"payload": 1, "kind": "x"})).await;
    assert_eq!(
        unknown_field.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{unknown_field:?}"
    );
    // Nothing of those landed; the author's own token edits.
    app.wait_for_idle().await;
    assert_eq!(app.timeline("alice").await[0]["version"], 1);
    let ok = edit(&own, "alice", &id, body).await;
    assert_eq!(ok.status, StatusCode::OK, "{ok:?}");
    assert_eq!(ok.body["version"], 2);
}

async fn the_fanout_status_follows_the_latest_operation_on_the_event(backend: Backend) {
    let app = spawn_app_with(TestStore::new(backend).await, |_| {}).await;
    for reader in ["r1", "r2", "r3"] {
        assert_eq!(
            app.follow(reader, "alice").await.status,
            StatusCode::NO_CONTENT
        );
    }
    let id = event_id(&post(&app, "alice", "v1", None).await);
    app.wait_for_idle().await;
    let status_path = format!("/v1/subjects/alice/events/{id}/fanout");
    assert_eq!(app.get(&status_path).await.body["operation"], "delivery");
    for version in 1..=2 {
        let reply = edit(
            &app,
            "alice",
            &id,
            json!({"payload": version, "version": version}),
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    }
    app.wait_for_idle().await;
    let status = app.get(&status_path).await.body;
    assert_eq!(status["operation"], "edit", "{status}");
    assert_eq!(status["state"], "done", "{status}");
    // The author and three followers were told.
    assert_eq!(status["delivered"], 4, "{status}");
    let deleted = app
        .send(
            app.client
                .delete(app.url(&format!("/v1/subjects/alice/events/{id}"))),
        )
        .await;
    assert_eq!(deleted.body["operation"], "removal", "{deleted:?}");
    app.wait_for_idle().await;
    assert_eq!(app.get(&status_path).await.body["operation"], "removal");
}

async fn a_catch_up_reader_learns_of_edits_and_deletes_to_entries_it_holds(backend: Backend) {
    let app = spawn_app_with(TestStore::new(backend).await, |_| {}).await;
    assert_eq!(
        app.follow("reader", "alice").await.status,
        StatusCode::NO_CONTENT
    );
    let kept = event_id(&post(&app, "alice", "kept", None).await);
    let edited = event_id(&post(&app, "alice", "draft", None).await);
    let deleted = event_id(&post(&app, "alice", "oops", None).await);
    app.wait_for_idle().await;
    let first = app
        .page("reader", "timeline", "after=2000-01-01T00:00:00Z")
        .await;
    assert_eq!(
        first.body["items"].as_array().expect("items").len(),
        3,
        "{first:?}"
    );
    assert_eq!(first.body["edited"], json!([]));
    assert_eq!(first.body["removed"], json!([]));
    let cursor = first.body["next_cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();

    let reply = edit(
        &app,
        "alice",
        &edited,
        json!({"payload": {"text": "final"}}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let removed = app
        .send(
            app.client
                .delete(app.url(&format!("/v1/subjects/alice/events/{deleted}"))),
        )
        .await;
    assert_eq!(removed.status, StatusCode::ACCEPTED, "{removed:?}");
    post(&app, "alice", "new", None).await;
    app.wait_for_idle().await;

    let query = format!("after={}", crate::helpers::segment(&cursor));
    let next = app.page("reader", "timeline", &query).await;
    assert_eq!(next.status, StatusCode::OK, "{next:?}");
    let texts: Vec<&Value> = next.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| &item["payload"]["text"])
        .collect();
    assert_eq!(texts, [&json!("new")], "only the new entry is new");
    let changed = next.body["edited"].as_array().expect("edited");
    assert_eq!(changed.len(), 1, "{next:?}");
    assert_eq!(changed[0]["event_id"], edited.as_str());
    assert_eq!(changed[0]["version"], 2);
    assert_eq!(changed[0]["payload"], json!({"text": "final"}));
    assert_eq!(next.body["removed"], json!([deleted]));
    assert!(
        !next.body.to_string().contains(&kept),
        "nothing of the untouched entry"
    );
    // Told once: the next read from this answer's cursor has nothing more.
    let cursor = next.body["next_cursor"].as_str().expect("cursor");
    let again = app
        .page(
            "reader",
            "timeline",
            &format!("after={}", crate::helpers::segment(cursor)),
        )
        .await;
    assert_eq!(again.body["items"], json!([]), "{again:?}");
    assert_eq!(again.body["edited"], json!([]), "{again:?}");
    assert_eq!(again.body["removed"], json!([]), "{again:?}");
}

/// Sends `request` until it is answered with anything but a 5xx (a client's retry), at most
/// 20 times.
async fn with_retries(api: &Api, request: impl Fn() -> reqwest::RequestBuilder) -> Reply {
    for _ in 0..20 {
        let reply = api.send(request()).await;
        if !reply.status.is_server_error() {
            return reply;
        }
    }
    panic!("still failing after 20 tries");
}

async fn a_failure_at_any_step_of_an_edit_a_delete_a_follow_and_an_unfollow_converges_on_retry(
    backend: Backend,
) {
    // Each run fails the n-th store call of one kind after the set-up, once, whoever makes it
    // (a request or a job); the client retries what failed, the workers retry their jobs.
    let kinds = [Op::Transact, Op::BatchWrite, Op::Get, Op::Query];
    for (op, nth) in kinds
        .into_iter()
        .flat_map(|op| (1..=6).map(move |nth| (op, nth)))
    {
        let app = spawn_app_with(TestStore::new(backend).await, |config| {
            config.retry_base_ms = 1;
        })
        .await;
        for fan in ["fan1", "fan2"] {
            assert_eq!(
                app.follow(fan, "alice").await.status,
                StatusCode::NO_CONTENT
            );
        }
        let kept = event_id(&post(&app, "alice", "kept", None).await);
        let doomed = event_id(&post(&app, "alice", "doomed", None).await);
        app.wait_for_idle().await;
        app.faults.fail_nth(nth, Calls::op(op), Fault::Unavailable);

        let url = |path: String| app.url(&path);
        let edited = with_retries(&app, || {
            app.client
                .patch(url(format!("/v1/subjects/alice/events/{kept}")))
                .json(&json!({"payload": {"text": "edited"}, "version": 1}))
        })
        .await;
        // A retry after a lost answer finds its own edit: the same event, not a conflict.
        assert_eq!(edited.status, StatusCode::OK, "{op:?} {nth}: {edited:?}");
        let deleted = with_retries(&app, || {
            app.client
                .delete(url(format!("/v1/subjects/alice/events/{doomed}")))
        })
        .await;
        assert_eq!(
            deleted.status,
            StatusCode::ACCEPTED,
            "{op:?} {nth}: {deleted:?}"
        );
        let followed = with_retries(&app, || {
            app.client
                .put(url("/v1/subjects/fan3/following/alice".into()))
        })
        .await;
        assert_eq!(followed.status, StatusCode::NO_CONTENT, "{op:?} {nth}");
        let unfollowed = with_retries(&app, || {
            app.client
                .delete(url("/v1/subjects/fan1/following/alice".into()))
        })
        .await;
        assert_eq!(unfollowed.status, StatusCode::NO_CONTENT, "{op:?} {nth}");
        app.wait_for_idle().await;

        for owner in ["alice", "fan2", "fan3"] {
            let items = app.timeline(owner).await;
            let seen: Vec<(&Value, &Value)> = items
                .iter()
                .map(|item| (&item["event_id"], &item["version"]))
                .collect();
            assert_eq!(
                seen,
                [(&json!(kept), &json!(2))],
                "{op:?} {nth}: {owner}'s timeline"
            );
            assert_eq!(items[0]["payload"], json!({"text": "edited"}));
        }
        assert!(
            app.timeline("fan1").await.is_empty(),
            "{op:?} {nth}: fan1 unfollowed"
        );
    }
}
