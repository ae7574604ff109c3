//! The series API: points by range, step aggregates, aligned series, deletes, tags, the
//! catalogue, retention and the latest value.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::{ApiError, ErrorBody};
use super::extract::{Json, Path, Query};
use super::page::{Names, PageResponse};
use super::schema::{Aggregation, Cursor, Name, SeriesNames, Step, Tag};
use crate::keys::Ticks;
use crate::metrics::PointSource;
use crate::series::catalogue::DEFAULT_LIST_PAGE;
use crate::series::reading::{DEFAULT_SERIES_PAGE, Range};
use crate::series::{
    Aggregate, Latest, MAX_POINTS_PER_SERIES_WRITE, NewPoints, Point, Retention, RetentionSetting,
    SeriesName,
};

/// Largest series request body: a batch of 200,000 points at about 70 bytes each.
pub const MAX_SERIES_BODY_BYTES: usize = 16 * 1024 * 1024;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(list_series))
        .routes(routes!(write_batch))
        .routes(routes!(read_aligned))
        .routes(routes!(write_points, read_points, delete_points))
        .routes(routes!(delete_series))
        .routes(routes!(read_tags, write_tags))
        .routes(routes!(read_retention, write_retention))
        .routes(routes!(read_latest))
        .routes(routes!(read_latest_listed, delete_series_named_latest))
}

pub(super) fn series_name(text: &str) -> Result<SeriesName, ApiError> {
    SeriesName::parse(text).map_err(|message| ApiError::bad_request("invalid_series", message))
}

/// An RFC 3339 time parameter, as ticks.
fn time_param(name: &str, text: Option<&str>) -> Result<Option<u64>, ApiError> {
    text.map(|text| {
        Ticks::parse_rfc3339(text)
            .map(Ticks::get)
            .map_err(|err| ApiError::bad_request("invalid_range", format!("{name}: {err}")))
    })
    .transpose()
}

fn range(from: Option<&str>, to: Option<&str>) -> Result<Range, ApiError> {
    Ok(Range::new(
        time_param("from", from)?,
        time_param("to", to)?,
    )?)
}

/// A step such as `60s`, `5m`, `1h` or `250ms`, in ticks (whole 100 ns).
fn step_param(text: &str) -> Result<u64, ApiError> {
    let invalid = || {
        ApiError::bad_request(
            "invalid_step",
            format!(
                "step must be a duration such as 60s, 5m or 1h, of at least 100ns; got {text:?}"
            ),
        )
    };
    let duration = humantime::parse_duration(text).map_err(|_| invalid())?;
    let ticks = u64::try_from(duration.as_nanos() / 100).map_err(|_| invalid())?;
    if ticks == 0 {
        return Err(invalid());
    }
    Ok(ticks)
}

fn aggregate_param(text: Option<&str>) -> Result<Aggregate, ApiError> {
    match text {
        None => Ok(Aggregate::Avg),
        Some(text) => Aggregate::parse(text).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_agg",
                "agg must be one of avg, min, max, sum, count, first, last",
            )
        }),
    }
}

