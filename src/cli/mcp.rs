//! `codecage mcp`: the MCP server over stdio, for an MCP client that starts it.

use std::path::PathBuf;

use clap::Args;

use crate::server::{Caller, ServerConfig};

#[derive(Args)]
pub struct McpArgs {
    /// The profile execute_python runs under (default: python).
    #[arg(long, value_name = "NAME")]
    profile_python: Option<String>,
    /// The profile execute_node runs under (default: typescript).
    #[arg(long, value_name = "NAME")]
    profile_node: Option<String>,
    /// The profile execute_shell runs under (default: bash).
    #[arg(long, value_name = "NAME")]
    profile_shell: Option<String>,
    /// Images are downscaled to at most this many pixels on a side (default: 1024).
    #[arg(long, value_name = "PIXELS")]
    image_max_edge: Option<u32>,
    /// At most this many images per call (default: 8).
    #[arg(long, value_name = "N")]
    max_images: Option<usize>,
    /// A server configuration file (TOML): its [mcp], [limits] and profiles_dir apply.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

pub fn main(args: McpArgs) -> i32 {
    let fail = |message: String| {
        eprintln!("codecage: {message}");
        125
    };
    let mut config = match ServerConfig::load_or_default(args.config.as_deref()) {
        Ok(config) => config,
        Err(e) => return fail(e),
    };
    let mcp = &mut config.mcp;
    if let Some(p) = args.profile_python {
        mcp.profile_python = p;
    }
    if let Some(p) = args.profile_node {
        mcp.profile_node = p;
    }
    if let Some(p) = args.profile_shell {
        mcp.profile_shell = p;
    }
    if let Some(edge) = args.image_max_edge {
        mcp.image_max_edge = edge;
    }
    if let Some(n) = args.max_images {
        mcp.max_images = n;
    }
    if let Err(e) = config.validate() {
        return fail(e);
    }
    // stdout is the protocol's: logs go to stderr, quiet unless RUST_LOG asks.
    if std::env::var_os("RUST_LOG").is_none() {
        std::env::set_var("RUST_LOG", "warn");
    }
    super::serve::init_logging();
    // Through sudo the client is the invoking user; else whoever runs this process.
    let uid = codecage::caller::Caller::from_sudo()
        .map_or_else(|| nix::unistd::getuid().as_raw(), |c| c.uid);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(format!("cannot start the async runtime: {e}")),
    };
    let caller = Caller::unix(uid, &config);
    match runtime.block_on(crate::server::mcp::serve_stdio(config, caller)) {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}
