//! The OpenAPI document of the server (`GET /openapi.json`, and docs/openapi.json in the
//! repository, which a test holds equal to it). Request types carry their schemas
//! (utoipa derives); the limits fields come from the knob table; the result types'
//! schemas are listed here and a test holds them to what the types serialize.

use utoipa::openapi::path::{
    HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn, PathItemBuilder,
};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, SchemaType, Type};
use utoipa::openapi::{
    ComponentsBuilder, ContentBuilder, InfoBuilder, OpenApiBuilder, PathItem, PathsBuilder, Ref,
    RefOr, Required, ResponseBuilder, Schema,
};
use utoipa::PartialSchema;

use codecage::knobs::{Knob, Unit};

use super::api::{
    AuditList, ErrorBody, ExecuteRequest, FileEntry, PoolStatus, RunRequest, SessionInfo,
    SessionRequest,
};

/// The document, as JSON.
pub fn document() -> String {
    let mut doc = build();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    let mut text = doc.to_pretty_json().unwrap_or_default();
    text.push('\n');
    text
}

fn json_body(schema: &str) -> utoipa::openapi::request_body::RequestBody {
    RequestBodyBuilder::new()
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(schema)))
                .build(),
        )
        .required(Some(Required::True))
        .build()
}

fn answer(description: &str, schema: Option<&str>) -> utoipa::openapi::Response {
    let mut response = ResponseBuilder::new().description(description);
    if let Some(schema) = schema {
        response = response.content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(schema)))
                .build(),
        );
    }
    response.build()
}

fn error(description: &str) -> utoipa::openapi::Response {
    answer(description, Some("ErrorBody"))
}

fn id_parameter() -> utoipa::openapi::path::Parameter {
    ParameterBuilder::new()
        .name("id")
        .parameter_in(ParameterIn::Path)
        .required(Required::True)
        .description(Some("the session's id, from POST /v1/sessions"))
        .schema(Some(String::schema()))
        .build()
}

fn path_parameter() -> utoipa::openapi::path::Parameter {
    ParameterBuilder::new()
        .name("path")
        .parameter_in(ParameterIn::Path)
        .required(Required::True)
        .description(Some("the file, relative to /work (no `..`)"))
        .schema(Some(String::schema()))
        .build()
}

/// The filters of `GET /v1/audit` and `/v1/audit/export`.
fn audit_filters(mut op: OperationBuilder) -> OperationBuilder {
    let time = "RFC 3339 (2026-11-26T05:00:00Z), a date (2026-11-26), or a duration back from now (24h, 7d, 30m)";
    let filters = [
        ("since", format!("records that started at or after this: {time}")),
        ("until", format!("records that started before this: {time}")),
        ("profile", "under this profile".to_string()),
        ("error", "with this error kind (timeout, oom, policy, invalid_request, unauthorized, ...), or `none`".to_string()),
        ("session", "of this session (its life, calls and resets)".to_string()),
        ("kind", "run, call, session, reset or refused".to_string()),
        ("caller", "token:NAME, uid:N or unauthenticated".to_string()),
        ("status", "running, complete or incomplete".to_string()),
    ];
    for (name, text) in filters {
        op = op.parameter(
            ParameterBuilder::new()
                .name(name)
                .parameter_in(ParameterIn::Query)
                .required(Required::False)
                .description(Some(text))
                .schema(Some(String::schema())),
        );
    }
    op.response(
        "403",
        error("not an administrator: the audit needs a token with role admin, or root on the unix socket"),
    )
    .response("400", error("a filter that does not parse"))
}

