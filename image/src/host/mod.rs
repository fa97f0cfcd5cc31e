//! What a build needs of the host, in one place (the rootfs build here, and xtask's
//! tasks):
//!
//! * [`signals`]: SIGINT, SIGTERM and SIGHUP turned into a flag that the wait loops poll.
//! * [`command`]: tools in process groups of their own that die with the build, and
//!   [`Runner`], which runs them with their output in a log, polling for interrupts.
//! * [`steps`]: a build's numbered steps, with progress lines and, when one fails, the
//!   output of its tools.
//! * [`debian`]: `apt-get install`, and the Debian mirror for mmdebstrap.
//! * [`tree`]: removing directory trees without ever deleting through a mount point,
//!   temporary trees removed on every failure path, leftovers of processes that are gone.
//!
//! and below, the small things every task uses: root, commands on `PATH`,
//! shell quoting, status lines.

pub mod command;
pub mod debian;
pub mod signals;
pub mod steps;
pub mod tree;

pub use command::{kill_processes_rooted_in, own_group_and_die_with_parent, signal_group, Runner};
pub use debian::{install_missing, Recommends};
pub use signals::{check_interrupted, install_signal_handlers, interrupted};
pub use steps::Steps;
pub use tree::{mounts_below, orphans, remove_stale, remove_tree, TempTree};

use std::ffi::OsStr;
use std::fmt::Display;
use std::fs;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The full path of an executable in `$PATH` or the sbin directories (which
/// are not in a non-root `$PATH` on Debian); `name` may be an absolute path too.
pub fn find_command(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let executable = |p: &Path| {
        fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.starts_with('/') {
        return executable(Path::new(name)).then(|| PathBuf::from(name));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| executable(p))
}

/// Quote a string for a POSIX shell (for messages and logs).
pub fn shell_quote(s: impl AsRef<OsStr>) -> String {
    let s = s.as_ref().to_string_lossy();
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        return s.into_owned();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// A command line for messages. Long arguments (inline scripts) are elided.
pub fn display_command(cmd: &Command) -> String {
    let mut s = shell_quote(cmd.get_program());
    for arg in cmd.get_args() {
        s.push(' ');
        let a = arg.to_string_lossy();
        if a.contains('\n') {
            s.push_str("'<script>'");
        } else {
            s.push_str(&shell_quote(arg));
        }
    }
    s
}

/// Seconds as `12.3s` (`0.012s` below a second).
pub fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        format!("{s:.3}s")
    } else {
        format!("{s:.1}s")
    }
}

fn use_color() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// A cargo-style status line on stderr: a right-aligned verb, then `msg`.
pub fn status(verb: &str, msg: impl Display) {
    if use_color() {
        eprintln!("\x1b[1;32m{verb:>12}\x1b[0m {msg}");
    } else {
        eprintln!("{verb:>12} {msg}");
    }
}

pub fn warn(msg: impl Display) {
    if use_color() {
        eprintln!("\x1b[1;33mwarning\x1b[0m: {msg}");
    } else {
        eprintln!("warning: {msg}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting() {
        assert_eq!(shell_quote("a-b/c.d=e"), "a-b/c.d=e");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo\nx", "a b"]);
        assert_eq!(display_command(&cmd), "sh -c '<script>' 'a b'");
    }

    #[test]
    fn commands_by_name_or_path() {
        assert_eq!(find_command("sh").map(|p| p.is_absolute()), Some(true));
        assert_eq!(find_command("/bin/sh"), Some(PathBuf::from("/bin/sh")));
        let dir = TempTree::create_in(&std::env::temp_dir(), "codecage-image-find-test-").unwrap();
        let plain = dir.path().join("plain");
        fs::write(&plain, "").unwrap();
        assert_eq!(find_command(&plain.to_string_lossy()), None);
        assert_eq!(find_command("codecage-no-such-command"), None);
    }
}
