//! Results for a model: an Outcome (or a service error) as MCP content blocks. One text
//! block (output, the error, the exception), then an image block per PNG the driver
//! showed (checked by its header, never decoded here), then resource links for output
//! files and for output cut from the text.

use std::sync::Arc;

use base64::Engine as _;
use rmcp::model::{CallToolResult, ContentBlock, Resource, ResourceContents};

use codecage::outcome::ErrorKind;
use codecage::session::{CallOutcome, MimeBundle};

use super::{CodecageMcp, Language};
use crate::server::registry::Entry;
use crate::server::Caller;
use crate::service::Error as ApiError;

/// A one-shot run's output files are embedded up to this size each (there is no session
/// to read them from later).
const EMBED_MAX: usize = 1 << 20;

/// A call's result rendered for a chat channel (the `format` argument): each message a text
/// block, ready to post; images as image blocks and the other attachments (the full
/// output, files) as embedded resources. A failed call is still `isError`.
pub(super) fn formatted(call: &CallOutcome, options: &codecage::format::Options) -> CallToolResult {
    let rendered = match codecage::format::render(call, options) {
        Ok(rendered) => rendered,
        Err(e) => return tool_error(format!("format: {e}")),
    };
    let mut blocks: Vec<ContentBlock> = rendered
        .messages
        .iter()
        .map(|m| ContentBlock::text(m.clone()))
        .collect();
    for attachment in &rendered.attachments {
        blocks.push(if attachment.media_type.starts_with("image/") {
            ContentBlock::image(b64(&attachment.data), attachment.media_type.clone())
        } else {
            ContentBlock::resource(
                ResourceContents::blob(
                    b64(&attachment.data),
                    format!("codecage://attachments/{}", attachment.name),
                )
                .with_mime_type(attachment.media_type.clone()),
            )
        });
    }
    let failed = call.outcome.error.is_some();
    if failed {
        CallToolResult::error(blocks)
    } else {
        CallToolResult::success(blocks)
    }
}

