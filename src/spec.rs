//! What the launcher runs, fully resolved: a [`SandboxSpec`] describes the box (root,
//! sizes, limits, layers, ids), an [`Exec`] one execution in it (program, environment,
//! files, stdin, timeout, output cap), and a [`Spec`] is both, for a one-shot run. The
//! launcher reads nothing else (no config files, no environment), which keeps the
//! privileged part small and testable. Front ends build them by resolving a request under
//! a profile (`profile::resolve`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::files::{InputFile, OutputRules};
use crate::knobs::Knob;
use crate::network::NetworkSpec;

/// The CFS period codecage uses, in microseconds.
pub const CPU_PERIOD_US: u64 = 100_000;

/// Memory, CPU and process limits, enforced through a cgroup of the run's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Memory (RAM plus swap: no swap beyond it), in bytes.
    pub memory: u64,
    /// CPU time per 100 ms period, in microseconds (0.5 CPU = 50 000).
    pub cpu_quota_us: u64,
    /// Processes and threads.
    pub pids: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory: Knob::Memory.def().default,
            cpu_quota_us: quota_for_millicpus(Knob::Cpus.def().default),
            pids: Knob::Pids.def().default,
        }
    }
}

/// The CFS quota per [`CPU_PERIOD_US`] for thousandths of a CPU.
pub fn quota_for_millicpus(millicpus: u64) -> u64 {
    millicpus * CPU_PERIOD_US / 1000
}

/// uid and gid of the unprivileged user the payload runs as, inside the sandbox.
pub const SANDBOX_UID: u32 = 1000;
/// Name of that user in the synthesized /etc/passwd.
pub const SANDBOX_USER: &str = "sandbox";

/// The filesystem the sandbox sees as `/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rootfs {
    /// Read-only binds of the host's /usr, /bin, /sbin and /lib*, plus a synthesized /etc.
    Host,
    /// A prepared image directory (`cargo xtask rootfs`), mounted read-only as `/`. It must
    /// hold the mount points `dev`, `proc`, `tmp` and `work`.
    Dir(PathBuf),
}

/// Whether a hardening layer must be applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayerMode {
    /// Applied in full, or the run is refused (exit 125, naming what is missing).
    #[default]
    Required,
    /// Applied as far as the kernel allows; the Outcome lists what was skipped.
    BestEffort,
    /// Not applied (for measuring what the layer costs).
    Off,
}

/// How much of landlock a sandbox must have. Landlock grew by ABI versions; what the
/// newer ones add is covered by other layers (see `sandbox::landlock::FEATURES`), except
/// the filesystem rules of ABI 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LandlockMode {
    /// Every feature codecage asks for (ABI 6, Linux 6.12), or the run is refused.
    Strict,
    /// Landlock's filesystem rules (ABI 1, Linux 5.13) at least, or the run is refused;
    /// what the kernel's ABI lacks is listed in `skipped_layers` with what covers it.
    #[default]
    Required,
    /// What the kernel has, even nothing; the rest is listed.
    BestEffort,
    /// Not applied (for measuring what the layer costs).
    Off,
}

/// uid and gid of `nobody` and `nogroup` inside the sandbox, mapped so that programs
/// which try to switch to them (test suites, daemons dropping privileges) meet EPERM, the
/// answer an unprivileged process expects, rather than EINVAL for an id that does not
/// exist in the namespace.
pub const NOBODY_UID: u32 = 65534;

/// How a host directory appears in the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VolumeMode {
    /// Bound read-only (and nosuid, nodev) at the target: the payload reads the host's
    /// files as they are, and every write fails with EROFS.
    ReadOnly,
    /// Copied into the target on /work's tmpfs by the init before the payload starts, owned
    /// by the sandbox user: the payload may change the copy; the host's files never see it.
    /// The copy counts against /work's size (`work_size`) and the memory limit.
    Copy,
}

