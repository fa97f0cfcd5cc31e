//! `cargo xtask vm-run`: boot the VM, run one command in it, stream its
//! output, return its exit status.
//!
//! Each run gets a fresh *control directory* on the host, shared with the
//! guest over 9p (tag `codecage.ctl`). It carries the per-run init script
//! (`guest-init.sh`), its `config`, the job (`cmd.sh`), and brings back the
//! `started` marker and the job's `rc`. The project directory is a second 9p
//! share (tag `codecage.share`) mounted at the *same absolute path* in the
//! guest, so absolute paths baked into test binaries
//! (`env!("CARGO_BIN_EXE_codecage")`) work unchanged.
//!
//! The job's stdout+stderr leave the guest through a virtio-serial port that
//! QEMU writes to a file, which we poll and copy to our stdout. A 16550 UART
//! is ~4x slower than that under TCG; the kernel console (ttyS0) goes to a
//! separate file, shown only when something fails.
//!
//! A thread can send all of that (the job's output and the runner's own messages) to a
//! file instead ([`log_to`]): the lanes that `vm-test` runs side by side each write one
//! log, printed whole when the lane ends, so their lines do not interleave.
//!
//! Exit status: the job's; 124 when it timed out; 125 when the VM failed
//! before the job could report one. A boot that dies before the job started
//! is retried (up to twice); once the job has started it is never run again.

use super::lanes::{self, Cgroups, Lane};
use super::qemu::{self, Machine};
use super::{ensure_image, systemd, Image, EXIT_TIMEOUT, EXIT_VM_FAILED};
use crate::host::{
    find_command, interrupted, orphans, remove_tree, secs, shell_quote, signal_group,
    workspace_root, TempTree,
};
use anyhow::{ensure, Context, Result};
use std::cell::RefCell;
use std::fmt::Write as _;
use std::fs;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const GUEST_INIT_SH: &str = include_str!("../../vm/guest-init.sh");
/// The same for the image with systemd as pid 1 (`systemd.rs`), run by a unit of its own.
const SYSTEMD_JOB_SH: &str = include_str!("../../vm/systemd-job.sh");

/// Control directories are `$TMPDIR/codecage-vm-<pid>-<n>`.
const CONTROL_DIR_PREFIX: &str = "codecage-vm-";

/// Boots in total when the job never started: the first plus two retries.
/// (A rare early-boot oops under multi-threaded TCG was seen with newer
/// kernels; a retry is cheaper than a red CI run.)
const BOOT_ATTEMPTS: u32 = 3;

/// How long the host waits after the guest's own timeout fired before it
/// kills QEMU (time for the guest to record the status and power off).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// How often the host copies the job's output and looks at QEMU and the guest.
const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// Lines of the guest console and of QEMU's messages shown when a boot fails.
const CONSOLE_TAIL_LINES: usize = 40;
const QEMU_TAIL_LINES: usize = 20;

thread_local! {
    /// Where this thread's runs print (see [`log_to`]); None: the terminal.
    static LOG: RefCell<Option<fs::File>> = const { RefCell::new(None) };
}

/// Sends what this thread's runs print, the job's output and the runner's messages, to
/// `file` instead of the terminal (stdout and stderr), until called with None.
pub fn log_to(file: Option<fs::File>) {
    LOG.with(|log| *log.borrow_mut() = file);
}

/// Writes `text` to this thread's log, or with `terminal` when it has none. A closed
/// terminal (piped into `head`, say) must not stop a run.
fn emit(text: &[u8], terminal: &mut dyn std::io::Write) {
    LOG.with(|log| match &mut *log.borrow_mut() {
        Some(file) => {
            let _ = file.write_all(text);
        }
        None => {
            let _ = terminal.write_all(text);
            let _ = terminal.flush();
        }
    });
}

/// A message of the runner, on stderr or in this thread's log; `say!` formats one line.
pub fn say_str(text: &str) {
    emit(text.as_bytes(), &mut std::io::stderr());
}

