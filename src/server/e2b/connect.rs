//! Connect with the JSON codec, as envd's services speak it to E2B's SDKs: a unary call is
//! a JSON body and a JSON answer; a server-streaming call takes one enveloped message
//! (a flags byte, a 32-bit big-endian length, the JSON) and answers enveloped messages,
//! the last an end-of-stream envelope (flags 2) carrying `{}` or `{"error": ...}`. Errors
//! are `{"code", "message"}` with the code's HTTP status, which the SDKs map to their
//! exceptions (`not_found` to NotFoundException, `already_exists`, `invalid_argument`...).

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::service::{self, Kind};

/// A Connect error: its code's name and HTTP status.
pub(super) struct ConnectError {
    pub code: &'static str,
    pub status: StatusCode,
    pub message: String,
}

impl ConnectError {
    pub fn invalid(message: impl Into<String>) -> ConnectError {
        ConnectError {
            code: "invalid_argument",
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> ConnectError {
        ConnectError {
            code: "not_found",
            status: StatusCode::NOT_FOUND,
            message: message.into(),
        }
    }

    pub fn json(&self) -> Value {
        json!({"code": self.code, "message": self.message})
    }
}

impl From<service::Error> for ConnectError {
    fn from(e: service::Error) -> ConnectError {
        let (code, status) = match e.kind {
            Kind::InvalidRequest => ("invalid_argument", StatusCode::BAD_REQUEST),
            Kind::Unauthorized => ("unauthenticated", StatusCode::UNAUTHORIZED),
            Kind::Policy | Kind::Forbidden => ("permission_denied", StatusCode::FORBIDDEN),
            Kind::NotFound | Kind::SessionExpired => ("not_found", StatusCode::NOT_FOUND),
            Kind::Exists => ("already_exists", StatusCode::CONFLICT),
            Kind::Busy => ("failed_precondition", StatusCode::PRECONDITION_FAILED),
            // E2B has no approvals: the command did not start, and the message names the
            // pending approval a person decides through codecage's own API or CLI.
            Kind::ApprovalPending => ("failed_precondition", StatusCode::PRECONDITION_FAILED),
            Kind::PayloadTooLarge | Kind::Quota => {
                ("resource_exhausted", StatusCode::TOO_MANY_REQUESTS)
            }
            Kind::Capacity | Kind::AuditUnavailable | Kind::SessionLost => {
                ("unavailable", StatusCode::SERVICE_UNAVAILABLE)
            }
            Kind::Setup | Kind::Audit => ("internal", StatusCode::INTERNAL_SERVER_ERROR),
        };
        ConnectError {
            code,
            status,
            message: format!("{}: {}", e.kind.name(), e.message),
        }
    }
}

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.json().to_string(),
        )
            .into_response()
    }
}

pub(super) type Unary = Result<Response, ConnectError>;

/// A unary call's answer.
pub(super) fn answer(value: Value) -> Unary {
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response())
}

/// A unary request's message, or a streaming one's (its one envelope).
pub(super) fn message<T: for<'de> Deserialize<'de>>(
    body: &[u8],
    enveloped: bool,
) -> Result<T, ConnectError> {
    let json = if enveloped {
        if body.len() < 5 {
            return Err(ConnectError::invalid(
                "the request has no enveloped message",
            ));
        }
        if body[0] & 1 != 0 {
            return Err(ConnectError::invalid(
                "compressed messages are not taken (send them uncompressed)",
            ));
        }
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        body.get(5..5 + len)
            .ok_or_else(|| ConnectError::invalid("the enveloped message is cut short"))?
    } else {
        body
    };
    serde_json::from_slice(if json.is_empty() { b"{}" } else { json })
        .map_err(|e| ConnectError::invalid(format!("the request's message: {e}")))
}

/// One enveloped message (flags 0), or the end of a stream (flags 2).
pub(super) fn envelope(flags: u8, value: &Value) -> Bytes {
    let json = value.to_string().into_bytes();
    let mut bytes = Vec::with_capacity(json.len() + 5);
    bytes.push(flags);
    bytes.extend_from_slice(&(json.len() as u32).to_be_bytes());
    bytes.extend_from_slice(&json);
    Bytes::from(bytes)
}

/// A server-streaming answer: the envelopes sent on the channel's sender, as they come.
pub(super) fn streaming(receiver: tokio::sync::mpsc::Receiver<Bytes>) -> Response {
    let body = tokio_stream::wrappers::ReceiverStream::new(receiver);
    let body = tokio_stream::StreamExt::map(body, Ok::<_, std::convert::Infallible>);
    (
        [(header::CONTENT_TYPE, "application/connect+json")],
        Body::from_stream(body),
    )
        .into_response()
}

/// A server-streaming call's answer: a stream's errors, those before its first message
/// too, travel in its end-of-stream envelope with status 200 (the SDKs' Connect clients
/// take any other status as a transport failure: `[internal] HTTP 400`).
pub(super) fn streamed(result: Unary) -> Response {
    match result {
        Ok(response) => response,
        Err(e) => (
            [(header::CONTENT_TYPE, "application/connect+json")],
            envelope(2, &json!({"error": e.json()})),
        )
            .into_response(),
    }
}

/// The user a call names (`Authorization: Basic base64("USER:")`, as the SDK sends it
/// when given `user`): the sandbox has one, E2B's `user`.
pub(super) fn check_user(headers: &HeaderMap) -> Result<(), ConnectError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(());
    };
    let user = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
        .map(|v| {
            String::from_utf8_lossy(&v)
                .split(':')
                .next()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default();
    if user.is_empty() || user == "user" {
        return Ok(());
    }
    Err(ConnectError {
        code: "permission_denied",
        status: StatusCode::FORBIDDEN,
        message: format!(
            "user {user:?}: a codecage sandbox has one user, `user` (uid 1000); there is no root in it"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Default)]
    #[serde(default)]
    struct Pid {
        pid: u64,
    }

    #[test]
    fn envelopes_round_trip() {
        let bytes = envelope(0, &json!({"pid": 7}));
        let body: Pid = message(&bytes, true).ok().unwrap();
        assert_eq!(body.pid, 7);
        assert!(message::<Pid>(&bytes[..4], true).is_err());
        let end = envelope(2, &json!({}));
        assert_eq!(&end[..], b"\x02\x00\x00\x00\x02{}");
    }
}