/// A host directory the sandbox sees under /work (`--volume HOST_DIR:/work/src[:ro|:copy]`).
/// Never read-write onto the host.
///
/// The sandbox's ids are not the host's: inside, the host's files belong to nobody, and
/// the payload (and the init, which copies) may read what the host lets any user read
/// (the "other" permission bits), no more. Symlinks in the directory are never followed on
/// the host's side: bound, they resolve inside the sandbox; copied, they are copied as
/// links.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    /// The host directory, an absolute path. The launcher (root) opens it; a front end that
    /// acts for someone else opens it with their credentials first ([`Volume::pin`]).
    pub source: PathBuf,
    /// Where it appears: `/work` itself (a copy only) or a path under it.
    pub target: PathBuf,
    pub mode: VolumeMode,
    /// The directory as a front end opened it ([`Volume::pin`]): the launcher opens this fd
    /// of its own process instead of `source`. Not sent anywhere.
    #[serde(skip)]
    pub pinned: Option<std::os::fd::RawFd>,
}

/// The most volumes a sandbox may have.
pub const MAX_VOLUMES: usize = 16;

impl Volume {
    /// Parses `HOST_DIR:TARGET[:ro|:copy]` (read-only when no mode is given). A relative
    /// HOST_DIR is taken from the current directory.
    pub fn parse(text: &str) -> Result<Volume, String> {
        let usage = "give HOST_DIR:/work/DIR, HOST_DIR:/work/DIR:ro or HOST_DIR:/work/DIR:copy";
        let parts: Vec<&str> = text.split(':').collect();
        let (source, target, mode) = match parts.as_slice() {
            [source, target] => (*source, *target, VolumeMode::ReadOnly),
            [source, target, "ro"] => (*source, *target, VolumeMode::ReadOnly),
            [source, target, "copy"] => (*source, *target, VolumeMode::Copy),
            [_, _, mode] => {
                return Err(format!(
                    "volume {text}: unknown mode {mode:?}; {usage} (volumes are never writable onto the host)"
                ))
            }
            _ => return Err(format!("volume {text}: {usage}")),
        };
        if source.is_empty() {
            return Err(format!(
                "volume {text}: the host directory is empty; {usage}"
            ));
        }
        let source = std::path::absolute(source).map_err(|e| format!("volume {text}: {e}"))?;
        let volume = Volume {
            source,
            target: PathBuf::from(target),
            mode,
            pinned: None,
        };
        volume
            .validate()
            .map_err(|e| format!("volume {text}: {e}"))?;
        Ok(volume)
    }

    /// The target must be /work or under it, written plainly (no `.`, `..`, `//`, trailing
    /// `/`); a read-only volume cannot be /work itself, which must stay writable.
    pub fn validate(&self) -> Result<(), String> {
        if !self.source.is_absolute() {
            return Err(format!(
                "the host directory {} is not an absolute path",
                self.source.display()
            ));
        }
        let target = self.target.to_str().unwrap_or_default();
        let plain = target == "/work"
            || target.strip_prefix("/work/").is_some_and(|rest| {
                rest.split('/')
                    .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'))
            });
        if !plain {
            return Err(format!(
                "the target {} must be /work or a path under it (like /work/src), without . or ..",
                self.target.display()
            ));
        }
        if target == "/work" && self.mode == VolumeMode::ReadOnly {
            return Err(
                "a read-only volume cannot be /work itself (the working directory stays writable): \
                 use a path under it (/work/src), or :copy"
                    .into(),
            );
        }
        Ok(())
    }

    /// The first component under /work (`src` for /work/src/x), or None for /work.
    pub fn top(&self) -> Option<&str> {
        self.target
            .to_str()?
            .strip_prefix("/work/")
            .and_then(|rest| rest.split('/').next())
    }

    /// Opens the host directory for a front end, race-free: with `caller`'s credentials
    /// when it acts for someone (so a directory they cannot open is refused as it would be
    /// to them), and, when `roots` are given (a server's configuration), only if the
    /// directory opened lies under one of them. The launcher then opens the directory
    /// opened here ([`Volume::pinned`]), so nothing can swap the path in between; the
    /// returned fd must stay open until the sandbox has started.
    pub fn pin(
        &mut self,
        caller: Option<&crate::caller::Caller>,
        roots: Option<&[PathBuf]>,
    ) -> Result<std::os::fd::OwnedFd, String> {
        let fd = match caller {
            Some(caller) => caller.open_dir(&self.source),
            None => crate::caller::open_dir(&self.source),
        }
        .map_err(|e| format!("volume {}: {e}", self.source.display()))?;
        let link = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
        let real = std::fs::read_link(&link)
            .map_err(|e| format!("volume {}: {e}", self.source.display()))?;
        if let Some(roots) = roots {
            if !Volume::lies_under(&real, roots) {
                return Err(self.outside(roots));
            }
        }
        self.pinned = Some(std::os::fd::AsRawFd::as_raw_fd(&fd));
        Ok(fd)
    }

