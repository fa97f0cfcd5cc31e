//! `cargo xtask test`: the project's test command (README.md and .ci/run). In order:
//! install the Debian packages the tests run inside the sandbox; build the default image
//! (`cargo xtask rootfs`, instant when the recipe is unchanged); run every unit and
//! integration test natively (this host's cgroup layout); then the integration tests again
//! in the cgroup v2 VM (`cargo xtask vm-test`), so both layouts are proven on every change.

use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::host::{install_missing, Recommends, Runner};

/// Run the unit and integration tests (root)
///
/// Installs the Debian packages the tests use inside the sandbox (procps, python3, nodejs)
/// when missing, builds the default image (cargo xtask rootfs), runs the unit and
/// integration tests of the workspace (cargo nextest when installed, else cargo test), then
/// the integration tests in the cgroup v2 VM (cargo xtask vm-test; skipped with
/// --native-only). Must run as root: the tests build real sandboxes.
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Skip the run in the cgroup v2 VM
    #[arg(long)]
    native_only: bool,
    /// Passed on to cargo nextest run (or cargo test)
    #[arg(last = true, value_name = "NEXTEST-ARGS")]
    nextest_args: Vec<String>,
}

/// Programs the integration tests run inside a sandbox with the host rootfs, and the
/// Debian package of each.
const NEEDED: &[(&str, &str)] = &[
    ("/usr/bin/bash", "bash"),
    ("/usr/bin/ps", "procps"),
    ("/usr/bin/python3", "python3"),
    ("/usr/bin/node", "nodejs"),
    ("/usr/bin/ldd", "libc-bin"),
];

pub fn test(args: &Args) -> Result<i32> {
    if !crate::host::is_root() {
        bail!(
            "the tests build real sandboxes and must run as root (try: sudo -E cargo xtask test)"
        );
    }
    install_missing(&Runner::terminal(), NEEDED, Recommends::Skip)?;
    eprintln!("xtask: building the default image (cargo xtask rootfs)");
    let built = crate::rootfs::rootfs(&crate::rootfs::Args::default())?;
    if built != 0 {
        bail!("the default image could not be built (cargo xtask rootfs exited {built})");
    }
    let nextest = Command::new("cargo")
        .args(["nextest", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    let mut cmd = Command::new("cargo");
    if nextest {
        cmd.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        eprintln!("xtask: cargo-nextest not found, using cargo test");
        cmd.args(["test", "--workspace", "--no-fail-fast"]);
    }
    cmd.args(&args.nextest_args);
    eprintln!("xtask: {cmd:?}");
    let native = cmd.status().context("running cargo")?.code().unwrap_or(1);
    if args.native_only {
        return Ok(native);
    }
    // The image lives on this host, not in the VM: its tests run natively only; so do the
    // server's (its clients, curl among them, are the host's).
    eprintln!("xtask: the integration tests in the cgroup v2 VM (cargo xtask vm-test)");
    let skips = [
        "--skip",
        "image::",
        "--skip",
        "server::",
        "--skip",
        "network::",
    ];
    let vm_args = crate::vm::lane::TestArgs::new(skips.map(String::from).into());
    let vm = crate::vm::lane::vm_test(&vm_args)?;
    eprintln!("xtask: native tests exited {native}, VM tests exited {vm}");
    Ok(if native != 0 { native } else { vm })
}

#[cfg(test)]
mod tests {
    use crate::{tests::parse, Task};

    #[test]
    fn parses_arguments() {
        let Ok(Task::Test(a)) = parse(&["test", "--native-only", "--", "-E", "x"]) else {
            panic!()
        };
        assert!(a.native_only);
        assert_eq!(a.nextest_args, ["-E", "x"]);
        let Ok(Task::Test(a)) = parse(&["test"]) else {
            panic!()
        };
        assert!(!a.native_only && a.nextest_args.is_empty());
        assert!(parse(&["test", "extra"]).is_err());
        assert!(parse(&["test", "--bogus"]).is_err());
    }
}
