//! What every handler shares: the server's config and data directory, the semaphores that
//! bound sandboxes, sessions and request bodies, the session registry, each caller's runs
//! in flight, the shutdown signals, MCP's kept outputs, the audit log and the warm pool.

use std::sync::Arc;

use tokio::sync::Semaphore;

use codecage::profile::DataDir;
use codecage::Canceller;

use super::{mcp, pool, registry, ServerConfig};

/// What every handler shares.
pub struct AppState {
    pub config: ServerConfig,
    pub data_dir: DataDir,
    /// Room for sandboxes (runs and sessions).
    pub sandboxes: Arc<Semaphore>,
    /// Room for sessions.
    pub session_slots: Arc<Semaphore>,
    pub sessions: registry::Registry,
    /// Request bodies in memory at once, in KiB (`limits.max_body` in all).
    pub bodies: Arc<Semaphore>,
    /// Each caller's runs and calls in flight (`max_concurrent_runs`).
    pub runs: crate::service::tenancy::RunCounts,
    /// Stops every run at shutdown.
    pub canceller: Canceller,
    /// Cancelled at shutdown (the async side: MCP connections, their runs).
    pub shutdown: tokio_util::sync::CancellationToken,
    /// What MCP connections share (kept outputs).
    pub mcp: mcp::McpStore,
    /// The audit log, unless `audit.enabled = false`.
    pub audit: Option<crate::audit::Audit>,
    /// Sandboxes and sessions built ahead of requests.
    pub pool: pool::Pool,
    /// `[exec] ask`: the questions waiting for a person, and the standing rules.
    pub approvals: crate::service::approvals::Approvals,
}

pub type Shared = Arc<AppState>;

impl AppState {
    pub fn new(config: ServerConfig) -> Result<Shared, String> {
        let canceller =
            Canceller::new().map_err(|e| format!("cannot create the canceller: {e}"))?;
        let audit = if config.audit.enabled {
            Some(crate::audit::Audit::open(&config.audit)?)
        } else {
            None
        };
        let approvals = crate::service::approvals::Approvals::open(
            audit.as_ref().and_then(|_| config.audit.path.parent()),
        )?;
        Ok(Arc::new(AppState {
            approvals,
            audit,
            sandboxes: Arc::new(Semaphore::new(config.limits.max_sandboxes)),
            session_slots: Arc::new(Semaphore::new(config.limits.max_sessions)),
            sessions: registry::Registry::default(),
            runs: Default::default(),
            bodies: Arc::new(Semaphore::new(
                usize::try_from(config.limits.max_body / 1024 + 1).unwrap_or(usize::MAX),
            )),
            data_dir: DataDir::from_env(),
            canceller,
            shutdown: tokio_util::sync::CancellationToken::new(),
            mcp: mcp::McpStore::default(),
            pool: pool::Pool::default(),
            config,
        }))
    }
}
