//! Resource limits: one cgroup per run, under one `codecage` parent, on v2, v1 and hybrid
//! hosts, behind one interface: create with limits, attach, kill, read usage, remove.
//!
//! Why not the cgroups-rs crate: it drives a hybrid host as plain v1 and ignores the
//! unified tree (so no `cgroup.kill`, `cgroup.events` or `CLONE_INTO_CGROUP` there), it does
//! not parse `memory.events` on v2 (its OOM counter is always 0), it drops the errors of
//! `cgroup.subtree_control` writes (the EBUSY of the no-internal-process rule goes unseen),
//! it exposes no directory fd for `CLONE_INTO_CGROUP`, and it brings nix 0.25 and zbus
//! (91 crates). What codecage needs is a few dozen file reads and writes, done here with
//! errors that name the file and say what to configure.
//!
//! Layout per backend (`<run>` is `run-<pid namespace>-<launcher pid>-<start time>-<n>`):
//! - v2: `<root>/codecage/<run>` with memory.max, memory.swap.max, cpu.max, pids.max; the
//!   init is born in it (`CLONE_INTO_CGROUP`). A server whose own cgroup is delegated to it
//!   (systemd's `Delegate=yes`) uses `<its cgroup>/codecage/<run>` instead, from a leaf
//!   `<its cgroup>/supervisor` (see [`delegation`]).
//! - v1: `<controller>/codecage/<run>` in memory, cpu, cpuacct and pids; the init's raw
//!   child moves itself in (writes "0" into each `tasks` file) before it execs anything.
//! - hybrid: the v1 directories for limits and memory and pids usage, plus
//!   `<unified>/codecage/<run>` for `CLONE_INTO_CGROUP`, `cgroup.kill` and the CPU time
//!   (the unified tree's cpu.stat counts it without any controller), so no cpuacct
//!   directory: a hierarchy fewer to create, join and remove at every run.

pub mod delegation;
pub mod detect;

use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::outcome::Skipped;
pub use crate::spec::{Limits, CPU_PERIOD_US};
pub use detect::{Controller, Layout};

/// The name of the parent cgroup every sandbox cgroup lives under.
pub const PARENT: &str = "codecage";
/// The v1 controllers a hybrid host's run joins: no cpuacct, since the unified directory,
/// which every run has there, counts the CPU time (see `Meters::cpu`).
const HYBRID_V1: [Controller; 3] = [Controller::Memory, Controller::Cpu, Controller::Pids];
/// What a run's cgroup measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Peak memory of the whole sandbox (processes and the tmpfs pages they wrote), as the
    /// kernel keeps it: v2's memory.peak (Linux 5.19), v1's max_usage_in_bytes. None on an
    /// older v2 kernel; [`Usage::peak_memory_or_estimate`] then gives the best figure there is.
    pub peak_memory: Option<u64>,
    /// The memory limit the cgroup enforces (memory.max, memory.limit_in_bytes), if any.
    pub memory_limit: Option<u64>,
    /// Times a charge met the memory limit (v2's memory.events `max`): the sandbox's usage
    /// reached its limit at least once when this grew.
    pub memory_limit_hits: u64,
    /// CPU time of every process of the sandbox.
    pub cpu: Option<Duration>,
    /// Processes the kernel's OOM killer killed in the sandbox.
    pub oom_kills: u64,
    /// Times a fork failed because of the pids limit.
    pub pids_limit_hits: u64,
}

impl Usage {
    /// The sandbox's peak memory since `before` (a session's previous reading; None: since
    /// the start), where the kernel keeps no peak of its own (v2 before Linux 5.19):
    ///
    /// - the limit, when a charge met it since `before` (memory.events `max` grew): usage
    ///   was then within one charge batch of it, which is what memory.peak would say;
    /// - else `largest_rss` (the largest resident set of a process the init reaped, from
    ///   wait4), capped at the limit. RSS counts pages the cgroup was never charged for
    ///   (shared libraries and files already in the page cache, charged to whoever read them
    ///   first), so it can exceed what the cgroup held, which memory.max bounds: 70.8-71.4
    ///   MB for a Python bomb at a 64M limit on Linux 5.10.
    pub fn peak_memory_or_estimate(
        &self,
        before: Option<&Usage>,
        largest_rss: Option<u64>,
    ) -> Option<u64> {
        if self.peak_memory.is_some() {
            return self.peak_memory;
        }
        let hits = self
            .memory_limit_hits
            .saturating_sub(before.map_or(0, |b| b.memory_limit_hits));
        match self.memory_limit {
            Some(limit) if hits > 0 => Some(limit),
            Some(limit) => largest_rss.map(|rss| rss.min(limit)),
            None => largest_rss,
        }
    }
}

/// A cgroup operation that failed, with the file and what to do.
#[derive(Debug, thiserror::Error)]
#[error("cgroup setup failed: {op} {path}: {source}{hint}")]
pub struct CgroupError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
    pub hint: String,
}

impl CgroupError {
    /// The same error again (io::Error is not Clone), for each controller it stops.
    fn again(&self) -> CgroupError {
        CgroupError {
            op: self.op,
            path: self.path.clone(),
            source: match self.source.raw_os_error() {
                Some(errno) => io::Error::from_raw_os_error(errno),
                None => io::Error::new(self.source.kind(), self.source.to_string()),
            },
            hint: self.hint.clone(),
        }
    }
}

fn err(op: &'static str, path: &Path, source: io::Error) -> CgroupError {
    let hint = match source.raw_os_error() {
        Some(libc::EACCES | libc::EPERM | libc::EROFS) => {
            "; codecage must run as root (or own a delegated cgroup subtree) to create cgroups"
                .to_string()
        }
        _ => String::new(),
    };
    CgroupError {
        op,
        path: path.to_path_buf(),
        source,
        hint,
    }
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(|e| err("writing", path, e))
}

/// What the CPU quota file holds for a quota of `quota_us` per period, or none: v2's
/// `cpu.max` ("QUOTA PERIOD", "max PERIOD"), v1's `cpu.cfs_quota_us` ("QUOTA", "-1").
fn cpu_quota_text(v2: bool, quota_us: Option<u64>) -> String {
    match (v2, quota_us) {
        (true, Some(q)) => format!("{q} {CPU_PERIOD_US}"),
        (true, None) => format!("max {CPU_PERIOD_US}"),
        (false, Some(q)) => q.to_string(),
        (false, None) => "-1".to_string(),
    }
}

fn read(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok()
}

