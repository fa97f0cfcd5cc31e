//! The server's one configuration file (`codecage serve --config FILE`, TOML, unknown keys
//! refused): listeners, tokens, caps, the warm pool, the network, MCP, the audit log.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use codecage::knobs::Raw;
use codecage::units::{parse_duration, parse_size};

/// Where the server listens by default.
pub const DEFAULT_SOCKET: &str = "/run/codecage/codecage.sock";

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// `unix:PATH` or `HOST:PORT`, each.
    pub listen: Vec<String>,
    /// The unix socket's group (mode 0660 then); without one the socket is 0600.
    pub socket_group: Option<String>,
    /// Bearer tokens, each with a name (for logs and the audit) and a role.
    pub tokens: Vec<Token>,
    /// What local users of the unix socket may do, by uid (root is always an admin).
    pub unix_peers: Vec<UnixPeer>,
    /// What a unix peer not in `unix_peers` may do.
    pub unix_peers_default: UnlistedPeers,
    /// The installed profiles requests may name, besides the built-in ones (default
    /// /etc/codecage/profiles).
    pub profiles_dir: Option<PathBuf>,
    /// The host directories under which a run's `volumes` may lie (none: requests may
    /// not name volumes). A volume is read-only or copied, never writable onto the host.
    pub volume_roots: Vec<PathBuf>,
    pub limits: Limits,
    /// The network gateway: whether `full` is allowed, the package indexes.
    pub network: crate::gateway::GatewayConfig,
    /// The MCP server (`codecage mcp`, and `/mcp` on the listeners).
    pub mcp: McpConfig,
    /// The audit log: where, what it keeps, for how long, and what a request meets when it
    /// cannot take a record.
    pub audit: crate::audit::AuditConfig,
    /// The warm pool: sandboxes and sessions built ahead of requests, by profile.
    pub pool: super::pool::PoolConfig,
    /// `[cgroups]`: where the sandboxes' cgroups go.
    pub cgroups: CgroupsConfig,
    /// `[cluster]`: session ids that carry their route and node, behind a router that
    /// hashes the route header (deploy/kubernetes/README.md).
    pub cluster: crate::service::cluster::ClusterConfig,
    /// `[e2b]`: the E2B-compatible front end (src/server/e2b/), off unless it has a
    /// `listen`.
    pub e2b: super::e2b::E2bConfig,
}

/// `[cgroups]`: `parent = "auto"` (default) puts the sandboxes' `codecage` parent under the
/// server's own cgroup when that is delegated to it (systemd's `Delegate=yes`, pure cgroup
/// v2), else at the root of the hierarchy; `"delegated"` insists on the former, `"root"` on
/// the latter (src/cgroup/delegation.rs).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CgroupsConfig {
    #[serde(deserialize_with = "parent_mode")]
    pub parent: codecage::delegation::ParentMode,
}

fn parent_mode<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<codecage::delegation::ParentMode, D::Error> {
    codecage::delegation::ParentMode::parse(&String::deserialize(d)?)
        .map_err(serde::de::Error::custom)
}

/// `[mcp]`: what the MCP tools run and how their results are shaped. A client cannot
/// change any of it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// The profile `execute_python` runs under.
    pub profile_python: String,
    /// The profile `execute_node` runs under (TypeScript is accepted with `typescript`).
    pub profile_node: String,
    /// The profile `execute_shell` runs under.
    pub profile_shell: String,
    /// Images are downscaled to at most this many pixels on their longer edge.
    pub image_max_edge: u32,
    /// At most this many images per call (the rest are counted in the text).
    pub max_images: usize,
    /// stdout and stderr shown in a result, at most (bytes); the whole is a resource.
    #[serde(deserialize_with = "size")]
    pub max_text: u64,
    /// Host names (with or without a port) the `/mcp` endpoint answers besides loopback
    /// and `codecage` (the unix socket's): a check against DNS rebinding.
    pub allowed_hosts: Vec<String>,
    /// The largest MCP request (bytes), over stdio and at `/mcp`; a larger one is answered
    /// with a JSON-RPC error that names this limit.
    #[serde(deserialize_with = "size")]
    pub max_request: u64,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            profile_python: "python".into(),
            profile_node: "typescript".into(),
            profile_shell: "bash".into(),
            image_max_edge: 1024,
            max_images: 8,
            max_text: 20 << 10,
            allowed_hosts: Vec::new(),
            max_request: 16 << 20,
        }
    }
}

