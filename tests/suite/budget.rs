//! The start-up budget (tests/budget.toml): what one `codecage run --rootfs host --
//! /bin/true` costs, in counts that do not depend on the machine's load: the system calls
//! that change mount tables, the execs, the clones, the files the launcher opens (from
//! strace), the loadable size of the init binary, and the launcher's peak RSS. Wall time
//! is measured side by side by `cargo xtask bench`, never here; these counts are what
//! creeps when code joins the single run's path. A change that goes over a budget raises
//! it in the same commit and says why in the commit message.
//!
//! Native only: the counts are this host's (cgroup layout, kernel), and the VM lanes have
//! no strace. The figures are of the test profile's build (debug), which the suite runs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;

use super::common::*;

const BUDGET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/budget.toml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Budget {
    /// mount, umount2, pivot_root, mount_setattr, move_mount, fsmount, open_tree.
    mount_calls: u64,
    /// fsopen and fsconfig (the new mount API's configuration of a file system).
    fs_config_calls: u64,
    /// execve and execveat, of every process (the `codecage` command's own included).
    execs: u64,
    /// clone, clone3, fork and vfork, threads included.
    clones: u64,
    /// open and openat by the launcher's threads (the libraries the loader opens included).
    launcher_opens: u64,
    /// The init binary's loadable size (its PT_LOAD segments in memory), KiB.
    init_load_kib: u64,
    /// The `codecage` binary's loadable size, KiB: what a run maps and relocates. The
    /// server's code is in `codecage-full`; a run that reached it would link it again.
    launcher_load_kib: u64,
    /// The launcher's peak RSS (ru_maxrss of its process tree: the launcher's own, as the
    /// init and /bin/true are smaller), KiB.
    launcher_peak_rss_kib: u64,
}

const MOUNT_CALLS: &[&str] = &[
    "mount",
    "umount2",
    "pivot_root",
    "mount_setattr",
    "move_mount",
    "fsmount",
    "open_tree",
];
const FS_CONFIG_CALLS: &[&str] = &["fsopen", "fsconfig"];
const EXECS: &[&str] = &["execve", "execveat"];
const CLONES: &[&str] = &["clone", "clone3", "fork", "vfork"];
const OPENS: &[&str] = &["open", "openat"];

/// An open of `/proc/PID/stat`: the start-up sweep reads one for each launcher whose runs
/// it finds in the `codecage` parents (whether that launcher still lives), so their number
/// is the suite's concurrency, not the run's: left out of `launcher_opens`.
fn is_proc_stat(args: &str) -> bool {
    args.split('"').nth(1).is_some_and(|path| {
        path.strip_prefix("/proc/")
            .and_then(|rest| rest.strip_suffix("/stat"))
            .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
    })
}

