//! The OpenAPI document at `/openapi.json`, and schemathesis run against a live server with
//! it: every route, zero 5xx answers, every answer as the document says.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{Api, Backend, TEST_ADMIN_TOKEN, TestStore, spawn_app, spawn_app_with};

on_both_backends!(
    the_document_describes_every_route_and_its_security,
    schemathesis_finds_no_server_errors_or_schema_violations,
);

/// Every operation of the API, as `METHOD template`.
const OPERATIONS: [&str; 27] = [
    "GET /healthz",
    "GET /metrics",
    "GET /openapi.json",
    "GET /v1/admin/fanout/{subject}/dead-letters",
    "POST /v1/admin/fanout/{subject}/{event_id}/requeue",
    "POST /v1/admin/series/{series}/tokens",
    "POST /v1/admin/subjects/{subject}/tokens",
    "GET /v1/admin/tokens",
    "DELETE /v1/admin/tokens/{token_id}",
    "GET /v1/series",
    "DELETE /v1/series/{series}",
    "DELETE /v1/series/{series}/points",
    "GET /v1/series/{series}/points",
    "POST /v1/series/{series}/points",
    "GET /v1/series/{series}/tags",
    "PUT /v1/series/{series}/tags",
    "GET /v1/series:aligned",
    "POST /v1/series:batch",
    "GET /v1/subjects/{subject}/events",
    "POST /v1/subjects/{subject}/events",
    "DELETE /v1/subjects/{subject}/events/{event_id}",
    "GET /v1/subjects/{subject}/events/{event_id}/fanout",
    "GET /v1/subjects/{subject}/followers",
    "GET /v1/subjects/{subject}/following",
    "DELETE /v1/subjects/{subject}/following/{target}",
    "PUT /v1/subjects/{subject}/following/{target}",
    "GET /v1/subjects/{subject}/timeline",
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

/// The schemathesis that `scripts/test` installs, or the one `FANLINE_SCHEMATHESIS` names.
fn schemathesis() -> PathBuf {
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

/// Runs schemathesis over every operation as the admin, with every check but
/// `positive_data_acceptance`: a schema cannot say which cursors the server issued, that a
/// subject cannot follow itself, or how many bytes a name of multi-byte characters takes, so
/// some schema-valid requests are rightly refused with a 400.
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
        .args([
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
        ])
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
    // leaves out), and many cases generated.
    assert!(
        stdout.contains(&format!("Tested: {}", OPERATIONS.len() - 1)),
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
