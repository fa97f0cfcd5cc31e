//! The HTTP API: a front end of the service (src/service), which decides; this module
//! translates. Requests in (body.rs: bodies under a budget, parsed in one pass), service
//! errors out as status codes (`status_of`): a request that ran returns 200 with the
//! verdict in the body (timeout, oom, exception are verdicts, not HTTP errors); refused
//! before running: 400 invalid (the message names the field), 401 no or bad token, 403
//! policy, 404 unknown session (or another caller's), 409 session busy, 413 body or code
//! too large, 429 (with Retry-After) past the caller's quota, 503 (with Retry-After) at
//! capacity or when the audit log cannot take the request's record. Streams are
//! stream.rs; the audit API and the audit of refusals are audit_api.rs.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use codecage::outcome::Outcome;
use codecage::runner::Lang;
use codecage::session::{Call, CallOutcome, Event};
use codecage::Stream;

pub(crate) mod approvals_api;
pub(crate) mod audit_api;
mod body;
pub(crate) mod fs;
pub(crate) mod processes;
mod stream;

use super::registry::Entry;
use super::{Caller, Shared};
use crate::audit::Via;
use crate::service::{
    self, close_session, lookup, open_session, relative, reset_session, run_request, timeout_of,
    with_session, write_session_file, Kind,
};
pub use crate::service::{ExecuteRequest, RunRequest, SessionRequest};
pub use audit_api::audit_errors;
use audit_api::{audit_export, audit_list, audit_show};
pub use body::{body_budget, JsonBody, RawBody};
pub use stream::StreamEvent;
use stream::{ndjson, output_event, wants_ndjson};

use super::openapi::{CallRefusals, Missing, MissingOrBusy, Refusals, Unauthenticated};

