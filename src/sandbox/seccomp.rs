//! Seccomp: the policy is data, one JSON file per architecture in `profiles/seccomp/`, with
//! a reason beside each entry (seccompiler's JSON format, firecracker style). It names two
//! lists:
//!
//! 1. `allow`: the syscalls programs need; anything else answers ENOSYS, the errno libc
//!    expects from a syscall it does not know, so it falls back (clone3 -> clone) instead
//!    of failing.
//! 2. `deny`: what a hostile payload would use, answered with EPERM: mount and the new mount
//!    API, namespaces, ptrace, keyring, bpf, perf, userfaultfd, io_uring, file handles,
//!    modules, clocks; clone with namespace flags; socket families other than unix, IP and
//!    netlink, netlink protocols other than NETLINK_ROUTE, raw and packet sockets; TIOCSTI;
//!    personality changes. EPERM wins over the allow list's ENOSYS.
//!
//! To these the program adds the netlink watch: `socket(AF_NETLINK, ...)` (only
//! NETLINK_ROUTE gets past the deny list) and `setsockopt(SOL_SOCKET, SO_RCVBUF)` become
//! user notifications that the init answers (netlink.rs); the program is installed with a
//! listener, which the payload hands to the init before it execs.
//!
//! build.rs turns the policy into one program (src/sandbox/seccomp_program.rs: a binary
//! search over syscall numbers, seccompiler's code for the few argument conditions) and
//! embeds it; the init only decodes it, and the payload installs it last, right before
//! execve. Foreign architectures (i386's int 0x80 on x86_64) are killed; x32 syscall
//! numbers match no allowed entry and answer ENOSYS.
//!
//! With an exec allowlist, a second filter refuses `memfd_create` (EPERM): a memfd is the
//! one file no noexec mount and no landlock rule covers.

use std::os::fd::OwnedFd;

use libc::sock_filter;

/// The compiled filters, in installation order.
pub struct Filters {
    /// With an exec allowlist: `memfd_create` refused (a memfd lives on the kernel's
    /// internal shmem mount, which is not noexec and which landlock lets through, so it
    /// could hold a program to `execveat`).
    memfd: Option<Vec<sock_filter>>,
    /// The policy's program, with the netlink watch.
    sandbox: Vec<sock_filter>,
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
            op(JEQ_K, 0, 3, AUDIT_ARCH), // else 5 (the sandbox program kills those)
            /* 2 */ op(LD_W_ABS, 0, 0, 0),
            /* 3 */ op(JEQ_K, 0, 1, libc::SYS_memfd_create as u32), // else 5
            /* 4 */ op(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
            /* 5 */ op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        ]);
    }
}

/// This architecture's program, as build.rs compiled it.
pub fn compile() -> Result<Filters, String> {
    let sandbox = decode(include_bytes!(concat!(
        env!("OUT_DIR"),
        "/seccomp-sandbox.bpf"
    )))?;
    Ok(Filters {
        memfd: None,
        sandbox,
    })
}

