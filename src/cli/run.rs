//! `codecage run`: one sandbox, one program, then the Outcome as an exit status or JSON.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use clap::Args;
use codecage::caller::Caller;
use codecage::format::{self, Channel, Formatted, Options as FormatOptions};
use codecage::knobs::{Knob, Unit, Values};
use codecage::outcome::{ErrorKind, Outcome};
use codecage::profile::{self, DataDir, Profile, Request};
use codecage::runner::Lang;
use codecage::spec::{Spec, Volume};
use codecage::{launcher, Stream};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use super::{full, print_json};
use crate::audit::{Audit, Start, Via};
use crate::service::error::starts_with_word;
use crate::service::resolve::{self, ProfileSource};
use crate::service::{Error, Kind};

#[derive(Args)]
#[command(
    after_help = "Limits default to the profile's values (see `codecage profiles`); a flag may ask for less, or for \
                  more up to the profile's maximum.\n\nExit status: the program's own; 124 on timeout; 125 when the \
                  sandbox could not be built or the request is invalid or not allowed; 126/127 when the program \
                  cannot run / is not found; 128+N when signal N ended it (137 at the output or memory limit).",
    override_usage = "codecage run [OPTIONS] --lang LANG -c CODE\n       codecage run [OPTIONS] [--lang LANG] FILE\n       codecage run [OPTIONS] -- PROGRAM [ARGS]..."
)]
pub struct RunArgs {
    /// Profile: a name (python, node, typescript, bash, or one in /etc/codecage/profiles) or a
    /// TOML file. Default: the language's profile, or bash for a PROGRAM.
    #[arg(long, value_name = "NAME|FILE")]
    profile: Option<String>,
    /// Language of CODE or FILE: python, node, typescript or bash (default: the profile's;
    /// FILE's extension picks one too).
    #[arg(long, value_parser = parse_lang, value_name = "LANG")]
    lang: Option<Lang>,
    /// Code to run.
    #[arg(short = 'c', value_name = "CODE", conflicts_with = "file")]
    code: Option<String>,
    /// File of code to run, read on the host ("-" reads it from stdin).
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
    /// Program and arguments to run, after `--`.
    #[arg(last = true, value_name = "PROGRAM")]
    argv: Vec<String>,
    #[command(flatten)]
    knobs: KnobFlags,
    /// Root filesystem: `host` (read-only binds of the host's /usr), an image name built by
    /// `cargo xtask rootfs` (default), or an image directory.
    #[arg(long, value_name = "host|NAME|DIR")]
    rootfs: Option<String>,
    /// Network: none (loopback only), restricted (the profile's allowed_hosts through
    /// codecage's gateway) or full (where the host config enables it); no looser than the
    /// profile's.
    #[arg(long = "net", value_name = "none|restricted|full")]
    net: Option<codecage::network::Mode>,
    /// Set an environment variable (K=V). Repeatable.
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    env: Vec<String>,
    /// A host directory the sandbox sees under /work: read-only (`ro`, the default: writes
    /// fail with EROFS), or a copy the code may change (`copy`, on /work's tmpfs: it must
    /// fit in the profile's work_size). Never writable onto the host. Repeatable.
    #[arg(
        long = "volume",
        short = 'v',
        value_name = "HOST_DIR:/work/DIR[:ro|:copy]"
    )]
    volume: Vec<String>,
    /// Place the host file SRC at /work/DEST before the code runs. Repeatable.
    #[arg(long = "file", value_name = "DEST=SRC")]
    files: Vec<String>,
    /// Write the output files (the profile's outputs.dir, default /work/out) under DIR.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
    /// Print one JSON object with the outcome instead of passing output through.
    #[arg(long)]
    json: bool,
    /// Render the result for a chat channel: discord, telegram, slack, whatsapp, markdown or
    /// plain (messages within the channel's limit; what they cannot hold, figures and output
    /// files as attachments). With --json the object carries it as `formatted`; without,
    /// the messages are printed instead of the output, and the attachments are written
    /// under --out-dir.
    #[arg(long, value_name = "CHANNEL")]
    format: Option<Channel>,
    /// With --format: at most N messages (1 to 100; default 1).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "format")]
    format_messages: usize,
    /// With --format: the code blocks' language tag (python, js, ...; default none).
    #[arg(long, value_name = "LANG", requires = "format")]
    format_lang: Option<String>,
    /// With --format: a message's limit in characters instead of the channel's (at least
    /// 1000; markdown and plain have none of their own).
    #[arg(long, value_name = "N", requires = "format")]
    format_max_chars: Option<usize>,
    /// Also report where the wall time went, phase by phase (`phases` in the JSON; a line on
    /// stderr otherwise).
    #[arg(long)]
    timings: bool,
}