/// What a caller may do: its role, the profiles it may name, its quotas and the ceilings
/// on the limits it may ask for. A token's (`[[tokens]]`) and a unix peer's
/// (`[[unix_peers]]`, `[unix_peers_default]`) alike, read and applied by one code path.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    #[serde(default)]
    pub role: Role,
    /// The profiles it may name (default: the built-in language profiles, python, node,
    /// typescript and bash; not `ci`). An admin may name any.
    #[serde(default)]
    pub profiles: Option<Vec<String>>,
    /// The most sessions it may hold at once; past it, 429 with Retry-After.
    #[serde(default)]
    pub max_sessions: Option<usize>,
    /// The most runs and session calls it may have running at once; past it, 429.
    #[serde(default)]
    pub max_concurrent_runs: Option<usize>,
    /// The most it may ask of each limit (`memory = "512M"`, `timeout = "60s"`, ...): a
    /// request above one is refused (403), a profile default above one is lowered to it.
    #[serde(default)]
    pub limits: std::collections::BTreeMap<String, Raw>,
}

impl Grant {
    /// Its `limits`, parsed (validated at load, so nothing is dropped here).
    pub fn ceilings(&self) -> Vec<(codecage::knobs::Knob, u64)> {
        self.parse_ceilings("limits").unwrap_or_default()
    }

