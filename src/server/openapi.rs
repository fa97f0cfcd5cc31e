//! The OpenAPI document of the server (`GET /openapi.json`, and docs/openapi.json in the
//! repository, which a test holds equal to it), generated from the handlers: each one's
//! `#[utoipa::path]` (src/server/api/) gives its operation, parameters, bodies and
//! answers, and the types' `ToSchema` derives their schemas. Here: the list of handlers,
//! the error answers they share (the statuses `status_of` maps the service's kinds to),
//! the bearer scheme, and two passes over the schemas: a request's limit fields come from
//! the knob table (src/knobs.rs), and a type with flattened fields becomes one object.

use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{IntoResponses, Modify, OpenApi};

use codecage::knobs::{Knob, Unit};

use super::api::{self, ErrorBody};

/// The document, as JSON.
pub fn document() -> String {
    let mut text = ApiDoc::openapi().to_pretty_json().unwrap_or_default();
    text.push('\n');
    text
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "codecage",
        description = "Runs untrusted Python, JavaScript/TypeScript and bash in Linux sandboxes: \
            one-shot runs and sessions with a persistent interpreter."
    ),
    paths(
        api::run,
        api::create_session,
        api::list_sessions,
        api::get_session,
        api::delete_session,
        api::execute,
        api::reset,
        api::interrupt,
        api::processes::start,
        api::processes::list,
        api::processes::poll,
        api::processes::stdin,
        api::processes::signal,
        api::processes::kill,
        api::processes::screen,
        api::processes::resize,
        api::processes::stream,
        api::processes::events,
        api::list_files,
        api::download,
        api::upload,
        api::fs::stat,
        api::fs::list,
        api::fs::mkdir,
        api::fs::move_path,
        api::fs::remove,
        api::fs::watch,
        api::fs::create_watcher,
        api::fs::poll_watcher,
        api::fs::remove_watcher,
        api::approvals_api::list,
        api::approvals_api::show,
        api::approvals_api::decide,
        api::approvals_api::rules,
        api::approvals_api::revoke,
        api::audit_api::audit_list,
        api::audit_api::audit_export,
        api::audit_api::audit_show,
        api::pool_status,
        api::healthz,
        api::openapi,
    ),
    components(schemas(ErrorBody)),
    modifiers(&Bearer, &OneObject, &Knobs),
    tags(
        (name = "runs", description = "One-shot runs"),
        (name = "sessions", description = "Sessions: a sandbox with a persistent interpreter"),
        (name = "processes", description = "A session's background processes"),
        (name = "files", description = "A session's /work"),
        (name = "approvals", description = "Commands waiting for a person ([exec] ask), and standing approvals"),
        (name = "audit", description = "The audit log (administrators)"),
        (name = "server", description = "The server itself"),
    )
)]
struct ApiDoc;

/// No caller: a TCP listener without a good token.
#[derive(IntoResponses)]
#[allow(dead_code)]
pub enum Unauthenticated {
    /// No or a bad token (`unauthorized`; TCP listeners: `Authorization: Bearer TOKEN`).
    #[response(status = 401, headers(
        ("WWW-Authenticate" = String, description = "`Bearer realm=\"codecage\"`, with `error=\"invalid_token\"` when a token was given")
    ))]
    Unauthorized(ErrorBody),
}

/// What refuses a run or a new session before it runs.
#[derive(IntoResponses)]
#[allow(dead_code)]
pub enum Refusals {
    /// Invalid request (`invalid_request`): the message names the field.
    #[response(status = 400)]
    Invalid(ErrorBody),
    /// The request asks more than its profile or its token allows, or names a profile
    /// its token may not use (`policy`).
    #[response(status = 403)]
    Policy(ErrorBody),
    /// The body, or its code, is over the server's limit (`payload_too_large`).
    #[response(status = 413)]
    TooLarge(ErrorBody),
    /// The caller is past its quota, a token's or a uid's (`quota`: `max_sessions`,
    /// `max_concurrent_runs`): retry after Retry-After's seconds.
    #[response(status = 429, headers(("Retry-After" = u64, description = "seconds")))]
    Quota(ErrorBody),
    /// The sandbox could not be built, or the server failed (`setup`).
    #[response(status = 500)]
    Setup(ErrorBody),
    /// At capacity (`capacity`), or the audit log cannot take the request's record
    /// (`audit_unavailable`): retry after Retry-After's seconds.
    #[response(status = 503, headers(("Retry-After" = u64, description = "seconds")))]
    Capacity(ErrorBody),
}