pub fn main(args: RunArgs) -> i32 {
    // This thread (the process's main one) starts the run and outlives it: the sandbox is
    // cloned from it, without a spawner thread.
    launcher::clone_on_calling_thread();
    let (json, timings) = (args.json, args.timings);
    let out_dir = args.out_dir.clone();
    let format = match format_options(&args) {
        Ok(format) => format,
        Err(e) => return report(&Outcome::failed(ErrorKind::InvalidRequest, e), json),
    };
    // Statically linked, codecage asks the host's name service nothing (`full::STATIC`):
    // what would ask, it hands to codecage-full before it reads anything.
    let hand_over = |why: &str| {
        report(
            &Outcome::failed(ErrorKind::Setup, full::hand_over(why)),
            json,
        )
    };
    if full::STATIC {
        if let Some(why) = static_hand_over(&args) {
            return hand_over(why);
        }
    }
    let caller = match full::STATIC {
        // Their groups would be the name service's answer, and nothing here acts as them.
        true => Caller::from_sudo_ids(),
        false => Caller::from_sudo(),
    };
    let host = match crate::host_config::HostConfig::load() {
        Ok(config) => config,
        Err(e) => return report(&Outcome::failed(ErrorKind::Setup, e), json),
    };
    // Loaded here for the gateway's decision, the profile is the one `build_spec` uses.
    let mut preloaded = None;
    if full::STATIC {
        if host
            .audit
            .as_ref()
            .is_some_and(|a| a.enabled && a.group.is_some())
        {
            return hand_over("an audit log for a group ([audit] group) needs its gid from the name service (NSS)");
        }
        preloaded = early_profile(&args, caller.as_ref());
        let mode = |profile: &Profile| args.net.unwrap_or(profile.network.mode);
        if preloaded
            .as_ref()
            .is_some_and(|(_, p)| mode(p).has_gateway())
        {
            return hand_over("the gateway of this run's network looks up host names (NSS)");
        }
    }
    // The audit log, when the host config has an [audit] section.
    let audit = match host.audit.as_ref().filter(|a| a.enabled) {
        Some(config) => match Audit::open(config) {
            Ok(audit) => Some(audit),
            Err(e) => return report(&Outcome::failed(ErrorKind::Setup, e), json),
        },
        None => None,
    };
    let who = match &caller {
        Some(c) => format!("uid:{}", c.uid),
        None => format!("uid:{}", nix::unistd::getuid()),
    };
    let mut start = resolve::run_start(Via::Cli, who, args.lang, args.profile.clone());
    let built = build_spec(args, &mut start, &host.network, caller.as_ref(), preloaded);
    let slot = match audit.as_ref().map(Audit::slot_blocking).transpose() {
        Ok(slot) => slot,
        Err(e) => {
            return report(&Outcome::failed(ErrorKind::Setup, e.to_string()), json);
        }
    };
    // The volumes' directories stay open until the launcher has cloned their trees.
    let (spec, _volumes, profile, profile_name) = match built {
        Ok(built) => built,
        Err(error) => {
            if let Some(slot) = slot {
                let (start, end) = resolve::refusal(start, &error);
                slot.whole(start, end);
            }
            close(audit.as_ref());
            return report(&failed(&error), json);
        }
    };
    // The gateway (and its runtime, only when a sandbox needs it) under the host's config,
    // which allowed the mode when the request was resolved.
    if spec.sandbox.network.mode.has_gateway() {
        crate::gateway::Gateway::install(host.network.clone());
    }
    let pending = slot.map(|slot| slot.begin(resolve::starting(start, &spec)));
    // CODECAGE_PREPARED=1: the server's warm-pool path for this one run (the sandbox built
    // from the profile alone and, for Python, the interpreter pre-started; then the request
    // handed over), so that the run suite proves pooled runs give cold runs' outcomes.
    let prepared = if std::env::var_os("CODECAGE_PREPARED").is_some_and(|v| v == "1") {
        match prepare(&spec, &profile, &profile_name) {
            Ok(prepared) => prepared,
            Err(outcome) => {
                if let Some(pending) = pending {
                    let end = pending.end_of(&outcome);
                    pending.finish_with_output(end, &outcome.stdout, &outcome.stderr);
                }
                close(audit.as_ref());
                return report(&outcome, json);
            }
        }
    } else {
        None
    };
    let mut prepared = prepared;
    let mut launch = |spec: &Spec,
                      sink: &mut dyn FnMut(Stream, &[u8]),
                      interrupt: Option<&nix::sys::signalfd::SignalFd>|
     -> Outcome {
        match prepared.take() {
            Some(p) => p.run(spec, sink, interrupt, None),
            None => launcher::run_with(spec, sink, interrupt),
        }
    };
    // SIGINT, SIGTERM and SIGHUP are forwarded to the payload rather than killing the
    // launcher (which would take the sandbox down with it, unannounced).
    let forwarded = forward_signals();
    // With --format, the messages are printed after the run instead of the output as it
    // comes.
    let mut outcome = if json || format.is_some() {
        launch(&spec, &mut |_, _| {}, forwarded.as_ref())
    } else {
        // Output passes through from a thread of its own: a reader of our stdout that does
        // not read (`| sleep 60`) must not stall the launcher's loop, which enforces the
        // timeout. What waits is bounded by the output limit.
        // The thread starts with the first output: a run that prints nothing makes none.
        let (chunks, receiver) = std::sync::mpsc::channel::<(Stream, Vec<u8>)>();
        let mut receiver = Some(receiver);
        let mut writer = None;
        let mut pass_through = |stream: Stream, bytes: &[u8]| {
            if let Some(pending) = receiver.take() {
                writer = Some(std::thread::spawn(move || {
                    let (mut stdout, mut stderr) = (std::io::stdout(), std::io::stderr());
                    for (stream, bytes) in pending {
                        // A closed stdout (`| head`) must not stop the run; the Outcome has
                        // it all.
                        let _ = match stream {
                            Stream::Stdout => stdout.write_all(&bytes).and_then(|_| stdout.flush()),
                            Stream::Stderr => stderr.write_all(&bytes),
                        };
                    }
                }));
            }
            let _ = chunks.send((stream, bytes.to_vec()));
        };
        let outcome = launch(&spec, &mut pass_through, forwarded.as_ref());
        drop(chunks);
        if let Some(writer) = writer {
            let _ = writer.join();
        }
        outcome
    };
    if let Some(pending) = pending {
        let end = pending.end_of(&outcome);
        pending.finish_with_output(end, &outcome.stdout, &outcome.stderr);
    }
    close(audit.as_ref());
    if !timings {
        outcome.phases = None;
    } else if !json {
        if let Ok(phases) = serde_json::to_string(&outcome.phases) {
            eprintln!("codecage: phases (ms) {phases}");
        }
    }
    // Rendered before the output files' bytes are dropped (--out-dir keeps names only).
    let formatted = format
        .as_ref()
        .map(|options| format::render(&outcome, options).expect("options checked before the run"));
    if let (Some(formatted), false) = (&formatted, json) {
        print_messages(formatted);
        save_attachments(formatted, &outcome, out_dir.as_deref(), caller.as_ref());
    }
    if let Some(dir) = &out_dir {
        save_outputs(
            &mut outcome,
            dir,
            caller.as_ref(),
            spec.exec.outputs.as_ref(),
            json,
        );
    } else if !json {
        for file in &outcome.files {
            eprintln!(
                "codecage: output file {} ({} bytes, {}) was not saved: give --out-dir DIR",
                file.path, file.size, file.media_type
            );
        }
    }
    match formatted {
        Some(formatted) if json => {
            let mut value = serde_json::to_value(&outcome).unwrap_or_default();
            value["formatted"] = serde_json::to_value(&formatted).unwrap_or_default();
            super::print_json_value(&value);
            outcome.exit_status()
        }
        _ => report(&outcome, json),
    }
}

