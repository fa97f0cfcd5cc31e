//! The sandbox's network, as policy data and a hook. The library knows the modes, the
//! rules (which names, ports and address ranges a sandbox may reach) and the addresses of
//! the link between a sandbox and its gateway; it creates the link (a tun device in the
//! sandbox's network namespace, whose queue only the launcher holds) and hands it to a
//! [`Gateway`] that the front end provides. The gateway itself (a userspace TCP/IP stack,
//! DNS, the checks of every connection) lives in the binary, with tokio: a program that
//! only calls [`crate::run`] with the default mode compiles none of it.
//!
//! - `none`: only `lo`. The namespace is the boundary.
//! - `restricted`: `lo` and `tun0`, whose default route leads to the gateway. Every TCP
//!   connection is terminated in the gateway and decided there (the name the program
//!   resolved through the gateway's DNS, the TLS server name or HTTP Host it sends, the
//!   port, the address the name resolves to); DNS is answered by the gateway; everything
//!   else is dropped. IPv6 is off on the link.
//! - `full`: the same gateway without a host list (still no private ranges or cloud
//!   metadata), only where the host's configuration enables it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::OwnedFd;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

/// The name of the gateway's device inside the sandbox.
pub const TUN_NAME: &str = "tun0";
/// The sandbox's own address on the link (RFC 2544's benchmarking range: nothing real
/// lives there, and no host network is ever bridged to it).
pub const SANDBOX_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// The gateway's address: its DNS server (port 53) and package indexes (port 80).
pub const GATEWAY_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The addresses the gateway's DNS hands out, one per name: 198.19.0.0/16. A connection to
/// one of them is a connection to the name it stands for.
pub const NAME_POOL: (Ipv4Addr, u8) = (Ipv4Addr::new(198, 19, 0, 0), 16);
/// The link's MTU: large, because every packet costs the gateway a read and a parse, and
/// the link never leaves the host.
pub const LINK_MTU: u16 = 65_000;

/// Which network a sandbox has. Ordered from tightest to loosest: a request may only move
/// down.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Mode {
    /// Loopback only.
    #[default]
    None,
    /// Only `allowed_hosts`, through the gateway.
    Restricted,
    /// Any public name or address through the gateway; only where the host enables it.
    Full,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Restricted => "restricted",
            Mode::Full => "full",
        }
    }

    /// Whether the sandbox gets the link to a gateway.
    pub fn has_gateway(self) -> bool {
        self != Mode::None
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "none" => Ok(Mode::None),
            "restricted" => Ok(Mode::Restricted),
            "full" => Ok(Mode::Full),
            _ => Err(format!(
                "network mode {s:?} does not exist: use none, restricted or full"
            )),
        }
    }
}

/// The ports every allowed host may be reached on, unless the profile says otherwise.
pub const DEFAULT_PORTS: &[u16] = &[80, 443];

/// A sandbox's network, fully resolved (part of [`crate::SandboxSpec`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct NetworkSpec {
    pub mode: Mode,
    /// Names the sandbox may reach: `example.com` (that name), `*.example.com` (its
    /// subdomains, not itself), either with `:PORT` for one more port on which the
    /// connection is passed through unchecked (a protocol other than TLS or HTTP).
    pub allowed_hosts: Vec<String>,
    /// Ports on which every allowed host may be reached, with TLS (its server name) or
    /// HTTP (its Host header) checked against the name.
    pub allowed_ports: Vec<u16>,
    /// Address ranges (CIDR) a name may resolve to although they are not public: for tests
    /// and internal services.
    pub allowed_ranges: Vec<String>,
    /// Bytes per second, in each direction, for the whole sandbox.
    pub max_bandwidth: u64,
    /// TCP connections open at once.
    pub max_connections: u64,
    /// A connection with no traffic either way for this long is closed, in milliseconds.
    pub connection_idle_timeout_ms: u64,
    /// Python packages (PEP 503 names) the gateway's package index serves.
    pub python_packages: Vec<String>,
    /// npm packages the gateway's registry serves.
    pub npm_packages: Vec<String>,
}

