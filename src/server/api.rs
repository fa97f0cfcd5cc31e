//! The HTTP API: requests in, profile-resolved sandboxes and sessions out. Status codes
//! follow one rule: a request that ran returns 200 with the verdict in the body (timeout,
//! oom, exception are verdicts, not HTTP errors); refused before running: 400 invalid (the
//! message names the field), 401 no or bad token, 403 policy, 404 unknown session, 409
//! session busy, 413 body too large, 503 (with Retry-After) at capacity or when the audit
//! log cannot take the request's record (`audit.on_full = "refuse"`). Every execution and
//! every refusal is recorded in the audit log (src/audit); `/v1/audit` reads it, for
//! administrators.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use codecage::outcome::encode_stream;
use codecage::runner::Lang;
use codecage::session::{Call, CallOutcome, Event};
use codecage::Stream;

use super::registry::Entry;
use super::{Caller, Shared};
use crate::audit::{self, End, Kind as AuditKind, Start, Via};
use crate::service::{
    self, close_session, lookup, open_session, relative, reset_session, run_request, timeout_of,
    with_session, write_session_file, Kind,
};
pub use crate::service::{ExecuteRequest, RunRequest, SessionRequest};

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
        .route("/v1/sessions/{id}/files", get(list_files))
        .route("/v1/sessions/{id}/files/{*path}", get(download).put(upload))
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
        Kind::Busy => StatusCode::CONFLICT,
        Kind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Kind::Quota => StatusCode::TOO_MANY_REQUESTS,
        Kind::Capacity | Kind::AuditUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Kind::Setup | Kind::SessionLost | Kind::Audit => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// On an error response: what went wrong, for the audit of refusals outside the routes.
#[derive(Clone)]
struct ErrorInfo {
    kind: &'static str,
    message: String,
    audited: bool,
    /// Code refused for its size, as measured (for the refusal's record).
    code: Option<Box<service::code::Measured>>,
}

#[derive(Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// What went wrong, for a program: `invalid_request`, `unauthorized`, `policy`,
    /// `not_found`, `session_expired`, `busy`, `payload_too_large`, `quota` (the caller
    /// is past one of its token's quotas: 429), `capacity`, `setup`, `forbidden` (the
    /// audit API without the admin role), `audit_unavailable` (the audit log cannot take
    /// the request's record and its `on_full` is `refuse`).
    pub error: String,
    /// What went wrong and what to do, for a person or an agent.
    pub message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let info = ErrorInfo {
            kind: self.kind(),
            message: self.message.clone(),
            audited: self.is_audited(),
            code: self.code.clone(),
        };
        let body = ErrorBody {
            error: self.kind().to_string(),
            message: self.message,
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

/// A request's body, read under the server's body budget: bodies in memory at once are
/// bounded by `limits.max_body` together; a body takes its size (its Content-Length, else
/// the cap) from that budget (given back with the permit) and waits up to the queue
/// timeout for it. Read into one buffer of the declared size: no list of chunks copied
/// at the end.
async fn read_body(
    request: Request,
    state: &Shared,
) -> Result<(Vec<u8>, tokio::sync::OwnedSemaphorePermit), ApiError> {
    // Bodies in memory at once are bounded by `limits.max_body` together: a body takes
    // its size (its Content-Length, else the cap) from that budget while it is read
    // and parsed, and waits (up to the queue timeout) for it.
    let max = state.config.limits.max_body;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(max)
        .min(max);
    let kib = u32::try_from(declared / 1024 + 1).unwrap_or(u32::MAX);
    let budget = tokio::time::timeout(
        state.config.limits.queue_timeout,
        state.bodies.clone().acquire_many_owned(kib),
    )
    .await;
    let budget = match budget {
        Ok(Ok(permit)) => permit,
        _ => return Err(ApiError::new(
            Kind::Capacity,
            "the server is reading as many request bodies as it holds at once; try again shortly",
        )
        .retry_after(state.config.limits.queue_timeout.as_secs())),
    };
    // Read into one buffer of the declared size: no list of chunks copied at the end.
    let too_large = || {
        ApiError::new(
            Kind::PayloadTooLarge,
            "the request body is over the server's limit (limits.max_body)",
        )
    };
    let mut body = request.into_body();
    let mut bytes = Vec::with_capacity(declared as usize);
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        let frame =
            frame.map_err(|e| ApiError::invalid(format!("cannot read the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if (bytes.len() + data.len()) as u64 > max {
                return Err(too_large());
            }
            bytes.extend_from_slice(&data);
        }
    }
    drop(body);
    Ok((bytes, budget))
}

/// A raw body (file uploads), read as [`read_body`] does.
pub struct RawBody(pub Vec<u8>);

impl FromRequest<Shared> for RawBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &Shared) -> Result<Self, ApiError> {
        Ok(RawBody(read_body(request, state).await?.0))
    }
}

