//! The OpenAPI 3.1 document of the whole API, served at `GET /openapi.json`.
//!
//! Every handler describes itself with `#[utoipa::path]` and is mounted through
//! `utoipa_axum::routes!`, so a route cannot exist without its description. What all routes
//! share is added here, once: the bearer scheme, which routes are open, and the error answers
//! that the middleware and extractors can give on any route.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use utoipa::OpenApi;
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::header::Header;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::response::{Response as ResponseDoc, ResponseBuilder};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{OpenApi as Document, Ref, RefOr};

use super::AppState;
use super::error::ErrorBody;
use super::influx::WritePrecision;
use super::page::NoExtra;
use super::schema::{After, Aggregation, Cursor, RowKey, SeriesNames, Step, Tag};

/// The name of the security scheme in the document.
const BEARER: &str = "bearer";

/// Routes anyone may call: probes and this document.
const OPEN_ROUTES: [&str; 3] = ["/healthz", "/metrics", "/openapi.json"];

/// The route whose reads `FANLINE_PUBLIC_EVENTS` opens to anyone.
const PUBLIC_EVENTS_ROUTE: &str = "/v1/subjects/{subject}/events";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "fanline",
        description = "Timeline fan-out and sensor time series. Every `/v1` route needs \
            `Authorization: Bearer <token>`: the admin token, a subject token or a device token."
    ),
    paths(get_document),
    security(("bearer" = [])),
    // `NoExtra` is the default of a generic parameter, which the routes do not register;
    // the routes do not register the schemas their parameters refer to either.
    components(schemas(
        ErrorBody,
        NoExtra,
        After,
        Aggregation,
        Cursor,
        RowKey,
        SeriesNames,
        Step,
        Tag,
        WritePrecision
    )),
    tags(
        (name = "events", description = "Subjects' event logs, their fan-out and deletes"),
        (name = "following", description = "Follow edges"),
        (name = "timeline", description = "Timelines, newest first, catch-up reads, live streams and read markers"),
        (name = "notifications", description = "Notification feeds: events addressed to a subject, grouped, with seen and read, and live"),
        (name = "series", description = "Sensor readings as time series"),
        (name = "admin", description = "Tokens and fan-out repair; the admin token only"),
        (name = "tokens", description = "Who the caller's token acts as; any valid token"),
        (name = "operations", description = "Health, metrics and this document; no token"),
    )
)]
struct ApiDoc;

/// The document before routes add their paths to it.
pub fn base() -> Document {
    ApiDoc::openapi()
}

/// Completes the document once every route has added its path: the bearer scheme, open
/// routes, and the shared error responses, each referenced by the operations that can give
/// it. `public_events` says whether `GET …/events` works without a token.
pub fn finish(document: &mut Document, public_events: bool) {
    let components = document.components.get_or_insert_with(Default::default);
    components.security_schemes.insert(
        BEARER.to_owned(),
        RefOr::T(SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "The admin token (FANLINE_ADMIN_TOKEN), or a subject or device token \
                     issued under /v1/admin",
                ))
                .build(),
        )),
    );
    for shared in Shared::ALL {
        components
            .responses
            .insert(shared.name().to_owned(), RefOr::T(shared.response()));
    }
    for (route, item) in &mut document.paths.paths {
        let open = OPEN_ROUTES.contains(&route.as_str());
        for (is_get, operation) in operations(item) {
            if open {
                operation.security = Some(Vec::new());
                continue;
            }
            if public_events && is_get && route == PUBLIC_EVENTS_ROUTE {
                operation.security = Some(vec![
                    SecurityRequirement::new(BEARER, Vec::<String>::new()),
                    SecurityRequirement::default(),
                ]);
            }
            let mut shared = vec![
                Shared::BadRequest,
                Shared::Unauthorized,
                Shared::Forbidden,
                Shared::RateLimited,
                Shared::Unavailable,
            ];
            if operation.request_body.is_some() {
                shared.extend([
                    Shared::RequestTimeout,
                    Shared::PayloadTooLarge,
                    Shared::UnsupportedMediaType,
                    Shared::Unprocessable,
                ]);
            }
            for answer in shared {
                operation
                    .responses
                    .responses
                    .entry(answer.status().to_owned())
                    .or_insert_with(|| RefOr::Ref(Ref::from_response_name(answer.name())));
            }
        }
    }
}

