//! Request bodies: read under the server's body budget into one buffer, code over
//! `limits.max_code` measured before decoding, JSON parsed in one pass with errors that
//! name the field (and never quote a string value).

use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::{ApiError, Kind};
use crate::server::Shared;
use crate::service;

/// A request's body, read under the server's body budget: bodies in memory at once are
/// bounded by `limits.max_body` together; a body takes its size (its Content-Length, else
/// the cap) from that budget (given back with the permit) and waits up to the queue
/// timeout for it. Read into one buffer of the declared size: no list of chunks copied
/// at the end.
async fn read_body(
    request: Request,
    state: &Shared,
) -> Result<(Vec<u8>, tokio::sync::OwnedSemaphorePermit), ApiError> {
    let (budget, declared) = budget(request.headers(), state).await?;
    let max = state.config.limits.max_body;
    // Read into one buffer of the declared size: no list of chunks copied at the end.
    let too_large = || {
        ApiError::new(
            Kind::PayloadTooLarge,
            "the request body is over the server's limit (limits.max_body)",
        )
    };
    let mut body = request.into_body();
    let mut bytes = Vec::with_capacity(declared as usize);
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        let frame =
            frame.map_err(|e| ApiError::invalid(format!("cannot read the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if (bytes.len() + data.len()) as u64 > max {
                return Err(too_large());
            }
            bytes.extend_from_slice(&data);
        }
    }
    drop(body);
    Ok((bytes, budget))
}

/// For a service that reads its own bodies (rmcp's, at /mcp): the request holds its share
/// of the body budget (its Content-Length, else `max_body`) until its answer begins.
pub async fn body_budget(
    axum::extract::State(state): axum::extract::State<Shared>,
    request: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    match budget(request.headers(), &state).await {
        Ok((_permit, _)) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

/// A place in the body budget for `request`'s body, and the size it declared.
async fn budget(
    headers: &axum::http::HeaderMap,
    state: &Shared,
) -> Result<(tokio::sync::OwnedSemaphorePermit, u64), ApiError> {
    let max = state.config.limits.max_body;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(max)
        .min(max);
    let kib = u32::try_from(declared / 1024 + 1).unwrap_or(u32::MAX);
    let budget = tokio::time::timeout(
        state.config.limits.queue_timeout,
        state.bodies.clone().acquire_many_owned(kib),
    )
    .await;
    match budget {
        Ok(Ok(permit)) => Ok((permit, declared)),
        _ => Err(ApiError::new(
            Kind::Capacity,
            "the server is reading as many request bodies as it holds at once; try again shortly",
        )
        .retry_after(state.config.limits.queue_timeout.as_secs())),
    }
}

/// A raw body (file uploads), read as [`read_body`] does.
pub struct RawBody(pub Vec<u8>);

impl FromRequest<Shared> for RawBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &Shared) -> Result<Self, ApiError> {
        Ok(RawBody(read_body(request, state).await?.0))
    }
}

/// A JSON body: malformed JSON, unknown fields and wrong types are 400 with the field's
/// path; a body over the cap is 413.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Shared> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &Shared) -> Result<Self, ApiError> {
        let (bytes, _budget) = read_body(request, state).await?;
        // Code over `limits.max_code` is refused before the body is decoded: measured in
        // the JSON text (a pass that allocates nothing of its size).
        if let Ok(probe) = serde_json::from_slice::<Probe>(&bytes) {
            if let Some(raw) = probe
                .code
                .filter(|raw| raw.get().len() as u64 > state.config.limits.max_code + 2)
            {
                let cap = state.audit.as_ref().map_or(0, |a| a.code_cap());
                if let Some(measured) = service::code::measure(raw.get(), cap) {
                    if let Err(mut e) = service::code_within(state, measured.size as usize) {
                        e.code = Some(Box::new(measured));
                        return Err(e);
                    }
                }
            }
        }
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

/// A body's `code`, as JSON text borrowed from the body (everything else is skipped
/// without being decoded).
#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default)]
    code: Option<&'a serde_json::value::RawValue>,
}

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
