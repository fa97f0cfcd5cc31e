//! Landlock: what the payload may reach by path, on top of the read-only mounts and the
//! empty network namespace. Built in the payload after pivot_root, because rules bind to
//! the inodes their paths name when the ruleset is built.
//!
//! - read and execute everywhere under `/`;
//! - read and write in `/tmp`, `/work`, `/dev/shm` and the sandbox's own `/dev/pts`, and on
//!   the harmless devices;
//! - TCP (ABI 4): in network mode `none`, not handled: the network namespace is the
//!   boundary (it holds nothing but the sandbox's own loopback), test suites need servers
//!   and clients on 127.0.0.1, and landlock cannot tell loopback from anywhere else, so it
//!   could only forbid all TCP; in `restricted`, connect only to the ports the gateway
//!   serves for the profile (its allowed ports, the ports of `host:port` rules, DNS, the
//!   package indexes), bind anywhere (nothing can reach a listener: the gateway carries only
//!   connections the sandbox opens); in `full`, not handled (the gateway decides every
//!   connection);
//! - no abstract unix sockets or signals beyond the sandbox's own domain (ABI 6).
//!
//! Each ABI after the first adds a feature another layer already covers ([`FEATURES`]), so
//! by default ([`LandlockMode::Required`]) a kernel with landlock runs whatever its ABI,
//! and the result lists what it lacks and what covers it. Only the filesystem rules of ABI
//! 1 have no full substitute: the read-only mounts stop writes to the image and /etc, but
//! not to the writable kernel files of the payload's own processes in /proc, nor to the
//! devices; landlock does. A kernel without landlock is refused unless the profile says
//! `best-effort` or `off`; `strict` refuses anything below ABI 6.

use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope, ABI,
};

use landlock::NetPort;

use crate::exec_policy::ExecAllowlist;
use crate::network::{Mode as NetworkMode, NetworkSpec};
use crate::outcome::Skipped;
use crate::protocol::{SetupError, Step};
use crate::spec::LandlockMode;

/// The ABI whose rights codecage asks for: filesystem (1-3, 5), scopes (6).
const TARGET: ABI = ABI::V6;

/// A landlock feature newer than ABI 1: the ABI that brought it, and the layer that
/// enforces the same where the kernel lacks it.
pub struct Feature {
    pub abi: u32,
    pub what: &'static str,
    pub covered_by: &'static str,
}

/// What each ABI after the first adds of what codecage asks for, and what covers it
/// without landlock. (ABI 4's TCP rules are not asked for: see the module's comment.)
pub const FEATURES: &[Feature] = &[
    Feature {
        abi: 2,
        what: "file renames and links across directories (landlock ABI 2, Linux 5.19)",
        covered_by: "the read-only mounts: files can only move within /tmp, /work and /dev/shm, all writable anyway",
    },
    Feature {
        abi: 3,
        what: "truncation (landlock ABI 3, Linux 6.2)",
        covered_by: "the read-only mounts and the tmpfs sizes",
    },
    Feature {
        abi: 4,
        what: "TCP bind and connect rules (landlock ABI 4, Linux 6.7)",
        covered_by: "the network namespace (only the sandbox's own loopback exists) and, with a gateway, its check of every connection",
    },
    Feature {
        abi: 5,
        what: "device ioctls (landlock ABI 5, Linux 6.10)",
        covered_by: "the minimal /dev (null, zero, full, random, urandom, tty) and seccomp's TIOCSTI rule",
    },
    Feature {
        abi: 6,
        what: "abstract unix socket and signal scopes (landlock ABI 6, Linux 6.12)",
        covered_by: "the network namespace (abstract sockets are per namespace) and the pid namespace (signals reach only the sandbox)",
    },
];

/// What was enforced.
pub struct Enforced {
    /// The kernel's landlock ABI, if it has landlock.
    pub abi: Option<u32>,
    /// What was not enforced, and why.
    pub skipped: Vec<Skipped>,
}

