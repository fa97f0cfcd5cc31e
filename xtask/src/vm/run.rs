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
//! Exit status: the job's; 124 when it timed out; 125 when the VM failed
//! before the job could report one. A boot that dies before the job started
//! is retried (up to twice); once the job has started it is never run again.

use super::{Image, EXIT_TIMEOUT, EXIT_VM_FAILED};
use crate::host::{
    find_command, interrupted, orphans, own_group_and_die_with_parent, remove_tree, secs,
    shell_quote, signal_group, workspace_root, TempTree,
};
use anyhow::{ensure, Context, Result};
use std::fmt::Write as _;
use std::fs;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const GUEST_INIT_SH: &str = include_str!("../../vm/guest-init.sh");

/// Control directories are `$TMPDIR/codecage-vm-<pid>-<n>`.
const CONTROL_DIR_PREFIX: &str = "codecage-vm-";

/// Name of the virtio-serial port carrying the job's output.
const OUT_PORT: &str = "codecage.out";

/// Boots in total when the job never started: the first plus two retries.
/// (A rare early-boot oops under multi-threaded TCG was seen with newer
/// kernels; a retry is cheaper than a red CI run.)
const BOOT_ATTEMPTS: u32 = 3;

/// How long the host waits after the guest's own timeout fired before it
/// kills QEMU (time for the guest to record the status and power off).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Run a command in the VM
///
/// Boots the cgroup v2 VM (building its image first if needed), runs CMD as root in the
/// current directory when that is inside the share (else in the share), with its output
/// streamed to stdout, and exits with CMD's status (124: timeout, 125: the VM failed).
/// The share is mounted at the same absolute path in the guest.
#[derive(clap::Args, Debug, Clone)]
#[command(
    verbatim_doc_comment,
    override_usage = "cargo xtask vm-run [OPTIONS] [--] CMD [ARGS...]"
)]
pub struct RunOptions {
    /// Time limit of the command in whole seconds (boot time not included)
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_TIMEOUT)]
    pub timeout: Seconds,
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
    /// Working directory of the command (inside `share`); empty: see above.
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
            timeout: DEFAULT_TIMEOUT,
            share: workspace_root(),
            env: Vec::new(),
            cwd: PathBuf::new(),
            command,
        }
    }
}

/// `vm-run`'s time limit.
const DEFAULT_TIMEOUT: Seconds = Seconds::new(600);

/// A time limit in whole seconds, more than zero (`--timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seconds(u64);

impl Seconds {
    pub const fn new(secs: u64) -> Seconds {
        Seconds(secs)
    }

    pub fn duration(self) -> Duration {
        Duration::from_secs(self.0)
    }
}

impl std::str::FromStr for Seconds {
    type Err = String;

    fn from_str(s: &str) -> Result<Seconds, String> {
        match s.parse::<u64>() {
            Ok(0) => Err("the timeout must be positive".to_string()),
            Ok(secs) => Ok(Seconds(secs)),
            Err(_) => Err("want whole seconds".to_string()),
        }
    }
}

impl std::fmt::Display for Seconds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
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

/// Run the command in the VM and return its exit status (see module docs).
pub fn run(image: &Image, opts: &RunOptions) -> Result<i32> {
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
        match boot(&qemu, image, opts, &share, &cwd, attempt)? {
            Outcome::Status(rc) => return Ok(rc),
            Outcome::NotStarted(why) => {
                eprintln!(
                    "[vm] boot {attempt}/{BOOT_ATTEMPTS} failed before the command started: {why}"
                );
            }
        }
    }
    eprintln!("[vm] giving up after {BOOT_ATTEMPTS} boots");
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
    let system = [
        "/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/root", "/run", "/sbin",
        "/sys", "/tmp", "/usr", "/var",
    ];
    for dir in system {
        ensure!(
            !Path::new(dir).starts_with(&share),
            "cannot share {}: it would hide the guest's {dir}",
            share.display()
        );
    }
    for dir in ["/dev", "/proc", "/run", "/sys"] {
        ensure!(
            !share.starts_with(dir),
            "cannot share {}: {dir} is the guest's own",
            share.display()
        );
    }
    Ok(share)
}

/// QEMU option values escape a comma by doubling it.
fn qemu_path(p: &Path) -> String {
    p.to_string_lossy().replace(',', ",,")
}