/// What refuses a file operation on a session's /work.
#[derive(IntoResponses)]
#[allow(dead_code)]
pub enum FsRefusals {
    /// A bad path (`invalid_request`): `..`, outside /work, through a symlink or a mount
    /// point, the wrong type (a file for a directory); the message names the field.
    #[response(status = 400)]
    Invalid(ErrorBody),
    /// No such session of this caller's, or no such path (`not_found`: the message says
    /// which).
    #[response(status = 404)]
    Missing(ErrorBody),
    /// What would be created or replaced exists (`exists`).
    #[response(status = 409)]
    Exists(ErrorBody),
    /// The file system failed (`setup`).
    #[response(status = 500)]
    Failed(ErrorBody),
}

/// What refuses a session's call before it runs.
#[derive(IntoResponses)]
#[allow(dead_code)]
pub enum CallRefusals {
    /// Invalid request (`invalid_request`): the message names the field.
    #[response(status = 400)]
    Invalid(ErrorBody),
    /// A timeout over the profile's or the caller's maximum (`policy`).
    #[response(status = 403)]
    Policy(ErrorBody),
    /// No such session of this caller's (`not_found`: another caller's is not revealed),
    /// or it expired (`session_expired`).
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// The session is running another call (`busy`).
    #[response(status = 409)]
    Busy(ErrorBody),
    /// The body, or its code, is over the server's limit (`payload_too_large`).
    #[response(status = 413)]
    TooLarge(ErrorBody),
    /// The caller is past its `max_concurrent_runs` (`quota`): retry after Retry-After's
    /// seconds.
    #[response(status = 429, headers(("Retry-After" = u64, description = "seconds")))]
    Quota(ErrorBody),
    /// The session's sandbox is gone, or (behind a cluster's router) its node
    /// (`session_lost`).
    #[response(status = 410)]
    Lost(ErrorBody),
    /// The server failed (`setup`).
    #[response(status = 500)]
    Failed(ErrorBody),
    /// The audit log cannot take the call's record (`audit_unavailable`): retry after
    /// Retry-After's seconds.
    #[response(status = 503, headers(("Retry-After" = u64, description = "seconds")))]
    Unavailable(ErrorBody),
}

/// A session that is not there.
#[derive(IntoResponses)]
#[allow(dead_code)]
pub enum Missing {
    /// No such session of this caller's (`not_found`: another caller's is not revealed),
    /// or it expired (`session_expired`).
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// Behind a cluster's router: the session's node is gone or the route moved
    /// (`session_lost`, naming the node).
    #[response(status = 410)]
    Lost(ErrorBody),
}

/// A session that is not there or is running a call.
#[derive(IntoResponses)]
#[allow(dead_code)]
pub enum MissingOrBusy {
    /// No such session of this caller's (`not_found`: another caller's is not revealed),
    /// or it expired (`session_expired`).
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// The session is running a call (`busy`).
    #[response(status = 409)]
    Busy(ErrorBody),
    /// Behind a cluster's router: the session's node is gone or the route moved
    /// (`session_lost`, naming the node).
    #[response(status = 410)]
    Lost(ErrorBody),
}

/// The audit API's refusals.
#[derive(IntoResponses)]
#[allow(dead_code)]
pub enum AuditRefusals {
    /// A filter that does not parse (`invalid_request`).
    #[response(status = 400)]
    Invalid(ErrorBody),
    /// Not an administrator (`forbidden`): the audit needs a token with role admin, or
    /// root on the unix socket.
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// No such record, or the server keeps no audit log (`not_found`).
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// The audit database could not be read (`audit`).
    #[response(status = 500)]
    Failed(ErrorBody),
}

/// The bearer scheme of the TCP listeners (the unix socket needs none: its mode decides
/// who connects, and the caller is the peer's uid).
struct Bearer;

impl Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "TCP listeners: `Authorization: Bearer TOKEN`, a token of the server's \
                         configuration. The unix socket needs none.",
                    ))
                    .build(),
            ),
        );
    }
}

/// A type with flattened fields derives an `allOf` of inline objects (an `Outcome`'s
/// stream fields, a `CallOutcome`'s outcome, a stream's result event): one object here,
/// as JSON carries it.
struct OneObject;

impl Modify for OneObject {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = doc.components.as_mut() {
            for schema in components.schemas.values_mut() {
                if let RefOr::T(Schema::OneOf(one_of)) = schema {
                    // The variants of a tagged enum (the stream events).
                    for item in one_of.items.iter_mut() {
                        if let Some(merged) = one_object(item) {
                            *item = RefOr::T(Schema::Object(merged));
                        }
                    }
                } else if let Some(merged) = one_object(schema) {
                    *schema = RefOr::T(Schema::Object(merged));
                }
            }
        }
    }
}

/// An `allOf` of inline objects (or of such `allOf`s, or of a `oneOf` of one object: a
/// flattened field with its own description), as one object; None for anything else.
fn one_object(schema: &RefOr<Schema>) -> Option<utoipa::openapi::schema::Object> {
    match schema {
        RefOr::T(Schema::Object(object)) => Some(object.clone()),
        RefOr::T(Schema::OneOf(one)) if one.items.len() == 1 => one_object(&one.items[0]),
        RefOr::T(Schema::AllOf(all)) => {
            let mut merged = ObjectBuilder::new().build();
            for item in &all.items {
                let part = one_object(item)?;
                merged.properties.extend(part.properties);
                merged.required.extend(part.required);
                if merged.description.is_none() {
                    merged.description = part.description;
                }
            }
            merged.description = all.description.clone().or(merged.description);
            Some(merged)
        }
        _ => None,
    }
}

