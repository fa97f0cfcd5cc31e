//! The HTTP API: requests in, profile-resolved sandboxes and sessions out. Status codes
//! follow one rule: a request that ran returns 200 with the verdict in the body (timeout,
//! oom, exception are verdicts, not HTTP errors); refused before running: 400 invalid (the
//! message names the field), 401 no or bad token, 403 policy, 404 unknown session, 409
//! session busy, 413 body too large, 503 (with Retry-After) at capacity or when the audit
//! log cannot take the request's record (`audit.on_full = "refuse"`). Every execution and
//! every refusal is recorded in the audit log (src/audit); `/v1/audit` reads it, for
//! administrators.

use std::collections::BTreeMap;
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

use codecage::knobs::{Knob, Raw, Values};
use codecage::outcome::{encode_stream, ErrorKind, Outcome};
use codecage::profile::{self, PolicyError, Profile, Request as PolicyRequest};
use codecage::runner::Lang;
use codecage::session::{Call, CallOutcome, Event, Session, SessionSpec};
use codecage::{Canceller, Stream};

use super::registry::{self, Caps, Entry, Missing};
use super::{Caller, Shared};
use crate::audit::{self, AuditError, End, Kind, Start, Via};

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

/// An answer that is not a run's: `{"error": kind, "message": ...}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    retry_after: Option<u64>,
    /// Its refusal is in the audit log already (or cannot be: the audit's own refusal).
    audited: bool,
}

/// On an error response: what went wrong, for the audit of refusals outside the routes.
#[derive(Clone)]
struct ErrorInfo {
    kind: &'static str,
    message: String,
    audited: bool,
}

#[derive(Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// What went wrong, for a program: `invalid_request`, `unauthorized`, `policy`,
    /// `not_found`, `session_expired`, `busy`, `payload_too_large`, `capacity`, `setup`,
    /// `forbidden` (the audit API without the admin role), `audit_unavailable` (the audit
    /// log cannot take the request's record and its `on_full` is `refuse`).
    pub error: String,
    /// What went wrong and what to do, for a person or an agent.
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            retry_after: None,
            audited: false,
        }
    }

    fn audited(mut self) -> ApiError {
        self.audited = true;
        self
    }

    pub(super) fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// What went wrong, for a program (`invalid_request`, `policy`, `not_found`, ...).
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn into_response_now(self) -> Response {
        self.into_response()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let info = ErrorInfo {
            kind: self.kind,
            message: self.message.clone(),
            audited: self.audited,
        };
        let body = ErrorBody {
            error: self.kind.to_string(),
            message: self.message,
        };
        let mut response = (self.status, Json(body)).into_response();
        response.extensions_mut().insert(info);
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

impl From<PolicyError> for ApiError {
    fn from(e: PolicyError) -> ApiError {
        match e {
            PolicyError::Invalid(m) => ApiError::invalid(m),
            e @ (PolicyError::AboveMax { .. } | PolicyError::Forbidden(_)) => {
                ApiError::new(StatusCode::FORBIDDEN, "policy", e.to_string())
            }
        }
    }
}

/// A JSON body: malformed JSON, unknown fields and wrong types are 400 with the field's
/// path; a body over the cap is 413.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(request, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    "the request body is over the server's limit (limits.max_body)",
                )
            } else {
                ApiError::invalid(format!("cannot read the request body: {e}"))
            }
        })?;
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

/// `POST /v1/run`.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunRequest {
    /// python, node, typescript or bash: how `code` runs (default: the profile's).
    pub language: Option<Lang>,
    /// Code to run, in `language`.
    pub code: Option<String>,
    /// A program and its arguments, instead of code.
    pub argv: Option<Vec<String>>,
    /// A profile by name (default: the language's, or bash).
    pub profile: Option<String>,
    /// What the program reads on stdin.
    pub stdin: Option<String>,
    /// Environment variables to add (not PATH or LD_*).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The network mode: none, restricted or full, no looser than the profile's.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub network: Option<codecage::network::Mode>,
    /// Files placed in /work before the code runs: `{"path": "data/in.csv", "data":
    /// BASE64}` (within the profile's inputs caps).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub files: Vec<codecage::files::InputFile>,
    /// Whether the output files come back with their bytes (default) or by name only.
    pub file_data: Option<bool>,
    /// Host directories under /work, as `codecage run -v` takes them:
    /// `HOST_DIR:/work/DIR[:ro|:copy]` (read-only by default, or copied into /work within
    /// `work_size`); only under the server's `volume_roots`.
    #[serde(default)]
    pub volumes: Vec<String>,
    /// The limits, as in the profile: timeout, memory, cpus, pids, output_limit,
    /// tmp_size, work_size (a number, or a string with a unit: "30s", "256M").
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub limits: BTreeMap<String, serde_json::Value>,
}

