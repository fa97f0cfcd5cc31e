//! A session's /work as a file system: stat, list to a depth, make directories, move,
//! remove (and watch, in `watch`), for every front end. These work on the host's view of
//! /work (`codecage::workdir`: openat2 beneath /work's own tmpfs, never through a symlink
//! or a mount), so they need no claim on the session and run while a call runs. Tenancy as
//! every session operation: [`lookup`] (another caller's session is 404).

use std::sync::Arc;
use std::time::SystemTime;

use codecage::workdir::{EntryInfo, FsError, FsErrorKind, WorkDir, WorkPath};
use serde::Serialize;

use super::sessions::lookup;
use super::{Caller, Error, Kind};
use crate::server::Shared;

/// One entry of a session's /work (the fields of E2B's `EntryInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct FsEntry {
    /// Its last component (`work` for /work itself).
    pub name: String,
    /// `file`, `dir`, `symlink` (never followed) or `other` (a FIFO, a socket).
    #[serde(rename = "type")]
    pub kind: String,
    /// Its absolute path in the sandbox: `/work/...`.
    pub path: String,
    /// In bytes (a symlink's: its target's length).
    pub size: u64,
    /// The permission bits, with setuid, setgid and sticky (`st_mode & 0o7777`).
    pub mode: u32,
    /// As `ls -l` shows them: `-rw-r--r--`, `drwxr-xr-x`, `lrwxrwxrwx`.
    pub permissions: String,
    /// By the sandbox's names: `root`, `sandbox` (the user code runs as) or `nobody`.
    pub owner: String,
    pub group: String,
    /// When its content last changed (RFC 3339, UTC, to the nanosecond).
    pub modified_time: String,
    /// A symlink's target, as written (absent for anything else).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// It is a symlink (`type` says so too; E2B's clients read this field).
    pub is_symlink: bool,
}

impl From<EntryInfo> for FsEntry {
    fn from(e: EntryInfo) -> FsEntry {
        FsEntry {
            name: e.name,
            kind: e.kind.name().to_string(),
            path: e.path,
            size: e.size,
            mode: e.mode,
            permissions: e.permissions,
            owner: e.owner,
            group: e.group,
            modified_time: rfc3339(e.modified),
            is_symlink: e.symlink_target.is_some()
                || e.kind == codecage::workdir::FileKind::Symlink,
            symlink_target: e.symlink_target,
        }
    }
}

/// A directory `make_dir` made, or found.
#[derive(Debug, Clone, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct MadeDir {
    pub entry: FsEntry,
    /// True: made now; false: it was there.
    pub created: bool,
}

pub(crate) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_nanos(t).to_string()
}

/// A file system error as the service's: 404 missing, 400 refused path, 409 exists.
pub(crate) fn error_of(e: FsError) -> Error {
    let kind = match e.kind {
        FsErrorKind::NotFound => Kind::NotFound,
        FsErrorKind::Invalid => Kind::InvalidRequest,
        FsErrorKind::Exists => Kind::Exists,
        FsErrorKind::Failed => Kind::Setup,
    };
    Error::new(kind, e.message)
}

/// A path as the API takes it (relative to /work, or absolute under it), checked; the
/// error names the field.
pub fn work_path(path: &str, field: &'static str) -> Result<WorkPath, Error> {
    WorkPath::parse(path).map_err(|e| Error::invalid(format!("{field}: {}", e.message)).on(field))
}

/// The session's /work, if `caller` may see the session.
pub(crate) fn work_of(state: &Shared, caller: &Caller, id: &str) -> Result<Arc<WorkDir>, Error> {
    lookup(state, caller, id)?.work.clone().ok_or_else(|| {
        Error::new(
            Kind::Setup,
            format!("session {id}'s /work cannot be reached from the host"),
        )
    })
}

/// Runs `f` on the session's /work on a blocking thread (a tree removed may be large).
async fn on_work<T: Send + 'static>(
    state: &Shared,
    caller: &Caller,
    id: &str,
    f: impl FnOnce(&WorkDir) -> Result<T, FsError> + Send + 'static,
) -> Result<T, Error> {
    let work = work_of(state, caller, id)?;
    tokio::task::spawn_blocking(move || f(&work))
        .await
        .map_err(|e| Error::new(Kind::Setup, e.to_string()))?
        .map_err(error_of)
}

/// `path`'s entry (a symlink's own, not followed).
pub async fn stat_path(
    state: &Shared,
    caller: &Caller,
    id: &str,
    path: &str,
) -> Result<FsEntry, Error> {
    let path = work_path(path, "path")?;
    on_work(state, caller, id, move |w| w.stat(&path))
        .await
        .map(FsEntry::from)
}

/// The entries of directory `path` to `depth` levels (1: its own entries; at most
/// [`codecage::workdir::MAX_DEPTH`]), sorted by path; symlinks are listed, not entered.
pub async fn list_dir(
    state: &Shared,
    caller: &Caller,
    id: &str,
    path: &str,
    depth: u32,
) -> Result<Vec<FsEntry>, Error> {
    let path = work_path(path, "path")?;
    let entries = on_work(state, caller, id, move |w| w.list(&path, depth)).await?;
    Ok(entries.into_iter().map(FsEntry::from).collect())
}

/// Makes directory `path` with its missing parents (`mkdir -p`), owned by the sandbox
/// user; says whether it was made or there. 409 if something else is there.
pub async fn make_dir(
    state: &Shared,
    caller: &Caller,
    id: &str,
    path: &str,
) -> Result<MadeDir, Error> {
    let path = work_path(path, "path")?;
    let (entry, created) = on_work(state, caller, id, move |w| w.make_dir(&path)).await?;
    Ok(MadeDir {
        entry: entry.into(),
        created,
    })
}

/// Moves (renames) `source` to `destination` (its parent must exist); an existing
/// destination is 409 unless `overwrite`. The entry at its new path.
pub async fn move_path(
    state: &Shared,
    caller: &Caller,
    id: &str,
    source: &str,
    destination: &str,
    overwrite: bool,
) -> Result<FsEntry, Error> {
    let source = work_path(source, "source")?;
    let destination = work_path(destination, "destination")?;
    on_work(state, caller, id, move |w| {
        w.move_to(&source, &destination, overwrite)
    })
    .await
    .map(FsEntry::from)
}

/// Removes `path`: a file or a symlink (not what it points to), or a directory and
/// everything under it.
pub async fn remove_path(
    state: &Shared,
    caller: &Caller,
    id: &str,
    path: &str,
) -> Result<(), Error> {
    let path = work_path(path, "path")?;
    on_work(state, caller, id, move |w| w.remove(&path)).await
}

/// `POST .../fs/mkdir` and `POST .../fs/remove`: a path.
#[derive(Debug, Clone, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PathRequest {
    /// Relative to /work, or absolute under /work (no `..`).
    pub path: String,
}

/// `POST .../fs/move`.
#[derive(Debug, Clone, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    /// What to move: relative to /work, or absolute under /work (no `..`).
    pub source: String,
    /// Its new path; its parent directory must exist.
    pub destination: String,
    /// Replace an existing destination (a file, or an empty directory by a directory);
    /// default false: 409 if it exists.
    #[serde(default)]
    pub overwrite: bool,
}
