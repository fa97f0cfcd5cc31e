//! The sandbox's processes as its init sees them in /proc: the members of a payload's
//! process group that a session call started, and killing exactly those (a pid with its
//! start time, so a pid reused meanwhile is never hit).

use std::fs;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::protocol::ProcessInfo;

/// At most this many processes are listed (the pids limit is far lower in practice).
const MAX_LISTED: usize = 4096;
/// A command line is cut at this many bytes.
const MAX_COMMAND: usize = 200;

/// What /proc/PID/stat says of a process that matters here.
struct Stat {
    state: char,
    pgrp: i32,
    /// The kernel's flags of the task (`PF_*`).
    flags: u64,
    start: u64,
    name: String,
}

/// `PF_EXITING` of include/linux/sched.h: the task has begun its exit.
const PF_EXITING: u64 = 0x4;

fn stat(pid: i32) -> Option<Stat> {
    stat_at(format!("/proc/{pid}/stat"))
}

/// The stat file at `path`: a process's, or one of its tasks' (/proc/PID/task/TID/stat).
fn stat_at(path: impl AsRef<std::path::Path>) -> Option<Stat> {
    let text = fs::read_to_string(path).ok()?;
    // "PID (NAME) STATE PPID PGRP SESSION ... STARTTIME(22) ...": the name may hold
    // spaces and parentheses, so the fields are counted from its last ')'.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let name = text.get(open + 1..close)?.to_string();
    let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // fields[0] is field 3 (state); field N is fields[N - 3].
    Some(Stat {
        state: fields.first()?.chars().next()?,
        pgrp: fields.get(2)?.parse().ok()?,
        flags: fields.get(6)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
        name,
    })
}

/// Whether the process ignores SIGHUP (bit 0 of SigIgn in /proc/PID/status).
fn ignores_hangup(pid: i32) -> bool {
    let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & 1 != 0)
}

fn command(pid: i32, name: &str) -> String {
    let argv = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let joined: Vec<String> = argv
        .split(|&b| b == 0)
        .filter(|arg| !arg.is_empty())
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect();
    let line = joined.join(" ");
    if line.is_empty() {
        return format!("[{name}]");
    }
    match crate::units::head(&line, MAX_COMMAND) {
        whole if whole.len() == line.len() => line,
        head => format!("{head}..."),
    }
}

/// Clock ticks a second, as /proc counts start times.
fn ticks_per_second() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|&t| t > 0)
        .map_or(100, |t| t as u64)
}

/// The last pid allocated in this pid namespace.
pub fn last_pid() -> Option<i32> {
    fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The live members of process group `pgrp`, other than `leader`, that a call started:
/// with a `mark` (the last pid allocated as the call began), those of a higher pid; should
/// the pids have wrapped around since, those started at or after `since_ns` of
/// CLOCK_BOOTTIME (whose ticks, 10 ms, /proc counts start times in: too coarse alone, a
/// process an earlier call started just before would count).
pub fn group_members(pgrp: i32, leader: i32, mark: Option<i32>, since_ns: u64) -> Vec<ProcessInfo> {
    let since = since_ns / (1_000_000_000 / ticks_per_second());
    let wrapped = matches!((mark, last_pid()), (Some(mark), Some(now)) if now < mark);
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut members = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == leader || pid == 1 {
            continue;
        }
        let Some(stat) = stat(pid) else { continue };
        let of_the_call = match mark {
            Some(mark) if !wrapped => pid > mark,
            _ => stat.start >= since,
        };
        if stat.pgrp != pgrp || stat.state == 'Z' || stat.state == 'X' || !of_the_call {
            continue;
        }
        members.push(ProcessInfo {
            pid,
            start: stat.start,
            command: command(pid, &stat.name),
            ignores_hangup: ignores_hangup(pid),
        });
        if members.len() >= MAX_LISTED {
            break;
        }
    }
    members.sort_by_key(|p| p.pid);
    members
}

/// Whether every thread of the sandbox but the init's has begun its exit: PF_EXITING in
/// the flags of /proc/PID/task/TID/stat (field 9), which the kernel sets as a killed thread
/// leaves its last system call, before it frees anything; zombies keep it. A thread with it
/// runs no code of its process and is in none of its system calls any more. A task whose
/// stat is gone meanwhile counts as exited.
pub fn all_exiting() -> bool {
    let Ok(dir) = fs::read_dir("/proc") else {
        return false;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if pid == 1 {
            continue;
        }
        let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            if stat_at(task.path().join("stat")).is_some_and(|s| s.flags & PF_EXITING == 0) {
                return false;
            }
        }
    }
    true
}

/// SIGKILL to each process that is still the one named (same pid, same start time).
pub fn kill_exact(processes: &[(i32, u64)]) {
    for &(pid, start) in processes {
        if pid > 1 && stat(pid).is_some_and(|s| s.start == start) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}
