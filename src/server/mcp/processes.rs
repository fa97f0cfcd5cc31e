//! The `exec` and `process` tools (the seeds' names and parameters): a command run by
//! `bash -c` in the session's sandbox, in the foreground up to `yieldMs` and then in the
//! background; its processes listed, polled, read, fed stdin and killed. Over the service's
//! background processes (src/service/processes.rs), rendered as text blocks.
//!
//! A poll without `cursor` gives the output since this client's last poll of that process
//! (the cursors are kept in [`super::McpStore`]: per connection over stdio, per caller over
//! HTTP); each answer ends with its cursor, which a client that lost its place gives back
//! as `cursor` to resume with no gap and no repeat. An answer holds at most `mcp.max_text`
//! bytes of output and the cursor advances only over what it shows: the rest comes with
//! the next poll.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Deserialize;

use codecage::processes::{EventKind, Snapshot, Status, Window};
use codecage::units::format_size;

use super::connection::wait_idle;
use super::results::{api_error, tool_error};
use super::CodecageMcp;
use crate::server::Caller;
use crate::service::processes::{self as procs, ProcessRequest, StdinRequest, MAX_YIELD};
use crate::service::Error as ApiError;

/// How many lines `log` shows unless asked.
const LOG_LINES: u64 = 200;
/// How long `kill` waits for the process to end, to say how it ended.
const KILL_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExecArgs {
    /// The command line, run by `bash -c` in the session's sandbox.
    pub command: String,
    /// Where it starts: relative to /work, or absolute (default /work).
    pub workdir: Option<String>,
    /// Variables added to its environment (PATH and LD_* are refused).
    pub env: Option<BTreeMap<String, String>>,
    /// How long to wait for it in the foreground, in milliseconds (default 10000, at most
    /// 600000); then it goes on in the background and the answer says `running`.
    #[serde(rename = "yieldMs", alias = "yield_ms")]
    pub yield_ms: Option<u64>,
    /// Put it in the background at once (the answer comes without waiting).
    pub background: Option<bool>,
    /// Its time limit in seconds (default 1800, at most the profile's): then it is killed.
    pub timeout: Option<f64>,
    /// A session from `create_session`. Over stdio, optional: the connection has its own.
    pub session_id: Option<String>,
    /// Run it on a terminal (80x24, TERM=xterm-256color): for programs that need one
    /// (REPLs, editors, pagers, TUIs). Its output is then one stream; process
    /// action=screen shows the terminal as a person sees it, send-keys/paste/submit type.
    pub pty: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// The session's processes.
    List,
    /// New output and the status.
    Poll,
    /// The output kept, a window of lines.
    Log,
    /// Text to its stdin.
    Write,
    /// A signal (KILL by default).
    Kill,
    /// Keys by tmux's names (`keys`: Enter, C-c, Up, Tab, Escape, ...).
    #[serde(rename = "send-keys", alias = "send_keys")]
    SendKeys,
    /// Text pasted (`text`), bracketed when the program asked for it.
    Paste,
    /// Enter (a carriage return on a terminal).
    Submit,
    /// A terminal's screen now: its rows of text and the cursor.
    Screen,
}

/// A process's id: a number, or a string of one (as the seeds give it).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ProcessId {
    Number(u64),
    Text(String),
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ProcessArgs {
    /// list, poll, log, write, kill, send-keys, paste, submit or screen.
    pub action: Action,
    /// The process (every action but list): the id exec's answer gives.
    #[serde(rename = "sessionId", alias = "process_id")]
    pub process: Option<ProcessId>,
    /// poll: resume from this cursor ("STDOUT:STDERR", byte offsets, as an answer ends
    /// with) instead of where this client's last poll of it ended.
    pub cursor: Option<String>,
    /// log: the first line to show, from 0 (default: the last `limit` lines).
    pub offset: Option<u64>,
    /// log: how many lines (default 200).
    pub limit: Option<u64>,
    /// write: the text to write to its stdin.
    pub data: Option<String>,
    /// write: close its stdin after the data (the program reads end of file).
    pub eof: Option<bool>,
    /// kill: the signal's name (KILL by default; TERM, INT, HUP, QUIT, USR1, ...).
    pub signal: Option<String>,
    /// send-keys: keys by tmux's names (`Enter`, `C-c`, `Up`, `Tab`, `Escape`, `BSpace`,
    /// `PPage`, `F1`, a character; modifiers `C-`, `M-`, `S-`).
    pub keys: Option<Vec<String>>,
    /// paste: the text (line ends become Enter; bracketed-paste markers when the program
    /// enabled them).
    pub text: Option<String>,
    /// The codecage session the process runs in (from `create_session`). Over stdio,
    /// optional: the connection has its own.
    pub session_id: Option<String>,
}

