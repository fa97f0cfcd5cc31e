//! Watching a running sandbox: drain stdout and stderr under the output cap, enforce the
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

use super::clone::Sandbox;
use super::Stream;
use crate::outcome::{ErrorKind, Outcome};
use crate::protocol::{FrameReader, FromSandbox, Phase};
use crate::spec::Spec;
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
/// What one read takes from a pipe or the channel.
const READ_CHUNK: usize = 64 * 1024;

/// What the loop polls, by name.
#[derive(Clone, Copy)]
enum Slot {
    Stdout,
    Stderr,
    Channel,
    Pidfd,
    Interrupt,
}

/// Which of the polled fds are still worth polling.
struct Open {
    stdout: bool,
    stderr: bool,
    channel: bool,
}

struct Watch<'a> {
    spec: &'a Spec,
    sink: &'a mut dyn FnMut(Stream, &[u8]),
    outcome: Outcome,
    frames: FrameReader,
    report: Option<FromSandbox>,
    protocol_error: Option<String>,
    killed_for: Option<ErrorKind>,
    marks: Vec<(Phase, u64)>,
}

/// What supervision saw besides the Outcome: the sandbox's phase marks and when the init
/// was reaped (CLOCK_MONOTONIC ns).
pub struct Timeline {
    pub marks: Vec<(Phase, u64)>,
    pub reaped_ns: u64,
}

/// Supervises `sandbox` until its init is reaped and returns the Outcome. `start` is when
/// the launch began; the timeout counts from there.
pub fn supervise(
    mut sandbox: Sandbox,
    spec: &Spec,
    start: Instant,
    sink: &mut dyn FnMut(Stream, &[u8]),
    interrupt: Option<&SignalFd>,
) -> (Outcome, Timeline) {
    let deadline = start + spec.timeout;
    for fd in [
        sandbox.stdout.as_fd(),
        sandbox.stderr.as_fd(),
        sandbox.channel.as_fd(),
    ] {
        let _ = set_nonblocking(fd);
    }
    let mut watch = Watch {
        spec,
        sink,
        outcome: Outcome::default(),
        frames: FrameReader::default(),
        report: None,
        protocol_error: None,
        killed_for: None,
        marks: Vec::new(),
    };
    let mut open = Open {
        stdout: true,
        stderr: true,
        channel: true,
    };
    let mut exited_at: Option<Instant> = None;
    let mut buf = vec![0u8; READ_CHUNK];

    loop {
        let now = Instant::now();
        if let Some(at) = exited_at {
            if (!open.stdout && !open.stderr) || now >= at + DRAIN_GRACE {
                break;
            }
        } else if now >= deadline && watch.killed_for.is_none() {
            watch.kill(&sandbox, ErrorKind::Timeout);
        }
        let wake_at = match exited_at {
            Some(at) => at + DRAIN_GRACE,
            None if watch.killed_for.is_some() => now + KILLED_WAKE,
            None => deadline,
        };
        let ready = match poll_once(
            &sandbox,
            interrupt,
            &open,
            exited_at.is_none(),
            wake_at - now.min(wake_at),
        ) {
            Ok(ready) => ready,
            Err(e) => {
                watch.protocol_error =
                    Some(format!("poll failed while supervising the sandbox: {e}"));
                watch.kill(&sandbox, ErrorKind::Setup);
                break;
            }
        };
        if ready(Slot::Stdout) && open.stdout {
            open.stdout = watch.drain(&mut sandbox, Stream::Stdout, &mut buf);
        }
        if ready(Slot::Stderr) && open.stderr {
            open.stderr = watch.drain(&mut sandbox, Stream::Stderr, &mut buf);
        }
        if watch.killed_for == Some(ErrorKind::OutputLimit) {
            // Past the cap nothing more is read; the sandbox is already being killed.
            (open.stdout, open.stderr) = (false, false);
        }
        if ready(Slot::Channel) && open.channel {
            open.channel = watch.read_channel(&mut sandbox, &mut buf);
        }
        if ready(Slot::Pidfd) && exited_at.is_none() {
            exited_at = Some(Instant::now());
        }
        if ready(Slot::Interrupt) {
            if let Some(signals) = interrupt {
                if let Ok(Some(info)) = signals.read_signal() {
                    // Forwarded to the init, which passes it on to the payload.
                    let _ = sys::pidfd_send_signal(sandbox.pidfd.as_fd(), info.ssi_signo as i32);
                }
            }
        }
    }

    let reaped = sys::wait4(sandbox.pid);
    let reaped_ns = sys::monotonic_ns();
    watch.outcome.duration = start.elapsed();
    // The init wrote its last report before exiting; collect what is still buffered.
    // One pass: what the init wrote is buffered; a copy of its end held elsewhere (a
    // program that forked without exec) must not keep us reading.
    if open.channel {
        watch.read_channel(&mut sandbox, &mut buf);
    }
    let marks = std::mem::take(&mut watch.marks);
    (watch.finish(reaped), Timeline { marks, reaped_ns })
}

