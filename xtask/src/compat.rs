//! `cargo xtask compat`: real test suites bare and in the sandbox, side by side.
//!
//! CPython's own regression tests (Debian's libpython3.11-testsuite, installed when
//! missing) run module by module twice: bare, as an unprivileged user (nobody) with the
//! same environment, and in a sandbox of the `ci` profile with the host's /usr
//! (`--rootfs host --memory 2G --pids 512 --cpus 2`). A Node counterpart, a `node --test`
//! suite of what npm packages use at start-up (xtask/compat/node_apis.test.js), runs the
//! same way. Each run reports JUnit XML; every test whose result differs is looked up in
//! [`REASONS`], which says why: a deliberate denial (with the policy that causes it and why
//! a user is better off with it) or a bug. COMPATIBILITY.md is the table.
//!
//! `--quick` runs a short subset and writes nothing: it fails when a difference has no
//! reason or its reason is a bug, which is what .ci/run checks.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::host::{install_missing, status, workspace_root, Recommends, Runner};

/// Run CPython's regression tests and a Node suite bare and in the sandbox (root)
///
/// Installs libpython3.11-testsuite when missing, builds codecage, runs each module bare (as
/// nobody) and in a sandbox of the ci profile (--rootfs host --memory 2G --pids 512 --cpus
/// 2), compares the results test by test, and writes COMPATIBILITY.md: per module both
/// results, and for each difference the tests and the reason, deliberate (with the policy
/// behind it) or a bug. Exits 1 when a difference has no known reason or is a bug.
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Only these modules (CPython test modules, or `node`); repeatable
    #[arg(long = "module", value_name = "MODULE")]
    modules: Vec<String>,
    /// The short subset .ci/run uses; writes no report, only checks
    #[arg(long)]
    quick: bool,
    /// Where to write the report (default: COMPATIBILITY.md at the workspace root)
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// The CPython modules of the report: those issue 18 listed, in its order.
const MODULES: &[&str] = &[
    "test_socket",
    "test_os",
    "test_pty",
    "test_multiprocessing_forkserver",
    "test_asyncio.test_events",
    "test_urllib2_localnet",
    "test_httpservers",
    "test_logging",
    "test_subprocess",
    "test_resource",
    "test_concurrent_futures",
    "test_posix",
    "test_signal",
    "test_threading",
    "test_select",
    "test_selectors",
    "test_mmap",
    "test_tempfile",
    "test_shutil",
    "test_pathlib",
    "test_json",
    "test_time",
    "test_fcntl",
    "test_socketserver",
    "test_uuid",
    "test_zipfile",
    "test_tarfile",
    "test_ctypes",
    "test_faulthandler",
];

/// The subset of `--quick`: about a minute, and each of the compatibility fixes in use:
/// ptys (test_pty, test_os's openpty), loopback TCP (test_urllib2_localnet, test_os's
/// sendfile), the nobody id (test_subprocess's user and group switches), rlimits
/// (test_resource), interfaces (test_uuid, node's os.networkInterfaces()).
const QUICK: &[&str] = &[
    "test_pty",
    "test_os",
    "test_resource",
    "test_uuid",
    "test_urllib2_localnet",
    "test_subprocess",
    "node",
];

/// The pseudo-module of the Node suite.
const NODE: &str = "node";
/// The Node suite, run from a read-only volume in the sandbox.
const NODE_SUITE: &str = "xtask/compat/node_apis.test.js";
/// The directory of both, a read-only volume of every sandboxed run.
const COMPAT_DIR: &str = "xtask/compat";

/// The interpreters the comparison uses: Debian's, the same bare and in the sandbox.
const PYTHON: &str = "/usr/bin/python3";
const NODE_BIN: &str = "/usr/bin/node";

/// regrtest with a fix for a CPython bug that loses a whole module's results (see the
/// file), run from the same directory as the Node suite.
const REGRTEST: &str = "xtask/compat/regrtest.py";

