//! Helpers: running the real binary, and checking the host after a run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use super::host::*;

/// The codecage binary under test.
pub fn codecage() -> Command {
    Command::new(env!("CARGO_BIN_EXE_codecage"))
}

/// `codecage run --rootfs host`: the host's /usr, which every test machine has.
pub fn codecage_run() -> Command {
    let mut cmd = codecage();
    cmd.args(["run", "--rootfs", "host"]);
    cmd
}

/// Fails loudly when not root: these tests build real sandboxes, and a skipped isolation
/// test proves nothing. `CODECAGE_ALLOW_SKIP=1` turns that into a printed skip, for
/// developers without root; CI never sets it.
pub fn require_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var_os("CODECAGE_ALLOW_SKIP").is_some_and(|v| v == "1") {
        eprintln!("SKIPPED: needs root (CODECAGE_ALLOW_SKIP=1)");
        return false;
    }
    panic!("this test needs root: it creates namespaces and mounts (set CODECAGE_ALLOW_SKIP=1 to skip)");
}

/// Seconds scaled for where the tests run: the VM lane (`CODECAGE_IN_VM=1`) emulates its CPU
/// in software, and programs start 10-50 times slower there.
/// Never past 120 s, the profiles' max_timeout.
pub fn secs(n: u64) -> String {
    format!("{}s", (n * slowdown()).min(120))
}

/// How much slower than native the tests run here (10 in the VM lane).
pub fn slowdown() -> u64 {
    if std::env::var_os("CODECAGE_IN_VM").is_some() {
        10
    } else {
        1
    }
}

/// A string unique to this test process and call, to find its processes on the host.
pub fn marker(name: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "ccmark-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The outcome of one `codecage run --json ...`.
pub struct Run {
    pub json: Value,
    pub status: i32,
}

impl Run {
    pub fn stdout(&self) -> &str {
        self.json["stdout"].as_str().unwrap_or_default()
    }
    pub fn stderr_field(&self) -> &str {
        self.json["stderr"].as_str().unwrap_or_default()
    }
    pub fn error(&self) -> Option<&str> {
        self.json["error"].as_str()
    }
    pub fn exit_code(&self) -> Option<i64> {
        self.json["exit_code"].as_i64()
    }
}

/// Runs `codecage run --json ARGS...` and parses its one JSON object.
pub fn run_json(args: &[&str]) -> Run {
    let mut cmd = codecage();
    cmd.arg("run").arg("--json");
    // Unless the test chooses a rootfs: the host's /usr, which every machine has.
    if !args
        .iter()
        .take_while(|a| **a != "--")
        .any(|a| *a == "--rootfs")
    {
        cmd.args(["--rootfs", "host"]);
    }
    parse(cmd.args(args).output().expect("spawn codecage"))
}

/// Runs a bash script in a sandbox (host rootfs), with extra flags before it.
pub fn bash(flags: &[&str], script: &str) -> Run {
    let mut args: Vec<&str> = flags.to_vec();
    args.extend(["--", "bash", "-c", script]);
    run_json(&args)
}

pub fn parse(output: Output) -> Run {
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "--json must print exactly one line; got {stdout:?}, stderr {stderr:?}"
    );
    let json: Value =
        serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    let status = output.status.code().unwrap_or(-1);
    Run { json, status }
}

/// Host pids whose command line starts with `needle` (NUL separates arguments).
pub fn host_pids_with(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            // The codecage invocation carries the marker in its arguments too; only
            // processes *named* by it count.
            if String::from_utf8_lossy(&cmdline).starts_with(needle) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// Waits up to `limit` for `cond`.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// What the host looked like before a test, to compare after it.
pub struct HostState {
    mounts: Vec<Mount>,
}

impl HostState {
    pub fn take() -> HostState {
        HostState {
            mounts: host_mounts(),
        }
    }

    /// No mount added to or removed from the host's table, no process named by `marker`
    /// left.
    pub fn assert_clean(&self, marker: &str) {
        let mounts = host_mounts();
        let added = missing_from(&mounts, &self.mounts);
        let removed = missing_from(&self.mounts, &mounts);
        assert!(
            added.is_empty() && removed.is_empty(),
            "the host's mount table changed: added {added:?}, removed {removed:?}"
        );
        let left = host_pids_with(marker);
        assert!(
            left.is_empty(),
            "processes named {marker} outlived the run: {left:?}"
        );
    }
}

/// A throwaway directory of the test's own, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(marker(name));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A minimal image directory: bash and the libraries it links, plus the mount points.
/// `with_mount_points = false` leaves them out, for the setup-failure tests.
pub fn minimal_rootfs(dir: &Path, with_mount_points: bool) {
    let bash = Path::new("/usr/bin/bash");
    let ldd = Command::new("ldd").arg(bash).output().expect("ldd");
    let mut files = vec![bash.to_path_buf()];
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let path = line
            .split_whitespace()
            .find(|w| w.starts_with('/'))
            .map(PathBuf::from);
        files.extend(path);
    }
    for file in files {
        let real = std::fs::canonicalize(&file).unwrap();
        for target in [&file, &real] {
            let dst = dir.join(target.strip_prefix("/").unwrap());
            std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
            let _ = std::fs::copy(&real, &dst);
        }
    }
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let _ = std::fs::copy(bash, dir.join("bin/bash"));
    if with_mount_points {
        for d in ["dev", "proc", "tmp", "work"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
    }
}