    /// Whether `real` (a directory's resolved path) lies under one of `roots`.
    fn lies_under(real: &Path, roots: &[PathBuf]) -> bool {
        roots
            .iter()
            .any(|root| std::fs::canonicalize(root).is_ok_and(|root| real.starts_with(root)))
    }

    /// The refusal of a directory outside a server's roots (see [`Volume::is_outside`]).
    fn outside(&self, roots: &[PathBuf]) -> String {
        format!(
            "volume {}: only directories under {} may be volumes here",
            self.source.display(),
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// Whether [`Volume::pin`]'s error is the refusal of a directory outside the roots (a
    /// policy), not a directory that cannot be opened (a bad request).
    pub fn is_outside(message: &str) -> bool {
        message.contains(": only directories under ")
    }
}

/// How sandbox ids map to host ids. Each live sandbox holds a slot (see `ids.rs`: a lock on
/// one byte of a file under /run/codecage, so that every codecage process on the host
/// agrees), and gets [`IdMapping::IDS_PER_SLOT`] host ids of its own: `base + 3*slot` for
/// uid/gid 0, `base + 3*slot + 1` for the sandbox user and `base + 3*slot + 2` for nobody.
/// The ids are known before clone3, so the sandbox root's uid also owns the user
/// namespace: the kernel charges the sandbox's inotify instances and other per-user counts
/// to that uid, not to host root.
///
/// Nothing in the sandbox runs as nobody (the payload cannot switch to it: it has no
/// capability), but its host id is the sandbox's own like the others, so two live
/// sandboxes still never share a host uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMapping {
    /// First host id of the range codecage may use. The default, 0x7200_0000, lies above
    /// the ranges systemd assigns to users, dynamic users and containers
    /// (systemd's UIDS-GIDS.md) and leaves room for `3 * SLOTS` ids. (Codecage before
    /// the third id used 0x7100_0000 with two ids per slot; the ranges do not meet, so
    /// sandboxes of both versions may live side by side during an upgrade.)
    pub host_base: u32,
}

impl Default for IdMapping {
    fn default() -> Self {
        IdMapping {
            host_base: 0x7200_0000,
        }
    }
}

impl IdMapping {
    /// The lowest `host_base` allowed: below it lie real users and system ids.
    pub const MIN_BASE: u32 = 0x0010_0000;
    /// How many sandboxes may live at once on a host.
    pub const SLOTS: u32 = 1 << 22;
    /// Host ids per sandbox: root, the sandbox user, nobody.
    pub const IDS_PER_SLOT: u32 = 3;

    /// Host uid (and gid) that sandbox root maps to for `slot` (below [`Self::SLOTS`]).
    pub fn host_root(&self, slot: u32) -> u32 {
        self.host_base + Self::IDS_PER_SLOT * slot
    }

    /// The `uid_map`/`gid_map` content for `slot`: 0, the sandbox user and nobody, each
    /// to a host id of the slot's own.
    pub fn map_lines(&self, slot: u32) -> String {
        let root = self.host_root(slot);
        format!(
            "0 {root} 1\n{SANDBOX_UID} {} 1\n{NOBODY_UID} {} 1\n",
            root + 1,
            root + 2
        )
    }

