//! The audit log: one record per execution (a run, a session's call, a session's life) and
//! per refused request, in an SQLite database (WAL) written by one thread.
//!
//! The request path never touches the disk: it takes a place in a bounded queue (past it,
//! the configured `on_full`: wait, or refuse with a 503 that names the audit) and moves on.
//! A record is written when its execution starts (`running`) and completed when it ends,
//! so a process killed mid-run leaves `running` rows, which the next codecage to open the
//! database marks `incomplete` (rows of a writer process that no longer exists). While the
//! writer cannot write (a full disk), it keeps what it holds and retries, and new requests
//! meet `on_full` at once: nothing accepted is dropped. Code and output go to the database
//! only (as `log_code` and `log_output` say), never to the tracing log.

mod record;
mod store;
pub mod time;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use codecage::files::InputFile;
use codecage::outcome::{ErrorKind, Outcome};

pub use record::{Filter, Record};
pub use store::Store;

/// Where the database lives unless the configuration says otherwise.
pub const DEFAULT_PATH: &str = "/var/lib/codecage/audit/audit.db";

/// `[audit]` of the server's config (on unless `enabled = false`) and of the host config
/// /etc/codecage/config.toml (the CLI audits only when that file has the section).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    pub enabled: bool,
    /// The database file; its directory is made 0700 (0750 with `group`).
    pub path: PathBuf,
    /// Keep each execution's code (and a program's argv); its sha256 and size are kept
    /// either way.
    pub log_code: bool,
    /// The code (or argv) kept, at most; the whole's sha256 and size are kept either way.
    #[serde(deserialize_with = "crate::server::config::size")]
    pub code_cap: u64,
    /// Keep stdout and stderr, each up to `output_cap`; their sizes and sha256 either way.
    pub log_output: bool,
    #[serde(deserialize_with = "crate::server::config::size")]
    pub output_cap: u64,
    /// Records older than this many days are deleted (daily by the server, and by
    /// `codecage audit prune`).
    pub retention_days: u64,
    /// Records waiting for the writer, at most.
    pub queue: usize,
    /// What a request meets when the queue is full or the writer cannot write.
    pub on_full: OnFull,
    /// A group that may read the database (directory 0750, files 0640).
    pub group: Option<String>,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            enabled: true,
            path: PathBuf::from(DEFAULT_PATH),
            log_code: true,
            log_output: true,
            code_cap: 64 << 10,
            output_cap: 64 << 10,
            retention_days: 30,
            queue: 1024,
            on_full: OnFull::Block,
            group: None,
        }
    }
}

impl AuditConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=1 << 20).contains(&self.queue) {
            return Err(format!("audit.queue = {}: give 1 to 1048576", self.queue));
        }
        if self.code_cap > 16 << 20 || self.output_cap > 16 << 20 {
            return Err("audit.code_cap and audit.output_cap: give at most 16M".into());
        }
        if self.retention_days == 0 {
            return Err("audit.retention_days = 0: give 1 or more days".into());
        }
        if !self.path.is_absolute() {
            return Err(format!(
                "audit.path = {:?}: give an absolute path",
                self.path
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFull {
    /// The request waits until its record can be queued and written.
    Block,
    /// The request is refused (HTTP 503, `audit_unavailable`; the CLI exits 125).
    Refuse,
}

/// The front end a record came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Api,
    Mcp,
    Cli,
    /// The E2B-compatible front end (`[e2b]`).
    E2b,
}

impl Via {
    pub fn name(self) -> &'static str {
        match self {
            Via::Api => "api",
            Via::Mcp => "mcp",
            Via::Cli => "cli",
            Via::E2b => "e2b",
        }
    }
}

/// What a record is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A one-shot run.
    Run,
    /// One call in a session.
    Call,
    /// A session's life, from its creation to its close.
    Session,
    /// A session's interpreter started again.
    Reset,
    /// A session's process (`POST /v1/sessions/{id}/processes`, MCP `exec`), from its
    /// start to its exit.
    Process,
    /// A request refused before anything ran.
    Refused,
    /// An `[exec] ask` question, its decision, or a rule's revocation.
    Approval,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Run => "run",
            Kind::Call => "call",
            Kind::Session => "session",
            Kind::Reset => "reset",
            Kind::Process => "process",
            Kind::Refused => "refused",
            Kind::Approval => "approval",
        }
    }
}