impl NetworkSpec {
    /// Checks every rule's syntax, with messages that name the key.
    pub fn validate(&self) -> Result<(), String> {
        for host in &self.allowed_hosts {
            HostRule::parse(host).map_err(|e| format!("network.allowed_hosts: {e}"))?;
        }
        for range in &self.allowed_ranges {
            Cidr::parse(range).map_err(|e| format!("network.allowed_ranges: {e}"))?;
        }
        if let Some(p) = self.allowed_ports.iter().find(|p| **p == 0) {
            return Err(format!("network.allowed_ports: {p} is not a port"));
        }
        for name in self.python_packages.iter().chain(&self.npm_packages) {
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./@".contains(c))
            {
                return Err(format!("network packages: {name:?} is not a package name"));
            }
        }
        Ok(())
    }

    /// The parsed host rules (validated beforehand).
    pub fn host_rules(&self) -> Vec<HostRule> {
        self.allowed_hosts
            .iter()
            .filter_map(|h| HostRule::parse(h).ok())
            .collect()
    }

    /// The parsed ranges (validated beforehand).
    pub fn ranges(&self) -> Vec<Cidr> {
        self.allowed_ranges
            .iter()
            .filter_map(|r| Cidr::parse(r).ok())
            .collect()
    }

    /// The environment that points package managers at the gateway's index, when the
    /// profile lists packages.
    pub fn package_env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if self.mode.has_gateway() && !self.python_packages.is_empty() {
            env.push((
                "PIP_INDEX_URL".into(),
                format!("http://{GATEWAY_ADDR}/simple/"),
            ));
            env.push(("PIP_TRUSTED_HOST".into(), GATEWAY_ADDR.to_string()));
        }
        if self.mode.has_gateway() && !self.npm_packages.is_empty() {
            env.push((
                "npm_config_registry".into(),
                format!("http://{GATEWAY_ADDR}/npm/"),
            ));
            // npm's audit and update check would ask the registry for what it does not
            // serve, and fail with a warning.
            env.push(("npm_config_audit".into(), "false".into()));
            env.push(("npm_config_update_notifier".into(), "false".into()));
        }
        env
    }

    /// The TCP ports landlock lets the payload connect to: in `restricted`, the allowed
    /// ports, the ports of `host:port` rules, DNS over TCP and the package indexes; in
    /// `none` and `full`, None (not handled: the namespace, or the gateway, decides).
    pub fn landlock_connect_ports(&self) -> Option<Vec<u16>> {
        if self.mode != Mode::Restricted {
            return None;
        }
        let mut ports: Vec<u16> = self.allowed_ports.clone();
        ports.extend(self.host_rules().iter().filter_map(|r| r.port));
        ports.extend([53, 80]);
        ports.sort_unstable();
        ports.dedup();
        Some(ports)
    }
}

/// One entry of `allowed_hosts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRule {
    /// Lowercase, without a trailing dot; for a wildcard, the suffix after `*.`.
    pub name: String,
    pub wildcard: bool,
    /// A port this host may be reached on unchecked, besides `allowed_ports`.
    pub port: Option<u16>,
}

impl HostRule {
    pub fn parse(text: &str) -> Result<HostRule, String> {
        let (host, port) = match text.rsplit_once(':') {
            Some((host, port)) => {
                let port: u16 = port
                    .parse()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| format!("{text:?}: {port:?} is not a port"))?;
                (host, Some(port))
            }
            None => (text, None),
        };
        let (wildcard, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, host),
        };
        let name = normalize_name(name).ok_or_else(|| {
            format!("{text:?} is not a host name (use example.com or *.example.com)")
        })?;
        if name.parse::<IpAddr>().is_ok() {
            return Err(format!(
                "{text:?}: give a name, not an address (addresses go in allowed_ranges)"
            ));
        }
        Ok(HostRule {
            name,
            wildcard,
            port,
        })
    }

    /// Whether `name` (normalized) is this rule's name.
    pub fn matches(&self, name: &str) -> bool {
        if self.wildcard {
            name.len() > self.name.len() + 1
                && name.ends_with(&self.name)
                && name.as_bytes()[name.len() - self.name.len() - 1] == b'.'
        } else {
            name == self.name
        }
    }
}

