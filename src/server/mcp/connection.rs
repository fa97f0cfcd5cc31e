//! Who a call acts for and which session it uses: the request's caller (HTTP) or the
//! connection's (stdio); the connection's one session (stdio), made on first use, whose
//! contexts (python, node, bash) the execute tools use, or a `session_id`'s; the session a
//! stdio connection closes when it ends. [`CodecageMcp::session`] is the one place that
//! picks a call's session.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::RoleServer;

use codecage::runner::Lang;

use super::results::{api_error, tool_error};
use super::{CodecageMcp, Language};
use crate::audit::Via;
use crate::server::registry::Entry;
use crate::server::Caller;
use crate::service::{self, Error as ApiError, SessionRequest};

impl CodecageMcp {
    /// Closes the connection's sessions (stdio, when the client goes).
    pub(super) async fn close_connection(&self) {
        let Some(connection) = &self.connection else {
            return;
        };
        let id = connection.lock().await.take();
        if let Some(id) = id {
            let _ = service::close_session(&self.state, &self.caller, Via::Mcp, &id).await;
        }
    }

    pub(super) fn profile_name(&self, language: Language) -> String {
        let mcp = &self.state.config.mcp;
        match language {
            Language::Python => mcp.profile_python.clone(),
            Language::Node => mcp.profile_node.clone(),
            Language::Shell => mcp.profile_shell.clone(),
        }
    }

    /// The request's caller (HTTP: what the listener's check found), else the connection's.
    pub(super) fn caller_of(&self, ctx: &RequestContext<RoleServer>) -> Caller {
        ctx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>().cloned())
            .unwrap_or_else(|| self.caller.clone())
    }

    /// The language a tool's calls run in: its context in the session. execute_node's is
    /// its profile's (node or typescript; typescript if the profile does not say).
    pub(super) fn lang_of(&self, language: Language) -> Lang {
        match language {
            Language::Python => Lang::Python,
            Language::Shell => Lang::Bash,
            Language::Node => service::load_profile(&self.state, &self.profile_name(language))
                .ok()
                .and_then(|p| p.language)
                .filter(|l| matches!(l, Lang::Node | Lang::Typescript))
                .unwrap_or(Lang::Typescript),
        }
    }

    /// Starts a session for `language` under its configured profile.
    pub(super) async fn open(
        &self,
        language: Language,
        caller: &Caller,
    ) -> Result<Arc<Entry>, ApiError> {
        let profile = self.profile_name(language);
        if language == Language::Node {
            // A profile that cannot be loaded is the open's error, said by the service.
            service::load_profile(&self.state, &profile)?;
        }
        let lang = self.lang_of(language);
        let mut request = SessionRequest {
            profile: Some(profile),
            ..SessionRequest::new(lang)
        };
        // The driver scales what it shows to the server's edge (its default is the
        // server's default; only another edge needs saying, and costs the warm pool).
        let edge = self.state.config.mcp.image_max_edge;
        if edge != crate::server::config::McpConfig::default().image_max_edge {
            request
                .env
                .insert("CODECAGE_IMAGE_MAX_EDGE".into(), edge.to_string());
        }
        service::open_session(&self.state, caller, Via::Mcp, request).await
    }

    /// The session a call uses: `session_id`'s, else (stdio) the connection's one session,
    /// made on first use under `language`'s profile (and again, with a note, if it
    /// expired); None over HTTP without an id. Every tool of a stdio connection gets the
    /// same sandbox: execute_python, execute_node and execute_shell are its contexts.
    /// Errors come as the tool result to return.
    pub(super) async fn session(
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
        let mut session = connection.lock().await;
        if let Some(id) = session.as_deref() {
            if let Ok(entry) = service::lookup(&self.state, caller, id) {
                return Ok(Some(entry));
            }
            *session = None;
        }
        if !create {
            return Ok(None);
        }
        let entry = self.open(language, caller).await.map_err(api_error)?;
        *session = Some(entry.id.clone());
        Ok(Some(entry))
    }

    /// The session the `exec` and `process` tools use (the one place that decides it):
    /// `session_id`'s, else (stdio) the connection's shell session, made on first use when
    /// `create`. Over HTTP without an id, or (stdio) with none made yet and not `create`,
    /// the error to return.
    pub(super) async fn exec_session(
        &self,
        session_id: Option<&str>,
        caller: &Caller,
        create: bool,
    ) -> Result<Arc<Entry>, CallToolResult> {
        match self
            .session(Language::Shell, session_id, caller, create)
            .await?
        {
            Some(entry) => Ok(entry),
            None if self.connection.is_some() => Err(tool_error(
                "this connection has no session (no command has run on it yet, or its session expired \
                 and its processes with it): exec starts one, and process then reaches its processes",
            )),
            None => Err(tool_error(
                "exec and process need a session_id from create_session: over HTTP there is no connection \
                 session, and a process lives in a session",
            )),
        }
    }

    pub(super) async fn files_session(
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
}

/// A client's calls come one after another, but a call it cancelled may still be winding
/// down (the interrupt, at most the session's grace): wait for that rather than refuse.
pub(super) async fn wait_idle(entry: &Entry) {
    let end = Instant::now() + codecage::session::GRACE + Duration::from_secs(1);
    while entry.is_busy() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
