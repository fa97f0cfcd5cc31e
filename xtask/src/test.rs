//! `cargo xtask test`: the project's test command (README.md). Installs the Debian packages
//! the integration tests run inside the sandbox, then runs every unit and integration test
//! of the workspace as root.

use std::process::Command;

use anyhow::{bail, Context, Result};

pub const USAGE: &str = "\
usage: cargo xtask test [-- NEXTEST-ARGS...]

Runs the unit and integration tests of the workspace (cargo nextest when installed, else
cargo test). Must run as root: the integration tests build real sandboxes. Installs the
Debian packages the tests use inside the sandbox (procps, python3, nodejs) when missing.";

/// Programs the integration tests run inside a sandbox with the host rootfs, and the
/// Debian package of each.
const NEEDED: &[(&str, &str)] = &[
    ("/usr/bin/bash", "bash"),
    ("/usr/bin/ps", "procps"),
    ("/usr/bin/python3", "python3"),
    ("/usr/bin/node", "nodejs"),
    ("/usr/bin/ldd", "libc-bin"),
];

pub fn test(args: &[String]) -> Result<i32> {
    let extra: &[String] = match args.split_first() {
        Some((first, rest)) if first == "--" => rest,
        Some((first, _)) => bail!("unexpected argument {first:?}\n\n{USAGE}"),
        None => &[],
    };
    if !nix_is_root() {
        bail!(
            "the tests build real sandboxes and must run as root (try: sudo -E cargo xtask test)"
        );
    }
    install_missing()?;
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
    cmd.args(extra);
    eprintln!("xtask: {cmd:?}");
    let status = cmd.status().context("running cargo")?;
    Ok(status.code().unwrap_or(1))
}

fn nix_is_root() -> bool {
    // The effective uid, from the kernel itself (xtask has no libc dependency).
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

fn install_missing() -> Result<()> {
    let missing: Vec<&str> = NEEDED
        .iter()
        .filter(|(path, _)| !std::path::Path::new(path).exists())
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    let install = |update: bool| -> Result<bool> {
        if update {
            Command::new("apt-get")
                .args(["update", "-q"])
                .status()
                .context("apt-get update")?;
        }
        let status = Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .context("apt-get install")?;
        Ok(status.success())
    };
    if !install(false)? && !install(true)? {
        bail!(
            "could not install {}: install them with apt-get and rerun",
            missing.join(" ")
        );
    }
    Ok(())
}
