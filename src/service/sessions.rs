//! Sessions: opened within the caller's quotas and ceilings, owned by their caller (only
//! it and admins see or use them), called, reset, interrupted and closed, with their
//! files; each step recorded in the audit log.

use std::sync::Arc;
use std::time::Duration;

use codecage::knobs::{Knob, Raw};
use codecage::outcome::ErrorKind;
use codecage::profile::{self, Profile, Request as PolicyRequest};
use codecage::runner::Lang;
use codecage::session::{Call, CallOutcome, Event, Session, SessionSpec};

use tokio_util::sync::CancellationToken;

use super::cluster;
use super::tenancy::new_id;
use super::{
    audit_slot, code_within, knobs_of, load_profile, log_call, network_allowed, refused, room,
    Caller, Error, Kind, SessionRequest,
};
use crate::audit::{self, End, Kind as AuditKind, Start, Via};
use crate::server::registry::{self, Caps, Entry, Missing};
use crate::server::Shared;

/// Starts a session and registers it (`POST /v1/sessions`; MCP's sessions). Its audit
/// record runs from here to its close.
pub async fn open_session(
    state: &Shared,
    caller: &Caller,
    via: Via,
    body: SessionRequest,
) -> Result<Arc<Entry>, Error> {
    let mut start = Start::new(AuditKind::Session, via, caller.to_string());
    start.language = Some(body.language.name().to_string());
    start.profile = body.profile.clone();
    let language = body.language;
    let route = body.route.clone();
    let (session_spec, caps, lifetimes, profile_name) = match resolve_session(state, caller, body) {
        Ok(resolved) => resolved,
        Err(e) => return Err(refused(state, start, e).await),
    };
    start.profile = Some(profile_name.clone());
    let max_sessions = caller.max_sessions(&state.config);
    let quota = match state.sessions.admit(caller, max_sessions) {
        Ok(ticket) => ticket,
        Err(e) => return Err(refused(state, start, e).await),
    };
    let session_permit = match room(&state.session_slots, state, "sessions").await {
        Ok(permit) => permit,
        Err(e) => return Err(refused(state, start, e).await),
    };
    let slot = audit_slot(state).await?;
    let id = match new_id()
        .and_then(|local| cluster::session_id(&state.config.cluster, route.as_deref(), local))
    {
        Ok(id) => id,
        Err(e) => return Err(refused(state, start, e).await),
    };
    start.session = Some(id.clone());
    let (pooled, sandbox_permit) = match state.pool.take_session(&profile_name, &session_spec) {
        Some(pooled) => (Some(pooled.item), pooled.permit),
        None => match room(&state.sandboxes, state, "sandboxes").await {
            Ok(permit) => (None, permit),
            Err(e) => return Err(refused(state, start, e).await),
        },
    };
    let started = tokio::task::spawn_blocking(move || {
        let warm = pooled.is_some();
        let pending = slot.map(|slot| {
            let mut start = start.spec(&session_spec.sandbox, None);
            start.details = serde_json::json!({ "warm": warm });
            slot.begin(start)
        });
        let session = match pooled {
            Some(session) => match session.handed_over() {
                Ok(()) => Ok(session),
                Err(e) => {
                    let _ = session.close();
                    Err(e)
                }
            },
            None => Session::start(session_spec),
        };
        match session {
            Ok(session) => Ok((session, pending)),
            Err(e) => {
                if let Some(pending) = pending {
                    pending.finish(End::error(&audit::error_name(e.kind), &e.message));
                }
                Err(e)
            }
        }
    })
    .await
    .map_err(|e| Error::new(Kind::Setup, e.to_string()))?;
    let (session, pending) = started.map_err(|e| {
        let kind = if e.kind == ErrorKind::InvalidRequest {
            Kind::InvalidRequest
        } else {
            Kind::Setup
        };
        Error::new(kind, e.message).audited()
    })?;
    let (idle, max) = lifetimes;
    let entry = Entry::new(
        id,
        caller.owner(),
        quota,
        profile_name,
        session,
        idle,
        max,
        caps,
        (session_permit, sandbox_permit),
    );
    *entry.audit.lock().unwrap_or_else(|e| e.into_inner()) = pending;
    let entry = state.sessions.insert(entry);
    tracing::info!(caller = %caller, session = %entry.id, language = language.name(), "session created");
    Ok(entry)
}

