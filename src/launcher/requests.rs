//! What a live [`Sandbox`] is asked and tells, as typed calls: a session (and a pre-started
//! run) talk to the init through these, and the wire protocol's frames and messages stay
//! inside the launcher.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::Sandbox;
use crate::files::{DirEntry, InputFile, OutputRules};
use crate::outcome::Outcome;
use crate::protocol::{FromSandbox, ToSandbox};

/// How long a request (write, collect, list or read files; list or kill processes) may
/// take the init.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What the init reports on its own, as the session reads it (answers to requests, phase
/// marks and hardening reports are not among these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    /// Payload `id` ended: with an exit status, or by a signal.
    Exited {
        id: u64,
        code: Option<i32>,
        signal: Option<i32>,
    },
    /// A setup step failed: of the sandbox (`id` None), or of payload `id` (it never ran).
    SetupFailed { id: Option<u64>, error: String },
    /// Every process but the init is gone (after [`Sandbox::kill_all`]).
    AllKilled,
}

/// A process of the sandbox, as the init read it from /proc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CallProcess {
    pub pid: i32,
    /// Its start time in clock ticks since boot: with the pid, it names this process and
    /// no later one that reuses the pid.
    pub start: u64,
    /// Its command line (cut), or its name in brackets where it has none.
    pub command: String,
    /// It ignores SIGHUP (what `nohup` does to keep a process past its session).
    pub ignores_hangup: bool,
}

/// Takes the reports of a session's background processes (true: taken).
pub(crate) type ReportSink = Box<dyn FnMut(&Report) -> bool + Send>;

/// A message of the init as a report, if it is one.
pub(crate) fn report_of(message: &FromSandbox) -> Option<Report> {
    Some(match message {
        FromSandbox::Exited { id, code, signal } => Report::Exited {
            id: *id,
            code: *code,
            signal: *signal,
        },
        FromSandbox::SetupFailed { id, error } => Report::SetupFailed {
            id: *id,
            error: error.to_string(),
        },
        FromSandbox::AllKilled => Report::AllKilled,
        _ => return None,
    })
}

impl Sandbox {
    /// Writes `files` into /work.
    pub(crate) fn write_files(&mut self, files: &[InputFile]) -> Result<(), String> {
        let answers = self.request(
            &ToSandbox::WriteFiles {
                files: files.to_vec(),
            },
            REQUEST_TIMEOUT,
        )?;
        match answers.into_iter().last() {
            Some(FromSandbox::FilesWritten) => Ok(()),
            Some(FromSandbox::FileError { message }) => Err(message),
            _ => Err("the sandbox did not confirm the files".into()),
        }
    }

    /// Lists a directory under /work.
    pub(crate) fn list_dir(&mut self, path: &str) -> Result<Vec<DirEntry>, String> {
        let answers = self.request(&ToSandbox::ListDir { path: path.into() }, REQUEST_TIMEOUT)?;
        match answers.into_iter().last() {
            Some(FromSandbox::Listing { entries }) => Ok(entries),
            Some(FromSandbox::FileError { message }) => Err(message),
            _ => Err("the sandbox did not list the directory".into()),
        }
    }

    /// Reads a file under /work, at most `max` bytes.
    pub(crate) fn read_file(&mut self, path: &str, max: u64) -> Result<Vec<u8>, String> {
        let request = ToSandbox::ReadFile {
            path: path.into(),
            max,
        };
        match self.request(&request, REQUEST_TIMEOUT)?.into_iter().last() {
            Some(FromSandbox::FileData { data }) => Ok(data),
            Some(FromSandbox::FileError { message }) => Err(message),
            _ => Err("the sandbox did not send the file".into()),
        }
    }

    /// Tells the init a call begins: it notes the last pid, and the output directory if
    /// `rules` are given. Whether it confirmed.
    pub(crate) fn begin_call(&mut self, rules: Option<OutputRules>) -> bool {
        let answers = self.request(&ToSandbox::BeginCall { rules }, REQUEST_TIMEOUT);
        matches!(answers.as_deref(), Ok([.., FromSandbox::CallBegun]))
    }

