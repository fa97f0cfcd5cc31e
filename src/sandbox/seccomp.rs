//! Seccomp: the policy is data, one JSON file per architecture in `profiles/seccomp/`, with
//! a reason beside each entry (seccompiler's JSON format, firecracker style). It holds two
//! filters, installed in this order:
//!
//! 1. `allow`: the syscalls programs need; anything else answers ENOSYS, the errno libc
//!    expects from a syscall it does not know, so it falls back (clone3 -> clone) instead
//!    of failing.
//! 2. `deny`: what a hostile payload would use, answered with EPERM: mount and the new mount
//!    API, namespaces, ptrace, keyring, bpf, perf, userfaultfd, io_uring, file handles,
//!    modules, clocks; clone with namespace flags; socket families other than unix, IP and
//!    netlink, netlink protocols other than NETLINK_ROUTE, raw and packet sockets; TIOCSTI;
//!    personality changes. Installed last, so its EPERM wins over the allow filter's ENOSYS
//!    (the kernel keeps the most recent filter's value among equal actions).
//!
//! Before both, each payload installs a third, small filter built here, the netlink watch
//! (`install_netlink_watch`): `socket(AF_NETLINK, ...)` and `setsockopt(SOL_SOCKET,
//! SO_RCVBUF)` become user notifications that the init answers (netlink.rs). The deny
//! filter's EPERM outranks a notification, so only NETLINK_ROUTE ever reaches the init.
//!
//! With an exec allowlist, a fourth filter after the deny filter refuses `memfd_create`
//! (EPERM): a memfd is the one file no noexec mount and no landlock rule covers.
//!
//! Foreign architectures (i386's int 0x80 on x86_64) are killed by seccompiler's arch check;
//! x32 syscall numbers match no allowed entry and answer ENOSYS. build.rs compiles the
//! target's policy with seccompiler at build time; the init only decodes the embedded BPF,
//! and the payload installs it last, right before execve.

#[cfg(test)]
use seccompiler::TargetArch;
use seccompiler::{sock_filter, BpfProgram};

/// The compiled filters, in installation order.
pub struct Filters {
    allow: BpfProgram,
    deny: BpfProgram,
    /// With an exec allowlist: `memfd_create` refused (a memfd lives on the kernel's
    /// internal shmem mount, which is not noexec and which landlock lets through, so it
    /// could hold a program to `execveat`).
    memfd: Option<BpfProgram>,
}

