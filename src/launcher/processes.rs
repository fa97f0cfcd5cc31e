//! A session's background processes: commands started beside its interpreter, in the
//! same sandbox (the same /work, network and limits), each a payload of the init as the
//! driver is (its own session and process group, every layer: landlock, seccomp, no
//! capabilities, uid 1000).
//!
//! Output is never lost to a slow or absent client: a thread per process reads its two
//! pipes from start to end, into a bounded buffer per stream. Past the buffer the oldest
//! bytes go; offsets stay absolute (byte N of stdout is byte N however much was dropped),
//! so a client that polls from a cursor resumes with no gap and no repeat, and learns how
//! many bytes it missed.
//!
//! How a process ended comes from the init's `Exited` report, on the sandbox's channel.
//! Whoever reads that channel (a call's supervision, a request, a poll) hands the reports
//! of background processes to the table here ([`super::Sandbox::set_background_sink`]), so
//! none is dropped by a reader that waits for something else. The table is shared
//! ([`Processes`]): a poll, stdin and a signal reach it without the session, even while a
//! call runs; a signal is queued and the session's owner sends it (a call's supervision
//! wakes for it).

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::unistd::pipe2;

use super::Report;

/// How much of each stream a process keeps, unless asked otherwise.
pub const DEFAULT_BUFFER: usize = 1 << 20;
/// How many processes (running or ended) a session remembers; the oldest ended ones are
/// forgotten past it. Running ones are bounded by the sandbox's pids limit.
pub const MAX_REMEMBERED: usize = 256;
/// After its exit, how long a process's output pipes may stay open (a child it left
/// holding them) before its result is given without waiting for their end.
pub const AFTER_EXIT: Duration = Duration::from_millis(200);
/// The error of a process that died with its session's sandbox.
pub const SANDBOX_GONE: &str = "the session's sandbox ended";
/// How many events (starts and exits) a session's log keeps; past it the oldest go, and a
/// reader that asks from before them learns how many it missed.
pub const MAX_EVENTS: usize = 1024;

/// A process to start.
#[derive(Debug, Clone)]
pub struct Start {
    /// The program and its arguments (a command is `["bash", "-c", COMMAND]`).
    pub argv: Vec<String>,
    /// What the client gave: the command line, or the argv joined (for listings).
    pub command: String,
    /// Where it starts, relative to /work or absolute (default /work).
    pub cwd: Option<String>,
    /// Variables added to the session's environment.
    pub env: Vec<(String, String)>,
    /// Keep its stdin open for [`Processes::write_stdin`] (else it reads /dev/null).
    pub stdin: bool,
    /// Killed (SIGKILL to its process group) when this runs out.
    pub timeout: Duration,
    /// The bytes kept per stream.
    pub buffer: usize,
    /// Run it on a terminal of this size (its stdin, stdout and stderr, one stream: stdout).
    pub pty: Option<TermSize>,
    /// What it may execute beyond the sandbox's exec allowlist (an approved command).
    pub exec_extra: Option<crate::exec_policy::ExecAllowlist>,
}

/// A terminal's size, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TermSize {
    pub cols: u16,
    pub rows: u16,
}

impl TermSize {
    /// What a terminal gets unless asked otherwise.
    pub const DEFAULT: TermSize = TermSize { cols: 80, rows: 24 };
    /// The widest a terminal may be: the screen lives in the launcher's memory (two grids
    /// of cells, the normal and the alternate screen), and a sandbox may hold 32.
    pub const MAX_COLS: u16 = 500;
    /// The tallest.
    pub const MAX_ROWS: u16 = 200;

    /// The size checked: at least 1, at most [`TermSize::MAX_COLS`] x
    /// [`TermSize::MAX_ROWS`].
    pub fn check(self) -> Result<TermSize, String> {
        if !(1..=Self::MAX_COLS).contains(&self.cols) || !(1..=Self::MAX_ROWS).contains(&self.rows)
        {
            return Err(format!(
                "a terminal of {} columns and {} rows: each must be at least 1, columns at most {} \
                 and rows at most {}",
                self.cols,
                self.rows,
                Self::MAX_COLS,
                Self::MAX_ROWS
            ));
        }
        Ok(self)
    }
}

