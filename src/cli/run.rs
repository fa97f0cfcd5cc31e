//! `codecage run`: one sandbox, one program, then the Outcome as an exit status or JSON.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use super::print_json;
use crate::cgroup::Limits;
use crate::outcome::{ErrorKind, Outcome};
use crate::spec::{Rootfs, Spec};
use crate::units::{parse_duration, parse_size};
use crate::{launcher, Stream};

/// The languages `--lang` knows, and how each runs a piece of code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    Python,
    Node,
    Bash,
}

impl Lang {
    fn argv(self, code: String) -> Vec<String> {
        let (program, flag) = match self {
            Lang::Python => ("python3", "-c"),
            Lang::Node => ("node", "-e"),
            Lang::Bash => ("bash", "-c"),
        };
        vec![program.into(), flag.into(), code]
    }

    fn from_extension(path: &std::path::Path) -> Option<Lang> {
        match path.extension()?.to_str()? {
            "py" => Some(Lang::Python),
            "js" | "cjs" | "mjs" => Some(Lang::Node),
            "sh" | "bash" => Some(Lang::Bash),
            _ => None,
        }
    }
}

#[derive(Args)]
#[command(
    after_help = "Exit status: the program's own; 124 on timeout; 125 when the sandbox could not be \
                  built or the request is invalid; 126/127 when the program cannot run / is not found; \
                  128+N when signal N ended it (137 when the output limit stopped it).",
    override_usage = "codecage run [OPTIONS] --lang LANG -c CODE\n       codecage run [OPTIONS] [--lang LANG] FILE\n       codecage run [OPTIONS] -- PROGRAM [ARGS]..."
)]
pub struct RunArgs {
    /// Language of CODE or FILE (FILE's extension picks one when omitted).
    #[arg(long, value_enum)]
    lang: Option<Lang>,
    /// Code to run, in --lang.
    #[arg(short = 'c', value_name = "CODE", conflicts_with = "file")]
    code: Option<String>,
    /// File of code to run, read on the host ("-" reads it from stdin).
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
    /// Program and arguments to run, after `--`.
    #[arg(last = true, value_name = "PROGRAM")]
    argv: Vec<String>,
    /// Wall-clock limit: seconds, or with a unit (500ms, 30s, 2m).
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION", allow_hyphen_values = true)]
    timeout: Duration,
    /// Print one JSON object with the outcome instead of passing output through.
    #[arg(long)]
    json: bool,
    /// Root filesystem: `host` (read-only binds of the host's /usr) or an image directory.
    #[arg(long, default_value = "host", value_name = "host|DIR")]
    rootfs: String,
    /// Set an environment variable (K=V; a bare K copies the host's value). Repeatable.
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    env: Vec<String>,
    /// Cap on stdout plus stderr; past it the sandbox is stopped (bytes, or 512K, 1M).
    #[arg(long, default_value = "1M", value_parser = parse_size, value_name = "SIZE", allow_hyphen_values = true)]
    output_limit: u64,
    /// Memory limit, RAM and swap together (bytes, or 256M, 1G).
    #[arg(long, default_value = "256M", value_parser = parse_size, value_name = "SIZE", allow_hyphen_values = true)]
    memory: u64,
    /// CPU limit, in CPUs (0.5 = half of one CPU's time).
    #[arg(long, default_value = "0.5", value_parser = parse_cpus, allow_hyphen_values = true, value_name = "CPUS")]
    cpus: f64,
    /// Limit on processes and threads.
    #[arg(long, default_value = "64", value_parser = parse_pids, allow_hyphen_values = true, value_name = "N")]
    pids: u64,
    /// Size of the tmpfs on /tmp.
    #[arg(long, default_value = "64M", value_parser = parse_size, value_name = "SIZE", allow_hyphen_values = true)]
    tmp_size: u64,
    /// Size of the tmpfs on /work, the working directory.
    #[arg(long, default_value = "64M", value_parser = parse_size, value_name = "SIZE", allow_hyphen_values = true)]
    work_size: u64,
}

pub fn main(args: RunArgs) -> i32 {
    let json = args.json;
    let spec = match build_spec(args) {
        Ok(spec) => spec,
        Err(message) => return report(&Outcome::failed(ErrorKind::InvalidRequest, message), json),
    };
    // SIGINT, SIGTERM and SIGHUP are forwarded to the payload rather than killing the
    // launcher (which would take the sandbox down with it, unannounced).
    let forwarded = forward_signals();
    let mut stdout = std::io::stdout().lock();
    let mut stderr = std::io::stderr();
    let mut pass_through = |stream: Stream, bytes: &[u8]| {
        // A closed stdout (`| head`) must not stop the run; the Outcome still has it all.
        let _ = match stream {
            Stream::Stdout => stdout.write_all(bytes).and_then(|_| stdout.flush()),
            Stream::Stderr => stderr.write_all(bytes),
        };
    };
    let outcome = if json {
        launcher::run_with(&spec, &mut |_, _| {}, forwarded.as_ref())
    } else {
        launcher::run_with(&spec, &mut pass_through, forwarded.as_ref())
    };
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

/// Translates the flags into a Spec, with messages that name the flag and what is allowed.
fn build_spec(args: RunArgs) -> Result<Spec, String> {
    let argv = match (args.code, args.file, args.argv.is_empty()) {
        (Some(code), None, true) => {
            let lang = args.lang.ok_or("-c CODE needs --lang python|node|bash")?;
            lang.argv(code)
        }
        (None, Some(file), true) => {
            let lang = match args.lang {
                Some(lang) => lang,
                None => Lang::from_extension(&file).ok_or_else(|| {
                    format!(
                        "cannot tell the language of {} from its extension (.py, .js, .mjs, .sh): give --lang",
                        file.display()
                    )
                })?,
            };
            lang.argv(read_code(&file)?)
        }
        (None, None, false) => {
            if args.lang.is_some() {
                return Err(
                    "--lang applies to -c CODE or FILE, not to a program given after --".into(),
                );
            }
            args.argv
        }
        (None, None, true) => {
            return Err(
                "nothing to run: give --lang LANG -c CODE, a FILE, or -- PROGRAM [ARGS]".into(),
            )
        }
        _ => return Err("give only one of -c CODE, FILE, or -- PROGRAM [ARGS]".into()),
    };
    let mut spec = Spec::new(argv);
    spec.timeout = args.timeout;
    spec.output_limit = args.output_limit;
    spec.tmp_size = args.tmp_size;
    spec.work_size = args.work_size;
    spec.limits = Some(Limits {
        memory: args.memory,
        cpu_quota_us: Limits::quota_for_cpus(args.cpus),
        pids: args.pids,
    });
    spec.rootfs = match args.rootfs.as_str() {
        "host" => Rootfs::Host,
        dir => {
            let dir = std::path::absolute(dir).map_err(|e| format!("--rootfs {dir}: {e}"))?;
            Rootfs::Dir(dir)
        }
    };
    for item in &args.env {
        let (key, value) = match item.split_once('=') {
            Some((key, value)) => (key.to_string(), value.to_string()),
            None => {
                let value = std::env::var(item).map_err(|_| {
                    format!("--env {item}: use K=V, or a bare K that is set on the host")
                })?;
                (item.clone(), value)
            }
        };
        if key.is_empty() {
            return Err(format!("--env {item}: the variable name is empty; use K=V"));
        }
        spec.set_env(&key, &value);
    }
    spec.validate()
        .map_err(|e| format!("invalid request: {e}"))?;
    Ok(spec)
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
