//! The mechanism: a [`Sandbox`] is started from a [`SandboxSpec`] and runs payloads in it;
//! [`run`] is start + one execution + close, the one entry point of one-shot runs.
//!
//! ```text
//! launcher (host, root)                       sandbox (new user, mount, pid, net, ipc, uts ns)
//!  |- validate, cgroup, id slot, fds (CLOEXEC)
//!  |- clone3 (spawner thread) ----------------> raw child: waits for "go"
//!  |- write uid_map / gid_map
//!  |- "go" + SandboxSpec ---------------------> setresuid(0), PDEATHSIG, fds 0-3, exec init
//!  |                                             init (pid 1): cgroup ns, mounts, pivot_root,
//!  |                                             hostname, lo; then serves requests:
//!  |- Spawn{argv, env, files} + stdio fds ----> fork, harden, exec the payload
//!  |<-- Hardened, Exited{id}, AllKilled ------- reaps every child, reports payloads
//!  '- supervise: output cap, timeout, signals; Outcome
//! ```
//!
//! Safe to call from many threads at once: the child runs only raw syscalls until it execs
//! a fresh codecage, every fd is CLOEXEC, and concurrent sandboxes share no files or ids.

mod clone;
mod fill;
mod link;
mod prepared;
pub mod processes;
mod requests;
pub mod session;
mod supervise;

pub use clone::clone_on_calling_thread;
pub use prepared::Prepared;

pub(crate) use requests::{CallProcess, Report};
pub(crate) use supervise::{set_nonblocking, take_output_file};

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::sys::signalfd::SignalFd;
use nix::unistd::{pipe2, Pid};

use crate::cgroup::{self, RunCgroup, Usage};
use crate::ids::Slot;
use crate::outcome::{ErrorKind, Outcome, Phases, Skipped};
use crate::protocol::{self, FrameReader, FromSandbox, Phase, ToSandbox};
use crate::spec::{Exec, LayerMode, Limits, SandboxSpec, Spec};
use crate::sys;
use crate::units::format_size;
use supervise::End;

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
    run_full(spec, sink, interrupt, None)
}

/// Runs `spec` until it ends or `cancel` is cancelled (a server shutting down), whichever
/// comes first.
pub fn run_cancellable(
    spec: &Spec,
    sink: &mut dyn FnMut(Stream, &[u8]),
    cancel: &Canceller,
) -> Outcome {
    run_full(spec, sink, None, Some(cancel))
}

/// Removes the cgroups that launchers which died left (with any process still in them),
/// now rather than at this process's first sandbox: a server calls it as it starts, so a
/// crashed predecessor's sandboxes do not wait for the next request. Once per process.
pub fn sweep_leftovers() {
    cgroup::sweep_leftovers_once(cgroup::layout());
}

/// Stops every run it is given to, at once and for good (a server shutting down): a pipe
/// whose read end becomes readable and stays so.
#[derive(Clone)]
pub struct Canceller(std::sync::Arc<(OwnedFd, OwnedFd)>);

impl Canceller {
    pub fn new() -> std::io::Result<Canceller> {
        let (read, write) = pipe2(OFlag::O_CLOEXEC)?;
        Ok(Canceller(std::sync::Arc::new((read, write))))
    }

    pub fn cancel(&self) {
        let _ = nix::unistd::write(&self.0 .1, b"!");
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.0 .0.as_fd()
    }
}

fn run_full(
    spec: &Spec,
    sink: &mut dyn FnMut(Stream, &[u8]),
    interrupt: Option<&SignalFd>,
    cancel: Option<&Canceller>,
) -> Outcome {
    let start = Instant::now();
    if let Err(message) = spec.validate() {
        return Outcome::failed(ErrorKind::InvalidRequest, message);
    }
    let sandbox = match Sandbox::start(&spec.sandbox) {
        Ok(sandbox) => sandbox,
        Err(e) => {
            let mut outcome = Outcome::failed(e.kind, e.message);
            outcome.duration = start.elapsed();
            return outcome;
        }
    };
    execute(
        sandbox,
        spec,
        start,
        sink,
        supervise::Stops { interrupt, cancel },
    )
}

/// Runs `spec.exec` as the last payload of `sandbox` and supervises it to its end.
fn execute(
    sandbox: Sandbox,
    spec: &Spec,
    start: Instant,
    sink: &mut dyn FnMut(Stream, &[u8]),
    stops: supervise::Stops,
) -> Outcome {
    let (mut outcome, teardown) = execute_to(sandbox, spec, start, sink, stops, End::Reaped);
    teardown.finish_into(&mut outcome);
    outcome
}

