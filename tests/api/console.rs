//! The web console at `/ui/`: how it is served, `GET /v1/whoami` that it signs in with, and
//! the console itself in headless Chromium (tests/api/browser.rs) against a live server.

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::browser::Browser;
use crate::helpers::{Api, Backend, TestApp, segment, spawn_app};
use crate::notifications::like;

on_every_backend!(
    whoami_says_who_each_token_acts_as,
    the_console_is_served_without_a_token_with_strict_headers_and_outside_the_api_document,
);

/// At most two browsers at once: each is a few processes, and the machine is shared.
static BROWSERS: Semaphore = Semaphore::const_new(2);

async fn browser_slot() -> SemaphorePermit<'static> {
    BROWSERS.acquire().await.expect("semaphore open")
}

/// Issues a token through the admin route; returns the token.
async fn issue(app: &TestApp, path: &str) -> String {
    let reply = app.post_json(path, &json!({})).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    reply.body["token"].as_str().expect("token").to_owned()
}

pub(crate) async fn subject_token(app: &TestApp, subject: &str) -> String {
    issue(
        app,
        &format!("/v1/admin/subjects/{}/tokens", segment(subject)),
    )
    .await
}

async fn whoami_says_who_each_token_acts_as(backend: Backend) {
    let app = spawn_app(backend).await;
    let alice = subject_token(&app, "alice").await;
    let device = issue(&app, "/v1/admin/series/field-7%2Ftemp/tokens").await;
    let cases = [
        (
            Some(crate::helpers::TEST_ADMIN_TOKEN),
            json!({"kind": "admin", "name": null}),
        ),
        (
            Some(alice.as_str()),
            json!({"kind": "subject", "name": "alice"}),
        ),
        (
            Some(device.as_str()),
            json!({"kind": "device", "name": "field-7/temp"}),
        ),
    ];
    for (token, expected) in cases {
        let reply = Api::with_token(&app.address, token).get("/v1/whoami").await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        assert_eq!(reply.body, expected);
    }
    for token in [None, Some("not-a-token")] {
        let reply = Api::with_token(&app.address, token).get("/v1/whoami").await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{reply:?}");
        assert_eq!(reply.error_code(), "unauthorized");
    }
}

async fn the_console_is_served_without_a_token_with_strict_headers_and_outside_the_api_document(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    let client = reqwest::Client::new();
    for (path, content_type) in [
        ("/ui/", "text/html; charset=utf-8"),
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/console.css", "text/css; charset=utf-8"),
        (
            "/ui/vendor/uplot/uPlot.esm.js",
            "text/javascript; charset=utf-8",
        ),
        ("/ui/vendor/uplot/LICENSE", "text/plain; charset=utf-8"),
        ("/ui/overview.js", "text/javascript; charset=utf-8"),
        ("/ui/notifications.js", "text/javascript; charset=utf-8"),
        ("/ui/chart.js", "text/javascript; charset=utf-8"),
        ("/ui/favicon.svg", "image/svg+xml"),
        // A browser asks for it on its own: the console's icon, not a 404.
        ("/favicon.ico", "image/svg+xml"),
    ] {
        let response = client.get(app.url(path)).send().await.expect("get");
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let headers = response.headers();
        assert_eq!(headers["content-type"], content_type, "{path}");
        let policy = headers["content-security-policy"].to_str().expect("ascii");
        for directive in [
            "default-src 'self'",
            "script-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(policy.contains(directive), "{path}: {policy}");
        }
        assert!(!policy.contains("unsafe"), "{path}: {policy}");
        assert_eq!(headers["cache-control"], "no-cache", "{path}");
        let etag = headers["etag"].clone();
        let again = client
            .get(app.url(path))
            .header("if-none-match", etag)
            .send()
            .await
            .expect("get");
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "{path}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert!(!response.bytes().await.expect("body").is_empty(), "{path}");
    }
    let page = client.get(app.url("/ui/")).send().await.expect("get");
    assert_eq!(page.headers()["cache-control"], "no-cache");
    let html = page.text().await.expect("html");
    assert!(!html.contains("<script>"), "no inline script: {html}");
    assert!(!html.contains("style="), "no inline style: {html}");
    assert!(
        html.contains(r#"<link rel="icon" href="favicon.svg""#),
        "the page names its icon: {html}"
    );

    let bare = client.get(app.url("/ui")).send().await.expect("get");
    assert_eq!(bare.url().path(), "/ui/", "/ui redirects to /ui/");

    let missing = Api::with_token(&app.address, None)
        .get("/ui/nothing.js")
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.error_code(), "not_found");

    let document = Api::with_token(&app.address, None)
        .get("/openapi.json")
        .await;
    let paths = document.body["paths"].as_object().expect("paths");
    assert!(
        paths.keys().all(|path| !path.starts_with("/ui")),
        "{paths:?}"
    );
}

/// The console's address for `fragment`.
fn console_url(app: &TestApp, fragment: &str) -> String {
    app.url(&format!("/ui/#{fragment}"))
}

/// Opens the console signed in as `token` at `fragment`, and waits until it says who it is.
async fn open(app: &TestApp, token: &str, fragment: &str, width: u32) -> Browser {
    let browser = Browser::launch(width, 900).await;
    let sign_in = if fragment.is_empty() {
        format!("token={token}")
    } else {
        format!("{fragment}&token={token}")
    };
    browser.goto(&console_url(app, &sign_in)).await;
    browser
        .wait_for("document.body.dataset.who && document.body.dataset.who !== ''")
        .await;
    browser
}

