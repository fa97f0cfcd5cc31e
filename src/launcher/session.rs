//! Sessions: one long-lived sandbox running a language's REPL driver, which executes many
//! calls and keeps its state between them (drivers/ in the repository).
//!
//! The driver speaks on a socket of its own (fd 3 in the driver), never on the user's
//! stdout, so a `print` cannot break the framing; the user's stdout and stderr are the
//! driver's fds 1 and 2, read as streams (subprocesses and C extensions included). The
//! launcher holds the other end of that socket directly: the init only passes it on at
//! spawn time and never reads it. Everything the driver sends is untrusted (the cell can
//! write to fd 3 too): lines are capped, events are validated and capped, stale ones (of
//! an earlier call) are dropped. Verdicts come from the cgroup, the wait status and the
//! launcher's own clock, never from the driver's word.
//!
//! A call that must stop (its timeout, an interrupt, the output cap) is interrupted first:
//! SIGINT to the driver's process group (KeyboardInterrupt in Python, a broken evaluation
//! in Node, the foreground job in bash). If the driver answers within [`GRACE`], the session
//! is kept (`state.preserved`); if not, every process of the sandbox but its init is killed
//! (the init holds the mounts, so /work survives) and the driver is started again
//! (`state.restarted`). When the driver did answer, the processes the call started in the
//! driver's process group and that are still running at the end of the grace period are
//! killed and listed (`killed`): a child that ignores SIGINT does not keep the session's
//! CPU past its call. What the cell put in the background on purpose (a process in a
//! session or process group of its own, `setsid`, a daemon; or one that ignores SIGHUP,
//! as `nohup` makes it) is left.
//!
//! The request is written to the driver's channel as the driver reads it (a cell of any
//! size reaches the interpreter whole), within the call's deadline. A driver that exits
//! during a call (`exit 3` in bash, `process.exit()` in Node) gives the call its exit
//! status and is started again; one whose streams the cell broke beyond repair asks for a
//! restart in its answer.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde::{Deserialize, Serialize};

use super::processes::{self, Processes};
use super::supervise::with_read_buf;
use super::{CallProcess, ExecStreams, OutputPipes, Report, Sandbox, StartError, Stream};
use crate::cgroup::Usage;
use crate::files::{DirEntry, InputFile, OutputRules};
use crate::outcome::{ErrorKind, Outcome};
use crate::runner::Lang;
use crate::spec::{Exec, SandboxSpec};
use crate::units::{format_duration, format_size};

/// How long an interrupted driver has to answer before every process is killed.
pub const GRACE: Duration = Duration::from_secs(2);
/// How long a driver may take to start (an interpreter, its imports).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest line the launcher reads from a driver.
const MAX_LINE: usize = 24 << 20;
/// At most this many displays per call, and this many bytes of them in all.
const MAX_DISPLAYS: usize = 64;
const MAX_DISPLAY_BYTES: usize = 16 << 20;
/// One text MIME type, one image, a MIME type's name.
const MAX_TEXT: usize = 256 << 10;
const MAX_IMAGE: usize = 8 << 20;
const MAX_MIME_NAME: usize = 100;

/// The program a session of `lang` starts (its driver's interpreter): what an exec
/// allowlist must allow for the session to run.
pub fn driver_program(lang: crate::runner::Lang) -> &'static str {
    match crate::drivers::argv(lang).first().map(String::as_str) {
        Some("python3") => "python3",
        Some("bash") => "bash",
        _ => "node",
    }
}

/// What a session is built from: the box (with drivers), the language, the environment,
/// and each call's default timeout and output cap.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSpec {
    pub sandbox: SandboxSpec,
    pub lang: Lang,
    /// Under an exec allowlist, what a context's driver may execute beyond it (its
    /// interpreter, `[exec] interpreter = "context"`), by context (python, node, bash):
    /// the driver and what it starts get it; the session's processes do not.
    pub context_exec: Vec<(Lang, crate::exec_policy::ExecAllowlist)>,
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    pub output_limit: u64,
    /// Output files to take back after each call (new or changed during it).
    pub outputs: Option<OutputRules>,
}

/// One call.
#[derive(Debug, Clone, Default)]
pub struct Call {
    pub code: String,
    /// Text the cell reads on stdin (`input()`, `read`).
    pub stdin: Option<String>,
    /// This call's limit (the session's default if None).
    pub timeout: Option<Duration>,
    /// Files placed in /work before the code runs (checked by the front end against the
    /// profile's caps).
    pub files: Vec<InputFile>,
    /// The context it runs in (the session's language if None): python, node or
    /// typescript (one Node context), bash. See [`context_of`].
    pub lang: Option<Lang>,
}

/// The context a language's calls run in: Python, Node (node and typescript calls; a
/// typescript call's code is stripped of its types) or bash.
pub fn context_of(lang: Lang) -> Lang {
    match lang {
        Lang::Typescript => Lang::Node,
        other => other,
    }
}

/// The contexts a session holds now (the languages whose interpreter is started), in the
/// order python, node, bash; readable from any thread, while a call runs too.
#[derive(Clone, Default)]
pub struct Contexts(Arc<std::sync::Mutex<Vec<Lang>>>);

impl Contexts {
    pub fn languages(&self) -> Vec<Lang> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A MIME bundle: type -> content (text, or base64 for binary types).
pub type MimeBundle = BTreeMap<String, String>;

/// A MIME bundle: type -> content (text, or base64 for binary types). (The OpenAPI
/// schema of [`MimeBundle`], by that name.)
#[cfg(feature = "openapi")]
#[derive(utoipa::ToSchema)]
#[schema(as = MimeBundle)]
#[allow(dead_code)]
pub struct MimeBundleSchema(BTreeMap<String, String>);

/// An exception a cell raised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Exception {
    pub name: String,
    pub value: String,
    pub traceback: Vec<String>,
}

/// Whether a call kept the session's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct State {
    /// Variables, imports and the working directory are as the call left them.
    pub preserved: bool,
    /// The interpreter was started again: everything in memory is gone (/work is kept).
    pub restarted: bool,
}

/// A process a stopped call had started, killed because it outlived the interrupt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KilledProcess {
    pub pid: i32,
    pub command: String,
}

/// The result of one call: what a run gives, plus the REPL's own.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CallOutcome {
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(inline))]
    pub outcome: Outcome,
    pub execution_count: Option<u64>,
    /// The trailing expression's value, as the REPL would show it: a MIME bundle (type
    /// -> text, or base64 for binary types).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<MimeBundleSchema>))]
    pub result: Option<MimeBundle>,
    /// MIME bundles shown during the call (figures, `display()`).
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<MimeBundleSchema>))]
    pub displays: Vec<MimeBundle>,
    pub exception: Option<Exception>,
    pub state: State,
    /// bash: the working directory after the call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Processes the call started that did not stop at its interrupt, killed after the
    /// grace period.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub killed: Vec<KilledProcess>,
}

