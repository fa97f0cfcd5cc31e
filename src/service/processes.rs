//! A session's background processes (issue 24's first slice): started beside the
//! interpreter, in the foreground up to `yield_ms` and then in the background; listed,
//! polled from byte cursors, fed stdin, signalled, killed. Only the session's owner (or an
//! admin) reaches them: [`lookup`] answers 404 to anyone else.
//!
//! A poll, stdin and a signal do not need the session to be free: the process table is
//! shared (`codecage::processes::Processes`), so they work while a call runs; starting a
//! process claims the session as a call does (409 while one runs).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Deserialize;

use codecage::knobs::{Knob, Raw};
use codecage::processes::{Snapshot, Start, Status, TermSize, Window};
use codecage::units::format_duration;

use super::keys::{self, KeyModes};
use super::{audit_slot, lookup, with_session, Caller, Error, Kind};
use crate::audit::{self, Via};
use crate::server::registry::Entry;
use crate::server::Shared;

/// A process's time limit unless the request names one (lowered to the profile's maximum).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);
/// How long a start waits in the foreground unless the request says.
pub const DEFAULT_YIELD: Duration = Duration::from_millis(10_000);
/// The longest a start may wait in the foreground.
pub const MAX_YIELD: Duration = Duration::from_secs(600);
/// At most this many bytes of stdin in one request.
pub const MAX_STDIN: usize = 1 << 20;

/// `POST /v1/sessions/{id}/processes`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProcessRequest {
    /// A command line, run by `bash -c` (give this or `argv`).
    pub command: Option<String>,
    /// A program and its arguments (searched in PATH), instead of `command`.
    pub argv: Option<Vec<String>>,
    /// Where it starts: relative to /work, or absolute (default /work).
    pub cwd: Option<String>,
    /// Variables added to the session's environment (not PATH or LD_*).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Keep stdin open for `POST .../stdin` (default: it reads /dev/null).
    #[serde(default)]
    pub stdin: bool,
    /// Run it on a terminal of this size (`{cols, rows}`, each defaulting to 80 and 24;
    /// `true` for 80x24): a pty of the sandbox's own, `TERM=xterm-256color`, its input
    /// through `POST .../stdin`, its screen at `GET .../screen`. Its output is one stream
    /// (`stdout`), escape codes and all.
    #[serde(default)]
    pub pty: PtyOption,
    /// Answer at once with `status: running` rather than waiting up to `yield_ms`.
    #[serde(default)]
    pub background: bool,
    /// How long to wait for it to end before answering `running` (default 10000).
    pub yield_ms: Option<u64>,
    /// Its time limit (default 1800 s, at most the profile's maximum): then it is killed.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub timeout: Option<Raw>,
}

/// A terminal's size as a start asks for it.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PtyRequest {
    /// Columns (default 80, at most 500).
    #[serde(default = "default_cols")]
    pub cols: u16,
    /// Rows (default 24, at most 200).
    #[serde(default = "default_rows")]
    pub rows: u16,
}

fn default_cols() -> u16 {
    TermSize::DEFAULT.cols
}

fn default_rows() -> u16 {
    TermSize::DEFAULT.rows
}

/// `pty` of a start: absent, `null` or `false` (no terminal), `true` (80x24), or
/// `{cols, rows}`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PtyOption(pub Option<TermSize>);

/// Its OpenAPI schema: `oneOf` a boolean and [`PtyRequest`] (null allowed).
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for PtyOption {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Ref, SchemaType, Type};
        OneOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(SchemaType::Type(Type::Boolean)))
            .item(Ref::from_schema_name("PtyRequest"))
            .item(ObjectBuilder::new().schema_type(SchemaType::Type(Type::Null)))
            .description(Some("`true` (a terminal of 80x24), or {cols, rows}"))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for PtyOption {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        use utoipa::PartialSchema as _;
        schemas.push(("PtyRequest".into(), PtyRequest::schema()));
    }
}

