//! Sandboxes built ahead of a request: the server's warm pool (and `CODECAGE_PREPARED=1`
//! for the CLI, which takes the same path for one run, so the run suite can prove it).
//!
//! A [`Prepared`] is a started [`Sandbox`] (cgroup with limits, namespaces, mounts, /work
//! and /tmp, the init waiting for requests) and, for Python, maybe an interpreter already
//! running in it: `python3 -c drivers/prestart.py` spawned with the payload's every layer,
//! its preload imports done, blocked on its fd 3 until the request's argv and environment
//! come. The request then costs the write of its files, one line on fd 3, and the script
//! itself. A prepared sandbox serves one request and is destroyed with it, never reused:
//! what a pre-started interpreter holds before the request is the profile's preload
//! imports and nothing of any other request.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::unistd::pipe2;

use super::supervise::{End, Stops};
use super::{Canceller, OutputPipes, Sandbox, StartError, Stream, Teardown};
use crate::outcome::{ErrorKind, Outcome};
use crate::spec::{Exec, Spec};

/// The bootstrap of a pre-started Python.
const PRESTART: &str = include_str!("../../drivers/prestart.py");
/// How long a pre-started interpreter may take to import its preload.
const PRELOAD_TIMEOUT: Duration = Duration::from_secs(120);

/// A sandbox built before its request, maybe with its interpreter waiting.
pub struct Prepared {
    sandbox: Sandbox,
    /// What it was built for: a request fits if its spec differs only where a prepared
    /// sandbox can follow (see [`Prepared::fits`]).
    spec: Spec,
    runner: Option<Runner>,
}

/// A pre-started interpreter: its stdio and its control socket (its fd 3).
struct Runner {
    control: UnixStream,
    stdin: OwnedFd,
    pipes: OutputPipes,
}

impl Prepared {
    /// Builds the sandbox of `spec` and, when `preload` is given and `spec` runs a Python
    /// script (`python3 FILE`), starts the interpreter with those modules imported.
    pub fn build(spec: &Spec, preload: Option<&[String]>) -> Result<Prepared, StartError> {
        let mut sandbox = Sandbox::start(&spec.sandbox)?;
        // Built ahead of a request: in the background until [`Prepared::run`] (lifting
        // the quota is best effort, a refill that keeps it only takes longer).
        let _ = sandbox.set_background(true);
        let runner = match preload {
            Some(modules) if prestartable(&spec.exec) => {
                Some(start_runner(&mut sandbox, &spec.exec, modules)?)
            }
            _ => None,
        };
        Ok(Prepared {
            sandbox,
            spec: spec.clone(),
            runner,
        })
    }

    /// Whether an interpreter is waiting in it.
    pub fn prestarted(&self) -> bool {
        self.runner.is_some()
    }

    /// Whether it can serve `spec`: the same sandbox, and with a pre-started interpreter,
    /// the same program, output rules and interpreter settings (`PYTHON*` variables act
    /// when the interpreter starts: a request that changes one needs a cold start).
    pub fn fits(&self, spec: &Spec) -> bool {
        if spec.sandbox != self.spec.sandbox {
            return false;
        }
        if self.runner.is_none() {
            return true;
        }
        let startup = |env: &[(String, String)]| -> Vec<(String, String)> {
            let mut v: Vec<(String, String)> = env
                .iter()
                .filter(|(k, _)| k.starts_with("PYTHON"))
                .cloned()
                .collect();
            v.sort();
            v
        };
        spec.exec.argv.first() == self.spec.exec.argv.first()
            && prestartable(&spec.exec)
            && spec.exec.outputs == self.spec.exec.outputs
            && startup(&spec.exec.env) == startup(&self.spec.exec.env)
    }

    /// Runs `spec` (which [`Prepared::fits`]) to its end; the sandbox ends with it. The
    /// timeout, the duration and the CPU time count from here.
    pub fn run(
        self,
        spec: &Spec,
        sink: &mut dyn FnMut(Stream, &[u8]),
        interrupt: Option<&nix::sys::signalfd::SignalFd>,
        cancel: Option<&Canceller>,
    ) -> Outcome {
        let (mut outcome, teardown) = self.answer(spec, sink, interrupt, cancel);
        teardown.finish_into(&mut outcome);
        outcome
    }

    /// Runs `spec` (which [`Prepared::fits`]) and returns its Outcome as soon as the
    /// payload's end is known: its exit, or a pre-started interpreter's word on its end,
    /// reported by the init once every other process of the sandbox is killed (each reaped,
    /// or after the word past its last system call), its output read to the end, its output
    /// files received, the cgroup's figures read (final then: nothing of the code runs).
    /// The sandbox is not gone yet: the [`Teardown`] reaps the init and removes the cgroup,
    /// and the sandbox counts until it is finished (or dropped).
    pub fn answer(
        self,
        spec: &Spec,
        sink: &mut dyn FnMut(Stream, &[u8]),
        interrupt: Option<&nix::sys::signalfd::SignalFd>,
        cancel: Option<&Canceller>,
    ) -> (Outcome, Teardown) {
        let (outcome, teardown) = self.run_prepared(spec, sink, interrupt, cancel);
        (
            Outcome {
                warm: true,
                ..outcome
            },
            teardown,
        )
    }

