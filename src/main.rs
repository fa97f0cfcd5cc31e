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
    use_init_beside_us();
    std::process::exit(cli::main())
}

/// The sandboxes' init: `codecage-init` beside this binary (as cargo builds them) or in
/// `../libexec/codecage/` (as the Debian package installs it), else this binary itself,
/// which can be an init too. A small init makes every run's second exec cheap.
fn use_init_beside_us() {
    let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.to_path_buf()))
    else {
        return;
    };
    let found = [
        dir.join("codecage-init"),
        dir.join("../libexec/codecage/codecage-init"),
    ]
    .into_iter()
    .find(|p| p.is_file());
    if let Some(init) = found {
        codecage::spec::set_default_init_exe(init);
    }
}