impl<'de> Deserialize<'de> for PtyOption {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<PtyOption, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = PtyOption;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "`true` (a terminal of 80x24), `false`, or `{\"cols\": N, \"rows\": M}`",
                )
            }
            fn visit_bool<E>(self, on: bool) -> Result<PtyOption, E> {
                Ok(PtyOption(on.then_some(TermSize::DEFAULT)))
            }
            fn visit_unit<E>(self) -> Result<PtyOption, E> {
                Ok(PtyOption(None))
            }
            fn visit_none<E>(self) -> Result<PtyOption, E> {
                Ok(PtyOption(None))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<PtyOption, A::Error> {
                let size =
                    PtyRequest::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(PtyOption(Some(TermSize {
                    cols: size.cols,
                    rows: size.rows,
                })))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// `POST /v1/sessions/{id}/processes/{pid}/stdin`: input to a process, sent in this
/// order: `keys`, `data`, `paste`, then Enter if `submit`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StdinRequest {
    /// Keys by tmux's names: `Enter`, `Escape`, `Tab`, `BSpace`, `Up`, `Home`, `PPage`,
    /// `DC`, `F1`..`F12`, a single character, or `^X`, with any of the modifiers `C-`,
    /// `M-`, `S-` (`C-c`, `M-x`, `C-Left`). Cursor keys follow the terminal's mode
    /// (application cursor keys when the program set them).
    #[serde(default)]
    pub keys: Vec<String>,
    /// Text to write, as it is.
    #[serde(default)]
    pub data: String,
    /// Text pasted: on a terminal, line ends as carriage returns, and between
    /// bracketed-paste markers when the program enabled them.
    pub paste: Option<String>,
    /// Enter after the rest (a carriage return on a terminal, a line feed on a pipe).
    #[serde(default)]
    pub submit: bool,
    /// Close stdin after writing (the program then reads EOF). Not for a terminal: send
    /// the key `C-d`.
    #[serde(default)]
    pub close: bool,
}

/// `POST /v1/sessions/{id}/processes/{pid}/resize`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResizeRequest {
    pub cols: u16,
    pub rows: u16,
}

/// `GET /v1/sessions/{id}/processes/{pid}/screen`: a process's terminal as a person would
/// see it now.
#[derive(Debug, Clone, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScreenView {
    pub process_id: u64,
    /// `running` or `exited` (an exited process's last screen stays).
    pub status: Status,
    /// Each row's text, trailing blanks cut (as many as the terminal has rows).
    pub rows: Vec<String>,
    pub cursor: CursorView,
    pub size: TermSize,
    /// The window title the program set, if any.
    pub title: Option<String>,
    /// The program uses the alternate screen (a full-screen program: an editor, a pager).
    pub alternate_screen: bool,
    /// Cursor keys are in application mode (`keys` follow it).
    pub application_cursor: bool,
    /// The program asked for bracketed paste (`paste` follows it).
    pub bracketed_paste: bool,
}

/// Where the cursor is, from 0.
#[derive(Debug, Clone, Copy, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CursorView {
    pub row: u16,
    pub col: u16,
    pub visible: bool,
}

/// `POST /v1/sessions/{id}/processes/{pid}/signal`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SignalRequest {
    /// A signal's name (`TERM`, `SIGINT`, ...) or number.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub signal: serde_json::Value,
}

/// A process as the API gives it (a JSON object): `process_id`, `command`, `status`
/// (`running` or `exited`), `exit_code`, `signal`, `timed_out`, `error` (why it never
/// started), `started_at`, `duration_ms`, `pty` (its terminal's size, when it runs on one),
/// and for each stream (stdout, stderr) its window:
/// `stdout` (text, or base64 with `stdout_encoding: "base64"`), `stdout_from` (the offset
/// of its first byte), `stdout_cursor` (where to poll from next: every byte so far) and
/// `stdout_dropped` (bytes between the cursor asked and `stdout_from` that the buffer no
/// longer held).
pub type ProcessView = serde_json::Value;

/// A snapshot as JSON (see [`ProcessView`]).
pub fn view(s: Snapshot) -> ProcessView {
    let running = s.status == Status::Running;
    let mut object = serde_json::json!({
        "process_id": s.id,
        "command": s.command,
        "status": s.status,
        "exit_code": s.exit_code,
        "signal": s.signal,
        "timed_out": s.timed_out,
        "started_at": humantime::format_rfc3339_seconds(s.started).to_string(),
        "duration_ms": s.duration.as_millis() as u64,
    });
    let map = object.as_object_mut().expect("an object");
    if let Some(error) = s.error {
        map.insert("error".into(), error.into());
    }
    if let Some(size) = s.pty {
        map.insert("pty".into(), serde_json::json!(size));
    }
    for (name, window) in [("stdout", s.stdout), ("stderr", s.stderr)] {
        stream_fields(map, name, window, running);
    }
    object
}