/// KVM only when it can really run a stock kernel: /dev/kvm usable *and* the
/// CPU shows vmx/svm. (On PVM-backed hosts /dev/kvm exists, but a stock
/// kernel crawls there; TCG is much faster.) `CODECAGE_VM_ACCEL=kvm|tcg`
/// overrides, `CODECAGE_VM_CPU` sets the CPU model.
fn accel_args() -> (&'static str, Vec<String>) {
    let forced = std::env::var("CODECAGE_VM_ACCEL").unwrap_or_default();
    let kvm = match forced.as_str() {
        "kvm" => true,
        "tcg" => false,
        _ => {
            let usable = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/kvm")
                .is_ok();
            let flags = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            let virt = flags
                .lines()
                .filter(|l| l.starts_with("flags"))
                .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
            usable && virt
        }
    };
    let (name, accel, cpu) = if kvm {
        ("kvm", "kvm", "host")
    } else {
        // Nehalem covers x86-64-v2 (SSE4.2, POPCNT), more than what
        // Debian and rustc target by default. Measured against `-cpu max`
        // (which adds AVX/AVX2, that glibc then prefers and TCG emulates
        // slowly): boot 4.7-5.5 s instead of 5.6-9 s, exec ~30% faster.
        // Binaries built for x86-64-v3 need CODECAGE_VM_CPU=max.
        ("tcg", "tcg,thread=multi", "Nehalem")
    };
    let cpu = std::env::var("CODECAGE_VM_CPU").unwrap_or_else(|_| cpu.to_string());
    (
        name,
        vec!["-accel".into(), accel.into(), "-cpu".into(), cpu],
    )
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
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
    s.push_str(&format!("cd {} || exit 125\n", shell_quote(cwd)));
    s.push_str("exec");
    for a in &opts.command {
        s.push(' ');
        s.push_str(&shell_quote(a));
    }
    s.push('\n');
    s
}

