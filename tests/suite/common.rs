//! Helpers: running the real binary and reading its answer. The harness that checks the
//! host after a test is in [`super::host`], re-exported here.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use super::host::*;

/// The codecage binary under test. Start it with [`Launch`], so that the host check
/// finds the cgroups it leaves.
pub fn codecage() -> Command {
    Command::new(env!("CARGO_BIN_EXE_codecage"))
}

/// `codecage run --rootfs host`: the host's /usr, which every test machine has.
pub fn codecage_run() -> Command {
    let mut cmd = codecage();
    cmd.args(["run", "--rootfs", "host"]);
    cmd
}

/// Starting a process of the test (a `codecage` launcher, or a program that becomes one):
/// its pid is noted, because a launcher names its cgroups after it, and the check after an
/// [`as_root`] test looks for those.
pub trait Launch {
    /// Spawns the command.
    fn launch(&mut self) -> Child;
    /// Runs the command to its end, like [`Command::output`]: stdin from /dev/null, stdout
    /// and stderr captured.
    fn launch_output(&mut self) -> Output;
}

impl Launch for Command {
    fn launch(&mut self) -> Child {
        let child = self
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {self:?}: {e}"));
        note_launcher(child.id());
        child
    }

    fn launch_output(&mut self) -> Output {
        self.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .launch()
            .wait_with_output()
            .unwrap()
    }
}

/// SIGKILLs a launcher and reaps it. Its sandbox dies with it (`PR_SET_PDEATHSIG`): the
/// processes named `mark` must be gone within 20 s, less than what any caller's payload
/// would live on its own (it sleeps 30 s or more), so the deadline tells a sandbox that
/// died from one that did not, on a loaded machine too. A launcher killed so cannot remove
/// its cgroups, and the next launcher sweeps them: one runs here, and the host check after
/// the test proves the sweep.
pub fn kill_launcher(child: &mut Child, mark: &str) {
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        wait_for(Duration::from_secs(20), || host_pids_with(mark).is_empty()),
        "sandbox processes survived their launcher: {:?}",
        host_pids_with(mark)
    );
    let next = run_json(&["--", "true"]);
    assert_eq!(next.error(), None, "{}", next.json);
}

