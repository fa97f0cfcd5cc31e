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

use crate::cgroup::{self, RunCgroup, Usage};
use crate::outcome::{ErrorKind, Outcome, Phases, Skipped};
use crate::protocol::Phase;
use crate::spec::Limits;
use crate::spec::{LayerMode, Spec};
use crate::sys;
use crate::units::format_size;

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
    let start_ns = sys::monotonic_ns();
    if let Err(message) = spec.validate() {
        return Outcome::failed(ErrorKind::InvalidRequest, message);
    }
    let failed = |message: String| {
        let mut outcome =
            Outcome::failed(ErrorKind::Setup, format!("{message}; the code did not run"));
        outcome.duration = start.elapsed();
        outcome
    };
    let mut skipped = Vec::new();
    let cgroup = match (&spec.limits, spec.cgroup) {
        (Some(limits), mode @ (LayerMode::Required | LayerMode::BestEffort)) => {
            let best_effort = mode == LayerMode::BestEffort;
            match RunCgroup::create(cgroup::layout(), limits, best_effort) {
                Ok(cgroup) => {
                    skipped.extend(cgroup.skipped().iter().cloned());
                    Some(cgroup)
                }
                Err(e) if best_effort => {
                    skipped.push(Skipped::new("cgroup", "the whole layer", e.to_string()));
                    None
                }
                Err(e) => return failed(e.to_string()),
            }
        }
        _ => None,
    };
    let clone_ns = sys::monotonic_ns();
    let sandbox = match clone::spawn(spec, cgroup.as_ref()) {
        Ok(sandbox) => sandbox,
        Err(message) => return failed(message),
    };
    let go_ns = sandbox.go_ns;
    let (mut outcome, timeline) = supervise::supervise(sandbox, spec, start, sink, interrupt);
    outcome.skipped_layers.extend(skipped);
    let payload_started = timeline
        .marks
        .iter()
        .any(|(p, _)| *p == Phase::PayloadReady);
    if spec.cgroup == LayerMode::Off {
        outcome.skipped_layers.push(Skipped::new(
            "cgroup",
            "the whole layer",
            "turned off by the profile",
        ));
    }
    if let (Some(cgroup), Some(limits)) = (cgroup, &spec.limits) {
        account(&mut outcome, cgroup.usage(), limits, payload_started);
        if let Err(e) = cgroup.remove() {
            let note = format!("codecage could not remove the run's cgroup: {e}");
            outcome.message = Some(match outcome.message.take() {
                Some(message) => format!("{message}; {note}"),
                None => note,
            });
        }
    }
    outcome.phases = Some(phases(&timeline, [start_ns, clone_ns, go_ns]));
    outcome
}

/// The run's phases from the launcher's timestamps (start, clone, go) and the sandbox's
/// marks; a phase whose mark never came (a setup failure) is None.
fn phases(timeline: &supervise::Timeline, [start_ns, clone_ns, go_ns]: [u64; 3]) -> Phases {
    let at = |phase: Phase| {
        timeline
            .marks
            .iter()
            .find(|(p, _)| *p == phase)
            .map(|(_, t)| *t)
    };
    let span = |from: Option<u64>, to: Option<u64>| match (from, to) {
        (Some(a), Some(b)) if b >= a => Some((b - a) as f64 / 1e6),
        _ => None,
    };
    let (init, built) = (at(Phase::InitStarted), at(Phase::SandboxBuilt));
    let (ready, exited) = (at(Phase::PayloadReady), at(Phase::PayloadExited));
    Phases {
        prepare_ms: span(Some(start_ns), Some(clone_ns)),
        clone_ms: span(Some(clone_ns), Some(go_ns)),
        init_exec_ms: span(Some(go_ns), init),
        sandbox_ms: span(init, built),
        payload_setup_ms: span(built, ready),
        run_ms: span(ready, exited),
        teardown_ms: span(exited, Some(timeline.reaped_ns)),
        cleanup_ms: span(Some(timeline.reaped_ns), Some(sys::monotonic_ns())),
    }
}

/// Puts what the cgroup measured into the Outcome: the whole sandbox's figures replace the
/// init's rusage, OOM kills are counted, and the verdict names what ended the run. A run
/// the launcher stopped (timeout, output limit) keeps that verdict; OOM kills along the way
/// are only counted. Otherwise the run ended by OOM if the kernel's OOM killer took the
/// program itself (SIGKILL) or the init.
fn account(outcome: &mut Outcome, usage: Usage, limits: &Limits, payload_started: bool) {
    if let Some(peak) = usage.peak_memory {
        outcome.peak_memory_bytes = Some(peak);
    }
    if let Some(cpu) = usage.cpu {
        outcome.cpu = cpu;
    }
    outcome.pids_limit_hit = usage.pids_limit_hits > 0;
    outcome.oom_kills = usage.oom_kills;
    if usage.oom_kills == 0 {
        return;
    }
    let memory = format_size(limits.memory);
    let killed_by_oom = match outcome.error {
        // A setup failure the sandbox reported stays one; an init that died silently
        // while the OOM killer was at work was its victim (tmpfs and pipe pages belong to
        // no process, so the killer may pick the init when the payload is small).
        Some(ErrorKind::Setup) => outcome.init_lost,
        Some(_) => false,
        // The program, or the child a shell was waiting for (its status 128 + SIGKILL).
        None => {
            outcome.signal == Some(libc::SIGKILL) || outcome.exit_code == Some(128 + libc::SIGKILL)
        }
    };
    if !killed_by_oom {
        return;
    }
    outcome.error = Some(ErrorKind::Oom);
    outcome.message = Some(if !payload_started {
        format!(
            "the sandbox ran out of memory while it was being built (the code file in /work and the \
             interpreter's start count against the memory limit of {memory}); the code did not run. Allow \
             more memory, or send less code."
        )
    } else {
        let who = if outcome.init_lost {
            "the sandbox's init, and with it every process".to_string()
        } else {
            "the program".to_string()
        };
        format!(
            "the code reached the memory limit of {memory} and the kernel's OOM killer killed {who}; the \
             output up to then is kept. Use less memory (process data in chunks, free large objects), or \
             allow more memory."
        )
    });
}