    /// The range must hold `IDS_PER_SLOT * SLOTS` ids and stay clear of real users and of
    /// the overflow id 2^32-1.
    pub fn validate(&self) -> Result<(), String> {
        let span = u64::from(Self::IDS_PER_SLOT) * u64::from(Self::SLOTS);
        let top = u64::from(self.host_base) + span + 2;
        if self.host_base < Self::MIN_BASE || top >= u64::from(u32::MAX) {
            return Err(format!(
                "host id base {:#x} is out of range: use {:#x} to {:#x}, clear of real users",
                self.host_base,
                Self::MIN_BASE,
                u64::from(u32::MAX) - span - 3
            ));
        }
        Ok(())
    }
}

/// What describes the box: its root, its tmpfs sizes, its limits and layers, its ids. A
/// [`crate::launcher::Sandbox`] is started from it once and runs many [`Exec`]s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// What `/` is.
    pub rootfs: Rootfs,
    /// Size of the tmpfs on `/tmp` (and of `/dev/shm`), in bytes.
    pub tmp_size: u64,
    /// Size of the tmpfs on `/work`, the payload's working directory, in bytes.
    pub work_size: u64,
    /// Memory, CPU and process limits, enforced through a cgroup of the sandbox's own.
    pub limits: Option<Limits>,
    /// Whether the cgroup must exist: `Off` runs without one (for measuring what the layer
    /// costs), `BestEffort` without what the host cannot make.
    pub cgroup: LayerMode,
    /// Landlock filesystem, TCP and scope rules.
    pub landlock: LandlockMode,
    /// The seccomp filter of profiles/seccomp/<arch>.json.
    pub seccomp: LayerMode,
    /// RLIMIT_NOFILE: open files per process.
    pub nofile: u64,
    /// Host name inside the sandbox.
    pub hostname: String,
    /// Host id allocation.
    pub ids: IdMapping,
    /// The REPL drivers (drivers/ in the repository, built into the binary) are mounted
    /// read-only at [`DRIVERS_DIR`]: sessions need them, one-shot runs do not.
    pub drivers: bool,
    /// Host directories the sandbox sees under /work, read-only or copied.
    #[serde(default)]
    pub volumes: Vec<Volume>,
    /// The network: `none` (loopback only) by default, or a link to the front end's
    /// gateway (see [`crate::network`]).
    pub network: NetworkSpec,
    /// With an exec allowlist, the only files the payload may execute (and map
    /// executable); `None` (security `full` or `deny`) adds nothing to the sandbox.
    #[serde(default)]
    pub exec: Option<crate::exec_policy::ExecAllowlist>,
    /// The binary to run as the sandbox's pid 1: a program whose `main` calls
    /// [`crate::dispatch_init`] first, from the same build as the launcher. The default is
    /// the running program itself (`/proc/self/exe`), or what the front end named with
    /// [`set_default_init_exe`] (`codecage` names `codecage-init`).
    pub init_exe: PathBuf,
}

/// The init binary of the Specs made from now on (see [`set_default_init_exe`]).
static DEFAULT_INIT_EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Names the binary that every [`Spec`] made from now on runs as the sandbox's pid 1,
/// instead of `/proc/self/exe`: for a front end that ships a small init of its own (the
/// `codecage` command uses `codecage-init` beside it: the second exec of every run then
/// loads a small program instead of the whole front end). Only the first call counts.
pub fn set_default_init_exe(path: PathBuf) {
    let _ = DEFAULT_INIT_EXE.set(path);
}

fn default_init_exe() -> PathBuf {
    DEFAULT_INIT_EXE
        .get()
        .cloned()
        .unwrap_or_else(|| PathBuf::from("/proc/self/exe"))
}

/// Where the REPL drivers are, inside a sandbox that has them: on a small read-only tmpfs
/// on /run, which every root has (an empty directory in images, as the FHS wants it).
pub const DRIVERS_DIR: &str = "/run/codecage/drivers";

/// What describes one execution in a sandbox: the program, its environment, the files it
/// finds in /work, its stdin, and how long and how loud it may be.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exec {
    /// The program and its arguments; `argv[0]` is searched in the sandbox's `PATH` unless it
    /// contains a `/`.
    pub argv: Vec<String>,
    /// The payload's whole environment (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// Files written into /work before the payload starts (a runner's code file, inputs).
    pub files: Vec<InputFile>,
    /// Output files to take back when the payload has ended (one-shot runs).
    pub outputs: Option<OutputRules>,
    /// What the payload reads on stdin; none is /dev/null.
    pub stdin: Option<Vec<u8>>,
    /// Wall-clock limit from start to the end of the last process.
    pub timeout: Duration,
    /// Cap on stdout plus stderr, in bytes. Past it the execution is stopped.
    pub output_limit: u64,
    /// Under an exec allowlist: what this payload may execute beyond the sandbox's
    /// allowlist (a command a person approved, `[exec] ask`). Its files are bound exec in
    /// the sandbox before the payload starts, and its landlock ruleset grants them EXECUTE;
    /// other payloads keep the sandbox's own ruleset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_extra: Option<crate::exec_policy::ExecAllowlist>,
}