/// The kernel's landlock ABI (landlock_create_ruleset's version query), None where it has
/// no landlock: what the sandbox's rules get on this kernel, and what a test of them must
/// expect. The VM lanes run kernels with ABI 2 (6.1) and none (5.10).
pub fn kernel_landlock_abi() -> Option<u32> {
    codecage::doctor::landlock_abi()
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

/// A string unique to this test process and call, to name sandbox processes by
/// (`exec -a`) and find them on the host: the check after an [`as_root`] test fails if any
/// process named by one of its markers is left.
pub fn marker(name: &str) -> String {
    let marker = unique(name);
    note_marker(&marker);
    marker
}

/// `ccmark-NAME-PID-N`: unique to this test process and call.
fn unique(name: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "ccmark-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The arguments that run `argv` in a sandbox under the name `mark`: `-- bash -c 'exec -a
/// MARK "$@"' bash ARGV...` (forked copies keep the name).
pub fn marked(mark: &str, argv: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--".to_string(),
        "bash".into(),
        "-c".into(),
        format!("exec -a {mark} \"$@\""),
        "bash".into(),
    ];
    args.extend(argv.iter().map(|s| s.to_string()));
    args
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

/// Starts a bash script in a sandbox like [`bash`], without waiting for it: [`finish`]
/// reads its answer.
pub fn spawn_bash(flags: &[&str], script: &str) -> Child {
    codecage_run()
        .arg("--json")
        .args(flags)
        .args(["--", "bash", "-c", script])
        .stdout(Stdio::piped())
        .launch()
}

/// Waits for a `codecage run --json` started in the background and parses its answer.
pub fn finish(child: Child) -> Run {
    parse(child.wait_with_output().unwrap())
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
    parse(cmd.args(args).launch_output())
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

/// Waits until at least `n` processes named by `mark` run, however long the sandbox takes
/// to start on this machine: the only deadline is the run's own timeout, which ends
/// `child` (a `codecage run`), and then the test fails.
pub fn wait_for_marks(child: &mut Child, mark: &str, n: usize) {
    while host_pids_with(mark).len() < n {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before {n} processes named {mark} ran");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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

/// A throwaway directory of the test's own, removed on drop; the check after an
/// [`as_root`] test proves it is gone.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(unique(name));
        std::fs::create_dir_all(&path).unwrap();
        note_temp_dir(&path);
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

/// Runs a bash script from a minimal image directory of the test's own: bash and the
/// libraries it links, plus the mount points (`with_mount_points = false` leaves them
/// out, for the setup-failure tests). The directory is returned with the run, to look at.
pub fn bash_in_minimal_rootfs(with_mount_points: bool, script: &str) -> (TempDir, Run) {
    let image = minimal_rootfs(with_mount_points);
    let rootfs = image.path().to_str().unwrap();
    let run = run_json(&["--rootfs", rootfs, "--", "/bin/bash", "-c", script]);
    (image, run)
}

/// A root with the host's bash and the libraries it loads, and nothing else (with
/// `with_mount_points`, the directories the sandbox mounts on).
pub fn minimal_rootfs(with_mount_points: bool) -> TempDir {
    let image = TempDir::new("rootfs");
    let dir = image.path();
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
    image
}

/// A mount namespace of the test's own (private propagation), held by a sleeping process
/// named by a [`marker`]: what the test mounts there is not in the host's mount table, so
/// the check after every other test, running beside this one, does not see it (the rule
/// in [`super::host`]). It ends with its holder, whatever happens to the test: no unmount
/// to forget. From the host, its files are at [`MountNamespace::path`]; a program that must
/// see its mounts (a launcher, a server) starts in it with [`MountNamespace::command`].
pub struct MountNamespace {
    holder: Child,
}

impl MountNamespace {
    /// A namespace with a tmpfs of `options` (mount(8)'s `-o`) at `dir`, a directory of
    /// the test's own.
    pub fn with_tmpfs(dir: &Path, options: &str) -> MountNamespace {
        use std::io::BufRead;
        let mark = marker("mountns");
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "bash", "-c"])
            .arg(
                "mount -t tmpfs -o \"$1\" codecage-test \"$2\" && echo mounted && \
                 exec -a \"$3\" sleep infinity",
            )
            .arg("bash")
            .arg(options)
            .arg(dir)
            .arg(&mark)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("unshare");
        // The line comes once the tmpfs is mounted; EOF if it could not be.
        let mut line = String::new();
        let mut stdout = std::io::BufReader::new(holder.stdout.take().unwrap());
        stdout.read_line(&mut line).unwrap();
        if line != "mounted\n" {
            let out = holder.wait_with_output().unwrap();
            panic!(
                "no tmpfs at {} in a mount namespace of the test's own: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        MountNamespace { holder }
    }

    /// `path` of the namespace, from the host (`/proc/<holder>/root/<path>`; the kernel
    /// resolves it in the namespace, a program that reads links itself, such as SQLite,
    /// may not: start it with [`MountNamespace::command`] instead).
    pub fn path(&self, path: &Path) -> PathBuf {
        let relative = path.strip_prefix("/").expect("an absolute path");
        PathBuf::from(format!("/proc/{}/root", self.holder.id())).join(relative)
    }

    /// `program` started in the namespace (nsenter, which execs it: the pid stays the one
    /// [`Launch`] notes).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--mount=/proc/{}/ns/mnt", self.holder.id()))
            .arg("--")
            .arg(program);
        cmd
    }

    /// The codecage binary, started in the namespace.
    pub fn codecage(&self) -> Command {
        self.command(env!("CARGO_BIN_EXE_codecage"))
    }
}

impl Drop for MountNamespace {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

#[test]
fn a_mount_namespace_of_the_tests_own_is_not_in_the_host_table() {
    as_root(|| {
        let dir = TempDir::new("nsprobe");
        let ns = MountNamespace::with_tmpfs(dir.path(), "size=1m");
        let at = dir.path().to_str().unwrap();
        assert!(
            !host_mounts().iter().any(|m| m.mount_point == at),
            "the tmpfs is in the host's table"
        );
        let holder = ns.holder.id();
        let theirs = std::fs::read_to_string(format!("/proc/{holder}/mountinfo")).unwrap();
        let tmpfs = parse_mountinfo(&theirs)
            .into_iter()
            .find(|m| m.mount_point == at)
            .expect("the tmpfs in the namespace's table");
        assert_eq!(tmpfs.fs_type, "tmpfs");
        // Written through the namespace, absent from the host's directory.
        std::fs::write(ns.path(&dir.path().join("f")), "x").unwrap();
        assert!(!dir.path().join("f").exists());
        let out = ns
            .command("cat")
            .arg(dir.path().join("f"))
            .output()
            .unwrap();
        assert_eq!(out.stdout, b"x");
    });
}
