//! `/v1/sessions/{id}/fs/...`: a session's /work as a file system (src/service/fs.rs
//! decides; this translates). Paths travel in the query or the body, never in the URL's
//! path, so a client's URL normalization cannot eat a `..` the server must refuse.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;

use super::ApiError;
use crate::server::openapi::{FsRefusals, Unauthenticated};
use crate::server::{Caller, Shared};
use crate::service::fs::{
    self, FsEntry, MadeDir, MoveRequest, PathRequest, WatchEvent, WatchRequest, WatcherEvents,
    WatcherMade,
};

/// `GET .../fs/stat?path=P`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct StatQuery {
    /// Relative to /work, or absolute under /work (no `..`); default /work itself.
    #[serde(default)]
    #[param(required = false)]
    path: String,
}

/// `GET .../fs/list?path=P&depth=N`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// The directory: relative to /work, or absolute under /work (default /work).
    #[serde(default)]
    #[param(required = false)]
    path: String,
    /// How many levels: 1 (default) its own entries, 2 theirs too, ... up to 64.
    #[param(required = false)]
    depth: Option<u32>,
}

#[utoipa::path(get, path = "/v1/sessions/{id}/fs/stat", operation_id = "stat_path", tag = "files",
    summary = "An entry of the session's /work: type, size, mode, owner, time, symlink target",
    description = "A symlink is described, never followed. Works while a call runs.",
    params(("id" = String, Path, description = "the session's id"), StatQuery),
    security(("bearer" = [])),
    responses((status = 200, description = "the entry", body = FsEntry), FsRefusals, Unauthenticated))]
pub(crate) async fn stat(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(query): Query<StatQuery>,
) -> Result<Json<FsEntry>, ApiError> {
    Ok(Json(
        fs::stat_path(&state, &caller, &id, &query.path).await?,
    ))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/fs/list", operation_id = "list_dir", tag = "files",
    summary = "A directory of the session's /work, to a depth",
    description = "Every entry to `depth` levels, sorted by path; subdirectories are entered, \
        symlinks and mount points (volumes) are not. A path through a symlink is 400.",
    params(("id" = String, Path, description = "the session's id"), ListQuery),
    security(("bearer" = [])),
    responses((status = 200, description = "the entries", body = Vec<FsEntry>), FsRefusals, Unauthenticated))]
pub(crate) async fn list(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(query): Query<ListQuery>,
) -> Result<Json<Vec<FsEntry>>, ApiError> {
    let depth = query.depth.unwrap_or(1);
    Ok(Json(
        fs::list_dir(&state, &caller, &id, &query.path, depth).await?,
    ))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/fs/mkdir", operation_id = "make_dir", tag = "files",
    summary = "Make a directory in the session's /work, with its parents",
    description = "201 when made, 200 when it was there; 409 when something else is.",
    params(("id" = String, Path, description = "the session's id")),
    request_body = PathRequest,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "made", body = MadeDir),
        (status = 200, description = "it was there", body = MadeDir),
        FsRefusals, Unauthenticated))]
pub(crate) async fn mkdir(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    super::JsonBody(body): super::JsonBody<PathRequest>,
) -> Result<(StatusCode, Json<MadeDir>), ApiError> {
    let made = fs::make_dir(&state, &caller, &id, &body.path).await?;
    let status = if made.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(made)))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/fs/move", operation_id = "move_path", tag = "files",
    summary = "Move or rename an entry of the session's /work",
    description = "The destination's parent must exist; an existing destination is 409 unless \
        `overwrite`. Symlinks are moved as links.",
    params(("id" = String, Path, description = "the session's id")),
    request_body = MoveRequest,
    security(("bearer" = [])),
    responses((status = 200, description = "the entry at its new path", body = FsEntry), FsRefusals, Unauthenticated))]
pub(crate) async fn move_path(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    super::JsonBody(body): super::JsonBody<MoveRequest>,
) -> Result<Json<FsEntry>, ApiError> {
    Ok(Json(
        fs::move_path(
            &state,
            &caller,
            &id,
            &body.source,
            &body.destination,
            body.overwrite,
        )
        .await?,
    ))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/fs/remove", operation_id = "remove_path", tag = "files",
    summary = "Remove a file, a symlink (not its target) or a directory tree of the session's /work",
    params(("id" = String, Path, description = "the session's id")),
    request_body = PathRequest,
    security(("bearer" = [])),
    responses((status = 204, description = "removed"), FsRefusals, Unauthenticated))]
pub(crate) async fn remove(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    super::JsonBody(body): super::JsonBody<PathRequest>,
) -> Result<StatusCode, ApiError> {
    fs::remove_path(&state, &caller, &id, &body.path).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// How often a quiet watch stream says it is alive.
const WATCH_HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(10);

#[utoipa::path(get, path = "/v1/sessions/{id}/fs/watch", operation_id = "watch_dir", tag = "files",
    summary = "Watch a directory of the session's /work: its events as NDJSON, as they happen",
    description = "The first line is `{\"type\":\"start\",\"path\":...}` once the watch is in place; then \
        one line per event, `{\"type\":\"create|write|remove|rename|chmod\",\"name\":...,\"path\":...}` \
        (`name` relative to the watched directory; a move is `rename` of the old name and `create` \
        of the new; `overflow`: the kernel's queue overflowed and events were lost), \
        `{\"type\":\"heartbeat\"}` after 10 s without one, and a last `{\"type\":\"error\",...}` when the \
        directory is removed, the session closed (`not_found`) or the server stops (`capacity`). The stream ends when the client goes. With \
        `recursive`, every directory under it is watched too (new ones as they come, at most 1024; \
        never through a symlink or a mount).",
    params(("id" = String, Path, description = "the session's id"), WatchRequest),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "the events, one JSON object a line", body = WatchEvent,
            content_type = "application/x-ndjson"),
        FsRefusals, Unauthenticated))]
