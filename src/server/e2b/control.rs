//! E2B's control plane (`E2B_API_URL`): create, get, list, kill, set the timeout,
//! connect; what codecage does not do (pause, resume, snapshots, fork, metrics, logs,
//! templates, volumes) answers an error the SDK shows as it is.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{E2b, E2bError, E2bResult, Record, ENVD_VERSION};
use crate::audit::Via;
use crate::server::api::JsonBody;
use crate::server::{Caller, Shared};
use crate::service::{self, SessionRequest};

/// E2B's default sandbox lifetime, when create names none.
const DEFAULT_TIMEOUT: u64 = 300;

pub(super) fn router(state: Shared) -> Router {
    Router::new()
        .route("/sandboxes", post(create).get(list))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(detail).delete(kill_handler))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/pause", post(not_done))
        .route("/sandboxes/{id}/resume", post(not_done))
        .route("/sandboxes/{id}/snapshots", post(not_done))
        .route("/sandboxes/{id}/fork", post(not_done))
        .route("/sandboxes/{id}/refreshes", post(not_done))
        .route("/sandboxes/{id}/network", axum::routing::put(not_done))
        .route("/sandboxes/{id}/metrics", get(not_done))
        .route("/sandboxes/{id}/logs", get(not_done))
        .route("/v2/sandboxes/{id}/logs", get(not_done))
        .route("/sandboxes/metrics", get(not_done))
        .route("/templates/{id}", delete(not_done))
        .fallback(unknown)
        .with_state(state)
}

/// `POST /v2/sandboxes` (and v1's): what the SDK's `Sandbox.create()` sends.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<u64>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    auto_pause: Option<bool>,
    #[serde(default)]
    volume_mounts: Option<Vec<Value>>,
    #[serde(default)]
    mcp: Option<Value>,
    #[serde(default)]
    network: Option<Value>,
}

fn refused(what: &str) -> E2bError {
    E2bError::new(StatusCode::BAD_REQUEST, what.to_string())
}

async fn create(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<NewSandbox>,
) -> E2bResult<Response> {
    if body.allow_internet_access == Some(true) {
        return Err(refused(
            "allow_internet_access = true: codecage sandboxes have no network unless their profile gives one; ask the operator for a template whose profile has the network you need",
        ));
    }
    if body.auto_pause == Some(true) {
        return Err(refused(
            "autoPause: codecage does not pause sandboxes (a sandbox ends at its timeout)",
        ));
    }
    if body.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(refused(
            "volumeMounts: codecage's E2B front end does not mount E2B volumes",
        ));
    }
    if body
        .network
        .as_ref()
        .is_some_and(|n| !n.is_null() && n.as_object().is_none_or(|o| !o.is_empty()))
    {
        return Err(refused(
            "network: codecage's E2B front end does not take network rules; a template's profile says what network its sandboxes have",
        ));
    }
    if body.mcp.as_ref().is_some_and(|m| !m.is_null()) {
        return Err(refused(
            "mcp: codecage does not run an MCP gateway in the sandbox",
        ));
    }
    let profile = e2b
        .config
        .templates
        .get(&body.template_id)
        .cloned()
        .ok_or_else(|| {
            let known: Vec<&str> = e2b.config.templates.keys().map(String::as_str).collect();
            E2bError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "template {:?} is not one of this server's ([e2b] templates: {}); codecage builds no templates",
                    body.template_id,
                    known.join(", ")
                ),
            )
        })?;
    let timeout = body.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let loaded = service::load_profile(&e2b.state, &profile)?;
    let language = loaded.language.ok_or_else(|| {
        E2bError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "template {:?}'s profile {profile} names no language",
                body.template_id
            ),
        )
    })?;
    let request = SessionRequest {
        profile: Some(profile),
        env: body.env_vars.unwrap_or_default(),
        ..SessionRequest::new(language)
    };
    let entry = service::open_session(&e2b.state, &caller, Via::E2b, request).await?;
    let max_end = entry.created + entry.max_duration;
    let end = (SystemTime::now() + Duration::from_secs(timeout)).min(max_end);
    let (cpus, memory_mb, disk_mb) = {
        let guard = entry.session.lock().unwrap_or_else(|e| e.into_inner());
        guard.as_ref().map_or((1, 0, 0), |s| {
            let sandbox = &s.spec().sandbox;
            let limits = sandbox.limits.unwrap_or_default();
            (
                limits
                    .cpu_quota_us
                    .div_ceil(codecage::spec::CPU_PERIOD_US)
                    .max(1),
                limits.memory >> 20,
                sandbox.work_size >> 20,
            )
        })
    };
    let token = match service::tenancy::new_id() {
        Ok(token) => token,
        Err(e) => {
            let _ = service::close_session(&e2b.state, &caller, Via::E2b, &entry.id).await;
            return Err(e.into());
        }
    };
    let record = Arc::new(Record {
        id: entry.id.clone(),
        caller,
        template: body.template_id,
        metadata: body.metadata.unwrap_or_default(),
        token,
        started: entry.created,
        end: Mutex::new(end),
        cpus,
        memory_mb,
        disk_mb,
        watchers: Mutex::default(),
    });
    e2b.sandboxes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(record.id.clone(), record.clone());
    Ok((StatusCode::CREATED, Json(created(&record))).into_response())
}