/// `POST /v1/sessions`.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionRequest {
    /// python, node, typescript or bash.
    pub language: Lang,
    /// A profile by name (default: the language's).
    pub profile: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The network mode, as in `POST /v1/run`.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub network: Option<codecage::network::Mode>,
    /// The limits, as in `POST /v1/run`; `timeout` and `output_limit` are each call's.
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub limits: BTreeMap<String, serde_json::Value>,
}

/// `POST /v1/sessions/{id}/execute`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecuteRequest {
    pub code: String,
    /// Files placed in /work before the call, as in `POST /v1/run`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub files: Vec<codecage::files::InputFile>,
    /// Whether the call's output files come back with their bytes (default) or by name.
    pub file_data: Option<bool>,
    /// This call's time limit (default: the session's), e.g. "10s".
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub timeout: Option<Raw>,
    /// Text the cell reads on stdin.
    pub stdin: Option<String>,
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

/// `GET /healthz`: 200 `ok` while the server and its gateway can serve; 503 and why not
/// when the gateway cannot relay (its runtime stalled, its reaper far behind).
async fn healthz() -> (StatusCode, String) {
    match crate::gateway::Gateway::health().await {
        Ok(_) => (StatusCode::OK, "ok\n".into()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unhealthy\n{why}\n"),
        ),
    }
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
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint: see GET /openapi.json",
    )
}

/// The knob fields of a request: each must be a knob a request may set.
fn knobs_of(fields: &BTreeMap<String, serde_json::Value>, what: &str) -> Result<Values, ApiError> {
    let mut values = Values::new();
    for (key, value) in fields {
        let knob = Knob::from_key(key)
            .filter(|k| k.requestable())
            .ok_or_else(|| {
                let knobs: Vec<&str> = Knob::all()
                    .filter(|k| k.requestable())
                    .map(|k| k.key())
                    .collect();
                ApiError::invalid(format!(
                    "unknown field `{key}`: {what} takes {} and the limits {}",
                    match what {
                        "a run" => "language, code, argv, profile, stdin, env",
                        _ => "language, profile, env",
                    },
                    knobs.join(", ")
                ))
            })?;
        let raw: Raw = serde_json::from_value(value.clone()).map_err(|_| {
            ApiError::invalid(format!(
                "field `{key}`: give a number or a string with a unit"
            ))
        })?;
        let parsed = knob
            .from_raw(&raw)
            .map_err(|e| ApiError::invalid(format!("field `{key}`: {e}")))?;
        values.insert(knob, parsed);
    }
    Ok(values)
}

/// A profile by name: built in, or in /etc/codecage/profiles. Never a path: through the
/// server, the host's administrator chooses what profiles exist.
pub(super) fn load_profile(state: &Shared, name: &str) -> Result<Profile, ApiError> {
    let dir = state
        .config
        .profiles_dir
        .clone()
        .unwrap_or_else(|| profile::SYSTEM_DIR.into());
    if name.contains('/') || name.ends_with(".toml") || name.is_empty() {
        return Err(ApiError::invalid(format!(
            "field `profile`: {name:?} is not a profile name; the profiles are {}",
            profile::names_in(&dir).join(", ")
        )));
    }
    Profile::load_in(name, &dir).map_err(|e| ApiError::invalid(format!("field `profile`: {e}")))
}

/// Room for one more: at once if there is, else by evicting an idle pooled sandbox (the
/// pool only fills room nobody asks for), else after waiting up to the queue timeout;
/// 503 with Retry-After past it.
async fn room(
    semaphore: &Arc<tokio::sync::Semaphore>,
    state: &Shared,
    what: &str,
) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    if let Ok(permit) = semaphore.clone().try_acquire_owned() {
        return Ok(permit);
    }
    if Arc::ptr_eq(semaphore, &state.sandboxes) && state.pool.evict_one() {
        // The evicted sandbox gives its permit back once it is torn down (a few ms).
    }
    let wait = state.config.limits.queue_timeout;
    match tokio::time::timeout(wait, semaphore.clone().acquire_owned()).await {
        Ok(Ok(permit)) => Ok(permit),
        _ => {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "capacity",
                format!("the server is at its limit of {what}; try again shortly"),
            );
            e.retry_after = Some(wait.as_secs().max(1));
            Err(e)
        }
    }
}