/// The routes, on whatever listener.
pub fn router(state: Shared) -> Router {
    let max_body = state.config.limits.max_body as usize;
    Router::new()
        .route("/healthz", get(healthz))
        .route("/v1/pool", get(pool_status))
        .route("/openapi.json", get(openapi))
        .route("/v1/run", post(run))
        .route("/v1/sessions", post(create_session).get(list_sessions))
        .route("/v1/sessions/{id}", get(get_session).delete(delete_session))
        .route("/v1/sessions/{id}/execute", post(execute))
        .route("/v1/sessions/{id}/reset", post(reset))
        .route("/v1/sessions/{id}/interrupt", post(interrupt))
        .route("/v1/sessions/{id}/fs/stat", get(fs::stat))
        .route("/v1/sessions/{id}/fs/list", get(fs::list))
        .route("/v1/sessions/{id}/fs/mkdir", post(fs::mkdir))
        .route("/v1/sessions/{id}/fs/move", post(fs::move_path))
        .route("/v1/sessions/{id}/fs/remove", post(fs::remove))
        .route("/v1/sessions/{id}/fs/watch", get(fs::watch))
        .route("/v1/sessions/{id}/fs/watchers", post(fs::create_watcher))
        .route(
            "/v1/sessions/{id}/fs/watchers/{watcher_id}",
            get(fs::poll_watcher).delete(fs::remove_watcher),
        )
        .route(
            "/v1/sessions/{id}/processes",
            post(processes::start).get(processes::list),
        )
        .route(
            "/v1/sessions/{id}/processes/{pid}",
            get(processes::poll).delete(processes::kill),
        )
        .route(
            "/v1/sessions/{id}/processes/{pid}/stdin",
            post(processes::stdin),
        )
        .route(
            "/v1/sessions/{id}/processes/{pid}/signal",
            post(processes::signal),
        )
        .route(
            "/v1/sessions/{id}/processes/{pid}/screen",
            get(processes::screen),
        )
        .route(
            "/v1/sessions/{id}/processes/{pid}/resize",
            post(processes::resize),
        )
        .route(
            "/v1/sessions/{id}/processes/{pid}/stream",
            get(processes::stream),
        )
        .route("/v1/sessions/{id}/events", get(processes::events))
        .route("/v1/sessions/{id}/files", get(list_files))
        .route("/v1/sessions/{id}/files/{*path}", get(download).put(upload))
        .route("/v1/approvals", get(approvals_api::list))
        .route("/v1/approvals/rules", get(approvals_api::rules))
        .route(
            "/v1/approvals/rules/{id}",
            axum::routing::delete(approvals_api::revoke),
        )
        .route(
            "/v1/approvals/{id}",
            get(approvals_api::show).post(approvals_api::decide),
        )
        .route("/v1/audit", get(audit_list))
        .route("/v1/audit/export", get(audit_export))
        .route("/v1/audit/{id}", get(audit_show))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// An answer that is not a run's: the service's error, `{"error": kind, "message": ...}`.
pub type ApiError = crate::service::Error;

/// The one place a kind of error becomes an HTTP status (DESIGN.md, "Status codes").
pub fn status_of(kind: Kind) -> StatusCode {
    match kind {
        Kind::InvalidRequest => StatusCode::BAD_REQUEST,
        Kind::Unauthorized => StatusCode::UNAUTHORIZED,
        Kind::Policy | Kind::Forbidden => StatusCode::FORBIDDEN,
        Kind::NotFound | Kind::SessionExpired => StatusCode::NOT_FOUND,
        Kind::Busy | Kind::Exists => StatusCode::CONFLICT,
        Kind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Kind::Quota => StatusCode::TOO_MANY_REQUESTS,
        Kind::Capacity | Kind::AuditUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Kind::SessionLost => StatusCode::GONE,
        Kind::Setup | Kind::Audit => StatusCode::INTERNAL_SERVER_ERROR,
        Kind::ApprovalPending => StatusCode::ACCEPTED,
    }
}

/// On an error response: what went wrong, for the audit of refusals outside the routes.
#[derive(Clone)]
struct ErrorInfo {
    pub(super) kind: &'static str,
    pub(super) message: String,
    pub(super) audited: bool,
    /// Code refused for its size, as measured (for the refusal's record).
    pub(super) code: Option<Box<service::code::Measured>>,
}

/// An error answer's body: `{"error": kind, "message": ..., "retry_after": seconds}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong, for a program: `invalid_request`, `unauthorized`, `policy`,
    /// `not_found`, `session_expired`, `busy`, `exists` (a file operation's target is
    /// there already: 409), `payload_too_large`, `quota` (the caller
    /// is past one of its quotas, a token's or a uid's: 429), `capacity`, `setup`,
    /// `forbidden` (the audit API without the admin role), `audit_unavailable` (the audit
    /// log cannot take the request's record and its `on_full` is `refuse`).
    pub error: String,
    /// What went wrong and what to do, for a person or an agent.
    pub message: String,
    /// Seconds to wait before trying again (429, 503; also the Retry-After header).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Some(pending) = self.pending.clone() {
            return (status_of(self.kind), Json(*pending)).into_response();
        }
        let info = ErrorInfo {
            kind: self.kind(),
            message: self.message.clone(),
            audited: self.is_audited(),
            code: self.code.clone(),
        };
        let body = ErrorBody {
            error: self.kind().to_string(),
            message: self.message,
            retry_after: self.retry_after,
        };
        let mut response = (status_of(self.kind), Json(body)).into_response();
        response.extensions_mut().insert(info);
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

/// A session, as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SessionInfo {
    pub id: String,
    pub language: Lang,
    pub profile: String,
    /// RFC 3339.
    pub created_at: String,
    /// When the session ends unless used again (RFC 3339).
    pub expires_at: String,
    pub idle_timeout_s: u64,
    pub max_duration_s: u64,
    pub busy: bool,
    pub executions: u64,
    /// Its contexts started so far (python, node, bash: each made on first use by a call
    /// with that `language`; node serves typescript calls too).
    pub contexts: Vec<Lang>,
}

