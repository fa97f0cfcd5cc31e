//! Watching a one-shot run: drain stdout and stderr under the output cap, enforce the
//! wall-clock limit, forward signals, read the init's reports, and reap it.
//!
//! Killing the whole tree needs no bookkeeping: SIGKILL to the init (pid 1 of the sandbox's
//! pid namespace) makes the kernel kill every other process of the namespace, and the init
//! only finishes exiting once they are all gone (pid_namespaces(7)), so when `wait4` returns
//! nothing of the sandbox is left running, whatever it double-forked or setsid'd.

use std::io::{ErrorKind as IoErrorKind, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signalfd::SignalFd;

use super::{OutputPipes, Sandbox, Stream};
use crate::outcome::{ErrorKind, Outcome};
use crate::protocol::FromSandbox;
use crate::spec::Exec;
use crate::sys;
use crate::units::{format_duration, format_size};

/// How long to keep draining output after the init has exited. Every writer is dead by then,
/// so EOF comes at once; the bound only guards against the impossible.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// After the launcher sent SIGKILL, it waits for the kernel to finish the kill, waking at
/// least this often.
const KILLED_WAKE: Duration = Duration::from_secs(60);
/// Longest single poll: the loop re-checks its deadlines at least this often.
const MAX_POLL: Duration = Duration::from_secs(60);
/// What one read takes from a pipe.
const READ_CHUNK: usize = 64 * 1024;

/// Runs `f` with a buffer of [`READ_CHUNK`] bytes, one per thread and kept for its life:
/// a server's session calls allocated and zeroed one (and a stack array for each read of
/// a driver's channel) every call, about 4.5 % of a burst's server CPU. A nested call gets a
/// buffer of its own.
pub(super) fn with_read_buf<R>(f: impl FnOnce(&mut [u8]) -> R) -> R {
    thread_local!(static BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) });
    let mut buf = BUF.take();
    buf.resize(READ_CHUNK, 0);
    let result = f(&mut buf);
    BUF.set(buf);
    result
}

/// What the loop polls, by name.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    Stdout,
    Stderr,
    Channel,
    Pidfd,
    Cancel,
    Interrupt,
}

/// What, besides the deadline and the output cap, may stop a run: signals to forward to
/// the payload (a CLI's), and a canceller (a server shutting down).
#[derive(Clone, Copy)]
pub(super) struct Stops<'a> {
    pub interrupt: Option<&'a SignalFd>,
    pub cancel: Option<&'a super::Canceller>,
}

/// Which of the polled fds are still worth polling.
struct Open {
    stdout: bool,
    stderr: bool,
    channel: bool,
}

/// Output kept under a cap, passed on to a sink as it comes.
pub(crate) struct Output<'a> {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub limit: u64,
    pub truncated: bool,
    pub sink: &'a mut dyn FnMut(Stream, &[u8]),
}

impl Output<'_> {
    /// Keeps `chunk` up to the cap. Returns false once the cap is passed.
    pub(crate) fn take(&mut self, stream: Stream, chunk: &[u8]) -> bool {
        let used = (self.stdout.len() + self.stderr.len()) as u64;
        let room = self.limit.saturating_sub(used) as usize;
        let kept = &chunk[..chunk.len().min(room)];
        match stream {
            Stream::Stdout => self.stdout.extend_from_slice(kept),
            Stream::Stderr => self.stderr.extend_from_slice(kept),
        }
        if !kept.is_empty() {
            (self.sink)(stream, kept);
        }
        if chunk.len() > room {
            self.truncated = true;
            return false;
        }
        true
    }

    /// Reads what `pipe` holds now. Returns (still open, still under the cap).
    pub(crate) fn drain(
        &mut self,
        pipe: &mut std::fs::File,
        stream: Stream,
        buf: &mut [u8],
    ) -> (bool, bool) {
        loop {
            match pipe.read(buf) {
                Ok(0) => return (false, true),
                Ok(n) => {
                    if !self.take(stream, &buf[..n]) {
                        return (false, false);
                    }
                }
                Err(e) if e.kind() == IoErrorKind::WouldBlock => return (true, true),
                Err(e) if e.kind() == IoErrorKind::Interrupted => continue,
                Err(_) => return (false, true),
            }
        }
    }
}