impl CodecageMcp {
    pub(super) async fn run_exec(&self, args: ExecArgs, caller: &Caller) -> CallToolResult {
        if let Some(ms) = args
            .yield_ms
            .filter(|ms| *ms > MAX_YIELD.as_millis() as u64)
        {
            return tool_error(format!(
                "yieldMs {ms}: at most {} (give background: true to answer at once)",
                MAX_YIELD.as_millis()
            ));
        }
        let timeout = match args.timeout {
            None => None,
            Some(t) if t.is_finite() && t > 0.0 && t < 1e7 => Some(codecage::knobs::Raw::Text(
                format!("{}ms", Duration::from_secs_f64(t).as_millis().max(1)),
            )),
            Some(t) => {
                return tool_error(format!(
                    "timeout {t}: give a number of seconds above 0 (e.g. 600)"
                ))
            }
        };
        let entry = match self
            .exec_session(args.session_id.as_deref(), caller, true)
            .await
        {
            Ok(entry) => entry,
            Err(e) => return e,
        };
        let pty = args.pty.unwrap_or(false);
        let request = ProcessRequest {
            command: Some(args.command),
            argv: None,
            cwd: args.workdir,
            env: args.env.unwrap_or_default(),
            // Open, for process action=write (a program that reads it waits for that); on a
            // terminal, the terminal is its input.
            stdin: !pty,
            pty: procs::PtyOption(pty.then_some(codecage::processes::TermSize::DEFAULT)),
            background: args.background.unwrap_or(false),
            yield_ms: args.yield_ms,
            timeout,
        };
        wait_idle(&entry).await;
        match procs::start(
            &self.state,
            caller,
            crate::audit::Via::Mcp,
            &entry.id,
            request,
        )
        .await
        {
            Ok(snapshot) => {
                let max = self.state.config.mcp.max_text as usize;
                let (mut text, cursor) = render(&snapshot, max);
                if let Some(rest) = text.strip_prefix("(no new output)") {
                    text = format!("(no output){rest}");
                }
                self.state
                    .mcp
                    .set_cursor(caller, &entry.id, snapshot.id, cursor);
                if snapshot.status == Status::Running {
                    text.push_str(&format!(
                        "[it goes on in the background: sessionId {id}; process action=poll sessionId={id} gives \
                         its new output, action=write feeds its stdin, action=kill stops it]\n",
                        id = snapshot.id
                    ));
                }
                let failed = snapshot.status == Status::Exited
                    && (snapshot.exit_code != Some(0) || snapshot.error.is_some());
                if failed {
                    CallToolResult::error(vec![ContentBlock::text(text)])
                } else {
                    CallToolResult::success(vec![ContentBlock::text(text)])
                }
            }
            Err(e) if e.kind == crate::service::Kind::ApprovalPending => {
                // `[exec] ask`: nothing ran yet; the approval's id stands for the process.
                let pending = e.pending.as_deref().cloned().unwrap_or_default();
                let id = pending["approval_id"].as_str().unwrap_or("?");
                text_result(format!(
                    "[approval pending] approval {id}: {}. Nothing ran: a person decides (allow once, allow \
                     always, deny). process action=poll sessionId={id} says whether it was decided and, once it \
                     started, gives its output.\n",
                    pending["reason"].as_str().unwrap_or("")
                ))
            }
            Err(e) => exec_error(e),
        }
    }

