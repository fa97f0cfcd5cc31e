//! The network gateway: the front end's side of a sandbox's link (see
//! `codecage::network`). Each sandbox in network mode `restricted` or `full` hands its tun
//! queue to [`Gateway::attach`]; a userspace TCP/IP stack (ipstack) over it terminates every
//! TCP connection and UDP flow the sandbox opens, and `engine` decides each one.
//!
//! The gateway runs on a tokio runtime of its own, started the first time a sandbox needs
//! it: `codecage run` with network mode `none` never starts it, and the server's request
//! handling never shares its workers with packet processing.

mod admission;
mod client;
mod config;
mod dns;
mod engine;
mod forward;
mod http;
mod log;
mod npm;
mod packages;
mod sniff;
mod tun;
mod upstream;

use std::os::fd::OwnedFd;
use std::sync::{Arc, OnceLock};

use codecage::network::{Attached, Connection, Mode, NetworkSpec};

pub use config::GatewayConfig;

/// The gateway this process installed, for [`Gateway::health`].
static INSTALLED: OnceLock<Arc<Gateway>> = OnceLock::new();
/// How long the health check waits for the gateway's runtime to run a task.
const HEALTH_PROBE: std::time::Duration = std::time::Duration::from_secs(1);
/// Streams waiting for the reaper past which the gateway is reported unhealthy.
const REAPER_BACKLOG: usize = 100_000;

/// The gateway of one process (the CLI's, or the server's).
pub struct Gateway {
    config: Arc<GatewayConfig>,
    runtime: OnceLock<Result<tokio::runtime::Runtime, String>>,
    upstream: OnceLock<Result<Arc<upstream::Upstream>, String>>,
    /// The package indexes' HTTP(S) client, shared by every sandbox (its TLS settings
    /// are made once).
    client: OnceLock<Arc<client::Client>>,
    /// The thread that drops the sandboxes' streams (see `admission`).
    reaper: OnceLock<Result<admission::Reaper, String>>,
}

impl Gateway {
    pub fn new(config: GatewayConfig) -> Gateway {
        Gateway {
            config: Arc::new(config),
            runtime: OnceLock::new(),
            upstream: OnceLock::new(),
            client: OnceLock::new(),
            reaper: OnceLock::new(),
        }
    }

    /// Registers a gateway with this config as the process's.
    pub fn install(config: GatewayConfig) {
        let gateway = Arc::new(Gateway::new(config));
        let _ = INSTALLED.set(gateway.clone());
        codecage::network::set_gateway(gateway);
    }

    /// Whether the gateway can relay: its runtime runs a task within a second (a stalled
    /// runtime is what stopped every sandbox's network before, issue 22), and its reaper
    /// keeps up. `Ok` with its state, or why not. A gateway not started yet is healthy.
    pub async fn health() -> Result<String, String> {
        match INSTALLED.get() {
            Some(gateway) => gateway.check_health().await,
            None => Ok("gateway: not configured".into()),
        }
    }

    async fn check_health(&self) -> Result<String, String> {
        let gateway = self;
        let Some(Ok(runtime)) = gateway.runtime.get() else {
            return Ok("gateway: not started".into());
        };
        let probe = runtime.spawn(async {});
        match tokio::time::timeout(HEALTH_PROBE, probe).await {
            Ok(Ok(())) => {}
            _ => {
                return Err(format!(
                    "gateway: its runtime did not run a task within {HEALTH_PROBE:?}: sandboxes cannot reach the network"
                ))
            }
        }
        let backlog = match gateway.reaper.get() {
            Some(Ok(reaper)) => reaper.backlog(),
            _ => 0,
        };
        if backlog > REAPER_BACKLOG {
            return Err(format!(
                "gateway: {backlog} closed connections wait to be released (more than {REAPER_BACKLOG})"
            ));
        }
        Ok(format!(
            "gateway: ok ({backlog} connections being released)"
        ))
    }