fn log_call(
    caller: &Caller,
    kind: &str,
    lang: Option<Lang>,
    session: Option<&str>,
    outcome: &Outcome,
) {
    tracing::info!(
        caller = %caller,
        kind,
        session = session.unwrap_or("-"),
        language = lang.map_or("-", |l| l.name()),
        duration_ms = (outcome.duration.as_secs_f64() * 1000.0).round() as u64,
        error = outcome.error.map_or("-".to_string(), |e| format!("{e:?}")),
        peak_memory = outcome.peak_memory_bytes.unwrap_or(0),
        "call"
    );
}

async fn run(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<RunRequest>,
) -> Result<Json<Outcome>, ApiError> {
    run_request(&state, &caller, Via::Api, body, state.canceller.clone())
        .await
        .map(Json)
}

/// The audit's refusal (`on_full = "refuse"`): 503, naming the audit.
fn audit_unavailable(e: AuditError) -> ApiError {
    let mut error = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "audit_unavailable",
        e.to_string(),
    );
    error.retry_after = Some(1);
    error.audited()
}

/// A place in the audit's queue for an execution about to start (None: no audit).
async fn audit_slot(state: &Shared) -> Result<Option<audit::Slot>, ApiError> {
    match &state.audit {
        Some(audit) => audit.slot().await.map(Some).map_err(audit_unavailable),
        None => Ok(None),
    }
}

/// Records a refusal with what the service function knew of the request.
async fn refused(state: &Shared, start: Start, error: ApiError) -> ApiError {
    let Some(audit) = &state.audit else {
        return error;
    };
    if error.audited {
        return error;
    }
    let end = End::error(error.kind, &error.message).details(serde_json::json!({
        "status": error.status.as_u16(),
        "request": start.kind.name(),
    }));
    let mut start = start;
    start.kind = Kind::Refused;
    match audit.refusal(start, end).await {
        Ok(()) => error.audited(),
        Err(e) => audit_unavailable(e),
    }
}

/// A run, resolved against its profile and run on a blocking thread until it ends or
/// `canceller` fires (`POST /v1/run`; MCP's tools without a session). Its audit record is
/// written before it starts and completed on that thread, whatever becomes of the request.
pub(super) async fn run_request(
    state: &Shared,
    caller: &Caller,
    via: Via,
    body: RunRequest,
    canceller: Canceller,
) -> Result<Outcome, ApiError> {
    let mut start = Start::new(Kind::Run, via, caller.to_string());
    start.code = body.code.clone();
    start.argv = body.argv.clone();
    start.stdin = body.stdin.as_ref().map(|s| s.clone().into_bytes());
    start.language = body.language.map(|l| l.name().to_string());
    start.profile = run_profile(&body).ok();
    let names_only = body.file_data == Some(false);
    let language = body.language;
    let (spec, profile_name, opened) = match resolve_run(state, body) {
        Ok(resolved) => resolved,
        Err(e) => return Err(refused(state, start, e).await),
    };
    start.profile = Some(profile_name);
    let (pooled, _permit) = match state
        .pool
        .take_run(&start.profile.clone().unwrap_or_default(), &spec)
    {
        Some(pooled) => (Some(pooled.item), pooled.permit),
        None => match room(&state.sandboxes, state, "sandboxes").await {
            Ok(permit) => (None, permit),
            Err(e) => return Err(refused(state, start, e).await),
        },
    };
    let slot = audit_slot(state).await?;
    // The outcome comes back as soon as the run ends; its record is completed after, on
    // the same thread (hashing a large output takes milliseconds).
    let (answer, answered) = tokio::sync::oneshot::channel();
    tokio::task::spawn_blocking(move || {
        let warm = pooled.is_some();
        let pending = slot.map(|slot| {
            let mut start = start
                .input_files(&spec.exec.files)
                .spec(&spec.sandbox, Some(&spec.exec));
            start.details = serde_json::json!({ "warm": warm });
            slot.begin(start)
        });
        let outcome = match pooled {
            Some(prepared) => prepared.run(&spec, &mut |_, _| {}, None, Some(&canceller)),
            None => codecage::run_cancellable(&spec, &mut |_, _| {}, &canceller),
        };
        drop(opened);
        match pending {
            Some(pending) => {
                let end = pending.end_of(&outcome);
                let (stdout, stderr) = (outcome.stdout.clone(), outcome.stderr.clone());
                let _ = answer.send(outcome);
                pending.finish_with_output(end, &stdout, &stderr);
            }
            None => {
                let _ = answer.send(outcome);
            }
        }
    });
    let mut outcome = answered.await.map_err(|_| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "setup",
            "the run's thread ended without an outcome",
        )
    })?;
    outcome.phases = None;
    if names_only {
        outcome.files.iter_mut().for_each(|f| f.data = None);
    }
    log_call(caller, "run", language, None, &outcome);
    Ok(outcome)
}

