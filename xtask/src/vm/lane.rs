//! `cargo xtask vm-test`, `vm-check`, `vm-build` and `vm-matrix`: the lanes
//! ([`super::lanes`]) on top of [`super::run`].

use super::ensure_image;
use super::lanes::{self, Lane, Profiles};
use super::matrix::{self, LaneDir, LaneReport};
use super::run::{self, parse_env, parse_timeout, RunOptions};
use crate::host::{interrupted, secs, status, workspace_root};
use anyhow::{bail, ensure, Context, Result};
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The package whose integration tests the lane runs.
const PACKAGE: &str = "codecage";

/// Host variables passed on to the tests when set (they steer libtest and
/// logging, and a developer expects them to work in the VM too).
const FORWARDED_ENV: &[&str] = &[
    "RUST_BACKTRACE",
    "RUST_LIB_BACKTRACE",
    "RUST_LOG",
    "RUST_MIN_STACK",
    "RUST_TEST_THREADS",
    "RUST_TEST_NOCAPTURE",
];

/// Run the integration tests in the VM lanes
///
/// Builds codecage's binary and integration tests on the host, then, for each lane (--lane,
/// default v2-6.12; `all` for every lane), boots its VM ONCE and runs there: the probe of
/// the support matrix (kernel features, codecage doctor, a run of the default python
/// profile), then the lane's tests (every suite but image:: in v2-6.12, a subset in the
/// others; see `cargo xtask vm-test --help` and xtask/vm/README.md), with
/// CODECAGE_TEST_LAYOUT and CODECAGE_IN_VM=1 set. TEST-ARGS (libtest filters and flags,
/// e.g. `-- limits:: --test-threads 1`) replace the lane's selection. Prints a summary per
/// lane and the support matrix; exits 0 when every lane passed, else with the first
/// failing lane's status (124: timeout, 125: the VM failed).
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment, after_long_help = lane_list())]
pub struct TestArgs {
    /// A lane to run (repeatable; `all`: every lane). Default: v2-6.12
    #[arg(long = "lane", value_name = "NAME", value_parser = lanes::parse_lane)]
    pub lanes: Vec<String>,
    /// Build and test in release mode
    #[arg(long)]
    release: bool,
    /// Time limit of each lane's tests in whole seconds (boot not included)
    #[arg(long, value_name = "SECS", default_value_t = TEST_TIMEOUT_SECS, value_parser = parse_timeout)]
    timeout: u64,
    /// Extra environment for the tests (repeatable)
    ///
    /// K=V, or K for the host's value of K.
    #[arg(long, value_name = "K=V|K", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Passed to every test executable instead of the lane's selection (libtest filters
    /// and flags)
    #[arg(last = true, value_name = "TEST-ARGS")]
    test_args: Vec<String>,
}

impl TestArgs {
    /// The defaults of `vm-test`, in `lanes` (names, or `all`).
    pub fn new(lanes: Vec<String>) -> TestArgs {
        TestArgs {
            lanes,
            release: false,
            timeout: TEST_TIMEOUT_SECS,
            env: Vec::new(),
            test_args: Vec::new(),
        }
    }
}

/// The lanes and what each runs, for `--help`.
pub fn lane_list() -> String {
    let mut s = String::from("Lanes:\n");
    for lane in lanes::LANES {
        s.push_str(&format!(
            "  {:<13} kernel from {}, cgroup {}; tests: {}\n                {}\n",
            lane.name,
            lane.kernel_suite,
            lane.cgroups.name(),
            lane.selection(),
            lane.stands_for
        ));
    }
    s
}

/// `--lane NAME` (repeatable) or `--lane all`.
#[derive(clap::Args, Debug, Default)]
pub struct LaneArgs {
    /// A lane (repeatable; `all`: every lane). Default: v2-6.12
    #[arg(long = "lane", value_name = "NAME", value_parser = lanes::parse_lane)]
    pub lanes: Vec<String>,
}

/// `vm-test`'s time limit, per lane.
const TEST_TIMEOUT_SECS: u64 = 1800;

