//! The payload's last mile, in the child the init forked. Each step is one function; the
//! order is the security argument:
//!
//! 0. with a ruleset of its own (an approved command, a context's interpreter): its own mount
//!    namespace, where the extra files are bound exec (no other process sees them);
//! 1. signals unblocked (the init already set their dispositions back to default), its own
//!    session (and a terminal's slave as its controlling terminal, when it runs on one);
//! 2. rlimits (lowering needs no privilege);
//! 3. bounding and inheritable capabilities dropped while we are still the sandbox's root
//!    (dropping the bounding set needs CAP_SETPCAP);
//! 4. no supplementary groups, then uid/gid 1000: leaving uid 0 clears the permitted,
//!    effective and ambient sets; then every set is checked empty;
//! 5. /work;
//! 6. no_new_privs (landlock and seccomp need it; setuid binaries lose their power);
//! 7. landlock, built now that the final mounts exist;
//! 8. every fd above 2 close-on-exec;
//! 9. seccomp, last (after it only handing its listener, the netlink watch, to the init:
//!    sendmsg and close, which it allows); then execve.

use std::ffi::CString;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use caps::CapSet;
use nix::errno::Errno;
use nix::sys::resource::{setrlimit, Resource};
use nix::sys::signal::SigSet;
use nix::unistd::{chdir, execve, setgroups, setresgid, setresuid, setsid, Gid, Uid};

use super::landlock;
use super::seccomp::Filters;
use crate::protocol::{self, FromSandbox, SetupError, Step};
use crate::spec::{SandboxSpec, SANDBOX_PATH, SANDBOX_UID};

/// The stack limit of the payload's processes (glibc sizes thread stacks from it).
const STACK_LIMIT: u64 = 8 << 20;

/// The seccomp layer for a payload: the compiled filters, and where to hand the listener of
/// their netlink watch to the init.
pub struct Seccomp<'a> {
    pub filters: &'a Filters,
    pub netlink_outbox: Option<std::os::fd::BorrowedFd<'a>>,
}

/// One payload to start: what the launcher asked for, and the fds that came with it
/// (stdin, stdout, stderr, and a REPL driver's channel).
pub struct Launch<'a> {
    pub id: u64,
    pub argv: &'a [String],
    pub env: &'a [(String, String)],
    /// Where it starts, relative to /work (default: /work itself).
    pub cwd: Option<&'a str>,
    pub fds: Vec<std::os::fd::OwnedFd>,
    /// The fds are a terminal's slave: it becomes the payload's controlling terminal.
    pub terminal: bool,
    /// Its exec allowlist when it differs from the sandbox's (an approved command's: the
    /// sandbox's plus what was approved).
    pub exec: Option<&'a crate::exec_policy::ExecAllowlist>,
    /// The files of `exec` beyond the sandbox's allowlist: bound exec in the payload's own
    /// mount namespace before anything else.
    pub exec_binds: &'a [PathBuf],
}

/// Prepares and execs the payload. Never returns: a setup failure is reported on the
/// channel (exit 125); a program that cannot run exits 127 (not found) or 126, as a shell.
pub fn exec(
    spec: &SandboxSpec,
    launch: &Launch,
    seccomp: Option<Seccomp>,
    channel: &UnixStream,
) -> ! {
    match prepare(spec, launch, seccomp, channel) {
        Ok(()) => {
            let (code, message) = exec_in_path(launch);
            eprintln!("codecage: {message}");
            std::process::exit(code)
        }
        Err(error) => {
            let failed = FromSandbox::SetupFailed {
                id: Some(launch.id),
                error,
            };
            let _ = protocol::write_message(&mut &*channel, &failed, protocol::MAX_FRAME);
            std::process::exit(125);
        }
    }
}

