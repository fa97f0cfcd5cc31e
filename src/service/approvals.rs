//! `[exec] ask`: commands that wait for a person. Before a session process starts or a
//! bash cell runs, [`gate`] parses the command (src/exec_ask.rs) and, when the profile's
//! `ask` says so, answers `approval_pending` (HTTP 202) with an approval id instead of
//! running it. An administrator (a token with the admin role, or root on the unix
//! socket), never the caller that asked, decides: `allow-once` (a process starts then;
//! a bash cell runs when the caller sends it again), `allow-always` (the same, and a rule
//! in the approvals table so that the same programs, or the same command when the parse
//! could not judge it, run without asking in the rule's scope: the session, the asking
//! token or uid, or the profile) or `deny`. A pending approval is denied after
//! [`APPROVAL_TIMEOUT`]. Rules are listed and revoked through the API; a revoked rule
//! stops matching at the very next command. Every question, decision and revocation is an
//! audit record (kind `approval`).
//!
//! The rules live in `approvals.db` beside the audit database (SQLite, mode 0600), so they
//! survive restarts; with the audit log off they are kept in memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rusqlite::{params, Connection};
use serde::{Deserialize, Serialize};
use serde_json::json;

use codecage::exec_ask::{self, Ask};
use codecage::exec_policy::ExecAllowlist;
use codecage::processes::Start as ProcessStart;

use super::tenancy::{new_id, Caller};
use super::{Error, Kind};
use crate::audit::{End, Kind as AuditKind, Start, Via};
use crate::server::registry::Entry;
use crate::server::Shared;

/// How long a question waits for a person before it counts as denied.
pub const APPROVAL_TIMEOUT: Duration = Duration::from_secs(600);

/// How long an approved process waits for its session to be free (a call running).
const START_PATIENCE: Duration = Duration::from_secs(60);

/// What a session's commands are judged against: the profile's `ask`, and the programs
/// that run without asking, as files of the image.
#[derive(Debug, Clone)]
pub struct AskGate {
    pub mode: Ask,
    /// The image's directory on the host, and the PATH names are looked up along.
    pub root: PathBuf,
    pub path: String,
    pub allowed: Vec<PathBuf>,
    /// `[exec.args]`, by the program's file.
    pub arg_rules: Vec<(PathBuf, exec_ask::ArgRule)>,
    /// The sandbox enforces an exec allowlist: an approved command needs its own
    /// ruleset ([`AskGate::extra`]).
    pub kernel: bool,
}

impl AskGate {
    /// Under a kernel allowlist, what `programs` (image paths) need beyond it: the
    /// programs with their loaders and libraries, for the payload's own ruleset.
    fn extra(&self, programs: &[PathBuf]) -> Result<Option<ExecAllowlist>, Error> {
        if !self.kernel || programs.is_empty() {
            return Ok(None);
        }
        let names: Vec<String> = programs
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        codecage::exec_policy::resolve_programs(&names, &self.root, &self.path)
            .map(Some)
            .map_err(|e| Error::new(Kind::Policy, format!("the approved programs: {e}")))
    }

    fn file_of(&self, program: &str) -> Option<PathBuf> {
        codecage::exec_policy::find_program(&self.root, &self.path, program).ok()
    }
}

/// `allow-once`, `allow-always`, `deny`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Decision {
    AllowOnce,
    AllowAlways,
    Deny,
}

/// Where an `allow-always` rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// The session that asked (the default).
    #[default]
    Session,
    /// Every session of the token (or unix uid) that asked.
    Token,
    /// Every session of the profile.
    Profile,
}

impl Scope {
    fn name(self) -> &'static str {
        match self {
            Scope::Session => "session",
            Scope::Token => "token",
            Scope::Profile => "profile",
        }
    }
}

/// `POST /v1/approvals/{id}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideRequest {
    pub decision: Decision,
    /// For `allow-always` (default `session`).
    #[serde(default)]
    pub scope: Option<Scope>,
}

/// What waits for the decision.
enum Waiting {
    /// A session process: started by the decision.
    Process(ProcessStart),
    /// A bash cell: runs when the caller sends it again.
    Cell,
}

