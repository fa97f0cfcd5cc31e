//! pid 1 of the sandbox, and the server of the launcher's requests. An interpreter run as
//! pid 1 would ignore SIGTERM and pile up zombies (a pid 1 gets no default signal actions,
//! pid_namespaces(7)), so this init forks each payload the launcher asks for, forwards
//! signals to it, reaps every child, and reports each payload's end.
//!
//! The loop waits on the channel (spawn, signal, kill all, shut down), a signalfd
//! (SIGCHLD, and the signals it forwards) and, for a last payload that says its own end, its
//! end pipe. A one-shot run's payload is spawned `last`: when it ends, the init kills the
//! rest and exits, as before sessions existed.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::files;
use super::netlink;
use super::payload::{self, Launch};
use super::procs;
use super::seccomp::{self, Filters};
use crate::files::OutputRules;
use crate::protocol::{self, FromSandbox, Inbox, Phase, SetupError, Step, ToSandbox};
use crate::spec::{LayerMode, SandboxSpec};
use crate::sys::{self, ForkedInit};

/// Signals the init passes on to the newest payload's process group.
const FORWARDED: &[Signal] = &[
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
];

/// A directory listing has at most this many entries.
const MAX_LISTING: usize = 10_000;
/// How long a run that a payload said the end of waits for every process of the sandbox
/// to begin its exit before it waits for each to be reaped instead.
const END_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

struct Init<'a> {
    spec: &'a SandboxSpec,
    channel: &'a UnixStream,
    filters: Option<Filters>,
    /// Counts and makes the payloads' netlink sockets (with the seccomp layer on).
    netlink: Option<netlink::Guard>,
    /// Live payloads: pid -> (id, last, the output files to send when it ends).
    payloads: BTreeMap<Pid, (u64, bool, Option<OutputRules>)>,
    newest: Option<Pid>,
    /// Payloads reaped lately (id, pid): a session's context whose driver died may have
    /// left members in its process group, which `CallProcesses` still finds by the id.
    reaped: std::collections::VecDeque<(u64, Pid)>,
    /// The last pid allocated in the sandbox as the running session call began.
    call_mark: Option<i32>,
    /// The last payload's pipe for saying its end (`Spawn::says_end`): its pid and the
    /// pipe's read end.
    end_word: Option<(Pid, OwnedFd)>,
    /// The output directory as a session call began (`BeginCall`).
    marked: Option<files::Marks>,
}

/// Serves the launcher until it says to stop, goes away, or the last payload ends.
pub fn serve(spec: &SandboxSpec, channel: &UnixStream) -> ! {
    let mut init = Init {
        spec,
        channel,
        filters: None,
        netlink: None,
        payloads: BTreeMap::new(),
        newest: None,
        reaped: std::collections::VecDeque::new(),
        call_mark: None,
        marked: None,
        end_word: None,
    };
    let signals = match init.prepare() {
        Ok(signals) => signals,
        Err(error) => init.fail_and_exit(None, error),
    };
    let mut inbox = Inbox::default();
    loop {
        let mut fds = vec![
            PollFd::new(channel.as_fd(), PollFlags::POLLIN),
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
        ];
        if let Some((_, pipe)) = &init.end_word {
            fds.push(PollFd::new(pipe.as_fd(), PollFlags::POLLIN));
        }
        let netlink_at = fds.len();
        if let Some(guard) = &init.netlink {
            fds.extend(
                guard
                    .fds()
                    .into_iter()
                    .map(|fd| PollFd::new(fd, PollFlags::POLLIN)),
            );
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => init.exit(125),
        }
        let revents: Vec<PollFlags> = fds
            .iter()
            .map(|fd| fd.revents().unwrap_or(PollFlags::empty()))
            .collect();
        drop(fds);
        let ready = |i: usize| !revents[i].is_empty();
        let (channel_ready, signal_ready) = (ready(0), ready(1));
        let end_ready = init.end_word.is_some() && ready(2);
        if let Some(guard) = &mut init.netlink {
            guard.ready(&revents[netlink_at..]);
        }
        if signal_ready {
            while let Ok(Some(info)) = signals.read_signal() {
                match Signal::try_from(info.ssi_signo as i32) {
                    Ok(Signal::SIGCHLD) => init.reap(),
                    Ok(signal) if FORWARDED.contains(&signal) => init.forward(signal),
                    _ => {}
                }
            }
        }
        // After the signals: a payload whose exit was reaped meanwhile has ended the
        // ordinary way, and its word is moot.
        if end_ready {
            init.read_end_word();
        }
        if channel_ready {
            match inbox.fill(channel) {
                Ok(true) => {}
                // The launcher is gone: nobody is left to supervise.
                Ok(false) | Err(_) => init.exit(0),
            }
            while let Some(message) = inbox.next() {
                match message {
                    Ok((message, fds)) => init.handle(message, fds),
                    Err(_) => init.exit(125),
                }
            }
        }
    }
}

