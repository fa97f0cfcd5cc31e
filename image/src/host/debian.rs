//! Debian on the host: `apt-get install`, and the mirror that mmdebstrap bootstraps from.

use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, ensure, Result};

use super::{check_interrupted, find_command, status, Runner};

/// Whether `apt-get install` brings in the packages' recommendations too.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Recommends {
    Install,
    Skip,
}

/// `apt-get install -y` of `packages` (nothing when there are none), with an
/// `apt-get update` and a second try when the first fails: the package lists may be
/// missing or stale on a fresh machine.
pub fn apt_install(runner: &Runner, packages: &[&str], recommends: Recommends) -> Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    let list = packages.join(" ");
    ensure!(
        find_command("apt-get").is_some(),
        "{list} missing, and this host has no apt-get to install it with"
    );
    status("Installing", format!("{list} (apt-get)"));
    let install = || {
        let mut cmd = Command::new("apt-get");
        cmd.args(["install", "-y", "-q"]);
        if recommends == Recommends::Skip {
            cmd.arg("--no-install-recommends");
        }
        cmd.args(packages).env("DEBIAN_FRONTEND", "noninteractive");
        runner.run("apt-get install", cmd)
    };
    if install().is_ok() {
        return Ok(());
    }
    check_interrupted()?;
    let mut update = Command::new("apt-get");
    update.args(["update", "-q"]);
    runner.run("apt-get update", update)?;
    if let Err(e) = install() {
        bail!("could not install {list} ({e:#}): install it with apt-get and run again");
    }
    Ok(())
}

/// [`apt_install`] of the package of each command that is not there: `tools` pairs a
/// command (a name on `PATH`, or an absolute path) with the Debian package that has it.
pub fn install_missing(
    runner: &Runner,
    tools: &[(&str, &str)],
    recommends: Recommends,
) -> Result<()> {
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(command, _)| find_command(command).is_none())
        .map(|(_, package)| *package)
        .collect();
    apt_install(runner, &missing, recommends)
}

/// The mirror arguments for mmdebstrap bootstrapping Debian `suite`: `$variable` (one
/// argument per line); else, on a host of the same suite, its own Debian sources, so that
/// a mirror or proxy configured there applies (deb822 `debian.sources`, else the suite's
/// `deb` lines in `sources.list`); else deb.debian.org with the -updates and -security
/// suites, which is also mmdebstrap's default.
pub fn mirrors(variable: &str, suite: &str) -> Vec<String> {
    if let Some(value) = std::env::var_os(variable) {
        let list: Vec<String> = value
            .to_string_lossy()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        if !list.is_empty() {
            return list;
        }
    }
    let os = fs::read_to_string("/etc/os-release").unwrap_or_default();
    if os.lines().any(|l| l == format!("VERSION_CODENAME={suite}")) {
        let deb822 = Path::new("/etc/apt/sources.list.d/debian.sources");
        if deb822.is_file() {
            return vec![deb822.display().to_string()];
        }
        let lines: Vec<String> = fs::read_to_string("/etc/apt/sources.list")
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("deb ") && l.split_whitespace().any(|w| w.starts_with(suite)))
            .map(str::to_string)
            .collect();
        if !lines.is_empty() {
            return lines;
        }
    }
    vec![
        format!("deb http://deb.debian.org/debian {suite} main"),
        format!("deb http://deb.debian.org/debian {suite}-updates main"),
        format!("deb http://deb.debian.org/debian-security {suite}-security main"),
    ]
}

/// The entries of a list file (package lists): one per line, `#` starts a comment.
pub fn list_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_files_drop_comments_and_blank_lines() {
        let text = "# header\nbash\n\n  python3  # the interpreter\n#x\nnodejs";
        assert_eq!(
            list_lines(text).collect::<Vec<_>>(),
            ["bash", "python3", "nodejs"]
        );
    }

    #[test]
    fn the_mirror_variable_wins() {
        let var = "CODECAGE_XTASK_TEST_MIRROR";
        // No other test reads or writes this variable.
        std::env::set_var(var, "deb http://m/debian bookworm main\n\nhttp://n/\n");
        assert_eq!(
            mirrors(var, "bookworm"),
            ["deb http://m/debian bookworm main", "http://n/"]
        );
        std::env::remove_var(var);
        let fallback = mirrors(var, "no-such-suite");
        assert_eq!(fallback.len(), 3);
        assert!(fallback[2].ends_with("no-such-suite-security main"));
    }
}