/// One question.
struct Approval {
    id: String,
    session: String,
    profile: String,
    /// The asking caller's owner key (`token:NAME`, `uid:N`) and its name in records.
    owner: String,
    asked_by: String,
    asker: Caller,
    command: String,
    programs: Vec<String>,
    /// Programs not allowed, as image paths (what an `allow-always` rule names).
    missing: Vec<PathBuf>,
    unresolved: Vec<String>,
    reason: String,
    /// `process` or `cell`.
    what: &'static str,
    asked_at: SystemTime,
    asked: Instant,
    /// `pending`, `approved`, `denied`, `expired`, `started`, `failed`, `used`.
    status: &'static str,
    decision: Option<Decision>,
    decided_by: Option<String>,
    process_id: Option<u64>,
    error: Option<String>,
    rules: Vec<String>,
    waiting: Option<Waiting>,
}

/// An approval as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ApprovalView {
    pub approval_id: String,
    /// `pending`; `approved` (a cell to send again), `started` (its process runs:
    /// `process_id`), `used` (the approved cell ran), `denied`, `expired`, `failed`.
    pub status: String,
    pub session_id: String,
    pub profile: String,
    pub asked_by: String,
    /// `process` or `cell`.
    pub what: String,
    pub command: String,
    pub programs: Vec<String>,
    pub unresolved: Vec<String>,
    pub reason: String,
    /// RFC 3339.
    pub asked_at: String,
    pub decision: Option<Decision>,
    pub decided_by: Option<String>,
    pub process_id: Option<u64>,
    pub error: Option<String>,
    /// The rules an `allow-always` added.
    pub rules: Vec<String>,
}

/// A standing approval.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RuleView {
    pub rule_id: String,
    /// `session`, `token` or `profile`.
    pub scope: String,
    /// The session id, owner key or profile name it applies to.
    pub applies_to: String,
    /// The program's path in the image (any arguments), or null for a command rule.
    pub program: Option<String>,
    /// The exact command line, for a command the parse could not judge.
    pub command: Option<String>,
    pub created_at: String,
    pub created_by: String,
    pub approval_id: String,
}

