//! The OpenAPI document at `/openapi.json`, and schemathesis run against a live server with
//! it: every route, zero 5xx answers, every answer as the document says.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    Api, Backend, TEST_ADMIN_TOKEN, TestStore, segment, spawn_app, spawn_app_with,
};

on_every_backend!(
    the_document_describes_every_route_and_its_security,
    the_document_admits_exactly_what_the_server_accepts,
    schemathesis_finds_no_server_errors_or_schema_violations,
);

/// Every operation of the API, as `METHOD template`.
const OPERATIONS: [&str; 43] = [
    "POST /api/v2/write",
    "GET /healthz",
    "GET /metrics",
    "GET /openapi.json",
    "GET /v1/admin/fanout/{subject}/dead-letters",
    "POST /v1/admin/fanout/{subject}/{event_id}/requeue",
    "POST /v1/admin/series/{series}/tokens",
    "POST /v1/admin/subjects/{subject}/tokens",
    "GET /v1/admin/overview",
    "GET /v1/admin/tokens",
    "DELETE /v1/admin/tokens/{token_id}",
    "GET /v1/series",
    "DELETE /v1/series/latest",
    "GET /v1/series/latest",
    "DELETE /v1/series/{series}",
    "DELETE /v1/series/{series}/points",
    "GET /v1/series/{series}/latest",
    "GET /v1/series/{series}/points",
    "POST /v1/series/{series}/points",
    "GET /v1/series/{series}/retention",
    "PUT /v1/series/{series}/retention",
    "GET /v1/series/{series}/stream",
    "GET /v1/series/{series}/tags",
    "PUT /v1/series/{series}/tags",
    "GET /v1/series:aligned",
    "POST /v1/series:batch",
    "GET /v1/subjects/{subject}/events",
    "POST /v1/subjects/{subject}/events",
    "DELETE /v1/subjects/{subject}/events/{event_id}",
    "PATCH /v1/subjects/{subject}/events/{event_id}",
    "GET /v1/subjects/{subject}/events/{event_id}/fanout",
    "GET /v1/subjects/{subject}/followers",
    "GET /v1/subjects/{subject}/following",
    "DELETE /v1/subjects/{subject}/following/{target}",
    "PUT /v1/subjects/{subject}/following/{target}",
    "GET /v1/subjects/{subject}/marker",
    "PUT /v1/subjects/{subject}/marker",
    "GET /v1/subjects/{subject}/notifications",
    "PUT /v1/subjects/{subject}/notifications/marker",
    "GET /v1/subjects/{subject}/notifications/stream",
    "GET /v1/subjects/{subject}/timeline",
    "GET /v1/subjects/{subject}/timeline/stream",
    "GET /v1/whoami",
];

/// The document, fetched without a token: it is public, like the probes.
async fn document(address: &str) -> Value {
    let reply = Api::with_token(address, None).get("/openapi.json").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body
}

