//! Creating the sandbox process: clone3 into new namespaces, the allocation-free child that
//! waits for "go" and execs the init, and the parent's half of the handshake (id maps, go,
//! the SandboxSpec).
//!
//! clone3 runs on one long-lived thread of the process (the spawner): the init's
//! parent-death signal fires when the thread that cloned it exits, not the process, and a
//! sandbox that lives for a session must not die with the caller's thread (a tokio
//! blocking thread retires after ten idle seconds). The spawner thread lives as long as the
//! process, so every sandbox still dies with its launcher. A process whose sandboxes are all
//! started from one thread that outlives them (the CLI's `codecage run`, from its main
//! thread) says so with [`clone_on_calling_thread`] and spares that thread's creation.

use std::ffi::{c_char, CStr, CString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

use nix::fcntl::{open, OFlag};
use nix::sched::CloneFlags;
use nix::sys::stat::Mode;
use nix::unistd::Pid;

use crate::cgroup::RunCgroup;
use crate::ids::Slot;
use crate::protocol::{self, raw_error_frame, Step, Tmpfs, TmpfsOwner, CHANNEL_FD, GO, INIT_ARG_C};
use crate::spec::SandboxSpec;
use crate::sys::{self, ChildStack};

/// A sandbox whose init is running (or has already failed), as the launcher holds it.
pub struct Started {
    pub pid: Pid,
    pub pidfd: OwnedFd,
    pub channel: UnixStream,
    /// The host id slot, held for the sandbox's life.
    pub slot: Slot,
    /// When "go" was sent (CLOCK_MONOTONIC ns), for `Outcome.phases`.
    pub go_ns: u64,
    /// The queue of the sandbox's link to its gateway (network modes other than `none`).
    pub tun: Option<OwnedFd>,
    /// A copy of /work's tmpfs (its root), kept for `crate::workdir`; with the host id
    /// of the sandbox's root.
    pub work: Option<(OwnedFd, u32)>,
    /// The memory the raw child ran on before its exec, for the sandbox to keep until its
    /// init is reaped.
    pub raw_child: RawChild,
}

/// The fds the raw child puts on 0..=3, and the init binary it execs.
struct ChildFds {
    devnull: OwnedFd,
    channel: OwnedFd,
    exe: OwnedFd,
}

/// What the raw child needs, as raw fds and C strings made before clone3, so that the
/// child does not allocate. The child reads it in the launcher's own memory (see
/// [`sys::RAW_CHILD_SHARES_MEMORY`]), so it stays put and unchanged until the child has
/// exec'd: [`RawChild`] holds it for the sandbox's life.
struct ChildPlan {
    devnull: RawFd,
    channel: RawFd,
    exe: RawFd,
    argv: [*const c_char; 3],
    envp: [*const c_char; 1],
    /// The run's v1 `tasks` files, to write "0" into (at most one per controller).
    cgroup_tasks: [*const c_char; MAX_V1_HIERARCHIES],
    cgroup_tasks_len: usize,
    /// The strings `cgroup_tasks` points into (on the heap: they do not move with the plan).
    _tasks: Vec<CString>,
    /// The child makes its network namespace itself, first thing, while the launcher makes
    /// the tmpfs file systems and writes the id maps: a new network namespace is the
    /// largest part of clone3's time (about 0.45 ms), and done by the child it no longer
    /// delays the launcher's own work. Not when the launcher needs the namespace before
    /// "go" (the gateway's link is made in it): clone3 makes it then.
    unshare_net: bool,
}

// SAFETY: the plan's pointers point into its own `_tasks` (heap buffers that live as long
// as the plan) and into 'static C strings; nothing writes through them. Sending the plan
// to the spawner thread, or sharing it, cannot create a dangling or a racy access.
unsafe impl Send for ChildPlan {}
// SAFETY: as above; the plan is never changed after it is made.
unsafe impl Sync for ChildPlan {}

/// The raw child's plan and stack, kept alive until the child can no longer use them. A
/// sandbox drops it after its init is reaped; should it be dropped while the child might
/// still be before its exec (it should not: every failure path reaps the child first),
/// both are leaked rather than freed under it.
pub struct RawChild {
    plan: Arc<ChildPlan>,
    stack: Arc<ChildStack>,
}

impl Drop for RawChild {
    fn drop(&mut self) {
        if !self.stack.released() {
            std::mem::forget(Arc::clone(&self.plan));
            std::mem::forget(Arc::clone(&self.stack));
        }
    }
}

/// What the spawner thread is asked to clone: owned, so it can cross threads.
struct CloneJob {
    plan: Arc<ChildPlan>,
    stack: Arc<ChildStack>,
    target: Option<RawFd>,
    owner: u32,
}

/// The v1 hierarchies a run joins at most: memory, cpu, cpuacct, pids (fewer where the
/// host co-mounts them).
const MAX_V1_HIERARCHIES: usize = 4;
/// Where fds the child must move out of 0..=3 go.
const FIRST_FREE_FD: RawFd = 10;
const ARGV0: &CStr = c"codecage";

/// The namespaces clone3 makes: every one but the cgroup namespace, which the init enters
/// itself once it sits in its own cgroup (created at clone time on a v1 host, its root would
/// be the launcher's cgroup), and, unless `with_net`, the network namespace, which the raw
/// child then makes itself (see [`ChildPlan::unshare_net`]).
fn namespaces(with_net: bool) -> u64 {
    let mut flags = CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS;
    if with_net {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    flags.bits() as u64
}

/// Clones the sandbox's init into new namespaces (and into its cgroup), writes its id maps,
/// sends it "go" and the spec, fills its tmpfs file systems and sends them. Returns once the init is on its way; setup errors from
/// inside arrive later on the channel.
pub fn start(
    spec: &SandboxSpec,
    mut cgroup: Option<&mut RunCgroup>,
    volumes: Vec<OwnedFd>,
) -> Result<Started, String> {
    let layout = crate::cgroup::layout();
    // clone3 makes the network namespace when the launcher needs it before "go" (the
    // gateway's link is made in it), and on v2, where the child is born into the run's
    // cgroup: made there, the namespace's kernel memory and CPU would be charged to the
    // run's limits (a small cpu.max would throttle the start; a memory charge that met
    // memory.max would OOM-kill the child, and with it every process sharing its memory:
    // the launcher). On v1 and hybrid hosts the child sits in the launcher's cgroups until
    // it joins its own after "go", as clone3's work did.
    let unshare_net =
        !spec.network.mode.has_gateway() && !cgroup.as_deref().is_some_and(|c| c.is_v2());
    let mut finished = cgroup.is_none();
    if let (false, true, Some(cgroup)) = (
        finished,
        FINISH_FIRST.load(Ordering::Relaxed),
        cgroup.as_deref_mut(),
    ) {
        // A run of this process had to clone twice (below): finish before the clone.
        finished = true;
        cgroup.finish(layout).map_err(|e| e.to_string())?;
    }
    // The v1 `tasks` files the child joins after "go": named now, made after the clone.
    let mut tasks = cgroup
        .as_deref()
        .map(|c| c.planned_v1_tasks_files(layout))
        .unwrap_or_default();
    let (mut started, born_inside, owner) = loop {
        let slot = Slot::take()?;
        let (child, channel) = open_fds(spec)?;
        // The sandbox's root uid owns its user namespace (see IdMapping).
        let owner = spec.ids.host_root(slot.number());
        let raw_child = RawChild {
            plan: Arc::new(ChildPlan::new(&child, v1_tasks_paths(&tasks), unshare_net)),
            stack: Arc::new(
                ChildStack::new()
                    .map_err(|e| format!("cannot map the sandbox child's stack: {e}"))?,
            ),
        };
        let job = CloneJob {
            plan: Arc::clone(&raw_child.plan),
            stack: Arc::clone(&raw_child.stack),
            target: cgroup
                .as_deref()
                .and_then(|c| c.clone_target())
                .map(|fd| fd.as_raw_fd()),
            owner,
        };
        let (pid, pidfd, born_inside) = on_spawner_thread(job)?;
        // The parent's copies of the child's ends go now, or it would never see EOF.
        drop(child);
        let started = Started {
            pid,
            pidfd,
            channel,
            slot,
            go_ns: 0,
            tun: None,
            work: None,
            raw_child,
        };
        // The run's v1 cgroups now, while the child makes its network namespace.
        if let (false, Some(cgroup)) = (finished, cgroup.as_deref_mut()) {
            finished = true;
            if let Err(e) = cgroup.finish(layout) {
                abort(&started);
                return Err(e.to_string());
            }
            let made = cgroup.v1_tasks_files();
            if made != tasks {
                // A best-effort run skipped a hierarchy the child was told to join: clone
                // it again, told what exists; and the process's later runs finish their
                // cgroups first, not cloning twice each where a hierarchy always fails.
                abort(&started);
                FINISH_FIRST.store(true, Ordering::Relaxed);
                tasks = made;
                continue;
            }
        }
        break (started, born_inside, owner);
    };
    // The tmpfs file systems after the clone too.
    let tmpfs = match make_tmpfs(spec, owner) {
        Ok(tmpfs) => tmpfs,
        Err(message) => {
            abort(&started);
            return Err(message);
        }
    };
    started.work = Tmpfs::plan(spec)
        .iter()
        .position(|fs| *fs == Tmpfs::Work)
        .and_then(|at| tmpfs.get(at))
        .and_then(|fd| fd.try_clone().ok())
        .map(|fd| (fd, owner));
    // In its cgroups before it may run: its limits hold from its first instruction, and its
    // cgroup namespace (created after "go") is rooted at its own cgroup.
    if let Some(cgroup) = cgroup {
        if let Err(e) = cgroup.attach(started.pid.as_raw() as u32, born_inside, owner) {
            abort(&started);
            return Err(e.to_string());
        }
    }
    // The link exists before "go": the init configures it while it builds the sandbox.
    if spec.network.mode.has_gateway() {
        // In the child's own namespace: clone3 made it (an unsharing child might not have
        // yet, and setns would find the launcher's).
        debug_assert!(!started.raw_child.plan.unshare_net);
        match super::link::create_tun(started.pidfd.as_fd()) {
            Ok(tun) => started.tun = Some(tun),
            Err(message) => {
                abort(&started);
                return Err(message);
            }
        }
    }
    let filesystems = tmpfs.len();
    let mounts: Vec<OwnedFd> = tmpfs.into_iter().chain(volumes).collect();
    if let Err(message) = handshake(spec, &mut started, &mounts, filesystems, owner) {
        abort(&started);
        return Err(message);
    }
    Ok(started)
}

/// The init binary, /dev/null for its stdio, and the channel, all CLOEXEC, none of the
/// child's in 0..=3 (where it dup2s them).
fn open_fds(spec: &SandboxSpec) -> Result<(ChildFds, UnixStream), String> {
    let exe = open(
        &spec.init_exe,
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        format!(
            "cannot open the sandbox init binary {}: {e}",
            spec.init_exe.display()
        )
    })?;
    let devnull = open("/dev/null", OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| format!("cannot open /dev/null for the init's stdio: {e}"))?;
    let (channel, channel_child) =
        UnixStream::pair().map_err(|e| format!("cannot create the sandbox channel: {e}"))?;
    // What the init may have in flight towards the launcher: the default (208 KiB) makes a
    // 5 MiB output file cost some 25 wakeups of the launcher's poll loop. Bounded and
    // small (the launcher reads the channel all the time); FORCE because the host's
    // wmem_max may be lower. Best effort: only the speed depends on it.
    let _ = nix::sys::socket::setsockopt(
        &channel_child,
        nix::sys::socket::sockopt::SndBufForce,
        &(1 << 20),
    );
    let child = ChildFds {
        devnull: above_stdio(devnull)?,
        channel: above_stdio(OwnedFd::from(channel_child))?,
        exe: above_stdio(exe)?,
    };
    Ok((child, channel))
}

/// The run's v1 `tasks` files as C strings, for the raw child.
fn v1_tasks_paths(tasks: &[PathBuf]) -> Vec<CString> {
    tasks
        .iter()
        .filter_map(|p| CString::new(p.as_os_str().as_bytes()).ok())
        .take(MAX_V1_HIERARCHIES)
        .collect()
}

/// Set once a best-effort run skipped a v1 hierarchy after its clone: this process's runs
/// then make their v1 cgroups before the clone (see [`start`]).
static FINISH_FIRST: AtomicBool = AtomicBool::new(false);

/// Set by [`clone_on_calling_thread`].
static CALLER_CLONES: AtomicBool = AtomicBool::new(false);

/// From now on this process clones its sandboxes on the thread that starts them, not on the
/// spawner thread. Only for a caller whose starting thread outlives every sandbox it starts
/// (the main thread of a process that exits once its runs are done): each init's
/// parent-death signal is tied to that thread.
pub fn clone_on_calling_thread() {
    CALLER_CLONES.store(true, Ordering::Relaxed);
}

/// Runs the clone on the spawner thread (or the calling one, see [`clone_on_calling_thread`])
/// and waits for it.
fn on_spawner_thread(job: CloneJob) -> Result<(Pid, OwnedFd, bool), String> {
    if CALLER_CLONES.load(Ordering::Relaxed) {
        return clone_child(&job);
    }
    type Reply = mpsc::SyncSender<Result<(Pid, OwnedFd, bool), String>>;
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<(CloneJob, Reply)>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, incoming) = mpsc::channel::<(CloneJob, Reply)>();
        std::thread::Builder::new()
            .name("codecage-spawner".into())
            .spawn(move || {
                for (job, reply) in incoming {
                    let _ = reply.send(clone_child(&job));
                }
            })
            .expect("starting the spawner thread");
        Mutex::new(jobs)
    });
    let (reply, answer) = mpsc::sync_channel(1);
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((job, reply))
        .map_err(|_| "the spawner thread is gone".to_string())?;
    answer
        .recv()
        .map_err(|_| "the spawner thread is gone".to_string())?
}