/// Why the audit could not take a record.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuditError {
    #[error("the audit log's queue is full (on_full = \"refuse\"): the request was not run; try again shortly")]
    Full,
    #[error("the audit log cannot be written ({0}; on_full = \"refuse\"): the request was not run; the operator must make room for {1}")]
    Failing(String, String),
    #[error("the audit log's writer has stopped")]
    Stopped,
}

/// What is known of an execution when it starts.
#[derive(Debug, Clone)]
pub struct Start {
    pub kind: Kind,
    pub via: Via,
    pub caller: String,
    pub profile: Option<String>,
    pub language: Option<String>,
    pub session: Option<String>,
    pub code: Option<String>,
    pub argv: Option<Vec<String>>,
    pub stdin: Option<Vec<u8>>,
    /// Input files: names, sizes and sha256 are recorded, not their bytes.
    pub input_files: Vec<Value>,
    /// The limits the execution runs under.
    pub limits: Option<Value>,
    /// The hardening layers asked for.
    pub layers: Option<Value>,
    /// What else the front end knows (the endpoint, the HTTP status of a refusal).
    pub details: Value,
    /// The whole code's (or argv's) sha256 and size, taken when the code is cut to the
    /// audit's `code_cap` ([`Start::bounded`]).
    pub code_digest: Option<(String, u64)>,
    /// stdin's sha256 and size (its bytes are never kept).
    pub stdin_digest: Option<(String, u64)>,
}

impl Start {
    pub fn new(kind: Kind, via: Via, caller: impl Into<String>) -> Start {
        Start {
            kind,
            via,
            caller: caller.into(),
            profile: None,
            language: None,
            session: None,
            code: None,
            argv: None,
            stdin: None,
            input_files: Vec::new(),
            limits: None,
            layers: None,
            details: Value::Null,
            code_digest: None,
            stdin_digest: None,
        }
    }

    /// What the record keeps, bounded before it is queued: the code (or argv) cut to `cap`
    /// bytes with the whole's sha256 and size beside it, stdin only as its sha256 and
    /// size. A queue of records is then bounded in bytes too.
    pub fn bounded(mut self, cap: usize) -> Start {
        if self.code_digest.is_none() {
            let whole = match (&self.code, &self.argv) {
                (Some(code), _) => {
                    Some(codecage::files::sha256(code.as_bytes())).zip(Some(code.len() as u64))
                }
                (None, Some(argv)) => {
                    let joined = argv.join("\0");
                    Some(codecage::files::sha256(joined.as_bytes())).zip(Some(joined.len() as u64))
                }
                (None, None) => None,
            };
            self.code_digest = whole;
        }
        if let Some(code) = &mut self.code {
            if code.len() > cap {
                *code = codecage::units::head(code, cap).to_string();
                self.details = with_detail(std::mem::take(&mut self.details), "code_truncated");
            }
        }
        if let Some(argv) = &mut self.argv {
            let mut room = cap;
            let mut kept = Vec::new();
            for arg in argv.iter() {
                if room == 0 {
                    break;
                }
                let part = codecage::units::head(arg, room).to_string();
                room = room.saturating_sub(part.len() + 1);
                kept.push(part);
            }
            if kept.len() < argv.len()
                || kept.last().map(String::len) != argv.last().map(String::len)
            {
                *argv = kept;
                self.details = with_detail(std::mem::take(&mut self.details), "code_truncated");
            }
        }
        if let Some(stdin) = self.stdin.take() {
            self.stdin_digest = Some((codecage::files::sha256(&stdin), stdin.len() as u64));
        }
        self
    }

