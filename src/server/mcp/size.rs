//! MCP requests over `mcp.max_request`, answered rather than dropped, on both transports.
//!
//! rmcp's own stdio transport drops a line over its limit and only logs it, so a client
//! that sent a large `write_file` waits forever for the answer to that id. Here the lines
//! from stdin are read with a bound first: a request over `max_request` bytes is answered
//! with a JSON-RPC error that names the limit (with the request's id when the start of
//! the line shows it), and only lines within the limit reach rmcp, through an in-memory
//! pipe. rmcp's answers and these errors reach stdout through one writer, a whole line at
//! a time. Over HTTP (`/mcp`), [`http_limit`] reads a body up to the limit first and answers
//! one over it with the same error (HTTP 413).

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use codecage::units::format_size;

/// JSON-RPC's "Invalid Request".
const INVALID_REQUEST: i64 = -32600;
/// The id is looked for in this much of an oversize line.
const ID_WINDOW: usize = 64 << 10;

/// Runs the filter between the real stdin/stdout and rmcp's side of two pipes, and
/// returns rmcp's transport over that side.
pub fn stdio(
    max_request: usize,
) -> rmcp::transport::async_rw::AsyncRwTransport<
    rmcp::RoleServer,
    tokio::io::DuplexStream,
    tokio::io::DuplexStream,
> {
    let (to_rmcp, rmcp_in) = tokio::io::duplex(1 << 16);
    let (rmcp_out, from_rmcp) = tokio::io::duplex(1 << 16);
    let (errors, error_lines) = mpsc::channel::<Vec<u8>>(16);
    tokio::spawn(read_requests(
        tokio::io::stdin(),
        to_rmcp,
        errors,
        max_request,
    ));
    tokio::spawn(write_answers(from_rmcp, error_lines, tokio::io::stdout()));
    // Every line that reaches rmcp is within the limit already.
    rmcp::transport::async_rw::AsyncRwTransport::new(rmcp_in, rmcp_out)
        .with_max_line_length(max_request.saturating_add(1))
}

/// Lines from `input`: each within `max` goes on to rmcp; each over it is answered.
async fn read_requests(
    input: impl AsyncRead + Unpin,
    mut to_rmcp: impl AsyncWrite + Unpin,
    errors: mpsc::Sender<Vec<u8>>,
    max: usize,
) {
    let mut input = BufReader::with_capacity(1 << 16, input);
    let mut line: Vec<u8> = Vec::new();
    // The size of the line being dropped, and its start (for the id).
    let mut dropping: Option<(usize, Vec<u8>)> = None;
    loop {
        let chunk = match input.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(chunk) => chunk,
        };
        let (used, end) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let part = &chunk[..used];
        match &mut dropping {
            Some((size, head)) => {
                *size += part.len();
                let room = ID_WINDOW.saturating_sub(head.len());
                head.extend_from_slice(&part[..part.len().min(room)]);
            }
            // Over the limit (the newline aside): from here on only its size and its start
            // are kept.
            None if line.len() + part.len() > max + 1 => {
                let size = line.len() + part.len();
                let mut head = std::mem::take(&mut line);
                head.truncate(ID_WINDOW);
                let room = ID_WINDOW.saturating_sub(head.len());
                head.extend_from_slice(&part[..part.len().min(room)]);
                dropping = Some((size, head));
            }
            None => line.extend_from_slice(part),
        }
        input.consume(used);
        if end {
            if let Some((size, head)) = dropping.take() {
                let answer = too_large(&head, size, max);
                if errors.send(answer).await.is_err() {
                    break;
                }
            } else if to_rmcp.write_all(&line).await.is_err() {
                break;
            }
            line.clear();
        }
    }
    let _ = to_rmcp.shutdown().await;
}

/// rmcp's lines and the errors, each written whole.
async fn write_answers(
    from_rmcp: impl AsyncRead + Unpin,
    mut errors: mpsc::Receiver<Vec<u8>>,
    mut output: impl AsyncWrite + Unpin,
) {
    let mut from_rmcp = BufReader::new(from_rmcp);
    let mut line = Vec::new();
    let mut rmcp_open = true;
    loop {
        tokio::select! {
            read = from_rmcp.read_until(b'\n', &mut line), if rmcp_open => {
                match read {
                    Ok(0) | Err(_) => rmcp_open = false,
                    Ok(_) => {
                        if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
                            return;
                        }
                        line.clear();
                    }
                }
            }
            error = errors.recv() => match error {
                Some(error)
                    if output.write_all(&error).await.is_err() || output.flush().await.is_err() =>
                {
                    return
                }
                None if !rmcp_open => return,
                _ => {}
            },
        }
    }
}