impl ChildPlan {
    fn new(fds: &ChildFds, tasks: Vec<CString>, unshare_net: bool) -> ChildPlan {
        let mut cgroup_tasks = [std::ptr::null(); MAX_V1_HIERARCHIES];
        for (slot, path) in cgroup_tasks.iter_mut().zip(&tasks) {
            *slot = path.as_ptr();
        }
        ChildPlan {
            devnull: fds.devnull.as_raw_fd(),
            channel: fds.channel.as_raw_fd(),
            exe: fds.exe.as_raw_fd(),
            argv: [ARGV0.as_ptr(), INIT_ARG_C.as_ptr(), std::ptr::null()],
            envp: [std::ptr::null()],
            cgroup_tasks,
            cgroup_tasks_len: tasks.len().min(MAX_V1_HIERARCHIES),
            _tasks: tasks,
            unshare_net,
        }
    }
}

/// clone3 into the namespaces (and, on v2 and hybrid hosts, into the run's unified cgroup),
/// with this thread's euid set to the owner so the sandbox's root owns the user namespace.
/// In the child, runs [`child_pre_exec`]. Returns the pid, a pidfd, and whether the child
/// was born in its cgroup.
fn clone_child(job: &CloneJob) -> Result<(Pid, OwnedFd, bool), String> {
    let flags = namespaces(!job.plan.unshare_net) | sys::CLONE_CLEAR_SIGHAND;
    let plan = Arc::as_ptr(&job.plan) as usize;
    let clone = |target: Option<RawFd>| {
        // SAFETY: the child runs only `child_entry`, whose `child_pre_exec` makes the raw
        // calls of `sys` on the plan and ends in execveat or _exit. The plan and the stack
        // live in `start`'s RawChild until the child has released them.
        unsafe {
            sys::with_thread_euid(job.owner, || {
                sys::clone3_raw_child(flags, target, &job.stack, child_entry, plan)
            })
        }
        .and_then(|r| r)
    };
    // No file of another sandbox's tmpfs open for writing may be copied into the child.
    let _quiet = super::fill::WRITING
        .write()
        .unwrap_or_else(|e| e.into_inner());
    let mut born_inside = job.target.is_some();
    let mut forked = clone(job.target);
    if born_inside
        && forked
            .as_ref()
            .is_err_and(|e| matches!(e.raw_os_error(), Some(libc::E2BIG | libc::EINVAL)))
    {
        // A kernel before 5.7 knows no CLONE_INTO_CGROUP: clone, then attach by pid.
        born_inside = false;
        forked = clone(None);
    }
    let (pid, pidfd) = forked.map_err(|e| clone_error(&e))?;
    Ok((pid, pidfd, born_inside))
}

