//! One-shot runs: a request resolved against its profile, within its caller's quotas,
//! on a pooled or a new sandbox, recorded in the audit log.

use codecage::knobs::Knob;
use codecage::launcher::Teardown;
use codecage::outcome::Outcome;
use codecage::profile::Request as PolicyRequest;
use codecage::Canceller;
use tokio_util::sync::CancellationToken;

use super::{
    audit_slot, code_within, knobs_of, load_profile, log_call, refused, resolve, room, Caller,
    Error, Kind, RunRequest,
};
use crate::audit::Via;
use crate::server::Shared;

/// A run, resolved against its profile and run on a blocking thread until it ends, the
/// server shuts down or `stop` fires (a client that went away, a cancelled MCP request);
/// `sink` sees its output as it comes, on that thread (it must not wait) (`POST /v1/run`; MCP's tools without a session). Its audit record is
/// written before it starts and completed on that thread, whatever becomes of the request.
pub async fn run_request(
    state: &Shared,
    caller: &Caller,
    via: Via,
    body: RunRequest,
    stop: CancellationToken,
    mut sink: impl FnMut(codecage::Stream, &[u8]) + Send + 'static,
) -> Result<Outcome, Error> {
    let mut start = resolve::run_start(
        via,
        caller.to_string(),
        body.language,
        run_profile(&body).ok(),
    );
    start.stdin_digest = body
        .stdin
        .as_ref()
        .map(|s| (codecage::files::sha256(s.as_bytes()), s.len() as u64));
    let size = body.code.as_ref().map_or(0, String::len)
        + body
            .argv
            .as_ref()
            .map_or(0, |a| a.iter().map(|s| s.len() + 1).sum());
    if let Err(e) = code_within(state, size) {
        // Moved, not copied: the audit keeps its head, sha256 and size.
        start.code = body.code;
        start.argv = body.argv;
        return Err(refused(state, start, e).await);
    }
    start.code = body.code.clone();
    start.argv = body.argv.clone();
    let mut format = match format_options(body.format.as_ref()) {
        Ok(format) => format,
        Err(e) => return Err(refused(state, start, e).await),
    };
    if let Some(options) = format.as_mut() {
        // The code blocks' tag: the request's language unless it named one.
        options.language = options
            .language
            .take()
            .or_else(|| body.language.map(|l| l.name().to_string()));
    }
    let names_only = body.file_data == Some(false);
    let language = body.language;
    let (spec, profile_name, opened) = match resolve_run(state, caller, body) {
        Ok(resolved) => resolved,
        Err(e) => return Err(refused(state, start, e).await),
    };
    start.profile = Some(profile_name);
    let ticket = match state.runs.admit(caller, &state.config) {
        Ok(ticket) => ticket,
        Err(e) => return Err(refused(state, start, e).await),
    };
    let (pooled, permit) = match state
        .pool
        .take_run(&start.profile.clone().unwrap_or_default(), &spec)
    {
        Some(pooled) => (Some(pooled.item), pooled.permit),
        None => match room(&state.sandboxes, state, "sandboxes").await {
            Ok(permit) => (None, permit),
            Err(e) => return Err(refused(state, start, e).await),
        },
    };
    let slot = audit_slot(state).await?;
    let canceller = Canceller::new()
        .map_err(|e| Error::new(Kind::Setup, format!("cannot start the run: {e}")))?;
    let (shutdown, stopper) = (state.shutdown.clone(), canceller.clone());
    let watcher = tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = shutdown.cancelled() => {}
        }
        stopper.cancel();
    });
    // The outcome comes back as soon as the run ends; its record is completed after, on
    // the same thread (hashing a large output takes milliseconds). A pooled sandbox
    // answers as soon as its payload's end is known and is torn down after the answer;
    // its place under the sandbox cap (the permit) is given back only once it is gone.
    let (answer, answered) = tokio::sync::oneshot::channel();
    tokio::task::spawn_blocking(move || {
        let warm = pooled.is_some();
        let pending = slot.map(|slot| {
            let mut start = resolve::starting(start, &spec);
            start.details = serde_json::json!({ "warm": warm });
            slot.begin(start)
        });
        let (outcome, teardown) = match pooled {
            Some(prepared) => {
                let (outcome, teardown) = prepared.answer(&spec, &mut sink, None, Some(&canceller));
                (outcome, Some(teardown))
            }
            None => (
                codecage::run_cancellable(&spec, &mut sink, &canceller),
                None,
            ),
        };
        drop(opened);
        drop(ticket);
        let record = pending.map(|pending| {
            let end = pending.end_of(&outcome);
            let output = (outcome.stdout.clone(), outcome.stderr.clone());
            (pending, end, output)
        });
        let _ = answer.send(outcome);
        if let Some(Err(e)) = teardown.map(Teardown::finish) {
            tracing::warn!("a pooled run's sandbox was not wholly removed: {e}");
        }
        // Held here, not by the request's future: a client that goes away does not give
        // back the place of a sandbox still running.
        drop(permit);
        if let Some((pending, end, (stdout, stderr))) = record {
            pending.finish_with_output(end, &stdout, &stderr);
        }
    });
    let answered = answered.await;
    watcher.abort();
    let mut outcome = answered
        .map_err(|_| Error::new(Kind::Setup, "the run's thread ended without an outcome"))?;
    outcome.phases = None;
    // Rendered before the files lose their bytes: they are its attachments.
    if let Some(options) = &format {
        outcome.formatted = codecage::format::render(&outcome, options).ok();
    }
    if names_only {
        outcome.files.iter_mut().for_each(|f| f.data = None);
    }
    log_call(caller, "run", language, None, &outcome);
    Ok(outcome)
}

