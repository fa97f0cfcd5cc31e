//! The harness of the tests that build real sandboxes: [`as_root`] runs one such test and
//! then proves that the host is as it was (mount table, processes, cgroups, temp dirs).
//!
//! # The rule: tests that cannot see each other
//!
//! Tests run in parallel (nextest: a process each; `cargo test`: threads of one), and each
//! one's check runs while others are mid-way. So what a test changes on the host must be
//! invisible to the others' checks *by construction*, never by timing:
//! - **Mounts**: the check compares the whole host mount table, so a test never mounts in
//!   the host's mount namespace. It mounts in one of its own
//!   ([`super::common::MountNamespace`]: private propagation, held by a marked process,
//!   gone with it) and starts there whatever must see the mount (the launcher, the
//!   server). Network namespaces are held by a process (`unshare --net`), never bind-mounted
//!   under /run/netns. As a second line, a mount under another test's temp dir
//!   (`ccmark-...`, not one of this test's) is left to that test's own check.
//! - **Processes**: the check looks only for processes named by this test's markers
//!   ([`super::common::marker`], unique per process and call).
//! - **Cgroups**: only run cgroups named after this test's own launchers (their pids), and
//!   any probe cgroup a test makes lives under a `codecage` parent with a name no launcher
//!   sweeps and no check counts.
//! - **Temp dirs**: only this test's own ([`super::common::TempDir`], unique names).
//! - **Host-wide measures** (the kernel-memory tests read the host's available memory):
//!   no name can keep other tests out of those, so such tests run alone
//!   (`threads-required` in .config/nextest.toml) and measure what other load leaves
//!   alone (see kmem.rs).
//!
//! A test that waits on the kernel (fork and memory bombs, timeouts) asserts what holds
//! whatever the machine's load: the verdict, the limit's counters, the host's state; its
//! deadlines come from the sandbox's own limits, never from how fast the machine is today.

use std::cell::RefCell;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Runs a test that builds real sandboxes, then checks the host after it: no mount added
/// to or removed from its table, no process named by one of the test's markers, no cgroup
/// of one of the test's launchers, none of the test's temp dirs left.
///
/// Without root the test fails: a skipped isolation test proves nothing. A developer
/// without root can opt in to a printed skip instead, see [`unavailable`]; CI never does.
pub fn as_root(test: impl FnOnce()) {
    if !nix::unistd::geteuid().is_root() {
        unavailable("root: the test creates namespaces, mounts and cgroups");
    } else {
        let mounts = host_mounts();
        // Replaces (and so releases) whatever a test that panicked on this thread left.
        SCOPE.set(Some(Scope::default()));
        test();
        let scope = SCOPE.take().expect("the test's scope");
        scope.assert_host_clean(&mounts);
    }
}

/// What a test needs and this machine lacks (root, the built image): a failure, unless the
/// developer set `CODECAGE_ALLOW_SKIP=1`, which turns it into a printed skip.
pub fn unavailable(what: &str) {
    if std::env::var_os("CODECAGE_ALLOW_SKIP").is_some_and(|v| v == "1") {
        eprintln!("SKIPPED: this test needs {what} (CODECAGE_ALLOW_SKIP=1)");
    } else {
        panic!("this test needs {what} (set CODECAGE_ALLOW_SKIP=1 to skip it)");
    }
}

/// What the test running on this thread made, for the check after it.
#[derive(Default)]
struct Scope {
    /// Names its sandbox processes run under ([`super::common::marker`]).
    markers: Vec<String>,
    /// Pids of the processes it started ([`super::common::Launch`]): a `codecage` launcher
    /// names its cgroups after its pid.
    launchers: Vec<u32>,
    /// Its [`super::common::TempDir`]s.
    temp_dirs: Vec<PathBuf>,
    /// Held while it runs sandboxes from this very process; see [`in_process_launcher`].
    in_process: Option<MutexGuard<'static, ()>>,
}

thread_local! {
    static SCOPE: RefCell<Option<Scope>> = const { RefCell::new(None) };
}

pub(super) fn note_marker(marker: &str) {
    note(|scope| scope.markers.push(marker.to_string()));
}

pub(super) fn note_launcher(pid: u32) {
    note(|scope| scope.launchers.push(pid));
}

pub(super) fn note_temp_dir(path: &Path) {
    note(|scope| scope.temp_dirs.push(path.to_path_buf()));
}

/// Outside [`as_root`] (tests that build no sandbox) there is nothing to note.
fn note(f: impl FnOnce(&mut Scope)) {
    SCOPE.with_borrow_mut(|scope| {
        if let Some(scope) = scope {
            f(scope);
        }
    });
}

/// Declares that the test runs sandboxes from this process (the library, not the binary):
/// their launcher is this process, and their cgroups are named after its pid. Such tests
/// take turns, so that the check after each finds only that test's cgroups among the ones
/// named after this process (`cargo test` runs tests as threads of one process).
pub fn in_process_launcher() {
    static TURN: Mutex<()> = Mutex::new(());
    let held = SCOPE.with_borrow(|scope| scope.as_ref().is_some_and(|s| s.in_process.is_some()));
    if held {
        return;
    }
    let turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
    note(|scope| scope.in_process = Some(turn));
}