macro_rules! say {
    ($($arg:tt)*) => {
        $crate::vm::run::say_str(&format!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use say;

/// Run a command in the VM
///
/// Boots the VM of a lane (default: v2-6.12, pure cgroup v2 on Linux 6.12), building its
/// image first if needed, runs CMD as root in the current directory when that is inside
/// the share (else in the share), with its output streamed to stdout, and exits with CMD's
/// status (124: timeout, 125: the VM failed). The share is mounted at the same absolute
/// path in the guest.
#[derive(clap::Args, Debug, Clone)]
#[command(
    verbatim_doc_comment,
    override_usage = "cargo xtask vm-run [OPTIONS] [--] CMD [ARGS...]"
)]
pub struct RunOptions {
    /// The lane whose kernel and cgroup layout to boot (default: v2-6.12), or
    /// debian12-systemd: Debian 12 with systemd as pid 1 (`cargo xtask dist --vm-check`'s)
    #[arg(long, value_name = "NAME", value_parser = parse_run_lane)]
    pub lane: Option<String>,
    /// Time limit of the command in whole seconds (boot time not included)
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_TIMEOUT_SECS, value_parser = parse_timeout)]
    pub timeout: u64,
    /// Host directory shared at the same path in the guest
    ///
    /// Default: the workspace root.
    #[arg(long, value_name = "DIR", default_value_os_t = workspace_root(), hide_default_value = true)]
    pub share: PathBuf,
    /// Extra environment for the command (repeatable)
    ///
    /// K=V, or K for the host's value of K.
    #[arg(long, value_name = "K=V|K", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Working directory of the command (inside `share`); empty: the current directory
    /// when it is inside the share, else the share.
    #[arg(skip)]
    pub cwd: PathBuf,
    /// The command and its arguments
    #[arg(value_name = "CMD", required = true, trailing_var_arg = true)]
    pub command: Vec<String>,
}

impl RunOptions {
    /// The defaults of `vm-run` for `command`.
    pub fn new(command: Vec<String>) -> RunOptions {
        RunOptions {
            lane: None,
            timeout: DEFAULT_TIMEOUT_SECS,
            share: workspace_root(),
            env: Vec::new(),
            cwd: PathBuf::new(),
            command,
        }
    }
}

/// `vm-run`'s time limit.
const DEFAULT_TIMEOUT_SECS: u64 = 600;

/// `--timeout`: whole seconds, more than zero.
pub fn parse_timeout(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("the timeout must be positive".to_string()),
        Ok(secs) => Ok(secs),
        Err(_) => Err("want whole seconds".to_string()),
    }
}

/// `vm-run --lane`: a lane's name, or the systemd VM's.
fn parse_run_lane(s: &str) -> Result<String, String> {
    if s == systemd::LANE.name {
        Ok(s.to_string())
    } else {
        lanes::parse_lane(s).map_err(|e| format!("{e}, or {} (vm-run only)", systemd::LANE.name))
    }
}

/// `K=V`, or `K` for the host's value of K.
pub fn parse_env(s: &str) -> Result<(String, String), String> {
    let (k, v) = match s.split_once('=') {
        Some((k, v)) => (k.to_string(), v.to_string()),
        None => (
            s.to_string(),
            std::env::var(s).map_err(|_| format!("{s} is not set on the host"))?,
        ),
    };
    let valid = !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        return Err(format!("bad environment variable name {k:?}"));
    }
    Ok((k, v))
}

/// The QEMU binary, or an error saying how to get it.
pub fn require_qemu() -> Result<PathBuf> {
    find_command("qemu-system-x86_64").context(
        "qemu-system-x86_64 not found: run `cargo xtask vm-build` as root (it installs it)",
    )
}

/// `cargo xtask vm-run`: the command in the VM of the lane `--lane` names.
pub fn vm_run(opts: &RunOptions) -> Result<i32> {
    let lane = match &opts.lane {
        Some(name) if name == "all" => {
            anyhow::bail!("vm-run boots one lane: name it (`all` is for vm-test and vm-check)")
        }
        Some(name) if name == systemd::LANE.name => {
            return run(&systemd::LANE, &systemd::ensure_systemd_image()?, opts)
        }
        Some(name) => *Lane::named(name)?,
        None => Lane::default_from_env(),
    };
    let image = ensure_image(lane.kernel_suite)?;
    run(&lane, &image, opts)
}

/// Run the command in the VM of `lane` booted from `image` and return its exit status
/// (see module docs).
pub fn run(lane: &Lane, image: &Image, opts: &RunOptions) -> Result<i32> {
    let qemu = require_qemu()?;
    let share = check_share(&opts.share)?;
    let cwd = if opts.cwd.as_os_str().is_empty() {
        std::env::current_dir()
            .ok()
            .filter(|d| d.starts_with(&share))
            .unwrap_or_else(|| share.clone())
    } else {
        opts.cwd.clone()
    };
    remove_stale_control_dirs();
    for attempt in 1..=BOOT_ATTEMPTS {
        match boot(&qemu, lane, image, opts, &share, &cwd, attempt)? {
            Outcome::Status(rc) => return Ok(rc),
            Outcome::NotStarted(why) => {
                say!(
                    "[vm] boot {attempt}/{BOOT_ATTEMPTS} failed before the command started: {why}"
                );
            }
        }
    }
    say!("[vm] giving up after {BOOT_ATTEMPTS} boots");
    Ok(EXIT_VM_FAILED)
}