/// A session's request checked and resolved: its spec, caps, lifetimes (idle, maximum)
/// and profile name.
fn resolve_session(
    state: &Shared,
    caller: &Caller,
    body: SessionRequest,
) -> Result<(SessionSpec, Caps, (Duration, Duration), String), Error> {
    let mut knobs = knobs_of(&body.limits())?;
    let profile_name = body
        .profile
        .clone()
        .unwrap_or_else(|| body.language.name().to_string());
    caller.check_profile(&state.config, &profile_name)?;
    let profile = load_profile(state, &profile_name)?;
    caller.within_ceilings(&state.config, &profile, &mut knobs)?;
    let request = PolicyRequest {
        knobs,
        env: body.env.into_iter().collect(),
        network: body.network,
        ..PolicyRequest::default()
    };
    let session_spec = session_spec_of(
        &profile,
        &profile_name,
        body.language,
        &request,
        &state.data_dir,
    )?;
    network_allowed(state, session_spec.sandbox.network.mode)?;
    let caps = Caps {
        ask: super::approvals::gate_of(&profile, &session_spec.sandbox, &session_spec.env),
        input_files: profile.value(Knob::InputFiles),
        input_total: profile.value(Knob::InputTotalSize),
        read_max: profile.value(Knob::OutputFileSize),
        output_dir: profile.output_rules().dir,
        exec_denied: profile.exec.security == codecage::exec_policy::ExecSecurity::Deny,
        process_buffer: profile.value(Knob::ProcessBuffer) as usize,
        max_timeout: Duration::from_millis(
            caller
                .ceiling(&state.config, Knob::Timeout)
                .map_or(profile.max(Knob::Timeout), |c| {
                    c.min(profile.max(Knob::Timeout))
                }),
        ),
    };
    let idle = Duration::from_millis(profile.value(Knob::IdleTimeout));
    let max = Duration::from_millis(profile.value(Knob::MaxDuration));
    Ok((session_spec, caps, (idle, max), profile_name))
}

/// A session's spec: the profile resolved with `request` (its limits, env and network) as
/// a run of the language's driver would be.
pub fn session_spec_of(
    profile: &Profile,
    name: &str,
    lang: Lang,
    request: &PolicyRequest,
    data: &codecage::profile::DataDir,
) -> Result<SessionSpec, Error> {
    let request = PolicyRequest {
        argv: Some(vec!["true".into()]),
        ..request.clone()
    };
    if profile.exec.security == codecage::exec_policy::ExecSecurity::Deny && lang == Lang::Bash {
        return Err(Error::new(
            Kind::Policy,
            codecage::exec_policy::denied(name, "a bash session"),
        )
        .on("exec"));
    }
    let spec = profile::resolve(profile, name, &request, data)?;
    let mut context_exec = Vec::new();
    if let Some(allowlist) = &spec.sandbox.exec {
        // The driver's interpreter must be allowed, as a run's is, or allowed to its own
        // context (`interpreter = "context"`): then each context's driver gets a ruleset
        // of its own, for the session's language and for any other context the image can
        // start (E2B's contexts), and the session's processes get none.
        let own = codecage::session::context_of(lang);
        for context in [Lang::Python, Lang::Node, Lang::Bash] {
            let program = codecage::session::driver_program(context);
            match profile::interpreter_ruleset(profile, &spec, allowlist, program) {
                Ok(Some(extra)) => context_exec.push((context, extra)),
                Ok(None) => {}
                Err(e) if context == own => {
                    return Err(profile::exec_error(
                        name,
                        format!("the {} session's interpreter: {e}", lang.name()),
                    )
                    .into())
                }
                // Another context this image or allowlist cannot start: it fails if asked for.
                Err(_) => {}
            }
        }
    }
    Ok(SessionSpec {
        sandbox: spec.sandbox,
        lang,
        context_exec,
        env: spec.exec.env,
        timeout: spec.exec.timeout,
        output_limit: spec.exec.output_limit,
        outputs: Some(profile.output_rules()),
    })
}