    /// Whether the host allows `mode`: `full` only where the config enables it.
    pub fn check_mode(config: &GatewayConfig, mode: Mode) -> Result<(), String> {
        if mode == Mode::Full && !config.full {
            return Err(
                "network full is not enabled on this host: its administrator enables it with `full = true` \
                 in [network] of the server's config (or of /etc/codecage/config.toml for the CLI); use \
                 restricted with allowed_hosts instead"
                    .into(),
            );
        }
        Ok(())
    }

    fn runtime(&self) -> Result<&tokio::runtime::Runtime, String> {
        self.runtime
            .get_or_init(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("codecage-gateway")
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot start the gateway's runtime: {e}"))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    fn reaper(&self, runtime: &tokio::runtime::Runtime) -> Result<admission::Reaper, String> {
        self.reaper
            .get_or_init(|| {
                admission::Reaper::start(runtime.handle().clone())
                    .map_err(|e| format!("cannot start the gateway's reaper thread: {e}"))
            })
            .clone()
    }

    fn upstream(&self) -> Result<Arc<upstream::Upstream>, String> {
        self.upstream
            .get_or_init(|| {
                upstream::Upstream::new(
                    self.config.hosts_file.clone(),
                    self.config.dial_netns.as_deref(),
                )
                .map(Arc::new)
            })
            .clone()
    }
}

impl codecage::network::Gateway for Gateway {
    fn attach(&self, tun: OwnedFd, spec: &NetworkSpec) -> Result<Box<dyn Attached>, String> {
        Gateway::check_mode(&self.config, spec.mode)?;
        let runtime = self.runtime()?;
        let reaper = self.reaper(runtime)?;
        let upstream = self.upstream()?;
        let client = self
            .client
            .get_or_init(|| {
                Arc::new(client::Client::new(
                    upstream.clone(),
                    self.config.index_ca_file.clone(),
                ))
            })
            .clone();
        let log = Arc::new(log::Log::default());
        let engine = engine::Engine::new(
            spec.clone(),
            self.config.clone(),
            upstream,
            client,
            log.clone(),
            reaper,
        );
        let task = {
            let _guard = runtime.enter();
            let device = tun::TunDevice::new(tun)
                .map_err(|e| format!("cannot serve the sandbox's link: {e}"))?;
            runtime.spawn(engine.serve(device))
        };
        Ok(Box::new(Link { log, task }))
    }
}

/// One sandbox's gateway, as the launcher holds it.
struct Link {
    log: Arc<log::Log>,
    task: tokio::task::JoinHandle<()>,
}

impl Attached for Link {
    fn take_connections(&mut self) -> Vec<Connection> {
        self.log.take()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // The engine's task owns the stack and every connection's task (a JoinSet):
        // aborting it drops them all, and with them the tun queue and upstream sockets;
        // the streams themselves go to the reaper (see `admission`), never dropped here
        // or on the runtime's workers.
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_says_when_the_gateways_runtime_is_stalled() {
        // The server's side: a runtime of its own that asks.
        let server = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let gateway = Gateway::new(GatewayConfig::default());
        let check = || server.block_on(gateway.check_health());
        assert_eq!(check().unwrap(), "gateway: not started");
        let runtime = gateway.runtime().unwrap();
        assert!(check().unwrap().starts_with("gateway: ok"));
        // Both workers blocked: no task of the gateway's can run, nothing is relayed.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = Arc::new(std::sync::Mutex::new(rx));
        let (started_tx, started) = std::sync::mpsc::channel::<()>();
        for _ in 0..2 {
            let rx = rx.clone();
            let started_tx = started_tx.clone();
            runtime.spawn(async move {
                let _ = started_tx.send(());
                let _ = rx
                    .lock()
                    .unwrap()
                    .recv_timeout(std::time::Duration::from_secs(5));
            });
        }
        // Both blockers are on a worker (a loaded machine may start them late).
        for _ in 0..2 {
            started
                .recv_timeout(std::time::Duration::from_secs(30))
                .expect("a blocking task started");
        }
        let start = std::time::Instant::now();
        let why = check().unwrap_err();
        assert!(why.contains("did not run a task"), "{why}");
        assert!(start.elapsed() < std::time::Duration::from_secs(3));
        drop(tx);
        assert!((0..50).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            check().is_ok()
        }));
    }
}
