//! The MCP server: the tools agents know (`execute_python`, `execute_node`,
//! `execute_shell`, `reset_repl`), files (`list_files`, `read_file`, `write_file`) and
//! explicit sessions (`create_session`, `close_session`), on rmcp, over the same sessions
//! and policy as the HTTP API.
//!
//! Two ways in. `codecage mcp` serves one client over stdio: the connection holds one
//! session per language, made on first use and closed when the connection ends. `/mcp` on
//! `codecage serve` is streamable HTTP behind the listener's caller check, with no state
//! per connection: a tool given a `session_id` (from `create_session`) uses that session;
//! an `execute_*` without one runs in a fresh sandbox of its own.
//!
//! Results: one text block (output, the error, the exception), then an image block per
//! PNG figure or image display (downscaled here to `mcp.image_max_edge`), then resource
//! links for output files and for output cut from the text. A sandbox's failure is a tool
//! result with `isError`, never a protocol error. No tool declares an output schema or
//! sends structured content: several clients drop every content block, images included,
//! when structured content is present.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ListResourceTemplatesResult,
    PaginatedRequestParams, ProgressNotificationParam, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, Resource, ResourceContents, ResourceTemplate,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;

use codecage::outcome::ErrorKind;
use codecage::runner::Lang;
use codecage::session::{Call, CallOutcome, Event, MimeBundle};

use super::registry::Entry;
use super::{Caller, Shared};
use crate::audit::Via;
use crate::service::{self, Error as ApiError, RunRequest, SessionRequest};

/// How many calls' full output is kept for `codecage://outputs/...` (the oldest go first).
const KEPT_OUTPUTS: usize = 16;
/// A one-shot run's output files are embedded up to this size each (there is no session
/// to read them from later).
const EMBED_MAX: usize = 1 << 20;
/// How often a running call reports progress, at most.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);
/// How much of the output so far a progress message carries.
const PROGRESS_TAIL: usize = 400;

/// The languages, as the tools name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Python,
    Node,
    Shell,
}

/// Full outputs of recent calls, for resource links when the text block was cut.
#[derive(Default)]
pub struct McpStore {
    outputs: Mutex<VecDeque<(String, String, String)>>,
}

impl McpStore {
    fn keep(&self, stdout: String, stderr: String) -> String {
        let key = new_key();
        let mut outputs = self.outputs.lock().unwrap_or_else(|e| e.into_inner());
        if outputs.len() >= KEPT_OUTPUTS {
            outputs.pop_front();
        }
        outputs.push_back((key.clone(), stdout, stderr));
        key
    }

    fn get(&self, key: &str, stream: &str) -> Option<String> {
        let outputs = self.outputs.lock().unwrap_or_else(|e| e.into_inner());
        let (_, out, err) = outputs.iter().find(|(k, _, _)| k == key)?;
        match stream {
            "stdout" => Some(out.clone()),
            "stderr" => Some(err.clone()),
            _ => None,
        }
    }
}

