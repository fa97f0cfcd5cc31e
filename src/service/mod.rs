//! The service: what every front end (the HTTP API, MCP, the CLI's session commands)
//! calls, and the one place that decides. Runs and sessions (open, call, reset,
//! interrupt, close), their files; the request types; the pool, the caps, the callers'
//! quotas and ownership ([`tenancy`]), the audit record. Errors are [`Error`]s: a kind in
//! words and a message, never a status code or a flag; front ends only translate them.

pub mod approvals;
pub mod cluster;
pub mod code;
pub mod error;
pub mod fs;
pub mod keys;
pub mod processes;
pub mod request;
pub mod resolve;
pub mod runs;
pub mod sessions;
pub mod tenancy;

use std::sync::Arc;

use codecage::knobs::{Knob, Raw, Values};
use codecage::outcome::Outcome;
use codecage::profile::{self, Profile};
use codecage::runner::Lang;

use crate::audit::{self, AuditError, Start};
use crate::server::Shared;

pub use error::{Error, Kind};
pub use request::{ExecuteRequest, RunRequest, SessionRequest};
pub use runs::{format_options, run_request};
pub use sessions::{
    begin_call, call_session, close_session, interrupt_session, language_of, list_sessions, lookup,
    open_session, relative, reset_session, session_spec_of, timeout_of, with_session,
    write_session_file,
};
pub use tenancy::Caller;

/// The limits a request asks for, each parsed by its knob (the field named on error).
pub(crate) fn knobs_of(fields: &[(&'static str, &Raw)]) -> Result<Values, Error> {
    let mut values = Values::new();
    for (key, raw) in fields {
        let knob = Knob::from_key(key)
            .filter(|k| k.requestable())
            .ok_or_else(|| Error::invalid(format!("unknown field `{key}`")))?;
        let parsed = knob
            .from_raw(raw)
            .map_err(|e| Error::invalid(format!("field `{key}`: {e}")))?;
        values.insert(knob, parsed);
    }
    Ok(values)
}

/// A profile by name: built in, or in the config's `profiles_dir` (/etc/codecage/profiles).
/// Never a path: through the server, the host's administrator chooses what profiles exist.
pub fn load_profile(state: &Shared, name: &str) -> Result<Profile, Error> {
    let dir = state
        .config
        .profiles_dir
        .clone()
        .unwrap_or_else(|| profile::SYSTEM_DIR.into());
    resolve::load_profile(name, resolve::ProfileSource::installed(&dir)).map_err(Error::in_field)
}

/// Room for one more: at once if there is, else by evicting an idle pooled sandbox (the
/// pool only fills room nobody asks for), else after waiting up to the queue timeout;
/// 503 with Retry-After past it.
pub(crate) async fn room(
    semaphore: &Arc<tokio::sync::Semaphore>,
    state: &Shared,
    what: &str,
) -> Result<tokio::sync::OwnedSemaphorePermit, Error> {
    if let Ok(permit) = semaphore.clone().try_acquire_owned() {
        return Ok(permit);
    }
    if Arc::ptr_eq(semaphore, &state.sandboxes) && state.pool.evict_one() {
        // The evicted sandbox gives its permit back once it is torn down (a few ms).
    }
    let wait = state.config.limits.queue_timeout;
    match tokio::time::timeout(wait, semaphore.clone().acquire_owned()).await {
        Ok(Ok(permit)) => Ok(permit),
        _ => Err(Error::new(
            Kind::Capacity,
            format!("the server is at its limit of {what}; try again shortly"),
        )
        .retry_after(wait.as_secs())),
    }
}

pub(crate) fn log_call(
    caller: &Caller,
    kind: &str,
    lang: Option<Lang>,
    session: Option<&str>,
    outcome: &Outcome,
) {
    tracing::info!(
        caller = %caller,
        kind,
        session = session.unwrap_or("-"),
        language = lang.map_or("-", |l| l.name()),
        duration_ms = (outcome.duration.as_secs_f64() * 1000.0).round() as u64,
        error = outcome.error.map_or("-".to_string(), |e| format!("{e:?}")),
        peak_memory = outcome.peak_memory_bytes.unwrap_or(0),
        "call"
    );
}

/// The audit's refusal (`on_full = "refuse"`): 503, naming the audit.
pub(crate) fn audit_unavailable(e: AuditError) -> Error {
    Error::new(Kind::AuditUnavailable, e.to_string())
        .retry_after(1)
        .audited()
}

/// A place in the audit's queue for an execution about to start (None: no audit).
pub(crate) async fn audit_slot(state: &Shared) -> Result<Option<audit::Slot>, Error> {
    match &state.audit {
        Some(audit) => audit.slot().await.map(Some).map_err(audit_unavailable),
        None => Ok(None),
    }
}

/// Records a refusal with what the service function knew of the request.
pub(crate) async fn refused(state: &Shared, start: Start, error: Error) -> Error {
    let Some(audit) = &state.audit else {
        return error;
    };
    if error.audited {
        return error;
    }
    let (start, end) = resolve::refusal(start, &error);
    match audit.refusal(start, end).await {
        Ok(()) => error.audited(),
        Err(e) => audit_unavailable(e),
    }
}

/// Network mode `full` only where the server's config enables it: 403 otherwise.
pub(crate) fn network_allowed(state: &Shared, mode: codecage::network::Mode) -> Result<(), Error> {
    resolve::network_allowed(&state.config.network, mode)
}

/// Code (or a program's argv) over the server's `limits.max_code` is refused before it
/// goes further.
pub(crate) fn code_within(state: &Shared, size: usize) -> Result<(), Error> {
    let max = state.config.limits.max_code;
    if size as u64 > max {
        return Err(Error::new(
            Kind::PayloadTooLarge,
            format!(
                "the code is {}, more than this server takes (at most {}, its limits.max_code)",
                codecage::units::format_size(size as u64),
                codecage::units::format_size(max)
            ),
        ));
    }
    Ok(())
}