impl Scope {
    fn assert_host_clean(&self, mounts_before: &[Mount]) {
        let mounts_after = host_mounts();
        let others = |m: &Mount| self.of_another_test(Path::new(&m.mount_point));
        let added: Vec<Mount> = missing_from(&mounts_after, mounts_before)
            .into_iter()
            .filter(|m| !others(m))
            .collect();
        let removed: Vec<Mount> = missing_from(mounts_before, &mounts_after)
            .into_iter()
            .filter(|m| !others(m))
            .collect();
        assert!(
            added.is_empty() && removed.is_empty(),
            "the host's mount table changed: added {added:?}, removed {removed:?}"
        );
        for marker in &self.markers {
            let left = host_pids_with(marker);
            assert!(
                left.is_empty(),
                "processes named {marker} outlived the run: {left:?}"
            );
        }
        let own = std::process::id();
        let left: Vec<PathBuf> = run_cgroups()
            .into_iter()
            .filter(|(launcher, _)| {
                self.launchers.contains(launcher) || (self.in_process.is_some() && *launcher == own)
            })
            .map(|(_, dir)| dir)
            .collect();
        assert!(left.is_empty(), "the run's cgroups were left: {left:?}");
        let left: Vec<&PathBuf> = self.temp_dirs.iter().filter(|d| d.exists()).collect();
        assert!(left.is_empty(), "temp dirs were left: {left:?}");
    }
}

impl Scope {
    /// Whether `path` lies in a temp dir of another test (`<temp>/ccmark-...`, not one of
    /// this test's [`super::common::TempDir`]s): that test's own check covers it.
    fn of_another_test(&self, path: &Path) -> bool {
        let Ok(rest) = path.strip_prefix(std::env::temp_dir()) else {
            return false;
        };
        let Some(first) = rest.components().next() else {
            return false;
        };
        let dir = std::env::temp_dir().join(first);
        first.as_os_str().to_string_lossy().starts_with("ccmark-") && !self.temp_dirs.contains(&dir)
    }
}

/// The CPU weight files of the sandboxes launched by `pid` (v1 `cpu.shares`, v2
/// `cpu.weight`) and their values.
pub fn cpu_weights(pid: u32) -> Vec<(PathBuf, u64)> {
    run_cgroup_files(pid, &["cpu.shares", "cpu.weight"])
        .into_iter()
        .filter_map(|(file, value)| Some((file, value.parse().ok()?)))
        .collect()
}

/// The CPU quota files of the run cgroups of the launcher `pid` (v1 `cpu.cfs_quota_us`,
/// v2 `cpu.max`), with what they hold.
pub fn cpu_quotas(pid: u32) -> Vec<(PathBuf, String)> {
    run_cgroup_files(pid, &["cpu.cfs_quota_us", "cpu.max"])
}

/// In each run cgroup of the launcher `pid`, the first of `names` it has, with its text.
fn run_cgroup_files(pid: u32, names: &[&str]) -> Vec<(PathBuf, String)> {
    run_cgroups()
        .into_iter()
        .filter(|(launcher, _)| *launcher == pid)
        .filter_map(|(_, dir)| {
            names.iter().find_map(|name| {
                let file = dir.join(name);
                let value = std::fs::read_to_string(&file).ok()?.trim().to_string();
                Some((file, value))
            })
        })
        .collect()
}

/// The run cgroups under every `codecage` parent of the host's cgroup hierarchies
/// (`/sys/fs/cgroup/codecage` on v2, `/sys/fs/cgroup/*/codecage` on v1 and hybrid), and
/// under nested ones (a server in a delegated cgroup makes `<its cgroup>/codecage`, as
/// tests/suite/delegation.rs does under `/sys/fs/cgroup/codecage/unit-<pid>.service`), with
/// the pid of the launcher each is named after (`run-<pid ns>-<pid>-<start>-<n>`). Runs of
/// launchers in other pid namespaces are left out: their pids mean nothing here.
pub fn run_cgroups() -> Vec<(u32, PathBuf)> {
    let root = Path::new("/sys/fs/cgroup");
    let mut parents = Vec::new();
    codecage_parents(root, 0, &mut parents);
    let ns = pid_namespace().to_string();
    let mut runs = Vec::new();
    for parent in parents {
        for entry in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let fields: Vec<&str> = name.split('-').collect();
            let ["run", run_ns, pid, _start, _n] = fields[..] else {
                continue;
            };
            match pid.parse() {
                Ok(pid) if run_ns == ns => runs.push((pid, entry.path())),
                _ => {}
            }
        }
    }
    runs
}

/// The directories named `codecage` in the cgroup tree under `dir`, a few levels deep (a
/// systemd unit sits two or three below a hierarchy's root), not inside run cgroups.
fn codecage_parents(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    if depth > 6 {
        return;
    }
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("run-") || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if name == "codecage" {
            out.push(entry.path());
        }
        codecage_parents(&entry.path(), depth + 1, out);
    }
}

