//! `cargo xtask test`: the project's test command (README.md and .ci/run). In order:
//! install the Debian packages the tests run inside the sandbox; build the default image
//! (`cargo xtask rootfs`, instant when the recipe is unchanged); run every unit and
//! integration test natively (this host's cgroup layout); then the integration tests again
//! in every VM lane (`cargo xtask vm-test --lane all`: pure v2 on 6.12 with every suite,
//! Debian 12's 6.1, pure cgroup v1 and Debian 11's 5.10 without landlock with a subset), so
//! the kernels and layouts users run are proven on every change; and, after every lane, the
//! debug build's Debian package installed, run, upgraded and purged under systemd in the
//! debian12-systemd VM (`cargo xtask dist --debug --vm-check`).

use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::host::{install_missing, Recommends, Runner};

/// Run the unit and integration tests (root)
///
/// Installs the Debian packages the tests use inside the sandbox (procps, python3, nodejs)
/// when missing, builds the default image (cargo xtask rootfs), runs the unit and
/// integration tests of the workspace (cargo nextest when installed, else cargo test), then
/// the integration tests in every VM lane (cargo xtask vm-test --lane all; --lane picks
/// some, --native-only none), with a summary per lane and the support matrix, then (with
/// every lane) the package under systemd (cargo xtask dist --debug --vm-check). Must run as
/// root: the tests build real sandboxes. --repeat N runs all of it N times in a row;
/// --stress runs a CPU and memory load beside (stress-ng, 2+2 workers; README "Testing").
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Skip the runs in the VM lanes
    #[arg(long, conflicts_with = "lanes")]
    native_only: bool,
    /// Run these VM lanes only (repeatable; default: all)
    #[arg(long = "lane", value_name = "NAME", value_parser = crate::vm::lanes::parse_lane)]
    lanes: Vec<String>,
    /// Run everything this many times in a row (each run's result and time printed)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Beside the runs, a CPU and memory load: stress-ng --cpu 2 --vm 2 --vm-bytes 1G
    /// (installed when missing; stopped when the runs end)
    #[arg(long)]
    stress: bool,
    /// Passed on to cargo nextest run (or cargo test)
    #[arg(last = true, value_name = "NEXTEST-ARGS")]
    nextest_args: Vec<String>,
}

/// The load of `--stress`, as README's "Testing" describes it: two CPU workers and two
/// workers that allocate, touch and free 1 GiB each. Its own timeout bounds it should
/// xtask die without stopping it.
const STRESS: &[&str] = &[
    "--cpu",
    "2",
    "--vm",
    "2",
    "--vm-bytes",
    "1G",
    "--timeout",
    "6h",
];

/// A stress-ng started for `--stress`, stopped (SIGTERM to its pid: it stops its workers)
/// and reaped when dropped.
struct Stress(std::process::Child);

impl Stress {
    fn start() -> Result<Stress> {
        install_missing(
            &Runner::terminal(),
            &[("stress-ng", "stress-ng")],
            Recommends::Skip,
        )?;
        let child = Command::new("stress-ng")
            .args(STRESS)
            .stdout(std::process::Stdio::null())
            .spawn()
            .context("starting stress-ng")?;
        eprintln!(
            "xtask: load beside the tests: stress-ng {} (pid {})",
            STRESS.join(" "),
            child.id()
        );
        Ok(Stress(child))
    }
}

