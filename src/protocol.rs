//! The launcher <-> sandbox protocol, in one module both sides import: the fd the channel
//! sits on, the frames, the setup steps, and the messages.
//!
//! The channel is a CLOEXEC stream socketpair whose sandbox end is fd [`CHANNEL_FD`] of the
//! init (which moves it out of the way of the payloads' fds at once). Frames, in order:
//! - launcher -> sandbox: the byte [`GO`] once the id maps are written (read by the raw child
//!   before it execs the init), then a [`TAG_MESSAGE`] frame holding the `SandboxSpec`,
//!   then the byte [`TAG_VOLUMES`] with the sandbox's tmpfs file systems (in the order of
//!   [`Tmpfs::plan`]) and the volumes' detached mount trees (SCM_RIGHTS), then
//!   [`ToSandbox`] frames: spawn a payload (its stdin, stdout, stderr and, for a REPL
//!   driver, its own channel travel with the frame as SCM_RIGHTS), signal it, kill every
//!   process but the init, shut down.
//! - sandbox -> launcher: either a 6-byte [`TAG_RAW_ERROR`] frame from the raw child (it
//!   cannot allocate, so it sends a [`Step`] number and the errno), or [`TAG_MESSAGE`]
//!   frames holding a [`FromSandbox`] as JSON behind a little-endian u32 length (one,
//!   [`FromSandbox::PtyOpened`], carries a terminal's master as SCM_RIGHTS: the launcher
//!   takes it only for a payload it asked a terminal for, and checks it is a pty master), or
//!   [`TAG_FILE`] frames carrying a file's bytes as they are (an output file, or a
//!   download), which would cost a base64 encoding, a JSON escape scan and a decoding as
//!   JSON: a 5 MiB file took 50 ms that way.
//!
//! The launcher treats every byte from the sandbox as untrusted: frames are capped at
//! [`MAX_FRAME`], and a frame that does not decode is a protocol error, never a panic.

use std::ffi::CStr;
use std::fmt;
use std::io::{self, Read, Write};
use std::os::fd::RawFd;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The fd number of the channel in the init.
pub const CHANNEL_FD: RawFd = 3;
/// What every init's argv[1] starts with.
pub const INIT_ARG_PREFIX: &str = "__sandbox-init:";
/// The hidden subcommand that turns the codecage binary (or `codecage-init`) into a sandbox
/// init, with this build's fingerprint (build.rs): an init of another build refuses it.
pub const INIT_ARG: &str = concat!("__sandbox-init:", env!("CODECAGE_BUILD_ID"));
/// [`INIT_ARG`] for the raw child's execveat, which cannot allocate.
pub const INIT_ARG_C: &CStr = match CStr::from_bytes_with_nul(
    concat!("__sandbox-init:", env!("CODECAGE_BUILD_ID"), "\0").as_bytes(),
) {
    Ok(arg) => arg,
    Err(_) => panic!("the init argument has no interior NUL"),
};

/// The "go" byte: maps are written; become root in the sandbox and exec the init.
pub const GO: u8 = b'G';
/// A raw error from the child before it exec'd the init: step number (u8), errno (i32 LE).
pub const TAG_RAW_ERROR: u8 = b'E';
/// A length-prefixed JSON message.
pub const TAG_MESSAGE: u8 = b'M';
/// One byte that carries the sandbox's detached mounts (SCM_RIGHTS): its tmpfs file
/// systems in the order of [`Tmpfs::plan`], then the volumes' mount trees in the order of
/// `SandboxSpec::volumes`; sent after the spec, once the launcher has filled the tmpfs
/// (src/launcher/fill.rs).
pub const TAG_VOLUMES: u8 = b'V';

/// At most this many entries in [`Tmpfs::plan`].
pub const MAX_TMPFS: usize = 6;

/// A tmpfs of the sandbox. The launcher makes each one (host root, in the host's user
/// namespace) and sends it detached; the init attaches it. Made inside, by the sandbox's
/// root, a tmpfs would print that root's *host* uid in /proc/self/mountinfo (tmpfs shows
/// its owner in the initial namespace's ids unless it is that namespace's root), and a
/// `uid=` option, the sandbox user's. The launcher gives each root directory its owner
/// instead, which the options never show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tmpfs {
    /// The root of the host rootfs (its /usr and /etc bound onto it).
    Root,
    Tmp,
    Work,
    Dev,
    Shm,
    /// The staging tmpfs: attached first at the new root's mount point, under the root,
    /// where nothing of the sandbox can reach it. The files bound over /proc (the empty
    /// file and directory that mask host entries, the sandbox's own meminfo, ...) are
    /// written there, with the sandbox's /sys and a session's /run (the REPL drivers), and
    /// bound from there once it is read-only; it leaves the mount table with the old root
    /// (see mount.rs).
    Stage,
    /// An image's root is an overlay of the image and this empty layer (see mount.rs).
    Empty,
}

/// Who owns a tmpfs's root directory, inside the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmpfsOwner {
    /// Uid and gid 0, the sandbox's root.
    Root,
    /// The sandbox user ([`crate::spec::SANDBOX_UID`]).
    User,
}