/// The profile a run asks for: by name, else the language's (bash for a program).
fn run_profile(body: &RunRequest) -> Result<String, ApiError> {
    match (&body.profile, body.language) {
        (Some(name), _) => Ok(name.clone()),
        (None, Some(lang)) => Ok(lang.name().to_string()),
        (None, None) if body.argv.is_some() => Ok("bash".to_string()),
        (None, None) => Err(ApiError::invalid(
            "field `language`: give python, node, typescript or bash (or a profile, or argv)",
        )),
    }
}

/// A run's request checked and resolved into its Spec (and the profile's name, and the
/// volumes' directories, opened, which must stay open until the sandbox has started).
fn resolve_run(
    state: &Shared,
    body: RunRequest,
) -> Result<(codecage::Spec, String, Vec<std::os::fd::OwnedFd>), ApiError> {
    let knobs = knobs_of(&body.limits, "a run")?;
    let profile_name = run_profile(&body)?;
    let profile = load_profile(state, &profile_name)?;
    codecage::files::check_inputs(
        &body.files,
        profile.value(Knob::InputFiles),
        profile.value(Knob::InputTotalSize),
    )
    .map_err(|e| ApiError::invalid(format!("field `files`: {e}")))?;
    let request = PolicyRequest {
        code: body.code,
        lang: body.language,
        argv: body.argv,
        knobs,
        files: body.files,
        rootfs: None,
        env: body.env.into_iter().collect(),
        network: body.network,
    };
    let mut spec = profile::resolve(&profile, &profile_name, &request, &state.data_dir)?;
    network_allowed(state, spec.sandbox.network.mode)?;
    spec.exec.stdin = body.stdin.map(String::into_bytes);
    // Opened now (they stay open until the sandbox has started); a spec with volumes is
    // never a pooled sandbox's, so such a run is cold.
    let (volumes, opened) = open_volumes(state, &body.volumes)?;
    spec.sandbox.volumes = volumes;
    spec.validate()
        .map_err(|e| ApiError::invalid(format!("field `volumes`: {e}")))?;
    Ok((spec, profile_name, opened))
}

/// A run's volumes, each opened by the server (as root) and only if it lies under the
/// config's `volume_roots`: 403 for one outside them (or for any, without roots), 400 for
/// one that is malformed or cannot be opened. The fds must stay open until the sandbox
/// has started.
fn open_volumes(
    state: &Shared,
    items: &[String],
) -> Result<(Vec<codecage::spec::Volume>, Vec<std::os::fd::OwnedFd>), ApiError> {
    let roots = &state.config.volume_roots;
    let policy = |m: String| ApiError::new(StatusCode::FORBIDDEN, "policy", m);
    if !items.is_empty() && roots.is_empty() {
        return Err(policy(
            "field `volumes`: this server allows no volumes (its config has no volume_roots)"
                .into(),
        ));
    }
    let (mut volumes, mut opened) = (Vec::new(), Vec::new());
    for item in items {
        let mut volume = codecage::spec::Volume::parse(item)
            .map_err(|e| ApiError::invalid(format!("field `volumes`: {e}")))?;
        if !item.starts_with('/') {
            return Err(ApiError::invalid(format!(
                "field `volumes`: {item}: the host directory must be an absolute path"
            )));
        }
        let fd = volume.pin(None, Some(roots)).map_err(|e| {
            let message = format!("field `volumes`: {e}");
            match codecage::spec::Volume::is_outside(&e) {
                true => policy(message),
                false => ApiError::invalid(message),
            }
        })?;
        opened.push(fd);
        volumes.push(volume);
    }
    Ok((volumes, opened))
}

