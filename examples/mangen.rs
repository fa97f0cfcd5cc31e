//! Writes codecage's man pages, generated from the CLI's clap definitions by clap_mangen,
//! into the directory given (`cargo xtask dist` packs them): codecage.1 and one
//! `codecage-SUB.1` per subcommand, nested ones as `codecage-session-create.1`.
//!
//! The CLI is the library's `cli` module (feature `cli`; both binaries call it), which
//! hands over its clap tree; clap_mangen is a dev-dependency and never reaches a binary.

use std::path::PathBuf;

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
    if let Err(e) = clap_mangen::generate_to(codecage::cli::command(), &dir) {
        eprintln!("mangen: writing the man pages to {}: {e}", dir.display());
        std::process::exit(1);
    }
}
