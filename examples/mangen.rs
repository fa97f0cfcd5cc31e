//! Writes codecage's man pages, generated from the CLI's clap definitions by clap_mangen,
//! into the directory given (`cargo xtask dist` packs them): codecage.1 and one
//! `codecage-SUB.1` per subcommand, nested ones as `codecage-session-create.1`.
//!
//! The CLI lives in the binary, not the library, so this example compiles the binary's
//! modules as its own (the same files as src/main.rs declares); clap_mangen is a
//! dev-dependency and never reaches the binary.
// The binary's handlers are compiled but only the argument definitions are used here.
#![allow(dead_code)]

#[path = "../src/audit/mod.rs"]
mod audit;
#[path = "../src/cli/mod.rs"]
mod cli;
#[path = "../src/client.rs"]
mod client;
#[path = "../src/gateway/mod.rs"]
mod gateway;
#[path = "../src/host_config.rs"]
mod host_config;
#[path = "../src/server/mod.rs"]
mod server;
#[path = "../src/service/mod.rs"]
mod service;

use std::path::PathBuf;

use clap::CommandFactory as _;

fn main() {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: mangen DIR");
        std::process::exit(2);
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("mangen: creating {}: {e}", dir.display());
        std::process::exit(1);
    }
    // One page per command and subcommand, named as clap_mangen names them
    // (codecage.1, codecage-session.1, codecage-session-create.1, ...).
    if let Err(e) = clap_mangen::generate_to(cli::Cli::command(), &dir) {
        eprintln!("mangen: writing the man pages to {}: {e}", dir.display());
        std::process::exit(1);
    }
}