/// A point as a write takes it; `fanline import --server` and the bench send these too.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PointBody {
    /// RFC 3339, 100 ns precision.
    #[schema(format = DateTime)]
    pub(crate) at: String,
    /// A finite number.
    pub(crate) value: f64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WritePointsRequest {
    /// At most 10,000.
    pub(crate) points: Vec<PointBody>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchSeries {
    #[schema(value_type = Name)]
    pub(crate) name: String,
    /// At most 10,000.
    pub(crate) points: Vec<PointBody>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WriteBatchRequest {
    /// At most 200,000 points in all.
    pub(crate) series: Vec<BatchSeries>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct WrittenResponse {
    /// Points written (a point at a time already held replaces it).
    pub(crate) written: usize,
}

/// Parses the points of one series; `where_` names it in errors.
fn points(where_: &str, bodies: Vec<PointBody>) -> Result<Vec<Point>, ApiError> {
    bodies
        .into_iter()
        .enumerate()
        .map(|(index, body)| {
            let at = Ticks::parse_rfc3339(&body.at).map_err(|err| {
                ApiError::bad_request("invalid_at", format!("{where_}points[{index}].at: {err}"))
            })?;
            if !body.value.is_finite() {
                return Err(ApiError::bad_request(
                    "invalid_value",
                    format!("{where_}points[{index}].value must be a finite number"),
                ));
            }
            Ok(Point {
                at: at.get(),
                value: body.value,
            })
        })
        .collect()
}

/// Adds points to a series; the admin token or the series' device token.
#[utoipa::path(
    post,
    path = "/v1/series/{series}/points",
    tag = "series",
    params(("series" = Name, Path, description = "The series name")),
    request_body = WritePointsRequest,
    responses(
        (status = CREATED, description = "Written", body = WrittenResponse),
    )
)]
async fn write_points(
    State(state): State<AppState>,
    Path(series): Path<String>,
    Json(request): Json<WritePointsRequest>,
) -> Result<Response, ApiError> {
    let series = series_name(&series)?;
    if request.points.len() > MAX_POINTS_PER_SERIES_WRITE {
        return Err(ApiError::bad_request(
            "too_many_points",
            format!("a write holds at most {MAX_POINTS_PER_SERIES_WRITE} points"),
        ));
    }
    let points = points("", request.points)?;
    let written = state
        .series
        .write(vec![NewPoints { series, points }])
        .await?;
    count_points(&state, written);
    Ok((StatusCode::CREATED, axum::Json(WrittenResponse { written })).into_response())
}

/// Adds points to many series in one request, all or none.
#[utoipa::path(
    post,
    path = "/v1/series:batch",
    tag = "series",
    request_body = WriteBatchRequest,
    responses(
        (status = CREATED, description = "Written", body = WrittenResponse),
    )
)]
async fn write_batch(
    State(state): State<AppState>,
    Json(request): Json<WriteBatchRequest>,
) -> Result<Response, ApiError> {
    let mut batch = Vec::with_capacity(request.series.len());
    for (index, one) in request.series.into_iter().enumerate() {
        let series = SeriesName::parse(&one.name).map_err(|message| {
            ApiError::bad_request("invalid_series", format!("series[{index}].name: {message}"))
        })?;
        let points = points(&format!("series[{index}]."), one.points)?;
        batch.push(NewPoints { series, points });
    }
    let written = state.series.write(batch).await?;
    count_points(&state, written);
    Ok((StatusCode::CREATED, axum::Json(WrittenResponse { written })).into_response())
}

fn count_points(state: &AppState, written: usize) {
    state.metrics.intake.count_points(
        PointSource::Json,
        u64::try_from(written).unwrap_or(u64::MAX),
    );
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ReadParams {
    /// Start of the range, RFC 3339, inclusive.
    #[param(format = DateTime)]
    from: Option<String>,
    /// End of the range, RFC 3339, exclusive.
    #[param(format = DateTime)]
    to: Option<String>,
    /// Points (or buckets) a page: 1 to 10,000; 1,000 when absent.
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<usize>,
    #[param(value_type = Option<Cursor>)]
    cursor: Option<String>,
    /// Bucket width, such as `60s`, `5m` or `1h`: one aggregate row per bucket.
    #[param(value_type = Option<Step>)]
    step: Option<String>,
    /// Only with `step` (a 400 `invalid_parameters` without): avg (default), min, max, sum,
    /// count, first or last.
    #[param(value_type = Option<Aggregation>)]
    agg: Option<String>,
}

/// A point, or with `step`, the aggregate of one bucket.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct PointResponse {
    /// RFC 3339; with `step`, the start of the bucket.
    #[schema(format = DateTime)]
    pub(crate) at: String,
    pub(crate) value: f64,
}