    pub fn input_files(mut self, files: &[InputFile]) -> Start {
        self.input_files = files
            .iter()
            .map(|f| {
                json!({"path": f.path, "size": f.data.len(), "sha256": codecage::files::sha256(&f.data)})
            })
            .collect();
        self
    }

    /// The limits and layers of a resolved sandbox.
    pub fn spec(mut self, sandbox: &codecage::SandboxSpec, exec: Option<&codecage::Exec>) -> Start {
        let mut limits = json!({
            "tmp_size": sandbox.tmp_size,
            "work_size": sandbox.work_size,
            "network": sandbox.network.mode,
        });
        if let Some(l) = &sandbox.limits {
            limits["memory"] = json!(l.memory);
            limits["cpus"] = json!(l.cpu_quota_us as f64 / codecage::spec::CPU_PERIOD_US as f64);
            limits["pids"] = json!(l.pids);
        }
        if let Some(exec) = exec {
            limits["timeout_ms"] = json!(exec.timeout.as_millis() as u64);
            limits["output_limit"] = json!(exec.output_limit);
        }
        self.limits = Some(limits);
        self.layers = Some(json!({
            "namespaces": "user, mount, pid, network, ipc, uts, cgroup",
            "cgroup": sandbox.cgroup,
            "landlock": sandbox.landlock,
            "seccomp": sandbox.seccomp,
        }));
        // What of the host the sandbox could read: each volume's directory, target, mode.
        if !sandbox.volumes.is_empty() {
            self.layers.as_mut().unwrap()["volumes"] = json!(sandbox.volumes);
        }
        self
    }
}

/// What is known when it ends.
#[derive(Debug, Clone, Default)]
pub struct End {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: Option<String>,
    pub message: Option<String>,
    pub duration: Option<Duration>,
    pub cpu: Option<Duration>,
    pub peak_memory: Option<u64>,
    pub limits_hit: Vec<&'static str>,
    pub landlock_abi: Option<u32>,
    pub skipped_layers: Option<Value>,
    pub output_files: Option<Value>,
    pub files_skipped: Option<Value>,
    pub network: Option<Value>,
    pub stdout: Option<Captured>,
    pub stderr: Option<Captured>,
    /// Merged into the record's details.
    pub details: Value,
}

/// A stream as the audit keeps it: its size and sha256, and its bytes up to the cap when
/// output is logged. Taken on the thread that ran the execution, so the queue never
/// holds more than the cap of any output.
#[derive(Debug, Clone)]
pub struct Captured {
    pub kept: Option<Vec<u8>>,
    pub size: u64,
    pub sha256: String,
    pub cut: bool,
}

impl Captured {
    fn of(bytes: &[u8], config: &AuditConfig) -> Captured {
        let cap = usize::try_from(config.output_cap).unwrap_or(usize::MAX);
        Captured {
            kept: config
                .log_output
                .then(|| bytes[..bytes.len().min(cap)].to_vec()),
            size: bytes.len() as u64,
            sha256: codecage::files::sha256(bytes),
            cut: config.log_output && bytes.len() > cap,
        }
    }
}

impl End {
    /// An execution's result, without its output (see [`Pending::finish_with_output`]).
    fn outcome(outcome: &Outcome) -> End {
        let mut hit = Vec::new();
        if outcome.error == Some(ErrorKind::Timeout) {
            hit.push("timeout");
        }
        if outcome.truncated || outcome.error == Some(ErrorKind::OutputLimit) {
            hit.push("output");
        }
        if outcome.oom_kills > 0 || outcome.error == Some(ErrorKind::Oom) {
            hit.push("memory");
        }
        if outcome.pids_limit_hit {
            hit.push("pids");
        }
        let files: Vec<Value> = outcome
            .files
            .iter()
            .map(|f| json!({"path": f.path, "size": f.size, "media_type": f.media_type, "sha256": f.sha256}))
            .collect();
        End {
            exit_code: outcome.exit_code,
            signal: outcome.signal,
            error: outcome.error.map(error_name),
            message: outcome.message.clone(),
            duration: Some(outcome.duration),
            cpu: Some(outcome.cpu),
            peak_memory: outcome.peak_memory_bytes,
            limits_hit: hit,
            landlock_abi: outcome.landlock_abi,
            skipped_layers: Some(json!(outcome.skipped_layers)),
            output_files: Some(Value::Array(files)),
            files_skipped: Some(json!(outcome.files_skipped)),
            network: Some(json!(outcome.network)),
            stdout: None,
            stderr: None,
            details: Value::Null,
        }
    }