/// How a supervised run ends.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// When the init has exited: it is reaped, and its rusage is in the Outcome.
    Reaped,
    /// As soon as the init reports the payload's end (its `Exited`, sent once every other
    /// process of the sandbox is killed and reaped and the output files are sent): the
    /// init is left exiting, for [`super::Teardown`]. Only for a sandbox whose cgroup keeps
    /// the figures the init's rusage would give (its memory peak); if the init ends
    /// without that report, the run ends as with `Reaped`.
    Reported,
}

/// Supervises the sandbox's one payload until its end (see [`End`]) and returns the
/// Outcome and when the init was reaped (None: it was not, the run ended at the init's
/// report). `start` is when the launch began; the timeout counts from there.
pub(super) fn supervise(
    sandbox: &mut Sandbox,
    mut pipes: OutputPipes,
    exec: &Exec,
    start: Instant,
    sink: &mut dyn FnMut(Stream, &[u8]),
    stops: Stops,
    end: End,
) -> (Outcome, Option<u64>) {
    let interrupt = stops.interrupt;
    let deadline = start + exec.timeout;
    for fd in [pipes.stdout.as_fd(), pipes.stderr.as_fd()] {
        let _ = set_nonblocking(fd);
    }
    let mut output = Output {
        stdout: Vec::new(),
        stderr: Vec::new(),
        limit: exec.output_limit,
        truncated: false,
        sink,
    };
    let mut open = Open {
        stdout: true,
        stderr: true,
        channel: true,
    };
    let mut killed_for: Option<ErrorKind> = None;
    let mut exited_at: Option<Instant> = None;
    // The payload's end was reported (with `End::Reported`) before the init exited.
    let mut reported = false;
    let mut buf = vec![0u8; READ_CHUNK];
    let mut poll_error = None;

    loop {
        let now = Instant::now();
        if let Some(at) = exited_at {
            if (!open.stdout && !open.stderr) || now >= at + DRAIN_GRACE {
                break;
            }
        } else if now >= deadline && killed_for.is_none() {
            killed_for = Some(ErrorKind::Timeout);
            sandbox.kill();
        }
        let wake_at = match exited_at {
            Some(at) => at + DRAIN_GRACE,
            None if killed_for.is_some() => now + KILLED_WAKE,
            None => deadline,
        };
        let polled = poll_once(
            &pipes,
            sandbox,
            stops,
            &open,
            exited_at.is_none(),
            wake_at.saturating_duration_since(now),
        );
        let ready = match polled {
            Ok(ready) => ready,
            Err(e) => {
                poll_error = Some(format!("poll failed while supervising the sandbox: {e}"));
                killed_for.get_or_insert(ErrorKind::Setup);
                sandbox.kill();
                break;
            }
        };
        for (slot, stream) in [
            (Slot::Stdout, Stream::Stdout),
            (Slot::Stderr, Stream::Stderr),
        ] {
            let (is_open, pipe) = match stream {
                Stream::Stdout => (&mut open.stdout, &mut pipes.stdout),
                Stream::Stderr => (&mut open.stderr, &mut pipes.stderr),
            };
            if ready(slot) && *is_open {
                let (still_open, under_cap) = output.drain(pipe, stream, &mut buf);
                *is_open = still_open;
                if !under_cap && killed_for.is_none() {
                    killed_for = Some(ErrorKind::OutputLimit);
                    sandbox.kill();
                }
            }
        }
        if killed_for == Some(ErrorKind::OutputLimit) {
            // Past the cap nothing more is read; the sandbox is already being killed.
            (open.stdout, open.stderr) = (false, false);
        }
        if ready(Slot::Channel) && open.channel {
            open.channel = sandbox.read_channel();
            if end == End::Reported && exited_at.is_none() && sandbox.payload_reported() {
                exited_at = Some(Instant::now());
                reported = true;
            }
        }
        if ready(Slot::Pidfd) && exited_at.is_none() {
            exited_at = Some(Instant::now());
        }
        if ready(Slot::Cancel) && killed_for.is_none() && exited_at.is_none() {
            killed_for = Some(ErrorKind::Interrupted);
            sandbox.kill();
        }
        if ready(Slot::Interrupt) {
            if let Some(signals) = interrupt {
                if let Ok(Some(info)) = signals.read_signal() {
                    // Forwarded to the init, which passes it on to the payload.
                    let _ = sys::pidfd_send_signal(sandbox.pidfd(), info.ssi_signo as i32);
                }
            }
        }
    }

    let (status, rusage, reaped_ns) = match reported {
        // The init is exiting (nothing else of the sandbox is left): its status says
        // nothing the report did not, and the cgroup has what its rusage would give.
        true => (None, None, None),
        false => {
            let (status, rusage) = match sandbox.reap() {
                Ok((status, rusage)) => (Some(*status), Some(*rusage)),
                Err(_) => (None, None),
            };
            (status, rusage, Some(sys::monotonic_ns()))
        }
    };
    // The init wrote its last report before exiting; collect what is still buffered. One
    // pass: a copy of its end held elsewhere must not keep us reading.
    sandbox.read_channel();
    let mut outcome = Outcome {
        stdout: output.stdout,
        stderr: output.stderr,
        truncated: output.truncated,
        duration: start.elapsed(),
        ..Outcome::default()
    };
    if let Some(usage) = rusage {
        outcome.cpu = timeval(usage.ru_utime) + timeval(usage.ru_stime);
        // ru_maxrss is in KiB: the largest resident set of the init or any process it
        // reaped. (The cgroup layer reports the whole sandbox's peak instead.)
        outcome.peak_memory_bytes = Some(usage.ru_maxrss.max(0) as u64 * 1024);
    }
    verdict(&mut outcome, sandbox, exec, killed_for, status, poll_error);
    (outcome, reaped_ns)
}