/// A JSON body: malformed JSON, unknown fields and wrong types are 400 with the field's
/// path; a body over the cap is 413.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Shared> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &Shared) -> Result<Self, ApiError> {
        let (bytes, _budget) = read_body(request, state).await?;
        // Code over `limits.max_code` is refused before the body is decoded: measured in
        // the JSON text (a pass that allocates nothing of its size).
        if let Ok(probe) = serde_json::from_slice::<Probe>(&bytes) {
            if let Some(raw) = probe
                .code
                .filter(|raw| raw.get().len() as u64 > state.config.limits.max_code + 2)
            {
                let cap = state.audit.as_ref().map_or(0, |a| a.code_cap());
                if let Some(measured) = service::code::measure(raw.get(), cap) {
                    if let Err(mut e) = service::code_within(state, measured.size as usize) {
                        e.code = Some(Box::new(measured));
                        return Err(e);
                    }
                }
            }
        }
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let inner = without_string_values(&e.into_inner().to_string());
            if path == "." || path.is_empty() {
                ApiError::invalid(format!("the body is not the expected JSON object: {inner}"))
            } else {
                ApiError::invalid(format!("field `{path}`: {inner}"))
            }
        })?;
        de.end().map_err(|e| {
            ApiError::invalid(format!("the body has more after its JSON object: {e}"))
        })?;
        Ok(JsonBody(value))
    }
}
/// A body's `code`, as JSON text borrowed from the body (everything else is skipped
/// without being decoded).
#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default)]
    code: Option<&'a serde_json::value::RawValue>,
}

/// A session, as the API shows it.
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// `GET /v1/pool`: how many pooled sandboxes and sessions are ready, by profile.
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PoolStatus {
    /// Sandboxes ready for `POST /v1/run`, by profile.
    pub runs: BTreeMap<String, usize>,
    /// Sessions ready for `POST /v1/sessions`, by profile.
    pub sessions: BTreeMap<String, usize>,
}

async fn pool_status(State(state): State<Shared>) -> Json<PoolStatus> {
    let (runs, sessions) = state.pool.ready();
    Json(PoolStatus { runs, sessions })
}

async fn openapi() -> Response {
    let doc = super::openapi_document();
    ([(header::CONTENT_TYPE, "application/json")], doc).into_response()
}

async fn not_found() -> ApiError {
    ApiError::new(Kind::NotFound, "no such endpoint: see GET /openapi.json")
}

async fn run(
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
            Ok(outcome) => StreamEvent::RunResult(Box::new(outcome)),
            Err(e) => StreamEvent::error(e),
        }
    }));
    Ok(response)
}

fn wants_ndjson(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/x-ndjson"))
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
    }
}

async fn create_session(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<SessionRequest>,
) -> Result<(StatusCode, Json<SessionInfo>), ApiError> {
    let entry = open_session(&state, &caller, Via::Api, body).await?;
    Ok((StatusCode::CREATED, Json(info(&entry))))
}