/// The texts of the timeline's entries, newest first.
async fn entry_texts(browser: &Browser) -> Vec<String> {
    let texts = browser
        .eval("[...document.querySelectorAll('#entries li[data-row-key] .payload')].map(e => e.textContent)")
        .await;
    serde_json::from_value(texts).expect("strings")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fragment_token_signs_in_and_leaves_the_address_bar_at_once() {
    let _slot = browser_slot().await;
    let app = spawn_app(Backend::Embedded).await;
    let alice = subject_token(&app, "alice").await;
    let browser = open(&app, &alice, "view=timeline", 1000).await;
    let who = browser
        .eval("document.getElementById('who').textContent")
        .await;
    assert_eq!(who, json!("Signed in as subject alice"));
    let address = browser.eval("location.href").await;
    let address = address.as_str().expect("href");
    assert!(
        !address.contains(&alice),
        "the token is still in the address: {address}"
    );
    assert!(!address.contains("token"), "{address}");
    assert_eq!(
        browser
            .eval("sessionStorage.getItem('fanline-token')")
            .await,
        json!(alice)
    );
    assert_eq!(browser.eval("document.cookie").await, json!(""));
    // Admin-only views are hidden from a subject.
    assert_eq!(
        browser
            .eval("document.querySelector('nav a[data-view=admin]').hidden")
            .await,
        json!(true)
    );
    // Every request the page made carried no token in its URL.
    for url in browser.requests() {
        assert!(!url.contains(&alice), "the token reached a URL: {url}");
    }
    browser.assert_clean(&app.address);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_appears_on_a_followers_open_timeline_without_a_reload() {
    let _slot = browser_slot().await;
    let app = spawn_app(Backend::Embedded).await;
    assert_eq!(
        app.follow("bob", "alice").await.status,
        StatusCode::NO_CONTENT
    );
    app.wait_for_idle().await;
    let bob = subject_token(&app, "bob").await;
    let browser = open(&app, &bob, "view=timeline", 1000).await;
    browser
        .wait_for("document.getElementById('view').dataset.stream === 'live'")
        .await;
    browser
        .eval("window.__loadedAt = performance.timeOrigin; true")
        .await;
    let reply = app
        .post_event(
            "alice",
            json!({"kind": "post", "payload": {"text": "hello from alice"}}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    browser
        .wait_for("[...document.querySelectorAll('#entries .payload')].some(e => e.textContent === 'hello from alice')")
        .await;
    assert_eq!(
        browser
            .eval("window.__loadedAt === performance.timeOrigin")
            .await,
        json!(true),
        "the page did not reload"
    );
    // Bob posts from the page too; his own post reaches his timeline.
    browser.fill("#post-payload", "and hello from bob").await;
    browser.click("#post").await;
    browser
        .wait_for("[...document.querySelectorAll('#entries .payload')].some(e => e.textContent === 'and hello from bob')")
        .await;
    // The stream may show the entry before the page has its answer, which empties the box:
    // type the next post only then, or the answer would empty that one.
    browser
        .wait_for("document.getElementById('post-payload').value === ''")
        .await;
    assert_eq!(
        entry_texts(&browser).await,
        ["and hello from bob", "hello from alice"]
    );
    // A JSON payload is posted as JSON; text that is not JSON is refused on the page.
    browser.fill("#post-payload", "{\"reading\": 7}").await;
    browser.click("#post-json").await;
    browser.click("#post").await;
    browser
        .wait_for("document.querySelectorAll('#entries li[data-row-key]').length === 3")
        .await;
    browser
        .wait_for("document.getElementById('post-payload').value === ''")
        .await;
    let posted = app.page("bob", "events", "").await;
    assert_eq!(
        posted.body["items"][0]["payload"],
        json!({"reading": 7}),
        "{posted:?}"
    );
    browser.fill("#post-payload", "not json").await;
    browser.click("#post").await;
    let shown = browser
        .wait_for("!document.getElementById('error').hidden && document.getElementById('error').textContent")
        .await;
    assert!(
        shown
            .as_str()
            .is_some_and(|text| text.starts_with("not JSON")),
        "{shown}"
    );
    browser.fill("#post-payload", "").await;
    browser.click("#post-json").await;
    // Entries that arrived live count as unread; marking all read moves the marker,
    // through the API.
    browser
        .wait_for("document.getElementById('marker').textContent === 'Unread: 3'")
        .await;
    browser.click("#mark-read").await;
    browser
        .wait_for("document.getElementById('marker').textContent === 'Unread: 0'")
        .await;
    let marker = app.get("/v1/subjects/bob/marker").await;
    assert_eq!(marker.body["version"], json!(1), "{marker:?}");
    browser.screenshot("timeline").await;
    browser.assert_clean(&app.address);
}

/// The bell's count as a script expression: its number, or 0 while the badge is hidden.
const BELL_COUNT: &str = "(() => { const c = document.getElementById('bell-count'); \
     return c.hidden ? 0 : Number(c.textContent); })()";

/// The notification list's rows, newest first, as `{kind, summary, text, count, unread}`.
async fn notification_rows(browser: &Browser) -> Value {
    browser
        .eval(
            "[...document.querySelectorAll('#notification-list li[data-id]')].map(e => ({
               kind: e.dataset.kind,
               summary: e.querySelector('.summary').textContent,
               text: e.querySelector('.payload').hidden ? null : e.querySelector('.payload').textContent,
               count: Number(e.dataset.count),
               unread: e.classList.contains('unread') && !e.querySelector('.unread-mark').hidden,
             }))",
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bell_counts_unseen_groups_live_and_the_list_shows_and_marks_them_read() {
    let _slot = browser_slot().await;
    let app = spawn_app(Backend::Embedded).await;
    let carol = subject_token(&app, "carol").await;
    let browser = open(&app, &carol, "view=timeline", 1000).await;
    browser
        .wait_for("document.getElementById('bell')?.dataset.stream === 'live'")
        .await;
    browser
        .eval("window.__loadedAt = performance.timeOrigin; true")
        .await;
    assert_eq!(browser.eval(BELL_COUNT).await, json!(0), "nothing unseen");

    // Two likes of one post are one group; a mention without a group is its own.
    for author in ["ann", "bob"] {
        like(&app, author, "p1", "carol").await;
    }
    // The feed orders groups by when their events land: the likes land first.
    app.wait_for_idle().await;
    let mention = app
        .post_event(
            "dave",
            json!({"kind": "mention", "payload": {"text": "hi @carol"}, "to": ["carol"]}),
        )
        .await;
    assert_eq!(mention.status, StatusCode::CREATED, "{mention:?}");
    browser.wait_for(&format!("{BELL_COUNT} === 2")).await;
    assert_eq!(
        browser
            .eval("document.getElementById('bell').getAttribute('aria-label')")
            .await,
        json!("Notifications, 2 unseen")
    );

    // Opening the list shows one row per group, newest first, and marks them seen.
    browser.click("#bell").await;
    browser
        .wait_for("!document.getElementById('notifications').hidden && document.querySelectorAll('#notification-list li[data-id]').length === 2")
        .await;
    assert_eq!(
        notification_rows(&browser).await,
        json!([
            {"kind": "mention", "summary": "dave mentioned you", "text": "hi @carol", "count": 1, "unread": true},
            {"kind": "like", "summary": "bob and ann liked", "text": null, "count": 2, "unread": true},
        ])
    );
    browser.wait_for(&format!("{BELL_COUNT} === 0")).await;
    let feed = app.get("/v1/subjects/carol/notifications").await;
    assert_eq!(
        (feed.body["unseen"].clone(), feed.body["unread"].clone()),
        (json!(0), json!(2)),
        "{feed:?}"
    );

    // "Mark all read" clears every row's unread mark, through the API.
    browser.click("#notifications-read-all").await;
    browser
        .wait_for("document.getElementById('notifications-unread').textContent === 'Unread: 0' && !document.querySelector('#notification-list li.unread')")
        .await;
    assert_eq!(browser.eval(BELL_COUNT).await, json!(0));
    let feed = app.get("/v1/subjects/carol/notifications").await;
    assert_eq!(
        (feed.body["unseen"].clone(), feed.body["unread"].clone()),
        (json!(0), json!(0)),
        "{feed:?}"
    );

    // A further like brings its group back on top, unseen and unread, without a reload.
    like(&app, "eve", "p1", "carol").await;
    browser.wait_for(&format!("{BELL_COUNT} === 1")).await;
    browser
        .wait_for("document.querySelector('#notification-list li[data-id]')?.dataset.count === '3'")
        .await;
    assert_eq!(
        notification_rows(&browser).await,
        json!([
            {"kind": "like", "summary": "eve and 2 others liked", "text": null, "count": 3, "unread": true},
            {"kind": "mention", "summary": "dave mentioned you", "text": "hi @carol", "count": 1, "unread": false},
        ])
    );
    browser.screenshot("notifications").await;
    // One row is marked read on its own.
    assert_unlabelled_controls_are_none(&browser).await;
    browser
        .click("#notification-list li[data-kind=like] .mark-one")
        .await;
    browser
        .wait_for("document.getElementById('notifications-unread').textContent === 'Unread: 0' && !document.querySelector('#notification-list li.unread')")
        .await;
    let feed = app.get("/v1/subjects/carol/notifications").await;
    assert_eq!(feed.body["unread"], json!(0), "{feed:?}");
    assert_eq!(
        browser
            .eval("window.__loadedAt === performance.timeOrigin")
            .await,
        json!(true),
        "the page did not reload"
    );
    browser.assert_clean(&app.address);
}

/// The event ids of the timeline's entries, in the order shown.
async fn entry_ids(browser: &Browser) -> Value {
    browser
        .eval("[...document.querySelectorAll('#entries li[data-row-key]')].map(e => e.dataset.eventId)")
        .await
}

/// The selector of the entry of `event_id` on the page.
fn entry(event_id: &str) -> String {
    format!("#entries li[data-event-id=\"{event_id}\"]")
}

/// Whether the entry of `event_id` shows `text` with the edited mark, as a script expression.
fn shows_edited(event_id: &str, text: &str) -> String {
    format!(
        "document.querySelector({payload})?.textContent === {text} && !!document.querySelector({mark})",
        payload = json!(format!("{} .payload", entry(event_id))),
        mark = json!(format!("{} .meta .edited", entry(event_id))),
        text = json!(text),
    )
}

/// `event_id`'s item in `owner`'s timeline, through the API.
async fn timeline_item(app: &TestApp, owner: &str, event_id: &str) -> Value {
    app.timeline(owner)
        .await
        .into_iter()
        .find(|item| item["event_id"] == event_id)
        .unwrap_or_else(|| panic!("{event_id} is not on {owner}'s timeline"))
}

/// How many timeline pages (not the stream) the page has read.
fn page_reads(browser: &Browser) -> usize {
    browser
        .requests()
        .iter()
        .filter(|url| url.contains("/timeline?"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_author_edits_an_entry_in_place_and_a_followers_open_timeline_shows_the_edit() {
    // Two browsers: the author's and a follower's.
    let _slots = BROWSERS.acquire_many(2).await.expect("semaphore open");
    let app = spawn_app(Backend::Embedded).await;
    assert_eq!(
        app.follow("bob", "alice").await.status,
        StatusCode::NO_CONTENT
    );
    let one = crate::helpers::post_at(&app, "alice", "one", 1).await;
    let two = crate::helpers::post_at(&app, "alice", "two", 2).await;
    let three = crate::helpers::post_at(&app, "alice", "three", 3).await;
    let own = crate::helpers::post_at(&app, "bob", "bob's own", 4).await;
    app.wait_for_timeline("bob", 4).await;
    app.wait_for_timeline("alice", 3).await;
    let alice_token = subject_token(&app, "alice").await;
    let bob_token = subject_token(&app, "bob").await;

    let bob = open(&app, &bob_token, "view=timeline", 1000).await;
    bob.wait_for("document.getElementById('view').dataset.stream === 'live'")
        .await;
    bob.wait_for("document.querySelectorAll('#entries li[data-row-key]').length === 4")
        .await;
    bob.eval("window.__loadedAt = performance.timeOrigin; true")
        .await;
    let bob_order = entry_ids(&bob).await;
    assert_eq!(bob_order, json!([own, three, two, one]));
    // Bob may edit his own entry only.
    let editable = bob
        .eval("[...document.querySelectorAll('#entries li:has(button.edit)')].map(e => e.dataset.eventId)")
        .await;
    assert_eq!(editable, json!([own]));
    let bob_reads = page_reads(&bob);

    let alice = open(&app, &alice_token, "view=timeline", 1000).await;
    alice
        .wait_for("document.getElementById('view').dataset.stream === 'live'")
        .await;
    alice
        .wait_for("document.querySelectorAll('#entries li[data-row-key] button.edit').length === 3")
        .await;
    assert_eq!(entry_ids(&alice).await, json!([three, two, one]));
    assert_eq!(
        alice
            .eval("document.querySelectorAll('.edited').length")
            .await,
        json!(0),
        "nothing is edited yet"
    );

    // (a) Alice edits "two": the editor holds its payload as pretty JSON.
    alice.click(&format!("{} button.edit", entry(&two))).await;
    let prefilled = alice
        .wait_for(&format!(
            "document.querySelector({})?.value",
            json!(format!("{} .editor textarea", entry(&two)))
        ))
        .await;
    assert_eq!(prefilled, json!("{\n  \"text\": \"two\"\n}"));
    assert_unlabelled_controls_are_none(&alice).await;
    alice
        .fill(
            &format!("{} .editor textarea", entry(&two)),
            "{\"text\": \"two, edited\"}",
        )
        .await;
    alice.click(&format!("{} .editor .save", entry(&two))).await;
    alice
        .wait_for(&format!(
            "({}) && !document.querySelector({})",
            shows_edited(&two, "two, edited"),
            json!(format!("{} .editor", entry(&two)))
        ))
        .await;
    assert_eq!(entry_ids(&alice).await, json!([three, two, one]));
    let item = timeline_item(&app, "alice", &two).await;
    assert_eq!(item["version"], json!(2), "{item}");
    assert_eq!(item["payload"], json!({"text": "two, edited"}), "{item}");
    let edited_at = item["edited_at"].as_str().expect("edited_at").to_owned();
    let mark = alice
        .eval(&format!(
            "(() => {{ const m = document.querySelector({}); return {{datetime: m.getAttribute('datetime'), title: m.title, version: m.closest('li').dataset.version}}; }})()",
            json!(format!("{} .meta .edited", entry(&two)))
        ))
        .await;
    assert_eq!(mark["datetime"], json!(edited_at), "{mark}");
    assert!(
        mark["title"]
            .as_str()
            .is_some_and(|title| title.starts_with("edited ")),
        "{mark}"
    );
    assert_eq!(mark["version"], json!("2"), "{mark}");
    assert_eq!(timeline_item(&app, "bob", &two).await["version"], json!(2));

    // (b) Bob's open timeline shows the edit, in place, from the stream: no reload, no
    // page read.
    bob.wait_for(&shows_edited(&two, "two, edited")).await;
    assert_eq!(entry_ids(&bob).await, bob_order, "the entry kept its place");
    assert_eq!(
        bob.eval("window.__loadedAt === performance.timeOrigin")
            .await,
        json!(true),
        "the page did not reload"
    );
    assert_eq!(
        page_reads(&bob),
        bob_reads,
        "no timeline page was read again"
    );
    assert_eq!(
        bob.eval("document.querySelectorAll('#entries .edited').length")
            .await,
        json!(1)
    );

    // Cancel closes the editor and sends nothing.
    alice.click(&format!("{} button.edit", entry(&one))).await;
    alice
        .wait_for(&format!(
            "document.querySelector({})",
            json!(format!("{} .editor", entry(&one)))
        ))
        .await;
    alice
        .fill(&format!("{} .editor textarea", entry(&one)), "\"dropped\"")
        .await;
    alice
        .click(&format!("{} .editor .cancel", entry(&one)))
        .await;
    alice
        .wait_for(&format!(
            "!document.querySelector({}) && !document.querySelector({}).hidden",
            json!(format!("{} .editor", entry(&one))),
            json!(format!("{} button.edit", entry(&one)))
        ))
        .await;
    assert_eq!(
        timeline_item(&app, "alice", &one).await["version"],
        json!(1)
    );

    // (c) Alice opens "three" at version 1; meanwhile it is edited elsewhere. Her save is a
    // conflict, shown as the API says it, with an offer to reload.
    alice.click(&format!("{} button.edit", entry(&three))).await;
    alice
        .wait_for(&format!(
            "document.querySelector({})",
            json!(format!("{} .editor textarea", entry(&three)))
        ))
        .await;
    let elsewhere = app
        .send(
            app.client
                .patch(app.url(&format!("/v1/subjects/alice/events/{three}")))
                .json(&json!({"payload": {"text": "three, from elsewhere"}, "version": 1})),
        )
        .await;
    assert_eq!(elsewhere.status, StatusCode::OK, "{elsewhere:?}");
    alice
        .fill(
            &format!("{} .editor textarea", entry(&three)),
            "{\"text\": \"three, from alice\"}",
        )
        .await;
    alice
        .click(&format!("{} .editor .save", entry(&three)))
        .await;
    let notice = alice
        .wait_for(&format!(
            "(() => {{ const n = document.querySelector({}); return n && !n.hidden && n.classList.contains('conflict') && n.textContent; }})()",
            json!(format!("{} .editor-notice", entry(&three)))
        ))
        .await;
    assert!(
        notice
            .as_str()
            .is_some_and(|text| text.starts_with("409 version_conflict: ")),
        "{notice}"
    );
    assert_eq!(
        alice
            .eval(&format!(
                "document.querySelector({}).hidden",
                json!(format!("{} .editor .reload", entry(&three)))
            ))
            .await,
        json!(false),
        "a reload is offered"
    );
    assert_unlabelled_controls_are_none(&alice).await;
    let item = timeline_item(&app, "alice", &three).await;
    assert_eq!(
        item["version"],
        json!(2),
        "the stale edit did not apply: {item}"
    );
    assert_eq!(item["payload"], json!({"text": "three, from elsewhere"}));
    alice.screenshot("timeline-edit-conflict").await;
    // Reloading shows the current version and keeps her text; saving again replaces it.
    alice
        .click(&format!("{} .editor .reload", entry(&three)))
        .await;
    alice
        .wait_for(&format!(
            "document.querySelector({}).textContent.startsWith('Reloaded version 2') && ({})",
            json!(format!("{} .editor-notice", entry(&three))),
            shows_edited(&three, "three, from elsewhere")
        ))
        .await;
    assert_eq!(
        alice
            .eval(&format!(
                "document.querySelector({}).value",
                json!(format!("{} .editor textarea", entry(&three)))
            ))
            .await,
        json!("{\"text\": \"three, from alice\"}")
    );
    alice
        .click(&format!("{} .editor .save", entry(&three)))
        .await;
    alice
        .wait_for(&shows_edited(&three, "three, from alice"))
        .await;
    let item = timeline_item(&app, "alice", &three).await;
    assert_eq!(item["version"], json!(3), "{item}");
    assert_eq!(item["payload"], json!({"text": "three, from alice"}));
    bob.wait_for(&shows_edited(&three, "three, from alice"))
        .await;
    assert_eq!(entry_ids(&bob).await, bob_order);
    assert_eq!(page_reads(&bob), bob_reads);
    assert_eq!(entry_ids(&alice).await, json!([three, two, one]));
    bob.assert_clean(&app.address);
    alice.assert_clean(&app.address);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_entries_are_paged_in_below_the_first_page() {
    let _slot = browser_slot().await;
    let app = spawn_app(Backend::Embedded).await;
    assert_eq!(
        app.follow("bob", "alice").await.status,
        StatusCode::NO_CONTENT
    );
    for n in 0..25 {
        crate::helpers::post_at(&app, "alice", &format!("post {n}"), n).await;
    }
    app.wait_for_timeline("bob", 25).await;
    let bob = subject_token(&app, "bob").await;
    let browser = open(&app, &bob, "view=timeline", 375).await;
    browser
        .wait_for("document.querySelectorAll('#entries li[data-row-key]').length === 20 && !document.getElementById('older').hidden")
        .await;
    browser.click("#older").await;
    browser
        .wait_for("document.querySelectorAll('#entries li[data-row-key]').length === 25")
        .await;
    let texts = entry_texts(&browser).await;
    let expected: Vec<String> = (0..25).rev().map(|n| format!("post {n}")).collect();
    assert_eq!(texts, expected);
    // At 375 px nothing is wider than the screen, and every control has a label or text.
    assert_eq!(
        browser
            .eval("document.documentElement.scrollWidth <= 375")
            .await,
        json!(true)
    );
    assert_unlabelled_controls_are_none(&browser).await;
    browser.assert_clean(&app.address);
}

/// Every input, select and textarea has a label, and every button a name.
async fn assert_unlabelled_controls_are_none(browser: &Browser) {
    let unlabelled = browser
        .eval(
            "[...document.querySelectorAll('input, select, textarea, button')]
               .filter(e => !e.hidden && e.offsetParent !== null)
               .filter(e => e.tagName === 'BUTTON'
                 ? !(e.textContent.trim() || e.getAttribute('aria-label'))
                 : !(e.labels && e.labels.length))
               .map(e => e.outerHTML)",
        )
        .await;
    assert_eq!(unlabelled, json!([]), "controls without a label");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn following_and_unfollowing_from_the_page_changes_what_the_timeline_shows() {
    let _slot = browser_slot().await;
    let app = spawn_app(Backend::Embedded).await;
    let bob = subject_token(&app, "bob").await;
    let browser = open(&app, &bob, "view=timeline", 1000).await;
    browser
        .wait_for("document.getElementById('view').dataset.stream === 'live'")
        .await;
    browser.fill("#follow-target", "carol").await;
    browser.click("#follow").await;
    let following = wait_for_following(&app, "bob", true).await;
    assert_eq!(following, json!(["carol"]));
    let reply = app
        .post_event("carol", json!({"payload": {"text": "carol speaks"}}))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED);
    browser
        .wait_for("document.querySelector('#entries li[data-author=carol]')")
        .await;
    browser.click("#unfollow").await;
    // The stream's `unfollowed` event takes carol's entries off the page.
    browser
        .wait_for("!document.querySelector('#entries li[data-author=carol]')")
        .await;
    assert_eq!(wait_for_following(&app, "bob", false).await, json!([]));
    browser.assert_clean(&app.address);
}

/// The subjects `subject` follows, once the list is non-empty (`non_empty`) or empty.
async fn wait_for_following(app: &TestApp, subject: &str, non_empty: bool) -> Value {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let page = app.page(subject, "following", "").await;
        let names: Vec<Value> = page.body["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|item| item["subject"].clone())
            .collect();
        if names.is_empty() != non_empty || tokio::time::Instant::now() > deadline {
            return Value::Array(names);
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_series_chart_draws_the_points_and_extends_as_new_ones_arrive() {
    let _slot = browser_slot().await;
    let app = spawn_app(Backend::Embedded).await;
    let now = time::OffsetDateTime::now_utc();
    let points: Vec<Value> = (1..=30_i32)
        .rev()
        .map(|minutes| {
            let at = now - time::Duration::minutes(minutes.into());
            json!({
                "at": at.format(&time::format_description::well_known::Rfc3339).expect("time"),
                "value": (f64::from(minutes) / 3.0).sin().mul_add(4.0, 10.0),
            })
        })
        .collect();
    let path = "/v1/series/field-7%2Fsoil_temp/points";
    let reply = app.post_json(path, &json!({ "points": points })).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    let browser = open(
        &app,
        crate::helpers::TEST_ADMIN_TOKEN,
        "view=series&series=field-7%2Fsoil_temp&range=1h",
        1000,
    )
    .await;
    browser
        .wait_for("document.getElementById('chart').dataset.points === '30'")
        .await;
    assert_eq!(
        browser.eval(CANVAS_INK).await,
        json!(true),
        "the chart is blank"
    );
    // Once the stream is open, a new write extends the chart.
    browser
        .wait_for("document.getElementById('chart').dataset.stream === 'live'")
        .await;
    let fresh = json!({"points": [{
        "at": time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).expect("time"),
        "value": 20.0,
    }]});
    let reply = app.post_json(path, &fresh).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    browser
        .wait_for("document.getElementById('chart').dataset.points === '31'")
        .await;
    assert_eq!(browser.eval(CANVAS_INK).await, json!(true));
    browser.screenshot("series").await;
    browser.assert_clean(&app.address);
}

/// Whether the chart's canvas has any painted pixel.
const CANVAS_INK: &str = "(() => {
    const canvas = document.querySelector('#chart canvas');
    if (!canvas || !canvas.width || !canvas.height) return false;
    const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    for (let i = 3; i < data.length; i += 4) if (data[i] !== 0) return true;
    return false;
})()";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_token_sees_no_timeline_controls() {
    let _slot = browser_slot().await;
    let app = spawn_app(Backend::Embedded).await;
    let device = issue(&app, "/v1/admin/series/dev-1/tokens").await;
    let browser = open(&app, &device, "view=timeline", 1000).await;
    browser.wait_for("document.getElementById('device')").await;
    let shown = browser
        .eval(
            "({nav: document.getElementById('nav').hidden,
               post: !!document.getElementById('post-form'),
               follow: !!document.getElementById('follow-form'),
               entries: !!document.getElementById('entries'),
               who: document.getElementById('who').textContent})",
        )
        .await;
    assert_eq!(
        shown,
        json!({"nav": true, "post": false, "follow": false, "entries": false,
               "who": "Signed in as device dev-1"})
    );
    browser.assert_clean(&app.address);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_error_is_shown_as_the_api_says_it() {
    let _slot = browser_slot().await;
    let app = spawn_app(Backend::Embedded).await;
    // A token the server does not know: the sign-in fails with the API's 401.
    let browser = open_unsigned(&app, "token=not-a-real-token").await;
    let shown = browser
        .wait_for("!document.getElementById('error').hidden && document.getElementById('error').textContent")
        .await;
    assert!(
        shown
            .as_str()
            .is_some_and(|text| text.starts_with("401 unauthorized: ")),
        "{shown}"
    );
    assert_eq!(
        browser
            .eval("document.getElementById('sign-in').hidden")
            .await,
        json!(false)
    );
    // Signed in as the admin by keyboard alone, a malformed subject is refused with the
    // API's 400.
    browser
        .eval("document.getElementById('token-input').focus(); true")
        .await;
    browser.type_text(crate::helpers::TEST_ADMIN_TOKEN).await;
    browser.press("Enter").await;
    browser
        .wait_for("document.body.dataset.who === 'admin'")
        .await;
    // The admin lands on the overview; the timeline is a link away.
    browser
        .wait_for("document.querySelector('[data-figure=backlog]')")
        .await;
    browser.click("nav a[data-view=timeline]").await;
    browser
        .wait_for("document.getElementById('timeline-subject')")
        .await;
    browser.fill("#timeline-subject", "tab\there").await;
    browser
        .eval("document.getElementById('timeline-pick').requestSubmit(); true")
        .await;
    let shown = browser
        .wait_for("!document.getElementById('error').hidden && document.getElementById('error').textContent")
        .await;
    assert!(
        shown
            .as_str()
            .is_some_and(|text| text.starts_with("400 invalid_subject: ")),
        "{shown}"
    );
    browser.assert_clean(&app.address);
}

/// Opens the console at `fragment` without waiting for a sign-in.
async fn open_unsigned(app: &TestApp, fragment: &str) -> Browser {
    let browser = Browser::launch(1000, 900).await;
    browser.goto(&console_url(app, fragment)).await;
    browser.wait_for("document.readyState === 'complete'").await;
    browser
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_issues_a_token_shown_once_and_revokes_it() {
    let _slot = browser_slot().await;
    let app = spawn_app(Backend::Embedded).await;
    let browser = open(&app, crate::helpers::TEST_ADMIN_TOKEN, "view=admin", 1000).await;
    browser.fill("#issue-subject", "dora").await;
    browser
        .eval("document.getElementById('issue-subject').form.requestSubmit(); true")
        .await;
    let token = browser
        .wait_for("document.getElementById('issued-token')?.textContent")
        .await;
    let token = token.as_str().expect("token text").to_owned();
    let dora = Api::with_token(&app.address, Some(&token));
    let who = dora.get("/v1/whoami").await;
    assert_eq!(
        who.body,
        json!({"kind": "subject", "name": "dora"}),
        "{who:?}"
    );
    browser.fill("#tokens-of", "dora").await;
    browser
        .eval("document.getElementById('tokens-of').form.requestSubmit(); true")
        .await;
    browser
        .wait_for("document.querySelectorAll('#tokens tr').length === 1")
        .await;
    browser.click("#tokens tr button").await;
    browser
        .wait_for("document.querySelectorAll('#tokens tr').length === 0")
        .await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let status = dora.get("/v1/whoami").await.status;
        if status == StatusCode::UNAUTHORIZED {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the revoked token still works: {status}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    browser.assert_clean(&app.address);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_page_shows_its_events_with_fan_out_status_and_its_follow_lists() {
    let _slot = browser_slot().await;
    let app = spawn_app(Backend::Embedded).await;
    assert_eq!(
        app.follow("bob", "alice").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        app.follow("alice", "carol").await.status,
        StatusCode::NO_CONTENT
    );
    let reply = app
        .post_event("alice", json!({"kind": "post", "payload": {"n": 1}}))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    app.wait_for_idle().await;
    let alice = subject_token(&app, "alice").await;
    let browser = open(&app, &alice, "view=subject", 1000).await;
    browser
        .wait_for("document.querySelector('#events li .payload')?.textContent.includes('\"n\": 1')")
        .await;
    browser
        .wait_for("document.getElementById('followers').textContent.trim() === 'bob'")
        .await;
    browser
        .wait_for("document.getElementById('following').textContent.startsWith('carol')")
        .await;
    browser.click("#events li button").await;
    let status = browser
        .wait_for("document.querySelector('#events li .status').textContent")
        .await;
    assert!(
        status
            .as_str()
            .is_some_and(|text| text.starts_with(" delivery: done, delivered 2")),
        "{status}"
    );
    browser.assert_clean(&app.address);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_are_found_by_tag_charted_together_stepped_and_their_tags_edited() {
    let _slot = browser_slot().await;
    let app = spawn_app(Backend::Embedded).await;
    let now = time::OffsetDateTime::now_utc();
    for (name, offset) in [
        ("site-a/temp", 0.0),
        ("site-a/wind", 5.0),
        ("site-b/temp", 9.0),
    ] {
        let points: Vec<Value> = (1..=20_i32)
            .map(|minutes| {
                let at = now - time::Duration::minutes(minutes.into());
                json!({
                    "at": at.format(&time::format_description::well_known::Rfc3339).expect("time"),
                    "value": offset + f64::from(minutes),
                })
            })
            .collect();
        let path = format!("/v1/series/{}/points", segment(name));
        let reply = app.post_json(&path, &json!({ "points": points })).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }
    for name in ["site-a/temp", "site-a/wind"] {
        let path = format!("/v1/series/{}/tags", segment(name));
        let reply = app
            .send(
                app.client
                    .put(app.url(&path))
                    .json(&json!({"tags": ["site:a"]})),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    }
    let browser = open(&app, crate::helpers::TEST_ADMIN_TOKEN, "view=series", 1000).await;
    browser.fill("#series-tag", "site:a").await;
    browser
        .eval("document.getElementById('series-find').requestSubmit(); true")
        .await;
    let found = browser
        .wait_for("document.querySelectorAll('#series-found input').length === 2 && [...document.querySelectorAll('#series-found input')].map(e => e.value)")
        .await;
    assert_eq!(found, json!(["site-a/temp", "site-a/wind"]));
    browser
        .eval("document.querySelectorAll('#series-found input').forEach(e => { e.checked = true; }); true")
        .await;
    browser
        .eval("document.getElementById('mode').value = 'stepped'; document.getElementById('series-chart').requestSubmit(); true")
        .await;
    let status = browser
        .wait_for("document.getElementById('chart-status').textContent.includes('buckets') && document.getElementById('chart-status').textContent")
        .await;
    assert_eq!(
        status,
        json!("site-a/temp, site-a/wind: 20 buckets of 15s (avg)")
    );
    assert_eq!(
        browser.eval(CANVAS_INK).await,
        json!(true),
        "the chart is blank"
    );
    // The deep link names the series, range and mode (and no token).
    let link = browser.eval("location.hash").await;
    assert_eq!(
        link,
        json!(
            "#view=series&series=site-a%2Ftemp%2Csite-a%2Fwind&range=1h&mode=stepped&agg=avg&tag=site%3Aa"
        )
    );
    browser
        .wait_for("document.getElementById('tags-0')?.value === 'site:a'")
        .await;
    browser.fill("#tags-0", "site:a, kind:temp").await;
    browser
        .eval("document.getElementById('tags-0').form.requestSubmit(); true")
        .await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let tags = app.get("/v1/series/site-a%2Ftemp/tags").await;
        if tags.body["tags"] == json!(["site:a", "kind:temp"]) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{tags:?}");
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    browser.assert_clean(&app.address);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_sees_a_dead_lettered_fan_out_and_requeues_it() {
    use fanline::store::Table;
    use fanline::store::fault::{Calls, Fault, Op};

    let _slot = browser_slot().await;
    let app = crate::helpers::spawn_app_with(
        crate::helpers::TestStore::new(Backend::Embedded).await,
        |config| {
            config.max_attempts = 2;
            config.retry_base_ms = 1;
            // The post's fan-out must be a job, for its writes to fail.
            config.fanout_in_post = Some(0);
        },
    )
    .await;
    assert_eq!(
        app.follow("reader", "writer").await.status,
        StatusCode::NO_CONTENT
    );
    app.wait_for_idle().await;
    app.faults.fail_always(
        Calls::on(Op::BatchWrite, Table::Timelines),
        Fault::Permanent,
    );
    let reply = app.post_text("writer", "poison").await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let letters = app.get("/v1/admin/fanout/writer/dead-letters").await;
        if letters.body["items"]
            .as_array()
            .is_some_and(|items| !items.is_empty())
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{letters:?}");
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let browser = open(&app, crate::helpers::TEST_ADMIN_TOKEN, "view=admin", 1000).await;
    browser.fill("#dead-subject", "writer").await;
    browser
        .eval("document.getElementById('dead-subject').form.requestSubmit(); true")
        .await;
    let row = browser
        .wait_for("document.querySelector('#dead-letters tr button') && document.querySelector('#dead-letters tr').textContent")
        .await;
    assert!(
        row.as_str()
            .is_some_and(|text| text.contains("delivery") && text.contains("injected failure")),
        "{row}"
    );
    app.faults.clear();
    browser.click("#dead-letters tr button").await;
    browser
        .wait_for("document.querySelector('#dead-letters tr td:nth-child(6)').textContent !== ''")
        .await;
    assert_eq!(app.wait_for_timeline("reader", 1).await.len(), 1);
    browser.assert_clean(&app.address);
}

/// A figure of the overview, as a script expression: `[data-figure=name]`.
fn figure(name: &str) -> String {
    format!("document.querySelector('[data-figure={name}]')")
}

/// The overview's figure `name` as `{value, total, text}` (its `data-value`, its `data-total`
/// and its shown value).
async fn figure_now(browser: &Browser, name: &str) -> Value {
    browser
        .eval(&format!(
            "(() => {{ const f = {}; return {{value: Number(f.dataset.value), total: Number(f.dataset.total), text: f.querySelector('.value').textContent}}; }})()",
            figure(name)
        ))
        .await
}

/// How many times the page has read the overview.
fn overview_reads(browser: &Browser) -> usize {
    browser
        .requests()
        .iter()
        .filter(|url| url.ends_with("/v1/admin/overview"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_lands_on_a_live_overview_whose_figures_change_as_events_are_posted() {
    let _slot = browser_slot().await;
    let app = spawn_app(Backend::Embedded).await;
    for follower in ["bob", "carol", "dave"] {
        assert_eq!(
            app.follow(follower, "alice").await.status,
            StatusCode::NO_CONTENT
        );
    }
    app.wait_for_idle().await;
    let browser = open(&app, crate::helpers::TEST_ADMIN_TOKEN, "", 1280).await;
    // No view named: the admin's landing view is the overview, first in the menu.
    browser
        .wait_for(&format!(
            "{}?.dataset.total !== undefined",
            figure("events")
        ))
        .await;
    assert_eq!(
        browser
            .eval("document.querySelector('nav a[aria-current=page]').dataset.view")
            .await,
        json!("overview")
    );
    assert_eq!(
        browser
            .eval("document.querySelector('nav a:not([hidden])').dataset.view")
            .await,
        json!("overview")
    );
    // Every figure is filled in and says what it covers: the service's (from the store) and
    // this process's.
    let shown = browser
        .eval(
            "[...document.querySelectorAll('.figure')].map(f => [f.dataset.figure, f.querySelector('.value').textContent, f.querySelector('.covers').textContent])",
        )
        .await;
    let shown = shown.as_array().expect("figures");
    let names: Vec<&str> = shown
        .iter()
        .map(|row| row[0].as_str().expect("name"))
        .collect();
    assert_eq!(
        names,
        [
            "backlog",
            "oldest-job",
            "events",
            "deliveries",
            "lag",
            "streams",
            "connections",
            "dead-letters",
            "mqtt"
        ]
    );
    for row in shown {
        assert!(
            row[1]
                .as_str()
                .is_some_and(|text| !text.is_empty() && text != "…"),
            "a figure is not filled in: {row}"
        );
        assert!(
            row[2].as_str().is_some_and(|text| !text.is_empty()),
            "a figure does not say what it covers: {row}"
        );
    }
    let headings = browser
        .eval("[...document.querySelectorAll('#view h3')].map(h => h.textContent)")
        .await;
    let headings = headings.to_string();
    assert!(
        headings.contains("Service what the store tells"),
        "{headings}"
    );
    assert!(headings.contains("This process since "), "{headings}");
    assert_eq!(
        figure_now(&browser, "mqtt").await["text"],
        json!("not configured")
    );
    assert_eq!(
        browser
            .eval("document.getElementById('overview-workers').hidden")
            .await,
        json!(true),
        "this process runs workers"
    );
    let intake = browser
        .eval("[...document.querySelectorAll('#intake tbody tr')].map(r => r.dataset.intake)")
        .await;
    assert_eq!(intake, json!(["line_protocol", "json", "mqtt"]));

    // Events posted with followers while the page is open: the figures it shows move.
    let events_before = figure_now(&browser, "events").await;
    let deliveries_before = figure_now(&browser, "deliveries").await;
    let reads_before = overview_reads(&browser);
    for n in 0..5 {
        let reply = app.post_text("alice", &format!("busy {n}")).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }
    let points = json!({"points": [{"at": "2026-01-01T00:00:00Z", "value": 1.0}, {"at": "2026-01-01T00:00:01Z", "value": 2.0}]});
    let reply = app
        .post_json("/v1/series/barn%2Ftemp/points", &points)
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    let events_total = events_before["total"].as_u64().expect("events total") + 5;
    let deliveries_total = deliveries_before["total"]
        .as_u64()
        .expect("deliveries total")
        + 15;
    browser
        .wait_for(&format!(
            "Number({e}.dataset.total) >= {events_total} && Number({d}.dataset.total) >= {deliveries_total} \
             && Number({e}.dataset.value) > 0 && Number({d}.dataset.value) > 0",
            e = figure("events"),
            d = figure("deliveries"),
        ))
        .await;
    let events_after = figure_now(&browser, "events").await;
    let deliveries_after = figure_now(&browser, "deliveries").await;
    assert_ne!(
        events_after["text"], events_before["text"],
        "{events_after}"
    );
    assert_ne!(
        deliveries_after["text"], deliveries_before["text"],
        "{deliveries_after}"
    );
    assert!(
        events_after["text"]
            .as_str()
            .is_some_and(|text| text.ends_with("/s")),
        "{events_after}"
    );
    assert!(
        overview_reads(&browser) > reads_before,
        "the page polls the overview"
    );
    // The JSON intake counts the two points; the lag of the fan-outs is shown.
    browser
        .wait_for("document.querySelector('#intake tr[data-intake=json] td:last-child').textContent === '2'")
        .await;
    browser
        .wait_for(&format!("{}.dataset.value !== ''", figure("lag")))
        .await;
    // The history is charted.
    for chart in ["rates", "backlog", "lag", "points"] {
        browser
            .wait_for(&format!(
                "Number(document.getElementById('history-{chart}').dataset.points) >= 1"
            ))
            .await;
        assert_eq!(
            browser
                .eval(&CANVAS_INK.replace("#chart", &format!("#history-{chart}")))
                .await,
            json!(true),
            "the {chart} chart is blank"
        );
    }
    assert_unlabelled_controls_are_none(&browser).await;
    browser.screenshot("overview").await;
    // Dead letters link to the admin view's list of them.
    browser.click("#overview-dead-letters").await;
    browser
        .wait_for("document.activeElement && document.activeElement.id === 'dead-subject'")
        .await;
    browser.assert_clean(&app.address);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_token_gets_no_overview() {
    let _slot = browser_slot().await;
    let app = spawn_app(Backend::Embedded).await;
    let alice = subject_token(&app, "alice").await;
    let browser = open(&app, &alice, "view=overview", 1000).await;
    // Asked for the overview, a subject is shown its own timeline instead.
    browser
        .wait_for("document.getElementById('view').dataset.stream === 'live'")
        .await;
    let shown = browser
        .eval(
            "({overview: !!document.querySelector('[data-figure]'),
               link: document.querySelector('nav a[data-view=overview]').hidden,
               current: document.querySelector('nav a[aria-current=page]').dataset.view})",
        )
        .await;
    assert_eq!(
        shown,
        json!({"overview": false, "link": true, "current": "timeline"})
    );
    assert_eq!(overview_reads(&browser), 0, "{:#?}", browser.requests());
    // The API refuses it too.
    let reply = Api::with_token(&app.address, Some(&alice))
        .get("/v1/admin/overview")
        .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{reply:?}");
    browser.assert_clean(&app.address);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_workers_the_overview_says_the_fan_out_happens_elsewhere() {
    let _slot = browser_slot().await;
    let app = crate::helpers::spawn_app_with(
        crate::helpers::TestStore::new(Backend::Embedded).await,
        |config| config.workers = 0,
    )
    .await;
    let browser = open(
        &app,
        crate::helpers::TEST_ADMIN_TOKEN,
        "view=overview",
        1000,
    )
    .await;
    let note = browser
        .wait_for("!document.getElementById('overview-workers').hidden && document.getElementById('overview-workers').textContent")
        .await;
    assert!(
        note.as_str()
            .is_some_and(|text| text.contains("--workers 0") && text.contains("other processes")),
        "{note}"
    );
    let covers = browser
        .eval("document.getElementById('overview-process-covers').textContent")
        .await;
    assert!(
        covers
            .as_str()
            .is_some_and(|text| text.ends_with("0 fan-out workers")),
        "{covers}"
    );
    browser.assert_clean(&app.address);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_series_page_lists_the_catalogue_a_page_at_a_time_without_a_search() {
    let _slot = browser_slot().await;
    let app = spawn_app(Backend::Embedded).await;
    let series: Vec<Value> = (0..60)
        .map(|n| json!({"name": format!("s-{n:02}"), "points": [{"at": "2026-01-01T00:00:00Z", "value": n}]}))
        .collect();
    let reply = app
        .post_json("/v1/series:batch", &json!({ "series": series }))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    let browser = open(&app, crate::helpers::TEST_ADMIN_TOKEN, "view=series", 1000).await;
    let first = browser
        .wait_for("document.querySelectorAll('#series-found input').length === 50 && !document.getElementById('series-more').hidden && [...document.querySelectorAll('#series-found input')].map(e => e.value)")
        .await;
    let expected: Vec<String> = (0..50).map(|n| format!("s-{n:02}")).collect();
    assert_eq!(first, json!(expected));
    browser.click("#series-more").await;
    browser
        .wait_for("document.querySelectorAll('#series-found input').length === 60 && document.getElementById('series-more').hidden")
        .await;
    let last = browser
        .eval("[...document.querySelectorAll('#series-found input')].slice(-1)[0].value")
        .await;
    assert_eq!(last, json!("s-59"));
    // Before any pick, the chart says what to do and draws nothing.
    assert_eq!(
        browser
            .eval("document.getElementById('chart').hidden && document.getElementById('chart-status').textContent")
            .await,
        json!("Tick one or more series above, then Draw.")
    );
    // A prefix narrows the list.
    browser.fill("#series-start", "s-5").await;
    browser
        .eval("document.getElementById('series-find').requestSubmit(); true")
        .await;
    browser
        .wait_for("document.querySelectorAll('#series-found input').length === 10 && document.getElementById('series-more').hidden")
        .await;
    assert_unlabelled_controls_are_none(&browser).await;
    browser.assert_clean(&app.address);
}

/// The series chart's x-axis labels, as drawn.
async fn tick_labels(browser: &Browser) -> Vec<String> {
    let ticks = browser
        .eval("JSON.parse(document.getElementById('chart').dataset.ticks)")
        .await;
    serde_json::from_value(ticks).expect("strings")
}

/// The legend's values, the time first.
async fn legend_values(browser: &Browser) -> Vec<String> {
    let values = browser
        .eval("[...document.querySelectorAll('#chart .u-legend .u-value')].map(e => e.textContent)")
        .await;
    serde_json::from_value(values).expect("strings")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_axes_fit_a_second_or_a_year_and_the_legend_shows_the_hovered_values() {
    let _slot = browser_slot().await;
    let app = spawn_app(Backend::Embedded).await;
    let rfc3339 = &time::format_description::well_known::Rfc3339;
    let now = time::OffsetDateTime::now_utc();
    let first = (now - time::Duration::minutes(5))
        .replace_nanosecond(0)
        .expect("whole second");
    let second = first + time::Duration::seconds(1);
    let points = json!({"points": [
        {"at": first.format(rfc3339).expect("time"), "value": 3.5},
        {"at": second.format(rfc3339).expect("time"), "value": 7.25},
    ]});
    let reply = app.post_json("/v1/series/pair/points", &points).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    let browser = open(
        &app,
        crate::helpers::TEST_ADMIN_TOKEN,
        "view=series&series=pair&range=15m",
        1000,
    )
    .await;
    browser
        .wait_for("document.getElementById('chart').dataset.points === '2' && document.getElementById('chart').dataset.ticks")
        .await;
    // Two ticks, a second apart, as times of day to the second; the date once, under the
    // first; no millisecond ticks; nothing cut off at the chart's edges.
    let ticks = tick_labels(&browser).await;
    let millis = first.unix_timestamp() * 1000;
    let expected = browser
        .eval(&format!(
            "[{millis}, {millis} + 1000].map(ms => new Date(ms).toTimeString().slice(0, 8))"
        ))
        .await;
    let firsts: Vec<&str> = ticks
        .iter()
        .map(|tick| tick.split('\n').next().expect("a line"))
        .collect();
    assert_eq!(json!(firsts), expected, "{ticks:?}");
    assert!(ticks.iter().all(|tick| !tick.contains('.')), "{ticks:?}");
    let dated: Vec<&String> = ticks.iter().filter(|tick| tick.contains('\n')).collect();
    assert_eq!(dated.len(), 1, "the date is shown once: {ticks:?}");
    assert!(ticks[0].contains('\n'), "{ticks:?}");
    assert_eq!(
        browser
            .eval("document.getElementById('chart').dataset.ticksFit")
            .await,
        json!("true"),
        "a label is cut off: {ticks:?}"
    );
    // Away from the chart, the legend shows the latest point; over it, the point under
    // the cursor; never `--`.
    let idle = legend_values(&browser).await;
    assert_eq!(idle.len(), 2, "{idle:?}");
    assert_eq!(idle[1], "7.25", "{idle:?}");
    browser.hover("#chart .u-over", 0.05, 0.5).await;
    browser
        .wait_for("document.querySelectorAll('#chart .u-legend .u-value')[1].textContent === '3.5'")
        .await;
    let hovered = legend_values(&browser).await;
    let day_and_time = browser
        .eval(&format!(
            "(() => {{ const d = new Date({millis}); return [d.getDate(), d.toTimeString().slice(0, 8)]; }})()"
        ))
        .await;
    assert!(
        hovered[0].starts_with(&day_and_time[0].to_string())
            && hovered[0].ends_with(day_and_time[1].as_str().expect("time")),
        "{hovered:?} {day_and_time}"
    );
    browser.hover("#chart .u-over", 0.95, 0.5).await;
    browser
        .wait_for(
            "document.querySelectorAll('#chart .u-legend .u-value')[1].textContent === '7.25'",
        )
        .await;
    for values in [idle, hovered, legend_values(&browser).await] {
        assert!(values.iter().all(|value| value != "--"), "{values:?}");
    }

    // A year of monthly points: the axis shows months, the year once per year.
    let yearly: Vec<Value> = (0..12_i64)
        .map(|months| {
            let at = now - time::Duration::days(30 * months + 1);
            json!({"at": at.format(rfc3339).expect("time"), "value": months})
        })
        .collect();
    let reply = app
        .post_json("/v1/series/yearly/points", &json!({ "points": yearly }))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    browser
        .eval("location.hash = 'view=series&series=yearly&range=1y'; true")
        .await;
    browser
        .wait_for("document.getElementById('chart')?.dataset.points === '12' && document.getElementById('chart').dataset.ticks")
        .await;
    let ticks = tick_labels(&browser).await;
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    assert!(ticks.len() >= 5, "{ticks:?}");
    for tick in &ticks {
        let mut lines = tick.split('\n');
        let month = lines.next().expect("a line");
        assert!(MONTHS.contains(&month), "not a month: {ticks:?}");
        if let Some(year) = lines.next() {
            assert!(year.parse::<i32>().is_ok(), "{ticks:?}");
        }
    }
    assert!(
        ticks[0].contains('\n'),
        "the first month has its year: {ticks:?}"
    );
    assert_eq!(
        browser
            .eval("document.getElementById('chart').dataset.ticksFit")
            .await,
        json!("true"),
        "a label is cut off: {ticks:?}"
    );
    browser.assert_clean(&app.address);
}

/// Tables shown on the page without a row in them (bare headers), as their ids.
const BARE_TABLES: &str = "[...document.querySelectorAll('table')]
    .filter(t => t.offsetParent !== null && !t.querySelector('tbody tr'))
    .map(t => t.querySelector('tbody')?.id || t.outerHTML.slice(0, 60))";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_tables_and_lists_say_so_instead_of_showing_bare_headers() {
    let _slot = browser_slot().await;
    let app = spawn_app(Backend::Embedded).await;
    let browser = open(&app, crate::helpers::TEST_ADMIN_TOKEN, "view=admin", 1000).await;
    browser
        .wait_for("document.getElementById('tokens-empty')")
        .await;
    assert_eq!(browser.eval(BARE_TABLES).await, json!([]));
    let said = browser
        .eval("[...document.querySelectorAll('.empty')].filter(e => !e.hidden).map(e => e.id)")
        .await;
    assert_eq!(said, json!(["tokens-empty", "dead-letters-empty"]));
    // Two issue buttons, each saying what it issues.
    let buttons = browser
        .eval("[...document.querySelectorAll('#view button')].map(b => b.textContent)")
        .await;
    assert_eq!(
        buttons,
        json!([
            "Issue subject token",
            "Issue device token",
            "List tokens",
            "List dead letters"
        ])
    );
    // Listing the tokens of a subject that has none says so, still without a bare table.
    browser.fill("#tokens-of", "quiet").await;
    browser
        .eval("document.getElementById('tokens-of').form.requestSubmit(); true")
        .await;
    browser
        .wait_for("document.getElementById('tokens-empty').textContent === 'quiet has no tokens.'")
        .await;
    browser.fill("#dead-subject", "quiet").await;
    browser
        .eval("document.getElementById('dead-subject').form.requestSubmit(); true")
        .await;
    browser
        .wait_for("document.getElementById('dead-letters-empty').textContent === 'Nothing of quiet is dead-lettered.'")
        .await;
    assert_eq!(browser.eval(BARE_TABLES).await, json!([]));
    assert_unlabelled_controls_are_none(&browser).await;

    // An empty timeline, an empty subject page and an empty catalogue say so too.
    browser
        .eval("location.hash = 'view=timeline&subject=quiet'; true")
        .await;
    browser
        .wait_for("!document.getElementById('entries-empty')?.hidden")
        .await;
    // The payload box is a sized, labelled textarea with a hint; the JSON switch a
    // labelled checkbox.
    let payload = browser
        .eval(
            "(() => { const t = document.getElementById('post-payload'); const c = document.getElementById('post-json');
               return {rows: t.rows, placeholder: t.placeholder !== '', wide: t.getBoundingClientRect().width >= 300,
                       label: t.labels[0].textContent.startsWith('Post as quiet'), check: c.type, checkLabel: c.labels[0].textContent}; })()",
        )
        .await;
    assert_eq!(
        payload,
        json!({"rows": 3, "placeholder": true, "wide": true, "label": true,
               "check": "checkbox", "checkLabel": "The payload is JSON"})
    );
    browser
        .eval("location.hash = 'view=subject&subject=quiet'; true")
        .await;
    let said = browser
        .wait_for("document.querySelectorAll('#followers .empty, #following .empty, #events .empty').length === 3 && [...document.querySelectorAll('#view .empty')].map(e => e.textContent)")
        .await;
    assert_eq!(
        said,
        json!(["quiet has posted nothing yet.", "none yet", "none yet"])
    );
    browser.eval("location.hash = 'view=series'; true").await;
    let said = browser
        .wait_for("document.querySelector('#series-found .empty')?.textContent")
        .await;
    assert!(
        said.as_str()
            .is_some_and(|text| text.starts_with("No series yet")),
        "{said}"
    );
    browser.assert_clean(&app.address);
}