/// The questions (in memory) and the rules (SQLite).
pub struct Approvals {
    pending: Mutex<HashMap<String, Approval>>,
    rules: Mutex<Connection>,
    /// Questions that expired and whose session has not been told yet (the server's
    /// reaper tells them: [`announce_expired`]).
    expired: Mutex<Vec<(Caller, String, serde_json::Value)>>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS rules (
    id TEXT PRIMARY KEY,
    scope TEXT NOT NULL,
    applies_to TEXT NOT NULL,
    program TEXT,
    command TEXT,
    created_at INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    approval_id TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rules_scope ON rules (scope, applies_to);
";

impl Approvals {
    /// The rules in `dir`/approvals.db, or in memory without a directory.
    pub fn open(dir: Option<&Path>) -> Result<Approvals, String> {
        let conn = match dir {
            Some(dir) => {
                let path = dir.join("approvals.db");
                let conn = Connection::open(&path)
                    .map_err(|e| format!("approvals database {}: {e}", path.display()))?;
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| format!("approvals database {}: {e}", path.display()))?;
                conn
            }
            None => Connection::open_in_memory().map_err(|e| e.to_string())?,
        };
        conn.busy_timeout(Duration::from_secs(10))
            .and_then(|_| conn.execute_batch(SCHEMA))
            .map_err(|e| format!("approvals database: {e}"))?;
        Ok(Approvals {
            expired: Mutex::default(),
            pending: Mutex::new(HashMap::new()),
            rules: Mutex::new(conn),
        })
    }

    fn rules(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn questions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Approval>> {
        let mut map = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        // Questions past their time are denied; decided ones are forgotten after a day.
        for a in map.values_mut() {
            if a.status == "pending" && a.asked.elapsed() > APPROVAL_TIMEOUT {
                a.status = "expired";
                a.waiting = None;
                let note = denied_note(a, "expired", "not decided in time: taken as denied");
                self.expired
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((a.asker.clone(), a.session.clone(), note));
            }
        }
        map.retain(|_, a| a.status == "pending" || a.asked.elapsed() < Duration::from_secs(86_400));
        map
    }

    /// Whether a rule lets `program` (an image path) or `command` run for this session.
    fn matches(
        &self,
        entry: &Entry,
        program: Option<&Path>,
        command: Option<&str>,
    ) -> Option<String> {
        let conn = self.rules();
        let mut stmt = conn
            .prepare_cached(
                "SELECT id FROM rules WHERE ((scope = 'session' AND applies_to = ?1) OR (scope = 'token' AND \
                 applies_to = ?2) OR (scope = 'profile' AND applies_to = ?3)) AND (program IS ?4 AND command IS ?5) \
                 LIMIT 1",
            )
            .ok()?;
        stmt.query_row(
            params![
                entry.id,
                entry.owner,
                entry.profile,
                program.map(|p| p.to_string_lossy().into_owned()),
                command
            ],
            |r| r.get::<_, String>(0),
        )
        .ok()
    }
}

/// What `command` (or `argv`, quoted) would start, parsed as bash.
fn analysis_of(command: &str, argv: Option<&[String]>) -> exec_ask::Analysis {
    match argv {
        Some(argv) => exec_ask::analyze(
            &argv
                .iter()
                .map(|a| shell_quote(a))
                .collect::<Vec<_>>()
                .join(" "),
        ),
        None => exec_ask::analyze(command),
    }
}

/// A command judged against the profile's lists and argument rules, and the standing
/// rules `rule_for` finds for a program's file (its id).
struct Judgement {
    /// Why a person must approve it; None: it runs.
    reason: Option<String>,
    /// The files neither the profile nor a rule allows (or allows with these arguments).
    missing: Vec<PathBuf>,
    /// The files beyond the profile's list that rules allow: the payload's own ruleset.
    ruled: Vec<PathBuf>,
    /// The standing rules that let something through, for the audit record.
    matched: Vec<String>,
}

fn judge(
    gate: &AskGate,
    analysis: &exec_ask::Analysis,
    rule_for: impl Fn(&std::path::Path) -> Option<String>,
) -> Judgement {
    let mut missing = Vec::new();
    let mut ruled = Vec::new();
    let mut matched: Vec<String> = Vec::new();
    // Argument rules: a program used outside its rule asks, unless a standing rule
    // allows the program with any arguments.
    let mut violations = Vec::new();
    for invocation in &analysis.programs {
        let Some(file) = gate.file_of(&invocation.program) else {
            continue;
        };
        let Some((_, rule)) = gate.arg_rules.iter().find(|(f, _)| *f == file) else {
            continue;
        };
        if let Err(why) = rule.check(&invocation.program, invocation.args.as_deref()) {
            match rule_for(&file) {
                Some(rule) => {
                    if !matched.contains(&rule) {
                        matched.push(rule);
                    }
                }
                None => {
                    violations.push(why);
                    if !missing.contains(&file) {
                        missing.push(file);
                    }
                }
            }
        }
    }
    let reason = {
        let mut allowed = |name: &str| match gate.file_of(name) {
            Some(file) if gate.allowed.contains(&file) => true,
            Some(file) => match rule_for(&file) {
                Some(rule) => {
                    if !ruled.contains(&file) {
                        ruled.push(file);
                    }
                    if !matched.contains(&rule) {
                        matched.push(rule);
                    }
                    true
                }
                None => {
                    if !missing.contains(&file) {
                        missing.push(file);
                    }
                    false
                }
            },
            None => false,
        };
        exec_ask::needs_approval(gate.mode, analysis, &mut allowed, &violations)
    };
    Judgement {
        reason,
        missing,
        ruled,
        matched,
    }
}

/// Whether the command may run now: Ok, or the `approval_pending` answer (or a refusal).
/// `command` is the shell text (a process's `bash -c` line, a cell's code); `argv` a
/// process started without a shell.
pub async fn gate(
    state: &Shared,
    caller: &Caller,
    via: Via,
    entry: &Arc<Entry>,
    command: &str,
    argv: Option<&[String]>,
    waiting: Option<ProcessStart>,
) -> Result<Option<ExecAllowlist>, Error> {
    let Some(gate) = entry.caps.ask.clone() else {
        return Ok(None);
    };
    let analysis = analysis_of(command, argv);
    let is_cell = waiting.is_none();
    // A cell approved once runs when sent again.
    if is_cell {
        let mut map = state.approvals.questions();
        if let Some(a) = map.values_mut().find(|a| {
            a.status == "approved"
                && a.session == entry.id
                && a.command == command
                && matches!(a.waiting, Some(Waiting::Cell))
        }) {
            a.status = "used";
            a.waiting = None;
            return Ok(None);
        }
    }
    let approvals = &state.approvals;
    let command_rule = approvals.matches(entry, None, Some(command));
    let Judgement {
        reason,
        missing,
        ruled,
        mut matched,
    } = judge(&gate, &analysis, |file| {
        approvals.matches(entry, Some(file), None)
    });
    // A rule for this exact command (one the parse could not judge) lets it run; the
    // program rules added with it give its payload their files.
    if let (Some(_), Some(rule)) = (&reason, &command_rule) {
        matched.push(rule.clone());
    }
    let reason = reason.filter(|_| command_rule.is_none());
    let Some(reason) = reason else {
        if !matched.is_empty() {
            record_rule(state, via, caller, entry, command, &analysis, &matched).await;
        }
        return gate.extra(&ruled);
    };
    let id = new_id()?;
    let approval = Approval {
        id: id.clone(),
        session: entry.id.clone(),
        profile: entry.profile.clone(),
        owner: caller.owner(),
        asked_by: caller.to_string(),
        asker: caller.clone(),
        command: command.to_string(),
        programs: analysis.program_names(),
        missing,
        unresolved: analysis.unresolved.clone(),
        reason: reason.clone(),
        what: if is_cell { "cell" } else { "process" },
        asked_at: SystemTime::now(),
        asked: Instant::now(),
        status: "pending",
        decision: None,
        decided_by: None,
        process_id: None,
        error: None,
        rules: Vec::new(),
        waiting: Some(match waiting {
            Some(start) => Waiting::Process(start),
            None => Waiting::Cell,
        }),
    };
    let view = view_of(&approval);
    record(
        state,
        via,
        caller.to_string(),
        &view,
        approval.asked,
        "asked",
        None,
    )
    .await;
    approvals.questions().insert(id.clone(), approval);
    tracing::info!(caller = %caller, session = %entry.id, approval = %id, "exec approval asked");
    let mut body = serde_json::to_value(&view).unwrap_or_default();
    body["status"] = "approval_pending".into();
    let mut error = Error::new(
        Kind::ApprovalPending,
        format!(
            "the command waits for a person's approval (approval {id}): {reason}. An administrator decides with \
             `codecage approvals allow {id}` (or POST /v1/approvals/{id}); {}",
            if is_cell {
                "once approved, send the same code again"
            } else {
                "once approved it starts: GET /v1/approvals/{id} gives its process_id"
            }
        ),
    );
    error.pending = Some(Box::new(body));
    Err(error.audited())
}

/// `arg` as one bash word.
fn shell_quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', "'\\''"))
}

fn view_of(a: &Approval) -> ApprovalView {
    ApprovalView {
        approval_id: a.id.clone(),
        status: a.status.to_string(),
        session_id: a.session.clone(),
        profile: a.profile.clone(),
        asked_by: a.asked_by.clone(),
        what: a.what.into(),
        command: a.command.clone(),
        programs: a.programs.clone(),
        unresolved: a.unresolved.clone(),
        reason: a.reason.clone(),
        asked_at: crate::audit::time::show(crate::audit::time::millis(a.asked_at)),
        decision: a.decision,
        decided_by: a.decided_by.clone(),
        process_id: a.process_id,
        error: a.error.clone(),
        rules: a.rules.clone(),
    }
}

/// An audit record of a question or a decision (`event`), by `caller`.
async fn record(
    state: &Shared,
    via: Via,
    caller: String,
    a: &ApprovalView,
    asked: Instant,
    event: &str,
    scope: Option<Scope>,
) {
    let Some(audit) = &state.audit else {
        return;
    };
    let mut start = Start::new(AuditKind::Approval, via, caller);
    start.session = Some(a.session_id.clone());
    start.profile = Some(a.profile.clone());
    start.code = Some(a.command.clone());
    start.details = json!({
        "approval_id": a.approval_id,
        "event": event,
        "asked_by": a.asked_by,
        "what": a.what,
        "programs": a.programs,
        "unresolved": a.unresolved,
        "reason": a.reason,
        "scope": scope.map(Scope::name),
        "rules": a.rules,
        "waited_ms": asked.elapsed().as_millis() as u64,
    });
    let end = End {
        duration: Some(asked.elapsed()),
        ..End::default()
    };
    if let Err(e) = audit.refusal(start, end).await {
        tracing::warn!("the approval's audit record was not taken: {e}");
    }
}

/// A command a standing rule let run without asking: an audit record of kind `approval`,
/// event `rule`, naming the rules that matched.
async fn record_rule(
    state: &Shared,
    via: Via,
    caller: &Caller,
    entry: &Entry,
    command: &str,
    analysis: &exec_ask::Analysis,
    rules: &[String],
) {
    let Some(audit) = &state.audit else {
        return;
    };
    let mut start = Start::new(AuditKind::Approval, via, caller.to_string());
    start.session = Some(entry.id.clone());
    start.profile = Some(entry.profile.clone());
    start.code = Some(command.to_string());
    start.details = json!({
        "event": "rule",
        "programs": analysis.program_names(),
        "unresolved": analysis.unresolved,
        "rules": rules,
    });
    if let Err(e) = audit.refusal(start, End::default()).await {
        tracing::warn!("the approval rule's audit record was not taken: {e}");
    }
}

/// The questions `caller` may see: all for an administrator, else those it asked.
pub fn list(state: &Shared, caller: &Caller, all: bool) -> Vec<ApprovalView> {
    let map = state.approvals.questions();
    let mut views: Vec<(SystemTime, ApprovalView)> = map
        .values()
        .filter(|a| caller.is_admin() || a.owner == caller.owner())
        .filter(|a| all || a.status == "pending")
        .map(|a| (a.asked_at, view_of(a)))
        .collect();
    views.sort_by_key(|v| v.0);
    views.into_iter().map(|v| v.1).collect()
}

pub fn show(state: &Shared, caller: &Caller, id: &str) -> Result<ApprovalView, Error> {
    let map = state.approvals.questions();
    map.get(id)
        .filter(|a| caller.is_admin() || a.owner == caller.owner())
        .map(view_of)
        .ok_or_else(|| Error::new(Kind::NotFound, format!("no approval {id}")))
}

/// A person's decision on question `id`.
pub async fn decide(
    state: &Shared,
    caller: &Caller,
    via: Via,
    id: &str,
    body: DecideRequest,
) -> Result<ApprovalView, Error> {
    if !caller.is_admin() {
        return Err(Error::new(
            Kind::Forbidden,
            "approvals are decided by an administrator (a token with the admin role, or root on the unix socket)",
        ));
    }
    let scope = match (body.decision, body.scope) {
        (Decision::AllowAlways, scope) => Some(scope.unwrap_or_default()),
        (_, None) => None,
        (_, Some(_)) => {
            return Err(
                Error::invalid("field `scope`: only with decision allow-always").on("scope"),
            )
        }
    };
    let (snapshot, asked, start, asker, session) = {
        let mut map = state.approvals.questions();
        let a = map
            .get_mut(id)
            .filter(|a| caller.is_admin() || a.owner == caller.owner())
            .ok_or_else(|| Error::new(Kind::NotFound, format!("no approval {id}")))?;
        if a.asked_by == caller.to_string() {
            return Err(Error::new(
                Kind::Forbidden,
                format!("approval {id} was asked by {}: the caller that asked cannot approve its own command", a.asked_by),
            ));
        }
        if a.status != "pending" {
            return Err(Error::new(
                Kind::Policy,
                format!("approval {id} is {} already: nothing to decide", a.status),
            ));
        }
        a.decision = Some(body.decision);
        a.decided_by = Some(caller.to_string());
        let waiting = a.waiting.take();
        match body.decision {
            Decision::Deny => a.status = "denied",
            _ => {
                if let Some(scope) = scope {
                    let applies_to = match scope {
                        Scope::Session => a.session.clone(),
                        Scope::Token => a.owner.clone(),
                        Scope::Profile => a.profile.clone(),
                    };
                    let mut targets: Vec<(Option<String>, Option<String>)> = a
                        .missing
                        .iter()
                        .map(|p| (Some(p.to_string_lossy().into_owned()), None))
                        .collect();
                    if !a.unresolved.is_empty() || targets.is_empty() {
                        targets.push((None, Some(a.command.clone())));
                    }
                    let conn = state.approvals.rules();
                    for (program, command) in targets {
                        let rule = new_id()?;
                        conn.execute(
                            "INSERT INTO rules (id, scope, applies_to, program, command, created_at, created_by, approval_id) \
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                            params![
                                rule,
                                scope.name(),
                                applies_to,
                                program,
                                command,
                                crate::audit::time::millis(SystemTime::now()),
                                caller.to_string(),
                                a.id
                            ],
                        )
                        .map_err(|e| Error::new(Kind::Setup, format!("approvals database: {e}")))?;
                        a.rules.push(rule);
                    }
                }
                if let Some(Waiting::Cell) = waiting {
                    a.waiting = Some(Waiting::Cell);
                }
                a.status = "approved";
            }
        }
        let start = match (&a.waiting, waiting) {
            (None, Some(Waiting::Process(start))) if body.decision != Decision::Deny => Some(start),
            _ => None,
        };
        // The approved process's own ruleset: the allowlist plus what was approved.
        let start = match (start, entry_gate(state, &a.asker, &a.session)) {
            (Some(mut start), Some(gate)) => match gate.extra(&a.missing) {
                Ok(extra) => {
                    start.exec_extra = extra;
                    Some(start)
                }
                Err(e) => {
                    a.status = "failed";
                    a.error = Some(e.message);
                    None
                }
            },
            (start, _) => start,
        };
        (
            view_of(a),
            a.asked,
            start,
            a.asker.clone(),
            a.session.clone(),
        )
    };
    let event = match body.decision {
        Decision::AllowOnce => "allow-once",
        Decision::AllowAlways => "allow-always",
        Decision::Deny => "deny",
    };
    record(
        state,
        via,
        caller.to_string(),
        &snapshot,
        asked,
        event,
        scope,
    )
    .await;
    tracing::info!(caller = %caller, approval = %id, decision = event, "exec approval decided");
    if body.decision == Decision::Deny {
        let note = {
            let map = state.approvals.questions();
            map.get(id)
                .map(|a| denied_note(a, "denied", &format!("denied by {caller}")))
        };
        if let Some(note) = note {
            announce(state, &asker, &session, note);
        }
    }
    let started = start.is_some();
    if let Some(start) = start {
        // The process starts as the caller that asked would have started it.
        let deadline = Instant::now() + START_PATIENCE;
        let result = loop {
            let start = start.clone();
            match super::with_session(state, &asker, &session, move |s, _| s.start_process(&start))
                .await
            {
                Err(e) if e.kind == Kind::Busy && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => break other,
            }
        };
        let mut map = state.approvals.questions();
        if let Some(a) = map.get_mut(id) {
            match result {
                Ok(process) => {
                    a.status = "started";
                    a.process_id = Some(process);
                }
                Err(e) => {
                    a.status = "failed";
                    a.error = Some(e.message);
                }
            }
        }
    }
    if body.decision != Decision::Deny {
        let (note, process) = {
            let map = state.approvals.questions();
            match map.get(id) {
                Some(a) => (
                    Some(serde_json::json!({
                        "type": "approval_finished",
                        "approval_id": a.id,
                        "decision": event,
                        "status": a.status,
                        "command": a.command,
                        "process_id": a.process_id,
                        "error": a.error,
                    })),
                    a.process_id.filter(|_| started),
                ),
                None => (None, None),
            }
        };
        if let Some(note) = note {
            announce(state, &asker, &session, note);
        }
        if let Some(process) = process {
            running_notice(state.clone(), asker, session, id.to_string(), process);
        }
    }
    show(state, caller, id)
}