/// regrtest's arguments, bare and sandboxed alike: its own limit per test, which dumps the
/// stacks of a hung test.
const REGRTEST_ARGS: &str = "--timeout 900";

/// The resources (`-u`) a module needs to run at all: test_socketserver skips itself whole
/// without `network`, though its servers and clients only use the loopback. (Given to every
/// module, `network` makes test_multiprocessing_forkserver hang until regrtest's timeout,
/// bare and sandboxed alike.)
fn resources(module: &str) -> &'static str {
    match module {
        "test_socketserver" => "-u network",
        _ => "",
    }
}

/// Wall-clock limit of one module, bare or sandboxed (the ci profile allows up to 1h).
const MODULE_TIMEOUT: Duration = Duration::from_secs(1800);

/// The environment of both runs (the sandbox adds PATH, HOME and LANG itself, and the ci
/// profile PYTHONUNBUFFERED).
const ENV: &[(&str, &str)] = &[
    (
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ),
    ("LANG", "C.UTF-8"),
    ("PYTHONUNBUFFERED", "1"),
];

/// The sandbox's flags: the ci profile with the host's /usr and the issue's limits.
const SANDBOX_FLAGS: &[&str] = &[
    "--profile",
    "ci",
    "--rootfs",
    "host",
    "--memory",
    "2G",
    "--pids",
    "512",
    "--cpus",
    "2",
    "--output-limit",
    "100M",
];

pub fn compat(args: &Args) -> Result<i32> {
    if !crate::host::is_root() {
        bail!("the comparison builds sandboxes and runs tests as another user: run it as root");
    }
    install_missing(
        &Runner::terminal(),
        &[
            // A module of the test suite itself: regrtest.py and the `test` package's
            // skeleton come with libpython3.11-stdlib, without a single test.
            (
                "/usr/lib/python3.11/test/test_os.py",
                "libpython3.11-testsuite",
            ),
            (PYTHON, "python3"),
            (NODE_BIN, "nodejs"),
            ("setpriv", "util-linux"),
        ],
        Recommends::Skip,
    )?;
    let root = workspace_root();
    let codecage = build_codecage(&root, !args.quick)?;
    let modules: Vec<String> = if !args.modules.is_empty() {
        args.modules.clone()
    } else if args.quick {
        QUICK.iter().map(|m| m.to_string()).collect()
    } else {
        MODULES
            .iter()
            .chain([&NODE])
            .map(|m| m.to_string())
            .collect()
    };
    let work = crate::host::TempTree::create_in(Path::new("/tmp"), "codecage-compat-")?;
    let mut rows = Vec::new();
    for module in &modules {
        crate::host::check_interrupted()?;
        status("Comparing", module);
        let bare = run_bare(&root, work.path(), module)?;
        if bare.cases.is_empty() {
            // Nothing to compare: a comparison of two empty runs would say "compatible".
            bail!(
                "{module} ran no test outside the sandbox (runner exit {:?}): the comparison \
                 needs its tests (libpython3.11-testsuite for CPython's, xtask/compat for \
                 node's)",
                bare.exit
            );
        }
        let sandboxed = run_sandboxed(&root, &codecage, module)?;
        let row = Row::compare(module, bare, sandboxed);
        eprintln!("  {}", row.summary());
        rows.push(row);
    }
    let report = report(&rows, &codecage)?;
    if !args.quick {
        let output = args
            .output
            .clone()
            .unwrap_or_else(|| root.join("COMPATIBILITY.md"));
        std::fs::write(&output, &report)
            .with_context(|| format!("writing {}", output.display()))?;
        status("Wrote", output.display());
    }
    let unexplained: Vec<String> = rows
        .iter()
        .flat_map(|r| r.differences.iter().map(move |d| (r, d)))
        .filter(|(_, d)| !matches!(d.reason, Some(r) if r.verdict == Verdict::Deliberate))
        .map(|(r, d)| format!("{}: {} ({})", r.module, d.test, d.sandboxed.describe()))
        .collect();
    if unexplained.is_empty() {
        status(
            "Compatible",
            "every difference is a deliberate denial with its reason",
        );
        Ok(0)
    } else {
        eprintln!("differences that are bugs or have no known reason:");
        for line in &unexplained {
            eprintln!("  {line}");
        }
        Ok(1)
    }
}

