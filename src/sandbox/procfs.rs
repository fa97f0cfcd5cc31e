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

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use super::mount::{attach, bind_copy, bind_readonly, mkdir, TmpfsFds};
use crate::protocol::{SetupError, Step};
use crate::protocol::{Tmpfs, MASKED_PROC_DIRS};
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

/// Hides the host's entries of the new /proc mounted at `proc`. The empty file bound over
/// them is staged at `empty` (on the sandbox's /dev tmpfs, before it is made read-only) and
/// unlinked afterwards: the binds keep it alive, and nothing of it stays visible elsewhere.
/// (Binding /dev/null instead, as runc does, would give EACCES here: our read-only binds
/// are nodev.)
pub fn mask_host_entries(proc: &Path, empty: &Path, tmpfs: &mut TmpfsFds) -> Done {
    let fail = |e: nix::Error, what: &str| SetupError::errno(Step::MaskHostProcEntries, e, what);
    fs::write(empty, b"")
        .map_err(|e| SetupError::io(Step::MaskHostProcEntries, &e, "creating the empty file"))?;
    // Made read-only once (bound onto itself), then bound over each entry: a bind copies
    // the read-only flag, which saves a remount per entry.
    bind_readonly(empty, empty).map_err(|e| fail(e, "making the empty file read-only"))?;
    for name in MASKED_FILES {
        let path = proc.join(name);
        if !path.exists() {
            continue;
        }
        bind_copy(empty, &path).map_err(|e| fail(e, &format!("hiding /proc/{name}")))?;
    }
    for (i, name) in MASKED_PROC_DIRS.iter().enumerate() {
        let path = proc.join(name);
        if !path.is_dir() {
            continue;
        }
        // An empty tmpfs made by the launcher, read-only once here.
        attach(tmpfs, Tmpfs::MaskedProc(i), &path).map_err(|e| {
            SetupError::io(
                Step::MaskHostProcEntries,
                &e,
                format!("hiding /proc/{name}"),
            )
        })?;
        super::mount::remount_readonly(&path)
            .map_err(|e| fail(e, &format!("making /proc/{name} read-only")))?;
    }
    umount2(empty, MntFlags::MNT_DETACH).map_err(|e| fail(e, "unbinding the empty file"))?;
    fs::remove_file(empty)
        .map_err(|e| SetupError::io(Step::MaskHostProcEntries, &e, "removing the empty file"))
}

/// Writes the sandbox's own meminfo, cpuinfo, stat, loadavg and boot id, and binds them
/// over /proc's. The files are staged in `staging` (on /dev's tmpfs) and unlinked after.
pub fn write_sandbox_files(proc: &Path, staging: &Path, spec: &SandboxSpec) -> Done {
    let facts = Facts::of(spec);
    let fail = |e: std::io::Error, what: &str| {
        SetupError::io(Step::WriteSandboxProcFiles, &e, format!("writing {what}"))
    };
    mkdir(staging, 0o755).map_err(|e| fail(e, "the staging directory"))?;
    let mut staged = Vec::new();
    for name in VIRTUAL_FILES {
        let target = proc.join(name);
        if !target.exists() {
            continue;
        }
        let content = match *name {
            "meminfo" => facts.meminfo(),
            "cpuinfo" => facts.cpuinfo(&read_host("cpuinfo")),
            "stat" => facts.stat(&read_host("stat")),
            "loadavg" => "0.00 0.00 0.00 1/1 1\n".to_string(),
            _ => format!("{}\n", random_uuid()),
        };
        let file = staging.join(name.replace('/', "_"));
        fs::write(&file, content).map_err(|e| fail(e, &format!("/proc/{name}")))?;
        staged.push((name, file, target));
    }
    // The staging directory is made read-only once; each file's bind copies that.
    let bind_fail =
        |e: nix::Error, what: String| SetupError::errno(Step::WriteSandboxProcFiles, e, what);
    bind_readonly(staging, staging)
        .map_err(|e| bind_fail(e, "making the staging directory read-only".into()))?;
    for (name, file, target) in &staged {
        bind_copy(file, target)
            .map_err(|e| bind_fail(e, format!("binding the sandbox's /proc/{name}")))?;
    }
    umount2(staging, MntFlags::MNT_DETACH)
        .map_err(|e| bind_fail(e, "unbinding the staging directory".into()))?;
    for (name, file, _) in &staged {
        fs::remove_file(file).map_err(|e| fail(e, &format!("(removing) /proc/{name}")))?;
    }
    fs::remove_dir(staging).map_err(|e| fail(e, "(removing) the staging directory"))
}

/// A read-only /sys with the CPU topology files glibc's CPU count reads, when the root has
/// a /sys to mount on.
pub fn mount_sys(sys: &Path, tmpfs: &mut TmpfsFds, spec: &SandboxSpec) -> Done {
    if !sys.is_dir() {
        return Ok(());
    }
    let fail = |e: std::io::Error, what: &str| {
        SetupError::io(Step::MountSys, &e, format!("writing /sys/{what}"))
    };
    attach(tmpfs, Tmpfs::Sys, sys)
        .map_err(|e| SetupError::io(Step::MountSys, &e, "mounting the tmpfs on /sys"))?;
    let cpu = sys.join("devices/system/cpu");
    fs::create_dir_all(&cpu).map_err(|e| fail(e, "devices/system/cpu"))?;
    let range = Facts::of(spec).cpu_range();
    for name in ["online", "possible", "present"] {
        fs::write(cpu.join(name), &range).map_err(|e| fail(e, name))?;
    }
    let flags = MsFlags::MS_BIND
        | MsFlags::MS_REMOUNT
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | MsFlags::MS_NOEXEC;
    mount(None::<&str>, sys, None::<&str>, flags, None::<&str>)
        .map_err(|e| SetupError::errno(Step::MountSys, e, "making /sys read-only"))
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
        let host_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
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