/// A terminal as a person would see it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Screen {
    /// Each row's text, trailing blanks cut.
    pub lines: Vec<String>,
    /// The cursor's row and column, from 0.
    pub cursor: (u16, u16),
    pub cursor_visible: bool,
    pub size: TermSize,
    /// The window title the program set (OSC 0 or 2), if any.
    pub title: Option<String>,
    /// The program switched to the alternate screen (a full-screen program: an editor, a
    /// pager).
    pub alternate_screen: bool,
    /// Modes the program set that change what keys send.
    pub modes: TermModes,
}

/// What a terminal's program asked of the keys it gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TermModes {
    /// Cursor keys in application mode (DECCKM: ESC O A rather than ESC [ A).
    pub application_cursor: bool,
    /// Pasted text wrapped in ESC [200~ ... ESC [201~.
    pub bracketed_paste: bool,
}

/// Whether a process still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Status {
    Running,
    Exited,
}

/// A window of one stream: the bytes from `from` to `cursor` (absolute offsets).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Window {
    pub bytes: Vec<u8>,
    /// The offset of the first byte given.
    pub from: u64,
    /// The offset to ask from next time (every byte written so far).
    pub cursor: u64,
    /// Bytes between the cursor asked from and `from` that the buffer no longer holds.
    pub dropped: u64,
}

/// A process as a poll sees it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub id: u64,
    pub command: String,
    pub status: Status,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Killed at its time limit.
    pub timed_out: bool,
    /// Why it never started (a cwd that does not exist, ...), or that its sandbox ended.
    pub error: Option<String>,
    pub started: SystemTime,
    /// From start to exit, or to now.
    pub duration: Duration,
    pub stdout: Window,
    pub stderr: Window,
    /// Its terminal's size, when it runs on one.
    pub pty: Option<TermSize>,
}

/// What happened to a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum EventKind {
    Started,
    /// It exited and its output is all in its buffers (as a poll's `exited`).
    Exited,
    /// Something its owner tells of the session that is not a process's start or exit
    /// (the server's exec approvals: a command approved, denied, still running): the
    /// event's `note` says what.
    Note,
}

/// One entry of a session's event log, numbered from 1 in the order they happened.
#[derive(Debug, Clone)]
pub struct Event {
    pub seq: u64,
    pub kind: EventKind,
    pub at: SystemTime,
    /// The process then, without output (its cursors say how much there was); none for a
    /// note.
    pub process: Option<Snapshot>,
    /// A note's fields (its `type` among them).
    pub note: Option<serde_json::Value>,
}

/// The table of a session's processes; cheap to clone, shared with the session's owner.
#[derive(Clone)]
pub struct Processes {
    table: Arc<Table>,
}

struct Table {
    inner: Mutex<Inner>,
    /// A byte here wakes the session's supervision: a signal is queued.
    wake_read: OwnedFd,
    wake_write: OwnedFd,
}

#[derive(Default)]
struct Inner {
    procs: BTreeMap<u64, Arc<Proc>>,
    next: u64,
    /// Signals for the session to send: (payload id, signal).
    signals: Vec<(u64, i32)>,
    /// The last [`MAX_EVENTS`] events.
    events: VecDeque<Event>,
    /// The number the next event gets.
    next_event: u64,
}

impl Inner {
    fn log(&mut self, kind: EventKind, process: Snapshot) {
        self.push(kind, Some(process), None);
    }

    fn push(
        &mut self,
        kind: EventKind,
        process: Option<Snapshot>,
        note: Option<serde_json::Value>,
    ) {
        let seq = self.next_event;
        self.next_event += 1;
        self.events.push_back(Event {
            seq,
            kind,
            at: SystemTime::now(),
            process,
            note,
        });
        while self.events.len() > MAX_EVENTS {
            self.events.pop_front();
        }
    }
}

struct Proc {
    id: u64,
    /// Its payload id in the sandbox.
    payload: u64,
    command: String,
    started: SystemTime,
    started_at: Instant,
    deadline: Instant,
    state: Mutex<State>,
    /// Its stdin pipe, or its terminal's master (written to, and sized).
    stdin: Mutex<Option<File>>,
    /// It runs on a terminal.
    terminal: bool,
}