/// One stream's window as JSON carries it: text when it is UTF-8 (a character cut at the
/// end of a running process's output waits for the next poll), else base64 of the bytes.
fn stream_fields(
    map: &mut serde_json::Map<String, serde_json::Value>,
    name: &str,
    mut window: Window,
    running: bool,
) {
    let encoded = match std::str::from_utf8(&window.bytes) {
        Ok(_) => None,
        Err(e) if running && e.error_len().is_none() => {
            let valid = e.valid_up_to();
            window.cursor = window.from + valid as u64;
            window.bytes.truncate(valid);
            None
        }
        Err(_) => Some(base64::engine::general_purpose::STANDARD.encode(&window.bytes)),
    };
    match encoded {
        Some(text) => {
            map.insert(name.into(), text.into());
            map.insert(format!("{name}_encoding"), "base64".into());
        }
        None => {
            let text = String::from_utf8(window.bytes).unwrap_or_default();
            map.insert(name.into(), text.into());
        }
    }
    map.insert(format!("{name}_from"), window.from.into());
    map.insert(format!("{name}_cursor"), window.cursor.into());
    map.insert(format!("{name}_dropped"), window.dropped.into());
}

/// The request checked and made a [`Start`]: one of command and argv, names of variables
/// allowed, the time limit within the profile's maximum. With the foreground wait.
fn start_of(entry: &Entry, body: ProcessRequest) -> Result<(Start, Option<Duration>), Error> {
    if entry.caps.exec_denied {
        return Err(Error::new(
            Kind::Policy,
            codecage::exec_policy::denied(&entry.profile, "a process"),
        )
        .on("exec"));
    }
    let (argv, command) = match (body.command, body.argv) {
        (Some(command), None) => (
            vec!["bash".to_string(), "-c".to_string(), command.clone()],
            command,
        ),
        (None, Some(argv)) if !argv.is_empty() => {
            let command = argv.join(" ");
            (argv, command)
        }
        (None, Some(_)) => return Err(Error::invalid("field `argv`: it is empty")),
        _ => return Err(Error::invalid(
            "give exactly one of `command` (a command line for bash -c) and `argv` (a program and \
                 its arguments)",
        )),
    };
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(Error::invalid(
            "field `command`/`argv`: a NUL byte cannot be in a program's arguments",
        ));
    }
    for key in body.env.keys() {
        codecage::profile::check_env_name(key)
            .map_err(|e| Error::new(Kind::Policy, format!("field `env`: {e}")))?;
    }
    if let Some(cwd) = &body.cwd {
        if cwd.is_empty() || cwd.contains('\0') {
            return Err(Error::invalid(
                "field `cwd`: a directory, relative to /work or absolute",
            ));
        }
    }
    let pty = match body.pty.0 {
        Some(size) => Some(
            size.check()
                .map_err(|e| Error::invalid(format!("field `pty`: {e}")))?,
        ),
        None => None,
    };
    if pty.is_some() && body.stdin {
        return Err(Error::invalid(
            "field `stdin`: a process on a terminal reads its terminal; leave `stdin` out with `pty`",
        ));
    }
    let max = entry.caps.max_timeout;
    let timeout = match &body.timeout {
        None => DEFAULT_TIMEOUT.min(max),
        Some(raw) => {
            let asked = Knob::Timeout
                .from_raw(raw)
                .map(Duration::from_millis)
                .map_err(|e| Error::invalid(format!("field `timeout`: {e}")))?;
            if asked > max {
                return Err(Error::new(
                    Kind::Policy,
                    format!(
                        "a timeout of {} is more than the session's profile {} allows (at most {}); ask \
                         for less",
                        format_duration(asked),
                        entry.profile,
                        format_duration(max)
                    ),
                ));
            }
            asked
        }
    };
    let wait = match (body.background, body.yield_ms) {
        (true, _) => None,
        (false, Some(ms)) if Duration::from_millis(ms) > MAX_YIELD => {
            return Err(Error::invalid(format!(
                "field `yield_ms`: at most {} ms (give `background: true` to answer at once)",
                MAX_YIELD.as_millis()
            )))
        }
        (false, ms) => Some(ms.map_or(DEFAULT_YIELD, Duration::from_millis)),
    };
    Ok((
        Start {
            argv,
            command,
            cwd: body.cwd,
            env: body.env.into_iter().collect(),
            stdin: body.stdin,
            timeout,
            buffer: entry.caps.process_buffer,
            pty,
            exec_extra: None,
        },
        wait,
    ))
}

