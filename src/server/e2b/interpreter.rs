//! E2B's code interpreter (port 49999): `POST /execute` streaming NDJSON, the contexts,
//! health. A context is one of the session's (python, javascript: the Node context, bash),
//! by the language's name; codecage's displays and results become E2B's results, its
//! verdicts (timeout, oom, output limit, ...) an error and a stderr line.

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::{Body, Bytes};
use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use codecage::runner::Lang;
use codecage::session::{context_of, Call, CallOutcome, Event, MimeBundle};
use codecage::Stream;

use super::{E2b, E2bError, E2bResult, Record, HOME};
use crate::audit::Via;
use crate::server::api::JsonBody;
use crate::server::Shared;
use crate::service;

pub(super) fn router(state: Shared) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/execute", post(execute))
        .route("/contexts", get(list_contexts).post(create_context))
        .route("/contexts/{id}", delete(remove_context))
        .route("/contexts/{id}/restart", post(restart_context))
        .with_state(state)
}

async fn health() -> Json<Value> {
    Json(json!("OK"))
}

/// An E2B language (or context id) as a codecage context's language.
fn language(name: &str) -> E2bResult<Lang> {
    match name.to_ascii_lowercase().as_str() {
        "python" | "python3" => Ok(Lang::Python),
        "javascript" | "js" | "node" => Ok(Lang::Node),
        "typescript" | "ts" => Ok(Lang::Typescript),
        "bash" | "sh" | "shell" => Ok(Lang::Bash),
        other => Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("language {other:?}: codecage's contexts are python, javascript (also typescript, in the same Node context) and bash"),
        )),
    }
}

/// A context's id and E2B language: the Node context is `javascript`.
fn context_name(lang: Lang) -> &'static str {
    match context_of(lang) {
        Lang::Python => "python",
        Lang::Bash => "bash",
        _ => "javascript",
    }
}

fn context_json(lang: Lang) -> Value {
    json!({"id": context_name(lang), "language": context_name(lang), "cwd": HOME})
}