/// One run: a sandbox and the one execution it holds ([`crate::run`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    pub sandbox: SandboxSpec,
    pub exec: Exec,
}

/// The PATH the payload starts with.
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Default for SandboxSpec {
    /// Every knob at its default, the host rootfs, every layer required.
    fn default() -> SandboxSpec {
        let mut spec = SandboxSpec {
            rootfs: Rootfs::Host,
            tmp_size: 0,
            work_size: 0,
            limits: Some(Limits::default()),
            cgroup: LayerMode::Required,
            landlock: LandlockMode::Required,
            seccomp: LayerMode::Required,
            nofile: 0,
            hostname: "sandbox".into(),
            ids: IdMapping::default(),
            drivers: false,
            volumes: Vec::new(),
            exec: None,
            network: NetworkSpec {
                allowed_ports: crate::network::DEFAULT_PORTS.to_vec(),
                ..NetworkSpec::default()
            },
            init_exe: default_init_exe(),
        };
        for knob in Knob::all() {
            spec.set(knob, knob.def().default);
        }
        spec
    }
}

impl SandboxSpec {
    /// Sets a knob that belongs to the box, in its base unit (see [`Knob`]); others are
    /// ignored here.
    pub fn set(&mut self, knob: Knob, value: u64) {
        fn limits(spec: &mut SandboxSpec) -> &mut Limits {
            spec.limits.get_or_insert_with(Limits::default)
        }
        match knob {
            Knob::Memory => limits(self).memory = value,
            Knob::Cpus => limits(self).cpu_quota_us = quota_for_millicpus(value),
            Knob::Pids => limits(self).pids = value,
            Knob::Nofile => self.nofile = value,
            Knob::TmpSize => self.tmp_size = value,
            Knob::WorkSize => self.work_size = value,
            Knob::MaxBandwidth => self.network.max_bandwidth = value,
            Knob::MaxConnections => self.network.max_connections = value,
            Knob::ConnectionIdleTimeout => self.network.connection_idle_timeout_ms = value,
            _ => {}
        }
    }

    /// A box knob's value (limits only with a cgroup).
    pub fn get(&self, knob: Knob) -> Option<u64> {
        let limits = self.limits.as_ref();
        match knob {
            Knob::Memory => limits.map(|l| l.memory),
            Knob::Cpus => limits.map(|l| l.cpu_quota_us * 1000 / CPU_PERIOD_US),
            Knob::Pids => limits.map(|l| l.pids),
            Knob::Nofile => Some(self.nofile),
            Knob::TmpSize => Some(self.tmp_size),
            Knob::WorkSize => Some(self.work_size),
            Knob::MaxBandwidth => Some(self.network.max_bandwidth),
            Knob::MaxConnections => Some(self.network.max_connections),
            Knob::ConnectionIdleTimeout => Some(self.network.connection_idle_timeout_ms),
            _ => None,
        }
    }