/// `cargo build` of codecage, `--release` for the report; the binary's path. `--quick`
/// takes the debug build, which `cargo xtask test` has just made in .ci/run (a release
/// build from nothing would take minutes there; what the sandbox allows is the same).
fn build_codecage(root: &Path, release: bool) -> Result<PathBuf> {
    let profile: &[&str] = if release { &["--release"] } else { &[] };
    let name = if release { "release" } else { "debug" };
    status("Building", format!("codecage ({name})"));
    let built = Command::new("cargo")
        .args(["build", "--quiet", "-p", "codecage"])
        .args(profile)
        .current_dir(root)
        .status()
        .context("running cargo")?;
    if !built.success() {
        bail!("cargo build failed");
    }
    Ok(root.join("target").join(name).join("codecage"))
}

/// What one test did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Pass,
    Skip,
    Fail,
    Error,
}

/// One test's result and, when it did not pass, the line that says why.
#[derive(Debug, Clone)]
struct Case {
    outcome: Outcome,
    detail: String,
}

impl Case {
    fn describe(&self) -> String {
        let word = match self.outcome {
            Outcome::Pass => "passed",
            Outcome::Skip => "skipped",
            Outcome::Fail => "failed",
            Outcome::Error => "error",
        };
        if self.detail.is_empty() {
            word.to_string()
        } else {
            format!("{word}: {}", self.detail)
        }
    }
}

/// One run of a module: its tests, its exit status, and how long it took.
#[derive(Debug, Default)]
struct ModuleRun {
    cases: BTreeMap<String, Case>,
    /// The runner's exit status (0: every test passed or was skipped).
    exit: Option<i32>,
    seconds: f64,
    /// What went wrong with the run itself (a timeout, a sandbox error), if anything.
    problem: Option<String>,
}

impl ModuleRun {
    fn count(&self, outcome: Outcome) -> usize {
        self.cases.values().filter(|c| c.outcome == outcome).count()
    }

    /// "pass (316 tests, 12 skipped)" or "FAIL (3 failed, 1 error of 316)".
    fn cell(&self) -> String {
        let (run, skipped) = (self.cases.len(), self.count(Outcome::Skip));
        let bad = self.count(Outcome::Fail) + self.count(Outcome::Error);
        let ok = bad == 0 && self.problem.is_none() && self.exit == Some(0);
        let mut cell = if ok {
            format!("pass ({run} tests, {skipped} skipped)")
        } else if bad > 0 {
            format!("**FAIL** ({bad} of {run} tests failed, {skipped} skipped)")
        } else {
            format!("**FAIL** ({run} tests, {skipped} skipped)")
        };
        if let Some(problem) = &self.problem {
            write!(cell, "; {problem}").unwrap();
        }
        write!(cell, ", {:.0} s", self.seconds).unwrap();
        cell
    }
}

