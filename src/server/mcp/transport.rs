//! The two ways in: `codecage mcp` (one client over stdio, through the request-size
//! filter of [`super::size`]) and `/mcp` on `codecage serve` (streamable HTTP, stateless).

use std::sync::Arc;

use super::CodecageMcp;
use crate::server::{Caller, Shared};

/// `codecage mcp`: one client over stdin/stdout until it goes (or SIGTERM); its sessions
/// are closed then.
pub async fn serve_stdio(
    config: crate::server::ServerConfig,
    caller: Caller,
) -> Result<(), String> {
    use rmcp::ServiceExt as _;
    let state = crate::server::AppState::new(config)?;
    let reaper = tokio::spawn(crate::server::registry::reap_forever(state.clone()));
    let max_request = usize::try_from(state.config.mcp.max_request).unwrap_or(usize::MAX);
    let server = CodecageMcp::stdio(state.clone(), caller);
    let transport = super::size::stdio(max_request);
    let result = match server.clone().serve(transport).await {
        Ok(running) => {
            tokio::select! {
                r = running.waiting() => r.map(|_| ()).map_err(|e| format!("the MCP connection failed: {e}")),
                _ = crate::server::wait_for_termination() => Ok(()),
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