/// Remove control directories left behind by runs whose xtask was killed
/// with SIGKILL (QEMU dies with it, through PR_SET_PDEATHSIG, but no cleanup
/// code runs).
fn remove_stale_control_dirs() {
    let run_pid = |name: &str| {
        let rest = name.strip_prefix(CONTROL_DIR_PREFIX)?;
        rest.split('-').next()?.parse().ok()
    };
    for dir in orphans(&std::env::temp_dir(), run_pid) {
        let _ = remove_tree(&dir);
    }
}

enum Outcome {
    /// The exit status to report (the job's, or 124/125/128+signal).
    Status(i32),
    /// The job never started: a new boot may be tried.
    NotStarted(String),
}

/// The guest's system directories, which a share mounted at the same path must not hide.
const GUEST_SYSTEM_DIRS: &[&str] = &[
    "/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/root", "/run", "/sbin",
    "/sys", "/tmp", "/usr", "/var",
];
/// The guest's own file systems, in which a share cannot be.
const GUEST_OWN_DIRS: &[&str] = &["/dev", "/proc", "/run", "/sys"];

/// The share must be an existing directory that does not hide a part of the
/// guest's own system when mounted at the same path.
fn check_share(share: &Path) -> Result<PathBuf> {
    let share = share
        .canonicalize()
        .with_context(|| format!("share {}", share.display()))?;
    ensure!(
        share.is_dir(),
        "share {} is not a directory",
        share.display()
    );
    for dir in GUEST_SYSTEM_DIRS {
        ensure!(
            !Path::new(dir).starts_with(&share),
            "cannot share {}: it would hide the guest's {dir}",
            share.display()
        );
    }
    for dir in GUEST_OWN_DIRS {
        ensure!(
            !share.starts_with(dir),
            "cannot share {}: {dir} is the guest's own",
            share.display()
        );
    }
    Ok(share)
}