async fn the_document_describes_every_route_and_its_security(backend: Backend) {
    let app = spawn_app(backend).await;
    let doc = document(&app.address).await;
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "{doc}"
    );

    let mut described = BTreeSet::new();
    for (template, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("path item") {
            described.insert(format!("{} {template}", method.to_uppercase()));
            assert!(
                operation["responses"]
                    .as_object()
                    .is_some_and(|responses| responses.keys().any(|code| code.starts_with('2'))),
                "{method} {template} documents a success: {operation}"
            );
        }
    }
    let expected: BTreeSet<String> = OPERATIONS.iter().map(|op| op.to_string()).collect();
    assert_eq!(described, expected);
    let mut dangling = Vec::new();
    check_references(&doc, &doc, &mut dangling);
    assert!(dangling.is_empty(), "references to nothing: {dangling:?}");

    // Every listing answers the one envelope: items and next_cursor (always present).
    let listings = [
        "/v1/admin/fanout/{subject}/dead-letters",
        "/v1/admin/tokens",
        "/v1/series",
        "/v1/series/{series}/points",
        "/v1/series:aligned",
        "/v1/subjects/{subject}/events",
        "/v1/subjects/{subject}/followers",
        "/v1/subjects/{subject}/following",
        "/v1/subjects/{subject}/timeline",
    ];
    for listing in listings {
        let schema = &doc["paths"][listing]["get"]["responses"]["200"]["content"]["application/json"]
            ["schema"]["$ref"];
        let name = schema
            .as_str()
            .and_then(|reference| reference.strip_prefix("#/components/schemas/"))
            .unwrap_or_else(|| panic!("{listing} answers a named schema: {schema}"));
        assert!(name.starts_with("PageResponse_"), "{listing}: {name}");
        let envelope = doc["components"]["schemas"][name]["allOf"]
            .as_array()
            .and_then(|parts| {
                parts
                    .iter()
                    .find(|part| part["properties"]["items"].is_object())
            })
            .unwrap_or_else(|| panic!("{listing}: {name} holds items"));
        assert_eq!(
            envelope["required"],
            serde_json::json!(["items", "next_cursor"]),
            "{listing}"
        );
    }

    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"],
        serde_json::json!({
            "type": "http",
            "scheme": "bearer",
            "description": doc["components"]["securitySchemes"]["bearer"]["description"],
        })
    );
    assert_eq!(doc["security"], serde_json::json!([{"bearer": []}]));
    // The probes and the document need no token; every API route inherits the bearer and
    // documents 401 (with the challenge) and 403.
    for open in ["/healthz", "/metrics", "/openapi.json"] {
        assert_eq!(doc["paths"][open]["get"]["security"], serde_json::json!([]));
    }
    let events = &doc["paths"]["/v1/subjects/{subject}/events"];
    assert!(events["get"]["security"].is_null(), "{events}");
    for code in ["401", "403", "429"] {
        assert!(
            events["get"]["responses"][code]["$ref"].is_string(),
            "{events}"
        );
    }
    let unauthorized = &doc["components"]["responses"]["Unauthorized"];
    assert!(
        unauthorized["headers"]["WWW-Authenticate"].is_object(),
        "{unauthorized}"
    );
    // Bodies are bounded and typed: 413 and 415 where there is a body, never where not.
    assert!(events["post"]["responses"]["413"].is_object(), "{events}");
    assert!(events["post"]["responses"]["415"].is_object(), "{events}");
    assert!(events["get"]["responses"]["415"].is_null(), "{events}");

    // With public event logs, their reads say a token is optional.
    let public = spawn_app_with(TestStore::new(backend).await, |config| {
        config.public_events = true;
    })
    .await;
    let doc = document(&public.address).await;
    assert_eq!(
        doc["paths"]["/v1/subjects/{subject}/events"]["get"]["security"],
        serde_json::json!([{"bearer": []}, {}])
    );
}