/// A request's limit fields: one property per knob a request may set, from the knob
/// table (the fields are `schema(ignore)`d on the types, which read them in one pass).
struct Knobs;

impl Modify for Knobs {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let Some(components) = doc.components.as_mut() else {
            return;
        };
        for (name, request) in [
            ("RunRequest", Request::Run),
            ("SessionRequest", Request::Session),
            ("ExecuteRequest", Request::Call),
        ] {
            if let Some(RefOr::T(Schema::Object(object))) = components.schemas.get_mut(name) {
                with_knobs(object, request);
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Request {
    Run,
    Session,
    /// A session's call: only its timeout.
    Call,
}

fn with_knobs(object: &mut utoipa::openapi::schema::Object, request: Request) {
    let session = request == Request::Session;
    let knobs = Knob::all()
        .filter(|k| k.requestable())
        .filter(|k| request != Request::Call || *k == Knob::Timeout);
    for knob in knobs {
        let def = knob.def();
        let kind = match def.unit {
            Unit::Count => "a whole number",
            Unit::Cpus => "a number of CPUs",
            Unit::Duration => "seconds, or a string with a unit (\"30s\", \"500ms\")",
            Unit::Size => "bytes, or a string with a unit (\"256M\", \"1G\")",
        };
        let per_call = session && matches!(knob, Knob::Timeout | Knob::OutputLimit);
        let description = format!(
            "{} ({kind}; default from the {}, {}{})",
            def.help,
            if request == Request::Call {
                "session"
            } else {
                "profile"
            },
            knob.show(def.default),
            if per_call {
                "; each call's default"
            } else {
                ""
            }
        );
        let property = ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([Type::Number, Type::String]))
            .description(Some(description))
            .build();
        object
            .properties
            .insert(knob.key().to_string(), property.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn properties(doc: &serde_json::Value, schema: &str) -> Vec<String> {
        let mut keys: Vec<String> = doc["components"]["schemas"][schema]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{schema} is not one object"))
            .keys()
            .cloned()
            .collect();
        keys.sort();
        keys
    }

    fn serialized(value: serde_json::Value, optional: &[&str]) -> Vec<String> {
        let mut keys: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
        keys.extend(optional.iter().map(|k| k.to_string()));
        keys.sort();
        keys
    }

    /// The result schemas have exactly the fields the types serialize (the fields left
    /// out when empty included).
    #[test]
    fn the_result_schemas_match_what_the_types_serialize() {
        let doc: serde_json::Value = serde_json::from_str(&document()).unwrap();
        let outcome = codecage::Outcome::default();
        assert_eq!(
            properties(&doc, "Outcome"),
            serialized(serde_json::to_value(&outcome).unwrap(), &["formatted"])
        );
        let call = codecage::session::CallOutcome {
            outcome,
            execution_count: None,
            result: None,
            displays: vec![],
            exception: None,
            state: Default::default(),
            cwd: None,
            killed: vec![],
        };
        assert_eq!(
            properties(&doc, "CallOutcome"),
            serialized(
                serde_json::to_value(&call).unwrap(),
                &["formatted", "cwd", "killed"]
            )
        );
        // Typed arrays, not `object`.
        let outcome = &doc["components"]["schemas"]["Outcome"]["properties"];
        for (field, item) in [
            ("files", "OutputFile"),
            ("network", "Connection"),
            ("files_skipped", "SkippedFile"),
            ("skipped_layers", "Skipped"),
        ] {
            assert_eq!(
                outcome[field]["items"]["$ref"],
                format!("#/components/schemas/{item}"),
                "{field}: {}",
                outcome[field]
            );
        }
    }

    /// Every operation has an operationId, and the authenticated ones the bearer scheme
    /// and a 401 that names it.
    #[test]
    fn every_operation_is_named_and_authenticated() {
        let doc: serde_json::Value = serde_json::from_str(&document()).unwrap();
        let mut ids = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let id = op["operationId"].as_str().unwrap_or_default();
                assert!(!id.is_empty(), "{method} {path} has no operationId");
                ids.push(id.to_string());
                if path == "/healthz" {
                    continue;
                }
                assert_eq!(
                    op["security"],
                    serde_json::json!([{"bearer": []}]),
                    "{path}"
                );
                assert!(
                    op["responses"]["401"]["headers"]["WWW-Authenticate"].is_object(),
                    "{method} {path}"
                );
            }
        }
        let count = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), count, "operationIds repeat: {ids:?}");
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