    pub(super) async fn run_process(&self, args: ProcessArgs, caller: &Caller) -> CallToolResult {
        let entry = match self
            .exec_session(args.session_id.as_deref(), caller, false)
            .await
        {
            Ok(entry) => entry,
            Err(e) => return e,
        };
        let session = entry.id.clone();
        let max = self.state.config.mcp.max_text as usize;
        if args.action == Action::List {
            return match procs::list(&self.state, caller, &session) {
                Ok(list) if list.is_empty() => text_result("no processes in this session"),
                Ok(list) => {
                    let mut text = String::new();
                    for p in &list {
                        text.push_str(&format!(
                            "sessionId {}: {}, {}; {} of stdout, {} of stderr; {}\n",
                            p.id,
                            status_words(p),
                            seconds(p.duration),
                            format_size(p.stdout.cursor),
                            format_size(p.stderr.cursor),
                            one_line(&p.command)
                        ));
                    }
                    text_result(text)
                }
                Err(e) => api_error(e),
            };
        }
        let id = match &args.process {
            Some(ProcessId::Number(n)) => *n,
            // An approval's id (exec answered `approval pending`): its process once started.
            Some(ProcessId::Text(t))
                if t.trim().len() == 32 && !t.trim().contains(|c: char| !c.is_ascii_hexdigit()) =>
            {
                match crate::service::approvals::show(&self.state, caller, t.trim()) {
                    Ok(a) if a.session_id != session => {
                        return tool_error(format!("approval {t} is of another session"))
                    }
                    Ok(a) => match (a.status.as_str(), a.process_id) {
                        ("started", Some(process)) => process,
                        ("pending", _) => {
                            return text_result(format!(
                                "approval {t} is still pending: nothing ran yet; poll again later\n"
                            ))
                        }
                        (status, _) => {
                            return tool_error(format!(
                                "approval {t} is {status}{}: the command did not run",
                                a.error.map(|e| format!(" ({e})")).unwrap_or_default()
                            ))
                        }
                    },
                    Err(e) => return api_error(e),
                }
            }
            Some(ProcessId::Text(t)) => match t.trim().parse() {
                Ok(n) => n,
                Err(_) => {
                    return tool_error(format!(
                        "sessionId {t:?}: give the process's id, the number exec's answer gave"
                    ))
                }
            },
            None => return tool_error(
                "sessionId: which process? Give the id exec's answer gave (action=list lists them)",
            ),
        };
        match args.action {
            Action::List => unreachable!("answered above"),
            Action::Poll => {
                let from = match args.cursor.as_deref() {
                    Some(text) => match parse_cursor(text) {
                        Ok(c) => c,
                        Err(e) => return tool_error(e),
                    },
                    None => self.state.mcp.cursor(caller, &session, id),
                };
                match procs::poll(&self.state, caller, &session, id, from.0, from.1) {
                    Ok(snapshot) => {
                        let (text, cursor) = render(&snapshot, max);
                        self.state.mcp.set_cursor(caller, &session, id, cursor);
                        text_result(text)
                    }
                    Err(e) => api_error(e),
                }
            }
            Action::Log => match procs::poll(&self.state, caller, &session, id, 0, 0) {
                Ok(snapshot) => text_result(log(
                    &snapshot,
                    args.offset,
                    args.limit.unwrap_or(LOG_LINES),
                    max,
                )),
                Err(e) => api_error(e),
            },
            Action::Write => {
                let data = args.data.unwrap_or_default();
                let eof = args.eof.unwrap_or(false);
                if data.is_empty() && !eof {
                    return tool_error(
                        "write: give `data` (the text to write) and/or `eof: true` (to close its stdin)",
                    );
                }
                let body = StdinRequest {
                    data,
                    close: eof,
                    ..StdinRequest::default()
                };
                match procs::write_stdin(&self.state, caller, &session, id, body).await {
                    Ok(written) => text_result(format!(
                        "wrote {written} bytes to the stdin of process {id}{}",
                        if eof { ", and closed it" } else { "" }
                    )),
                    Err(e) => api_error(e),
                }
            }
            Action::SendKeys | Action::Paste | Action::Submit => {
                let body = match args.action {
                    Action::SendKeys => match args.keys {
                        Some(keys) if !keys.is_empty() => StdinRequest {
                            keys,
                            ..StdinRequest::default()
                        },
                        _ => {
                            return tool_error(
                                "send-keys: give `keys`, e.g. [\"C-c\"] or [\"Up\", \"Enter\"] (tmux's names)",
                            )
                        }
                    },
                    Action::Paste => match args.text {
                        Some(text) if !text.is_empty() => StdinRequest {
                            paste: Some(text),
                            ..StdinRequest::default()
                        },
                        _ => return tool_error("paste: give `text`, the text to paste"),
                    },
                    _ => StdinRequest {
                        submit: true,
                        ..StdinRequest::default()
                    },
                };
                match procs::write_stdin(&self.state, caller, &session, id, body).await {
                    Ok(written) => text_result(format!("sent {written} bytes to process {id}")),
                    Err(e) => api_error(e),
                }
            }
            Action::Screen => match procs::screen_process(&self.state, caller, &session, id) {
                Ok(screen) => text_result(screen_text(&screen)),
                Err(e) => api_error(e),
            },
            Action::Kill => {
                let name = args.signal.unwrap_or_else(|| "KILL".into());
                let signal = serde_json::Value::String(name.clone());
                if let Err(e) = procs::signal_process(&self.state, caller, &session, id, &signal) {
                    return api_error(e);
                }
                // Say how it ended, if it did soon.
                let end = Instant::now() + KILL_WAIT;
                let mut last = None;
                while Instant::now() < end {
                    match procs::list(&self.state, caller, &session) {
                        Ok(list) => last = list.into_iter().find(|p| p.id == id),
                        Err(e) => return api_error(e),
                    }
                    if last.as_ref().is_some_and(|p| p.status == Status::Exited) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let name = name.to_ascii_uppercase();
                let name = name.strip_prefix("SIG").unwrap_or(&name);
                text_result(match last {
                    Some(p) => format!("sent SIG{name} to process {id}: it {}", status_words(&p)),
                    None => format!("sent SIG{name} to process {id}"),
                })
            }
        }
    }
}

/// A terminal's screen as text: its rows (trailing empty rows left out), then a line with
/// the cursor, the size, the title and the status.
fn screen_text(screen: &procs::ScreenView) -> String {
    let last = screen
        .rows
        .iter()
        .rposition(|r| !r.is_empty())
        .map_or(0, |i| i + 1)
        .max(usize::from(screen.cursor.row) + 1)
        .min(screen.rows.len());
    let mut text = String::new();
    for row in &screen.rows[..last] {
        text.push_str(row);
        text.push('\n');
    }
    text.push_str(&format!(
        "[screen {}x{}; cursor at row {}, column {}{}{}; {}]\n",
        screen.size.cols,
        screen.size.rows,
        screen.cursor.row,
        screen.cursor.col,
        if screen.cursor.visible {
            ""
        } else {
            " (hidden)"
        },
        screen
            .title
            .as_deref()
            .map(|t| format!("; title {t:?}"))
            .unwrap_or_default(),
        match screen.status {
            Status::Running => "running",
            Status::Exited => "exited",
        }
    ));
    text
}

fn text_result(text: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text.into())])
}

