//! envd's filesystem service (`filesystem.Filesystem`) over Connect with the JSON codec, as
//! E2B's SDKs call it (`files.list`, `get_info`, `exists`, `make_dir`, `rename`, `remove`,
//! `watch_dir`): each call is one of the service's operations on the session's /work
//! (service::fs), which decides (escapes, symlinks, mounts, tenancy); this translates
//! E2B's paths (`/home/user` is /work), its `EntryInfo` and `FilesystemEvent` and its
//! error codes. WatchDir is a stream of the service's watch; CreateWatcher,
//! GetWatcherEvents and RemoveWatcher are the service's polled watchers, with the cursor
//! kept here (E2B's poll answers what came since the last one).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::{Extension, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{
    answer, check_user, envelope, message, streamed, streaming, ConnectError, Unary,
};
use super::{work_path, E2b, Record, WatcherCursor, HOME};
use crate::server::api::RawBody;
use crate::server::Shared;
use crate::service::fs::{self, FsEntry, WatchEvent};

pub(super) fn routes(router: Router<Shared>) -> Router<Shared> {
    router
        .route("/filesystem.Filesystem/Stat", post(stat))
        .route("/filesystem.Filesystem/ListDir", post(list_dir))
        .route("/filesystem.Filesystem/MakeDir", post(make_dir))
        .route("/filesystem.Filesystem/Move", post(move_path))
        .route("/filesystem.Filesystem/Remove", post(remove))
        .route("/filesystem.Filesystem/WatchDir", post(watch_dir))
        .route("/filesystem.Filesystem/CreateWatcher", post(create_watcher))
        .route(
            "/filesystem.Filesystem/GetWatcherEvents",
            post(get_watcher_events),
        )
        .route("/filesystem.Filesystem/RemoveWatcher", post(remove_watcher))
}

/// A stream with nothing to say sends a keepalive this often.
const KEEPALIVE: Duration = Duration::from_secs(30);

/// An E2B path as the service takes it: `/home/user/x`, `/work/x` and `x` are /work/x;
/// the service refuses what is not beneath /work (`..`, symlinks, mounts).
fn path_of(path: &str, field: &str) -> Result<String, ConnectError> {
    work_path(path).map_err(|e| ConnectError::invalid(format!("{field}: {}", e.message)))
}

/// A /work path as E2B names it: under /home/user.
fn e2b_path(path: &str) -> String {
    match path.strip_prefix("/work") {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("{HOME}{rest}"),
        _ => path.to_string(),
    }
}

/// The sandbox's user, `sandbox` in codecage, is E2B's `user`.
fn e2b_user(name: &str) -> &str {
    if name == "sandbox" {
        "user"
    } else {
        name
    }
}

/// E2B's `EntryInfo` (proto3 JSON: camelCase names, enum names, int64 as a string).
fn entry_info(entry: &FsEntry) -> Value {
    let file_type = match entry.kind.as_str() {
        "file" => "FILE_TYPE_FILE",
        "dir" => "FILE_TYPE_DIRECTORY",
        "symlink" => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_UNSPECIFIED",
    };
    let mut info = json!({
        "name": entry.name,
        "type": file_type,
        "path": e2b_path(&entry.path),
        "size": entry.size.to_string(),
        "mode": entry.mode,
        "permissions": entry.permissions,
        "owner": e2b_user(&entry.owner),
        "group": e2b_user(&entry.group),
        "modifiedTime": entry.modified_time,
        "isSymlink": entry.is_symlink,
    });
    if let Some(target) = &entry.symlink_target {
        info["symlinkTarget"] = json!(target);
    }
    info
}

/// E2B's `EventType` of a watch event; None for `overflow`, which E2B has no name for.
fn event_type(event: &WatchEvent) -> Option<&'static str> {
    Some(match event.kind.as_str() {
        "create" => "EVENT_TYPE_CREATE",
        "write" => "EVENT_TYPE_WRITE",
        "remove" => "EVENT_TYPE_REMOVE",
        "rename" => "EVENT_TYPE_RENAME",
        "chmod" => "EVENT_TYPE_CHMOD",
        _ => return None,
    })
}

/// E2B's `FilesystemEvent`; with `include_entry`, the entry where it is now (none when it
/// is gone: a remove, a rename away).
async fn fs_event(
    e2b: &E2b,
    record: &Record,
    event: &WatchEvent,
    kind: &str,
    include_entry: bool,
) -> Value {
    let mut value = json!({"name": event.name, "type": kind});
    if include_entry && !matches!(event.kind.as_str(), "remove" | "rename") {
        if let Ok(entry) = fs::stat_path(&e2b.state, &record.caller, &record.id, &event.path).await
        {
            value["entry"] = entry_info(&entry);
        }
    }
    value
}

