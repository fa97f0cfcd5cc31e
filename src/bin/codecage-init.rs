//! `codecage-init`: the sandbox's pid 1, and nothing else. The launcher executes it in
//! the new namespaces instead of the whole `codecage` binary (the server, MCP, the gateway,
//! TLS and SQLite), so the second exec of every run loads a small program. It links only
//! the library's sandbox side; started by anything but codecage's launcher, it refuses.

fn main() {
    codecage::dispatch_init();
    eprintln!(
        "codecage-init: the sandbox init, started only by codecage's launcher (run `codecage run ...`)"
    );
    std::process::exit(2)
}