/// A DNS name in lowercase without its trailing dot, if it is one (letters, digits, `-`,
/// `_`, labels of 1 to 63 characters, 253 at most).
pub fn normalize_name(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    ok.then_some(name)
}

/// Whether any rule allows `name` (on some port).
pub fn name_allowed(rules: &[HostRule], name: &str) -> bool {
    rules.iter().any(|r| r.matches(name))
}

/// An address range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let bad = || format!("{text:?} is not an address range (203.0.113.0/24, fd00::/8)");
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(bad)?,
            None => max,
        };
        Ok(Cidr { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// Why an address is not public, if it is not: the gateway connects only to public
/// unicast addresses, unless a range of the profile admits it.
pub fn not_public(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => not_public_v4(v4),
        IpAddr::V6(v6) => {
            if v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
                return Some("a cloud metadata address");
            }
            // Addresses that carry an IPv4 address are judged by it.
            if let Some(v4) = v6.to_ipv4_mapped() {
                return not_public_v4(v4);
            }
            let s = v6.segments();
            if s[0] == 0x64 && s[1] == 0xff9b {
                return not_public_v4(Ipv4Addr::from((u128::from(v6) & 0xffff_ffff) as u32));
            }
            if s[0] == 0x2002 {
                return not_public_v4(Ipv4Addr::new(
                    (s[1] >> 8) as u8,
                    s[1] as u8,
                    (s[2] >> 8) as u8,
                    s[2] as u8,
                ));
            }
            if v6.is_unspecified() {
                Some("the unspecified address")
            } else if v6.is_loopback() {
                Some("a loopback address")
            } else if v6.is_multicast() {
                Some("a multicast address")
            } else if s[0] & 0xfe00 == 0xfc00 {
                Some("a private (unique local) address")
            } else if s[0] & 0xffc0 == 0xfe80 {
                Some("a link-local address")
            } else if s[0] == 0x2001 && s[1] == 0x0db8 {
                Some("a documentation address")
            } else if s[0] & 0xe000 != 0x2000 {
                Some("not a global unicast address")
            } else {
                None
            }
        }
    }
}

fn not_public_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    if ip == Ipv4Addr::new(169, 254, 169, 254) || ip == Ipv4Addr::new(100, 100, 100, 200) {
        Some("a cloud metadata address")
    } else if ip.is_loopback() {
        Some("a loopback address")
    } else if ip.is_private() {
        Some("a private address")
    } else if ip.is_link_local() {
        Some("a link-local address")
    } else if o[0] == 100 && o[1] & 0xc0 == 64 {
        Some("a shared (CGNAT) address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if ip.is_broadcast() || o[0] >= 240 {
        Some("a reserved address")
    } else if o[0] == 0 {
        Some("a 'this network' address")
    } else if ip.is_documentation() {
        Some("a documentation address")
    } else if o[0] == 198 && o[1] & 0xfe == 18 {
        Some("a benchmarking address")
    } else if o[0] == 192 && o[1] == 0 && o[2] == 0 {
        Some("an IETF protocol address")
    } else {
        None
    }
}

/// What the gateway did with one destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Verdict {
    /// Connected (or answered), and forwarded.
    Allowed,
    /// Refused by the policy: `reason` says which rule.
    Denied,
    /// Allowed, but the destination could not be reached: `reason` says why.
    Failed,
}

/// The connections (and DNS questions) of a run to one destination with one verdict, in
/// `Outcome.network`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Connection {
    /// `tcp`, `udp` or `dns`.
    pub protocol: String,
    /// The name the program asked for, or the address it dialed.
    pub host: String,
    pub port: u16,
    pub verdict: Verdict,
    /// Why it was denied or failed.
    pub reason: Option<String>,
    /// How many connections (or questions) this entry counts.
    pub count: u64,
    /// Bytes from the sandbox to the destination.
    pub bytes_out: u64,
    /// Bytes from the destination to the sandbox.
    pub bytes_in: u64,
}

