//! `/v1/sessions/{id}/processes`: a session's background processes (src/service/processes.rs
//! decides; this translates).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;

use super::ApiError;
use crate::server::openapi::{CallRefusals, Missing, Unauthenticated};
use crate::server::{Caller, Shared};
use crate::service::processes::{
    self as procs, ProcessRequest, ProcessView, ResizeRequest, ScreenView, SignalRequest,
    StdinRequest,
};

/// A process as the API gives it (the OpenAPI schema of the JSON object the handlers
/// build).
#[derive(utoipa::ToSchema)]
#[schema(as = Process)]
#[allow(dead_code)]
pub struct ProcessSchema {
    process_id: u64,
    /// What was started: the command line, or the argv joined.
    command: String,
    /// `running` or `exited`.
    status: String,
    exit_code: Option<i32>,
    /// The signal that ended it.
    signal: Option<i32>,
    /// Killed at its time limit.
    timed_out: bool,
    /// Why it never started, or that the session's sandbox ended (present only then).
    error: Option<String>,
    /// Its terminal's size, when it runs on one (present only then); its output is then
    /// all in `stdout`.
    pty: Option<codecage::processes::TermSize>,
    started_at: String,
    duration_ms: u64,
    /// Its output from the cursor asked (text, or base64 with `stdout_encoding`).
    stdout: String,
    /// `base64` when the bytes are not UTF-8 (absent otherwise).
    stdout_encoding: Option<String>,
    /// The offset of the first byte given.
    stdout_from: u64,
    /// The offset to poll from next: every byte written so far.
    stdout_cursor: u64,
    /// Bytes between the cursor asked and `stdout_from` that the buffer (the profile's
    /// `session.process_buffer`, 1 MiB by default) no longer held.
    stdout_dropped: u64,
    stderr: String,
    stderr_encoding: Option<String>,
    stderr_from: u64,
    stderr_cursor: u64,
    stderr_dropped: u64,
}

/// `GET .../processes/{pid}?stdout_from=N&stderr_from=M`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PollQuery {
    /// Give stdout from this byte offset (the last answer's `stdout_cursor`; default 0).
    #[serde(default)]
    #[param(required = false)]
    stdout_from: u64,
    /// Give stderr from this byte offset (default 0).
    #[serde(default)]
    #[param(required = false)]
    stderr_from: u64,
}

/// What `POST .../stdin` answers.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct StdinWritten {
    pub written: usize,
}

#[utoipa::path(post, path = "/v1/sessions/{id}/processes", operation_id = "start_process", tag = "processes",
    summary = "Start a process in the session (a command for bash -c, or an argv)",
    description = "It runs beside the interpreter, in the same sandbox and /work, with every layer, \
        `CODECAGE_SHELL=exec` in its environment. The answer waits up to `yield_ms` (default 10000): if \
        it ended, its whole result; else `status: running` with its output so far, and it goes on (poll \
        it). `background: true` answers at once. Its output is read as it comes, whoever polls, into a \
        buffer of 1 MiB a stream (the profile's `session.process_buffer`). Closing the session kills it.",
    params(("id" = String, Path, description = "the session's id")),
    request_body = ProcessRequest,
    security(("bearer" = [])),
    responses((status = 200, description = "the process", body = ProcessSchema), CallRefusals, Unauthenticated))]
pub(crate) async fn start(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    super::JsonBody(body): super::JsonBody<ProcessRequest>,
) -> Result<Json<ProcessView>, ApiError> {
    Ok(Json(
        procs::start_process(&state, &caller, crate::audit::Via::Api, &id, body).await?,
    ))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/processes", operation_id = "list_processes", tag = "processes",
    summary = "The session's processes, oldest first (without output: the cursors say how much there is)",
    params(("id" = String, Path, description = "the session's id")),
    security(("bearer" = [])),
    responses((status = 200, description = "the processes", body = Vec<ProcessSchema>), Missing, Unauthenticated))]
pub(crate) async fn list(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Vec<ProcessView>>, ApiError> {
    Ok(Json(procs::list_processes(&state, &caller, &id)?))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/processes/{pid}", operation_id = "poll_process", tag = "processes",
    summary = "A process: its status and its output from byte cursors",
    description = "Give the last answer's `stdout_cursor` and `stderr_cursor` as `stdout_from` and \
        `stderr_from`: the answer holds every byte since, once (a client that reconnects resumes with \
        no gap and no repeat). Bytes the buffer no longer holds are counted in `stdout_dropped`.",
    params(("id" = String, Path, description = "the session's id"),
        ("pid" = u64, Path, description = "the process's id (`process_id`)"), PollQuery),
    security(("bearer" = [])),
    responses((status = 200, description = "the process", body = ProcessSchema), Missing, Unauthenticated))]
