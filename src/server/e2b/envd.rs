//! envd's HTTP API (port 49983): health, and file download and upload (multipart, as the
//! SDK sends by default, and octet-stream) through the session's file calls, within the
//! profile's caps. `/home/user` is /work; the sandbox's one user is E2B's `user`.

use std::sync::Arc;

use axum::extract::Query;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use codecage::files::InputFile;

use super::{work_path, E2b, E2bError, E2bResult, Record, HOME};
use crate::server::api::RawBody;
use crate::server::Shared;
use crate::service;

pub(super) fn router(state: Shared) -> Router {
    let router = Router::new()
        .route("/health", get(health))
        .route("/files", get(download).post(upload));
    let router = super::process::routes(router);
    super::filesystem::routes(router)
        .fallback(not_done)
        .with_state(state)
}

async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

#[derive(Deserialize)]
struct FileQuery {
    path: Option<String>,
    username: Option<String>,
}

/// The sandbox's files belong to its one user, E2B's `user`; another is refused.
fn check_user(query: &FileQuery) -> E2bResult<()> {
    match query.username.as_deref() {
        None | Some("") | Some("user") => Ok(()),
        Some(other) => Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("username {other:?}: a codecage sandbox has one user, `user` (uid 1000); there is no root in it"),
        )),
    }
}

/// A path the SDK gave, checked as codecage's file calls take it (relative to /work).
fn checked(path: &str) -> E2bResult<String> {
    let relative = work_path(path)?;
    codecage::files::check_input_path(&relative)
        .map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, format!("path {path:?}: {e}")))?;
    Ok(relative)
}

async fn download(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    Query(query): Query<FileQuery>,
) -> E2bResult<Response> {
    check_user(&query)?;
    let path = query.path.clone().ok_or_else(|| {
        E2bError::new(
            StatusCode::BAD_REQUEST,
            "the `path` query parameter is missing",
        )
    })?;
    let relative = checked(&path)?;
    let media = codecage::files::media_type(&relative);
    let data = service::with_session(&e2b.state, &record.caller, &record.id, move |s, e| {
        s.read_file(&relative, e.caps.read_max)
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, media)], data).into_response())
}

async fn upload(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    Query(query): Query<FileQuery>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> E2bResult<Json<Vec<Value>>> {
    check_user(&query)?;
    if headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity")
    {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            "Content-Encoding: codecage's E2B front end takes uploads uncompressed (write without gzip)",
        ));
    }
    if headers
        .keys()
        .any(|k| k.as_str().starts_with("x-metadata-"))
    {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            "metadata: codecage's files carry no metadata (write without `metadata`)",
        ));
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let files: Vec<(String, Vec<u8>)> = if content_type.starts_with("multipart/form-data") {
        let parts = multipart(&content_type, body)?;
        if parts.len() == 1 && query.path.is_some() {
            let (_, data) = parts.into_iter().next().unwrap_or_default();
            vec![(query.path.clone().unwrap_or_default(), data)]
        } else {
            parts
        }
    } else {
        let path = query.path.clone().ok_or_else(|| {
            E2bError::new(
                StatusCode::BAD_REQUEST,
                "the `path` query parameter is missing",
            )
        })?;
        vec![(path, body)]
    };
    let mut inputs = Vec::new();
    let mut answer = Vec::new();
    for (path, data) in files {
        let relative = checked(&path)?;
        let name = relative.rsplit('/').next().unwrap_or(&relative).to_string();
        answer.push(json!({"name": name, "type": "file", "path": format!("{HOME}/{relative}")}));
        inputs.push(InputFile::new(relative, data));
    }
    service::with_session(&e2b.state, &record.caller, &record.id, move |s, e| {
        codecage::files::check_inputs(&inputs, e.caps.input_files, e.caps.input_total)?;
        s.write_files(&inputs)
    })
    .await?;
    Ok(Json(answer))
}

/// The parts of a `multipart/form-data` body: each one's file name and bytes.
fn multipart(content_type: &str, body: Vec<u8>) -> E2bResult<Vec<(String, Vec<u8>)>> {
    let bad = |why: &str| E2bError::new(StatusCode::BAD_REQUEST, format!("multipart body: {why}"));
    let boundary = content_type
        .split(';')
        .filter_map(|p| p.trim().strip_prefix("boundary="))
        .next()
        .map(|b| b.trim_matches('"').to_string())
        .ok_or_else(|| bad("no boundary in its Content-Type"))?;
    let delimiter = format!("--{boundary}").into_bytes();
    let mut parts = Vec::new();
    let mut rest: &[u8] = &body;
    let start = find(rest, &delimiter).ok_or_else(|| bad("no part"))?;
    rest = &rest[start + delimiter.len()..];
    loop {
        if rest.starts_with(b"--") {
            break;
        }
        rest = rest
            .strip_prefix(b"\r\n")
            .ok_or_else(|| bad("a delimiter without CRLF"))?;
        let head_end = find(rest, b"\r\n\r\n").ok_or_else(|| bad("a part without headers"))?;
        let head = String::from_utf8_lossy(&rest[..head_end]).to_string();
        rest = &rest[head_end + 4..];
        let mut closing = b"\r\n".to_vec();
        closing.extend_from_slice(&delimiter);
        let end = find(rest, &closing).ok_or_else(|| bad("a part that does not end"))?;
        let data = rest[..end].to_vec();
        rest = &rest[end + closing.len()..];
        let name = head
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("content-disposition"))
            .and_then(|l| {
                let at = l.find("filename=")?;
                let value = &l[at + "filename=".len()..];
                let value = value.strip_prefix('"').map_or_else(
                    || value.split(';').next().unwrap_or("").to_string(),
                    |v| v.split('"').next().unwrap_or("").to_string(),
                );
                Some(value)
            })
            .ok_or_else(|| bad("a part without a file name"))?;
        parts.push((name, data));
    }
    if parts.is_empty() {
        return Err(bad("no file in it"));
    }
    Ok(parts)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// envd's filesystem service is not served yet.
async fn not_done(request: axum::extract::OriginalUri) -> E2bError {
    E2bError::new(
        StatusCode::NOT_IMPLEMENTED,
        format!(
            "{}: codecage's E2B front end does not serve envd's filesystem service yet (files.read and files.write work; see README's E2B compatibility table)",
            request.path()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_parts_are_read_with_their_names() {
        let body = b"--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/a.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhello\r\n--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"b\"\r\n\r\n\r\nx\r\n--xyz--\r\n".to_vec();
        let parts = multipart("multipart/form-data; boundary=xyz", body)
            .ok()
            .unwrap();
        assert_eq!(
            parts[0],
            ("/home/user/a.txt".to_string(), b"hello".to_vec())
        );
        assert_eq!(parts[1], ("b".to_string(), b"\r\nx".to_vec()));
        assert!(multipart("multipart/form-data", Vec::new()).is_err());
    }
}