pub(super) fn point_response(at: u64, value: f64) -> PointResponse {
    PointResponse {
        at: Ticks::clamped(at).to_string(),
        value,
    }
}

/// Points in a time range, oldest first; or with `step`, one aggregate per bucket.
#[utoipa::path(
    get,
    path = "/v1/series/{series}/points",
    tag = "series",
    params(("series" = Name, Path, description = "The series name"), ReadParams),
    responses(
        (status = OK, description = "A page of points, or of buckets", body = PageResponse<PointResponse>),
        (status = BAD_REQUEST, description = "A malformed name, time, limit, cursor, `step` or `agg`; `from` after `to`; or `agg` without `step` (`invalid_parameters`)", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "A bucket's sum or average is too large for a double (`aggregate_overflow`)", body = ErrorBody),
    )
)]
async fn read_points(
    State(state): State<AppState>,
    Path(series): Path<String>,
    Query(params): Query<ReadParams>,
) -> Result<axum::Json<PageResponse<PointResponse>>, ApiError> {
    let series = series_name(&series)?;
    let range = range(params.from.as_deref(), params.to.as_deref())?;
    let limit = params.limit.unwrap_or(DEFAULT_SERIES_PAGE);
    let cursor = params.cursor.as_deref();
    let response = match params.step.as_deref() {
        None => {
            if params.agg.is_some() {
                return Err(ApiError::bad_request(
                    "invalid_parameters",
                    "agg needs a step",
                ));
            }
            let page = state.series.points(&series, range, limit, cursor).await?;
            PageResponse::new(
                page.items
                    .into_iter()
                    .map(|point| point_response(point.at, point.value))
                    .collect(),
                page.next_cursor,
            )
        }
        Some(step) => {
            let step = step_param(step)?;
            let aggregate = aggregate_param(params.agg.as_deref())?;
            let page = state
                .series
                .aggregate(&series, range, step, aggregate, limit, cursor)
                .await?;
            PageResponse::new(
                page.items
                    .into_iter()
                    .map(|(at, value)| point_response(at, value))
                    .collect(),
                page.next_cursor,
            )
        }
    };
    Ok(axum::Json(response))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct AlignedParams {
    /// Comma-separated series names, at most 32.
    #[param(value_type = SeriesNames)]
    names: String,
    /// Start of the range, RFC 3339, inclusive.
    #[param(format = DateTime)]
    from: Option<String>,
    /// End of the range, RFC 3339, exclusive.
    #[param(format = DateTime)]
    to: Option<String>,
    /// Bucket width, such as `60s`, `5m` or `1h`.
    #[param(value_type = Step)]
    step: String,
    /// avg (default), min, max, sum, count, first or last.
    #[param(value_type = Option<Aggregation>)]
    agg: Option<String>,
    /// Rows a page: 1 to 10,000; 1,000 when absent.
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<usize>,
    #[param(value_type = Option<Cursor>)]
    cursor: Option<String>,
}

/// One bucket of an aligned read.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct AlignedRow {
    /// RFC 3339, the start of the bucket.
    #[schema(format = DateTime)]
    pub(crate) at: String,
    /// One per name, in order; null where that series has no points in the bucket.
    pub(crate) values: Vec<Option<f64>>,
}

