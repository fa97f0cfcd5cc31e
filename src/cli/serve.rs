//! `codecage serve`: the local API.

use std::path::PathBuf;

use clap::Args;

use crate::server::{config::DEFAULT_SOCKET, Listen, ServerConfig};

#[derive(Args)]
pub struct ServeArgs {
    /// Where to listen: unix:PATH or HOST:PORT (a TCP listener needs a token). Repeatable.
    /// Default: unix:/run/codecage/codecage.sock.
    #[arg(long, value_name = "unix:PATH|HOST:PORT")]
    listen: Vec<String>,
    /// Bearer tokens, one per line: TOKEN, NAME:TOKEN or NAME:TOKEN:admin.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The server's configuration (TOML): listeners, tokens, caps.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Keep N sandboxes of PROFILE built ahead of runs (0: none). Repeatable; replaces the
    /// config's `[pool] runs` (default: python=2).
    #[arg(long = "pool", value_name = "PROFILE=N")]
    pool: Vec<String>,
    /// Keep N sessions of PROFILE started ahead of their creation. Repeatable; replaces
    /// the config's `[pool] sessions` (default: python=1).
    #[arg(long = "session-pool", value_name = "PROFILE=N")]
    session_pool: Vec<String>,
}

/// `PROFILE=N` flags into a map.
fn pool_flags(
    flag: &str,
    items: &[String],
) -> Result<std::collections::BTreeMap<String, usize>, String> {
    items
        .iter()
        .map(|item| {
            let (name, n) = item.split_once('=').ok_or_else(|| {
                format!("--{flag} {item}: give PROFILE=N, e.g. --{flag} python=2")
            })?;
            let n: usize = n
                .parse()
                .map_err(|_| format!("--{flag} {item}: N must be a number (0 for none)"))?;
            Ok((name.to_string(), n))
        })
        .collect()
}

pub fn main(args: ServeArgs) -> i32 {
    let fail = |message: String| {
        eprintln!("codecage: {message}");
        125
    };
    let mut config = match ServerConfig::load_or_default(args.config.as_deref()) {
        Ok(config) => config,
        Err(e) => return fail(e),
    };
    if !args.pool.is_empty() {
        match pool_flags("pool", &args.pool) {
            Ok(runs) => config.pool.runs = runs,
            Err(e) => return fail(e),
        }
    }
    if !args.session_pool.is_empty() {
        match pool_flags("session-pool", &args.session_pool) {
            Ok(sessions) => config.pool.sessions = sessions,
            Err(e) => return fail(e),
        }
    }
    if let Err(e) = config.pool.validate(config.limits.max_sandboxes) {
        return fail(e);
    }
    if let Some(path) = &args.token_file {
        if let Err(e) = config.add_token_file(path) {
            return fail(e);
        }
    }
    let mut texts = args.listen.clone();
    if texts.is_empty() {
        texts = config.listen.clone();
    }
    if texts.is_empty() {
        texts.push(format!("unix:{DEFAULT_SOCKET}"));
    }
    let listens: Result<Vec<Listen>, String> = texts.iter().map(|t| Listen::parse(t)).collect();
    let listens = match listens {
        Ok(l) => l,
        Err(e) => return fail(format!("--listen {e}")),
    };
    init_logging();
    // Before any thread or child: with a delegated cgroup the server moves itself (every
    // thread) into its `supervisor` leaf, and its sandboxes go beside it.
    match codecage::delegation::place_server(config.cgroups.parent) {
        Ok(placement) => tracing::info!(
            parent = %placement.parent.display(),
            reason = %placement.reason,
            "sandbox cgroups"
        ),
        Err(e) => return fail(e),
    }
    crate::gateway::Gateway::install(config.network.clone());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(format!("cannot start the async runtime: {e}")),
    };
    match runtime.block_on(crate::server::serve(config, listens)) {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// One line per event on stderr (journald takes it from there); RUST_LOG filters. A line
/// that cannot be written (stderr's reader gone: journald restarted, a pipe closed) is
/// dropped: tracing-subscriber's report of it is an `eprintln!`, which panics on that same
/// broken stderr, in whatever thread logged (a request's, or main's as the server stops).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_target(false)
        .log_internal_errors(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    use crate::host_config::HostConfig;
    use crate::server::ServerConfig;

    /// The file with its examples (`# key = value`, `# [section]`) made live.
    fn uncommented(text: &str) -> String {
        text.lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(rest)
                    if rest.starts_with('[')
                        || rest
                            .split_once(" = ")
                            .is_some_and(|(key, _)| !key.is_empty() && !key.contains(' ')) =>
                {
                    rest
                }
                _ => line,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The package's /etc/codecage/server.toml (packaging/debian/) is a valid server
    /// config as shipped and with every example it shows switched on.
    #[test]
    fn the_packaged_server_config_parses_with_and_without_its_examples() {
        let text = include_str!("../../packaging/debian/server.toml");
        for (what, text) in [
            ("as shipped", text.to_string()),
            ("uncommented", uncommented(text)),
        ] {
            let config: ServerConfig =
                toml::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}"));
            config.validate().unwrap_or_else(|e| panic!("{what}: {e}"));
            if what == "uncommented" {
                assert_eq!(config.tokens.len(), 1);
                assert_eq!(config.limits.max_sessions, 256);
                assert_eq!(config.pool.runs.get("python"), Some(&2));
                assert_eq!(
                    config.cgroups.parent,
                    codecage::delegation::ParentMode::Auto
                );
            }
        }
    }

    /// `[cgroups] parent` takes the three modes; anything else is refused with them named.
    #[test]
    fn the_cgroup_parent_mode_is_one_of_three() {
        use codecage::delegation::ParentMode;
        for (text, mode) in [
            ("auto", ParentMode::Auto),
            ("delegated", ParentMode::Delegated),
            ("root", ParentMode::Root),
        ] {
            let config: ServerConfig =
                toml::from_str(&format!("[cgroups]\nparent = {text:?}\n")).unwrap();
            assert_eq!(config.cgroups.parent, mode);
        }
        let e = toml::from_str::<ServerConfig>("[cgroups]\nparent = \"unit\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"unit\"") && e.contains("\"auto\", \"delegated\" or \"root\""),
            "{e}"
        );
    }

    /// The package's /etc/codecage/config.toml: the CLI's host config, the same way.
    #[test]
    fn the_packaged_host_config_parses_with_and_without_its_examples() {
        let text = include_str!("../../packaging/debian/config.toml");
        let shipped: HostConfig = toml::from_str(text).unwrap();
        assert!(shipped.audit.is_none() && !shipped.network.full);
        let live: HostConfig = toml::from_str(&uncommented(text)).unwrap();
        let audit = live.audit.expect("the [audit] example");
        assert_eq!(audit.path, std::path::Path::new(crate::audit::DEFAULT_PATH));
        assert_eq!(live.network.python_index(), "https://pypi.org/simple/");
    }
}
