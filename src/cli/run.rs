//! `codecage run`: one sandbox, one program, then the Outcome as an exit status or JSON.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use super::print_json;
use crate::outcome::{ErrorKind, Outcome};
use crate::profile::{self, Host, PolicyError, Profile, Request};
use crate::runner::Lang;
use crate::spec::Spec;
use crate::units::{parse_duration, parse_size};
use crate::{launcher, Stream};

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
    /// Language of CODE or FILE (default: the profile's; FILE's extension picks one too).
    #[arg(long, value_enum)]
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
    /// Wall-clock limit: seconds, or with a unit (500ms, 30s, 2m).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION", allow_hyphen_values = true)]
    timeout: Option<Duration>,
    /// Memory limit, RAM and swap together (bytes, or 256M, 1G).
    #[arg(long, value_parser = parse_size, value_name = "SIZE", allow_hyphen_values = true)]
    memory: Option<u64>,
    /// CPU limit, in CPUs (0.5 = half of one CPU's time).
    #[arg(long, value_parser = parse_cpus, value_name = "CPUS", allow_hyphen_values = true)]
    cpus: Option<f64>,
    /// Limit on processes and threads.
    #[arg(long, value_parser = parse_pids, value_name = "N", allow_hyphen_values = true)]
    pids: Option<u64>,
    /// Cap on stdout plus stderr; past it the sandbox is stopped (bytes, or 512K, 1M).
    #[arg(long, value_parser = parse_size, value_name = "SIZE", allow_hyphen_values = true)]
    output_limit: Option<u64>,
    /// Size of the tmpfs on /tmp.
    #[arg(long, value_parser = parse_size, value_name = "SIZE", allow_hyphen_values = true)]
    tmp_size: Option<u64>,
    /// Size of the tmpfs on /work, the working directory.
    #[arg(long, value_parser = parse_size, value_name = "SIZE", allow_hyphen_values = true)]
    work_size: Option<u64>,
    /// Root filesystem: `host` (read-only binds of the host's /usr), an image name built by
    /// `cargo xtask rootfs` (default), or an image directory.
    #[arg(long, value_name = "host|NAME|DIR")]
    rootfs: Option<String>,
    /// Set an environment variable (K=V; a bare K copies the host's value). Repeatable.
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    env: Vec<String>,
    /// Print one JSON object with the outcome instead of passing output through.
    #[arg(long)]
    json: bool,
    /// Also report where the wall time went, phase by phase (`phases` in the JSON; a line on
    /// stderr otherwise).
    #[arg(long)]
    timings: bool,
}