/// Several series bucketed on one time grid, a row per bucket.
#[utoipa::path(
    get,
    path = "/v1/series:aligned",
    tag = "series",
    params(AlignedParams),
    responses(
        (status = OK, description = "A page of rows, `values` in the order of `names`", body = PageResponse<AlignedRow, Names>),
        (status = BAD_REQUEST, description = "A malformed name, time, limit, cursor, `step` or `agg`, or `from` after `to`", body = ErrorBody),
        (status = UNPROCESSABLE_ENTITY, description = "A bucket's sum or average is too large for a double (`aggregate_overflow`)", body = ErrorBody),
    )
)]
async fn read_aligned(
    State(state): State<AppState>,
    Query(params): Query<AlignedParams>,
) -> Result<axum::Json<PageResponse<AlignedRow, Names>>, ApiError> {
    let names = params
        .names
        .split(',')
        .map(series_name)
        .collect::<Result<Vec<_>, _>>()?;
    let range = range(params.from.as_deref(), params.to.as_deref())?;
    let step = step_param(&params.step)?;
    let aggregate = aggregate_param(params.agg.as_deref())?;
    let limit = params.limit.unwrap_or(DEFAULT_SERIES_PAGE);
    let page = state
        .series
        .aligned(
            &names,
            range,
            step,
            aggregate,
            limit,
            params.cursor.as_deref(),
        )
        .await?;
    Ok(axum::Json(PageResponse {
        items: page
            .items
            .into_iter()
            .map(|(at, values)| AlignedRow {
                at: Ticks::clamped(at).to_string(),
                values,
            })
            .collect(),
        next_cursor: page.next_cursor,
        extra: Names {
            names: names.iter().map(|name| name.as_str().to_owned()).collect(),
        },
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct DeleteParams {
    /// Start of the range, RFC 3339, inclusive; not after `to`.
    #[param(format = DateTime, required = true)]
    from: Option<String>,
    /// End of the range, RFC 3339, exclusive.
    #[param(format = DateTime, required = true)]
    to: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
struct DeletedResponse {
    /// Points deleted.
    deleted: u64,
}

/// Deletes the points in a time range.
#[utoipa::path(
    delete,
    path = "/v1/series/{series}/points",
    tag = "series",
    params(("series" = Name, Path, description = "The series name"), DeleteParams),
    responses(
        (status = OK, description = "Deleted", body = DeletedResponse),
        (status = BAD_REQUEST, description = "A malformed name or time, `from` or `to` missing, or `from` after `to` (`invalid_range`)", body = ErrorBody),
    )
)]
async fn delete_points(
    State(state): State<AppState>,
    Path(series): Path<String>,
    Query(params): Query<DeleteParams>,
) -> Result<axum::Json<DeletedResponse>, ApiError> {
    let series = series_name(&series)?;
    let (Some(from), Some(to)) = (params.from.as_deref(), params.to.as_deref()) else {
        return Err(ApiError::bad_request(
            "invalid_range",
            "a range delete needs both from and to (DELETE /v1/series/{series} deletes all)",
        ));
    };
    let range = range(Some(from), Some(to))?;
    let deleted = state.series.delete_points(&series, range).await?;
    Ok(axum::Json(DeletedResponse { deleted }))
}

/// Deletes a series: its points, tags and name.
#[utoipa::path(
    delete,
    path = "/v1/series/{series}",
    tag = "series",
    params(("series" = Name, Path, description = "The series name")),
    responses(
        (status = NO_CONTENT, description = "Deleted"),
        (status = NOT_FOUND, description = "No such series", body = ErrorBody),
    )
)]
async fn delete_series(
    State(state): State<AppState>,
    Path(series): Path<String>,
) -> Result<StatusCode, ApiError> {
    let series = series_name(&series)?;
    state.series.delete_series(&series).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Deletes the series named `latest`: `/v1/series/latest` is the route of the latest values
/// of many series, so it takes this series' `DELETE /v1/series/{series}` too.
#[utoipa::path(
    delete,
    path = "/v1/series/latest",
    tag = "series",
    responses(
        (status = NO_CONTENT, description = "Deleted"),
        (status = NOT_FOUND, description = "No series named `latest`", body = ErrorBody),
    )
)]
async fn delete_series_named_latest(State(state): State<AppState>) -> Result<StatusCode, ApiError> {
    state.series.delete_series(&series_name("latest")?).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct Tags {
    /// At most 32, each 1 to 256 bytes.
    #[schema(value_type = std::collections::BTreeSet<Tag>, max_items = 32)]
    tags: Vec<String>,
}

/// A series' tags.
#[utoipa::path(
    get,
    path = "/v1/series/{series}/tags",
    tag = "series",
    params(("series" = Name, Path, description = "The series name")),
    responses(
        (status = OK, description = "The tags", body = Tags),
        (status = NOT_FOUND, description = "No such series", body = ErrorBody),
    )
)]
async fn read_tags(
    State(state): State<AppState>,
    Path(series): Path<String>,
) -> Result<axum::Json<Tags>, ApiError> {
    let series = series_name(&series)?;
    let tags = state.series.tags(&series).await?;
    Ok(axum::Json(Tags { tags }))
}