/// The host's layout, detected once per process.
pub fn layout() -> &'static Layout {
    static LAYOUT: OnceLock<Layout> = OnceLock::new();
    LAYOUT.get_or_init(detect::detect)
}

/// One run's cgroups. Dropping it removes them (best effort); [`RunCgroup::remove`] reports
/// what could not be removed.
pub struct RunCgroup {
    /// v2, or the controller-less unified tree of a hybrid host: the directory and an fd
    /// of it for `CLONE_INTO_CGROUP`.
    unified: Option<(PathBuf, OwnedFd)>,
    /// v2 holds the controllers in the unified directory.
    v2: bool,
    /// v1 directories, one per distinct hierarchy, with the controllers each serves.
    v1: Vec<(Vec<Controller>, PathBuf)>,
    limits: Limits,
    /// In best-effort mode a controller that cannot be set up is skipped, alone.
    best_effort: bool,
    /// What a best-effort run goes without, one entry per controller.
    skipped: Vec<Skipped>,
    removed: bool,
    /// The files [`RunCgroup::usage`] reads, opened at its first call.
    meters: OnceLock<Meters>,
    /// In the background: built ahead of a request and not yet handed to one (see
    /// [`RunCgroup::set_background`]).
    background: AtomicBool,
    /// The CPU quota is lifted while in the background.
    quota_lifted: AtomicBool,
    /// The v1 directories [`RunCgroup::finish`] is still to make: the run's name and the
    /// controllers wanted (see [`RunCgroup::begin`]).
    pending_v1: Option<(String, &'static [Controller])>,
}

/// The files a run's usage is read from, each opened once and read again from offset 0
/// (a seq_file shows itself afresh there): a session reads its usage before and after
/// every call, and opening a cgroup file (the path walk through cgroupfs and the seq_file
/// set up, then its close) cost more than the reading; measured, 22 % of the server's CPU
/// in a burst of session calls. The peak is also reset through its fd, which since Linux
/// 6.12 is the only way the reset holds on v2: a write to memory.peak resets the figure
/// for reads through the same open file only.
struct Meters {
    /// v2 memory.peak, v1 memory.max_usage_in_bytes (opened for writing too: the reset).
    peak: Meter,
    /// memory.max, memory.limit_in_bytes.
    limit: Meter,
    /// v2 memory.events (`max`, `oom_kill`), v1 memory.oom_control (`oom_kill`).
    memory_events: Meter,
    /// cpu.stat (`usage_usec`) of the unified directory (v2, hybrid), v1's cpuacct.usage
    /// (nanoseconds).
    cpu: Meter,
    /// pids.events (`max`).
    pids_events: Meter,
}

impl Meters {
    fn of(cgroup: &RunCgroup) -> Meters {
        let at = |dir: Option<&Path>, name: &str, writable: bool| Meter {
            path: dir.map(|d| d.join(name)),
            writable,
            file: OnceLock::new(),
        };
        if cgroup.v2 {
            let dir = cgroup.unified.as_ref().map(|(dir, _)| dir.as_path());
            return Meters {
                peak: at(dir, "memory.peak", true),
                limit: at(dir, "memory.max", false),
                memory_events: at(dir, "memory.events", false),
                cpu: at(dir, "cpu.stat", false),
                pids_events: at(dir, "pids.events", false),
            };
        }
        let memory = cgroup.v1_dir(Controller::Memory);
        let cpu = match &cgroup.unified {
            Some((dir, _)) => at(Some(dir), "cpu.stat", false),
            None => at(cgroup.v1_dir(Controller::Cpuacct), "cpuacct.usage", false),
        };
        Meters {
            peak: at(memory, "memory.max_usage_in_bytes", true),
            limit: at(memory, "memory.limit_in_bytes", false),
            memory_events: at(memory, "memory.oom_control", false),
            cpu,
            pids_events: at(cgroup.v1_dir(Controller::Pids), "pids.events", false),
        }
    }
}

/// One usage file, opened at its first reading. A file the kernel does not have (v2's
/// memory.peak before 5.19) is given up on; one that could not be opened otherwise (the
/// server out of fds) is tried again at the next reading, as a path read each time was.
struct Meter {
    path: Option<PathBuf>,
    writable: bool,
    /// Some(file), or None for a file that is not there.
    file: OnceLock<Option<fs::File>>,
}

impl Meter {
    fn file(&self) -> Option<&fs::File> {
        if let Some(known) = self.file.get() {
            return known.as_ref();
        }
        let path = self.path.as_ref()?;
        let opened = if self.writable {
            // Read-only where the kernel has no reset (memory.peak before 6.12 is 0444).
            fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .or_else(|_| fs::File::open(path))
        } else {
            fs::File::open(path)
        };
        match opened {
            Ok(file) => self.file.get_or_init(|| Some(file)).as_ref(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.file.get_or_init(|| None).as_ref()
            }
            Err(_) => None,
        }
    }

    /// The whole file, read from its start.
    fn text(&self) -> Option<String> {
        read_from_start(self.file()?)
    }

    fn number(&self) -> Option<u64> {
        self.text()?.trim().parse().ok()
    }
}

/// The whole of a cgroup file kept open, read from its start.
fn read_from_start(file: &fs::File) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let mut text = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        match file.read_at(&mut chunk, text.len() as u64) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    String::from_utf8(text).ok()
}

/// The value of `key` in "key value" lines (memory.events, cpu.stat, ...).
fn keyed_in(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        (parts.next()? == key)
            .then(|| parts.next()?.parse().ok())
            .flatten()
    })
}

