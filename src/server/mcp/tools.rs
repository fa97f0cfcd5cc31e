//! The tools: `execute_python`, `execute_node`, `execute_shell`, `reset_repl`, `exec` and
//! `process` (their arguments in [`super::processes`]), the files
//! (`list_files`, `read_file`, `write_file`) and explicit sessions (`create_session`,
//! `close_session`): their arguments, and each tool's translation to the service.

use base64::Engine as _;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, ErrorData, RoleServer};
use schemars::JsonSchema;
use serde::Deserialize;

use super::processes::{ExecArgs, ProcessArgs, ProcessId, Subject};
use super::results::{api_error, as_text, b64, check_png, file_uri, tool_error};
use super::{CodecageMcp, Language};
use crate::audit::Via;
use crate::service;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExecuteArgs {
    /// The code to run.
    pub code: String,
    /// This call's time limit in seconds (default and maximum: the tool's description).
    pub timeout: Option<f64>,
    /// A session from `create_session`. Over stdio, optional: the connection has its own.
    pub session_id: Option<String>,
    /// Render the result for a chat channel instead (discord, telegram, slack, whatsapp,
    /// markdown, plain): its messages as text blocks, ready to post, and the full output,
    /// figures and files as attachments.
    pub format: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ShellArgs {
    /// The command line, run by the session's bash (`cd`, variables and functions persist).
    pub command: String,
    /// This call's time limit in seconds (default and maximum: the tool's description).
    pub timeout: Option<f64>,
    /// A session from `create_session`. Over stdio, optional: the connection has its own.
    pub session_id: Option<String>,
    /// Render the result for a chat channel instead (discord, telegram, slack, whatsapp,
    /// markdown, plain): its messages as text blocks, ready to post, and the full output,
    /// figures and files as attachments.
    pub format: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ResetArgs {
    /// Which interpreter: python, node or shell; every one of the session if absent.
    pub language: Option<Language>,
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListFilesArgs {
    /// A directory under /work (default: /work).
    pub path: Option<String>,
    /// Over stdio without a session_id: the profile (python's by default, node's or
    /// shell's) of the connection's session if this call makes it. Every language's tools
    /// share the one sandbox.
    pub language: Option<Language>,
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReadFileArgs {
    /// A file under /work (relative, or starting with /work/).
    pub path: String,
    /// Over stdio without a session_id: the profile (python's by default, node's or
    /// shell's) of the connection's session if this call makes it. Every language's tools
    /// share the one sandbox.
    pub language: Option<Language>,
    pub session_id: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    #[default]
    Utf8,
    Base64,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WriteFileArgs {
    /// Where under /work (relative, or starting with /work/); directories are made.
    pub path: String,
    /// The file's content: text, or base64 with encoding "base64".
    pub content: String,
    pub encoding: Option<Encoding>,
    /// Over stdio without a session_id: the profile (python's by default, node's or
    /// shell's) of the connection's session if this call makes it. Every language's tools
    /// share the one sandbox.
    pub language: Option<Language>,
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateSessionArgs {
    /// python, node or shell.
    pub language: Language,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CloseSessionArgs {
    pub session_id: String,
}

#[tool_router(vis = "pub(super)")]
impl CodecageMcp {
    #[tool(
        name = "execute_python",
        description = "Run Python code in a persistent interpreter."
    )]
    async fn execute_python(
        &self,
        Parameters(args): Parameters<ExecuteArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(self
            .execute(
                Language::Python,
                args.code,
                args.timeout,
                args.session_id,
                args.format,
                ctx,
            )
            .await)
    }

    #[tool(
        name = "execute_node",
        description = "Run JavaScript or TypeScript in a persistent Node.js REPL."
    )]
    async fn execute_node(
        &self,
        Parameters(args): Parameters<ExecuteArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(self
            .execute(
                Language::Node,
                args.code,
                args.timeout,
                args.session_id,
                args.format,
                ctx,
            )
            .await)
    }

    #[tool(
        name = "execute_shell",
        description = "Run a command in a persistent bash."
    )]
    async fn execute_shell(
        &self,
        Parameters(args): Parameters<ShellArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(self
            .execute(
                Language::Shell,
                args.command,
                args.timeout,
                args.session_id,
                args.format,
                ctx,
            )
            .await)
    }

    #[tool(
        name = "exec",
        description = "Run a command, in the background if it takes long."
    )]
    async fn exec(
        &self,
        Parameters(args): Parameters<ExecArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller_of(&ctx);
        let session = args.session_id.clone();
        let mut result = self.run_exec(args, &caller).await;
        self.tell_exits(session.as_deref(), &caller, Subject::Started, &mut result)
            .await;
        Ok(result)
    }

    #[tool(
        name = "process",
        description = "List, poll, read, feed, type into and kill the commands exec started; read a terminal's screen."
    )]
    async fn process(
        &self,
        Parameters(args): Parameters<ProcessArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller_of(&ctx);
        let session = args.session_id.clone();
        let subject = match args.process.as_ref().and_then(ProcessId::number) {
            Some(id) => Subject::Process(id),
            None => Subject::None,
        };
        let mut result = self.run_process(args, &caller).await;
        self.tell_exits(session.as_deref(), &caller, subject, &mut result)
            .await;
        Ok(result)
    }

    #[tool(
        name = "reset_repl",
        description = "Restart an interpreter of the session: `language` python, node or shell restarts that one \
                       (the others keep their variables); without it, every interpreter and background process. \
                       Files in /work are kept."
    )]
    async fn reset_repl(
        &self,
        Parameters(args): Parameters<ResetArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let language = args.language.unwrap_or(Language::Python);
        let caller = self.caller_of(&ctx);
        let lang = args.language.map(|l| self.lang_of(l));
        let entry = match self.session(language, args.session_id.as_deref(), &caller, true).await {
            Ok(Some(entry)) => entry,
            Ok(None) => {
                return Ok(tool_error(
                    "reset_repl needs a session_id from create_session: over HTTP, a call without one runs in a fresh sandbox and has nothing to reset",
                ))
            }
            Err(e) => return Ok(e),
        };
        Ok(match service::reset_session(&self.state, &caller, Via::Mcp, entry, lang).await {
            Ok(()) => CallToolResult::success(vec![ContentBlock::text(match lang {
                Some(_) => "The interpreter was restarted: its variables, imports and functions are gone (the \
                            other languages' are kept); files in /work are kept.",
                None => "Every interpreter was restarted and every background process killed: variables, \
                         imports and functions are gone; files in /work are kept.",
            })]),
            Err(e) => api_error(e),
        })
    }

    #[tool(name = "list_files", description = "List a directory under /work.")]
    async fn list_files(
        &self,
        Parameters(args): Parameters<ListFilesArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller_of(&ctx);
        let language = args.language.unwrap_or(Language::Python);
        let entry = match self
            .files_session(language, args.session_id.as_deref(), &caller)
            .await
        {
            Ok(entry) => entry,
            Err(e) => return Ok(e),
        };
        let path = service::relative(args.path.as_deref().unwrap_or("")).to_string();
        if !path.is_empty() {
            if let Err(e) = codecage::files::check_input_path(&path) {
                return Ok(tool_error(format!("path: {e}")));
            }
        }
        let shown = if path.is_empty() {
            "/work".to_string()
        } else {
            format!("/work/{path}")
        };
        let listed = service::with_session(&self.state, &caller, &entry.id, move |s, _| {
            s.list_files(&path)
        })
        .await;
        Ok(match listed {
            Ok(entries) if entries.is_empty() => {
                CallToolResult::success(vec![ContentBlock::text(format!("{shown} is empty"))])
            }
            Ok(entries) => {
                let mut text = format!("{shown}:\n");
                for e in entries {
                    let name = if e.kind == "dir" {
                        format!("{}/", e.name)
                    } else {
                        e.name
                    };
                    text.push_str(&format!("{:<8} {:>10}  {name}\n", e.kind, e.size));
                }
                CallToolResult::success(vec![ContentBlock::text(text)])
            }
            Err(e) => api_error(e),
        })
    }

    #[tool(name = "read_file", description = "Read a file under /work.")]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller_of(&ctx);
        let language = args.language.unwrap_or(Language::Python);
        let entry = match self
            .files_session(language, args.session_id.as_deref(), &caller)
            .await
        {
            Ok(entry) => entry,
            Err(e) => return Ok(e),
        };
        let path = service::relative(&args.path).to_string();
        if let Err(e) = codecage::files::check_input_path(&path) {
            return Ok(tool_error(format!("path: {e}")));
        }
        let wanted = path.clone();
        let data = service::with_session(&self.state, &caller, &entry.id, move |s, e| {
            s.read_file(&wanted, e.caps.read_max)
        })
        .await;
        let data = match data {
            Ok(d) => d,
            Err(e) => return Ok(api_error(e)),
        };
        let media = codecage::files::media_type(&path);
        let uri = file_uri(&entry.id, &path);
        let edge = self.state.config.mcp.image_max_edge;
        let block = if media == "image/png" {
            // Never decoded here: shown as it is if its header says it fits, else named.
            match check_png(&data, edge) {
                Ok(()) => ContentBlock::image(b64(&data), "image/png"),
                Err(e) => {
                    return Ok(CallToolResult::success(vec![
                        ContentBlock::text(format!(
                            "/work/{path} is not shown as an image: {e}. Scale it down in the sandbox \
                             (e.g. PIL's Image.thumbnail) and read that, or fetch the file itself: {uri}"
                        )),
                    ]))
                }
            }
        } else if let Some(text) = as_text(media, &data) {
            ContentBlock::text(text)
        } else {
            ContentBlock::resource(ResourceContents::blob(b64(&data), uri).with_mime_type(media))
        };
        Ok(CallToolResult::success(vec![block]))
    }

    #[tool(name = "write_file", description = "Write a file under /work.")]
    async fn write_file(
        &self,
        Parameters(args): Parameters<WriteFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller_of(&ctx);
        let language = args.language.unwrap_or(Language::Python);
        let entry = match self
            .files_session(language, args.session_id.as_deref(), &caller)
            .await
        {
            Ok(entry) => entry,
            Err(e) => return Ok(e),
        };
        let path = service::relative(&args.path).to_string();
        let data = match args.encoding.unwrap_or_default() {
            Encoding::Utf8 => args.content.into_bytes(),
            Encoding::Base64 => {
                match base64::engine::general_purpose::STANDARD.decode(&args.content) {
                    Ok(d) => d,
                    Err(e) => return Ok(tool_error(format!("content is not base64: {e}"))),
                }
            }
        };
        let size = data.len();
        let file = codecage::files::InputFile::new(path.clone(), data);
        let written = service::write_session_file(&self.state, &caller, &entry.id, file).await;
        Ok(match written {
            Ok(()) => CallToolResult::success(vec![ContentBlock::text(format!(
                "wrote /work/{path} ({size} bytes)"
            ))]),
            Err(e) => api_error(e),
        })
    }

    #[tool(name = "create_session", description = "Start a persistent session.")]
    async fn create_session(
        &self,
        Parameters(args): Parameters<CreateSessionArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller_of(&ctx);
        Ok(match self.open(args.language, &caller).await {
            Ok(entry) => CallToolResult::success(vec![ContentBlock::text(format!(
                "session_id: {}\nlanguage: {}\nIt ends after {} s without a call, {} s after it started at the latest, \
                 or at close_session; then its id is refused and its state gone.",
                entry.id,
                entry.lang.name(),
                entry.idle_timeout.as_secs(),
                entry.max_duration.as_secs()
            ))]),
            Err(e) => api_error(e),
        })
    }

    #[tool(name = "close_session", description = "End a session.")]
    async fn close_session(
        &self,
        Parameters(args): Parameters<CloseSessionArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = self.caller_of(&ctx);
        if let Some(connection) = &self.connection {
            let mut session = connection.lock().await;
            if session.as_deref() == Some(args.session_id.as_str()) {
                *session = None;
            }
        }
        Ok(
            match service::close_session(&self.state, &caller, Via::Mcp, &args.session_id).await {
                Ok(()) => CallToolResult::success(vec![ContentBlock::text(format!(
                    "session {} is closed",
                    args.session_id
                ))]),
                Err(e) => api_error(e),
            },
        )
    }
}