/// Replaces a series' tags.
#[utoipa::path(
    put,
    path = "/v1/series/{series}/tags",
    tag = "series",
    params(("series" = Name, Path, description = "The series name")),
    request_body = Tags,
    responses(
        (status = OK, description = "The tags as stored", body = Tags),
        (status = CONFLICT, description = "Lost to concurrent writers 8 times in a row; retry", body = ErrorBody),
    )
)]
async fn write_tags(
    State(state): State<AppState>,
    Path(series): Path<String>,
    Json(request): Json<Tags>,
) -> Result<axum::Json<Tags>, ApiError> {
    let series = series_name(&series)?;
    state.series.set_tags(&series, request.tags.clone()).await?;
    Ok(axum::Json(request))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListParams {
    /// Names from this one on, in name order.
    start: Option<String>,
    /// Only the series with this tag.
    #[param(value_type = Option<Tag>)]
    tag: Option<String>,
    /// Names a page: 1 to 1,000; 100 when absent.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    #[param(value_type = Option<Cursor>)]
    cursor: Option<String>,
}

/// The names of the series, in name order.
#[utoipa::path(
    get,
    path = "/v1/series",
    tag = "series",
    params(ListParams),
    responses((status = OK, description = "A page of names", body = PageResponse<Name>))
)]
async fn list_series(
    State(state): State<AppState>,
    Query(params): Query<ListParams>,
) -> Result<axum::Json<PageResponse<String>>, ApiError> {
    let list = state
        .series
        .list(
            params.start.as_deref(),
            params.tag.as_deref(),
            params.limit.unwrap_or(DEFAULT_LIST_PAGE),
            params.cursor.as_deref(),
        )
        .await?;
    Ok(axum::Json(PageResponse::new(list.items, list.next_cursor)))
}

/// A series' retention.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RetentionResponse {
    /// `forever`, or a duration in its largest whole unit: `30d`, `36h`, `90m`, `3601s`.
    #[schema(example = "30d")]
    retention: String,
    /// The retention in seconds; null for forever.
    seconds: Option<u64>,
    /// `series` when set on this series, `default` when it follows the server's
    /// (`--series-retention`).
    #[schema(pattern = "^(series|default)$")]
    source: String,
}

impl From<RetentionSetting> for RetentionResponse {
    fn from(setting: RetentionSetting) -> Self {
        RetentionResponse {
            retention: setting.retention.text(),
            seconds: setting.retention.seconds(),
            source: if setting.own { "series" } else { "default" }.to_owned(),
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RetentionRequest {
    /// `forever`, or a duration such as `30d`, `12h` or `1w`, of at least `1h`; null to
    /// follow the server's default again.
    #[schema(
        required = true,
        example = "30d",
        pattern = r"^(?:forever|[1-9][0-9]{0,5}[hdw]|(?:[6-9][0-9]|[1-9][0-9]{2,5})m|(?:3[6-9][0-9]{2}|[4-9][0-9]{3}|[1-9][0-9]{4,6})s)$"
    )]
    #[serde(deserialize_with = "present")]
    retention: Option<String>,
}

/// An `Option` field that must be present, though it may be null (serde takes a missing
/// `Option` field for null unless told otherwise).
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    Option::deserialize(deserializer)
}