/// The create and connect answer (E2B's `Sandbox`).
fn created(record: &Record) -> Value {
    json!({
        "templateID": record.template,
        "sandboxID": record.id,
        "clientID": "codecage",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": record.token,
        "trafficAccessToken": record.token,
        "domain": null,
    })
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// E2B's `ListedSandbox` (and, with the token, `SandboxDetail`).
fn listed(record: &Record) -> Value {
    json!({
        "templateID": record.template,
        "sandboxID": record.id,
        "clientID": "codecage",
        "startedAt": rfc3339(record.started),
        "endAt": rfc3339(record.end()),
        "cpuCount": record.cpus,
        "memoryMB": record.memory_mb,
        "diskSizeMB": record.disk_mb,
        "state": "running",
        "envdVersion": ENVD_VERSION,
        "metadata": record.metadata,
    })
}

/// The caller's sandbox `id`, live: 404 otherwise (another caller's is not revealed).
fn owned(e2b: &E2b, caller: &Caller, id: &str) -> E2bResult<Arc<Record>> {
    let missing = || E2bError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found"));
    let record = e2b.record(id).ok_or_else(missing)?;
    // The service decides who may see the session.
    match service::lookup(&e2b.state, caller, id) {
        Ok(_) => Ok(record),
        Err(e) if e.kind == service::Kind::NotFound => Err(missing()),
        Err(e) => {
            e2b.forget(id);
            Err(e.into())
        }
    }
}

async fn detail(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> E2bResult<Json<Value>> {
    let record = owned(&e2b, &caller, &id)?;
    let mut body = listed(&record);
    body["envdAccessToken"] = json!(record.token);
    body["allowInternetAccess"] = json!(false);
    Ok(Json(body))
}

#[derive(Deserialize)]
struct ListQuery {
    /// `k=v&k2=v2`, URL-encoded once more by the SDK.
    metadata: Option<String>,
    /// `running,paused`.
    state: Option<String>,
}

async fn list(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<ListQuery>,
) -> E2bResult<Json<Vec<Value>>> {
    let wanted: Vec<(String, String)> = query
        .metadata
        .as_deref()
        .map(|m| {
            url_pairs(m)
                .into_iter()
                .filter(|(k, _)| !k.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let running_wanted = query
        .state
        .as_deref()
        .is_none_or(|s| s.split(',').any(|s| s.trim() == "running"));
    let mut records: Vec<Arc<Record>> = service::list_sessions(&e2b.state, &caller)
        .into_iter()
        .filter_map(|entry| e2b.record(&entry.id))
        .filter(|r| {
            wanted
                .iter()
                .all(|(k, v)| r.metadata.get(k).is_some_and(|m| m == v))
        })
        .collect();
    if !running_wanted {
        records.clear();
    }
    records.sort_by_key(|r| r.started);
    Ok(Json(records.iter().map(|r| listed(r)).collect()))
}

/// `k=v&k2=v2`, percent-decoded.
fn url_pairs(text: &str) -> Vec<(String, String)> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8_lossy()
            .to_string()
    };
    text.split('&')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((decode(k), decode(v)))
        })
        .collect()
}

/// Closes the sandbox's session and forgets it.
pub(super) async fn kill(e2b: &E2b, record: &Record) -> Result<(), service::Error> {
    let result = service::close_session(&e2b.state, &record.caller, Via::E2b, &record.id).await;
    e2b.forget(&record.id);
    result
}

async fn kill_handler(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let record = owned(&e2b, &caller, &id)?;
    match service::close_session(&e2b.state, &caller, Via::E2b, &record.id).await {
        Ok(()) => {
            e2b.forget(&id);
            Ok(StatusCode::NO_CONTENT)
        }
        Err(e) if e.kind == service::Kind::NotFound => {
            e2b.forget(&id);
            Err(E2bError::new(
                StatusCode::NOT_FOUND,
                format!("sandbox {id} not found"),
            ))
        }
        Err(e) => Err(e.into()),
    }
}

#[derive(Deserialize)]
struct TimeoutBody {
    timeout: u64,
}

/// Moves the sandbox's end to `timeout` seconds from now, within its profile's maximum
/// lifetime (a longer one is refused, naming it).
fn move_end(e2b: &E2b, record: &Record, timeout: u64, only_later: bool) -> E2bResult<()> {
    let entry = service::lookup(&e2b.state, &record.caller, &record.id)?;
    let max_end = entry.created + entry.max_duration;
    let end = SystemTime::now() + Duration::from_secs(timeout);
    if end > max_end {
        let left = max_end
            .duration_since(SystemTime::now())
            .unwrap_or_default()
            .as_secs();
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "a timeout of {timeout} s is past the sandbox's maximum lifetime (its profile {}'s max_duration of {}): at most {left} s from now",
                entry.profile,
                codecage::units::format_duration(entry.max_duration)
            ),
        ));
    }
    let mut current = record.end.lock().unwrap_or_else(|e| e.into_inner());
    if !only_later || end > *current {
        *current = end;
    }
    Ok(())
}