/// `--format` and its options, checked before anything runs.
fn format_options(args: &RunArgs) -> Result<Option<FormatOptions>, String> {
    let Some(channel) = args.format else {
        return Ok(None);
    };
    let options = FormatOptions {
        channel,
        max_messages: args.format_messages,
        language: args.format_lang.clone(),
        max_chars: args.format_max_chars,
    };
    options.validate().map_err(|e| {
        let flag = if e.0.starts_with("max_messages") {
            "--format-messages"
        } else if e.0.starts_with("language") {
            "--format-lang"
        } else {
            "--format-max-chars"
        };
        format!("{flag}: {e}")
    })?;
    Ok(Some(options))
}

/// The messages on stdout, each under a line that numbers it.
fn print_messages(formatted: &Formatted) {
    let n = formatted.messages.len();
    let mut out = String::new();
    for (i, message) in formatted.messages.iter().enumerate() {
        let units: usize = message.chars().map(char::len_utf16).sum();
        out.push_str(&format!(
            "----- message {} of {n} ({}, {units} characters) -----\n{message}\n",
            i + 1,
            formatted.channel
        ));
    }
    let _ = std::io::stdout().write_all(out.as_bytes());
    let _ = std::io::stdout().flush();
}

/// In a static `codecage`, why this run must be handed to codecage-full before anything is
/// read: through sudo, it reads or writes the caller's files as them (FILE, `--file`,
/// `--volume`, `--out-dir`: their groups are the name service's answer); or its profile
/// file or host config (`CODECAGE_CONFIG`) can be read only once (a pipe), and reading it
/// here would leave codecage-full nothing to read.
fn static_hand_over(args: &RunArgs) -> Option<&'static str> {
    let once = |path: &std::path::Path| std::fs::metadata(path).is_ok_and(|m| !m.is_file());
    if full::sudo_caller()
        && (args.file.as_ref().is_some_and(|f| f.as_os_str() != "-")
            || !args.files.is_empty()
            || !args.volume.is_empty()
            || args.out_dir.is_some())
    {
        return Some("reading or writing the sudo caller's files as them needs their groups from the name service (NSS)");
    }
    let config = std::env::var_os("CODECAGE_CONFIG");
    if args.profile.as_deref().is_some_and(|p| once(p.as_ref()))
        || config.is_some_and(|c| once(c.as_ref()))
    {
        return Some("the profile or host config is a pipe, which can be read only once");
    }
    None
}