/// A name unique to this run, `run-<pid ns>-<pid>-<start>-<n>`: the launcher's pid
/// namespace (the inode of /proc/self/ns/pid), pid and start time identify the launcher (a
/// recycled pid has another start time; a pid means nothing outside its namespace), the
/// counter the run within it.
fn run_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let id = launcher_identity();
    format!(
        "run-{}-{}-{}-{}",
        id.pid_ns,
        id.pid,
        id.start,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

#[derive(Clone, Copy)]
struct Launcher {
    pid_ns: u64,
    pid: u32,
    start: u64,
}

fn launcher_identity() -> Launcher {
    static ID: OnceLock<Launcher> = OnceLock::new();
    *ID.get_or_init(|| {
        let pid = std::process::id();
        Launcher {
            pid_ns: crate::sys::pid_namespace(),
            pid,
            start: process_start_time(pid).unwrap_or(0),
        }
    })
}

/// Field 22 of /proc/<pid>/stat: the start time in clock ticks since boot.
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = read(Path::new(&format!("/proc/{pid}/stat")))?;
    // The command name (field 2) may hold spaces; fields resume after its ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

impl RunCgroup {
    /// Creates this run's cgroups with `limits` on `layout`. Fails closed: a missing
    /// controller or a limit the kernel refuses is an error naming it, unless
    /// `best_effort`, where that controller alone is skipped and listed in
    /// [`RunCgroup::skipped`].
    pub fn create(
        layout: &Layout,
        limits: &Limits,
        best_effort: bool,
    ) -> Result<RunCgroup, CgroupError> {
        let mut run = RunCgroup::begin(layout, limits, best_effort)?;
        run.finish(layout)?;
        Ok(run)
    }

    /// The part of [`RunCgroup::create`] that must exist before the init is cloned: on v2
    /// the run's directory with its limits, on a hybrid host the unified directory (both
    /// are `CLONE_INTO_CGROUP`'s target). The v1 directories come with
    /// [`RunCgroup::finish`], which the launcher calls after the clone, before "go": the
    /// child joins them itself after "go", and meanwhile makes its network namespace, the
    /// largest part of its start, on the other CPU. [`RunCgroup::planned_v1_tasks_files`]
    /// names their `tasks` files before they exist.
    pub fn begin(
        layout: &Layout,
        limits: &Limits,
        best_effort: bool,
    ) -> Result<RunCgroup, CgroupError> {
        let name = run_name();
        let mut run = RunCgroup {
            unified: None,
            v2: false,
            v1: Vec::new(),
            limits: *limits,
            best_effort,
            skipped: Vec::new(),
            removed: false,
            meters: OnceLock::new(),
            background: AtomicBool::new(false),
            quota_lifted: AtomicBool::new(false),
            pending_v1: None,
        };
        match layout {
            Layout::V2 { root } => {
                let mut attempts = 0;
                let base = delegation::v2_base(root);
                let dir = loop {
                    let dir = v2_parent(&base, &mut run)?.join(&name);
                    match mkdir_755(&dir) {
                        // The parent went away with a concurrent run: make it again.
                        Err(e) if e.kind() == io::ErrorKind::NotFound && attempts < 8 => attempts += 1,
                        Err(e) => return Err(err("creating", &dir, e)),
                        Ok(()) => break dir,
                    }
                };
                run.open_unified(dir)?;
                run.v2 = true;
                run.write_v2_limits(layout)?;
            }
            Layout::V1 { .. } => run.pending_v1 = Some((name, &Controller::ALL)),
            Layout::Hybrid { unified, .. } => {
                let dir = unified.join(PARENT).join(&name);
                create_run_dir(&dir)?;
                run.open_unified(dir)?;
                run.pending_v1 = Some((name, &HYBRID_V1));
            }
            Layout::None => {
                return Err(CgroupError {
                    op: "finding",
                    path: "/sys/fs/cgroup".into(),
                    source: io::Error::from(io::ErrorKind::NotFound),
                    hint: "; no cgroup filesystem is mounted, so memory, CPU and process limits cannot be enforced"
                        .into(),
                })
            }
        }
        Ok(run)
    }

    /// The rest of [`RunCgroup::create`] after [`RunCgroup::begin`]: the sweep of dead
    /// launchers' runs, and the run's v1 directories with their limits (none on v2). In best-effort mode a hierarchy whose
    /// directory cannot be made is skipped with its controllers, and listed.
    pub fn finish(&mut self, layout: &Layout) -> Result<(), CgroupError> {
        // Dead launchers' runs go here, after the clone too (the first run only).
        sweep_leftovers_once(layout);
        match self.pending_v1.take() {
            Some((name, controllers)) => self.make_v1(layout, &name, controllers),
            None => Ok(()),
        }
    }

    /// The `tasks` files [`RunCgroup::v1_tasks_files`] will list once
    /// [`RunCgroup::finish`] has made them all (it lists fewer only when a best-effort run
    /// skipped a hierarchy).
    pub fn planned_v1_tasks_files(&self, layout: &Layout) -> Vec<PathBuf> {
        match &self.pending_v1 {
            Some((name, controllers)) => v1_plan(layout, name, controllers)
                .0
                .into_iter()
                .map(|(_, dir)| dir.join("tasks"))
                .collect(),
            None => self.v1_tasks_files(),
        }
    }

    /// Keeps the unified directory and an fd of it for `CLONE_INTO_CGROUP`.
    fn open_unified(&mut self, dir: PathBuf) -> Result<(), CgroupError> {
        let fd = nix::fcntl::open(
            &dir,
            nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| err("opening", &dir, e.into()));
        match fd {
            Ok(fd) => {
                self.unified = Some((dir, fd));
                Ok(())
            }
            Err(e) => {
                let _ = fs::remove_dir(&dir);
                Err(e)
            }
        }
    }

    /// What a best-effort run goes without (empty in required mode).
    pub fn skipped(&self) -> &[Skipped] {
        &self.skipped
    }

    /// A controller's setup step: in best-effort mode a failure skips that controller
    /// only, and is listed; otherwise it is the error.
    fn or_skip(
        &mut self,
        controller: &str,
        result: Result<(), CgroupError>,
    ) -> Result<(), CgroupError> {
        match result {
            Err(e) if self.best_effort => {
                let skipped = Skipped::new("cgroup", format!("{controller} limit"), e.to_string());
                // The payload's uid has its own process count, whatever the cgroup.
                self.skipped.push(if controller == "pids" {
                    skipped.covered_by("RLIMIT_NPROC of the payload's own uid")
                } else {
                    skipped
                });
                Ok(())
            }
            other => other,
        }
    }

    /// The run's directory in the v1 hierarchies of `controllers`, with their limits.
    fn make_v1(
        &mut self,
        layout: &Layout,
        name: &str,
        controllers: &[Controller],
    ) -> Result<(), CgroupError> {
        let (dirs, missing) = v1_plan(layout, name, controllers);
        for controller in missing {
            let missing = Err(missing_controller(layout, controller));
            self.or_skip(controller.name(), missing)?;
        }
        for (served, dir) in dirs {
            match create_run_dir(&dir) {
                Ok(()) => self.v1.push((served, dir)),
                Err(e) if self.best_effort => {
                    for controller in served {
                        self.or_skip(controller.name(), Err(e.again()))?;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        self.write_v1_limits()
    }

    fn v1_dir(&self, controller: Controller) -> Option<&Path> {
        self.v1
            .iter()
            .find(|(served, _)| served.contains(&controller))
            .map(|(_, dir)| dir.as_path())
    }

    fn write_v2_limits(&mut self, layout: &Layout) -> Result<(), CgroupError> {
        let Some((dir, _)) = &self.unified else {
            return Ok(());
        };
        let (dir, l) = (dir.clone(), self.limits);
        let available = match layout {
            Layout::V2 { root } => read(
                &delegation::v2_base(root)
                    .join(PARENT)
                    .join("cgroup.subtree_control"),
            )
            .unwrap_or_default(),
            _ => String::new(),
        };
        let has = |c: &str| available.split_whitespace().any(|a| a == c);
        // No swap beyond the memory limit (memory.swap.max is absent without swap support).
        // Socket buffers are charged to memory.current on v2 without further setup.
        let memory = if has("memory") {
            write(&dir.join("memory.max"), &l.memory.to_string()).and_then(|()| {
                let swap = dir.join("memory.swap.max");
                if swap.exists() {
                    write(&swap, "0")
                } else {
                    Ok(())
                }
            })
        } else {
            Err(unavailable_v2(&dir, "memory"))
        };
        self.or_skip("memory", memory)?;
        let cpu = if has("cpu") {
            write(
                &dir.join("cpu.max"),
                &cpu_quota_text(true, Some(l.cpu_quota_us)),
            )
        } else {
            Err(unavailable_v2(&dir, "cpu"))
        };
        self.or_skip("cpu", cpu)?;
        let pids = if has("pids") {
            write(&dir.join("pids.max"), &pids_max(&l))
        } else {
            Err(unavailable_v2(&dir, "pids"))
        };
        self.or_skip("pids", pids)
    }

    fn write_v1_limits(&mut self) -> Result<(), CgroupError> {
        let l = self.limits;
        if let Some(dir) = self.v1_dir(Controller::Memory).map(Path::to_path_buf) {
            let memory = write(&dir.join("memory.limit_in_bytes"), &l.memory.to_string())
                .and_then(|()| {
                    // memory+swap, after the memory limit (it may not be below it). Without
                    // swap accounting, swappiness 0 keeps the sandbox out of swap instead.
                    let memsw = dir.join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        write(&memsw, &l.memory.to_string())
                    } else {
                        let _ = write(&dir.join("memory.swappiness"), "0");
                        Ok(())
                    }
                })
                .and_then(|()| {
                    // v1 charges TCP and UDP socket buffers to no cgroup unless this limit is
                    // set: a sandbox could pin gigabytes of host memory in socket queues.
                    // Setting it turns the accounting on for every socket created after; the
                    // buffers are then capped at the memory limit (a counter of their own).
                    let tcp = dir.join("memory.kmem.tcp.limit_in_bytes");
                    if tcp.exists() {
                        write(&tcp, &l.memory.to_string())
                    } else {
                        Ok(())
                    }
                });
            self.or_skip("memory", memory)?;
        }
        if let Some(dir) = self.v1_dir(Controller::Cpu).map(Path::to_path_buf) {
            let quota = cpu_quota_text(false, Some(l.cpu_quota_us));
            let cpu = write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())
                .and_then(|()| write(&dir.join("cpu.cfs_quota_us"), &quota));
            self.or_skip("cpu", cpu)?;
        }
        if let Some(dir) = self.v1_dir(Controller::Pids).map(Path::to_path_buf) {
            let pids = write(&dir.join("pids.max"), &pids_max(&l));
            self.or_skip("pids", pids)?;
        }
        Ok(())
    }

    /// Whether the controllers (and their limits) are in the unified directory the init is
    /// cloned into (v2), not in v1 hierarchies it joins after "go".
    pub fn is_v2(&self) -> bool {
        self.v2
    }

    /// The directory fd to clone the init into (`CLONE_INTO_CGROUP`), on v2 and hybrid.
    pub fn clone_target(&self) -> Option<BorrowedFd<'_>> {
        self.unified.as_ref().map(|(_, fd)| fd.as_fd())
    }

    /// The `tasks` files of the run's v1 cgroups, which the child writes "0" into to move
    /// itself (see [`RunCgroup::attach`]).
    pub fn v1_tasks_files(&self) -> Vec<PathBuf> {
        self.v1.iter().map(|(_, dir)| dir.join("tasks")).collect()
    }

    /// Prepares the placement of the init with host pid `pid`, before it may run.
    ///
    /// - Not born inside (no `CLONE_INTO_CGROUP`, before Linux 5.7): its pid is written into
    ///   the unified cgroup's `cgroup.procs`.
    /// - v1 controllers: the run's `tasks` files are given to `owner`, the host uid the
    ///   child runs as, and the child moves itself by writing "0" into them. Moving another
    ///   process takes the kernel's cgroup_threadgroup_rwsem for writing, which waits for an
    ///   RCU grace period: 11.6 ms per run on the build machines, more than everything else
    ///   of a start together. A thread moving itself through `tasks` skips that lock
    ///   (cgroup_procs_write_start), 0.4 ms for four controllers. The sandbox cannot use the
    ///   files later: the init reaches them only before pivot_root (there is no /sys in the
    ///   sandbox), and the payload runs as another uid.
    pub fn attach(&self, pid: u32, born_inside: bool, owner: u32) -> Result<(), CgroupError> {
        if !born_inside {
            if let Some((dir, _)) = &self.unified {
                write(&dir.join("cgroup.procs"), &pid.to_string())?;
            }
        }
        for tasks in self.v1_tasks_files() {
            std::os::unix::fs::chown(&tasks, Some(owner), None)
                .map_err(|e| err("giving the child", &tasks, e))?;
        }
        Ok(())
    }

    /// Kills every process of the run's cgroups. A run's processes die with its init (the
    /// pid namespace); this is for a `RunCgroup` dropped without [`RunCgroup::remove`] (an
    /// early return), whose processes may still run.
    fn kill(&self) {
        for dir in self.dirs() {
            kill_members(&dir);
        }
    }

    /// Whether the kernel offers `cgroup.kill` for the run's unified cgroup (v2 and the
    /// unified tree of a hybrid host, Linux 5.14), which [`RunCgroup::kill`] uses where it can.
    pub fn has_cgroup_kill(&self) -> bool {
        self.unified
            .as_ref()
            .is_some_and(|(dir, _)| dir.join("cgroup.kill").exists())
    }

    /// Starts the peak-memory figure afresh: v1's max_usage_in_bytes takes a write of 0,
    /// v2's memory.peak any write (Linux 6.12; older kernels keep the cgroup's peak).
    /// The write goes through the fd [`RunCgroup::usage`] reads the peak from: v2 resets
    /// the figure for that fd alone.
    pub fn reset_peak_memory(&self) {
        use std::os::unix::fs::FileExt;
        if let Some(peak) = self.meters().peak.file() {
            let _ = peak.write_at(if self.v2 { b"reset" } else { b"0" }, 0);
        }
    }

    fn meters(&self) -> &Meters {
        self.meters.get_or_init(|| Meters::of(self))
    }

    /// Raises the memory limit by what the sandbox holds now: a pre-started interpreter's
    /// preload is not charged to the request's limit, which then gets the whole of it on
    /// top, as a cold run would. Returns the added bytes (0 where nothing could be read).
    pub fn grant_current_memory(&mut self) -> u64 {
        let base = self.limits.memory;
        if self.v2 {
            let Some((dir, _)) = &self.unified else {
                return 0;
            };
            let held = read_u64(&dir.join("memory.current")).unwrap_or(0);
            if held > 0 && write(&dir.join("memory.max"), &(base + held).to_string()).is_ok() {
                return held;
            }
            return 0;
        }
        let Some(dir) = self.v1_dir(Controller::Memory).map(Path::to_path_buf) else {
            return 0;
        };
        let held = read_u64(&dir.join("memory.usage_in_bytes")).unwrap_or(0);
        if held == 0 {
            return 0;
        }
        let limit = (base + held).to_string();
        // memory+swap may not be below memory: raised first.
        let memsw = dir.join("memory.memsw.limit_in_bytes");
        if memsw.exists() && write(&memsw, &limit).is_err() {
            return 0;
        }
        if write(&dir.join("memory.limit_in_bytes"), &limit).is_err() {
            return 0;
        }
        let tcp = dir.join("memory.kmem.tcp.limit_in_bytes");
        if tcp.exists() {
            let _ = write(&tcp, &limit);
        }
        held
    }

    /// A sandbox built ahead of a request (the warm pool) runs in the background: its CPU
    /// weight is the lowest (v1 `cpu.shares` 2, v2 `cpu.weight` 1), so building the next
    /// pooled sandbox (an interpreter importing its preload) takes only the CPU that
    /// requests leave idle, and its CPU quota is lifted: what runs then is the image's
    /// interpreter importing the operator's preload, none of a request's code, and held to
    /// the request's quota (0.5 CPU by default) a refill took twice the CPU time it
    /// needed in wall time, so a pool kept up with half the request rate. Handed to a
    /// request, it gets the default weight back (1024, 100) and the request's quota, before
    /// any of the request's code runs.
    ///
    /// The weight is best effort (only scheduling order depends on it), and so is lifting
    /// the quota (a refill that keeps it is only slower). Restoring the quota is not: an
    /// error means the sandbox must not run the request, and the next hand-over tries
    /// again. Handing over a cgroup that is a request's already writes nothing, so a
    /// session can make sure of it before every call.
    pub fn set_background(&self, background: bool) -> Result<(), CgroupError> {
        if !background && !self.background.load(Ordering::SeqCst) {
            return Ok(());
        }
        let (weight, quota) = if self.v2 {
            let Some((dir, _)) = &self.unified else {
                return Ok(());
            };
            (dir.join("cpu.weight"), dir.join("cpu.max"))
        } else {
            let Some(dir) = self.v1_dir(Controller::Cpu) else {
                return Ok(());
            };
            (dir.join("cpu.shares"), dir.join("cpu.cfs_quota_us"))
        };
        let weight_value = match (self.v2, background) {
            (true, true) => "1",
            (true, false) => "100",
            (false, true) => "2",
            (false, false) => "1024",
        };
        let _ = write(&weight, weight_value);
        // No quota to lift where the cpu limit was skipped (best effort), nor to restore.
        let limited = !self.skipped.iter().any(|s| s.feature == "cpu limit");
        if background {
            if limited && write(&quota, &cpu_quota_text(self.v2, None)).is_ok() {
                self.quota_lifted.store(true, Ordering::SeqCst);
            }
        } else if self.quota_lifted.load(Ordering::SeqCst) {
            let limit = cpu_quota_text(self.v2, Some(self.limits.cpu_quota_us));
            write(&quota, &limit)?;
            self.quota_lifted.store(false, Ordering::SeqCst);
        }
        self.background.store(background, Ordering::SeqCst);
        Ok(())
    }

    /// What the cgroup measured. Read before [`RunCgroup::remove`].
    pub fn usage(&self) -> Usage {
        let meters = self.meters();
        let memory_events = meters.memory_events.text();
        let event = |key| memory_events.as_deref().and_then(|e| keyed_in(e, key));
        let pids_events = meters.pids_events.text();
        Usage {
            peak_memory: meters.peak.number(),
            // "max" where no limit is set (v2): not a number, so None.
            memory_limit: meters.limit.number(),
            // v1 has no such counter (failcnt stays 0 when memsw fails first).
            memory_limit_hits: if self.v2 { event("max") } else { None }.unwrap_or(0),
            // The OOM signal on v1 is memory.oom_control's counter too.
            oom_kills: event("oom_kill").unwrap_or(0),
            // Where there is a unified directory, its cpu.stat (see `Meters::cpu`).
            cpu: if self.unified.is_some() {
                meters
                    .cpu
                    .text()
                    .and_then(|stat| keyed_in(&stat, "usage_usec"))
                    .map(Duration::from_micros)
            } else {
                meters.cpu.number().map(Duration::from_nanos)
            },
            pids_limit_hits: pids_events.and_then(|e| keyed_in(&e, "max")).unwrap_or(0),
        }
    }

    /// Removes the run's cgroups. The launcher calls it after reaping the init, when the
    /// kernel has already killed every process of the sandbox; a cgroup that still shows
    /// members (a zombie not yet released) is retried for a while.
    pub fn remove(mut self) -> Result<(), CgroupError> {
        self.removed = true;
        self.remove_dirs()
    }

    fn dirs(&self) -> Vec<PathBuf> {
        let unified = self.unified.as_ref().map(|(dir, _)| dir.clone());
        self.v1
            .iter()
            .map(|(_, dir)| dir.clone())
            .chain(unified)
            .collect()
    }

    /// Removes the run's directories, then the `codecage` parents if no other run uses
    /// them: nothing of codecage stays in the host's cgroup tree between runs.
    fn remove_dirs(&mut self) -> Result<(), CgroupError> {
        // Open files would keep the removed cgroups' memory until the RunCgroup is gone.
        self.meters.take();
        let mut first_error = None;
        for dir in self.dirs() {
            if let Err(e) = remove_dir_patiently(&dir, Duration::from_secs(2)) {
                first_error.get_or_insert(e);
            }
            // EBUSY while another run lives there: that run removes it.
            if let Some(parent) = dir.parent() {
                let _ = fs::remove_dir(parent);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        if !self.removed {
            self.kill();
            let _ = self.remove_dirs();
        }
    }
}

/// The run's directory in each distinct v1 hierarchy of `controllers` on `layout`, with the
/// controllers it serves (co-mounted ones share one); and the controllers `layout` lacks.
fn v1_plan(
    layout: &Layout,
    name: &str,
    controllers: &[Controller],
) -> (Vec<(Vec<Controller>, PathBuf)>, Vec<Controller>) {
    let mut dirs: Vec<(Vec<Controller>, PathBuf)> = Vec::new();
    let mut missing = Vec::new();
    for &controller in controllers {
        let Some(mount) = layout.v1(controller) else {
            missing.push(controller);
            continue;
        };
        match dirs.iter_mut().find(|(_, dir)| dir.starts_with(mount)) {
            Some((served, _)) => served.push(controller),
            None => dirs.push((vec![controller], mount.join(PARENT).join(name))),
        }
    }
    (dirs, missing)
}

/// Creates `<parent>/<run>`, and the `codecage` parent when missing. A concurrent run may
/// remove the parent between the two mkdirs (it does when it was the last one): retry.
fn create_run_dir(dir: &Path) -> Result<(), CgroupError> {
    let parent = dir.parent().unwrap_or(dir);
    for _ in 0..8 {
        mkdir_if_missing(parent)?;
        match mkdir_755(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            other => return other.map_err(|e| err("creating", dir, e)),
        }
    }
    mkdir_755(dir).map_err(|e| err("creating", dir, e))
}

/// mkdir with mode 0755 whatever the launcher's umask: the child, already an unprivileged
/// uid, walks down to its `tasks` files.
fn mkdir_755(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
}

/// rmdir, retrying on EBUSY: after a kill, tasks leave the cgroup only once they are reaped.
fn remove_dir_patiently(dir: &Path, patience: Duration) -> Result<(), CgroupError> {
    let end = Instant::now() + patience;
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < end => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(err("removing", dir, e)),
        }
    }
}

fn mkdir_if_missing(dir: &Path) -> Result<(), CgroupError> {
    match mkdir_755(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(err("creating", dir, e)),
        _ => Ok(()),
    }
}

fn missing_controller(layout: &Layout, controller: Controller) -> CgroupError {
    CgroupError {
        op: "finding the v1 hierarchy of",
        path: PathBuf::from(controller.name()),
        source: io::Error::from(io::ErrorKind::NotFound),
        hint: format!(
            "; this host's cgroups are {layout}, without the {} controller, so its limit cannot be enforced \
             (mount it, e.g. `mount -t cgroup -o {0} cgroup /sys/fs/cgroup/{0}`)",
            controller.name()
        ),
    }
}

/// The v2 parent `<root>/codecage`, with the memory, cpu and pids controllers enabled for
/// its children. `root` is the hierarchy's root, exempt from the no-internal-process rule,
/// or the delegated cgroup a server moved itself out of (see [`delegation`]); `codecage`
/// itself never holds a process, so enabling controllers in it cannot meet EBUSY.
fn v2_parent(root: &Path, run: &mut RunCgroup) -> Result<PathBuf, CgroupError> {
    let available = read(&root.join("cgroup.controllers")).unwrap_or_default();
    let (wanted, missing): (Vec<&str>, Vec<&str>) = ["memory", "cpu", "pids"]
        .into_iter()
        .partition(|c| available.split_whitespace().any(|a| a == *c));
    // A best-effort run goes on with what there is; write_v2_limits lists the rest.
    if !missing.is_empty() && !run.best_effort {
        return Err(CgroupError {
            op: "checking controllers in",
            path: root.join("cgroup.controllers"),
            source: io::Error::from(io::ErrorKind::Unsupported),
            hint: format!(
                "; the {} controller(s) are not available in this cgroup (they may be bound to a v1 \
                 hierarchy, or not delegated to this cgroup namespace); give codecage a cgroup with them \
                 delegated, e.g. a systemd unit with Delegate=memory cpu pids",
                missing.join(", ")
            ),
        });
    }
    enable_controllers(root, &wanted)?;
    let parent = root.join(PARENT);
    for _ in 0..8 {
        mkdir_if_missing(&parent)?;
        match enable_controllers(&parent, &wanted) {
            // Removed by a concurrent run that was the last one: recreate it.
            Err(e) if e.source.kind() == io::ErrorKind::NotFound => continue,
            other => return other.map(|()| parent),
        }
    }
    Err(err(
        "creating",
        &parent,
        io::Error::from(io::ErrorKind::NotFound),
    ))
}

/// `pids.max` for a run: the payload's processes and threads, plus the sandbox's init.
fn pids_max(limits: &Limits) -> String {
    (limits.pids + 1).to_string()
}

fn unavailable_v2(dir: &Path, controller: &str) -> CgroupError {
    CgroupError {
        op: "enabling the controller for",
        path: dir.to_path_buf(),
        source: io::Error::from(io::ErrorKind::Unsupported),
        hint: format!("; the {controller} controller is not available in this cgroup"),
    }
}

/// Enables controllers for the children of `dir`, checking each write (cgroups-rs does
/// not, so the EBUSY of the no-internal-process rule goes unseen there).
fn enable_controllers(dir: &Path, controllers: &[&str]) -> Result<(), CgroupError> {
    let file = dir.join("cgroup.subtree_control");
    let enabled = read(&file).unwrap_or_default();
    let todo: Vec<String> = controllers
        .iter()
        .filter(|c| !enabled.split_whitespace().any(|e| e == **c))
        .map(|c| format!("+{c}"))
        .collect();
    if todo.is_empty() {
        return Ok(());
    }
    fs::write(&file, todo.join(" ")).map_err(|e| {
        let mut error = err("writing", &file, e);
        if error.source.raw_os_error() == Some(libc::EBUSY) {
            error.hint = format!(
                "; cgroup v2 enables controllers only in a cgroup without processes of its own, and {} holds \
                 some. Run codecage where it may create cgroups: as root on the host's cgroup root, or in a \
                 systemd unit with Delegate=yes whose own processes sit in a child cgroup",
                dir.display()
            );
        }
        error
    })
}

fn read_u64(path: &Path) -> Option<u64> {
    read(path)?.trim().parse().ok()
}

/// Removes the cgroups of launchers that died without cleaning up: a run cgroup whose
/// launcher (pid plus start time) is gone. Its processes died with the launcher
/// (PR_SET_PDEATHSIG); any left are killed first. Runs once per process.
pub(crate) fn sweep_leftovers_once(layout: &Layout) {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(|| sweep_leftovers(layout));
}

/// See [`sweep_leftovers_once`].
pub fn sweep_leftovers(layout: &Layout) {
    let parents = delegation::parents(layout);
    let mut leftovers: std::collections::BTreeMap<String, Vec<PathBuf>> = Default::default();
    // A launcher's liveness is read once (from /proc), however many runs and hierarchies
    // name it: a host with hundreds of sandboxes would otherwise cost a starting launcher
    // thousands of reads.
    let mut judged: std::collections::HashMap<(u64, u64), bool> = Default::default();
    for parent in parents {
        let Ok(entries) = fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let Some((pid, start)) = run_launcher(&name) else {
                continue;
            };
            // This launcher's own runs are never leftovers, whatever /proc says of it (the
            // sweep may run beside its starts, and a start time it could not read is 0).
            let own = launcher_identity();
            if (pid, start) == (u64::from(own.pid), own.start) {
                continue;
            }
            let dead = *judged
                .entry((pid, start))
                .or_insert_with(|| process_start_time(pid as u32) != Some(start));
            if dead {
                leftovers.entry(name).or_default().push(entry.path());
            }
        }
    }
    for dirs in leftovers.values() {
        // Only processes of that run's own cgroup are killed.
        for dir in dirs {
            kill_members(dir);
        }
        for dir in dirs {
            let _ = remove_dir_patiently(dir, Duration::from_millis(500));
        }
    }
}

/// SIGKILLs every process of one run's cgroup: with `cgroup.kill` where the kernel has it
/// (Linux 5.14, v2), else each member `cgroup.procs` lists, by pid. A member forked between
/// the read and the kills escapes the latter, but not its pid namespace: its init's death
/// kills it, and the directory's removal waits for it.
fn kill_members(dir: &Path) {
    if fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    for pid in read(&dir.join("cgroup.procs")).unwrap_or_default().lines() {
        if let Ok(pid) = pid.trim().parse::<i32>() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// The launcher (pid, start time) a `run-<pid ns>-<pid>-<start>-<n>` directory is named
/// after, when it is of this pid namespace. A launcher in another pid namespace cannot be
/// judged from here: its pid means nothing in ours, and killing a live sandbox is worse
/// than keeping a stale directory.
fn run_launcher(name: &str) -> Option<(u64, u64)> {
    let fields: Vec<u64> = name
        .strip_prefix("run-")?
        .split('-')
        .map_while(|f| f.parse().ok())
        .collect();
    let [pid_ns, pid, start, _] = fields[..] else {
        return None;
    };
    (pid_ns == launcher_identity().pid_ns).then_some((pid, start))
}

/// A run directory whose launcher no longer exists.
#[cfg(test)]
fn is_leftover(name: &str) -> bool {
    run_launcher(name).is_some_and(|(pid, start)| process_start_time(pid as u32) != Some(start))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept file is read whole from its start each time, past one chunk too, and
    /// "key value" lines give their values.
    #[test]
    fn kept_files_read_whole_and_keyed() {
        let dir = std::env::temp_dir().join(format!("codecage-unit-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("memory.events");
        fs::write(
            &path,
            "low 0\nhigh 0\nmax 70\noom 1\noom_kill 1\noom_group_kill 0\n",
        )
        .unwrap();
        let file = fs::File::open(&path).unwrap();
        let text = read_from_start(&file).unwrap();
        assert_eq!(keyed_in(&text, "oom_kill"), Some(1));
        assert_eq!(keyed_in(&text, "max"), Some(70));
        assert_eq!(keyed_in(&text, "nope"), None);
        let long: String = (0..100).map(|i| format!("key{i} {i}\n")).collect();
        fs::write(&path, &long).unwrap();
        let again = read_from_start(&file).unwrap();
        assert_eq!(again, long);
        assert_eq!(keyed_in(&again, "key99"), Some(99));
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A usage file that is not there is given up on; one that failed to open otherwise
    /// (here ENOTDIR; in a server, EMFILE) is opened at the next reading.
    #[test]
    fn a_meter_tries_again_unless_the_file_is_not_there() {
        let dir = std::env::temp_dir().join(format!("codecage-meter-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let meter = |name: &str| Meter {
            path: Some(dir.join(name)),
            writable: false,
            file: OnceLock::new(),
        };
        let absent = meter("absent");
        assert!(absent.number().is_none());
        fs::write(dir.join("absent"), "1\n").unwrap();
        assert!(
            absent.number().is_none(),
            "a file not there at first is not looked for again"
        );
        fs::write(dir.join("parent"), "").unwrap();
        let later = meter("parent/value");
        assert!(later.number().is_none());
        fs::remove_file(dir.join("parent")).unwrap();
        fs::create_dir(dir.join("parent")).unwrap();
        fs::write(dir.join("parent/value"), "42\n").unwrap();
        assert_eq!(later.number(), Some(42));
        fs::write(dir.join("parent/value"), "43\n").unwrap();
        assert_eq!(later.number(), Some(43), "read again from the kept file");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Without memory.peak (v2 before 5.19) the peak is the limit once a charge met it,
    /// else the largest RSS within the limit; where the kernel keeps a peak, it is that.
    #[test]
    fn the_peak_without_memory_peak_stays_within_the_limit() {
        let limit = 64 << 20;
        let old_v2 = Usage {
            memory_limit: Some(limit),
            ..Usage::default()
        };
        let rss = Some(71 << 20);
        assert_eq!(old_v2.peak_memory_or_estimate(None, rss), Some(limit));
        assert_eq!(
            old_v2.peak_memory_or_estimate(None, Some(40 << 20)),
            Some(40 << 20)
        );
        assert_eq!(old_v2.peak_memory_or_estimate(None, None), None);
        let hit = Usage {
            memory_limit_hits: 3,
            ..old_v2
        };
        assert_eq!(hit.peak_memory_or_estimate(None, None), Some(limit));
        // A session's call that met no limit since the last one: no figure.
        assert_eq!(hit.peak_memory_or_estimate(Some(&hit), None), None);
        let unlimited = Usage::default();
        assert_eq!(unlimited.peak_memory_or_estimate(None, rss), rss);
        let kept = Usage {
            peak_memory: Some(50 << 20),
            ..hit
        };
        assert_eq!(kept.peak_memory_or_estimate(None, rss), Some(50 << 20));
    }

    #[test]
    fn our_own_runs_are_not_leftovers_but_dead_launchers_are() {
        let Launcher { pid, start, .. } = launcher_identity();
        let ns = crate::sys::pid_namespace();
        assert!(!is_leftover(&format!("run-{ns}-{pid}-{start}-0")));
        assert!(is_leftover(&format!("run-{ns}-{pid}-{}-0", start + 1)));
        assert!(is_leftover(&format!("run-{ns}-4194304-1-0")));
        assert!(
            !is_leftover(&format!("run-{}-4194304-1-0", ns + 1)),
            "another pid namespace's"
        );
        assert!(!is_leftover("something-else"));
        assert!(run_name().starts_with(&format!("run-{ns}-{pid}-{start}-")));
    }

    #[test]
    fn cpu_quota_is_per_100ms() {
        assert_eq!(crate::spec::quota_for_millicpus(500), 50_000);
        assert_eq!(Limits::default().cpu_quota_us, 50_000);
        assert_eq!(Limits::default().memory, 256 << 20);
    }

    /// Root tests in the unit suite fail loudly without root, as the integration tests do,
    /// unless a developer sets CODECAGE_ALLOW_SKIP=1.
    fn require_root() -> bool {
        if nix::unistd::geteuid().is_root() {
            return true;
        }
        if std::env::var_os("CODECAGE_ALLOW_SKIP").is_some_and(|v| v == "1") {
            eprintln!("SKIPPED: needs root (CODECAGE_ALLOW_SKIP=1)");
            return false;
        }
        panic!("this test needs root: it creates cgroups (set CODECAGE_ALLOW_SKIP=1 to skip)");
    }

    /// The pure v1 backend (this host's v1 controllers without its unified tree): the run's
    /// directories appear with the limits written, and disappear on removal.
    #[test]
    fn the_v1_backend_creates_limits_and_removes_them() {
        if !require_root() {
            return;
        }
        let controllers = match layout() {
            Layout::V1 { controllers } | Layout::Hybrid { controllers, .. } => controllers.clone(),
            other => {
                eprintln!("this host has no v1 controllers ({other}); the v1 backend is tested where they exist");
                return;
            }
        };
        let v1 = Layout::V1 { controllers };
        let limits = Limits {
            memory: 48 << 20,
            cpu_quota_us: 25_000,
            pids: 7,
        };
        // Begun, nothing of v1 exists yet, but the child is told its tasks files; finished,
        // they are the ones made.
        let mut run = RunCgroup::begin(&v1, &limits, false).unwrap();
        assert!(
            run.clone_target().is_none(),
            "pure v1 has no unified directory to clone into"
        );
        let planned = run.planned_v1_tasks_files(&v1);
        assert!(run.v1_tasks_files().is_empty());
        assert!(planned.iter().all(|t| !t.exists()), "{planned:?}");
        run.finish(&v1).unwrap();
        let tasks = run.v1_tasks_files();
        assert_eq!(tasks, planned);
        assert!(tasks.iter().all(|t| t.exists()), "{tasks:?}");
        assert_eq!(tasks.len(), 4, "{tasks:?}");
        // Each limit in the directory of the hierarchy that has its file.
        let read = |file: &str| {
            let dir = tasks
                .iter()
                .map(|t| t.parent().unwrap())
                .find(|d| d.join(file).exists())
                .unwrap();
            std::fs::read_to_string(dir.join(file))
                .unwrap()
                .trim()
                .to_string()
        };
        assert_eq!(read("memory.limit_in_bytes"), (48u64 << 20).to_string());
        assert_eq!(read("cpu.cfs_quota_us"), "25000");
        assert_eq!(read("pids.max"), "8", "the payload's 7 and the init");
        run.remove().unwrap();
        for t in &tasks {
            assert!(
                !t.parent().unwrap().exists(),
                "{} was not removed",
                t.display()
            );
        }
    }

    /// Built ahead of a request, a sandbox has the lowest weight and no CPU quota; handed
    /// over, the default weight and the request's quota, on this host's layout.
    #[test]
    fn the_background_lifts_the_cpu_quota_and_the_handover_restores_it() {
        if !require_root() {
            return;
        }
        let limits = Limits {
            memory: 48 << 20,
            cpu_quota_us: 25_000,
            pids: 7,
        };
        let run = RunCgroup::create(layout(), &limits, false).unwrap();
        let (weight, quota) = if run.v2 {
            let dir = &run.unified.as_ref().unwrap().0;
            (dir.join("cpu.weight"), dir.join("cpu.max"))
        } else {
            let dir = run.v1_dir(Controller::Cpu).unwrap();
            (dir.join("cpu.shares"), dir.join("cpu.cfs_quota_us"))
        };
        let read = |file: &Path| std::fs::read_to_string(file).unwrap().trim().to_string();
        let limited = if run.v2 { "25000 100000" } else { "25000" };
        assert_eq!(read(&quota), limited);
        run.set_background(true).unwrap();
        assert!(matches!(read(&weight).as_str(), "1" | "2"));
        assert!(
            matches!(read(&quota).as_str(), "-1" | "max 100000"),
            "{}",
            read(&quota)
        );
        run.set_background(false).unwrap();
        assert!(matches!(read(&weight).as_str(), "100" | "1024"));
        assert_eq!(read(&quota), limited);
        // Not lifted, nothing to restore: a second handover writes nothing.
        run.set_background(false).unwrap();
        assert_eq!(read(&quota), limited);
        run.remove().unwrap();
    }

    /// A limit the kernel refuses (pids.max above PID_MAX_LIMIT) skips that controller
    /// alone in best-effort mode, and fails the run in required mode.
    #[test]
    fn best_effort_skips_only_the_controller_the_kernel_refused() {
        if !require_root() {
            return;
        }
        let limits = Limits {
            memory: 48 << 20,
            cpu_quota_us: 25_000,
            pids: 5_000_000,
        };
        assert!(RunCgroup::create(layout(), &limits, false).is_err());
        let run = RunCgroup::create(layout(), &limits, true).unwrap();
        assert_eq!(run.skipped().len(), 1, "{:?}", run.skipped());
        assert_eq!(
            run.skipped()[0].feature,
            "pids limit",
            "{:?}",
            run.skipped()
        );
        let memory = match layout() {
            Layout::V2 { .. } => run.unified.as_ref().unwrap().0.join("memory.max"),
            _ => run
                .v1_dir(Controller::Memory)
                .unwrap()
                .join("memory.limit_in_bytes"),
        };
        assert_eq!(
            fs::read_to_string(memory).unwrap().trim(),
            (48u64 << 20).to_string()
        );
        run.remove().unwrap();
    }
}