impl Filters {
    /// Adds the exec allowlist's filter: `memfd_create` answers EPERM.
    pub fn deny_memfd(&mut self) {
        const LD_W_ABS: u16 = 0x20;
        const JEQ_K: u16 = 0x15;
        const RET_K: u16 = 0x06;
        let op = |code: u16, jt: u8, jf: u8, k: u32| sock_filter { code, jt, jf, k };
        self.memfd = Some(vec![
            /* 0 */ op(LD_W_ABS, 0, 0, 4),
            /* 1 */
            op(JEQ_K, 0, 3, AUDIT_ARCH), // else 5 (the allow filter kills those)
            /* 2 */ op(LD_W_ABS, 0, 0, 0),
            /* 3 */ op(JEQ_K, 0, 1, libc::SYS_memfd_create as u32), // else 5
            /* 4 */ op(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
            /* 5 */ op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        ]);
    }
}

/// This architecture's policy, as build.rs compiled it.
pub fn compile() -> Result<Filters, String> {
    let allow = decode(include_bytes!(concat!(
        env!("OUT_DIR"),
        "/seccomp-allow.bpf"
    )))?;
    let deny = decode(include_bytes!(concat!(
        env!("OUT_DIR"),
        "/seccomp-deny.bpf"
    )))?;
    Ok(Filters {
        allow,
        deny,
        memfd: None,
    })
}

/// 8-byte little-endian records (code u16, jt u8, jf u8, k u32) back into instructions.
fn decode(bytes: &[u8]) -> Result<BpfProgram, String> {
    if bytes.is_empty() || bytes.len() % 8 != 0 {
        return Err(format!(
            "embedded seccomp program has {} bytes, not whole instructions",
            bytes.len()
        ));
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| sock_filter {
            code: u16::from_le_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect())
}

#[cfg(test)]
fn compile_policy(json: &str, arch: TargetArch) -> Result<Filters, String> {
    let mut map = seccompiler::compile_from_json(json.as_bytes(), arch)
        .map_err(|e| format!("seccomp policy: {e}"))?;
    let mut take = |name: &str| {
        map.remove(name)
            .ok_or_else(|| format!("seccomp policy has no {name:?} filter"))
    };
    Ok(Filters {
        allow: take("allow")?,
        deny: take("deny")?,
        memfd: None,
    })
}

/// The audit architecture of this build, as seccomp_data.arch holds it.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// The netlink watch, a third filter: `socket(AF_NETLINK, ...)` (the deny filter lets
/// through NETLINK_ROUTE only; its EPERM outranks this filter's answer) and
/// `setsockopt(SOL_SOCKET, SO_RCVBUF)` go to the init as user notifications, and the init
/// answers them (see `netlink.rs`). Anything else, and foreign architectures (which the
/// allow filter kills), is allowed here.
fn netlink_watch_program() -> Vec<libc::sock_filter> {
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    // seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8i (the low half first: both
    // architectures are little-endian).
    let op = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    vec![
        /* 0 */ op(LD_W_ABS, 0, 0, 4),
        /* 1 */ op(JEQ_K, 0, 10, AUDIT_ARCH), // else 12
        /* 2 */ op(LD_W_ABS, 0, 0, 0),
        /* 3 */ op(JEQ_K, 0, 2, libc::SYS_socket as u32), // else 6
        /* 4 */ op(LD_W_ABS, 0, 0, 16),
        /* 5 */ op(JEQ_K, 5, 6, libc::AF_NETLINK as u32), // 11 or 12
        /* 6 */ op(JEQ_K, 0, 5, libc::SYS_setsockopt as u32), // else 12
        /* 7 */ op(LD_W_ABS, 0, 0, 24),
        /* 8 */ op(JEQ_K, 0, 3, libc::SOL_SOCKET as u32), // else 12
        /* 9 */ op(LD_W_ABS, 0, 0, 32),
        /* 10 */ op(JEQ_K, 0, 1, libc::SO_RCVBUF as u32), // 11 or 12
        /* 11 */ op(RET_K, 0, 0, libc::SECCOMP_RET_USER_NOTIF),
        /* 12 */ op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

/// Installs the netlink watch on the calling thread (no_new_privs must be set) and returns
/// the listener its notifications go to.
pub fn install_netlink_watch() -> std::io::Result<std::os::fd::OwnedFd> {
    crate::sys::seccomp_filter_with_listener(&netlink_watch_program())
}

/// Installs the filters on the calling thread (and sets no_new_privs). On failure: which
/// filter, and seccompiler's error.
pub fn apply(filters: &Filters) -> Result<(), (&'static str, seccompiler::Error)> {
    seccompiler::apply_filter(&filters.allow).map_err(|e| ("allow", e))?;
    seccompiler::apply_filter(&filters.deny).map_err(|e| ("deny", e))?;
    match &filters.memfd {
        Some(memfd) => seccompiler::apply_filter(memfd).map_err(|e| ("memfd", e)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a classic BPF seccomp program on (arch, nr, the first three arguments' low
    /// words): the subset of instructions codecage's programs use (ld abs, jeq/jge/jgt/ja,
    /// ret).
    fn run_bpf(program: &[sock_filter], arch: u32, nr: u32, args: [u32; 3]) -> u32 {
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = &program[pc];
            pc += 1;
            match i.code {
                0x20 => {
                    acc = match i.k {
                        0 => nr,
                        4 => arch,
                        16 | 24 | 32 => args[(i.k as usize - 16) / 8],
                        _ => 0,
                    }
                }
                0x15 | 0x35 | 0x25 => {
                    let taken = match i.code {
                        0x15 => acc == i.k,
                        0x35 => acc >= i.k,
                        _ => acc > i.k,
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                0x05 => pc += i.k as usize,
                0x06 => return i.k,
                other => panic!("instruction {other:#x} not emulated"),
            }
        }
    }

    /// Runs an allow program on (arch, nr) with zero arguments.
    fn evaluate(program: &[sock_filter], arch: u32, nr: u32) -> u32 {
        run_bpf(program, arch, nr, [0; 3])
    }

    /// build.rs's binary search decides every syscall number exactly as seccompiler's
    /// linear program for the same policy does, and is a fraction of its size.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_embedded_allow_program_matches_seccompilers() {
        let embedded = compile().unwrap();
        let fresh = compile_policy(
            include_str!("../../profiles/seccomp/x86_64.json"),
            TargetArch::x86_64,
        )
        .unwrap();
        assert!(embedded.deny == fresh.deny);
        assert!(
            embedded.allow.len() * 5 < fresh.allow.len(),
            "{} vs {}",
            embedded.allow.len(),
            fresh.allow.len()
        );
        const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
        let x32 = (0..600).map(|n| n | 0x4000_0000);
        for nr in (0..1100).chain(x32).chain([u32::MAX]) {
            let (ours, theirs) = (
                evaluate(&embedded.allow, AUDIT_ARCH_X86_64, nr),
                evaluate(&fresh.allow, AUDIT_ARCH_X86_64, nr),
            );
            assert_eq!(ours, theirs, "syscall {nr}");
        }
        // i386 (int 0x80) is killed by both.
        assert_eq!(
            evaluate(&embedded.allow, 0x4000_0003, 1),
            evaluate(&fresh.allow, 0x4000_0003, 1)
        );
    }

    #[test]
    fn both_architectures_compile() {
        compile_policy(
            include_str!("../../profiles/seccomp/x86_64.json"),
            TargetArch::x86_64,
        )
        .unwrap();
        compile_policy(
            include_str!("../../profiles/seccomp/aarch64.json"),
            TargetArch::aarch64,
        )
        .unwrap();
    }

    #[test]
    fn every_entry_has_a_reason() {
        for file in [
            include_str!("../../profiles/seccomp/x86_64.json"),
            include_str!("../../profiles/seccomp/aarch64.json"),
        ] {
            let policy: serde_json::Value = serde_json::from_str(file).unwrap();
            for filter in ["allow", "deny"] {
                for rule in policy[filter]["filter"].as_array().unwrap() {
                    assert!(
                        rule["comment"].as_str().is_some_and(|c| !c.is_empty()),
                        "{rule}"
                    );
                }
            }
        }
    }

    /// Runs the netlink watch on (arch, nr, args).
    fn watch(arch: u32, nr: i64, args: [u32; 3]) -> u32 {
        // libc's sock_filter, the same instruction as seccompiler's.
        let program: Vec<sock_filter> = netlink_watch_program()
            .iter()
            .map(|i| sock_filter {
                code: i.code,
                jt: i.jt,
                jf: i.jf,
                k: i.k,
            })
            .collect();
        run_bpf(&program, arch, nr as u32, args)
    }

    #[test]
    fn the_netlink_watch_sends_netlink_sockets_and_rcvbuf_to_the_init_only() {
        use libc::{SECCOMP_RET_ALLOW as ALLOW, SECCOMP_RET_USER_NOTIF as NOTIFY};
        let (socket, setsockopt) = (libc::SYS_socket, libc::SYS_setsockopt);
        let netlink = libc::AF_NETLINK as u32;
        let (sol, rcvbuf) = (libc::SOL_SOCKET as u32, libc::SO_RCVBUF as u32);
        assert_eq!(watch(AUDIT_ARCH, socket, [netlink, 3, 0]), NOTIFY);
        assert_eq!(
            watch(AUDIT_ARCH, socket, [libc::AF_INET as u32, 1, 0]),
            ALLOW
        );
        assert_eq!(watch(AUDIT_ARCH, setsockopt, [3, sol, rcvbuf]), NOTIFY);
        assert_eq!(
            watch(AUDIT_ARCH, setsockopt, [3, sol, libc::SO_SNDBUF as u32]),
            ALLOW
        );
        assert_eq!(watch(AUDIT_ARCH, setsockopt, [3, 6, rcvbuf]), ALLOW);
        assert_eq!(
            watch(AUDIT_ARCH, libc::SYS_getpid, [netlink, sol, rcvbuf]),
            ALLOW
        );
        assert_eq!(watch(0x4000_0003, socket, [netlink, 3, 0]), ALLOW);
    }

    /// The filters, applied in a thread of their own so the test process stays unfiltered.
    #[test]
    fn denied_calls_get_the_documented_errno() {
        let filters = compile().unwrap();
        let results = std::thread::spawn(move || {
            apply(&filters).unwrap();
            let errno = |ret: libc::c_long| {
                if ret < 0 {
                    nix::errno::Errno::last_raw()
                } else {
                    0
                }
            };
            // SAFETY: each call fails in the filter before reaching the kernel, or is harmless.
            unsafe {
                [
                    errno(libc::syscall(libc::SYS_mount, 0, 0, 0, 0, 0)),
                    errno(libc::syscall(libc::SYS_clone3, 0, 0)),
                    errno(libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER)),
                    errno(libc::syscall(
                        libc::SYS_socket,
                        libc::AF_PACKET,
                        libc::SOCK_RAW,
                        0,
                    )),
                    errno(libc::syscall(
                        libc::SYS_socket,
                        libc::AF_INET,
                        libc::SOCK_RAW,
                        1,
                    )),
                    errno(libc::syscall(libc::SYS_ioctl, 0, libc::TIOCSTI, 0)),
                    errno(libc::syscall(libc::SYS_io_uring_setup, 1, 0)),
                    errno(libc::syscall(libc::SYS_personality, 0x0040000)),
                    errno(libc::syscall(libc::SYS_getpid)),
                    errno(libc::syscall(
                        libc::SYS_socket,
                        libc::AF_NETLINK,
                        libc::SOCK_RAW,
                        libc::NETLINK_AUDIT,
                    )),
                    errno(libc::syscall(
                        libc::SYS_socket,
                        libc::AF_NETLINK,
                        libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                        libc::NETLINK_ROUTE,
                    )),
                ]
            }
        })
        .join()
        .unwrap();
        use libc::{ENOSYS, EPERM};
        assert_eq!(
            results,
            [EPERM, ENOSYS, EPERM, EPERM, EPERM, EPERM, EPERM, EPERM, 0, EPERM, 0]
        );
    }
}