/// The run's profile and its name, as `build_spec` would load them, before its code and
/// inputs are read. None where they do not resolve: the run's own resolution then reports
/// why.
fn early_profile(args: &RunArgs, caller: Option<&Caller>) -> Option<(String, Profile)> {
    let lang = args
        .lang
        .or_else(|| args.file.as_deref().and_then(Lang::from_extension));
    let name = resolve::profile_name(args.profile.as_deref(), lang, !args.argv.is_empty()).ok()?;
    let profile = resolve::load_profile(&name, profile_source(caller)).ok()?;
    Some((name, profile))
}

/// Where a run's profile comes from: a profile file's path is the local user's to give;
/// through sudo, only names.
fn profile_source(caller: Option<&Caller>) -> ProfileSource<'static> {
    ProfileSource {
        dir: std::path::Path::new(profile::SYSTEM_DIR),
        files: caller.is_none(),
    }
}

/// The attachments codecage made (output.txt, figures) under --out-dir, as the caller;
/// the output files among them are written there by save_outputs. Listed on stderr.
fn save_attachments(
    formatted: &Formatted,
    outcome: &Outcome,
    dir: Option<&std::path::Path>,
    caller: Option<&Caller>,
) {
    let ours: Vec<codecage::files::OutputFile> = formatted
        .attachments
        .iter()
        .filter(|a| !outcome.files.iter().any(|f| f.path == a.name))
        .map(|a| codecage::files::OutputFile {
            path: a.name.clone(),
            size: a.size,
            media_type: a.media_type.clone(),
            sha256: a.sha256.clone(),
            data: Some(a.data.clone()),
        })
        .collect();
    if ours.is_empty() {
        return;
    }
    let Some(dir) = dir else {
        for a in &ours {
            eprintln!(
                "codecage: attachment {} ({} bytes, {}) was not saved: give --out-dir DIR",
                a.path, a.size, a.media_type
            );
        }
        return;
    };
    let target = dir.to_path_buf();
    let files = ours.clone();
    let saved = match caller {
        Some(c) => c.as_user(move || codecage::files::save_under(&target, &files)),
        None => codecage::files::save_under(&target, &files),
    };
    match saved {
        Ok(paths) => {
            for (a, path) in ours.iter().zip(&paths) {
                eprintln!(
                    "codecage: wrote attachment {} ({} bytes, {})",
                    path.display(),
                    a.size,
                    a.media_type
                );
            }
        }
        Err(e) => eprintln!("codecage: the attachments could not be saved: {e}"),
    }
}