/// A CPython module (regrtest with JUnit XML) or the Node suite, bare: as nobody, in a
/// directory of its own, with the sandbox's environment.
fn run_bare(root: &Path, work: &Path, module: &str) -> Result<ModuleRun> {
    let dir = work.join(format!("bare-{module}"));
    std::fs::create_dir_all(&dir)?;
    let junit = dir.join("junit.xml");
    for file in [NODE_SUITE, REGRTEST] {
        let file = root.join(file);
        std::fs::copy(&file, dir.join(file.file_name().unwrap()))?;
    }
    let script = if module == NODE {
        format!(
            "cd {dir} && {NODE_BIN} --test --test-reporter=junit --test-reporter-destination={junit} \
             node_apis.test.js > log 2>&1",
            dir = dir.display(),
            junit = junit.display()
        )
    } else {
        format!(
            "cd {dir} && {PYTHON} regrtest.py {REGRTEST_ARGS} {} --junit-xml {junit} {module} > log 2>&1",
            resources(module),
            dir = dir.display(),
            junit = junit.display(),
        )
    };
    chown_nobody(&dir)?;
    let mut cmd = Command::new("timeout");
    cmd.args(["--kill-after=30", &MODULE_TIMEOUT.as_secs().to_string()])
        .args([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
        ])
        .args(["env", "-i"])
        .args(ENV.iter().map(|(k, v)| format!("{k}={v}")))
        .arg(format!("HOME={}", dir.display()))
        .args(["bash", "-c", &script]);
    let start = Instant::now();
    let (status, _) = run_child(cmd, false).context("running the bare tests")?;
    let mut run = ModuleRun {
        exit: status.code(),
        seconds: start.elapsed().as_secs_f64(),
        ..ModuleRun::default()
    };
    if status.code() == Some(124) || status.code() == Some(137) {
        run.problem = Some(format!("stopped at {} s", MODULE_TIMEOUT.as_secs()));
    }
    match std::fs::read_to_string(&junit) {
        Ok(xml) => run.cases = parse_junit(&xml),
        Err(_) => {
            let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
            run.problem
                .get_or_insert_with(|| format!("no results: {}", last_line(&log)));
        }
    }
    Ok(run)
}

fn chown_nobody(dir: &Path) -> Result<()> {
    let ok = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(dir)
        .status()?
        .success();
    if !ok {
        bail!("chown of {} failed", dir.display());
    }
    Ok(())
}

/// The same in a sandbox: the results come back on stdout, the log's end on stderr.
fn run_sandboxed(root: &Path, codecage: &Path, module: &str) -> Result<ModuleRun> {
    let mut cmd = Command::new(codecage);
    cmd.args(["run", "--json"])
        .args(SANDBOX_FLAGS)
        .args(["--timeout", &format!("{}s", MODULE_TIMEOUT.as_secs())]);
    cmd.arg("-v").arg(format!(
        "{}:/work/compat:ro",
        root.join(COMPAT_DIR).display()
    ));
    let script = if module == NODE {
        format!(
            "cd /tmp && {NODE_BIN} --test --test-reporter=junit --test-reporter-destination=/tmp/junit.xml \
             /work/compat/node_apis.test.js > /tmp/log 2>&1"
        )
    } else {
        format!(
            "cd /tmp && {PYTHON} /work/compat/regrtest.py {REGRTEST_ARGS} {} --junit-xml /tmp/junit.xml \
             {module} > /tmp/log 2>&1",
            resources(module)
        )
    };
    let script = format!(
        "{script}; rc=$?; tail -c 2000 /tmp/log >&2; cat /tmp/junit.xml 2>/dev/null; exit $rc"
    );
    cmd.args(["--", "bash", "-c", &script]);
    let start = Instant::now();
    let (_, stdout) = run_child(cmd, true).context("running codecage")?;
    let seconds = start.elapsed().as_secs_f64();
    let json: serde_json::Value = serde_json::from_slice(&stdout).with_context(|| {
        format!(
            "codecage's answer is not JSON: {}",
            String::from_utf8_lossy(&stdout)
        )
    })?;
    let mut run = ModuleRun {
        exit: json["exit_code"].as_i64().map(|c| c as i32),
        seconds,
        ..ModuleRun::default()
    };
    if let Some(error) = json["error"].as_str() {
        let message = json["message"].as_str().unwrap_or_default();
        run.problem = Some(match error {
            "timeout" => format!("stopped at {} s", MODULE_TIMEOUT.as_secs()),
            _ => format!("{error}: {message}"),
        });
    }
    let stdout = json["stdout"].as_str().unwrap_or_default();
    if json["stdout_encoding"] == "base64" {
        run.problem
            .get_or_insert_with(|| "the results came back as binary".into());
    } else if stdout.contains("<testsuite") {
        run.cases = parse_junit(stdout);
    } else {
        let stderr = json["stderr"].as_str().unwrap_or_default();
        run.problem
            .get_or_insert_with(|| format!("no results: {}", last_line(stderr)));
    }
    Ok(run)
}

