//! What the sandbox's /proc (and /sys) say about the machine. A fresh procfs describes the
//! host: its kernel command line and config, its memory, CPUs, disks, interrupts, load,
//! pressure and file locks. A payload needs none of that, and programs size themselves from
//! some of it (numpy and Node size thread pools from the CPU count, caches from MemTotal).
//! So, as runc masks paths and lxcfs rewrites files:
//!
//! - entries that describe the host and that programs do without are hidden: an empty
//!   read-only file bound over each, or an empty read-only directory;
//! - entries programs read are replaced by the sandbox's own truth, computed once at start
//!   (a static snapshot: `MemTotal` is the memory limit, the CPU count is the CPU limit
//!   rounded up, load and task counts are the sandbox's);
//! - `/sys` holds only the CPU topology files glibc reads for the CPU count.
//!
//! Root-only entries (kcore, slabinfo, timer_list, ...) need no mask: the payload's uid
//! cannot read them.

use std::fs;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use super::mount::bind_copy;
use super::skeleton::Entry;
use crate::protocol::{SetupError, Step};
use crate::spec::{SandboxSpec, CPU_PERIOD_US};

type Done = Result<(), SetupError>;

/// /proc files a payload can read that describe the host, hidden behind an empty file.
pub const MASKED_FILES: &[&str] = &[
    "buddyinfo",
    "cmdline",
    "config.gz",
    "consoles",
    "diskstats",
    "dma",
    "interrupts",
    "iomem",
    "ioports",
    "kallsyms",
    "key-users",
    "keys",
    "locks",
    "partitions",
    "softirqs",
    "swaps",
    "vmstat",
    "zoneinfo",
];

/// /proc files replaced by the sandbox's own values.
pub const VIRTUAL_FILES: &[&str] = &[
    "meminfo",
    "cpuinfo",
    "stat",
    "loadavg",
    "sys/kernel/random/boot_id",
];

/// /proc directories a payload could list that describe the host, each hidden behind an
/// empty read-only directory.
pub const MASKED_DIRS: &[&str] = &["acpi", "driver", "pressure"];

/// The names in the stage of the empty file and directory that mask host entries.
const EMPTY_FILE: &str = "empty";
const EMPTY_DIR: &str = "empty.d";

/// The name in the stage of the sandbox's own /proc/`name`.
fn staged_name(name: &str) -> String {
    name.replace('/', "_")
}

/// What the stage holds (see [`super::mount::Stage`]; written by the launcher, see
/// [`super::skeleton`]) for the new /proc: the empty file and directory that hide the host's
/// entries, and the sandbox's own meminfo, cpuinfo, stat, loadavg and boot id; and the
/// sandbox's /sys.
pub(super) fn stage_entries(spec: &SandboxSpec, entries: &mut Vec<Entry>) {
    let facts = Facts::of(spec);
    entries.push(Entry::File(EMPTY_FILE.into(), Vec::new()));
    entries.push(Entry::Dir(EMPTY_DIR.into(), 0o555));
    for name in VIRTUAL_FILES {
        let content = match *name {
            "meminfo" => facts.meminfo(),
            "cpuinfo" => facts.cpuinfo(&read_host("cpuinfo")),
            "stat" => facts.stat(&read_host("stat")),
            "loadavg" => "0.00 0.00 0.00 1/1 1\n".to_string(),
            _ => format!("{}\n", random_uuid()),
        };
        entries.push(Entry::File(staged_name(name), content.into_bytes()));
    }
    // The sandbox's /sys (see mount_sys).
    let cpu = "sys/devices/system/cpu";
    super::skeleton::dirs_to(entries, cpu);
    let range = facts.cpu_range();
    for name in ["online", "possible", "present"] {
        entries.push(Entry::File(
            format!("{cpu}/{name}"),
            range.clone().into_bytes(),
        ));
    }
}

