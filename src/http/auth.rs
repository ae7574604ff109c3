//! Who may call what: one policy for every route, applied before the handler runs, and the
//! admin routes that issue and revoke tokens.
//!
//! The policy reads the matched route template and its path parameters, so a handler never
//! forgets a check and the whole matrix is in one `match`.

use axum::extract::{MatchedPath, RawPathParams, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::{ApiError, ErrorBody};
use super::extract::{Path, Query};
use super::page::PageResponse;
use super::schema::{Cursor, Name};
use crate::auth::{Grant, MAX_TOKEN_PAGE, Principal, TokenInfo, TokenListError};
use crate::series::SeriesName;

/// What a route needs of the caller.
#[derive(Debug, PartialEq, Eq)]
enum Need {
    /// The admin token.
    Admin,
    /// A token acting as this subject (or the admin's).
    Subject(String),
    /// The subject's public log: anyone when public reads are on, else as `Subject`.
    PublicRead(String),
    /// Adding points to this series: its device token, or the admin's.
    SeriesWrite(String),
    /// Adding points to series named in the body (line protocol): the admin token or any
    /// device token; the handler refuses a device the lines that are not its series.
    SeriesWriteInBody,
    /// Any valid token.
    AnyToken,
}

/// The policy: what each route template needs.
fn need(method: &Method, template: &str, param: impl Fn(&str) -> String) -> Need {
    match template {
        "/v1/subjects/{subject}/events" if method == Method::GET => {
            Need::PublicRead(param("subject"))
        }
        "/v1/subjects/{subject}/events"
        | "/v1/subjects/{subject}/events/{event_id}"
        | "/v1/subjects/{subject}/events/{event_id}/fanout"
        | "/v1/subjects/{subject}/following/{target}"
        | "/v1/subjects/{subject}/following"
        | "/v1/subjects/{subject}/followers"
        | "/v1/subjects/{subject}/timeline"
        | "/v1/subjects/{subject}/timeline/stream"
        | "/v1/subjects/{subject}/marker"
        | "/v1/subjects/{subject}/notifications"
        | "/v1/subjects/{subject}/notifications/marker"
        | "/v1/subjects/{subject}/notifications/stream" => Need::Subject(param("subject")),
        "/v1/whoami" => Need::AnyToken,
        "/v1/series/{series}/points" if method == Method::POST => {
            Need::SeriesWrite(param("series"))
        }
        "/api/v2/write" => Need::SeriesWriteInBody,
        _ => Need::Admin,
    }
}

/// Whether `principal` may do what `need` asks.
fn allows(principal: &Principal, need: &Need, public_events: bool) -> bool {
    match (principal, need) {
        (Principal::Admin, _) | (_, Need::AnyToken) => true,
        (_, Need::PublicRead(_)) if public_events => true,
        (Principal::Subject(own), Need::Subject(subject) | Need::PublicRead(subject)) => {
            own == subject
        }
        (Principal::Device(own), Need::SeriesWrite(series)) => own == series,
        (Principal::Device(_), Need::SeriesWriteInBody) => true,
        _ => false,
    }
}

/// The bearer token of a request, if it has one: `Bearer <token>`, or `Token <token>` as
/// the InfluxDB clients and Telegraf send it.
pub(super) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("token"))
        .then(|| token.trim())
}

