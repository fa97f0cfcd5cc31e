//! `codecage-full`: every command of `codecage`, the server's (serve, mcp, audit, image,
//! openapi) included. `codecage` executes it for those, with the same arguments; it runs
//! the others itself, without loading this binary's server code (see `cli::full`).

fn main() {
    // A library user's program, this one included, can be a sandbox's init.
    codecage::dispatch_init();
    std::process::exit(codecage::cli::main_full())
}