/// `GET /healthz`: 200 `ok` while the server and its gateway can serve; 503 and why not
/// when the gateway cannot relay (its runtime stalled, its reaper far behind).
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "server",
    summary = "Liveness (answered without a token on TCP too)",
    responses(
        (status = 200, description = "ok", body = String, content_type = "text/plain"),
        (status = 503, description = "the network gateway cannot relay (the body says why)",
            body = String, content_type = "text/plain"),
    ))]
pub(crate) async fn healthz() -> (StatusCode, String) {
    match crate::gateway::Gateway::health().await {
        Ok(_) => (StatusCode::OK, "ok\n".into()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unhealthy\n{why}\n"),
        ),
    }
}

/// `GET /v1/pool`: how many pooled sandboxes and sessions are ready, by profile.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PoolStatus {
    /// Sandboxes ready for `POST /v1/run`, by profile.
    pub runs: BTreeMap<String, usize>,
    /// Sessions ready for `POST /v1/sessions`, by profile.
    pub sessions: BTreeMap<String, usize>,
}

#[utoipa::path(get, path = "/v1/pool", operation_id = "pool_status", tag = "server",
    summary = "The warm pool: sandboxes and sessions ready, by profile",
    security(("bearer" = [])),
    responses((status = 200, description = "ready counts", body = PoolStatus), Unauthenticated))]
pub(crate) async fn pool_status(State(state): State<Shared>) -> Json<PoolStatus> {
    let (runs, sessions) = state.pool.ready();
    Json(PoolStatus { runs, sessions })
}

#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "server",
    summary = "This document",
    security(("bearer" = [])),
    responses((status = 200, description = "the OpenAPI document", body = Object), Unauthenticated))]
pub(crate) async fn openapi() -> Response {
    let doc = super::openapi_document();
    ([(header::CONTENT_TYPE, "application/json")], doc).into_response()
}

async fn not_found() -> ApiError {
    ApiError::new(Kind::NotFound, "no such endpoint: see GET /openapi.json")
}

#[utoipa::path(post, path = "/v1/run", operation_id = "run", tag = "runs",
    summary = "Run code or a program in a new sandbox",
    description = "With `Accept: application/x-ndjson` the run streams, one event a line: stdout and \
        stderr as they happen, a heartbeat every 10 s, then the result; a refusal found after the \
        stream began is a final `error` event. A client that disconnects stops the run.",
    request_body = RunRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "the run's outcome, whatever its verdict", content(
            (Outcome = "application/json"),
            (StreamEvent<Outcome> = "application/x-ndjson"),
        )),
        Refusals, Unauthenticated,
    ))]
pub(crate) async fn run(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<RunRequest>,
) -> Result<Response, ApiError> {
    // A client that goes away drops this future (or the streamed body), and with it the
    // guard: the run stops.
    let stop = CancellationToken::new();
    if !wants_ndjson(&headers) {
        let _guard = stop.clone().drop_guard();
        let outcome = run_request(&state, &caller, Via::Api, body, stop, |_, _| {}).await?;
        return Ok(Json(outcome).into_response());
    }
    // Streamed: stdout and stderr as they come, then the outcome (or the refusal, as a
    // final error event: a run's checks happen once the stream has begun).
    let (stream, response) = ndjson(stop.clone());
    let events = stream.clone();
    let sink = move |s: Stream, bytes: &[u8]| events.push(output_event(s, bytes));
    tokio::spawn(stream.conclude(async move {
        match run_request(&state, &caller, Via::Api, body, stop, sink).await {
            Ok(outcome) => StreamEvent::Result(Box::new(outcome)),
            Err(e) => StreamEvent::error(e),
        }
    }));
    Ok(response)
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn info(entry: &Entry) -> SessionInfo {
    SessionInfo {
        id: entry.id.clone(),
        language: entry.lang,
        profile: entry.profile.clone(),
        created_at: rfc3339(entry.created),
        expires_at: rfc3339(entry.expires()),
        idle_timeout_s: entry.idle_timeout.as_secs(),
        max_duration_s: entry.max_duration.as_secs(),
        busy: entry.is_busy(),
        executions: entry.executions.load(std::sync::atomic::Ordering::Relaxed),
        contexts: entry.contexts.languages(),
    }
}

#[utoipa::path(post, path = "/v1/sessions", operation_id = "create_session", tag = "sessions",
    summary = "Create a session: a sandbox with a persistent interpreter",
    request_body = SessionRequest,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "the new session", body = SessionInfo),
        Refusals, Unauthenticated,
    ))]