/// Middleware of every API route: 401 without a valid token, 403 outside its rights.
pub async fn authorize(
    State(state): State<AppState>,
    matched: Option<MatchedPath>,
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
    request: Request,
    next: Next,
) -> Response {
    let template = matched.as_ref().map_or("", MatchedPath::as_str);
    let params = params.ok();
    let param = |name: &str| {
        params
            .iter()
            .flat_map(|params| params.iter())
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.to_owned())
            .unwrap_or_default()
    };
    let need = need(request.method(), template, param);
    let token = bearer(request.headers());
    if token.is_none() && matches!(need, Need::PublicRead(_)) && state.public_events {
        return next.run(request).await;
    }
    let Some(token) = token else {
        return ApiError::Unauthorized.into_response();
    };
    let principal = match state.tokens.authenticate(token).await {
        Ok(Some(principal)) => principal,
        Ok(None) => return ApiError::Unauthorized.into_response(),
        Err(err) => return ApiError::from(err).into_response(),
    };
    if !allows(&principal, &need, state.public_events) {
        return ApiError::Forbidden("this token may not do that".into()).into_response();
    }
    if let Err(limited) = state.rate_limits.check(&principal, token) {
        return limited.into_response();
    }
    let mut request = request;
    request.extensions_mut().insert(principal);
    next.run(request).await
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(issue_subject_token))
        .routes(routes!(issue_device_token))
        .routes(routes!(revoke_token))
        .routes(routes!(list_tokens))
        .routes(routes!(whoami))
}

/// Who a token acts as.
#[derive(Debug, Serialize, ToSchema)]
struct WhoAmI {
    kind: PrincipalKind,
    /// The subject a subject token acts as, the series a device token writes to; null for
    /// the admin.
    name: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum PrincipalKind {
    /// The admin token: every route.
    Admin,
    /// Acts as a subject.
    Subject,
    /// Writes points to one series.
    Device,
}

/// Who the calling token acts as: any valid token may ask (the console uses it to show only
/// what the token may do).
#[utoipa::path(
    get,
    path = "/v1/whoami",
    tag = "tokens",
    responses((status = OK, description = "Who the token acts as", body = WhoAmI))
)]
async fn whoami(axum::Extension(principal): axum::Extension<Principal>) -> axum::Json<WhoAmI> {
    let (kind, name) = match principal {
        Principal::Admin => (PrincipalKind::Admin, None),
        Principal::Subject(name) => (PrincipalKind::Subject, Some(name)),
        Principal::Device(name) => (PrincipalKind::Device, Some(name)),
    };
    axum::Json(WhoAmI { kind, name })
}

#[derive(Debug, Serialize, ToSchema)]
struct IssuedResponse {
    token_id: String,
    /// Shown once: only its hash is kept.
    token: String,
}

async fn issue(state: &AppState, grant: Grant) -> Result<Response, ApiError> {
    let issued = state.tokens.issue(grant).await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(IssuedResponse {
            token_id: issued.token_id,
            token: issued.token,
        }),
    )
        .into_response())
}

/// Issues a token that acts as `subject`: it posts, follows, reads its timeline, events and
/// follow lists, and deletes its events.
#[utoipa::path(
    post,
    path = "/v1/admin/subjects/{subject}/tokens",
    tag = "admin",
    params(("subject" = Name, Path)),
    responses((status = CREATED, description = "The token, shown this once", body = IssuedResponse))
)]
async fn issue_subject_token(
    State(state): State<AppState>,
    Path(subject): Path<String>,
) -> Result<Response, ApiError> {
    let subject = super::subject(&subject)?;
    issue(&state, Grant::Subject(subject.as_str().to_owned())).await
}

/// Issues a write-only device token: it may add points to `series` and do nothing else.
#[utoipa::path(
    post,
    path = "/v1/admin/series/{series}/tokens",
    tag = "admin",
    params(("series" = Name, Path)),
    responses((status = CREATED, description = "The token, shown this once", body = IssuedResponse))
)]
async fn issue_device_token(
    State(state): State<AppState>,
    Path(series): Path<String>,
) -> Result<Response, ApiError> {
    let series = SeriesName::parse(&series)
        .map_err(|message| ApiError::bad_request("invalid_series", message))?;
    issue(&state, Grant::Device(series.as_str().to_owned())).await
}