    /// `section` names where the grant is in the file (`tokens`, `unix_peers`, ...), for
    /// the errors.
    fn parse_ceilings(&self, section: &str) -> Result<Vec<(codecage::knobs::Knob, u64)>, String> {
        self.limits
            .iter()
            .map(|(key, raw)| {
                let knob = codecage::knobs::Knob::from_key(key)
                    .filter(|k| k.requestable())
                    .ok_or_else(|| {
                        format!("{section}.limits: {key:?} is not a limit a request may set")
                    })?;
                let value = knob
                    .from_raw(raw)
                    .map_err(|e| format!("{section}.limits.{key}: {e}"))?;
                Ok((knob, value))
            })
            .collect()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Token {
    pub name: String,
    pub token: String,
    /// Its role, profiles, quotas and ceilings.
    #[serde(flatten)]
    pub grant: Grant,
}

impl Token {
    /// A token with only a name, a secret and a role (the token file's).
    pub fn new(name: &str, token: &str, role: Role) -> Token {
        Token {
            name: name.to_string(),
            token: token.to_string(),
            grant: Grant {
                role,
                ..Grant::default()
            },
        }
    }
}

/// `[[unix_peers]]`: a local user of the unix socket, by the uid the kernel gives for the
/// connection (`SO_PEERCRED`), with the same keys as a token besides. Root (uid 0) is
/// always an admin and is not listed.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnixPeer {
    pub uid: u32,
    /// Its role, profiles, quotas and ceilings.
    #[serde(flatten)]
    pub grant: Grant,
}

/// The sessions a unix peer not in `[[unix_peers]]` may hold at once, unless
/// `[unix_peers_default]` says otherwise.
pub const UNLISTED_PEER_MAX_SESSIONS: usize = 16;
/// The runs and calls such a peer may have running at once, likewise.
pub const UNLISTED_PEER_MAX_CONCURRENT_RUNS: usize = 16;

/// `[unix_peers_default]`: the grant of a unix peer not listed in `[[unix_peers]]`. Keys
/// not given keep their default: the built-in language profiles, 16 sessions, 16 runs at
/// once, the profiles' own maxima; `role` may only be `user`.
#[derive(Debug, Clone)]
pub struct UnlistedPeers(pub Grant);

impl Default for UnlistedPeers {
    fn default() -> Self {
        UnlistedPeers(Grant {
            max_sessions: Some(UNLISTED_PEER_MAX_SESSIONS),
            max_concurrent_runs: Some(UNLISTED_PEER_MAX_CONCURRENT_RUNS),
            ..Grant::default()
        })
    }
}

impl<'de> Deserialize<'de> for UnlistedPeers {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut grant = Grant::deserialize(d)?;
        let default = UnlistedPeers::default().0;
        grant.max_sessions = grant.max_sessions.or(default.max_sessions);
        grant.max_concurrent_runs = grant.max_concurrent_runs.or(default.max_concurrent_runs);
        Ok(UnlistedPeers(grant))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    #[default]
    User,
    Admin,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Sandboxes alive at once: one-shot runs and sessions together.
    pub max_sandboxes: usize,
    /// Sessions alive at once (each also counts as a sandbox).
    pub max_sessions: usize,
    /// How long a request waits for room before it gets 503.
    #[serde(deserialize_with = "duration")]
    pub queue_timeout: Duration,
    /// The largest request body.
    #[serde(deserialize_with = "size")]
    pub max_body: u64,
    /// How long a shutdown waits for running calls before it kills them.
    #[serde(deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// The largest code (or argv, joined) a run or call may send; more is refused (413)
    /// before the request goes further, and its audit record keeps `audit.code_cap` of it.
    #[serde(deserialize_with = "size")]
    pub max_code: u64,
    /// Open connections per listener, at most (lowered to fit under the fd limit); past
    /// it, new connections wait in the kernel's backlog.
    pub max_connections: usize,
    /// A request's head must arrive within this, and so must the next one on a
    /// kept-alive connection (the idle deadline).
    #[serde(deserialize_with = "duration")]
    pub header_timeout: Duration,
    /// A request's body must arrive whole within this of its head.
    #[serde(deserialize_with = "duration")]
    pub body_timeout: Duration,
    /// A write the client does not read for this long ends the connection.
    #[serde(deserialize_with = "duration")]
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_sandboxes: 64,
            max_sessions: 256,
            queue_timeout: Duration::from_secs(5),
            max_body: 32 << 20,
            shutdown_grace: Duration::from_secs(5),
            max_code: 1 << 20,
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
        }
    }
}

fn text_of<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match Raw::deserialize(d)? {
        Raw::Int(n) => n.to_string(),
        Raw::Float(f) => f.to_string(),
        Raw::Text(t) => t,
    })
}

fn duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    parse_duration(&text_of(d)?).map_err(serde::de::Error::custom)
}

pub(crate) fn size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    parse_size(&text_of(d)?).map_err(serde::de::Error::custom)
}

impl ServerConfig {
    /// The file's configuration (see [`ServerConfig::load`]), or the defaults without one.
    pub fn load_or_default(path: Option<&std::path::Path>) -> Result<ServerConfig, String> {
        path.map_or_else(|| Ok(ServerConfig::default()), ServerConfig::load)
    }

