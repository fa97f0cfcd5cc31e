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

/// One event of a watch, as the API gives it (E2B's `FilesystemEvent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct WatchEvent {
    /// `create` (made, or moved in), `write`, `remove`, `rename` (moved away: the new
    /// name comes as a `create`), `chmod` (mode, owner or times), `overflow` (the
    /// kernel's queue overflowed: events were lost).
    #[serde(rename = "type")]
    pub kind: String,
    /// The entry's path relative to the watched directory (`sub/a.txt`).
    pub name: String,
    /// Its absolute path: `/work/...`.
    pub path: String,
}

impl From<codecage::workdir::FsEvent> for WatchEvent {
    fn from(e: codecage::workdir::FsEvent) -> WatchEvent {
        WatchEvent {
            kind: e.kind.name().to_string(),
            name: e.name,
            path: e.path,
        }
    }
}

/// A watch on a directory of a session's /work, read as its events come (the streaming
/// front ends: HTTP's NDJSON, MCP; polled watchers). Dropping it ends it.
pub struct DirWatch {
    watch: codecage::workdir::AsyncWatch,
}

/// Watches directory `path` of the session's /work (with `recursive`, every directory
/// under it too, new ones as they come; never through a symlink or a mount).
pub async fn watch_dir(
    state: &Shared,
    caller: &Caller,
    id: &str,
    path: &str,
    recursive: bool,
) -> Result<DirWatch, Error> {
    let path = work_path(path, "path")?;
    let work = work_of(state, caller, id)?;
    let watch = tokio::task::spawn_blocking(move || work.watch(&path, recursive))
        .await
        .map_err(|e| Error::new(Kind::Setup, e.to_string()))?
        .map_err(error_of)?;
    let watch = codecage::workdir::AsyncWatch::new(watch)
        .map_err(|e| Error::new(Kind::Setup, format!("cannot poll the watch: {e}")))?;
    Ok(DirWatch { watch })
}

impl DirWatch {
    /// The watched directory, `/work/...`.
    pub fn path(&self) -> String {
        self.watch.get_ref().path()
    }

    /// The next events, waiting up to `wait` for some (none: nothing happened; the
    /// reactor wakes it, no thread waits). An error (404) once the session was closed or
    /// the watched directory removed; the watch is over then.
    pub async fn next(&mut self, wait: std::time::Duration) -> Result<Vec<WatchEvent>, Error> {
        Ok(self
            .watch
            .next(wait)
            .await
            .map_err(error_of)?
            .into_iter()
            .map(WatchEvent::from)
            .collect())
    }
}

/// Watchers a session holds at most (polled ones: see [`create_watcher`]).
pub const MAX_WATCHERS: usize = 16;
/// Events a polled watcher keeps for its poller; past it the oldest are dropped and
/// counted in `lost`.
pub const WATCHER_BUFFER: usize = 10_000;

/// A watcher a session holds for polling (E2B's CreateWatcher/GetWatcherEvents): a task
/// reads its watch as events come (so a new directory is followed at once, and the
/// kernel's queue does not overflow between polls) into a buffer, where they wait until a
/// poll's cursor says they were taken. Dropping it (removed, or the session's entry gone)
/// stops the task.
pub struct Polled {
    state: Arc<std::sync::Mutex<PolledState>>,
    _stop: tokio_util::sync::DropGuard,
}

#[derive(Default)]
struct PolledState {
    buffer: std::collections::VecDeque<(u64, WatchEvent)>,
    /// The last sequence number given.
    last_seq: u64,
    lost: u64,
    ended: Option<String>,
}

impl Polled {
    fn start(mut watch: DirWatch) -> Polled {
        let state = Arc::new(std::sync::Mutex::new(PolledState::default()));
        let stop = tokio_util::sync::CancellationToken::new();
        let (shared, stopped) = (state.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    _ = stopped.cancelled() => return,
                    next = watch.next(std::time::Duration::from_secs(1)) => next,
                };
                let mut state = shared.lock().unwrap_or_else(|e| e.into_inner());
                match next {
                    Ok(events) => {
                        for event in events {
                            state.last_seq += 1;
                            let seq = state.last_seq;
                            state.buffer.push_back((seq, event));
                        }
                        while state.buffer.len() > WATCHER_BUFFER {
                            state.buffer.pop_front();
                            state.lost += 1;
                        }
                    }
                    Err(e) => {
                        state.ended = Some(e.message);
                        return;
                    }
                }
            }
        });
        Polled {
            state,
            _stop: stop.drop_guard(),
        }
    }
}