/// How a [`Tmpfs`] is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TmpfsSpec {
    /// Mount options, as `mount -t tmpfs -o` takes them.
    pub options: Vec<(&'static str, String)>,
    pub noexec: bool,
    /// Made read-only by the init once attached (the launcher gives it its owner first).
    pub read_only: bool,
    pub owner: TmpfsOwner,
}

impl Tmpfs {
    /// The tmpfs file systems of a sandbox built from `spec`, in the order they are sent.
    pub fn plan(spec: &crate::spec::SandboxSpec) -> Vec<Tmpfs> {
        let mut plan = vec![Tmpfs::Stage];
        match spec.rootfs {
            crate::spec::Rootfs::Host => plan.push(Tmpfs::Root),
            crate::spec::Rootfs::Dir(_) => plan.push(Tmpfs::Empty),
        }
        plan.extend([Tmpfs::Tmp, Tmpfs::Work, Tmpfs::Dev, Tmpfs::Shm]);
        plan
    }

    /// How this one is made for `spec`.
    pub fn spec(self, spec: &crate::spec::SandboxSpec) -> TmpfsSpec {
        // The size, and as many inodes as 4 KiB files would fill, so that a flood of empty
        // files meets the same wall as a flood of data.
        let sized = |mode: &str, size: u64| {
            vec![
                ("mode", mode.to_string()),
                ("size", size.to_string()),
                ("nr_inodes", (size / 4096).max(1024).to_string()),
            ]
        };
        let fixed = |mode: &str, size: &str, inodes: u32| {
            vec![
                ("mode", mode.to_string()),
                ("size", size.to_string()),
                ("nr_inodes", inodes.to_string()),
            ]
        };
        let (options, noexec, read_only, owner) = match self {
            Tmpfs::Root => (fixed("0755", "4m", 4096), false, false, TmpfsOwner::Root),
            Tmpfs::Tmp => (sized("1777", spec.tmp_size), false, false, TmpfsOwner::Root),
            Tmpfs::Work => (
                sized("0755", spec.work_size),
                false,
                false,
                TmpfsOwner::User,
            ),
            Tmpfs::Dev => (fixed("0755", "64k", 64), true, false, TmpfsOwner::Root),
            Tmpfs::Shm => (sized("1777", spec.tmp_size), false, false, TmpfsOwner::Root),
            // Room for the sandbox's cpuinfo (a few KiB a CPU), the drivers (32 KiB) and
            // the other files.
            Tmpfs::Stage => (fixed("0755", "1m", 64), true, false, TmpfsOwner::Root),
            Tmpfs::Empty => (fixed("0555", "4k", 1), true, true, TmpfsOwner::Root),
        };
        TmpfsSpec {
            options,
            noexec,
            read_only,
            owner,
        }
    }
}
/// A file's bytes: kind (u8: [`FILE_OUTPUT`] or [`FILE_DATA`]), path length (u16 LE), the
/// path (UTF-8), data length (u32 LE), the data.
pub const TAG_FILE: u8 = b'F';
/// A [`TAG_FILE`] frame that is an output file ([`FromSandbox::OutputFile`]).
pub const FILE_OUTPUT: u8 = 0;
/// A [`TAG_FILE`] frame that answers `ReadFile` ([`FromSandbox::FileData`], no path).
pub const FILE_DATA: u8 = 1;
/// The largest frame the launcher accepts from the sandbox, which it does not trust: one
/// output file (at most 64 MiB) and its framing, or a message.
pub const MAX_FRAME: usize = 96 << 20;
/// The largest message the launcher sends (a Spec carries the code): the init reads it
/// before anything of the payload runs.
pub const MAX_SPEC_FRAME: usize = 1 << 30;