/// A service error, in the tool's names for the fields.
fn exec_error(e: ApiError) -> CallToolResult {
    let message = e
        .message()
        .replace("field `cwd`", "workdir")
        .replace("field `yield_ms`", "yieldMs")
        .replace("field `command`/`argv`", "command")
        .replace("field `", "`");
    tool_error(format!("[{}] {message}", e.kind()))
}

/// "STDOUT:STDERR" byte offsets.
fn parse_cursor(text: &str) -> Result<(u64, u64), String> {
    text.split_once(':')
        .and_then(|(o, e)| Some((o.trim().parse().ok()?, e.trim().parse().ok()?)))
        .ok_or_else(|| {
            format!(
                "cursor {text:?}: give \"STDOUT:STDERR\", two byte offsets as an answer's last line \
                 gives them (e.g. \"120:0\")"
            )
        })
}

/// A duration as a person reads it: 0.3 s, 12.0 s.
fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// A command on one line (its newlines as `\n`), at most 200 characters.
fn one_line(command: &str) -> String {
    let line = command.replace('\n', "\\n");
    match line.char_indices().nth(200) {
        Some((at, _)) => format!("{}...", &line[..at]),
        None => line,
    }
}

/// How a process stands, in words.
fn status_words(p: &Snapshot) -> String {
    let mut words = match (p.status, p.exit_code, p.signal) {
        (Status::Running, _, _) => "running".to_string(),
        (Status::Exited, Some(code), _) => format!("exited with status {code}"),
        (Status::Exited, None, Some(signal)) => {
            format!("was killed by {}", procs::signal_name(signal))
        }
        (Status::Exited, None, None) => "exited".to_string(),
    };
    if p.timed_out {
        words.push_str(" at its time limit");
    }
    if let Some(error) = &p.error {
        words.push_str(&format!(" ({error})"));
    }
    words
}