/// The rules the server enforces on parameters and bodies are in the document: for sample
/// values, among them each looseness the document once had (an empty cursor, `step=0`, an
/// empty `names`, a control character in `kind`, a bad subject in the tokens filter), the
/// document admits a value exactly when the server accepts it. The rules between parameters,
/// which no schema can state (`from` with `to` on a delete, `cursor` or `after`, following
/// oneself), are required parameters or stated in the text with their 400.
async fn the_document_admits_exactly_what_the_server_accepts(backend: Backend) {
    let app = spawn_app(backend).await;
    let doc = document(&app.address).await;

    // Every listing's cursor: never empty, of the alphabet the server issues.
    for (template, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("path item") {
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                if parameter["name"] == "cursor" {
                    let schema = resolved(&doc, &parameter["schema"]);
                    assert!(
                        schema["minLength"].as_u64().is_some_and(|min| min >= 1)
                            && schema["pattern"].is_string(),
                        "{method} {template}: {schema}"
                    );
                }
            }
        }
    }

    for n in 0..2 {
        let posted = app.post_event("alice", json!({"payload": n})).await;
        assert_eq!(posted.status, StatusCode::CREATED, "{posted:?}");
    }
    let first = app.get("/v1/subjects/alice/events?limit=1").await;
    let cursor = first.body["next_cursor"]
        .as_str()
        .expect("a cursor")
        .to_owned();
    let points = json!({"points": [{"at": "2026-01-01T00:00:00Z", "value": 1.0}]});
    let written = app.post_json("/v1/series/s/points", &points).await;
    assert_eq!(written.status, StatusCode::CREATED, "{written:?}");

    // (operation, parameter, value, the request that carries it).
    let events = "/v1/subjects/{subject}/events";
    let points = "/v1/series/{series}/points";
    let aligned = "/v1/series:aligned";
    let tokens = "/v1/admin/tokens";
    let mut probes: Vec<(&str, &str, String, String)> = vec![
        (
            events,
            "cursor",
            String::new(),
            "/v1/subjects/alice/events?cursor=".into(),
        ),
        (
            events,
            "cursor",
            cursor.clone(),
            format!("/v1/subjects/alice/events?cursor={cursor}"),
        ),
    ];
    for step in [
        "", "0", "0s", "50ns", "1h30", "100ns", "250ms", "60s", "5m", "1d",
    ] {
        let path = format!("/v1/series/s/points?step={step}");
        probes.push((points, "step", step.into(), path));
    }
    for agg in ["", "median", "max", "count"] {
        let path = format!("/v1/series/s/points?step=1h&agg={agg}");
        probes.push((points, "agg", agg.into(), path));
    }
    for names in ["", "s,,s", "s/..,s", ",s", "s", "s,t/u,s"] {
        let path = format!("{aligned}?step=1h&names={}", segment(names));
        probes.push((aligned, "names", names.into(), path));
    }
    for subject in ["\u{0}", "", "a/../b", "alice", "dev-1/t"] {
        let path = format!("{tokens}?subject={}", segment(subject));
        probes.push((tokens, "subject", subject.into(), path));
    }
    let mut checks = Vec::new();
    let mut accepted = Vec::new();
    for (template, name, value, path) in &probes {
        let parameter = parameter_named(&doc["paths"][*template]["get"], name);
        checks.push((resolved(&doc, &parameter["schema"]), json!(value)));
        accepted.push(app.get(path).await.status.is_success());
    }
    // A body field: the event kind.
    let kind = resolved(
        &doc,
        &doc["components"]["schemas"]["PostEventRequest"]["properties"]["kind"],
    );
    for value in ["post", "caf\u{e9}", "a\u{7}b", "\u{85}", "tab\there"] {
        checks.push((kind.clone(), json!(value)));
        let posted = app
            .post_event("alice", json!({"kind": value, "payload": null}))
            .await;
        accepted.push(posted.status.is_success());
        probes.push((events, "kind", value.into(), "POST body".into()));
    }
    let admitted = admitted(&checks).await;
    let disagreements: Vec<String> = probes
        .iter()
        .zip(admitted.iter().zip(&accepted))
        .filter(|(_, (admitted, accepted))| admitted != accepted)
        .map(|((template, name, value, _), (admitted, accepted))| {
            format!(
                "{template} {name}={value:?}: document admits {admitted}, server accepts {accepted}"
            )
        })
        .collect();
    assert!(disagreements.is_empty(), "{disagreements:#?}");

    // A range delete needs both ends.
    let delete = &doc["paths"][points]["delete"];
    for end in ["from", "to"] {
        let parameter = parameter_named(delete, end);
        assert_eq!(parameter["required"], true, "{parameter}");
    }
    assert_documents_400(delete, "`from` or `to` missing");
    let only_to = app
        .send(
            app.client
                .delete(app.url("/v1/series/s/points?to=2027-01-01T00:00:00Z")),
        )
        .await;
    assert_eq!(
        only_to.body["error"]["code"], "invalid_range",
        "{only_to:?}"
    );

    // A timeline read pages with `cursor` or catches up with `after`, not both.
    let timeline = &doc["paths"]["/v1/subjects/{subject}/timeline"]["get"];
    for (name, other) in [("cursor", "`after`"), ("after", "`cursor`")] {
        let parameter = parameter_named(timeline, name);
        let description = parameter["description"].as_str().unwrap_or_default();
        let words: Vec<&str> = description.split_whitespace().collect();
        assert!(
            words.join(" ").contains(&format!("Not with {other}")),
            "{parameter}"
        );
    }
    assert_documents_400(timeline, "`invalid_parameters`");
    let both = app
        .get(&format!(
            "/v1/subjects/alice/timeline?cursor={cursor}&after=2026-01-01T00:00:00Z"
        ))
        .await;
    assert_eq!(both.body["error"]["code"], "invalid_parameters", "{both:?}");

    // No subject follows itself.
    let follow = &doc["paths"]["/v1/subjects/{subject}/following/{target}"]["put"];
    assert_documents_400(follow, "`cannot_follow_self`");
    let itself = app
        .send(
            app.client
                .put(app.url("/v1/subjects/alice/following/alice")),
        )
        .await;
    assert_eq!(
        itself.body["error"]["code"], "cannot_follow_self",
        "{itself:?}"
    );
}