/// Runs in the guest: the probe with the built-in profiles, the tests given before
/// `--opt-in`; then, when `--opt-in` is there, installs the lane's opt-in profiles, probes
/// again and runs the tests after it. The test executables come before the first `--`.
/// Every executable runs (like `cargo test --no-fail-fast`); the status is the first
/// failure's, except that 101 (failed tests, which the host checks against the lane's known
/// failures) gives way to anything worse. The tests' output is also kept in
/// $LANE_DIR/tests.log.
const TEST_RUNNER_SH: &str = r#"
set -u
bins=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do bins+=("$1"); shift; done
[ "$#" -gt 0 ] && shift
built_in=()
while [ "$#" -gt 0 ] && [ "$1" != "--opt-in" ]; do built_in+=("$1"); shift; done
opt_in=()
have_opt_in=0
if [ "$#" -gt 0 ]; then shift; have_opt_in=1; opt_in=("$@"); fi
status=0
failed=()
probe() {
    echo "     Probing lane $LANE ($1 profiles)"
    python3 "$LANE_DIR/probe.py" "$LANE_DIR/$1.json" || {
        failed+=("the probe ($1)")
        [ "$status" -eq 0 ] && status=1
    }
}
run_tests() {
    local what=$1
    shift
    for bin in "${bins[@]}"; do
        echo "     Running ${bin#"$PWD"/} (lane $LANE, $what)"
        "$bin" "$@" 2>&1 | tee -a "$LANE_DIR/tests.log"
        rc=${PIPESTATUS[0]}
        if [ "$rc" -ne 0 ]; then
            failed+=("${bin##*/} with $what (status $rc)")
            # 101 (tests failed) only when nothing worse happened.
            if [ "$status" -eq 0 ] || { [ "$status" -eq 101 ] && [ "$rc" -ne 101 ]; }; then
                status=$rc
            fi
        fi
    done
}
# The lane's opt-in: each profile of profiles/ with landlock = "best-effort", in
# /etc/codecage/profiles, where codecage looks for a profile by name before its own.
install_opt_in() {
    mkdir -p /etc/codecage/profiles
    for f in "$CARGO_MANIFEST_DIR"/profiles/*.toml; do
        to=/etc/codecage/profiles/${f##*/}
        if grep -q '^landlock *=' "$f"; then
            sed 's/^landlock *=.*/landlock = "best-effort"/' "$f" >"$to"
        elif grep -q '^\[hardening\]' "$f"; then
            sed 's/^\[hardening\]/&\nlandlock = "best-effort"/' "$f" >"$to"
        else
            { cat "$f"; printf '\n[hardening]\nlandlock = "best-effort"\n'; } >"$to"
        fi
        echo "     Installed $to: ${f#"$PWD"/} with landlock = \"best-effort\""
    done
}
probe built-in
# With --opt-in and nothing before it, no tests run with the built-in profiles.
if [ "${#bins[@]}" -gt 0 ] && { [ "${#built_in[@]}" -gt 0 ] || [ "$have_opt_in" = 0 ]; }; then
    run_tests "built-in profiles" "${built_in[@]}"
fi
if [ "$have_opt_in" = 1 ]; then
    install_opt_in
    probe opt-in
    [ "${#bins[@]}" -gt 0 ] && run_tests 'landlock = "best-effort"' "${opt_in[@]}"
fi
if [ "${#failed[@]}" -gt 0 ]; then
    echo "error: in lane $LANE, ${#failed[@]} failed:"
    printf '    %s\n' "${failed[@]}"
fi
exit "$status"
"#;