/// How much of `bytes` to show within `limit`: not cutting a UTF-8 character (nor, while
/// the process runs, the character it is writing).
fn cut(bytes: &[u8], limit: usize, running: bool) -> usize {
    let mut n = bytes.len().min(limit);
    if n < bytes.len() {
        while n > 0 && bytes[n] & 0xC0 == 0x80 {
            n -= 1;
        }
        if n == 0 {
            n = limit.clamp(1, bytes.len());
        }
    } else if running {
        if let Err(e) = std::str::from_utf8(&bytes[..n]) {
            if e.error_len().is_none() {
                n = e.valid_up_to();
            }
        }
    }
    n
}

/// A process's answer: its output windows (at most `max` bytes between them; the cursor
/// advances only over what is shown), what was dropped, its status and its cursor.
fn render(p: &Snapshot, max: usize) -> (String, (u64, u64)) {
    let running = p.status == Status::Running;
    let (out, err) = (&p.stdout, &p.stderr);
    let out_budget = if err.bytes.is_empty() {
        max
    } else {
        (max / 2).max(max.saturating_sub(err.bytes.len()))
    };
    let out_n = cut(&out.bytes, out_budget, running);
    let err_n = cut(&err.bytes, max.saturating_sub(out_n), running);
    let mut text = String::new();
    if out_n > 0 {
        text.push_str(&String::from_utf8_lossy(&out.bytes[..out_n]));
        if !text.ends_with('\n') {
            text.push('\n');
        }
    }
    if err_n > 0 {
        text.push_str("[stderr]\n");
        text.push_str(&String::from_utf8_lossy(&err.bytes[..err_n]));
        if !text.ends_with('\n') {
            text.push('\n');
        }
    }
    if text.is_empty() {
        text.push_str("(no new output)\n");
    }
    for (name, w) in [("stdout", out), ("stderr", err)] {
        if w.dropped > 0 {
            text.push_str(&format!(
                "[{name}: {} bytes before this were dropped: the buffer keeps the last {}]\n",
                w.dropped,
                format_size(codecage::processes::DEFAULT_BUFFER as u64)
            ));
        }
    }
    let more = out_n < out.bytes.len() || err_n < err.bytes.len();
    if more {
        text.push_str("[more output than fits in one answer: poll again for the rest]\n");
    }
    text.push_str(&format!(
        "[process {}: {} after {}]\n",
        p.id,
        status_words(p),
        seconds(p.duration)
    ));
    let cursor = (out.from + out_n as u64, err.from + err_n as u64);
    text.push_str(&format!("[cursor {}:{}]\n", cursor.0, cursor.1));
    (text, cursor)
}

