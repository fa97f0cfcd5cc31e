//! Where the gateway's connections go: names resolved by the host's resolver (or a hosts
//! file, for tests), sockets opened in the host's network namespace (or another one, for
//! tests).

use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use tokio::net::{TcpSocket, TcpStream};

/// How long a lookup or a connect may take.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Upstream {
    hosts_file: Option<PathBuf>,
    /// Makes sockets in another network namespace.
    maker: Option<Mutex<mpsc::Sender<SocketRequest>>>,
}

type SocketRequest = (bool, mpsc::SyncSender<std::io::Result<OwnedFd>>);

impl Upstream {
    pub fn new(hosts_file: Option<PathBuf>, netns: Option<&Path>) -> Result<Upstream, String> {
        let maker = match netns {
            Some(path) => Some(Mutex::new(socket_maker(path)?)),
            None => None,
        };
        Ok(Upstream { hosts_file, maker })
    }

    /// The addresses of `name`, as the host resolves it.
    pub async fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, String> {
        if let Some(file) = &self.hosts_file {
            let path = file.clone();
            let text = tokio::task::spawn_blocking(move || std::fs::read_to_string(path))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("cannot read the hosts file {}: {e}", file.display()))?;
            let addrs = hosts_lookup(&text, name);
            return match addrs.is_empty() {
                true => Err(format!("{name} does not exist")),
                false => Ok(addrs),
            };
        }
        crate::cli::full::name_service("the gateway's lookup of a host name")?;
        let lookup = tokio::net::lookup_host((name, 0));
        match tokio::time::timeout(UPSTREAM_TIMEOUT, lookup).await {
            Ok(Ok(addrs)) => {
                let mut out: Vec<IpAddr> = Vec::new();
                for a in addrs {
                    if !out.contains(&a.ip()) {
                        out.push(a.ip());
                    }
                }
                // IPv4 first: the host may have no IPv6 route.
                out.sort_by_key(|a| a.is_ipv6());
                Ok(out)
            }
            Ok(Err(e)) => Err(format!("{name} does not resolve: {e}")),
            Err(_) => Err(format!(
                "looking up {name} took longer than {UPSTREAM_TIMEOUT:?}"
            )),
        }
    }

    /// A TCP connection to `addr`.
    pub async fn connect(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        let socket = match &self.maker {
            None => match addr {
                SocketAddr::V4(_) => TcpSocket::new_v4()?,
                SocketAddr::V6(_) => TcpSocket::new_v6()?,
            },
            Some(maker) => {
                let (reply, answer) = mpsc::sync_channel(1);
                maker
                    .lock()
                    .map_err(|_| std::io::Error::other("socket maker poisoned"))?
                    .send((addr.is_ipv6(), reply))
                    .map_err(|_| std::io::Error::other("the socket maker thread is gone"))?;
                let fd = answer
                    .recv()
                    .map_err(|_| std::io::Error::other("the socket maker thread is gone"))??;
                TcpSocket::from_std_stream(std::net::TcpStream::from(fd))
            }
        };
        let _ = socket.set_nodelay(true);
        match tokio::time::timeout(UPSTREAM_TIMEOUT, socket.connect(addr)).await {
            Ok(result) => result,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {UPSTREAM_TIMEOUT:?}"),
            )),
        }
    }
}

/// A thread that lives in the network namespace at `path` and makes non-blocking TCP
/// sockets there (a socket stays in the namespace it was made in).
fn socket_maker(path: &Path) -> Result<mpsc::Sender<SocketRequest>, String> {
    let ns = std::fs::File::open(path)
        .map_err(|e| format!("cannot open the dial namespace {}: {e}", path.display()))?;
    let (tx, rx) = mpsc::channel::<SocketRequest>();
    let (ready_tx, ready_rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("codecage-dial".into())
        .spawn(move || {
            let entered = nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("cannot enter the dial namespace: {e}"));
            let ok = entered.is_ok();
            let _ = ready_tx.send(entered);
            if !ok {
                return;
            }
            for (v6, reply) in rx {
                use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
                let family = if v6 {
                    AddressFamily::Inet6
                } else {
                    AddressFamily::Inet
                };
                let fd = socket(
                    family,
                    SockType::Stream,
                    SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                    None,
                )
                .map_err(std::io::Error::from);
                let _ = reply.send(fd);
            }
        })
        .map_err(|e| format!("cannot start the dial thread: {e}"))?;
    ready_rx
        .recv()
        .map_err(|_| "the dial thread died".to_string())??;
    Ok(tx)
}

/// Every address `name` has in a hosts(5) file.
pub fn hosts_lookup(text: &str, name: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        let Some(Ok(addr)) = fields.next().map(str::parse::<IpAddr>) else {
            continue;
        };
        if fields.any(|n| n.eq_ignore_ascii_case(name)) && !out.contains(&addr) {
            out.push(addr);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hosts_file_gives_every_address_of_a_name() {
        let text = "203.0.113.10 a.test b.test # comment\n# 1.2.3.4 a.test\n203.0.113.11\tA.TEST\nbad a.test\n";
        let got = hosts_lookup(text, "a.test");
        assert_eq!(
            got,
            vec![
                "203.0.113.10".parse::<IpAddr>().unwrap(),
                "203.0.113.11".parse().unwrap()
            ]
        );
        assert!(hosts_lookup(text, "c.test").is_empty());
    }
}
