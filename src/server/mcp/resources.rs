//! The server's handler: its info, and the resources (a session's files, kept outputs).

use rmcp::model::{
    Implementation, ListResourceTemplatesResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, ResourceContents, ResourceTemplate,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool_handler, ErrorData, RoleServer, ServerHandler};

use super::results::{as_text, b64};
use super::store::KEPT_OUTPUTS;
use super::CodecageMcp;
use crate::service;

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CodecageMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("codecage", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "codecage runs code in a sandbox: Python (execute_python), Node.js/TypeScript (execute_node) and \
             bash (execute_shell), each a persistent interpreter with its own /work directory. Long \
             commands (builds, servers): exec, which goes to the background after yieldMs, and process to \
             poll, read, feed and kill them. Files: \
             write_file, list_files, read_file; files the code writes under /work/out come back with the \
             result. The sandbox has no access to the host and limited resources; each tool's description \
             gives them.",
        )
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new(
                "codecage://sessions/{session_id}/files/{path}",
                "a file of a session's /work",
            ),
            ResourceTemplate::new(
                "codecage://outputs/{key}/{stream}",
                "the whole stdout or stderr of a call whose result was cut",
            ),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let caller = self.caller_of(&context);
        let uri = request.uri.clone();
        let not_found = || {
            ErrorData::resource_not_found(
                format!("{uri} is not a resource of this server (codecage://sessions/ID/files/PATH, codecage://outputs/KEY/stdout|stderr)"),
                None,
            )
        };
        if let Some(rest) = uri.strip_prefix("codecage://outputs/") {
            let (key, stream) = rest.split_once('/').ok_or_else(not_found)?;
            let text = self.state.mcp.get(&caller, key, stream).ok_or_else(|| {
                ErrorData::resource_not_found(
                    format!(
                        "{uri}: no such output of yours is kept (the last {KEPT_OUTPUTS} calls' are)"
                    ),
                    None,
                )
            })?;
            return Ok(ReadResourceResult::new(vec![
                ResourceContents::text(text, uri.clone()).with_mime_type("text/plain")
            ])
            .into());
        }
        let rest = uri
            .strip_prefix("codecage://sessions/")
            .ok_or_else(not_found)?;
        let (id, path) = rest.split_once("/files/").ok_or_else(not_found)?;
        let path = path.to_string();
        codecage::files::check_input_path(&path)
            .map_err(|e| ErrorData::invalid_params(format!("{uri}: {e}"), None))?;
        let wanted = path.clone();
        let data = service::with_session(&self.state, &caller, id, move |s, e| {
            s.read_file(&wanted, e.caps.read_max)
        })
        .await
        .map_err(|e| ErrorData::resource_not_found(format!("{uri}: {}", e.message()), None))?;
        let media = codecage::files::media_type(&path);
        let contents = match as_text(media, &data) {
            Some(text) => ResourceContents::text(text, uri.clone()),
            None => ResourceContents::blob(b64(&data), uri.clone()),
        };
        Ok(ReadResourceResult::new(vec![contents.with_mime_type(media)]).into())
    }
}