#[derive(Deserialize)]
struct ExecuteBody {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<serde_json::Map<String, Value>>,
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn line(value: Value) -> Bytes {
    let mut bytes = serde_json::to_vec(&value).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// A MIME bundle as an E2B result: its types under E2B's names, the others in `extra`.
pub(crate) fn result_line(bundle: &MimeBundle, main: bool) -> Value {
    let mut result = Map::new();
    result.insert("type".into(), json!("result"));
    let mut extra = Map::new();
    for (mime, data) in bundle {
        let key = match mime.as_str() {
            "text/plain" => "text",
            "text/html" => "html",
            "text/markdown" => "markdown",
            "image/svg+xml" => "svg",
            "image/png" => "png",
            "image/jpeg" => "jpeg",
            "application/pdf" => "pdf",
            "text/latex" => "latex",
            "application/javascript" => "javascript",
            "application/json" => {
                let value = serde_json::from_str(data).unwrap_or_else(|_| json!(data));
                result.insert("json".into(), value);
                continue;
            }
            _ => {
                extra.insert(mime.clone(), json!(data));
                continue;
            }
        };
        result.insert(key.into(), json!(data));
    }
    if !extra.is_empty() {
        result.insert("extra".into(), Value::Object(extra));
    }
    result.insert("is_main_result".into(), json!(main));
    Value::Object(result)
}

/// Output bytes as text lines of E2B's stream: UTF-8 decoded across chunk boundaries (a
/// character split between two chunks is held until its end comes).
#[derive(Default)]
struct Utf8Carry(Vec<u8>);

impl Utf8Carry {
    fn take(&mut self, bytes: &[u8]) -> String {
        self.0.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.0) {
            Ok(_) => self.0.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.0.len(),
        };
        let rest = self.0.split_off(valid);
        let text = String::from_utf8_lossy(&self.0).into_owned();
        self.0 = rest;
        text
    }
}

/// The lines after the call: its main result, its exception or codecage's verdict, the
/// execution count and the end.
fn final_lines(outcome: &CallOutcome) -> Vec<Value> {
    let mut lines = Vec::new();
    if let Some(result) = &outcome.result {
        lines.push(result_line(result, true));
    }
    let verdict = outcome
        .outcome
        .error
        .filter(|k| *k != codecage::outcome::ErrorKind::Exception);
    if let Some(kind) = verdict {
        let name = serde_json::to_value(kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| format!("{kind:?}"));
        let message = outcome.outcome.message.clone().unwrap_or_default();
        // Never dropped: a stderr line always, and the error where the code raised none.
        lines.push(json!({
            "type": "stderr",
            "text": format!("codecage: {name}: {message}\n"),
            "timestamp": now_ns(),
        }));
        if outcome.exception.is_none() {
            lines.push(json!({"type": "error", "name": name, "value": message, "traceback": ""}));
        }
    }
    if let Some(e) = &outcome.exception {
        let traceback: String = e
            .traceback
            .iter()
            .map(|l| {
                if l.ends_with('\n') {
                    l.clone()
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        lines.push(json!({
            "type": "error",
            "name": e.name,
            "value": e.value,
            "traceback": traceback.trim_end_matches('\n'),
        }));
    }
    if let Some(count) = outcome.execution_count {
        lines.push(json!({"type": "number_of_executions", "execution_count": count}));
    }
    lines.push(json!({"type": "end_of_execution"}));
    lines
}

async fn execute(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    JsonBody(body): JsonBody<ExecuteBody>,
) -> E2bResult<Response> {
    if body.env_vars.as_ref().is_some_and(|e| !e.is_empty()) {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            "env_vars: codecage does not set environment variables for one execution; give them at Sandbox.create(envs=...)",
        ));
    }
    let lang = match (&body.context_id, &body.language) {
        (Some(_), Some(_)) => {
            return Err(E2bError::new(
                StatusCode::BAD_REQUEST,
                "give context_id or language, not both",
            ))
        }
        (Some(id), None) => Some(language(id)?),
        (None, Some(name)) => Some(language(name)?),
        (None, None) => None,
    };
    let state = e2b.state.clone();
    let entry = service::lookup(&state, &record.caller, &record.id)?;
    let call = Call {
        code: body.code,
        lang,
        ..Call::default()
    };
    // Every refusal (busy, policy, quota) is known here, before the stream begins.
    let begun =
        service::begin_call(state.clone(), record.caller.clone(), Via::E2b, entry, call).await?;
    let stop = CancellationToken::new();
    let (lines, receiver) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let events = lines.clone();
    let mut carry = (Utf8Carry::default(), Utf8Carry::default());
    // Bounded by the session's output limit: the call is stopped past it.
    let forward = move |event: Event| {
        let value = match event {
            Event::Output(stream, bytes) => {
                let (kind, carry) = match stream {
                    Stream::Stdout => ("stdout", &mut carry.0),
                    Stream::Stderr => ("stderr", &mut carry.1),
                };
                let text = carry.take(bytes);
                if text.is_empty() {
                    return;
                }
                json!({"type": kind, "text": text, "timestamp": now_ns()})
            }
            Event::Display(bundle) => result_line(bundle, false),
        };
        let _ = events.send(line(value));
    };
    let guard = stop.clone().drop_guard();
    tokio::spawn(async move {
        let values = match begun.run(forward, stop).await {
            Ok(outcome) => final_lines(&outcome),
            Err(e) => vec![
                json!({"type": "error", "name": e.kind.name(), "value": e.message, "traceback": ""}),
                json!({"type": "end_of_execution"}),
            ],
        };
        // One chunk: the answer's end in one write.
        let end: Vec<u8> = values.into_iter().flat_map(|v| line(v).to_vec()).collect();
        let _ = lines.send(Bytes::from(end));
    });
    let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(receiver);
    let stream = tokio_stream::StreamExt::map(stream, move |bytes| {
        // The client going away drops the body and, with it, this guard: the call stops.
        let _held = &guard;
        Ok::<_, std::convert::Infallible>(bytes)
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}

async fn list_contexts(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
) -> E2bResult<Json<Vec<Value>>> {
    let entry = service::lookup(&e2b.state, &record.caller, &record.id)?;
    Ok(Json(
        entry
            .contexts
            .languages()
            .into_iter()
            .map(context_json)
            .collect(),
    ))
}

#[derive(Deserialize)]
struct NewContext {
    language: Option<String>,
    cwd: Option<String>,
}

/// A context of the language: the session's (made now if it was not), its working
/// directory moved to `cwd` (`/home/user` is /work) if another is asked for. Contexts
/// are one per language: a second of the same language is the first.
async fn create_context(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    body: Option<Json<NewContext>>,
) -> E2bResult<Json<Value>> {
    let body = body.map(|b| b.0).unwrap_or(NewContext {
        language: None,
        cwd: None,
    });
    let lang = language(body.language.as_deref().unwrap_or("python"))?;
    let cwd = body.cwd.unwrap_or_else(|| HOME.to_string());
    let dir = match cwd.strip_prefix(HOME) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("/work{rest}"),
        _ => cwd.clone(),
    };
    let quoted = serde_json::to_string(&dir).unwrap_or_default();
    let code = match context_of(lang) {
        Lang::Python => format!("import os as _cc_os; _cc_os.chdir({quoted}); del _cc_os"),
        Lang::Bash => format!("cd '{}'", dir.replace('\'', "'\\''")),
        _ => format!("process.chdir({quoted})"),
    };
    let entry = service::lookup(&e2b.state, &record.caller, &record.id)?;
    let call = Call {
        code,
        lang: Some(lang),
        ..Call::default()
    };
    let outcome = service::call_session(
        e2b.state.clone(),
        record.caller.clone(),
        Via::E2b,
        entry,
        call,
        |_| {},
    )
    .await?;
    if let Some(e) = &outcome.exception {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("cwd {cwd:?}: {}: {}", e.name, e.value),
        ));
    }
    if let Some(kind) = outcome.outcome.error {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "the {} context could not be made ({kind:?}): {}",
                context_name(lang),
                outcome.outcome.message.unwrap_or_default()
            ),
        ));
    }
    let mut context = context_json(lang);
    context["cwd"] = json!(cwd);
    Ok(Json(context))
}

