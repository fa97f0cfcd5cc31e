//! `codecage-full`: every command of `codecage`, the server's (serve, mcp, audit, image,
//! openapi) included, from the same modules as src/main.rs. `codecage` executes it for
//! those, with the same arguments; it runs the others itself, without this binary's
//! server code (see `cli::full`).

#[path = "../audit/mod.rs"]
mod audit;
#[path = "../cli/mod.rs"]
mod cli;
#[path = "../client.rs"]
mod client;
#[path = "../gateway/mod.rs"]
mod gateway;
#[path = "../host_config.rs"]
mod host_config;
#[path = "../server/mod.rs"]
mod server;
#[path = "../service/mod.rs"]
mod service;

fn main() {
    // A library user's program, this one included, can be a sandbox's init.
    codecage::dispatch_init();
    std::process::exit(cli::main_full())
}