pub(crate) async fn create_session(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    headers: axum::http::HeaderMap,
    JsonBody(mut body): JsonBody<SessionRequest>,
) -> Result<(StatusCode, Json<SessionInfo>), ApiError> {
    if let Some(name) = &state.config.cluster.route_header {
        // Behind the router every create must carry its route: without one the router
        // hashes every create to one node.
        let route = headers.get(name.as_str()).ok_or_else(|| {
            ApiError::new(
                Kind::InvalidRequest,
                format!("this server sits behind a router that hashes the {name} header: send a fresh route (16 lowercase hex digits) with every new session, and the id's first field with each later call"),
            )
        })?;
        body.route = Some(String::from_utf8_lossy(route.as_bytes()).into_owned());
    }
    let entry = open_session(&state, &caller, Via::Api, body).await?;
    Ok((StatusCode::CREATED, Json(info(&entry))))
}

#[utoipa::path(get, path = "/v1/sessions", operation_id = "list_sessions", tag = "sessions",
    summary = "List the caller's live sessions (an admin's: every one)",
    security(("bearer" = [])),
    responses((status = 200, description = "the sessions", body = Vec<SessionInfo>), Unauthenticated))]
pub(crate) async fn list_sessions(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
) -> Json<Vec<SessionInfo>> {
    Json(
        service::list_sessions(&state, &caller)
            .iter()
            .map(|e| info(e))
            .collect(),
    )
}

#[utoipa::path(get, path = "/v1/sessions/{id}", operation_id = "get_session", tag = "sessions",
    summary = "A session",
    params(("id" = String, Path, description = "the session's id, from `POST /v1/sessions`")),
    security(("bearer" = [])),
    responses((status = 200, description = "the session", body = SessionInfo), Missing, Unauthenticated))]
pub(crate) async fn get_session(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, ApiError> {
    let entry = lookup(&state, &caller, &id)?;
    Ok(Json(info(&entry)))
}

#[utoipa::path(delete, path = "/v1/sessions/{id}", operation_id = "delete_session", tag = "sessions",
    summary = "Close a session",
    params(("id" = String, Path, description = "the session's id, from `POST /v1/sessions`")),
    security(("bearer" = [])),
    responses((status = 204, description = "closed: every process killed, nothing left"), Missing, Unauthenticated))]
pub(crate) async fn delete_session(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    close_session(&state, &caller, Via::Api, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sessions/{id}/execute", operation_id = "execute", tag = "sessions",
    summary = "Run a call in a session",
    description = "With `Accept: application/x-ndjson` the events stream as they happen, one a line: \
        stdout, stderr, displays, a heartbeat every 10 s, then the result. A reader more than 1 MiB of \
        events behind loses events, counted in a `dropped` event before the result (which has all the \
        output); the call keeps its own clock. Refusals are known before the stream starts (their status \
        codes); a failure after it ends the stream with an `error` event. A client that disconnects \
        interrupts the call.",
    params(("id" = String, Path, description = "the session's id, from `POST /v1/sessions`")),
    request_body = ExecuteRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "the call's outcome, whatever its verdict", content(
            (CallOutcome = "application/json"),
            (StreamEvent<CallOutcome> = "application/x-ndjson"),
        )),
        CallRefusals, Unauthenticated,
    ))]