/// Restarting and removing a context both give it a fresh interpreter (codecage keeps
/// one context per language; a removed one is made again on its next use).
async fn restart(e2b: &E2b, record: &Record, id: &str) -> E2bResult<StatusCode> {
    let lang = language(id)?;
    let entry = service::lookup(&e2b.state, &record.caller, &record.id)?;
    service::reset_session(&e2b.state, &record.caller, Via::E2b, entry, Some(lang)).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn restart_context(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    restart(&e2b, &record, &id).await
}

async fn remove_context(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    restart(&e2b, &record, &id).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_become_e2b_results() {
        let bundle: MimeBundle = [
            ("text/plain".to_string(), "42".to_string()),
            ("image/png".to_string(), "iVBO".to_string()),
            ("application/json".to_string(), "{\"a\": 1}".to_string()),
            ("application/x-other".to_string(), "x".to_string()),
        ]
        .into_iter()
        .collect();
        let r = result_line(&bundle, true);
        assert_eq!(r["type"], "result");
        assert_eq!(r["text"], "42");
        assert_eq!(r["png"], "iVBO");
        assert_eq!(r["json"]["a"], 1);
        assert_eq!(r["extra"]["application/x-other"], "x");
        assert_eq!(r["is_main_result"], true);
    }

    #[test]
    fn utf8_split_across_chunks_is_held() {
        let mut carry = Utf8Carry::default();
        let bytes = "é".as_bytes();
        assert_eq!(carry.take(&bytes[..1]), "");
        assert_eq!(carry.take(&bytes[1..]), "é");
        assert_eq!(carry.take(b"\xff"), "\u{fffd}");
    }
}