impl Init<'_> {
    /// Signals to a signalfd, and the seccomp filters compiled once for every payload.
    fn prepare(&mut self) -> Result<SignalFd, SetupError> {
        // Every signal is blocked and read from a signalfd: a blocked SIGCHLD stays pending,
        // so no child's exit is missed, and the payload inherits nothing odd (it unblocks
        // everything before exec).
        let all = SigSet::all();
        all.thread_block()
            .map_err(|e| SetupError::errno(Step::BlockInitSignals, e, "sigprocmask"))?;
        let signals = SignalFd::with_flags(&all, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map_err(|e| SetupError::errno(Step::BlockInitSignals, e, "signalfd"))?;
        self.filters = match self.spec.seccomp {
            LayerMode::Off => None,
            _ => {
                Some(seccomp::compile().map_err(|e| SetupError::refused(Step::CompileSeccomp, e))?)
            }
        };
        if let (Some(filters), Some(_)) = (self.filters.as_mut(), &self.spec.exec) {
            filters.deny_memfd();
        }
        if self.filters.is_some() {
            self.netlink = Some(netlink::Guard::new()?);
        }
        Ok(signals)
    }

    fn handle(&mut self, message: ToSandbox, fds: Vec<OwnedFd>) {
        match message {
            ToSandbox::Spawn {
                id,
                argv,
                env,
                files,
                last,
                outputs,
                cwd,
                pty,
                exec_extra,
                says_end,
                ..
            } => {
                if let Err(error) = super::write_work_files(&files) {
                    return self.report_failure(id, error, last);
                }
                // A payload's own ruleset (an approved command's, a context's interpreter):
                // the sandbox's allowlist plus its files, which the payload binds exec in a
                // mount namespace of its own (payload::own_exec_mounts), so that no other
                // process of the sandbox can map them.
                let (merged, exec_binds) = match (&self.spec.exec, exec_extra) {
                    (Some(base), Some(extra)) => {
                        let binds = (extra.exec_mounted())
                            .filter(|f| f.is_absolute() && !base.exec_mounted().any(|b| b == *f))
                            .cloned()
                            .collect();
                        (Some(base.with(&extra)), binds)
                    }
                    _ => (None, Vec::new()),
                };
                let (mut fds, master) = match pty {
                    None => (fds, None),
                    Some(size) => match open_terminal(size) {
                        Ok((master, slave)) => (slave, Some(master)),
                        Err(error) => return self.report_failure(id, error, last),
                    },
                };
                // The pipe a last payload says its end on: its write end the payload's next
                // fd, its read end ours (close-on-exec: no payload inherits it).
                let end_word = match says_end && last {
                    false => None,
                    true => match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
                        Ok((read, write)) => {
                            fds.push(write);
                            Some(read)
                        }
                        Err(e) => {
                            let error = SetupError::errno(Step::AttachPayloadFds, e, "pipe2");
                            return self.report_failure(id, error, last);
                        }
                    },
                };
                let launch = Launch {
                    id,
                    argv: &argv,
                    env: &env,
                    cwd: cwd.as_deref(),
                    fds,
                    terminal: master.is_some(),
                    exec: merged.as_ref(),
                    exec_binds: &exec_binds,
                };
                match sys::fork_in_init() {
                    Ok(ForkedInit::Child) => {
                        let seccomp = self.filters.as_ref().map(|filters| payload::Seccomp {
                            filters,
                            netlink_outbox: self.netlink.as_ref().map(|g| g.outbox()),
                        });
                        payload::exec(self.spec, &launch, seccomp, self.channel)
                    }
                    Ok(ForkedInit::Parent(pid)) => {
                        // The parent's copies of the payload's fds go now, or the launcher
                        // would never see EOF on its pipes.
                        drop(launch);
                        self.payloads.insert(pid, (id, last, outputs));
                        self.newest = Some(pid);
                        self.end_word = end_word.map(|read| (pid, read));
                        if let Some(master) = master {
                            // The launcher's copy; ours closes with this scope.
                            self.send_fd(&FromSandbox::PtyOpened { id }, master.as_fd());
                        }
                    }
                    Err(e) => {
                        let error = SetupError::errno(Step::ForkPayload, e, "fork");
                        self.report_failure(id, error, last)
                    }
                }
            }
            ToSandbox::Signal { id, signal } => {
                let target = self.payloads.iter().find(|(_, (i, _, _))| *i == id);
                if let (Some((pid, _)), Ok(signal)) = (target, Signal::try_from(signal)) {
                    signal_group(*pid, signal);
                }
            }
            ToSandbox::CallProcesses { id, since_ns } => {
                let leader = self
                    .payloads
                    .iter()
                    .find(|(_, (i, _, _))| *i == id)
                    .map(|(pid, _)| *pid)
                    .or_else(|| self.reaped.iter().find(|(i, _)| *i == id).map(|(_, p)| *p));
                // since_ns 0: every member of the group, whenever it started (what is left
                // of a context whose driver is gone).
                let mark = if since_ns == 0 { None } else { self.call_mark };
                let processes = leader.map_or_else(Vec::new, |pid| {
                    procs::group_members(pid.as_raw(), pid.as_raw(), mark, since_ns)
                });
                self.send(&FromSandbox::CallProcesses { processes });
            }
            ToSandbox::KillProcesses { processes } => {
                procs::kill_exact(&processes);
                self.send(&FromSandbox::ProcessesKilled);
            }
            ToSandbox::KillAll => {
                self.kill_all();
                self.send(&FromSandbox::AllKilled);
            }
            ToSandbox::Shutdown => self.exit(0),
            ToSandbox::WriteFiles { files } => match files::write_inputs(&files) {
                Ok(()) => self.send(&FromSandbox::FilesWritten),
                Err(message) => self.send(&FromSandbox::FileError { message }),
            },
            ToSandbox::BeginCall { rules } => {
                self.call_mark = procs::last_pid();
                self.marked = rules.map(|rules| files::mark(&rules));
                self.send(&FromSandbox::CallBegun);
            }
            ToSandbox::CollectOutputs { rules, changed } => {
                let before = if changed { self.marked.take() } else { None };
                self.send_outputs(&rules, before.as_ref());
            }
            ToSandbox::ListDir { path } => match files::list(&path, MAX_LISTING) {
                Ok(entries) => self.send(&FromSandbox::Listing { entries }),
                Err(message) => self.send(&FromSandbox::FileError { message }),
            },
            ToSandbox::ReadFile { path, max } => match files::read(&path, max) {
                Ok(data) => self.send_file(protocol::FILE_DATA, "", &data),
                Err(message) => self.send(&FromSandbox::FileError { message }),
            },
        }
    }

    /// The output directory's files, one message each, then the skipped ones.
    fn send_outputs(&self, rules: &OutputRules, before: Option<&files::Marks>) {
        let (taken, skipped) = files::collect(rules, before);
        for file in taken {
            self.send_file(protocol::FILE_OUTPUT, &file.path, &file.data);
        }
        self.send(&FromSandbox::OutputsDone { skipped });
    }

    /// A payload that never started: reported, and for a one-shot run the end.
    fn report_failure(&mut self, id: u64, error: SetupError, last: bool) {
        if last {
            self.fail_and_exit(Some(id), error);
        }
        self.send(&FromSandbox::SetupFailed {
            id: Some(id),
            error,
        });
    }

    /// Reaps every child that has ended, and reports the payloads among them. When the
    /// last payload of a one-shot run ends, everything else is killed and the init exits.
    fn reap(&mut self) {
        loop {
            let (pid, code, signal) = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, Some(code), None),
                Ok(WaitStatus::Signaled(pid, signal, _)) => (pid, None, Some(signal as i32)),
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(_) => return,
            };
            if self.end_word.as_ref().is_some_and(|(p, _)| *p == pid) {
                self.end_word = None;
            }
            if let Some((id, last, outputs)) = self.payloads.remove(&pid) {
                self.note_reaped(id, pid);
                if last {
                    // From pid 1, kill(-1) reaches every other process of the namespace:
                    // nothing the payload started outlives it, double-forked or not. Each
                    // is reaped before the end is reported: the output files are taken from
                    // a /work nothing writes to any more, and when `Exited` arrives the
                    // cgroup's figures are final (the launcher of a pooled run answers
                    // with them before this init has exited).
                    protocol::mark(self.channel, Phase::PayloadExited);
                    self.kill_all();
                    if let Some(rules) = &outputs {
                        self.send_outputs(rules, None);
                    }
                }
                self.send(&FromSandbox::Exited { id, code, signal });
                if last {
                    self.exit(0);
                }
            }
        }
    }

    /// Reads the last payload's word on its end pipe: its exit status ends the run (see
    /// [`Init::end_said`]). Anything else (the pipe closed, a malformed word) stops the
    /// listening, and the run ends at the payload's exit as any other.
    fn read_end_word(&mut self) {
        let Some((pid, pipe)) = self.end_word.take() else {
            return;
        };
        let mut word = [0u8; 8];
        // One write of a few bytes on a pipe is atomic: the word comes whole or not at all.
        let said = match nix::unistd::read(&pipe, &mut word) {
            Ok(n) => std::str::from_utf8(&word[..n])
                .ok()
                .and_then(|w| w.strip_suffix('\n'))
                .and_then(|w| w.parse::<u8>().ok()),
            Err(_) => None,
        };
        if let Some(code) = said {
            self.end_said(pid, i32::from(code));
        }
    }

    /// The last payload said its code has finished with `code`, its stdio flushed and
    /// closed. The run ends as at its exit (everything else killed, the output files sent,
    /// then `Exited` with that status and the init's exit), except that the init does not
    /// wait for the payload's own exit, in which the kernel frees its memory: a pre-started
    /// interpreter holding the preloaded libraries takes milliseconds for it, which
    /// the launcher's `Teardown` waits for after the answer. What the init waits
    /// for is that no process of the sandbox runs any more: the SIGKILL from pid 1 reaches
    /// every one (the payload and its own threads too), and each thread has begun its exit
    /// when it leaves its last system call; from then on nothing writes to /work, the
    /// pipes or memory, and the cgroup's figures hold only what the code did (and part of
    /// the exits).
    fn end_said(&mut self, pid: Pid, code: i32) {
        // Only a last payload is given the pipe.
        let Some((id, _, outputs)) = self.payloads.remove(&pid) else {
            return;
        };
        self.note_reaped(id, pid);
        protocol::mark(self.channel, Phase::PayloadExited);
        let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
        let patience = std::time::Instant::now() + END_PATIENCE;
        loop {
            self.reap_killed(false);
            if procs::all_exiting() {
                break;
            }
            if std::time::Instant::now() >= patience {
                // A task that does not leave its system call (an uninterruptible wait):
                // every process is waited for, the payload too, as at an exit.
                self.kill_all();
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        if let Some(rules) = &outputs {
            self.send_outputs(rules, None);
        }
        self.send(&FromSandbox::Exited {
            id,
            code: Some(code),
            signal: None,
        });
        self.exit(0)
    }

    /// Reaps the killed processes, the payloads among them reported as killed: with `wait`,
    /// every child until none is left; without, those that have exited.
    fn reap_killed(&mut self, wait: bool) {
        let flags = match wait {
            true => WaitPidFlag::__WALL,
            false => WaitPidFlag::__WALL | WaitPidFlag::WNOHANG,
        };
        loop {
            match waitpid(None, Some(flags)) {
                Ok(WaitStatus::Exited(pid, code)) => self.killed(pid, Some(code), None),
                Ok(WaitStatus::Signaled(pid, signal, _)) => {
                    self.killed(pid, None, Some(signal as i32))
                }
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(_) => return,
            }
        }
    }

    /// Kills every process but this one and waits until each is reaped; the payloads
    /// among them are reported as killed.
    fn kill_all(&mut self) {
        let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
        self.reap_killed(true);
    }

    /// Remembers a reaped payload's group for a while (the last 16).
    fn note_reaped(&mut self, id: u64, pid: Pid) {
        if self.reaped.len() >= 16 {
            self.reaped.pop_front();
        }
        self.reaped.push_back((id, pid));
    }

    fn killed(&mut self, pid: Pid, code: Option<i32>, signal: Option<i32>) {
        if let Some((id, _, _)) = self.payloads.remove(&pid) {
            self.send(&FromSandbox::Exited { id, code, signal });
        }
    }

    fn forward(&self, signal: Signal) {
        if let Some(pid) = self.newest.filter(|p| self.payloads.contains_key(p)) {
            signal_group(pid, signal);
        }
    }

    fn send(&self, message: &FromSandbox) {
        // A launcher that is gone is handled by the loop (EOF on the channel).
        let _ = protocol::write_message(&mut &*self.channel, message, protocol::MAX_FRAME);
    }

    /// A message with an fd attached (SCM_RIGHTS).
    fn send_fd(&self, message: &FromSandbox, fd: std::os::fd::BorrowedFd<'_>) {
        use std::os::fd::AsRawFd;
        if let Ok(frame) = protocol::frame(message, protocol::MAX_FRAME) {
            let _ = protocol::send_with_fds(self.channel, &frame, &[fd.as_raw_fd()]);
        }
    }

    fn send_file(&self, kind: u8, path: &str, data: &[u8]) {
        let _ = protocol::write_file_frame(&mut &*self.channel, kind, path, data);
    }

    fn fail_and_exit(&mut self, id: Option<u64>, error: SetupError) -> ! {
        self.send(&FromSandbox::SetupFailed { id, error });
        let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
        std::process::exit(125)
    }

    fn exit(&mut self, code: i32) -> ! {
        let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
        std::process::exit(code)
    }
}

/// A terminal of the sandbox's own devpts for a payload: its master, and its slave three
/// times (stdin, stdout, stderr), owned by the sandbox user as a login's terminal is
/// (mode 0620, from the devpts mount), so that a program that reopens it by its name
/// (/dev/pts/N) may.
fn open_terminal(size: protocol::PtySize) -> Result<(OwnedFd, Vec<OwnedFd>), SetupError> {
    let failed = |e: std::io::Error, what: &str| SetupError::io(Step::OpenTerminal, &e, what);
    let (master, slave) =
        sys::open_pty(std::path::Path::new("/dev/pts/ptmx"), size.rows, size.cols).map_err(
            |e| {
                let what = format!(
                    "opening /dev/pts/ptmx (a sandbox holds at most {} terminals)",
                    super::mount::MAX_PTYS
                );
                failed(e, &what)
            },
        )?;
    let user = Some(nix::unistd::Uid::from_raw(crate::spec::SANDBOX_UID));
    let group = Some(nix::unistd::Gid::from_raw(crate::spec::SANDBOX_UID));
    nix::unistd::fchown(slave.as_fd(), user, group)
        .map_err(|e| failed(e.into(), "giving the terminal to the sandbox user"))?;
    let copies = (0..2)
        .map(|_| slave.try_clone())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| failed(e, "duplicating the terminal's fd"))?;
    let mut fds = vec![slave];
    fds.extend(copies);
    Ok((master, fds))
}

fn signal_group(payload: Pid, signal: Signal) {
    // The payload leads its own process group; a pipeline it runs gets the signal too, as
    // from a terminal.
    if kill(Pid::from_raw(-payload.as_raw()), signal).is_err() {
        let _ = kill(payload, signal);
    }
}