/// A tool's failure, for the client to show the model: `isError` with the message.
pub(super) fn tool_error(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

/// A service error as a tool result: `isError`, "[kind] message".
pub(super) fn api_error(e: ApiError) -> CallToolResult {
    let message = match e.kind() {
        "not_found" | "session_expired" => e
            .message()
            .replace("create a new one", "call create_session for a new one"),
        _ => e.message().to_string(),
    };
    tool_error(format!("[{}] {message}", e.kind()))
}

impl CodecageMcp {
    /// The result blocks of a call: text, images, resource links.
    pub(super) fn render(
        &self,
        language: Language,
        entry: Option<&Arc<Entry>>,
        call: &CallOutcome,
        note: Option<String>,
        caller: &Caller,
    ) -> CallToolResult {
        let config = &self.state.config.mcp;
        let outcome = &call.outcome;
        let max_text = config.max_text as usize;
        let mut text = String::new();
        let mut links = Vec::new();
        let stdout = String::from_utf8_lossy(&outcome.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&outcome.stderr).into_owned();
        let cut = stdout.len() + stderr.len() > max_text;
        let key = cut
            .then(|| self.state.mcp.keep(caller, stdout.clone(), stderr.clone()))
            .flatten();
        let share = if stderr.is_empty() {
            max_text
        } else {
            max_text / 2
        };
        if !stdout.is_empty() {
            text.push_str(&shorten(
                &stdout,
                share.max(max_text.saturating_sub(stderr.len())),
            ));
            if !text.ends_with('\n') {
                text.push('\n');
            }
        }
        if !stderr.is_empty() {
            text.push_str("[stderr]\n");
            text.push_str(&shorten(
                &stderr,
                share.max(max_text.saturating_sub(stdout.len())),
            ));
            if !text.ends_with('\n') {
                text.push('\n');
            }
        }
        if let Some(key) = &key {
            text.push_str(&format!(
                "[output cut to {max_text} bytes; all of it: the resources codecage://outputs/{key}/stdout and /stderr]\n"
            ));
            for stream in ["stdout", "stderr"] {
                links.push(ContentBlock::resource_link(
                    Resource::new(
                        format!("codecage://outputs/{key}/{stream}"),
                        format!("the call's {stream}"),
                    )
                    .with_mime_type("text/plain"),
                ));
            }
        }
        if outcome.truncated {
            text.push_str(
                "[the output passed the output limit and was cut there; the code was stopped]\n",
            );
        }
        if let Some(result) = call.result.as_ref().and_then(|r| r.get("text/plain")) {
            text.push_str(&format!("[result]\n{}\n", shorten(result, max_text)));
        }
        let mut images = Vec::new();
        let mut skipped_images = 0;
        for bundle in call.displays.iter().chain(call.result.iter()) {
            match image_of(bundle, config.image_max_edge) {
                Some(Ok(png)) if images.len() < config.max_images => {
                    images.push(ContentBlock::image(b64(&png), "image/png"))
                }
                Some(Ok(_)) => skipped_images += 1,
                Some(Err(e)) => text.push_str(&format!("[an image not shown: {e}]\n")),
                None => {
                    if !bundle.contains_key("text/plain") {
                        let kinds: Vec<&str> = bundle.keys().map(String::as_str).collect();
                        text.push_str(&format!("[display: {}]\n", kinds.join(", ")));
                    }
                }
            }
        }
        if skipped_images > 0 {
            text.push_str(&format!(
                "[{skipped_images} more image(s) not shown: at most {} per call]\n",
                config.max_images
            ));
        }
        if let Some(e) = &call.exception {
            text.push_str(&format!("[exception] {}: {}\n", e.name, e.value));
            let traceback: String = e.traceback.concat();
            if !traceback.is_empty() {
                text.push_str(&shorten(&traceback, max_text / 2));
                if !text.ends_with('\n') {
                    text.push('\n');
                }
            }
        }
        let mut failed = outcome.error.is_some();
        match outcome.error {
            Some(ErrorKind::Exception) | None => {}
            Some(kind) => {
                let name = serde_json::to_value(kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                text.push_str(&format!(
                    "[error: {name}] {}\n",
                    outcome.message.as_deref().unwrap_or("")
                ));
            }
        }
        if entry.is_some() && (outcome.error.is_some() || call.state.restarted) {
            if call.state.restarted {
                text.push_str(
                    "[state: the interpreter was restarted; variables, imports and functions are gone; files in /work are kept]\n",
                );
            } else if matches!(
                outcome.error,
                Some(ErrorKind::Timeout | ErrorKind::Interrupted | ErrorKind::OutputLimit)
            ) {
                text.push_str(&format!(
                    "[state: {}]\n",
                    if call.state.preserved {
                        "preserved: the interpreter was interrupted and keeps its variables"
                    } else {
                        "lost"
                    }
                ));
            }
        }
        if language == Language::Shell {
            if let Some(code) = outcome.exit_code.filter(|c| *c != 0) {
                text.push_str(&format!("[exit status {code}]\n"));
                failed = true;
            }
        } else if entry.is_none() && outcome.exit_code.is_some_and(|c| c != 0) {
            text.push_str(&format!(
                "[exit status {}]\n",
                outcome.exit_code.unwrap_or(0)
            ));
            failed = true;
        }
        // Output files: links to read them (a session), or the files themselves (no session).
        if !outcome.files.is_empty() {
            let names: Vec<String> = outcome
                .files
                .iter()
                .map(|f| format!("{} ({}, {} bytes)", f.path, f.media_type, f.size))
                .collect();
            let dir = entry.map_or("out", |e| e.caps.output_dir.as_str());
            text.push_str(&format!("[files in /work/{dir}] {}\n", names.join(", ")));
            for file in &outcome.files {
                let path = format!("{dir}/{}", file.path);
                match (entry, &file.data) {
                    (Some(entry), _) => links.push(ContentBlock::resource_link(
                        Resource::new(file_uri(&entry.id, &path), file.path.clone())
                            .with_mime_type(file.media_type.clone())
                            .with_size(file.size),
                    )),
                    (None, Some(data)) if data.len() <= EMBED_MAX => {
                        let uri = format!("codecage://run/{path}");
                        let contents = match as_text(&file.media_type, data) {
                            Some(t) => ResourceContents::text(t, uri),
                            None => ResourceContents::blob(b64(data), uri),
                        };
                        links.push(ContentBlock::resource(
                            contents.with_mime_type(file.media_type.clone()),
                        ));
                    }
                    (None, _) => text.push_str(&format!(
                        "[{} is over {} bytes and was not returned: use a session to read it]\n",
                        file.path, EMBED_MAX
                    )),
                }
            }
        }
        if !outcome.files_skipped.is_empty() {
            let skipped: Vec<String> = outcome
                .files_skipped
                .iter()
                .take(20)
                .map(|s| format!("{} ({})", s.path, s.reason.describe(None)))
                .collect();
            text.push_str(&format!("[files not returned] {}\n", skipped.join("; ")));
        }
        if let Some(note) = note {
            text.push_str(&format!("[{note}]\n"));
        }
        if text.is_empty() {
            text.push_str("(no output)\n");
        }
        let mut content = vec![ContentBlock::text(text)];
        content.extend(images);
        content.extend(links);
        if failed {
            CallToolResult::error(content)
        } else {
            CallToolResult::success(content)
        }
    }
}

pub(super) fn file_uri(session: &str, path: &str) -> String {
    format!("codecage://sessions/{session}/files/{path}")
}

pub(super) fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Text cut to about `max` bytes: its head and tail, with the cut said.
fn shorten(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let half = max / 2;
    let head_end = codecage::units::head(text, half).len();
    let mut tail_start = text.len() - half;
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    format!(
        "{}\n[... {} bytes cut ...]\n{}",
        &text[..head_end],
        tail_start - head_end,
        &text[tail_start..]
    )
}

/// A file's bytes as text, when it is text.
pub(super) fn as_text(media: &str, data: &[u8]) -> Option<String> {
    let textual =
        media.starts_with("text/") || matches!(media, "application/json" | "image/svg+xml");
    textual
        .then(|| std::str::from_utf8(data).ok().map(str::to_string))
        .flatten()
}

/// A bundle's PNG, checked (never decoded: the driver scaled it in the sandbox); None if
/// it has none.
fn image_of(bundle: &MimeBundle, edge: u32) -> Option<Result<Vec<u8>, String>> {
    let data = bundle.get("image/png")?;
    let bytes = match base64::engine::general_purpose::STANDARD.decode(data.trim()) {
        Ok(b) => b,
        Err(e) => return Some(Err(format!("not base64: {e}"))),
    };
    Some(check_png(&bytes, edge).map(|()| bytes))
}

/// The largest PNG shown, in bytes: far above what an image within the edge needs.
const MAX_PNG_BYTES: usize = 8 << 20;

/// Whether a PNG may be shown as it is: its header says a PNG of at most `edge` pixels on
/// its longer edge, and it is at most [`MAX_PNG_BYTES`]. The server reads the header and
/// nothing else: images are decoded and scaled only inside the sandbox (the driver).
pub fn check_png(png: &[u8], edge: u32) -> Result<(), String> {
    const SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
    if png.len() < 24 || &png[..8] != SIGNATURE || &png[12..16] != b"IHDR" {
        return Err("it has no PNG header".into());
    }
    let width = u32::from_be_bytes([png[16], png[17], png[18], png[19]]);
    let height = u32::from_be_bytes([png[20], png[21], png[22], png[23]]);
    if width.max(height) > edge {
        return Err(format!(
            "it is {width}x{height} pixels, more than the {edge} this server shows (mcp.image_max_edge)"
        ));
    }
    if png.len() > MAX_PNG_BYTES {
        return Err(format!(
            "it is {} bytes, more than the {MAX_PNG_BYTES} this server shows",
            png.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PNG header (and no more) of the given size.
    fn png(width: u32, height: u32) -> Vec<u8> {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        png.extend_from_slice(&width.to_be_bytes());
        png.extend_from_slice(&height.to_be_bytes());
        png.extend_from_slice(&[8, 2, 0, 0, 0]);
        png
    }

    #[test]
    fn images_are_checked_by_their_header_and_never_decoded() {
        assert!(check_png(&png(300, 200), 1024).is_ok());
        assert!(check_png(&png(1024, 10), 1024).is_ok());
        let e = check_png(&png(11_585, 11_585), 1024).unwrap_err();
        assert!(e.contains("11585x11585"), "{e}");
        assert!(check_png(b"GIF89a......................", 1024).is_err());
        let mut big = png(100, 100);
        big.resize(MAX_PNG_BYTES + 1, 0);
        assert!(check_png(&big, 1024).is_err());
    }

    #[test]
    fn long_text_keeps_its_head_and_tail() {
        let text = format!("{}{}", "a".repeat(1000), "é".repeat(1000));
        let short = shorten(&text, 100);
        assert!(
            short.starts_with("aaaa") && short.ends_with("éé"),
            "{short}"
        );
        assert!(short.contains("bytes cut"));
        assert_eq!(shorten("short", 100), "short");
    }
}
