//! The sandbox side: codecage re-executed as pid 1 of the new namespaces. It is a fresh,
//! single-threaded process, so unlike the raw child before it, it may allocate freely.
//!
//! The setup reads as a script (`build`): each step is a function, and its name is what a
//! setup error reports. The order matters, and each step says why it stands where it does.

mod files;
mod init;
pub(crate) mod landlock;
mod mount;
mod netlink;
mod payload;
mod procfs;
mod procs;
mod rootfs;
mod seccomp;
pub(crate) mod skeleton;
mod volumes;

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use nix::sched::{unshare, CloneFlags};

use crate::protocol::{
    self, FromSandbox, Phase, SetupError, Step, CHANNEL_FD, INIT_ARG, INIT_ARG_PREFIX,
};
use crate::spec::SandboxSpec;

pub use files::Entry as DirEntry;

/// Compiles this architecture's seccomp policy, for `doctor`. Returns the architecture.
pub fn seccomp_policy_check() -> Result<&'static str, String> {
    seccomp::compile().map(|_| std::env::consts::ARCH)
}

/// The init's name (comm, what `ps` shows), the same as its argv[0].
const INIT_COMM: &std::ffi::CStr = c"codecage";

/// Call first thing in `main`: if this process was started as a sandbox init, it runs the
/// sandbox and never returns. Anything that runs before it (a tokio runtime, threads)
/// would be inherited by every sandbox.
pub fn dispatch_init() {
    let Some(arg) = std::env::args_os().nth(1) else {
        return;
    };
    if arg == INIT_ARG {
        init_main(None)
    }
    if let Some(theirs) = arg.to_str().and_then(|a| a.strip_prefix(INIT_ARG_PREFIX)) {
        // A launcher of another build: its spec may not mean what this init would read.
        let ours = &INIT_ARG[INIT_ARG_PREFIX.len()..];
        init_main(Some(format!(
            "the sandbox init {} is from another build of codecage (build {ours}) than the \
             launcher (build {theirs}): install codecage and codecage-init from one build",
            std::env::current_exe().unwrap_or_default().display()
        )))
    }
}

fn init_main(mismatch: Option<String>) -> ! {
    // Named the same on every kernel: older ones (5.10 in the VM lanes) name a program
    // started with execveat(fd, "", AT_EMPTY_PATH) after the fd's number (`ps` showed pid 1
    // as `7`), newer ones after the file. Nothing depends on the name, so a failure (there
    // is none for a short name) is ignored.
    let _ = nix::sys::prctl::set_name(INIT_COMM);
    // The channel moves out of 0..=3, where each payload gets its own fds.
    let channel = crate::sys::take_inherited_socket(CHANNEL_FD)
        .and_then(|fd| crate::sys::dup_above(std::os::fd::AsFd::as_fd(&fd), 10));
    let channel = match channel {
        Ok(fd) => UnixStream::from(fd),
        Err(e) => {
            eprintln!("codecage: {INIT_ARG} is internal to the launcher ({e})");
            std::process::exit(125)
        }
    };
    if let Some(context) = mismatch {
        let error = SetupError {
            step: Step::ExecInit,
            errno: None,
            context,
            cause: None,
        };
        let failed = FromSandbox::SetupFailed { id: None, error };
        let _ = protocol::write_message(&mut &channel, &failed, protocol::MAX_FRAME);
        std::process::exit(125)
    }
    match build(&channel) {
        Ok(spec) => init::serve(&spec, &channel),
        Err(error) => {
            // If the launcher is gone there is nobody to tell, and nothing else to do.
            let failed = FromSandbox::SetupFailed { id: None, error };
            let _ = protocol::write_message(&mut &channel, &failed, protocol::MAX_FRAME);
            std::process::exit(125)
        }
    }
}