#[test]
fn a_true_run_stays_within_the_start_up_budget() {
    as_root(|| {
        let budget: Budget = toml::from_str(&std::fs::read_to_string(BUDGET).unwrap())
            .unwrap_or_else(|e| panic!("{BUDGET}: {e}"));
        let codecage = PathBuf::from(env!("CARGO_BIN_EXE_codecage"));
        let init = codecage.with_file_name("codecage-init");
        assert!(
            init.is_file(),
            "{} is missing: cargo builds it beside codecage",
            init.display()
        );

        // The peak RSS first, without strace, and before this process waits for any other
        // child: RUSAGE_CHILDREN's maxrss is the largest of every child waited for.
        let before = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
            .unwrap()
            .max_rss();
        assert_eq!(before, 0, "this test must be the process's first to wait for a child (nextest runs each test alone)");
        // Without the test harness's LD_LIBRARY_PATH (cargo's build dirs), where the loader
        // would look for every library first.
        let out = codecage_run()
            .args(["--", "/bin/true"])
            .env_remove("LD_LIBRARY_PATH")
            .launch_output();
        assert!(out.status.success(), "{out:?}");
        let rss_kib = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
            .unwrap()
            .max_rss() as u64;

        let dir = TempDir::new("budget");
        let trace = dir.path().join("strace.txt");
        let traced = [MOUNT_CALLS, FS_CONFIG_CALLS, EXECS, CLONES, OPENS]
            .concat()
            .join(",");
        let status = Command::new("strace")
            .args(["-f", "-qq", "-o"])
            .arg(&trace)
            .arg(format!("--trace={traced}"))
            .arg(&codecage)
            .args(["run", "--rootfs", "host", "--", "/bin/true"])
            .stdin(Stdio::null())
            .env_remove("LD_LIBRARY_PATH")
            .status()
            .expect("strace (Debian's strace package; cargo xtask test installs it)");
        assert!(status.success(), "the traced run failed: {status}");
        let text = std::fs::read_to_string(&trace).unwrap();
        let calls = parse_strace(&text);
        if let Some(launcher) = calls.first().map(|c| c.pid) {
            super::host::note_launcher(launcher);
        }
        assert!(
            calls
                .iter()
                .any(|c| c.name == "openat" && c.args.contains(&*init.to_string_lossy())),
            "the launcher did not open {} as the sandbox's init",
            init.display()
        );

        let count = |names: &[&str]| {
            calls
                .iter()
                .filter(|c| names.contains(&c.name.as_str()))
                .count() as u64
        };
        let launcher = launcher_tids(&calls);
        let measured = [
            ("mount_calls", count(MOUNT_CALLS), budget.mount_calls),
            (
                "fs_config_calls",
                count(FS_CONFIG_CALLS),
                budget.fs_config_calls,
            ),
            ("execs", count(EXECS), budget.execs),
            ("clones", count(CLONES), budget.clones),
            (
                "launcher_opens",
                calls
                    .iter()
                    .filter(|c| {
                        OPENS.contains(&c.name.as_str())
                            && launcher.contains(&c.pid)
                            && !is_proc_stat(&c.args)
                    })
                    .count() as u64,
                budget.launcher_opens,
            ),
            (
                "init_load_kib",
                load_size(&init) / 1024,
                budget.init_load_kib,
            ),
            (
                "launcher_load_kib",
                load_size(&codecage) / 1024,
                budget.launcher_load_kib,
            ),
            (
                "launcher_peak_rss_kib",
                rss_kib,
                budget.launcher_peak_rss_kib,
            ),
        ];
        let report: Vec<String> = measured
            .iter()
            .map(|(name, got, max)| format!("{name} = {got} (budget {max})"))
            .collect();
        eprintln!(
            "start-up counts of `codecage run --rootfs host -- /bin/true`:\n  {}",
            report.join("\n  ")
        );
        let over: Vec<&String> = measured
            .iter()
            .zip(&report)
            .filter(|((_, got, max), _)| got > max)
            .map(|(_, line)| line)
            .collect();
        assert!(
            over.is_empty(),
            "over the start-up budget in tests/budget.toml: {over:?}. If the change is worth \
             it, raise the budget in the same commit and say why in the commit message; \
             the calls by name:\n{:?}\nthe launcher's opens:\n{}",
            by_name(&calls),
            calls
                .iter()
                .filter(|c| OPENS.contains(&c.name.as_str()) && launcher.contains(&c.pid))
                .map(|c| c.args.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        );
    });
}

/// One system call of an `strace -f` log: `PID name(args) = result`.
#[derive(Debug)]
struct Call {
    pid: u32,
    name: String,
    args: String,
    result: String,
}

/// The calls of `strace -f -qq -o FILE` (each line prefixed with its tid). Calls that strace
/// split (`<unfinished ...>` and `<... NAME resumed>`) count once, where they began.
fn parse_strace(text: &str) -> Vec<Call> {
    let mut calls = Vec::new();
    for line in text.lines() {
        let Some((pid, rest)) = line.split_once(' ') else {
            continue;
        };
        let (Ok(pid), rest) = (pid.parse(), rest.trim_start()) else {
            continue;
        };
        if rest.starts_with("<...") || rest.starts_with("---") || rest.starts_with("+++") {
            continue;
        }
        let Some((name, args)) = rest.split_once('(') else {
            continue;
        };
        let result = args
            .rsplit_once(" = ")
            .map(|(_, r)| r.to_string())
            .unwrap_or_default();
        calls.push(Call {
            pid,
            name: name.to_string(),
            args: args.to_string(),
            result,
        });
    }
    calls
}

/// The launcher's threads: the first traced process and the threads it made
/// (`CLONE_THREAD`), recursively.
fn launcher_tids(calls: &[Call]) -> BTreeSet<u32> {
    let mut tids: BTreeSet<u32> = calls.first().map(|c| c.pid).into_iter().collect();
    for call in calls {
        if CLONES.contains(&call.name.as_str())
            && tids.contains(&call.pid)
            && call.args.contains("CLONE_THREAD")
        {
            if let Ok(tid) = call.result.split_whitespace().next().unwrap_or("").parse() {
                tids.insert(tid);
            }
        }
    }
    tids
}

fn by_name(calls: &[Call]) -> BTreeMap<&str, usize> {
    let mut names = BTreeMap::new();
    for call in calls {
        *names.entry(call.name.as_str()).or_default() += 1;
    }
    names
}

/// The sum of an ELF64 file's PT_LOAD segments' sizes in memory (p_memsz).
fn load_size(path: &Path) -> u64 {
    let elf = std::fs::read(path).unwrap();
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap());
    assert_eq!(
        &elf[..5],
        b"\x7fELF\x02",
        "{} is not an ELF64 file",
        path.display()
    );
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    (0..phnum)
        .map(|i| phoff + i * phentsize)
        .filter(|&ph| u32::from_le_bytes(elf[ph..ph + 4].try_into().unwrap()) == 1)
        .map(|ph| u64_at(ph + 0x28))
        .sum()
}