/// The raw child's first frame: `plan` is the address of its [`ChildPlan`].
extern "C" fn child_entry(plan: usize) -> ! {
    // SAFETY: `clone_child` passes the address of the plan in an Arc that `start` keeps
    // (in the sandbox's RawChild) until the child no longer uses it; nothing changes it.
    child_pre_exec(unsafe { &*(plan as *const ChildPlan) })
}

/// The sandbox's tmpfs file systems, made here in the host's user namespace and owned
/// inside by the ids their plan names (see [`Tmpfs`]): `root` is the sandbox root's host
/// uid, the sandbox user's the next.
fn make_tmpfs(spec: &SandboxSpec, root: u32) -> Result<Vec<OwnedFd>, String> {
    Tmpfs::plan(spec)
        .into_iter()
        .map(|fs| {
            let made = fs.spec(spec);
            let mut attrs = sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
            if made.noexec {
                attrs |= sys::MOUNT_ATTR_NOEXEC;
            }
            let owner = match made.owner {
                TmpfsOwner::Root => root,
                TmpfsOwner::User => root + 1,
            };
            sys::detached_tmpfs(&made.options, attrs, (owner, owner))
                .map_err(|e| format!("cannot make the sandbox's tmpfs ({fs:?}): {e}"))
        })
        .collect()
}