/// Network mode `full` only where the server's config enables it: 403 otherwise.
fn network_allowed(state: &Shared, mode: codecage::network::Mode) -> Result<(), ApiError> {
    crate::gateway::Gateway::check_mode(&state.config.network, mode)
        .map_err(|m| ApiError::new(StatusCode::FORBIDDEN, "policy", m))
}

fn new_id() -> String {
    let mut bytes = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut bytes);
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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

/// Starts a session and registers it (`POST /v1/sessions`; MCP's sessions). Its audit
/// record runs from here to its close.
pub(super) async fn open_session(
    state: &Shared,
    caller: &Caller,
    via: Via,
    body: SessionRequest,
) -> Result<Arc<Entry>, ApiError> {
    let mut start = Start::new(Kind::Session, via, caller.to_string());
    start.language = Some(body.language.name().to_string());
    start.profile = body.profile.clone();
    let language = body.language;
    let (session_spec, caps, lifetimes, profile_name) = match resolve_session(state, body) {
        Ok(resolved) => resolved,
        Err(e) => return Err(refused(state, start, e).await),
    };
    start.profile = Some(profile_name.clone());
    let session_permit = match room(&state.session_slots, state, "sessions").await {
        Ok(permit) => permit,
        Err(e) => return Err(refused(state, start, e).await),
    };
    let slot = audit_slot(state).await?;
    let id = new_id();
    start.session = Some(id.clone());
    let (pooled, sandbox_permit) = match state.pool.take_session(&profile_name, &session_spec) {
        Some(pooled) => (Some(pooled.item), pooled.permit),
        None => match room(&state.sandboxes, state, "sandboxes").await {
            Ok(permit) => (None, permit),
            Err(e) => return Err(refused(state, start, e).await),
        },
    };
    let started = tokio::task::spawn_blocking(move || {
        let warm = pooled.is_some();
        let pending = slot.map(|slot| {
            let mut start = start.spec(&session_spec.sandbox, None);
            start.details = serde_json::json!({ "warm": warm });
            slot.begin(start)
        });
        let session = match pooled {
            Some(session) => Ok(session),
            None => Session::start(session_spec),
        };
        match session {
            Ok(session) => Ok((session, pending)),
            Err(e) => {
                if let Some(pending) = pending {
                    pending.finish(End::error(&audit::error_name(e.kind), &e.message));
                }
                Err(e)
            }
        }
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "setup", e.to_string()))?;
    let (session, pending) = started.map_err(|e| {
        let status = if e.kind == ErrorKind::InvalidRequest {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        ApiError::new(status, "setup", e.message).audited()
    })?;
    let (idle, max) = lifetimes;
    let entry = Entry::new(
        id,
        profile_name,
        session,
        idle,
        max,
        caps,
        (session_permit, sandbox_permit),
    );
    *entry.audit.lock().unwrap_or_else(|e| e.into_inner()) = pending;
    let entry = state.sessions.insert(entry);
    tracing::info!(caller = %caller, session = %entry.id, language = language.name(), "session created");
    Ok(entry)
}

/// A session's request checked and resolved: its spec, caps, lifetimes (idle, maximum)
/// and profile name.
fn resolve_session(
    state: &Shared,
    body: SessionRequest,
) -> Result<(SessionSpec, Caps, (Duration, Duration), String), ApiError> {
    let knobs = knobs_of(&body.limits, "a session")?;
    let profile_name = body
        .profile
        .clone()
        .unwrap_or_else(|| body.language.name().to_string());
    let profile = load_profile(state, &profile_name)?;
    let request = PolicyRequest {
        knobs,
        env: body.env.into_iter().collect(),
        network: body.network,
        ..PolicyRequest::default()
    };
    let session_spec = session_spec_of(
        &profile,
        &profile_name,
        body.language,
        &request,
        &state.data_dir,
    )?;
    network_allowed(state, session_spec.sandbox.network.mode)?;
    let caps = Caps {
        input_files: profile.value(Knob::InputFiles),
        input_total: profile.value(Knob::InputTotalSize),
        read_max: profile.value(Knob::OutputFileSize),
        output_dir: profile.output_rules().dir,
        max_timeout: Duration::from_millis(profile.max(Knob::Timeout)),
    };
    let idle = Duration::from_millis(profile.value(Knob::IdleTimeout));
    let max = Duration::from_millis(profile.value(Knob::MaxDuration));
    Ok((session_spec, caps, (idle, max), profile_name))
}

/// A session's spec: the profile resolved with `request` (its limits, env and network) as
/// a run of the language's driver would be.
pub(super) fn session_spec_of(
    profile: &Profile,
    name: &str,
    lang: Lang,
    request: &PolicyRequest,
    data: &codecage::profile::DataDir,
) -> Result<SessionSpec, ApiError> {
    let request = PolicyRequest {
        argv: Some(vec!["true".into()]),
        ..request.clone()
    };
    let spec = profile::resolve(profile, name, &request, data)?;
    Ok(SessionSpec {
        sandbox: spec.sandbox,
        lang,
        env: spec.exec.env,
        timeout: spec.exec.timeout,
        output_limit: spec.exec.output_limit,
        outputs: Some(profile.output_rules()),
    })
}

pub(super) fn lookup(state: &Shared, id: &str) -> Result<Arc<Entry>, ApiError> {
    state.sessions.get(id).map_err(|missing| match missing {
        Missing::Expired => ApiError::new(
            StatusCode::NOT_FOUND,
            "session_expired",
            format!(
                "session {id} expired (idle or maximum lifetime) and was closed: create a new one"
            ),
        ),
        Missing::Unknown => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("there is no session {id}: create one with POST /v1/sessions"),
        ),
    })
}