fn new_key() -> String {
    let mut bytes = [0u8; 12];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut bytes);
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

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
    /// Whose interpreter: python (default), node or shell. Ignored with a session_id.
    pub language: Option<Language>,
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListFilesArgs {
    /// A directory under /work (default: /work).
    pub path: Option<String>,
    /// Whose sandbox: python (default), node or shell. Ignored with a session_id.
    pub language: Option<Language>,
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReadFileArgs {
    /// A file under /work (relative, or starting with /work/).
    pub path: String,
    /// Whose sandbox: python (default), node or shell. Ignored with a session_id.
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
    /// Whose sandbox: python (default), node or shell. Ignored with a session_id.
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

/// One MCP server: a stdio connection, or one HTTP request's handler.
#[derive(Clone)]
pub struct CodecageMcp {
    state: Shared,
    /// Who the client is when the request does not say (stdio: the process's user).
    caller: Caller,
    /// stdio: the connection's session per language. None over HTTP.
    connection: Option<Arc<tokio::sync::Mutex<HashMap<Language, String>>>>,
    tool_router: ToolRouter<Self>,
}

/// A tool's failure, for the client to show the model: `isError` with the message.
/// A call's result rendered for a chat channel (the `format` argument): each message a text
/// block, ready to post; images as image blocks and the other attachments (the full
/// output, files) as embedded resources. A failed call is still `isError`.
fn formatted(call: &CallOutcome, options: &codecage::format::Options) -> CallToolResult {
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

fn tool_error(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

fn api_error(e: ApiError) -> CallToolResult {
    let message = match e.kind() {
        "not_found" | "session_expired" => e
            .message()
            .replace("create a new one", "call create_session for a new one"),
        _ => e.message().to_string(),
    };
    tool_error(format!("[{}] {message}", e.kind()))
}

#[tool_router]
impl CodecageMcp {
    fn new(state: Shared, caller: Caller, stdio: bool) -> CodecageMcp {
        let mut server = CodecageMcp {
            connection: stdio.then(|| Arc::new(tokio::sync::Mutex::new(HashMap::new()))),
            tool_router: Self::tool_router(),
            state,
            caller,
        };
        server.describe();
        server
    }

    /// A stdio connection's server (one client, its own sessions).
    pub fn stdio(state: Shared, caller: Caller) -> CodecageMcp {
        CodecageMcp::new(state, caller, true)
    }

    /// Closes the connection's sessions (stdio, when the client goes).
    pub async fn close_connection(&self) {
        let Some(connection) = &self.connection else {
            return;
        };
        let ids: Vec<String> = connection.lock().await.drain().map(|(_, id)| id).collect();
        for id in ids {
            let _ = service::close_session(&self.state, &self.caller, Via::Mcp, &id).await;
        }
    }

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

    #[tool(name = "reset_repl", description = "Restart an interpreter.")]
    async fn reset_repl(
        &self,
        Parameters(args): Parameters<ResetArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let language = args.language.unwrap_or(Language::Python);
        let caller = self.caller_of(&ctx);
        let entry = match self.session(language, args.session_id.as_deref(), &caller, true).await {
            Ok(Some(entry)) => entry,
            Ok(None) => {
                return Ok(tool_error(
                    "reset_repl needs a session_id from create_session: over HTTP, a call without one runs in a fresh sandbox and has nothing to reset",
                ))
            }
            Err(e) => return Ok(e),
        };
        Ok(match service::reset_session(&self.state, &caller, Via::Mcp, entry).await {
            Ok(()) => CallToolResult::success(vec![ContentBlock::text(
                "The interpreter was restarted: variables, imports and functions are gone; files in /work are kept.",
            )]),
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
            connection
                .lock()
                .await
                .retain(|_, id| *id != args.session_id);
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

impl CodecageMcp {
    /// The tools' descriptions, with this server's profiles' figures in them.
    fn describe(&mut self) {
        let mcp = &self.state.config.mcp;
        let limits = |language: Language| -> String {
            let name = self.profile_name(language);
            match service::load_profile(&self.state, &name) {
                Ok(p) => {
                    use codecage::knobs::Knob;
                    format!(
                        "Limits (profile {name}): {} per call by default, up to {} with `timeout`; {} of memory; \
                         {} of output (stdout and stderr together).",
                        Knob::Timeout.show(p.value(Knob::Timeout)),
                        Knob::Timeout.show(p.max(Knob::Timeout)),
                        Knob::Memory.show(p.value(Knob::Memory)),
                        Knob::OutputLimit.show(p.value(Knob::OutputLimit)),
                    )
                }
                Err(_) => format!("Limits: those of the profile {name}."),
            }
        };
        let session_text = if self.connection.is_some() {
            "The interpreter persists across calls on this connection: variables, imports and functions stay \
             until reset_repl; files stay in /work (each language has its own sandbox and /work). \
             session_id is optional: give one from create_session to use that session instead."
                .to_string()
        } else {
            "Without session_id the code runs in a fresh sandbox that is gone after the call: nothing persists. \
             For a persistent interpreter (variables, imports, files in /work), call create_session first and \
             pass its session_id."
                .to_string()
        };
        let results = |shell: bool| {
            format!(
                "The result is the output (stdout, then stderr){}, and errors{}; {}files written under /work/out \
                 come back as resource links (read them with read_file). A call past its time limit is \
                 interrupted: the output so far is returned, marked as an error, and the result says whether \
                 the {} state survived.",
                if shell { " and the exit status" } else { ", the value of a trailing expression" },
                if shell { "" } else { " with their traceback" },
                if shell {
                    String::new()
                } else {
                    format!(
                        "figures (matplotlib, displayed images) come back as images (PNG, at most {} px on a side, \
                         {} per call); ",
                        mcp.image_max_edge, mcp.max_images
                    )
                },
                if shell { "shell's" } else { "interpreter's" }
            )
        };
        let descriptions = [
            (
                "execute_python",
                format!(
                    "Run Python 3 code (numpy, pandas, matplotlib in the default image). {session_text} The last \
                     expression's value is shown, as in a notebook; top-level await works. {} {}",
                    results(false),
                    limits(Language::Python)
                ),
            ),
            (
                "execute_node",
                format!(
                    "Run JavaScript or TypeScript in Node.js (a REPL: `const`/`let`, functions and require()d \
                     modules persist; TypeScript types are stripped; top-level await works). {session_text} \
                     {} {}",
                    results(false),
                    limits(Language::Node)
                ),
            ),
            (
                "execute_shell",
                format!(
                    "Run a bash command line (pipelines, coreutils, grep, sed, awk). {} `cd`, variables and \
                     functions persist; a non-zero exit status marks the result as an error. {} {}",
                    session_text.replace("interpreter persists", "shell persists").replace(
                        "variables, imports and functions stay until reset_repl",
                        "its state stays until reset_repl"
                    ),
                    results(true),
                    limits(Language::Shell)
                ),
            ),
            (
                "reset_repl",
                format!(
                    "Restart an interpreter: its variables, imports and functions are gone; files in /work are \
                     kept. Use it when the state is broken or memory is full. {}",
                    if self.connection.is_some() {
                        "language: python (default), node or shell; or a session_id."
                    } else {
                        "Needs the session_id of a session from create_session."
                    }
                ),
            ),
            (
                "list_files",
                format!(
                    "List a directory of the sandbox's /work (type, size, name). {}",
                    self.files_text()
                ),
            ),
            (
                "read_file",
                format!(
                    "Read a file of /work: a PNG comes back as an image, text as text, anything else as an \
                     embedded resource (at most {} per file). {}",
                    codecage::knobs::Knob::OutputFileSize
                        .show(codecage::knobs::Knob::OutputFileSize.def().default),
                    self.files_text()
                ),
            ),
            (
                "write_file",
                format!(
                    "Write a file into /work (directories are made; an existing file is replaced), for the code \
                     to read: text, or bytes as base64 with encoding \"base64\". {}",
                    self.files_text()
                ),
            ),
            (
                "create_session",
                "Start a persistent session for python, node or shell and get its session_id, for the other \
                 tools' session_id. A session keeps its interpreter's state and its /work between calls. It \
                 ends after its idle time without a call (10 minutes by default), after its maximum lifetime \
                 (1 hour by default), or at close_session; the answer gives its figures. After that its id is \
                 refused with an error that says so."
                    .to_string(),
            ),
            (
                "close_session",
                "End a session from create_session now: its processes and files are gone.".to_string(),
            ),
        ];
        for (name, text) in descriptions {
            if let Some(route) = self.tool_router.map.get_mut(name) {
                route.attr.description = Some(text.into());
            }
        }
    }

    fn files_text(&self) -> &'static str {
        if self.connection.is_some() {
            "language chooses whose sandbox (python by default; each language has its own /work), or give a \
             session_id."
        } else {
            "Needs the session_id of a session from create_session."
        }
    }

    fn profile_name(&self, language: Language) -> String {
        let mcp = &self.state.config.mcp;
        match language {
            Language::Python => mcp.profile_python.clone(),
            Language::Node => mcp.profile_node.clone(),
            Language::Shell => mcp.profile_shell.clone(),
        }
    }

    /// The request's caller (HTTP: what the listener's check found), else the connection's.
    fn caller_of(&self, ctx: &RequestContext<RoleServer>) -> Caller {
        ctx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>().cloned())
            .unwrap_or_else(|| self.caller.clone())
    }

    /// Starts a session for `language` under its configured profile.
    async fn open(&self, language: Language, caller: &Caller) -> Result<Arc<Entry>, ApiError> {
        let profile = self.profile_name(language);
        let lang = match language {
            Language::Python => Lang::Python,
            Language::Shell => Lang::Bash,
            Language::Node => service::load_profile(&self.state, &profile)?
                .language
                .filter(|l| matches!(l, Lang::Node | Lang::Typescript))
                .unwrap_or(Lang::Typescript),
        };
        let mut request = SessionRequest {
            profile: Some(profile),
            ..SessionRequest::new(lang)
        };
        // The driver scales what it shows to the server's edge (its default is the
        // server's default; only another edge needs saying, and costs the warm pool).
        let edge = self.state.config.mcp.image_max_edge;
        if edge != super::config::McpConfig::default().image_max_edge {
            request
                .env
                .insert("CODECAGE_IMAGE_MAX_EDGE".into(), edge.to_string());
        }
        service::open_session(&self.state, caller, Via::Mcp, request).await
    }

    /// The session a call uses: `session_id`'s, else (stdio) the connection's for the
    /// language, made on first use (and again, with a note, if it expired); None over HTTP
    /// without an id. Errors come as the tool result to return.
    async fn session(
        &self,
        language: Language,
        session_id: Option<&str>,
        caller: &Caller,
        create: bool,
    ) -> Result<Option<Arc<Entry>>, CallToolResult> {
        if let Some(id) = session_id {
            return service::lookup(&self.state, caller, id)
                .map(Some)
                .map_err(api_error);
        }
        let Some(connection) = &self.connection else {
            return Ok(None);
        };
        let mut sessions = connection.lock().await;
        if let Some(id) = sessions.get(&language) {
            if let Ok(entry) = service::lookup(&self.state, caller, id) {
                return Ok(Some(entry));
            }
            sessions.remove(&language);
        }
        if !create {
            return Ok(None);
        }
        let entry = self.open(language, caller).await.map_err(api_error)?;
        sessions.insert(language, entry.id.clone());
        Ok(Some(entry))
    }

    async fn files_session(
        &self,
        language: Language,
        session_id: Option<&str>,
        caller: &Caller,
    ) -> Result<Arc<Entry>, CallToolResult> {
        match self.session(language, session_id, caller, true).await? {
            Some(entry) => Ok(entry),
            None => Err(tool_error(
                "this tool needs a session_id from create_session: over HTTP there is no connection session",
            )),
        }
    }

    async fn execute(
        &self,
        language: Language,
        code: String,
        timeout: Option<f64>,
        session_id: Option<String>,
        format: Option<String>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let caller = self.caller_of(&ctx);
        let format = match format
            .as_deref()
            .map(str::parse::<codecage::format::Channel>)
        {
            None => None,
            Some(Ok(channel)) => Some(codecage::format::Options {
                language: Some(
                    match language {
                        Language::Python => "python",
                        Language::Node => "typescript",
                        Language::Shell => "bash",
                    }
                    .to_string(),
                ),
                ..codecage::format::Options::new(channel)
            }),
            Some(Err(e)) => return tool_error(format!("format: {e}")),
        };
        let timeout = match timeout {
            None => None,
            Some(t) if t.is_finite() && t > 0.0 && t < 1e7 => Some(Duration::from_secs_f64(t)),
            Some(t) => {
                return tool_error(format!(
                    "timeout {t}: give a number of seconds above 0 (e.g. 30)"
                ))
            }
        };
        // A session this connection had, gone since (idle or too old): say so.
        let had = match (&self.connection, &session_id) {
            (Some(connection), None) => connection.lock().await.get(&language).cloned(),
            _ => None,
        };
        let entry = match self
            .session(language, session_id.as_deref(), &caller, true)
            .await
        {
            Ok(Some(entry)) => entry,
            Ok(None) => {
                return self
                    .one_shot(language, code, timeout, format, &caller, ctx)
                    .await
            }
            Err(e) => return e,
        };
        let note = had.filter(|id| *id != entry.id).map(|_| {
            "Note: this connection's previous session had expired (idle too long or too old); this call \
             ran in a new one, without the earlier variables and files."
                .to_string()
        });
        let progress = ctx.meta.get_progress_token();
        let (chunks, mut received) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let want_progress = progress.is_some();
        let forward = move |event: Event| {
            if let (true, Event::Output(_, bytes)) = (want_progress, event) {
                let _ = chunks.send(bytes.to_vec());
            }
        };
        let reporter = progress.map(|token| {
            let peer = ctx.peer.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                let mut seen: Vec<u8> = Vec::new();
                let mut last = Instant::now() - PROGRESS_EVERY;
                let mut step = 0.0;
                while let Some(chunk) = received.recv().await {
                    seen.extend_from_slice(&chunk);
                    if seen.len() > 4 * PROGRESS_TAIL {
                        seen.drain(..seen.len() - PROGRESS_TAIL);
                    }
                    if last.elapsed() < PROGRESS_EVERY {
                        continue;
                    }
                    last = Instant::now();
                    step += 1.0;
                    let tail =
                        String::from_utf8_lossy(&seen[seen.len().saturating_sub(PROGRESS_TAIL)..]);
                    let message = format!(
                        "running for {:.1} s; output so far ends with:\n{tail}",
                        start.elapsed().as_secs_f64()
                    );
                    let _ = peer
                        .notify_progress(
                            ProgressNotificationParam::new(token.clone(), step)
                                .with_message(message),
                        )
                        .await;
                }
            })
        });
        // The client's cancellation interrupts the call as its timeout would.
        let interrupter = entry.interrupter.clone();
        let cancelled = ctx.ct.clone();
        let watcher = tokio::spawn(async move {
            cancelled.cancelled().await;
            interrupter.interrupt();
        });
        let call = Call {
            code,
            stdin: None,
            timeout,
            files: Vec::new(),
        };
        wait_idle(&entry).await;
        let result = service::call_session(
            self.state.clone(),
            caller,
            Via::Mcp,
            entry.clone(),
            call,
            forward,
        )
        .await;
        watcher.abort();
        if let Some(reporter) = reporter {
            let _ = reporter.await;
        }
        match (result, format) {
            (Ok(outcome), Some(options)) => formatted(&outcome, &options),
            (Ok(outcome), None) => self.render(language, Some(&entry), &outcome, note),
            (Err(e), _) => api_error(e),
        }
    }

    /// A call without a session (HTTP): a fresh sandbox for this code alone.
    async fn one_shot(
        &self,
        language: Language,
        code: String,
        timeout: Option<Duration>,
        format: Option<codecage::format::Options>,
        caller: &Caller,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let profile = self.profile_name(language);
        let lang = match language {
            Language::Python => Lang::Python,
            Language::Node => Lang::Typescript,
            Language::Shell => Lang::Bash,
        };
        let request = RunRequest {
            language: Some(lang),
            code: Some(code),
            profile: Some(profile),
            file_data: Some(true),
            timeout: timeout.map(|t| codecage::knobs::Raw::Text(format!("{}ms", t.as_millis()))),
            ..RunRequest::default()
        };
        // The client's cancellation stops the run (the service watches the shutdown).
        let result = service::run_request(
            &self.state,
            caller,
            Via::Mcp,
            request,
            ctx.ct.clone(),
            |_, _| {},
        )
        .await;
        match result {
            Ok(outcome) => {
                let call = CallOutcome {
                    outcome,
                    execution_count: None,
                    result: None,
                    displays: Vec::new(),
                    exception: None,
                    state: Default::default(),
                    cwd: None,
                    killed: Vec::new(),
                };
                match format {
                    Some(options) => formatted(&call, &options),
                    None => self.render(language, None, &call, None),
                }
            }
            Err(e) => api_error(e),
        }
    }

    /// The result blocks of a call: text, images, resource links.
    fn render(
        &self,
        language: Language,
        entry: Option<&Arc<Entry>>,
        call: &CallOutcome,
        note: Option<String>,
    ) -> CallToolResult {
        let config = &self.state.config.mcp;
        let outcome = &call.outcome;
        let max_text = config.max_text as usize;
        let mut text = String::new();
        let mut links = Vec::new();
        let stdout = String::from_utf8_lossy(&outcome.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&outcome.stderr).into_owned();
        let cut = stdout.len() + stderr.len() > max_text;
        let key = cut.then(|| self.state.mcp.keep(stdout.clone(), stderr.clone()));
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
             bash (execute_shell), each a persistent interpreter with its own /work directory. Files: \
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
            let text = self.state.mcp.get(key, stream).ok_or_else(|| {
                ErrorData::resource_not_found(
                    format!(
                        "{uri}: the output is no longer kept (the last {KEPT_OUTPUTS} calls' are)"
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

/// A client's calls come one after another, but a call it cancelled may still be winding
/// down (the interrupt, at most the session's grace): wait for that rather than refuse.
async fn wait_idle(entry: &Entry) {
    let end = Instant::now() + codecage::session::GRACE + Duration::from_secs(1);
    while entry.is_busy() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn file_uri(session: &str, path: &str) -> String {
    format!("codecage://sessions/{session}/files/{path}")
}

fn b64(data: &[u8]) -> String {
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
fn as_text(media: &str, data: &[u8]) -> Option<String> {
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

/// `codecage mcp`: one client over stdin/stdout until it goes (or SIGTERM); its sessions
/// are closed then.
pub async fn serve_stdio(config: super::ServerConfig, caller: Caller) -> Result<(), String> {
    use rmcp::ServiceExt as _;
    let state = super::AppState::new(config)?;
    let reaper = tokio::spawn(super::registry::reap_forever(state.clone()));
    let max_request = usize::try_from(state.config.mcp.max_request).unwrap_or(usize::MAX);
    let server = CodecageMcp::stdio(state.clone(), caller);
    let transport = super::mcp_size::stdio(max_request);
    let result = match server.clone().serve(transport).await {
        Ok(running) => {
            tokio::select! {
                r = running.waiting() => r.map(|_| ()).map_err(|e| format!("the MCP connection failed: {e}")),
                _ = super::wait_for_termination() => Ok(()),
            }
        }
        Err(e) => Err(format!("the MCP client did not initialize: {e}")),
    };
    state.shutdown.cancel();
    state.canceller.cancel();
    state.sessions.interrupt_all();
    server.close_connection().await;
    state.sessions.close_all().await;
    reaper.abort();
    if let Some(audit) = state.audit.clone() {
        let _ = tokio::task::spawn_blocking(move || audit.close()).await;
    }
    result
}

/// `/mcp` on the server's listeners: streamable HTTP, stateless (a request's caller comes
/// from the listener's check, in the request's extensions).
pub fn http_service(
    state: Shared,
) -> rmcp::transport::streamable_http_server::StreamableHttpService<
    CodecageMcp,
    rmcp::transport::streamable_http_server::session::never::NeverSessionManager,
> {
    use rmcp::transport::streamable_http_server::{
        session::never::NeverSessionManager, StreamableHttpServerConfig, StreamableHttpService,
    };
    let mut hosts: Vec<String> = vec![
        "localhost".into(),
        "127.0.0.1".into(),
        "::1".into(),
        "codecage".into(),
    ];
    hosts.extend(state.config.mcp.allowed_hosts.iter().cloned());
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_allowed_hosts(hosts)
        .enforce_origin_validation()
        .with_cancellation_token(state.shutdown.child_token())
        .with_max_request_body_bytes(state.config.limits.max_body as usize);
    StreamableHttpService::new(
        move || {
            Ok(CodecageMcp::new(
                state.clone(),
                Caller::Unix {
                    uid: u32::MAX,
                    role: crate::server::config::Role::User,
                },
                false,
            ))
        },
        Arc::new(NeverSessionManager::default()),
        config,
    )
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