/// Hides the host's entries of the new /proc mounted at `proc` behind the stage's empty
/// file and directory. The stage is read-only by now, and a bind copies its source mount's
/// flags: one remount of the stage serves every bind. (Binding /dev/null instead, as runc
/// does, would give EACCES here: our read-only binds are nodev.)
pub fn mask_host_entries(proc: &Path, stage: &Path) -> Done {
    let fail = |e: nix::Error, what: &str| SetupError::errno(Step::MaskHostProcEntries, e, what);
    for (names, empty, is_dir) in [
        (MASKED_FILES, EMPTY_FILE, false),
        (MASKED_DIRS, EMPTY_DIR, true),
    ] {
        for name in names {
            // Not there (or, for a directory, not a directory): nothing to hide.
            let absent: &[Errno] = if is_dir {
                &[Errno::ENOENT, Errno::ENOTDIR]
            } else {
                &[Errno::ENOENT]
            };
            bind_if_there(&stage.join(empty), &proc.join(name), absent)
                .map_err(|e| fail(e, &format!("hiding /proc/{name}")))?;
        }
    }
    Ok(())
}

/// Binds the sandbox's own meminfo, cpuinfo, stat, loadavg and boot id, staged
/// ([`stage_entries`]) on the read-only stage, over /proc's.
pub fn bind_sandbox_files(proc: &Path, stage: &Path) -> Done {
    for name in VIRTUAL_FILES {
        let target = proc.join(name);
        bind_if_there(&stage.join(staged_name(name)), &target, &[Errno::ENOENT]).map_err(|e| {
            SetupError::errno(
                Step::WriteSandboxProcFiles,
                e,
                format!("binding the sandbox's /proc/{name}"),
            )
        })?;
    }
    Ok(())
}

/// [`bind_copy`] of `src` over `dst`, where `dst` exists: the bind's own error (one of
/// `absent`) says it does not, which spares a lookup before each bind (in /proc a lookup
/// costs about what the bind does). Other errors are errors, and so is a missing `src`
/// (the same errno from mount(2)): a mask that is not there must not pass for an entry
/// that is not there, or the host's entry would stay visible.
pub(super) fn bind_if_there(src: &Path, dst: &Path, absent: &[Errno]) -> nix::Result<()> {
    match bind_copy(src, dst) {
        Err(e) if absent.contains(&e) && src.exists() => Ok(()),
        other => other,
    }
}

/// A read-only /sys with the CPU topology files glibc's CPU count reads, when the root has
/// a /sys to mount on: the stage's `sys` ([`stage_entries`]), bound.
pub fn mount_sys(sys: &Path, stage: &Path) -> Done {
    if !sys.is_dir() {
        return Ok(());
    }
    bind_copy(&stage.join("sys"), sys)
        .map_err(|e| SetupError::errno(Step::MountSys, e, "binding the minimal /sys"))
}

fn read_host(name: &str) -> String {
    fs::read_to_string(PathBuf::from("/proc").join(name)).unwrap_or_default()
}

/// A random version-4 UUID, as the kernel writes boot ids.
fn random_uuid() -> String {
    let mut bytes = [0u8; 16];
    if let Ok(mut f) = fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut bytes);
    }
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The machine as the sandbox should see it.
struct Facts {
    /// Bytes of memory: the limit, or the host's.
    memory: Option<u64>,
    /// CPUs: the CPU limit rounded up, at most the host's.
    cpus: usize,
}

impl Facts {
    fn of(spec: &SandboxSpec) -> Facts {
        // The CPUs the sandbox may run on (it inherits the launcher's affinity). Not
        // available_parallelism: that also reads the calling process's cgroup quota, which
        // is the launcher's, and parses /proc/self/mountinfo to find it.
        let host_cpus = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
            .map(|set| {
                (0..nix::sched::CpuSet::count())
                    .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
                    .count()
            })
            .ok()
            .filter(|&cpus| cpus > 0)
            // A host with more CPUs than the set holds (1024: EINVAL): the count std finds.
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let cpus = match spec.limits {
            Some(l) => (l.cpu_quota_us.div_ceil(CPU_PERIOD_US) as usize).clamp(1, host_cpus),
            None => host_cpus,
        };
        Facts {
            memory: spec.limits.map(|l| l.memory),
            cpus,
        }
    }

    /// "0-1" for two CPUs, "0" for one.
    fn cpu_range(&self) -> String {
        match self.cpus {
            1 => "0\n".to_string(),
            n => format!("0-{}\n", n - 1),
        }
    }