/// The parameter `name` of `operation`.
fn parameter_named<'a>(operation: &'a Value, name: &str) -> &'a Value {
    operation["parameters"]
        .as_array()
        .and_then(|all| all.iter().find(|parameter| parameter["name"] == name))
        .unwrap_or_else(|| panic!("no parameter {name}: {operation}"))
}

/// `operation` documents a 400 of its own, whose description names `rule`.
fn assert_documents_400(operation: &Value, rule: &str) {
    let description = operation["responses"]["400"]["description"]
        .as_str()
        .unwrap_or_default();
    assert!(description.contains(rule), "{rule}: {operation}");
}

/// `value` with every `$ref` into `doc` replaced by what it points at.
fn resolved(doc: &Value, value: &Value) -> Value {
    match value {
        Value::Object(map) => match map.get("$ref").and_then(Value::as_str) {
            Some(reference) => {
                let target = reference
                    .strip_prefix('#')
                    .and_then(|pointer| doc.pointer(pointer))
                    .unwrap_or_else(|| panic!("dangling {reference}"));
                resolved(doc, target)
            }
            None => Value::Object(
                map.iter()
                    .map(|(key, child)| (key.clone(), resolved(doc, child)))
                    .collect(),
            ),
        },
        Value::Array(items) => Value::Array(items.iter().map(|item| resolved(doc, item)).collect()),
        other => other.clone(),
    }
}

/// Whether each `(schema, value)` pair validates, by the JSON Schema validator that
/// schemathesis judges requests with (`jsonschema_rs`, in its virtualenv), formats included.
async fn admitted(checks: &[(Value, Value)]) -> Vec<bool> {
    const VALIDATE: &str = "import json, sys, jsonschema_rs\n\
        checks = json.load(sys.stdin)\n\
        print(json.dumps([jsonschema_rs.validator_for(schema, validate_formats=True)\
        .is_valid(value) for schema, value in checks]))";
    let python = schemathesis().with_file_name("python3");
    let mut child = tokio::process::Command::new(&python)
        .args(["-c", VALIDATE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|err| panic!("{} starts: {err}", python.display()));
    let input = serde_json::to_vec(checks).expect("checks as JSON");
    let mut stdin = child.stdin.take().expect("stdin");
    tokio::io::AsyncWriteExt::write_all(&mut stdin, &input)
        .await
        .expect("checks written");
    drop(stdin);
    let output = child.wait_with_output().await.expect("python runs");
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).expect("a list of booleans")
}

