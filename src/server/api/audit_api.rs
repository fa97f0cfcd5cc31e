//! The audit API (administrators only) and the audit of refusals no service function
//! recorded.

use std::time::SystemTime;

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};

use super::{ApiError, ErrorInfo, Kind};
use crate::audit::Record as AuditRecord;
use crate::audit::{self, End, Kind as AuditKind, Start, Via};
use crate::server::openapi::{AuditRefusals, Unauthenticated};
use crate::server::{Caller, Shared};
use crate::service;

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
    // A listener of another front end says which (the E2B one's).
    let via = match request.extensions().get::<Via>() {
        Some(via) => *via,
        None if request.uri().path().starts_with("/mcp") => Via::Mcp,
        None => Via::Api,
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
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Records that started at or after this: RFC 3339 (2026-11-26T05:00:00Z), a date (2026-11-26), or a duration back from now (24h, 7d, 30m).
    since: Option<String>,
    /// Records that started before this: RFC 3339 (2026-11-26T05:00:00Z), a date (2026-11-26), or a duration back from now (24h, 7d, 30m).
    until: Option<String>,
    /// Under this profile.
    profile: Option<String>,
    /// With this error kind (timeout, oom, policy, invalid_request, unauthorized, ...), or
    /// `none`.
    error: Option<String>,
    /// Of this session (its life, calls and resets).
    session: Option<String>,
    /// run, call, session, reset, process, refused or approval.
    kind: Option<String>,
    /// token:NAME, uid:N or unauthenticated.
    caller: Option<String>,
    /// running, complete or incomplete.
    status: Option<String>,
    /// `GET /v1/audit`: at most this many (1 to 10000, default 100); the export takes all.
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
#[derive(Serialize, utoipa::ToSchema)]
pub struct AuditList {
    /// Newest first; code and output are left out (see `GET /v1/audit/{id}`).
    pub records: Vec<audit::Record>,
}

/// Reads the database once everything this server queued before the request is written
/// (the writer commits a few milliseconds behind the request path), so a caller finds the
/// records of the requests it made before. A writer that cannot write is waited for a
/// second; then the read shows what is written.
async fn read_audit<T: Send + 'static>(
    state: &Shared,
    path: std::path::PathBuf,
    f: impl FnOnce(&audit::Store) -> rusqlite::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let writer = state.audit.clone();
    tokio::task::spawn_blocking(move || {
        if let Some(writer) = writer {
            writer.flush_blocking(std::time::Duration::from_secs(1));
        }
        let store = audit::Store::open_existing(&path)?;
        f(&store).map_err(|e| format!("audit database {}: {e}", path.display()))
    })
    .await
    .map_err(|e| ApiError::new(Kind::Audit, e.to_string()))?
    .map_err(|e| ApiError::new(Kind::Audit, e))
}

#[utoipa::path(get, path = "/v1/audit", operation_id = "list_audit", tag = "audit",
    summary = "The audit log's newest records (administrators)",
    description = "Every run, session call, session, reset and refused request, newest first, \
        without code and output (see `GET /v1/audit/{id}`).",
    params(AuditQuery),
    security(("bearer" = [])),
    responses((status = 200, description = "the records", body = AuditList), AuditRefusals, Unauthenticated))]
pub(crate) async fn audit_list(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    axum::extract::Query(query): axum::extract::Query<AuditQuery>,
) -> Result<Json<AuditList>, ApiError> {
    let path = admin_only(&state, &caller)?;
    let filter = query.filter(false)?;
    let records = read_audit(&state, path, move |store| store.query(&filter, false)).await?;
    Ok(Json(AuditList { records }))
}

#[utoipa::path(get, path = "/v1/audit/export", operation_id = "export_audit", tag = "audit",
    summary = "Every record the filters select, whole, oldest first (administrators)",
    params(AuditQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "JSON Lines: one record a line, streamed",
            body = AuditRecord, content_type = "application/x-ndjson"),
        AuditRefusals, Unauthenticated,
    ))]
pub(crate) async fn audit_export(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    axum::extract::Query(query): axum::extract::Query<AuditQuery>,
) -> Result<Response, ApiError> {
    let path = admin_only(&state, &caller)?;
    let filter = query.filter(true)?;
    // Streamed: one record at a time from the database to the client, a few lines
    // buffered between them, whatever the export's size.
    let (lines, receiver) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    let opened = read_audit(&state, path, |_| Ok(())).await;
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

#[utoipa::path(get, path = "/v1/audit/{id}", operation_id = "get_audit_record", tag = "audit",
    summary = "One audit record, with its code and output (administrators)",
    params(("id" = String, Path, description = "the record's id")),
    security(("bearer" = [])),
    responses((status = 200, description = "the record", body = AuditRecord), AuditRefusals, Unauthenticated))]
pub(crate) async fn audit_show(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<audit::Record>, ApiError> {
    let path = admin_only(&state, &caller)?;
    let wanted = id.clone();
    read_audit(&state, path, move |store| store.get(&wanted))
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::new(Kind::NotFound, format!("there is no audit record {id}")))
}
