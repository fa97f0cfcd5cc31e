//! The E2B-compatible front end (`[e2b]` in the server's config): what E2B's SDKs send,
//! answered from the service layer, on a listener of its own. Like the HTTP API and MCP it
//! translates and decides nothing: a sandbox is a session (its id is the session's id),
//! a template names a profile, a code context is a session context, an envd process is
//! one of the session's background processes, envd's filesystem calls are service::fs on
//! the session's /work, `/home/user` is `/work`.
//!
//! One router answers both of the SDK's destinations, `E2B_API_URL` and
//! `E2B_SANDBOX_URL`: a request with `E2b-Sandbox-Id` is sandbox traffic, told apart by
//! `E2b-Sandbox-Port` (49999 the code interpreter, 49983 envd) and authenticated by the
//! sandbox's access token (`X-Access-Token`, or `E2B-Traffic-Access-Token` which the
//! code interpreter's context calls send alone); anything else is the control plane,
//! authenticated by `X-API-Key`, one of the server's tokens. The sandbox's token is
//! bound to the caller that made it: its traffic acts as that caller, so tenancy holds
//! as in the API.

mod connect;
mod control;
mod envd;
mod filesystem;
mod interpreter;
mod process;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use tower::ServiceExt as _;

use super::{Caller, Shared};
use crate::service::{self, Kind};

/// The code interpreter's port, as the SDK names it in `E2b-Sandbox-Port`.
pub const INTERPRETER_PORT: &str = "49999";
/// envd's port.
pub const ENVD_PORT: &str = "49983";
/// The envd version the answers carry: the newest the SDKs gate on (E2B's Python SDK
/// 2.63 and JS SDK 2.x), so that they take their current paths.
pub const ENVD_VERSION: &str = "0.6.4";
/// E2B's home directory: the sandbox's /work.
pub const HOME: &str = "/home/user";

/// `[e2b]`: the E2B-compatible front end, off unless `listen` is given.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct E2bConfig {
    /// `HOST:PORT` (plain HTTP: behind the operator's TLS proxy). The SDK's
    /// `E2B_API_URL` and `E2B_SANDBOX_URL` both point here.
    pub listen: Option<String>,
    /// E2B template name -> codecage profile.
    pub templates: BTreeMap<String, String>,
}

impl Default for E2bConfig {
    fn default() -> Self {
        let python = |name: &str| (name.to_string(), "python".to_string());
        E2bConfig {
            listen: None,
            templates: [
                python("code-interpreter-v1"),
                python("code-interpreter"),
                python("code-interpreter-stateful"),
            ]
            .into_iter()
            .collect(),
        }
    }
}

/// What the front end keeps of a sandbox beside its session: what the control plane
/// answers, and the token its traffic must carry.
pub(crate) struct Record {
    pub id: String,
    /// Who made it: its traffic acts as this caller.
    pub caller: Caller,
    pub template: String,
    pub metadata: BTreeMap<String, String>,
    pub token: String,
    pub started: SystemTime,
    /// When the front end closes it (E2B's `timeout`, moved by `set_timeout`).
    pub end: Mutex<SystemTime>,
    pub cpus: u64,
    pub memory_mb: u64,
    pub disk_mb: u64,
    /// envd's watchers (filesystem.CreateWatcher) -> the cursor of the service's
    /// watcher: GetWatcherEvents answers what came since its last answer.
    pub watchers: Mutex<HashMap<String, WatcherCursor>>,
}

/// Where an envd watcher's reader is: the service watcher's cursor, the events it had
/// lost when last asked (more since is an answer's data loss), and whether its events
/// carry their entries (`include_entry`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WatcherCursor {
    pub cursor: u64,
    pub lost: u64,
    pub include_entry: bool,
}