fn build() -> utoipa::openapi::OpenApi {
    let refused = [
        ("400", "invalid request: the message names the field"),
        ("401", "no or bad token (TCP listeners)"),
        (
            "403",
            "the request asks more than its profile or its token allows, or names a profile its token may not use",
        ),
        ("413", "the body is over the server's limit"),
        (
            "429",
            "the caller is past its token's quota (`max_sessions`, `max_concurrent_runs`): retry after the Retry-After header's seconds",
        ),
        (
            "503",
            "at capacity: retry after the Retry-After header's seconds",
        ),
    ];
    let with_refusals = |mut op: OperationBuilder| {
        for (code, text) in refused {
            op = op.response(code, error(text));
        }
        op
    };
    let session_missing = |op: OperationBuilder| {
        op.parameter(id_parameter()).response(
            "404",
            error("no such session of this caller's (`not_found`: another caller's session is not revealed), or it expired (`session_expired`)"),
        )
    };
    let paths = PathsBuilder::new()
        .path(
            "/v1/run",
            PathItem::new(
                HttpMethod::Post,
                with_refusals(
                    OperationBuilder::new()
                        .summary(Some("Run code or a program in a new sandbox"))
                        .description(Some(
                            "With `Accept: application/x-ndjson` the run streams: {\"type\":\"stdout\"|\"stderr\",\"data\",\"encoding\"} \
                             as they happen, {\"type\":\"heartbeat\"} every 10 s, then {\"type\":\"result\", ...Outcome}; a refusal found \
                             after the stream began is a final {\"type\":\"error\",\"error\",\"message\"}. A client that disconnects stops the run.",
                        ))
                        .request_body(Some(json_body("RunRequest")))
                        .response("200", answer("the run's outcome, whatever its verdict", Some("Outcome"))),
                )
                .build(),
            ),
        )
        .path(
            "/v1/sessions",
            PathItemBuilder::new()
                .operation(
                HttpMethod::Post,
                with_refusals(
                    OperationBuilder::new()
                        .summary(Some("Create a session: a sandbox with a persistent interpreter"))
                        .request_body(Some(json_body("SessionRequest")))
                        .response("201", answer("the new session", Some("SessionInfo"))),
                )
                .build(),
            )
            .operation(
                HttpMethod::Get,
                OperationBuilder::new()
                    .summary(Some("List the caller's live sessions (an admin's: every one)"))
                    .response(
                        "200",
                        ResponseBuilder::new()
                            .description("the sessions")
                            .content(
                                "application/json",
                                ContentBuilder::new()
                                    .schema(Some(
                                        ArrayBuilder::new().items(Ref::from_schema_name("SessionInfo")).build(),
                                    ))
                                    .build(),
                            )
                            .build(),
                    )
                    .build(),
            )
            .build(),
        )
        .path(
            "/v1/sessions/{id}",
            PathItemBuilder::new()
                .operation(
                HttpMethod::Get,
                session_missing(OperationBuilder::new().summary(Some("A session")))
                    .response("200", answer("the session", Some("SessionInfo")))
                    .build(),
            )
            .operation(
                HttpMethod::Delete,
                session_missing(OperationBuilder::new().summary(Some("Close a session")))
                    .response("204", answer("closed: every process killed, nothing left", None))
                    .build(),
            )
            .build(),
        )
        .path(
            "/v1/sessions/{id}/execute",
            PathItem::new(
                HttpMethod::Post,
                session_missing(
                    OperationBuilder::new()
                        .summary(Some("Run a call in a session"))
                        .description(Some(
                            "With `Accept: application/x-ndjson` the events stream as they happen: \
                             {\"type\":\"stdout\"|\"stderr\",\"data\",\"encoding\"}, {\"type\":\"display\",\"data\"}, \
                             then {\"type\":\"result\", ...CallOutcome}. A reader more than 1 MiB of events behind \
                             loses events, counted in {\"type\":\"dropped\",\"bytes\",\"events\"} before the result \
                             (which has all the output); the call keeps its own clock. Refusals are known before the \
                             stream starts (their status codes); a failure after it ends the stream with \
                             {\"type\":\"error\",\"error\",\"message\"}. A client that disconnects interrupts the call.",
                        ))
                        .request_body(Some(json_body("ExecuteRequest"))),
                )
                .response("200", answer("the call's outcome, whatever its verdict", Some("CallOutcome")))
                .response("400", error("invalid request"))
                .response("409", error("the session is running another call"))
                .response("403", error("a timeout over the profile's or the token's maximum"))
                .response("429", error("the caller is past its `max_concurrent_runs`: retry after Retry-After"))
                .build(),
            ),
        )
        .path(
            "/v1/sessions/{id}/reset",
            PathItem::new(
                HttpMethod::Post,
                session_missing(OperationBuilder::new().summary(Some(
                    "A fresh interpreter in the same sandbox (/work is kept)",
                )))
                .response("204", answer("reset", None))
                .response("409", error("the session is running a call"))
                .build(),
            ),
        )
        .path(
            "/v1/sessions/{id}/interrupt",
            PathItem::new(
                HttpMethod::Post,
                session_missing(OperationBuilder::new().summary(Some(
                    "Interrupt the running call (as its timeout would)",
                )))
                .response("204", answer("interrupt sent", None))
                .build(),
            ),
        )
        .path(
            "/v1/sessions/{id}/files",
            PathItem::new(
                HttpMethod::Get,
                session_missing(
                    OperationBuilder::new()
                        .summary(Some("List a directory of the session's /work"))
                        .parameter(
                            ParameterBuilder::new()
                                .name("path")
                                .parameter_in(ParameterIn::Query)
                                .required(Required::False)
                                .description(Some("the directory, relative to /work (default: /work)"))
                                .schema(Some(String::schema()))
                                .build(),
                        ),
                )
                .response(
                    "200",
                    ResponseBuilder::new()
                        .description("the entries, sorted by name")
                        .content(
                            "application/json",
                            ContentBuilder::new()
                                .schema(Some(
                                    ArrayBuilder::new().items(Ref::from_schema_name("FileEntry")),
                                ))
                                .build(),
                        )
                        .build(),
                )
                .response("409", error("the session is running a call"))
                .build(),
            ),
        )
        .path(
            "/v1/sessions/{id}/files/{path}",
            PathItemBuilder::new()
                .operation(
                    HttpMethod::Get,
                    session_missing(
                        OperationBuilder::new()
                            .summary(Some("Download a file of the session's /work"))
                            .parameter(path_parameter()),
                    )
                    .response("200", answer("the file's bytes, with its media type", None))
                    .response("409", error("the session is running a call"))
                    .build(),
                )
                .operation(
                    HttpMethod::Put,
                    session_missing(
                        OperationBuilder::new()
                            .summary(Some("Upload a file into the session's /work (the body is its bytes)"))
                            .parameter(path_parameter()),
                    )
                    .response("204", answer("written", None))
                    .response("400", error("a bad path, or over the profile's inputs caps"))
                    .response("409", error("the session is running a call"))
                    .build(),
                )
                .build(),
        )
        .path(
            "/v1/audit",
            PathItem::new(
                HttpMethod::Get,
                audit_filters(
                    OperationBuilder::new()
                        .summary(Some("The audit log's newest records (administrators)"))
                        .description(Some(
                            "Every run, session call, session, reset and refused request, newest first, \
                             without code and output (see /v1/audit/{id}).",
                        ))
                        .parameter(
                            ParameterBuilder::new()
                                .name("limit")
                                .parameter_in(ParameterIn::Query)
                                .required(Required::False)
                                .description(Some("at most this many (1 to 10000, default 100)"))
                                .schema(Some(u64::schema())),
                        ),
                )
                .response("200", answer("the records", Some("AuditList")))
                .build(),
            ),
        )
        .path(
            "/v1/audit/export",
            PathItem::new(
                HttpMethod::Get,
                audit_filters(
                    OperationBuilder::new()
                        .summary(Some("Every record the filters select, whole, oldest first (administrators)")),
                )
                .response(
                    "200",
                    ResponseBuilder::new()
                        .description("JSON Lines: one AuditRecord per line")
                        .content("application/x-ndjson", ContentBuilder::new().build())
                        .build(),
                )
                .build(),
            ),
        )
        .path(
            "/v1/audit/{id}",
            PathItem::new(
                HttpMethod::Get,
                OperationBuilder::new()
                    .summary(Some("One audit record, with its code and output (administrators)"))
                    .parameter(
                        ParameterBuilder::new()
                            .name("id")
                            .parameter_in(ParameterIn::Path)
                            .required(Required::True)
                            .description(Some("the record's id"))
                            .schema(Some(String::schema())),
                    )
                    .response("200", answer("the record", Some("AuditRecord")))
                    .response(
                        "403",
                        error("not an administrator: the audit needs a token with role admin, or root on the unix socket"),
                    )
                    .response("404", error("no such record"))
                    .build(),
            ),
        )
        .path(
            "/v1/pool",
            PathItem::new(
                HttpMethod::Get,
                OperationBuilder::new()
                    .summary(Some("The warm pool: sandboxes and sessions ready, by profile"))
                    .response("200", answer("ready counts", Some("PoolStatus")))
                    .build(),
            ),
        )
        .path(
            "/healthz",
            PathItem::new(
                HttpMethod::Get,
                OperationBuilder::new()
                    .summary(Some("Liveness"))
                    .response("200", answer("ok", None))
                    .response(
                        "503",
                        answer("the network gateway cannot relay (the body says why)", None),
                    )
                    .build(),
            ),
        )
        .path(
            "/openapi.json",
            PathItem::new(
                HttpMethod::Get,
                OperationBuilder::new()
                    .summary(Some("This document"))
                    .response("200", answer("the OpenAPI document", None))
                    .build(),
            ),
        )
        .build();
    let components = ComponentsBuilder::new()
        .schema("RunRequest", with_knobs(RunRequest::schema(), false))
        .schema("SessionRequest", with_knobs(SessionRequest::schema(), true))
        .schema_from::<ExecuteRequest>()
        .schema_from::<SessionInfo>()
        .schema_from::<FileEntry>()
        .schema_from::<PoolStatus>()
        .schema_from::<ErrorBody>()
        .schema_from::<AuditList>()
        .schema_from::<crate::audit::Record>()
        .schema("Outcome", outcome_schema())
        .schema("CallOutcome", call_outcome_schema())
        .build();
    OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("codecage")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "Runs untrusted Python, JavaScript/TypeScript and bash in Linux sandboxes: one-shot runs \
                     and sessions with a persistent interpreter.",
                ))
                .build(),
        )
        .paths(paths)
        .components(Some(components))
        .build()
}

