//! The InfluxDB v2 write API, `POST /api/v2/write`: line protocol, so Telegraf's
//! `outputs.influxdb_v2` and the InfluxDB client libraries write points unchanged.
//!
//! A request is all or nothing, like `POST /v1/series:batch`: every line is parsed and
//! checked before anything is written. The mapping of lines to series is
//! [`crate::series::line_protocol`]'s. Errors answer InfluxDB's shape,
//! `{"code":"invalid","message":"..."}`, which its clients and Telegraf read: the route's
//! own errors and those of the shared middleware (401, 403, 413, 429...) alike.

use std::io::Read as _;

use axum::Extension;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::Query;
use crate::auth::Principal;
use crate::keys::Ticks;
use crate::metrics::PointSource;
use crate::series::line_protocol::{self, LineError, LineSeries, Precision};
use crate::series::{MAX_POINTS_PER_BATCH, MAX_SERIES_PER_BATCH, NewPoints, SeriesName};

/// Largest body, compressed and (for gzip) again after decompression: as large as a series
/// batch, about 200,000 points of 80 bytes.
pub const MAX_LINE_PROTOCOL_BYTES: usize = 16 * 1024 * 1024;
/// Longest quote of a bad line in an error message, in bytes.
const MAX_QUOTED_LINE_BYTES: usize = 100;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default().routes(routes!(write_line_protocol))
}

/// A timestamp's unit, as InfluxDB names it.
#[derive(Clone, Copy, Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum WritePrecision {
    #[default]
    Ns,
    Us,
    Ms,
    S,
}

impl From<WritePrecision> for Precision {
    fn from(precision: WritePrecision) -> Self {
        match precision {
            WritePrecision::Ns => Precision::Nanoseconds,
            WritePrecision::Us => Precision::Microseconds,
            WritePrecision::Ms => Precision::Milliseconds,
            WritePrecision::S => Precision::Seconds,
        }
    }
}

/// InfluxDB's parameters. Others (`consistency`, ...) are ignored, as clients send them.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct WriteParams {
    /// Required, as InfluxDB requires it, and otherwise unused: fanline has one namespace of
    /// series, so the names do not depend on the bucket.
    #[param(min_length = 1)]
    bucket: String,
    /// Accepted and unused.
    #[expect(
        dead_code,
        reason = "InfluxDB's clients send it; fanline has no organisations"
    )]
    org: Option<String>,
    /// Accepted and unused.
    #[expect(
        dead_code,
        reason = "InfluxDB's clients send it; fanline has no organisations"
    )]
    #[serde(rename = "orgID")]
    #[param(rename = "orgID")]
    org_id: Option<String>,
    /// The unit of the lines' timestamps; `ns` when absent. Nanoseconds are rounded down to
    /// fanline's 100 ns.
    #[param(value_type = Option<WritePrecision>)]
    precision: Option<WritePrecision>,
}

/// InfluxDB's error body.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct InfluxErrorBody {
    /// InfluxDB's code: `invalid`, `unauthorized`, `forbidden`, `request too large`,
    /// `too many requests`, `unavailable`, `conflict`, `internal error`...
    pub(crate) code: String,
    /// For people; a bad line's message quotes it and gives its number:
    /// `unable to parse 'cpu usage=': line 3: missing field value of field "usage"`.
    pub(crate) message: String,
}