struct State {
    out: [Ring; 2],
    exit: Option<(Option<i32>, Option<i32>)>,
    exited_at: Option<Instant>,
    error: Option<String>,
    /// Both pipes reached their end: every byte is in the buffers.
    drained: bool,
    timed_out: bool,
    /// A SIGKILL for its deadline is on its way.
    killing: bool,
    /// A terminal's screen, fed what the program writes to it.
    screen: Option<Box<vt100::Parser<Beside>>>,
    /// Its end is in the event log ([`Processes::take_ended`]).
    announced: bool,
}

/// What a terminal's program said beside its screen: the window title it set (OSC 0 or
/// 2, cut at [`MAX_TITLE`] bytes), and the answers owed to its queries of the terminal.
#[derive(Default)]
struct Beside {
    title: Option<String>,
    /// Answers to write back to the program, as a terminal would: a cursor position report
    /// (`ESC [ 6 n`, which line editors such as prompt_toolkit wait for) and the status
    /// report (`ESC [ 5 n`). Digits only: nothing the program writes is echoed back.
    replies: Vec<u8>,
}

/// The longest window title kept.
const MAX_TITLE: usize = 1024;
/// The most reply bytes owed at once (a program that floods queries gets no more).
const MAX_REPLIES: usize = 4096;

impl vt100::Callbacks for Beside {
    fn set_window_title(&mut self, _: &mut vt100::Screen, title: &[u8]) {
        let title = &title[..title.len().min(MAX_TITLE)];
        self.title = Some(String::from_utf8_lossy(title).into_owned());
    }

    fn unhandled_csi(
        &mut self,
        screen: &mut vt100::Screen,
        i1: Option<u8>,
        _: Option<u8>,
        params: &[&[u16]],
        c: char,
    ) {
        if c != 'n' || i1.is_some() || self.replies.len() >= MAX_REPLIES {
            return;
        }
        match params {
            [[6]] => {
                let (row, col) = screen.cursor_position();
                let report = format!("\x1b[{};{}R", u32::from(row) + 1, u32::from(col) + 1);
                self.replies.extend_from_slice(report.as_bytes());
            }
            [[5]] => self.replies.extend_from_slice(b"\x1b[0n"),
            _ => {}
        }
    }
}

/// The last `cap` bytes of a stream, and how many were written in all.
struct Ring {
    bytes: VecDeque<u8>,
    cap: usize,
    total: u64,
}

impl Ring {
    fn new(cap: usize) -> Ring {
        Ring {
            bytes: VecDeque::new(),
            cap,
            total: 0,
        }
    }

    fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        let data = &data[data.len().saturating_sub(self.cap)..];
        let over = (self.bytes.len() + data.len()).saturating_sub(self.cap);
        self.bytes.drain(..over);
        self.bytes.extend(data);
    }

    /// The bytes from `cursor` on (or from the oldest kept, saying how many are gone).
    fn window(&self, cursor: u64) -> Window {
        let start = self.total - self.bytes.len() as u64;
        let cursor = cursor.min(self.total);
        let from = cursor.max(start);
        let skip = (from - start) as usize;
        Window {
            bytes: self.bytes.range(skip..).copied().collect(),
            from,
            cursor: self.total,
            dropped: from - cursor,
        }
    }
}

impl State {
    /// It has exited and its output is all read (or its pipes stayed open [`AFTER_EXIT`]
    /// past its exit: a child it left holds them).
    fn ended(&self) -> bool {
        match self.exited_at {
            Some(at) => self.drained || at.elapsed() >= AFTER_EXIT,
            None => false,
        }
    }
}

impl Proc {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn snapshot(&self, stdout_from: Option<u64>, stderr_from: Option<u64>) -> Snapshot {
        let state = self.state();
        let window = |i: usize, from: Option<u64>| match from {
            Some(from) => state.out[i].window(from),
            None => Window {
                cursor: state.out[i].total,
                from: state.out[i].total,
                ..Window::default()
            },
        };
        let end = state.exited_at.unwrap_or_else(Instant::now);
        // Exited once its output is all read too: a client that polls until then has
        // every byte, whichever thread ran first.
        let ended = state.ended();
        let exit = state.exit.filter(|_| ended);
        Snapshot {
            id: self.id,
            command: self.command.clone(),
            status: match ended {
                true => Status::Exited,
                false => Status::Running,
            },
            exit_code: exit.and_then(|e| e.0),
            signal: exit.and_then(|e| e.1),
            timed_out: state.timed_out,
            error: state.error.clone(),
            started: self.started,
            duration: end.saturating_duration_since(self.started_at),
            stdout: window(0, stdout_from),
            stderr: window(1, stderr_from),
            pty: state.screen.as_ref().map(|parser| {
                let (rows, cols) = parser.screen().size();
                TermSize {
                    cols: cols.get(),
                    rows: rows.get(),
                }
            }),
        }
    }
}