    /// The fields programs read (psutil, free, Node's os.totalmem), from the limit. Usage
    /// is reported as none: a snapshot at start would only be wrong later.
    fn meminfo(&self) -> String {
        let total_kb = match self.memory {
            Some(bytes) => bytes / 1024,
            None => host_meminfo_total_kb(),
        };
        let mut out = String::new();
        for (key, kb) in [
            ("MemTotal", total_kb),
            ("MemFree", total_kb),
            ("MemAvailable", total_kb),
            ("Buffers", 0),
            ("Cached", 0),
            ("SwapCached", 0),
            ("Active", 0),
            ("Inactive", 0),
            ("Active(anon)", 0),
            ("Inactive(anon)", 0),
            ("Active(file)", 0),
            ("Inactive(file)", 0),
            ("Unevictable", 0),
            ("Mlocked", 0),
            ("SwapTotal", 0),
            ("SwapFree", 0),
            ("Dirty", 0),
            ("Writeback", 0),
            ("AnonPages", 0),
            ("Mapped", 0),
            ("Shmem", 0),
            ("Slab", 0),
            ("SReclaimable", 0),
            ("SUnreclaim", 0),
        ] {
            out.push_str(&format!("{:<16}{kb:>8} kB\n", format!("{key}:")));
        }
        out
    }

    /// The host's first `cpus` processor blocks, renumbered, with the counts they carry.
    fn cpuinfo(&self, host: &str) -> String {
        let blocks: Vec<&str> = host
            .split("\n\n")
            .filter(|b| !b.trim().is_empty())
            .take(self.cpus)
            .collect();
        let mut out = String::new();
        for block in blocks {
            for line in block.lines() {
                let key = line.split(':').next().unwrap_or("").trim();
                let value = match key {
                    "siblings" | "cpu cores" => Some(self.cpus.to_string()),
                    _ => None,
                };
                match value {
                    Some(v) => out.push_str(&format!("{key}\t: {v}\n")),
                    None => out.push_str(&format!("{line}\n")),
                }
            }
            out.push('\n');
        }
        out
    }

    /// The aggregate and the first `cpus` per-CPU lines of the host's /proc/stat, and the
    /// sandbox's task counts (not the host's).
    fn stat(&self, host: &str) -> String {
        let mut out = String::new();
        let mut per_cpu = 0;
        for line in host.lines() {
            let key = line.split_whitespace().next().unwrap_or("");
            if key == "cpu" {
                out.push_str(line);
                out.push('\n');
            } else if key.starts_with("cpu") {
                if per_cpu < self.cpus {
                    out.push_str(&format!("cpu{per_cpu}{}\n", &line[key.len()..]));
                    per_cpu += 1;
                }
            } else if key == "btime" {
                out.push_str(line);
                out.push('\n');
            }
        }
        out.push_str("intr 0\nctxt 0\nprocesses 1\nprocs_running 1\nprocs_blocked 0\nsoftirq 0\n");
        out
    }
}

fn host_meminfo_total_kb() -> u64 {
    read_host("meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(cpus: usize) -> Facts {
        Facts {
            memory: Some(64 << 20),
            cpus,
        }
    }

    #[test]
    fn meminfo_says_the_limit() {
        let m = facts(1).meminfo();
        assert!(m.starts_with("MemTotal:          65536 kB\n"), "{m}");
        assert!(m.contains("MemAvailable:      65536 kB\n"), "{m}");
    }

    #[test]
    fn cpuinfo_and_stat_keep_as_many_cpus_as_the_limit() {
        let host = "processor\t: 0\nsiblings\t: 8\n\nprocessor\t: 1\nsiblings\t: 8\n\n";
        let c = facts(1).cpuinfo(host);
        assert_eq!(c.matches("processor").count(), 1, "{c}");
        assert!(c.contains("siblings\t: 1"), "{c}");
        let stat = "cpu  1 2 3\ncpu0 1 1 1\ncpu1 0 1 2\nintr 5 6\nbtime 17\nprocesses 999\n";
        let s = facts(1).stat(stat);
        assert!(s.contains("cpu0 1 1 1\n") && !s.contains("cpu1"), "{s}");
        assert!(s.contains("btime 17") && s.contains("processes 1\n"), "{s}");
        assert_eq!(facts(2).cpu_range(), "0-1\n");
        assert_eq!(facts(1).cpu_range(), "0\n");
    }

    #[test]
    fn boot_ids_look_like_the_kernels() {
        let id = random_uuid();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert_ne!(id, random_uuid());
    }
}