/// [`execute`], ending as `end` says: with [`End::Reported`], the Outcome comes as soon as
/// the payload's end is reported and the sandbox is left to the [`Teardown`].
fn execute_to(
    mut sandbox: Sandbox,
    spec: &Spec,
    start: Instant,
    sink: &mut dyn FnMut(Stream, &[u8]),
    stops: supervise::Stops,
    end: End,
) -> (Outcome, Teardown) {
    let streams = match ExecStreams::open(&spec.exec) {
        Ok(streams) => streams,
        Err(message) => return sandbox.failed_before_running(message, start),
    };
    if let Err(e) = sandbox.spawn(&spec.exec, &streams.child_fds(), None, true) {
        return sandbox.failed_before_running(e.describe("cannot start the payload"), start);
    }
    let streams = streams.into_parent();
    sandbox.supervise_to(streams, &spec.exec, start, sink, stops, end)
}

/// What is left of a sandbox after its run's Outcome: the init reaped or still exiting,
/// the cgroup, the host id slot. [`Teardown::finish`] kills what is left, reaps the init
/// and removes the cgroup; dropping it does the same. A server answers first and finishes
/// after, and holds the sandbox's place under its cap until then.
#[must_use = "the sandbox is torn down when this is finished or dropped"]
pub struct Teardown(Option<Sandbox>);

impl Teardown {
    fn of(sandbox: Sandbox) -> Teardown {
        Teardown(Some(sandbox))
    }

    /// Tears the sandbox down: its init killed (it is already exiting) and reaped, the
    /// cgroup removed, the id slot released. Bounded: the init has nothing left to wait
    /// for, and the cgroup's removal waits at most 2 s for the kernel.
    pub fn finish(mut self) -> Result<(), String> {
        match self.0.take() {
            Some(sandbox) => sandbox.tear_down(),
            None => Ok(()),
        }
    }

    /// [`Teardown::finish`], with its failure noted in `outcome`'s message.
    pub fn finish_into(self, outcome: &mut Outcome) {
        if let Err(e) = self.finish() {
            note_cgroup_left(outcome, &e);
        }
    }
}

/// Notes in `outcome`'s message that the run's cgroup could not be removed.
fn note_cgroup_left(outcome: &mut Outcome, error: &str) {
    let note = format!("codecage could not remove the run's cgroup: {error}");
    outcome.message = Some(match outcome.message.take() {
        Some(message) => format!("{message}; {note}"),
        None => note,
    });
}

impl Drop for Teardown {
    fn drop(&mut self) {
        if let Some(sandbox) = self.0.take() {
            let _ = sandbox.tear_down();
        }
    }
}

/// Why a sandbox could not be started: the spec was invalid, or the host could not build it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct StartError {
    pub kind: ErrorKind,
    pub message: String,
}

/// A running sandbox: its init, the channel to it, its cgroup and its host id slot. It
/// runs payloads until it is closed or dropped; either kills every process of it and
/// removes its cgroup.
pub struct Sandbox {
    pid: Pid,
    pidfd: OwnedFd,
    channel: UnixStream,
    frames: FrameReader,
    /// Where `read_channel` receives into (kept: a file of megabytes arrives in many reads).
    recv_buf: Vec<u8>,
    /// Messages read from the channel and not consumed yet.
    inbox: VecDeque<FromSandbox>,
    cgroup: Option<RunCgroup>,
    _slot: Slot,
    /// The memory the raw child ran on before its exec (see clone::RawChild): freed once
    /// the init says it started (it has exec'd), else with the sandbox, after the reap.
    raw_child: Option<clone::RawChild>,
    spec: SandboxSpec,
    /// Layers the host could not give this sandbox (a best-effort cgroup).
    skipped: Vec<Skipped>,
    marks: Vec<(Phase, u64)>,
    start_ns: u64,
    clone_ns: u64,
    go_ns: u64,
    next_id: u64,
    /// The channel is closed or sent something that does not decode.
    channel_open: bool,
    protocol_error: Option<String>,
    /// The init has been reaped.
    reaped: Option<std::io::Result<(i32, libc::rusage)>>,
    /// The gateway serving the sandbox's link, in network modes other than `none`.
    network: Option<Box<dyn crate::network::Attached>>,
    /// CPU time spent before the request (a pre-started interpreter's preload), which the
    /// outcome does not count.
    cpu_base: Duration,
    /// Takes the reports of a session's background processes as they are read (whoever
    /// reads the channel), so no one else drops them; true: taken.
    background: Option<requests::ReportSink>,
    /// Fds the init sent (SCM_RIGHTS) that no message has claimed yet (at most
    /// [`MAX_QUEUED_FDS`]: the oldest go past it).
    received_fds: VecDeque<OwnedFd>,
    /// The payloads asked to run on a terminal whose master has not come yet.
    ptys_wanted: std::collections::BTreeSet<u64>,
    /// Their masters as they came (checked), or why one was refused.
    ptys: std::collections::BTreeMap<u64, Result<OwnedFd, String>>,
    /// /work from the host (see [`crate::workdir`]).
    work: Option<std::sync::Arc<crate::workdir::WorkDir>>,
}