pub(crate) async fn poll(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, pid)): Path<(String, u64)>,
    Query(query): Query<PollQuery>,
) -> Result<Json<ProcessView>, ApiError> {
    Ok(Json(procs::poll_process(
        &state,
        &caller,
        &id,
        pid,
        query.stdout_from,
        query.stderr_from,
    )?))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/processes/{pid}/stdin", operation_id = "process_stdin", tag = "processes",
    summary = "Send input to a process: keys by tmux's names, text, a paste, Enter; to its terminal or its stdin",
    description = "For a process on a terminal (`pty`) or one started with `stdin: true`. In this \
        order: `keys` (`Enter`, `C-c`, `Up`, `Tab`, `Escape`, `BSpace`, `Home`, `End`, `PPage`, \
        `NPage`, `DC`, `F1`..`F12`, `M-x`, `Space`, a single character; cursor keys in application \
        mode when the screen says so), `data` as it is, `paste` (bracketed when the program enabled \
        bracketed paste), then Enter if `submit`. On a terminal, `C-c` is SIGINT to its foreground \
        process group, as a person's ^C; on a pipe it is the byte 0x03 and Enter is a line feed. \
        `close` closes a pipe (a terminal's program reads EOF from `C-d`).",
    params(("id" = String, Path, description = "the session's id"),
        ("pid" = u64, Path, description = "the process's id")),
    request_body = StdinRequest,
    security(("bearer" = [])),
    responses((status = 200, description = "the bytes written", body = StdinWritten),
        (status = 400, description = "an unknown key (named, with the forms allowed), its stdin is closed, or it did not read within 5 s", body = super::ErrorBody),
        Missing, Unauthenticated))]
pub(crate) async fn stdin(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, pid)): Path<(String, u64)>,
    super::JsonBody(body): super::JsonBody<StdinRequest>,
) -> Result<Json<StdinWritten>, ApiError> {
    let written = procs::write_stdin(&state, &caller, &id, pid, body).await?;
    Ok(Json(StdinWritten { written }))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/processes/{pid}/signal", operation_id = "signal_process", tag = "processes",
    summary = "Send a signal to a process's process group",
    params(("id" = String, Path, description = "the session's id"),
        ("pid" = u64, Path, description = "the process's id")),
    request_body = SignalRequest,
    security(("bearer" = [])),
    responses((status = 204, description = "sent"),
        (status = 400, description = "not a signal allowed, or the process has exited", body = super::ErrorBody),
        Missing, Unauthenticated))]
pub(crate) async fn signal(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, pid)): Path<(String, u64)>,
    super::JsonBody(body): super::JsonBody<SignalRequest>,
) -> Result<StatusCode, ApiError> {
    procs::signal_process(&state, &caller, &id, pid, &body.signal)?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(delete, path = "/v1/sessions/{id}/processes/{pid}", operation_id = "kill_process", tag = "processes",
    summary = "Kill a process (SIGKILL to its process group); its record and output stay for polls",
    params(("id" = String, Path, description = "the session's id"),
        ("pid" = u64, Path, description = "the process's id")),
    security(("bearer" = [])),
    responses((status = 204, description = "killed"),
        (status = 400, description = "it has already exited", body = super::ErrorBody),
        Missing, Unauthenticated))]
pub(crate) async fn kill(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, pid)): Path<(String, u64)>,
) -> Result<StatusCode, ApiError> {
    procs::signal_process(&state, &caller, &id, pid, &procs::kill_signal())?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/sessions/{id}/processes/{pid}/screen", operation_id = "process_screen", tag = "processes",
    summary = "A process's terminal as a person would see it now: rows of text, the cursor, the size, the title",
    description = "For a process started with `pty`. The launcher feeds everything the program \
        writes to a terminal emulator (the `vt100` crate), so a full-screen program (an editor, a \
        pager, `top`) reads as its screen, without escape codes. An exited process keeps its last \
        screen.",
    params(("id" = String, Path, description = "the session's id"),
        ("pid" = u64, Path, description = "the process's id")),
    security(("bearer" = [])),
    responses((status = 200, description = "the screen", body = ScreenView),
        (status = 400, description = "the process does not run on a terminal", body = super::ErrorBody),
        Missing, Unauthenticated))]
pub(crate) async fn screen(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, pid)): Path<(String, u64)>,
) -> Result<Json<ScreenView>, ApiError> {
    Ok(Json(procs::screen_process(&state, &caller, &id, pid)?))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/processes/{pid}/resize", operation_id = "resize_process", tag = "processes",
    summary = "Resize a process's terminal (its foreground process group gets SIGWINCH)",
    params(("id" = String, Path, description = "the session's id"),
        ("pid" = u64, Path, description = "the process's id")),
    request_body = ResizeRequest,
    security(("bearer" = [])),
    responses((status = 204, description = "resized"),
        (status = 400, description = "no terminal, it has exited, or a size out of range (1 to 500 columns, 1 to 200 rows)", body = super::ErrorBody),
        Missing, Unauthenticated))]
pub(crate) async fn resize(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, pid)): Path<(String, u64)>,
    super::JsonBody(body): super::JsonBody<ResizeRequest>,
) -> Result<StatusCode, ApiError> {
    procs::resize_process(&state, &caller, &id, pid, body)?;
    Ok(StatusCode::NO_CONTENT)
}