/// The job script: environment, working directory, exec of the command.
fn job_script(opts: &RunOptions, cwd: &Path) -> String {
    let mut s = String::from("# written by cargo xtask vm-run\n");
    let term = std::env::var("TERM").unwrap_or_else(|_| "dumb".into());
    let defaults = [
        ("HOME", "/root".to_string()),
        ("USER", "root".to_string()),
        ("LOGNAME", "root".to_string()),
        ("SHELL", "/bin/bash".to_string()),
        ("LANG", "C.UTF-8".to_string()),
        ("TERM", term),
    ];
    for (k, v) in defaults
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .chain(opts.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    {
        s.push_str(&format!("export {k}={}\n", shell_quote(v)));
    }
    s.push_str(&format!(
        "cd {} || exit {EXIT_VM_FAILED}\n",
        shell_quote(cwd)
    ));
    s.push_str("exec");
    for a in &opts.command {
        s.push(' ');
        s.push_str(&shell_quote(a));
    }
    s.push('\n');
    s
}

/// One boot of the VM: the control directory, QEMU, its supervision, the verdict.
fn boot(
    qemu: &Path,
    lane: &Lane,
    image: &Image,
    opts: &RunOptions,
    share: &Path,
    cwd: &Path,
    attempt: u32,
) -> Result<Outcome> {
    let ctl = ControlDir::write(opts, share, cwd, lane.cgroups)?;
    let machine = Machine::from_env(lane.cgroups);
    let mut output = OutputPump::open(&ctl.output)?;
    let mut cmd = qemu::command(qemu, image, &machine, &ctl, share)?;
    say!(
        "[vm] lane {}: boot {attempt}: {}, {} vCPUs, {} MiB; share {}; timeout {}s",
        lane.name,
        machine.accel,
        machine.cpus,
        machine.mem_mib,
        share.display(),
        opts.timeout
    );
    let mut vm = RunningVm::start(&mut cmd)?;
    let verdict = vm.supervise(&ctl, &mut output, &machine, opts.timeout)?;
    // QEMU has exited (or was killed): nothing more will be written, so this
    // last read gets the complete tail of the output.
    output.pump();
    if debug() {
        ctl.show_console();
    }
    Ok(verdict.unwrap_or_else(|| vm.outcome_after_exit(&ctl)))
}

/// A run's control directory (see the module docs), written before the boot.
pub(super) struct ControlDir {
    pub(super) dir: TempTree,
    /// The job's output, as QEMU writes it.
    pub(super) output: PathBuf,
    /// The guest's serial console.
    pub(super) console: PathBuf,
    /// QEMU's own stdout and stderr.
    pub(super) qemu_log: PathBuf,
    /// Written by the guest right before the job starts.
    started: PathBuf,
    /// The job's exit status, written by the guest.
    rc: PathBuf,
}

impl ControlDir {
    fn write(opts: &RunOptions, share: &Path, cwd: &Path, cgroups: Cgroups) -> Result<ControlDir> {
        let dir = TempTree::create_in(&std::env::temp_dir(), CONTROL_DIR_PREFIX)?;
        let path = dir.path();
        fs::write(path.join("guest-init.sh"), GUEST_INIT_SH)?;
        fs::write(path.join("systemd-job.sh"), SYSTEMD_JOB_SH)?;
        fs::write(
            path.join("config"),
            format!(
                "SHARE={}\nTIMEOUT={}\nOUT_PORT={}\nCGROUP={}\nDEBUG={}\n",
                shell_quote(share),
                opts.timeout,
                qemu::OUT_PORT,
                cgroups.name(),
                if debug() { "1" } else { "" }
            ),
        )?;
        fs::write(path.join("cmd.sh"), job_script(opts, cwd))?;
        let ctl = ControlDir {
            output: path.join("output.log"),
            console: path.join("console.log"),
            qemu_log: path.join("qemu.log"),
            started: path.join("started"),
            rc: path.join("rc"),
            dir,
        };
        // Created before QEMU opens it (which truncates an empty file: harmless),
        // so the reader can open it right away.
        fs::write(&ctl.output, b"")?;
        Ok(ctl)
    }

    /// Show all of the guest's console and of QEMU's messages (`CODECAGE_VM_DEBUG`).
    fn show_console(&self) {
        say!("----- guest console (CODECAGE_VM_DEBUG) -----");
        say_str(&fs::read_to_string(&self.console).unwrap_or_default());
        say_str(&fs::read_to_string(&self.qemu_log).unwrap_or_default());
        say!("---------------------------------------------");
    }

    /// Show the end of the guest's console and of QEMU's messages.
    fn show_failure(&self) {
        say!("----- guest console (tail) -----");
        say_str(&tail_lines(&self.console, CONSOLE_TAIL_LINES));
        let q = fs::read_to_string(&self.qemu_log).unwrap_or_default();
        if !q.trim().is_empty() {
            say!("----- qemu -----");
            say_str(&tail_lines(&self.qemu_log, QEMU_TAIL_LINES));
        }
        say!("--------------------------------");
    }
}

/// Copies what the guest writes to the output file on to our stdout (or the thread's log).
struct OutputPump {
    file: fs::File,
    buf: Vec<u8>,
}

impl OutputPump {
    fn open(path: &Path) -> Result<OutputPump> {
        Ok(OutputPump {
            file: fs::File::open(path)?,
            buf: vec![0; 1 << 16],
        })
    }

    /// Copy whatever the guest wrote since the last call, to stdout or this thread's log.
    fn pump(&mut self) {
        let mut stdout = std::io::stdout();
        while let Ok(n) = self.file.read(&mut self.buf) {
            if n == 0 {
                break;
            }
            emit(&self.buf[..n], &mut stdout);
        }
    }
}

/// QEMU, running.
struct RunningVm {
    child: Child,
    booted: Instant,
    /// When the guest said the job started.
    started: Option<Instant>,
}

impl RunningVm {
    fn start(qemu: &mut Command) -> Result<RunningVm> {
        let booted = Instant::now();
        let child = qemu.spawn().context("cannot start qemu-system-x86_64")?;
        Ok(RunningVm {
            child,
            booted,
            started: None,
        })
    }

    /// Stream the output until QEMU exits (`None`: the guest decides the outcome), or
    /// until an interrupt, the boot timeout or the job's timeout (plus the guest's grace)
    /// ends the VM with an outcome of its own.
    fn supervise(
        &mut self,
        ctl: &ControlDir,
        output: &mut OutputPump,
        machine: &Machine,
        timeout_secs: u64,
    ) -> Result<Option<Outcome>> {
        loop {
            output.pump();
            if self.started.is_none() && ctl.started.exists() {
                self.started = Some(Instant::now());
                let boot = secs(self.booted.elapsed());
                say!("[vm] command started after {boot} of boot");
            }
            if self.child.try_wait()?.is_some() {
                return Ok(None);
            }
            if let Some(sig) = interrupted() {
                self.kill();
                output.pump();
                say!("[vm] interrupted by signal {sig}: VM killed");
                return Ok(Some(Outcome::Status(128 + sig)));
            }
            match self.started {
                None if self.booted.elapsed() > machine.boot_timeout => {
                    self.kill();
                    ctl.show_failure();
                    return Ok(Some(Outcome::NotStarted(format!(
                        "no command start within {} (CODECAGE_VM_BOOT_TIMEOUT)",
                        secs(machine.boot_timeout)
                    ))));
                }
                Some(s) if s.elapsed() > Duration::from_secs(timeout_secs) + SHUTDOWN_GRACE => {
                    self.kill();
                    output.pump();
                    say!(
                        "[vm] timeout: the command ran over {timeout_secs}s and the guest did not \
                         stop it; VM killed"
                    );
                    return Ok(Some(Outcome::Status(EXIT_TIMEOUT)));
                }
                _ => {}
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    fn kill(&mut self) {
        signal_group(&self.child, libc::SIGKILL);
        let _ = self.child.wait();
    }

    /// The outcome once QEMU exited by itself: the job's status when the guest wrote it.
    fn outcome_after_exit(&self, ctl: &ControlDir) -> Outcome {
        let rc = fs::read_to_string(&ctl.rc)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        let total = secs(self.booted.elapsed());
        match (rc, self.started) {
            (Some(rc), Some(s)) => {
                let job = secs(s.elapsed());
                say!("[vm] exit status {rc} (command {job}, total {total})");
                Outcome::Status(rc)
            }
            (_, Some(_)) => {
                say!("[vm] the VM stopped while the command was running, without a status");
                ctl.show_failure();
                Outcome::Status(EXIT_VM_FAILED)
            }
            (_, None) => {
                ctl.show_failure();
                Outcome::NotStarted(format!("the VM exited after {total}"))
            }
        }
    }
}

/// `CODECAGE_VM_DEBUG=1`: show the guest console with stage timestamps.
fn debug() -> bool {
    std::env::var_os("CODECAGE_VM_DEBUG").is_some_and(|v| !v.is_empty() && v != "0")
}

/// The last `n` lines of a file (lossy UTF-8), for failure reports.
fn tail_lines(path: &Path, n: usize) -> String {
    let Ok(bytes) = fs::read(path) else {
        return format!("({} is missing)\n", path.display());
    };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    let mut out = String::new();
    if start > 0 {
        let _ = writeln!(out, "... ({start} earlier lines in {})", path.display());
    }
    for l in &lines[start..] {
        let _ = writeln!(out, "{l}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{tests::parse, Task};

    fn run_options(args: &[&str]) -> Result<RunOptions, clap::Error> {
        match parse(&[&["vm-run"], args].concat())? {
            Task::VmRun(opts) => Ok(opts),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parses_arguments() {
        let o = run_options(&["ls", "-la", "--timeout", "5"]).unwrap();
        assert_eq!(o.command, ["ls", "-la", "--timeout", "5"]);
        assert_eq!(o.timeout, DEFAULT_TIMEOUT_SECS);
        assert_eq!(o.share, workspace_root());
        let o = run_options(&[
            "--timeout",
            "5",
            "--timeout",
            "7",
            "--env",
            "A=b=c",
            "--share",
            "/s",
            "--",
            "--x",
        ])
        .unwrap();
        assert_eq!(o.command, ["--x"]);
        assert_eq!(o.timeout, 7);
        assert_eq!(o.env, [("A".to_string(), "b=c".to_string())]);
        assert_eq!(o.share, PathBuf::from("/s"));
        for bad in [
            &[][..],
            &["--"],
            &["--bogus", "--", "x"],
            &["--timeout", "0", "x"],
            &["--timeout", "1.5", "x"],
            &["--env", "1A=b", "x"],
            &["--env", "=b", "x"],
            &["--env", "CODECAGE_XTASK_TEST_UNSET", "x"],
        ] {
            assert!(run_options(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn env_takes_the_hosts_value() {
        let path = std::env::var("PATH").unwrap();
        assert_eq!(parse_env("PATH"), Ok(("PATH".to_string(), path)));
        assert_eq!(parse_env("A_1="), Ok(("A_1".to_string(), String::new())));
    }
}
