//! The VM lanes, as data: each is a kernel, a cgroup layout and a set of tests, standing for
//! hosts that users run. `vm-run`, `vm-check`, `vm-build`, `vm-test`, `vm-matrix` and
//! `cargo xtask test` take `--lane NAME` (repeatable, or `all`).
//!
//! Every lane boots the same bookworm userland (the test binaries are built on bookworm and
//! need its glibc); what differs is the kernel, its command line, and what the guest's init
//! mounts on `/sys/fs/cgroup`.

use anyhow::{bail, Result};

/// The cgroup layout the guest's init sets up (`CGROUP=` in the guest's config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cgroups {
    /// Pure cgroup v2: `cgroup_no_v1=all`, cgroup2 at `/sys/fs/cgroup` as systemd mounts it.
    V2,
    /// Pure cgroup v1, as a systemd host in "legacy" mode has it (RHEL 8 and older): a tmpfs
    /// at `/sys/fs/cgroup` with one v1 hierarchy per controller (`cpu,cpuacct` and
    /// `net_cls,net_prio` joined) and a named `systemd` one; no cgroup2 mount at all.
    V1,
}

impl Cgroups {
    /// The name codecage's doctor gives the layout (`cgroup_layout`), which is also what
    /// the tests expect in `CODECAGE_TEST_LAYOUT`.
    pub fn name(self) -> &'static str {
        match self {
            Cgroups::V2 => "v2",
            Cgroups::V1 => "v1",
        }
    }

    /// What the kernel command line adds for this layout.
    pub fn kernel_args(self) -> &'static str {
        match self {
            // Every controller on the unified hierarchy, as a systemd host in unified mode.
            Cgroups::V2 => "cgroup_no_v1=all",
            // What systemd's legacy mode asks for; the guest's init (not systemd) reads
            // CGROUP=v1 instead, so this only documents the layout in /proc/cmdline.
            Cgroups::V1 => "systemd.unified_cgroup_hierarchy=0",
        }
    }
}

/// The profiles a lane runs the tests under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profiles {
    /// The built-in profiles, unchanged (the default profiles are what users get).
    Default,
    /// The built-in profiles with `landlock = "best-effort"`, installed in the guest's
    /// `/etc/codecage/profiles/` (which `Profile::load` reads before the built-in ones): a
    /// kernel without landlock refuses the default profiles, and a profile must opt in.
    LandlockBestEffort,
}

/// A test that fails on a lane's kernel for a reason the lane states. The lane runs it, and
/// passes when it fails; when it passes, the lane says so (the entry can go).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownFailure {
    /// The test's full name (`suite::NAME::test`).
    pub test: &'static str,
    pub why: &'static str,
}

/// One lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lane {
    pub name: &'static str,
    /// The hosts the lane stands for.
    pub stands_for: &'static str,
    /// The Debian suite the kernel comes from (`linux-image-amd64` of that suite).
    pub kernel_suite: &'static str,
    pub cgroups: Cgroups,
    /// The integration suites run (libtest filters, `suite::NAME::`); empty: all of them.
    pub suites: &'static [&'static str],
    /// Tests skipped in this lane on top of [`SKIP_EVERYWHERE`] (libtest `--skip`).
    pub skip: &'static [&'static str],
    pub profiles: Profiles,
    /// Whether the kernel has landlock (for `vm-check`, and the probe's expectations).
    pub landlock: bool,
    /// Tests this kernel fails, and why.
    pub known_failures: &'static [KnownFailure],
}

