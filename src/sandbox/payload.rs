//! The payload's last mile, in the child the init forked: signals back to default, its own
//! session, the unprivileged sandbox user, /work, then execve with a PATH search.

use std::ffi::CString;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::sys::signal::SigSet;
use nix::sys::stat::{umask, Mode};
use nix::unistd::{chdir, execve, setgroups, setresgid, setresuid, setsid, Gid, Uid};

use super::fail;
use crate::channel::{self, Report, SetupError};
use crate::spec::{Spec, SANDBOX_PATH, SANDBOX_UID};

/// Prepares and execs the payload. Never returns: a setup failure is reported on the
/// channel (exit 125); a program that cannot run exits 127 (not found) or 126, as a shell.
pub fn exec(spec: &Spec, channel: &UnixStream) -> ! {
    if let Err(err) = prepare() {
        let _ = channel::write_message(&mut &*channel, &Report::SetupFailed(err));
        std::process::exit(125);
    }
    let (code, message) = exec_in_path(spec);
    eprintln!("codecage: {message}");
    std::process::exit(code)
}

fn prepare() -> Result<(), SetupError> {
    // Rust ignores SIGPIPE and ignored signals survive execve; the init blocked everything.
    reset_signals()?;
    // Its own session and process group: signals from the init reach its whole pipeline.
    setsid().map_err(|e| fail("new_session", e, "setsid"))?;
    drop_to_sandbox_user()?;
    chdir("/work").map_err(|e| fail("enter_workdir", e, "chdir /work"))?;
    umask(Mode::from_bits_truncate(0o022));
    Ok(())
}

fn reset_signals() -> Result<(), SetupError> {
    crate::sys::reset_signal_dispositions()
        .map_err(|e| fail("reset_signals", e, "sigaction SIG_DFL"))?;
    SigSet::all()
        .thread_unblock()
        .map_err(|e| fail("reset_signals", e, "sigprocmask"))
}

/// setgroups first (it needs the privilege the uid change drops), then gid, then uid.
/// Leaving uid 0 clears the permitted, effective and ambient capabilities (capabilities(7)).
fn drop_to_sandbox_user() -> Result<(), SetupError> {
    let (uid, gid) = (Uid::from_raw(SANDBOX_UID), Gid::from_raw(SANDBOX_UID));
    setgroups(&[]).map_err(|e| fail("drop_to_sandbox_user", e, "setgroups([])"))?;
    setresgid(gid, gid, gid)
        .map_err(|e| fail("drop_to_sandbox_user", e, format!("setresgid({gid})")))?;
    setresuid(uid, uid, uid)
        .map_err(|e| fail("drop_to_sandbox_user", e, format!("setresuid({uid})")))
}

/// execve through the payload's own PATH, like execvp(3) but with the sandbox's PATH rather
/// than the init's (empty) environment. Returns the exit status and message on failure.
fn exec_in_path(spec: &Spec) -> (i32, String) {
    let program = &spec.argv[0];
    let to_c = |s: &str| CString::new(s).unwrap_or_default();
    let argv: Vec<CString> = spec.argv.iter().map(|a| to_c(a)).collect();
    let envp: Vec<CString> = spec
        .env
        .iter()
        .map(|(k, v)| to_c(&format!("{k}={v}")))
        .collect();
    let path = spec
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