/// A request's schema with one property per knob a request may set, from the knob table.
fn with_knobs(schema: RefOr<Schema>, session: bool) -> RefOr<Schema> {
    // The knob fields are a flattened map: utoipa gives an allOf of it and the typed
    // fields; they become one object, with a property per knob.
    let mut object = match schema {
        RefOr::T(Schema::Object(object)) => object,
        RefOr::T(Schema::AllOf(all)) => {
            let mut merged = ObjectBuilder::new().build();
            for item in all.items {
                if let RefOr::T(Schema::Object(part)) = item {
                    merged.properties.extend(part.properties);
                    merged.required.extend(part.required);
                    if merged.description.is_none() {
                        merged.description = part.description;
                    }
                }
            }
            merged
        }
        other => return other,
    };
    for knob in Knob::all().filter(|k| k.requestable()) {
        let def = knob.def();
        let kind = match def.unit {
            Unit::Count => "a whole number",
            Unit::Cpus => "a number of CPUs",
            Unit::Duration => "seconds, or a string with a unit (\"30s\", \"500ms\")",
            Unit::Size => "bytes, or a string with a unit (\"256M\", \"1G\")",
        };
        let per_call = session && matches!(knob, Knob::Timeout | Knob::OutputLimit);
        let description = format!(
            "{} ({kind}; default from the profile, {}{})",
            def.help,
            knob.show(def.default),
            if per_call {
                "; each call's default"
            } else {
                ""
            }
        );
        let property = ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([
                Type::Integer,
                Type::Number,
                Type::String,
            ]))
            .description(Some(description))
            .build();
        object
            .properties
            .insert(knob.key().to_string(), property.into());
    }
    RefOr::T(Schema::Object(object))
}