/// Skipped in every lane: the image tests need the default image, which lives on the host
/// (/var/lib/codecage/rootfs), not in the VM, and so do the transcripts (run on the image
/// through the library, the server and MCP); the server's tests (server::, service::) need
/// its clients (curl among them), which are the host's, and so do the MCP tests' (the MCP
/// Python SDK, in a venv of the host) and the E2B front end's (E2B's Python SDK, likewise), the audit tests' (servers and curl), and the pool's
/// (they pre-start the default image's Python); so do the files tests named here (the
/// default image's matplotlib and pandas, or curl through the server). A test that panics
/// while a server it started is up aborts the whole test binary, so these must not run in
/// a VM. The start-up budget and the static launcher's tests trace with strace, which
/// the VMs lack, and the static launcher is linked on the host.
const SKIP_EVERYWHERE: &[&str] = &[
    "image::",
    "server::",
    "service::",
    "mcp::",
    "e2b::",
    "network::",
    "audit::",
    "pool::",
    "transcripts::",
    "budget::",
    "static_launcher::",
    "files::a_plot_and_a_csv_come_back_with_their_sha256_and_media_type",
    "files::bad_input_names_are_refused_and_nothing_runs",
    "files::a_file_that_keeps_growing_is_read_up_to_the_cap_and_the_call_returns",
    "files::a_session_uploads_a_csv_pandas_reads_it_and_the_api_downloads_the_result",
];

/// Skipped in the full lane: the Node.js twins of tests whose subject does not depend on
/// the kernel or the cgroup layout (the session protocol's streams, exits and restarts in
/// Node, CommonJS and ES modules, an npm project), each with a Python or bash twin that
/// runs here, and all of them natively on every change. Node's start costs 2-3 s of both
/// CPUs under TCG bare and about 6 s in a sandbox (measured in this lane), and the lanes
/// are CPU-bound (the cells suite took 108 s one test at a time and 103 s two at a time):
/// these six were about 70 s of the lane's 8 minutes. `basic::hello_world_in_node`, the
/// Node bombs and the Node half of `compat::interfaces_are_listed_from_python_glibc_and_node`
/// still run: Node on this kernel, and its memory and processes under v2's limits.
const NODE_TWINS: &[&str] = &[
    "suite::cells::node_console_writes_to_the_call_s_streams_in_order",
    "suite::cells::node_survives_a_cell_that_closes_or_replaces_its_streams",
    "suite::cells::node_process_exit_gives_its_status_and_a_new_interpreter",
    "suite::sessions::node_keeps_variables_and_required_modules",
    "suite::profiles::node_runs_commonjs_and_es_modules",
    "suite::compat::a_node_project_runs_npm_test_from_a_copied_volume",
];

/// Skipped in the subset lanes: the Node bombs (a spawn loop against the pids limit, a
/// Buffer bomb against the memory limit), 25 s of a lane under TCG each time. Their
/// limits are held there by the Python and bash bombs (the same controllers, charged the
/// same way), and the Node bombs run in the full v2 lane and natively.
const NODE_BOMBS: &[&str] = &["suite::bombs::node_"];

/// The representative subset the lanes other than the first run: what a sandbox must hold
/// on any kernel (isolation, escapes, bombs), that it runs code at all (basic), what the
/// default profiles do on the kernel at hand (portability), a sessions smoke test (a
/// Python and a bash session keep their state across calls, a call's peak memory is its
/// own where the kernel can reset it), the warm pool's early answer (what it reads of the
/// kernel's task flags), and the raw child that shares the launcher's memory (CLONE_VM,
/// CLONE_CHILD_CLEARTID at its exec).
const SUBSET: &[&str] = &[
    "suite::basic::",
    "suite::bombs::",
    "suite::escape::",
    "suite::isolation::",
    PORTABILITY,
    "suite::sessions::python_state_and_imports_persist",
    "suite::sessions::bash_keeps_cd_variables_and_exports_and_reports_the_status",
    "suite::sessions::a_calls_peak_memory_is_its_own",
    "suite::library::a_pre_started_python_is_answered_at_its_word_before_its_exit",
    "suite::library::the_kernel_shows_a_killed_process_as_exiting",
    "suite::library::the_sandbox_child_leaves_no_stack_behind_and_reports_a_failed_exec",
];

