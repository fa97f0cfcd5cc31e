//! Landlock: what the payload may reach, by path and by port, on top of the read-only
//! mounts and the empty network namespace. Built in the payload after pivot_root, because
//! rules bind to the inodes their paths name when the ruleset is built.
//!
//! - read and execute everywhere under `/`;
//! - read and write in `/tmp`, `/work` and `/dev/shm`, and on the harmless devices;
//! - no TCP bind or connect at all (ABI 4);
//! - no abstract unix sockets or signals beyond the sandbox's own domain (ABI 6).

use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, CompatLevel, Compatible, LandlockStatus,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

use crate::protocol::{SetupError, Step};
use crate::spec::LayerMode;

/// The ABI whose rights codecage asks for: filesystem (1-3, 5), TCP (4), scopes (6).
const TARGET: ABI = ABI::V6;

/// What was enforced.
pub struct Enforced {
    /// The kernel's landlock ABI, if it has landlock.
    pub abi: Option<u32>,
    /// What the kernel could not enforce (best-effort mode only).
    pub skipped: Vec<String>,
}

/// Restricts this process and its future children.
pub fn restrict(mode: LayerMode) -> Result<Enforced, SetupError> {
    if mode == LayerMode::Off {
        return Ok(Enforced {
            abi: None,
            skipped: vec!["landlock: turned off by the profile".into()],
        });
    }
    let status = build_and_restrict().map_err(|e| {
        SetupError::from_error(
            Step::RestrictWithLandlock,
            &e,
            "building the landlock ruleset",
        )
    })?;
    let abi = match status.landlock {
        LandlockStatus::Available {
            effective_abi,
            kernel_abi,
        } => Some(kernel_abi.map_or(effective_abi as u32, |v| v as u32)),
        _ => None,
    };
    if status.ruleset == RulesetStatus::FullyEnforced {
        return Ok(Enforced {
            abi,
            skipped: Vec::new(),
        });
    }
    let missing = missing_features(abi);
    if mode == LayerMode::Required {
        return Err(SetupError::refused(
            Step::RestrictWithLandlock,
            format!(
                "landlock ABI {} is required and this kernel has {}: {missing}. Use a newer kernel (6.12+), or set \
                 landlock = \"best-effort\" in the profile to run with what this kernel enforces",
                TARGET as u32,
                abi.map_or("no landlock".to_string(), |a| format!("ABI {a}")),
            ),
        ));
    }
    Ok(Enforced {
        abi,
        skipped: vec![format!("landlock: {missing}")],
    })
}

fn build_and_restrict() -> Result<landlock::RestrictionStatus, landlock::RulesetError> {
    let read = AccessFs::from_read(TARGET);
    let all = AccessFs::from_all(TARGET);
    Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)?
        .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)?
        .create()?
        .add_rules(path_beneath_rules(["/"], read))?
        .add_rules(path_beneath_rules(["/tmp", "/work", "/dev/shm"], all))?
        .add_rules(path_beneath_rules(
            ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"],
            AccessFs::from_file(TARGET),
        ))?
        .restrict_self()
}

/// What a kernel of landlock ABI `abi` lacks of what codecage asks for.
fn missing_features(abi: Option<u32>) -> String {
    let Some(abi) = abi else {
        return "the kernel has no landlock (needs Linux 5.13+ with landlock in the lsm= list)"
            .into();
    };
    let mut missing = Vec::new();
    for (needed, what) in [
        (2, "file renames across directories (ABI 2, Linux 5.19)"),
        (3, "truncation (ABI 3, Linux 6.2)"),
        (4, "TCP bind and connect rules (ABI 4, Linux 6.7)"),
        (5, "device ioctls (ABI 5, Linux 6.10)"),
        (
            6,
            "abstract unix socket and signal scopes (ABI 6, Linux 6.12)",
        ),
    ] {
        if abi < needed {
            missing.push(what);
        }
    }
    format!("not enforced: {}", missing.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_features_name_the_abi() {
        assert!(missing_features(Some(2)).contains("TCP bind and connect rules (ABI 4"));
        assert!(!missing_features(Some(5)).contains("ABI 4"));
        assert!(missing_features(None).contains("no landlock"));
    }
}