/// `cargo xtask vm-test`.
pub fn vm_test(args: &TestArgs) -> Result<i32> {
    let lanes = lanes::select(&args.lanes)?;
    lane_jobs()?;
    let root = workspace_root();
    let built = build_tests(&root, args.release)?;
    if built.tests.is_empty() {
        bail!(
            "package `{PACKAGE}` has no integration test executables (tests/*.rs) yet: \
             nothing to run in the VM"
        );
    }
    let share = root.canonicalize()?;
    for exe in built.tests.iter().chain(&built.bin) {
        ensure!(
            exe.starts_with(&share),
            "{} is outside the shared directory {}: the VM cannot see it \
             (is CARGO_TARGET_DIR pointing elsewhere?)",
            exe.display(),
            share.display()
        );
    }
    eprintln!(
        "[vm-test] {} test executables: {}",
        built.tests.len(),
        built
            .tests
            .iter()
            .map(|p| p.file_name().unwrap_or_default().to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    run_lanes(&lanes, &share, &built, args, true)
}

/// `cargo xtask vm-matrix`: the probe of each lane, without tests, and the matrix.
pub fn vm_matrix(args: &MatrixArgs) -> Result<i32> {
    let lanes = if args.lanes.lanes.is_empty() {
        lanes::LANES.to_vec()
    } else {
        lanes::select(&args.lanes.lanes)?
    };
    let root = workspace_root();
    let built = build_tests(&root, false)?;
    let share = root.canonicalize()?;
    let mut test_args = TestArgs::new(Vec::new());
    test_args.timeout = CHECK_TIMEOUT_SECS * 2;
    run_lanes(&lanes, &share, &built, &test_args, false)
}

/// How many lanes run at once unless `CODECAGE_VM_JOBS` says: two. Under TCG a lane
/// keeps a 2-core host about 55 % busy (its tests wait on sandboxes, timeouts and the
/// guest's 9p share), so a second lane beside it uses what the first leaves; see
/// xtask/vm/README.md, "Timings".
const DEFAULT_JOBS: usize = 2;

/// `CODECAGE_VM_JOBS` (a positive whole number), else [`DEFAULT_JOBS`].
pub(crate) fn lane_jobs() -> Result<usize> {
    parse_jobs(std::env::var("CODECAGE_VM_JOBS").ok().as_deref())
}

fn parse_jobs(value: Option<&str>) -> Result<usize> {
    match value {
        None => Ok(DEFAULT_JOBS),
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!("CODECAGE_VM_JOBS={v:?}: want how many lanes run at once, 1 or more"),
        },
    }
}

/// Runs the lanes (the probe, and the tests when `with_tests`), [`lane_jobs`] at a time,
/// reports each and the matrix, and returns the first failing lane's status. A lane that
/// cannot start (its image does not build) fails alone; an interrupt stops them all. Lanes
/// that run side by side each write their output to `target/vm-lanes/LANE.log`, printed
/// whole when the lane ends. `vm-test` and `vm-matrix` both run lanes this way.
fn run_lanes(
    lanes: &[Lane],
    share: &Path,
    built: &Built,
    args: &TestArgs,
    with_tests: bool,
) -> Result<i32> {
    let target = target_dir(share);
    let jobs = lane_jobs()?.min(lanes.len()).max(1);
    let wall = Instant::now();
    let announce = |i: usize, lane: &Lane| {
        status(
            "Lane",
            format!(
                "{} ({}/{}): kernel from {}, cgroup {}, tests: {}",
                lane.name,
                i + 1,
                lanes.len(),
                lane.kernel_suite,
                lane.cgroups.name(),
                if with_tests {
                    lane.selection()
                } else {
                    "none (probe only)".into()
                }
            ),
        );
    };
    // One lane, its problems said after its output; Err only when interrupted.
    let one = |lane: &Lane| -> Result<LaneReport> {
        let start = Instant::now();
        let report = match run_lane(lane, share, &target, built, args, with_tests) {
            Ok(report) => report,
            Err(e) if interrupted().is_none() => {
                run::say!("[vm-test] lane {}: {e:#}", lane.name);
                LaneReport::not_started(lane, start.elapsed(), format!("{e:#}"))
            }
            Err(e) => return Err(e),
        };
        for problem in &report.problems {
            run::say!("[vm-test] lane {}: {problem}", lane.name);
        }
        Ok(report)
    };
    let mut reports: Vec<LaneReport> = Vec::new();
    if jobs == 1 {
        for (i, lane) in lanes.iter().enumerate() {
            announce(i, lane);
            reports.push(one(lane)?);
            if let Some(sig) = interrupted() {
                return Ok(128 + sig);
            }
        }
    } else {
        // Each kernel's image first (ensure_image builds one at a time), so that a build's
        // messages reach the terminal rather than a lane's log and no lane waits on
        // another's build. A failure here shows again in the lane, which fails alone.
        let mut suites: Vec<&str> = lanes.iter().map(|l| l.kernel_suite).collect();
        suites.sort_unstable();
        suites.dedup();
        for suite in suites {
            if let Err(e) = ensure_image(suite) {
                eprintln!("[vm-test] the image with the {suite} kernel: {e:#}");
            }
        }
        let logs = target.join("vm-lanes");
        std::fs::create_dir_all(&logs)?;
        eprintln!(
            "[vm-test] {} lanes, {jobs} at a time (CODECAGE_VM_JOBS); each lane's output is \
             printed when it ends",
            lanes.len()
        );
        let next = std::sync::atomic::AtomicUsize::new(0);
        let (done, finished) = std::sync::mpsc::channel();
        let mut slots: Vec<Option<LaneReport>> = lanes.iter().map(|_| None).collect();
        std::thread::scope(|scope| -> Result<()> {
            for _ in 0..jobs {
                let done = done.clone();
                let (next, announce, one, logs) = (&next, &announce, &one, &logs);
                scope.spawn(move || loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if i >= lanes.len() || interrupted().is_some() {
                        break;
                    }
                    let lane = &lanes[i];
                    announce(i, lane);
                    let log = logs.join(format!("{}.log", lane.name));
                    // A log that cannot be made fails its lane alone, as an image would.
                    let report = match std::fs::File::create(&log) {
                        Ok(file) => {
                            run::log_to(Some(file));
                            let report = one(lane);
                            run::log_to(None);
                            report
                        }
                        Err(e) => Ok(LaneReport::not_started(
                            lane,
                            std::time::Duration::ZERO,
                            format!("cannot create {}: {e}", log.display()),
                        )),
                    };
                    if done.send((i, report, log)).is_err() {
                        break;
                    }
                });
            }
            drop(done);
            // Every lane's log is printed, as bytes (the guest's output need not be UTF-8),
            // and a closed stdout (piped into `head`) stops nothing; an error (an
            // interrupt) is returned once both lanes have ended.
            let mut first_err = None;
            for (i, report, log) in finished {
                let lane = &lanes[i];
                let text = std::fs::read(&log)
                    .unwrap_or_else(|e| format!("(cannot read {}: {e})\n", log.display()).into());
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "\n===== lane {} ({}) =====", lane.name, log.display());
                let _ = out.write_all(&text);
                let _ = writeln!(out, "===== lane {} ends =====", lane.name);
                let _ = out.flush();
                match report {
                    Ok(report) => slots[i] = Some(report),
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            first_err.map_or(Ok(()), Err)
        })?;
        if let Some(sig) = interrupted() {
            return Ok(128 + sig);
        }
        reports.extend(slots.into_iter().flatten());
    }
    let matrix = matrix::markdown(&reports);
    let _ = std::fs::write(target.join("vm-lanes").join("matrix.md"), &matrix);
    println!("\nSupport matrix (target/vm-lanes/matrix.md):\n\n{matrix}");
    println!("Lanes:");
    for r in &reports {
        println!("  {}", r.summary_line());
    }
    let total: std::time::Duration = reports.iter().map(|r| r.elapsed).sum();
    let failed: Vec<&LaneReport> = reports.iter().filter(|r| !r.passed()).collect();
    println!(
        "{} of {} lanes passed in {} ({} of lanes' time, {jobs} at a time)",
        reports.len() - failed.len(),
        reports.len(),
        secs(wall.elapsed()),
        secs(total)
    );
    Ok(failed.first().map_or(0, |r| r.exit_status()))
}

/// One lane: its image, one boot, and what it left in its directory.
fn run_lane(
    lane: &Lane,
    share: &Path,
    target: &Path,
    built: &Built,
    args: &TestArgs,
    with_tests: bool,
) -> Result<LaneReport> {
    let start = Instant::now();
    let image = ensure_image(lane.kernel_suite)?;
    let dir = LaneDir::new(target, lane);
    dir.prepare()?;
    let mut command = vec![
        "bash".to_string(),
        "-c".to_string(),
        TEST_RUNNER_SH.to_string(),
        "vm-test".to_string(),
    ];
    if with_tests {
        command.extend(built.tests.iter().map(|p| p.display().to_string()));
    }
    command.push("--".to_string());
    if !args.test_args.is_empty() {
        // The developer's selection, under the lane's profiles.
        if lane.profiles != Profiles::Default {
            command.push("--opt-in".to_string());
        }
        command.extend(args.test_args.iter().cloned());
    } else {
        let (built_in, opt_in) = lane.test_phases();
        command.extend(built_in);
        if let Some(opt_in) = opt_in {
            command.push("--opt-in".to_string());
            command.extend(opt_in);
        }
    }
    let mut opts = RunOptions::new(command);
    opts.share = share.to_path_buf();
    opts.cwd = share.to_path_buf();
    opts.timeout = args.timeout;
    opts.env = test_env(lane, share, built.bin.as_deref());
    opts.env.push(("LANE".to_string(), lane.name.to_string()));
    opts.env
        .push(("LANE_DIR".to_string(), dir.0.display().to_string()));
    opts.env.extend(args.env.iter().cloned());
    let mut rc = run::run(lane, &image, &opts)?;
    let mut retried = None;
    if rc == super::EXIT_VM_FAILED && interrupted().is_none() {
        // The VM died under the command (a guest kernel oops under multi-threaded TCG, seen
        // with 6.12 a few seconds into a boot; the console above shows it). A lane has no
        // effect outside its throw-away guest and its directory, so it runs once more; the
        // report says so.
        let why =
            "the VM died under the command (status 125; the console was shown): ran once more";
        run::say!("[vm-test] lane {}: {why}", lane.name);
        dir.prepare()?;
        rc = run::run(lane, &image, &opts)?;
        retried = Some(why.to_string());
    }
    let mut report = LaneReport::read(lane, &dir, rc, start.elapsed(), with_tests);
    report.retried = retried;
    Ok(report)
}

/// Cargo's target directory, which must be inside the share for the guest to see it.
fn target_dir(share: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .and_then(|t| t.canonicalize().ok())
        .filter(|t| t.starts_with(share))
        .unwrap_or_else(|| share.join("target"))
}

/// The environment of the test executables in the guest.
///
/// `CODECAGE_TEST_LAYOUT` tells the tests which cgroup layout to expect (the lane's),
/// `CODECAGE_IN_VM=1` that they run in a VM lane. `CARGO_MANIFEST_DIR` and
/// `CARGO_BIN_EXE_codecage` are what `cargo test` itself would set at run
/// time (the compile-time `env!` values are baked in already).
fn test_env(lane: &Lane, root: &Path, bin: Option<&Path>) -> Vec<(String, String)> {
    let mut env = vec![
        (
            "CODECAGE_TEST_LAYOUT".to_string(),
            lane.cgroups.name().to_string(),
        ),
        ("CODECAGE_IN_VM".to_string(), "1".to_string()),
        ("CARGO_MANIFEST_DIR".to_string(), root.display().to_string()),
    ];
    if let Some(bin) = bin {
        env.push((
            format!("CARGO_BIN_EXE_{PACKAGE}"),
            bin.display().to_string(),
        ));
    }
    for name in FORWARDED_ENV {
        if let Ok(v) = std::env::var(name) {
            env.push((name.to_string(), v));
        }
    }
    env
}

struct Built {
    /// Integration test executables.
    tests: Vec<PathBuf>,
    /// The `codecage` binary.
    bin: Option<PathBuf>,
}

/// Build the binary and the test executables on the host; the guest has the
/// same glibc (bookworm), so host-built executables run there.
fn build_tests(root: &Path, release: bool) -> Result<Built> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let profile: &[&str] = if release { &["--release"] } else { &[] };

    eprintln!("[vm-test] cargo build --bins -p {PACKAGE}");
    let status = Command::new(&cargo)
        .current_dir(root)
        .args(["build", "--bins", "-p", PACKAGE])
        .args(profile)
        .stdout(Stdio::inherit())
        .status()
        .context("running cargo build")?;
    ensure!(status.success(), "cargo build --bins failed ({status})");

    eprintln!("[vm-test] cargo test -p {PACKAGE} --no-run");
    let mut child = Command::new(&cargo)
        .current_dir(root)
        .args(["test", "-p", PACKAGE, "--no-run", "--message-format=json"])
        .args(profile)
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo test --no-run")?;
    let mut built = Built {
        tests: Vec::new(),
        bin: None,
    };
    let stdout = child.stdout.take().context("no stdout from cargo")?;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line?;
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let kinds = msg["target"]["kind"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let is = |k: &str| kinds.iter().any(|v| v == k);
        let is_test = msg["profile"]["test"] == true;
        if is_test && is("test") {
            built.tests.push(PathBuf::from(exe));
        } else if !is_test && is("bin") && msg["target"]["name"] == PACKAGE {
            built.bin = Some(PathBuf::from(exe));
        }
    }
    let status = child.wait()?;
    ensure!(status.success(), "cargo test --no-run failed ({status})");
    built.tests.sort();
    built.tests.dedup();
    if built.bin.is_none() {
        // `cargo test` reports the binary only when it builds it for the
        // integration tests; it is where `cargo build` put it.
        let dir = if release { "release" } else { "debug" };
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        let candidate = target.join(dir).join(PACKAGE);
        if candidate.is_file() {
            built.bin = Some(candidate.canonicalize()?);
        }
    }
    Ok(built)
}