/// Writes the id maps, then "go" and the spec, then sends the mounts: the first
/// `filesystems` of them are the tmpfs file systems, which the launcher fills first
/// (super::fill) while the child executes the init. `root` is the sandbox root's host id.
/// A failure to send means the child already died; its raw error frame is waiting on the
/// channel, so that is not an error here.
fn handshake(
    spec: &SandboxSpec,
    started: &mut Started,
    mounts: &[OwnedFd],
    filesystems: usize,
    root: u32,
) -> Result<(), String> {
    let pid = started.pid.as_raw() as u32;
    let lines = spec.ids.map_lines(started.slot.number());
    // As root in the parent namespace we may write a map with several lines and need not
    // deny setgroups (user_namespaces(7)); the payload drops its supplementary groups itself.
    for file in ["uid_map", "gid_map"] {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, &lines).map_err(|e| {
            format!(
                "cannot write {path} (mapping sandbox ids to unprivileged host ids {lines:?}): {e}"
            )
        })?;
    }
    let mut frame = vec![GO];
    protocol::write_message(&mut frame, spec, protocol::MAX_SPEC_FRAME)
        .map_err(|e| format!("cannot encode the spec: {e}"))?;
    started.go_ns = crate::sys::monotonic_ns();
    if protocol::send_with_fds(&started.channel, &frame, &[]).is_ok() {
        super::fill::fill(spec, &mounts[..filesystems], root)?;
        // The tmpfs file systems and the volumes' mount trees, in a frame of their own: the
        // raw child reads "go" with a plain read, which would drop fds sent with it.
        let fds: Vec<RawFd> = mounts.iter().map(|fd| fd.as_raw_fd()).collect();
        let _ = protocol::send_with_fds(&started.channel, &[protocol::TAG_VOLUMES], &fds);
    }
    Ok(())
}