async fn set_timeout(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<TimeoutBody>,
) -> E2bResult<StatusCode> {
    let record = owned(&e2b, &caller, &id)?;
    move_end(&e2b, &record, body.timeout, false)?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct ConnectBody {
    timeout: Option<u64>,
}

/// Connects to a running sandbox (there are no paused ones): its create answer again,
/// and its end moved later if `timeout` asks.
async fn connect(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Option<Json<ConnectBody>>,
) -> E2bResult<Json<Value>> {
    let record = owned(&e2b, &caller, &id)?;
    if let Some(timeout) = body.and_then(|b| b.0.timeout) {
        move_end(&e2b, &record, timeout, true)?;
    }
    Ok(Json(created(&record)))
}

/// What E2B has and codecage does not: said so, with the status the SDK shows as an error.
async fn not_done(request: axum::extract::OriginalUri) -> E2bResult<Response> {
    let path = request.path();
    let what = if path.ends_with("/pause") || path.ends_with("/resume") {
        "pausing and resuming sandboxes"
    } else if path.ends_with("/snapshots") || path.starts_with("/templates") {
        "snapshots and templates"
    } else if path.ends_with("/fork") {
        "forking sandboxes"
    } else if path.contains("metrics") {
        "sandbox metrics"
    } else if path.ends_with("/logs") {
        "sandbox logs"
    } else if path.ends_with("/network") {
        "changing a sandbox's network"
    } else {
        "this call"
    };
    Err(E2bError::new(
        StatusCode::NOT_IMPLEMENTED,
        format!("codecage's E2B front end does not do {what} ({path}); see README's E2B compatibility table"),
    ))
}

async fn unknown(request: axum::extract::OriginalUri) -> E2bResult<Response> {
    Err(E2bError::new(
        StatusCode::NOT_FOUND,
        format!(
            "{} is not part of codecage's E2B front end (see README's E2B compatibility table)",
            request.path()
        ),
    ))
}