/// Runs `cmd` in a process group of its own that dies with xtask, waiting for it while
/// watching for SIGINT/SIGTERM (then the group is killed and the task stops). Returns its
/// status and, when `capture`, its stdout.
fn run_child(mut cmd: Command, capture: bool) -> Result<(std::process::ExitStatus, Vec<u8>)> {
    use std::io::Read as _;
    crate::host::own_group_and_die_with_parent(&mut cmd);
    cmd.stdin(Stdio::null());
    if capture {
        cmd.stdout(Stdio::piped());
    }
    let mut child = cmd.spawn()?;
    let reader = child.stdout.take().map(|mut out| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = out.read_to_end(&mut bytes);
            bytes
        })
    });
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if crate::host::interrupted().is_some() {
            crate::host::signal_group(&child, libc::SIGTERM);
            std::thread::sleep(Duration::from_secs(2));
            crate::host::signal_group(&child, libc::SIGKILL);
            let _ = child.wait();
            crate::host::check_interrupted()?;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = reader
        .map(|r| r.join().unwrap_or_default())
        .unwrap_or_default();
    Ok((status, stdout))
}

fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}

/// The test cases of a JUnit XML report (regrtest's or node's): name -> result. A case
/// that failed keeps the last line of its message or traceback.
fn parse_junit(xml: &str) -> BTreeMap<String, Case> {
    let mut cases = BTreeMap::new();
    for chunk in xml.split("<testcase ").skip(1) {
        let head_end = chunk.find('>').unwrap_or(chunk.len());
        let head = &chunk[..head_end];
        let Some(mut name) = attribute(head, "name") else {
            continue;
        };
        if let Some(class) = attribute(head, "classname").filter(|c| !c.is_empty() && c != "test") {
            name = format!("{class}.{name}");
        }
        let body = if head.ends_with('/') {
            ""
        } else {
            let rest = &chunk[head_end + 1..];
            &rest[..rest.find("</testcase>").unwrap_or(rest.len())]
        };
        let (outcome, tag) = if body.contains("<error") {
            (Outcome::Error, "<error")
        } else if body.contains("<failure") {
            (Outcome::Fail, "<failure")
        } else if body.contains("<skipped") {
            (Outcome::Skip, "<skipped")
        } else {
            (Outcome::Pass, "")
        };
        let detail = if tag.is_empty() {
            String::new()
        } else {
            let element = &body[body.find(tag).unwrap()..];
            let element_head = &element[..element.find('>').unwrap_or(element.len())];
            let text = element
                .find('>')
                .map(|i| &element[i + 1..])
                .map(|t| &t[..t.find("</").unwrap_or(t.len())])
                .unwrap_or("");
            let from_text = last_line(&unescape(text));
            let message = attribute(element_head, "message").unwrap_or_default();
            if from_text.is_empty() || (outcome == Outcome::Skip && !message.is_empty()) {
                message
            } else {
                from_text
            }
        };
        let detail: String = detail.chars().take(300).collect();
        // A test run twice (subtests, reruns) keeps its worst result.
        let case = Case { outcome, detail };
        match cases.get(&name) {
            Some(Case { outcome: old, .. }) if *old >= outcome => {}
            _ => drop(cases.insert(name, case)),
        }
    }
    cases
}

fn attribute(head: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let start = format!(" {head}").find(&key)? + key.len() - 1;
    let value = &head[start..];
    Some(unescape(&value[..value.find('"')?]))
}

fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#10;", "\n")
        .replace("&amp;", "&")
}

/// Whether a difference is a deliberate denial or a bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The sandbox refuses it on purpose; `policy` names the layer.
    Deliberate,
    /// Something the sandbox should allow and does not: a row to fix. (None is known now;
    /// the variant is how a newly found one is recorded until it is fixed.)
    #[allow(dead_code)]
    Bug,
}

