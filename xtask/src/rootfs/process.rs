//! Child processes, interrupts and safe removal of trees for the rootfs build.
//!
//! The helpers every task shares (interrupts, process groups, safe removal) are in
//! `crate::host`.
//!
//! * Every tool runs in its own process group with `PR_SET_PDEATHSIG`, its
//!   stdout and stderr go through one pipe into the build log (and to our
//!   stderr with `--verbose`), and the wait loop polls for SIGINT/SIGTERM/
//!   SIGHUP so an interrupted build still stops its tools and removes its
//!   half-built image.
//! * Processes whose root directory is inside the image under construction
//!   (a daemon some package script started in the chroot) are killed after
//!   each step.
//! * [`remove_tree`] refuses to delete through a mount point.

pub use crate::host::{
    check_interrupted, display_command, find_command, interrupted, mounts_below,
    own_group_and_die_with_parent, remove_tree, signal_group, stop_group,
};
use anyhow::{bail, Context, Result};
use std::fs;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Runs tools for one build, appending their output to the build log.
pub struct Runner {
    pub log: PathBuf,
    pub verbose: bool,
}

impl Runner {
    /// Append a line to the build log.
    pub fn note(&self, line: &str) {
        if let Ok(mut f) = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
        {
            let _ = writeln!(f, "{line}");
        }
        if self.verbose {
            eprintln!("{line}");
        }
    }

    /// Run `cmd` to completion (stdin from /dev/null, stdout and stderr into
    /// the log), polling for interrupts. Fails unless it exits with 0; the
    /// error names it as `label` (the full command line is in the log).
    pub fn run(&self, label: &str, mut cmd: Command) -> Result<()> {
        let status = self.run_status(&mut cmd)?;
        if !status.success() {
            bail!("{label} failed ({status})");
        }
        Ok(())
    }

    /// Like [`Runner::run`], and return the command's stdout (which also
    /// goes to the log).
    pub fn output(&self, mut cmd: Command) -> Result<String> {
        let what = display_command(&cmd);
        self.note(&format!("$ {what}"));
        own_group_and_die_with_parent(&mut cmd);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        cmd.stdin(Stdio::null()).stderr(log);
        let out = cmd
            .output()
            .with_context(|| format!("cannot start {what}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        self.note(text.trim_end());
        if !out.status.success() {
            bail!("{what} failed ({})", out.status);
        }
        Ok(text)
    }

    fn run_status(&self, cmd: &mut Command) -> Result<ExitStatus> {
        let what = display_command(cmd);
        self.note(&format!("$ {what}"));
        let (mut reader, writer) = std::io::pipe().context("pipe")?;
        cmd.stdin(Stdio::null())
            .stdout(writer.try_clone()?)
            .stderr(writer);
        own_group_and_die_with_parent(cmd);
        let spawned = cmd.spawn();
        // The Command holds the pipe's write end: replace its stdio so that
        // the reader sees EOF once the child (and its children) are done.
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        let mut child = spawned.with_context(|| format!("cannot start {what}"))?;

        let mut log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let verbose = self.verbose;
        let (done_tx, done_rx) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            let mut buf = [0u8; 16 * 1024];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let _ = log.write_all(&buf[..n]);
                        if verbose {
                            let _ = std::io::stderr().write_all(&buf[..n]);
                        }
                    }
                }
            }
            let _ = done_tx.send(());
        });

        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if let Some(sig) = interrupted() {
                stop_group(&mut child, Duration::from_secs(10));
                let _ = done_rx.recv_timeout(Duration::from_secs(2));
                bail!("interrupted by signal {sig}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        // Stragglers left in its group go too.
        signal_group(&child, libc::SIGKILL);
        // A daemon that escaped the group may hold the pipe open: do not wait
        // for it forever (its output is then cut short in the log).
        let _ = done_rx.recv_timeout(Duration::from_secs(3));
        Ok(status)
    }
}

/// Kill every process whose root directory is `dir` or below it (daemons a
/// package script started inside the chroot). Returns how many were killed.
pub fn kill_processes_rooted_in(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir("/proc") else {
        return 0;
    };
    let mut killed = 0;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        let Ok(root) = fs::read_link(entry.path().join("root")) else {
            continue;
        };
        if root.starts_with(dir) && pid != std::process::id() as libc::pid_t {
            // SAFETY: plain syscall on a pid we just found rooted in our build tree.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            killed += 1;
        }
    }
    killed
}

/// A path (directory or file) removed when dropped, unless disarmed; for the
/// image and work directories of a build, so that every failure and
/// interrupt path cleans up.
pub struct Guard {
    path: PathBuf,
    armed: bool,
}

impl Guard {
    pub fn new(path: PathBuf) -> Guard {
        Guard { path, armed: true }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Processes still running in a chroot of the tree first, so that the
        // private mount namespace they hold goes away too.
        if kill_processes_rooted_in(&self.path) > 0 {
            std::thread::sleep(Duration::from_millis(200));
        }
        if let Err(e) = remove_tree(&self.path) {
            eprintln!("warning: {e:#}");
        }
    }
}

/// Is a process with this pid alive?
pub fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}
