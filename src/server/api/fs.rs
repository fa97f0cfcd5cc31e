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
use crate::service::fs::{self, FsEntry, MadeDir, MoveRequest, PathRequest};

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