/// The subset without the sessions smoke test, for a kernel without landlock: a session is
/// a library `SandboxSpec`, whose landlock is required, and the tests give it no opt-in.
const SUBSET_WITHOUT_SESSIONS: &[&str] = &[
    "suite::basic::",
    "suite::bombs::",
    "suite::escape::",
    "suite::isolation::",
    PORTABILITY,
];

/// The suite that holds the default profiles to what they must do on the kernel at hand
/// (run, or refuse without landlock): in a lane whose profiles opt in, it runs first, with
/// the built-in profiles, and not again under the opt-in.
const PORTABILITY: &str = "suite::portability::";

pub const LANES: &[Lane] = &[
    Lane {
        name: "v2-6.12",
        stands_for: "Debian 12 with bookworm-backports' kernel, Debian 13, and other \
                     systemd hosts on Linux 6.12+ (pure cgroup v2)",
        kernel_suite: "bookworm-backports",
        cgroups: Cgroups::V2,
        suites: &[],
        skip: NODE_TWINS,
        profiles: Profiles::Default,
        landlock: true,
        known_failures: &[],
    },
    Lane {
        name: "debian12-6.1",
        stands_for: "Debian 12 (bookworm) as installed: Linux 6.1, pure cgroup v2",
        kernel_suite: "bookworm",
        cgroups: Cgroups::V2,
        suites: SUBSET,
        skip: NODE_BOMBS,
        profiles: Profiles::Default,
        landlock: true,
        known_failures: &[],
    },
    Lane {
        name: "v1",
        stands_for: "hosts with cgroup v1 only (systemd's legacy layout, as RHEL 8 and \
                     older have), here on Debian 12's Linux 6.1",
        kernel_suite: "bookworm",
        cgroups: Cgroups::V1,
        suites: SUBSET,
        skip: NODE_BOMBS,
        profiles: Profiles::Default,
        landlock: true,
        known_failures: &[],
    },
    Lane {
        name: "no-landlock",
        stands_for: "Debian 11 (bullseye): Linux 5.10, no landlock, pure cgroup v2",
        kernel_suite: "bullseye",
        cgroups: Cgroups::V2,
        suites: SUBSET_WITHOUT_SESSIONS,
        skip: NODE_BOMBS,
        profiles: Profiles::LandlockBestEffort,
        landlock: false,
        known_failures: &[],
    },
];

/// The lane of `vm-run`, `vm-check`, `vm-build` and `vm-test` without `--lane`.
pub const DEFAULT_LANE: &Lane = &LANES[0];

/// The variable that, without `--lane`, changes the default lane's kernel (as it did
/// before there were lanes): e.g. `bookworm` for 6.1.
pub const KERNEL_SUITE_VARIABLE: &str = "CODECAGE_VM_KERNEL_SUITE";