/// A one-shot run's command (bash code, or a program's argv) judged by its profile's
/// `ask`: a run cannot wait for a person, so one that would ask is refused (403 `policy`)
/// with the reason, and the caller is pointed at a session, where it can be approved.
/// Judged against the profile's `allowed` and argument rules; standing rules (which
/// belong to sessions, tokens and profiles of sessions) are not consulted.
pub fn judge_run(gate: &AskGate, command: &str, argv: Option<&[String]>) -> Result<(), Error> {
    let analysis = analysis_of(command, argv);
    // No session, no standing rule: the profile's lists and argument rules alone.
    match judge(gate, &analysis, |_| None).reason {
        None => Ok(()),
        Some(reason) => Err(Error::new(
            Kind::Policy,
            format!(
                "the profile asks a person before this command runs (exec.ask = {}: {reason}), \
                 and a one-shot run cannot wait for an approval: run it in a session \
                 (POST /v1/sessions, then POST /v1/sessions/{{id}}/processes), where it can be approved",
                gate.mode.name()
            ),
        )),
    }
}

/// How long an approved command runs before the session's event stream says that it
/// still runs (seed 004's `approval_running_notice`, 10 s).
pub const APPROVAL_RUNNING_NOTICE: Duration = Duration::from_secs(10);

/// An `exec_denied` note of approval `a` (denied by a person, or expired).
fn denied_note(a: &Approval, status: &str, reason: &str) -> serde_json::Value {
    serde_json::json!({
        "type": "exec_denied",
        "approval_id": a.id,
        "status": status,
        "command": a.command,
        "programs": a.programs,
        "reason": reason,
    })
}

