//! The `codecage` command. The library does the work; `cli` parses and prints. This binary
//! runs sandboxes and talks to a server; the server's own commands are in `codecage-full`
//! (src/bin/codecage-full.rs), which it executes for them (see `cli::full`).

fn main() {
    // Before anything else: if this process is a sandbox's init, it never returns.
    codecage::dispatch_init();
    std::process::exit(codecage::cli::main())
}