/// The most fds from the sandbox the launcher holds unclaimed.
const MAX_QUEUED_FDS: usize = 4;

/// A payload's fds as sent with its `Spawn`: stdin, stdout, stderr, then a driver's channel.
fn raw_fds(stdio: &[BorrowedFd<'_>; 3], driver: Option<BorrowedFd<'_>>) -> Vec<i32> {
    stdio
        .iter()
        .chain(&driver)
        .map(|fd| fd.as_raw_fd())
        .collect()
}

impl Sandbox {
    /// /work from the host (see [`crate::workdir`]).
    pub(crate) fn work_dir(&self) -> Option<std::sync::Arc<crate::workdir::WorkDir>> {
        self.work.clone()
    }

    /// Builds a sandbox: its cgroup with limits, the init in new namespaces, the id maps,
    /// and the spec sent. Returns as soon as the init is on its way (its setup errors come
    /// with the first payload's outcome).
    pub fn start(spec: &SandboxSpec) -> Result<Sandbox, StartError> {
        let start_ns = sys::monotonic_ns();
        let setup_failed = |message: String| StartError {
            kind: ErrorKind::Setup,
            message: format!("{message}; the code did not run"),
        };
        spec.validate().map_err(|message| StartError {
            kind: ErrorKind::InvalidRequest,
            message,
        })?;
        let mut skipped = Vec::new();
        let mut cgroup = match (&spec.limits, spec.cgroup) {
            (Some(limits), mode @ (LayerMode::Required | LayerMode::BestEffort)) => {
                let best_effort = mode == LayerMode::BestEffort;
                // Its v1 directories follow the clone (clone::start): the child makes its
                // network namespace meanwhile.
                match RunCgroup::begin(cgroup::layout(), limits, best_effort) {
                    Ok(cgroup) => Some(cgroup),
                    Err(e) if best_effort => {
                        skipped.push(Skipped::new("cgroup", "the whole layer", e.to_string()));
                        None
                    }
                    Err(e) => return Err(setup_failed(e.to_string())),
                }
            }
            _ => None,
        };
        if spec.cgroup == LayerMode::Off {
            skipped.push(Skipped::new(
                "cgroup",
                "the whole layer",
                "turned off by the profile",
            ));
        }
        // The volumes' mount trees, cloned here in the host's mount namespace (the sandbox's
        // root cannot read host paths for itself), read-only, and passed to the init.
        let volumes = open_volumes(spec).map_err(|message| StartError {
            kind: ErrorKind::InvalidRequest,
            message,
        })?;
        let gateway = match spec.network.mode.has_gateway() {
            true => Some(crate::network::gateway().ok_or_else(|| StartError {
                kind: ErrorKind::Setup,
                message: format!(
                    "network mode {} needs a gateway, and this program provides none (the codecage binary \
                     does; a program using the library registers one with codecage::network::set_gateway); \
                     the code did not run",
                    spec.network.mode.name()
                ),
            })?),
            false => None,
        };
        let clone_ns = sys::monotonic_ns();
        let mut started = clone::start(spec, cgroup.as_mut(), volumes).map_err(setup_failed)?;
        if let Some(cgroup) = &cgroup {
            skipped.splice(0..0, cgroup.skipped().iter().cloned());
        }
        let tun = started.tun.take();
        let work = started
            .work
            .take()
            .map(|(fd, root)| std::sync::Arc::new(crate::workdir::WorkDir::new(fd, root)));
        let mut sandbox = Sandbox {
            pid: started.pid,
            pidfd: started.pidfd,
            channel: started.channel,
            frames: FrameReader::default(),
            recv_buf: vec![0; 256 * 1024],
            inbox: VecDeque::new(),
            cgroup,
            _slot: started.slot,
            raw_child: Some(started.raw_child),
            spec: spec.clone(),
            skipped,
            marks: Vec::new(),
            start_ns,
            clone_ns,
            go_ns: started.go_ns,
            next_id: 0,
            channel_open: true,
            protocol_error: None,
            reaped: None,
            network: None,
            cpu_base: Duration::ZERO,
            background: None,
            received_fds: VecDeque::new(),
            ptys_wanted: Default::default(),
            ptys: Default::default(),
            work,
        };
        if let (Some(gateway), Some(tun)) = (gateway, tun) {
            // On failure the sandbox is dropped: its init killed and reaped.
            sandbox.network = Some(
                gateway
                    .attach(tun, &spec.network)
                    .map_err(|e| setup_failed(format!("the network gateway refused: {e}")))?,
            );
        }
        Ok(sandbox)
    }

    /// The network connections since the last call (none without a gateway).
    pub fn take_network(&mut self) -> Vec<crate::network::Connection> {
        self.network
            .as_mut()
            .map(|n| n.take_connections())
            .unwrap_or_default()
    }

    /// The host uid the sandbox's user (uid 1000 inside) maps to.
    pub(crate) fn user_host_uid(&self) -> u32 {
        self.spec.ids.host_root(self._slot.number()) + 1
    }

    /// The spec the sandbox was built from.
    pub fn spec(&self) -> &SandboxSpec {
        &self.spec
    }

    /// Starts a payload with `stdio` on its fds 0, 1, 2 and `driver` on 3. Returns its id.
    /// `last`: the init exits when this payload ends (a one-shot run).
    pub fn spawn(
        &mut self,
        exec: &Exec,
        stdio: &[BorrowedFd<'_>; 3],
        driver: Option<BorrowedFd<'_>>,
        last: bool,
    ) -> Result<u64, SpawnError> {
        self.spawn_in(exec, stdio, driver, last, None)
    }

    /// [`Sandbox::spawn`] starting in `cwd` (relative to /work) rather than /work.
    pub(crate) fn spawn_in(
        &mut self,
        exec: &Exec,
        stdio: &[BorrowedFd<'_>; 3],
        driver: Option<BorrowedFd<'_>>,
        last: bool,
        cwd: Option<String>,
    ) -> Result<u64, SpawnError> {
        self.spawn_with(exec, &raw_fds(stdio, driver), last, cwd, None, false)
    }

    /// Spawns the sandbox's last payload, one that says its own end: the init gives it,
    /// on the fd after `stdio` and `driver`, a pipe for its exit status (`CODE\n`), written
    /// once its code has finished and its stdio is closed; the run then ends without
    /// waiting for the process's exit (see `ToSandbox::Spawn::says_end`).
    pub(crate) fn spawn_saying_end(
        &mut self,
        exec: &Exec,
        stdio: &[BorrowedFd<'_>; 3],
        driver: BorrowedFd<'_>,
    ) -> Result<u64, SpawnError> {
        self.spawn_with(exec, &raw_fds(stdio, Some(driver)), true, None, None, true)
    }

    /// Sends a `Spawn` with `fds`, or for a terminal of `pty`'s size none.
    fn spawn_with(
        &mut self,
        exec: &Exec,
        fds: &[i32],
        last: bool,
        cwd: Option<String>,
        pty: Option<protocol::PtySize>,
        says_end: bool,
    ) -> Result<u64, SpawnError> {
        let id = self.next_id;
        self.next_id += 1;
        let message = ToSandbox::Spawn {
            id,
            argv: exec.argv.clone(),
            env: exec.env.clone(),
            files: exec.files.clone(),
            fds: fds.len() as u8,
            last,
            outputs: if last { exec.outputs.clone() } else { None },
            cwd,
            pty,
            exec_extra: exec.exec_extra.clone(),
            says_end,
        };
        match self.send(&message, fds) {
            Ok(()) => Ok(id),
            // The init has exited (EPIPE): its SetupFailed, if it wrote one, is the reason
            // (a copied volume that does not fit in /work, say), not the pipe.
            Err(e) => Err(match self.setup_failure() {
                Some(message) => SpawnError::Setup(message),
                None => SpawnError::Send(e),
            }),
        }
    }

    /// Sends a request (write, collect, list or read files; list or kill a call's
    /// processes) and waits up to `timeout` for its answer: the answers in order, up to
    /// and including the one that ends it. Other messages that arrive meanwhile stay
    /// queued for [`Sandbox::next_message`].
    fn request(
        &mut self,
        message: &ToSandbox,
        timeout: Duration,
    ) -> Result<Vec<FromSandbox>, String> {
        self.send(message, &[])
            .map_err(|e| format!("cannot reach the sandbox's init: {e}"))?;
        let end = Instant::now() + timeout;
        let mut answers = Vec::new();
        let mut others = VecDeque::new();
        loop {
            while let Some(m) = self.inbox.pop_front() {
                match m {
                    FromSandbox::FilesWritten
                    | FromSandbox::CallBegun
                    | FromSandbox::FileError { .. }
                    | FromSandbox::OutputsDone { .. }
                    | FromSandbox::Listing { .. }
                    | FromSandbox::FileData { .. }
                    | FromSandbox::CallProcesses { .. }
                    | FromSandbox::ProcessesKilled => {
                        answers.push(m);
                        others.extend(self.inbox.drain(..));
                        self.inbox = others;
                        return Ok(answers);
                    }
                    FromSandbox::OutputFile { .. } => answers.push(m),
                    other => others.push_back(other),
                }
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.inbox = others;
                return Err("the sandbox's init did not answer a request in time".into());
            }
            let timeout = nix::poll::PollTimeout::try_from(left.as_millis() as i32 + 1)
                .unwrap_or(nix::poll::PollTimeout::MAX);
            let mut fds = [
                nix::poll::PollFd::new(self.channel.as_fd(), nix::poll::PollFlags::POLLIN),
                nix::poll::PollFd::new(self.pidfd.as_fd(), nix::poll::PollFlags::POLLIN),
            ];
            let _ = nix::poll::poll(&mut fds, timeout);
            if !self.read_channel() && self.inbox.is_empty() {
                self.inbox = others;
                return Err("the sandbox's init is gone".into());
            }
        }
    }

    /// Sends `signal` to payload `id`'s process group.
    pub fn signal(&mut self, id: u64, signal: i32) -> std::io::Result<()> {
        self.send(&ToSandbox::Signal { id, signal }, &[])
    }

    /// Asks the init to kill every other process of the sandbox; `AllKilled` answers.
    pub fn kill_all(&mut self) -> std::io::Result<()> {
        self.send(&ToSandbox::KillAll, &[])
    }

    fn send(&mut self, message: &ToSandbox, fds: &[i32]) -> std::io::Result<()> {
        let frame = protocol::frame(message, protocol::MAX_SPEC_FRAME)?;
        protocol::send_with_fds(&self.channel, &frame, fds)
    }

    /// The channel, to poll.
    pub fn channel_fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }

    /// The init's pidfd, to poll: readable once the init has exited.
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// Reads what the channel holds now into the inbox. Returns false once it is closed or
    /// broken. Phase marks are kept for the timings, not queued.
    pub fn read_channel(&mut self) -> bool {
        use nix::errno::Errno;
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
        let mut space = nix::cmsg_space!([RawFd; MAX_QUEUED_FDS]);
        while self.channel_open {
            let mut iov = [std::io::IoSliceMut::new(&mut self.recv_buf)];
            let received = recvmsg::<()>(
                self.channel.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .map(|msg| {
                // Fds the kernel put in our table for us: owned at once, so none leaks.
                let fds: Vec<OwnedFd> = msg
                    .cmsgs()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| match c {
                        ControlMessageOwned::ScmRights(fds) => Some(fds),
                        _ => None,
                    })
                    .flatten()
                    .map(sys::adopt_fd)
                    .collect();
                (msg.bytes, fds)
            });
            match received {
                Ok((0, _)) => self.channel_open = false,
                Ok((n, fds)) => {
                    for fd in fds {
                        if self.received_fds.len() == MAX_QUEUED_FDS {
                            self.received_fds.pop_front();
                        }
                        self.received_fds.push_back(fd);
                    }
                    self.frames.feed(&self.recv_buf[..n]);
                }
                Err(Errno::EAGAIN) => break,
                Err(Errno::EINTR) => continue,
                Err(_) => self.channel_open = false,
            }
        }
        while let Some(message) = self.frames.next_message() {
            match message {
                Ok(FromSandbox::Mark { phase, at_ns }) => {
                    if phase == Phase::InitStarted {
                        // Sent by the init after its exec: the raw child's stack is free.
                        self.raw_child = None;
                    }
                    self.marks.push((phase, at_ns))
                }
                Ok(FromSandbox::PtyOpened { id }) => {
                    let fd = self.received_fds.pop_front();
                    if self.ptys_wanted.remove(&id) {
                        self.ptys.insert(id, requests::check_pty_master(fd));
                    }
                }
                Ok(message) => {
                    let taken = match (&mut self.background, requests::report_of(&message)) {
                        (Some(sink), Some(report)) => sink(&report),
                        _ => false,
                    };
                    if !taken {
                        self.inbox.push_back(message)
                    }
                }
                Err(e) => {
                    self.protocol_error = Some(e);
                    self.channel_open = false;
                }
            }
        }
        self.channel_open
    }

    /// Why the init's setup failed, if it said so (its SetupFailed, still in the channel).
    fn setup_failure(&mut self) -> Option<String> {
        // One read takes all it wrote: the loop inside stops at the end (0) or, with an init
        // still alive, at EAGAIN.
        self.read_channel();
        self.inbox.iter().find_map(|m| match m {
            FromSandbox::SetupFailed { error, .. } => Some(error.to_string()),
            _ => None,
        })
    }

    /// The next message read from the channel, if any.
    fn next_message(&mut self) -> Option<FromSandbox> {
        self.inbox.pop_front()
    }

    /// What the channel said that made no sense, if anything.
    pub fn protocol_error(&self) -> Option<&str> {
        self.protocol_error.as_deref()
    }

    /// SIGKILL to the init: the kernel kills the whole pid namespace with it.
    pub fn kill(&self) {
        // ESRCH: it already exited, which is fine.
        let _ = sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
    }

    /// Whether the init has exited (without reaping it).
    pub fn init_exited(&self) -> bool {
        let mut fds = [nix::poll::PollFd::new(
            self.pidfd.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(n) if n > 0)
    }

    /// Reaps the init (once), returning its wait status and rusage.
    fn reap(&mut self) -> &std::io::Result<(i32, libc::rusage)> {
        let pid = self.pid;
        self.reaped.get_or_insert_with(|| sys::wait4(pid))
    }

    /// Starts the peak-memory figure afresh, where the kernel allows (v1; v2 since 6.12),
    /// so that a session's call reports its own peak.
    pub fn reset_peak_memory(&self) {
        if let Some(cgroup) = &self.cgroup {
            cgroup.reset_peak_memory();
        }
    }

    /// What the sandbox's cgroup measured so far.
    pub fn usage(&self) -> Option<Usage> {
        self.cgroup.as_ref().map(RunCgroup::usage)
    }

    /// Raises the memory limit by what the sandbox holds now (see
    /// `RunCgroup::grant_current_memory`); the bytes added.
    pub(crate) fn grant_current_memory(&mut self) -> u64 {
        self.cgroup
            .as_mut()
            .map_or(0, RunCgroup::grant_current_memory)
    }

    /// Built ahead of a request, or a request's now (see `RunCgroup::set_background`): an
    /// error leaving the background means the request's CPU quota is not in place, and the
    /// sandbox must not run its code.
    pub(crate) fn set_background(&self, background: bool) -> Result<(), String> {
        match &self.cgroup {
            Some(cgroup) => cgroup
                .set_background(background)
                .map_err(|e| format!("cannot set the request's CPU quota: {e}")),
            None => Ok(()),
        }
    }

    /// The memory limit, for messages.
    pub fn limits(&self) -> Option<&Limits> {
        self.spec.limits.as_ref()
    }

    /// Layers the host could not give this sandbox.
    pub fn skipped(&self) -> &[Skipped] {
        &self.skipped
    }

    /// Asks the init to shut down, waits up to `patience` for it, then kills it; reaps it
    /// and removes the cgroup. Nothing of the sandbox is left afterwards.
    pub fn close(mut self, patience: Duration) -> Result<(), String> {
        let _ = self.send(&ToSandbox::Shutdown, &[]);
        let end = Instant::now() + patience;
        while !self.init_exited() && Instant::now() < end {
            let mut fds = [nix::poll::PollFd::new(
                self.pidfd.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(10u8));
        }
        self.kill();
        self.reap();
        match self.cgroup.take() {
            Some(cgroup) => cgroup.remove().map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    /// The end of a sandbox whose run is over: its init killed (if it has not exited yet)
    /// and reaped, its cgroup removed. Nothing of the sandbox is left afterwards.
    fn tear_down(mut self) -> Result<(), String> {
        self.kill();
        self.reap();
        match self.cgroup.take() {
            Some(cgroup) => cgroup.remove().map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    /// A one-shot run that failed before its payload started: the sandbox is torn down and
    /// the Outcome says why.
    fn failed_before_running(mut self, message: String, start: Instant) -> (Outcome, Teardown) {
        self.kill();
        self.reap();
        let mut outcome =
            Outcome::failed(ErrorKind::Setup, format!("{message}; the code did not run"));
        outcome.duration = start.elapsed();
        (outcome, Teardown::of(self))
    }

    /// Whether the init reported the end of a payload (`Exited`, still in the inbox).
    fn payload_reported(&self) -> bool {
        self.inbox
            .iter()
            .any(|m| matches!(m, FromSandbox::Exited { .. }))
    }

    /// Supervises the sandbox's last payload (already spawned, its output on `pipes`) to
    /// its end and makes the Outcome; the [`Teardown`] removes the rest. With
    /// [`End::Reported`] the Outcome comes as soon as the init reports the payload's end
    /// (every other process of the sandbox killed and reaped, the output files sent), if
    /// the cgroup keeps the memory peak the init's rusage would otherwise give.
    fn supervise_to(
        mut self,
        pipes: OutputPipes,
        exec: &Exec,
        start: Instant,
        sink: &mut dyn FnMut(Stream, &[u8]),
        stops: supervise::Stops,
        end: End,
    ) -> (Outcome, Teardown) {
        let end = match end {
            End::Reported if self.usage().is_some_and(|u| u.peak_memory.is_some()) => End::Reported,
            _ => End::Reaped,
        };
        let (mut outcome, reaped_ns) =
            supervise::supervise(&mut self, pipes, exec, start, sink, stops, end);
        self.finish_run(&mut outcome, reaped_ns);
        (outcome, Teardown::of(self))
    }

    /// The end of a one-shot run, the init reaped (`reaped_ns`) or reaping nothing more
    /// (None: it reported the payload's end, every other process was reaped): the
    /// cgroup's figures go into the Outcome, and the phases are computed. The cgroup stays
    /// for the [`Teardown`] to remove.
    fn finish_run(&mut self, outcome: &mut Outcome, reaped_ns: Option<u64>) {
        outcome
            .skipped_layers
            .splice(0..0, self.skipped.iter().cloned());
        let payload_started = self.marks.iter().any(|(p, _)| *p == Phase::PayloadReady);
        if let (Some(cgroup), Some(limits)) = (&self.cgroup, self.spec.limits) {
            let mut usage = cgroup.usage();
            usage.cpu = usage.cpu.map(|c| c.saturating_sub(self.cpu_base));
            account(outcome, usage, &limits, payload_started);
        }
        // A reaped init leaves an empty cgroup: removed now, as a one-shot run always did
        // (its time is the phases' cleanup).
        if let Some(cgroup) = reaped_ns.and_then(|_| self.cgroup.take()) {
            if let Err(e) = cgroup.remove() {
                note_cgroup_left(outcome, &e.to_string());
            }
        }
        outcome.phases = Some(self.phases(reaped_ns.unwrap_or_else(sys::monotonic_ns)));
        outcome.network = self.take_network();
    }

    /// The run's phases from the launcher's timestamps and the sandbox's marks; a phase
    /// whose mark never came (a setup failure) is None.
    fn phases(&self, reaped_ns: u64) -> Phases {
        let at = |phase: Phase| {
            self.marks
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
            prepare_ms: span(Some(self.start_ns), Some(self.clone_ns)),
            clone_ms: span(Some(self.clone_ns), Some(self.go_ns)),
            init_exec_ms: span(Some(self.go_ns), init),
            sandbox_ms: span(init, built),
            payload_setup_ms: span(built, ready),
            run_ms: span(ready, exited),
            teardown_ms: span(exited, Some(reaped_ns)),
            cleanup_ms: span(Some(reaped_ns), Some(sys::monotonic_ns())),
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.reaped.is_none() {
            self.kill();
            self.reap();
        }
        // The cgroup, if still held, removes itself (RunCgroup's drop).
    }
}

/// A detached read-only copy of each volume's mount tree (see `sys::clone_tree_readonly`):
/// the init attaches it (`:ro`) or copies from it (`:copy`).
fn open_volumes(spec: &SandboxSpec) -> Result<Vec<OwnedFd>, String> {
    spec.volumes
        .iter()
        .map(|volume| {
            let failed = |e: std::io::Error| {
                format!(
                    "volume {} ({}): {e}",
                    volume.source.display(),
                    volume.target.display()
                )
            };
            let dir = match volume.pinned {
                // The front end's own fd, opened with the right credentials: reopened
                // through /proc, it is the same directory whatever the path is now.
                Some(fd) => crate::caller::open_dir(Path::new(&format!("/proc/self/fd/{fd}"))),
                None => crate::caller::open_dir(&volume.source),
            }
            .map_err(failed)?;
            // Read-only here where the kernel has mount_setattr (5.12); the init makes every
            // mount of an attached tree read-only again in any case.
            sys::clone_tree_readonly(dir.as_fd())
                .map(|(tree, _)| tree)
                .map_err(failed)
        })
        .collect()
}

/// Why [`Sandbox::spawn`] failed: the init's own setup failure, or the send itself.
#[derive(Debug)]
pub enum SpawnError {
    Setup(String),
    Send(std::io::Error),
}

impl SpawnError {
    /// The message to give: the init's reason as it is, a send error after `doing`.
    pub fn describe(self, doing: &str) -> String {
        match self {
            SpawnError::Setup(message) => message,
            SpawnError::Send(e) => format!("{doing}: {e}"),
        }
    }
}

/// One execution's stdio: the payload's ends (sent to the init) and the launcher's.
pub(crate) struct ExecStreams {
    stdin: OwnedFd,
    stdout_w: OwnedFd,
    stderr_w: OwnedFd,
    stdout: File,
    stderr: File,
    /// Writes the execution's stdin into its pipe, if it has any.
    feeder: Option<std::thread::JoinHandle<()>>,
}

/// The launcher's ends of an execution's output, once the payload holds its own.
pub(crate) struct OutputPipes {
    pub stdout: File,
    pub stderr: File,
}

impl ExecStreams {
    /// Pipes for stdout and stderr; stdin is /dev/null, or a pipe that a thread fills with
    /// the execution's stdin and closes (a payload that does not read it ends the thread
    /// with EPIPE when it exits).
    pub(crate) fn open(exec: &Exec) -> Result<ExecStreams, String> {
        let (stdout, stdout_w) =
            pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("cannot create the stdout pipe: {e}"))?;
        let (stderr, stderr_w) =
            pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("cannot create the stderr pipe: {e}"))?;
        let (stdin, feeder) = match &exec.stdin {
            None => {
                let null = nix::fcntl::open(
                    "/dev/null",
                    OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                    nix::sys::stat::Mode::empty(),
                )
                .map_err(|e| format!("cannot open /dev/null for stdin: {e}"))?;
                (null, None)
            }
            Some(bytes) => {
                let (read, write) = pipe2(OFlag::O_CLOEXEC)
                    .map_err(|e| format!("cannot create the stdin pipe: {e}"))?;
                let bytes = bytes.clone();
                let feeder = std::thread::spawn(move || {
                    let _ = std::io::Write::write_all(&mut File::from(write), &bytes);
                });
                (read, Some(feeder))
            }
        };
        Ok(ExecStreams {
            stdin,
            stdout_w,
            stderr_w,
            stdout: File::from(stdout),
            stderr: File::from(stderr),
            feeder,
        })
    }

    /// Gives the payload's ends of the pipes to host uid `uid` (the sandbox's user), so the
    /// payload may open them again through /proc/self/fd (Node, which has no dup(), gets
    /// back a stdout a cell closed that way). A pipe is reachable only by who holds it.
    pub(crate) fn give_to(&self, uid: u32) -> Result<(), String> {
        let owner = Some(nix::unistd::Uid::from_raw(uid));
        let group = Some(nix::unistd::Gid::from_raw(uid));
        for fd in [&self.stdout_w, &self.stderr_w] {
            nix::unistd::fchown(fd.as_fd(), owner, group)
                .map_err(|e| format!("cannot give the output pipes to the sandbox: {e}"))?;
        }
        Ok(())
    }

    pub(crate) fn child_fds(&self) -> [BorrowedFd<'_>; 3] {
        [
            self.stdin.as_fd(),
            self.stdout_w.as_fd(),
            self.stderr_w.as_fd(),
        ]
    }

    /// Drops the payload's ends (or the launcher would never see EOF) and keeps the
    /// launcher's.
    pub(crate) fn into_parent(self) -> OutputPipes {
        let ExecStreams {
            stdout,
            stderr,
            feeder,
            ..
        } = self;
        // The feeder finishes on its own (all written, or EPIPE); it is not waited for.
        drop(feeder);
        OutputPipes { stdout, stderr }
    }
}

/// Puts what the cgroup measured into the Outcome: the whole sandbox's figures replace the
/// init's rusage, OOM kills are counted, and the verdict names what ended the run. A run
/// the launcher stopped (timeout, output limit) keeps that verdict; OOM kills along the way
/// are only counted. Otherwise the run ended by OOM if the kernel's OOM killer took the
/// program itself (SIGKILL) or the init.
fn account(outcome: &mut Outcome, usage: Usage, limits: &Limits, payload_started: bool) {
    // Where the kernel keeps no peak (v2 before 5.19), the init's rusage (the largest RSS
    // it reaped) is the estimate, within the limit.
    outcome.peak_memory_bytes = usage.peak_memory_or_estimate(None, outcome.peak_memory_bytes);
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
    outcome.message = Some(oom_message(&memory, payload_started, outcome.init_lost));
}

/// What an OOM verdict says, in words every front end can use.
pub(crate) fn oom_message(memory: &str, payload_started: bool, init_lost: bool) -> String {
    if !payload_started {
        return format!(
            "the sandbox ran out of memory while it was being built (the code file in /work and the \
             interpreter's start count against the memory limit of {memory}); the code did not run. Allow \
             more memory, or send less code."
        );
    }
    let who = if init_lost {
        "the sandbox's init, and with it every process"
    } else {
        "the program"
    };
    format!(
        "the code reached the memory limit of {memory} and the kernel's OOM killer killed {who}; the \
         output up to then is kept. Use less memory (process data in chunks, free large objects), or \
         allow more memory."
    )
}