/// A payload with a ruleset of its own (an approved command, a context's interpreter)
/// gets its own mount namespace, a copy of the sandbox's with every mount private, and in
/// it binds `files` exec (super::mount::bind_exec). Its children inherit the namespace;
/// the sandbox's other processes never see these binds, so the files stay unmappable
/// (noexec) for them, the loader's `ld.so FILE` included. While still the sandbox's root,
/// before the capabilities go.
fn own_exec_mounts(files: &[PathBuf]) -> Result<(), SetupError> {
    if files.is_empty() {
        return Ok(());
    }
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(|e| {
        SetupError::errno(
            Step::RestrictExecMounts,
            e,
            "unshare(CLONE_NEWNS) for the payload's own exec binds",
        )
    })?;
    // Nothing in the sandbox is shared (its root became a recursive slave at setup), but
    // a private copy says so by construction: no bind here reaches the init's table.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| {
        SetupError::errno(
            Step::RestrictExecMounts,
            e,
            "making the payload's mounts private",
        )
    })?;
    for file in files {
        super::mount::bind_exec(file, file)?;
    }
    Ok(())
}

fn prepare(
    spec: &SandboxSpec,
    launch: &Launch,
    seccomp: Option<Seccomp>,
    channel: &UnixStream,
) -> Result<(), SetupError> {
    attach_fds(&launch.fds)?;
    own_exec_mounts(launch.exec_binds)?;
    unblock_signals()?;
    setsid().map_err(|e| SetupError::errno(Step::NewSession, e, "setsid"))?;
    if launch.terminal {
        // The new session's process group is then the terminal's foreground group: ^C on
        // it is SIGINT to the payload, a resize SIGWINCH.
        crate::sys::set_controlling_terminal(0)
            .map_err(|e| SetupError::errno(Step::TakeTerminal, e, "ioctl(0, TIOCSCTTY)"))?;
    }
    set_rlimits(spec)?;
    prefer_for_oom_kill()?;
    drop_bounding_and_inheritable_caps()?;
    drop_to_sandbox_user()?;
    check_no_capabilities()?;
    // (The umask, 022, is the init's, set before it forked us.)
    chdir("/work").map_err(|e| SetupError::errno(Step::EnterWorkdir, e, "chdir /work"))?;
    if let Some(cwd) = launch.cwd {
        // As the sandbox's user, before landlock: it may enter what it could read anyway.
        chdir(cwd).map_err(|e| SetupError::errno(Step::EnterWorkdir, e, format!("chdir {cwd}")))?;
    }
    nix::sys::prctl::set_no_new_privs()
        .map_err(|e| SetupError::errno(Step::SetNoNewPrivs, e, "PR_SET_NO_NEW_PRIVS"))?;
    let exec = launch.exec.or(spec.exec.as_ref());
    let landlock = landlock::restrict(spec.landlock, &spec.network, exec)?;
    mark_fds_cloexec(launch.fds.len() as i32)?;
    let mut skipped = landlock.skipped;
    if seccomp.is_none() {
        skipped.push(crate::outcome::Skipped::new(
            "seccomp",
            "the whole layer",
            "turned off by the profile",
        ));
    }
    // The last message before the filter: it needs no syscall the filter might deny.
    protocol::mark(channel, protocol::Phase::PayloadReady);
    let report = FromSandbox::Hardened {
        id: launch.id,
        landlock_abi: landlock.abi,
        skipped,
    };
    protocol::write_message(&mut &*channel, &report, protocol::MAX_FRAME).map_err(|e| {
        SetupError::io(
            Step::ReportHardening,
            &e,
            "telling the launcher which layers are on",
        )
    })?;
    if let Some(seccomp) = seccomp {
        let listener = super::seccomp::apply(seccomp.filters).map_err(|(which, e)| {
            SetupError::io(
                Step::ApplySeccomp,
                &e,
                format!("installing the {which} filter"),
            )
        })?;
        // The program's notifications (the netlink watch) are the init's to answer. Without
        // an outbox nobody would, and the watched calls would fail with ENOSYS; the init
        // has one whenever the layer is on.
        if let Some(outbox) = seccomp.netlink_outbox {
            super::netlink::send_listener(outbox, &listener).map_err(|e| {
                SetupError::io(
                    Step::WatchNetlink,
                    &e,
                    "handing the netlink watch to the init",
                )
            })?;
        }
    }
    Ok(())
}