impl Processes {
    pub(crate) fn new() -> Result<Processes, String> {
        let (wake_read, wake_write) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .map_err(|e| format!("cannot create the processes' wake pipe: {e}"))?;
        Ok(Processes {
            table: Arc::new(Table {
                inner: Mutex::new(Inner {
                    next: 1,
                    next_event: 1,
                    ..Inner::default()
                }),
                wake_read,
                wake_write,
            }),
        })
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.table.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, id: u64) -> Option<Arc<Proc>> {
        self.inner().procs.get(&id).cloned()
    }

    /// Every process, oldest first, without output (the cursors say how much there is).
    pub fn list(&self) -> Vec<Snapshot> {
        let procs: Vec<Arc<Proc>> = self.inner().procs.values().cloned().collect();
        procs.iter().map(|p| p.snapshot(None, None)).collect()
    }

    /// Process `id` with its output from the cursors given; None if there is no such one.
    pub fn poll(&self, id: u64, stdout_from: u64, stderr_from: u64) -> Option<Snapshot> {
        self.get(id)
            .map(|p| p.snapshot(Some(stdout_from), Some(stderr_from)))
    }

    /// The processes that ended (as a poll's `exited`: their output all read) since the
    /// last call, each once, oldest first, without output; their exits go to the event
    /// log. Called by whoever tends the session (a poll, the server's reaper every second).
    pub fn take_ended(&self) -> Vec<Snapshot> {
        let mut inner = self.inner();
        let mut ended = Vec::new();
        for proc in inner.procs.values() {
            let newly = {
                let mut state = proc.state();
                let newly = state.ended() && !state.announced;
                state.announced |= newly;
                newly
            };
            if newly {
                ended.push(proc.snapshot(None, None));
            }
        }
        for snapshot in &ended {
            inner.log(EventKind::Exited, snapshot.clone());
        }
        ended
    }

    /// The events after number `after` (0: from the first), and how many of those the log
    /// no longer holds. The number the next event will get.
    pub fn events(&self, after: u64) -> (Vec<Event>, u64, u64) {
        let inner = self.inner();
        let first = inner.events.front().map_or(inner.next_event, |e| e.seq);
        let missed = first.saturating_sub(after + 1);
        let events = inner
            .events
            .iter()
            .filter(|e| e.seq > after)
            .cloned()
            .collect();
        (events, missed, inner.next_event)
    }

    /// Logs a note (`fields`, with its `type`) in the session's event log, numbered with
    /// the processes' starts and exits.
    pub fn note(&self, fields: serde_json::Value) {
        self.inner().push(EventKind::Note, None, Some(fields));
    }

    /// How many still run.
    pub fn running(&self) -> usize {
        let procs: Vec<Arc<Proc>> = self.inner().procs.values().cloned().collect();
        procs.iter().filter(|p| p.state().exit.is_none()).count()
    }

    /// Process `id`'s terminal as a person would see it now. Err: no such process, or it
    /// does not run on a terminal.
    pub fn screen(&self, id: u64) -> Result<Screen, String> {
        let proc = self.proc(id)?;
        let state = proc.state();
        let parser = state.screen.as_ref().ok_or_else(|| no_terminal(id))?;
        let screen = parser.screen();
        let (rows, cols) = screen.size();
        let lines = screen
            .rows(0, cols.get())
            .map(|row| row.trim_end().to_string())
            .collect();
        Ok(Screen {
            lines,
            cursor: screen.cursor_position(),
            cursor_visible: !screen.hide_cursor(),
            size: TermSize {
                cols: cols.get(),
                rows: rows.get(),
            },
            title: parser.callbacks().title.clone(),
            alternate_screen: screen.alternate_screen(),
            modes: modes_of(screen),
        })
    }