/// The session `id`, if `caller` may see it (its owner, or an admin); to anyone else
/// 404, as for a session that never was.
pub fn lookup(state: &Shared, caller: &Caller, id: &str) -> Result<Arc<Entry>, Error> {
    state
        .sessions
        .get(id, caller)
        .map_err(|missing| match missing {
            Missing::Expired => Error::new(
                Kind::SessionExpired,
                format!(
                "session {id} expired (idle or maximum lifetime) and was closed: create a new one"
            ),
            ),
            Missing::Unknown => {
                cluster::lost_elsewhere(&state.config.cluster, id).unwrap_or_else(|| {
                    Error::new(
                        Kind::NotFound,
                        format!("there is no session {id}: create a new one"),
                    )
                })
            }
        })
}

/// The sessions `caller` may see: its own (every one for an admin), oldest first.
pub fn list_sessions(state: &Shared, caller: &Caller) -> Vec<Arc<Entry>> {
    state.sessions.list_for(caller)
}

/// Interrupts the session's running call, if any.
pub fn interrupt_session(state: &Shared, caller: &Caller, id: &str) -> Result<(), Error> {
    lookup(state, caller, id)?.interrupter.interrupt();
    Ok(())
}

pub fn busy(id: &str) -> Error {
    Error::new(
        Kind::Busy,
        format!("session {id} is running a call: wait for it, or interrupt it"),
    )
}

/// Closes a session (its sandbox and everything in it).
pub async fn close_session(
    state: &Shared,
    caller: &Caller,
    via: Via,
    id: &str,
) -> Result<(), Error> {
    lookup(state, caller, id)?;
    if let Some(entry) = state.sessions.remove(id, false) {
        let why = format!("closed by {caller} ({})", via.name());
        tokio::task::spawn_blocking(move || registry::close(&entry, &why))
            .await
            .map_err(|e| Error::new(Kind::Setup, e.to_string()))?;
        tracing::info!(caller = %caller, session = %id, "session closed");
    }
    Ok(())
}

/// A call's own time limit, from a request field.
/// A call's `language` (the context it runs in), checked: None means the session's own.
pub fn language_of(text: Option<&str>) -> Result<Option<Lang>, Error> {
    text.map(|text| {
        text.parse::<Lang>()
            .map_err(|e| Error::invalid(format!("field `language`: {e}")).on("language"))
    })
    .transpose()
}

pub fn timeout_of(raw: Option<&Raw>) -> Result<Option<Duration>, Error> {
    raw.map(|raw| {
        Knob::Timeout
            .from_raw(raw)
            .map(Duration::from_millis)
            .map_err(|e| Error::invalid(format!("field `timeout`: {e}")))
    })
    .transpose()
}

/// One call in a session, on a blocking thread (409 if the session is busy); `forward`
/// sees its output and displays as they come, on that thread.
pub async fn call_session(
    state: Shared,
    caller: Caller,
    via: Via,
    entry: Arc<Entry>,
    call: Call,
    forward: impl FnMut(Event) + Send + 'static,
) -> Result<CallOutcome, Error> {
    begin_call(state, caller, via, entry, call)
        .await?
        .run(forward, CancellationToken::new())
        .await
}

/// A call admitted: its policy checked, its caller's quota counted, the session claimed,
/// its audit record placed. A front end learns every refusal here, before it answers
/// anything (a stream then starts only for a call that runs).
pub struct Begun {
    state: Shared,
    caller: Caller,
    entry: Arc<Entry>,
    call: Call,
    start: Start,
    ticket: super::tenancy::RunTicket,
    claim: registry::Busy,
    slot: Option<audit::Slot>,
}