/// `log`: the kept output as lines, `limit` of them from `offset` (default: the last
/// ones), each stream on its own, within `max` bytes.
fn log(p: &Snapshot, offset: Option<u64>, limit: u64, max: usize) -> String {
    let mut text = String::new();
    let mut budget = max;
    for (name, w) in [("stdout", &p.stdout), ("stderr", &p.stderr)] {
        if w.bytes.is_empty() && name == "stderr" {
            continue;
        }
        text.push_str(&window_lines(name, w, offset, limit, &mut budget));
    }
    text.push_str(&format!(
        "[process {}: {} after {}]\n",
        p.id,
        status_words(p),
        seconds(p.duration)
    ));
    text
}

fn window_lines(
    name: &str,
    w: &Window,
    offset: Option<u64>,
    limit: u64,
    budget: &mut usize,
) -> String {
    let all = String::from_utf8_lossy(&w.bytes);
    let lines: Vec<&str> = all.split_inclusive('\n').collect();
    let total = lines.len() as u64;
    let first = offset
        .unwrap_or_else(|| total.saturating_sub(limit))
        .min(total);
    let mut shown = String::new();
    let mut count = 0u64;
    for line in lines
        .iter()
        .skip(first as usize)
        .take(limit.min(usize::MAX as u64) as usize)
    {
        if line.len() > *budget {
            break;
        }
        *budget -= line.len();
        shown.push_str(line);
        count += 1;
    }
    if !shown.is_empty() && !shown.ends_with('\n') {
        shown.push('\n');
    }
    let range = if count == 0 {
        "no lines".to_string()
    } else {
        format!("lines {}-{}", first, first + count - 1)
    };
    let mut head = format!("[{name}: {range} of the {total} kept");
    if w.from > 0 {
        head.push_str(&format!(
            "; the {} bytes before them were dropped (the buffer keeps the last {})",
            w.from,
            format_size(codecage::processes::DEFAULT_BUFFER as u64)
        ));
    }
    if first + count < total {
        head.push_str(&format!("; more from offset {}", first + count));
    }
    head.push_str("]\n");
    head + &shown
}

/// The most exits one tool result tells of; the rest are counted.
const MAX_NOTICES: usize = 20;

impl CodecageMcp {
    /// The seeds' `notifyOnExit`: the exits of the session's processes that `caller` was
    /// not yet told of, appended to this result of `exec` or `process` as one more text
    /// block (an MCP client sees them on its next call of either). `subject`: the process
    /// the result itself is about (its exit is in the result, not told again). Where the
    /// caller was in the session's event log is kept as its cursor of "process 0".
    pub(super) async fn tell_exits(
        &self,
        session_id: Option<&str>,
        caller: &Caller,
        subject: Subject,
        result: &mut CallToolResult,
    ) {
        let Ok(entry) = self.exec_session(session_id, caller, false).await else {
            return;
        };
        procs::tend(&entry);
        let told = self.state.mcp.cursor(caller, &entry.id, 0).0;
        let (events, _, next) = entry.processes.events(told);
        let newest = events
            .iter()
            .filter(|e| e.kind == EventKind::Started)
            .filter_map(|e| e.process.as_ref().map(|p| p.id))
            .max();
        let subject = match subject {
            Subject::Process(id) => Some(id),
            Subject::Started => newest,
            Subject::None => None,
        };
        let exits: Vec<&Snapshot> = events
            .iter()
            .filter(|e| e.kind == EventKind::Exited)
            .filter_map(|e| e.process.as_ref())
            .filter(|p| Some(p.id) != subject)
            .collect();
        self.state
            .mcp
            .set_cursor(caller, &entry.id, 0, (next.saturating_sub(1), 0));
        if exits.is_empty() {
            return;
        }
        let mut text = String::new();
        for p in exits.iter().take(MAX_NOTICES) {
            text.push_str(&format!(
                "[background process sessionId {} {} after {}: {}; process action=poll sessionId={} gives \
                 its output]\n",
                p.id,
                status_words(p),
                seconds(p.duration),
                one_line(&p.command),
                p.id
            ));
        }
        if exits.len() > MAX_NOTICES {
            text.push_str(&format!(
                "[and {} more exited; process action=list lists them]\n",
                exits.len() - MAX_NOTICES
            ));
        }
        result.content.push(ContentBlock::text(text));
    }
}