/// Revokes a token: every server refuses it within a second.
#[utoipa::path(
    delete,
    path = "/v1/admin/tokens/{token_id}",
    tag = "admin",
    params(("token_id" = String, Path, pattern = "^[0-9a-fA-F]{32}$", description = "32 hex digits, as issued")),
    responses(
        (status = NO_CONTENT, description = "Revoked"),
        (status = NOT_FOUND, description = "No such token", body = ErrorBody),
    )
)]
async fn revoke_token(
    State(state): State<AppState>,
    Path(token_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if token_id.len() != 32 || !token_id.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return Err(ApiError::bad_request("invalid_token_id", "not a token id"));
    }
    if state.tokens.revoke(&token_id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound(format!("no token {token_id}")))
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListParams {
    /// The subject, or series, whose tokens to list: checked like every subject id (a 400
    /// `invalid_subject` otherwise).
    #[param(value_type = Name)]
    subject: String,
    /// Tokens a page: 1 to 1,000; 1,000 when absent.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    /// The `next_cursor` of the page before (a cursor this listing issued).
    #[param(value_type = Option<Cursor>)]
    cursor: Option<String>,
}

/// A token as listed: never its secret.
#[derive(Debug, Serialize, ToSchema)]
struct ListedToken {
    token_id: String,
    kind: TokenKind,
    /// The subject it acts as, or the series it writes to.
    name: String,
    /// RFC 3339.
    #[schema(format = DateTime)]
    created_at: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum TokenKind {
    /// Acts as a subject.
    Subject,
    /// Writes points to one series.
    Device,
}

impl From<TokenInfo> for ListedToken {
    fn from(info: TokenInfo) -> Self {
        let (kind, name) = match info.grant {
            Grant::Subject(name) => (TokenKind::Subject, name),
            Grant::Device(name) => (TokenKind::Device, name),
        };
        ListedToken {
            token_id: info.token_id,
            kind,
            name,
            created_at: info.created_at,
        }
    }
}

impl From<TokenListError> for ApiError {
    fn from(err: TokenListError) -> Self {
        match err {
            TokenListError::InvalidLimit => ApiError::bad_request("invalid_limit", err.to_string()),
            TokenListError::InvalidCursor(invalid) => {
                ApiError::bad_request("invalid_cursor", invalid.to_string())
            }
            TokenListError::Store(store) => store.into(),
        }
    }
}

/// Lists the tokens issued for a subject or a series, without their secrets, oldest first.
#[utoipa::path(
    get,
    path = "/v1/admin/tokens",
    tag = "admin",
    params(ListParams),
    responses((status = OK, description = "A page of tokens", body = PageResponse<ListedToken>))
)]
async fn list_tokens(
    State(state): State<AppState>,
    Query(params): Query<ListParams>,
) -> Result<axum::Json<PageResponse<ListedToken>>, ApiError> {
    let subject = super::subject(&params.subject)?;
    let page = state
        .tokens
        .list(
            subject.as_str(),
            params.limit.unwrap_or(MAX_TOKEN_PAGE),
            params.cursor.as_deref(),
        )
        .await?;
    Ok(axum::Json(PageResponse::new(
        page.items.into_iter().map(ListedToken::from).collect(),
        page.next_cursor,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_principal_reaches_exactly_its_own_routes() {
        let alice = Principal::Subject("alice".into());
        let device = Principal::Device("dev/1".into());
        let own = Need::Subject("alice".into());
        let other = Need::Subject("bob".into());
        assert!(allows(&Principal::Admin, &Need::Admin, false));
        assert!(allows(&alice, &own, false));
        assert!(!allows(&alice, &other, false));
        assert!(!allows(&alice, &Need::Admin, false));
        assert!(!allows(&alice, &Need::SeriesWrite("alice".into()), false));
        assert!(allows(&device, &Need::SeriesWrite("dev/1".into()), false));
        assert!(!allows(&device, &Need::SeriesWrite("dev/2".into()), false));
        assert!(!allows(&device, &Need::Subject("dev/1".into()), false));
        assert!(allows(&device, &Need::SeriesWriteInBody, false));
        assert!(!allows(&alice, &Need::SeriesWriteInBody, false));
        assert!(!allows(&alice, &Need::PublicRead("bob".into()), false));
        assert!(allows(&alice, &Need::PublicRead("bob".into()), true));
    }
}