/// Declares the setup steps once: the enum, each step's name (what errors report, the
/// function that performs it) and what it does.
macro_rules! steps {
    ($($(#[$doc:meta])* $variant:ident = $name:literal: $detail:literal,)*) => {
        /// A step of the sandbox's setup, in the order they run: the raw child's first (their
        /// numbers go over the wire as one byte), then the init's, then the payload's.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Step {
            $($(#[$doc])* $variant,)*
        }

        impl Step {
            /// Every step, in order.
            pub const ALL: &'static [Step] = &[$(Step::$variant,)*];

            /// The step's name: the function that performs it.
            pub fn name(self) -> &'static str {
                match self { $(Step::$variant => $name,)* }
            }

            /// What the step does, for messages.
            pub fn detail(self) -> &'static str {
                match self { $(Step::$variant => $detail,)* }
            }
        }
    };
}

steps! {
    // The raw child, between clone3 and the exec of the init (numbered on the wire).
    CreateNetworkNamespace = "create_network_namespace": "creating the sandbox's network namespace (unshare CLONE_NEWNET)",
    WaitForGo = "wait_for_go": "waiting for the launcher to write the id maps",
    EnterSandboxIds = "enter_sandbox_ids": "switching to the sandbox's root user (setresgid/setresuid 0)",
    JoinCgroups = "join_cgroups": "moving into the run's v1 cgroups (writing 0 to their tasks files)",
    SetParentDeathSignal = "set_parent_death_signal": "setting PR_SET_PDEATHSIG",
    AttachStdio = "attach_stdio": "attaching stdin, stdout, stderr and the channel",
    CloseInheritedFds = "close_inherited_fds": "marking inherited fds close-on-exec",
    ExecInit = "exec_init": "executing the sandbox init (codecage-init, or the codecage binary itself)",
    // The init, pid 1 of the sandbox.
    ResetSignalDispositions = "reset_signal_dispositions": "setting every signal back to its default action",
    LeaveSession = "leave_session": "leaving the launcher's session (setsid)",
    DieWithLauncher = "die_with_launcher": "asking for SIGKILL when the launcher dies",
    ReceiveSpec = "receive_spec": "reading the Spec from the launcher",
    EnterCgroupNamespace = "enter_cgroup_namespace": "creating the cgroup namespace",
    ReceiveVolumes = "receive_volumes": "reading the tmpfs file systems and the volumes' mount trees from the launcher",
    StopMountPropagation = "stop_mount_propagation": "making / a recursive slave mount",
    AttachStage = "attach_stage": "attaching the tmpfs the /proc masks and the sandbox's /proc files are staged on, under the new root",
    MountRootTmpfs = "mount_root_tmpfs": "mounting the tmpfs the new root is assembled on",
    BindHostDirs = "bind_host_dirs": "binding the host's /usr, /bin and /lib* read-only",
    WriteEtc = "write_etc": "binding the host's /etc entries onto the sandbox's /etc",
    BindImageRoot = "bind_image_root": "binding the image directory as the new root",
    CheckMountPoints = "check_mount_points": "checking the image has /dev, /proc, /tmp and /work",
    MountTmp = "mount_tmp": "mounting the tmpfs on /tmp",
    MountWork = "mount_work": "mounting the tmpfs on /work",
    MountVolumes = "mount_volumes": "attaching the read-only volumes under /work",
    CopyVolumes = "copy_volumes": "copying the :copy volumes into /work",
    MountDev = "mount_dev": "building the minimal /dev",
    MountDevpts = "mount_devpts": "mounting the sandbox's own devpts on /dev/pts",
    MountProc = "mount_proc": "mounting a new proc on /proc",
    ProtectProc = "protect_proc": "making kernel knobs in /proc read-only",
    MaskHostProcEntries = "mask_host_proc_entries": "hiding the /proc entries that describe the host",
    WriteSandboxProcFiles = "write_sandbox_proc_files": "binding the sandbox's own meminfo, cpuinfo, stat, loadavg and boot id",
    MountSys = "mount_sys": "mounting the minimal /sys",
    MountDrivers = "mount_drivers": "mounting the REPL drivers read-only",
    PointResolverAtGateway = "point_resolver_at_gateway": "covering the image's /etc/resolv.conf with one naming the gateway's DNS",
    RestrictExecMounts = "restrict_exec_mounts": "making every mount noexec but read-only binds of the exec allowlist's files",
    SealDev = "seal_dev": "making /dev read-only",
    RemountRootReadonly = "remount_root_readonly": "making / read-only",
    EnterNewRoot = "enter_new_root": "pivot_root into the new root and detaching the old one",
    WriteWorkFiles = "write_work_files": "writing the code file into /work",
    SetHostname = "set_hostname": "setting the host name",
    BringUpLoopback = "bring_up_loopback": "setting lo up in the new network namespace",
    SetNetworkSysctls = "set_network_sysctls": "setting the sandbox network namespace's sysctls",
    ConfigureGatewayLink = "configure_gateway_link": "giving tun0 its address, MTU and the default route",
    MakeInitUndumpable = "make_init_undumpable": "PR_SET_DUMPABLE 0 for the init",
    BlockInitSignals = "block_init_signals": "blocking the init's signals (taken with sigwait)",
    CompileSeccomp = "compile_seccomp": "decoding the seccomp filters",
    PrepareNetlinkWatch = "prepare_netlink_watch": "opening the socket pair payloads hand their netlink watch to the init on",
    OpenTerminal = "open_terminal": "opening a terminal from the sandbox's devpts (/dev/pts/ptmx) and handing its master to the launcher",
    ForkPayload = "fork_payload": "forking the payload",
    // The payload's last mile, in the child the init forked.
    AttachPayloadFds = "attach_payload_fds": "putting the launcher's stdin, stdout, stderr (and a driver's channel) on 0-3",
    UnblockSignals = "unblock_signals": "unblocking the signals the init blocked",
    NewSession = "new_session": "giving the payload a session of its own (setsid)",
    TakeTerminal = "take_terminal": "making the terminal the payload's controlling terminal (TIOCSCTTY)",
    SetRlimits = "set_rlimits": "setting the resource limits",
    PreferForOomKill = "prefer_for_oom_kill": "writing oom_score_adj 1000",
    DropCapabilities = "drop_capabilities": "clearing the bounding, inheritable and ambient capability sets",
    DropToSandboxUser = "drop_to_sandbox_user": "switching to the sandbox user",
    CheckNoCapabilities = "check_no_capabilities": "checking every capability set is empty",
    EnterWorkdir = "enter_workdir": "changing to /work",
    SetNoNewPrivs = "set_no_new_privs": "PR_SET_NO_NEW_PRIVS",
    RestrictWithLandlock = "restrict_with_landlock": "applying the landlock rules",
    MarkFdsCloexec = "mark_fds_cloexec": "marking fds above 2 close-on-exec",
    ReportHardening = "report_hardening": "telling the launcher which layers are on",
    WatchNetlink = "watch_netlink": "installing the netlink watch and handing its listener to the init",
    ApplySeccomp = "apply_seccomp": "installing the seccomp filters",
}

impl Step {
    /// The raw child's steps are numbered on the wire by their position.
    pub const RAW: &'static [Step] = &[
        Step::CreateNetworkNamespace,
        Step::WaitForGo,
        Step::EnterSandboxIds,
        Step::JoinCgroups,
        Step::SetParentDeathSignal,
        Step::AttachStdio,
        Step::CloseInheritedFds,
        Step::ExecInit,
    ];

    /// The step's number in the raw child's error frame.
    pub const fn raw_number(self) -> u8 {
        self as u8
    }

    fn from_name(name: &str) -> Option<Step> {
        Step::ALL.iter().copied().find(|s| s.name() == name)
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Step {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Step {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Step, D::Error> {
        let name = String::deserialize(d)?;
        Step::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown setup step {name:?}")))
    }
}

/// The frame the raw child sends when `step` failed with `errno`.
pub const fn raw_error_frame(step: Step, errno: i32) -> [u8; 6] {
    let e = errno.to_le_bytes();
    [TAG_RAW_ERROR, step.raw_number(), e[0], e[1], e[2], e[3]]
}

/// A sandbox setup step that failed: the step, the errno the kernel returned (if the failure
/// was a system call), what the step was doing (its paths), and the failing layer's own
/// message when it is not an errno (a crate's error).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetupError {
    pub step: Step,
    pub errno: Option<i32>,
    pub context: String,
    pub cause: Option<String>,
}

impl SetupError {
    /// A failed system call.
    pub fn errno(step: Step, errno: nix::errno::Errno, context: impl fmt::Display) -> SetupError {
        SetupError {
            step,
            errno: Some(errno as i32),
            context: context.to_string(),
            cause: None,
        }
    }

    /// An io::Error: its errno when it has one, else its message.
    pub fn io(step: Step, err: &io::Error, context: impl fmt::Display) -> SetupError {
        SetupError {
            step,
            errno: err.raw_os_error(),
            context: context.to_string(),
            cause: err.raw_os_error().is_none().then(|| err.to_string()),
        }
    }

    /// A crate's error: its message, and the errno of the first io::Error in its chain.
    pub fn from_error(
        step: Step,
        err: &(dyn std::error::Error + 'static),
        context: impl fmt::Display,
    ) -> SetupError {
        let mut errno = None;
        let mut source = Some(err);
        while let Some(e) = source {
            if let Some(io) = e.downcast_ref::<io::Error>() {
                errno = io.raw_os_error();
                break;
            }
            source = e.source();
        }
        SetupError {
            step,
            errno,
            context: context.to_string(),
            cause: Some(err.to_string()),
        }
    }

    /// A failure that is not a system call's (a check that found something wrong).
    pub fn refused(step: Step, context: impl fmt::Display) -> SetupError {
        SetupError {
            step,
            errno: None,
            context: context.to_string(),
            cause: None,
        }
    }
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sandbox setup failed at step {}: {}",
            self.step, self.context
        )?;
        if let Some(cause) = &self.cause {
            write!(f, ": {cause}")?;
        }
        if let Some(errno) = self.errno {
            let errno = nix::errno::Errno::from_raw(errno);
            write!(f, ": {errno} ({})", errno.desc())?;
        }
        Ok(())
    }
}

impl std::error::Error for SetupError {}

/// What the launcher asks of the sandbox's init.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToSandbox {
    /// Start a payload. `fds` fds came with this frame: stdin, stdout, stderr and, when 4,
    /// a REPL driver's channel (fd 3 of the payload). `last`: when it ends, the init kills
    /// the rest and exits (a one-shot run).
    Spawn {
        id: u64,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        files: Vec<crate::files::InputFile>,
        fds: u8,
        last: bool,
        /// For a `last` payload: the output files to send back before the init exits.
        outputs: Option<crate::files::OutputRules>,
        /// Where the payload starts, under /work if relative (default: /work).
        #[serde(default)]
        cwd: Option<String>,
        /// Run it on a terminal of this size, from the sandbox's own devpts (no fds come
        /// with the frame then): the init opens it, gives the payload its slave as stdin,
        /// stdout, stderr and controlling terminal, and hands the master back
        /// ([`FromSandbox::PtyOpened`]).
        #[serde(default)]
        pty: Option<PtySize>,
        /// Under an exec allowlist: what this payload may execute beyond it (an approved
        /// command): the init binds these files exec, and the payload's landlock ruleset is
        /// the sandbox's allowlist plus these.
        #[serde(default)]
        exec_extra: Option<crate::exec_policy::ExecAllowlist>,
        /// For a `last` payload that says its own end (the warm pool's pre-started Python):
        /// the init gives it one more fd, after those that came with the frame, the write
        /// end of a pipe on which it writes its exit status (`CODE\n`) once its code has
        /// finished and its stdio is flushed and closed. The init then ends the run as if it
        /// had exited with that status without waiting for its exit (the teardown of a large
        /// interpreter's memory comes after the answer); see `Init::end_said`.
        #[serde(default)]
        says_end: bool,
    },
    /// Write files into /work; answered by `FilesWritten` or `FileError`.
    WriteFiles { files: Vec<crate::files::InputFile> },
    /// A session call begins: note the last pid the sandbox allocated (what starts after it
    /// is the call's), and with `rules` what the output directory holds (each file's
    /// inode, size, mtime and ctime): answered by `CallBegun`.
    BeginCall {
        rules: Option<crate::files::OutputRules>,
    },
    /// Send the output directory's files (with `changed`, only those new or changed since
    /// the last `BeginCall`): `OutputFile`s, then `OutputsDone`.
    CollectOutputs {
        rules: crate::files::OutputRules,
        changed: bool,
    },
    /// List a directory under /work: `Listing` or `FileError`.
    ListDir { path: String },
    /// Read a file under /work, at most `max` bytes: `FileData` or `FileError`.
    ReadFile { path: String, max: u64 },
    /// Send `signal` to the process group of payload `id`.
    Signal { id: u64, signal: i32 },
    /// List the live processes of payload `id`'s process group (the payload itself left
    /// out) that the running call started: newer than the pid `BeginCall` noted (should the
    /// pids have wrapped since, started at or after `since_ns` of CLOCK_BOOTTIME); with
    /// `since_ns` 0, every member. The payload may have been reaped lately (the init keeps
    /// the last 16 ids): a dead driver's group is still found. `CallProcesses`.
    CallProcesses { id: u64, since_ns: u64 },
    /// SIGKILL each process that is still the one listed (pid and start time, so a reused
    /// pid is never hit): `ProcessesKilled`.
    KillProcesses { processes: Vec<(i32, u64)> },
    /// Kill every process of the sandbox but the init; answered by `AllKilled` once every
    /// one is reaped.
    KillAll,
    /// Kill everything and exit.
    Shutdown,
}