/// Kills and reaps a child whose handshake failed, so nothing is left behind.
fn abort(started: &Started) {
    let _ = sys::pidfd_send_signal(started.pidfd.as_fd(), libc::SIGKILL);
    let _ = sys::wait4(started.pid);
}

fn clone_error(e: &std::io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::EPERM) => {
            " (creating namespaces needs root or CAP_SYS_ADMIN; run codecage as root, or check \
             that user namespaces are not disabled by sysctl or an LSM)"
        }
        Some(libc::ENOSPC) | Some(libc::EUSERS) => {
            " (a namespace limit was reached: see /proc/sys/user/max_*_namespaces)"
        }
        Some(libc::ENOSYS) => " (clone3 needs Linux 5.3 or newer)",
        _ => "",
    };
    format!("cannot create the sandbox process (clone3 with new user, mount, pid, ipc and uts namespaces, and a network namespace where the gateway links to it): {e}{hint}")
}

/// Moves an fd to [`FIRST_FREE_FD`] or above (CLOEXEC) if it sits in 0..=3.
fn above_stdio(fd: OwnedFd) -> Result<OwnedFd, String> {
    if fd.as_raw_fd() > CHANNEL_FD {
        return Ok(fd);
    }
    sys::dup_above(fd.as_fd(), FIRST_FREE_FD)
        .map_err(|e| format!("cannot move an fd above stdio: {e}"))
}