#[test]
fn strace_lines_parse_with_unfinished_calls_and_threads() {
    let log = "\
100 execve(\"/x/codecage\", [\"codecage\"], 0x1 /* 3 vars */) = 0
100 clone3({flags=CLONE_VM|CLONE_THREAD|CLONE_SETTLS, child_tid=0x1} => {parent_tid=[101]}, 88) = 101
101 clone3({flags=CLONE_PIDFD|CLONE_NEWNS, pidfd=0x2} <unfinished ...>
100 openat(AT_FDCWD, \"/etc/ld.so.cache\", O_RDONLY|O_CLOEXEC) = 3
101 <... clone3 resumed> => {pidfd=[11]}, 88) = 102
102 openat(AT_FDCWD, \"/proc/self/fd\", O_RDONLY) = 4
102 +++ exited with 0 +++
";
    let calls = parse_strace(log);
    assert_eq!(calls.len(), 5);
    assert_eq!(launcher_tids(&calls), BTreeSet::from([100, 101]));
    assert_eq!(by_name(&calls)["clone3"], 2);
}

#[test]
fn the_sweeps_proc_stat_reads_are_told_from_the_runs_own_opens() {
    assert!(is_proc_stat(
        r#"AT_FDCWD, "/proc/1688/stat", O_RDONLY|O_CLOEXEC"#
    ));
    for other in [
        r#"AT_FDCWD, "/proc/self/stat", O_RDONLY|O_CLOEXEC"#,
        r#"AT_FDCWD, "/proc/1698/uid_map", O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC, 0666"#,
        r#"AT_FDCWD, "/proc//stat", O_RDONLY"#,
        r#"AT_FDCWD, "/etc/ld.so.cache", O_RDONLY|O_CLOEXEC"#,
    ] {
        assert!(!is_proc_stat(other), "{other}");
    }
}