/// Checks a call and claims its session (see [`Begun`]).
pub async fn begin_call(
    state: Shared,
    caller: Caller,
    via: Via,
    entry: Arc<Entry>,
    mut call: Call,
) -> Result<Begun, Error> {
    let mut start = Start::new(AuditKind::Call, via, caller.to_string());
    let oversized = code_within(&state, call.code.len());
    start.code = Some(match oversized {
        // The audit keeps the head, sha256 and size of what was refused.
        Err(_) => std::mem::take(&mut call.code),
        Ok(()) => call.code.clone(),
    });
    start.stdin = call.stdin.as_ref().map(|s| s.clone().into_bytes());
    start.session = Some(entry.id.clone());
    start.profile = Some(entry.profile.clone());
    start.language = Some(call.lang.unwrap_or(entry.lang).name().to_string());
    if let Some(t) = call.timeout {
        start.limits = Some(serde_json::json!({"timeout_ms": t.as_millis() as u64}));
    }
    if let Err(e) = oversized {
        return Err(refused(&state, start, e).await);
    }
    if let Some(asked) = call.timeout.filter(|t| *t > entry.caps.max_timeout) {
        let e = Error::new(
            Kind::Policy,
            format!(
                "a timeout of {} is more than the session's profile {} allows (at most {}); ask for less",
                codecage::units::format_duration(asked),
                entry.profile,
                codecage::units::format_duration(entry.caps.max_timeout)
            ),
        );
        return Err(refused(&state, start, e).await);
    }
    if entry.caps.exec_denied && call.lang.unwrap_or(entry.lang) == Lang::Bash {
        let e = Error::new(
            Kind::Policy,
            codecage::exec_policy::denied(&entry.profile, "a bash context"),
        )
        .on("language");
        return Err(refused(&state, start, e).await);
    }
    if call.lang.unwrap_or(entry.lang) == Lang::Bash {
        super::approvals::gate(&state, &caller, via, &entry, &call.code, None, None).await?;
    }
    if entry.owner != caller.owner() {
        start.details = serde_json::json!({ "owner": entry.owner });
    }
    let ticket = match state.runs.admit(&caller, &state.config) {
        Ok(ticket) => ticket,
        Err(e) => return Err(refused(&state, start, e).await),
    };
    let Some(claim) = entry.claim() else {
        return Err(refused(&state, start, busy(&entry.id)).await);
    };
    let slot = audit_slot(&state).await?;
    Ok(Begun {
        state,
        caller,
        entry,
        call,
        start,
        ticket,
        claim,
        slot,
    })
}

impl Begun {
    /// Runs the call to its end; `stop` interrupts it as its timeout would (a client
    /// that went away, a cancelled MCP request).
    pub async fn run(
        self,
        mut forward: impl FnMut(Event) + Send + 'static,
        stop: CancellationToken,
    ) -> Result<CallOutcome, Error> {
        let Begun {
            state,
            caller,
            entry,
            call,
            start,
            ticket,
            claim,
            slot,
        } = self;
        let interrupter = entry.interrupter.clone();
        let lang = call.lang.unwrap_or(entry.lang);
        let watcher = tokio::spawn(async move {
            stop.cancelled().await;
            interrupter.interrupt();
        });
        let worker_entry = entry.clone();
        // As for a run: the outcome goes back first, the record is completed after, with
        // the session already free for its next call.
        let (answer, answered) = tokio::sync::oneshot::channel();
        tokio::task::spawn_blocking(move || {
            let claim = claim;
            let pending = slot.map(|slot| slot.begin(start.input_files(&call.files)));
            let mut guard = worker_entry
                .session
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let Some(session) = guard.as_mut() else {
                if let Some(pending) = pending {
                    pending.finish(End::error(
                        "not_found",
                        "the session was closed before the call ran",
                    ));
                }
                let _ = answer.send(None);
                return;
            };
            let outcome = session.execute(&call, &mut forward);
            drop(ticket);
            worker_entry
                .executions
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            drop(guard);
            drop(claim);
            match pending {
                Some(pending) => {
                    let details = serde_json::json!({
                        "execution_count": outcome.execution_count,
                        "exception": outcome.exception.as_ref().map(|e| &e.name),
                        "state": outcome.state,
                    });
                    let end = pending.end_of(&outcome.outcome).details(details);
                    let stdout = outcome.outcome.stdout.clone();
                    let stderr = outcome.outcome.stderr.clone();
                    let _ = answer.send(Some(outcome));
                    pending.finish_with_output(end, &stdout, &stderr);
                }
                None => {
                    let _ = answer.send(Some(outcome));
                }
            }
        });
        let outcome = answered.await;
        watcher.abort();
        let outcome = outcome
            .map_err(|_| Error::new(Kind::Setup, "the call's thread ended without an outcome"))?
            .ok_or_else(|| {
                lookup(&state, &caller, &entry.id)
                    .err()
                    .unwrap_or_else(|| busy(&entry.id))
            })?;
        log_call(
            &caller,
            "execute",
            Some(lang),
            Some(&entry.id),
            &outcome.outcome,
        );
        Ok(outcome)
    }
}