/// Why tests of a module behave differently in the sandbox.
#[derive(Debug)]
struct Reason {
    module: &'static str,
    /// Tests whose name contains one of these (empty: any test of the module).
    tests: &'static [&'static str],
    /// And whose sandboxed result's detail contains this (empty: any).
    detail: &'static str,
    verdict: Verdict,
    /// The policy that causes it (the layer and its setting).
    policy: &'static str,
    /// For a deliberate denial: what it protects and why a user is better off with it.
    why: &'static str,
}

/// Every known reason for a difference. A difference that matches none is unexplained,
/// which fails the task like a bug.
const REASONS: &[Reason] = &[
    Reason {
        module: "test_socket",
        tests: &["UDPLITE"],
        detail: "",
        verdict: Verdict::Deliberate,
        policy: "seccomp: IP sockets of TCP, UDP and ICMP only (profiles/seccomp, deny filter)",
        why: "UDP-Lite (IPPROTO_UDPLITE) is refused like every IP protocol but TCP, UDP and ICMP: \
              each protocol allowed is kernel code a hostile payload can reach, and the kernel \
              itself deprecates this one (it logs \"UDP-Lite is deprecated and scheduled to be \
              removed\" at the first socket); nothing but its own tests uses it.",
    },
    Reason {
        module: "test_uuid",
        tests: &["test_ip_getnode", "test_ifconfig_getnode"],
        detail: "requires",
        verdict: Verdict::Deliberate,
        policy: "network mode none: a network namespace with only lo",
        why: "The tests read a hardware (MAC) address from `ip link` or `ifconfig`, and skip \
              without one. The sandbox's only interface is its own loopback, which has none: the \
              host's addresses identify the host and its network, which a sandbox does not \
              reveal. uuid1() still works (with a random node, as the RFC allows).",
    },
];

/// One difference: a test whose result in the sandbox is not its bare result.
#[derive(Debug)]
struct Difference {
    test: String,
    bare: Case,
    sandboxed: Case,
    reason: Option<&'static Reason>,
}

/// One module, both runs, and what differs.
#[derive(Debug)]
struct Row {
    module: String,
    bare: ModuleRun,
    sandboxed: ModuleRun,
    differences: Vec<Difference>,
}

impl Row {
    fn compare(module: &str, bare: ModuleRun, sandboxed: ModuleRun) -> Row {
        let missing = Case {
            outcome: Outcome::Error,
            detail: "not run".into(),
        };
        let mut differences = Vec::new();
        let names: std::collections::BTreeSet<&String> =
            bare.cases.keys().chain(sandboxed.cases.keys()).collect();
        for name in names {
            let b = bare.cases.get(name).unwrap_or(&missing);
            let s = sandboxed.cases.get(name).unwrap_or(&missing);
            // Worse in the sandbox: failed or skipped where bare passed, failed where bare
            // skipped.
            if s.outcome > b.outcome {
                let reason = REASONS.iter().find(|r| {
                    r.module == module
                        && (r.tests.is_empty() || r.tests.iter().any(|t| name.contains(t)))
                        && s.detail.contains(r.detail)
                });
                differences.push(Difference {
                    test: name.clone(),
                    bare: b.clone(),
                    sandboxed: s.clone(),
                    reason,
                });
            }
        }
        // A sandboxed run that broke as a whole is a difference too.
        if let (Some(problem), None) = (&sandboxed.problem, &bare.problem) {
            differences.push(Difference {
                test: "(the whole module)".into(),
                bare: Case {
                    outcome: Outcome::Pass,
                    detail: String::new(),
                },
                sandboxed: Case {
                    outcome: Outcome::Error,
                    detail: problem.clone(),
                },
                reason: None,
            });
        }
        Row {
            module: module.to_string(),
            bare,
            sandboxed,
            differences,
        }
    }

    fn summary(&self) -> String {
        format!(
            "bare: {}; sandbox: {}; {} differences",
            self.bare.cell(),
            self.sandboxed.cell(),
            self.differences.len()
        )
    }