/// The fields of `Outcome` as JSON carries them.
const OUTCOME_FIELDS: &[(&str, Type, bool, &str)] = &[
    ("stdout", Type::String, false, "what the code wrote to stdout, up to the output limit"),
    ("stdout_encoding", Type::String, false, "utf-8, or base64 when the bytes are not text"),
    ("stderr", Type::String, false, "what the code wrote to stderr, up to the output limit"),
    ("stderr_encoding", Type::String, false, "utf-8, or base64"),
    ("exit_code", Type::Integer, true, "the program's exit status, when it exited by itself"),
    ("signal", Type::Integer, true, "the signal that ended it"),
    ("error", Type::String, true, "null, or what ended the run: timeout, oom, output_limit, setup, policy, invalid_request, exception, interrupted, session_lost"),
    ("message", Type::String, true, "what happened and what to do"),
    ("truncated", Type::Boolean, false, "output was cut at the output limit"),
    ("duration_ms", Type::Number, false, "wall time"),
    ("cpu_ms", Type::Number, false, "CPU time of every process of the sandbox"),
    ("peak_memory_bytes", Type::Integer, true, "peak memory of the whole sandbox"),
    ("pids_limit_hit", Type::Boolean, false, "a fork failed at the process limit"),
    ("oom_kills", Type::Integer, false, "processes the OOM killer killed"),
    ("landlock_abi", Type::Integer, true, "the kernel's landlock ABI"),
    ("skipped_layers", Type::Array, false, "hardening not applied: {layer, feature, reason, covered_by}"),
    ("network", Type::Array, false, "connections through the network gateway, allowed and denied: {protocol, host, port, verdict (allowed, denied, failed), reason, count, bytes_out, bytes_in}"),
    ("files", Type::Array, false, "output files taken back: {path, size, media_type, sha256, data (base64)}"),
    ("files_skipped", Type::Array, false, "output files not taken: {path, reason}"),
    ("warm", Type::Boolean, false, "served by a sandbox of the warm pool, built before the request; false: started for it"),
];