/// Starts a process in session `id`; waits for its end up to `yield_ms` (unless
/// `background`): its whole result if it ended, else its output so far, `running`.
pub async fn start_process(
    state: &Shared,
    caller: &Caller,
    via: Via,
    id: &str,
    body: ProcessRequest,
) -> Result<ProcessView, Error> {
    start(state, caller, via, id, body).await.map(view)
}

/// [`start_process`]'s answer as a [`Snapshot`] (its output from offset 0), for front
/// ends that render it themselves (MCP).
pub async fn start(
    state: &Shared,
    caller: &Caller,
    via: Via,
    id: &str,
    body: ProcessRequest,
) -> Result<Snapshot, Error> {
    let entry = lookup(state, caller, id)?;
    let (mut start, wait) = start_of(&entry, body)?;
    let shell = start.argv.len() == 3 && start.argv[0] == "bash" && start.argv[1] == "-c";
    let extra = super::approvals::gate(
        state,
        caller,
        via,
        &entry,
        &start.command,
        (!shell).then_some(start.argv.as_slice()),
        Some(start.clone()),
    )
    .await?;
    start.exec_extra = extra;
    let command = start.command.clone();
    // Its audit record: written now (`running`), completed at its exit (see `settle`).
    let mut record = audit::Start::new(audit::Kind::Process, via, caller.to_string());
    record.session = Some(entry.id.clone());
    record.profile = Some(entry.profile.clone());
    match start.argv.get(..2) {
        Some([bash, dash_c]) if bash == "bash" && dash_c == "-c" && start.argv.len() == 3 => {
            record.code = Some(start.command.clone());
            record.language = Some("bash".into());
        }
        _ => record.argv = Some(start.argv.clone()),
    }
    record.limits = Some(serde_json::json!({
        "timeout_ms": start.timeout.as_millis() as u64,
        "buffer": start.buffer,
    }));
    record.details = serde_json::json!({
        "cwd": start.cwd,
        "pty": start.pty,
        "stdin": start.stdin,
        "env": start.env.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
    });
    let slot = audit_slot(state).await?;
    // Shared with the session's thread, which takes it: left here, the start was refused
    // before it ran (409 while a call runs, or the session closed).
    let pending = Arc::new(std::sync::Mutex::new(slot.map(|slot| slot.begin(record))));
    let taken = pending.clone();
    let started = with_session(state, caller, id, move |session, entry| {
        let pending = taken.lock().unwrap_or_else(|e| e.into_inner()).take();
        let process = match session.start_process(&start) {
            Ok(process) => process,
            Err(e) => {
                if let Some(pending) = pending {
                    pending.finish(audit::End::error("not_started", &e));
                }
                return Err(e);
            }
        };
        if let Some(pending) = pending {
            entry
                .process_audits
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(process, pending);
        }
        if let Some(wait) = wait {
            session.wait_process(process, Instant::now() + wait)?;
        }
        Ok(process)
    })
    .await;
    let left = pending.lock().unwrap_or_else(|e| e.into_inner()).take();
    let process = match (started, left) {
        (Ok(process), _) => process,
        (Err(e), Some(pending)) => {
            pending.finish(audit::End::error(e.kind.name(), &e.message));
            return Err(e);
        }
        (Err(e), None) => return Err(e),
    };
    tracing::info!(caller = %caller, session = %id, process, command = %command, "process started");
    entry.touch();
    settle(&entry);
    snapshot(&entry, process, 0, 0)
}

/// The processes of session `id`, oldest first (their cursors say how much output each
/// has).
pub fn list_processes(
    state: &Shared,
    caller: &Caller,
    id: &str,
) -> Result<Vec<ProcessView>, Error> {
    Ok(list(state, caller, id)?.into_iter().map(view).collect())
}

/// [`list_processes`] as [`Snapshot`]s.
pub fn list(state: &Shared, caller: &Caller, id: &str) -> Result<Vec<Snapshot>, Error> {
    let entry = lookup(state, caller, id)?;
    tend(&entry);
    Ok(entry.processes.list())
}

