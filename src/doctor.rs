//! `codecage doctor`: what this host supports, layer by layer, checked for real where a
//! check is cheap (a cgroup is created and removed; nothing else is changed).

use std::path::Path;

use serde::Serialize;

use crate::cgroup::{self, Controller, Layout, Limits, RunCgroup};
use crate::outcome::Skipped;

/// One layer's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// The layer or limit.
    pub name: &'static str,
    /// It works here.
    pub ok: bool,
    /// How (the mechanism, the files), or why not and what to do.
    pub detail: String,
}

/// Everything `doctor` found.
#[derive(Debug, Clone, Serialize)]
pub struct HostReport {
    pub kernel: String,
    pub cgroup_layout: &'static str,
    pub checks: Vec<Check>,
    /// What a run with the default profiles does not enforce on this host, and what covers it.
    pub not_enforced: Vec<Skipped>,
}

impl HostReport {
    /// Every check passed.
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
}

/// Probes the host.
pub fn probe() -> HostReport {
    let layout = cgroup::layout();
    let mut checks = vec![user_namespaces(), userns_restrictions()];
    checks.extend(cgroup_checks(layout));
    let (landlock, not_enforced) = landlock();
    checks.push(landlock);
    checks.push(seccomp());
    HostReport {
        kernel: kernel(),
        cgroup_layout: layout.name(),
        checks,
        not_enforced,
    }
}

fn kernel() -> String {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{} ({})", release.trim(), std::env::consts::ARCH)
}

fn user_namespaces() -> Check {
    let max = std::fs::read_to_string("/proc/sys/user/max_user_namespaces").ok();
    let max: Option<u64> = max.and_then(|m| m.trim().parse().ok());
    let (ok, detail) = match max {
        Some(0) => (
            false,
            "disabled: /proc/sys/user/max_user_namespaces is 0 (set it, e.g. to 10000)".to_string(),
        ),
        Some(n) => (true, format!("available (max_user_namespaces {n})")),
        None => (
            false,
            "not supported by this kernel (no /proc/sys/user/max_user_namespaces)".to_string(),
        ),
    };
    Check {
        name: "user namespaces",
        ok,
        detail,
    }
}

/// Ubuntu 23.10+ (AppArmor) and older Debian kernels restrict user namespaces for
/// unprivileged users. The launcher runs as root with CAP_SYS_ADMIN, which neither affects.
fn userns_restrictions() -> Check {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|v| v.trim().to_string())
    };
    let mut notes = Vec::new();
    if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
        notes.push("AppArmor restricts unprivileged user namespaces (apparmor_restrict_unprivileged_userns=1)");
    }
    if read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        notes.push("unprivileged user namespaces are disabled (unprivileged_userns_clone=0)");
    }
    let detail = if notes.is_empty() {
        "none for unprivileged users".to_string()
    } else {
        format!(
            "{}; codecage's launcher runs as root with CAP_SYS_ADMIN, which this does not affect",
            notes.join("; ")
        )
    };
    Check {
        name: "userns restrictions",
        ok: true,
        detail,
    }
}

fn landlock() -> (Check, Vec<Skipped>) {
    use crate::sandbox::landlock::FEATURES;
    match crate::sys::landlock_abi() {
        Ok(abi) => {
            let missing: Vec<Skipped> = FEATURES
                .iter()
                .filter(|f| f.abi > abi)
                .map(|f| {
                    Skipped::new(
                        "landlock",
                        f.what,
                        format!("this kernel has landlock ABI {abi}"),
                    )
                    .covered_by(f.covered_by)
                })
                .collect();
            let detail = if missing.is_empty() {
                format!("ABI {abi}: filesystem rules, abstract unix socket and signal scopes")
            } else {
                format!(
                    "ABI {abi}: filesystem rules; the default profiles run here without {} (covered by other \
                     layers, see not_enforced); landlock = \"strict\" profiles need ABI 6 (Linux 6.12)",
                    missing.iter().map(|m| m.feature.as_str()).collect::<Vec<_>>().join(", ")
                )
            };
            let check = Check {
                name: "landlock",
                ok: true,
                detail,
            };
            (check, missing)
        }
        Err(errno) => {
            let check = Check {
                name: "landlock",
                ok: false,
                detail: format!(
                    "unavailable ({}): the default profiles refuse to run. Boot with landlock in lsm= (Linux \
                     5.13+), or use profiles with landlock = \"best-effort\"",
                    nix::errno::Errno::from_raw(errno)
                ),
            };
            let skipped =
                Skipped::new("landlock", "the whole layer", "this kernel has no landlock");
            (check, vec![skipped])
        }
    }
}