/// The operations of a path item, each with whether it is a GET.
fn operations(item: &mut PathItem) -> impl Iterator<Item = (bool, &mut Operation)> {
    [
        (true, item.get.as_mut()),
        (false, item.put.as_mut()),
        (false, item.post.as_mut()),
        (false, item.delete.as_mut()),
        (false, item.patch.as_mut()),
    ]
    .into_iter()
    .filter_map(|(is_get, operation)| Some((is_get, operation?)))
}

/// The error answers any route can give, whatever its handler does.
#[derive(Clone, Copy)]
enum Shared {
    BadRequest,
    Unauthorized,
    Forbidden,
    RequestTimeout,
    PayloadTooLarge,
    UnsupportedMediaType,
    Unprocessable,
    RateLimited,
    Unavailable,
}

impl Shared {
    const ALL: [Shared; 9] = [
        Shared::BadRequest,
        Shared::Unauthorized,
        Shared::Forbidden,
        Shared::RequestTimeout,
        Shared::PayloadTooLarge,
        Shared::UnsupportedMediaType,
        Shared::Unprocessable,
        Shared::RateLimited,
        Shared::Unavailable,
    ];

    fn name(self) -> &'static str {
        match self {
            Shared::BadRequest => "BadRequest",
            Shared::Unauthorized => "Unauthorized",
            Shared::Forbidden => "Forbidden",
            Shared::RequestTimeout => "RequestTimeout",
            Shared::PayloadTooLarge => "PayloadTooLarge",
            Shared::UnsupportedMediaType => "UnsupportedMediaType",
            Shared::Unprocessable => "Unprocessable",
            Shared::RateLimited => "RateLimited",
            Shared::Unavailable => "Unavailable",
        }
    }

    fn status(self) -> &'static str {
        match self {
            Shared::BadRequest => "400",
            Shared::Unauthorized => "401",
            Shared::Forbidden => "403",
            Shared::RequestTimeout => "408",
            Shared::PayloadTooLarge => "413",
            Shared::UnsupportedMediaType => "415",
            Shared::Unprocessable => "422",
            Shared::RateLimited => "429",
            Shared::Unavailable => "503",
        }
    }

    fn response(self) -> ResponseDoc {
        let description = match self {
            Shared::BadRequest => {
                "A malformed id, name, parameter or cursor (a forged or edited cursor too)"
            }
            Shared::Unauthorized => "No token, or an unknown or revoked one",
            Shared::Forbidden => "A valid token acting outside its rights",
            Shared::RequestTimeout => {
                "The body did not arrive whole within FANLINE_BODY_TIMEOUT_MS \
                 (`request_timeout`); the connection is closed"
            }
            Shared::PayloadTooLarge => "The body, or a payload in it, is over its limit",
            Shared::UnsupportedMediaType => "The body is not `application/json`",
            Shared::Unprocessable => "Well-formed JSON of the wrong shape",
            Shared::RateLimited => "This token is over its rate (FANLINE_RATE_LIMIT)",
            Shared::Unavailable => {
                "The store is unavailable (`unavailable`), or a post or a series write meets a \
                 full job backlog (`backlog_full`, nothing written); retry later"
            }
        };
        let builder = ResponseBuilder::new().description(description).content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        );
        match self {
            Shared::Unauthorized => builder.header(
                "WWW-Authenticate",
                Header::new(ObjectBuilder::new().schema_type(Type::String)),
            ),
            Shared::RateLimited | Shared::Unavailable => builder.header(
                "Retry-After",
                Header::new(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(1)),
                ),
            ),
            _ => builder,
        }
        .build()
    }
}

/// `GET /openapi.json`, serving `document` as rendered once here.
pub fn router(document: &Document) -> Router<AppState> {
    // Plain data always serialises; a failure would be a bug in utoipa, found at start-up.
    let json: Arc<str> = document
        .to_json()
        .expect("the OpenAPI document serialises")
        .into();
    Router::new()
        .route("/openapi.json", get(get_document))
        .with_state(json)
}

/// This document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    responses((status = OK, description = "The OpenAPI document of this API", body = Object))
)]
async fn get_document(State(json): State<Arc<str>>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        json.to_string(),
    )
        .into_response()
}