/// How long a series keeps its points.
#[utoipa::path(
    get,
    path = "/v1/series/{series}/retention",
    tag = "series",
    params(("series" = Name, Path, description = "The series name")),
    responses(
        (status = OK, description = "The retention in force", body = RetentionResponse),
        (status = NOT_FOUND, description = "No such series", body = ErrorBody),
    )
)]
async fn read_retention(
    State(state): State<AppState>,
    Path(series): Path<String>,
) -> Result<axum::Json<RetentionResponse>, ApiError> {
    let series = series_name(&series)?;
    Ok(axum::Json(state.series.retention(&series).await?.into()))
}

/// Sets how long a series keeps its points (creating it in the catalogue if need be). Reads
/// stop returning older points at once; the retention sweep deletes them.
#[utoipa::path(
    put,
    path = "/v1/series/{series}/retention",
    tag = "series",
    params(("series" = Name, Path, description = "The series name")),
    request_body = RetentionRequest,
    responses(
        (status = OK, description = "The retention now in force", body = RetentionResponse),
    )
)]
async fn write_retention(
    State(state): State<AppState>,
    Path(series): Path<String>,
    Json(request): Json<RetentionRequest>,
) -> Result<axum::Json<RetentionResponse>, ApiError> {
    let series = series_name(&series)?;
    let retention = request
        .retention
        .as_deref()
        .map(Retention::parse)
        .transpose()
        .map_err(|message| ApiError::bad_request("invalid_retention", message))?;
    let setting = state.series.set_retention(&series, retention).await?;
    Ok(axum::Json(setting.into()))
}

/// The latest value of a series.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct LatestResponse {
    #[schema(value_type = Name)]
    pub(crate) series: String,
    /// RFC 3339; null when the series has no point within its retention.
    #[schema(format = DateTime, required = true)]
    pub(crate) at: Option<String>,
    /// Null when the series has no point within its retention.
    #[schema(required = true)]
    pub(crate) value: Option<f64>,
}

impl From<Latest> for LatestResponse {
    fn from(latest: Latest) -> Self {
        LatestResponse {
            series: latest.series,
            at: latest
                .point
                .map(|point| Ticks::clamped(point.at).to_string()),
            value: latest.point.map(|point| point.value),
        }
    }
}

/// The newest point of a series: one read, whatever its size.
#[utoipa::path(
    get,
    path = "/v1/series/{series}/latest",
    tag = "series",
    params(("series" = Name, Path, description = "The series name")),
    responses(
        (status = OK, description = "The newest point, or nulls when there is none", body = LatestResponse),
        (status = NOT_FOUND, description = "No such series", body = ErrorBody),
    )
)]
async fn read_latest(
    State(state): State<AppState>,
    Path(series): Path<String>,
) -> Result<axum::Json<LatestResponse>, ApiError> {
    let series = series_name(&series)?;
    Ok(axum::Json(state.series.latest(&series).await?.into()))
}

/// The newest point of each series of a listing page, in name order: the listing of
/// `GET /v1/series` (same parameters, same cursors), then one batch read.
#[utoipa::path(
    get,
    path = "/v1/series/latest",
    tag = "series",
    params(ListParams),
    responses((status = OK, description = "A page of latest values", body = PageResponse<LatestResponse>))
)]
async fn read_latest_listed(
    State(state): State<AppState>,
    Query(params): Query<ListParams>,
) -> Result<axum::Json<PageResponse<LatestResponse>>, ApiError> {
    let page = state
        .series
        .latest_listed(
            params.start.as_deref(),
            params.tag.as_deref(),
            params.limit.unwrap_or(DEFAULT_LIST_PAGE),
            params.cursor.as_deref(),
        )
        .await?;
    Ok(axum::Json(PageResponse::new(
        page.items.into_iter().map(LatestResponse::from).collect(),
        page.next_cursor,
    )))
}