/// Tells session `session` (its event stream) what became of one of its questions; a
/// session closed meanwhile has no one to tell.
fn announce(state: &Shared, asker: &Caller, session: &str, note: serde_json::Value) {
    if let Ok(entry) = super::lookup(state, asker, session) {
        entry.processes.note(note);
    }
}

/// After [`APPROVAL_RUNNING_NOTICE`], an `approval_running` note if the approved process
/// still runs.
fn running_notice(state: Shared, asker: Caller, session: String, approval: String, process: u64) {
    tokio::spawn(async move {
        tokio::time::sleep(APPROVAL_RUNNING_NOTICE).await;
        let Ok(entry) = super::lookup(&state, &asker, &session) else {
            return;
        };
        let running = entry
            .processes
            .poll(process, u64::MAX, u64::MAX)
            .is_some_and(|p| p.status == codecage::processes::Status::Running);
        if running {
            entry.processes.note(serde_json::json!({
                "type": "approval_running",
                "approval_id": approval,
                "process_id": process,
                "running_for_ms": APPROVAL_RUNNING_NOTICE.as_millis() as u64,
            }));
        }
    });
}

/// Tells the sessions whose questions expired (denied by no one in time); the server's
/// reaper calls it every second.
pub fn announce_expired(state: &Shared) {
    drop(state.approvals.questions());
    let expired = std::mem::take(
        &mut *state
            .approvals
            .expired
            .lock()
            .unwrap_or_else(|e| e.into_inner()),
    );
    for (asker, session, note) in expired {
        announce(state, &asker, &session, note);
    }
}