/// Writes the output files under `dir` (as the caller, through sudo), lists them on stderr
/// (with `--json`, in the object only, names without bytes).
fn save_outputs(
    outcome: &mut Outcome,
    dir: &std::path::Path,
    caller: Option<&Caller>,
    rules: Option<&codecage::files::OutputRules>,
    json: bool,
) {
    let files = outcome.files.clone();
    let target = dir.to_path_buf();
    let saved = match caller {
        Some(c) => c.as_user(move || codecage::files::save_under(&target, &files)),
        None => codecage::files::save_under(&target, &files),
    };
    match saved {
        Ok(paths) if !json => {
            for (file, path) in outcome.files.iter().zip(&paths) {
                eprintln!(
                    "codecage: wrote {} ({} bytes, {}, sha256 {})",
                    path.display(),
                    file.size,
                    file.media_type,
                    &file.sha256[..16]
                );
            }
        }
        Ok(_) => {}
        Err(e) => {
            let note = format!("the output files could not be saved: {e}");
            outcome.message = Some(match outcome.message.take() {
                Some(m) => format!("{m}; {note}"),
                None => note,
            });
        }
    }
    if !json {
        for skipped in &outcome.files_skipped {
            eprintln!(
                "codecage: skipped output {}: {}",
                skipped.path,
                skipped.reason.describe(rules)
            );
        }
    }
    for file in &mut outcome.files {
        file.data = None;
    }
}

/// Writes what the audit holds before the process ends.
fn close(audit: Option<&Audit>) {
    if let Some(audit) = audit {
        audit.close();
    }
}

fn report(outcome: &Outcome, json: bool) -> i32 {
    if json {
        print_json(outcome);
    } else if let Some(message) = &outcome.message {
        eprintln!("codecage: {message}");
    }
    outcome.exit_status()
}

