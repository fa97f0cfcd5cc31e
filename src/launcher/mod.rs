//! The mechanism: `run(&Spec) -> Outcome`, the one entry point every front end uses.
//!
//! ```text
//! launcher (host, root)                       sandbox (new user, mount, pid, net, ipc, uts ns)
//!  |- validate Spec, open fds (all CLOEXEC)
//!  |- clone3 ---------------------------------> raw child: waits for "go"
//!  |- write uid_map / gid_map
//!  |- "go" + Spec ----------------------------> setresuid(0), PDEATHSIG, fds 0-3, exec init
//!  |                                             init (pid 1): cgroup ns, mounts, pivot_root,
//!  |                                             hostname, lo; forks the payload; reaps
//!  |<-- reports (setup error | exit status) ---- exits when the payload did
//!  '- supervise: output cap, timeout, signals; reap; Outcome
//! ```
//!
//! Safe to call from many threads at once: the child runs only raw syscalls until it execs
//! a fresh codecage, every fd is CLOEXEC, and concurrent runs share no files or ids.

mod clone;
mod supervise;

use std::time::Instant;

use nix::sys::signalfd::SignalFd;

use crate::outcome::{ErrorKind, Outcome};
use crate::spec::Spec;

pub use clone::CHANNEL_FD;

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Runs `spec` in a new sandbox and waits for it. Output is collected into the Outcome.
pub fn run(spec: &Spec) -> Outcome {
    run_with(spec, &mut |_, _| {}, None)
}

/// Runs `spec`, also passing each chunk of output to `sink` as it arrives (within the output
/// cap). Signals read from `interrupt` are forwarded to the sandbox's init, which passes them
/// on to the payload: a CLI blocks SIGINT/SIGTERM and hands their signalfd here.
pub fn run_with(
    spec: &Spec,
    sink: &mut dyn FnMut(Stream, &[u8]),
    interrupt: Option<&SignalFd>,
) -> Outcome {
    let start = Instant::now();
    if let Err(message) = spec.validate() {
        return Outcome::failed(ErrorKind::InvalidRequest, message);
    }
    let sandbox = match clone::spawn(spec) {
        Ok(sandbox) => sandbox,
        Err(message) => {
            let mut outcome =
                Outcome::failed(ErrorKind::Setup, format!("{message}; the code did not run"));
            outcome.duration = start.elapsed();
            return outcome;
        }
    };
    supervise::supervise(sandbox, spec, start, sink, interrupt)
}