impl Drop for Stress {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

/// Programs the integration tests run inside a sandbox with the host rootfs, and the
/// Debian package of each.
const NEEDED: &[(&str, &str)] = &[
    ("/usr/bin/bash", "bash"),
    ("/usr/bin/ps", "procps"),
    ("/usr/bin/python3", "python3"),
    ("/usr/bin/node", "nodejs"),
    // The E2B JavaScript SDK tests' client is installed with it.
    ("/usr/bin/npm", "npm"),
    ("/usr/bin/ldd", "libc-bin"),
    // The start-up budget test (tests/suite/budget.rs) counts system calls with it.
    ("/usr/bin/strace", "strace"),
];

/// The suites of `codecage run` that run a second time with `CODECAGE_PREPARED=1`.
const POOLED_SUITES: &str =
    "test(/suite::(basic|bombs|cleanup|escape|files|fs|hardening|isolation|limits|network|profiles|portability)::/)";

pub fn test(args: &Args) -> Result<i32> {
    if !crate::host::is_root() {
        bail!(
            "the tests build real sandboxes and must run as root (try: sudo -E cargo xtask test)"
        );
    }
    let _stress = if args.stress {
        Some(Stress::start()?)
    } else {
        None
    };
    if args.repeat == 1 {
        return test_once(args);
    }
    let mut results = Vec::new();
    for n in 1..=args.repeat {
        eprintln!("xtask: run {n} of {}", args.repeat);
        let start = std::time::Instant::now();
        let code = test_once(args)?;
        results.push((code, start.elapsed()));
    }
    for (n, (code, took)) in results.iter().enumerate() {
        eprintln!(
            "xtask: run {} of {}: exit {code} in {}",
            n + 1,
            args.repeat,
            crate::host::secs(*took)
        );
    }
    Ok(results
        .iter()
        .map(|(code, _)| *code)
        .find(|c| *c != 0)
        .unwrap_or(0))
}

fn test_once(args: &Args) -> Result<i32> {
    if !args.native_only {
        // A bad CODECAGE_VM_JOBS said now, not after the native suite.
        crate::vm::lane::lane_jobs()?;
    }
    install_missing(&Runner::terminal(), NEEDED, Recommends::Skip)?;
    eprintln!("xtask: building the default image (cargo xtask rootfs)");
    let built = crate::rootfs::rootfs(&crate::rootfs::Args::default())?;
    if built != 0 {
        bail!("the default image could not be built (cargo xtask rootfs exited {built})");
    }
    let mcp_python = mcp_client()?;
    let openapi_python = openapi_client()?;
    let e2b_python = e2b_client()?;
    let e2b_js = e2b_js_client()?;
    let nextest = Command::new("cargo")
        .args(["nextest", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    let static_launcher = static_launcher()?;
    let mut cmd = Command::new("cargo");
    if nextest {
        cmd.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        eprintln!("xtask: cargo-nextest not found, using cargo test");
        cmd.args(["test", "--workspace", "--no-fail-fast"]);
    }
    cmd.args(&args.nextest_args);
    let threads = test_threads(&args.nextest_args);
    if let Some(n) = threads {
        eprintln!("xtask: {n} tests at a time (twice the CPUs: most tests wait on a sandbox, a server or a timeout; NEXTEST_TEST_THREADS or -- --test-threads N to change)");
        cmd.env("NEXTEST_TEST_THREADS", n.to_string());
    }
    cmd.env("CODECAGE_MCP_PYTHON", &mcp_python);
    cmd.env("CODECAGE_OPENAPI_PYTHON", &openapi_python);
    cmd.env("CODECAGE_E2B_PYTHON", &e2b_python);
    cmd.env("CODECAGE_E2B_JS", &e2b_js);
    cmd.env("CODECAGE_STATIC_LAUNCHER", &static_launcher);
    eprintln!("xtask: {cmd:?}");
    let native_start = std::time::Instant::now();
    let mut native = cmd.status().context("running cargo")?.code().unwrap_or(1);
    // The run suites again, through the warm pool's path (the sandbox built from the
    // profile alone, Python pre-started, then the request handed over): pooled runs must
    // give cold runs' outcomes.
    if nextest && args.nextest_args.is_empty() {
        let mut pooled = Command::new("cargo");
        pooled
            .args(["nextest", "run", "--test", "all", "--no-fail-fast", "-E"])
            .arg(POOLED_SUITES)
            .env("CODECAGE_PREPARED", "1")
            .envs(threads.map(|n| ("NEXTEST_TEST_THREADS", n.to_string())))
            .env("CODECAGE_MCP_PYTHON", &mcp_python);
        eprintln!("xtask: the run suites through the pooled path: {pooled:?}");
        let code = pooled
            .status()
            .context("running cargo")?
            .code()
            .unwrap_or(1);
        if native == 0 {
            native = code;
        }
    }
    let native_time = native_start.elapsed();
    if args.native_only {
        return Ok(native);
    }
    // Each lane skips image::, server:: and the files:: tests that use the image or curl
    // (the image lives on this host, not in the VM, and the server's clients, curl among
    // them, are the host's: their tests run natively only; see vm/lanes.rs).
    let lanes = if args.lanes.is_empty() {
        vec!["all".to_string()]
    } else {
        args.lanes.clone()
    };
    eprintln!(
        "xtask: the integration tests in the VM lanes (cargo xtask vm-test --lane {})",
        lanes.join(" --lane ")
    );
    let vm_start = std::time::Instant::now();
    let mut vm = crate::vm::lane::vm_test(&crate::vm::lane::TestArgs::new(lanes.clone()))?;
    // The package under systemd (debian12-systemd), with every lane only: the debug
    // build's package, installed, run, upgraded and purged (about 90 s under TCG).
    if lanes == ["all"] {
        eprintln!("xtask: the package under systemd (cargo xtask dist --debug --vm-check)");
        let code = crate::dist::dist(&crate::dist::Args::vm_check_of_the_debug_build())?;
        if vm == 0 {
            vm = code;
        }
    }
    eprintln!(
        "xtask: native tests exited {native} in {}, VM lanes exited {vm} in {}",
        crate::host::secs(native_time),
        crate::host::secs(vm_start.elapsed())
    );
    Ok(if native != 0 { native } else { vm })
}

/// The static `codecage` that `cargo xtask dist` ships, for tests/suite/static_launcher.rs:
/// the debug binaries built, `codecage` linked again statically, and hard links of it, of
/// `codecage-full` and of `codecage-init` put in target/debug/static/ (the launcher finds
/// its companions beside itself). Then `cargo build` puts the dynamic `codecage` back in
/// target/debug/, where the other suites find it. The first link compiles the CLI's crate
/// once more (about 40 s); later ones are fresh.
fn static_launcher() -> Result<std::path::PathBuf> {
    let root = crate::host::workspace_root();
    let build = || -> Result<()> {
        let status = Command::new("cargo")
            .current_dir(&root)
            .args(["build", "--locked", "--quiet", "-p", "codecage", "--bins"])
            .status()
            .context("running cargo build")?;
        anyhow::ensure!(status.success(), "cargo build failed");
        Ok(())
    };
    eprintln!("xtask: linking the static launcher (target/debug/static/codecage)");
    build()?;
    let launcher = crate::host::link_static_launcher(&root, false)?;
    let debug = launcher.parent().expect("target/debug").to_path_buf();
    let dir = debug.join("static");
    std::fs::create_dir_all(&dir)?;
    for name in ["codecage", "codecage-full", "codecage-init"] {
        let link = dir.join(name);
        if link.exists() {
            std::fs::remove_file(&link)?;
        }
        std::fs::hard_link(debug.join(name), &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    build()?;
    anyhow::ensure!(
        !crate::host::is_static(&std::fs::read(&launcher)?),
        "{} is still the static one after cargo build",
        launcher.display()
    );
    Ok(dir.join("codecage"))
}

/// How many tests nextest runs at a time unless told (`NEXTEST_TEST_THREADS`, or
/// `--test-threads`/`-j` after `--`): twice the CPUs. Measured on a 2-core host, the
/// native suite kept the CPUs 40 % busy at nextest's default of one test per CPU (its
/// tests mostly wait: on a sandbox's timeout, a server, a client's venv), and took 158 s
/// instead of 281 s at four at a time, all passing. The suite is built to hold under load
/// (README "Testing"); the tests that measure the whole host (`kmem::`) still run alone
/// (.config/nextest.toml).
fn test_threads(nextest_args: &[String]) -> Option<usize> {
    if std::env::var_os("NEXTEST_TEST_THREADS").is_some() || names_threads(nextest_args) {
        return None;
    }
    Some(std::thread::available_parallelism().map_or(2, |n| n.get()) * 2)
}

/// Whether nextest's arguments set how many tests run at a time.
fn names_threads(nextest_args: &[String]) -> bool {
    nextest_args
        .iter()
        .any(|a| a.starts_with("--test-threads") || a.starts_with("-j"))
}

/// The MCP tests' client: the official MCP Python SDK, pinned (see [`python_client`]).
fn mcp_client() -> Result<std::path::PathBuf> {
    python_client("mcp-client", &["mcp==2.3.0"], "the MCP tests")
}

/// The E2B front end's tests' client: E2B's real Python SDK, pinned (the code
/// interpreter's package and the `e2b` one it builds on).
fn e2b_client() -> Result<std::path::PathBuf> {
    python_client(
        "e2b-client",
        &["e2b-code-interpreter==2.11.5", "e2b==2.63.0"],
        "the E2B SDK tests (e2b::)",
    )
}

/// E2B's JavaScript SDK for the same tests, pinned, in /var/cache/codecage/e2b-js-client
/// (npm, made once, stamped with the packages). Returns the directory (its node_modules
/// resolve the packages).
fn e2b_js_client() -> Result<std::path::PathBuf> {
    let dir = std::path::Path::new("/var/cache/codecage/e2b-js-client");
    let packages = ["@e2b/code-interpreter@2.8.0", "e2b@2.51.0"];
    let stamp = dir.join("codecage-installed");
    let wanted = packages.join(" ");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok(dir.to_path_buf());
    }
    eprintln!("xtask: {wanted} in {} for the E2B SDK tests", dir.display());
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("package.json"), "{\"private\": true}\n")?;
    let npm = Command::new("npm")
        .args([
            "install",
            "--no-audit",
            "--no-fund",
            "--save-exact",
            "--prefix",
        ])
        .arg(dir)
        .args(packages)
        .status()
        .context("running npm (the E2B JavaScript SDK tests need node and npm)")?;
    if !npm.success() {
        bail!("npm install {wanted} failed: it is for the E2B SDK tests (the npm registry must be reachable)");
    }
    std::fs::write(&stamp, wanted)?;
    Ok(dir.to_path_buf())
}

/// The OpenAPI test's client generator: openapi-python-client, pinned (it brings httpx
/// and attrs, which the client it generates imports, and ruff, which formats it).
fn openapi_client() -> Result<std::path::PathBuf> {
    python_client(
        "openapi-client",
        &["openapi-python-client==0.29.1"],
        "the OpenAPI client test",
    )
}

/// A test's Python client: `packages`, pinned, in a venv of Debian's python3 at
/// /var/cache/codecage/NAME (made once, stamped with the packages; python3-venv
/// installed when missing). Returns its python.
fn python_client(name: &str, packages: &[&str], needed_by: &str) -> Result<std::path::PathBuf> {
    let venv = std::path::Path::new("/var/cache/codecage").join(name);
    let python = venv.join("bin/python");
    let stamp = venv.join("codecage-installed");
    let wanted = packages.join(" ");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok(python);
    }
    eprintln!("xtask: {wanted} in {} for {needed_by}", venv.display());
    let make = || {
        let _ = std::fs::remove_dir_all(&venv);
        Command::new("/usr/bin/python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !make() {
        // Debian's python3 makes venvs only with python3-venv (ensurepip).
        crate::host::debian::apt_install(&Runner::terminal(), &["python3-venv"], Recommends::Skip)?;
        if !make() {
            bail!(
                "python3 -m venv {} failed even with python3-venv installed",
                venv.display()
            );
        }
    }
    let pip = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .args(packages)
        .status()
        .context("running pip")?;
    if !pip.success() {
        bail!("pip install {wanted} failed: it is for {needed_by} (PyPI must be reachable)");
    }
    std::fs::write(&stamp, wanted)?;
    Ok(python)
}

#[cfg(test)]
mod tests {
    use crate::{tests::parse, Task};

    #[test]
    fn a_thread_count_after_the_double_dash_is_the_callers() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for told in [
            &["--test-threads", "3"][..],
            &["--test-threads=3"],
            &["-E", "x", "-j", "1"],
            &["-j1"],
        ] {
            assert!(super::names_threads(&args(told)), "{told:?}");
        }
        assert!(!super::names_threads(&args(&["-E", "test(/threads/)"])));
    }

    #[test]
    fn parses_arguments() {
        let Ok(Task::Test(a)) = parse(&["test", "--native-only", "--", "-E", "x"]) else {
            panic!()
        };
        assert!(a.native_only);
        assert_eq!(a.nextest_args, ["-E", "x"]);
        let Ok(Task::Test(a)) = parse(&["test"]) else {
            panic!()
        };
        assert!(!a.native_only && a.nextest_args.is_empty() && a.lanes.is_empty());
        assert!(a.repeat == 1 && !a.stress);
        let Ok(Task::Test(a)) = parse(&["test", "--repeat", "3", "--stress"]) else {
            panic!()
        };
        assert!(a.repeat == 3 && a.stress);
        assert!(parse(&["test", "--repeat", "0"]).is_err());
        let Ok(Task::Test(a)) = parse(&["test", "--lane", "v1", "--lane", "no-landlock"]) else {
            panic!()
        };
        assert_eq!(a.lanes, ["v1", "no-landlock"]);
        assert!(parse(&["test", "--native-only", "--lane", "v1"]).is_err());
        assert!(parse(&["test", "--lane", "nosuch"]).is_err());
        assert!(parse(&["test", "extra"]).is_err());
        assert!(parse(&["test", "--bogus"]).is_err());
    }
}