/// Process `process` of session `id`, with its output from the cursors given.
pub fn poll_process(
    state: &Shared,
    caller: &Caller,
    id: &str,
    process: u64,
    stdout_from: u64,
    stderr_from: u64,
) -> Result<ProcessView, Error> {
    poll(state, caller, id, process, stdout_from, stderr_from).map(view)
}

/// [`poll_process`] as a [`Snapshot`].
pub fn poll(
    state: &Shared,
    caller: &Caller,
    id: &str,
    process: u64,
    stdout_from: u64,
    stderr_from: u64,
) -> Result<Snapshot, Error> {
    let entry = lookup(state, caller, id)?;
    tend(&entry);
    entry.touch();
    snapshot(&entry, process, stdout_from, stderr_from)
}

/// Writes input to a process's stdin or terminal (`keys`, `data`, `paste`, then Enter if
/// `submit`), and closes stdin if asked; the bytes written.
pub async fn write_stdin(
    state: &Shared,
    caller: &Caller,
    id: &str,
    process: u64,
    body: StdinRequest,
) -> Result<usize, Error> {
    let entry = lookup(state, caller, id)?;
    let given = body.data.len() + body.paste.as_ref().map_or(0, String::len);
    if given > MAX_STDIN {
        return Err(Error::invalid(format!(
            "fields `data` and `paste`: at most {MAX_STDIN} bytes a request"
        )));
    }
    let terminal = entry
        .processes
        .terminal_modes(process)
        .map_err(|e| missing_or(e, Kind::InvalidRequest))?;
    let modes = KeyModes {
        terminal: terminal.is_some(),
        application_cursor: terminal.is_some_and(|m| m.application_cursor),
    };
    let mut bytes = keys::encode_all(&body.keys, modes)
        .map_err(|e| Error::invalid(format!("field `keys`: {e}")))?;
    bytes.extend_from_slice(body.data.as_bytes());
    if let Some(text) = &body.paste {
        let bracketed = terminal.is_some_and(|m| m.bracketed_paste);
        bytes.extend(keys::paste(text, modes, bracketed));
    }
    if body.submit {
        bytes.extend_from_slice(keys::submit(modes));
    }
    entry.touch();
    let processes = entry.processes.clone();
    tokio::task::spawn_blocking(move || processes.write_stdin(process, &bytes, body.close))
        .await
        .map_err(|e| Error::new(Kind::Setup, e.to_string()))?
        .map_err(|e| missing_or(e, Kind::InvalidRequest))
}

/// Process `process`'s terminal as a person would see it now (rows of text, the cursor,
/// the size, the title, the modes that change what keys send).
pub fn screen_process(
    state: &Shared,
    caller: &Caller,
    id: &str,
    process: u64,
) -> Result<ScreenView, Error> {
    let entry = lookup(state, caller, id)?;
    tend(&entry);
    entry.touch();
    let screen = entry
        .processes
        .screen(process)
        .map_err(|e| missing_or(e, Kind::InvalidRequest))?;
    let status = entry
        .processes
        .poll(process, u64::MAX, u64::MAX)
        .map_or(Status::Exited, |p| p.status);
    Ok(ScreenView {
        process_id: process,
        status,
        rows: screen.lines,
        cursor: CursorView {
            row: screen.cursor.0,
            col: screen.cursor.1,
            visible: screen.cursor_visible,
        },
        size: screen.size,
        title: screen.title,
        alternate_screen: screen.alternate_screen,
        application_cursor: screen.modes.application_cursor,
        bracketed_paste: screen.modes.bracketed_paste,
    })
}

/// Resizes a process's terminal: the kernel sends SIGWINCH to its foreground process
/// group, and the screen takes the new size.
pub fn resize_process(
    state: &Shared,
    caller: &Caller,
    id: &str,
    process: u64,
    body: ResizeRequest,
) -> Result<(), Error> {
    let entry = lookup(state, caller, id)?;
    let size = TermSize {
        cols: body.cols,
        rows: body.rows,
    };
    entry.touch();
    entry
        .processes
        .resize(process, size)
        .map_err(|e| missing_or(e, Kind::InvalidRequest))
}