/// What the sandbox tells the launcher.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromSandbox {
    /// A setup step failed: of the sandbox (`id` None; nothing can run in it), or of one
    /// payload (it never ran).
    SetupFailed { id: Option<u64>, error: SetupError },
    /// A point of the sandbox's setup was reached, at this CLOCK_MONOTONIC time: the
    /// launcher turns these into `Outcome.phases`.
    Mark { phase: Phase, at_ns: u64 },
    /// Payload `id`'s hardening is in place and it is about to exec: which landlock ABI the
    /// kernel has, and what was not enforced.
    Hardened {
        id: u64,
        landlock_abi: Option<u32>,
        skipped: Vec<crate::outcome::Skipped>,
    },
    /// Payload `id`'s terminal: its master travels with this frame (SCM_RIGHTS), sent by
    /// the init right after the fork. The launcher takes it only for a payload it asked a
    /// terminal for, and only if it is a pty master.
    PtyOpened { id: u64 },
    /// Payload `id` ended: with an exit status, or by a signal.
    Exited {
        id: u64,
        code: Option<i32>,
        signal: Option<i32>,
    },
    /// Every process but the init is gone (after `KillAll`).
    AllKilled,
    /// The processes `CallProcesses` asked for.
    CallProcesses { processes: Vec<ProcessInfo> },
    /// `KillProcesses` is done.
    ProcessesKilled,
    /// `WriteFiles` is done.
    FilesWritten,
    /// `BeginCall` is done.
    CallBegun,
    /// A file operation failed: what, in words.
    FileError { message: String },
    /// One output file, taken. Sent as a [`TAG_FILE`] frame, never as JSON.
    #[serde(skip)]
    OutputFile { path: String, data: Vec<u8> },
    /// The end of the output files, with the ones skipped and why.
    OutputsDone {
        skipped: Vec<crate::files::SkippedFile>,
    },
    /// A directory's entries.
    Listing {
        entries: Vec<crate::sandbox::DirEntry>,
    },
    /// A file's bytes. Sent as a [`TAG_FILE`] frame, never as JSON.
    #[serde(skip)]
    FileData { data: Vec<u8> },
}