/// Writes line protocol: one series per measurement, tag set and field (docs/api.md, "Line
/// protocol"); all lines or none. The admin token writes any series; a device token only
/// its own (a line mapping to another is a 403 naming it). `Authorization: Token <token>`
/// works as `Bearer` does. A gzip body needs `Content-Encoding: gzip`; its size limit
/// applies after decompression too.
#[utoipa::path(
    post,
    path = "/api/v2/write",
    tag = "series",
    params(WriteParams),
    request_body(
        content = String,
        content_type = "text/plain",
        description = "Line protocol: `measurement[,tag=value...] field=value[,field=value...] [timestamp]`, a line each"
    ),
    responses(
        (status = NO_CONTENT, description = "Every line written"),
        (status = BAD_REQUEST, description = "A line that is not line protocol fanline takes (a string field, a name over the series rules...), named by its number; no lines; a missing `bucket`; a bad `precision`; a body that is not gzip under `Content-Encoding: gzip`, or not UTF-8 (`invalid`)", body = InfluxErrorBody),
        (status = UNAUTHORIZED, description = "No token, or an unknown or revoked one (`unauthorized`)", body = InfluxErrorBody),
        (status = FORBIDDEN, description = "A subject token, or a device token and a line of another series, named by its number (`forbidden`)", body = InfluxErrorBody),
        (status = REQUEST_TIMEOUT, description = "The body did not arrive whole in time", body = InfluxErrorBody),
        (status = PAYLOAD_TOO_LARGE, description = "Over 16 MiB, compressed or not, or over 200,000 points or 10,000 series (`request too large`): send fewer lines a request", body = InfluxErrorBody),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "A `Content-Encoding` other than gzip or identity", body = InfluxErrorBody),
        (status = TOO_MANY_REQUESTS, description = "This token is over its rate (`too many requests`)", body = InfluxErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable, or the job backlog is full; retry after `Retry-After` (`unavailable`)", body = InfluxErrorBody),
    )
)]
async fn write_line_protocol(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Query(params): Query<WriteParams>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    if params.bucket.is_empty() {
        return Err(ApiError::bad_request("invalid", "bucket must not be empty"));
    }
    let precision = Precision::from(params.precision.unwrap_or_default());
    let gzip = content_is_gzip(&headers)?;
    let now = Ticks::now();
    // Decompressing and parsing megabytes takes milliseconds: off the executor threads, and
    // no more at once than there are cores.
    let series = crate::bulk::run(move || {
        let text = if gzip { gunzip(&body)? } else { body.to_vec() };
        parse(&text, precision, now)
    })
    .await
    .map_err(|err| ApiError::Internal(format!("line protocol parsing panicked: {err}")))??;
    if let Principal::Device(own) = &principal
        && let Some(other) = series.iter().find(|one| one.name.as_str() != own)
    {
        return Err(ApiError::Forbidden(format!(
            "line {}: this token writes only series {own:?}; the line maps to {:?}",
            other.first_line,
            other.name.as_str()
        )));
    }
    let points: usize = series.iter().map(|one| one.points.len()).sum();
    if points > MAX_POINTS_PER_BATCH || series.len() > MAX_SERIES_PER_BATCH {
        return Err(ApiError::PayloadTooLarge(format!(
            "{points} points in {} series: a write holds at most {MAX_POINTS_PER_BATCH} points \
             and {MAX_SERIES_PER_BATCH} series",
            series.len()
        )));
    }
    // Tags first: if the points then fail, the request fails and a retry writes them; the
    // tags alone are harmless. Tags set otherwise (PUT .../tags) are kept.
    let tags: Vec<(&SeriesName, &[String])> = series
        .iter()
        .map(|one| (&one.name, &one.tags[..]))
        .collect();
    state.series.add_tags_to_many(&tags).await?;
    let batch = series
        .into_iter()
        .map(|one| NewPoints {
            series: one.name,
            points: one.points,
        })
        .collect();
    let written = state.series.write(batch).await?;
    state.metrics.intake.count_points(
        PointSource::LineProtocol,
        u64::try_from(written).unwrap_or(u64::MAX),
    );
    Ok(StatusCode::NO_CONTENT)
}

/// Whether the body is gzip; identity (or no header) is plain text.
fn content_is_gzip(headers: &HeaderMap) -> Result<bool, ApiError> {
    let Some(encoding) = headers.get(header::CONTENT_ENCODING) else {
        return Ok(false);
    };
    match encoding.to_str().map(str::trim) {
        Ok(value) if value.eq_ignore_ascii_case("gzip") => Ok(true),
        Ok(value) if value.eq_ignore_ascii_case("identity") || value.is_empty() => Ok(false),
        _ => Err(ApiError::UnsupportedMediaType(
            "Content-Encoding must be gzip or identity".into(),
        )),
    }
}

/// The decompressed body, never more than [`MAX_LINE_PROTOCOL_BYTES`] of it: a small body
/// that inflates past the limit (a gzip bomb) is a 413 after reading one byte too many.
fn gunzip(body: &[u8]) -> Result<Vec<u8>, ApiError> {
    let mut text = Vec::new();
    flate2::read::MultiGzDecoder::new(body)
        .take(MAX_LINE_PROTOCOL_BYTES as u64 + 1)
        .read_to_end(&mut text)
        .map_err(|err| {
            ApiError::bad_request("invalid", format!("the gzip body is not gzip: {err}"))
        })?;
    if text.len() > MAX_LINE_PROTOCOL_BYTES {
        return Err(ApiError::PayloadTooLarge(format!(
            "the body decompresses to more than the limit of {MAX_LINE_PROTOCOL_BYTES} bytes"
        )));
    }
    Ok(text)
}