/// A request's `format`, checked: the error names the field and what it may be.
pub fn format_options(
    format: Option<&codecage::format::FormatRequest>,
) -> Result<Option<codecage::format::Options>, Error> {
    format
        .map(|f| f.options())
        .transpose()
        .map_err(|e| Error::new(Kind::InvalidRequest, format!("field `format`: {e}")))
}

/// The profile a run asks for: by name, else the language's (bash for a program).
fn run_profile(body: &RunRequest) -> Result<String, Error> {
    resolve::profile_name(body.profile.as_deref(), body.language, body.argv.is_some())
        .map_err(Error::in_field)
}

/// A run's request checked and resolved into its Spec (and the profile's name, and the
/// volumes' directories, opened, which must stay open until the sandbox has started).
fn resolve_run(
    state: &Shared,
    caller: &Caller,
    body: RunRequest,
) -> Result<(codecage::Spec, String, Vec<std::os::fd::OwnedFd>), Error> {
    let mut knobs = knobs_of(&body.limits())?;
    let profile_name = run_profile(&body)?;
    caller.check_profile(&state.config, &profile_name)?;
    let profile = load_profile(state, &profile_name)?;
    caller.within_ceilings(&state.config, &profile, &mut knobs)?;
    codecage::files::check_inputs(
        &body.files,
        profile.value(Knob::InputFiles),
        profile.value(Knob::InputTotalSize),
    )
    .map_err(|e| Error::invalid(format!("field `files`: {e}")))?;
    // What `ask` judges of a run: bash code, or a program's argv (a python or node run's
    // code is not a command, as a session's python cell is not).
    let judged = match (&body.argv, body.language.or(profile.language), &body.code) {
        (Some(argv), _, _) => Some((argv.join(" "), Some(argv.clone()))),
        (None, Some(codecage::runner::Lang::Bash), Some(code)) => Some((code.clone(), None)),
        _ => None,
    };
    let request = PolicyRequest {
        code: body.code,
        lang: body.language,
        argv: body.argv,
        knobs,
        files: body.files,
        rootfs: None,
        env: body.env.into_iter().collect(),
        network: body.network,
    };
    let mut spec = resolve::resolve_run(
        &profile,
        &profile_name,
        &request,
        &state.data_dir,
        &state.config.network,
    )?;
    spec.exec.stdin = body.stdin.map(String::into_bytes);
    if let (Some(gate), Some((command, argv))) = (
        super::approvals::gate_of(&profile, &spec.sandbox, &spec.exec.env),
        judged,
    ) {
        super::approvals::judge_run(&gate, &command, argv.as_deref())?;
    }
    // Opened now (they stay open until the sandbox has started); a spec with volumes is
    // never a pooled sandbox's, so such a run is cold.
    let (volumes, opened) = open_volumes(state, &body.volumes)?;
    spec.sandbox.volumes = volumes;
    spec.validate()
        .map_err(|e| Error::invalid(format!("field `volumes`: {e}")))?;
    Ok((spec, profile_name, opened))
}

/// A run's volumes, each opened by the server (as root) and only if it lies under the
/// config's `volume_roots`: 403 for one outside them (or for any, without roots), 400 for
/// one that is malformed or cannot be opened. The fds must stay open until the sandbox
/// has started.
fn open_volumes(
    state: &Shared,
    items: &[String],
) -> Result<(Vec<codecage::spec::Volume>, Vec<std::os::fd::OwnedFd>), Error> {
    let roots = &state.config.volume_roots;
    let policy = |m: String| Error::new(Kind::Policy, m);
    if !items.is_empty() && roots.is_empty() {
        return Err(policy(
            "field `volumes`: this server allows no volumes (its config has no volume_roots)"
                .into(),
        ));
    }
    let (mut volumes, mut opened) = (Vec::new(), Vec::new());
    for item in items {
        let mut volume = codecage::spec::Volume::parse(item)
            .map_err(|e| Error::invalid(format!("field `volumes`: {e}")))?;
        if !item.starts_with('/') {
            return Err(Error::invalid(format!(
                "field `volumes`: {item}: the host directory must be an absolute path"
            )));
        }
        let fd = volume.pin(None, Some(roots)).map_err(|e| {
            let message = format!("field `volumes`: {e}");
            match codecage::spec::Volume::is_outside(&e) {
                true => policy(message),
                false => Error::invalid(message),
            }
        })?;
        opened.push(fd);
        volumes.push(volume);
    }
    Ok((volumes, opened))
}