/// Something a call produced, as it happens (for streaming front ends).
#[derive(Debug, Clone)]
pub enum Event<'a> {
    Output(Stream, &'a [u8]),
    Display(&'a MimeBundle),
}

/// Interrupts the call a session is running, from another thread.
#[derive(Clone)]
pub struct Interrupter(Arc<OwnedFd>);

impl Interrupter {
    /// Stops the running call as a timeout would (a call started later is not affected).
    pub fn interrupt(&self) {
        let _ = nix::unistd::write(self.0.as_fd(), b"!");
    }
}

/// A live session.
pub struct Session {
    sandbox: Sandbox,
    spec: SessionSpec,
    /// Its contexts: one driver per language (see [`context_of`]), each started on first
    /// use, the session's own language at the start.
    drivers: Vec<Driver>,
    /// The contexts ever started (a call to one that is gone says `restarted`).
    started: Vec<Lang>,
    /// Exits the init reported for drivers other than the one a reader waited for.
    exits: Vec<(u64, Option<i32>, Option<i32>)>,
    /// What the session view shows of `drivers`.
    contexts: Contexts,
    interrupts: OwnedFd,
    interrupter: Interrupter,
    /// The sandbox itself is gone (its init died): no call can run any more.
    lost: Option<String>,
    /// The cgroup's figures as the running call began: the base of its deltas.
    last_usage: Option<Usage>,
    /// Its background processes (src/launcher/processes.rs).
    processes: Processes,
}

/// The driver process of a session, as the launcher holds it.
struct Driver {
    /// Its context: Python, Node or Bash.
    lang: Lang,
    id: u64,
    channel: UnixStream,
    pipes: OutputPipes,
    lines: LineReader,
}

/// The driver's events, as the launcher accepts them.
#[derive(Debug, Deserialize)]
#[serde(tag = "ev", rename_all = "lowercase")]
enum DriverEvent {
    Ready,
    Display {
        id: Option<u64>,
        data: BTreeMap<String, String>,
    },
    Done {
        id: Option<u64>,
        execution_count: Option<u64>,
        result: Option<BTreeMap<String, String>>,
        exception: Option<Exception>,
        status: Option<i32>,
        cwd: Option<String>,
        /// The driver cannot give the next call its streams: it asks to be started again.
        #[serde(default)]
        restart: Option<bool>,
    },
}

impl Session {
    /// Starts the sandbox and its driver, and waits until the driver is ready.
    pub fn start(spec: SessionSpec) -> Result<Session, StartError> {
        Session::start_with(spec, false)
    }

    /// [`Session::start`] ahead of a request (the warm pool): the sandbox runs in the
    /// background (the lowest CPU weight and no CPU quota, see
    /// `RunCgroup::set_background`) until [`Session::handed_over`], so starting it takes
    /// only CPU that requests leave idle, at full speed. The request's quota comes back at
    /// the hand-over; a call or a process started before it hands the session over first
    /// (and fails if the quota cannot be put back).
    pub fn start_ahead(spec: SessionSpec) -> Result<Session, StartError> {
        Session::start_with(spec, true)
    }

    /// A session started ahead is a request's now: the default CPU weight and the
    /// request's CPU quota back (lifted while it started, see `RunCgroup::set_background`).
    /// An error means the quota is not in place: the session must not be used. Calling it
    /// again once it is a request's writes nothing.
    pub fn handed_over(&self) -> Result<(), StartError> {
        self.sandbox
            .set_background(false)
            .map_err(|message| StartError {
                kind: ErrorKind::Setup,
                message,
            })
    }

    fn start_with(mut spec: SessionSpec, background: bool) -> Result<Session, StartError> {
        spec.sandbox.drivers = true;
        let mut sandbox = Sandbox::start(&spec.sandbox)?;
        if background {
            // Lifting the quota is best effort: a start that keeps it only takes longer.
            let _ = sandbox.set_background(true);
        }
        let processes = Processes::new().map_err(|message| StartError {
            kind: ErrorKind::Setup,
            message,
        })?;
        let table = processes.clone();
        sandbox.set_background_sink(Box::new(move |report| table.take_report(report)));
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
                .map_err(|e| StartError {
                    kind: ErrorKind::Setup,
                    message: format!("cannot create the interrupt pipe: {e}"),
                })?;
        let mut session = Session {
            sandbox,
            spec,
            drivers: Vec::new(),
            started: Vec::new(),
            exits: Vec::new(),
            contexts: Contexts::default(),
            interrupts: read,
            interrupter: Interrupter(Arc::new(write)),
            lost: None,
            last_usage: None,
            processes,
        };
        session
            .start_driver(context_of(session.spec.lang))
            .map_err(|(kind, message)| StartError { kind, message })?;
        session.publish();
        // Opens the cgroup files every call reads while the session is built (a pooled one
        // before its request), and is the first call's base.
        session.last_usage = session.sandbox.usage();
        Ok(session)
    }

    /// The session's own language (its calls' default).
    pub fn lang(&self) -> Lang {
        self.spec.lang
    }

    /// Its contexts, as they are now and will be (a handle for other threads).
    pub fn contexts(&self) -> Contexts {
        self.contexts.clone()
    }

    /// The sandbox's /work from the host, for stat, list, mkdir, move, remove and watch
    /// (from any thread, while a call runs too); None if the launcher could not keep it.
    pub fn work_dir(&self) -> Option<std::sync::Arc<crate::workdir::WorkDir>> {
        self.sandbox.work_dir()
    }

    /// Shows the started contexts in [`Contexts`].
    fn publish(&self) {
        let mut now: Vec<Lang> = [Lang::Python, Lang::Node, Lang::Bash]
            .into_iter()
            .filter(|l| self.drivers.iter().any(|d| d.lang == *l))
            .collect();
        let mut shown = self.contexts.0.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::swap(&mut *shown, &mut now);
    }

    /// What the session was started from.
    pub fn spec(&self) -> &SessionSpec {
        &self.spec
    }

    /// A handle that interrupts the running call from another thread.
    pub fn interrupter(&self) -> Interrupter {
        self.interrupter.clone()
    }

    /// The session's background processes: poll them, write their stdin, queue signals
    /// (from any thread, while a call runs too).
    pub fn processes(&self) -> Processes {
        self.processes.clone()
    }

    /// Starts a background process in the sandbox, beside the interpreter: the session's
    /// environment plus `start.env` and `CODECAGE_SHELL=exec`. Returns its id.
    pub fn start_process(&mut self, start: &processes::Start) -> Result<u64, String> {
        if let Some(why) = &self.lost {
            return Err(why.clone());
        }
        self.handed_over().map_err(|e| e.message)?;
        self.tend_processes();
        let mut exec = Exec::new(start.argv.clone());
        for (key, value) in self.spec.env.iter().chain(&start.env) {
            exec.set_env(key, value);
        }
        exec.set_env("CODECAGE_SHELL", "exec");
        exec.exec_extra = start.exec_extra.clone();
        if let Some(size) = start.pty {
            exec.set_env("TERM", "xterm-256color");
            let (payload, master) =
                self.sandbox
                    .spawn_on_terminal(&exec, start.cwd.clone(), size.rows, size.cols)?;
            let id = self.processes.add_on_terminal(start, payload, master);
            match &id {
                // Its exit may have been read while the master was awaited.
                Ok(_) => self.sandbox.offer_queued_reports(),
                Err(_) => drop(self.sandbox.signal(payload, libc::SIGKILL)),
            }
            return id;
        }
        let pipes = processes::Pipes::open(start.stdin)?;
        let [stdin, stdout, stderr] = &pipes.child;
        let payload = self
            .sandbox
            .spawn_in(
                &exec,
                &[stdin.as_fd(), stdout.as_fd(), stderr.as_fd()],
                None,
                false,
                start.cwd.clone(),
            )
            .map_err(|e| e.describe("cannot start the process"))?;
        let processes::Pipes {
            child,
            stdin,
            stdout,
            stderr,
        } = pipes;
        // The payload's ends go now, or the reader would never see the pipes' end.
        drop(child);
        let id = self.processes.add(start, payload, stdin, stdout, stderr);
        if id.is_err() {
            let _ = self.sandbox.signal(payload, libc::SIGKILL);
        }
        id
    }

    /// Waits until process `id` has ended and its output is read, or `until`; whether it
    /// has. The session's owner waits here (it reads the sandbox's reports meanwhile).
    pub fn wait_process(&mut self, id: u64, until: Instant) -> Result<bool, String> {
        loop {
            self.tend_processes();
            match self.processes.finished(id) {
                None => return Err(format!("there is no process {id} in this session")),
                Some(true) => return Ok(true),
                Some(false) => {}
            }
            let now = Instant::now();
            if now >= until {
                return Ok(false);
            }
            if let Some(why) = &self.lost {
                return Err(why.clone());
            }
            let _ = self.wait_channel((now + Duration::from_millis(20)).min(until));
        }
    }

    /// Reads the sandbox's reports (the processes' exits), sends the signals queued for
    /// the processes and kills those past their time limit; the soonest deadline left.
    pub fn tend_processes(&mut self) -> Option<Instant> {
        if self.lost.is_none() {
            self.sandbox.read_channel();
        }
        if self.lost.is_some() || self.sandbox.init_exited() {
            // No report can come any more: the pid namespace took them all.
            self.processes.sandbox_gone();
        }
        self.processes_due()
    }

    /// Sends the processes' queued signals and deadline kills; the soonest deadline left.
    fn processes_due(&mut self) -> Option<Instant> {
        let (due, next) = self.processes.due();
        for (payload, signal) in due {
            let _ = self.sandbox.signal(payload, signal);
        }
        next
    }

    /// Whether the sandbox is gone for good (its init died).
    pub fn is_lost(&self) -> bool {
        self.lost.is_some()
    }

    /// What the sandbox's cgroup measured so far.
    pub fn usage(&self) -> Option<Usage> {
        self.sandbox.usage()
    }

    /// A fresh interpreter in the same sandbox; /work is kept. `lang` None: every context
    /// (every process but the init is killed, background ones too, and the session's own
    /// language started again; the others are made again on first use). A language: that
    /// context only (its driver's process group killed, the driver started again; nothing
    /// to do if it was never started); the other contexts and the processes are left.
    pub fn reset(&mut self, lang: Option<Lang>) -> Result<(), String> {
        if let Some(why) = &self.lost {
            return Err(why.clone());
        }
        let result = match lang.map(context_of) {
            None => self.kill_processes().and_then(|()| {
                self.start_driver(context_of(self.spec.lang))
                    .map_err(|(_, message)| message)
            }),
            Some(kind) if self.driver_of(kind).is_none() => Ok(()),
            Some(kind) => self
                .kill_context(kind)
                .and_then(|()| self.start_driver(kind).map_err(|(_, message)| message)),
        };
        self.publish();
        result
    }

    fn driver_of(&self, kind: Lang) -> Option<&Driver> {
        self.drivers.iter().find(|d| d.lang == kind)
    }

    /// Ends the session: every process is killed, the cgroup removed.
    pub fn close(self) -> Result<(), String> {
        self.sandbox.close(Duration::from_secs(1))
    }

    /// Runs one call to its end and reports it.
    pub fn execute(&mut self, call: &Call, events: &mut dyn FnMut(Event)) -> CallOutcome {
        let start = Instant::now();
        let timeout = call.timeout.unwrap_or(self.spec.timeout);
        let mut result = CallOutcome {
            outcome: Outcome::default(),
            execution_count: None,
            result: None,
            displays: Vec::new(),
            exception: None,
            state: State::default(),
            cwd: None,
            killed: Vec::new(),
        };
        let lang = call.lang.unwrap_or(self.spec.lang);
        let kind = context_of(lang);
        if kind == Lang::Bash && call.code.contains('\0') {
            result.outcome = Outcome::failed(
                ErrorKind::InvalidRequest,
                "the code holds a NUL byte, which a bash cell cannot (bash's strings end at one); \
                 remove it, or write the bytes with printf '\\0'",
            );
            return result;
        }
        if let Some(why) = &self.lost {
            result.outcome = Outcome::failed(ErrorKind::SessionLost, why.clone());
            return result;
        }
        if let Err(e) = self.handed_over() {
            result.outcome = Outcome::failed(e.kind, e.message);
            return result;
        }
        // A context whose driver died while idle (another context's call ran, the OOM
        // killer chose it) is started again before the call.
        self.sandbox.read_channel();
        self.gather_exits();
        if let Some(id) = self.driver_of(kind).map(|d| d.id) {
            if self.exits.iter().any(|e| e.0 == id) {
                let _ = self.kill_context(kind);
            }
        }
        if self.driver_of(kind).is_none() {
            let again = self.started.contains(&kind);
            let started = self.start_driver(kind);
            self.publish();
            if let Err((error, message)) = started {
                let message = if again {
                    message
                } else {
                    format!(
                        "the {} context could not be made in this session's sandbox: {message}. Its image \
                         must have the {} interpreter; the session's other contexts are unaffected",
                        kind.name(),
                        program_of(kind)
                    )
                };
                result.outcome = Outcome::failed(error, message);
                return result;
            }
            result.state.restarted = again;
        }
        // Interrupts that came while no call ran are not for this one.
        let mut drained = [0u8; 64];
        while matches!(nix::unistd::read(&self.interrupts, &mut drained), Ok(n) if n > 0) {}
        if let Some(cgroup_usage) = self.sandbox.usage() {
            self.last_usage = Some(cgroup_usage);
        }
        self.sandbox.reset_peak_memory();
        if !call.files.is_empty() {
            if let Err(message) = self.write_files(&call.files) {
                result.outcome = Outcome::failed(ErrorKind::InvalidRequest, message);
                return result;
            }
        }
        let marked = self.begin_call();
        let mut call_state = CallRun::new(self.spec.output_limit, start + timeout, events);
        call_state.request = self.request(call, lang);
        call_state.since_ns = crate::sys::boottime_ns();
        self.supervise(&mut call_state, kind);
        self.conclude(call_state, timeout, &mut result, kind);
        self.publish();
        if self.lost.is_none() {
            self.collect_outputs(marked, &mut result.outcome);
        }
        result.outcome.duration = start.elapsed();
        result.outcome.network = self.sandbox.take_network();
        result
    }

    /// Writes files into /work (the session must not be running a call).
    pub fn write_files(&mut self, files: &[InputFile]) -> Result<(), String> {
        self.sandbox.write_files(files)
    }

    /// Lists a directory under /work.
    pub fn list_files(&mut self, path: &str) -> Result<Vec<DirEntry>, String> {
        self.sandbox.list_dir(path)
    }

    /// Reads a file under /work, at most `max` bytes.
    pub fn read_file(&mut self, path: &str, max: u64) -> Result<Vec<u8>, String> {
        self.sandbox.read_file(path, max)
    }

    /// Tells the init a call begins (it notes the last pid, and the output directory if
    /// the session takes output files); whether the output directory was noted.
    fn begin_call(&mut self) -> bool {
        let rules = self.spec.outputs.clone();
        let outputs = rules.is_some();
        let begun = self.sandbox.begin_call(rules);
        outputs && begun
    }

    /// Takes the output files new or changed since the call began (all of them if the
    /// directory could not be noted then).
    fn collect_outputs(&mut self, marked: bool, outcome: &mut Outcome) {
        let Some(rules) = self.spec.outputs.clone() else {
            return;
        };
        if let Err(e) = self.sandbox.collect_outputs(&rules, marked, outcome) {
            let note = format!("the output files could not be taken: {e}");
            outcome.message = Some(match outcome.message.take() {
                Some(m) => format!("{m}; {note}"),
                None => note,
            });
        }
    }

    /// The request line (and, for bash, the raw code and stdin after it).
    fn request(&self, call: &Call, lang: Lang) -> Vec<u8> {
        let id = self.driver_of(context_of(lang)).map_or(0, |d| d.id);
        match lang {
            Lang::Bash => {
                let stdin_len = call.stdin.as_ref().map_or(-1, |s| s.len() as i64);
                let mut bytes =
                    format!("execute {id} {} {stdin_len}\n", call.code.len()).into_bytes();
                bytes.extend_from_slice(call.code.as_bytes());
                bytes.extend_from_slice(call.stdin.as_deref().unwrap_or("").as_bytes());
                bytes
            }
            Lang::Node | Lang::Typescript => {
                let request = serde_json::json!({
                    "op": "execute", "id": id, "code": call.code, "stdin": call.stdin,
                    "typescript": lang == Lang::Typescript,
                });
                let mut bytes = request.to_string().into_bytes();
                bytes.push(b'\n');
                bytes
            }
            Lang::Python => {
                let request = serde_json::json!({
                    "op": "execute", "id": id, "code": call.code, "stdin": call.stdin,
                });
                let mut bytes = request.to_string().into_bytes();
                bytes.push(b'\n');
                bytes
            }
        }
    }

    /// Polls the driver's streams and channel, the sandbox's channel and init, and the
    /// interrupt pipe until the call ends.
    fn supervise(&mut self, run: &mut CallRun, kind: Lang) {
        with_read_buf(|buf| self.supervise_with(run, kind, buf))
    }

    fn supervise_with(&mut self, run: &mut CallRun, kind: Lang, buf: &mut [u8]) {
        while run.end.is_none() {
            let now = Instant::now();
            let stop = run.stop_reason.is_some() || now >= run.deadline;
            if stop && run.interrupted_at.is_none() {
                run.stop_reason.get_or_insert(ErrorKind::Timeout);
                run.interrupted_at = Some(now);
                if let Some(driver) = self.drivers.iter().find(|d| d.lang == kind) {
                    let _ = self.sandbox.signal(driver.id, libc::SIGINT);
                }
            }
            if run.interrupted_at.is_some_and(|at| now >= at + GRACE) {
                run.end = Some(End::Unresponsive);
                break;
            }
            let wake = match run.interrupted_at {
                Some(at) => at + GRACE,
                None => run.deadline,
            };
            let next_process = self.processes_due();
            let wake = next_process.map_or(wake, |p| p.min(wake));
            let Some(driver) = self.drivers.iter_mut().find(|d| d.lang == kind) else {
                run.end = Some(End::DriverGone);
                break;
            };
            let timeout = wake
                .saturating_duration_since(now)
                .min(Duration::from_secs(60));
            let timeout =
                PollTimeout::try_from(timeout.as_millis() as i32 + 1).unwrap_or(PollTimeout::MAX);
            let channel_events = if run.sent < run.request.len() {
                PollFlags::POLLIN | PollFlags::POLLOUT
            } else {
                PollFlags::POLLIN
            };
            let mut fds = [
                PollFd::new(driver.pipes.stdout.as_fd(), PollFlags::POLLIN),
                PollFd::new(driver.pipes.stderr.as_fd(), PollFlags::POLLIN),
                PollFd::new(driver.channel.as_fd(), channel_events),
                PollFd::new(self.sandbox.channel_fd(), PollFlags::POLLIN),
                PollFd::new(self.sandbox.pidfd(), PollFlags::POLLIN),
                PollFd::new(self.interrupts.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.processes.wake_fd(), PollFlags::POLLIN),
            ];
            if let Err(e) = poll(&mut fds, timeout) {
                if e != nix::errno::Errno::EINTR {
                    run.end = Some(End::SandboxGone(format!("poll failed: {e}")));
                }
                continue;
            }
            let writable = fds[2]
                .revents()
                .is_some_and(|r| r.contains(PollFlags::POLLOUT));
            let ready: Vec<bool> = fds
                .iter()
                .map(|fd| {
                    fd.revents()
                        .is_some_and(|r| !(r - PollFlags::POLLOUT).is_empty())
                })
                .collect();
            if writable && run.write_request(&mut driver.channel).is_err() {
                run.end.get_or_insert(End::DriverGone);
            }
            for (i, stream) in [(0, Stream::Stdout), (1, Stream::Stderr)] {
                if ready[i] && !run.output_capped {
                    let pipe = match stream {
                        Stream::Stdout => &mut driver.pipes.stdout,
                        Stream::Stderr => &mut driver.pipes.stderr,
                    };
                    run.drain(pipe, stream, buf);
                }
            }
            if ready[2] {
                match driver.lines.fill(&mut driver.channel, buf) {
                    Ok(true) => {}
                    Ok(false) => run.end = Some(End::DriverGone),
                    Err(e) => run.end = Some(End::DriverBroke(e)),
                }
                while let Some(line) = driver.lines.next_line() {
                    run.event(driver.id, &line);
                }
            }
            if ready[3] {
                self.sandbox.read_channel();
                while let Some(report) = self.sandbox.next_report() {
                    match report {
                        Report::Exited { id, code, signal } if id == driver.id => {
                            run.driver_exit = Some((code, signal));
                            run.end.get_or_insert(End::DriverGone);
                        }
                        Report::SetupFailed {
                            id: Some(id),
                            error,
                        } if id == driver.id => {
                            run.end = Some(End::DriverBroke(error));
                        }
                        // Another context's driver: its next call learns it.
                        Report::Exited { id, code, signal } => {
                            note_exit(&mut self.exits, id, code, signal)
                        }
                        _ => {}
                    }
                }
            }
            if ready[4] {
                run.end = Some(End::SandboxGone(
                    "the session's sandbox ended (its init died)".into(),
                ));
            }
            if ready[5] {
                let mut drained = [0u8; 64];
                while matches!(nix::unistd::read(&self.interrupts, &mut drained), Ok(n) if n > 0) {}
                run.stop_reason.get_or_insert(ErrorKind::Interrupted);
            }
        }
        // Output written before the driver answered is in the pipes already.
        if let Some(driver) = self.drivers.iter_mut().find(|d| d.lang == kind) {
            if !run.output_capped {
                run.drain(&mut driver.pipes.stdout, Stream::Stdout, buf);
                run.drain(&mut driver.pipes.stderr, Stream::Stderr, buf);
            }
        }
    }

    /// Turns how the call ended into its result; restarts the driver where the call's end
    /// took it down.
    fn conclude(&mut self, run: CallRun, timeout: Duration, result: &mut CallOutcome, kind: Lang) {
        let usage = self.sandbox.usage();
        let outcome = &mut result.outcome;
        outcome.stdout = run.stdout;
        outcome.stderr = run.stderr;
        outcome.truncated = run.output_capped;
        result.displays = run.displays;
        if !run.notes.is_empty() {
            outcome.message = Some(run.notes.join("; "));
        }
        let oom_kills = match (&usage, &self.last_usage) {
            (Some(now), Some(before)) => now.oom_kills.saturating_sub(before.oom_kills),
            (Some(now), None) => now.oom_kills,
            _ => 0,
        };
        if let Some(now) = &usage {
            outcome.oom_kills = oom_kills;
            // Where the kernel keeps no peak (v2 before 5.19): the limit if this call met it.
            outcome.peak_memory_bytes = now.peak_memory_or_estimate(self.last_usage.as_ref(), None);
            outcome.pids_limit_hit = match &self.last_usage {
                Some(before) => now.pids_limit_hits > before.pids_limit_hits,
                None => now.pids_limit_hits > 0,
            };
            if let (Some(cpu), Some(before)) = (now.cpu, self.last_usage.and_then(|u| u.cpu)) {
                outcome.cpu = cpu.saturating_sub(before);
            }
        }
        let memory = self
            .sandbox
            .limits()
            .map_or_else(String::new, |l| format_size(l.memory));
        let driver_id = self.driver_of(kind).map(|d| d.id);
        match run.end.unwrap_or(End::DriverGone) {
            End::Done(done) => {
                result.execution_count = done.execution_count;
                result.result = done.result;
                result.exception = done.exception;
                result.cwd = done.cwd;
                outcome.exit_code = done.status;
                result.state.preserved = true;
                match run.stop_reason {
                    Some(reason) => stopped(outcome, reason, timeout, self.spec.output_limit, true),
                    None if result.exception.is_some() => {
                        let e = result.exception.as_ref().expect("checked");
                        outcome.error = Some(ErrorKind::Exception);
                        outcome.message = Some(format!("{}: {}", e.name, e.value));
                    }
                    None => {}
                }
                if let (Some(at), Some(id)) = (run.interrupted_at, driver_id) {
                    result.killed = self.stop_call_processes(id, run.since_ns, at + GRACE);
                    if !result.killed.is_empty() {
                        let listed: Vec<String> = result
                            .killed
                            .iter()
                            .map(|p| format!("{} (pid {})", p.command, p.pid))
                            .collect();
                        add_note(
                            &mut result.outcome,
                            &format!(
                                "processes the call started did not stop at the interrupt and were \
                                 killed: {}",
                                listed.join(", ")
                            ),
                        );
                    }
                }
                if done.restart {
                    self.restart_after(
                        kind,
                        result,
                        "the cell closed the interpreter's own copies of its streams",
                    );
                    add_note(
                        &mut result.outcome,
                        "the cell closed the interpreter's own copies of its output streams, so it \
                         was started again: its variables are gone, /work is kept",
                    );
                }
            }
            End::Unresponsive => {
                let reason = run.stop_reason.unwrap_or(ErrorKind::Timeout);
                self.restart_after(kind, result, "did not stop within the grace period");
                stopped(
                    &mut result.outcome,
                    reason,
                    timeout,
                    self.spec.output_limit,
                    false,
                );
            }
            end @ (End::DriverGone | End::DriverBroke(_)) => {
                let exit = match (&end, run.driver_exit, driver_id) {
                    (End::DriverGone, None, Some(id)) => self.driver_exit_status(id),
                    (_, exit, _) => exit,
                };
                let why = match (end, exit) {
                    (End::DriverBroke(e), _) => e,
                    (_, Some((_, Some(signal)))) => {
                        format!("the interpreter was killed by signal {signal}")
                    }
                    (_, Some((Some(code), _))) => {
                        format!("the interpreter exited with status {code}")
                    }
                    _ => "the interpreter exited".to_string(),
                };
                if let (Some((code, signal)), Some(id)) = (exit, driver_id) {
                    // Known: the context's end does not wait for it again.
                    note_exit(&mut self.exits, id, code, signal);
                }
                let killed_by_oom = oom_kills > 0;
                self.restart_after(kind, result, &why);
                let outcome = &mut result.outcome;
                if let (false, None, Some((Some(code), None))) =
                    (killed_by_oom, run.stop_reason, exit)
                {
                    // The cell ended the interpreter itself (`exit 3`, `process.exit(3)`,
                    // a failing command under `set -e`): its status is the call's.
                    outcome.exit_code = Some(code);
                    outcome.message = Some(format!(
                        "the code ended the {} interpreter (exit status {code}); a new one was started: \
                         its variables are gone, /work is kept",
                        kind.name()
                    ));
                } else if killed_by_oom {
                    outcome.error = Some(ErrorKind::Oom);
                    outcome.message = Some(format!(
                        "the code reached the memory limit of {memory} and the kernel's OOM killer killed the \
                         interpreter; the output up to then is kept, and the interpreter was started again (its \
                         variables are gone, /work is kept). Use less memory, or allow more memory."
                    ));
                } else if let Some(reason) = run.stop_reason {
                    stopped(outcome, reason, timeout, self.spec.output_limit, false);
                } else {
                    outcome.error = Some(ErrorKind::SessionLost);
                    outcome.message = Some(format!(
                        "the interpreter ended during the call ({why}); it was started again: its variables \
                         are gone, /work is kept"
                    ));
                }
            }
            End::SandboxGone(why) => {
                self.drivers.clear();
                self.lost = Some(why.clone());
                result.outcome.error = Some(if oom_kills > 0 {
                    ErrorKind::Oom
                } else {
                    ErrorKind::SessionLost
                });
                result.outcome.message =
                    Some(format!("{why}; the session is over: create a new one"));
            }
        }
    }

    /// The processes a stopped call started in the driver's process group: given until
    /// `until` to end after the interrupt, then killed. Those the cell put in the
    /// background on purpose (their own session or group, or ignoring SIGHUP) are left.
    fn stop_call_processes(
        &mut self,
        driver: u64,
        since_ns: u64,
        until: Instant,
    ) -> Vec<KilledProcess> {
        loop {
            let left: Vec<CallProcess> = match self.sandbox.call_processes(driver, since_ns) {
                Some(processes) => processes
                    .into_iter()
                    .filter(|p| !p.ignores_hangup)
                    .collect(),
                None => return Vec::new(),
            };
            if left.is_empty() {
                return Vec::new();
            }
            let now = Instant::now();
            if now >= until {
                let _ = self.sandbox.kill_processes(&left);
                // The call is over once they are: SIGKILL is delivered on the way out of
                // the kernel, not by kill(2) itself.
                let gone_by = Instant::now() + GRACE;
                while Instant::now() < gone_by {
                    let still = match self.sandbox.call_processes(driver, since_ns) {
                        Some(processes) => processes
                            .iter()
                            .any(|p| left.iter().any(|k| (k.pid, k.start) == (p.pid, p.start))),
                        None => false,
                    };
                    if !still {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                return left
                    .into_iter()
                    .map(|p| KilledProcess {
                        pid: p.pid,
                        command: p.command,
                    })
                    .collect();
            }
            std::thread::sleep((until - now).min(Duration::from_millis(20)));
        }
    }

    /// How driver `id` ended, once the init reports it (its channel closes a moment
    /// before the init reaps it).
    fn driver_exit_status(&mut self, id: u64) -> Option<(Option<i32>, Option<i32>)> {
        let end = Instant::now() + Duration::from_secs(1);
        loop {
            if let Some(exit) = self.take_exit(id) {
                return Some(exit);
            }
            if Instant::now() >= end || self.wait_channel(end).is_err() {
                return None;
            }
        }
    }

    /// How driver `id` ended, if the init has said so (the reports read so far).
    fn take_exit(&mut self, id: u64) -> Option<(Option<i32>, Option<i32>)> {
        self.gather_exits();
        let at = self.exits.iter().position(|e| e.0 == id)?;
        let (_, code, signal) = self.exits.remove(at);
        Some((code, signal))
    }

    /// Keeps the drivers' exits among the reports read so far (the rest are dropped).
    fn gather_exits(&mut self) {
        while let Some(report) = self.sandbox.next_report() {
            if let Report::Exited {
                id: done,
                code,
                signal,
            } = report
            {
                note_exit(&mut self.exits, done, code, signal);
            }
        }
    }

    /// Kills what is left of context `kind` and starts it again; the result says so.
    fn restart_after(&mut self, kind: Lang, result: &mut CallOutcome, why: &str) {
        result.state.preserved = false;
        match self
            .kill_context(kind)
            .and_then(|()| self.start_driver(kind).map_err(|(_, message)| message))
        {
            Ok(()) => result.state.restarted = true,
            Err(e) => {
                self.drivers.retain(|d| d.lang != kind);
                let note = format!("the interpreter ({why}) could not be started again: {e}");
                result.outcome.message = Some(note);
            }
        }
    }

    /// Ends context `kind`: SIGKILL to its driver's process group (what its calls started
    /// there goes with it), waits for the driver's end, then kills what the group still
    /// holds (a driver that died on its own leaves its children). The other contexts and
    /// the background processes are left, and so is what a call put in a session or group
    /// of its own. Should the driver not end within 5 s, every process is killed.
    fn kill_context(&mut self, kind: Lang) -> Result<(), String> {
        let Some(at) = self.drivers.iter().position(|d| d.lang == kind) else {
            return Ok(());
        };
        let id = self.drivers.remove(at).id;
        if self.take_exit(id).is_none() {
            let _ = self.sandbox.signal(id, libc::SIGKILL);
            let end = Instant::now() + Duration::from_secs(5);
            while self.take_exit(id).is_none() {
                if Instant::now() >= end {
                    return self.kill_processes();
                }
                self.wait_channel(end)?;
            }
        }
        if let Some(left) = self.sandbox.call_processes(id, 0) {
            if !left.is_empty() {
                self.sandbox.kill_processes(&left)?;
            }
        }
        Ok(())
    }

    /// Kills every process of the sandbox but its init and waits until they are gone:
    /// every context ends.
    fn kill_processes(&mut self) -> Result<(), String> {
        self.drivers.clear();
        self.exits.clear();
        self.sandbox
            .kill_all()
            .map_err(|e| format!("cannot reach the sandbox's init: {e}"))?;
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            while let Some(report) = self.sandbox.next_report() {
                if report == Report::AllKilled {
                    return Ok(());
                }
            }
            if Instant::now() >= end {
                return Err("the sandbox's init did not answer a kill".into());
            }
            self.wait_channel(end)?;
        }
    }

    /// Waits for the sandbox's channel (or the init's end) until `end`; an error ends the
    /// session.
    fn wait_channel(&mut self, end: Instant) -> Result<(), String> {
        self.sandbox.wait_channel(end).inspect_err(|why| {
            self.lost = Some(why.clone());
        })
    }

    /// Spawns context `kind`'s driver with fresh pipes and a fresh channel, and waits for
    /// its "ready". Every context gets the same environment (the session's), the same
    /// last mile (uid, landlock, seccomp, rlimits: the init's for every payload).
    fn start_driver(&mut self, kind: Lang) -> Result<(), (ErrorKind, String)> {
        let setup = |m: String| (ErrorKind::Setup, m);
        let kind = context_of(kind);
        let mut exec = Exec::new(crate::drivers::argv(kind));
        for (key, value) in &self.spec.env {
            exec.set_env(key, value);
        }
        exec.exec_extra = (self.spec.context_exec.iter())
            .find(|(context, _)| *context == kind)
            .map(|(_, extra)| extra.clone());
        let streams = ExecStreams::open(&exec).map_err(setup)?;
        streams
            .give_to(self.sandbox.user_host_uid())
            .map_err(setup)?;
        let (channel, driver_end) = UnixStream::pair()
            .map_err(|e| setup(format!("cannot create the driver's channel: {e}")))?;
        let id = self
            .sandbox
            .spawn(&exec, &streams.child_fds(), Some(driver_end.as_fd()), false)
            .map_err(|e| setup(e.describe("cannot start the interpreter")))?;
        drop(driver_end);
        let pipes = streams.into_parent();
        for fd in [pipes.stdout.as_fd(), pipes.stderr.as_fd()] {
            let _ = super::set_nonblocking(fd);
        }
        let _ = channel.set_nonblocking(true);
        let mut driver = Driver {
            lang: kind,
            id,
            channel,
            pipes,
            lines: LineReader::default(),
        };
        // Until "ready": what the interpreter prints on start is not any call's output.
        let end = Instant::now() + START_TIMEOUT;
        let mut early = Vec::new();
        loop {
            let timeout = end.saturating_duration_since(Instant::now());
            if timeout.is_zero() {
                return Err(setup(format!(
                    "the {} interpreter did not start within {}",
                    kind.name(),
                    format_duration(START_TIMEOUT)
                )));
            }
            let timeout =
                PollTimeout::try_from(timeout.as_millis() as i32 + 1).unwrap_or(PollTimeout::MAX);
            let mut fds = [
                PollFd::new(driver.channel.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.sandbox.channel_fd(), PollFlags::POLLIN),
                PollFd::new(self.sandbox.pidfd(), PollFlags::POLLIN),
                PollFd::new(driver.pipes.stderr.as_fd(), PollFlags::POLLIN),
            ];
            let _ = poll(&mut fds, timeout);
            let ready = |i: usize| fds[i].revents().is_some_and(|r| !r.is_empty());
            let (driver_ready, sandbox_ready, init_gone, stderr_ready) =
                (ready(0), ready(1), ready(2), ready(3));
            if stderr_ready {
                let mut buf = [0u8; 4096];
                if let Ok(n) = driver.pipes.stderr.read(&mut buf) {
                    if early.len() < 4096 {
                        early.extend_from_slice(&buf[..n]);
                    }
                }
            }
            if driver_ready {
                let open = with_read_buf(|buf| driver.lines.fill(&mut driver.channel, buf))
                    .unwrap_or(false);
                while let Some(line) = driver.lines.next_line() {
                    if matches!(serde_json::from_slice(&line), Ok(DriverEvent::Ready)) {
                        self.drivers.retain(|d| d.lang != kind);
                        self.drivers.push(driver);
                        if !self.started.contains(&kind) {
                            self.started.push(kind);
                        }
                        return Ok(());
                    }
                }
                if !open {
                    return Err(setup(format!(
                        "the {} interpreter ended before it was ready: {}",
                        kind.name(),
                        String::from_utf8_lossy(&early).trim()
                    )));
                }
            }
            if sandbox_ready {
                self.sandbox.read_channel();
                while let Some(report) = self.sandbox.next_report() {
                    match report {
                        Report::SetupFailed { id: failed, error }
                            if failed.is_none_or(|f| f == id) =>
                        {
                            return Err(setup(format!(
                                "{error}; the {} interpreter did not start",
                                kind.name()
                            )));
                        }
                        Report::Exited {
                            id: done,
                            code,
                            signal,
                        } => note_exit(&mut self.exits, done, code, signal),
                        _ => {}
                    }
                }
            }
            if init_gone {
                let why = match self.sandbox.protocol_error() {
                    Some(e) => format!("the session's sandbox ended while starting: {e}"),
                    None => "the session's sandbox ended while starting".to_string(),
                };
                self.lost = Some(why.clone());
                return Err((ErrorKind::Setup, why));
            }
        }
    }
}

/// How a call ended.
enum End {
    Done(Done),
    /// Interrupted, and no answer within the grace period.
    Unresponsive,
    /// The driver exited (or closed its channel).
    DriverGone,
    /// The driver sent what the protocol does not allow, or could not start.
    DriverBroke(String),
    /// The sandbox's init is gone.
    SandboxGone(String),
}

struct Done {
    execution_count: Option<u64>,
    result: Option<MimeBundle>,
    exception: Option<Exception>,
    status: Option<i32>,
    cwd: Option<String>,
    restart: bool,
}

/// One call in progress: its output, displays and how it is ending.
struct CallRun<'a> {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    output_limit: u64,
    output_capped: bool,
    displays: Vec<MimeBundle>,
    display_bytes: usize,
    notes: Vec<String>,
    deadline: Instant,
    stop_reason: Option<ErrorKind>,
    /// When the launcher interrupted the call (its timeout, an interrupt, the output cap).
    interrupted_at: Option<Instant>,
    end: Option<End>,
    /// The request for the driver, and how much of it the channel has taken.
    request: Vec<u8>,
    sent: usize,
    /// When the call began, on the clock /proc counts start times in.
    since_ns: u64,
    /// How the driver process ended, if the init said so during the call.
    driver_exit: Option<(Option<i32>, Option<i32>)>,
    events: &'a mut dyn FnMut(Event),
}

impl<'a> CallRun<'a> {
    fn new(output_limit: u64, deadline: Instant, events: &'a mut dyn FnMut(Event)) -> Self {
        CallRun {
            stdout: Vec::new(),
            stderr: Vec::new(),
            output_limit,
            output_capped: false,
            displays: Vec::new(),
            display_bytes: 0,
            notes: Vec::new(),
            deadline,
            stop_reason: None,
            interrupted_at: None,
            end: None,
            request: Vec::new(),
            sent: 0,
            since_ns: 0,
            driver_exit: None,
            events,
        }
    }

    /// Writes as much of the request as the channel takes now (it is non-blocking: the
    /// driver reads a large cell as it comes). An error means the driver is gone.
    fn write_request(&mut self, channel: &mut UnixStream) -> std::io::Result<()> {
        while self.sent < self.request.len() {
            match std::io::Write::write(channel, &self.request[self.sent..]) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        // The whole request is in: its memory is not needed any more.
        self.request = Vec::new();
        self.sent = 0;
        Ok(())
    }

    fn drain(&mut self, pipe: &mut File, stream: Stream, buf: &mut [u8]) {
        loop {
            match pipe.read(buf) {
                Ok(0) => return,
                Ok(n) => {
                    let used = (self.stdout.len() + self.stderr.len()) as u64;
                    let room = self.output_limit.saturating_sub(used) as usize;
                    let kept = &buf[..n.min(room)];
                    match stream {
                        Stream::Stdout => self.stdout.extend_from_slice(kept),
                        Stream::Stderr => self.stderr.extend_from_slice(kept),
                    }
                    if !kept.is_empty() {
                        (self.events)(Event::Output(stream, kept));
                    }
                    if n > room {
                        self.output_capped = true;
                        self.stop_reason.get_or_insert(ErrorKind::OutputLimit);
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        }
    }

    /// One line from the driver: validated, and kept if it belongs to this call.
    fn event(&mut self, call_id: u64, line: &[u8]) {
        let event: DriverEvent = match serde_json::from_slice(line) {
            Ok(event) => event,
            Err(_) => {
                return self.note("the interpreter sent a line that is not an event; ignored")
            }
        };
        match event {
            DriverEvent::Ready => {}
            DriverEvent::Display { id, data } => {
                if id != Some(call_id) || self.end.is_some() {
                    return;
                }
                match checked_bundle(data) {
                    Ok(bundle) => {
                        let size: usize = bundle.values().map(String::len).sum();
                        if self.displays.len() >= MAX_DISPLAYS
                            || self.display_bytes + size > MAX_DISPLAY_BYTES
                        {
                            return self.note(&format!(
                                "displays past {MAX_DISPLAYS} or {} in one call were dropped",
                                format_size(MAX_DISPLAY_BYTES as u64)
                            ));
                        }
                        self.display_bytes += size;
                        (self.events)(Event::Display(&bundle));
                        self.displays.push(bundle);
                    }
                    Err(e) => self.note(&format!("a display was dropped: {e}")),
                }
            }
            DriverEvent::Done {
                id,
                execution_count,
                result,
                exception,
                status,
                cwd,
                restart,
            } => {
                if id != Some(call_id) {
                    return;
                }
                let result = match result.map(checked_bundle).transpose() {
                    Ok(result) => result,
                    Err(e) => {
                        self.note(&format!("the result was dropped: {e}"));
                        None
                    }
                };
                self.end = Some(End::Done(Done {
                    execution_count,
                    result,
                    exception: exception.map(checked_exception),
                    status,
                    cwd: cwd.map(|c| clip(&c, 4096)),
                    restart: restart == Some(true),
                }));
            }
        }
    }

    fn note(&mut self, note: &str) {
        if !self.notes.iter().any(|n| n == note) {
            self.notes.push(note.to_string());
        }
    }
}

/// Keeps a driver's exit for whoever waits for it (the last 64).
fn note_exit(
    exits: &mut Vec<(u64, Option<i32>, Option<i32>)>,
    id: u64,
    code: Option<i32>,
    signal: Option<i32>,
) {
    if exits.len() >= 64 {
        exits.remove(0);
    }
    exits.push((id, code, signal));
}

/// The program a context's driver runs on.
fn program_of(kind: Lang) -> &'static str {
    match kind {
        Lang::Python => "python3",
        Lang::Node | Lang::Typescript => "node",
        Lang::Bash => "bash",
    }
}

/// Adds a sentence to the outcome's message.
fn add_note(outcome: &mut Outcome, note: &str) {
    outcome.message = Some(match outcome.message.take() {
        Some(m) => format!("{m}; {note}"),
        None => note.to_string(),
    });
}

/// A call the launcher stopped: the verdict, and whether the session kept its state.
fn stopped(outcome: &mut Outcome, reason: ErrorKind, timeout: Duration, limit: u64, kept: bool) {
    let state = if kept {
        "the interpreter stopped the call and kept its state"
    } else {
        "the interpreter did not stop, so every process was killed and it was started again: its \
         variables are gone, /work is kept"
    };
    outcome.error = Some(reason);
    outcome.message = Some(match reason {
        ErrorKind::OutputLimit => format!(
            "the call wrote more than the output limit of {} and was stopped; the output is cut at the \
             limit and {state}",
            format_size(limit)
        ),
        ErrorKind::Interrupted => format!("the call was interrupted; {state}"),
        _ => format!(
            "the call ran longer than its time limit of {} and was interrupted; the output up to then is \
             kept and {state}",
            format_duration(timeout)
        ),
    });
}

/// A MIME bundle as the launcher accepts it: sane type names, texts and images within
/// their caps, images valid base64.
fn checked_bundle(data: BTreeMap<String, String>) -> Result<MimeBundle, String> {
    use base64::Engine as _;
    let mut bundle = MimeBundle::new();
    for (mime, content) in data {
        // type/subtype: one slash, each part starting with a letter or digit.
        let part = |p: &str| {
            p.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        };
        let sane = mime.len() <= MAX_MIME_NAME
            && mime
                .split_once('/')
                .is_some_and(|(t, s)| part(t) && part(s));
        if !sane {
            return Err(format!("{:?} is not a MIME type", clip(&mime, 40)));
        }
        let binary = mime.starts_with("image/") && mime != "image/svg+xml";
        if binary {
            if content.len() > MAX_IMAGE * 4 / 3 + 4 {
                return Err(format!(
                    "an {mime} image is over {}",
                    format_size(MAX_IMAGE as u64)
                ));
            }
            base64::engine::general_purpose::STANDARD
                .decode(&content)
                .map_err(|_| format!("the {mime} image is not base64"))?;
            bundle.insert(mime, content);
        } else {
            bundle.insert(mime, clip(&content, MAX_TEXT));
        }
    }
    Ok(bundle)
}

fn checked_exception(e: Exception) -> Exception {
    Exception {
        name: clip(&e.name, 200),
        value: clip(&e.value, MAX_TEXT),
        traceback: e
            .traceback
            .iter()
            .take(500)
            .map(|l| clip(l, 4096))
            .collect(),
    }
}

fn clip(text: &str, max: usize) -> String {
    match crate::units::head(text, max) {
        whole if whole.len() == text.len() => text.to_string(),
        head => format!("{head}... ({} more bytes)", text.len() - head.len()),
    }
}

/// Lines from a driver, each at most [`MAX_LINE`] bytes.
#[derive(Default)]
struct LineReader {
    buf: Vec<u8>,
}

impl LineReader {
    /// Reads what the socket holds, through `chunk`. Ok(false) at EOF; an error for a line
    /// over the cap.
    fn fill(&mut self, socket: &mut UnixStream, chunk: &mut [u8]) -> Result<bool, String> {
        loop {
            match socket.read(chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if self.buf.len() > MAX_LINE && !self.buf[..MAX_LINE].contains(&b'\n') {
                        return Err(format!(
                            "the interpreter sent a line over {}",
                            format_size(MAX_LINE as u64)
                        ));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return Ok(false),
            }
        }
    }

    fn next_line(&mut self) -> Option<Vec<u8>> {
        let end = self.buf.iter().position(|&b| b == b'\n')?;
        let line = self.buf[..end].to_vec();
        self.buf.drain(..=end);
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_keep_sane_types_and_refuse_the_rest() {
        let mut data = BTreeMap::new();
        data.insert("text/plain".to_string(), "x".repeat(MAX_TEXT + 10));
        data.insert("image/png".to_string(), "aGVsbG8=".to_string());
        let bundle = checked_bundle(data).unwrap();
        assert!(bundle["text/plain"].len() < MAX_TEXT + 100);
        let mut bad = BTreeMap::new();
        bad.insert("../../etc".to_string(), String::new());
        assert!(checked_bundle(bad).is_err());
        let mut bad = BTreeMap::new();
        bad.insert("image/png".to_string(), "not base64!".to_string());
        assert!(checked_bundle(bad).is_err());
    }

    #[test]
    fn events_of_another_call_are_dropped() {
        let mut sink = |_: Event| {};
        let mut run = CallRun::new(1 << 20, Instant::now(), &mut sink);
        run.event(7, br#"{"ev":"done","id":6,"execution_count":1}"#);
        assert!(run.end.is_none());
        run.event(7, br#"{"ev":"display","id":7,"data":{"text/plain":"hi"}}"#);
        run.event(7, b"garbage");
        run.event(7, br#"{"ev":"done","id":7,"execution_count":2}"#);
        assert!(matches!(
            run.end,
            Some(End::Done(Done {
                execution_count: Some(2),
                ..
            }))
        ));
        assert_eq!(run.displays.len(), 1);
        assert_eq!(run.notes.len(), 1);
    }

    #[test]
    fn a_line_over_the_cap_is_an_error_not_a_buffer() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let mut lines = LineReader::default();
        let writer = std::thread::spawn(move || {
            let chunk = vec![b'x'; 1 << 20];
            for _ in 0..(MAX_LINE >> 20) + 2 {
                if std::io::Write::write_all(&mut a, &chunk).is_err() {
                    break;
                }
            }
        });
        let mut result = Ok(true);
        for _ in 0..10_000 {
            result = with_read_buf(|buf| lines.fill(&mut b, buf));
            if result.is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(result.is_err());
        drop(b);
        let _ = writer.join();
    }
}