impl Lane {
    /// The lane called `name`.
    pub fn named(name: &str) -> Result<&'static Lane> {
        match LANES.iter().find(|l| l.name == name) {
            Some(lane) => Ok(lane),
            None => bail!(
                "no lane {name:?}; the lanes are {} (or all)",
                LANES.iter().map(|l| l.name).collect::<Vec<_>>().join(", ")
            ),
        }
    }

    /// The lane without `--lane`: [`DEFAULT_LANE`], on the kernel of
    /// `$CODECAGE_VM_KERNEL_SUITE` when that is set.
    pub fn default_from_env() -> Lane {
        match std::env::var(KERNEL_SUITE_VARIABLE) {
            Ok(suite) if !suite.is_empty() && suite != DEFAULT_LANE.kernel_suite => {
                // What a v2 lane on that kernel knows of it, if there is one.
                let like = LANES
                    .iter()
                    .find(|l| l.kernel_suite == suite && l.cgroups == Cgroups::V2);
                Lane {
                    // A name of its own, so that its results are not taken for the lane's.
                    name: Box::leak(format!("{}@{suite}", DEFAULT_LANE.name).into_boxed_str()),
                    stands_for: "the default lane on the kernel of CODECAGE_VM_KERNEL_SUITE",
                    landlock: like.is_none_or(|l| l.landlock),
                    known_failures: like.map_or(&[], |l| l.known_failures),
                    profiles: like.map_or(Profiles::Default, |l| l.profiles),
                    kernel_suite: Box::leak(suite.into_boxed_str()),
                    ..*DEFAULT_LANE
                }
            }
            _ => *DEFAULT_LANE,
        }
    }

    /// The libtest arguments of the lane's selection, in phases: the tests run with the
    /// built-in profiles, then (in a lane whose profiles opt in) the tests run after the
    /// opt-in profiles are installed.
    pub fn test_phases(&self) -> (Vec<String>, Option<Vec<String>>) {
        let skips = |extra: &[&str]| -> Vec<String> {
            SKIP_EVERYWHERE
                .iter()
                .chain(self.skip)
                .chain(extra)
                .flat_map(|s| ["--skip".to_string(), s.to_string()])
                .collect()
        };
        let selection: Vec<String> = self.suites.iter().map(|s| s.to_string()).collect();
        match self.profiles {
            Profiles::Default => ([selection, skips(&[])].concat(), None),
            Profiles::LandlockBestEffort => {
                let built_in = [vec![PORTABILITY.to_string()], skips(&[])].concat();
                let selection: Vec<String> =
                    selection.into_iter().filter(|s| s != PORTABILITY).collect();
                (built_in, Some([selection, skips(&[PORTABILITY])].concat()))
            }
        }
    }

    /// The lane's selection in words, for reports and the README.
    pub fn selection(&self) -> String {
        let mut s = if self.suites.is_empty() {
            "every suite".to_string()
        } else {
            self.suites
                .iter()
                .map(|s| s.trim_start_matches("suite::").trim_end_matches("::"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        {
            // Whole suites by name, single tests (or a prefix of some) counted by suite.
            let mut parts: Vec<String> = Vec::new();
            let mut tests: Vec<(&str, usize)> = Vec::new();
            for skip in SKIP_EVERYWHERE.iter().chain(self.skip) {
                let skip = skip.trim_start_matches("suite::");
                match skip.split_once("::") {
                    Some((suite, "")) => parts.push(format!("{suite}::")),
                    Some((suite, prefix)) if prefix.ends_with('_') => {
                        parts.push(format!("{suite}::{prefix}*"))
                    }
                    Some((suite, _)) => match tests.iter_mut().find(|(s, _)| *s == suite) {
                        Some((_, n)) => *n += 1,
                        None => tests.push((suite, 1)),
                    },
                    None => parts.push(skip.to_string()),
                }
            }
            for (suite, n) in tests {
                parts.push(format!(
                    "{n} {suite}:: test{}",
                    if n > 1 { "s" } else { "" }
                ));
            }
            s.push_str(&format!(" (without {})", parts.join(", ")));
        }
        if self.profiles == Profiles::LandlockBestEffort {
            s.push_str(
                "; portability with the built-in profiles, the rest with landlock = \"best-effort\"",
            );
        }
        s
    }
}

/// `--lane`: a lane's name, or `all`, repeatable; none given: the default lane.
pub fn select(names: &[String]) -> Result<Vec<Lane>> {
    if names.is_empty() {
        return Ok(vec![Lane::default_from_env()]);
    }
    if std::env::var_os(KERNEL_SUITE_VARIABLE).is_some_and(|v| !v.is_empty()) {
        crate::host::warn(format!(
            "{KERNEL_SUITE_VARIABLE} applies only without --lane; the lanes named have kernels of their own"
        ));
    }
    let mut lanes: Vec<Lane> = Vec::new();
    for name in names {
        let chosen: Vec<Lane> = if name == "all" {
            LANES.to_vec()
        } else {
            vec![*Lane::named(name)?]
        };
        for lane in chosen {
            if !lanes.contains(&lane) {
                lanes.push(lane);
            }
        }
    }
    Ok(lanes)
}

/// `--lane`'s value parser: a lane's name or `all`.
pub fn parse_lane(s: &str) -> Result<String, String> {
    if s == "all" || LANES.iter().any(|l| l.name == s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "the lanes are {}, or all",
            LANES.iter().map(|l| l.name).collect::<Vec<_>>().join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_have_unique_names_and_the_default_runs_everything() {
        for (i, lane) in LANES.iter().enumerate() {
            assert!(
                LANES[..i].iter().all(|l| l.name != lane.name),
                "{}",
                lane.name
            );
            assert!(parse_lane(lane.name).is_ok());
        }
        assert!(DEFAULT_LANE.suites.is_empty());
        let skips: Vec<String> = SKIP_EVERYWHERE
            .iter()
            .chain(NODE_TWINS)
            .flat_map(|s| ["--skip".to_string(), s.to_string()])
            .collect();
        assert_eq!(DEFAULT_LANE.test_phases(), (skips, None));
        assert_eq!(
            DEFAULT_LANE.selection(),
            "every suite (without image::, server::, service::, mcp::, e2b::, network::, audit::, pool::, transcripts::, budget::, static_launcher::, 4 files:: tests, 3 cells:: tests, 1 sessions:: test, 1 profiles:: test, 1 compat:: test)"
        );
        assert!(parse_lane("nosuch").is_err());
    }

    #[test]
    fn selection() {
        let names = |v: &[&str]| -> Vec<&str> {
            select(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap()
                .iter()
                .map(|l| l.name)
                .collect()
        };
        assert_eq!(names(&["all"]).len(), LANES.len());
        assert_eq!(names(&["v1", "all", "v1"])[0], "v1");
        assert_eq!(names(&["v1", "all"]).len(), LANES.len());
        assert!(select(&["nosuch".to_string()]).is_err());
        let v1 = Lane::named("v1").unwrap();
        let (args, opt_in) = v1.test_phases();
        assert_eq!(args[..2], ["suite::basic::", "suite::bombs::"]);
        assert!(opt_in.is_none());
        assert_eq!(
            v1.selection(),
            "basic, bombs, escape, isolation, portability, \
             sessions::python_state_and_imports_persist, \
             sessions::bash_keeps_cd_variables_and_exports_and_reports_the_status, \
             sessions::a_calls_peak_memory_is_its_own, \
             library::a_pre_started_python_is_answered_at_its_word_before_its_exit, \
             library::the_kernel_shows_a_killed_process_as_exiting, \
             library::the_sandbox_child_leaves_no_stack_behind_and_reports_a_failed_exec \
             (without image::, server::, service::, mcp::, e2b::, network::, audit::, pool::, transcripts::, budget::, static_launcher::, bombs::node_*, 4 files:: tests)"
        );
    }

    #[test]
    fn a_lane_that_opts_in_runs_portability_with_the_built_in_profiles_only() {
        let lane = Lane::named("no-landlock").unwrap();
        let (built_in, opt_in) = lane.test_phases();
        assert_eq!(
            built_in[..5],
            [
                "suite::portability::",
                "--skip",
                "image::",
                "--skip",
                "server::"
            ]
        );
        assert_eq!(
            built_in.len(),
            1 + 2 * (SKIP_EVERYWHERE.len() + NODE_BOMBS.len())
        );
        let opt_in = opt_in.unwrap();
        assert!(opt_in.contains(&"suite::escape::".to_string()));
        assert!(opt_in.ends_with(&["--skip".to_string(), PORTABILITY.to_string()]));
        assert!(!opt_in[..opt_in.len() - 1].contains(&PORTABILITY.to_string()));
    }
}
