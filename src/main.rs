//! The `codecage` command. The library does the work; `cli` parses and prints.

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
