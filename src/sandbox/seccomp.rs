//! Seccomp: the policy is data, one JSON file per architecture in `profiles/seccomp/`, with
//! a reason beside each entry (seccompiler's JSON format, firecracker style). It holds two
//! filters, installed in this order:
//!
//! 1. `allow`: the syscalls programs need; anything else answers ENOSYS, the errno libc
//!    expects from a syscall it does not know, so it falls back (clone3 -> clone) instead
//!    of failing.
//! 2. `deny`: what a hostile payload would use, answered with EPERM: mount and the new mount
//!    API, namespaces, ptrace, keyring, bpf, perf, userfaultfd, io_uring, file handles,
//!    modules, clocks; clone with namespace flags; socket families other than unix and IP,
//!    raw and packet sockets; TIOCSTI; personality changes. Installed last, so its EPERM
//!    wins over the allow filter's ENOSYS (the kernel keeps the most recent filter's value
//!    among equal actions).
//!
//! Foreign architectures (i386's int 0x80 on x86_64) are killed by seccompiler's arch check;
//! x32 syscall numbers match no allowed entry and answer ENOSYS. Compiled in the init, once
//! per run, before the payload is forked; applied last in the payload, right before execve.

use seccompiler::{BpfProgram, TargetArch};

#[cfg(target_arch = "x86_64")]
const POLICY: (&str, TargetArch) = (
    include_str!("../../profiles/seccomp/x86_64.json"),
    TargetArch::x86_64,
);
#[cfg(target_arch = "aarch64")]
const POLICY: (&str, TargetArch) = (
    include_str!("../../profiles/seccomp/aarch64.json"),
    TargetArch::aarch64,
);

/// The compiled filters, in installation order.
pub struct Filters {
    allow: BpfProgram,
    deny: BpfProgram,
}

/// Compiles this architecture's policy.
pub fn compile() -> Result<Filters, String> {
    compile_policy(POLICY.0, POLICY.1)
}

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
    })
}

/// Installs the filters on the calling thread (and sets no_new_privs).
pub fn apply(filters: &Filters) -> Result<(), String> {
    seccompiler::apply_filter(&filters.allow)
        .map_err(|e| format!("installing the allow filter: {e}"))?;
    seccompiler::apply_filter(&filters.deny).map_err(|e| format!("installing the deny filter: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
                ]
            }
        })
        .join()
        .unwrap();
        use libc::{ENOSYS, EPERM};
        assert_eq!(
            results,
            [EPERM, ENOSYS, EPERM, EPERM, EPERM, EPERM, EPERM, EPERM, 0]
        );
    }
}