/// A stream of JSON lines from the service (`application/x-ndjson`).
fn ndjson_lines(lines: tokio::sync::mpsc::Receiver<serde_json::Value>) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    use tokio_stream::StreamExt as _;
    let body = tokio_stream::wrappers::ReceiverStream::new(lines).map(|line| {
        let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
        bytes.push(b'\n');
        Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(bytes))
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// One line of `GET .../processes/{pid}/stream`.
#[derive(utoipa::ToSchema)]
#[schema(as = ProcessStreamLine)]
#[allow(dead_code)]
pub struct ProcessStreamLineSchema {
    /// `stdout` or `stderr` (output), `heartbeat` (every 10 s of quiet), `exit` (the last
    /// line: the process as a poll gives it, without output), or `error` (the last line).
    r#type: String,
    /// Output: the bytes from `from` to `cursor` (text, or base64 with `encoding`).
    data: Option<String>,
    /// `base64` when the bytes are not UTF-8 (absent otherwise).
    encoding: Option<String>,
    from: Option<u64>,
    /// Where to resume this stream from (`stdout_from`/`stderr_from`).
    cursor: Option<u64>,
    /// Bytes before `from` the buffer no longer held.
    dropped: Option<u64>,
}

/// `GET .../processes/{pid}/stream?stdout_from=N&stderr_from=M`: as a poll's.
#[utoipa::path(get, path = "/v1/sessions/{id}/processes/{pid}/stream", operation_id = "stream_process", tag = "processes",
    summary = "A process's output as it comes (NDJSON), from byte cursors, to its exit",
    description = "Lines of JSON (`application/x-ndjson`): `{type: stdout|stderr, data, encoding?, from, \
        cursor, dropped}` as output comes, `{type: heartbeat}` every 10 s of quiet, and last `{type: \
        exit, ...}`: the process as a poll gives it (exit code, signal, its cursors), once it has exited \
        and every byte was given. A client that reconnects with the last `cursor` of each stream as \
        `stdout_from` and `stderr_from` gets every byte since, once; bytes the buffer no longer held \
        are counted in `dropped`.",
    params(("id" = String, Path, description = "the session's id"),
        ("pid" = u64, Path, description = "the process's id"), PollQuery),
    security(("bearer" = [])),
    responses((status = 200, description = "the output, then the exit", body = ProcessStreamLineSchema, content_type = "application/x-ndjson"),
        Missing, Unauthenticated))]
pub(crate) async fn stream(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, pid)): Path<(String, u64)>,
    Query(query): Query<PollQuery>,
) -> Result<axum::response::Response, ApiError> {
    let lines = procs::stream_output(
        &state,
        &caller,
        &id,
        pid,
        query.stdout_from,
        query.stderr_from,
    )?;
    Ok(ndjson_lines(lines))
}

/// `GET /v1/sessions/{id}/events?after=N`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Give the events after this number (the last line's `seq`; default 0: from the first
    /// the log holds).
    #[serde(default)]
    #[param(required = false)]
    after: u64,
}

/// One line of `GET /v1/sessions/{id}/events`.
#[derive(utoipa::ToSchema)]
#[schema(as = SessionEvent)]
#[allow(dead_code)]
pub struct SessionEventSchema {
    /// `started` or `exited` (a process, with its fields as a poll gives them, without
    /// output), `missed` (`events` the log no longer held), `heartbeat`, or `closed` (the
    /// session ended: the last line).
    r#type: String,
    /// The event's number (resume with it as `after`).
    seq: Option<u64>,
    /// When it happened (RFC 3339).
    at: Option<String>,
    process_id: Option<u64>,
    command: Option<String>,
    status: Option<String>,
    exit_code: Option<i32>,
    signal: Option<i32>,
    timed_out: Option<bool>,
    events: Option<u64>,
}

#[utoipa::path(get, path = "/v1/sessions/{id}/events", operation_id = "session_events", tag = "processes",
    summary = "The session's events as they happen (NDJSON): each process's start and exit",
    description = "Lines of JSON (`application/x-ndjson`): `{type: started|exited, seq, at, process_id, \
        command, status, exit_code, signal, timed_out, error?, ...}` (an exit within a second of it, \
        once its output is all read), `{type: missed, events}` when the log (the last 1024 events) no \
        longer holds some asked for, `{type: heartbeat}` every 10 s of quiet, and `{type: closed}` last, \
        when the session ends (after the exits of the processes that died with it). Reconnect with \
        the last `seq` as `after`: no event is given twice or skipped.",
    params(("id" = String, Path, description = "the session's id"), EventsQuery),
    security(("bearer" = [])),
    responses((status = 200, description = "the events", body = SessionEventSchema, content_type = "application/x-ndjson"),
        Missing, Unauthenticated))]
pub(crate) async fn events(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(query): Query<EventsQuery>,
) -> Result<axum::response::Response, ApiError> {
    let lines = procs::stream_events(&state, &caller, &id, query.after)?;
    Ok(ndjson_lines(lines))
}