/// What ended the run, from what the launcher did and what the init reported.
fn verdict(
    outcome: &mut Outcome,
    sandbox: &mut Sandbox,
    exec: &Exec,
    killed_for: Option<ErrorKind>,
    status: Option<i32>,
    poll_error: Option<String>,
) {
    let mut report = None;
    let mut output_total = 0;
    while let Some(message) = sandbox.next_message() {
        match message {
            FromSandbox::Hardened {
                landlock_abi,
                skipped,
                ..
            } => {
                outcome.landlock_abi = landlock_abi;
                outcome.skipped_layers = skipped;
            }
            // A setup failure stays the answer even if an exit report follows it.
            FromSandbox::SetupFailed { error, .. }
                if !matches!(report, Some(FromSandbox::SetupFailed { .. })) =>
            {
                report = Some(FromSandbox::SetupFailed { id: None, error });
            }
            message @ FromSandbox::Exited { .. } if report.is_none() => report = Some(message),
            FromSandbox::OutputFile { path, data } => {
                if let Some(rules) = &exec.outputs {
                    take_output_file(outcome, rules, &mut output_total, path, data);
                }
            }
            FromSandbox::OutputsDone { skipped } => outcome.files_skipped.extend(skipped),
            _ => {}
        }
    }
    match (killed_for, report) {
        (Some(ErrorKind::Timeout), _) => {
            outcome.error = Some(ErrorKind::Timeout);
            outcome.message = Some(format!(
                "the code ran longer than the time limit of {} and was stopped, with every process \
                 it started; the output up to that point is kept. Make it faster or do less per run, \
                 or allow more time.",
                format_duration(exec.timeout)
            ));
        }
        (Some(ErrorKind::Interrupted), _) => {
            outcome.error = Some(ErrorKind::Interrupted);
            outcome.message = Some(
                "the run was stopped because codecage is shutting down; the output up to then is kept"
                    .into(),
            );
        }
        (Some(ErrorKind::OutputLimit), _) => {
            outcome.error = Some(ErrorKind::OutputLimit);
            outcome.message = Some(format!(
                "the code wrote more than the output limit of {} (stdout and stderr together) and was \
                 stopped there; the output is cut at the limit. Print less (a summary, the head of the \
                 data), or write large results to a file under /work.",
                format_size(exec.output_limit)
            ));
        }
        (_, Some(FromSandbox::SetupFailed { error, .. })) => {
            outcome.error = Some(ErrorKind::Setup);
            outcome.message = Some(format!("{error}; the code did not run"));
        }
        (_, Some(FromSandbox::Exited { code, signal, .. })) => {
            outcome.exit_code = code;
            outcome.signal = signal;
        }
        (killed, _) => {
            outcome.error = Some(ErrorKind::Setup);
            outcome.init_lost = true;
            let status = match status {
                Some(status) => describe_status(status),
                None => "it could not be reaped".to_string(),
            };
            let mut message =
                format!("the sandbox init ended without reporting a result ({status})");
            for e in [poll_error.as_deref(), sandbox.protocol_error()]
                .into_iter()
                .flatten()
            {
                message.push_str(&format!("; {e}"));
            }
            if killed == Some(ErrorKind::Setup) {
                message.push_str("; the launcher stopped it");
            }
            outcome.message = Some(message);
        }
    }
}

