//! One sandbox's gateway: the stack over its link, and the decision on every flow.
//!
//! TCP to a name: the destination must be an address the gateway's DNS handed out (one per
//! name, from 198.19.0.0/16), so the gateway knows the name the program resolved. In
//! `restricted`, the port must be an allowed port of an allowed host (then the first bytes
//! must be a TLS ClientHello whose server name, or an HTTP request whose Host, is that
//! name) or the port of a `host:port` rule (passed through unchecked). The gateway then
//! connects to the addresses it resolved for the name when the program asked (pinned: a
//! later answer of the name's DNS does not change where its connections go), if they are
//! public or in `allowed_ranges`. DNS (UDP and TCP port 53 of the gateway) is answered
//! here. Everything else is refused, and every decision is logged for the Outcome.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use codecage::network::{
    name_allowed, normalize_name, not_public, Cidr, HostRule, Mode, NetworkSpec, Verdict,
    GATEWAY_ADDR, LINK_MTU, NAME_POOL,
};
use ipstack::{IpStack, IpStackConfig, IpStackStream, IpStackTcpStream, IpStackUdpStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::admission::{Admission, Held, Key, Reaper};
use super::client::Client;
use super::config::GatewayConfig;
use super::dns::{self, Answer};
use super::forward::{self, Bucket, Limits};
use super::http::Requests;
use super::log::Log;
use super::npm::Registry;
use super::packages::{self, Index, Packages};
use super::sniff::{self, Sniffed};
use super::tun::TunDevice;
use super::upstream::Upstream;

/// How long the gateway waits for the first bytes that name the destination (and for each
/// request head on a plain-HTTP connection, and on the package index's).
pub const SNIFF_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a DNS flow is kept waiting for another question.
const DNS_IDLE: Duration = Duration::from_millis(500);
/// How long a DNS-over-TCP connection may wait for its next question.
const DNS_TCP_IDLE: Duration = Duration::from_secs(10);
/// How long one DNS-over-TCP message (its length and its bytes) or its reply may take.
const DNS_TCP_MESSAGE: Duration = Duration::from_secs(2);
/// The largest DNS message the gateway reads (a stub's query is a few hundred bytes).
const DNS_MAX: usize = 4096;

/// A TCP stream the engine holds (see `admission`).
type Flow = Held<IpStackTcpStream>;
/// The TTL of the gateway's answers (the mapping never changes during a sandbox's life).
const DNS_TTL: u32 = 300;

pub struct Engine {
    inner: Arc<Inner>,
    reaper: Reaper,
}

struct Inner {
    spec: NetworkSpec,
    rules: Vec<HostRule>,
    ranges: Vec<Cidr>,
    #[allow(dead_code)]
    config: Arc<GatewayConfig>,
    upstream: Arc<Upstream>,
    log: Arc<Log>,
    names: Mutex<Names>,
    limits: Arc<Limits>,
    connections: Arc<Semaphore>,
    /// The package indexes on the gateway's port 80, when the profile lists packages.
    index: Option<Arc<Packages>>,
}

/// The names the gateway's DNS has answered: each with the address it handed out and the
/// addresses it resolved (pinned for the sandbox's life).
#[derive(Default)]
struct Names {
    by_name: HashMap<String, (Ipv4Addr, Vec<IpAddr>)>,
    by_addr: HashMap<Ipv4Addr, String>,
    next: u32,
}

/// Why a flow was refused or failed, and the name it was for.
struct Refusal {
    verdict: Verdict,
    reason: String,
}

fn denied(reason: impl Into<String>) -> Refusal {
    Refusal {
        verdict: Verdict::Denied,
        reason: reason.into(),
    }
}

impl Engine {
    pub fn new(
        spec: NetworkSpec,
        config: Arc<GatewayConfig>,
        upstream: Arc<Upstream>,
        client: Arc<Client>,
        log: Arc<Log>,
        reaper: Reaper,
    ) -> Engine {
        let idle = Duration::from_millis(spec.connection_idle_timeout_ms.max(1000));
        let limits = Arc::new(Limits {
            up: Bucket::new(spec.max_bandwidth),
            down: Bucket::new(spec.max_bandwidth),
            idle,
        });
        let pages = packages::pages_in_flight();
        let to = |base: &str| packages::Upstream {
            client: client.clone(),
            base: packages::base_url(base),
            ranges: spec.ranges(),
            limits: limits.clone(),
            log: log.clone(),
            pages: pages.clone(),
        };
        let python = (!spec.python_packages.is_empty())
            .then(|| Index::new(&spec.python_packages, to(config.python_index())));
        let npm = (!spec.npm_packages.is_empty())
            .then(|| Registry::new(&spec.npm_packages, to(config.npm_registry())));
        let index =
            (python.is_some() || npm.is_some()).then(|| Arc::new(Packages::new(python, npm)));
        let inner = Inner {
            index,
            rules: spec.host_rules(),
            ranges: spec.ranges(),
            limits,
            connections: Arc::new(Semaphore::new(spec.max_connections.max(1) as usize)),
            spec,
            config,
            upstream,
            log,
            names: Mutex::new(Names::default()),
        };
        Engine {
            inner: Arc::new(inner),
            reaper,
        }
    }

    /// Serves the link until the sandbox's namespace goes away or the task is aborted.
    pub async fn serve(self, mut device: TunDevice) {
        let inner = self.inner.clone();
        let admission = Arc::new(Admission::new(
            self.inner.spec.max_connections,
            self.reaper.clone(),
            Box::new(move |dst| inner.refused_at_link(dst)),
        ));
        device.admit_with(admission.clone());
        let mut config = IpStackConfig::default();
        config.mtu_unchecked(LINK_MTU);
        config.udp_timeout(DNS_IDLE * 2);
        let mut tcp = ipstack::TcpConfig::default();
        // The stack's own idle timeout only backs up ours.
        tcp.timeout = self.inner.limits.idle + Duration::from_secs(5);
        // The link is local and loses nothing: no stray segment can come late, so a closed
        // connection need not linger (and hold its place under max_connections).
        tcp.two_msl = Duration::from_millis(100);
        tcp.max_unacked_bytes = 1 << 20;
        tcp.read_buffer_size = 256 * 1024;
        config.with_tcp_config(tcp);
        let mut stack = IpStack::new(config, device);
        let mut flows = JoinSet::new();
        loop {
            tokio::select! {
                accepted = stack.accept() => {
                    let Ok(stream) = accepted else { break };
                    let inner = self.inner.clone();
                    match stream {
                        IpStackStream::Tcp(tcp) => {
                            let key = Key { tcp: true, src: tcp.local_addr(), dst: tcp.peer_addr() };
                            let tcp = admission.hold(key, tcp);
                            drop(flows.spawn(async move { inner.tcp(tcp).await }))
                        }
                        IpStackStream::Udp(udp) => {
                            let key = Key { tcp: false, src: udp.local_addr(), dst: udp.peer_addr() };
                            let udp = admission.hold(key, udp);
                            drop(flows.spawn(async move { inner.udp(udp).await }))
                        }
                        // ICMP and other protocols, and packets the stack cannot parse: dropped.
                        _ => {}
                    }
                }
                Some(_) = flows.join_next(), if !flows.is_empty() => {}
            }
        }
    }
}

impl Inner {
    fn record(&self, protocol: &'static str, host: &str, port: u16, refusal: &Refusal) {
        self.log.record(
            protocol,
            host,
            port,
            refusal.verdict,
            Some(refusal.reason.clone()),
        );
    }

    /// Logs a connection the link refused (past `max_connections` and its headroom).
    fn refused_at_link(&self, dst: SocketAddr) {
        let host = match dst.ip() == IpAddr::V4(GATEWAY_ADDR) {
            true => GATEWAY_ADDR.to_string(),
            false => self.host_of(dst.ip()),
        };
        self.record("tcp", &host, dst.port(), &self.over_the_cap());
    }

    fn over_the_cap(&self) -> Refusal {
        denied(format!(
            "more than {} connections open at once (the profile's max_connections)",
            self.spec.max_connections
        ))
    }

    async fn udp(&self, mut flow: Held<IpStackUdpStream>) {
        let dst = flow.stream().peer_addr();
        if dst.ip() == IpAddr::V4(GATEWAY_ADDR) && dst.port() == 53 {
            let mut buf = vec![0u8; 4096];
            while let Ok(Ok(n)) = tokio::time::timeout(DNS_IDLE, flow.read(&mut buf)).await {
                if n == 0 {
                    break;
                }
                if let Some(reply) = self.dns(&buf[..n]).await {
                    if flow.write_all(&reply).await.is_err() {
                        break;
                    }
                }
            }
            return;
        }
        let host = self.host_of(dst.ip());
        self.record(
            "udp",
            &host,
            dst.port(),
            &denied(
                "UDP is not carried: only DNS to the gateway (the nameserver in /etc/resolv.conf)",
            ),
        );
    }

    /// The name an address stands for, or the address itself.
    fn host_of(&self, ip: IpAddr) -> String {
        let IpAddr::V4(v4) = ip else {
            return ip.to_string();
        };
        self.names
            .lock()
            .ok()
            .and_then(|n| n.by_addr.get(&v4).cloned())
            .unwrap_or_else(|| ip.to_string())
    }

    /// Answers one DNS message.
    async fn dns(&self, msg: &[u8]) -> Option<Vec<u8>> {
        let q = match dns::parse_query(msg) {
            Ok(q) => q,
            Err(dns::Malformed::Ignore) => return None,
            Err(dns::Malformed::Reply(id, rcode)) => return Some(dns::error_reply(id, rcode)),
        };
        let answer = self.answer(&q.name, q.qtype, q.qclass).await;
        Some(dns::reply(&q, &answer, DNS_TTL))
    }

    async fn answer(&self, asked: &str, qtype: u16, qclass: u16) -> Answer {
        let Some(name) = normalize_name(asked) else {
            return Answer::NxDomain;
        };
        let allowed = self.spec.mode == Mode::Full || name_allowed(&self.rules, &name);
        if !allowed || qclass != 1 {
            self.log.record(
                "dns",
                &name,
                53,
                Verdict::Denied,
                Some(format!(
                    "{name} is not in the profile's allowed_hosts: codecage's DNS answers NXDOMAIN"
                )),
            );
            return Answer::NxDomain;
        }
        match self.lookup(&name).await {
            Ok(addr) => {
                self.log.record("dns", &name, 53, Verdict::Allowed, None);
                // IPv4 only: the link carries no IPv6, so AAAA (and other types) get no record.
                Answer::Found((qtype == dns::TYPE_A).then_some(addr))
            }
            Err(e) => {
                self.log.record("dns", &name, 53, Verdict::Failed, Some(e));
                Answer::NxDomain
            }
        }
    }

    /// The address handed out for `name`: resolved once, then pinned.
    async fn lookup(&self, name: &str) -> Result<Ipv4Addr, String> {
        if let Some((addr, _)) = self
            .names
            .lock()
            .ok()
            .and_then(|n| n.by_name.get(name).cloned())
        {
            return Ok(addr);
        }
        let resolved = self.upstream.resolve(name).await?;
        let mut names = self
            .names
            .lock()
            .map_err(|_| "the gateway's name table is poisoned".to_string())?;
        if let Some((addr, _)) = names.by_name.get(name) {
            return Ok(*addr);
        }
        let size = 1u32 << (32 - NAME_POOL.1);
        names.next += 1;
        if names.next >= size - 1 {
            return Err(format!("the sandbox resolved more than {} names", size - 2));
        }
        let addr = Ipv4Addr::from(u32::from(NAME_POOL.0) + names.next);
        names.by_name.insert(name.to_string(), (addr, resolved));
        names.by_addr.insert(addr, name.to_string());
        Ok(addr)
    }

    async fn tcp(&self, mut flow: Flow) {
        let dst = flow.stream().peer_addr();
        let to_gateway = dst.ip() == IpAddr::V4(GATEWAY_ADDR);
        let index = self
            .index
            .as_ref()
            .filter(|_| to_gateway && dst.port() == 80);
        // Every connection counts against max_connections, the gateway's own services (DNS,
        // the package indexes) too: each holds buffers and a task in the gateway, which no
        // cgroup of the sandbox's pays for. Held until the connection ends.
        let Ok(permit) = self.connections.clone().try_acquire_owned() else {
            let host = match to_gateway {
                true => GATEWAY_ADDR.to_string(),
                false => self.host_of(dst.ip()),
            };
            self.record("tcp", &host, dst.port(), &self.over_the_cap());
            let _ =
                tokio::time::timeout(Duration::from_secs(1), forward::shutdown(&mut flow)).await;
            return;
        };
        if let Some(index) = index {
            index.clone().serve(&mut flow).await;
            drop(permit);
            return;
        }
        let refused = self.tcp_inner(&mut flow).await;
        drop(permit);
        if refused {
            // The stack has completed the handshake already; a FIN tells the program at
            // once (dropping the stream alone would leave it waiting for its timeout).
            let _ =
                tokio::time::timeout(Duration::from_secs(1), forward::shutdown(&mut flow)).await;
        }
    }

    /// Returns true if the connection was refused (and is still open).
    async fn tcp_inner(&self, flow: &mut Flow) -> bool {
        let dst = flow.stream().peer_addr();
        if dst.ip() == IpAddr::V4(GATEWAY_ADDR) {
            return self.gateway_service(flow, dst.port()).await;
        }
        let host = self.host_of(dst.ip());
        let target = match self.decide(flow, dst).await {
            Ok(target) => target,
            Err(None) => return true,
            Err(Some(refusal)) => {
                self.record("tcp", &host, dst.port(), &refusal);
                return true;
            }
        };
        let (addrs, first, requests) = target;
        let mut last_error = String::new();
        for addr in &addrs {
            match self
                .upstream
                .connect(SocketAddr::new(*addr, dst.port()))
                .await
            {
                Ok(upstream) => {
                    let bytes = self
                        .log
                        .record("tcp", &host, dst.port(), Verdict::Allowed, None);
                    let refuse =
                        |reason: String| self.record("tcp", &host, dst.port(), &denied(reason));
                    forward::relay(
                        flow,
                        upstream,
                        first,
                        requests,
                        &refuse,
                        &self.limits,
                        &bytes,
                    )
                    .await;
                    return false;
                }
                Err(e) => {
                    last_error = format!("connecting to {addr} port {} failed: {e}", dst.port())
                }
            }
        }
        self.record(
            "tcp",
            &host,
            dst.port(),
            &Refusal {
                verdict: Verdict::Failed,
                reason: last_error,
            },
        );
        true
    }

    /// Whether a connection may go on: the addresses to connect to, the bytes already
    /// read from the sandbox and checked, and on plain HTTP the checker of the requests
    /// still to come; or why not (None: the program closed it before saying anything, which
    /// is not worth a line).
    async fn decide(
        &self,
        flow: &mut Flow,
        dst: SocketAddr,
    ) -> Result<(Vec<IpAddr>, Vec<u8>, Option<Requests>), Option<Refusal>> {
        let port = dst.port();
        let IpAddr::V4(v4) = dst.ip() else {
            return Err(Some(denied("IPv6 is not carried by the gateway")));
        };
        let pinned = self.names.lock().ok().and_then(|n| {
            n.by_addr
                .get(&v4)
                .and_then(|name| n.by_name.get(name).map(|e| (name.clone(), e.1.clone())))
        });
        let (name, resolved) = match pinned {
            Some(found) => (Some(found.0), found.1),
            None if self.spec.mode == Mode::Full => (None, vec![dst.ip()]),
            None => {
                let mut reason = format!(
                    "{v4} is an address, not a name resolved through codecage's DNS: connect to an allowed host by its name"
                );
                if let Some(why) = not_public(dst.ip()) {
                    reason.push_str(&format!(" ({v4} is {why})"));
                }
                return Err(Some(denied(reason)));
            }
        };
        let mut first = (Vec::new(), None);
        if let (Mode::Restricted, Some(name)) = (self.spec.mode, &name) {
            let explicit = self
                .rules
                .iter()
                .any(|r| r.port == Some(port) && r.matches(name));
            let on_default_ports = self.spec.allowed_ports.contains(&port)
                && self
                    .rules
                    .iter()
                    .any(|r| r.port.is_none() && r.matches(name));
            if !explicit && !on_default_ports {
                return Err(Some(denied(format!(
                    "port {port} is not allowed for {name}: the profile allows ports {:?} of its allowed_hosts, and \
                     other ports only as host:port entries",
                    self.spec.allowed_ports
                ))));
            }
            if !explicit {
                first = self.check_first_bytes(flow, name, port).await?;
            }
        }
        let shown = name.clone().unwrap_or_else(|| v4.to_string());
        let mut refused = Vec::new();
        let usable: Vec<IpAddr> = resolved
            .into_iter()
            .filter(|ip| match not_public(*ip) {
                Some(why) if !self.ranges.iter().any(|r| r.contains(*ip)) => {
                    refused.push(format!("{ip} ({why})"));
                    false
                }
                _ => ip.is_ipv4() || self.spec.mode == Mode::Full,
            })
            .collect();
        if usable.is_empty() {
            return Err(Some(denied(format!(
                "{shown} resolves to {}, which the gateway does not connect to (a profile may admit a range with \
                 allowed_ranges)",
                if refused.is_empty() { "no usable address".to_string() } else { refused.join(", ") }
            ))));
        }
        Ok((usable, first.0, first.1))
    }

    /// Reads the connection's first bytes and checks the name they carry against the name
    /// the program resolved. Returns the bytes, to be sent on, and on plain HTTP the
    /// checker that goes on reading every request of the connection.
    async fn check_first_bytes(
        &self,
        flow: &mut Flow,
        name: &str,
        port: u16,
    ) -> Result<(Vec<u8>, Option<Requests>), Option<Refusal>> {
        /// How the first bytes end.
        enum First {
            Tls(Option<String>),
            /// A first request head passed: the checked bytes.
            Http(Vec<u8>),
            Refused(String),
            Other,
            Closed,
        }
        let mut buf = Vec::new();
        let mut requests: Option<Requests> = None;
        let read = tokio::time::timeout(SNIFF_TIMEOUT, async {
            let mut chunk = vec![0u8; 16 * 1024];
            let mut checked = Vec::new();
            loop {
                match &mut requests {
                    Some(r) if r.heads() > 0 => return First::Http(checked),
                    Some(_) => {}
                    None => match sniff::sniff(&buf) {
                        Sniffed::NeedMore if buf.len() < sniff::MAX_SNIFF => {}
                        Sniffed::NeedMore | Sniffed::Other => return First::Other,
                        Sniffed::Tls(sni) => return First::Tls(sni),
                        Sniffed::Http => {
                            let mut r = Requests::new(name);
                            let fed = r.feed(&std::mem::take(&mut buf), &mut checked);
                            match fed {
                                // A refused request behind allowed ones: those go on (the
                                // relay stops after them).
                                Err(reason) if r.heads() == 0 => return First::Refused(reason),
                                _ => {}
                            }
                            requests = Some(r);
                            continue;
                        }
                    },
                }
                let n = match flow.read(&mut chunk).await {
                    Ok(0) | Err(_) => return First::Closed,
                    Ok(n) => n,
                };
                match &mut requests {
                    Some(r) => {
                        if let (Err(reason), 0) = (r.feed(&chunk[..n], &mut checked), r.heads()) {
                            return First::Refused(reason);
                        }
                    }
                    None => buf.extend_from_slice(&chunk[..n]),
                }
            }
        })
        .await;
        let same = |other: &str| normalize_name(other).as_deref() == Some(name);
        match read {
            Err(_) => Err(Some(denied(format!(
                "the program sent nothing the gateway could check within {SNIFF_TIMEOUT:?} (it reads the TLS \
                 ClientHello or the HTTP request to check the name)"
            )))),
            Ok(First::Closed) => Err(None),
            Ok(First::Tls(Some(sni))) if same(&sni) => Ok((buf, None)),
            Ok(First::Tls(Some(sni))) => Err(Some(denied(format!(
                "the TLS server name (SNI) {sni} differs from {name}, the name the program resolved"
            )))),
            Ok(First::Tls(None)) => Err(Some(denied(
                "the TLS ClientHello has no server name (SNI) to check",
            ))),
            Ok(First::Http(checked)) => Ok((checked, requests)),
            Ok(First::Refused(reason)) => Err(Some(denied(reason))),
            Ok(First::Other) => Err(Some(denied(format!(
                "what the program sent on port {port} is neither TLS nor HTTP; other protocols need a host:port \
                 entry in allowed_hosts"
            )))),
        }
    }

    /// The gateway's own ports: DNS over TCP (53). Anything else is refused.
    async fn gateway_service(&self, flow: &mut Flow, port: u16) -> bool {
        if port != 53 {
            self.record(
                "tcp",
                &GATEWAY_ADDR.to_string(),
                port,
                &denied(format!("nothing of the gateway listens on port {port}")),
            );
            return true;
        }
        // Each question within DNS_TCP_IDLE of the last answer, each message whole within
        // DNS_TCP_MESSAGE of its first byte and at most DNS_MAX bytes; the reply written
        // within DNS_TCP_MESSAGE too. Anything else ends the connection.
        let mut msg = Vec::new();
        loop {
            let mut first = [0u8; 1];
            if !matches!(
                tokio::time::timeout(DNS_TCP_IDLE, flow.read_exact(&mut first)).await,
                Ok(Ok(_))
            ) {
                return true;
            }
            let read = tokio::time::timeout(DNS_TCP_MESSAGE, async {
                let mut second = [0u8; 1];
                flow.read_exact(&mut second).await?;
                let len = u16::from_be_bytes([first[0], second[0]]) as usize;
                if len > DNS_MAX {
                    return Err(std::io::ErrorKind::InvalidData.into());
                }
                msg.resize(len, 0);
                flow.read_exact(&mut msg).await.map(drop)
            })
            .await;
            if !matches!(read, Ok(Ok(()))) {
                return true;
            }
            let Some(reply) = self.dns(&msg).await else {
                return true;
            };
            let mut framed = (reply.len() as u16).to_be_bytes().to_vec();
            framed.extend_from_slice(&reply);
            let wrote = tokio::time::timeout(DNS_TCP_MESSAGE, flow.write_all(&framed)).await;
            if !matches!(wrote, Ok(Ok(()))) {
                return true;
            }
        }
    }
}