/// Restricts this process and its future children.
pub fn restrict(
    mode: LandlockMode,
    network: &NetworkSpec,
    exec: Option<&ExecAllowlist>,
) -> Result<Enforced, SetupError> {
    if exec.is_some() && mode == LandlockMode::Off {
        return Err(SetupError::refused(
            Step::RestrictWithLandlock,
            "an exec allowlist needs landlock, and the profile turns it off".to_string(),
        ));
    }
    if mode == LandlockMode::Off {
        return Ok(Enforced {
            abi: None,
            skipped: vec![Skipped::new(
                "landlock",
                "the whole layer",
                "turned off by the profile",
            )],
        });
    }
    let Some(abi) = crate::sys::landlock_abi().ok() else {
        if exec.is_some() {
            return Err(SetupError::refused(
                Step::RestrictWithLandlock,
                format!(
                    "the profile's exec allowlist needs landlock (its EXECUTE right keeps the libraries the \
                     allowed programs map from being run), and {}",
                    no_landlock()
                ),
            ));
        }
        if mode == LandlockMode::BestEffort {
            return Ok(Enforced {
                abi: None,
                skipped: vec![Skipped::new("landlock", "the whole layer", no_landlock())],
            });
        }
        return Err(SetupError::refused(
            Step::RestrictWithLandlock,
            format!(
                "landlock is required and {}. Its filesystem rules are the one landlock feature no other layer \
                 covers. Boot a kernel with landlock (Linux 5.13+, `lsm=...,landlock`), or set landlock = \
                 \"best-effort\" in the profile to run without it",
                no_landlock()
            ),
        ));
    };
    let missing: Vec<&Feature> = FEATURES.iter().filter(|f| f.abi > abi).collect();
    if mode == LandlockMode::Strict && !missing.is_empty() {
        let names: Vec<&str> = missing.iter().map(|f| f.what).collect();
        return Err(SetupError::refused(
            Step::RestrictWithLandlock,
            format!(
                "landlock = \"strict\" needs ABI {} and this kernel has ABI {abi}, without {}. Use a newer kernel \
                 (6.12+), or landlock = \"required\" (the default), which runs with what this kernel has and \
                 lists the rest with the layers that cover it",
                TARGET as u32,
                names.join(", ")
            ),
        ));
    }
    build_and_restrict(network, exec).map_err(|e| {
        SetupError::from_error(
            Step::RestrictWithLandlock,
            &e,
            "building the landlock ruleset",
        )
    })?;
    Ok(Enforced {
        abi: Some(abi),
        skipped: lacking(abi, tcp_rules(network)),
    })
}

/// Whether the ruleset has TCP rules for this network (only `restricted` mode's).
fn tcp_rules(network: &NetworkSpec) -> bool {
    network.mode != NetworkMode::None && network.landlock_connect_ports().is_some()
}

/// What a kernel of landlock ABI `abi` does not enforce of what codecage asks for, each
/// with the layer that covers it; ABI 4's TCP rules count only when they are asked for.
pub fn lacking(abi: u32, tcp_rules: bool) -> Vec<Skipped> {
    FEATURES
        .iter()
        .filter(|f| f.abi > abi && (tcp_rules || f.abi != 4))
        .map(|f| {
            Skipped::new(
                "landlock",
                f.what,
                format!("this kernel has landlock ABI {abi}"),
            )
            .covered_by(f.covered_by)
        })
        .collect()
}

fn no_landlock() -> String {
    match crate::sys::landlock_abi() {
        Err(libc::EOPNOTSUPP) => {
            "this kernel has landlock built in but not enabled (add landlock to its lsm= boot parameter)"
                .into()
        }
        _ => "this kernel has no landlock (it needs Linux 5.13+ built with CONFIG_SECURITY_LANDLOCK)".into(),
    }
}

/// Everything codecage asks for, at the kernel's ABI (the crate drops what it lacks: the
/// features [`restrict`] has listed).
fn build_and_restrict(
    network: &NetworkSpec,
    exec: Option<&ExecAllowlist>,
) -> Result<landlock::RestrictionStatus, landlock::RulesetError> {
    let mut read = AccessFs::from_read(TARGET);
    let mut all = AccessFs::from_all(TARGET);
    let mut file = AccessFs::from_file(TARGET);
    // With an allowlist, EXECUTE only on the allowed programs and their loaders.
    let executable: Vec<&std::path::PathBuf> = match exec {
        Some(exec) => {
            read.remove(AccessFs::Execute);
            all.remove(AccessFs::Execute);
            file.remove(AccessFs::Execute);
            exec.executable().collect()
        }
        None => Vec::new(),
    };
    let (tcp, ports) = match (network.mode, network.landlock_connect_ports()) {
        // The namespace is the boundary (see the module's comment).
        (NetworkMode::None, _) => (landlock::BitFlags::empty(), Vec::new()),
        (_, Some(ports)) => (AccessNet::ConnectTcp.into(), ports),
        (_, None) => (landlock::BitFlags::empty(), Vec::new()),
    };
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(TARGET))?;
    let ruleset = match tcp.is_empty() {
        true => ruleset,
        false => ruleset.handle_access(tcp)?,
    };
    ruleset
        .scope(Scope::AbstractUnixSocket | Scope::Signal)?
        .create()?
        .add_rules(path_beneath_rules(["/"], read))?
        .add_rules(path_beneath_rules(
            ["/tmp", "/work", "/dev/shm", "/dev/pts"],
            all,
        ))?
        .add_rules(path_beneath_rules(
            ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"],
            file,
        ))?
        .add_rules(path_beneath_rules(
            executable,
            landlock::BitFlags::from(AccessFs::Execute),
        ))?
        .add_rules(ports.into_iter().map(|port| {
            Ok::<_, landlock::RulesetError>(NetPort::new(port, AccessNet::ConnectTcp))
        }))?
        .restrict_self()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_abi_after_the_first_is_covered_by_another_layer() {
        let abis: Vec<u32> = FEATURES.iter().map(|f| f.abi).collect();
        assert_eq!(abis, (2..=TARGET as u32).collect::<Vec<_>>());
        for f in FEATURES {
            assert!(f.what.contains(&format!("ABI {}", f.abi)));
            assert!(!f.covered_by.is_empty());
        }
    }
}