    /// A refusal or a failure: its kind and message.
    pub fn error(kind: &str, message: &str) -> End {
        End {
            error: Some(kind.to_string()),
            message: Some(message.to_string()),
            ..End::default()
        }
    }

    pub fn details(mut self, details: Value) -> End {
        self.details = details;
        self
    }
}

/// An error kind's name as JSON carries it (`timeout`, `output_limit`).
pub fn error_name(kind: ErrorKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{kind:?}"))
}

enum Message {
    Begin {
        id: String,
        at: i64,
        start: Box<Start>,
    },
    Finish {
        id: String,
        at: i64,
        end: Box<End>,
    },
    Whole {
        id: String,
        at: i64,
        start: Box<Start>,
        end: Box<End>,
    },
    Prune {
        before: i64,
        done: std::sync::mpsc::Sender<Result<usize, String>>,
    },
    Flush {
        done: std::sync::mpsc::Sender<()>,
    },
}

/// The audit log of this process: a handle on the writer thread. Cheap to clone.
#[derive(Clone)]
pub struct Audit {
    inner: Arc<Inner>,
}

struct Inner {
    config: AuditConfig,
    queue: mpsc::Sender<Message>,
    /// The writer thread, unparked by a flush so its linger does not delay it.
    writer: std::thread::Thread,
    /// The writer's last attempt failed; it keeps what it holds and retries.
    failing: Arc<AtomicBool>,
    last_error: Arc<Mutex<String>>,
    refusals: Mutex<RefusalBudget>,
}

/// Refusals recorded one by one, at most [`REFUSAL_BURST`] at once and
/// [`REFUSALS_PER_SECOND`] after: past it they are counted, and the next recorded one says
/// how many were (so a client without credentials sending junk cannot fill the queue and
/// the disk that executions' records need, and nothing goes uncounted).
pub const REFUSALS_PER_SECOND: f64 = 20.0;
pub const REFUSAL_BURST: f64 = 200.0;

struct RefusalBudget {
    tokens: f64,
    at: std::time::Instant,
    suppressed: u64,
}

/// A place in the queue, taken before an execution starts: its record can then be sent
/// without waiting (from a blocking thread, after the heavy parts are computed there).
pub struct Slot {
    audit: Audit,
    permit: mpsc::OwnedPermit<Message>,
}

/// An execution whose record is written and not yet completed. Dropping it without
/// [`Pending::finish`] completes the record as abandoned, so a record stays `running` only
/// when the process died.
pub struct Pending {
    audit: Audit,
    id: String,
    done: bool,
}

impl Audit {
    /// Opens (creating) the database, marks the running records of dead writers
    /// incomplete, and starts the writer thread.
    pub fn open(config: &AuditConfig) -> Result<Audit, String> {
        config.validate()?;
        let mut store = Store::open_for_writing(config)?;
        let swept = store
            .sweep()
            .map_err(|e| format!("audit database {}: {e}", config.path.display()))?;
        if swept > 0 {
            tracing::warn!(
                records = swept,
                "audit: records of executions in flight when their process died, marked incomplete"
            );
        }
        let (queue, receiver) = mpsc::channel(config.queue);
        let failing = Arc::new(AtomicBool::new(false));
        let last_error = Arc::new(Mutex::new(String::new()));
        // The thread ends when every handle is gone (the queue closes); the process does not
        // wait for it beyond `close`.
        let writer = {
            let (failing, last_error, config) =
                (failing.clone(), last_error.clone(), config.clone());
            std::thread::Builder::new()
                .name("audit-writer".into())
                .spawn(move || writer(store, receiver, failing, last_error, config))
                .map_err(|e| format!("cannot start the audit writer: {e}"))?
                .thread()
                .clone()
        };
        Ok(Audit {
            inner: Arc::new(Inner {
                config: config.clone(),
                queue,
                writer,
                failing,
                last_error,
                refusals: Mutex::new(RefusalBudget {
                    tokens: REFUSAL_BURST,
                    at: std::time::Instant::now(),
                    suppressed: 0,
                }),
            }),
        })
    }