/// `vm-check`'s time limit.
const CHECK_TIMEOUT_SECS: u64 = 120;

/// The smoke test, run by bash in the guest. EXPECT_CGROUP (v2 or v1) and
/// EXPECT_LANDLOCK (1 or 0) say what the lane must look like.
const CHECK_SH: &str = r#"
set -u
cg=$(sed -n 's/^0:://p' /proc/self/cgroup)
abi=$(python3 -c '
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
# landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
print(libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))')
echo "kernel:               $(uname -r)"
echo "command line:         $(cat /proc/cmdline)"
echo "hostname:             $(hostname)"
echo "cgroup mounts:        $(grep -E '^[^ ]+ [^ ]+ cgroup2? ' /proc/self/mounts | awk '{printf "%s(%s) ", $2, $4}')"
ok=1
if [ "$EXPECT_CGROUP" = v2 ]; then
    job=/sys/fs/cgroup$cg
    echo "root controllers:     $(cat /sys/fs/cgroup/cgroup.controllers)"
    echo "root subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control)"
    echo "job cgroup:           $cg"
    echo "job controllers:      $(cat "$job/cgroup.controllers")"
    echo "job subtree_control:  $(cat "$job/cgroup.subtree_control")"
    echo "job processes:        $(wc -l < "$job/cgroup.procs")"
    echo "job cgroup.kill:      $([ -e "$job/cgroup.kill" ] && echo yes || echo no) (Linux 5.14+)"
    echo "job memory.peak:      $([ -e "$job/memory.peak" ] && echo yes || echo no) (Linux 5.19+)"
    [ "$cg" != "/" ] || { echo "FAIL: the job runs in the root cgroup"; ok=0; }
    for c in cpu cpuset io memory pids; do
        grep -qw "$c" "$job/cgroup.controllers" || { echo "FAIL: $c not available to the job"; ok=0; }
    done
    grep -q ' cgroup ' /proc/self/mounts && { echo "FAIL: a cgroup v1 hierarchy is mounted"; ok=0; }
