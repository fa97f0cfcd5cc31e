//! The `codecage` command. The library does the work; `cli` parses and prints. This binary
//! runs sandboxes and talks to a server; the server's own commands are in `codecage-full`
//! (src/bin/codecage-full.rs), which compiles the same modules and which this one executes
//! for them (see `cli::full`).
// What only `codecage-full` calls (the server, MCP, the audit reader, the images) is
// compiled here but never reached, so never built into this binary; codecage-full's build
// reports dead code.
#![allow(dead_code)]

mod audit;
mod cli;
mod client;
mod gateway;
mod host_config;
mod server;
mod service;

fn main() {
    // Before anything else: if this process is a sandbox's init, it never returns.
    codecage::dispatch_init();
    std::process::exit(cli::main())
}
