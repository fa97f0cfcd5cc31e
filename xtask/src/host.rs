//! What several tasks need of the host: root, Debian packages, interrupts turned into a
//! flag the wait loops poll, child process groups that die with xtask, and removing
//! directory trees without ever deleting through a mount point.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{bail, Context, Result};

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `apt-get install -y` of `packages`, with an `apt-get update` and a second try when the
/// first fails (stale package lists on a fresh machine).
pub fn apt_install(packages: &[&str]) -> Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    eprintln!("    Installing {} (apt-get)", packages.join(" "));
    let install = || -> Result<bool> {
        Ok(Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .context("running apt-get install")?
            .success())
    };
    if install()? {
        return Ok(());
    }
    Command::new("apt-get")
        .args(["update", "-q"])
        .status()
        .context("running apt-get update")?;
    if !install()? {
        bail!(
            "could not install {}: install them with apt-get and run again",
            packages.join(" ")
        );
    }
    Ok(())
}

/// Mount points at or below `dir` in our mount namespace, deepest first.
pub fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let digit = |c: u8| u32::from(c - b'0');
            out.push((digit(b[i + 1]) * 64 + digit(b[i + 2]) * 8 + digit(b[i + 3])) as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `rm -rf path` (a directory or a file), but never through a mount point.
///
/// A chroot build killed halfway can leave /proc, /sys or /dev mounted inside its tree;
/// deleting through such a bind mount would delete the host's own files. Builds mount in
/// private mount namespaces, so this should find nothing, but removing a tree is too
/// dangerous to rely on that: what is mounted below is detached, and if anything stays,
/// nothing is removed.
pub fn remove_tree(path: &Path) -> Result<()> {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return Ok(());
    };
    for m in mounts_below(path) {
        if let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) {
            // SAFETY: plain syscall with a valid NUL-terminated path.
            unsafe {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
    let left = mounts_below(path);
    if !left.is_empty() {
        bail!(
            "not removing {}: still mounted below it: {left:?}",
            path.display()
        );
    }
    if meta.is_dir() {
        fs::remove_dir_all(path).with_context(|| format!("removing {}", path.display()))
    } else {
        fs::remove_file(path).with_context(|| format!("removing {}", path.display()))
    }
}

// ---- commands ---------------------------------------------------------------------

/// The full path of an executable in `$PATH` or the sbin directories (which
/// are not in a non-root `$PATH` on Debian).
pub fn find_command(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
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

// ---- interrupts ---------------------------------------------------------------------

/// The signal (SIGINT, SIGTERM, SIGHUP) that asked us to stop, 0 if none.
static INTERRUPT: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    INTERRUPT.store(sig, Ordering::SeqCst);
}

/// Turn SIGINT/SIGTERM/SIGHUP into a flag that the wait loops poll, until
/// the returned guard is dropped: then the previous handlers are back (a task that
/// runs another, as `test` runs `rootfs`, gets its own back), and a signal that came
/// in meanwhile is raised again for a previous handler that is a function.
pub fn install_signal_handlers() -> SignalGuard {
    let mut previous = Vec::new();
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction is a valid starting value; the handler
        // only performs an atomic store, which is async-signal-safe; `old`
        // is written by the kernel.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            action.sa_flags = libc::SA_RESTART;
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, &action, &mut old) == 0 {
                previous.push((sig, old));
            }
        }
    }
    SignalGuard { previous }
}

pub struct SignalGuard {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (sig, old) in &self.previous {
            // SAFETY: restores a sigaction the kernel gave us.
            unsafe {
                libc::sigaction(*sig, old, std::ptr::null_mut());
            }
        }
        if let Some(sig) = interrupted() {
            let custom = self.previous.iter().any(|(s, old)| {
                *s == sig && old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN
            });
            if custom {
                // SAFETY: plain syscall; the handler is the caller's own.
                unsafe {
                    libc::raise(sig);
                }
            }
        }
    }
}

/// The signal that interrupted us, if any.
pub fn interrupted() -> Option<i32> {
    match INTERRUPT.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// Fail if a signal asked us to stop.
pub fn check_interrupted() -> Result<()> {
    match interrupted() {
        Some(sig) => bail!("interrupted by signal {sig}"),
        None => Ok(()),
    }
}

// ---- child processes ----------------------------------------------------------------

/// Make `cmd` start in its own process group and die with us.
///
/// Its own group lets us kill it together with its children (mmdebstrap runs
/// apt and dpkg; QEMU has threads only, but is killed the same way).
/// `PR_SET_PDEATHSIG` is the backstop for when xtask itself is SIGKILLed and
/// cannot run any cleanup.
pub fn own_group_and_die_with_parent(cmd: &mut Command) {
    cmd.process_group(0);
    // SAFETY: getpid before the fork; in the child only async-signal-safe
    // calls (prctl, getppid, _exit) are made.
    unsafe {
        let parent = libc::getpid();
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// Send `sig` to the process group led by `child` (started with
/// [`own_group_and_die_with_parent`], so the group is ours alone).
pub fn signal_group(child: &Child, sig: libc::c_int) {
    let pgid = child.id() as libc::pid_t;
    if pgid > 1 {
        // SAFETY: plain syscall; the group id is that of our own child, whose
        // group exists at least until we reap it.
        unsafe {
            libc::kill(-pgid, sig);
        }
    }
}

/// Stop a child's process group: SIGTERM, then SIGKILL after `grace`, and reap it.
pub fn stop_group(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        // Already reaped; its group may still hold stragglers.
        signal_group(child, libc::SIGKILL);
        return;
    }
    signal_group(child, libc::SIGTERM);
    let until = Instant::now() + grace;
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            signal_group(child, libc::SIGKILL);
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    signal_group(child, libc::SIGKILL);
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo("/a\\040b\\134c"), "/a b\\c");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }
}