    /// Whether process `id` runs on a terminal, and then the modes its program set. Err:
    /// no such process.
    pub fn terminal_modes(&self, id: u64) -> Result<Option<TermModes>, String> {
        let proc = self.proc(id)?;
        let state = proc.state();
        Ok(state.screen.as_ref().map(|p| modes_of(p.screen())))
    }

    /// Resizes process `id`'s terminal (the kernel sends SIGWINCH to its foreground
    /// process group) and its screen.
    pub fn resize(&self, id: u64, size: TermSize) -> Result<(), String> {
        let size = size.check()?;
        let proc = self.proc(id)?;
        if !proc.terminal {
            return Err(no_terminal(id));
        }
        let stdin = proc.stdin.lock().unwrap_or_else(|e| e.into_inner());
        let master = stdin
            .as_ref()
            .ok_or_else(|| format!("process {id} has exited: its terminal is closed"))?;
        crate::sys::set_window_size(master.as_fd(), size.rows, size.cols)
            .map_err(|e| format!("cannot resize process {id}'s terminal: {e}"))?;
        let mut state = proc.state();
        if let (Some(parser), Some(rows), Some(cols)) = (
            state.screen.as_mut(),
            std::num::NonZeroU16::new(size.rows),
            std::num::NonZeroU16::new(size.cols),
        ) {
            parser.set_size(rows, cols);
        }
        Ok(())
    }

    fn proc(&self, id: u64) -> Result<Arc<Proc>, String> {
        self.get(id)
            .ok_or_else(|| format!("there is no process {id} in this session"))
    }