const CALL_FIELDS: &[(&str, Type, bool, &str)] = &[
    ("execution_count", Type::Integer, true, "the REPL's counter"),
    (
        "result",
        Type::Object,
        true,
        "the trailing expression's MIME bundle (type -> text or base64)",
    ),
    (
        "displays",
        Type::Array,
        false,
        "MIME bundles shown during the call (figures, display())",
    ),
    (
        "exception",
        Type::Object,
        true,
        "{name, value, traceback} when the cell raised",
    ),
    (
        "state",
        Type::Object,
        false,
        "{preserved, restarted}: whether the interpreter kept its state",
    ),
    (
        "cwd",
        Type::String,
        true,
        "bash: the working directory after the call",
    ),
    (
        "killed",
        Type::Array,
        true,
        "processes a stopped call started that outlived its interrupt and were killed: {pid, command} (absent when none)",
    ),
];

/// Fields a result has only when the request asked for them.
const ASKED_FIELDS: &[(&str, Type, bool, &str)] = &[(
    "formatted",
    Type::Object,
    true,
    "with `format` in the request: {channel, messages, attachments: [{name, media_type, size, sha256, data}], truncated}, the result rendered for that chat channel",
)];

fn object(fields: &[(&str, Type, bool, &str)], description: &str) -> ObjectBuilder {
    let mut object = ObjectBuilder::new().description(Some(description));
    for (name, kind, nullable, text) in fields {
        let schema_type = if *nullable {
            SchemaType::from_iter([kind.clone(), Type::Null])
        } else {
            SchemaType::new(kind.clone())
        };
        object = object.property(
            *name,
            ObjectBuilder::new()
                .schema_type(schema_type)
                .description(Some(*text)),
        );
        if !nullable {
            object = object.required(*name);
        }
    }
    object
}

fn outcome_schema() -> Schema {
    let mut all: Vec<(&str, Type, bool, &str)> = OUTCOME_FIELDS.to_vec();
    all.extend_from_slice(ASKED_FIELDS);
    object(&all, "what a run did").build().into()
}

fn call_outcome_schema() -> Schema {
    let mut all: Vec<(&str, Type, bool, &str)> = OUTCOME_FIELDS.to_vec();
    all.extend_from_slice(ASKED_FIELDS);
    all.extend_from_slice(CALL_FIELDS);
    object(
        &all,
        "what a session's call did: a run's fields and the REPL's",
    )
    .build()
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The listed fields are exactly what the types serialize.
    #[test]
    fn the_result_schemas_match_what_the_types_serialize() {
        let outcome = serde_json::to_value(codecage::Outcome::default()).unwrap();
        let mut keys: Vec<&str> = outcome
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort();
        let mut listed: Vec<&str> = OUTCOME_FIELDS.iter().map(|f| f.0).collect();
        listed.sort();
        assert_eq!(keys, listed);
    }

    /// docs/openapi.json is the document the server serves (regenerate it with
    /// `codecage openapi > docs/openapi.json`).
    #[test]
    fn the_document_in_the_repository_is_current() {
        let kept = include_str!("../../docs/openapi.json");
        assert!(
            kept == document(),
            "docs/openapi.json is stale: run `cargo run -- openapi > docs/openapi.json`"
        );
    }
}