    /// The most of a request's code a record keeps.
    pub fn code_cap(&self) -> usize {
        usize::try_from(self.inner.config.code_cap).unwrap_or(usize::MAX)
    }

    /// Whether a refusal may be recorded now: `Some(n)` with the refusals counted but not
    /// recorded since the last one that was, or `None` (this one is counted).
    pub fn refusal_admitted(&self) -> Option<u64> {
        let mut budget = self.inner.refusals.lock().ok()?;
        let now = std::time::Instant::now();
        let elapsed = now.duration_since(budget.at).as_secs_f64();
        budget.tokens = (budget.tokens + elapsed * REFUSALS_PER_SECOND).min(REFUSAL_BURST);
        budget.at = now;
        if budget.tokens < 1.0 {
            budget.suppressed += 1;
            return None;
        }
        budget.tokens -= 1.0;
        Some(std::mem::take(&mut budget.suppressed))
    }

    /// Why the writer's last attempt failed (empty when it has not).
    fn last_error(&self) -> String {
        self.inner
            .last_error
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default()
    }

    fn refused_now(&self) -> Option<AuditError> {
        if !self.inner.failing.load(Ordering::Acquire) {
            return None;
        }
        let why = self.last_error();
        Some(AuditError::Failing(
            why,
            self.inner.config.path.display().to_string(),
        ))
    }

    /// A place in the queue; with `on_full = "block"` waits for one (and for a failing
    /// writer to recover), with `refuse` fails at once.
    pub async fn slot(&self) -> Result<Slot, AuditError> {
        loop {
            match (self.refused_now(), self.inner.config.on_full) {
                (Some(e), OnFull::Refuse) => return Err(e),
                (Some(_), OnFull::Block) => tokio::time::sleep(Duration::from_millis(50)).await,
                (None, OnFull::Refuse) => {
                    return match self.inner.queue.clone().try_reserve_owned() {
                        Ok(permit) => Ok(Slot {
                            audit: self.clone(),
                            permit,
                        }),
                        Err(mpsc::error::TrySendError::Full(_)) => Err(AuditError::Full),
                        Err(mpsc::error::TrySendError::Closed(_)) => Err(AuditError::Stopped),
                    }
                }
                (None, OnFull::Block) => {
                    let permit = self
                        .inner
                        .queue
                        .clone()
                        .reserve_owned()
                        .await
                        .map_err(|_| AuditError::Stopped)?;
                    // The writer may have failed while this request waited for room.
                    if self.inner.failing.load(Ordering::Acquire) {
                        drop(permit);
                        continue;
                    }
                    return Ok(Slot {
                        audit: self.clone(),
                        permit,
                    });
                }
            }
        }
    }

    /// [`Audit::slot`] for a thread outside the async runtime (the CLI).
    pub fn slot_blocking(&self) -> Result<Slot, AuditError> {
        loop {
            match (self.refused_now(), self.inner.config.on_full) {
                (Some(e), OnFull::Refuse) => return Err(e),
                (Some(_), OnFull::Block) => std::thread::sleep(Duration::from_millis(50)),
                (None, on_full) => match self.inner.queue.clone().try_reserve_owned() {
                    Ok(permit) => {
                        return Ok(Slot {
                            audit: self.clone(),
                            permit,
                        })
                    }
                    Err(mpsc::error::TrySendError::Full(_)) if on_full == OnFull::Block => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(mpsc::error::TrySendError::Full(_)) => return Err(AuditError::Full),
                    Err(mpsc::error::TrySendError::Closed(_)) => return Err(AuditError::Stopped),
                },
            }
        }
    }