fn forward_signals() -> Option<SignalFd> {
    let mut set = SigSet::empty();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(signal);
    }
    set.thread_block().ok()?;
    SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).ok()
}

/// A sandbox built ahead of `spec`, as the server's pool builds them: from the profile
/// (its program, environment and preload), with the sandbox `spec` resolved to, which is
/// what a pool of a profile saying what the request's flags say (its rootfs, limits,
/// layers) holds. The run suite chooses the host's rootfs and its own limits, and would
/// otherwise take the pooled path in no test that does. Volumes are a request's alone (a
/// pool's sandbox has none): such a run is cold, as the server's would be, and so is one
/// the pooled sandbox does not fit.
fn prepare(
    spec: &Spec,
    profile: &Profile,
    name: &str,
) -> Result<Option<launcher::Prepared>, Box<Outcome>> {
    let mut pool = match profile::pool_spec(profile, name, &DataDir::from_env()) {
        Ok(pool) => pool,
        Err(_) => return Ok(None),
    };
    if !spec.sandbox.volumes.is_empty() {
        return Ok(None);
    }
    pool.sandbox = spec.sandbox.clone();
    let prepared = launcher::Prepared::build(&pool, Some(&profile.preload))
        .map_err(|e| Box::new(Outcome::failed(e.kind, e.message)))?;
    Ok(prepared.fits(spec).then_some(prepared))
}

/// Translates the flags into a Request, picks the profile, and resolves both into a Spec
/// (with the profile and its name) whose network mode the host allows, by the service's
/// rules (`service::resolve`), the errors naming this front end's flags; notes what was
/// asked in `asked` (for the audit), as far as it got. Also returns the volumes'
/// directories, opened (with the sudo caller's credentials when codecage runs for
/// someone), which must stay open until the sandbox has started. `preloaded`: the profile
/// already loaded under its name ([`early_profile`]), used when the name is the run's.
fn build_spec(
    args: RunArgs,
    asked: &mut Start,
    network: &crate::gateway::GatewayConfig,
    caller: Option<&Caller>,
    preloaded: Option<(String, Profile)>,
) -> Result<(Spec, Vec<OwnedFd>, Profile, String), Error> {
    asked.code = args.code.clone();
    if !args.argv.is_empty() {
        asked.argv = Some(args.argv.clone());
    }
    let mut request = Request {
        lang: args.lang,
        knobs: args.knobs.0,
        rootfs: args.rootfs,
        network: args.net,
        ..Request::default()
    };
    match (args.code, args.file, args.argv.is_empty()) {
        (Some(code), None, true) => request.code = Some(code),
        (None, Some(file), true) => {
            request.lang = request.lang.or_else(|| Lang::from_extension(&file));
            request.code = Some(read_code(&file, caller).map_err(Error::invalid)?);
            asked.code = request.code.clone();
            asked.language = request.lang.map(|l| l.name().to_string());
        }
        (None, None, false) => {
            if request.lang.is_some() {
                return Err(Error::invalid(
                    "--lang applies to -c CODE or FILE, not to a program given after --",
                ));
            }
            request.argv = Some(args.argv);
        }
        (None, None, true) => {
            return Err(Error::invalid(
                "nothing to run: give --lang LANG -c CODE, a FILE, or -- PROGRAM [ARGS]",
            ))
        }
        _ => {
            return Err(Error::invalid(
                "give only one of -c CODE, FILE, or -- PROGRAM [ARGS]",
            ))
        }
    }
    for item in &args.env {
        // codecage never copies its own environment into a sandbox: a bare NAME would hand
        // over whatever the launcher (root, perhaps via sudo) happens to have.
        let Some((key, value)) = item.split_once('=') else {
            return Err(Error::invalid(format!(
                "--env {item}: give NAME=VALUE; codecage does not copy its own environment into the sandbox \
                 (from a shell: --env {item}=\"${item}\")"
            )));
        };
        request.env.push((key.to_string(), value.to_string()));
    }
    for item in &args.files {
        request
            .files
            .push(read_input(item, caller).map_err(Error::invalid)?);
    }
    if let (Some(caller), Some(rootfs)) = (caller, request.rootfs.as_deref()) {
        refuse_rootfs_dir_for(caller, rootfs).map_err(Error::invalid)?;
    }
    // Opened now, with the sudo caller's credentials; they join the spec once it is
    // resolved (a volume is the caller's choice, not the profile's).
    let volume_error = |e: String| Error::invalid(with_flag(&e, "volume", "--volume"));
    let mut opened = Vec::new();
    let mut volumes = Vec::new();
    for item in &args.volume {
        let mut volume = Volume::parse(item).map_err(volume_error)?;
        opened.push(volume.pin(caller, None).map_err(volume_error)?);
        volumes.push(volume);
    }
    let flagged = |e: Error| with_flags(e, caller);
    let profile_name = resolve::profile_name(
        args.profile.as_deref(),
        request.lang,
        request.argv.is_some(),
    )
    .map_err(|mut e| {
        e.message += "; a FILE ending in .py, .js, .mjs, .ts or .sh tells it too";
        flagged(e)
    })?;
    asked.profile = Some(profile_name.clone());
    let profile = match preloaded {
        Some((name, profile)) if name == profile_name => profile,
        _ => resolve::load_profile(&profile_name, profile_source(caller)).map_err(flagged)?,
    };
    let mut spec = resolve::resolve_run(
        &profile,
        &profile_name,
        &request,
        &DataDir::from_env(),
        network,
    )
    .map_err(flagged)?;
    spec.sandbox.volumes = volumes;
    spec.validate().map_err(Error::invalid)?;
    Ok((spec, opened, profile, profile_name))
}