fn admin_only(caller: &Caller) -> Result<(), Error> {
    if caller.is_admin() {
        Ok(())
    } else {
        Err(Error::new(
            Kind::Forbidden,
            "the approval rules are for administrators (a token with the admin role, or root on the unix socket)",
        ))
    }
}

/// The standing rules, oldest first.
pub fn rules(state: &Shared, caller: &Caller) -> Result<Vec<RuleView>, Error> {
    admin_only(caller)?;
    let conn = state.approvals.rules();
    let read = || -> rusqlite::Result<Vec<RuleView>> {
        let mut stmt = conn.prepare(
            "SELECT id, scope, applies_to, program, command, created_at, created_by, approval_id FROM rules \
             ORDER BY created_at, id",
        )?;
        let rows = stmt.query_map([], |r| {
            let at: i64 = r.get(5)?;
            Ok(RuleView {
                rule_id: r.get(0)?,
                scope: r.get(1)?,
                applies_to: r.get(2)?,
                program: r.get(3)?,
                command: r.get(4)?,
                created_at: crate::audit::time::show(at),
                created_by: r.get(6)?,
                approval_id: r.get(7)?,
            })
        })?;
        rows.collect()
    };
    read().map_err(|e| Error::new(Kind::Setup, format!("approvals database: {e}")))
}