/// A terminal's size, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

/// A process of the sandbox, as the init reads it from /proc.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub pid: i32,
    /// Its start time, in clock ticks since boot (/proc/PID/stat): with the pid, it names
    /// this process and no later one that reuses the pid.
    pub start: u64,
    /// Its command line (cut), or its name in brackets where it has none.
    pub command: String,
    /// It ignores SIGHUP: what `nohup` does to keep a process past its session.
    pub ignores_hangup: bool,
}

/// The points the sandbox reports the time of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The init's main began (after the exec).
    InitStarted,
    /// Namespaces, mounts, pivot_root, host name and loopback are done.
    SandboxBuilt,
    /// The payload is hardened and about to exec.
    PayloadReady,
    /// The init reaped the payload.
    PayloadExited,
}

/// Reports a phase mark; a launcher that is gone is not an error here.
pub fn mark(channel: &std::os::unix::net::UnixStream, phase: Phase) {
    let _ = write_message(
        &mut &*channel,
        &FromSandbox::Mark {
            phase,
            at_ns: crate::sys::monotonic_ns(),
        },
        MAX_FRAME,
    );
}

/// Writes one length-prefixed JSON message of at most `max` bytes.
pub fn write_message<T: Serialize>(w: &mut impl Write, msg: &T, max: usize) -> io::Result<()> {
    let body = serde_json::to_vec(msg)?;
    if body.len() > max {
        return Err(io::Error::other(format!(
            "message of {} bytes is over the protocol's {max}",
            body.len()
        )));
    }
    let mut frame = Vec::with_capacity(body.len() + 5);
    frame.push(TAG_MESSAGE);
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame)
}