/// The child between clone3 and the exec of the init. It runs in the memory of a process
/// that may have other threads (beside them, on a stack of its own; or in a copy of it,
/// without them, where the memory is not shared), so it only makes the raw calls of `sys`:
/// no allocation, no locks, no panics, no writes outside its stack. Each failure sends a
/// raw error frame naming the step and exits 125.
fn child_pre_exec(plan: &ChildPlan) -> ! {
    // Errors go to the channel where it is: its original fd until the dup2s, fd 3 after
    // (the original is marked close-on-exec with the rest).
    let report = |fd: RawFd, step: Step, errno: i32| -> ! {
        let _ = sys::child_write_all(fd, &raw_error_frame(step, errno));
        sys::exit_now(125)
    };
    let fail = |step: Step, errno: i32| -> ! { report(plan.channel, step, errno) };
    // The network namespace first, while the launcher makes the tmpfs file systems and the
    // id maps. A failure is reported after "go": the launcher writes the maps of a child
    // that is still alive, and so reads this step's error, not a failed map write.
    let net = match plan.unshare_net {
        true => sys::child_unshare_net(),
        false => Ok(()),
    };
    // Wait until the launcher has written our uid/gid maps.
    match sys::child_read_byte(plan.channel) {
        Ok(GO) => {}
        Ok(_) => fail(Step::WaitForGo, libc::EPROTO),
        Err(errno) => fail(Step::WaitForGo, errno),
    }
    if let Err(errno) = net {
        fail(Step::CreateNetworkNamespace, errno)
    }
    // Become the sandbox's root (an unprivileged host uid), so execve keeps the new user
    // namespace's capabilities, which the init needs for mounts.
    if let Err(errno) = sys::child_become_root() {
        fail(Step::EnterSandboxIds, errno)
    }
    // Into the run's v1 cgroups, by moving itself (cheap; see RunCgroup::attach), before
    // it execs anything.
    for &path in &plan.cgroup_tasks[..plan.cgroup_tasks_len] {
        if let Err(errno) = sys::child_join_cgroup(path) {
            fail(Step::JoinCgroups, errno)
        }
    }
    // Die with the launcher. After the id switch: a credential change clears the death
    // signal.
    if let Err(errno) = sys::child_set_pdeathsig() {
        fail(Step::SetParentDeathSignal, errno)
    }
    // /dev/null for the init's own stdio (each payload gets its own fds later), the
    // channel on fd 3.
    for (from, to) in [
        (plan.devnull, 0),
        (plan.devnull, 1),
        (plan.devnull, 2),
        (plan.channel, CHANNEL_FD),
    ] {
        if let Err(errno) = sys::child_dup2(from, to) {
            fail(Step::AttachStdio, errno)
        }
    }
    // Nothing else of the calling program survives the exec (CVE-2024-21626). The init
    // binary's fd was opened close-on-exec: execveat of an ELF file needs it only until
    // the exec.
    if let Err(errno) = sys::cloexec_from(CHANNEL_FD + 1) {
        report(CHANNEL_FD, Step::CloseInheritedFds, errno)
    }
    // A fresh, single-threaded codecage becomes pid 1.
    let errno = sys::child_execveat(plan.exe, plan.argv.as_ptr(), plan.envp.as_ptr());
    report(CHANNEL_FD, Step::ExecInit, errno)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_argument_matches_the_dispatcher() {
        assert_eq!(INIT_ARG_C.to_str().unwrap(), crate::protocol::INIT_ARG);
    }
}