/// Removes rule `id`: the next command is judged without it.
pub async fn revoke(
    state: &Shared,
    caller: &Caller,
    via: Via,
    id: &str,
) -> Result<RuleView, Error> {
    let rule = rules(state, caller)?
        .into_iter()
        .find(|r| r.rule_id == id)
        .ok_or_else(|| Error::new(Kind::NotFound, format!("no approval rule {id}")))?;
    state
        .approvals
        .rules()
        .execute("DELETE FROM rules WHERE id = ?1", params![id])
        .map_err(|e| Error::new(Kind::Setup, format!("approvals database: {e}")))?;
    if let Some(audit) = &state.audit {
        let mut start = Start::new(AuditKind::Approval, via, caller.to_string());
        start.code = rule.command.clone().or_else(|| rule.program.clone());
        start.details = json!({
            "event": "revoke",
            "rule_id": rule.rule_id,
            "approval_id": rule.approval_id,
            "scope": rule.scope,
            "applies_to": rule.applies_to,
            "program": rule.program,
        });
        if let Err(e) = audit.refusal(start, End::default()).await {
            tracing::warn!("the revocation's audit record was not taken: {e}");
        }
    }
    tracing::info!(caller = %caller, rule = %id, "exec approval rule revoked");
    Ok(rule)
}