pub fn main(args: RunArgs) -> i32 {
    let (json, timings) = (args.json, args.timings);
    let spec = match build_spec(args) {
        Ok(spec) => spec,
        Err(outcome) => return report(&outcome, json),
    };
    // SIGINT, SIGTERM and SIGHUP are forwarded to the payload rather than killing the
    // launcher (which would take the sandbox down with it, unannounced).
    let forwarded = forward_signals();
    let mut outcome = if json {
        launcher::run_with(&spec, &mut |_, _| {}, forwarded.as_ref())
    } else {
        // Output passes through from a thread of its own: a reader of our stdout that does
        // not read (`| sleep 60`) must not stall the launcher's loop, which enforces the
        // timeout. What waits is bounded by the output limit.
        let (chunks, pending) = std::sync::mpsc::channel::<(Stream, Vec<u8>)>();
        let writer = std::thread::spawn(move || {
            let (mut stdout, mut stderr) = (std::io::stdout(), std::io::stderr());
            for (stream, bytes) in pending {
                // A closed stdout (`| head`) must not stop the run; the Outcome has it all.
                let _ = match stream {
                    Stream::Stdout => stdout.write_all(&bytes).and_then(|_| stdout.flush()),
                    Stream::Stderr => stderr.write_all(&bytes),
                };
            }
        });
        let mut pass_through = |stream: Stream, bytes: &[u8]| {
            let _ = chunks.send((stream, bytes.to_vec()));
        };
        let outcome = launcher::run_with(&spec, &mut pass_through, forwarded.as_ref());
        drop(chunks);
        let _ = writer.join();
        outcome
    };
    if !timings {
        outcome.phases = None;
    } else if !json {
        if let Ok(phases) = serde_json::to_string(&outcome.phases) {
            eprintln!("codecage: phases (ms) {phases}");
        }
    }
    report(&outcome, json)
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

/// Translates the flags into a Request, picks the profile, and resolves both into a Spec.
fn build_spec(args: RunArgs) -> Result<Spec, Box<Outcome>> {
    let invalid = |message: String| Box::new(Outcome::failed(ErrorKind::InvalidRequest, message));
    let mut request = Request {
        lang: args.lang,
        timeout: args.timeout,
        memory: args.memory,
        cpus: args.cpus,
        pids: args.pids,
        output_limit: args.output_limit,
        tmp_size: args.tmp_size,
        work_size: args.work_size,
        rootfs: args.rootfs,
        ..Request::default()
    };
    match (args.code, args.file, args.argv.is_empty()) {
        (Some(code), None, true) => request.code = Some(code),
        (None, Some(file), true) => {
            request.lang = request.lang.or_else(|| Lang::from_extension(&file));
            request.code = Some(read_code(&file).map_err(invalid)?);
        }
        (None, None, false) => {
            if request.lang.is_some() {
                return Err(invalid(
                    "--lang applies to -c CODE or FILE, not to a program given after --".into(),
                ));
            }
            request.argv = Some(args.argv);
        }
        (None, None, true) => {
            return Err(invalid(
                "nothing to run: give --lang LANG -c CODE, a FILE, or -- PROGRAM [ARGS]".into(),
            ))
        }
        _ => {
            return Err(invalid(
                "give only one of -c CODE, FILE, or -- PROGRAM [ARGS]".into(),
            ))
        }
    }
    for item in &args.env {
        let (key, value) = match item.split_once('=') {
            Some((key, value)) => (key.to_string(), value.to_string()),
            None => {
                let value = std::env::var(item).map_err(|_| {
                    invalid(format!(
                        "--env {item}: use K=V, or a bare K that is set on the host"
                    ))
                })?;
                (item.clone(), value)
            }
        };
        request.env.push((key, value));
    }
    let profile_name = match (&args.profile, request.lang) {
        (Some(name), _) => name.clone(),
        (None, Some(lang)) => lang.name().to_string(),
        (None, None) if request.argv.is_some() => "bash".to_string(),
        (None, None) => {
            return Err(invalid(
                "cannot tell the language of the code: give --lang python|node|typescript|bash (or a FILE ending in .py, .js, .mjs, .ts, .sh)".into(),
            ))
        }
    };
    let profile = Profile::load(&profile_name).map_err(|e| invalid(e.to_string()))?;
    profile::resolve(&profile, &profile_name, &request, &Host::from_env()).map_err(|e| match e {
        PolicyError::Policy(message) => Box::new(Outcome::failed(ErrorKind::Policy, message)),
        PolicyError::Invalid(message) => invalid(message),
    })
}

fn parse_cpus(text: &str) -> Result<f64, String> {
    let form = "a number of CPUs from 0.01 up (0.5, 1, 2)";
    match text.trim().parse::<f64>() {
        Ok(cpus) if (0.01..=4096.0).contains(&cpus) => Ok(cpus),
        Ok(_) => Err(format!("{text:?} is out of range: use {form}")),
        Err(_) => Err(format!("{text:?} is not a number: use {form}")),
    }
}

fn parse_pids(text: &str) -> Result<u64, String> {
    let form = "a whole number of processes from 1 up (64)";
    match text.trim().parse::<u64>() {
        Ok(0) => Err(format!(
            "0 processes could not even start the program: use {form}"
        )),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{text:?} is not a whole number: use {form}")),
    }
}

fn read_code(file: &std::path::Path) -> Result<String, String> {
    let mut code = String::new();
    let read = if file.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut code)
    } else {
        std::fs::File::open(file).and_then(|mut f| f.read_to_string(&mut code))
    };
    read.map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    Ok(code)
}
