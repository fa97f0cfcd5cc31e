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

/// The kernel's landlock ABI (landlock_create_ruleset's version query), as the sandbox
/// sees it when it applies its rules: None where the kernel has no landlock or does not
/// enable it (`lsm=`).
pub fn landlock_abi() -> Option<u32> {
    crate::sys::landlock_abi().ok()
}

fn landlock() -> (Check, Vec<Skipped>) {
    match crate::sys::landlock_abi() {
        Ok(abi) => {
            // The default profiles' network mode (none) asks for no TCP rules.
            let missing = crate::sandbox::landlock::lacking(abi, false);
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
    let mut cgroup_kill = None;
    let (ok, why) = match created {
        Ok(run) => {
            cgroup_kill = Some(run.has_cgroup_kill());
            match run.remove() {
                Ok(()) => (true, String::new()),
                Err(e) => (false, e.to_string()),
            }
        }
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
    checks.push(Check {
        name: "cgroup parent",
        ok: true,
        detail: parent_detail(layout),
    });
    checks.push(Check {
        name: "kill and placement",
        ok: true,
        detail: kill_and_placement(layout, cgroup_kill, kernel_at_least(5, 7)),
    });
    checks
}

/// How the init gets into its cgroups and how a sandbox is stopped, as this kernel and
/// layout have it. `cgroup_kill`: whether a run cgroup made here had cgroup.kill (None: no
/// run cgroup could be made).
fn kill_and_placement(
    layout: &Layout,
    cgroup_kill: Option<bool>,
    clone_into_cgroup: bool,
) -> String {
    let born = |dir: &Path| match clone_into_cgroup {
        true => format!(
            "the init is born in its cgroup (CLONE_INTO_CGROUP, {})",
            dir.display()
        ),
        false => format!(
            "the init is attached by pid to its cgroup in {} before it runs (this kernel has no \
             CLONE_INTO_CGROUP, Linux 5.7)",
            dir.display()
        ),
    };
    let placement = match layout {
        Layout::V2 { root } => born(root),
        Layout::Hybrid { unified, .. } => format!(
            "{}, and joins its v1 cgroups itself (their tasks files) before it execs anything",
            born(unified)
        ),
        Layout::V1 { .. } => {
            "the init joins its v1 cgroups itself (their tasks files) before it execs anything"
                .into()
        }
        Layout::None => "no cgroup to place the init in".into(),
    };
    let stop =
        "SIGKILL of the pid-namespace init stops the sandbox (the kernel kills every process of \
                the namespace)";
    let error_path = match (layout, cgroup_kill) {
        (Layout::None, _) | (_, None) => String::new(),
        (_, Some(true)) => {
            "; a run cgroup dropped on an error path with processes inside is emptied with cgroup.kill"
                .into()
        }
        (Layout::V1 { .. }, Some(false)) => {
            "; a run cgroup dropped on an error path with processes inside is emptied by SIGKILL to each \
             process it lists (cgroup v1 has no cgroup.kill)"
                .into()
        }
        (_, Some(false)) => {
            "; a run cgroup dropped on an error path with processes inside is emptied by SIGKILL to each \
             process it lists (this kernel has no cgroup.kill, Linux 5.14)"
                .into()
        }
    };
    format!("{placement}; {stop}{error_path}")
}

/// Where run cgroups go, for this process and for a server: at the root of each hierarchy,
/// or, for a `codecage serve` in a delegated cgroup on pure v2, under that cgroup.
fn parent_detail(layout: &Layout) -> String {
    let parents: Vec<String> = cgroup::delegation::parents(layout)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let here = format!("{} (codecage run, and this check)", parents.join(", "));
    match layout {
        Layout::V2 { root } => {
            let own = cgroup::delegation::own_cgroup(root);
            let delegated = own.as_deref().is_some_and(cgroup::delegation::is_delegated);
            format!(
                "{here}; a codecage serve whose own cgroup is delegated (systemd's Delegate=yes: the \
                 trusted.delegate xattr) moves itself into <its cgroup>/supervisor and puts its sandboxes \
                 under <its cgroup>/codecage; this process's cgroup {} is {}delegated",
                own.map_or("(unknown)".into(), |o| o.display().to_string()),
                if delegated { "" } else { "not " }
            )
        }
        Layout::None => here,
        _ => format!(
            "{here}; a server uses a delegated cgroup on pure cgroup v2 only, this host is {}",
            layout.name()
        ),
    }
}

/// Whether the running kernel's version is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    crate::sys::running_kernel().is_some_and(|v| v >= (major, minor))
}

fn controller_available(root: &Path, controller: Controller) -> bool {
    std::fs::read_to_string(root.join("cgroup.controllers"))
        .map(|c| c.split_whitespace().any(|n| n == controller.name()))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_parse() {
        use crate::sys::kernel_version;
        assert_eq!(kernel_version("5.10.0-32-amd64\n"), Some((5, 10)));
        assert_eq!(kernel_version("6.18.44-fc-v669"), Some((6, 18)));
        assert_eq!(kernel_version("6.1"), Some((6, 1)));
        assert_eq!(kernel_version("garbage"), None);
    }

    /// What doctor says stops a sandbox follows the kernel: cgroup.kill only where a run
    /// cgroup had it, CLONE_INTO_CGROUP only from 5.7.
    #[test]
    fn kill_and_placement_name_the_mechanisms_this_kernel_has() {
        let v2 = Layout::V2 {
            root: "/sys/fs/cgroup".into(),
        };
        let new = kill_and_placement(&v2, Some(true), true);
        assert!(new.contains("CLONE_INTO_CGROUP, /sys/fs/cgroup"), "{new}");
        assert!(new.contains("emptied with cgroup.kill"), "{new}");
        let old = kill_and_placement(&v2, Some(false), true);
        assert!(!old.contains("with cgroup.kill"), "{old}");
        assert!(old.contains("this kernel has no cgroup.kill"), "{old}");
        let older = kill_and_placement(&v2, Some(false), false);
        assert!(older.contains("attached by pid"), "{older}");
        assert!(older.contains("no CLONE_INTO_CGROUP"), "{older}");
        let v1 = Layout::V1 {
            controllers: Vec::new(),
        };
        let v1 = kill_and_placement(&v1, Some(false), true);
        assert!(v1.contains("tasks files"), "{v1}");
        assert!(v1.contains("cgroup v1 has no cgroup.kill"), "{v1}");
        for text in [new, old, older, v1] {
            assert!(text.contains("SIGKILL of the pid-namespace init"), "{text}");
        }
    }
}