/// Sends a signal to a process's process group (`DELETE` sends SIGKILL).
pub fn signal_process(
    state: &Shared,
    caller: &Caller,
    id: &str,
    process: u64,
    signal: &serde_json::Value,
) -> Result<(), Error> {
    let entry = lookup(state, caller, id)?;
    let signal = signal_of(signal)?;
    entry
        .processes
        .queue_signal(process, signal)
        .map_err(|e| missing_or(e, Kind::InvalidRequest))?;
    entry.touch();
    tend(&entry);
    Ok(())
}

/// The signals a client may send, by name.
const SIGNALS: &[(&str, i32)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("TSTP", libc::SIGTSTP),
    ("WINCH", libc::SIGWINCH),
];

fn signal_of(value: &serde_json::Value) -> Result<i32, Error> {
    let found = match value {
        serde_json::Value::String(name) => {
            let name = name.to_ascii_uppercase();
            let name = name.strip_prefix("SIG").unwrap_or(&name);
            SIGNALS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
        }
        serde_json::Value::Number(n) => n
            .as_i64()
            .and_then(|n| SIGNALS.iter().find(|(_, s)| i64::from(*s) == n))
            .map(|(_, s)| *s),
        _ => None,
    };
    found.ok_or_else(|| {
        let names: Vec<&str> = SIGNALS.iter().map(|(n, _)| *n).collect();
        Error::invalid(format!(
            "field `signal`: {value} is not a signal a process may be sent; give one of {} (or its \
             number)",
            names.join(", ")
        ))
    })
}

pub fn kill_signal() -> serde_json::Value {
    serde_json::Value::String("KILL".into())
}

/// A signal's name (`SIGKILL`), or its number when it is not one a client may send.
pub fn signal_name(signal: i32) -> String {
    SIGNALS
        .iter()
        .find(|(_, s)| *s == signal)
        .map_or_else(|| signal.to_string(), |(n, _)| format!("SIG{n}"))
}

fn snapshot(
    entry: &Entry,
    process: u64,
    stdout_from: u64,
    stderr_from: u64,
) -> Result<Snapshot, Error> {
    entry
        .processes
        .poll(process, stdout_from, stderr_from)
        .ok_or_else(|| no_process(process))
}

fn no_process(process: u64) -> Error {
    Error::new(
        Kind::NotFound,
        format!("there is no process {process} in this session"),
    )
}

fn missing_or(message: String, kind: Kind) -> Error {
    if message.starts_with("there is no process") {
        Error::new(Kind::NotFound, message)
    } else {
        Error::new(kind, message)
    }
}

/// Reads the session's reports and sends queued signals, if no call holds the session
/// (a running call's supervision does it then); then logs and audits the exits seen.
pub fn tend(entry: &Arc<Entry>) {
    if let Ok(mut guard) = entry.session.try_lock() {
        if let Some(session) = guard.as_mut() {
            session.tend_processes();
        }
    }
    settle(entry);
}

/// The processes that ended since the last look: their exits go to the session's event
/// log, and their audit records are completed (exit code, signal, duration, the output
/// the buffer held). A record whose process the table forgot is completed as such.
pub fn settle(entry: &Entry) {
    let ended = entry.processes.take_ended();
    let mut audits = entry
        .process_audits
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if audits.is_empty() {
        return;
    }
    let mut done: Vec<(u64, Option<Snapshot>)> = ended
        .into_iter()
        .filter(|s| audits.contains_key(&s.id))
        .map(|s| (s.id, entry.processes.poll(s.id, 0, 0)))
        .collect();
    // Also those that ended before their record was placed (within a start's wait).
    for (&id, _) in audits.iter() {
        if done.iter().any(|(d, _)| *d == id) {
            continue;
        }
        match entry.processes.poll(id, 0, 0) {
            Some(s) if s.status == Status::Exited => done.push((id, Some(s))),
            Some(_) => {}
            None => done.push((id, None)),
        }
    }
    for (id, snapshot) in done {
        let Some(pending) = audits.remove(&id) else {
            continue;
        };
        let Some(s) = snapshot else {
            pending.finish(audit::End::error(
                "forgotten",
                "the session forgot the process before its end was seen",
            ));
            continue;
        };
        let end = audit::End {
            exit_code: s.exit_code,
            signal: s.signal,
            error: match (s.timed_out, &s.error) {
                (true, _) => Some("timeout".into()),
                (false, Some(e)) if e == codecage::processes::SANDBOX_GONE => {
                    Some("session_closed".into())
                }
                (false, Some(_)) => Some("not_started".into()),
                _ => None,
            },
            message: s.error.clone(),
            duration: Some(s.duration),
            details: serde_json::json!({
                "process_id": s.id,
                "timed_out": s.timed_out,
                "stdout_bytes": s.stdout.cursor,
                "stderr_bytes": s.stderr.cursor,
                "stdout_dropped": s.stdout.from,
                "stderr_dropped": s.stderr.from,
            }),
            ..audit::End::default()
        };
        pending.finish_with_output(end, &s.stdout.bytes, &s.stderr.bytes);
    }
}