pub(super) fn busy(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "busy",
        format!("session {id} is running a call: wait for it, or interrupt it"),
    )
}

async fn list_sessions(State(state): State<Shared>) -> Json<Vec<SessionInfo>> {
    Json(state.sessions.list().iter().map(|e| info(e)).collect())
}

async fn get_session(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, ApiError> {
    let entry = lookup(&state, &id)?;
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

/// Closes a session (its sandbox and everything in it).
pub(super) async fn close_session(
    state: &Shared,
    caller: &Caller,
    via: Via,
    id: &str,
) -> Result<(), ApiError> {
    lookup(state, id)?;
    if let Some(entry) = state.sessions.remove(id, false) {
        let why = format!("closed by {caller} ({})", via.name());
        tokio::task::spawn_blocking(move || registry::close(&entry, &why))
            .await
            .map_err(|e| {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "setup", e.to_string())
            })?;
        tracing::info!(caller = %caller, session = %id, "session closed");
    }
    Ok(())
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
    Result(Box<CallOutcome>),
}

async fn execute(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<ExecuteRequest>,
) -> Result<Response, ApiError> {
    let entry = lookup(&state, &id)?;
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
    let streaming = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/x-ndjson"));
    let (events, receiver) = tokio::sync::mpsc::channel::<StreamEvent>(256);
    let final_events = events.clone();
    let forward = move |event: Event| {
        if !streaming {
            return;
        }
        let event = match event {
            Event::Output(stream, bytes) => {
                let (encoding, data) = encode_stream(bytes);
                match stream {
                    Stream::Stdout => StreamEvent::Stdout { data, encoding },
                    Stream::Stderr => StreamEvent::Stderr { data, encoding },
                }
            }
            Event::Display(bundle) => StreamEvent::Display {
                data: bundle.clone(),
            },
        };
        let _ = events.blocking_send(event);
    };
    let worker = call_session(
        state.clone(),
        caller.clone(),
        Via::Api,
        entry,
        call,
        forward,
    );
    if streaming {
        tokio::spawn(async move {
            if let Ok(mut outcome) = worker.await {
                if names_only {
                    outcome.outcome.files.iter_mut().for_each(|f| f.data = None);
                }
                let _ = final_events
                    .send(StreamEvent::Result(Box::new(outcome)))
                    .await;
            }
        });
        let lines = tokio_stream::wrappers::ReceiverStream::new(receiver).map(|event| {
            let mut line = serde_json::to_vec(&event).unwrap_or_default();
            line.push(b'\n');
            Ok::<_, std::convert::Infallible>(Bytes::from(line))
        });
        let body = axum::body::Body::from_stream(lines);
        return Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response());
    }
    drop(receiver);
    drop(final_events);
    let mut outcome = worker.await?;
    if names_only {
        outcome.outcome.files.iter_mut().for_each(|f| f.data = None);
    }
    Ok(Json(outcome).into_response())
}