/// The front end's part: takes over a new sandbox's link. Provided by the binary (the
/// CLI and the server), registered once with [`set_gateway`].
pub trait Gateway: Send + Sync {
    /// Serves the sandbox's tun queue (non-blocking, `IFF_NO_PI`) under `spec` from now
    /// until the returned handle is dropped. Refuses a spec this host does not allow
    /// (`full` where the operator did not enable it).
    fn attach(&self, tun: OwnedFd, spec: &NetworkSpec) -> Result<Box<dyn Attached>, String>;
}

/// One sandbox's gateway. Dropping it stops every connection of the sandbox.
pub trait Attached: Send {
    /// The connections since the last call, aggregated by destination and verdict.
    fn take_connections(&mut self) -> Vec<Connection>;
}

static GATEWAY: OnceLock<Arc<dyn Gateway>> = OnceLock::new();

/// Registers the process's gateway. A sandbox whose mode needs one is refused without it.
/// Returns false if one was registered already (the first stays).
pub fn set_gateway(gateway: Arc<dyn Gateway>) -> bool {
    GATEWAY.set(gateway).is_ok()
}

pub(crate) fn gateway() -> Option<&'static Arc<dyn Gateway>> {
    GATEWAY.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_rules_match_exact_names_and_subdomains_only() {
        let exact = HostRule::parse("PyPI.org.").unwrap();
        assert!(exact.matches("pypi.org"));
        assert!(!exact.matches("evil-pypi.org"));
        assert!(!exact.matches("a.pypi.org"));
        let wild = HostRule::parse("*.example.com").unwrap();
        assert!(wild.matches("a.example.com"));
        assert!(wild.matches("a.b.example.com"));
        assert!(!wild.matches("example.com"));
        assert!(!wild.matches("badexample.com"));
        let port = HostRule::parse("db.example.com:5432").unwrap();
        assert_eq!(port.port, Some(5432));
        assert!(HostRule::parse("10.0.0.1").is_err());
        assert!(HostRule::parse("a b").is_err());
        assert!(HostRule::parse("x.com:0").is_err());
        assert!(HostRule::parse("*.com").is_ok());
    }

    #[test]
    fn only_public_addresses_pass() {
        for (ip, why) in [
            ("127.0.0.1", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "metadata"),
            ("169.254.1.1", "link-local"),
            ("100.64.0.1", "CGNAT"),
            ("224.0.0.1", "multicast"),
            ("0.0.0.0", "this network"),
            ("203.0.113.5", "documentation"),
            ("198.19.0.1", "benchmarking"),
            ("::1", "loopback"),
            ("fd00:ec2::254", "metadata"),
            ("fd12::1", "unique local"),
            ("fe80::1", "link-local"),
            ("::ffff:10.0.0.1", "private"),
            ("64:ff9b::7f00:1", "loopback"),
            ("2002:a00:1::", "private"),
            ("2001:db8::1", "documentation"),
        ] {
            let got = not_public(ip.parse().unwrap());
            assert!(got.is_some_and(|g| g.contains(why)), "{ip}: {got:?}");
        }
        for ip in ["93.184.216.34", "1.1.1.1", "2606:4700::1111"] {
            assert_eq!(not_public(ip.parse().unwrap()), None, "{ip}");
        }
    }

    #[test]
    fn ranges_contain_their_addresses() {
        let r = Cidr::parse("203.0.113.0/24").unwrap();
        assert!(r.contains("203.0.113.77".parse().unwrap()));
        assert!(!r.contains("203.0.114.1".parse().unwrap()));
        assert!(!r.contains("::1".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        assert!(Cidr::parse("fd00::/8")
            .unwrap()
            .contains("fd12::1".parse().unwrap()));
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("ten").is_err());
    }

    #[test]
    fn landlock_ports_follow_the_mode() {
        let mut spec = NetworkSpec {
            mode: Mode::Restricted,
            allowed_hosts: vec!["a.com".into(), "db.a.com:5432".into()],
            allowed_ports: DEFAULT_PORTS.to_vec(),
            ..NetworkSpec::default()
        };
        assert_eq!(spec.landlock_connect_ports(), Some(vec![53, 80, 443, 5432]));
        spec.mode = Mode::Full;
        assert_eq!(spec.landlock_connect_ports(), None);
        assert!(Mode::None < Mode::Restricted && Mode::Restricted < Mode::Full);
    }
}