fn seccomp() -> Check {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let supported = status.lines().any(|l| l.starts_with("Seccomp:"));
    let policy = crate::sandbox::seccomp_policy_check();
    let ok = supported && policy.is_ok();
    let detail = match (supported, policy) {
        (true, Ok(arch)) => format!(
            "filter mode available; policy profiles/seccomp/{arch}.json compiles (policies: x86_64, aarch64)"
        ),
        (false, _) => "this kernel has no seccomp (CONFIG_SECCOMP_FILTER)".to_string(),
        (true, Err(e)) => e,
    };
    Check {
        name: "seccomp",
        ok,
        detail,
    }
}

fn cgroup_checks(layout: &Layout) -> Vec<Check> {
    let mut checks = vec![Check {
        name: "cgroup layout",
        ok: *layout != Layout::None,
        detail: layout.to_string(),
    }];
    // The real test: create a run cgroup with limits, then remove it.
    let created = RunCgroup::create(layout, &Limits::default(), false);
    let (ok, why) = match created {
        Ok(run) => match run.remove() {
            Ok(()) => (true, String::new()),
            Err(e) => (false, e.to_string()),
        },
        Err(e) => (false, e.to_string()),
    };
    let how = |v2: &str, v1: &str| -> String {
        match layout {
            Layout::V2 { .. } => v2.to_string(),
            _ => v1.to_string(),
        }
    };
    let limit = |name: &'static str, controller: Controller, mechanism: String| {
        let present = match layout {
            Layout::V2 { root } => controller_available(root, controller),
            _ => layout.v1(controller).is_some(),
        };
        let ok = present && ok;
        let detail = if ok {
            mechanism
        } else if !present {
            format!("no {} controller here", controller.name())
        } else {
            why.clone()
        };
        Check { name, ok, detail }
    };
    checks.push(limit(
        "memory limit",
        Controller::Memory,
        how(
            "memory.max, memory.swap.max = 0",
            "memory.limit_in_bytes and memory.memsw.limit_in_bytes",
        ),
    ));
    checks.push(limit(
        "cpu limit",
        Controller::Cpu,
        how("cpu.max", "cpu.cfs_quota_us"),
    ));
    checks.push(limit(
        "pids limit",
        Controller::Pids,
        how("pids.max", "pids.max"),
    ));
    let unified = match layout {
        Layout::V2 { root } => Some(root.clone()),
        Layout::Hybrid { unified, .. } => Some(unified.clone()),
        _ => None,
    };
    checks.push(Check {
        name: "kill and placement",
        ok: true,
        detail: match unified {
            Some(dir) => format!(
                "the init is born in its cgroup (CLONE_INTO_CGROUP, {}); SIGKILL of the pid-namespace init and cgroup.kill stop the sandbox",
                dir.display()
            ),
            None => "the init is attached by pid before it runs; SIGKILL of the pid-namespace init stops the sandbox".into(),
        },
    });
    checks
}

fn controller_available(root: &Path, controller: Controller) -> bool {
    std::fs::read_to_string(root.join("cgroup.controllers"))
        .map(|c| c.split_whitespace().any(|n| n == controller.name()))
        .unwrap_or(false)
}
