//! What a lane found: the probe it ran before its tests (`xtask/vm/probe.py`: the kernel's
//! features, `codecage doctor --json`, a run of the default python profile), the tests'
//! counts, and the support matrix made of them (README.md, "Support matrix").
//!
//! A lane writes into `target/vm-lanes/<lane>/` in the shared directory: `built-in.json`
//! (the probe with the built-in profiles), `opt-in.json` (after a lane's opt-in profiles are
//! installed), `tests.log` (the tests' output). The host reads them after the run.

use super::lanes::{Cgroups, KnownFailure, Lane, Profiles};
use crate::host::secs;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The probe script, written into the lane's directory for the guest to run.
pub const PROBE_PY: &str = include_str!("../../vm/probe.py");

/// The files of one lane's run.
pub struct LaneDir(pub PathBuf);

impl LaneDir {
    /// `<target>/vm-lanes/<lane>`.
    pub fn new(target: &Path, lane: &Lane) -> LaneDir {
        LaneDir(target.join("vm-lanes").join(lane.name))
    }

    /// Empties the directory and writes the probe into it.
    pub fn prepare(&self) -> anyhow::Result<()> {
        crate::host::remove_tree(&self.0)?;
        fs::create_dir_all(&self.0)?;
        fs::write(self.0.join("probe.py"), PROBE_PY)?;
        Ok(())
    }

    fn json(&self, name: &str) -> Option<Value> {
        let text = fs::read_to_string(self.0.join(format!("{name}.json"))).ok()?;
        serde_json::from_str(&text).ok()
    }
}

/// Tests counted from libtest's output.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
    /// The summary lines (`test result: ...`) seen: one per test executable and phase.
    pub summaries: u64,
    /// The names of the tests that failed, and of those that passed.
    pub failures: Vec<String>,
    pub passes: Vec<String>,
}

impl Counts {
    /// The counts in libtest's output: `test result: ok. 59 passed; 0 failed; 1 ignored;
    /// ...` lines, summed; the `test NAME ... FAILED` and `... ok` lines, and the names
    /// listed under `failures:`.
    pub fn parse(log: &str) -> Counts {
        let mut c = Counts::default();
        let mut in_failure_list = false;
        for line in log.lines() {
            if let Some(rest) = line.strip_prefix("test result: ") {
                in_failure_list = false;
                c.summaries += 1;
                for part in rest.split(';') {
                    let mut words = part.split_whitespace().rev();
                    let (Some(what), Some(n)) = (words.next(), words.next()) else {
                        continue;
                    };
                    let Ok(n) = n.parse::<u64>() else { continue };
                    match what {
                        "passed" => c.passed += n,
                        "failed" => c.failed += n,
                        "ignored" => c.ignored += n,
                        _ => {}
                    }
                }
            } else if line == "failures:" {
                in_failure_list = true;
            } else if let Some(name) = line.strip_prefix("    ").filter(|_| in_failure_list) {
                if !name.contains(' ') && !c.failures.iter().any(|f| f == name) {
                    c.failures.push(name.to_string());
                }
            } else if let Some(rest) = line.strip_prefix("test ") {
                if let Some(name) = rest.strip_suffix(" ... FAILED") {
                    if !c.failures.iter().any(|f| f == name) {
                        c.failures.push(name.to_string());
                    }
                } else if let Some(name) = rest.strip_suffix(" ... ok") {
                    c.passes.push(name.to_string());
                }
            }
        }
        c
    }
}

/// One lane's run, as the host saw it.
pub struct LaneReport {
    pub lane: Lane,
    /// The job's exit status (124: timeout, 125: the VM failed), or None when the lane
    /// could not start (`problems` says why).
    pub status: Option<i32>,
    pub elapsed: Duration,
    /// Whether tests were run (not for `vm-matrix`).
    pub ran_tests: bool,
    pub counts: Counts,
    pub built_in: Option<Value>,
    pub opt_in: Option<Value>,
    /// What the probes show that the lane does not expect.
    pub problems: Vec<String>,
    /// Why the lane ran a second time, if it did.
    pub retried: Option<String>,
}