/// How often a stream looks for new output and events.
const STREAM_TICK: Duration = Duration::from_millis(50);
/// How often an idle stream says it is alive.
const STREAM_HEARTBEAT: Duration = Duration::from_secs(10);
/// Lines a stream holds for a slow reader before it waits (the output stays in the
/// process's buffer meanwhile: nothing is lost but what the buffer drops).
const STREAM_QUEUE: usize = 16;

/// A process's fields without its output (the cursors stay: how much there was).
fn bare(mut view: ProcessView) -> ProcessView {
    if let Some(map) = view.as_object_mut() {
        for name in ["stdout", "stderr"] {
            for suffix in ["", "_encoding", "_from", "_dropped"] {
                map.remove(&format!("{name}{suffix}"));
            }
        }
    }
    view
}

/// Process `process`'s output as it comes, from the cursors given, as lines of JSON:
/// `{"type": "stdout"|"stderr", "data", "encoding"?, "from", "cursor", "dropped"}` (the
/// offsets as a poll's), `{"type": "heartbeat"}` every 10 s of quiet, and last
/// `{"type": "exit", ...the process without output}` once it has exited with its output
/// all given (or `{"type": "error", ...}`). A client that reconnects with the last
/// `cursor` of each stream gets every byte since, once. Checked before it starts: 404 for
/// no such session or process.
pub fn stream_output(
    state: &Shared,
    caller: &Caller,
    id: &str,
    process: u64,
    stdout_from: u64,
    stderr_from: u64,
) -> Result<tokio::sync::mpsc::Receiver<serde_json::Value>, Error> {
    let entry = lookup(state, caller, id)?;
    snapshot(&entry, process, 0, 0)?;
    entry.touch();
    let (lines, receiver) = tokio::sync::mpsc::channel(STREAM_QUEUE);
    tokio::spawn(async move {
        let mut cursors = [stdout_from, stderr_from];
        let mut quiet = Instant::now();
        loop {
            tend(&entry);
            let Some(s) = entry.processes.poll(process, cursors[0], cursors[1]) else {
                let _ = lines
                    .send(serde_json::json!({
                        "type": "error",
                        "error": Kind::NotFound.name(),
                        "message": format!("the session forgot process {process}"),
                    }))
                    .await;
                return;
            };
            let exited = s.status == Status::Exited;
            let mut whole = view(s);
            let mut sent = false;
            for (i, name) in ["stdout", "stderr"].into_iter().enumerate() {
                let field = |suffix: &str| whole.get(format!("{name}{suffix}"));
                let cursor = field("_cursor").and_then(|v| v.as_u64()).unwrap_or(0);
                let dropped = field("_dropped").and_then(|v| v.as_u64()).unwrap_or(0);
                if cursor <= cursors[i] && dropped == 0 {
                    // Nothing new (a cursor past the end is taken as the end, as a poll's).
                    cursors[i] = cursor;
                    continue;
                }
                let mut line = serde_json::json!({
                    "type": name,
                    "data": field("").cloned().unwrap_or_default(),
                    "from": field("_from").cloned().unwrap_or_default(),
                    "cursor": cursor,
                    "dropped": dropped,
                });
                if let Some(encoding) = field("_encoding") {
                    line["encoding"] = encoding.clone();
                }
                cursors[i] = cursor;
                if lines.send(line).await.is_err() {
                    return;
                }
                sent = true;
            }
            if exited {
                if let Some(map) = whole.as_object_mut() {
                    map.insert("type".into(), "exit".into());
                }
                whole = bare(whole);
                let _ = lines.send(whole).await;
                return;
            }
            if sent {
                quiet = Instant::now();
            } else if quiet.elapsed() >= STREAM_HEARTBEAT {
                if lines
                    .send(serde_json::json!({"type": "heartbeat"}))
                    .await
                    .is_err()
                {
                    return;
                }
                quiet = Instant::now();
            } else if lines.is_closed() {
                return;
            }
            tokio::time::sleep(STREAM_TICK).await;
        }
    });
    Ok(receiver)
}