/// Polls the fds that are still open for up to `timeout` (EINTR counts as nothing ready)
/// and says which slots are ready.
fn poll_once(
    sandbox: &Sandbox,
    interrupt: Option<&SignalFd>,
    open: &Open,
    running: bool,
    timeout: Duration,
) -> nix::Result<impl Fn(Slot) -> bool> {
    let interest = |wanted: bool| {
        if wanted {
            PollFlags::POLLIN
        } else {
            PollFlags::empty()
        }
    };
    let timeout = timeout.min(MAX_POLL).as_millis() as i32 + 1;
    let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    // In the order of `Slot`.
    let mut fds = vec![
        PollFd::new(sandbox.stdout.as_fd(), interest(open.stdout)),
        PollFd::new(sandbox.stderr.as_fd(), interest(open.stderr)),
        PollFd::new(sandbox.channel.as_fd(), interest(open.channel)),
        PollFd::new(sandbox.pidfd.as_fd(), interest(running)),
    ];
    if let Some(signals) = interrupt {
        fds.push(PollFd::new(signals.as_fd(), interest(running)));
    }
    let ready: Vec<bool> = match poll(&mut fds, timeout) {
        Ok(_) => fds
            .iter()
            .map(|fd| fd.revents().is_some_and(|r| !r.is_empty()))
            .collect(),
        Err(nix::errno::Errno::EINTR) => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(move |slot: Slot| ready.get(slot as usize).copied().unwrap_or(false))
}

impl Watch<'_> {
    fn kill(&mut self, sandbox: &Sandbox, why: ErrorKind) {
        if self.killed_for.is_none() {
            self.killed_for = Some(why);
        }
        // ESRCH: it already exited, which is fine.
        let _ = sys::pidfd_send_signal(sandbox.pidfd.as_fd(), libc::SIGKILL);
    }

    /// Reads what one output pipe holds now. Returns false at EOF.
    fn drain(&mut self, sandbox: &mut Sandbox, stream: Stream, buf: &mut [u8]) -> bool {
        loop {
            let pipe = match stream {
                Stream::Stdout => &mut sandbox.stdout,
                Stream::Stderr => &mut sandbox.stderr,
            };
            match pipe.read(buf) {
                Ok(0) => return false,
                Ok(n) => {
                    if !self.take_output(sandbox, stream, &buf[..n]) {
                        return false;
                    }
                }
                Err(e) if e.kind() == IoErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == IoErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
    }

    /// Keeps `chunk` up to the output cap. Returns false once the cap is passed.
    fn take_output(&mut self, sandbox: &Sandbox, stream: Stream, chunk: &[u8]) -> bool {
        let used = (self.outcome.stdout.len() + self.outcome.stderr.len()) as u64;
        let room = self.spec.output_limit.saturating_sub(used) as usize;
        let kept = &chunk[..chunk.len().min(room)];
        match stream {
            Stream::Stdout => self.outcome.stdout.extend_from_slice(kept),
            Stream::Stderr => self.outcome.stderr.extend_from_slice(kept),
        }
        if !kept.is_empty() {
            (self.sink)(stream, kept);
        }
        if chunk.len() > room {
            self.outcome.truncated = true;
            self.kill(sandbox, ErrorKind::OutputLimit);
            return false;
        }
        true
    }

    /// Reads reports from the channel. Returns false at EOF.
    fn read_channel(&mut self, sandbox: &mut Sandbox, buf: &mut [u8]) -> bool {
        let open = loop {
            match sandbox.channel.read(buf) {
                Ok(0) => break false,
                Ok(n) => self.frames.feed(&buf[..n]),
                Err(e) if e.kind() == IoErrorKind::WouldBlock => break true,
                Err(e) if e.kind() == IoErrorKind::Interrupted => continue,
                Err(_) => break false,
            }
        };
        while let Some(message) = self.frames.next_message() {
            match message {
                Ok(FromSandbox::Mark { phase, at_ns }) => self.marks.push((phase, at_ns)),
                Ok(FromSandbox::Hardened {
                    landlock_abi,
                    skipped,
                }) => {
                    self.outcome.landlock_abi = landlock_abi;
                    self.outcome.skipped_layers = skipped;
                }
                // A setup failure stays the answer even if an exit report follows it.
                Ok(message) if !matches!(self.report, Some(FromSandbox::SetupFailed(_))) => {
                    self.report = Some(message)
                }
                Ok(_) => {}
                Err(e) => self.protocol_error = Some(e),
            }
        }
        open
    }

    /// Turns what was seen into the Outcome.
    fn finish(mut self, reaped: std::io::Result<(i32, libc::rusage)>) -> Outcome {
        if let Ok((_, usage)) = &reaped {
            self.outcome.cpu = timeval(usage.ru_utime) + timeval(usage.ru_stime);
            // ru_maxrss is in KiB: the largest resident set of the init or any process it
            // reaped. (The cgroup layer reports the whole sandbox's peak instead.)
            self.outcome.peak_memory_bytes = Some(usage.ru_maxrss.max(0) as u64 * 1024);
        }
        let spec = self.spec;
        let mut outcome = self.outcome;
        match (self.killed_for, self.report) {
            (Some(ErrorKind::Timeout), _) => {
                outcome.error = Some(ErrorKind::Timeout);
                outcome.message = Some(format!(
                    "the code ran longer than the time limit of {} and was stopped, with every process \
                     it started; the output up to that point is kept. Make it faster or do less per run, \
                     or allow more time.",
                    format_duration(spec.timeout)
                ));
            }
            (Some(ErrorKind::OutputLimit), _) => {
                outcome.error = Some(ErrorKind::OutputLimit);
                outcome.message = Some(format!(
                    "the code wrote more than the output limit of {} (stdout and stderr together) and was \
                     stopped there; the output is cut at the limit. Print less (a summary, the head of the \
                     data), or write large results to a file under /work.",
                    format_size(spec.output_limit)
                ));
            }
            (_, Some(FromSandbox::SetupFailed(err))) => {
                outcome.error = Some(ErrorKind::Setup);
                outcome.message = Some(format!("{err}; the code did not run"));
            }
            (_, Some(FromSandbox::Exited { code, signal })) => {
                outcome.exit_code = code;
                outcome.signal = signal;
            }
            // (Hardened is kept in the outcome as it arrives, never as the final report.)
            (killed, None | Some(FromSandbox::Hardened { .. } | FromSandbox::Mark { .. })) => {
                outcome.error = Some(ErrorKind::Setup);
                let status = match &reaped {
                    Ok((status, _)) => describe_status(*status),
                    Err(e) => format!("could not be reaped: {e}"),
                };
                outcome.init_lost = true;
                let mut message =
                    format!("the sandbox init ended without reporting a result ({status})");
                if let Some(e) = self.protocol_error {
                    message.push_str(&format!("; {e}"));
                }
                if killed == Some(ErrorKind::Setup) {
                    message.push_str("; the launcher stopped it");
                }
                outcome.message = Some(message);
            }
        }
        outcome
    }
}

fn describe_status(status: i32) -> String {
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

fn set_nonblocking(fd: BorrowedFd<'_>) -> nix::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).map(drop)
}