/// One boot of the VM.
fn boot(
    qemu: &Path,
    image: &Image,
    opts: &RunOptions,
    share: &Path,
    cwd: &Path,
    attempt: u32,
) -> Result<Outcome> {
    let ctl = TempTree::create_in(&std::env::temp_dir(), CONTROL_DIR_PREFIX)?;
    let ctl_dir = ctl.path();
    let output_log = ctl_dir.join("output.log");
    let console_log = ctl_dir.join("console.log");
    let qemu_log = ctl_dir.join("qemu.log");
    let started_file = ctl_dir.join("started");
    let rc_file = ctl_dir.join("rc");
    fs::write(ctl_dir.join("guest-init.sh"), GUEST_INIT_SH)?;
    fs::write(
        ctl_dir.join("config"),
        format!(
            "SHARE={}\nTIMEOUT={}\nOUT_PORT={}\nDEBUG={}\n",
            shell_quote(share),
            opts.timeout,
            OUT_PORT,
            if debug() { "1" } else { "" }
        ),
    )?;
    fs::write(ctl_dir.join("cmd.sh"), job_script(opts, cwd))?;
    // Created before QEMU opens it (which truncates an empty file: harmless),
    // so the reader can open it right away.
    fs::write(&output_log, b"")?;
    let mut output = fs::File::open(&output_log)?;

    let (accel, accel_args) = accel_args();
    let mem = env_u64("CODECAGE_VM_MEM", 2048);
    let host_cpus = std::thread::available_parallelism().map_or(2, |n| n.get() as u64);
    let cpus = env_u64("CODECAGE_VM_CPUS", host_cpus.min(4));
    let boot_timeout = Duration::from_secs(env_u64("CODECAGE_VM_BOOT_TIMEOUT", 120));
    let append = format!(
        "console=ttyS0 panic=-1 oops=panic quiet loglevel=3 mitigations=off \
         cgroup_no_v1=all random.trust_cpu=on {}",
        std::env::var("CODECAGE_VM_APPEND").unwrap_or_default()
    );

    let mut cmd = Command::new(qemu);
    cmd.args([
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ])
    .args(["-machine", "q35"])
    .args(&accel_args)
    .args(["-m", &mem.to_string(), "-smp", &cpus.to_string()])
    .arg("-kernel")
    .arg(&image.vmlinux)
    .arg("-initrd")
    .arg(&image.initrd)
    .args(["-append", append.trim_end()])
    .arg("-drive")
    .arg(format!(
        "file={},format=raw,if=virtio,snapshot=on,cache=unsafe",
        qemu_path(&image.rootfs)
    ))
    .arg("-virtfs")
    .arg(format!(
        "local,path={},mount_tag=codecage.ctl,security_model=none",
        qemu_path(ctl_dir)
    ))
    .arg("-virtfs")
    .arg(format!(
        "local,path={},mount_tag=codecage.share,security_model=none,multidevs=remap",
        qemu_path(share)
    ))
    .args(["-device", "virtio-rng-pci"])
    .args(["-device", "virtio-serial-pci,id=vser"])
    .arg("-chardev")
    .arg(format!("file,id=out,path={}", qemu_path(&output_log)))
    .args([
        "-device",
        &format!("virtserialport,bus=vser.0,chardev=out,name={OUT_PORT}"),
    ])
    .arg("-serial")
    .arg(format!("file:{}", qemu_path(&console_log)))
    .stdin(Stdio::null());
    // stdout and stderr share one open file (and so its offset).
    let qlog = fs::File::create(&qemu_log)?;
    cmd.stdout(qlog.try_clone()?).stderr(qlog);
    own_group_and_die_with_parent(&mut cmd);

    eprintln!(
        "[vm] boot {attempt}: {accel}, {cpus} vCPUs, {mem} MiB; share {}; timeout {}s",
        share.display(),
        opts.timeout
    );
    let t0 = Instant::now();
    let mut child = cmd.spawn().context("cannot start qemu-system-x86_64")?;
    let mut started: Option<Instant> = None;
    let mut stdout = std::io::stdout();
    let mut buf = vec![0u8; 1 << 16];
    let mut pump = |output: &mut fs::File| {
        // Copy whatever the guest wrote since the last poll. A closed stdout
        // (e.g. piped into `head`) must not stop the run.
        while let Ok(n) = output.read(&mut buf) {
            if n == 0 {
                break;
            }
            let _ = stdout.write_all(&buf[..n]);
        }
        let _ = stdout.flush();
    };

    let verdict: Option<Outcome> = loop {
        pump(&mut output);
        if started.is_none() && started_file.exists() {
            started = Some(Instant::now());
            eprintln!("[vm] command started after {} of boot", secs(t0.elapsed()));
        }
        if child.try_wait()?.is_some() {
            break None;
        }
        if let Some(sig) = interrupted() {
            signal_group(&child, libc::SIGKILL);
            let _ = child.wait();
            pump(&mut output);
            eprintln!("[vm] interrupted by signal {sig}: VM killed");
            break Some(Outcome::Status(128 + sig));
        }
        match started {
            None if t0.elapsed() > boot_timeout => {
                signal_group(&child, libc::SIGKILL);
                let _ = child.wait();
                show_failure(&console_log, &qemu_log);
                break Some(Outcome::NotStarted(format!(
                    "no command start within {} (CODECAGE_VM_BOOT_TIMEOUT)",
                    secs(boot_timeout)
                )));
            }
            Some(s) if s.elapsed() > opts.timeout.duration() + SHUTDOWN_GRACE => {
                signal_group(&child, libc::SIGKILL);
                let _ = child.wait();
                pump(&mut output);
                eprintln!(
                    "[vm] timeout: the command ran over {}s and the guest did not stop it; VM killed",
                    opts.timeout
                );
                break Some(Outcome::Status(EXIT_TIMEOUT));
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(25));
    };
    // QEMU has exited (or was killed): nothing more will be written, so this
    // last read gets the complete tail of the output.
    pump(&mut output);
    if debug() {
        eprintln!("----- guest console (CODECAGE_VM_DEBUG) -----");
        eprint!("{}", fs::read_to_string(&console_log).unwrap_or_default());
        eprint!("{}", fs::read_to_string(&qemu_log).unwrap_or_default());
        eprintln!("---------------------------------------------");
    }
    if let Some(outcome) = verdict {
        return Ok(outcome);
    }
    let rc = fs::read_to_string(&rc_file)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok());
    match (rc, started) {
        (Some(rc), Some(s)) => {
            eprintln!(
                "[vm] exit status {rc} (command {}, total {})",
                secs(s.elapsed()),
                secs(t0.elapsed())
            );
            Ok(Outcome::Status(rc))
        }
        (_, Some(_)) => {
            eprintln!("[vm] the VM stopped while the command was running, without a status");
            show_failure(&console_log, &qemu_log);
            Ok(Outcome::Status(EXIT_VM_FAILED))
        }
        (_, None) => {
            show_failure(&console_log, &qemu_log);
            Ok(Outcome::NotStarted(format!(
                "the VM exited after {}",
                secs(t0.elapsed())
            )))
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

fn show_failure(console_log: &Path, qemu_log: &Path) {
    eprintln!("----- guest console (tail) -----");
    eprint!("{}", tail_lines(console_log, 40));
    let q = fs::read_to_string(qemu_log).unwrap_or_default();
    if !q.trim().is_empty() {
        eprintln!("----- qemu -----");
        eprint!("{}", tail_lines(qemu_log, 20));
    }
    eprintln!("--------------------------------");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{tests::parse, Task};

    fn run_options(args: &[&str]) -> Result<RunOptions, clap::Error> {
        let argv: Vec<&str> = std::iter::once("vm-run")
            .chain(args.iter().copied())
            .collect();
        match parse(&argv)? {
            Task::VmRun(opts) => Ok(opts),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parses_arguments() {
        let o = run_options(&["ls", "-la", "--timeout", "5"]).unwrap();
        assert_eq!(o.command, ["ls", "-la", "--timeout", "5"]);
        assert_eq!(o.timeout, DEFAULT_TIMEOUT);
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
        assert_eq!(o.timeout.duration(), Duration::from_secs(7));
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
