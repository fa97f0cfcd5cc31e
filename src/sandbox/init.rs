//! pid 1 of the sandbox. An interpreter run as pid 1 would ignore SIGTERM and pile up
//! zombies (a pid 1 gets no default signal actions, pid_namespaces(7)), so this init forks the payload, forwards signals to it,
//! reaps every child, and when the payload ends kills whatever is left.

use std::os::unix::net::UnixStream;

use nix::errno::Errno;
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::{payload, seccomp};
use crate::protocol::{FromSandbox, Phase, SetupError, Step};
use crate::spec::{LayerMode, Spec};
use crate::sys::{self, ForkedInit};

/// Signals the init passes on to the payload's process group.
const FORWARDED: &[Signal] = &[
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
];

/// Runs the payload to its end and reports how it ended.
pub fn run_payload(spec: &Spec, channel: &UnixStream) -> FromSandbox {
    // Every signal is blocked and taken with sigwait: a blocked SIGCHLD stays pending, so
    // no child's exit is missed between two waits, and the payload inherits nothing odd
    // (it unblocks everything before exec).
    let signals = SigSet::all();
    if let Err(e) = signals.thread_block() {
        return FromSandbox::SetupFailed(SetupError::errno(
            Step::BlockInitSignals,
            e,
            "sigprocmask",
        ));
    }
    // Compiled here, once, before the fork: the payload only installs it.
    let filters = match spec.seccomp {
        LayerMode::Off => None,
        _ => match seccomp::compile() {
            Ok(filters) => Some(filters),
            Err(e) => {
                return FromSandbox::SetupFailed(SetupError::refused(Step::CompileSeccomp, e))
            }
        },
    };
    let payload = match sys::fork_in_init() {
        Ok(ForkedInit::Child) => payload::exec(spec, filters.as_ref(), channel),
        Ok(ForkedInit::Parent(pid)) => pid,
        Err(e) => return FromSandbox::SetupFailed(SetupError::errno(Step::ForkPayload, e, "fork")),
    };
    let status = loop {
        match signals.wait() {
            Ok(Signal::SIGCHLD) => {
                if let Some(status) = reap_all(payload) {
                    break status;
                }
            }
            Ok(signal) if FORWARDED.contains(&signal) => forward(payload, signal),
            _ => {}
        }
    };
    // From pid 1, kill(-1) reaches every other process of the namespace: nothing the
    // payload started outlives it, double-forked, setsid'd or not.
    let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
    crate::protocol::mark(channel, Phase::PayloadExited);
    match status {
        WaitStatus::Signaled(_, signal, _) => FromSandbox::Exited {
            code: None,
            signal: Some(signal as i32),
        },
        WaitStatus::Exited(_, code) => FromSandbox::Exited {
            code: Some(code),
            signal: None,
        },
        _ => FromSandbox::Exited {
            code: None,
            signal: None,
        },
    }
}

/// Reaps every child that has ended; returns the payload's status once it is among them.
fn reap_all(payload: Pid) -> Option<WaitStatus> {
    let mut payload_status = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return payload_status,
            Ok(status @ (WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _)))
                if pid == payload =>
            {
                payload_status = Some(status);
            }
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return payload_status,
        }
    }
}

fn forward(payload: Pid, signal: Signal) {
    // The payload leads its own process group; a pipeline it runs gets the signal too, as
    // from a terminal.
    if kill(Pid::from_raw(-payload.as_raw()), signal).is_err() {
        let _ = kill(payload, signal);
    }
}