pub(crate) async fn watch(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(query): Query<WatchRequest>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let mut watch = fs::watch_dir(&state, &caller, &id, &query.path, query.recursive).await?;
    let (lines, receiver) = tokio::sync::mpsc::channel::<axum::body::Bytes>(64);
    let line = |value: serde_json::Value| {
        let mut bytes = value.to_string().into_bytes();
        bytes.push(b'\n');
        axum::body::Bytes::from(bytes)
    };
    let shutdown = state.shutdown.clone();
    tokio::spawn(async move {
        let start = serde_json::json!({"type": "start", "path": watch.path()});
        if lines.send(line(start)).await.is_err() {
            return;
        }
        let mut quiet = tokio::time::Instant::now();
        loop {
            let next = tokio::select! {
                _ = lines.closed() => return,
                // The server stops: the stream ends at once, not at the shutdown's grace.
                _ = shutdown.cancelled() => Err(crate::service::Error::new(
                    crate::service::Kind::Capacity,
                    "the server is shutting down",
                )),
                next = watch.next(std::time::Duration::from_secs(1)) => next,
            };
            match next {
                Ok(events) if events.is_empty() => {
                    if quiet.elapsed() >= WATCH_HEARTBEAT {
                        quiet = tokio::time::Instant::now();
                        if lines
                            .send(line(serde_json::json!({"type": "heartbeat"})))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                }
                Ok(events) => {
                    quiet = tokio::time::Instant::now();
                    for event in events {
                        let value = serde_json::to_value(&event).unwrap_or_default();
                        if lines.send(line(value)).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    let end = serde_json::json!({
                        "type": "error", "error": e.kind.name(), "message": e.message,
                    });
                    let _ = lines.send(line(end)).await;
                    return;
                }
            }
        }
    });
    let stream = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::ReceiverStream::new(receiver),
        Ok::<_, std::convert::Infallible>,
    );
    let body = axum::body::Body::from_stream(stream);
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        body,
    )
        .into_response())
}

#[utoipa::path(post, path = "/v1/sessions/{id}/fs/watchers", operation_id = "create_watcher", tag = "files",
    summary = "Make a watcher on a directory of the session's /work, to poll",
    description = "The session keeps it (at most 16) until it is removed or the session closes; \
        `GET .../fs/watchers/{watcher_id}` takes its events.",
    params(("id" = String, Path, description = "the session's id")),
    request_body = WatchRequest,
    security(("bearer" = [])),
    responses((status = 201, description = "made", body = WatcherMade),
        (status = 403, description = "the session holds 16 watchers already (`policy`)", body = super::ErrorBody),
        FsRefusals, Unauthenticated))]
pub(crate) async fn create_watcher(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    super::JsonBody(body): super::JsonBody<WatchRequest>,
) -> Result<(StatusCode, Json<WatcherMade>), ApiError> {
    let made = fs::create_watcher(&state, &caller, &id, &body.path, body.recursive).await?;
    Ok((StatusCode::CREATED, Json(made)))
}

/// `GET .../fs/watchers/{watcher_id}?after=N`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PollWatcherQuery {
    /// The last answer's `cursor`: give the events after it, and forget those up to it
    /// (default 0: every event kept).
    #[param(required = false)]
    after: Option<u64>,
}

#[utoipa::path(get, path = "/v1/sessions/{id}/fs/watchers/{watcher_id}", operation_id = "poll_watcher", tag = "files",
    summary = "A watcher's events since a cursor (never waits)",
    description = "Give the last answer's `cursor` as `after`: every event once, in order; an answer \
        lost is asked again with the same cursor. `ended` says the watch is over (the directory \
        removed); the events before it still come.",
    params(("id" = String, Path, description = "the session's id"),
        ("watcher_id" = String, Path, description = "from `POST .../fs/watchers`"), PollWatcherQuery),
    security(("bearer" = [])),
    responses((status = 200, description = "the events", body = WatcherEvents), FsRefusals, Unauthenticated))]
pub(crate) async fn poll_watcher(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, watcher)): Path<(String, String)>,
    Query(query): Query<PollWatcherQuery>,
) -> Result<Json<WatcherEvents>, ApiError> {
    Ok(Json(fs::poll_watcher(
        &state,
        &caller,
        &id,
        &watcher,
        query.after,
    )?))
}

#[utoipa::path(delete, path = "/v1/sessions/{id}/fs/watchers/{watcher_id}", operation_id = "remove_watcher", tag = "files",
    summary = "End a watcher",
    params(("id" = String, Path, description = "the session's id"),
        ("watcher_id" = String, Path, description = "from `POST .../fs/watchers`")),
    security(("bearer" = [])),
    responses((status = 204, description = "ended"), FsRefusals, Unauthenticated))]
pub(crate) async fn remove_watcher(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, watcher)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    fs::remove_watcher(&state, &caller, &id, &watcher)?;
    Ok(StatusCode::NO_CONTENT)
}