    fn verdict_cell(&self) -> String {
        if self.differences.is_empty() {
            return "same".into();
        }
        let bugs = self
            .differences
            .iter()
            .filter(|d| !matches!(d.reason, Some(r) if r.verdict == Verdict::Deliberate))
            .count();
        let deliberate = self.differences.len() - bugs;
        match (deliberate, bugs) {
            (d, 0) => format!("{d} deliberate"),
            (0, b) => format!("**{b} bug**"),
            (d, b) => format!("{d} deliberate, **{b} bug**"),
        }
    }
}

fn report(rows: &[Row], codecage: &Path) -> Result<String> {
    let mut out = String::new();
    writeln!(out, "# Compatibility\n")?;
    writeln!(
        out,
        "Written by `cargo xtask compat` on {}. Each module of CPython's regression tests \
         (Debian's libpython3.11-testsuite, {python}) ran twice: bare, as the unprivileged user \
         nobody, and in a sandbox of the `ci` profile with the host's /usr (`codecage run {flags}`), \
         both with `python3 -m test --junit-xml`. The Node counterpart, `node`, is a `node --test` \
         suite of what npm packages use at start-up ([{NODE_SUITE}]({NODE_SUITE}), {node}), run the \
         same way from a read-only volume.\n",
        machine(),
        python = version(PYTHON),
        node = version(NODE_BIN),
        flags = SANDBOX_FLAGS.join(" "),
    )?;
    writeln!(
        out,
        "A difference is a test that passed bare and failed, erred or was skipped in the sandbox \
         (or was skipped bare and failed in the sandbox). Each is either a deliberate denial, with \
         the policy behind it and why a user is better off with it, or a bug. `{}` is the binary \
         compared.\n",
        codecage.display()
    )?;
    writeln!(out, "| module | bare | sandbox | differences |")?;
    writeln!(out, "|---|---|---|---|")?;
    for row in rows {
        writeln!(
            out,
            "| {} | {} | {} | {} |",
            row.module,
            row.bare.cell(),
            row.sandboxed.cell(),
            row.verdict_cell()
        )?;
    }
    let with_differences: Vec<&Row> = rows.iter().filter(|r| !r.differences.is_empty()).collect();
    if !with_differences.is_empty() {
        writeln!(out, "\n## Differences\n")?;
    }
    for row in with_differences {
        writeln!(out, "### {}\n", row.module)?;
        // Grouped by reason, so that one explanation covers its tests.
        let mut groups: Vec<(Option<&'static Reason>, Vec<&Difference>)> = Vec::new();
        for d in &row.differences {
            let key = d.reason.map(|r| r as *const Reason);
            match groups
                .iter_mut()
                .find(|(r, _)| r.map(|r| r as *const Reason) == key)
            {
                Some((_, list)) => list.push(d),
                None => groups.push((d.reason, vec![d])),
            }
        }
        for (reason, list) in groups {
            match reason {
                Some(r) => {
                    let verdict = match r.verdict {
                        Verdict::Deliberate => "deliberate",
                        Verdict::Bug => "**bug**",
                    };
                    writeln!(out, "- {verdict}, {}: {}", r.policy, r.why)?;
                }
                None => writeln!(out, "- **unexplained** (treated as a bug):")?,
            }
            for line in difference_lines(&list) {
                writeln!(out, "  - {}", line.replace('|', "\\|"))?;
            }
        }
        writeln!(out)?;
    }
    Ok(out)
}

/// The differences of one reason, a line per test class: its tests by name, and the bare
/// and sandboxed results they share (the first test's, when they differ).
fn difference_lines(list: &[&Difference]) -> Vec<String> {
    let mut classes: Vec<(&str, Vec<&Difference>)> = Vec::new();
    for d in list {
        let class = d.test.rsplit_once('.').map_or("", |(class, _)| class);
        match classes.iter_mut().find(|(c, _)| *c == class) {
            Some((_, tests)) => tests.push(d),
            None => classes.push((class, vec![d])),
        }
    }
    classes
        .into_iter()
        .map(|(class, tests)| {
            let first = tests[0];
            let results = format!(
                "bare {}; sandbox {}",
                first.bare.describe(),
                first.sandboxed.describe()
            );
            if tests.len() == 1 || class.is_empty() {
                let names: Vec<String> = tests.iter().map(|d| format!("`{}`", d.test)).collect();
                return format!("{}: {results}", names.join(", "));
            }
            let names: Vec<&str> = tests
                .iter()
                .map(|d| d.test.rsplit_once('.').map_or(d.test.as_str(), |(_, n)| n))
                .collect();
            format!(
                "`{class}` ({} tests: {}): {results}",
                tests.len(),
                names.join(", ")
            )
        })
        .collect()
}

fn version(program: &str) -> String {
    Command::new(program)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn machine() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let date = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    format!(
        "{} (Linux {}, {} CPUs)",
        &date[..10],
        kernel.trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn junit_of_regrtest_and_node_parses() {
        let xml = r#"<testsuites><testsuite tests="4"><testcase name="test.test_os.A.test_ok" status="run" result="completed" time="0.1" /><testcase name="test.test_os.A.test_skip" status="run" result="completed" time="0"><skipped message="no pty">no pty</skipped></testcase><testcase name="test.test_os.A.test_bad" status="run"><failure type="AssertionError" message="x">Traceback:&#10;  line&#10;PermissionError: [Errno 13] Permission denied</failure></testcase><testcase name="adds" time="0.001" classname="test"/></testsuite></testsuites>"#;
        let cases = parse_junit(xml);
        assert_eq!(cases["test.test_os.A.test_ok"].outcome, Outcome::Pass);
        assert_eq!(cases["test.test_os.A.test_skip"].outcome, Outcome::Skip);
        assert_eq!(cases["test.test_os.A.test_skip"].detail, "no pty");
        let bad = &cases["test.test_os.A.test_bad"];
        assert_eq!(bad.outcome, Outcome::Fail);
        assert_eq!(bad.detail, "PermissionError: [Errno 13] Permission denied");
        assert_eq!(cases["adds"].outcome, Outcome::Pass);
    }

    #[test]
    fn a_difference_is_explained_only_by_its_modules_reasons() {
        let pass = Case {
            outcome: Outcome::Pass,
            detail: String::new(),
        };
        let fail = Case {
            outcome: Outcome::Error,
            detail: "PermissionError: [Errno 1] Operation not permitted".into(),
        };
        let run = |case: &Case| ModuleRun {
            cases: [(
                "test.test_socket.BasicUDPLITETest.testRecvFrom".to_string(),
                case.clone(),
            )]
            .into(),
            exit: Some(0),
            ..ModuleRun::default()
        };
        let row = Row::compare("test_socket", run(&pass), run(&fail));
        assert_eq!(row.differences.len(), 1);
        assert_eq!(
            row.differences[0].reason.unwrap().verdict,
            Verdict::Deliberate
        );
        let row = Row::compare("test_os", run(&pass), run(&fail));
        assert!(row.differences[0].reason.is_none());
        let row = Row::compare("test_socket", run(&fail), run(&pass));
        assert!(row.differences.is_empty());
    }

    #[test]
    fn parses_arguments() {
        use crate::{tests::parse, Task};
        let Ok(Task::Compat(a)) = parse(&["compat", "--quick", "--module", "test_os"]) else {
            panic!()
        };
        assert!(a.quick);
        assert_eq!(a.modules, ["test_os"]);
        assert!(parse(&["compat", "extra"]).is_err());
    }

    #[test]
    fn every_reason_names_its_policy_and_every_deliberate_one_says_why() {
        for r in REASONS {
            assert!(!r.policy.is_empty(), "{r:?}");
            if r.verdict == Verdict::Deliberate {
                assert!(r.why.len() > 40, "{r:?}");
            }
            assert!(MODULES.contains(&r.module) || r.module == NODE, "{r:?}");
        }
    }
}