    /// Writes `data` to process `id`'s stdin, or its terminal (waiting up to 5 s for it to
    /// take it all), then closes stdin if `close` (a terminal cannot be: its program reads
    /// an end of file from C-d). Returns the bytes written.
    pub fn write_stdin(&self, id: u64, data: &[u8], close: bool) -> Result<usize, String> {
        let proc = self.proc(id)?;
        if close && proc.terminal {
            return Err(format!(
                "process {id} runs on a terminal, whose input cannot be closed: send the key `C-d` \
                 (an end of file at the start of a line)"
            ));
        }
        let mut stdin = proc.stdin.lock().unwrap_or_else(|e| e.into_inner());
        let Some(pipe) = stdin.as_mut() else {
            return Err(match proc.terminal {
                true => format!("process {id} has exited: its terminal is closed"),
                false => format!(
                    "process {id}'s stdin is closed (or was never open: start it with `stdin: true`)"
                ),
            });
        };
        let end = Instant::now() + Duration::from_secs(5);
        let mut written = 0;
        while written < data.len() {
            match pipe.write(&data[written..]) {
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let left = end.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(format!(
                            "process {id} did not read its stdin: {written} of {} bytes were written \
                             in 5 s",
                            data.len()
                        ));
                    }
                    let mut fds = [PollFd::new(pipe.as_fd(), PollFlags::POLLOUT)];
                    let wait = PollTimeout::try_from(left.as_millis().min(100) as i32)
                        .unwrap_or(PollTimeout::ZERO);
                    let _ = poll(&mut fds, wait);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e)
                    if e.kind() == std::io::ErrorKind::BrokenPipe
                        || e.raw_os_error() == Some(libc::EIO) =>
                {
                    // EIO: a terminal whose every slave fd is closed.
                    *stdin = None;
                    return Err(format!(
                        "process {id} closed its stdin (or exited): {written} of {} bytes were written",
                        data.len()
                    ));
                }
                Err(e) => return Err(format!("cannot write to process {id}'s stdin: {e}")),
            }
        }
        if close {
            *stdin = None;
        }
        Ok(written)
    }

    /// Queues `signal` for process `id`'s process group; the session sends it (at once
    /// when idle, else as its call's supervision wakes).
    pub fn queue_signal(&self, id: u64, signal: i32) -> Result<(), String> {
        let mut inner = self.inner();
        let proc = inner
            .procs
            .get(&id)
            .cloned()
            .ok_or_else(|| format!("there is no process {id} in this session"))?;
        if proc.state().exit.is_some() {
            return Err(format!("process {id} has already exited"));
        }
        inner.signals.push((proc.payload, signal));
        drop(inner);
        let _ = nix::unistd::write(&self.table.wake_write, b"!");
        Ok(())
    }

    /// The fd that is readable when a signal is queued.
    pub(crate) fn wake_fd(&self) -> BorrowedFd<'_> {
        self.table.wake_read.as_fd()
    }

    /// The signals to send now: those queued, and SIGKILL for every process past its
    /// deadline. The soonest deadline of those still running, to wake for.
    pub(crate) fn due(&self) -> (Vec<(u64, i32)>, Option<Instant>) {
        let mut drained = [0u8; 64];
        while matches!(nix::unistd::read(&self.table.wake_read, &mut drained), Ok(n) if n > 0) {}
        let mut inner = self.inner();
        let mut due = std::mem::take(&mut inner.signals);
        let now = Instant::now();
        let mut next = None::<Instant>;
        for proc in inner.procs.values() {
            let mut state = proc.state();
            if state.exit.is_some() {
                continue;
            }
            if now >= proc.deadline && !state.killing {
                state.killing = true;
                state.timed_out = true;
                due.push((proc.payload, libc::SIGKILL));
            } else if !state.killing {
                next = Some(next.map_or(proc.deadline, |n| n.min(proc.deadline)));
            }
        }
        (due, next)
    }

    /// Takes a report of the init if it is about one of these processes.
    pub(crate) fn take_report(&self, report: &Report) -> bool {
        let (id, exit, error) = match report {
            Report::Exited { id, code, signal } => (*id, Some((*code, *signal)), None),
            Report::SetupFailed {
                id: Some(id),
                error,
            } => (*id, None, Some(error.clone())),
            _ => return false,
        };
        let Some(proc) = self
            .inner()
            .procs
            .values()
            .find(|p| p.payload == id)
            .cloned()
        else {
            return false;
        };
        let mut state = proc.state();
        if let Some(exit) = exit {
            state.exit.get_or_insert(exit);
            state.exited_at.get_or_insert_with(Instant::now);
        }
        if let Some(error) = error {
            state.error = Some(error);
        }
        true
    }

    /// The sandbox is gone, and every process with it (its pid namespace): those not yet
    /// reported are marked killed.
    pub fn sandbox_gone(&self) {
        let procs: Vec<Arc<Proc>> = self.inner().procs.values().cloned().collect();
        for proc in procs {
            let mut state = proc.state();
            if state.exit.is_none() {
                state.exit = Some((None, Some(libc::SIGKILL)));
                state.exited_at = Some(Instant::now());
                state.error.get_or_insert_with(|| SANDBOX_GONE.to_string());
            }
        }
    }

    /// Whether every process has ended (exited, its output read or [`AFTER_EXIT`] past).
    pub fn all_ended(&self) -> bool {
        self.inner().procs.values().all(|p| p.state().ended())
    }

    /// Whether process `id` has ended with all its output read (or its pipes stayed open
    /// [`AFTER_EXIT`] past its exit). None: no such process.
    pub(crate) fn finished(&self, id: u64) -> Option<bool> {
        let proc = self.get(id)?;
        let ended = proc.state().ended();
        Some(ended)
    }

    /// Registers a process that was just spawned as payload `payload`, and starts the
    /// thread that reads its output. Returns its id.
    pub(crate) fn add(
        &self,
        start: &Start,
        payload: u64,
        stdin: Option<File>,
        stdout: File,
        stderr: File,
    ) -> Result<u64, String> {
        self.insert(start, payload, stdin, Output::Pipes(stdout, stderr))
    }

    /// Registers a process that was just spawned on a terminal whose master the launcher
    /// holds (non-blocking), and starts the thread that reads it. Returns its id.
    pub(crate) fn add_on_terminal(
        &self,
        start: &Start,
        payload: u64,
        master: OwnedFd,
    ) -> Result<u64, String> {
        let writer = master
            .try_clone()
            .map_err(|e| format!("cannot duplicate the terminal's master: {e}"))?;
        self.insert(
            start,
            payload,
            Some(File::from(writer)),
            Output::Terminal(File::from(master)),
        )
    }

    fn insert(
        &self,
        start: &Start,
        payload: u64,
        stdin: Option<File>,
        output: Output,
    ) -> Result<u64, String> {
        let screen = match (&output, start.pty) {
            (Output::Terminal(_), Some(size)) => {
                let rows = std::num::NonZeroU16::new(size.rows).ok_or("a terminal of 0 rows")?;
                let cols = std::num::NonZeroU16::new(size.cols).ok_or("a terminal of 0 columns")?;
                Some(Box::new(vt100::Parser::new_with_callbacks(
                    rows,
                    cols,
                    0,
                    Beside::default(),
                )))
            }
            _ => None,
        };
        let terminal = screen.is_some();
        let mut inner = self.inner();
        let id = inner.next;
        inner.next += 1;
        let now = Instant::now();
        let proc = Arc::new(Proc {
            id,
            payload,
            command: start.command.clone(),
            started: SystemTime::now(),
            started_at: now,
            deadline: now + start.timeout,
            state: Mutex::new(State {
                out: [Ring::new(start.buffer), Ring::new(start.buffer)],
                exit: None,
                exited_at: None,
                error: None,
                drained: false,
                timed_out: false,
                killing: false,
                screen,
                announced: false,
            }),
            stdin: Mutex::new(stdin),
            terminal,
        });
        let reader = proc.clone();
        std::thread::Builder::new()
            .name(format!("codecage-proc-{id}"))
            .spawn(move || match output {
                Output::Pipes(stdout, stderr) => drain(&reader, stdout, stderr),
                Output::Terminal(master) => drain_terminal(&reader, master),
            })
            .map_err(|e| {
                format!("cannot start the thread that reads process {id}'s output: {e}")
            })?;
        let started = proc.snapshot(None, None);
        inner.procs.insert(id, proc);
        inner.log(EventKind::Started, started);
        // Forget the oldest ended ones past the cap (those whose end is logged first).
        while inner.procs.len() > MAX_REMEMBERED {
            let oldest = inner
                .procs
                .iter()
                .find(|(_, p)| {
                    let state = p.state();
                    state.exit.is_some() && state.announced
                })
                .or_else(|| inner.procs.iter().find(|(_, p)| p.state().exit.is_some()))
                .map(|(id, _)| *id);
            match oldest {
                Some(old) => inner.procs.remove(&old),
                None => break,
            };
        }
        Ok(id)
    }
}

