//! `codecage-init`: the sandbox's pid 1, and nothing else. The launcher executes it in
//! the new namespaces instead of the whole `codecage` binary (the server, MCP, the gateway,
//! TLS and SQLite), so the second exec of every run loads a small program. It links only
//! the library's sandbox side; started by anything but codecage's launcher, it refuses.
//!
//! With glibc it starts at C's `main`, without Rust's runtime set-up (`lang_start`): that
//! set-up's stack-overflow handler reads /proc/self/maps to find the main thread's stack
//! and maps an alternate signal stack, some 45 us of every sandbox's start, for a process
//! whose own set-up resets every signal disposition and whose frames are small. glibc
//! hands argv to the standard library through `.init_array`, so `std::env::args` works as
//! before; other C libraries (musl) fill it only in `lang_start`, so there the init keeps
//! Rust's `main`. A panic ends it with 101 either way (an unwind out of `extern "C"` would
//! abort instead).

// Not in the test build: there the harness brings its own main.
#![cfg_attr(all(target_env = "gnu", not(test)), no_main)]

fn init() -> i32 {
    let refused = std::panic::catch_unwind(|| {
        codecage::dispatch_init();
        eprintln!(
            "codecage-init: the sandbox init, started only by codecage's launcher (run `codecage run ...`)"
        );
        2
    });
    refused.unwrap_or(101)
}

#[cfg(all(target_env = "gnu", not(test)))]
#[no_mangle]
pub extern "C" fn main(_argc: std::ffi::c_int, _argv: *const *const std::ffi::c_char) -> i32 {
    init()
}

#[cfg(any(not(target_env = "gnu"), test))]
fn main() {
    std::process::exit(init())
}