/// A call's own time limit, from a request field.
pub(super) fn timeout_of(raw: Option<&Raw>) -> Result<Option<Duration>, ApiError> {
    raw.map(|raw| {
        Knob::Timeout
            .from_raw(raw)
            .map(Duration::from_millis)
            .map_err(|e| ApiError::invalid(format!("field `timeout`: {e}")))
    })
    .transpose()
}

/// One call in a session, on a blocking thread (409 if the session is busy); `forward`
/// sees its output and displays as they come, on that thread.
pub(super) async fn call_session(
    state: Shared,
    caller: Caller,
    via: Via,
    entry: Arc<Entry>,
    call: Call,
    mut forward: impl FnMut(Event) + Send + 'static,
) -> Result<CallOutcome, ApiError> {
    let mut start = Start::new(Kind::Call, via, caller.to_string());
    start.code = Some(call.code.clone());
    start.stdin = call.stdin.as_ref().map(|s| s.clone().into_bytes());
    start.session = Some(entry.id.clone());
    start.profile = Some(entry.profile.clone());
    start.language = Some(entry.lang.name().to_string());
    if let Some(t) = call.timeout {
        start.limits = Some(serde_json::json!({"timeout_ms": t.as_millis() as u64}));
    }
    if let Some(asked) = call.timeout.filter(|t| *t > entry.caps.max_timeout) {
        let e = ApiError::new(
            StatusCode::FORBIDDEN,
            "policy",
            format!(
                "a timeout of {} is more than the session's profile {} allows (at most {}); ask for less",
                codecage::units::format_duration(asked),
                entry.profile,
                codecage::units::format_duration(entry.caps.max_timeout)
            ),
        );
        return Err(refused(&state, start, e).await);
    }
    let Some(claim) = entry.claim() else {
        return Err(refused(&state, start, busy(&entry.id)).await);
    };
    let slot = audit_slot(&state).await?;
    let worker_entry = entry.clone();
    // As for a run: the outcome goes back first, the record is completed after, with the
    // session already free for its next call.
    let (answer, answered) = tokio::sync::oneshot::channel();
    tokio::task::spawn_blocking(move || {
        let claim = claim;
        let pending = slot.map(|slot| slot.begin(start.input_files(&call.files)));
        let mut guard = worker_entry
            .session
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let Some(session) = guard.as_mut() else {
            if let Some(pending) = pending {
                pending.finish(End::error(
                    "not_found",
                    "the session was closed before the call ran",
                ));
            }
            let _ = answer.send(None);
            return;
        };
        let outcome = session.execute(&call, &mut forward);
        worker_entry
            .executions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        drop(guard);
        drop(claim);
        match pending {
            Some(pending) => {
                let details = serde_json::json!({
                    "execution_count": outcome.execution_count,
                    "exception": outcome.exception.as_ref().map(|e| &e.name),
                    "state": outcome.state,
                });
                let end = pending.end_of(&outcome.outcome).details(details);
                let stdout = outcome.outcome.stdout.clone();
                let stderr = outcome.outcome.stderr.clone();
                let _ = answer.send(Some(outcome));
                pending.finish_with_output(end, &stdout, &stderr);
            }
            None => {
                let _ = answer.send(Some(outcome));
            }
        }
    });
    let outcome = answered
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "setup",
                "the call's thread ended without an outcome",
            )
        })?
        .ok_or_else(|| {
            lookup(&state, &entry.id)
                .err()
                .unwrap_or_else(|| busy(&entry.id))
        })?;
    log_call(
        &caller,
        "execute",
        Some(entry.lang),
        Some(&entry.id),
        &outcome.outcome,
    );
    Ok(outcome)
}