/// The service's error with this front end's name for the field it is about: its flag
/// (`--memory`, `--net`, ...), in place of the field's key where the message starts with
/// it, else before the message.
fn with_flags(mut error: Error, caller: Option<&Caller>) -> Error {
    let Some((field, flag)) = error.field.and_then(|f| flag_of(f).map(|flag| (f, flag))) else {
        return error;
    };
    let mut message = with_flag(&error.message, field, &flag);
    match field {
        "rootfs" if message.contains("rootfs = \"host\"") => {
            message += "; for this run alone: --rootfs host";
        }
        "profile" => {
            if let Some(caller) = caller.filter(|_| message.contains("is not a profile name")) {
                message += &format!(
                    "; codecage runs for uid {} (through sudo), so --profile takes the name of an installed \
                     profile (see `codecage profiles`), not a file",
                    caller.uid
                );
            }
        }
        _ => {}
    }
    error.message = message;
    error
}

/// `message` about `key`, naming `flag` instead: in the key's place where the message
/// starts with it, else before it.
fn with_flag(message: &str, key: &str, flag: &str) -> String {
    match starts_with_word(message, key) {
        true => format!("{flag}{}", &message[key.len()..]),
        false => format!("{flag}: {message}"),
    }
}

/// The flag that sets a request's field.
fn flag_of(field: &str) -> Option<String> {
    let flag = match field {
        "language" => "--lang",
        "network" => "--net",
        "env" => "--env",
        "files" => "--file",
        "rootfs" => "--rootfs",
        "profile" => "--profile",
        "volumes" => "--volume",
        key => {
            return Knob::from_key(key)
                .filter(|k| k.requestable())
                .map(Knob::flag)
        }
    };
    Some(flag.to_string())
}

/// The Outcome of a request the service's rules refused: `policy` and `invalid_request`
/// as they are (exit status 125 either way), anything else `setup`.
fn failed(error: &Error) -> Outcome {
    let kind = match error.kind {
        Kind::Policy => ErrorKind::Policy,
        Kind::InvalidRequest => ErrorKind::InvalidRequest,
        _ => ErrorKind::Setup,
    };
    Outcome::failed(kind, error.message.clone())
}