    /// Checks what the kernel would otherwise reject halfway through setup, with a message
    /// that names the field and what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        if let Rootfs::Dir(dir) = &self.rootfs {
            if !dir.is_absolute() {
                return Err(format!("rootfs {} is not an absolute path", dir.display()));
            }
            if !dir.is_dir() {
                return Err(format!(
                    "rootfs {} is not a directory: build one with `cargo xtask rootfs`, or use the host rootfs",
                    dir.display()
                ));
            }
        }
        self.ids.validate()?;
        self.network.validate()?;
        if self.exec.is_some() && self.landlock == LandlockMode::Off {
            return Err(
                "an exec allowlist needs landlock (its EXECUTE right is what keeps libraries from being run): \
                 set landlock to \"required\" or remove the allowlist"
                    .into(),
            );
        }
        for file in self.exec.iter().flat_map(|e| e.exec_mounted()) {
            if !file.is_absolute()
                || file
                    .components()
                    .any(|c| c == std::path::Component::ParentDir)
            {
                return Err(format!(
                    "exec allowlist: {} is not an absolute path",
                    file.display()
                ));
            }
        }
        for knob in Knob::all() {
            if let Some(value) = self.get(knob) {
                knob.check(value).map_err(|e| format!("{knob}: {e}"))?;
            }
        }
        if self.volumes.len() > MAX_VOLUMES {
            return Err(format!(
                "{} volumes: at most {MAX_VOLUMES}",
                self.volumes.len()
            ));
        }
        for (i, volume) in self.volumes.iter().enumerate() {
            volume
                .validate()
                .map_err(|e| format!("volume {}: {e}", volume.source.display()))?;
            // One volume may not lie inside another: the later would land in the earlier
            // (a read-only bind, or a copy being made).
            for other in &self.volumes[..i] {
                if volume.target.starts_with(&other.target)
                    || other.target.starts_with(&volume.target)
                {
                    return Err(format!(
                        "the volumes at {} and {} overlap: give each its own directory",
                        other.target.display(),
                        volume.target.display()
                    ));
                }
            }
        }
        let h = &self.hostname;
        if h.is_empty()
            || h.len() > 64
            || !h
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        {
            return Err(format!(
                "hostname {h:?} is invalid: use 1-64 letters, digits, '-' or '.'"
            ));
        }
        Ok(())
    }
}

impl Exec {
    /// `argv` with the base environment, no files, and the default timeout and output cap.
    pub fn new(argv: Vec<String>) -> Exec {
        let mut exec = Exec {
            argv,
            env: base_env(),
            files: Vec::new(),
            outputs: None,
            stdin: None,
            timeout: Duration::ZERO,
            output_limit: 0,
            exec_extra: None,
        };
        for knob in Knob::all() {
            exec.set(knob, knob.def().default);
        }
        exec
    }

    /// Sets a knob that belongs to one execution; others are ignored here.
    pub fn set(&mut self, knob: Knob, value: u64) {
        match knob {
            Knob::Timeout => self.timeout = Duration::from_millis(value),
            Knob::OutputLimit => self.output_limit = value,
            _ => {}
        }
    }

    /// An execution knob's value.
    pub fn get(&self, knob: Knob) -> Option<u64> {
        match knob {
            Knob::Timeout => Some(self.timeout.as_millis() as u64),
            Knob::OutputLimit => Some(self.output_limit),
            _ => None,
        }
    }

    /// Sets `key=value` in the environment, replacing an earlier value.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.into()));
    }

    /// Checks the execution against the box it will run in (its files must fit /work).
    pub fn validate(&self, sandbox: &SandboxSpec) -> Result<(), String> {
        if self.argv.is_empty() || self.argv[0].is_empty() {
            return Err("argv is empty: give the program to run".into());
        }
        // Named by position, not content: an argument may be code, which an audit log
        // with log_code off must not receive by way of an error message.
        if let Some(i) = self.argv.iter().position(|a| a.contains('\0')) {
            return Err(format!(
                "argument {i} of argv contains a NUL byte, which no program can receive"
            ));
        }
        for (key, value) in &self.env {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                return Err(format!(
                    "environment variable name {key:?} is invalid: use a non-empty name without '=' or NUL"
                ));
            }
            if value.contains('\0') {
                return Err(format!("environment variable {key} contains a NUL byte"));
            }
        }
        let code_bytes: u64 = self.files.iter().map(|f| f.data.len() as u64).sum();
        if code_bytes > sandbox.work_size {
            return Err(format!(
                "the code and files are {} bytes, more than /work holds ({}): send less, or use a profile \
                 with a larger work_size",
                code_bytes,
                crate::units::format_size(sandbox.work_size)
            ));
        }
        for file in &self.files {
            crate::files::check_input_path(&file.path)?;
            let at = Path::new("/work").join(&file.path);
            if let Some(volume) = sandbox.volumes.iter().find(|v| {
                (v.mode == VolumeMode::ReadOnly && at.starts_with(&v.target))
                    || v.target.starts_with(&at)
            }) {
                return Err(format!(
                    "file {:?} would land on the volume at {}: put it elsewhere in /work",
                    file.path,
                    volume.target.display(),
                ));
            }
        }
        for knob in Knob::all() {
            if let Some(value) = self.get(knob) {
                knob.check(value).map_err(|e| format!("{knob}: {e}"))?;
            }
        }
        Ok(())
    }
}

