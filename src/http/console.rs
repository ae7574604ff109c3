//! The web console: static pages at `/ui/`, compiled into the binary.
//!
//! The assets are plain HTML, CSS and JavaScript modules under `console/`, embedded with
//! `include_bytes!` from one table below: a dozen files need no embedding crate, the table
//! names every file the console may serve, and each entry carries its content type. The
//! routes are open (the page holds no data; every API call it makes carries the token the
//! user typed in) and stay out of the OpenAPI document, like `/openapi.json` itself.
//! `/favicon.ico` answers the console's icon, so a browser asking for it on its own finds
//! one instead of a 404 in the log.

use std::sync::OnceLock;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use super::AppState;
use sha2::{Digest, Sha256};

use super::error::ApiError;

/// One embedded file: its path under `/ui/`, content type and bytes.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $type:expr) => {
        Asset {
            path: $path,
            content_type: $type,
            bytes: include_bytes!(concat!("../../console/", $path)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const SVG: &str = "image/svg+xml";

/// Every file the console serves.
static ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("console.css", CSS),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("sse.js", JS),
    asset!("ui.js", JS),
    asset!("timeline.js", JS),
    asset!("notifications.js", JS),
    asset!("series.js", JS),
    asset!("admin.js", JS),
    asset!("overview.js", JS),
    asset!("chart.js", JS),
    asset!("favicon.svg", SVG),
    asset!("vendor/uplot/uPlot.esm.js", JS),
    asset!("vendor/uplot/uPlot.min.css", CSS),
    asset!("vendor/uplot/LICENSE", "text/plain; charset=utf-8"),
];

/// Only this origin, no inline script or style, no framing, no plugins, forms post nowhere.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
    base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `/ui` and everything under it, and `/favicon.ico`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route(
            "/favicon.ico",
            get(|headers: HeaderMap| async move { serve("favicon.svg", &headers) }),
        )
        .route(
            "/ui/",
            get(|headers: HeaderMap| async move { serve("index.html", &headers) }),
        )
        .route(
            "/ui/{*path}",
            get(|Path(path): Path<String>, headers: HeaderMap| async move {
                serve(&path, &headers)
            }),
        )
}

/// The entity tag of each asset (a hash of its bytes), in the order of `ASSETS`.
fn etags() -> &'static [HeaderValue] {
    static ETAGS: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    ETAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|asset| {
                let digest = Sha256::digest(asset.bytes);
                let hex: String = digest[..12]
                    .iter()
                    .map(|byte| format!("{byte:02x}"))
                    .collect();
                HeaderValue::from_str(&format!("\"{hex}\"")).expect("hex is a header value")
            })
            .collect()
    })
}

fn serve(path: &str, request: &HeaderMap) -> Response {
    let Some(index) = ASSETS.iter().position(|asset| asset.path == path) else {
        return ApiError::NotFound("no such console file".into()).into_response();
    };
    let asset = &ASSETS[index];
    let etag = etags()[index].clone();
    // Revalidated every time (a 304 when unchanged), so a new binary's page never runs with
    // an old binary's modules.
    let unchanged = request
        .get(header::IF_NONE_MATCH)
        .is_some_and(|tags| tags.as_bytes() == etag.as_bytes());
    let mut response = if unchanged {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (StatusCode::OK, asset.bytes).into_response()
    };
    let headers = response.headers_mut();
    headers.insert(header::ETAG, etag);
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}
