//! The raw system calls that nix does not wrap, and the allocation-free calls the launcher's
//! child makes between `clone3` and `execve`. Every `unsafe` block of the crate lives here,
//! each with the reason it is sound.
//!
//! Why raw calls at all: the library may be called from a multi-threaded program (the HTTP
//! server runs it on tokio). After `clone3` only the calling thread exists in the child, and
//! any lock another thread held (the allocator's, stdio's, glibc's setxid machinery) stays
//! locked forever. So the child runs nothing but the async-signal-safe calls below until it
//! execs a fresh, single-threaded codecage (codex's `linux-sandbox` solves the same problem
//! with a helper exec; maelstrom issue #48 is the deadlock it avoids).

use std::ffi::{c_char, c_int, CStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::unistd::Pid;

/// `CLONE_PIDFD`: the kernel stores a pidfd for the child in `clone_args.pidfd`.
pub const CLONE_PIDFD: u64 = 0x1000;
/// `CLONE_CLEAR_SIGHAND` (Linux 5.5): the child starts with default signal dispositions, so a
/// handler of the calling program never runs in the child before it execs. Defined here
/// because libc 0.2 declares it as an overflowing `c_int`, i.e. 0.
pub const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;
/// `CLONE_INTO_CGROUP` (Linux 5.7): the child is born inside the cgroup2 directory given by
/// `clone_args.cgroup`. Same libc problem as above.
pub const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` of clone3(2), version 2 (with `cgroup`). Our own definition because
/// libc's is missing on musl.
#[repr(C, align(8))]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `CLONE_VM`: the child shares the caller's memory until it execs (as vfork does).
const CLONE_VM: u64 = 0x100;
/// `CLONE_CHILD_CLEARTID`: when the child lets go of that memory (its execve, or its exit),
/// the kernel writes 0 at `clone_args.child_tid` and wakes a futex waiting there.
const CLONE_CHILD_CLEARTID: u64 = 0x0020_0000;

/// Whether [`clone3_raw_child`] shares the caller's memory with the child (CLONE_VM) on
/// this architecture. Where it does not, the child runs on a copy of the caller (fork-like),
/// which costs a copy of the caller's page tables, their teardown at the child's exec, and
/// a copy-on-write fault for every page either side writes in between.
pub const RAW_CHILD_SHARES_MEMORY: bool = cfg!(target_arch = "x86_64");

/// The first kernel on which a core dump kills only the dumping process's own thread group
/// (commit 0258b5fd7c71, "coredump: Limit coredumps to a single thread group"). Before it,
/// a child that dumped core (a fault, SIGQUIT from the terminal's ^\ reaching the CLI's
/// process group) would take every process sharing its memory along: the launcher, or the
/// server. So the memory is shared from 5.16 on only.
const SHARED_CHILD_KERNEL: (u32, u32) = (5, 16);

/// Whether this kernel lets a raw child share the launcher's memory safely (see
/// [`SHARED_CHILD_KERNEL`]); read once.
fn kernel_shares_child_memory() -> bool {
    static SHARES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SHARES.get_or_init(|| running_kernel().is_some_and(|v| v >= SHARED_CHILD_KERNEL))
}

/// The running kernel's `major.minor`, from uname(2).
pub fn running_kernel() -> Option<(u32, u32)> {
    // SAFETY: an all-zero utsname is a valid value of this plain C struct.
    let mut name: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uname writes into the struct we own, NUL-terminating each field.
    if unsafe { libc::uname(&mut name) } != 0 {
        return None;
    }
    // SAFETY: the kernel NUL-terminated `release` within its array.
    let release = unsafe { CStr::from_ptr(name.release.as_ptr()) };
    kernel_version(&release.to_string_lossy())
}

/// `5.10.0-32-amd64` -> (5, 10).
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The stack a raw child runs on (with a guard page below it), and the word the kernel
/// clears once the child no longer uses the caller's memory. The memory is unmapped on drop
/// only if the child let go of it (or never shared it); a child that might still run on it
/// makes the drop leak it instead: 68 KiB, on a path that should not happen.
pub struct ChildStack {
    /// The start of the mapping (the guard page), as an address: plain data, so the stack
    /// can cross to the spawner thread.
    base: usize,
    len: usize,
    /// 1 until the kernel clears it (CLONE_CHILD_CLEARTID). In a box of its own: the
    /// kernel keeps its address until the child execs or exits.
    released: Box<std::sync::atomic::AtomicU32>,
    /// Whether a child was cloned to run on it in the caller's memory (see
    /// [`clone3_raw_child`]: not on a kernel without CLONE_CLEAR_SIGHAND).
    shared: std::sync::atomic::AtomicBool,
}

/// The raw child's stack: its frames are small, and the largest buffer it holds is the
/// 4 KiB getdents64 buffer of [`cloexec_from`]'s fallback.
const CHILD_STACK_SIZE: usize = 64 * 1024;
const PAGE: usize = 4096;

impl ChildStack {
    pub fn new() -> io::Result<ChildStack> {
        let len = CHILD_STACK_SIZE + PAGE;
        // SAFETY: a new private anonymous mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the lowest page of the mapping just made: a stack overflow in the child
        // faults there (killing only the child) instead of running into other memory.
        if unsafe { libc::mprotect(base, PAGE, libc::PROT_NONE) } != 0 {
            let err = io::Error::last_os_error();
            // SAFETY: unmapping the mapping made above, which nothing else uses.
            unsafe { libc::munmap(base, len) };
            return Err(err);
        }
        Ok(ChildStack {
            base: base as usize,
            len,
            released: Box::new(std::sync::atomic::AtomicU32::new(1)),
            shared: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Whether the child no longer runs on this stack or reads the caller's memory: it
    /// exec'd or exited (or never shared the memory).
    pub fn released(&self) -> bool {
        use std::sync::atomic::Ordering;
        !self.shared.load(Ordering::Acquire) || self.released.load(Ordering::Acquire) == 0
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        if !self.released() {
            // The child may still be running on it: leaking is the only sound choice.
            let released = std::mem::replace(&mut self.released, Box::new(0.into()));
            std::mem::forget(released);
            return;
        }
        // SAFETY: the mapping made in `new`, used by no one now (see `released`).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// clone3(2) of a raw child with no exit signal and a pidfd (`CLONE_PIDFD`), which runs
/// `entry(arg)` and must end in an exec or [`exit_now`]. Where
/// [`RAW_CHILD_SHARES_MEMORY`], it runs on `stack` in the caller's memory (CLONE_VM, as
/// posix_spawn's vfork does, without stopping the caller), else on a copy of the caller's
/// memory. `CLONE_CLEAR_SIGHAND` is dropped and retried once if the kernel rejects it
/// (before 5.5), and with it the shared memory: a handler of the caller's that ran in the
/// child (a ^C reaches its process group) must not run on the caller's own memory. Returns
/// the child's pid and pidfd; only the caller returns.
///
/// # Safety
///
/// `entry` runs in a process whose other threads are gone (and, sharing memory, beside the
/// caller's threads, which go on running). Until it execs it may only make the raw calls
/// of this module (`child_*`, [`cloexec_from`], [`exit_now`]): no allocation, no locks, no
/// panics, no writes to memory other than its own stack. Everything `arg` points to must
/// stay alive and unchanged until `stack` says it is released, and so must `stack`.
pub unsafe fn clone3_raw_child(
    flags: u64,
    cgroup_fd: Option<RawFd>,
    stack: &ChildStack,
    entry: extern "C" fn(usize) -> !,
    arg: usize,
) -> io::Result<(Pid, OwnedFd)> {
    let mut flags = flags | CLONE_PIDFD;
    if cgroup_fd.is_some() {
        flags |= CLONE_INTO_CGROUP;
    }
    let mut share = RAW_CHILD_SHARES_MEMORY && kernel_shares_child_memory();
    loop {
        if share {
            flags |= CLONE_VM | CLONE_CHILD_CLEARTID;
        } else {
            flags &= !(CLONE_VM | CLONE_CHILD_CLEARTID);
        }
        let mut pidfd: c_int = -1;
        stack
            .released
            .store(1, std::sync::atomic::Ordering::Release);
        let mut args = CloneArgs {
            flags,
            pidfd: &mut pidfd as *mut c_int as u64,
            // No exit signal: a caller that ignores SIGCHLD would otherwise have the kernel
            // reap the child before we can wait4 it; the pidfd tells us when it exits.
            exit_signal: 0,
            cgroup: cgroup_fd.map_or(0, |fd| fd as u64),
            ..CloneArgs::default()
        };
        if RAW_CHILD_SHARES_MEMORY {
            // Shared or not, the child starts on this stack (its own copy of it if not).
            args.child_tid = stack.released.as_ptr() as u64;
            args.stack = (stack.base + PAGE) as u64;
            args.stack_size = CHILD_STACK_SIZE as u64;
        }
        // SAFETY: `args` is a valid, initialised clone_args of the size passed; `pidfd`
        // outlives the call; the stack and the cleared word outlive the child's use of
        // them (the caller's contract). The child runs only `entry` (the contract above).
        let ret = unsafe { clone3_then(&mut args, entry, arg) };
        if ret >= 0 {
            stack
                .shared
                .store(share, std::sync::atomic::Ordering::Release);
            // SAFETY: with CLONE_PIDFD the kernel stored a new, owned fd in `pidfd`.
            let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
            return Ok((Pid::from_raw(ret as i32), pidfd));
        }
        let errno = -ret as i32;
        if errno == libc::EINVAL && flags & CLONE_CLEAR_SIGHAND != 0 {
            flags &= !CLONE_CLEAR_SIGHAND;
            share = false;
            continue;
        }
        return Err(io::Error::from_raw_os_error(errno));
    }
}

/// The clone3 system call; in the child, `entry(arg)`, which never returns. Returns the
/// child's pid, or the negated errno.
///
/// On x86_64 the child starts on the stack given in `args` (the kernel sets rsp to its top,
/// 16-byte aligned), so the call to `entry` is made in assembly before any compiled code
/// could use the caller's stack frame; `entry` and `arg` ride in callee-saved registers,
/// which the child inherits.
///
/// # Safety
///
/// As for [`clone3_raw_child`]; `args` must be a valid clone_args.
#[cfg(target_arch = "x86_64")]
unsafe fn clone3_then(args: &mut CloneArgs, entry: extern "C" fn(usize) -> !, arg: usize) -> i64 {
    let ret: i64;
    // SAFETY: the syscall instruction with clone3's two arguments; rcx and r11 are
    // clobbered by it. In the parent (rax != 0) the block ends normally. In the child
    // (rax == 0) it calls `entry`, which never returns, on the stack the kernel set.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "mov rdi, r13",
            "call r12",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") args as *mut CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") entry,
            in("r13") arg,
            lateout("rcx") _,
            lateout("r11") _,
        );
    }
    ret
}

/// Elsewhere the child is fork-like: it returns from the system call on a copy of the
/// caller's stack and calls `entry` there.
///
/// # Safety
///
/// As for [`clone3_raw_child`]; `args` must be a valid clone_args without CLONE_VM.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn clone3_then(args: &mut CloneArgs, entry: extern "C" fn(usize) -> !, arg: usize) -> i64 {
    // SAFETY: clone3 with a valid clone_args and no stack: the child continues like fork(2).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match ret {
        0 => entry(arg),
        pid if pid > 0 => pid as i64,
        _ => -(Errno::last_raw() as i64),
    }
}

/// The inode of this process's pid namespace (/proc/self/ns/pid), read once: it tells
/// launchers in different pid namespaces (containers) apart.
pub fn pid_namespace() -> u64 {
    static INODE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *INODE.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
    })
}

/// The value of the extended attribute `name` of `path` (at most 64 bytes): systemd marks a
/// delegated cgroup with `trusted.delegate` (and `user.delegate`) set to "1".
pub fn get_xattr(path: &std::path::Path, name: &str) -> io::Result<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let name = std::ffi::CString::new(name)?;
    let mut value = [0u8; 64];
    // SAFETY: both strings are NUL-terminated and live across the call; the kernel writes
    // at most `value.len()` bytes into `value`, which is that long.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value[..n as usize].to_vec())
}

/// Sets the extended attribute `name` of `path` to `value` (as systemd does on a cgroup it
/// delegates; the delegation test plays systemd with it).
pub fn set_xattr(path: &std::path::Path, name: &str, value: &[u8]) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let name = std::ffi::CString::new(name)?;
    // SAFETY: both strings are NUL-terminated and live across the call; the kernel reads
    // `value.len()` bytes from `value`.
    let rc = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `clone` with this thread's effective uid set to `euid` and its capabilities kept
/// (SECBIT_NO_SETUID_FIXUP), then restores both. A user namespace is owned by the euid of
/// the thread that creates it, and the kernel charges per-user counts of everything in it
/// (inotify instances and watches, ...) to that owner: created as root, every sandbox
/// would draw on host root's quota. Raw syscalls, so only this thread changes (glibc's
/// setresuid would change every thread of the process).
///
/// # Safety
///
/// As for [`clone3`], which `clone` is expected to call: the child branch must not return
/// into code that relies on this thread's credentials being restored.
pub unsafe fn with_thread_euid<T>(euid: u32, clone: impl FnOnce() -> T) -> io::Result<T> {
    const NO_FIXUP: libc::c_ulong = libc::SECBIT_NO_SETUID_FIXUP as libc::c_ulong;
    // SAFETY: prctl with integer arguments only.
    let old = unsafe { libc::prctl(libc::PR_GET_SECUREBITS) };
    if old < 0 {
        return Err(io::Error::last_os_error());
    }
    let old = old as libc::c_ulong;
    // SAFETY: as above; needs CAP_SETPCAP, which root has.
    if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, old | NO_FIXUP) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let keep: libc::c_long = -1;
    // SAFETY: setresuid of the calling thread only, with integer arguments.
    if unsafe { libc::syscall(libc::SYS_setresuid, keep, euid as libc::c_long, keep) } < 0 {
        let err = io::Error::last_os_error();
        // SAFETY: restoring the bits read above.
        unsafe { libc::prctl(libc::PR_SET_SECUREBITS, old) };
        return Err(err);
    }
    let result = clone();
    // SAFETY: back to euid 0 (real and saved uid are still 0), then the old bits.
    unsafe {
        libc::syscall(libc::SYS_setresuid, keep, 0 as libc::c_long, keep);
        libc::prctl(libc::PR_SET_SECUREBITS, old);
    }
    Ok(result)
}

/// Gives the calling thread (only) the file-system credentials of `uid`: its supplementary
/// groups, then fsgid and fsuid. Raw syscalls, because glibc's setgroups changes every
/// thread of the process. The thread keeps these credentials until it exits.
pub fn become_fs_user(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    // SAFETY: the kernel reads `groups.len()` gids from a live slice.
    let ret = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: integer arguments only. setfs[ug]id returns the previous id and cannot report
    // failure itself; the read-back below checks it took.
    unsafe {
        libc::syscall(libc::SYS_setfsgid, gid);
        libc::syscall(libc::SYS_setfsuid, uid);
    }
    // SAFETY: -1 (an invalid id) only reads the current fsuid.
    let now = unsafe { libc::syscall(libc::SYS_setfsuid, u32::MAX) };
    if now != i64::from(uid) {
        return Err(io::Error::other(format!("could not switch to fsuid {uid}")));
    }
    Ok(())
}

/// pidfd_send_signal(2): signal the process behind a pidfd. Unlike kill(2) it cannot hit a
/// recycled pid.
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, signal: c_int) -> io::Result<()> {
    // SAFETY: plain syscall on a borrowed, open fd; a null siginfo is allowed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// F_DUPFD_CLOEXEC: a close-on-exec copy of `fd` numbered `min` or above.
pub fn dup_above(fd: BorrowedFd<'_>, min: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: plain fcntl on a borrowed, open fd.
    let raw = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fcntl just returned this new fd; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Takes the channel the launcher's child placed on `fd` before it exec'd us. Refuses an fd
/// that is not a socket (someone ran the internal init subcommand by hand).
pub fn take_inherited_socket(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fstat into a local; an invalid fd just fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(io::Error::other(format!(
            "fd {fd} is not the launcher's channel"
        )));
    }
    // dup2 cleared CLOEXEC on it; the payload must not inherit the channel.
    // SAFETY: fcntl with integer arguments on an open fd.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the fd is open, and by the launch protocol this process is its only user.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A new terminal from the devpts instance whose `ptmx` node is given (the sandbox's own):
/// its master (O_RDWR, O_NOCTTY, close-on-exec), unlocked, sized `rows` x `cols`, with
/// IUTF8 on (a backspace erases a whole UTF-8 character in canonical mode); and its slave,
/// opened through the master (TIOCGPTPEER, Linux 4.13: no path is looked up, so it is the
/// peer of this master and no other), O_NOCTTY and close-on-exec too.
pub fn open_pty(ptmx: &std::path::Path, rows: u16, cols: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::fcntl::OFlag;
    let master = nix::fcntl::open(
        ptmx,
        OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let unlock: c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int from the pointer, which points at a live local.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) } < 0 {
        return Err(io::Error::last_os_error());
    }
    set_window_size(master.as_fd(), rows, cols)?;
    // SAFETY: TIOCGPTPEER takes the open flags as an integer and returns a new fd.
    let slave = unsafe {
        libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if slave < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd; nothing else owns it.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    // SAFETY: a zeroed termios is a valid value to read into; tcgetattr fills it.
    let mut termios: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: tcgetattr and tcsetattr read and write the local termios through pointers
    // that are valid for the call.
    unsafe {
        if libc::tcgetattr(slave.as_raw_fd(), &mut termios) == 0 {
            termios.c_iflag |= libc::IUTF8;
            libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &termios);
        }
    }
    Ok((master, slave))
}

/// TIOCSWINSZ: a terminal's size, on its master or its slave. The kernel sends SIGWINCH
/// to the terminal's foreground process group when it changes.
pub fn set_window_size(fd: BorrowedFd<'_>, rows: u16, cols: u16) -> io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer, a live local.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &size) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// TIOCGWINSZ: a terminal's size (rows, columns); None if `fd` is not a terminal.
pub fn window_size(fd: BorrowedFd<'_>) -> Option<(u16, u16)> {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize through the pointer, a live local.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut size) } < 0 {
        return None;
    }
    (size.ws_row > 0 && size.ws_col > 0).then_some((size.ws_row, size.ws_col))
}

/// A terminal in raw mode (no echo, no line editing, no signals from ^C: every byte read
/// as typed) until this is dropped, which restores its settings as they were.
pub struct RawMode {
    fd: std::os::fd::RawFd,
    saved: libc::termios,
}

impl RawMode {
    /// `fd` must stay open while this lives (the CLI's stdin).
    pub fn enter(fd: BorrowedFd<'_>) -> io::Result<RawMode> {
        // SAFETY: a zeroed termios is a valid value to read into; tcgetattr fills it.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr writes one termios through the pointer, a live local.
        if unsafe { libc::tcgetattr(fd.as_raw_fd(), &mut saved) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut raw = saved;
        // SAFETY: cfmakeraw changes the local termios it is given.
        unsafe { libc::cfmakeraw(&mut raw) };
        // SAFETY: tcsetattr reads one termios through the pointer, a live local.
        if unsafe { libc::tcsetattr(fd.as_raw_fd(), libc::TCSANOW, &raw) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RawMode {
            fd: fd.as_raw_fd(),
            saved,
        })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: tcsetattr reads the saved termios, a live field; the fd is the caller's
        // stdin, open for the process's life.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}

/// TIOCGPTN: the number of the pty whose master `fd` is; fails on anything that is not a
/// pty master (how the launcher checks an fd the sandbox handed it).
pub fn pty_number(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut number: libc::c_uint = 0;
    // SAFETY: TIOCGPTN writes one unsigned int through the pointer, a live local.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGPTN, &mut number) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(number)
}

/// TIOCSCTTY: terminal `fd` becomes the controlling terminal of the caller, a session
/// leader without one (a payload right after its setsid).
pub fn set_controlling_terminal(fd: RawFd) -> nix::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument (0: do not steal it from another session).
    if unsafe { libc::ioctl(fd, libc::TIOCSCTTY, 0) } < 0 {
        return Err(Errno::last());
    }
    Ok(())
}

/// Which side of [`fork_in_init`] we are on.
pub enum ForkedInit {
    Child,
    Parent(Pid),
}

/// fork(2) for the sandbox's init.
pub fn fork_in_init() -> nix::Result<ForkedInit> {
    // SAFETY: only the init calls this, and the init is single-threaded (a fresh exec of
    // codecage that starts no threads), so the child may allocate and run normal code.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => Ok(ForkedInit::Child),
        nix::unistd::ForkResult::Parent { child } => Ok(ForkedInit::Parent(child)),
    }
}

/// Sets every signal's disposition back to SIG_DFL (SIGKILL and SIGSTOP cannot change).
pub fn reset_signal_dispositions() -> nix::Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for signal in Signal::iterator().filter(|s| !matches!(s, Signal::SIGKILL | Signal::SIGSTOP)) {
        // SAFETY: installing SIG_DFL runs none of our code in signal context.
        unsafe { sigaction(signal, &default) }?;
    }
    Ok(())
}

/// The kernel's landlock ABI version (landlock_create_ruleset with the VERSION flag), or
/// the errno: ENOSYS (not built in) or EOPNOTSUPP (not enabled at boot).
pub fn landlock_abi() -> Result<u32, i32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: a NULL attribute pointer with size 0 and the VERSION flag is the documented
    // way to ask for the ABI; nothing is written.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 {
        Err(Errno::last_raw())
    } else {
        Ok(ret as u32)
    }
}

/// CLOCK_MONOTONIC in nanoseconds. One clock for the launcher and the sandbox (no time
/// namespace), so timestamps from both sides compare.
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
    })
}

/// CLOCK_BOOTTIME in nanoseconds: the clock /proc/PID/stat counts start times in.
pub fn boottime_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).map_or(0, |t| {
        t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
    })
}

/// wait4(2): reap `pid` and return its raw wait status and resource usage. The usage covers
/// the process and every descendant it reaped, which for our pid-1 init is the whole sandbox.
pub fn wait4(pid: Pid) -> io::Result<(c_int, libc::rusage)> {
    let mut status: c_int = 0;
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: both out-pointers are valid for writes for the duration of the call.
        // __WALL: the child has no exit signal, which makes it a "clone" child to wait4.
        let ret = unsafe { libc::wait4(pid.as_raw(), &mut status, libc::__WALL, &mut usage) };
        if ret == pid.as_raw() {
            return Ok((status, usage));
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Brings the loopback interface of the current network namespace up (SIOCSIFFLAGS), which
/// a new network namespace starts with down.
pub fn loopback_up() -> io::Result<()> {
    interface_up("lo")
}

fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: ifreq is plain old data; all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = *src as c_char;
    }
    Ok(req)
}

fn inet_socket() -> io::Result<OwnedFd> {
    Ok(nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )?)
}

/// Sets interface `name` of the current network namespace up and running.
pub fn interface_up(name: &str) -> io::Result<()> {
    let sock = inet_socket()?;
    let mut req = ifreq(name)?;
    // SAFETY: the fd is open and `req` is a valid ifreq naming the interface; SIOCGIFFLAGS
    // fills the flags member of the union.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS succeeded, so the union holds ifru_flags.
    unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: as above; SIOCSIFFLAGS reads the flags member.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn sockaddr_in(addr: std::net::Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(addr).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size (16 bytes) and sockaddr has no
    // invalid bit patterns.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// Gives interface `name` an IPv4 address, netmask and MTU (SIOCSIFADDR, SIOCSIFNETMASK,
/// SIOCSIFMTU).
pub fn configure_interface(
    name: &str,
    addr: std::net::Ipv4Addr,
    netmask: std::net::Ipv4Addr,
    mtu: u16,
) -> io::Result<()> {
    let sock = inet_socket()?;
    let calls: [(libc::Ioctl, libc::ifreq); 3] = [
        (libc::SIOCSIFADDR, {
            let mut req = ifreq(name)?;
            req.ifr_ifru.ifru_addr = sockaddr_in(addr);
            req
        }),
        (libc::SIOCSIFNETMASK, {
            let mut req = ifreq(name)?;
            req.ifr_ifru.ifru_netmask = sockaddr_in(netmask);
            req
        }),
        (libc::SIOCSIFMTU, {
            let mut req = ifreq(name)?;
            req.ifr_ifru.ifru_mtu = c_int::from(mtu);
            req
        }),
    ];
    for (request, req) in calls {
        // SAFETY: the fd is open; `req` is a valid ifreq whose union member matches the
        // request (an address, a netmask, an MTU).
        if unsafe { libc::ioctl(sock.as_raw_fd(), request, &req) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Adds the default IPv4 route through interface `name` (SIOCADDRT, no gateway: the link is
/// point-to-point).
pub fn add_default_route(name: &str) -> io::Result<()> {
    let sock = inet_socket()?;
    let dev =
        std::ffi::CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: rtentry is plain old data; all-zero is valid.
    let mut route: libc::rtentry = unsafe { std::mem::zeroed() };
    route.rt_dst = sockaddr_in(std::net::Ipv4Addr::UNSPECIFIED);
    route.rt_genmask = sockaddr_in(std::net::Ipv4Addr::UNSPECIFIED);
    route.rt_gateway = sockaddr_in(std::net::Ipv4Addr::UNSPECIFIED);
    route.rt_flags = libc::RTF_UP;
    route.rt_dev = dev.as_ptr() as *mut c_char;
    // SAFETY: the fd is open, `route` is a valid rtentry and `dev` outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCADDRT, &route) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Attaches `tun` (an open /dev/net/tun) to a new layer-3 device `name` without packet
/// information headers (TUNSETIFF with IFF_TUN | IFF_NO_PI), in the network namespace the
/// fd was opened in.
pub fn tun_set_iff(tun: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    // TUNSETIFF = _IOW('T', 202, int)
    const TUNSETIFF: libc::Ioctl = 0x4004_54ca;
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: the fd is an open tun queue and `req` a valid ifreq with the name and flags.
    if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Installs a seccomp filter on the calling thread. The caller must have no_new_privs set.
pub fn seccomp_filter(program: &[libc::sock_filter]) -> io::Result<()> {
    install_seccomp_filter(program, 0).map(drop)
}

/// Installs a seccomp filter whose `SECCOMP_RET_USER_NOTIF` answers go to the returned
/// listener (`SECCOMP_FILTER_FLAG_NEW_LISTENER`, Linux 5.0). The caller must have
/// no_new_privs set.
pub fn seccomp_filter_with_listener(program: &[libc::sock_filter]) -> io::Result<OwnedFd> {
    let fd = install_seccomp_filter(program, libc::SECCOMP_FILTER_FLAG_NEW_LISTENER)?;
    // SAFETY: with NEW_LISTENER the kernel returned a new fd, which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn install_seccomp_filter(
    program: &[libc::sock_filter],
    flags: libc::c_ulong,
) -> io::Result<libc::c_long> {
    let prog = libc::sock_fprog {
        len: u16::try_from(program.len())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `prog` points at `program`, which outlives the call; the kernel copies the
    // instructions and writes nothing back.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            flags,
            &prog as *const libc::sock_fprog,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ret)
}

/// The next seccomp user notification of `listener` (SECCOMP_IOCTL_NOTIF_RECV). ENOENT: the
/// process that raised it is gone or was interrupted.
pub fn seccomp_notif_recv(listener: BorrowedFd<'_>) -> io::Result<libc::seccomp_notif> {
    // SAFETY: seccomp_notif is plain old data; the kernel requires it zeroed.
    let mut notif: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: the fd is a listener and `notif` is valid for writes of its size.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_RECV,
            &mut notif as *mut libc::seccomp_notif,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(notif)
}

/// Puts a copy of `fd` into the table of the process that raised notification `id`
/// (SECCOMP_IOCTL_NOTIF_ADDFD, Linux 5.9). Returns its number there.
pub fn seccomp_notif_addfd(
    listener: BorrowedFd<'_>,
    id: u64,
    fd: BorrowedFd<'_>,
    cloexec: bool,
) -> io::Result<RawFd> {
    let add = libc::seccomp_notif_addfd {
        id,
        flags: 0,
        srcfd: fd.as_raw_fd() as u32,
        newfd: 0,
        newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
    };
    // SAFETY: the fd is a listener and `add` is a valid request the kernel only reads.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ADDFD,
            &add as *const libc::seccomp_notif_addfd,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ret as RawFd)
}

/// Answers notification `id`: the system call returns `val`, or fails with `errno` when it
/// is not 0 (SECCOMP_IOCTL_NOTIF_SEND).
pub fn seccomp_notif_send(
    listener: BorrowedFd<'_>,
    id: u64,
    val: i64,
    errno: i32,
) -> io::Result<()> {
    let resp = libc::seccomp_notif_resp {
        id,
        val,
        error: -errno,
        flags: 0,
    };
    // SAFETY: the fd is a listener and `resp` is a valid answer the kernel only reads.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            &resp as *const libc::seccomp_notif_resp,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether seccomp notification `id` is still pending (SECCOMP_IOCTL_NOTIF_ID_VALID): the
/// process that raised it still waits, so a pid read from it has not been reused.
pub fn seccomp_notif_id_valid(listener: BorrowedFd<'_>, id: u64) -> bool {
    // SAFETY: the fd is a listener and `id` is a u64 the kernel only reads.
    unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
            &id as *const u64,
        ) == 0
    }
}

/// A pidfd for `pid` (pidfd_open, Linux 5.3).
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain integer arguments; the result is checked.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) })
}

/// `RENAME_NOREPLACE` of renameat2(2): fail with EEXIST rather than replace the target.
pub const RENAME_NOREPLACE: u32 = 1;

/// renameat2(2) of `old` under `old_dir` to `new` under `new_dir` (names: neither is
/// followed if it is a symlink), with `flags` ([`RENAME_NOREPLACE`] or 0). Ours because
/// libc's wrapper is glibc's only.
pub fn renameat2(
    old_dir: BorrowedFd<'_>,
    old: &std::ffi::CStr,
    new_dir: BorrowedFd<'_>,
    new: &std::ffi::CStr,
    flags: u32,
) -> io::Result<()> {
    // SAFETY: the names are NUL-terminated C strings that outlive the call; the fds are
    // borrowed, open; the result is checked.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            old_dir.as_raw_fd(),
            old.as_ptr(),
            new_dir.as_raw_fd(),
            new.as_ptr(),
            flags,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `inner`'s fd registered with the tokio reactor (for readiness), owned by the result.
/// For types that own their fd, open until they are dropped ([`crate::workdir::Watch`]).
#[cfg(feature = "cli")]
pub fn register_async<T: OwnsFd>(inner: T) -> io::Result<tokio::io::unix::AsyncFd<T>> {
    // SAFETY: `OwnsFd` types hold their fd open, the same file description, for as long as
    // they live, and close it only when dropped, which the AsyncFd that owns them does
    // after deregistering it.
    unsafe { tokio::io::unix::AsyncFd::register(inner) }.map_err(|e| e.into_parts().1)
}

/// A type that owns its fd for its whole life (see [`register_async`]).
#[cfg(feature = "cli")]
pub trait OwnsFd: std::os::fd::AsRawFd {}

/// A copy of fd `target` of the process behind `pidfd` (pidfd_getfd, Linux 5.6).
pub fn pidfd_getfd(pidfd: BorrowedFd<'_>, target: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: plain integer arguments; the result is checked.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target, 0) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd (close-on-exec) that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) })
}

/// Adopts an fd that a system call just put in our table for us (openat, or SCM_RIGHTS),
/// and that nothing else owns.
pub fn adopt_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: the callers pass only fds fresh from the kernel, owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;

/// A new tmpfs, detached (fsopen, fsconfig, fsmount: Linux 5.2), made by this process in
/// its own user namespace, with `options` (key, value) and the mount attributes `attrs`
/// (`MOUNT_ATTR_*`; not RDONLY: the root's owner is set after, and mount_setattr, which
/// could make it read-only then, needs 5.12); its root directory is then owned by `owner`
/// (uid, gid), which the mount's options never show. Closing the fd drops it unless [`move_mount_here`]
/// attached it first.
pub fn detached_tmpfs(
    options: &[(&str, String)],
    attrs: u64,
    owner: (u32, u32),
) -> io::Result<OwnedFd> {
    let cstring =
        |s: &str| std::ffi::CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL));
    // SAFETY: a NUL-terminated name; the result is checked and owned below.
    let ret = unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd that nothing else owns.
    let context = unsafe { OwnedFd::from_raw_fd(ret as RawFd) };
    // "tmpfs" as the source, as `mount -t tmpfs tmpfs` gives it.
    let source = [("source", "tmpfs".to_string())];
    for (key, value) in source.iter().chain(options) {
        let (key, value) = (cstring(key)?, cstring(value)?);
        // SAFETY: both strings are NUL-terminated and outlive the call.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                context.as_raw_fd(),
                FSCONFIG_SET_STRING,
                key.as_ptr(),
                value.as_ptr(),
                0,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: FSCONFIG_CMD_CREATE takes no key or value (null pointers, 0).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            context.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a configured context fd; the result is checked and owned below.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            context.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            attrs as libc::c_uint,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd that nothing else owns.
    let mount = unsafe { OwnedFd::from_raw_fd(ret as RawFd) };
    let root = nix::fcntl::openat(
        mount.as_fd(),
        ".",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    nix::unistd::fchown(
        root.as_fd(),
        Some(nix::unistd::Uid::from_raw(owner.0)),
        Some(nix::unistd::Gid::from_raw(owner.1)),
    )?;
    Ok(mount)
}

/// A detached, read-only, nosuid, nodev, private copy of the mount tree at the directory
/// `dir` (open_tree with OPEN_TREE_CLONE and AT_RECURSIVE, Linux 5.2, then mount_setattr
/// on every mount of it, Linux 5.12). Closing the fd unmounts the copy unless
/// [`move_mount_here`] attached it somewhere first. Before 5.12 the copy is returned as it
/// is (the second value is false), and whoever attaches it must make it read-only.
pub fn clone_tree_readonly(dir: BorrowedFd<'_>) -> io::Result<(OwnedFd, bool)> {
    // SAFETY: an empty path with AT_EMPTY_PATH names `dir` itself; the result is checked.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dir.as_raw_fd(),
            c"".as_ptr(),
            OPEN_TREE_CLONE
                | AT_RECURSIVE
                | libc::AT_EMPTY_PATH as libc::c_uint
                | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(ret as RawFd) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: libc::MS_PRIVATE,
        userns_fd: 0,
    };
    // SAFETY: `attr` is a valid mount_attr of the size given, which the kernel only reads.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENOSYS) {
            return Ok((tree, false));
        }
        return Err(err);
    }
    Ok((tree, true))
}

/// Sets the mount attributes `set` (`MOUNT_ATTR_*`) on the mount at `path` and every
/// mount below it (mount_setattr with AT_RECURSIVE, Linux 5.12).
pub fn set_mount_attrs_recursive(path: &std::path::Path, set: u64) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: a NUL-terminated path and a valid mount_attr of the size given, which the
    // kernel only reads; both outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Attaches the detached mount tree `tree` at `target` (move_mount, Linux 5.2).
pub fn move_mount_here(tree: BorrowedFd<'_>, target: &std::path::Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let target = std::ffi::CString::new(target.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: both strings are NUL-terminated and outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

// ---- async-signal-safe calls for the child between clone3 and execve ----------------------
//
// Each returns the raw errno on failure and touches no memory it does not own: the system
// calls go through `raw_syscall`, which on x86_64 leaves errno alone too. That matters
// because a child that shares the launcher's memory also shares the thread-local errno of
// the thread that cloned it, which goes on running. No glibc wrappers: setresuid(3)
// broadcasts to all threads through glibc's own locks.

/// A system call with up to five arguments, its result as the kernel gives it: the negated
/// errno on failure. Never touches errno.
///
/// # Safety
///
/// The arguments must be valid for system call `nr`, as for libc::syscall.
#[cfg(target_arch = "x86_64")]
unsafe fn raw_syscall(nr: libc::c_long, a: [usize; 5]) -> libc::c_long {
    let ret: libc::c_long;
    // SAFETY: the syscall instruction with the kernel's argument registers; it clobbers
    // rcx and r11 and uses no stack. The caller vouches for the arguments.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// Elsewhere the child does not share the launcher's memory, so libc::syscall's errno is
/// its own.
///
/// # Safety
///
/// As for the x86_64 version.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn raw_syscall(nr: libc::c_long, a: [usize; 5]) -> libc::c_long {
    // SAFETY: the caller vouches for the arguments.
    let ret = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4]) };
    if ret == -1 {
        -libc::c_long::from(Errno::last_raw())
    } else {
        ret
    }
}

fn raw_result(ret: libc::c_long) -> Result<libc::c_long, i32> {
    if (-4095..0).contains(&ret) {
        Err(-ret as i32)
    } else {
        Ok(ret)
    }
}

/// Reads exactly one byte; EOF is reported as `EPIPE`.
pub fn child_read_byte(fd: RawFd) -> Result<u8, i32> {
    let mut byte = 0u8;
    loop {
        // SAFETY: reads at most one byte into a local.
        let ret = unsafe {
            raw_syscall(
                libc::SYS_read,
                [fd as usize, &mut byte as *mut u8 as usize, 1, 0, 0],
            )
        };
        match raw_result(ret) {
            Ok(1) => return Ok(byte),
            Ok(_) => return Err(libc::EPIPE),
            Err(libc::EINTR) => continue,
            Err(errno) => return Err(errno),
        }
    }
}

/// Writes all of `buf`, retrying on EINTR.
pub fn child_write_all(fd: RawFd, mut buf: &[u8]) -> Result<(), i32> {
    while !buf.is_empty() {
        // SAFETY: writes from a live slice.
        let ret = unsafe {
            raw_syscall(
                libc::SYS_write,
                [fd as usize, buf.as_ptr() as usize, buf.len(), 0, 0],
            )
        };
        match raw_result(ret) {
            Ok(n) => buf = &buf[n as usize..],
            Err(libc::EINTR) => continue,
            Err(errno) => return Err(errno),
        }
    }
    Ok(())
}

/// setresgid(0,0,0) then setresuid(0,0,0) for this thread only: after the launcher wrote the
/// id maps, this turns the host credentials the child was cloned with into the sandbox's
/// root, so that its execve keeps the capabilities of the new user namespace.
pub fn child_become_root() -> Result<(), i32> {
    // The launcher thread cloned us with SECBIT_NO_SETUID_FIXUP (see with_thread_euid);
    // the sandbox must have the normal rule that leaving uid 0 drops capabilities.
    // SAFETY: prctl with integer arguments; we hold every capability in the new namespace.
    raw_result(unsafe {
        raw_syscall(
            libc::SYS_prctl,
            [libc::PR_SET_SECUREBITS as usize, 0, 0, 0, 0],
        )
    })?;
    // SAFETY: plain syscalls without pointers.
    raw_result(unsafe { raw_syscall(libc::SYS_setresgid, [0; 5]) })?;
    // SAFETY: as above.
    raw_result(unsafe { raw_syscall(libc::SYS_setresuid, [0; 5]) })?;
    Ok(())
}

/// Writes "0" into the file at `path` (a cgroup v1 `tasks` file): the calling thread moves
/// itself into that cgroup.
pub fn child_join_cgroup(path: *const c_char) -> Result<(), i32> {
    // SAFETY: `path` is a NUL-terminated string built before clone3.
    let fd = raw_result(unsafe {
        raw_syscall(
            libc::SYS_openat,
            [
                libc::AT_FDCWD as usize,
                path as usize,
                (libc::O_WRONLY | libc::O_CLOEXEC) as usize,
                0,
                0,
            ],
        )
    })?;
    let written = child_write_all(fd as RawFd, b"0");
    // SAFETY: closing the fd just opened.
    unsafe { raw_syscall(libc::SYS_close, [fd as usize, 0, 0, 0, 0]) };
    written
}

/// unshare(CLONE_NEWNET): the raw child makes its network namespace itself, owned by the
/// user namespace it was born in, while the launcher goes on with its part.
pub fn child_unshare_net() -> Result<(), i32> {
    // SAFETY: plain syscall on an integer flag.
    raw_result(unsafe { raw_syscall(libc::SYS_unshare, [libc::CLONE_NEWNET as usize, 0, 0, 0, 0]) })
        .map(drop)
}

/// PR_SET_PDEATHSIG = SIGKILL: if the launcher thread dies, so does the sandbox.
pub fn child_set_pdeathsig() -> Result<(), i32> {
    // SAFETY: prctl with integer arguments only.
    raw_result(unsafe {
        raw_syscall(
            libc::SYS_prctl,
            [
                libc::PR_SET_PDEATHSIG as usize,
                libc::SIGKILL as usize,
                0,
                0,
                0,
            ],
        )
    })
    .map(drop)
}

/// dup2(2), which clears CLOEXEC on the copy.
pub fn child_dup2(from: RawFd, to: RawFd) -> Result<(), i32> {
    // SAFETY: plain syscall on integers; an invalid fd just fails.
    raw_result(unsafe { raw_syscall(libc::SYS_dup3, [from as usize, to as usize, 0, 0, 0]) })
        .map(drop)
}

/// close_range(first, ~0, CLOSE_RANGE_CLOEXEC) (Linux 5.11): every fd from `first` up is
/// closed at execve, whatever the calling program left open without O_CLOEXEC
/// (CVE-2024-21626). Older kernels: the same, one fd at a time, for each fd that
/// /proc/self/fd lists. Allocation-free, for the raw child too.
pub fn cloexec_from(first: RawFd) -> Result<(), i32> {
    const CLOSE_RANGE_CLOEXEC: usize = 1 << 2;
    // SAFETY: plain syscall on integers.
    let ret = unsafe {
        raw_syscall(
            libc::SYS_close_range,
            [
                first as usize,
                libc::c_uint::MAX as usize,
                CLOSE_RANGE_CLOEXEC,
                0,
                0,
            ],
        )
    };
    if ret == 0 {
        return Ok(());
    }
    cloexec_listed_fds(first)
}

/// Sets FD_CLOEXEC on every fd from `first` up that /proc/self/fd lists, reading the
/// directory with getdents64 into a buffer on the stack.
fn cloexec_listed_fds(first: RawFd) -> Result<(), i32> {
    const DIR: &CStr = c"/proc/self/fd";
    // SAFETY: a NUL-terminated path; the fd returned is ours.
    let dir = raw_result(unsafe {
        raw_syscall(
            libc::SYS_openat,
            [
                libc::AT_FDCWD as usize,
                DIR.as_ptr() as usize,
                (libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) as usize,
                0,
                0,
            ],
        )
    })? as RawFd;
    let mut buf = [0u8; 4096];
    let result = loop {
        // SAFETY: the kernel writes at most `buf.len()` bytes into the buffer.
        let n = match raw_result(unsafe {
            raw_syscall(
                libc::SYS_getdents64,
                [dir as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0],
            )
        }) {
            Ok(0) => break Ok(()),
            Ok(n) => n as usize,
            Err(errno) => break Err(errno),
        };
        let mut at = 0;
        // No indexing that could panic: the child may run in the launcher's memory, where a
        // panic would run the launcher's own machinery (see clone3_raw_child).
        while let Some(record) = buf.get(at..n).filter(|r| r.len() > 19) {
            // struct linux_dirent64: ino u64, off i64, reclen u16, type u8, name[].
            let reclen = u16::from_ne_bytes([record[16], record[17]]) as usize;
            let name = record.get(19..reclen.min(record.len())).unwrap_or_default();
            let mut fd: RawFd = 0;
            let mut digits = 0;
            for &b in name.iter().take_while(|b| **b != 0) {
                if !b.is_ascii_digit() {
                    digits = 0;
                    break;
                }
                fd = fd.saturating_mul(10).saturating_add(RawFd::from(b - b'0'));
                digits += 1;
            }
            if digits > 0 && fd >= first && fd != dir {
                // SAFETY: fcntl with integer arguments; a closed fd just fails.
                unsafe {
                    raw_syscall(
                        libc::SYS_fcntl,
                        [
                            fd as usize,
                            libc::F_SETFD as usize,
                            libc::FD_CLOEXEC as usize,
                            0,
                            0,
                        ],
                    )
                };
            }
            if reclen == 0 {
                break;
            }
            at += reclen;
        }
    };
    // SAFETY: closing the directory fd opened above.
    unsafe { raw_syscall(libc::SYS_close, [dir as usize, 0, 0, 0, 0]) };
    result
}

/// execveat(fd, "", argv, envp, AT_EMPTY_PATH): runs the program open at `fd`. Returns only
/// on failure, with the errno. `argv` and `envp` are NULL-terminated arrays built before
/// clone3.
pub fn child_execveat(fd: RawFd, argv: *const *const c_char, envp: *const *const c_char) -> i32 {
    const EMPTY: &CStr = c"";
    // SAFETY: `argv`/`envp` point to NULL-terminated arrays of C strings that the parent
    // built before clone3 and keeps alive until the child has exec'd (or shares with it as
    // a copy of its memory).
    let ret = unsafe {
        raw_syscall(
            libc::SYS_execveat,
            [
                fd as usize,
                EMPTY.as_ptr() as usize,
                argv as usize,
                envp as usize,
                libc::AT_EMPTY_PATH as usize,
            ],
        )
    };
    raw_result(ret).err().unwrap_or(libc::EINVAL)
}

/// _exit(2): leave without running destructors or atexit handlers.
pub fn exit_now(code: c_int) -> ! {
    // The system call itself, not glibc's _exit through the PLT (which a preloaded library
    // could interpose, to run in the launcher's memory from a raw child).
    // SAFETY: exit_group with an integer argument; it does not return.
    unsafe { raw_syscall(libc::SYS_exit_group, [code as usize, 0, 0, 0, 0]) };
    // SAFETY: reached only if exit_group returned, which it does not.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fallback for kernels without CLOSE_RANGE_CLOEXEC (before 5.11) marks every fd
    /// from `first` up, and none below.
    #[test]
    fn the_cloexec_fallback_marks_every_listed_fd_from_first_up() {
        let flags = |fd: RawFd| {
            // SAFETY: fcntl F_GETFD on an fd this test owns.
            unsafe { libc::fcntl(fd, libc::F_GETFD) }
        };
        // Without O_CLOEXEC, on purpose.
        let files: Vec<std::fs::File> = (0..3)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        let raw: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
        for fd in &raw {
            // SAFETY: clearing FD_CLOEXEC on an fd this test owns.
            unsafe { libc::fcntl(*fd, libc::F_SETFD, 0) };
        }
        cloexec_listed_fds(raw[1]).unwrap();
        assert_eq!(flags(raw[0]) & libc::FD_CLOEXEC, 0);
        assert_ne!(flags(raw[1]) & libc::FD_CLOEXEC, 0);
        assert_ne!(flags(raw[2]) & libc::FD_CLOEXEC, 0);
    }
}