    /// Reads the file; errors name it and the key.
    pub fn load(path: &std::path::Path) -> Result<ServerConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the server config {}: {e}", path.display()))?;
        let config: ServerConfig = toml::from_str(&text).map_err(|e| {
            format!(
                "server config {}: {}",
                path.display(),
                e.to_string().trim_end()
            )
        })?;
        config
            .validate()
            .map_err(|e| format!("server config {}: {e}", path.display()))?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), String> {
        self.pool.validate(self.limits.max_sandboxes)?;
        self.network.validate()?;
        if !(16..=8192).contains(&self.mcp.image_max_edge) {
            return Err(format!(
                "mcp.image_max_edge = {}: give 16 to 8192 pixels",
                self.mcp.image_max_edge
            ));
        }
        if self.mcp.max_images > 64 {
            return Err(format!(
                "mcp.max_images = {}: give 0 to 64",
                self.mcp.max_images
            ));
        }
        if !(256..=(16 << 20)).contains(&self.mcp.max_text) {
            return Err(format!(
                "mcp.max_text = {}: give 256 bytes to 16M",
                self.mcp.max_text
            ));
        }
        for (i, t) in self.tokens.iter().enumerate() {
            t.grant
                .parse_ceilings("tokens")
                .map_err(|e| format!("the token named {:?}: {e}", t.name))?;
            if self.tokens[..i].iter().any(|u| u.name == t.name) {
                return Err(format!(
                    "two tokens are named {:?}: a name owns sessions, so each must be its own",
                    t.name
                ));
            }
            if t.token.len() < 16 {
                return Err(format!(
                    "the token named {:?} is {} characters: use 16 or more (e.g. `openssl rand -hex 32`)",
                    t.name,
                    t.token.len()
                ));
            }
        }
        for (i, p) in self.unix_peers.iter().enumerate() {
            if p.uid == 0 {
                return Err(
                    "unix_peers: uid 0 is root, always an admin; list only other uids".into(),
                );
            }
            if self.unix_peers[..i].iter().any(|q| q.uid == p.uid) {
                return Err(format!(
                    "unix_peers: uid {} is listed twice: a uid owns sessions, so list each once",
                    p.uid
                ));
            }
            p.grant
                .parse_ceilings("unix_peers")
                .map_err(|e| format!("the unix peer uid {}: {e}", p.uid))?;
        }
        let unlisted = &self.unix_peers_default.0;
        if unlisted.role != Role::User {
            return Err("unix_peers_default.role = \"admin\": only \"user\" is allowed here; list an admin's uid in [[unix_peers]]".into());
        }
        unlisted.parse_ceilings("unix_peers_default")?;
        let l = &self.limits;
        if l.max_connections == 0
            || [l.header_timeout, l.body_timeout, l.write_timeout].contains(&Duration::ZERO)
        {
            return Err("limits.max_connections, header_timeout, body_timeout and write_timeout must be more than 0".into());
        }
        if self.limits.max_sandboxes == 0 || self.limits.max_sessions == 0 {
            return Err("limits.max_sandboxes and limits.max_sessions must be 1 or more".into());
        }
        self.cluster.validate()?;
        self.audit.validate()
    }

    /// Reads tokens from a file: one per line, `NAME:TOKEN` or a bare token (named
    /// "default"), `#` comments; `NAME:TOKEN:admin` gives the admin role.
    pub fn add_token_file(&mut self, path: &std::path::Path) -> Result<(), String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let parts: Vec<&str> = line.split(':').collect();
            let (name, token, role) = match parts[..] {
                [token] => ("default", token, Role::User),
                [name, token] => (name, token, Role::User),
                [name, token, "admin"] => (name, token, Role::Admin),
                [name, token, "user"] => (name, token, Role::User),
                _ => {
                    return Err(format!(
                        "{} line {}: use TOKEN, NAME:TOKEN or NAME:TOKEN:admin",
                        path.display(),
                        n + 1
                    ))
                }
            };
            self.tokens.push(Token::new(name, token, role));
        }
        self.validate()
    }
}

/// A listener address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Unix(PathBuf),
    Tcp(String),
}