/// Where a process's output comes from.
enum Output {
    /// Its stdout and stderr pipes.
    Pipes(File, File),
    /// Its terminal's master: one stream, kept as stdout.
    Terminal(File),
}

fn no_terminal(id: u64) -> String {
    format!("process {id} does not run on a terminal (start it with `pty`)")
}

fn modes_of(screen: &vt100::Screen) -> TermModes {
    TermModes {
        application_cursor: screen.application_cursor(),
        bracketed_paste: screen.bracketed_paste(),
    }
}

/// Reads a terminal's master until no process holds its slave any more (EIO), into the
/// process's stdout buffer and its screen; then lets the master go (the sandbox's devpts
/// gets the pty back).
fn drain_terminal(proc: &Proc, mut master: File) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match master.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let replies = {
                    let mut state = proc.state();
                    state.out[0].push(&buf[..n]);
                    match state.screen.as_mut() {
                        Some(parser) => {
                            parser.process(&buf[..n]);
                            std::mem::take(&mut parser.callbacks_mut().replies)
                        }
                        None => Vec::new(),
                    }
                };
                if !replies.is_empty() {
                    // Best effort, as a terminal's: a program that does not read its input
                    // does not get them.
                    let _ = (&master).write(&replies);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let mut fds = [PollFd::new(master.as_fd(), PollFlags::POLLIN)];
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(_) => break,
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // EIO: every fd of the slave is closed.
            Err(_) => break,
        }
    }
    drop(master);
    *proc.stdin.lock().unwrap_or_else(|e| e.into_inner()) = None;
    proc.state().drained = true;
}