/// Builds the sandbox around this process, in order. Returns its spec.
fn build(channel: &UnixStream) -> Result<SandboxSpec, SetupError> {
    protocol::mark(channel, Phase::InitStarted);
    // Whatever the calling program had: an ignored SIGCHLD survives execve and would let
    // the kernel reap the payload before the init sees it exit; a umask of 077 would make
    // /etc unreadable to the payload.
    crate::sys::reset_signal_dispositions()
        .map_err(|e| SetupError::errno(Step::ResetSignalDispositions, e, "sigaction SIG_DFL"))?;
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    // Leave the launcher's session and process group: a terminal's ^C reaches the launcher,
    // which forwards it once, and the payload cannot reach the terminal (CVE-2017-5226).
    leave_session()?;
    // Die with the launcher, and make sure it did not die before we asked.
    die_with_launcher(channel)?;
    let spec = receive_spec(channel)?;
    // Only now: we joined our cgroups before the exec, so the new cgroup namespace is
    // rooted at the run's own cgroup. Created at clone time on a v1 host, it would be
    // rooted at the launcher's cgroup instead.
    enter_cgroup_namespace()?;
    // /proc/sys/net shows the reader's network namespace, whichever procfs it is read from;
    // the sandbox's own /proc/sys is read-only once built.
    set_network_sysctls(spec.network.mode.has_gateway())?;
    // The tmpfs file systems come after "go" and the spec: the launcher fills them while we
    // start (src/launcher/fill.rs), so they are asked for only when the mounts need them.
    let plan = protocol::Tmpfs::plan(&spec);
    let mut volumes = receive_mounts(channel, plan.len() + spec.volumes.len())?;
    let tmpfs: mount::TmpfsFds = plan
        .iter()
        .copied()
        .zip(volumes.drain(..plan.len()))
        .collect();
    // Mounts: a new root from tmpfs and read-only binds, then pivot_root (see mount.rs).
    mount::build_root(&spec, tmpfs, volumes)?;
    set_hostname(&spec.hostname)?;
    bring_up_loopback()?;
    if spec.network.mode.has_gateway() {
        configure_gateway_link()?;
    }
    // pid 1 holds the host binary open; other uids may not inspect it (CVE-2019-5736).
    make_init_undumpable()?;
    protocol::mark(channel, Phase::SandboxBuilt);
    Ok(spec)
}

fn leave_session() -> Result<(), SetupError> {
    nix::unistd::setsid()
        .map(drop)
        .map_err(|e| SetupError::errno(Step::LeaveSession, e, "setsid"))
}

fn die_with_launcher(channel: &UnixStream) -> Result<(), SetupError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| SetupError::errno(Step::DieWithLauncher, e, "PR_SET_PDEATHSIG"))?;
    // The launcher may have died before the prctl: then its end of the channel is closed,
    // which a unix stream socket reports as POLLHUP.
    let mut fds = [PollFd::new(channel.as_fd(), PollFlags::empty())];
    let _ = poll(&mut fds, PollTimeout::ZERO);
    if fds[0]
        .revents()
        .is_some_and(|r| r.contains(PollFlags::POLLHUP))
    {
        // Data may still be buffered, but nobody is left to supervise the run.
        std::process::exit(125);
    }
    Ok(())
}

fn receive_spec(channel: &UnixStream) -> Result<SandboxSpec, SetupError> {
    protocol::read_message(&mut &*channel, protocol::MAX_SPEC_FRAME)
        .map_err(|e| SetupError::io(Step::ReceiveSpec, &e, "reading the Spec from the launcher"))
}

/// The sandbox's tmpfs file systems and the volumes' detached mount trees, which the
/// launcher sends after the spec, once it has filled the tmpfs.
fn receive_mounts(channel: &UnixStream, count: usize) -> Result<Vec<OwnedFd>, SetupError> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::{AsRawFd, RawFd};
    let failed = |e: nix::errno::Errno| {
        SetupError::errno(
            Step::ReceiveVolumes,
            e,
            "reading the tmpfs file systems and volumes from the launcher",
        )
    };
    let mut tag = [0u8; 1];
    let mut space = nix::cmsg_space!([RawFd; crate::spec::MAX_VOLUMES + protocol::MAX_TMPFS]);
    let mut iov = [std::io::IoSliceMut::new(&mut tag)];
    let msg = loop {
        match recvmsg::<()>(
            channel.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other.map_err(failed)?,
        }
    };
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs().map_err(failed)? {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            fds.extend(raw.into_iter().map(crate::sys::adopt_fd));
        }
    }
    if msg.bytes != 1 || tag[0] != protocol::TAG_VOLUMES || fds.len() != count {
        return Err(SetupError::refused(
            Step::ReceiveVolumes,
            format!(
                "expected {count} mounts (tmpfs file systems and volumes) from the launcher, got {}",
                fds.len()
            ),
        ));
    }
    Ok(fds)
}