/// A fresh interpreter in the session's sandbox (409 if it is busy): context `lang`'s, or
/// (None) every context's, with the background processes (see `Session::reset`).
pub async fn reset_session(
    state: &Shared,
    caller: &Caller,
    via: Via,
    entry: Arc<Entry>,
    lang: Option<Lang>,
) -> Result<(), Error> {
    let mut start = Start::new(AuditKind::Reset, via, caller.to_string());
    start.session = Some(entry.id.clone());
    start.profile = Some(entry.profile.clone());
    start.language = lang.map(|l| l.name().to_string());
    let Some(claim) = entry.claim() else {
        return Err(refused(state, start, busy(&entry.id)).await);
    };
    let slot = audit_slot(state).await?;
    let result = tokio::task::spawn_blocking(move || {
        let _claim = claim;
        let pending = slot.map(|slot| slot.begin(start));
        let mut guard = entry.session.lock().unwrap_or_else(|e| e.into_inner());
        let result = match guard.as_mut() {
            Some(session) => session.reset(lang),
            None => Err("the session is closed".to_string()),
        };
        if let Some(pending) = pending {
            pending.finish(match &result {
                Ok(()) => End::default(),
                Err(e) => End::error("session_lost", e),
            });
        }
        result
    })
    .await
    .map_err(|e| Error::new(Kind::Setup, e.to_string()))?;
    result.map_err(|e| Error::new(Kind::SessionLost, e))
}

/// Runs `f` on the session (claimed: 409 while a call runs) on a blocking thread.
pub async fn with_session<T: Send + 'static>(
    state: &Shared,
    caller: &Caller,
    id: &str,
    f: impl FnOnce(&mut Session, &Entry) -> Result<T, String> + Send + 'static,
) -> Result<T, Error> {
    let entry = lookup(state, caller, id)?;
    let claim = entry.claim().ok_or_else(|| busy(id))?;
    tokio::task::spawn_blocking(move || {
        let _claim = claim;
        let mut guard = entry.session.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_mut() {
            Some(session) => f(session, &entry),
            None => Err("the session is closed".to_string()),
        }
    })
    .await
    .map_err(|e| Error::new(Kind::Setup, e.to_string()))?
    .map_err(|e| {
        if e.contains("does not exist") {
            Error::new(Kind::NotFound, e)
        } else {
            Error::invalid(e)
        }
    })
}

/// A path under /work as the API takes it: relative, or absolute under /work.
pub fn relative(path: &str) -> &str {
    match path.strip_prefix("/work") {
        Some("") => "",
        Some(rest) if rest.starts_with('/') => rest.trim_start_matches('/'),
        _ => path,
    }
}

/// Writes one file into a session's /work, within the profile's input caps (the API's
/// upload and MCP's write_file).
pub async fn write_session_file(
    state: &Shared,
    caller: &Caller,
    id: &str,
    file: codecage::files::InputFile,
) -> Result<(), Error> {
    with_session(state, caller, id, move |s, e| {
        let files = std::slice::from_ref(&file);
        codecage::files::check_inputs(files, e.caps.input_files, e.caps.input_total)?;
        s.write_files(files)
    })
    .await
}