/// The inode of this process's pid namespace: the first number of a run cgroup's name.
pub fn pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid").unwrap().ino()
}

/// Host pids whose command line starts with `needle` (NUL separates arguments).
/// The processes named by `needle` that have not begun to exit: PF_EXITING (0x4) is not
/// in their flags (/proc/PID/stat, field 9). One that has runs nothing of its program any
/// more, though the kernel may still be freeing what it held.
pub fn running_pids_with(needle: &str) -> Vec<u32> {
    host_pids_with(needle)
        .into_iter()
        .filter(|pid| task_flags(*pid).is_some_and(|f| f & 0x4 == 0))
        .collect()
}

/// The kernel's flags of process `pid` (`PF_*`; /proc/PID/stat, field 9: the 7th after the
/// name's last ')'), if it is there.
pub fn task_flags(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.rfind(')')?;
    stat[close + 1..].split_whitespace().nth(6)?.parse().ok()
}

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

/// One line of a mount table (`/proc/<pid>/mountinfo`, see proc_pid_mountinfo(5)).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mount {
    /// The directory of the filesystem that is mounted (`/` for the whole filesystem).
    pub root: String,
    pub mount_point: String,
    /// The mount's own options (`ro`, `nosuid`, `nodev`, ...).
    pub options: Vec<String>,
    pub fs_type: String,
    pub source: String,
    /// The options of the filesystem (its superblock).
    pub super_options: Vec<String>,
}

/// Parses a mountinfo table: `id parent major:minor root mount-point options [optional
/// fields...] - fs-type source super-options`, paths with `\NNN` octal escapes.
pub fn parse_mountinfo(table: &str) -> Vec<Mount> {
    let mut mounts = Vec::new();
    for line in table.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let dash = fields.iter().position(|f| *f == "-");
        let (Some(dash), true) = (dash, fields.len() > 5) else {
            panic!("not a mountinfo line: {line:?}");
        };
        let after = |i: usize| fields.get(dash + i).copied().unwrap_or_default();
        let list = |s: &str| s.split(',').map(str::to_string).collect::<Vec<_>>();
        mounts.push(Mount {
            root: unescape(fields[3]),
            mount_point: unescape(fields[4]),
            options: list(fields[5]),
            fs_type: after(1).to_string(),
            source: unescape(after(2)),
            super_options: list(after(3)),
        });
    }
    mounts
}

/// Undoes the kernel's `\NNN` octal escapes (of space, tab, newline and backslash).
fn unescape(field: &str) -> String {
    let mut out = Vec::with_capacity(field.len());
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes
            .get(i + 1..i + 4)
            .filter(|_| bytes[i] == b'\\')
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match code {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).to_string()
}

/// The mount table of the host (of this test process, which runs in the host's mount
/// namespace).
pub fn host_mounts() -> Vec<Mount> {
    parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap())
}

/// The mounts of `a` that `b` lacks, counting duplicates: a mount stacked on an identical
/// one is a change too.
fn missing_from(a: &[Mount], b: &[Mount]) -> Vec<Mount> {
    let mut rest: Vec<&Mount> = b.iter().collect();
    a.iter()
        .filter(|m| match rest.iter().position(|r| r == m) {
            Some(i) => {
                rest.swap_remove(i);
                false
            }
            None => true,
        })
        .cloned()
        .collect()
}

#[test]
fn mountinfo_lines_parse_with_optional_fields_and_escapes() {
    let table = "36 35 98:0 /mnt1 /mnt\\040two rw,noatime master:1 shared:2 - ext3 /dev/root rw,errors=continue\n\
                 85 84 0:45 /sys /proc/sys ro,nosuid - proc proc rw\n";
    let mounts = parse_mountinfo(table);
    assert_eq!(mounts.len(), 2);
    assert_eq!(
        mounts[0],
        Mount {
            root: "/mnt1".into(),
            mount_point: "/mnt two".into(),
            options: vec!["rw".into(), "noatime".into()],
            fs_type: "ext3".into(),
            source: "/dev/root".into(),
            super_options: vec!["rw".into(), "errors=continue".into()],
        }
    );
    assert_eq!(
        (
            mounts[1].mount_point.as_str(),
            mounts[1].options[0].as_str()
        ),
        ("/proc/sys", "ro")
    );
    assert!(
        missing_from(&[mounts[1].clone(), mounts[1].clone()], &mounts) == [mounts[1].clone()],
        "a duplicate counts"
    );
}

#[test]
fn mounts_in_another_tests_temp_dir_are_left_to_its_check() {
    let temp = std::env::temp_dir();
    let own = temp.join("ccmark-mine-1-0");
    let scope = Scope {
        temp_dirs: vec![own.clone()],
        ..Scope::default()
    };
    assert!(scope.of_another_test(&temp.join("ccmark-audit-disk-2-0")));
    assert!(scope.of_another_test(&temp.join("ccmark-nested-2-1/inner")));
    assert!(!scope.of_another_test(&own));
    assert!(!scope.of_another_test(&own.join("inner")));
    assert!(!scope.of_another_test(&temp.join("other")));
    assert!(!scope.of_another_test(Path::new("/mnt/ccmark-x")));
}