impl Record {
    pub fn end(&self) -> SystemTime {
        *self.end.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The front end's state: the server's, and its sandboxes' records.
pub(crate) struct E2b {
    pub state: Shared,
    pub config: E2bConfig,
    pub sandboxes: Mutex<HashMap<String, Arc<Record>>>,
}

impl E2b {
    pub fn record(&self, id: &str) -> Option<Arc<Record>> {
        self.sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    pub fn forget(&self, id: &str) -> Option<Arc<Record>> {
        self.sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id)
    }

    pub fn all(&self) -> Vec<Arc<Record>> {
        self.sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

/// An error as E2B's API and envd answer one: `{"code": status, "message": ...}` (the
/// SDKs read `message`; 401 becomes their AuthenticationException). It carries what the
/// audit of refusals reads (as the API's errors do), and whether the service recorded it
/// already.
pub(crate) struct E2bError {
    pub status: StatusCode,
    pub message: String,
    kind: Kind,
    audited: bool,
}

impl E2bError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> E2bError {
        let kind = match status {
            StatusCode::UNAUTHORIZED => Kind::Unauthorized,
            StatusCode::NOT_FOUND | StatusCode::BAD_GATEWAY => Kind::NotFound,
            StatusCode::FORBIDDEN | StatusCode::NOT_IMPLEMENTED => Kind::Policy,
            StatusCode::CONFLICT => Kind::Busy,
            StatusCode::PAYLOAD_TOO_LARGE => Kind::PayloadTooLarge,
            StatusCode::TOO_MANY_REQUESTS => Kind::Quota,
            StatusCode::SERVICE_UNAVAILABLE => Kind::Capacity,
            s if s.is_server_error() => Kind::Setup,
            _ => Kind::InvalidRequest,
        };
        E2bError {
            status,
            message: message.into(),
            kind,
            audited: false,
        }
    }

    /// Sandbox traffic to a sandbox that is gone: 502 with the words E2B's proxy uses,
    /// which the SDKs turn into "the sandbox was killed or reached its timeout".
    pub fn gone(id: &str) -> E2bError {
        E2bError::new(
            StatusCode::BAD_GATEWAY,
            format!("The sandbox {id} was not found"),
        )
    }
}

impl From<service::Error> for E2bError {
    fn from(e: service::Error) -> E2bError {
        let status = match e.kind {
            // A session past its lifetime is, to E2B's clients, a sandbox not found.
            Kind::SessionExpired | Kind::SessionLost => StatusCode::NOT_FOUND,
            kind => super::api::status_of(kind),
        };
        E2bError {
            status,
            message: format!("{}: {}", e.kind.name(), e.message),
            kind: e.kind,
            audited: e.audited,
        }
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        // What the API's error answer carries for the audit of refusals.
        let mut error = service::Error::new(self.kind, self.message.clone());
        if self.audited {
            error = error.audited();
        }
        let mut api = error.into_response();
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        let mut response = (self.status, Json(body)).into_response();
        *response.extensions_mut() = std::mem::take(api.extensions_mut());
        response
    }
}

pub(crate) type E2bResult<T> = Result<T, E2bError>;

/// The front end's router: control plane and sandbox traffic, told apart by the headers.
pub fn router(state: Shared) -> axum::Router {
    let e2b = Arc::new(E2b {
        config: state.config.e2b.clone(),
        state: state.clone(),
        sandboxes: Mutex::new(HashMap::new()),
    });
    tokio::spawn(reap_forever(e2b.clone()));
    let control = control::router(state.clone()).layer(axum::Extension(e2b.clone()));
    let interpreter = interpreter::router(state.clone()).layer(axum::Extension(e2b.clone()));
    let envd = envd::router(state.clone()).layer(axum::Extension(e2b.clone()));
    axum::Router::new().fallback(move |request: Request| {
        let (control, interpreter, envd, e2b) = (
            control.clone(),
            interpreter.clone(),
            envd.clone(),
            e2b.clone(),
        );
        async move {
            let headers = request.headers();
            let Some(id) = header(headers, "e2b-sandbox-id") else {
                let caller = match api_caller(&e2b.state, headers) {
                    Ok(caller) => caller,
                    Err(e) => return e.into_response(),
                };
                let mut request = request;
                request.extensions_mut().insert(caller.clone());
                let mut response = control
                    .oneshot(request)
                    .await
                    .unwrap_or_else(|e| match e {});
                // For the audit of refusals, which sits outside.
                response.extensions_mut().insert(caller);
                return response;
            };
            let port = header(headers, "e2b-sandbox-port").unwrap_or_default();
            let target = match port.as_str() {
                INTERPRETER_PORT => interpreter,
                ENVD_PORT => envd,
                other => {
                    return E2bError::new(
                        StatusCode::BAD_GATEWAY,
                        format!(
                            "port {other:?} of sandbox {id}: the port is not open (codecage answers the code interpreter's {INTERPRETER_PORT} and envd's {ENVD_PORT} only)"
                        ),
                    )
                    .into_response()
                }
            };
            match sandbox_caller(&e2b, &id, headers) {
                Ok(record) => {
                    let caller = record.caller.clone();
                    let mut request = request;
                    request.extensions_mut().insert(record);
                    let mut response = target.oneshot(request).await.unwrap_or_else(|e| match e {});
                    response.extensions_mut().insert(caller);
                    response
                }
                Err(e) => e.into_response(),
            }
        }
    })
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Sandbox traffic: the sandbox must be one this front end made and is still alive, and
/// the request must carry its token.
fn sandbox_caller(e2b: &E2b, id: &str, headers: &HeaderMap) -> E2bResult<Arc<Record>> {
    let record = e2b.record(id).ok_or_else(|| E2bError::gone(id))?;
    let presented =
        header(headers, "x-access-token").or_else(|| header(headers, "e2b-traffic-access-token"));
    match presented {
        Some(token) if constant_time_eq(token.as_bytes(), record.token.as_bytes()) => Ok(record),
        Some(_) => Err(E2bError::new(
            StatusCode::UNAUTHORIZED,
            format!("the access token is not sandbox {id}'s (X-Access-Token: the envdAccessToken its create answered)"),
        )),
        None => Err(E2bError::new(
            StatusCode::UNAUTHORIZED,
            format!("sandbox {id}'s traffic needs its access token (X-Access-Token: the envdAccessToken its create answered)"),
        )),
    }
}

/// The control plane's caller: `X-API-Key` (E2B's API key), one of the server's tokens.
pub(crate) fn api_caller(state: &Shared, headers: &HeaderMap) -> E2bResult<Caller> {
    let presented = header(headers, "x-api-key").ok_or_else(|| {
        E2bError::new(
            StatusCode::UNAUTHORIZED,
            "this server needs an API key in X-API-Key (E2B_API_KEY): one of its tokens",
        )
    })?;
    state
        .config
        .tokens
        .iter()
        .find(|t| constant_time_eq(t.token.as_bytes(), presented.as_bytes()))
        .map(|t| Caller::Token {
            name: t.name.clone(),
            role: t.grant.role,
        })
        .ok_or_else(|| {
            E2bError::new(
                StatusCode::UNAUTHORIZED,
                "the API key is not one of this server's tokens",
            )
        })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A path as E2B names it, relative to /work: `/home/user/x` and `x` are /work/x, and
/// /work/x is too; anything else is outside what codecage's file calls reach.
pub(crate) fn work_path(path: &str) -> E2bResult<String> {
    let rest = if let Some(rest) = path.strip_prefix(HOME) {
        rest
    } else if path.starts_with('/') {
        match path.strip_prefix("/work") {
            Some(rest) => rest,
            None => {
                return Err(E2bError::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "path {path:?}: codecage's E2B front end reaches files under {HOME} (the sandbox's /work) only"
                    ),
                ))
            }
        }
    } else {
        return Ok(path.to_string());
    };
    if !rest.is_empty() && !rest.starts_with('/') {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("path {path:?}: codecage's E2B front end reaches files under {HOME} only"),
        ));
    }
    Ok(rest.trim_start_matches('/').to_string())
}

/// Closes the sandboxes past their E2B timeout, and forgets those whose session ended.
async fn reap_forever(e2b: Arc<E2b>) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        let now = SystemTime::now();
        for record in e2b.all() {
            let alive = service::lookup(&e2b.state, &record.caller, &record.id).is_ok();
            if !alive {
                e2b.forget(&record.id);
            } else if record.end() <= now {
                tracing::info!(session = %record.id, "e2b: the sandbox's timeout passed; closing it");
                let _ = control::kill(&e2b, &record).await;
            }
        }
    }
}