impl Listen {
    pub fn parse(text: &str) -> Result<Listen, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            if !path.starts_with('/') {
                return Err(format!(
                    "{text:?}: give an absolute socket path (unix:/run/codecage/codecage.sock)"
                ));
            }
            return Ok(Listen::Unix(PathBuf::from(path)));
        }
        if text.parse::<std::net::SocketAddr>().is_ok()
            || text
                .rsplit_once(':')
                .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            return Ok(Listen::Tcp(text.to_string()));
        }
        Err(format!(
            "{text:?} is not a listener: use unix:PATH or HOST:PORT"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_and_refuses_unknown_keys_and_short_tokens() {
        let c: ServerConfig = toml::from_str(
            "listen = [\"unix:/tmp/x.sock\"]\n[[tokens]]\nname = \"ci\"\ntoken = \"0123456789abcdef0\"\nrole = \"admin\"\n[limits]\nqueue_timeout = \"2s\"\nmax_body = \"1M\"\n",
        )
        .unwrap();
        assert_eq!(c.tokens[0].grant.role, Role::Admin);
        assert_eq!(c.limits.queue_timeout, Duration::from_secs(2));
        assert!(toml::from_str::<ServerConfig>("colour = 1").is_err());
        let mut short = ServerConfig::default();
        short.tokens.push(Token::new("x", "short", Role::User));
        assert!(short.validate().unwrap_err().contains("16 or more"));
        assert_eq!(
            Listen::parse("unix:/a.sock").unwrap(),
            Listen::Unix("/a.sock".into())
        );
        assert_eq!(
            Listen::parse("127.0.0.1:8080").unwrap(),
            Listen::Tcp("127.0.0.1:8080".into())
        );
        assert!(Listen::parse("nowhere").is_err());
    }

    fn refused(text: &str) -> String {
        match toml::from_str::<ServerConfig>(text) {
            Err(e) => e.to_string(),
            Ok(c) => c.validate().unwrap_err(),
        }
    }

    #[test]
    fn unix_peers_read_like_tokens_and_their_errors_name_the_key() {
        let c: ServerConfig = toml::from_str(
            "[[unix_peers]]\nuid = 1000\nrole = \"admin\"\nprofiles = [\"ci\"]\nmax_sessions = 2\n\
             [unix_peers.limits]\nmemory = \"1G\"\n\
             [unix_peers_default]\nmax_sessions = 4\n",
        )
        .unwrap();
        c.validate().unwrap();
        let peer = &c.unix_peers[0];
        assert_eq!((peer.uid, peer.grant.role), (1000, Role::Admin));
        assert_eq!(peer.grant.max_sessions, Some(2));
        assert_eq!(peer.grant.ceilings().len(), 1);
        assert_eq!(c.unix_peers_default.0.max_sessions, Some(4));
        assert_eq!(
            c.unix_peers_default.0.max_concurrent_runs,
            Some(UNLISTED_PEER_MAX_CONCURRENT_RUNS)
        );

        // Each refusal names the key (unknown keys too, in a token or a peer, whose keys
        // are shared) and what is allowed.
        let cases: &[(&str, &[&str])] = &[
            (
                "[[unix_peers]]\nuid = 1000\nmax_session = 1\n",
                &["max_session"],
            ),
            (
                "[[tokens]]\nname = \"a\"\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\ncolour = 1\n",
                &["colour"],
            ),
            ("[unix_peers_default]\nuid = 5\n", &["uid"]),
            ("[[unix_peers]]\nuid = 0\n", &["uid 0 is root"]),
            (
                "[[unix_peers]]\nuid = 7\n[[unix_peers]]\nuid = 7\n",
                &["uid 7 is listed twice"],
            ),
            (
                "[[unix_peers]]\nuid = 7\n[unix_peers.limits]\ncolour = 1\n",
                &["unix peer uid 7", "unix_peers.limits: \"colour\""],
            ),
            (
                "[[unix_peers]]\nuid = 7\n[unix_peers.limits]\nmemory = \"lots\"\n",
                &["unix_peers.limits.memory"],
            ),
            (
                "[unix_peers_default]\nrole = \"admin\"\n",
                &["unix_peers_default.role", "only \"user\""],
            ),
            (
                "[unix_peers_default.limits]\npids = -1\n",
                &["unix_peers_default.limits.pids"],
            ),
        ];
        for (text, words) in cases {
            let e = refused(text);
            assert!(words.iter().all(|w| e.contains(w)), "{text}: {e}");
        }
    }
}