fn parse_lang(text: &str) -> Result<Lang, String> {
    text.parse()
}

/// One flag per knob a request may set (`--timeout`, `--memory`, ...), generated from
/// `codecage::knobs::KNOBS`, so the flags, their parsing and their help cannot drift from
/// the profiles.
#[derive(Default)]
struct KnobFlags(Values);

impl clap::FromArgMatches for KnobFlags {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut values = Values::new();
        for knob in Knob::all().filter(|k| k.requestable()) {
            if let Some(value) = matches.get_one::<u64>(knob.key()) {
                values.insert(knob, *value);
            }
        }
        Ok(KnobFlags(values))
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl clap::Args for KnobFlags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        Knob::all()
            .filter(|k| k.requestable())
            .fold(cmd, |cmd, knob| {
                let def = knob.def();
                // Built once per process; clap wants 'static names.
                let long: &'static str = Box::leak(knob.key().replace('_', "-").into_boxed_str());
                let value_name = match def.unit {
                    Unit::Duration => "DURATION",
                    Unit::Size => "SIZE",
                    Unit::Count => "N",
                    Unit::Cpus => "CPUS",
                };
                cmd.arg(
                    clap::Arg::new(knob.key())
                        .long(long)
                        .value_name(value_name)
                        .help(def.help)
                        .allow_hyphen_values(true)
                        .value_parser(move |text: &str| knob.parse(text)),
                )
            })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// `--file DEST=SRC`: the host file SRC (read as the caller, through sudo) for /work/DEST.
/// DEST is checked here so the message names the flag; the profile's caps are checked when
/// the request resolves.
pub(crate) fn read_input(
    item: &str,
    caller: Option<&Caller>,
) -> Result<codecage::files::InputFile, String> {
    let Some((dest, src)) = item.split_once('=') else {
        return Err(format!(
            "--file {item}: give DEST=SRC, a path under /work and a host file (--file data.csv=./data.csv)"
        ));
    };
    let dest = dest.strip_prefix("/work/").unwrap_or(dest);
    codecage::files::check_input_path(dest).map_err(|e| format!("--file {item}: {e}"))?;
    let src = std::path::Path::new(src);
    let bytes = match caller {
        Some(caller) => caller.read(src),
        None => std::fs::read(src),
    }
    .map_err(|e| format!("--file {item}: cannot read {}: {e}", src.display()))?;
    Ok(codecage::files::InputFile::new(dest, bytes))
}

/// Reads the code of FILE, with the invoking user's credentials when codecage runs for
/// someone through sudo.
fn read_code(file: &std::path::Path, caller: Option<&Caller>) -> Result<String, String> {
    let failed = |e: std::io::Error| format!("cannot read {}: {e}", file.display());
    let bytes = if file.as_os_str() == "-" {
        let mut bytes = Vec::new();
        std::io::stdin().read_to_end(&mut bytes).map_err(failed)?;
        bytes
    } else if let Some(caller) = caller {
        caller.read(file).map_err(failed)?
    } else {
        std::fs::read(file).map_err(failed)?
    };
    String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", file.display()))
}

/// Through sudo, the image comes from what the host's administrator built, by name: an
/// image directory is a root file system of the caller's choosing. (The profile's rule,
/// names only through sudo, is the service's: [`ProfileSource::files`].)
fn refuse_rootfs_dir_for(caller: &Caller, rootfs: &str) -> Result<(), String> {
    if rootfs.contains('/') {
        return Err(format!(
            "--rootfs {rootfs}: codecage runs for uid {} (through sudo), so --rootfs takes host or the name of a \
             built image, not a directory",
            caller.uid
        ));
    }
    Ok(())
}