    fn run_prepared(
        self,
        spec: &Spec,
        sink: &mut dyn FnMut(Stream, &[u8]),
        interrupt: Option<&nix::sys::signalfd::SignalFd>,
        cancel: Option<&Canceller>,
    ) -> (Outcome, Teardown) {
        let start = Instant::now();
        if let Err(message) = spec.validate() {
            return (
                Outcome::failed(ErrorKind::InvalidRequest, message),
                Teardown::of(self.sandbox),
            );
        }
        let Prepared {
            mut sandbox,
            runner,
            ..
        } = self;
        let stops = Stops { interrupt, cancel };
        // The request's now: the default CPU weight and the request's CPU quota, before
        // anything of the request reaches the sandbox.
        if let Err(message) = sandbox.set_background(false) {
            return sandbox.failed_before_running(message, start);
        }
        let Some(runner) = runner else {
            return super::execute_to(sandbox, spec, start, sink, stops, End::Reported);
        };
        // What the preload cost is not the request's: its CPU time is not counted, and the
        // memory it holds is added to the limit, so the code gets the whole of its limit
        // on top, as in a cold run.
        sandbox.cpu_base = sandbox.usage().and_then(|u| u.cpu).unwrap_or_default();
        sandbox.grant_current_memory();
        sandbox.reset_peak_memory();
        if !spec.exec.files.is_empty() {
            if let Err(message) = sandbox.write_files(&spec.exec.files) {
                return sandbox.failed_before_running(message, start);
            }
        }
        let Runner {
            mut control,
            stdin,
            pipes,
        } = runner;
        let env: serde_json::Map<String, serde_json::Value> = spec
            .exec
            .env
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        let mut request = serde_json::json!({
            "argv": spec.exec.argv,
            "env": env,
            "stdin": spec.exec.stdin.is_some(),
            "cwd": "/work",
        })
        .to_string();
        request.push('\n');
        if let Err(e) = std::io::Write::write_all(&mut control, request.as_bytes()) {
            return sandbox
                .failed_before_running(format!("the pre-started interpreter is gone: {e}"), start);
        }
        drop(control);
        // The request's stdin, fed as a cold run's is; none: EOF (the bootstrap puts
        // /dev/null on fd 0, as a cold run has it).
        let mut stdin = File::from(stdin);
        match spec.exec.stdin.clone() {
            Some(bytes) => drop(std::thread::spawn(move || {
                let _ = std::io::Write::write_all(&mut stdin, &bytes);
            })),
            None => drop(stdin),
        }
        let (mut outcome, teardown) =
            sandbox.supervise_to(pipes, &spec.exec, start, sink, stops, End::Reported);
        // The phases of a sandbox built before its request say nothing about it.
        outcome.phases = None;
        (outcome, teardown)
    }
}

/// A Python script run as `python3 FILE [ARGS]`: what the bootstrap can take over.
fn prestartable(exec: &Exec) -> bool {
    exec.argv.len() >= 2 && exec.argv[0] == "python3" && !exec.argv[1].starts_with('-')
}

/// Spawns the bootstrap as the sandbox's last payload, with `exec`'s environment and
/// output rules: its exit ends the sandbox, and its output files come back then.
fn start_runner(
    sandbox: &mut Sandbox,
    exec: &Exec,
    modules: &[String],
) -> Result<Runner, StartError> {
    let failed = |what: &str, e: &dyn std::fmt::Display| StartError {
        kind: ErrorKind::Setup,
        message: format!("cannot pre-start the interpreter: {what}: {e}"),
    };
    let (stdin_r, stdin_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| failed("stdin pipe", &e))?;
    let (stdout, stdout_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| failed("stdout pipe", &e))?;
    let (stderr, stderr_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| failed("stderr pipe", &e))?;
    let (control, control_child) = UnixStream::pair().map_err(|e| failed("control socket", &e))?;
    let mut argv = vec!["python3".to_string(), "-c".into(), PRESTART.into()];
    argv.extend(modules.iter().cloned());
    let boot = Exec {
        argv,
        files: Vec::new(),
        stdin: None,
        ..exec.clone()
    };
    let child_end = OwnedFd::from(control_child);
    sandbox
        .spawn_saying_end(
            &boot,
            &[stdin_r.as_fd(), stdout_w.as_fd(), stderr_w.as_fd()],
            child_end.as_fd(),
        )
        .map_err(|e| StartError {
            kind: ErrorKind::Setup,
            message: format!("cannot pre-start the interpreter: {}", e.describe("spawn")),
        })?;
    drop((child_end, stdin_r, stdout_w, stderr_w));
    // Ready once its preload is imported: a request handed over sooner would wait for
    // it, and have its memory charged to the request.
    let mut control = control;
    control
        .set_read_timeout(Some(PRELOAD_TIMEOUT))
        .map_err(|e| failed("control socket", &e))?;
    let mut ready = [0u8; 6];
    match std::io::Read::read_exact(&mut control, &mut ready) {
        Ok(()) if &ready == b"ready\n" => {}
        Ok(()) => return Err(failed("its first word", &String::from_utf8_lossy(&ready))),
        Err(e) => {
            // What it printed says why (a broken image, an import that crashed it).
            let mut said = Vec::new();
            let _ = super::set_nonblocking(stderr.as_fd());
            let _ = std::io::Read::read_to_end(&mut File::from(stderr), &mut said);
            let said = String::from_utf8_lossy(&said);
            return Err(failed(
                "it did not get ready",
                &format!("{e}; {}", said.trim()),
            ));
        }
    }
    control
        .set_read_timeout(None)
        .map_err(|e| failed("control socket", &e))?;
    Ok(Runner {
        control,
        stdin: stdin_w,
        pipes: OutputPipes {
            stdout: File::from(stdout),
            stderr: File::from(stderr),
        },
    })
}