impl LaneReport {
    /// Reads what the lane's run left in `dir`, and checks the probes against the lane.
    pub fn read(
        lane: &Lane,
        dir: &LaneDir,
        status: i32,
        elapsed: Duration,
        ran_tests: bool,
    ) -> LaneReport {
        let log = fs::read_to_string(dir.0.join("tests.log")).unwrap_or_default();
        let mut report = LaneReport {
            lane: *lane,
            status: Some(status),
            elapsed,
            ran_tests,
            counts: Counts::parse(&log),
            built_in: dir.json("built-in"),
            opt_in: dir.json("opt-in"),
            problems: Vec::new(),
            retried: None,
        };
        report.problems = report.check();
        report
    }

    /// A lane that could not start.
    pub fn not_started(lane: &Lane, elapsed: Duration, why: String) -> LaneReport {
        LaneReport {
            lane: *lane,
            status: None,
            elapsed,
            ran_tests: false,
            counts: Counts::default(),
            built_in: None,
            opt_in: None,
            problems: vec![why],
            retried: None,
        }
    }

    /// Whether the lane passed: its job succeeded, or failed only by the tests its kernel
    /// is known to fail (libtest's 101), and the probes show what the lane expects.
    pub fn passed(&self) -> bool {
        self.problems.is_empty() && matches!(self.status, Some(0 | 101))
    }