/// The launcher's fds for this payload on 0, 1, 2 (and 3, a driver's channel).
fn attach_fds(fds: &[std::os::fd::OwnedFd]) -> Result<(), SetupError> {
    use std::os::fd::AsRawFd;
    // A source already in the range would be overwritten before it is copied: first lift
    // every source above it.
    let lifted: Vec<std::os::fd::OwnedFd> = fds
        .iter()
        .map(|fd| crate::sys::dup_above(std::os::fd::AsFd::as_fd(fd), 10))
        .collect::<Result<_, _>>()
        .map_err(|e| SetupError::io(Step::AttachPayloadFds, &e, "moving the payload's fds"))?;
    for (target, fd) in lifted.iter().enumerate() {
        crate::sys::child_dup2(fd.as_raw_fd(), target as i32).map_err(|e| {
            SetupError::errno(
                Step::AttachPayloadFds,
                Errno::from_raw(e),
                format!("dup2 onto fd {target}"),
            )
        })?;
    }
    Ok(())
}

/// The init reset every disposition (Rust's ignored SIGPIPE, a caller's ignored SIGCHLD)
/// before it forked us, and set none since; what remains is the mask it blocked.
fn unblock_signals() -> Result<(), SetupError> {
    SigSet::all()
        .thread_unblock()
        .map_err(|e| SetupError::errno(Step::UnblockSignals, e, "sigprocmask"))
}

/// No core dumps; `nofile` open files; 8 MiB stacks; the pids limit as RLIMIT_NPROC; 8 MiB
/// of locked memory; no realtime priority. Defence in depth behind the cgroup limits. Only
/// ever lowered: a limit the launcher already runs under is kept.
///
/// No RLIMIT_FSIZE: every file system the payload may write is a tmpfs with a size (or
/// memfd and shared memory, charged to the memory cgroup), so a file size limit would add
/// no bound, and it broke what tmpfs allows: sparse files larger than the tmpfs (LMDB's
/// map files, test suites' large-file tests), and programs that check the limit is off.
fn set_rlimits(spec: &SandboxSpec) -> Result<(), SetupError> {
    // The pids limit again, per uid: the payload's uid is the run's own, so this holds
    // even where a best-effort profile ran without a cgroup. One above the cgroup's limit
    // for the payload: the kernel checks RLIMIT_NPROC before the pids controller, and a
    // fork refused by the cgroup is the one that `pids_limit_hit` can report.
    let nproc = spec.limits.map_or(4096, |l| l.pids + 1);
    for (resource, name, value) in [
        (Resource::RLIMIT_CORE, "RLIMIT_CORE", 0),
        (Resource::RLIMIT_NOFILE, "RLIMIT_NOFILE", spec.nofile),
        (Resource::RLIMIT_STACK, "RLIMIT_STACK", STACK_LIMIT),
        (Resource::RLIMIT_NPROC, "RLIMIT_NPROC", nproc),
        (Resource::RLIMIT_MEMLOCK, "RLIMIT_MEMLOCK", 8 << 20),
        (Resource::RLIMIT_RTPRIO, "RLIMIT_RTPRIO", 0),
    ] {
        let (_, hard) = nix::sys::resource::getrlimit(resource)
            .map_err(|e| SetupError::errno(Step::SetRlimits, e, name))?;
        let value = value.min(hard);
        setrlimit(resource, value, value)
            .map_err(|e| SetupError::errno(Step::SetRlimits, e, format!("{name} = {value}")))?;
    }
    Ok(())
}

/// oom_score_adj 1000, inherited by everything the payload starts: when the sandbox's
/// memory runs out, the OOM killer takes a payload process, not the init (whose death
/// would end the run without a word), and in a host-wide shortage the sandbox goes first.
fn prefer_for_oom_kill() -> Result<(), SetupError> {
    std::fs::write("/proc/self/oom_score_adj", "1000").map_err(|e| {
        SetupError::io(
            Step::PreferForOomKill,
            &e,
            "writing /proc/self/oom_score_adj",
        )
    })
}