async fn reset(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    reset_session(&state, &caller, Via::Api, lookup(&state, &id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A fresh interpreter in the session's sandbox (409 if it is busy).
pub(super) async fn reset_session(
    state: &Shared,
    caller: &Caller,
    via: Via,
    entry: Arc<Entry>,
) -> Result<(), ApiError> {
    let mut start = Start::new(Kind::Reset, via, caller.to_string());
    start.session = Some(entry.id.clone());
    start.profile = Some(entry.profile.clone());
    start.language = Some(entry.lang.name().to_string());
    let Some(claim) = entry.claim() else {
        return Err(refused(state, start, busy(&entry.id)).await);
    };
    let slot = audit_slot(state).await?;
    let result = tokio::task::spawn_blocking(move || {
        let _claim = claim;
        let pending = slot.map(|slot| slot.begin(start));
        let mut guard = entry.session.lock().unwrap_or_else(|e| e.into_inner());
        let result = match guard.as_mut() {
            Some(session) => session.reset(),
            None => Err("the session is closed".to_string()),
        };
        if let Some(pending) = pending {
            pending.finish(match &result {
                Ok(()) => End::default(),
                Err(e) => End::error("session_lost", e),
            });
        }
        result
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "setup", e.to_string()))?;
    result.map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "session_lost", e))
}

async fn interrupt(
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    lookup(&state, &id)?.interrupter.interrupt();
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/sessions/{id}/files?path=DIR`.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    path: String,
}

/// Runs `f` on the session (claimed: 409 while a call runs) on a blocking thread.
pub(super) async fn with_session<T: Send + 'static>(
    state: &Shared,
    id: &str,
    f: impl FnOnce(&mut Session, &Entry) -> Result<T, String> + Send + 'static,
) -> Result<T, ApiError> {
    let entry = lookup(state, id)?;
    let claim = entry.claim().ok_or_else(|| busy(id))?;
    tokio::task::spawn_blocking(move || {
        let _claim = claim;
        let mut guard = entry.session.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_mut() {
            Some(session) => f(session, &entry),
            None => Err("the session is closed".to_string()),
        }
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "setup", e.to_string()))?
    .map_err(|e| {
        if e.contains("does not exist") {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", e)
        } else {
            ApiError::invalid(e)
        }
    })
}

/// A path under /work as the API takes it: relative, or absolute under /work.
pub(super) fn relative(path: &str) -> &str {
    match path.strip_prefix("/work") {
        Some("") => "",
        Some(rest) if rest.starts_with('/') => rest.trim_start_matches('/'),
        _ => path,
    }
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
    Path(id): Path<String>,
    axum::extract::Query(query): axum::extract::Query<ListQuery>,
) -> Result<Json<Vec<FileEntry>>, ApiError> {
    let path = relative(&query.path).to_string();
    if !path.is_empty() {
        codecage::files::check_input_path(&path)
            .map_err(|e| ApiError::invalid(format!("path: {e}")))?;
    }
    let entries = with_session(&state, &id, move |s, _| s.list_files(&path)).await?;
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
    Path((id, path)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let path = relative(&path).to_string();
    codecage::files::check_input_path(&path)
        .map_err(|e| ApiError::invalid(format!("path: {e}")))?;
    let media = codecage::files::media_type(&path);
    let data = with_session(&state, &id, move |s, e| s.read_file(&path, e.caps.read_max)).await?;
    Ok(([(header::CONTENT_TYPE, media)], data).into_response())
}

async fn upload(
    State(state): State<Shared>,
    Path((id, path)): Path<(String, String)>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let path = relative(&path).to_string();
    let file = codecage::files::InputFile::new(path, body.to_vec());
    write_session_file(&state, &id, file).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Writes one file into a session's /work, within the profile's input caps (the API's
/// upload and MCP's write_file).
pub async fn write_session_file(
    state: &Shared,
    id: &str,
    file: codecage::files::InputFile,
) -> Result<(), ApiError> {
    with_session(state, id, move |s, e| {
        let files = std::slice::from_ref(&file);
        codecage::files::check_inputs(files, e.caps.input_files, e.caps.input_total)?;
        s.write_files(files)
    })
    .await
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
    let start = Start::new(Kind::Refused, via, caller);
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
        Err(e) => audit_unavailable(e).into_response(),
    }
}

/// The audit API is for administrators: a token with the admin role, or root on the unix
/// socket.
fn admin_only(state: &Shared, caller: &Caller) -> Result<std::path::PathBuf, ApiError> {
    let admin = match caller {
        Caller::Unix { uid } => *uid == 0,
        Caller::Token { role, .. } => *role == super::config::Role::Admin,
    };
    if !admin {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "the audit log is for administrators: a token with role \"admin\", or root on the unix socket",
        ));
    }
    if !state.config.audit.enabled {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
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
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "audit", e.to_string()))?
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "audit", e))
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
    let records = read_audit(path, move |store| store.query(&filter, true)).await?;
    let mut body = Vec::new();
    for record in &records {
        if serde_json::to_writer(&mut body, record).is_ok() {
            body.push(b'\n');
        }
    }
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
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("there is no audit record {id}"),
            )
        })
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