/// An output file from the init, kept if it is within the rules (the launcher checks again
/// what the init checked: it does not trust it more than it must). `total` is the size of
/// the files taken so far.
pub(crate) fn take_output_file(
    outcome: &mut Outcome,
    rules: &crate::files::OutputRules,
    total: &mut u64,
    path: String,
    data: Vec<u8>,
) {
    use crate::files::{SkipReason, SkippedFile};
    let size = data.len() as u64;
    let reason = if crate::files::check_input_path(&path).is_err() {
        Some(SkipReason::BadName)
    } else if size > rules.max_file {
        Some(SkipReason::Size)
    } else if outcome.files.len() as u64 >= rules.max_files {
        Some(SkipReason::CountCap)
    } else if *total + size > rules.max_total {
        Some(SkipReason::TotalCap)
    } else {
        None
    };
    if let Some(reason) = reason {
        outcome.files_skipped.push(SkippedFile { path, reason });
        return;
    }
    *total += size;
    outcome.files.push(crate::files::OutputFile {
        media_type: crate::files::media_type(&path).to_string(),
        sha256: crate::files::sha256(&data),
        size,
        path,
        data: Some(data),
    });
}

/// Polls the fds that are still open for up to `timeout` (EINTR counts as nothing ready)
/// and says which slots are ready.
fn poll_once(
    pipes: &OutputPipes,
    sandbox: &Sandbox,
    stops: Stops,
    open: &Open,
    running: bool,
    timeout: Duration,
) -> nix::Result<impl Fn(Slot) -> bool> {
    let timeout = timeout.min(MAX_POLL).as_millis() as i32 + 1;
    let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    // Only what is still wanted is polled: a closed pipe or an exited process reports
    // POLLHUP whatever the events asked for, and would make the loop spin.
    let cancel = stops.cancel.map(|c| c.fd());
    let signals = stops.interrupt.map(|s| s.as_fd());
    let candidates = [
        (Slot::Stdout, Some(pipes.stdout.as_fd()), open.stdout),
        (Slot::Stderr, Some(pipes.stderr.as_fd()), open.stderr),
        (Slot::Channel, Some(sandbox.channel_fd()), open.channel),
        (Slot::Pidfd, Some(sandbox.pidfd()), running),
        (Slot::Cancel, cancel, running),
        (Slot::Interrupt, signals, running),
    ];
    let (slots, mut fds): (Vec<Slot>, Vec<PollFd>) = candidates
        .into_iter()
        .filter_map(|(slot, fd, wanted)| {
            Some((slot, PollFd::new(fd.filter(|_| wanted)?, PollFlags::POLLIN)))
        })
        .unzip();
    let ready: Vec<Slot> = match poll(&mut fds, timeout) {
        Ok(_) => fds
            .iter()
            .zip(&slots)
            .filter(|(fd, _)| fd.revents().is_some_and(|r| !r.is_empty()))
            .map(|(_, slot)| *slot)
            .collect(),
        Err(nix::errno::Errno::EINTR) => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(move |slot: Slot| ready.contains(&slot))
}

pub(crate) fn describe_status(status: i32) -> String {
    if libc::WIFEXITED(status) {
        format!("exit status {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("wait status {status:#x}")
    }
}

fn timeval(tv: libc::timeval) -> Duration {
    Duration::from_secs(tv.tv_sec.max(0) as u64) + Duration::from_micros(tv.tv_usec.max(0) as u64)
}

pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>) -> nix::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).map(drop)
}