pub(crate) async fn execute(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<ExecuteRequest>,
) -> Result<Response, ApiError> {
    let entry = lookup(&state, &caller, &id)?;
    let timeout = timeout_of(body.timeout.as_ref())?;
    codecage::files::check_inputs(&body.files, entry.caps.input_files, entry.caps.input_total)
        .map_err(|e| ApiError::invalid(format!("field `files`: {e}")))?;
    let lang = service::language_of(body.language.as_deref())?;
    let call = Call {
        code: body.code,
        stdin: body.stdin,
        timeout,
        files: body.files,
        lang,
    };
    let names_only = body.file_data == Some(false);
    let mut format = service::format_options(body.format.as_ref())?;
    if let Some(options) = format.as_mut() {
        // The code blocks' tag: the session's language unless the request named one.
        options.language = options
            .language
            .take()
            .or_else(|| Some(lang.unwrap_or(entry.lang).name().to_string()));
    }
    let streaming = wants_ndjson(&headers);
    // Every refusal (busy, policy, quota) is known here, before any answer begins.
    let begun = service::begin_call(state.clone(), caller.clone(), Via::Api, entry, call).await?;
    let stop = CancellationToken::new();
    if !streaming {
        // A client that goes away drops this future and the guard: the call is interrupted.
        let _guard = stop.clone().drop_guard();
        let mut outcome = begun.run(|_| {}, stop).await?;
        shape(&mut outcome, format.as_ref(), names_only);
        return Ok(Json(outcome).into_response());
    }
    let (stream, response) = ndjson(stop.clone());
    let events = stream.clone();
    let forward = move |event: Event| {
        events.push(match event {
            Event::Output(stream, bytes) => output_event(stream, bytes),
            Event::Display(bundle) => StreamEvent::Display {
                data: bundle.clone(),
            },
        })
    };
    tokio::spawn(stream.conclude(async move {
        match begun.run(forward, stop).await {
            Ok(mut outcome) => {
                shape(&mut outcome, format.as_ref(), names_only);
                StreamEvent::Result(Box::new(outcome))
            }
            Err(e) => StreamEvent::error(e),
        }
    }));
    Ok(response)
}

/// A call's answer as asked: rendered for a chat channel (before the files lose their
/// bytes: they are its attachments), and the files by name only.
fn shape(
    outcome: &mut codecage::session::CallOutcome,
    format: Option<&codecage::format::Options>,
    names_only: bool,
) {
    if let Some(options) = format {
        outcome.outcome.formatted = codecage::format::render(&*outcome, options).ok();
    }
    if names_only {
        outcome.outcome.files.iter_mut().for_each(|f| f.data = None);
    }
}

/// `POST /v1/sessions/{id}/reset`'s query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResetQuery {
    /// The context to reset (python, node, typescript, bash); every context if absent.
    language: Option<String>,
}

#[utoipa::path(post, path = "/v1/sessions/{id}/reset", operation_id = "reset_session", tag = "sessions",
    summary = "A fresh interpreter in the same sandbox (/work is kept)",
    description = "With `?language=`, that context only: its interpreter and what its calls started \
        are killed and it starts again; the other contexts and the background processes are left. \
        Without, every context and every background process (as a new session, /work kept).",
    params(("id" = String, Path, description = "the session's id, from `POST /v1/sessions`"), ResetQuery),
    security(("bearer" = [])),
    responses((status = 204, description = "reset"), MissingOrBusy, Unauthenticated))]
