//! `codecage serve`: the local API over a unix socket (0600, or 0660 with a configured
//! group) and, with a bearer token, TCP. Front ends translate; the library decides: every
//! request becomes a profile-resolved `Spec` or a `Session`, and each sandbox runs on a
//! blocking thread, never on the async runtime.
//!
//! Load: one semaphore bounds the sandboxes alive at once (runs and sessions), another the
//! sessions; a request that finds no room waits `queue_timeout`, then gets 503 with
//! Retry-After. Shutdown (SIGTERM, SIGINT): stop accepting, cancel running runs,
//! interrupt and close every session, remove the socket file.

pub mod api;
pub mod config;
pub mod e2b;
mod listen;
pub mod mcp;
pub(crate) mod openapi;
pub mod pool;
pub(crate) mod registry;
mod state;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::net::{TcpListener, UnixListener};

pub use config::{Listen, ServerConfig};
pub use openapi::document as openapi_document;
pub use state::{AppState, Shared};

pub use crate::service::Caller;

/// Serves until SIGTERM or SIGINT, then shuts down cleanly.
pub async fn serve(config: ServerConfig, listens: Vec<Listen>) -> Result<(), String> {
    let state = AppState::new(config)?;
    // What a crashed server left (its pool among it) goes before anything new is built.
    tokio::task::spawn_blocking(codecage::launcher::sweep_leftovers)
        .await
        .map_err(|e| format!("sweeping leftover cgroups failed: {e}"))?;
    let shutdown = tokio_util_shutdown();
    // Every listener is bound before any serves: a client that saw one answer (the unix
    // socket's /healthz, say) finds the others listening too.
    let mut serving: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> =
        Vec::new();
    let mut sockets: Vec<PathBuf> = Vec::new();
    let e2b_listen = state.config.e2b.listen.clone();
    let cap = listen::connection_cap(
        &state.config.limits,
        listens.len() + usize::from(e2b_listen.is_some()),
    );
    if let Some(addr) = e2b_listen {
        let (listener, app) = e2b::listener(&state, &addr).await?;
        let signal = shutdown.subscribe();
        let limits = state.config.limits.clone();
        serving.push(Box::pin(listen::serve(
            listener,
            app,
            limits,
            cap,
            wait(signal),
        )));
    }
    for listen in listens {
        match listen {
            Listen::Unix(path) => {
                let listener = bind_unix(&path, state.config.socket_group.as_deref())?;
                sockets.push(path.clone());
                tracing::info!(socket = %path.display(), "listening");
                let app = routes(&state)
                    .layer(axum::middleware::from_fn_with_state(
                        state.clone(),
                        unix_caller,
                    ))
                    .layer(axum::middleware::from_fn_with_state(
                        state.clone(),
                        api::audit_errors,
                    ));
                let signal = shutdown.subscribe();
                let limits = state.config.limits.clone();
                serving.push(Box::pin(listen::serve(
                    listener,
                    app,
                    limits,
                    cap,
                    wait(signal),
                )));
            }
            Listen::Tcp(addr) => {
                if state.config.tokens.is_empty() {
                    return Err(format!(
                        "listening on TCP ({addr}) needs a token: give --token-file FILE or [[tokens]] in the config"
                    ));
                }
                let listener = TcpListener::bind(&addr)
                    .await
                    .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
                tracing::info!(%addr, "listening");
                let app = routes(&state)
                    .layer(axum::middleware::from_fn_with_state(
                        state.clone(),
                        bearer_caller,
                    ))
                    .layer(axum::middleware::from_fn_with_state(
                        state.clone(),
                        api::audit_errors,
                    ));
                let signal = shutdown.subscribe();
                let limits = state.config.limits.clone();
                serving.push(Box::pin(listen::serve(
                    listener,
                    app,
                    limits,
                    cap,
                    wait(signal),
                )));
            }
        }
    }
    let tasks: Vec<_> = serving.into_iter().map(tokio::spawn).collect();
    let reaper = tokio::spawn(registry::reap_forever(state.clone()));
    let pruner = state
        .audit
        .clone()
        .map(|audit| tokio::spawn(audit.prune_daily()));
    let refills = pool::start(&state, &state.config.pool.clone());
    wait_for_termination().await;
    tracing::info!("shutting down: no new requests; stopping runs and closing sessions");
    let _ = shutdown.send(());
    state.shutdown.cancel();
    state.canceller.cancel();
    state.sessions.interrupt_all();
    let grace = state.config.limits.shutdown_grace;
    let _ = tokio::time::timeout(grace, async {
        for task in tasks {
            let _ = task.await;
        }
    })
    .await;
    reaper.abort();
    if let Some(pruner) = pruner {
        pruner.abort();
    }
    for refill in refills {
        refill.abort();
    }
    state.pool.drain().await;
    let closed = state.sessions.close_all().await;
    for path in sockets {
        let _ = std::fs::remove_file(path);
    }
    if let Some(audit) = state.audit.clone() {
        let _ = tokio::task::spawn_blocking(move || audit.close()).await;
    }
    tracing::info!(sessions = closed, "stopped");
    Ok(())
}

