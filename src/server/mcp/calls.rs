//! The execute tools' calls: in a session (the connection's or a `session_id`'s), with
//! progress notifications and cancellation, or (HTTP, no session) a one-shot run.

use std::time::{Duration, Instant};

use rmcp::model::{CallToolResult, ProgressNotificationParam};
use rmcp::service::RequestContext;
use rmcp::RoleServer;

use codecage::runner::Lang;
use codecage::session::{Call, CallOutcome, Event};

use super::connection::wait_idle;
use super::results::{api_error, formatted, tool_error};
use super::{CodecageMcp, Language};
use crate::audit::Via;
use crate::server::Caller;
use crate::service::{self, RunRequest};

/// How often a running call reports progress, at most.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);
/// How much of the output so far a progress message carries.
const PROGRESS_TAIL: usize = 400;

impl CodecageMcp {
    pub(super) async fn execute(
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
            (Some(connection), None) => connection.lock().await.clone(),
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
            lang: Some(self.lang_of(language)),
        };
        wait_idle(&entry).await;
        let result = service::call_session(
            self.state.clone(),
            caller.clone(),
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
            (Ok(outcome), None) => self.render(language, Some(&entry), &outcome, note, &caller),
            (Err(e), _) => api_error(e),
        }
    }

    /// A call without a session (HTTP): a fresh sandbox for this code alone.
    pub(super) async fn one_shot(
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
                    None => self.render(language, None, &call, None, caller),
                }
            }
            Err(e) => api_error(e),
        }
    }
}