    /// Records a request that was refused (nothing ran), complete at once.
    pub async fn refusal(&self, start: Start, end: End) -> Result<(), AuditError> {
        let slot = self.slot().await?;
        slot.whole(start, end);
        Ok(())
    }

    /// Sends a message that must not be refused (an execution's end): waits for room, on
    /// a task of the runtime when there is one (a runtime worker must not block).
    fn send_blocking(&self, message: Message) {
        let message = match self.inner.queue.try_send(message) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Full(message)) => message,
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::error!("audit: the writer has stopped; a record was not written");
                return;
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let queue = self.inner.queue.clone();
                handle.spawn(async move {
                    if queue.send(message).await.is_err() {
                        tracing::error!("audit: the writer has stopped; a record was not written");
                    }
                });
            }
            Err(_) => {
                if self.inner.queue.blocking_send(message).is_err() {
                    tracing::error!("audit: the writer has stopped; a record was not written");
                }
            }
        }
    }

    /// Deletes the records that started before `before` (the writer does it).
    pub fn prune_blocking(&self, before: SystemTime) -> Result<usize, String> {
        let (done, answer) = std::sync::mpsc::channel();
        self.send_blocking(Message::Prune {
            before: time::millis(before),
            done,
        });
        answer
            .recv()
            .map_err(|_| "the audit writer stopped".to_string())?
    }

    /// Waits until everything queued so far is written, for at most `patience`; false if
    /// the writer is still behind then (it cannot write).
    pub fn flush_blocking(&self, patience: Duration) -> bool {
        let (done, answer) = std::sync::mpsc::channel();
        self.send_blocking(Message::Flush { done });
        // A writer lingering over the records before the flush commits them now.
        self.inner.writer.unpark();
        answer.recv_timeout(patience).is_ok()
    }

    /// Writes what is queued before the process ends. A writer that cannot write is given
    /// 10 seconds; then what it holds is lost with the process, and the log says so.
    pub fn close(&self) {
        if !self.flush_blocking(Duration::from_secs(10)) {
            let why = self.last_error();
            tracing::error!(error = %why, "audit: the process ends with records the writer could not write");
            eprintln!("codecage: the audit log could not be written ({why}); records held in memory are lost");
        }
    }

    /// Retention: deletes what is older than `retention_days`, once a day.
    pub async fn prune_daily(self) {
        let mut tick = tokio::time::interval(Duration::from_secs(24 * 3600));
        loop {
            tick.tick().await;
            let days = self.inner.config.retention_days;
            let before = SystemTime::now() - Duration::from_secs(days * 24 * 3600);
            let audit = self.clone();
            match tokio::task::spawn_blocking(move || audit.prune_blocking(before)).await {
                Ok(Ok(n)) => tracing::info!(
                    records = n,
                    days,
                    "audit: pruned records past the retention"
                ),
                Ok(Err(e)) => tracing::warn!(error = %e, "audit: pruning failed"),
                Err(_) => {}
            }
        }
    }
}

impl Slot {
    /// Writes the record of an execution that starts now.
    pub fn begin(self, start: Start) -> Pending {
        let start = start.bounded(self.audit.code_cap());
        let id = new_id();
        let at = time::millis(SystemTime::now());
        self.permit.send(Message::Begin {
            id: id.clone(),
            at,
            start: Box::new(start),
        });
        Pending {
            audit: self.audit,
            id,
            done: false,
        }
    }

    /// Writes a record that is complete at once (a refusal).
    pub fn whole(self, start: Start, end: End) -> String {
        let start = start.bounded(self.audit.code_cap());
        let id = new_id();
        let at = time::millis(SystemTime::now());
        self.permit.send(Message::Whole {
            id: id.clone(),
            at,
            start: Box::new(start),
            end: Box::new(end),
        });
        id
    }
}

impl Pending {
    /// The end of an execution that gave `outcome`, but for its output: cheap, so it can
    /// be taken before the outcome goes to the client.
    pub fn end_of(&self, outcome: &Outcome) -> End {
        End::outcome(outcome)
    }