/// Writes a [`TAG_FILE`] frame: its header, then the bytes as they are (no copy).
pub fn write_file_frame(w: &mut impl Write, kind: u8, path: &str, data: &[u8]) -> io::Result<()> {
    let too_big = |what: &str| io::Error::other(format!("{what} is over the protocol's limit"));
    let path_len = u16::try_from(path.len()).map_err(|_| too_big("the path"))?;
    if data.len() > MAX_FRAME {
        return Err(too_big("the file"));
    }
    let mut head = Vec::with_capacity(1 + 1 + 2 + path.len() + 4);
    head.push(TAG_FILE);
    head.push(kind);
    head.extend_from_slice(&path_len.to_le_bytes());
    head.extend_from_slice(path.as_bytes());
    head.extend_from_slice(&(data.len() as u32).to_le_bytes());
    w.write_all(&head)?;
    w.write_all(data)
}

/// Reads one length-prefixed JSON message of at most `max` bytes, blocking.
pub fn read_message<T: DeserializeOwned>(r: &mut impl Read, max: usize) -> io::Result<T> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head)?;
    let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidData, msg);
    if head[0] != TAG_MESSAGE {
        return Err(invalid(format!("unexpected frame tag {:#x}", head[0])));
    }
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > max {
        return Err(invalid(format!("a frame of {len} bytes is over {max}")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    serde_json::from_slice(&body).map_err(|e| invalid(e.to_string()))
}

/// Sends a frame with `fds` attached (SCM_RIGHTS), all of it, without raising SIGPIPE. The
/// fds travel with the first bytes; the receiver queues them, so they are there by the
/// time the frame is complete.
pub fn send_with_fds(
    stream: &std::os::unix::net::UnixStream,
    mut bytes: &[u8],
    fds: &[std::os::fd::RawFd],
) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    use std::os::fd::AsRawFd;
    let mut first = true;
    while !bytes.is_empty() {
        let iov = [io::IoSlice::new(bytes)];
        let cmsgs = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if first && !fds.is_empty() {
            &cmsgs
        } else {
            &[]
        };
        match sendmsg::<()>(
            stream.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) => {
                bytes = &bytes[n..];
                first = false;
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// One [`ToSandbox`] message as a frame.
pub fn frame<T: Serialize>(msg: &T, max: usize) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    write_message(&mut out, msg, max)?;
    Ok(out)
}

/// The init's side of the channel: bytes and the fds that came with them, reassembled into
/// [`ToSandbox`] messages. The launcher is trusted, but a frame that does not decode still
/// ends the sandbox rather than guessing.
#[derive(Default)]
pub struct Inbox {
    buf: Vec<u8>,
    fds: std::collections::VecDeque<std::os::fd::OwnedFd>,
    /// What one read receives into: zeroed once, kept (a new one per read cost a 64 KiB
    /// memset each time the init woke for a message).
    chunk: Vec<u8>,
}

impl Inbox {
    /// Reads what the channel holds now (blocking until something arrives). Returns false
    /// at EOF: the launcher is gone.
    pub fn fill(&mut self, stream: &std::os::unix::net::UnixStream) -> io::Result<bool> {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        if self.chunk.is_empty() {
            self.chunk = vec![0u8; 64 * 1024];
        }
        let chunk = &mut self.chunk;
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 8]);
        let (n, received) = loop {
            let mut iov = [io::IoSliceMut::new(chunk)];
            match recvmsg::<()>(
                stream.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Ok(msg) => {
                    let mut fds = Vec::new();
                    for cmsg in msg.cmsgs().map_err(io::Error::from)? {
                        if let ControlMessageOwned::ScmRights(raw) = cmsg {
                            fds.extend(raw);
                        }
                    }
                    break (msg.bytes, fds);
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        for fd in received {
            // SAFETY: the kernel just installed this fd in our table for us (SCM_RIGHTS).
            self.fds.push_back(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    /// The next complete message and the fds it announced, if it has arrived.
    pub fn next(&mut self) -> Option<io::Result<(ToSandbox, Vec<std::os::fd::OwnedFd>)>> {
        let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidData, m);
        if self.buf.len() < 5 {
            return None;
        }
        if self.buf[0] != TAG_MESSAGE {
            return Some(Err(invalid(format!(
                "unexpected frame tag {:#x}",
                self.buf[0]
            ))));
        }
        let len = u32::from_le_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_SPEC_FRAME {
            return Some(Err(invalid(format!(
                "a frame of {len} bytes is over {MAX_SPEC_FRAME}"
            ))));
        }
        if self.buf.len() < 5 + len {
            return None;
        }
        let message: Result<ToSandbox, _> = serde_json::from_slice(&self.buf[5..5 + len]);
        self.buf.drain(..5 + len);
        let message = match message {
            Ok(m) => m,
            Err(e) => return Some(Err(invalid(e.to_string()))),
        };
        let wanted = match &message {
            ToSandbox::Spawn { fds, .. } => usize::from(*fds),
            _ => 0,
        };
        if self.fds.len() < wanted {
            return Some(Err(invalid(format!(
                "a spawn announced {wanted} fds and {} came",
                self.fds.len()
            ))));
        }
        let fds = self.fds.drain(..wanted).collect();
        Some(Ok((message, fds)))
    }
}

/// Reassembles the sandbox's frames from the bytes the launcher reads as they arrive.
#[derive(Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    broken: bool,
}

impl FrameReader {
    /// Appends bytes read from the channel. After a protocol error nothing more is kept.
    pub fn feed(&mut self, bytes: &[u8]) {
        if !self.broken {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// The next complete message, if one has arrived. A raw error frame becomes a
    /// `SetupFailed` naming the raw step. After an error the reader stays broken: what
    /// follows a bad frame cannot be trusted to be framed.
    pub fn next_message(&mut self) -> Option<Result<FromSandbox, String>> {
        if self.broken {
            return None;
        }
        let result = self.decode()?;
        if result.is_err() {
            self.broken = true;
            self.buf = Vec::new();
        }
        Some(result)
    }

    fn decode(&mut self) -> Option<Result<FromSandbox, String>> {
        match *self.buf.first()? {
            TAG_RAW_ERROR if self.buf.len() >= 6 => {
                let number = self.buf[1];
                let errno =
                    i32::from_le_bytes([self.buf[2], self.buf[3], self.buf[4], self.buf[5]]);
                self.buf.drain(..6);
                let Some(&step) = Step::RAW.get(usize::from(number)) else {
                    return Some(Err(format!(
                        "raw error frame names step {number}, which does not exist"
                    )));
                };
                let context = match (step, errno) {
                    (Step::CreateNetworkNamespace, libc::ENOSPC | libc::EUSERS) => format!(
                        "{} (a namespace limit was reached: see /proc/sys/user/max_net_namespaces)",
                        step.detail()
                    ),
                    _ => step.detail().into(),
                };
                Some(Ok(FromSandbox::SetupFailed {
                    id: None,
                    error: SetupError {
                        step,
                        errno: Some(errno),
                        context,
                        cause: None,
                    },
                }))
            }
            TAG_MESSAGE if self.buf.len() >= 5 => {
                let len = u32::from_le_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if len > MAX_FRAME {
                    return Some(Err(format!(
                        "the sandbox sent a frame of {len} bytes, over the protocol's {MAX_FRAME}"
                    )));
                }
                if self.buf.len() < 5 + len {
                    return None;
                }
                let message = serde_json::from_slice(&self.buf[5..5 + len])
                    .map_err(|e| format!("the sandbox sent a message that does not decode: {e}"));
                self.buf.drain(..5 + len);
                Some(message)
            }
            TAG_FILE => self.decode_file(),
            TAG_RAW_ERROR | TAG_MESSAGE => None,
            other => Some(Err(format!(
                "unexpected frame tag {other:#x} from the sandbox"
            ))),
        }
    }

    /// A [`TAG_FILE`] frame, once all of it is here.
    fn decode_file(&mut self) -> Option<Result<FromSandbox, String>> {
        let buf = &self.buf;
        if buf.len() < 4 {
            return None;
        }
        let kind = buf[1];
        let path_len = usize::from(u16::from_le_bytes([buf[2], buf[3]]));
        let data_at = 4 + path_len + 4;
        if buf.len() < data_at {
            return None;
        }
        let len_bytes = [
            buf[data_at - 4],
            buf[data_at - 3],
            buf[data_at - 2],
            buf[data_at - 1],
        ];
        let len = u32::from_le_bytes(len_bytes) as usize;
        if len > MAX_FRAME {
            return Some(Err(format!(
                "the sandbox sent a file of {len} bytes, over the protocol's {MAX_FRAME}"
            )));
        }
        if buf.len() < data_at + len {
            // Room for the whole frame at once, not by doublings.
            let missing = data_at + len - buf.len();
            self.buf.reserve(missing);
            return None;
        }
        let Ok(path) = std::str::from_utf8(&buf[4..4 + path_len]).map(str::to_string) else {
            return Some(Err("the sandbox sent a file name that is not UTF-8".into()));
        };
        let data = if 2 * (data_at + len) >= buf.len() && len >= 64 * 1024 {
            // A large file that fills the buffer: the buffer becomes the data (the header
            // shifted out), rather than a copy of megabytes.
            let rest = self.buf.split_off(data_at + len);
            let mut data = std::mem::replace(&mut self.buf, rest);
            data.drain(..data_at);
            data
        } else {
            let data = buf[data_at..data_at + len].to_vec();
            self.buf.drain(..data_at + len);
            data
        };
        match kind {
            FILE_OUTPUT => Some(Ok(FromSandbox::OutputFile { path, data })),
            FILE_DATA => Some(Ok(FromSandbox::FileData { data })),
            other => Some(Err(format!("a file frame of unknown kind {other}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_frames_carry_bytes_as_they_are_and_json_cannot_claim_a_file() {
        let data: Vec<u8> = (0..=255).cycle().take(100_000).collect();
        let mut wire = Vec::new();
        write_file_frame(&mut wire, FILE_OUTPUT, "plots/a.png", &data).unwrap();
        write_file_frame(&mut wire, FILE_DATA, "", b"x").unwrap();
        assert_eq!(wire.len(), 4 + 11 + 4 + data.len() + 4 + 4 + 1);
        let mut reader = FrameReader::default();
        let mut got = Vec::new();
        for piece in wire.chunks(7) {
            reader.feed(piece);
            while let Some(message) = reader.next_message() {
                got.push(message.unwrap());
            }
        }
        assert_eq!(
            got,
            [
                FromSandbox::OutputFile {
                    path: "plots/a.png".into(),
                    data
                },
                FromSandbox::FileData {
                    data: b"x".to_vec()
                },
            ]
        );
        // The variants do not exist as JSON.
        let json = br#"{"OutputFile":{"path":"x","data":"eA=="}}"#;
        let mut frame = vec![TAG_MESSAGE];
        frame.extend_from_slice(&(json.len() as u32).to_le_bytes());
        frame.extend_from_slice(json);
        let mut reader = FrameReader::default();
        reader.feed(&frame);
        assert!(reader.next_message().unwrap().is_err());
        // An unknown kind, and a size over the cap, are protocol errors.
        let mut reader = FrameReader::default();
        reader.feed(&[TAG_FILE, 9, 0, 0, 0, 0, 0, 0]);
        assert!(reader.next_message().unwrap().is_err());
        let mut reader = FrameReader::default();
        reader.feed(&[TAG_FILE, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        assert!(reader.next_message().unwrap().is_err());
    }

    #[test]
    fn frames_reassemble_across_partial_reads() {
        let mut wire = Vec::new();
        write_message(
            &mut wire,
            &FromSandbox::Exited {
                id: 0,
                code: Some(3),
                signal: None,
            },
            MAX_FRAME,
        )
        .unwrap();
        wire.extend_from_slice(&raw_error_frame(Step::ExecInit, libc::ENOENT));
        let mut reader = FrameReader::default();
        let mut messages = Vec::new();
        for byte in wire {
            reader.feed(&[byte]);
            while let Some(r) = reader.next_message() {
                messages.push(r.unwrap());
            }
        }
        assert_eq!(
            messages[0],
            FromSandbox::Exited {
                id: 0,
                code: Some(3),
                signal: None
            }
        );
        let FromSandbox::SetupFailed { error: err, .. } = &messages[1] else {
            panic!("{messages:?}")
        };
        assert_eq!(err.step, Step::ExecInit);
        assert_eq!(err.errno, Some(libc::ENOENT));
        assert!(
            err.to_string().contains("exec_init") && err.to_string().contains("ENOENT"),
            "{err}"
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_hang_and_nothing_after_it_is_trusted() {
        let mut reader = FrameReader::default();
        reader.feed(b"xyz");
        assert!(reader.next_message().unwrap().is_err());
        let mut wire = Vec::new();
        let exited = FromSandbox::Exited {
            id: 0,
            code: Some(0),
            signal: None,
        };
        write_message(&mut wire, &exited, MAX_FRAME).unwrap();
        reader.feed(&wire);
        assert!(reader.next_message().is_none());
    }

    #[test]
    fn oversized_frames_and_unknown_steps_are_refused() {
        let mut reader = FrameReader::default();
        let mut frame = vec![TAG_MESSAGE];
        frame.extend_from_slice(&(MAX_FRAME as u32 + 1).to_le_bytes());
        reader.feed(&frame);
        assert!(reader.next_message().unwrap().unwrap_err().contains("over"));
        let mut reader = FrameReader::default();
        reader.feed(&[TAG_RAW_ERROR, 200, 1, 0, 0, 0]);
        assert!(reader.next_message().unwrap().unwrap_err().contains("200"));
        let bad = br#"{"SetupFailed":{"id":null,"error":{"step":"rm_rf","errno":1,"context":"","cause":null}}}"#;
        let mut reader = FrameReader::default();
        let mut frame = vec![TAG_MESSAGE];
        frame.extend_from_slice(&(bad.len() as u32).to_le_bytes());
        frame.extend_from_slice(bad);
        reader.feed(&frame);
        assert!(reader
            .next_message()
            .unwrap()
            .unwrap_err()
            .contains("rm_rf"));
    }

    #[test]
    fn steps_have_unique_names_and_raw_numbers_are_their_positions() {
        let mut names = std::collections::BTreeSet::new();
        for step in Step::ALL {
            assert!(names.insert(step.name()), "{step} twice");
            assert!(!step.detail().is_empty());
        }
        for (i, step) in Step::RAW.iter().enumerate() {
            assert_eq!(usize::from(step.raw_number()), i);
        }
    }

    #[test]
    fn messages_round_trip() {
        let mut wire = Vec::new();
        let msg = FromSandbox::SetupFailed {
            id: None,
            error: SetupError::errno(Step::MountProc, nix::errno::Errno::EPERM, "d"),
        };
        write_message(&mut wire, &msg, MAX_FRAME).unwrap();
        let back: FromSandbox = read_message(&mut wire.as_slice(), MAX_FRAME).unwrap();
        assert_eq!(back, msg);
    }

    #[test]
    fn a_crate_error_carries_the_errno_of_its_io_source() {
        #[derive(Debug, thiserror::Error)]
        #[error("wrapped")]
        struct Wrapped(#[source] io::Error);
        let e = Wrapped(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        let s = SetupError::from_error(Step::RestrictWithLandlock, &e, "ctx");
        assert_eq!(s.errno, Some(libc::EOPNOTSUPP));
        assert_eq!(s.cause.as_deref(), Some("wrapped"));
    }
}