/// What a tool result is about, for [`CodecageMcp::tell_exits`].
pub(super) enum Subject {
    /// Process N (a `process` action on it).
    Process(u64),
    /// The process this call started (`exec`): the newest started.
    Started,
    None,
}

impl ProcessId {
    pub(super) fn number(&self) -> Option<u64> {
        match self {
            ProcessId::Number(n) => Some(*n),
            ProcessId::Text(t) => t.trim().parse().ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_keeps_characters_whole() {
        let text = "aé".as_bytes();
        assert_eq!(cut(text, 2, false), 1, "not inside é");
        assert_eq!(cut(text, 10, false), 3);
        assert_eq!(cut(&text[..2], 10, true), 1, "é half written waits");
        assert_eq!(
            cut(&text[..2], 10, false),
            2,
            "an ended process's bytes all go"
        );
        assert_eq!(cut(&[0x80, 0x80, 0x80], 2, false), 2, "never stuck at 0");
    }

    fn snapshot(stdout: &[u8], from: u64, dropped: u64, status: Status) -> Snapshot {
        Snapshot {
            id: 7,
            command: "x".into(),
            status,
            exit_code: (status == Status::Exited).then_some(0),
            signal: None,
            timed_out: false,
            error: None,
            started: std::time::SystemTime::now(),
            duration: Duration::from_millis(1500),
            stdout: Window {
                bytes: stdout.to_vec(),
                from,
                cursor: from + stdout.len() as u64,
                dropped,
            },
            stderr: Window::default(),
            pty: None,
        }
    }

    #[test]
    fn an_answer_over_the_text_limit_shows_a_part_and_its_cursor_stops_there() {
        let lines: String = (0..20).map(|i| format!("line {i:02}\n")).collect();
        let (text, cursor) = render(&snapshot(lines.as_bytes(), 100, 0, Status::Exited), 40);
        assert!(text.starts_with(&lines[..40]), "{text}");
        assert!(text.contains("poll again for the rest"), "{text}");
        assert!(
            text.contains("[process 7: exited with status 0 after 1.5 s]"),
            "{text}"
        );
        assert_eq!(cursor, (140, 0));
        assert!(text.ends_with("[cursor 140:0]\n"), "{text}");
        let (text, cursor) = render(&snapshot(b"tail\n", 2000, 1500, Status::Running), 40);
        assert!(text.starts_with("tail\n"), "{text}");
        assert!(
            text.contains("1500 bytes before this were dropped"),
            "{text}"
        );
        assert!(!text.contains("poll again"), "{text}");
        assert_eq!(cursor, (2005, 0));
    }

    #[test]
    fn a_log_is_a_window_of_lines() {
        let lines: String = (0..10).map(|i| format!("{i}\n")).collect();
        let p = snapshot(lines.as_bytes(), 0, 0, Status::Running);
        let tail = log(&p, None, 3, 1000);
        assert!(
            tail.starts_with("[stdout: lines 7-9 of the 10 kept]\n7\n8\n9\n"),
            "{tail}"
        );
        let head = log(&p, Some(0), 2, 1000);
        assert!(
            head.starts_with("[stdout: lines 0-1 of the 10 kept; more from offset 2]\n0\n1\n"),
            "{head}"
        );
    }

    #[test]
    fn cursors_are_two_offsets() {
        assert_eq!(parse_cursor("120:3"), Ok((120, 3)));
        assert!(parse_cursor("120").unwrap_err().contains("STDOUT:STDERR"));
        assert!(parse_cursor("a:b").is_err());
    }
}