    /// Takes the output files under `rules` into `outcome` (those new or changed since
    /// [`Sandbox::begin_call`] if `changed`, else all), with the ones skipped and why.
    pub(crate) fn collect_outputs(
        &mut self,
        rules: &OutputRules,
        changed: bool,
        outcome: &mut Outcome,
    ) -> Result<(), String> {
        let request = ToSandbox::CollectOutputs {
            rules: rules.clone(),
            changed,
        };
        let mut total = 0;
        for answer in self.request(&request, REQUEST_TIMEOUT)? {
            match answer {
                FromSandbox::OutputFile { path, data } => {
                    super::take_output_file(outcome, rules, &mut total, path, data)
                }
                FromSandbox::OutputsDone { skipped } => outcome.files_skipped.extend(skipped),
                _ => {}
            }
        }
        Ok(())
    }

    /// The processes still running that payload `id`'s call started (in its process
    /// group, at or after `since_ns` of CLOCK_BOOTTIME). None if the init did not answer.
    pub(crate) fn call_processes(&mut self, id: u64, since_ns: u64) -> Option<Vec<CallProcess>> {
        let request = ToSandbox::CallProcesses { id, since_ns };
        match self
            .request(&request, REQUEST_TIMEOUT)
            .ok()?
            .into_iter()
            .last()
        {
            Some(FromSandbox::CallProcesses { processes }) => Some(
                processes
                    .into_iter()
                    .map(|p| CallProcess {
                        pid: p.pid,
                        start: p.start,
                        command: p.command,
                        ignores_hangup: p.ignores_hangup,
                    })
                    .collect(),
            ),
            _ => None,
        }
    }

    /// SIGKILLs each of `processes` that is still the one listed (a reused pid is never
    /// hit), and waits for the init to say it did.
    pub(crate) fn kill_processes(&mut self, processes: &[CallProcess]) -> Result<(), String> {
        let request = ToSandbox::KillProcesses {
            processes: processes.iter().map(|p| (p.pid, p.start)).collect(),
        };
        self.request(&request, REQUEST_TIMEOUT).map(|_| ())
    }

    /// The next report the init sent on its own, read already (see
    /// [`Sandbox::read_channel`]); the messages that are not reports are dropped.
    pub(crate) fn next_report(&mut self) -> Option<Report> {
        loop {
            if let Some(report) = report_of(&self.next_message()?) {
                return Some(report);
            }
        }
    }

    /// Gives the reports of background processes to `sink` as the channel is read
    /// (whoever reads it: a call, a request, a poll); those it takes (true) are not queued.
    pub(crate) fn set_background_sink(&mut self, sink: ReportSink) {
        self.background = Some(sink);
    }

