//! The tasks' tools as child processes: each in a process group of its own that dies with
//! the process that started them (xtask, codecage), so that an interrupted task can stop a tool together with its children; and
//! [`Runner`], which runs them to completion with their output in a log, polling for
//! interrupts.

use std::fs;
use std::io::{Read as _, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{display_command, interrupted};

/// How long an interrupted tool gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How often the wait loops look at the child and at the interrupt flag.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How long the output is still read after a tool's exit (a daemon that left its process
/// group may hold the pipe open: its output is then cut short in the log).
const OUTPUT_DRAIN: Duration = Duration::from_secs(3);

/// Make `cmd` start in its own process group and die with us.
///
/// Its own group lets us kill it together with its children (mmdebstrap runs
/// apt and dpkg; QEMU has threads only, but is killed the same way).
/// `PR_SET_PDEATHSIG` is the backstop for when xtask (or codecage) itself is SIGKILLed and
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
fn stop_group(child: &mut Child, grace: Duration) {
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
        std::thread::sleep(POLL_INTERVAL);
    }
    signal_group(child, libc::SIGKILL);
    let _ = child.wait();
}

/// Kill every process whose root directory is `dir` or below it (daemons a
/// package script started inside a chroot). Returns how many were killed.
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
            // SAFETY: plain syscall on a pid we just found rooted in `dir`.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            killed += 1;
        }
    }
    killed
}

/// A pipe, both ends close-on-exec: (read end, write end). (`std::io::pipe` is newer than
/// the workspace's minimum Rust version.)
fn pipe() -> std::io::Result<(fs::File, fs::File)> {
    use std::os::fd::FromRawFd as _;
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created by pipe2 and are owned by nothing else.
    Ok(unsafe { (fs::File::from_raw_fd(fds[0]), fs::File::from_raw_fd(fds[1])) })
}

/// Runs a task's tools to completion.
///
/// With a log, each tool runs in its own process group that dies with us (see
/// [`own_group_and_die_with_parent`]), its stdout and stderr go through one pipe into the
/// log (and to our stderr when verbose), and an interrupt stops it. On the terminal
/// (`Runner::terminal`), a tool shares our terminal and our process group, as if it had
/// been started by hand: Ctrl-C reaches it, and apt-get or dpkg can stop cleanly.
pub struct Runner {
    log: Option<PathBuf>,
    verbose: bool,
}

impl Runner {
    /// Tools' output appended to `log`, and to our stderr too when `verbose`.
    pub fn logging_to(log: PathBuf, verbose: bool) -> Runner {
        Runner {
            log: Some(log),
            verbose,
        }
    }

    /// Tools on our terminal.
    pub fn terminal() -> Runner {
        Runner {
            log: None,
            verbose: true,
        }
    }

    fn open_log(&self) -> Result<Option<fs::File>> {
        let Some(log) = &self.log else {
            return Ok(None);
        };
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        Ok(Some(file))
    }

    /// Append a line to the log (and show it when verbose).
    pub fn note(&self, line: &str) {
        if let Ok(Some(mut f)) = self.open_log() {
            let _ = writeln!(f, "{line}");
        }
        if self.verbose {
            eprintln!("{line}");
        }
    }

    /// Run `cmd` to completion (stdin from /dev/null). Fails unless it exits with 0; the
    /// error names it as `label` (the full command line is in the log).
    pub fn run(&self, label: &str, mut cmd: Command) -> Result<()> {
        self.note(&format!("$ {}", display_command(&cmd)));
        cmd.stdin(Stdio::null());
        let status = match self.open_log()? {
            None => cmd
                .status()
                .with_context(|| format!("cannot start {}", display_command(&cmd)))?,
            Some(log) => self.supervise(&mut cmd, log)?,
        };
        if !status.success() {
            bail!("{label} failed ({status})");
        }
        Ok(())
    }

    /// Run `cmd` to completion for its stdout, which is returned and not logged; its
    /// stderr goes to the log. For short commands: interrupts are not polled, and the
    /// exit status is the caller's to judge.
    pub fn capture(&self, mut cmd: Command) -> Result<Output> {
        let what = display_command(&cmd);
        self.note(&format!("$ {what}"));
        if let Some(log) = self.open_log()? {
            own_group_and_die_with_parent(&mut cmd);
            cmd.stderr(log);
        }
        cmd.stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot start {what}"))
    }

    /// Run `cmd` in its own process group with its output into `log`, until it exits or
    /// an interrupt stops it.
    fn supervise(&self, cmd: &mut Command, mut log: fs::File) -> Result<ExitStatus> {
        let what = display_command(cmd);
        let (mut reader, writer) = pipe().context("pipe")?;
        cmd.stdout(writer.try_clone()?).stderr(writer);
        own_group_and_die_with_parent(cmd);
        let spawned = cmd.spawn();
        // The Command holds the pipe's write end: replace its stdio so that
        // the reader sees EOF once the child (and its children) are done.
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        let mut child = spawned.with_context(|| format!("cannot start {what}"))?;

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
                stop_group(&mut child, STOP_GRACE);
                let _ = done_rx.recv_timeout(OUTPUT_DRAIN);
                bail!("interrupted by signal {sig}");
            }
            std::thread::sleep(POLL_INTERVAL);
        };
        // Stragglers left in its group go too.
        signal_group(&child, libc::SIGKILL);
        let _ = done_rx.recv_timeout(OUTPUT_DRAIN);
        Ok(status)
    }
}