async fn list_sessions(
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

async fn get_session(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, ApiError> {
    let entry = lookup(&state, &caller, &id)?;
    Ok(Json(info(&entry)))
}

async fn delete_session(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    close_session(&state, &caller, Via::Api, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
/// One streamed event of `execute` with `Accept: application/x-ndjson`.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum StreamEvent {
    Stdout {
        data: String,
        encoding: codecage::outcome::Encoding,
    },
    Stderr {
        data: String,
        encoding: codecage::outcome::Encoding,
    },
    Display {
        data: codecage::session::MimeBundle,
    },
    /// Output the stream did not carry because its reader fell behind (the result
    /// carries all of it, up to the output limit).
    Dropped {
        bytes: u64,
        events: u64,
    },
    /// The call could not give its result (it ended the stream without one).
    Error {
        error: String,
        message: String,
    },
    /// The stream is alive (every 10 s while the work runs).
    Heartbeat,
    Result(Box<CallOutcome>),
    /// A run's outcome (`POST /v1/run` streamed).
    #[serde(rename = "result")]
    RunResult(Box<codecage::outcome::Outcome>),
}

impl StreamEvent {
    fn error(e: ApiError) -> StreamEvent {
        StreamEvent::Error {
            error: e.kind().to_string(),
            message: e.message,
        }
    }
}

/// Bytes of events a stream holds for a slow reader; past it events are dropped and
/// counted, and the call goes on on its own clock.
const STREAM_BUFFER: usize = 1 << 20;

/// What a streamed call has queued for its reader and what it dropped.
#[derive(Default)]
struct Backlog {
    queued: AtomicUsize,
    dropped_bytes: AtomicU64,
    dropped_events: AtomicU64,
}

async fn execute(
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
    let call = Call {
        code: body.code,
        stdin: body.stdin,
        timeout,
        files: body.files,
    };
    let names_only = body.file_data == Some(false);
    let streaming = wants_ndjson(&headers);
    // Every refusal (busy, policy, quota) is known here, before any answer begins.
    let begun = service::begin_call(state.clone(), caller.clone(), Via::Api, entry, call).await?;
    let stop = CancellationToken::new();
    if !streaming {
        // A client that goes away drops this future and the guard: the call is interrupted.
        let _guard = stop.clone().drop_guard();
        let mut outcome = begun.run(|_| {}, stop).await?;
        if names_only {
            outcome.outcome.files.iter_mut().for_each(|f| f.data = None);
        }
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
                if names_only {
                    outcome.outcome.files.iter_mut().for_each(|f| f.data = None);
                }
                StreamEvent::Result(Box::new(outcome))
            }
            Err(e) => StreamEvent::error(e),
        }
    }));
    Ok(response)
}

fn output_event(stream: Stream, bytes: &[u8]) -> StreamEvent {
    let (encoding, data) = encode_stream(bytes);
    match stream {
        Stream::Stdout => StreamEvent::Stdout { data, encoding },
        Stream::Stderr => StreamEvent::Stderr { data, encoding },
    }
}

/// How often an idle stream says it is alive.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// The sending side of a streamed answer (NDJSON): events from the work's thread, which
/// never waits for the reader, then the final event.
#[derive(Clone)]
struct Events {
    queue: tokio::sync::mpsc::Sender<(StreamEvent, usize)>,
    backlog: Arc<Backlog>,
    /// Fired when the reader is gone: the work stops.
    stop: CancellationToken,
}

/// A streamed answer: the sender for the work, and the response whose body holds `stop`'s
/// drop guard (a client that goes drops the body, and the work is stopped).
fn ndjson(stop: CancellationToken) -> (Events, Response) {
    let (queue, receiver) = tokio::sync::mpsc::channel::<(StreamEvent, usize)>(1024);
    let backlog = Arc::new(Backlog::default());
    let events = Events {
        queue,
        backlog: backlog.clone(),
        stop: stop.clone(),
    };
    let guard = stop.drop_guard();
    let lines = tokio_stream::wrappers::ReceiverStream::new(receiver).map(move |(event, size)| {
        let _held = &guard;
        backlog.queued.fetch_sub(size, Ordering::AcqRel);
        let mut line = serde_json::to_vec(&event).unwrap_or_default();
        line.push(b'\n');
        Ok::<_, std::convert::Infallible>(Bytes::from(line))
    });
    let body = axum::body::Body::from_stream(lines);
    let response = ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response();
    (events, response)
}

impl Events {
    /// On the work's thread: queued if the buffer has room, else dropped and counted; with
    /// the reader gone, the work is stopped.
    fn push(&self, event: StreamEvent) {
        let size = match &event {
            StreamEvent::Stdout { data, .. } | StreamEvent::Stderr { data, .. } => data.len(),
            _ => serde_json::to_vec(&event).map_or(0, |v| v.len()),
        };
        let dropped = |seen: &Backlog| {
            seen.dropped_bytes.fetch_add(size as u64, Ordering::Relaxed);
            seen.dropped_events.fetch_add(1, Ordering::Relaxed);
        };
        if self.backlog.queued.load(Ordering::Acquire) + size > STREAM_BUFFER {
            return dropped(&self.backlog);
        }
        match self.queue.try_send((event, size)) {
            Ok(()) => {
                self.backlog.queued.fetch_add(size, Ordering::AcqRel);
            }
            Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => dropped(&self.backlog),
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => self.stop.cancel(),
        }
    }