    /// Starts a payload on a terminal of the sandbox's own devpts, `rows` x `cols`, in
    /// `cwd`, and waits for the init to hand its master back (a pty master, checked, and
    /// non-blocking) and for the payload to hold it as its controlling terminal (its
    /// `Hardened`: a C-c sent before then would reach no process group), or to fail its
    /// setup (the failure is left for the process's table). Returns the payload's id and
    /// the master.
    pub(crate) fn spawn_on_terminal(
        &mut self,
        exec: &crate::spec::Exec,
        cwd: Option<String>,
        rows: u16,
        cols: u16,
    ) -> Result<(u64, OwnedFd), String> {
        let size = crate::protocol::PtySize { rows, cols };
        let id = self
            .spawn_with(exec, &[], false, cwd, Some(size), false)
            .map_err(|e| e.describe("cannot start the process"))?;
        self.ptys_wanted.insert(id);
        let end = Instant::now() + REQUEST_TIMEOUT;
        let mut master = None;
        let result = loop {
            if let Some(got) = self.ptys.remove(&id) {
                match got {
                    Ok(fd) => master = Some(fd),
                    Err(e) => break Err(e),
                }
            }
            let mine = |m: &FromSandbox| match m {
                FromSandbox::Hardened { id: i, .. } => *i == id,
                FromSandbox::SetupFailed { id: Some(i), .. } => *i == id,
                _ => false,
            };
            let ended = self.inbox.iter().position(mine);
            match (ended.map(|at| &self.inbox[at]), master.take()) {
                (Some(FromSandbox::Hardened { .. }), Some(fd)) => {
                    self.inbox.remove(ended.unwrap_or_default());
                    break Ok(fd);
                }
                (Some(FromSandbox::SetupFailed { .. }), Some(fd)) => break Ok(fd),
                (Some(FromSandbox::SetupFailed { error, .. }), None) => {
                    let error = error.to_string();
                    self.inbox.remove(ended.unwrap_or_default());
                    break Err(format!("cannot start the process: {error}"));
                }
                (_, fd) => master = fd,
            }
            if Instant::now() >= end {
                break Err(
                    "the sandbox's init did not hand over the process's terminal in time".into(),
                );
            }
            if let Err(e) = self.wait_channel(end) {
                break Err(e);
            }
        };
        self.ptys_wanted.remove(&id);
        if result.is_err() {
            let _ = self.signal(id, libc::SIGKILL);
        }
        result.map(|master| (id, master))
    }

    /// Offers the reports read while no one was there to take them (a process's exit read
    /// before its table entry existed) to the background sink again.
    pub(crate) fn offer_queued_reports(&mut self) {
        let Some(sink) = self.background.as_mut() else {
            return;
        };
        let queued = std::mem::take(&mut self.inbox);
        for message in queued {
            let taken = report_of(&message).is_some_and(|report| sink(&report));
            if !taken {
                self.inbox.push_back(message);
            }
        }
    }

    /// Waits until the channel is readable or the init ends, up to `end`, and reads it.
    /// An error says why nothing more can come: the init died, or its channel closed or
    /// broke.
    pub(crate) fn wait_channel(&mut self, end: Instant) -> Result<(), String> {
        let timeout = end.saturating_duration_since(Instant::now());
        let timeout =
            PollTimeout::try_from(timeout.as_millis() as i32 + 1).unwrap_or(PollTimeout::MAX);
        let mut fds = [
            PollFd::new(self.channel.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.pidfd.as_fd(), PollFlags::POLLIN),
        ];
        let _ = poll(&mut fds, timeout);
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            return Err("the session's sandbox ended (its init died)".into());
        }
        if !self.read_channel() && self.inbox.is_empty() {
            return Err(match self.protocol_error() {
                Some(e) => format!("the sandbox's channel broke: {e}"),
                None => "the sandbox's channel closed".to_string(),
            });
        }
        Ok(())
    }
}

/// An fd the init announced as a terminal's master, checked as untrusted: a character
/// device that answers TIOCGPTN (a pty master, of the sandbox's devpts: the init holds no
/// other), made non-blocking.
pub(crate) fn check_pty_master(fd: Option<OwnedFd>) -> Result<OwnedFd, String> {
    let fd = fd.ok_or("the sandbox's init announced a terminal and sent no fd")?;
    let stat = nix::sys::stat::fstat(fd.as_fd())
        .map_err(|e| format!("cannot stat the terminal the sandbox sent: {e}"))?;
    if stat.st_mode & libc::S_IFMT != libc::S_IFCHR {
        return Err("the sandbox sent something that is not a terminal for the process".into());
    }
    crate::sys::pty_number(fd.as_fd())
        .map_err(|e| format!("the sandbox sent a device that is not a pty master: {e}"))?;
    super::set_nonblocking(fd.as_fd())
        .map_err(|e| format!("cannot make the terminal non-blocking: {e}"))?;
    Ok(fd)
}