impl Spec {
    /// A run of `argv` with every knob at its default (`crate::knobs::KNOBS`: 30 s, 1 MiB
    /// of output, 64 MiB tmpfs for /tmp and /work, 256 MiB of memory, half a CPU, 64
    /// processes), the host rootfs, every layer required, and the base environment.
    pub fn new(argv: Vec<String>) -> Spec {
        Spec {
            sandbox: SandboxSpec::default(),
            exec: Exec::new(argv),
        }
    }

    /// Sets a knob, in its base unit (see [`Knob`]), on the box or the execution: the one
    /// place a knob's value reaches the field the launcher reads.
    pub fn set(&mut self, knob: Knob, value: u64) {
        self.sandbox.set(knob, value);
        self.exec.set(knob, value);
    }

    /// A knob's value, wherever it lives.
    pub fn get(&self, knob: Knob) -> Option<u64> {
        self.sandbox.get(knob).or_else(|| self.exec.get(knob))
    }

    /// Sets `key=value` in the execution's environment.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.exec.set_env(key, value);
    }

    /// Both halves, with messages that name the field and what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        self.exec.validate(&self.sandbox)?;
        self.sandbox.validate()
    }
}

/// The environment every payload starts with: PATH, HOME, LANG.
pub fn base_env() -> Vec<(String, String)> {
    vec![
        ("PATH".into(), SANDBOX_PATH.into()),
        ("HOME".into(), "/work".into()),
        ("LANG".into(), "C.UTF-8".into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_maps_are_distinct_per_slot_and_never_root() {
        let ids = IdMapping::default();
        let base = 0x7200_0000;
        assert_eq!(
            ids.map_lines(10),
            format!(
                "0 {} 1\n1000 {} 1\n65534 {} 1\n",
                base + 30,
                base + 31,
                base + 32
            )
        );
        // A slot's last id is below the next slot's first: no two slots share an id.
        assert_eq!(ids.host_root(10) + 2 + 1, ids.host_root(11));
        // The last slot's ids stay below u32::MAX, and the range clears the old layout's
        // (0x7100_0000 + 2 * SLOTS) so that both versions can live side by side.
        assert!(ids.validate().is_ok());
        assert!(u64::from(ids.host_root(IdMapping::SLOTS - 1)) + 2 < u64::from(u32::MAX));
        assert!(ids.host_base >= 0x7100_0000 + 2 * IdMapping::SLOTS);
        let top = IdMapping {
            host_base: u32::MAX - 3 * IdMapping::SLOTS,
        };
        assert!(top.validate().unwrap_err().contains("out of range"));
        let low = IdMapping { host_base: 1000 };
        assert!(low.validate().is_err());
    }

    #[test]
    fn validation_names_the_bad_field() {
        let mut spec = Spec::new(vec![]);
        assert!(spec.validate().unwrap_err().contains("argv"));
        spec.exec.argv = vec!["true".into()];
        assert!(spec.validate().is_ok());
        spec.set_env("A=B", "x");
        assert!(spec.validate().unwrap_err().contains("\"A=B\""));
        let mut spec = Spec::new(vec!["true".into()]);
        spec.sandbox.rootfs = Rootfs::Dir("/nonexistent/codecage".into());
        assert!(spec.validate().unwrap_err().contains("cargo xtask rootfs"));
        let mut spec = Spec::new(vec!["true".into()]);
        spec.sandbox.hostname = "a b".into();
        assert!(spec.validate().unwrap_err().contains("hostname"));
    }

    #[test]
    fn volumes_parse_and_their_targets_stay_under_work() {
        let v = Volume::parse("/srv/project:/work/src").unwrap();
        assert_eq!(v.source, PathBuf::from("/srv/project"));
        assert_eq!(v.target, PathBuf::from("/work/src"));
        assert_eq!(v.mode, VolumeMode::ReadOnly);
        assert_eq!(v.top(), Some("src"));
        let v = Volume::parse("/srv/project:/work:copy").unwrap();
        assert_eq!((v.mode, v.top()), (VolumeMode::Copy, None));
        assert_eq!(Volume::parse("/a:/work/a/b:ro").unwrap().top(), Some("a"));
        let relative = Volume::parse("project:/work/src").unwrap();
        assert!(relative.source.is_absolute());
        for bad in [
            "/a:/work/src:rw",
            "/a:/etc",
            "/a:/work/../etc",
            "/a:/work/./x",
            "/a:/work//x",
            "/a:/work/x/",
            "/a:/workspace",
            "/a:/work",
            "/a",
            ":/work/x",
            "/a:/work/x:copy:more",
        ] {
            assert!(Volume::parse(bad).is_err(), "{bad}");
        }
        assert!(Volume::parse("/a:/work/src:rw")
            .unwrap_err()
            .contains("never writable"));
    }

    /// A server's roots: a directory under one is pinned (the launcher will open the very
    /// directory opened here), one outside every root is refused, symlinks resolved first.
    #[test]
    fn a_pinned_volume_must_lie_under_the_roots() {
        let base = std::env::temp_dir().join(format!("codecage-pin-{}", std::process::id()));
        let (root, other) = (base.join("root"), base.join("other"));
        std::fs::create_dir_all(root.join("project")).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        std::os::unix::fs::symlink(&other, root.join("link")).unwrap();
        let roots = [root.clone()];
        let mut inside =
            Volume::parse(&format!("{}:/work/src", root.join("project").display())).unwrap();
        let fd = inside.pin(None, Some(&roots)).unwrap();
        assert_eq!(inside.pinned, Some(std::os::fd::AsRawFd::as_raw_fd(&fd)));
        assert_eq!(inside.source, root.join("project"));
        let mut outside =
            Volume::parse(&format!("{}:/work/src", root.join("link").display())).unwrap();
        assert!(outside
            .pin(None, Some(&roots))
            .unwrap_err()
            .contains("only directories under"));
        let mut missing =
            Volume::parse(&format!("{}:/work/src", base.join("nope").display())).unwrap();
        assert!(missing.pin(None, None).is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn volumes_may_not_overlap_or_meet_the_code_file() {
        let mut spec = Spec::new(vec!["true".into()]);
        spec.sandbox.volumes = vec![
            Volume::parse("/a:/work/src").unwrap(),
            Volume::parse("/b:/work/src/sub:copy").unwrap(),
        ];
        assert!(spec.validate().unwrap_err().contains("overlap"));
        spec.sandbox.volumes = vec![
            Volume::parse("/a:/work/src").unwrap(),
            Volume::parse("/b:/work/srcs:copy").unwrap(),
        ];
        assert!(spec.validate().is_ok());
        spec.exec.files = vec![crate::files::InputFile::new("src", "")];
        assert!(spec.validate().unwrap_err().contains("/work/src"));
        // Into a copy, a file lands in the copied tree; onto a read-only volume, nowhere.
        spec.exec.files = vec![crate::files::InputFile::new("srcs/extra.py", "")];
        assert!(spec.validate().is_ok());
        spec.exec.files = vec![crate::files::InputFile::new("src/extra.py", "")];
        assert!(spec.validate().unwrap_err().contains("/work/src"));
    }

    #[test]
    fn set_env_replaces() {
        let mut spec = Spec::new(vec!["true".into()]);
        spec.set_env("HOME", "/tmp");
        let env = &spec.exec.env;
        assert_eq!(env.iter().filter(|(k, _)| k == "HOME").count(), 1);
        assert!(env.contains(&("HOME".into(), "/tmp".into())));
    }

    #[test]
    fn knobs_land_in_the_box_or_the_execution() {
        let mut spec = Spec::new(vec!["true".into()]);
        spec.set(Knob::Memory, 64 << 20);
        spec.set(Knob::Timeout, 5000);
        assert_eq!(spec.sandbox.limits.unwrap().memory, 64 << 20);
        assert_eq!(spec.exec.timeout, Duration::from_secs(5));
        assert_eq!(spec.get(Knob::Timeout), Some(5000));
        assert_eq!(spec.get(Knob::Memory), Some(64 << 20));
    }
}