else
    echo "job cgroups:          $(grep -v '^0::' /proc/self/cgroup | tr '\n' ' ')"
    for c in memory cpu cpuacct pids freezer; do
        grep -qE "^[0-9]+:([^:]*,)?$c(,[^:]*)?:/vmjob\$" /proc/self/cgroup ||
            { echo "FAIL: the job is not in /vmjob of a v1 $c hierarchy"; ok=0; }
    done
    [ -e /sys/fs/cgroup/memory/memory.limit_in_bytes ] ||
        { echo "FAIL: no v1 memory controller files (CONFIG_MEMCG_V1?)"; ok=0; }
    grep -q ' cgroup2 ' /proc/self/mounts && { echo "FAIL: a cgroup2 hierarchy is mounted"; ok=0; }
fi
echo "landlock ABI:         $abi"
echo "lsm:                  $(cat /sys/kernel/security/lsm 2>/dev/null)"
echo "mounts:               $(awk '$2 ~ /^\/(proc|sys|dev|dev\/shm|dev\/pts|tmp)$/ {printf "%s(%s) ", $2, $3}' /proc/self/mounts)"
echo "loopback:             $(ip -br addr show lo | tr -s ' ')"
echo "tools:                bash $BASH_VERSION; $(python3 --version); node $(node --version); $(ps --version)"
if [ "$EXPECT_LANDLOCK" = 1 ]; then
    [ "$abi" -ge 1 ] 2>/dev/null || { echo "FAIL: no Landlock"; ok=0; }