/// What a poll of a watcher answers.
#[derive(Debug, Clone, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct WatcherEvents {
    /// The events after the cursor asked, oldest first.
    pub events: Vec<SeqEvent>,
    /// Give this as `after` next time: the last event's `seq` (or the cursor asked, if
    /// none came). Events up to the cursor given are forgotten.
    pub cursor: u64,
    /// Events dropped because the buffer was full (the poller was too slow).
    pub lost: u64,
    /// Why the watch is over (the directory removed, the session closed), once it is:
    /// the events before it are still given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
}

/// An event with its sequence number (1, 2, ...).
#[derive(Debug, Clone, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct SeqEvent {
    pub seq: u64,
    #[serde(flatten)]
    pub event: WatchEvent,
}

/// `POST .../fs/watchers` and `GET .../fs/watch`.
#[derive(Debug, Clone, serde::Deserialize, utoipa::ToSchema, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WatchRequest {
    /// The directory: relative to /work, or absolute under /work (default /work).
    #[serde(default)]
    #[param(required = false)]
    pub path: String,
    /// Every directory under it too (default false).
    #[serde(default)]
    #[param(required = false)]
    pub recursive: bool,
}

/// A watcher made.
#[derive(Debug, Clone, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct WatcherMade {
    pub watcher_id: String,
    /// The watched directory.
    pub path: String,
}

/// Makes a watcher on directory `path` that the session keeps until
/// [`remove_watcher`] or its close; [`poll_watcher`] takes its events.
pub async fn create_watcher(
    state: &Shared,
    caller: &Caller,
    id: &str,
    path: &str,
    recursive: bool,
) -> Result<WatcherMade, Error> {
    let entry = lookup(state, caller, id)?;
    let watch = watch_dir(state, caller, id, path, recursive).await?;
    let mut watchers = entry.watchers.lock().unwrap_or_else(|e| e.into_inner());
    if watchers.1.len() >= MAX_WATCHERS {
        return Err(Error::new(
            Kind::Policy,
            format!(
                "session {id} holds {MAX_WATCHERS} watchers already, the most it may: remove one first"
            ),
        ));
    }
    watchers.0 += 1;
    let watcher_id = format!("w{}", watchers.0);
    let made = WatcherMade {
        watcher_id: watcher_id.clone(),
        path: watch.path(),
    };
    watchers.1.insert(watcher_id, Polled::start(watch));
    Ok(made)
}

fn no_watcher(id: &str, watcher: &str) -> Error {
    Error::new(
        Kind::NotFound,
        format!("session {id} has no watcher {watcher}: make one with POST .../fs/watchers"),
    )
}

/// The events of watcher `watcher` after `after` (its last answer's cursor; 0 or None:
/// all it keeps). Never waits.
pub fn poll_watcher(
    state: &Shared,
    caller: &Caller,
    id: &str,
    watcher: &str,
    after: Option<u64>,
) -> Result<WatcherEvents, Error> {
    let entry = lookup(state, caller, id)?;
    let shared = {
        let watchers = entry.watchers.lock().unwrap_or_else(|e| e.into_inner());
        watchers
            .1
            .get(watcher)
            .ok_or_else(|| no_watcher(id, watcher))?
            .state
            .clone()
    };
    let mut polled = shared.lock().unwrap_or_else(|e| e.into_inner());
    let after = after.unwrap_or(0);
    while polled.buffer.front().is_some_and(|(seq, _)| *seq <= after) {
        polled.buffer.pop_front();
    }
    let events: Vec<SeqEvent> = polled
        .buffer
        .iter()
        .filter(|(seq, _)| *seq > after)
        .map(|(seq, event)| SeqEvent {
            seq: *seq,
            event: event.clone(),
        })
        .collect();
    Ok(WatcherEvents {
        cursor: events.last().map_or(after, |e| e.seq),
        events,
        lost: polled.lost,
        ended: polled.ended.clone(),
    })
}

/// Ends watcher `watcher`.
pub fn remove_watcher(
    state: &Shared,
    caller: &Caller,
    id: &str,
    watcher: &str,
) -> Result<(), Error> {
    let entry = lookup(state, caller, id)?;
    let mut watchers = entry.watchers.lock().unwrap_or_else(|e| e.into_inner());
    watchers
        .1
        .remove(watcher)
        .map(drop)
        .ok_or_else(|| no_watcher(id, watcher))
}