/// Collects every `$ref` under `value` that does not point into `doc`.
fn check_references(doc: &Value, value: &Value, dangling: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(reference)) = map.get("$ref") {
                let target = reference
                    .strip_prefix('#')
                    .and_then(|pointer| doc.pointer(pointer));
                if target.is_none() {
                    dangling.push(reference.clone());
                }
            }
            for child in map.values() {
                check_references(doc, child, dangling);
            }
        }
        Value::Array(items) => {
            for child in items {
                check_references(doc, child, dangling);
            }
        }
        _ => {}
    }
}

/// The hooks that keep out of schemathesis's valid requests what no schema can describe.
fn hooks_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/api/schemathesis_hooks.py")
}

/// The schemathesis that `scripts/test` installs, or the one `FANLINE_SCHEMATHESIS` names.
pub(crate) fn schemathesis() -> PathBuf {
    let path = std::env::var_os("FANLINE_SCHEMATHESIS").map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("target/tools/schemathesis/bin/schemathesis")
        },
        PathBuf::from,
    );
    assert!(
        path.is_file(),
        "schemathesis is not installed at {}: run the tests with scripts/test, which installs \
         the version pinned in scripts/requirements-test.txt, or install it yourself \
         (python3 -m venv target/tools/schemathesis && \
         target/tools/schemathesis/bin/pip install -r scripts/requirements-test.txt)",
        path.display()
    );
    path
}

/// Runs schemathesis over every operation as the admin, with every check:
/// `positive_data_acceptance` (every request the document calls valid is accepted) and
/// `negative_data_rejection` (every request it calls invalid is refused) hold the document
/// to what the server does. The few rules no schema can state (a cursor must be one the
/// server issued, a subject cannot follow itself, limits in bytes where JSON Schema counts
/// characters, `from` not after `to`, `agg` only with `step`) are stated in the document's
/// text, and `schemathesis_hooks.py` keeps them out of the requests meant to be valid.
async fn schemathesis_finds_no_server_errors_or_schema_violations(backend: Backend) {
    let schemathesis = schemathesis();
    let app = spawn_app(backend).await;
    let seed = std::env::var("FANLINE_SCHEMATHESIS_SEED").unwrap_or_else(|_| "1".into());
    // Its working directory, for its reports and example database: not the repository.
    let scratch = tempfile::tempdir().expect("scratch dir");
    let run = tokio::process::Command::new(&schemathesis)
        .arg("run")
        .arg(format!("{}/openapi.json", app.address))
        .args([
            "--header",
            &format!("Authorization: Bearer {TEST_ADMIN_TOKEN}"),
        ])
        .args(["--checks", "all"])
        // Live streams never end, so no check could read a whole answer; tests/api/streams.rs
        // covers them.
        .args(["--exclude-path-regex", "/stream$"])
        .env("SCHEMATHESIS_HOOKS", hooks_file())
        // One worker: hypothesis parses lambdas with `ast`, which on CPython 3.11 can fail
        // spuriously ("AST constructor recursion depth mismatch") when threads do it at once.
        .args(["--max-examples", "40", "--seed", &seed, "--workers", "1"])
        .args(["--request-timeout", "20"])
        .arg("--no-color")
        .current_dir(scratch.path())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(900), run)
        .await
        .expect("schemathesis finishes within 15 minutes")
        .expect("schemathesis starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "schemathesis found failures (seed {seed}):\n{stdout}\n{stderr}"
    );
    // It really ran: every operation tested (but the document itself, which schemathesis
    // leaves out, and the three streams), and many cases generated.
    assert!(
        stdout.contains(&format!("Tested: {}", OPERATIONS.len() - 4)),
        "{stdout}"
    );
    let generated: u64 = stdout
        .lines()
        .find_map(|line| {
            let (count, rest) = line.trim().split_once(' ')?;
            rest.starts_with("generated").then(|| count.parse().ok())?
        })
        .unwrap_or(0);
    assert!(generated >= 500, "only {generated} cases:\n{stdout}");
}