fn drop_bounding_and_inheritable_caps() -> Result<(), SetupError> {
    let caps_err = |set: &str, e: caps::errors::CapsError| {
        SetupError::from_error(
            Step::DropCapabilities,
            &e,
            format!("clearing the {set} set"),
        )
    };
    caps::clear(None, CapSet::Bounding).map_err(|e| caps_err("bounding", e))?;
    caps::clear(None, CapSet::Inheritable).map_err(|e| caps_err("inheritable", e))?;
    caps::clear(None, CapSet::Ambient).map_err(|e| caps_err("ambient", e))
}

/// setgroups first (it needs the privilege the uid change drops), then gid, then uid.
fn drop_to_sandbox_user() -> Result<(), SetupError> {
    let (uid, gid) = (Uid::from_raw(SANDBOX_UID), Gid::from_raw(SANDBOX_UID));
    setgroups(&[]).map_err(|e| SetupError::errno(Step::DropToSandboxUser, e, "setgroups([])"))?;
    setresgid(gid, gid, gid)
        .map_err(|e| SetupError::errno(Step::DropToSandboxUser, e, format!("setresgid({gid})")))?;
    setresuid(uid, uid, uid)
        .map_err(|e| SetupError::errno(Step::DropToSandboxUser, e, format!("setresuid({uid})")))
}

/// The uid change cleared permitted, effective and ambient (capabilities(7)); clear them
/// again anyway and refuse to go on if anything is left.
fn check_no_capabilities() -> Result<(), SetupError> {
    for set in [
        CapSet::Effective,
        CapSet::Permitted,
        CapSet::Inheritable,
        CapSet::Ambient,
        CapSet::Bounding,
    ] {
        if !matches!(set, CapSet::Bounding) {
            let _ = caps::clear(None, set);
        }
        let left = caps::read(None, set).map_err(|e| {
            SetupError::from_error(
                Step::CheckNoCapabilities,
                &e,
                format!("reading the {set:?} set"),
            )
        })?;
        if !left.is_empty() {
            return Err(SetupError::refused(
                Step::CheckNoCapabilities,
                format!("{set:?} still holds {left:?}"),
            ));
        }
    }
    Ok(())
}

/// The payload keeps only its stdio (and a driver's channel on 3); everything else it
/// inherited from the init closes at exec.
fn mark_fds_cloexec(keep: i32) -> Result<(), SetupError> {
    crate::sys::cloexec_from(keep).map_err(|e| {
        SetupError::errno(
            Step::MarkFdsCloexec,
            Errno::from_raw(e),
            format!("close_range({keep}, ~0, CLOEXEC)"),
        )
    })
}

/// execve through the payload's own PATH, like execvp(3) but with the sandbox's PATH rather
/// than the init's (empty) environment. Returns the exit status and message on failure.
fn exec_in_path(launch: &Launch) -> (i32, String) {
    let program = &launch.argv[0];
    let to_c = |s: &str| CString::new(s).unwrap_or_default();
    let argv: Vec<CString> = launch.argv.iter().map(|a| to_c(a)).collect();
    let envp: Vec<CString> = launch
        .env
        .iter()
        .map(|(k, v)| to_c(&format!("{k}={v}")))
        .collect();
    let path = launch
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or(SANDBOX_PATH, |(_, v)| v.as_str());
    let candidates: Vec<PathBuf> = if program.contains('/') {
        vec![PathBuf::from(program)]
    } else {
        path.split(':')
            .filter(|d| !d.is_empty())
            .map(|d| PathBuf::from(d).join(program))
            .collect()
    };
    let mut denied = None;
    for candidate in &candidates {
        let Ok(path) = CString::new(candidate.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        match execve(&path, &argv, &envp) {
            Err(Errno::ENOENT | Errno::ENOTDIR) => continue,
            Err(Errno::EACCES) => denied = Some(Errno::EACCES),
            Err(e) => return (126, format!("{program}: cannot execute: {}", e.desc())),
            Ok(never) => match never {},
        }
    }
    match denied {
        Some(e) => (126, format!("{program}: cannot execute: {}", e.desc())),
        None if program.contains('/') => (127, format!("{program}: No such file or directory")),
        None => (
            127,
            format!("{program}: command not found in PATH ({path})"),
        ),
    }
}