    /// Waits for the work's last event (with a heartbeat while it runs), then sends what
    /// was dropped, if anything, and that event.
    async fn conclude(self, work: impl std::future::Future<Output = StreamEvent>) {
        tokio::pin!(work);
        let mut beat = tokio::time::interval(HEARTBEAT);
        beat.tick().await;
        let last = loop {
            tokio::select! {
                last = &mut work => break last,
                _ = beat.tick() => self.push(StreamEvent::Heartbeat),
            }
        };
        let dropped = self.backlog.dropped_events.load(Ordering::Relaxed);
        if dropped > 0 {
            let bytes = self.backlog.dropped_bytes.load(Ordering::Relaxed);
            let event = StreamEvent::Dropped {
                bytes,
                events: dropped,
            };
            let _ = self.queue.send((event, 0)).await;
        }
        let _ = self.queue.send((last, 0)).await;
    }
}

async fn reset(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    reset_session(&state, &caller, Via::Api, lookup(&state, &caller, &id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn interrupt(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    service::interrupt_session(&state, &caller, &id)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/sessions/{id}/files?path=DIR`.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    path: String,
}
/// One entry of `GET /v1/sessions/{id}/files`.
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileEntry {
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    /// When it last changed (RFC 3339).
    pub mtime: String,
}

async fn list_files(
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

async fn download(
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

async fn upload(
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

use tokio_stream::StreamExt as _;

/// serde's message without the string values it quotes (`invalid type: string "...",
/// expected a sequence` becomes `invalid type: a string, expected a sequence`): a value may
/// be code (an argv sent as one string), which the client knows and the audit log must not
/// receive when `log_code` is off.
fn without_string_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("string \"") {
        out.push_str(&rest[..at]);
        out.push_str("a string");
        let mut chars = rest[at + 8..].char_indices();
        let mut end = rest.len() - at - 8;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => drop(chars.next()),
                '"' => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &rest[at + 8 + end..];
    }
    out.push_str(rest);
    out
}

/// The longest endpoint a refusal's record keeps.
const MAX_ENDPOINT: usize = 256;

/// The audit of refusals that no service function recorded (a body that does not parse,
/// 401, 404, 413, an audit request without the role): outside every other layer, it sees
/// each error response and records it with the caller, when one was found, and the
/// endpoint. A refusal the audit cannot take (`on_full = "refuse"`) becomes its 503.
pub async fn audit_errors(
    State(state): State<Shared>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(audit) = state.audit.clone() else {
        return next.run(request).await;
    };
    // The path as the client sent it, cut to a bound (it may be anything up to the
    // request line's limit).
    let mut endpoint = format!("{} {}", request.method(), request.uri().path());
    if endpoint.len() > MAX_ENDPOINT {
        endpoint = format!("{}…", codecage::units::head(&endpoint, MAX_ENDPOINT));
    }
    let via = if request.uri().path().starts_with("/mcp") {
        Via::Mcp
    } else {
        Via::Api
    };
    let peer = request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.to_string());
    let response = next.run(request).await;
    let status = response.status();
    let info = response.extensions().get::<ErrorInfo>().cloned();
    if status.as_u16() < 400 || info.as_ref().is_some_and(|i| i.audited) {
        return response;
    }
    let caller = response
        .extensions()
        .get::<Caller>()
        .map_or_else(|| "unauthenticated".to_string(), |c| c.to_string());
    let (kind, message) = match &info {
        Some(i) => (i.kind.to_string(), i.message.clone()),
        None => (
            status
                .canonical_reason()
                .unwrap_or("error")
                .to_lowercase()
                .replace(' ', "_"),
            format!("HTTP {status}"),
        ),
    };
    // Past the refusal budget a refusal is counted, and the next recorded one says how
    // many were.
    let Some(suppressed) = audit.refusal_admitted() else {
        return response;
    };
    let mut start = Start::new(AuditKind::Refused, via, caller);
    if let Some(code) = info.as_ref().and_then(|i| i.code.as_ref()) {
        start.code = Some(code.head.clone());
        start.code_digest = Some((code.sha256.clone(), code.size));
    }
    let mut details = serde_json::json!({"status": status.as_u16(), "endpoint": endpoint});
    if let Some(peer) = peer {
        details["peer"] = peer.into();
    }
    if suppressed > 0 {
        details["refusals_not_recorded_before"] = suppressed.into();
    }
    let end = End::error(&kind, &message).details(details);
    match audit.refusal(start, end).await {
        Ok(()) => response,
        Err(e) => service::audit_unavailable(e).into_response(),
    }
}

/// The audit API is for administrators: a token with the admin role, or root on the unix
/// socket.
fn admin_only(state: &Shared, caller: &Caller) -> Result<std::path::PathBuf, ApiError> {
    if !caller.is_admin() {
        return Err(ApiError::new(Kind::Forbidden,
            "the audit log is for administrators: a token with role \"admin\", or root on the unix socket",
        ));
    }
    if !state.config.audit.enabled {
        return Err(ApiError::new(
            Kind::NotFound,
            "this server keeps no audit log (audit.enabled = false)",
        ));
    }
    Ok(state.config.audit.path.clone())
}

/// `GET /v1/audit` and `/v1/audit/export`: the filters.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    since: Option<String>,
    until: Option<String>,
    profile: Option<String>,
    error: Option<String>,
    session: Option<String>,
    kind: Option<String>,
    caller: Option<String>,
    status: Option<String>,
    limit: Option<u64>,
}

impl AuditQuery {
    fn filter(self, export: bool) -> Result<audit::Filter, ApiError> {
        let now = SystemTime::now();
        let time = |t: Option<String>, name: &str| {
            t.map(|t| {
                audit::time::parse(&t, now)
                    .map(audit::time::millis)
                    .map_err(|e| ApiError::invalid(format!("`{name}`: {e}")))
            })
            .transpose()
        };
        let limit = match (export, self.limit) {
            (true, _) => None,
            (false, Some(n)) if (1..=10_000).contains(&n) => Some(n),
            (false, Some(n)) => {
                return Err(ApiError::invalid(format!("`limit` = {n}: give 1 to 10000")))
            }
            (false, None) => Some(100),
        };
        Ok(audit::Filter {
            since: time(self.since, "since")?,
            until: time(self.until, "until")?,
            profile: self.profile,
            error: self.error,
            session: self.session,
            kind: self.kind,
            caller: self.caller,
            status: self.status,
            limit,
        })
    }
}

/// `{"records": [...]}` of `GET /v1/audit`.
#[derive(Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditList {
    /// Newest first; code and output are left out (see `GET /v1/audit/{id}`).
    pub records: Vec<audit::Record>,
}

