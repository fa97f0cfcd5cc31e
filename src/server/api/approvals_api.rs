//! `/v1/approvals`: commands waiting for a person (`[exec] ask`) and the standing rules
//! (src/service/approvals.rs decides; this translates).

use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use serde::Deserialize;

use super::ApiError;
use crate::audit::Via;
use crate::server::openapi::{AuditRefusals, Unauthenticated};
use crate::server::{Caller, Shared};
use crate::service::approvals::{self, ApprovalView, DecideRequest, RuleView};

/// `GET /v1/approvals?all=true`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Also the decided ones of the last day (default: pending only).
    #[serde(default)]
    #[param(required = false)]
    all: bool,
}

#[utoipa::path(get, path = "/v1/approvals", operation_id = "list_approvals", tag = "approvals",
    summary = "Commands waiting for a person's approval ([exec] ask)",
    description = "An administrator sees every question; another caller those it asked. A pending \
        question is denied after 10 minutes.",
    params(ListQuery),
    security(("bearer" = [])),
    responses((status = 200, description = "the questions, oldest first", body = Vec<ApprovalView>), Unauthenticated))]
pub(crate) async fn list(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<ListQuery>,
) -> Json<Vec<ApprovalView>> {
    Json(approvals::list(&state, &caller, query.all))
}

#[utoipa::path(get, path = "/v1/approvals/{id}", operation_id = "show_approval", tag = "approvals",
    summary = "One question: its status, and the process it started once approved",
    params(("id" = String, Path, description = "the approval's id")),
    security(("bearer" = [])),
    responses((status = 200, description = "the question", body = ApprovalView), AuditRefusals, Unauthenticated))]
pub(crate) async fn show(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<ApprovalView>, ApiError> {
    Ok(Json(approvals::show(&state, &caller, &id)?))
}

#[utoipa::path(post, path = "/v1/approvals/{id}", operation_id = "decide_approval", tag = "approvals",
    summary = "Decide a question: allow-once, allow-always (with a scope), deny (administrators)",
    description = "By a token with the admin role or root on the unix socket, never by the caller \
        that asked (403). An approved process starts at once (its `process_id` is in the answer); an \
        approved bash cell runs when its caller sends it again. `allow-always` also adds rules: each \
        program that was not allowed, or the exact command when the parse could not judge it, for the \
        scope `session` (default), `token` (the asking token or uid) or `profile`.",
    params(("id" = String, Path, description = "the approval's id")),
    request_body = DecideRequest,
    security(("bearer" = [])),
    responses((status = 200, description = "the question, decided", body = ApprovalView), AuditRefusals, Unauthenticated))]
pub(crate) async fn decide(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    super::JsonBody(body): super::JsonBody<DecideRequest>,
) -> Result<Json<ApprovalView>, ApiError> {
    Ok(Json(
        approvals::decide(&state, &caller, Via::Api, &id, body).await?,
    ))
}

#[utoipa::path(get, path = "/v1/approvals/rules", operation_id = "list_approval_rules", tag = "approvals",
    summary = "The standing approvals (allow-always rules; administrators)",
    security(("bearer" = [])),
    responses((status = 200, description = "the rules, oldest first", body = Vec<RuleView>), AuditRefusals, Unauthenticated))]
pub(crate) async fn rules(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<RuleView>>, ApiError> {
    Ok(Json(approvals::rules(&state, &caller)?))
}

#[utoipa::path(delete, path = "/v1/approvals/rules/{id}", operation_id = "revoke_approval_rule", tag = "approvals",
    summary = "Revoke a rule: the very next command is judged without it (administrators)",
    params(("id" = String, Path, description = "the rule's id")),
    security(("bearer" = [])),
    responses((status = 200, description = "the rule removed", body = RuleView), AuditRefusals, Unauthenticated))]
pub(crate) async fn revoke(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<RuleView>, ApiError> {
    Ok(Json(
        approvals::revoke(&state, &caller, Via::Api, &id).await?,
    ))
}
