//! The MCP server: the tools agents know (`execute_python`, `execute_node`,
//! `execute_shell`, `reset_repl`), commands in the background (`exec`, `process`), files
//! (`list_files`, `read_file`, `write_file`) and explicit sessions (`create_session`,
//! `close_session`), on rmcp, over the same sessions and policy as the HTTP API.
//!
//! Two ways in. `codecage mcp` serves one client over stdio: the connection holds one
//! session, made on first use and closed when the connection ends, whose python, node and
//! bash contexts the execute tools use (they share its /work). `/mcp` on
//! `codecage serve` is streamable HTTP behind the listener's caller check, with no state
//! per connection: a tool given a `session_id` (from `create_session`) uses that session;
//! an `execute_*` without one runs in a fresh sandbox of its own.
//!
//! Results: one text block (output, the error, the exception), then an image block per
//! PNG figure or image display (scaled in the sandbox to `mcp.image_max_edge`), then
//! resource links for output files and for output cut from the text. A sandbox's failure is a tool
//! result with `isError`, never a protocol error. No tool declares an output schema or
//! sends structured content: several clients drop every content block, images included,
//! when structured content is present.

//!
//! By concern: [`tools`] (the tools and their arguments), [`calls`] (an execute tool's
//! call: session or one-shot, progress, cancellation), [`processes`] (`exec` and
//! `process`: background processes, polled from cursors), [`connection`] (the caller and
//! the session a call uses), [`results`] (outcomes as content blocks), [`describe`] (the
//! tools' descriptions), [`resources`] (the handler: info and resources), [`store`] (kept
//! outputs), [`transport`] (stdio and `/mcp`) and [`size`] (requests over
//! `mcp.max_request`).

mod calls;
mod connection;
mod describe;
mod processes;
mod resources;
mod results;
pub(super) mod size;
mod store;
mod tools;
mod transport;

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{Caller, Shared};

pub use store::McpStore;
pub use transport::{http_service, serve_stdio};

/// The languages, as the tools name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Python,
    Node,
    Shell,
}

/// One MCP server: a stdio connection, or one HTTP request's handler.
#[derive(Clone)]
pub struct CodecageMcp {
    state: Shared,
    /// Who the client is when the request does not say (stdio: the process's user).
    caller: Caller,
    /// stdio: the connection's one session (its id), whose contexts the execute tools
    /// use. None over HTTP.
    connection: Option<Arc<tokio::sync::Mutex<Option<String>>>>,
    tool_router: ToolRouter<Self>,
}

impl CodecageMcp {
    fn new(state: Shared, caller: Caller, stdio: bool) -> CodecageMcp {
        let mut server = CodecageMcp {
            connection: stdio.then(|| Arc::new(tokio::sync::Mutex::new(None))),
            tool_router: Self::tool_router(),
            state,
            caller,
        };
        server.describe();
        // A shell profile that says exec.security = "deny": no shell tool to list or call,
        // and no commands (exec, and process, which only reaches exec's).
        let shell = server.profile_name(Language::Shell);
        if crate::service::load_profile(&server.state, &shell)
            .is_ok_and(|p| p.exec.security == codecage::exec_policy::ExecSecurity::Deny)
        {
            for tool in ["execute_shell", "exec", "process"] {
                server.tool_router.remove_route(tool);
            }
        }
        server
    }

    /// A stdio connection's server (one client, its own sessions).
    pub fn stdio(state: Shared, caller: Caller) -> CodecageMcp {
        CodecageMcp::new(state, caller, true)
    }
}
