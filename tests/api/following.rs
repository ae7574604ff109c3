//! Following and unfollowing.

use reqwest::StatusCode;

use crate::helpers::{Backend, spawn_app};

on_every_backend!(
    follow_and_unfollow_update_both_lists,
    follow_and_unfollow_are_idempotent,
    subject_ids_may_hold_any_printable_unicode,
);

fn subjects(items: &[serde_json::Value]) -> Vec<&str> {
    items
        .iter()
        .map(|item| item["subject"].as_str().expect("subject"))
        .collect()
}

async fn follow_and_unfollow_update_both_lists(backend: Backend) {
    let app = spawn_app(backend).await;
    for follower in ["bob", "carol"] {
        assert_eq!(
            app.follow(follower, "alice").await.status,
            StatusCode::NO_CONTENT
        );
    }
    assert_eq!(
        app.follow("bob", "dave").await.status,
        StatusCode::NO_CONTENT
    );

    let followers = app.all_pages("alice", "followers").await;
    assert_eq!(subjects(&followers), ["bob", "carol"]);
    assert!(
        followers[0]["since"]
            .as_str()
            .expect("since")
            .ends_with('Z')
    );
    assert_eq!(
        subjects(&app.all_pages("bob", "following").await),
        ["alice", "dave"]
    );

    assert_eq!(
        app.unfollow("bob", "alice").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        subjects(&app.all_pages("alice", "followers").await),
        ["carol"]
    );
    assert_eq!(subjects(&app.all_pages("bob", "following").await), ["dave"]);

    // After unfollowing, new posts no longer reach bob.
    app.post_text("alice", "after unfollow").await;
    app.wait_for_timeline("carol", 1).await;
    assert!(app.timeline("bob").await.is_empty());
}

async fn follow_and_unfollow_are_idempotent(backend: Backend) {
    let app = spawn_app(backend).await;
    assert_eq!(
        app.follow("bob", "alice").await.status,
        StatusCode::NO_CONTENT
    );
    let since = app.all_pages("alice", "followers").await[0]["since"].clone();
    assert_eq!(
        app.follow("bob", "alice").await.status,
        StatusCode::NO_CONTENT
    );
    let followers = app.all_pages("alice", "followers").await;
    assert_eq!(followers.len(), 1);
    assert_eq!(
        followers[0]["since"], since,
        "following again keeps the first time"
    );

    assert_eq!(
        app.unfollow("bob", "alice").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        app.unfollow("bob", "alice").await.status,
        StatusCode::NO_CONTENT
    );
    assert!(app.all_pages("alice", "followers").await.is_empty());
    assert!(app.all_pages("bob", "following").await.is_empty());
}

async fn subject_ids_may_hold_any_printable_unicode(backend: Backend) {
    let app = spawn_app(backend).await;
    let author = "Zoë/日本 🚀";
    let follower = "fóllower 100%";
    assert_eq!(
        app.follow(follower, author).await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        subjects(&app.all_pages(author, "followers").await),
        [follower]
    );
    let posted = app.post_text(author, "unicode").await;
    assert_eq!(posted.body["subject"], author);
    let timeline = app.wait_for_timeline(follower, 1).await;
    assert_eq!(timeline[0]["author"], author);
}