fn overflowed() -> ConnectError {
    ConnectError {
        code: "data_loss",
        status: axum::http::StatusCode::INTERNAL_SERVER_ERROR,
        message: "the watch lost events: the kernel's inotify queue overflowed (too many changes at once); watch again".to_string(),
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PathBody {
    path: String,
    depth: u32,
}

async fn stat(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Unary {
    check_user(&headers)?;
    let body: PathBody = message(&body, false)?;
    let path = path_of(&body.path, "path")?;
    let entry = fs::stat_path(&e2b.state, &record.caller, &record.id, &path).await?;
    answer(json!({"entry": entry_info(&entry)}))
}

async fn list_dir(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Unary {
    check_user(&headers)?;
    let body: PathBody = message(&body, false)?;
    let path = path_of(&body.path, "path")?;
    // The SDK sends 0 for its default: one level, as envd takes it.
    let depth = body.depth.max(1);
    let entries = fs::list_dir(&e2b.state, &record.caller, &record.id, &path, depth).await?;
    let entries: Vec<Value> = entries.iter().map(entry_info).collect();
    answer(json!({"entries": entries}))
}

async fn make_dir(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Unary {
    check_user(&headers)?;
    let body: PathBody = message(&body, false)?;
    let path = path_of(&body.path, "path")?;
    let made = fs::make_dir(&e2b.state, &record.caller, &record.id, &path).await?;
    if !made.created {
        // envd answers an existing directory so; the SDK's make_dir returns False.
        return Err(ConnectError {
            code: "already_exists",
            status: axum::http::StatusCode::CONFLICT,
            message: format!("directory {} exists already", e2b_path(&made.entry.path)),
        });
    }
    answer(json!({"entry": entry_info(&made.entry)}))
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct MoveBody {
    source: String,
    destination: String,
}

async fn move_path(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Unary {
    check_user(&headers)?;
    let body: MoveBody = message(&body, false)?;
    let source = path_of(&body.source, "source")?;
    let destination = path_of(&body.destination, "destination")?;
    // envd's Move replaces what is at the destination (a rename(2)), as the service's
    // `overwrite` does: a file, or an empty directory by a directory.
    let entry = fs::move_path(
        &e2b.state,
        &record.caller,
        &record.id,
        &source,
        &destination,
        true,
    )
    .await?;
    answer(json!({"entry": entry_info(&entry)}))
}

async fn remove(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Unary {
    check_user(&headers)?;
    let body: PathBody = message(&body, false)?;
    let path = path_of(&body.path, "path")?;
    fs::remove_path(&e2b.state, &record.caller, &record.id, &path).await?;
    answer(json!({}))
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WatchBody {
    #[serde(alias = "path")]
    path: String,
    recursive: bool,
    #[serde(alias = "include_entry")]
    include_entry: bool,
    /// Taken and unused: a session's /work has no network mounts (and a watch never
    /// enters a mount).
    #[serde(alias = "allow_network_mounts")]
    allow_network_mounts: bool,
}

async fn watch_dir(
    e2b: Extension<Arc<E2b>>,
    record: Extension<Arc<Record>>,
    headers: HeaderMap,
    body: RawBody,
) -> Response {
    streamed(watch(e2b, record, headers, body).await)
}

async fn watch(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Unary {
    check_user(&headers)?;
    let body: WatchBody = message(&body, true)?;
    let _ = body.allow_network_mounts;
    let path = path_of(&body.path, "path")?;
    let mut watch = fs::watch_dir(
        &e2b.state,
        &record.caller,
        &record.id,
        &path,
        body.recursive,
    )
    .await?;
    let (sender, receiver) = tokio::sync::mpsc::channel::<Bytes>(64);
    let include_entry = body.include_entry;
    tokio::spawn(async move {
        if sender
            .send(envelope(0, &json!({"start": {}})))
            .await
            .is_err()
        {
            return;
        }
        let mut quiet_since = Instant::now();
        let end = 'watch: loop {
            let events = match watch.next(Duration::from_secs(1)).await {
                Ok(events) => events,
                Err(e) => break json!({"error": ConnectError::from(e).json()}),
            };
            for event in &events {
                let Some(kind) = event_type(event) else {
                    break 'watch json!({"error": overflowed().json()});
                };
                let value = fs_event(&e2b, &record, event, kind, include_entry).await;
                if sender
                    .send(envelope(0, &json!({"filesystem": value})))
                    .await
                    .is_err()
                {
                    return;
                }
                quiet_since = Instant::now();
            }
            if sender.is_closed() {
                return;
            }
            if quiet_since.elapsed() >= KEEPALIVE {
                if sender
                    .send(envelope(0, &json!({"keepalive": {}})))
                    .await
                    .is_err()
                {
                    return;
                }
                quiet_since = Instant::now();
            }
        };
        let _ = sender.send(envelope(2, &end)).await;
    });
    Ok(streaming(receiver))
}

async fn create_watcher(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Unary {
    check_user(&headers)?;
    let body: WatchBody = message(&body, false)?;
    let path = path_of(&body.path, "path")?;
    let made = fs::create_watcher(
        &e2b.state,
        &record.caller,
        &record.id,
        &path,
        body.recursive,
    )
    .await?;
    let cursor = WatcherCursor {
        include_entry: body.include_entry,
        ..WatcherCursor::default()
    };
    record
        .watchers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(made.watcher_id.clone(), cursor);
    answer(json!({"watcherId": made.watcher_id}))
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WatcherBody {
    #[serde(alias = "watcher_id")]
    watcher_id: String,
}

/// Where the reader of watcher `id` is.
fn watcher_of(record: &Record, id: &str) -> Result<WatcherCursor, ConnectError> {
    record
        .watchers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(id)
        .copied()
        .ok_or_else(|| {
            ConnectError::not_found(format!(
                "watcher {id:?}: no such watcher in sandbox {} (removed, or never made)",
                record.id
            ))
        })
}

async fn get_watcher_events(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Unary {
    check_user(&headers)?;
    let body: WatcherBody = message(&body, false)?;
    let seen = watcher_of(&record, &body.watcher_id)?;
    let polled = fs::poll_watcher(
        &e2b.state,
        &record.caller,
        &record.id,
        &body.watcher_id,
        Some(seen.cursor),
    )?;
    let keep = |cursor: u64| {
        let now = WatcherCursor {
            cursor,
            lost: polled.lost,
            ..seen
        };
        record
            .watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(body.watcher_id.clone(), now);
    };
    if polled.lost > seen.lost {
        // Said once; the events still kept come with the next call.
        keep(seen.cursor);
        return Err(ConnectError {
            code: "data_loss",
            status: axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            message: format!(
                "watcher {}: {} events were dropped, past the {} it keeps between polls (poll more often); the next call answers those kept",
                body.watcher_id,
                polled.lost - seen.lost,
                fs::WATCHER_BUFFER
            ),
        });
    }
    // The events before an overflow are answered; the overflow is the next call's error,
    // and the events after it the call after.
    let overflow = polled
        .events
        .iter()
        .position(|seq| event_type(&seq.event).is_none());
    match overflow {
        Some(0) => {
            keep(polled.events[0].seq);
            return Err(overflowed());
        }
        Some(at) => keep(polled.events[at - 1].seq),
        None => keep(polled.cursor),
    }
    if polled.events.is_empty() {
        if let Some(ended) = polled.ended {
            return Err(ConnectError::not_found(format!(
                "watcher {}: the watch is over: {ended}",
                body.watcher_id
            )));
        }
    }
    let mut events = Vec::new();
    for seq in &polled.events[..overflow.unwrap_or(polled.events.len())] {
        let kind = event_type(&seq.event).unwrap_or("EVENT_TYPE_UNSPECIFIED");
        events.push(fs_event(&e2b, &record, &seq.event, kind, seen.include_entry).await);
    }
    answer(json!({"events": events}))
}

async fn remove_watcher(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Unary {
    check_user(&headers)?;
    let body: WatcherBody = message(&body, false)?;
    watcher_of(&record, &body.watcher_id)?;
    record
        .watchers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&body.watcher_id);
    fs::remove_watcher(&e2b.state, &record.caller, &record.id, &body.watcher_id)?;
    answer(json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_users_read_as_e2b_names_them() {
        assert_eq!(e2b_path("/work"), "/home/user");
        assert_eq!(e2b_path("/work/a/b"), "/home/user/a/b");
        assert_eq!(e2b_path("/workshop"), "/workshop");
        assert_eq!(path_of("/home/user/a", "path").ok().unwrap(), "a");
        assert!(path_of("/etc/passwd", "path").is_err());
        assert_eq!(e2b_user("sandbox"), "user");
        assert_eq!(e2b_user("root"), "root");
    }
}