pub(crate) async fn reset(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(query): Query<ResetQuery>,
) -> Result<StatusCode, ApiError> {
    let lang = service::language_of(query.language.as_deref())?;
    reset_session(
        &state,
        &caller,
        Via::Api,
        lookup(&state, &caller, &id)?,
        lang,
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sessions/{id}/interrupt", operation_id = "interrupt_session", tag = "sessions",
    summary = "Interrupt the running call (as its timeout would)",
    params(("id" = String, Path, description = "the session's id, from `POST /v1/sessions`")),
    security(("bearer" = [])),
    responses((status = 204, description = "interrupt sent"), Missing, Unauthenticated))]
pub(crate) async fn interrupt(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    service::interrupt_session(&state, &caller, &id)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/sessions/{id}/files?path=DIR`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// The directory, relative to /work (default: /work).
    #[serde(default)]
    #[param(required = false)]
    path: String,
}
/// One entry of `GET /v1/sessions/{id}/files`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct FileEntry {
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    /// When it last changed (RFC 3339).
    pub mtime: String,
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files", operation_id = "list_files", tag = "files",
    summary = "List a directory of the session's /work",
    params(("id" = String, Path, description = "the session's id, from `POST /v1/sessions`"), ListQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "the entries, sorted by name", body = Vec<FileEntry>),
        (status = 400, description = "a bad path", body = ErrorBody),
        MissingOrBusy, Unauthenticated,
    ))]
pub(crate) async fn list_files(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    axum::extract::Query(query): axum::extract::Query<ListQuery>,
) -> Result<Json<Vec<FileEntry>>, ApiError> {
    let path = relative(&query.path).to_string();
    if !path.is_empty() {
        codecage::files::check_input_path(&path)
            .map_err(|e| ApiError::invalid(format!("path: {e}")))?;
    }
    let entries = with_session(&state, &caller, &id, move |s, _| s.list_files(&path)).await?;
    let entries = entries
        .into_iter()
        .map(|e| FileEntry {
            name: e.name,
            kind: e.kind,
            size: e.size,
            mtime: rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(e.mtime.max(0) as u64)),
        })
        .collect();
    Ok(Json(entries))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files/{path}", operation_id = "download_file", tag = "files",
    summary = "Download a file of the session's /work",
    params(("id" = String, Path, description = "the session's id, from `POST /v1/sessions`"), ("path" = String, Path, description = "the file, relative to /work (no `..`)")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "the file's bytes, with its media type", body = Vec<u8>,
            content_type = "application/octet-stream"),
        (status = 400, description = "a bad path, or over the profile's read cap", body = ErrorBody),
        MissingOrBusy, Unauthenticated,
    ))]
pub(crate) async fn download(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, path)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let path = relative(&path).to_string();
    codecage::files::check_input_path(&path)
        .map_err(|e| ApiError::invalid(format!("path: {e}")))?;
    let media = codecage::files::media_type(&path);
    let data = with_session(&state, &caller, &id, move |s, e| {
        s.read_file(&path, e.caps.read_max)
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, media)], data).into_response())
}

#[utoipa::path(put, path = "/v1/sessions/{id}/files/{path}", operation_id = "upload_file", tag = "files",
    summary = "Upload a file into the session's /work (the body is its bytes)",
    params(("id" = String, Path, description = "the session's id, from `POST /v1/sessions`"), ("path" = String, Path, description = "the file, relative to /work (no `..`)")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    security(("bearer" = [])),
    responses(
        (status = 204, description = "written"),
        (status = 400, description = "a bad path, or over the profile's inputs caps", body = ErrorBody),
        (status = 413, description = "the body is over the server's limit (`payload_too_large`)", body = ErrorBody),
        MissingOrBusy, Unauthenticated,
    ))]
pub(crate) async fn upload(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, path)): Path<(String, String)>,
    RawBody(body): RawBody,
) -> Result<StatusCode, ApiError> {
    let path = relative(&path).to_string();
    let file = codecage::files::InputFile::new(path, body);
    write_session_file(&state, &caller, &id, file).await?;
    Ok(StatusCode::NO_CONTENT)
}