fn enter_cgroup_namespace() -> Result<(), SetupError> {
    unshare(CloneFlags::CLONE_NEWCGROUP)
        .map_err(|e| SetupError::errno(Step::EnterCgroupNamespace, e, "unshare(CLONE_NEWCGROUP)"))
}

/// A runner's code file and the run's input files, under /work, owned by the sandbox
/// user (see files.rs: no symlink is ever followed).
pub(crate) fn write_work_files(files: &[crate::files::InputFile]) -> Result<(), SetupError> {
    files::write_inputs(files).map_err(|e| SetupError::refused(Step::WriteWorkFiles, e))
}

fn set_hostname(name: &str) -> Result<(), SetupError> {
    nix::unistd::sethostname(name)
        .map_err(|e| SetupError::errno(Step::SetHostname, e, format!("sethostname({name:?})")))
}

fn bring_up_loopback() -> Result<(), SetupError> {
    crate::sys::loopback_up().map_err(|e| {
        SetupError::io(
            Step::BringUpLoopback,
            &e,
            "setting lo up in the new network namespace",
        )
    })
}

/// tun0 (created by the launcher before "go") gets the sandbox's address, a large MTU,
/// and the default route: every packet that leaves the sandbox goes to the gateway.
fn configure_gateway_link() -> Result<(), SetupError> {
    use crate::network::{LINK_MTU, SANDBOX_ADDR, TUN_NAME};
    let fail = |e: std::io::Error, what: &str| {
        SetupError::io(
            Step::ConfigureGatewayLink,
            &e,
            format!("{what} of {TUN_NAME}"),
        )
    };
    crate::sys::configure_interface(
        TUN_NAME,
        SANDBOX_ADDR,
        std::net::Ipv4Addr::new(255, 255, 255, 255),
        LINK_MTU,
    )
    .map_err(|e| fail(e, "setting the address and MTU"))?;
    crate::sys::interface_up(TUN_NAME).map_err(|e| fail(e, "setting up"))?;
    crate::sys::add_default_route(TUN_NAME).map_err(|e| fail(e, "adding the default route"))
}

/// The network namespace's own sysctls (its /proc/sys/net, writable by the sandbox's root
/// before /proc/sys is made read-only). TCP Fast Open would let `sendto(MSG_FASTOPEN)` open
/// a connection without connect(2), which landlock's connect rule does not see. The rest
/// of the namespace's defaults are safe: ICMP sockets are off (ping_group_range "1 0"),
/// ports below 1024 need a capability the payload lacks, and socket buffers are charged to
/// the run's memory cgroup.
const NETWORK_SYSCTLS: &[(&str, &str)] = &[("net/ipv4/tcp_fastopen", "0")];

/// With a link to the gateway: no IPv6 on it (the gateway carries IPv4 only, so IPv6 is
/// off rather than open), and no IPv6 on links created later. A kernel without IPv6 has
/// nothing to turn off.
const GATEWAY_SYSCTLS: &[(&str, &str)] = &[
    ("net/ipv6/conf/tun0/disable_ipv6", "1"),
    ("net/ipv6/conf/default/disable_ipv6", "1"),
];

fn set_network_sysctls(gateway: bool) -> Result<(), SetupError> {
    let ipv6 = std::path::Path::new("/proc/sys/net/ipv6").exists();
    let extra = match gateway && ipv6 {
        true => GATEWAY_SYSCTLS,
        false => &[],
    };
    for (key, value) in NETWORK_SYSCTLS.iter().chain(extra) {
        let path = std::path::Path::new("/proc/sys").join(key);
        std::fs::write(&path, value).map_err(|e| {
            SetupError::io(
                Step::SetNetworkSysctls,
                &e,
                format!("writing {value} to {}", path.display()),
            )
        })?;
    }
    Ok(())
}

fn make_init_undumpable() -> Result<(), SetupError> {
    nix::sys::prctl::set_dumpable(false)
        .map_err(|e| SetupError::errno(Step::MakeInitUndumpable, e, "PR_SET_DUMPABLE 0"))
}