/// An event of the session's log as JSON: `{"type": "started"|"exited", "seq", "at",
/// ...the process without output}`, or a note's fields with `seq` and `at` (the exec
/// approvals': `approval_finished`, `exec_denied`, `approval_running`).
pub fn event_view(event: codecage::processes::Event) -> serde_json::Value {
    let mut line = match (event.process, event.note) {
        (Some(process), _) => {
            let mut line = bare(view(process));
            if let Some(map) = line.as_object_mut() {
                map.insert("type".into(), serde_json::json!(event.kind));
            }
            line
        }
        // A note: its own fields and type (`approval_finished`, `exec_denied`, ...).
        (None, note) => note.unwrap_or_else(|| serde_json::json!({"type": "note"})),
    };
    if let Some(map) = line.as_object_mut() {
        map.insert("seq".into(), event.seq.into());
        map.insert(
            "at".into(),
            humantime::format_rfc3339_millis(event.at)
                .to_string()
                .into(),
        );
    }
    line
}

/// Session `id`'s events as they happen, after event number `after` (0: from the first
/// the log holds), as lines of JSON: each process's start and exit ([`event_view`]; an
/// exit within a second of it), `{"type": "missed", "events": N}` when the log (the last
/// 1024) no longer holds some asked for, a heartbeat every 10 s of quiet, and last
/// `{"type": "closed"}` when the session ends. Reconnect with the last `seq` as `after`.
pub fn stream_events(
    state: &Shared,
    caller: &Caller,
    id: &str,
    after: u64,
) -> Result<tokio::sync::mpsc::Receiver<serde_json::Value>, Error> {
    let entry = lookup(state, caller, id)?;
    let (lines, receiver) = tokio::sync::mpsc::channel(STREAM_QUEUE);
    let state = state.clone();
    let caller = caller.clone();
    let id = id.to_string();
    tokio::spawn(async move {
        let mut after = after;
        let mut quiet = Instant::now();
        loop {
            tend(&entry);
            let (events, missed, next) = entry.processes.events(after);
            if missed > 0
                && lines
                    .send(serde_json::json!({"type": "missed", "events": missed}))
                    .await
                    .is_err()
            {
                return;
            }
            after = next - 1;
            let sent = !events.is_empty();
            for event in events {
                if lines.send(event_view(event)).await.is_err() {
                    return;
                }
            }
            if lookup(&state, &caller, &id).is_err() {
                // Closed (or closing: its sandbox goes within seconds): its processes' ends
                // logged, then the last line.
                let closing = Instant::now();
                while closing.elapsed() < Duration::from_secs(5)
                    && !matches!(entry.session.try_lock(), Ok(guard) if guard.is_none())
                {
                    tokio::time::sleep(STREAM_TICK).await;
                }
                entry.processes.sandbox_gone();
                // Every exit logged before the last line: a process whose end was just
                // recorded is ended once its output is read (its reader may not have run
                // yet on a loaded host), AFTER_EXIT after it at most.
                let settling = Instant::now();
                loop {
                    settle(&entry);
                    if entry.processes.all_ended()
                        || settling.elapsed() > codecage::processes::AFTER_EXIT * 5
                    {
                        break;
                    }
                    tokio::time::sleep(STREAM_TICK).await;
                }
                for event in entry.processes.events(after).0 {
                    let _ = lines.send(event_view(event)).await;
                }
                let _ = lines.send(serde_json::json!({"type": "closed"})).await;
                return;
            }
            if sent {
                quiet = Instant::now();
            } else if quiet.elapsed() >= STREAM_HEARTBEAT {
                if lines
                    .send(serde_json::json!({"type": "heartbeat"}))
                    .await
                    .is_err()
                {
                    return;
                }
                quiet = Instant::now();
            } else if lines.is_closed() {
                return;
            }
            tokio::time::sleep(STREAM_TICK).await;
        }
    });
    Ok(receiver)
}