    /// Completes the record with the execution's output: hashed, and kept up to the cap
    /// as the configuration says, here (after the client has its answer).
    pub fn finish_with_output(self, mut end: End, stdout: &[u8], stderr: &[u8]) {
        let config = &self.audit.inner.config;
        end.stdout = Some(Captured::of(stdout, config));
        end.stderr = Some(Captured::of(stderr, config));
        self.finish(end);
    }

    /// Completes the record (waiting for room in the queue if need be: an execution that
    /// ran is recorded, whatever `on_full` says).
    pub fn finish(mut self, end: End) {
        self.done = true;
        let at = time::millis(SystemTime::now());
        self.audit.send_blocking(Message::Finish {
            id: self.id.clone(),
            at,
            end: Box::new(end),
        });
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.done {
            let at = time::millis(SystemTime::now());
            let end = End::error(
                "abandoned",
                "the front end stopped waiting before the execution's end was known",
            );
            self.audit.send_blocking(Message::Finish {
                id: self.id.clone(),
                at,
                end: Box::new(end),
            });
        }
    }
}

/// A record id: 16 random bytes, hex.
/// `details` with `key: true` (an object made if it was null).
fn with_detail(details: Value, key: &str) -> Value {
    let mut details = match details {
        Value::Object(map) => Value::Object(map),
        Value::Null => json!({}),
        other => json!({ "details": other }),
    };
    details[key] = Value::Bool(true);
    details
}

/// A record's id: random (the OS's CSPRNG); should it fail, the time and a counter, which
/// are unique in this process, and the writer's name tells processes apart.
fn new_id() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let now = time::millis(SystemTime::now()) as u64;
        bytes[..8].copy_from_slice(&now.to_be_bytes());
        bytes[8..].copy_from_slice(&N.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// How long the writer waits, once a record arrives, for the records after it before it
/// commits (less when a flush unparks it). An execution's start and end, and the
/// executions beside it, then share a transaction: each commit writes every page it
/// touched to the WAL again (the table's last leaf, each index's), so one transaction a
/// record cost the writer a third of a server's CPU for a stream of short session calls. A process killed meanwhile loses these
/// milliseconds of records more, as it loses what the queue holds (see "Crash semantics" in
/// ARCHITECTURE.md).
const LINGER: Duration = Duration::from_millis(2);

/// The writer thread: takes what the queue holds (up to a batch, after [`LINGER`] when it
/// starts with a record), writes it in one transaction, and on failure keeps the batch and
/// retries until it is written.
fn writer(
    mut store: Store,
    mut receiver: mpsc::Receiver<Message>,
    failing: Arc<AtomicBool>,
    last_error: Arc<Mutex<String>>,
    config: AuditConfig,
) {
    const BATCH: usize = 256;
    let mut batch: Vec<Message> = Vec::with_capacity(BATCH);
    loop {
        if batch.is_empty() {
            match receiver.blocking_recv() {
                Some(message) => batch.push(message),
                None => return,
            }
            // A flush or a prune is answered at once, and a flush sent while the writer
            // lingers unparks it (the audit API and a CLI run's exit wait for a flush).
            if !matches!(batch[0], Message::Flush { .. } | Message::Prune { .. }) {
                std::thread::park_timeout(LINGER);
            }
            while batch.len() < BATCH {
                match receiver.try_recv() {
                    Ok(message) => batch.push(message),
                    Err(_) => break,
                }
            }
        }
        match store.write(&mut batch, &config) {
            Ok(()) => {
                if failing.swap(false, Ordering::AcqRel) {
                    tracing::warn!("audit: the database is writable again; the records held meanwhile are written");
                }
                batch.clear();
            }
            Err(e) => {
                let first = !failing.swap(true, Ordering::AcqRel);
                if let Ok(mut last) = last_error.lock() {
                    *last = e.clone();
                }
                if first {
                    tracing::error!(error = %e, held = batch.len(), "audit: cannot write the database; holding the records and retrying (requests now meet on_full)");
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}