else
    [ "$abi" -ge 1 ] 2>/dev/null && { echo "FAIL: Landlock ABI $abi, the lane stands for a kernel without"; ok=0; }
fi
[ "$ok" = 1 ] && echo "vm-check: OK"
[ "$ok" = 1 ]
"#;

/// Boot a lane's VM and show its cgroup and landlock layout
///
/// Boots the VM of each lane (--lane, default v2-6.12; `all` for every lane) once and
/// prints what the tests will find there: kernel, its command line, cgroup mounts, the
/// job's cgroups and controllers, Landlock ABI. Fails if a layout is not the lane's.
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment, after_long_help = lane_list())]
pub struct CheckArgs {
    #[command(flatten)]
    pub lanes: LaneArgs,
}

/// `cargo xtask vm-check`.
pub fn vm_check(args: &CheckArgs) -> Result<i32> {
    let mut first_failure = 0;
    for lane in lanes::select(&args.lanes.lanes)? {
        status("Lane", format!("{}: {}", lane.name, lane.stands_for));
        let image = ensure_image(lane.kernel_suite)?;
        let mut opts = RunOptions::new(vec![
            "bash".to_string(),
            "-c".to_string(),
            CHECK_SH.to_string(),
        ]);
        opts.timeout = CHECK_TIMEOUT_SECS;
        opts.env = vec![
            ("EXPECT_CGROUP".into(), lane.cgroups.name().into()),
            (
                "EXPECT_LANDLOCK".into(),
                if lane.landlock { "1" } else { "0" }.into(),
            ),
        ];
        let rc = run::run(&lane, &image, &opts)?;
        if rc != 0 && first_failure == 0 {
            first_failure = rc;
        }
        if let Some(sig) = interrupted() {
            return Ok(128 + sig);
        }
    }
    Ok(first_failure)
}