/// `/mcp`'s body, read up to `mcp.max_request` before rmcp sees it: over it, 413 with the
/// JSON-RPC error that names the limit, and the id when the start of the body shows it.
pub async fn http_limit(
    axum::extract::State(state): axum::extract::State<crate::server::Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let max = usize::try_from(state.config.mcp.max_request).unwrap_or(usize::MAX);
    let (parts, body) = request.into_parts();
    let mut body = body;
    let mut bytes: Vec<u8> = Vec::new();
    let mut size = 0usize;
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        let Ok(frame) = frame else {
            return (
                axum::http::StatusCode::BAD_REQUEST,
                "cannot read the request body",
            )
                .into_response();
        };
        if let Ok(data) = frame.into_data() {
            size += data.len();
            if size <= max {
                bytes.extend_from_slice(&data);
            } else if bytes.len() < ID_WINDOW {
                let room = ID_WINDOW - bytes.len();
                bytes.extend_from_slice(&data[..data.len().min(room)]);
            }
        }
    }
    if size > max {
        let mut answer = too_large(&bytes, size, max);
        answer.pop();
        return (
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            answer,
        )
            .into_response();
    }
    let request = axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
    next.run(request).await
}

/// The JSON-RPC error for a request of `size` bytes over `max`, with the id found in
/// `head` (null when none can be read).
fn too_large(head: &[u8], size: usize, max: usize) -> Vec<u8> {
    let id = top_level_id(head).unwrap_or(Value::Null);
    let answer = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": INVALID_REQUEST,
            "message": format!(
                "the request is {:.1} MiB ({size} bytes), over the limit of {} a request may have \
                 (mcp.max_request in the server config); send large files in parts, or in fewer \
                 bytes",
                size as f64 / f64::from(1 << 20),
                format_size(max as u64)
            ),
            "data": {"limit": max, "size": size},
        }
    });
    let mut bytes = answer.to_string().into_bytes();
    bytes.push(b'\n');
    bytes
}

/// The value of the top-level `"id"` key of the JSON object `head` begins, if `head`
/// holds all of it: a number or a string (JSON-RPC's ids).
fn top_level_id(head: &[u8]) -> Option<Value> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < head.len() {
        match head[i] {
            b'"' => {
                let start = i;
                i += 1;
                while i < head.len() && head[i] != b'"' {
                    i += if head[i] == b'\\' { 2 } else { 1 };
                }
                if i >= head.len() {
                    return None;
                }
                let mut j = i + 1;
                while j < head.len() && head[j].is_ascii_whitespace() {
                    j += 1;
                }
                // A key of the top-level object is a string followed by ':' at depth 1.
                if depth == 1 && head.get(j) == Some(&b':') && &head[start..=i] == b"\"id\"" {
                    return value_at(head, j + 1);
                }
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

/// A JSON number or string that starts at `from` (after whitespace).
fn value_at(head: &[u8], from: usize) -> Option<Value> {
    let rest = &head[from.min(head.len())..];
    let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    let rest = &rest[start..];
    let end = if rest.first() == Some(&b'"') {
        let mut i = 1;
        while i < rest.len() && rest[i] != b'"' {
            i += if rest[i] == b'\\' { 2 } else { 1 };
        }
        i + 1
    } else {
        rest.iter()
            .position(|b| !(b.is_ascii_digit() || b"-+.eE".contains(b)))
            .unwrap_or(rest.len())
    };
    let value: Value = serde_json::from_slice(rest.get(..end)?).ok()?;
    (value.is_number() || value.is_string()).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_read_from_the_start_of_a_request() {
        let head = br#"{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"write_file","arguments":{"content":"xxxx"#;
        assert_eq!(top_level_id(head), Some(Value::from(17)));
        let head = br#"{"method":"x","params":{"id":3,"a":"}"},"id" : "abc-1"}"#;
        assert_eq!(top_level_id(head), Some(Value::from("abc-1")));
        let head = br#"{"jsonrpc":"2.0","method":"tools/call","params":{"id":5,"#;
        assert_eq!(top_level_id(head), None, "a nested id is not the request's");
        assert_eq!(top_level_id(br#"{"id":"unterminated"#), None);
    }

    #[tokio::test]
    async fn a_line_over_the_limit_is_answered_and_the_next_one_passes() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"tools/call\",\"params\":{{\"x\":\"{}\"}}}}\n",
            "y".repeat(5000)
        );
        let small = "{\"jsonrpc\":\"2.0\",\"id\":10,\"method\":\"ping\"}\n";
        let input = format!("{big}{small}");
        let (mut rmcp_side, filter_side) = tokio::io::duplex(1 << 20);
        let (errors, mut error_lines) = mpsc::channel(4);
        read_requests(input.as_bytes(), filter_side, errors, 1000).await;
        let error = error_lines
            .recv()
            .await
            .expect("an answer to the large request");
        let error: Value = serde_json::from_slice(&error).unwrap();
        assert_eq!(error["id"], 9);
        assert_eq!(error["error"]["code"], INVALID_REQUEST);
        assert_eq!(error["error"]["data"]["size"], big.len());
        assert!(error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("mcp.max_request"));
        let mut passed = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut rmcp_side, &mut passed)
            .await
            .unwrap();
        assert_eq!(passed, small);
    }
}