/// Reads both pipes until both end (every process holding them has exited), into the
/// process's buffers.
fn drain(proc: &Proc, mut stdout: File, mut stderr: File) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut open = [true, true];
    while open[0] || open[1] {
        let which: Vec<usize> = (0..2).filter(|&i| open[i]).collect();
        let mut fds: Vec<PollFd> = which
            .iter()
            .map(|&i| {
                let pipe = if i == 0 { &stdout } else { &stderr };
                PollFd::new(pipe.as_fd(), PollFlags::POLLIN)
            })
            .collect();
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
        let ready: Vec<usize> = which
            .iter()
            .zip(&fds)
            .filter(|(_, p)| p.revents().is_some_and(|r| !r.is_empty()))
            .map(|(i, _)| *i)
            .collect();
        drop(fds);
        for i in ready {
            let pipe = if i == 0 { &mut stdout } else { &mut stderr };
            match pipe.read(&mut buf) {
                Ok(0) => open[i] = false,
                Ok(n) => proc.state().out[i].push(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => open[i] = false,
            }
        }
    }
    proc.state().drained = true;
}

/// The pipes of a process to start: stdin (a pipe the launcher writes, or /dev/null),
/// stdout and stderr. The payload's ends go to the init; the launcher keeps the others.
pub(crate) struct Pipes {
    pub child: [OwnedFd; 3],
    pub stdin: Option<File>,
    pub stdout: File,
    pub stderr: File,
}

impl Pipes {
    pub(crate) fn open(stdin: bool) -> Result<Pipes, String> {
        let (stdout, stdout_w) =
            pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("cannot create the stdout pipe: {e}"))?;
        let (stderr, stderr_w) =
            pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("cannot create the stderr pipe: {e}"))?;
        let (stdin_r, stdin_w) = if stdin {
            let (read, write) = pipe2(OFlag::O_CLOEXEC)
                .map_err(|e| format!("cannot create the stdin pipe: {e}"))?;
            super::set_nonblocking(write.as_fd())
                .map_err(|e| format!("cannot make the stdin pipe non-blocking: {e}"))?;
            (read, Some(File::from(write)))
        } else {
            let null = nix::fcntl::open(
                "/dev/null",
                OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(|e| format!("cannot open /dev/null for stdin: {e}"))?;
            (null, None)
        };
        Ok(Pipes {
            child: [stdin_r, stdout_w, stderr_w],
            stdin: stdin_w,
            stdout: File::from(stdout),
            stderr: File::from(stderr),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_keeps_the_last_bytes_with_absolute_offsets() {
        let mut ring = Ring::new(4);
        ring.push(b"abc");
        assert_eq!(ring.window(0).bytes, b"abc");
        ring.push(b"defg");
        let w = ring.window(0);
        assert_eq!(
            (w.bytes.as_slice(), w.from, w.cursor, w.dropped),
            (&b"defg"[..], 3, 7, 3)
        );
        let w = ring.window(5);
        assert_eq!((w.bytes.as_slice(), w.from, w.dropped), (&b"fg"[..], 5, 0));
        assert_eq!(ring.window(99).bytes, b"");
        ring.push(&[b'x'; 10]);
        assert_eq!(ring.window(0).bytes, b"xxxx");
        assert_eq!(ring.window(0).dropped, 13);
    }

    #[test]
    fn the_event_log_keeps_the_last_events_and_counts_those_it_lost() {
        let table = Processes::new().unwrap();
        let snapshot = Snapshot {
            id: 1,
            command: "true".into(),
            status: Status::Exited,
            exit_code: Some(0),
            signal: None,
            timed_out: false,
            error: None,
            started: SystemTime::now(),
            duration: Duration::ZERO,
            stdout: Window::default(),
            stderr: Window::default(),
            pty: None,
        };
        let (events, missed, next) = table.events(0);
        assert_eq!((events.len(), missed, next), (0, 0, 1));
        for _ in 0..MAX_EVENTS + 6 {
            table.inner().log(EventKind::Exited, snapshot.clone());
        }
        let (events, missed, next) = table.events(0);
        assert_eq!(
            (events.len(), missed, next),
            (MAX_EVENTS, 6, MAX_EVENTS as u64 + 7)
        );
        assert_eq!(events[0].seq, 7);
        // From the last seen: the rest, nothing missed; from the end: nothing.
        let (events, missed, _) = table.events(MAX_EVENTS as u64 + 4);
        assert_eq!((events.len(), missed), (2, 0));
        let (events, missed, _) = table.events(MAX_EVENTS as u64 + 6);
        assert_eq!((events.len(), missed), (0, 0));
    }
}
