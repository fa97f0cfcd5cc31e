fn main() {
    // Before anything else: if this process is a sandbox's init, it never returns.
    codecage::sandbox::dispatch_init();
    std::process::exit(codecage::cli::main())
}
