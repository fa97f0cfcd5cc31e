//! What a live [`Sandbox`] is asked and tells, as typed calls: a session (and a pre-started
//! run) talk to the init through these, and the wire protocol's frames and messages stay
//! inside the launcher.

use std::os::fd::AsFd;
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