/// 8-byte little-endian records (code u16, jt u8, jf u8, k u32) back into instructions.
fn decode(bytes: &[u8]) -> Result<Vec<sock_filter>, String> {
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

/// The audit architecture of this build, as seccomp_data.arch holds it.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// Installs the filters on the calling thread (no_new_privs must be set), the sandbox's
/// program last, and returns the listener its notifications (the netlink watch) go to. On
/// failure: which filter, and the error.
pub fn apply(filters: &Filters) -> Result<OwnedFd, (&'static str, std::io::Error)> {
    if let Some(memfd) = &filters.memfd {
        crate::sys::seccomp_filter(memfd).map_err(|e| ("memfd", e))?;
    }
    crate::sys::seccomp_filter_with_listener(&filters.sandbox).map_err(|e| ("sandbox", e))
}

#[cfg(test)]
#[path = "seccomp_program.rs"]
mod program;

#[cfg(test)]
mod tests {
    use super::program::{self, audit_arch, syscall_number};
    use super::*;
    use seccompiler::TargetArch;
    use std::collections::{BTreeMap, BTreeSet};

    const POLICIES: [(&str, TargetArch); 2] = [
        (
            include_str!("../../profiles/seccomp/x86_64.json"),
            TargetArch::x86_64,
        ),
        (
            include_str!("../../profiles/seccomp/aarch64.json"),
            TargetArch::aarch64,
        ),
    ];

    /// A classic BPF seccomp program's answer for (arch, nr, args): the instructions
    /// seccompiler's and codecage's programs use (ld abs, and, jeq/jge/jgt/jset/ja, ret).
    fn run_bpf<I: Into<u64> + Copy>(
        program: &[sock_filter],
        arch: u32,
        nr: u32,
        args: [I; 6],
    ) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, arg) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&(*arg).into().to_le_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = program[pc];
            pc += 1;
            match i.code {
                0x20 => {
                    let at = i.k as usize;
                    acc = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
                }
                0x54 => acc &= i.k,
                0x15 | 0x35 | 0x25 | 0x45 => {
                    let taken = match i.code {
                        0x15 => acc == i.k,
                        0x35 => acc >= i.k,
                        0x25 => acc > i.k,
                        _ => acc & i.k != 0,
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                0x05 => pc += i.k as usize,
                0x06 => return i.k,
                other => panic!("instruction {other:#x} not emulated"),
            }
        }
    }

    /// seccompiler's instructions as libc's (the same layout).
    fn as_libc(program: Vec<seccompiler::sock_filter>) -> Vec<sock_filter> {
        program
            .into_iter()
            .map(|i| sock_filter {
                code: i.code,
                jt: i.jt,
                jf: i.jf,
                k: i.k,
            })
            .collect()
    }

    /// What stacked filters answer, by the kernel's rule: the strongest action (the
    /// lowest as a signed number), and among equal ones the filter installed last.
    fn stacked(answers_in_install_order: &[u32]) -> u32 {
        let action = |r: u32| (r & libc::SECCOMP_RET_ACTION_FULL) as i32;
        let mut result = *answers_in_install_order.last().unwrap();
        for &r in answers_in_install_order.iter().rev() {
            if action(r) < action(result) {
                result = r;
            }
        }
        result
    }

    /// The netlink watch as it was a filter of its own, for the comparison.
    fn watch_program(target: TargetArch) -> Vec<sock_filter> {
        const LD_W_ABS: u16 = 0x20;
        const JEQ_K: u16 = 0x15;
        const RET_K: u16 = 0x06;
        let op = |code: u16, jt: u8, jf: u8, k: u32| sock_filter { code, jt, jf, k };
        vec![
            /* 0 */ op(LD_W_ABS, 0, 0, 4),
            /* 1 */ op(JEQ_K, 0, 10, audit_arch(target)), // else 12
            /* 2 */ op(LD_W_ABS, 0, 0, 0),
            /* 3 */ op(JEQ_K, 0, 2, syscall_number("socket", target)), // else 6
            /* 4 */ op(LD_W_ABS, 0, 0, 16),
            /* 5 */ op(JEQ_K, 5, 6, libc::AF_NETLINK as u32), // 11 or 12
            /* 6 */ op(JEQ_K, 0, 5, syscall_number("setsockopt", target)), // else 12
            /* 7 */ op(LD_W_ABS, 0, 0, 24),
            /* 8 */ op(JEQ_K, 0, 3, libc::SOL_SOCKET as u32), // else 12
            /* 9 */ op(LD_W_ABS, 0, 0, 32),
            /* 10 */ op(JEQ_K, 0, 1, libc::SO_RCVBUF as u32), // 11 or 12
            /* 11 */ op(RET_K, 0, 0, libc::SECCOMP_RET_USER_NOTIF),
            /* 12 */ op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        ]
    }

    /// The three filters the program replaced, compiled from `policy` (the netlink watch,
    /// seccompiler's allow and deny programs, in the order they were installed).
    fn the_three_filters(policy: &str, target: TargetArch) -> [Vec<sock_filter>; 3] {
        let mut compiled = seccompiler::compile_from_json(policy.as_bytes(), target).unwrap();
        [
            watch_program(target),
            as_libc(compiled.remove("allow").unwrap()),
            as_libc(compiled.remove("deny").unwrap()),
        ]
    }

    /// For each syscall whose answer depends on its arguments (the policy's deny rules with
    /// conditions, and the watch's two), the values worth trying at each argument index:
    /// every constant the rules compare with or mask by and its neighbours, with and
    /// without a high half, and 0, 1 and all ones; the indices no condition reads get 0,
    /// then all ones.
    fn argument_grid(policy: &str, target: TargetArch) -> BTreeMap<u32, Vec<[u64; 6]>> {
        let json: serde_json::Value = serde_json::from_str(policy).unwrap();
        let mut constants: BTreeMap<u32, [BTreeSet<u64>; 6]> = BTreeMap::new();
        let mut note = |name: &str, index: usize, value: u64| {
            constants.entry(syscall_number(name, target)).or_default()[index].insert(value);
        };
        for rule in json["deny"]["filter"].as_array().unwrap() {
            for arg in rule["args"].as_array().into_iter().flatten() {
                let index = arg["index"].as_u64().unwrap() as usize;
                note(
                    rule["syscall"].as_str().unwrap(),
                    index,
                    arg["val"].as_u64().unwrap(),
                );
                if let Some(mask) = arg["op"]["masked_eq"].as_u64() {
                    note(rule["syscall"].as_str().unwrap(), index, mask);
                }
            }
        }
        note("socket", 0, libc::AF_NETLINK as u64);
        note("setsockopt", 1, libc::SOL_SOCKET as u64);
        note("setsockopt", 2, libc::SO_RCVBUF as u64);
        constants
            .into_iter()
            .map(|(nr, by_index)| {
                let mut grid = vec![[0u64; 6]];
                for (index, found) in by_index.iter().enumerate() {
                    if found.is_empty() {
                        continue;
                    }
                    let mut values: BTreeSet<u64> = [0, 1, 0xffff_ffff, u64::MAX].into();
                    for &v in found {
                        for near in [v, v.wrapping_add(1), v.wrapping_sub(1)] {
                            values.insert(near);
                            values.insert(near | (1 << 32));
                        }
                    }
                    grid = grid
                        .into_iter()
                        .flat_map(|args| {
                            values.iter().map(move |&v| {
                                let mut args = args;
                                args[index] = v;
                                args
                            })
                        })
                        .collect();
                }
                // The indices no condition reads: 0 above, all ones here.
                let unread: Vec<usize> = (0..6).filter(|&i| by_index[i].is_empty()).collect();
                let mut all_ones = grid.clone();
                for args in &mut all_ones {
                    for &i in &unread {
                        args[i] = u64::MAX;
                    }
                }
                grid.extend(all_ones);
                (nr, grid)
            })
            .collect()
    }

    /// The syscall numbers tried: every number up to past the last syscall, x32's, a
    /// sample of the rest of the 32-bit range, and the edges of its halves.
    fn numbers() -> impl Iterator<Item = u32> {
        (0..1100)
            .chain((0..1100).map(|n| n | 0x4000_0000))
            .chain((0..=u32::MAX).step_by(1_048_573))
            .chain([
                0x7fff_ffff,
                0x8000_0000,
                0x8000_0001,
                u32::MAX - 1,
                u32::MAX,
            ])
    }

    /// The one program decides every syscall number, and every argument the policy's
    /// conditions look at, as the three filters it replaced did together (the netlink
    /// watch, seccompiler's allow and deny programs, installed in that order), on both
    /// architectures.
    #[test]
    fn the_program_answers_as_the_three_filters_did() {
        for (policy, target) in POLICIES {
            let ours = as_libc(program::sandbox_program(policy, target));
            let [watch, allow, deny] = the_three_filters(policy, target);
            assert!(
                ours.len() < allow.len() + deny.len(),
                "{target:?}: {} instructions",
                ours.len()
            );
            let theirs = |arch: u32, nr: u32, args: [u64; 6]| {
                stacked(&[
                    run_bpf(&watch, arch, nr, args),
                    run_bpf(&allow, arch, nr, args),
                    run_bpf(&deny, arch, nr, args),
                ])
            };
            let grids = argument_grid(policy, target);
            let plain = vec![[0; 6], [16, 1, 8, 0x5412, 0x4000_0000, u64::MAX]];
            let arch = audit_arch(target);
            let mut checked = 0u64;
            for nr in numbers() {
                for &args in grids.get(&nr).unwrap_or(&plain) {
                    assert_eq!(
                        run_bpf(&ours, arch, nr, args),
                        theirs(arch, nr, args),
                        "{target:?}: syscall {nr} with {args:x?}"
                    );
                    checked += 1;
                }
            }
            // A foreign architecture (i386's int 0x80, arm's, the other of the two) is
            // killed, whatever the number.
            let other = audit_arch(match target {
                TargetArch::x86_64 => TargetArch::aarch64,
                _ => TargetArch::x86_64,
            });
            for foreign in [0x4000_0003, 0x4000_0028, other, 0] {
                for nr in (0..600).chain([u32::MAX]) {
                    assert_eq!(
                        run_bpf(&ours, foreign, nr, [0u64; 6]),
                        libc::SECCOMP_RET_KILL_PROCESS
                    );
                    assert_eq!(theirs(foreign, nr, [0; 6]), libc::SECCOMP_RET_KILL_PROCESS);
                }
            }
            assert!(checked > 30_000, "{checked}");
        }
    }

    /// Under an exec allowlist the memfd filter now comes before the program, not after
    /// the three filters: every syscall still gets the same answer (memfd_create EPERM).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_memfd_filter_before_the_program_answers_as_after_the_three() {
        let (policy, target) = POLICIES[0];
        let mut filters = compile().unwrap();
        filters.deny_memfd();
        let (memfd, ours) = (filters.memfd.unwrap(), filters.sandbox);
        let [watch, allow, deny] = the_three_filters(policy, target);
        for nr in numbers() {
            let args = [0u64; 6];
            let run = |program: &[sock_filter]| run_bpf(program, AUDIT_ARCH, nr, args);
            assert_eq!(
                stacked(&[run(&memfd), run(&ours)]),
                stacked(&[run(&watch), run(&allow), run(&deny), run(&memfd)]),
                "syscall {nr}"
            );
        }
        assert_eq!(
            stacked(&[
                run_bpf(&memfd, AUDIT_ARCH, libc::SYS_memfd_create as u32, [0u64; 6]),
                run_bpf(&ours, AUDIT_ARCH, libc::SYS_memfd_create as u32, [0u64; 6]),
            ]),
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32
        );
    }

    /// build.rs embedded what the generator makes of this architecture's policy.
    #[test]
    fn the_embedded_program_is_the_policys() {
        #[cfg(target_arch = "x86_64")]
        let (policy, target) = POLICIES[0];
        #[cfg(target_arch = "aarch64")]
        let (policy, target) = POLICIES[1];
        let embedded = compile().unwrap().sandbox;
        let generated = as_libc(program::sandbox_program(policy, target));
        assert_eq!(embedded.len(), generated.len());
        for (a, b) in embedded.iter().zip(&generated) {
            assert_eq!((a.code, a.jt, a.jf, a.k), (b.code, b.jt, b.jf, b.k));
        }
    }

    #[test]
    fn every_entry_has_a_reason() {
        for (file, _) in POLICIES {
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

    /// The filters in the kernel, applied in a thread of their own so the test process
    /// stays unfiltered. Nobody holds the listener, so the watched calls answer ENOSYS (the
    /// kernel's answer for a notification nobody can receive): proof that they are watched.
    #[test]
    fn denied_calls_get_the_documented_errno() {
        let mut filters = compile().unwrap();
        filters.deny_memfd();
        let results = std::thread::spawn(move || {
            nix::sys::prctl::set_no_new_privs().unwrap();
            drop(apply(&filters).unwrap());
            let errno = |ret: libc::c_long| {
                if ret < 0 {
                    nix::errno::Errno::last_raw()
                } else {
                    0
                }
            };
            let udp = || {
                // SAFETY: plain socket(2).
                unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) }
            };
            let fd = udp();
            let rcvbuf: libc::c_int = 4096;
            // SAFETY: each call fails in the filter before reaching the kernel, or is
            // harmless; `rcvbuf` outlives the setsockopt calls.
            let results = unsafe {
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
                    errno(libc::syscall(
                        libc::SYS_setsockopt,
                        fd,
                        libc::SOL_SOCKET,
                        libc::SO_RCVBUF,
                        &rcvbuf as *const libc::c_int,
                        std::mem::size_of::<libc::c_int>(),
                    )),
                    errno(libc::syscall(
                        libc::SYS_setsockopt,
                        fd,
                        libc::SOL_SOCKET,
                        libc::SO_SNDBUF,
                        &rcvbuf as *const libc::c_int,
                        std::mem::size_of::<libc::c_int>(),
                    )),
                    errno(libc::syscall(libc::SYS_memfd_create, c"x".as_ptr(), 0)),
                ]
            };
            // SAFETY: the socket this thread opened.
            unsafe { libc::close(fd) };
            (fd >= 0, results)
        })
        .join()
        .unwrap();
        use libc::{ENOSYS, EPERM};
        assert_eq!(
            results,
            (
                true,
                [
                    EPERM, ENOSYS, EPERM, EPERM, EPERM, EPERM, EPERM, EPERM, 0, EPERM, ENOSYS,
                    ENOSYS, 0, EPERM
                ]
            )
        );
    }
}