/// The ask gate of session `id`, if it is still there.
fn entry_gate(state: &Shared, asker: &Caller, id: &str) -> Option<Arc<AskGate>> {
    super::lookup(state, asker, id).ok()?.caps.ask.clone()
}

/// The gate of a session whose profile asks: the allowed programs as image files.
pub fn gate_of(
    profile: &codecage::profile::Profile,
    sandbox: &codecage::SandboxSpec,
    env: &[(String, String)],
) -> Option<Arc<AskGate>> {
    use codecage::exec_policy::ExecSecurity;
    if profile.exec.ask == Ask::Off || profile.exec.security == ExecSecurity::Deny {
        return None;
    }
    let root = codecage::profile::rootfs_dir(&sandbox.rootfs);
    let path = env.iter().find(|(k, _)| k == "PATH").map_or_else(
        || codecage::spec::SANDBOX_PATH.to_string(),
        |(_, v)| v.clone(),
    );
    let allowed = match &sandbox.exec {
        Some(allowlist) => allowlist.programs.clone(),
        None => {
            let denied = exec_ask::resolve_names(&root, &path, &profile.exec.denied);
            exec_ask::resolve_names(&root, &path, &profile.exec.allowed)
                .into_iter()
                .filter(|p| !denied.contains(p))
                .collect()
        }
    };
    let arg_rules = profile
        .exec
        .args
        .iter()
        .filter_map(|(name, rule)| {
            codecage::exec_policy::find_program(&root, &path, name)
                .ok()
                .map(|file| (file, rule.clone()))
        })
        .collect();
    Some(Arc::new(AskGate {
        arg_rules,
        kernel: sandbox.exec.is_some(),
        mode: profile.exec.ask,
        root,
        path,
        allowed,
    }))
}