    /// The known failures of the lane that failed here.
    pub fn known_failed(&self) -> Vec<&'static KnownFailure> {
        self.lane
            .known_failures
            .iter()
            .filter(|k| self.counts.failures.iter().any(|f| f == k.test))
            .collect()
    }

    /// The known failures of the lane that passed here (their entries can go).
    pub fn known_passed(&self) -> Vec<&'static KnownFailure> {
        self.lane
            .known_failures
            .iter()
            .filter(|k| self.counts.passes.iter().any(|p| p == k.test))
            .collect()
    }

    /// The exit status that stands for this lane: 0 when it passed, else the job's, or 1
    /// for a problem the probe or the tests' output shows, or 125 when it could not start.
    pub fn exit_status(&self) -> i32 {
        match self.status {
            _ if self.passed() => 0,
            Some(0 | 101) => 1,
            Some(rc) => rc,
            None => super::EXIT_VM_FAILED,
        }
    }

    /// What the probes must show in this lane: the layout the lane mounts; the default
    /// python profile runs code where the kernel has landlock and is refused where not;
    /// a lane's opt-in profiles run.
    fn check(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let c = &self.counts;
        if self.status == Some(101) {
            // Failed tests: the lane passes only if each is a known failure of its kernel,
            // and the output accounts for every one of them.
            let unexpected: Vec<&String> = c
                .failures
                .iter()
                .filter(|f| {
                    !self
                        .lane
                        .known_failures
                        .iter()
                        .any(|k| k.test == f.as_str())
                })
                .collect();
            if !unexpected.is_empty() {
                problems.push(format!(
                    "{} test(s) failed that this lane does not expect to: {}",
                    unexpected.len(),
                    unexpected
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if c.failed == 0 || c.failed != c.failures.len() as u64 {
                problems.push(format!(
                    "the tests exited 101, and their output names {} failed test(s) of {} counted",
                    c.failures.len(),
                    c.failed
                ));
            }
        }
        if self.ran_tests && matches!(self.status, Some(0 | 101)) && c.summaries == 0 {
            problems.push("the tests' output has no `test result:` line".to_string());
        }
        let Some(built_in) = &self.built_in else {
            if self.status != Some(124) && self.status != Some(125) {
                problems.push("the probe left no built-in.json".to_string());
            }
            return problems;
        };
        let layout = built_in["doctor"]["cgroup_layout"].as_str().unwrap_or("?");
        if layout != self.lane.cgroups.name() {
            problems.push(format!(
                "codecage doctor sees cgroup layout {layout}, the lane mounts {}",
                self.lane.cgroups.name()
            ));
        }
        let run = &built_in["python"];
        let ran = run["error"].is_null() && run["exit_code"] == 0;
        if self.lane.landlock && !ran {
            problems.push(format!(
                "the default python profile did not run code on this kernel: {}",
                one_line(run)
            ));
        }
        if !self.lane.landlock && run["error"] != "setup" {
            problems.push(format!(
                "the default python profile was not refused on a kernel without landlock: {}",
                one_line(run)
            ));
        }
        if self.lane.profiles == Profiles::LandlockBestEffort {
            match &self.opt_in {
                Some(p) if p["python"]["error"].is_null() && p["python"]["exit_code"] == 0 => {}
                Some(p) => problems.push(format!(
                    "the opt-in python profile did not run code: {}",
                    one_line(&p["python"])
                )),
                None if self.status == Some(0) => {
                    problems.push("the probe left no opt-in.json".to_string())
                }
                None => {}
            }
        }
        problems
    }

    /// The lane's line in the per-lane summary.
    pub fn summary_line(&self) -> String {
        let verdict = if self.passed() { "ok" } else { "FAILED" };
        let c = &self.counts;
        let tests = if self.ran_tests {
            format!(
                "{} passed, {} failed ({} known to fail on this kernel), {} ignored",
                c.passed,
                c.failed,
                self.known_failed().len(),
                c.ignored
            )
        } else {
            "probe only".to_string()
        };
        let status = match self.status {
            Some(rc) => format!("exit {rc}"),
            None => "not started".to_string(),
        };
        format!(
            "{:<13} {verdict:<6} {:>7}  {tests} ({status}{}); {}",
            self.lane.name,
            secs(self.elapsed),
            if self.retried.is_some() {
                ", on a second boot: the first VM died"
            } else {
                ""
            },
            self.lane.selection()
        )
    }
}

/// A codecage `--json` answer in one line, for problems.
fn one_line(run: &Value) -> String {
    format!(
        "error={} exit_code={} message={}",
        run["error"],
        run["exit_code"],
        run["message"]
            .as_str()
            .unwrap_or("")
            .lines()
            .next()
            .unwrap_or("")
    )
}

/// The support matrix in markdown: one row per lane, from its probes and tests.
pub fn markdown(reports: &[LaneReport]) -> String {
    let mut s = String::from(
        "| lane | stands for | kernel | cgroups | landlock ABI | default python profile | \
         enforced | not enforced (`skipped_layers`) | tests |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        s.push_str(&row(r));
        s.push('\n');
    }
    s.push('\n');
    s.push_str(&notes(reports));
    s.push_str(&features(reports));
    s
}

/// The kernel features codecage uses, as each lane's probe found them.
fn features(reports: &[LaneReport]) -> String {
    const FEATURES: &[(&str, &str)] = &[
        ("clone3", "clone3 (5.3)"),
        ("pidfd_open", "pidfd_open (5.3)"),
        ("clone_into_cgroup", "CLONE_INTO_CGROUP (5.7)"),
        ("close_range_cloexec", "CLOSE_RANGE_CLOEXEC (5.11)"),
        ("cgroup.kill", "cgroup.kill (5.14)"),
        ("memory.peak", "memory.peak (5.19)"),
    ];
    let mut s =
        String::from("\nKernel features, as each lane's probe found them:\n\n| lane | kernel |");
    for (_, title) in FEATURES {
        s.push_str(&format!(" {title} |"));
    }
    s.push_str("\n|---|---|");
    s.push_str(&"---|".repeat(FEATURES.len()));
    s.push('\n');
    for r in reports {
        let Some(probe) = &r.built_in else { continue };
        s.push_str(&format!(
            "| {} | {} |",
            r.lane.name,
            probe["kernel"].as_str().unwrap_or("?")
        ));
        for (key, _) in FEATURES {
            let f = &probe["features"][*key];
            s.push_str(match f["available"].as_bool() {
                Some(true) => " yes |",
                Some(false) => " no |",
                // cgroup.kill and memory.peak are looked for on v2 only.
                None if r.lane.cgroups == Cgroups::V1 => " n/a (v1) |",
                None => " ? |",
            });
        }
        s.push('\n');
    }
    s
}

fn row(r: &LaneReport) -> String {
    let cells: Vec<String> = match &r.built_in {
        None => vec![
            r.lane.name.to_string(),
            r.lane.stands_for.to_string(),
            format!("(from {})", r.lane.kernel_suite),
            r.lane.cgroups.name().to_string(),
            "?".into(),
            "?".into(),
            "?".into(),
            "?".into(),
            tests_cell(r),
        ],
        Some(probe) => {
            let run = &probe["python"];
            let abi = run["landlock_abi"]
                .as_u64()
                .or_else(|| probe["features"]["landlock"]["abi"].as_u64())
                .map_or_else(|| landlock_absence(probe), |a| a.to_string());
            let mut default = if run["error"].is_null() && run["exit_code"] == 0 {
                "runs code".to_string()
            } else {
                format!(
                    "refused (`{}`): {}",
                    run["error"].as_str().unwrap_or("?"),
                    refusal(run["message"].as_str().unwrap_or(""))
                )
            };
            let mut shown = run;
            if let Some(opt_in) = &r.opt_in {
                let o = &opt_in["python"];
                let verdict = if o["error"].is_null() && o["exit_code"] == 0 {
                    "runs code"
                } else {
                    "fails"
                };
                default.push_str(&format!(
                    "; with `landlock = \"best-effort\"`: {verdict} (the columns to the right)"
                ));
                shown = o;
            }
            vec![
                r.lane.name.to_string(),
                r.lane.stands_for.to_string(),
                probe["kernel"].as_str().unwrap_or("?").to_string(),
                cgroups_cell(probe, r.lane.cgroups),
                abi,
                default,
                enforced(probe, shown),
                skipped(shown),
                tests_cell(r),
            ]
        }
    };
    format!(
        "| {} |",
        cells
            .iter()
            .map(|c| c.replace('|', "\\|"))
            .collect::<Vec<_>>()
            .join(" | ")
    )
}

/// Why there is no landlock: not built, or not enabled (`lsm=`).
fn landlock_absence(probe: &Value) -> String {
    match probe["features"]["landlock"]["probe"].as_str() {
        Some("ENOSYS") => "none (not in this kernel)".into(),
        Some("EOPNOTSUPP") => "none (built, not enabled in lsm=)".into(),
        Some(e) => format!("none ({e})"),
        None => "none".into(),
    }
}

fn cgroups_cell(probe: &Value, expected: Cgroups) -> String {
    let layout = probe["doctor"]["cgroup_layout"].as_str().unwrap_or("?");
    if layout == expected.name() {
        format!("pure {layout}")
    } else {
        format!("{layout} (lane mounts {})", expected.name())
    }
}

/// What the run enforced: the layers whose doctor checks pass and that the run did not
/// skip whole, with the kernel features the fallbacks replaced.
fn enforced(probe: &Value, run: &Value) -> String {
    let skipped_whole = |layer: &str| {
        run["skipped_layers"].as_array().is_some_and(|a| {
            a.iter()
                .any(|s| s["layer"] == layer && s["feature"] == "the whole layer")
        })
    };
    let checks = probe["doctor"]["checks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ok = |name: &str| checks.iter().any(|c| c["name"] == name && c["ok"] == true);
    let mut parts = vec!["namespaces (user, mount, pid, net, ipc, uts, cgroup)".to_string()];
    let limits: Vec<&str> = ["memory", "cpu", "pids"]
        .into_iter()
        .filter(|l| ok(&format!("{l} limit")))
        .filter(|l| {
            !run["skipped_layers"].as_array().is_some_and(|a| {
                a.iter().any(|s| {
                    s["layer"] == "cgroup" && s["feature"].as_str().unwrap_or("").contains(l)
                })
            })
        })
        .collect();
    if !limits.is_empty() {
        parts.push(format!("cgroup limits: {}", limits.join(", ")));
    }
    match run["landlock_abi"].as_u64() {
        Some(abi) if !skipped_whole("landlock") => {
            parts.push(format!("landlock ABI {abi} (what the kernel has)"))
        }
        _ => {}
    }
    if ok("seccomp") && !skipped_whole("seccomp") {
        parts.push("seccomp".to_string());
    }
    let f = &probe["features"];
    let missing: Vec<&str> = [
        ("clone_into_cgroup", "CLONE_INTO_CGROUP"),
        ("close_range_cloexec", "CLOSE_RANGE_CLOEXEC"),
        ("cgroup.kill", "cgroup.kill"),
        ("memory.peak", "memory.peak"),
    ]
    .into_iter()
    .filter(|(key, _)| f[*key]["available"] == false)
    .map(|(_, name)| name)
    .collect();
    let mut s = parts.join("; ");
    if !missing.is_empty() {
        s.push_str(&format!(
            ". Kernel lacks {}: codecage's fallbacks ran",
            missing.join(", ")
        ));
    }
    s
}

/// The run's `skipped_layers`: what each entry leaves out, and whether another layer covers
/// it (`covered_by`; ARCHITECTURE.md's table says which).
fn skipped(run: &Value) -> String {
    let Some(list) = run["skipped_layers"].as_array() else {
        return "?".into();
    };
    if list.is_empty() {
        return "nothing".into();
    }
    list.iter()
        .map(|s| {
            let feature = s["feature"].as_str().unwrap_or("?");
            let layer = s["layer"].as_str().unwrap_or("?");
            let what = if feature == "the whole layer" {
                format!(
                    "{layer}, the whole layer ({})",
                    s["reason"].as_str().unwrap_or("?")
                )
            } else {
                format!("{layer} {feature}")
            };
            match s["covered_by"].as_str() {
                Some(_) => format!("{what}: covered"),
                None => format!("{what}: not covered"),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn tests_cell(r: &LaneReport) -> String {
    let c = &r.counts;
    if !r.ran_tests {
        return "not run (probe only)".to_string();
    }
    let known = r.known_failed().len();
    let mut s = format!(
        "{}: {} of {} passed",
        if r.passed() { "passed" } else { "FAILED" },
        c.passed,
        c.passed + c.failed
    );
    if known > 0 {
        s.push_str(&format!(", {known} known failures (below)"));
    }
    if c.failed as usize > known {
        s.push_str(&format!(", {} unexpected", c.failed as usize - known));
    }
    if c.ignored > 0 {
        s.push_str(&format!(", {} ignored", c.ignored));
    }
    s.push_str(&format!("; {}", secs(r.elapsed)));
    s
}

/// Below the table: each lane's tests, its known failures and why, what it could not do.
fn notes(reports: &[LaneReport]) -> String {
    let mut s = String::new();
    for r in reports {
        s.push_str(&format!("- **{}**: {}", r.lane.name, r.lane.stands_for));
        if r.ran_tests {
            s.push_str(&format!(". Tests: {}", r.lane.selection()));
        }
        s.push_str(".\n");
        for k in r.known_failed() {
            s.push_str(&format!("  - known failure `{}`: {}\n", k.test, k.why));
        }
        for k in r.known_passed() {
            s.push_str(&format!(
                "  - `{}` is listed as a known failure but passed: the entry can go\n",
                k.test
            ));
        }
        let unexpected: Vec<&String> = r
            .counts
            .failures
            .iter()
            .filter(|f| !r.lane.known_failures.iter().any(|k| k.test == f.as_str()))
            .collect();
        for f in unexpected {
            s.push_str(&format!("  - FAILED `{f}`\n"));
        }
        for p in &r.problems {
            s.push_str(&format!("  - problem: {p}\n"));
        }
        if let Some(why) = &r.retried {
            s.push_str(&format!("  - retried: {why}\n"));
        }
    }
    s
}

/// The reason of a refusal: its first sentence, without the step it names.
fn refusal(message: &str) -> String {
    let first = message.split(". ").next().unwrap_or(message);
    let reason = first.split_once(": ").map_or(first, |(step, reason)| {
        if step.starts_with("sandbox setup failed") {
            reason
        } else {
            first
        }
    });
    reason.trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_libtest_output() {
        let log = "running 3 tests\ntest suite::a::x ... ok\ntest suite::a::y ... FAILED\n\
                   test result: FAILED. 2 passed; 1 failed; 1 ignored; 0 measured; 9 filtered out; finished in 1.0s\n\
                   test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 2.0s\n";
        let c = Counts::parse(log);
        assert_eq!((c.passed, c.failed, c.ignored), (5, 1, 1));
        assert_eq!(c.failures, ["suite::a::y"]);
    }

    fn probe(layout: &str, python: Value) -> Value {
        serde_json::json!({
            "kernel": "6.1.0-41-amd64",
            "features": {"landlock": {"available": true, "abi": 2},
                         "close_range_cloexec": {"available": true},
                         "cgroup.kill": {"available": true}},
            "doctor": {"cgroup_layout": layout, "checks": [
                {"name": "memory limit", "ok": true}, {"name": "cpu limit", "ok": true},
                {"name": "pids limit", "ok": true}, {"name": "seccomp", "ok": true}]},
            "python": python,
        })
    }

    #[test]
    fn a_lane_is_held_to_its_layout_and_to_what_the_default_profile_must_do() {
        let lane = *Lane::named("debian12-6.1").unwrap();
        let ran = serde_json::json!({"error": null, "exit_code": 0, "landlock_abi": 2,
            "skipped_layers": [{"layer": "landlock", "feature": "TCP bind and connect rules",
                                "reason": "this kernel has landlock ABI 2",
                                "covered_by": "the network namespace"}]});
        let mut r = LaneReport::not_started(&lane, Duration::ZERO, String::new());
        r.status = Some(0);
        r.ran_tests = true;
        r.counts.summaries = 1;
        r.built_in = Some(probe("v2", ran.clone()));
        r.problems = r.check();
        assert!(r.passed(), "{:?}", r.problems);
        let line = row(&r);
        assert!(line.contains("| pure v2 | 2 | runs code |"), "{line}");
        assert!(
            line.contains("cgroup limits: memory, cpu, pids; landlock ABI 2"),
            "{line}"
        );
        assert!(
            line.contains("landlock TCP bind and connect rules: covered"),
            "{line}"
        );
        let table = markdown(std::slice::from_ref(&r));
        assert!(
            table.contains("| debian12-6.1 | 6.1.0-41-amd64 | ? | ? | ? | yes | yes | ? |"),
            "{table}"
        );

        r.built_in = Some(probe("v1", ran));
        r.problems = r.check();
        assert!(!r.passed());
        assert!(r.problems[0].contains("layout v1"), "{:?}", r.problems);

        let refused = serde_json::json!({"error": "setup", "exit_code": null,
            "message": "landlock is required and this kernel has no landlock. Boot ..."});
        r.built_in = Some(probe("v2", refused));
        r.problems = r.check();
        assert!(
            r.problems[0].contains("did not run code"),
            "{:?}",
            r.problems
        );
        assert_eq!(
            refusal(
                "sandbox setup failed at step restrict_with_landlock: landlock is required. Boot"
            ),
            "landlock is required"
        );
    }

    #[test]
    fn a_lane_passes_with_its_known_failures_only() {
        // A lane with a known failure (the real lanes have none at present).
        let lane = Lane {
            known_failures: &[KnownFailure {
                test: "suite::a::known",
                why: "this kernel cannot",
            }],
            ..*Lane::named("debian12-6.1").unwrap()
        };
        let known = lane.known_failures[0].test;
        let log = |failed: &[&str]| {
            let mut l = String::from("test suite::a::x ... ok\n");
            for f in failed {
                l.push_str(&format!("test {f} ... FAILED\n"));
            }
            l.push_str("\nfailures:\n\nfailures:\n");
            for f in failed {
                l.push_str(&format!("    {f}\n"));
            }
            l.push_str(&format!(
                "\ntest result: FAILED. 1 passed; {} failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s\n",
                failed.len()
            ));
            l
        };
        let report = |log: &str| {
            let mut r = LaneReport::not_started(&lane, Duration::ZERO, String::new());
            r.status = Some(101);
            r.ran_tests = true;
            r.counts = Counts::parse(log);
            r.built_in = Some(probe(
                "v2",
                serde_json::json!({"error": null, "exit_code": 0, "skipped_layers": []}),
            ));
            r.problems = r.check();
            r
        };
        let r = report(&log(&[known]));
        assert!(r.passed(), "{:?}", r.problems);
        assert_eq!(r.exit_status(), 0);
        assert_eq!(r.known_failed().len(), 1);
        let r = report(&log(&[known, "suite::a::y"]));
        assert!(!r.passed());
        assert_eq!(r.exit_status(), 1);
        assert!(r.problems[0].contains("suite::a::y"), "{:?}", r.problems);
        assert!(markdown(&[r]).contains("FAILED `suite::a::y`"));
        // A crash without a summary is a failure, whatever failed before it.
        let r = report(&format!("test {known} ... FAILED\n"));
        assert!(!r.passed());
        let r = report(&format!(
            "test {known} ... ok\ntest result: ok. 1 passed; 0 failed;\n"
        ));
        assert_eq!(r.known_passed().len(), 1);
    }
}