/// Serves the front end on `addr` until `shutdown` fires.
pub(crate) async fn listener(
    state: &Shared,
    addr: &str,
) -> Result<(tokio::net::TcpListener, axum::Router), String> {
    if state.config.tokens.is_empty() {
        return Err(format!(
            "[e2b] listen = {addr:?} needs tokens (the E2B API keys): give --token-file FILE or [[tokens]] in the config"
        ));
    }
    for (template, profile) in &state.config.e2b.templates {
        service::load_profile(state, profile)
            .map_err(|e| format!("[e2b] templates.{template} = {profile:?}: {}", e.message))?;
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("[e2b] cannot listen on {addr}: {e}"))?;
    tracing::info!(%addr, "e2b: listening");
    let app = router(state.clone())
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            super::pool::count_requests,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            super::api::audit_errors,
        ))
        .layer(axum::Extension(crate::audit::Via::E2b));
    Ok((listener, app))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2b_paths_map_to_work() {
        assert_eq!(work_path("/home/user/a.txt").ok().unwrap(), "a.txt");
        assert_eq!(work_path("/home/user").ok().unwrap(), "");
        assert_eq!(work_path("a/b.txt").ok().unwrap(), "a/b.txt");
        assert_eq!(work_path("/work/c").ok().unwrap(), "c");
        assert!(work_path("/etc/passwd").is_err());
        assert!(work_path("/home/username/x").is_err());
        assert!(work_path("/workshop").is_err());
    }
}