async fn read_audit<T: Send + 'static>(
    path: std::path::PathBuf,
    f: impl FnOnce(&audit::Store) -> rusqlite::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(move || {
        let store = audit::Store::open_existing(&path)?;
        f(&store).map_err(|e| format!("audit database {}: {e}", path.display()))
    })
    .await
    .map_err(|e| ApiError::new(Kind::Audit, e.to_string()))?
    .map_err(|e| ApiError::new(Kind::Audit, e))
}

async fn audit_list(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    axum::extract::Query(query): axum::extract::Query<AuditQuery>,
) -> Result<Json<AuditList>, ApiError> {
    let path = admin_only(&state, &caller)?;
    let filter = query.filter(false)?;
    let records = read_audit(path, move |store| store.query(&filter, false)).await?;
    Ok(Json(AuditList { records }))
}

async fn audit_export(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    axum::extract::Query(query): axum::extract::Query<AuditQuery>,
) -> Result<Response, ApiError> {
    let path = admin_only(&state, &caller)?;
    let filter = query.filter(true)?;
    // Streamed: one record at a time from the database to the client, a few lines
    // buffered between them, whatever the export's size.
    let (lines, receiver) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    let opened = read_audit(path, |_| Ok(())).await;
    opened?;
    let path = state.config.audit.path.clone();
    tokio::task::spawn_blocking(move || {
        let store = match audit::Store::open_existing(&path) {
            Ok(store) => store,
            Err(e) => {
                let _ = lines.blocking_send(Err(std::io::Error::other(e)));
                return;
            }
        };
        let result = store.each(&filter, true, |record| {
            let mut line = serde_json::to_vec(&record).unwrap_or_default();
            line.push(b'\n');
            lines.blocking_send(Ok(Bytes::from(line))).is_ok()
        });
        if let Err(e) = result {
            let _ = lines.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    });
    let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(receiver));
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}

async fn audit_show(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<audit::Record>, ApiError> {
    let path = admin_only(&state, &caller)?;
    let wanted = id.clone();
    read_audit(path, move |store| store.get(&wanted))
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::new(Kind::NotFound, format!("there is no audit record {id}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parse_error_names_the_type_and_never_the_string_it_was_given() {
        let err = serde_json::from_str::<Vec<String>>(r#""python3 -c 'print(\"SECRET\")'""#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("SECRET"), "{err}");
        let clean = without_string_values(&err);
        assert!(!clean.contains("SECRET"), "{clean}");
        assert!(
            clean.starts_with("invalid type: a string, expected a sequence"),
            "{clean}"
        );
        assert_eq!(without_string_values("no values"), "no values");
        assert_eq!(without_string_values("string \"unterminated"), "a string");
    }
}
