//! `cargo xtask vm-test` and `cargo xtask vm-check`: the test lane on top of
//! [`super::run`].

use super::ensure_image;
use super::run::{self, parse_env, parse_timeout, RunOptions};
use crate::host::workspace_root;
use anyhow::{bail, ensure, Context, Result};
use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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

/// Run the integration tests in the VM
///
/// Builds codecage's binary and integration tests on the host, then runs every integration
/// test executable in ONE boot of the cgroup v2 VM, each with TEST-ARGS (libtest filters
/// and flags, e.g. `-- limits:: --test-threads 1`), with CODECAGE_TEST_LAYOUT=v2 and
/// CODECAGE_IN_VM=1 set. Exits 0 when all passed, else with the first failing
/// executable's status (124: timeout, 125: the VM failed).
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct TestArgs {
    /// Build and test in release mode
    #[arg(long)]
    release: bool,
    /// Time limit of all test executables together in whole seconds (boot not included)
    #[arg(long, value_name = "SECS", default_value_t = TEST_TIMEOUT_SECS, value_parser = parse_timeout)]
    timeout: u64,
    /// Extra environment for the tests (repeatable)
    ///
    /// K=V, or K for the host's value of K.
    #[arg(long, value_name = "K=V|K", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Passed to every test executable (libtest filters and flags)
    #[arg(last = true, value_name = "TEST-ARGS")]
    test_args: Vec<String>,
}

impl TestArgs {
    /// The defaults of `vm-test`, with `test_args` for every test executable.
    pub fn new(test_args: Vec<String>) -> TestArgs {
        TestArgs {
            release: false,
            timeout: TEST_TIMEOUT_SECS,
            env: Vec::new(),
            test_args,
        }
    }
}

/// `vm-test`'s time limit.
const TEST_TIMEOUT_SECS: u64 = 1800;

/// Runs the test executables given before `--` in turn, each with the
/// arguments after it; reports every failure and exits with the first one's
/// status (all executables run, like `cargo test --no-fail-fast`).
const TEST_RUNNER_SH: &str = r#"
bins=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do bins+=("$1"); shift; done
[ "$#" -gt 0 ] && shift
status=0
failed=()
for bin in "${bins[@]}"; do
    echo "     Running ${bin#"$PWD"/} (in the cgroup-v2 VM)"
    "$bin" "$@"
    rc=$?
    if [ "$rc" -ne 0 ]; then
        failed+=("${bin##*/} (status $rc)")
        [ "$status" -eq 0 ] && status=$rc
    fi
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "error: ${#failed[@]} of ${#bins[@]} test executables failed in the VM:"
    printf '    %s\n' "${failed[@]}"
fi
exit "$status"
"#;

/// `cargo xtask vm-test`.
pub fn vm_test(args: &TestArgs) -> Result<i32> {
    let image = ensure_image()?;
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

    let mut command = vec![
        "bash".to_string(),
        "-c".to_string(),
        TEST_RUNNER_SH.to_string(),
        "vm-test".to_string(),
    ];
    command.extend(built.tests.iter().map(|p| p.display().to_string()));
    command.push("--".to_string());
    command.extend(args.test_args.iter().cloned());

    let mut opts = RunOptions::new(command);
    opts.share = share.clone();
    opts.cwd = share.clone();
    opts.timeout = args.timeout;
    opts.env = test_env(&share, built.bin.as_deref());
    opts.env.extend(args.env.iter().cloned());
    run::run(&image, &opts)
}

/// The environment of the test executables in the guest.
///
/// `CODECAGE_TEST_LAYOUT=v2` tells the tests which cgroup layout to expect,
/// `CODECAGE_IN_VM=1` that they run in this lane. `CARGO_MANIFEST_DIR` and
/// `CARGO_BIN_EXE_codecage` are what `cargo test` itself would set at run
/// time (the compile-time `env!` values are baked in already).
fn test_env(root: &Path, bin: Option<&Path>) -> Vec<(String, String)> {
    let mut env = vec![
        ("CODECAGE_TEST_LAYOUT".to_string(), "v2".to_string()),
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

/// The smoke test, run by bash in the guest.
const CHECK_SH: &str = r#"
set -u
cg=$(sed -n 's/^0:://p' /proc/self/cgroup)
job=/sys/fs/cgroup$cg
abi=$(python3 -c '
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
# landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
print(libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))')
echo "kernel:               $(uname -r)"
echo "hostname:             $(hostname)"
echo "cgroup mounts:        $(grep -E '^[^ ]+ [^ ]+ cgroup2? ' /proc/self/mounts)"
echo "root controllers:     $(cat /sys/fs/cgroup/cgroup.controllers)"
echo "root subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control)"
echo "job cgroup:           $cg"
echo "job controllers:      $(cat "$job/cgroup.controllers")"
echo "job subtree_control:  $(cat "$job/cgroup.subtree_control")"
echo "job processes:        $(wc -l < "$job/cgroup.procs")"
echo "landlock ABI:         $abi"
echo "lsm:                  $(cat /sys/kernel/security/lsm 2>/dev/null)"
echo "mounts:               $(awk '$2 ~ /^\/(proc|sys|dev|dev\/shm|dev\/pts|tmp)$/ {printf "%s(%s) ", $2, $3}' /proc/self/mounts)"
echo "loopback:             $(ip -br addr show lo | tr -s ' ')"
echo "tools:                bash $BASH_VERSION; $(python3 --version); node $(node --version); $(ps --version)"
ok=1
[ "$cg" != "/" ] || { echo "FAIL: the job runs in the root cgroup"; ok=0; }
for c in cpu cpuset io memory pids; do
    grep -qw "$c" "$job/cgroup.controllers" || { echo "FAIL: $c not available to the job"; ok=0; }
done
grep -q ' cgroup ' /proc/self/mounts && { echo "FAIL: a cgroup v1 hierarchy is mounted"; ok=0; }
[ "$abi" -ge 1 ] 2>/dev/null || { echo "FAIL: no Landlock"; ok=0; }
[ "$ok" = 1 ] && echo "vm-check: OK"
[ "$ok" = 1 ]
"#;

/// `cargo xtask vm-check`.
pub fn vm_check() -> Result<i32> {
    let image = ensure_image()?;
    let mut opts = RunOptions::new(vec![
        "bash".to_string(),
        "-c".to_string(),
        CHECK_SH.to_string(),
    ]);
    opts.timeout = CHECK_TIMEOUT_SECS;
    run::run(&image, &opts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{tests::parse, Task};

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