/// The series of `text`, or a 400 quoting the first bad line and its number.
fn parse(text: &[u8], precision: Precision, now: Ticks) -> Result<Vec<LineSeries>, ApiError> {
    let text = std::str::from_utf8(text).map_err(|err| {
        let line = text[..err.valid_up_to()]
            .iter()
            .filter(|byte| **byte == b'\n')
            .count()
            + 1;
        ApiError::bad_request("invalid", format!("line {line}: the body is not UTF-8"))
    })?;
    let series = line_protocol::parse(text, precision, now).map_err(|err| {
        let LineError { line, message } = err;
        let quoted = quote(text.split('\n').nth(line - 1).unwrap_or_default());
        ApiError::bad_request(
            "invalid",
            format!("unable to parse '{quoted}': line {line}: {message}"),
        )
    })?;
    if series.is_empty() {
        return Err(ApiError::bad_request("invalid", "writing requires points"));
    }
    Ok(series)
}

/// `line` without its `\r`, shortened to about [`MAX_QUOTED_LINE_BYTES`].
fn quote(line: &str) -> String {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.len() <= MAX_QUOTED_LINE_BYTES {
        return line.to_owned();
    }
    let mut end = MAX_QUOTED_LINE_BYTES;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &line[..end])
}

/// InfluxDB's code for an answer's status.
fn influx_code(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST | StatusCode::REQUEST_TIMEOUT => "invalid",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not found",
        StatusCode::METHOD_NOT_ALLOWED => "method not allowed",
        StatusCode::CONFLICT => "conflict",
        StatusCode::PAYLOAD_TOO_LARGE => "request too large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported media type",
        StatusCode::UNPROCESSABLE_ENTITY => "unprocessable entity",
        StatusCode::TOO_MANY_REQUESTS => "too many requests",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        _ => "internal error",
    }
}

/// Middleware around the route and the shared middleware it passes (token, body limit):
/// rewrites fanline's error body `{"error":{"code","message"}}` into InfluxDB's
/// `{"code","message"}` with InfluxDB's code, keeping the status and headers, and names the
/// code in `X-Platform-Error-Code` as InfluxDB does.
pub(super) async fn influx_errors(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    if !status.is_client_error() && !status.is_server_error() {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // Error bodies are small; anything unreadable keeps the status' reason as message.
    let message = http_body_util::Limited::new(body, 64 * 1024)
        .collect()
        .await
        .ok()
        .and_then(|collected| {
            serde_json::from_slice::<serde_json::Value>(&collected.to_bytes())
                .ok()?
                .pointer("/error/message")?
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_owned());
    let code = influx_code(status);
    let body = InfluxErrorBody {
        code: code.to_owned(),
        message,
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    parts
        .headers
        .insert("x-platform-error-code", HeaderValue::from_static(code));
    let json = serde_json::to_vec(&body).unwrap_or_default();
    (parts, Body::from(json)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn a_gzip_body_inflating_past_the_limit_stops_one_byte_over_it() {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![b'0'; 1024 * 1024];
        for _ in 0..20 {
            encoder.write_all(&zeros).expect("compressed");
        }
        let bomb = encoder.finish().expect("compressed");
        assert!(bomb.len() < 100 * 1024, "{}", bomb.len());
        let err = gunzip(&bomb).expect_err("too large");
        assert_eq!(err.status_code(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(
            gunzip(b"not gzip").expect_err("invalid").status_code(),
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn a_bad_line_is_quoted_shortened_with_its_number() {
        let long = format!("m v=1\nm{} v=", "é".repeat(80));
        let err = parse(long.as_bytes(), Precision::Nanoseconds, Ticks::MIN).expect_err("bad");
        let message = err.body().to_string();
        assert!(
            message.starts_with("invalid: unable to parse 'mé"),
            "{message}"
        );
        assert!(
            message.contains("...': line 2: missing field value"),
            "{message}"
        );
        let err = parse(b"m v=1\n\xff", Precision::Nanoseconds, Ticks::MIN).expect_err("bad");
        assert!(
            err.body()
                .to_string()
                .contains("line 2: the body is not UTF-8")
        );
        let err = parse(b"# nothing\n", Precision::Nanoseconds, Ticks::MIN).expect_err("empty");
        assert_eq!(err.body().to_string(), "invalid: writing requires points");
    }
}