/// The API and, at /mcp, the MCP server (behind the same caller check).
fn routes(state: &Shared) -> axum::Router {
    // Layers run outside in: the body budget first, then the size limit that reads it.
    let mcp = axum::Router::new()
        .fallback_service(mcp::http_service(state.clone()))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            mcp::size::http_limit,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            api::body_budget,
        ));
    api::router(state.clone())
        .nest("/mcp", mcp)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            pool::count_requests,
        ))
}

fn tokio_util_shutdown() -> tokio::sync::broadcast::Sender<()> {
    tokio::sync::broadcast::channel(1).0
}

async fn wait(mut signal: tokio::sync::broadcast::Receiver<()>) {
    let _ = signal.recv().await;
}

pub(crate) async fn wait_for_termination() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// The unix socket, replacing a stale one, with its mode set before anyone can connect
/// (created under a 0177 umask): 0600, or 0660 and the group's when one is configured.
fn bind_unix(path: &std::path::Path, group: Option<&str>) -> Result<UnixListener, String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => {
            return Err(format!(
                "{} is in use: another codecage serve is listening there",
                path.display()
            ))
        }
        Err(_) => {
            let _ = std::fs::remove_file(path);
        }
    }
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let listener = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = listener.map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    if let Some(group) = group {
        crate::cli::full::name_service("socket_group")?;
        let gid = nix::unistd::Group::from_name(group)
            .ok()
            .flatten()
            .ok_or_else(|| format!("socket_group {group:?} does not exist"))?
            .gid;
        std::os::unix::fs::chown(path, None, Some(gid.as_raw()))
            .map_err(|e| format!("cannot give {} to group {group}: {e}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            .map_err(|e| format!("cannot set the mode of {}: {e}", path.display()))?;
    }
    Ok(listener)
}

/// A unix socket peer's credentials.
#[derive(Clone, Debug)]
pub struct UdsPeer {
    pub uid: u32,
}

/// The unix socket's mode already decided who may connect: the caller is the peer's uid,
/// with what `[[unix_peers]]` (or `[unix_peers_default]`) grants it.
async fn unix_caller(
    State(state): State<Shared>,
    ConnectInfo(peer): ConnectInfo<UdsPeer>,
    mut request: Request,
    next: Next,
) -> Response {
    let caller = Caller::unix(peer.uid, &state.config);
    request.extensions_mut().insert(caller.clone());
    let mut response = next.run(request).await;
    // For the audit of refusals, which sits outside this layer.
    response.extensions_mut().insert(caller);
    response
}

/// TCP: `Authorization: Bearer TOKEN`, or 401.
async fn bearer_caller(State(state): State<Shared>, mut request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let token = presented.and_then(|p| {
        state
            .config
            .tokens
            .iter()
            .find(|t| constant_time_eq(t.token.as_bytes(), p.as_bytes()))
            .cloned()
    });
    match token {
        Some(t) => {
            let caller = Caller::Token {
                name: t.name,
                role: t.grant.role,
            };
            request.extensions_mut().insert(caller.clone());
            let mut response = next.run(request).await;
            // For the audit of refusals, which sits outside this layer.
            response.extensions_mut().insert(caller);
            response
        }
        None if request.uri().path() == "/healthz" => next.run(request).await,
        None => {
            let given = request
                .headers()
                .contains_key(axum::http::header::AUTHORIZATION);
            let mut response = crate::service::Error::new(
                crate::service::Kind::Unauthorized,
                "this listener needs `Authorization: Bearer TOKEN` with a token from the server's configuration",
            )
            .into_response();
            // RFC 6750: the scheme a client must use, and whether the token it gave was bad.
            let challenge = if given {
                "Bearer realm=\"codecage\", error=\"invalid_token\""
            } else {
                "Bearer realm=\"codecage\""
            };
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static(challenge),
            );
            response
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