/// Build the VM images of lanes (root; cached, instant when up to date)
///
/// Needs root: it installs the missing host packages with apt-get and bootstraps a
/// Debian root filesystem. Instant when the image of the current recipe exists already.
/// Lanes with the same kernel share one image. --lane: default v2-6.12; `all` for every
/// lane.
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment, after_long_help = super::build::ENVIRONMENT)]
pub struct BuildArgs {
    #[command(flatten)]
    pub lanes: LaneArgs,
}

/// `cargo xtask vm-build`.
pub fn vm_build(args: &BuildArgs) -> Result<i32> {
    let mut suites: Vec<&str> = Vec::new();
    for lane in lanes::select(&args.lanes.lanes)? {
        if !suites.contains(&lane.kernel_suite) {
            suites.push(lane.kernel_suite);
        }
    }
    for suite in suites {
        super::build::build(suite)?;
    }
    Ok(0)
}

/// Probe each lane and print the support matrix
///
/// Boots the VM of each lane (--lane; default: every lane) once, without the tests, and
/// runs the probe that `vm-test` runs first: the kernel's features (clone3,
/// CLONE_INTO_CGROUP, CLOSE_RANGE_CLOEXEC, cgroup.kill, memory.peak, landlock),
/// `codecage doctor --json`, and a run of the default python profile. Prints the support
/// matrix (README.md's), whose "tests" column says "not run": `cargo xtask vm-test --lane
/// all` prints the same matrix with the tests' results. Fails if a lane's probe shows what
/// the lane must not (the default profile refused on a kernel with landlock, another
/// cgroup layout).
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment, after_long_help = lane_list())]
pub struct MatrixArgs {
    #[command(flatten)]
    pub lanes: LaneArgs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{tests::parse, Task};

    #[test]
    fn lanes_run_two_at_a_time_unless_told() {
        assert_eq!(parse_jobs(None).unwrap(), 2);
        assert_eq!(parse_jobs(Some("1")).unwrap(), 1);
        assert_eq!(parse_jobs(Some(" 3 ")).unwrap(), 3);
        for bad in ["0", "", "two", "-1"] {
            let e = parse_jobs(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains("CODECAGE_VM_JOBS") && e.contains("1 or more"),
                "{e}"
            );
        }
    }

    #[test]
    fn parses_arguments() {
        let Ok(Task::VmTest(a)) = parse(&["vm-test"]) else {
            panic!()
        };
        assert!(!a.release && a.env.is_empty() && a.test_args.is_empty());
        assert_eq!(a.timeout, TEST_TIMEOUT_SECS);
        let Ok(Task::VmTest(a)) = parse(&[
            "vm-test",
            "--release",
            "--timeout",
            "9",
            "--env",
            "K=v",
            "--",
            "limits::",
            "--x",
        ]) else {
            panic!()
        };
        assert!(a.release);
        assert_eq!(a.timeout, 9);
        assert_eq!(a.env, [("K".to_string(), "v".to_string())]);
        assert_eq!(a.test_args, ["limits::", "--x"]);
        // Test filters go after `--`.
        assert!(parse(&["vm-test", "limits::"]).is_err());
        assert!(parse(&["vm-test", "--timeout", "0"]).is_err());
    }
}
