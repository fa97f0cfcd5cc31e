//! `cargo xtask bench`: start-up, layer cost and throughput of codecage against bare
//! execution, bubblewrap and crun, measured side by side on the same machine and rootfs
//! (the host's /usr, read-only). Writes BENCHMARKS.md.
//!
//! The harness is our own rather than hyperfine's: hyperfine runs one command's batch after
//! another, so a burst of load on this shared 2-core machine lands on one command; here
//! every round runs each command once, in turn ("interleaved"), and medians compare
//! commands that saw the same conditions. Ratios to bare execution, not absolute times, are
//! what carries across machines.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::host::{install_missing, is_root, status, workspace_root, Recommends, Runner, TempTree};

/// Start-up, layer cost and throughput against bare, bubblewrap and crun (root)
///
/// Measures, interleaved and side by side on the host rootfs:
///   start-up of /bin/true, python3 -c pass and node -e 0: bare, bubblewrap, crun, codecage
///   the cost of each codecage layer (namespaces only; + cgroup; + landlock; + seccomp)
///   throughput of N x python3 -c pass, 1 and 2 in parallel: bare, bubblewrap, codecage
///   sessions and the warm pool through `codecage serve`, a burst of 50 session creations
///   against session pools of 50 and 4, and the pool at a steady request rate
///   (requests/s and how many the pool served, pools of 0, 1 and 4)
/// then the targets beside their figures, and writes the tables to BENCHMARKS.md (unless
/// --no-write). Each part's time is told on stderr. Root; installs bubblewrap
/// and crun from Debian when missing; builds codecage in release mode (unless --codecage).
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Rounds of the start-up scenarios (python and node use N/2; at least 3)
    #[arg(long, value_name = "N", default_value_t = DEFAULT_ROUNDS)]
    rounds: usize,
    /// Runs per throughput measurement (at least 2)
    #[arg(long, value_name = "N", default_value_t = DEFAULT_THROUGHPUT_RUNS)]
    throughput: usize,
    /// Print the tables only, leave BENCHMARKS.md as it is
    #[arg(long)]
    no_write: bool,
    /// The most idle Python sessions the density measurement creates
    #[arg(long, value_name = "N", default_value_t = 1000)]
    density: usize,
    /// Measure only the sessions table (printed, not written)
    #[arg(long)]
    sessions_only: bool,
    /// Measure only the warm-pool table (printed, not written)
    #[arg(long)]
    pool_only: bool,
    /// Measure only the session burst (printed, not written): 50 clients at once each
    /// create a Python session and get `1+1` answered, against session pools of 50 and 4
    #[arg(long)]
    session_burst: bool,
    /// Measure only the warm pool at a steady rate (printed, not written): requests/s,
    /// latency and requests served from the pool with pools of 0, 1 and 4, back to back
    /// and paced
    #[arg(long)]
    pool_rate: bool,
    /// Requests of each back-to-back figure of the steady-rate table
    #[arg(long, value_name = "N", default_value_t = crate::bench_pool_rate::DEFAULT_REQUESTS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..))]
    pool_rate_requests: usize,
    /// Measure this codecage binary instead of building the release one (e.g.
    /// target/debug/codecage to try a table: a debug build's figures are not the ones to
    /// quote)
    #[arg(long, value_name = "BIN")]
    codecage: Option<PathBuf>,
    /// An older codecage binary whose phases the phase table shows beside this build's,
    /// measured in the same rounds (e.g. a build of the commit before a change)
    #[arg(long, value_name = "BIN")]
    before: Option<PathBuf>,
    /// What the table calls the older binary (a commit, a date)
    #[arg(
        long,
        value_name = "TEXT",
        default_value = "before",
        requires = "before"
    )]
    before_label: String,
}

/// The figures the targets table quotes, as the tables measure them.
#[derive(Default)]
pub struct Figures {
    /// Cold `codecage run -- /bin/true`, ms.
    pub true_ms: Option<f64>,
    /// Cold `codecage run -- /bin/true` / bubblewrap's.
    pub true_bwrap_ratio: Option<f64>,
    /// Cold `codecage run python3 -c pass` / bare.
    pub python_ratio: Option<f64>,
    /// 2-parallel codecage runs/s as % of bare.
    pub throughput_pct: Option<f64>,
    /// `POST /v1/run` `pass` through the pool and bare cold `python3 -c pass`, ms.
    pub pool_pass: Option<(f64, f64)>,
    /// `POST /v1/run` `import pandas` through the pool and bare cold, ms.
    pub pool_pandas: Option<(f64, f64)>,
    /// A session made cold (no session pool) ready: create + first `1+1` answered, ms.
    pub session_cold_ms: Option<f64>,
    /// A burst of concurrent session creations against a session pool as large as it.
    pub burst_pool_full: Option<crate::bench_burst::Burst>,
    /// The same burst against a small session pool.
    pub burst_pool_small: Option<crate::bench_burst::Burst>,
    /// An idle Python session's memory, MiB.
    pub idle_python_mib: Option<f64>,
}

const DEFAULT_ROUNDS: usize = 60;
const DEFAULT_THROUGHPUT_RUNS: usize = 500;
/// Rounds of a table at the least (`--rounds` below it is raised to it).
const MIN_ROUNDS: usize = 3;
/// Runs of a throughput measurement at the least.
const MIN_THROUGHPUT_RUNS: usize = 2;
/// Rounds that warm caches before the counted ones.
const WARMUP_ROUNDS: usize = 3;

/// The start-up payloads: /bin/true, then the interpreters of the sandbox's languages.
const TRUE: &[&str] = &["/bin/true"];
const PYTHON: &[&str] = &["/usr/bin/python3", "-c", "pass"];
const NODE: &[&str] = &["/usr/bin/node", "-e", "0"];
const PAYLOADS: [(&str, &[&str]); 3] = [
    ("/bin/true", TRUE),
    ("python3 -c pass", PYTHON),
    ("node -e 0", NODE),
];

/// The environment of every command under test, as in the sandbox: a variable such as
/// NODE_EXTRA_CA_CERTS makes `node -e 0` three times slower here.
const CLEAN_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";

/// bubblewrap as close to codecage's sandbox as it goes: every namespace, the host's /usr
/// read-only, a new /proc, /dev and /tmp, a clean environment.
const BWRAP: &str = "bwrap --unshare-all --die-with-parent --new-session --ro-bind /usr /usr \
    --symlink usr/bin /bin --symlink usr/sbin /sbin --symlink usr/lib /lib --symlink usr/lib64 /lib64 \
    --ro-bind /etc/ld.so.cache /etc/ld.so.cache --ro-bind /etc/alternatives /etc/alternatives \
    --proc /proc --dev /dev --tmpfs /tmp --dir /work --chdir /work --clearenv --setenv PATH /usr/bin:/bin";

/// The number of the OCI bundle that probes whether crun runs here.
const PROBE_BUNDLE: usize = 99;

/// The phases `codecage run --timings` reports, and what happens in each.
const PHASES: [(&str, &str); 8] = [
    (
        "prepare",
        "validation, fds, the cgroup clone3 puts the init in (v2: with the run's limits)",
    ),
    (
        "clone",
        "clone3 into five new namespaces; while the child makes the network one: the v1 cgroups, the tmpfs file systems, id maps, \"go\"",
    ),
    (
        "init_exec",
        "the child's v1 cgroups, the exec of codecage-init as the sandbox's pid 1",
    ),
    (
        "sandbox",
        "cgroup namespace, mounts, pivot_root, host name, loopback",
    ),
    (
        "payload_setup",
        "fork, rlimits, capabilities, ids, no_new_privs, landlock, seccomp",
    ),
    ("run", "the payload: its execve until its exit"),
    (
        "teardown",
        "kill what is left, the init's exit and the namespaces' teardown, the reap",
    ),
    ("cleanup", "reading and removing the cgroups"),
];

/// The layer profiles: each adds one layer (cgroup, landlock, seccomp) to the one before.
const LAYERS: [(&str, &str, &str, &str); 4] = [
    ("namespaces only", "off", "off", "off"),
    ("+ cgroup limits", "required", "off", "off"),
    ("+ landlock", "required", "required", "off"),
    (
        "+ seccomp (every layer)",
        "required",
        "required",
        "required",
    ),
];

pub fn bench(args: &Args) -> Result<i32> {
    if !is_root() {
        bail!("the benchmark creates namespaces and cgroups: run it as root");
    }
    let root = workspace_root();
    let codecage = match &args.codecage {
        Some(bin) => {
            if !bin.is_file() {
                bail!("--codecage {}: no such file", bin.display());
            }
            std::fs::canonicalize(bin)?.display().to_string()
        }
        None => build_codecage(&root)?,
    };
    // What the tables call the binary they measured.
    let binary = match &args.codecage {
        Some(_) => format!("`{codecage}`"),
        None => "the release binary".to_string(),
    };
    let work = TempTree::create_in(&std::env::temp_dir(), "codecage-bench-")?;
    let mut figures = Figures::default();
    let mut parts = Parts::default();
    let mut report = String::new();
    let partial = args.sessions_only || args.pool_only || args.session_burst || args.pool_rate;
    if !partial {
        install_missing(
            &Runner::terminal(),
            &[("bwrap", "bubblewrap"), ("crun", "crun")],
            Recommends::Skip,
        )?;
        let mut bench = Bench::prepare(args, codecage.clone(), work.path())?;
        write_intro(&mut report)?;
        parts.time("start-up", || bench.startup(&mut figures, &mut report))?;
        parts.time("layers", || bench.layers(&mut report))?;
        parts.time("phases", || bench.phases(&mut report))?;
        parts.time("throughput", || bench.throughput(&mut figures, &mut report))?;
    }
    if !partial || args.sessions_only {
        parts.time("sessions", || {
            crate::bench_sessions::table(
                &codecage,
                &binary,
                work.path(),
                args.density,
                &mut figures,
                &mut report,
            )
        })?;
    }
    if !partial || args.pool_only {
        parts.time("warm pool", || {
            crate::bench_pool::table(&codecage, &binary, work.path(), &mut figures, &mut report)
        })?;
    }
    if !partial || args.session_burst {
        parts.time("session burst", || {
            crate::bench_burst::table(&codecage, &binary, work.path(), &mut figures, &mut report)
        })?;
    }
    if !partial || args.pool_rate {
        parts.time("pool at a steady rate", || {
            crate::bench_pool_rate::table(
                &codecage,
                &binary,
                work.path(),
                args.pool_rate_requests,
                &mut report,
            )
        })?;
    }
    if !partial {
        write_targets(&figures, &mut report)?;
    }
    print!("{report}");
    parts.summary();
    if !partial && !args.no_write {
        std::fs::write(root.join("BENCHMARKS.md"), &report)?;
        status("Wrote", "BENCHMARKS.md");
    }
    Ok(0)
}

/// How long each part of the bench took, told on stderr as each ends and together at the
/// end, so a full run's time is known.
#[derive(Default)]
struct Parts(Vec<(&'static str, Duration)>);

impl Parts {
    fn time<T>(&mut self, part: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        settle();
        let start = Instant::now();
        let out = f()?;
        let took = start.elapsed();
        status("Took", format!("{part}: {}", seconds(took)));
        self.0.push((part, took));
        Ok(out)
    }

    fn summary(&self) {
        let total: Duration = self.0.iter().map(|p| p.1).sum();
        let each: Vec<String> = self
            .0
            .iter()
            .map(|(part, took)| format!("{part} {}", seconds(*took)))
            .collect();
        status(
            "Took",
            format!("{} in all ({})", seconds(total), each.join(", ")),
        );
    }
}

/// The share of the CPUs' time a part may find busy before it starts.
const SETTLED_BUSY: f64 = 0.15;
/// The window over which the share is measured.
const SETTLE_WINDOW: Duration = Duration::from_millis(300);
/// How long a part waits at most for the machine to settle.
const SETTLE_PATIENCE: Duration = Duration::from_secs(90);

/// Waits until the machine is quiet (at most [`SETTLED_BUSY`] of the CPUs' time busy over
/// [`SETTLE_WINDOW`]), for at most [`SETTLE_PATIENCE`]: what a part leaves behind goes on
/// after it (the kernel tears down the network namespaces of the density table's 300 sessions in a
/// worker for many seconds), and the next part must not be measured against it.
pub(crate) fn settle() {
    // (busy, total) jiffies of every CPU, from /proc/stat's first line.
    fn sample() -> Option<(u64, u64)> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let fields: Vec<u64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .filter_map(|f| f.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal (guest time is in user).
        let total: u64 = fields.iter().take(8).sum();
        let idle = fields.get(3)? + fields.get(4)?;
        Some((total - idle, total))
    }
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < SETTLE_PATIENCE {
        let Some((busy0, total0)) = sample() else {
            return;
        };
        std::thread::sleep(SETTLE_WINDOW);
        let Some((busy1, total1)) = sample() else {
            return;
        };
        let share = (busy1 - busy0) as f64 / (total1 - total0).max(1) as f64;
        if share <= SETTLED_BUSY {
            if start.elapsed() > Duration::from_secs(1) {
                status("Settled", format!("after {}", seconds(start.elapsed())));
            }
            return;
        }
        last = Some(share);
    }
    if let Some(share) = last {
        status(
            "Unsettled",
            format!(
                "the CPUs were still {:.0} % busy after {}; measuring anyway",
                share * 100.0,
                seconds(SETTLE_PATIENCE)
            ),
        );
    }
}

/// A duration as whole seconds, or minutes and seconds past a minute.
fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64().round() as u64;
    if s < 60 {
        format!("{s} s")
    } else {
        format!("{} min {} s", s / 60, s % 60)
    }
}

/// `cargo build --release` of codecage, its init linked statically as `cargo xtask dist`
/// ships it; the binary's path.
fn build_codecage(root: &Path) -> Result<String> {
    status("Building", "codecage (release)");
    let built = Command::new("cargo")
        .args(["build", "--release", "--quiet", "-p", "codecage"])
        .current_dir(root)
        .status()?;
    if !built.success() {
        bail!("cargo build --release failed");
    }
    // The init and the launcher as the package ships them.
    crate::host::link_static_init(root, true)?;
    crate::host::link_static_launcher(root, true)?;
    Ok(root.join("target/release/codecage").display().to_string())
}

/// What the tables' commands are made of, and the count that names each run.
struct Bench<'a> {
    /// Rounds of `/bin/true`; the other payloads and the layer and phase tables use
    /// [`Bench::half_rounds`].
    rounds: usize,
    throughput_runs: usize,
    codecage: String,
    work: &'a Path,
    /// The layer profiles, each adding one layer; the last has every layer.
    profiles: Vec<(String, PathBuf)>,
    /// The OCI runtime compared with (crun, or runc where crun cannot run), and why not
    /// crun.
    runtime: &'static str,
    runtime_note: Option<String>,
    next_id: usize,
    /// An older codecage binary and its label, for the phase table's "before" column.
    before: Option<(String, String)>,
}

impl<'a> Bench<'a> {
    fn prepare(args: &Args, codecage: String, work: &'a Path) -> Result<Bench<'a>> {
        let profiles = write_layer_profiles(work)?;
        let probe = crun_bundle(work, PROBE_BUNDLE, &argv(TRUE))?;
        let (runtime, runtime_note) = oci_runtime(&probe)?;
        Ok(Bench {
            rounds: args.rounds.max(MIN_ROUNDS),
            throughput_runs: args.throughput.max(MIN_THROUGHPUT_RUNS),
            codecage,
            work,
            profiles,
            runtime,
            runtime_note,
            next_id: 0,
            before: args
                .before
                .as_ref()
                .map(|b| (b.display().to_string(), args.before_label.clone())),
        })
    }

    fn half_rounds(&self) -> usize {
        (self.rounds / 2).max(MIN_ROUNDS)
    }

    /// `codecage run` of `argv` on the host rootfs with the layer profile `profile`.
    fn codecage(&self, profile: &Path, argv: &[String]) -> Vec<String> {
        let mut v: Vec<String> = vec![self.codecage.clone(), "run".into()];
        v.extend(["--rootfs", "host", "--profile"].map(String::from));
        v.push(profile.display().to_string());
        v.push("--".into());
        v.extend(argv.iter().cloned());
        v
    }

    /// `codecage run` of `argv` with every layer.
    fn codecage_all_layers(&self, argv: &[String]) -> Vec<String> {
        let (_, every_layer) = self.profiles.last().expect("layer profiles");
        self.codecage(every_layer, argv)
    }

    fn interleaved(&mut self, cmds: &[Cmd], rounds: usize) -> Result<Vec<Duration>> {
        interleaved(cmds, rounds, &mut self.next_id)
    }

    /// The start-up table: each payload bare, in bubblewrap, in the OCI runtime and in
    /// codecage with every layer.
    fn startup(&mut self, figures: &mut Figures, out: &mut String) -> Result<()> {
        let runtime = self.runtime;
        writeln!(out, "## Start-up\n")?;
        writeln!(
            out,
            "| payload | bare | bubblewrap | {runtime} | codecage | codecage / bare | codecage - bare |"
        )?;
        writeln!(out, "|---|---|---|---|---|---|---|")?;
        for (i, (name, payload)) in PAYLOADS.iter().enumerate() {
            let payload = argv(payload);
            let bundle = crun_bundle(self.work, i, &payload)?;
            let cmds = [
                Cmd::new("bare", payload.clone()),
                Cmd::new("bubblewrap", bwrap(&payload)),
                Cmd::new(runtime, oci_argv(runtime, &bundle)),
                Cmd::new("codecage", self.codecage_all_layers(&payload)),
            ];
            let rounds = if i == 0 {
                self.rounds
            } else {
                self.half_rounds()
            };
            status("Measuring", format!("start-up of {name} ({rounds} rounds)"));
            let m = self.interleaved(&cmds, rounds)?;
            match i {
                0 => {
                    figures.true_ms = Some(ms(m[3]));
                    figures.true_bwrap_ratio = Some(ms(m[3]) / ms(m[1]));
                }
                1 => figures.python_ratio = Some(ms(m[3]) / ms(m[0])),
                _ => {}
            }
            writeln!(
                out,
                "| `{name}` | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.2}x | +{:.1} ms |",
                ms(m[0]),
                ms(m[1]),
                ms(m[2]),
                ms(m[3]),
                ms(m[3]) / ms(m[0]),
                ms(m[3]) - ms(m[0])
            )?;
        }
        writeln!(
            out,
            "\nbubblewrap: all namespaces (user, mount, pid, net, ipc, uts, cgroup), read-only /usr, new /proc, /dev and /tmp. \
             {runtime}: an OCI bundle with pid, net, ipc, uts, mount and cgroup namespaces (no user namespace, as docker \
             runs it), read-only /usr, and memory, pids and CPU limits{}. codecage: every layer (all namespaces, cgroup limits, \
             landlock, seccomp, capabilities dropped, no_new_privs, rlimits).\n",
            self.runtime_note
                .as_ref()
                .map_or(String::new(), |n| format!(" ({n})"))
        )?;
        Ok(())
    }

    /// The layer table: `python3 -c pass` bare, then in codecage with one more layer at a
    /// time.
    fn layers(&mut self, out: &mut String) -> Result<()> {
        writeln!(
            out,
            "## What each codecage layer costs (`python3 -c pass`)\n"
        )?;
        writeln!(out, "| layers | median | / bare | step |")?;
        writeln!(out, "|---|---|---|---|")?;
        let payload = argv(PYTHON);
        let mut cmds = vec![Cmd::new("bare", payload.clone())];
        cmds.extend(
            self.profiles
                .iter()
                .map(|(label, p)| Cmd::new(label, self.codecage(p, &payload))),
        );
        let rounds = self.half_rounds();
        status("Measuring", format!("layer costs ({rounds} rounds)"));
        let m = self.interleaved(&cmds, rounds)?;
        for (i, cmd) in cmds.iter().enumerate() {
            // The step from the layer before; none for bare and for namespaces only.
            let step = if i >= 2 {
                format!("+{:.1} ms", ms(m[i]) - ms(m[i - 1]))
            } else {
                String::new()
            };
            writeln!(
                out,
                "| {} | {:.1} ms | {:.2}x | {step} |",
                cmd.label,
                ms(m[i]),
                ms(m[i]) / ms(m[0])
            )?;
        }
        Ok(())
    }

    /// The phase table: where codecage's time goes, from its own `--timings`; with
    /// `--before`, an older binary's phases beside it, measured in the same rounds.
    fn phases(&mut self, out: &mut String) -> Result<()> {
        writeln!(
            out,
            "\n## Where codecage's time goes (`python3 -c pass`, every layer)\n"
        )?;
        writeln!(
            out,
            "Medians of `codecage run --json --timings` (the sandbox reports when each phase ends; see \
             `Outcome.phases` in ARCHITECTURE.md). The CLI's own start (exec, argument parsing, profile) comes on top.\n"
        )?;
        status("Measuring", "phases");
        let timed = |bin: &str| {
            let mut v = self.codecage_all_layers(&argv(PYTHON));
            v[0] = bin.to_string();
            v.splice(2..2, ["--json".to_string(), "--timings".to_string()]);
            v
        };
        let mut argvs = vec![timed(&self.codecage)];
        if let Some((bin, _)) = &self.before {
            argvs.insert(0, timed(bin));
        }
        let medians = phase_medians(&argvs, self.half_rounds())?;
        match &self.before {
            None => {
                writeln!(out, "| phase | median | what happens |")?;
                writeln!(out, "|---|---|---|")?;
                for (i, (phase, what)) in PHASES.iter().enumerate() {
                    writeln!(out, "| {phase} | {:.2} ms | {what} |", medians[0][i])?;
                }
            }
            Some((_, label)) => {
                writeln!(
                    out,
                    "Before: {label}; after: this build; both measured in the same rounds, one after the other.\n"
                )?;
                writeln!(out, "| phase | before | after | change | what happens |")?;
                writeln!(out, "|---|---|---|---|---|")?;
                let (mut sum_before, mut sum_after) = (0.0, 0.0);
                for (i, (phase, what)) in PHASES.iter().enumerate() {
                    let (b, a) = (medians[0][i], medians[1][i]);
                    if *phase != "run" {
                        sum_before += b;
                        sum_after += a;
                    }
                    writeln!(
                        out,
                        "| {phase} | {b:.2} ms | {a:.2} ms | {:+.2} ms | {what} |",
                        a - b
                    )?;
                }
                writeln!(
                    out,
                    "| every phase but run | {sum_before:.2} ms | {sum_after:.2} ms | {:+.2} ms | what codecage adds |",
                    sum_after - sum_before
                )?;
            }
        }
        Ok(())
    }

    /// The throughput table: `python3 -c pass` one at a time and two in parallel, bare,
    /// in bubblewrap and in codecage with every layer.
    fn throughput(&mut self, figures: &mut Figures, out: &mut String) -> Result<()> {
        let runs = self.throughput_runs;
        writeln!(out, "\n## Throughput ({runs} x `python3 -c pass`)\n")?;
        writeln!(
            out,
            "| command | 1 at a time | 2 in parallel | 2 in parallel, % of bare |"
        )?;
        writeln!(out, "|---|---|---|---|")?;
        let payload = argv(PYTHON);
        let mut bare2 = 0.0;
        for cmd in [
            Cmd::new("bare", payload.clone()),
            Cmd::new("bubblewrap", bwrap(&payload)),
            Cmd::new("codecage", self.codecage_all_layers(&payload)),
        ] {
            status("Measuring", format!("throughput of {}", cmd.label));
            let one = throughput(&cmd, runs, 1, &mut self.next_id)?;
            let two = throughput(&cmd, runs, 2, &mut self.next_id)?;
            if cmd.label == "bare" {
                bare2 = two;
            }
            if cmd.label == "codecage" {
                figures.throughput_pct = Some(100.0 * two / bare2);
            }
            writeln!(
                out,
                "| {} | {:.0} runs/s | {:.0} runs/s | {:.0} % |",
                cmd.label,
                one,
                two,
                100.0 * two / bare2
            )?;
        }
        Ok(())
    }
}

/// The report's title, the machine and how to read the tables.
fn write_intro(out: &mut String) -> Result<()> {
    writeln!(out, "# Benchmarks\n")?;
    writeln!(out, "Written by `cargo xtask bench` on {}.\n", machine()?)?;
    writeln!(
        out,
        "Every command runs on the same root: the host's /usr, read-only. Rounds are interleaved (each round runs \
         every command of a table once), the first three are not counted, and the figure is the median wall time \
         of spawning the command until it has exited and been reaped. Ratios are to bare execution. Each part \
         starts once the machine is quiet (at most {busy:.0} % of the CPUs' time busy over {window} ms), so what \
         the one before left (the kernel's teardown of 300 sessions' namespaces) is not measured with it.\n",
        busy = SETTLED_BUSY * 100.0,
        window = SETTLE_WINDOW.as_millis()
    )?;
    Ok(())
}

/// The targets (issue 27's, and the idle session's memory), each with today's figure from
/// the tables above: a row per figure, "not measured" where a partial run did not take it.
fn target_rows(f: &Figures) -> Vec<(&'static str, String, &'static str)> {
    let show = |v: Option<String>| v.unwrap_or_else(|| "not measured".into());
    let ratio = |v: Option<(f64, f64)>| {
        show(v.map(|(p, b)| format!("{:.2}x ({p:.1} ms / {b:.1} ms)", p / b)))
    };
    let p99 = |b: &Option<crate::bench_burst::Burst>| {
        show(b.as_ref().map(|b| {
            format!(
                "{:.1} ms (p50 {:.1} ms, {} bursts; the median burst {:.2} s)",
                b.p99_ms,
                b.p50_ms,
                b.rounds,
                b.wall_ms / 1000.0
            )
        }))
    };
    vec![
        (
            "cold `codecage run --lang python -c pass` / bare `python3 -c pass`",
            show(f.python_ratio.map(|r| format!("{r:.2}x"))),
            "≤ 1.2x",
        ),
        (
            "cold `codecage run -- /bin/true`",
            show(f.true_ms.map(|t| format!("{t:.1} ms"))),
            "≤ 4 ms",
        ),
        (
            "cold `codecage run -- /bin/true` / bubblewrap's (the start-up table)",
            show(f.true_bwrap_ratio.map(|r| format!("{r:.2}x"))),
            "≤ 1.4x",
        ),
        (
            "2-parallel python runs/s, as % of bare",
            show(f.throughput_pct.map(|p| format!("{p:.0} %"))),
            "≥ 70 %",
        ),
        (
            "`POST /v1/run` python `pass` through the warm pool (refilled between requests) / bare `python3 -c pass`",
            ratio(f.pool_pass),
            "≤ 0.8x",
        ),
        (
            "`POST /v1/run` python `import pandas` through the warm pool / bare cold `import pandas`",
            ratio(f.pool_pandas),
            "≤ 0.1x",
        ),
        (
            "a session made cold (no session pool) ready: create, then first `1+1` answered",
            show(f.session_cold_ms.map(|t| format!("{t:.1} ms"))),
            "≤ 50 ms",
        ),
        (
            "50 concurrent session creations (each then `1+1` answered), `--session-pool python=50`: p99",
            p99(&f.burst_pool_full),
            "≤ 20 ms",
        ),
        (
            "50 concurrent session creations (each then `1+1` answered), `--session-pool python=4`: p99",
            p99(&f.burst_pool_small),
            "≤ 1 s",
        ),
        (
            "idle Python session, memory",
            show(f.idle_python_mib.map(|m| format!("{m:.1} MiB"))),
            "≤ 12 MiB",
        ),
    ]
}

fn write_targets(f: &Figures, out: &mut String) -> Result<()> {
    writeln!(out, "## Targets\n")?;
    writeln!(out, "| figure | measured above | target |")?;
    writeln!(out, "|---|---|---|")?;
    for (figure, measured, target) in target_rows(f) {
        writeln!(out, "| {figure} | {measured} | {target} |")?;
    }
    writeln!(out)?;
    Ok(())
}

/// One command under test; `{id}` in its argv becomes a unique number per run.
#[derive(Clone)]
struct Cmd {
    label: String,
    argv: Vec<String>,
}

impl Cmd {
    fn new(label: &str, argv: Vec<String>) -> Cmd {
        Cmd {
            label: label.into(),
            argv,
        }
    }

    /// Runs it once, output discarded; returns the wall time. A failure is an error: a
    /// benchmark of a command that does not work measures nothing.
    fn time(&self, id: usize) -> Result<Duration> {
        let argv: Vec<String> = self
            .argv
            .iter()
            .map(|a| a.replace("{id}", &id.to_string()))
            .collect();
        let start = Instant::now();
        let out = Command::new(&argv[0])
            .args(&argv[1..])
            .env_clear()
            .env("PATH", CLEAN_PATH)
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .with_context(|| format!("running {}", argv[0]))?;
        let took = start.elapsed();
        if !out.status.success() {
            bail!(
                "{} failed ({}): {}",
                self.label,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(took)
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Interleaved rounds: every round runs each command once. Returns each command's median.
fn interleaved(cmds: &[Cmd], rounds: usize, next_id: &mut usize) -> Result<Vec<Duration>> {
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); cmds.len()];
    for round in 0..WARMUP_ROUNDS + rounds {
        for (i, cmd) in cmds.iter().enumerate() {
            *next_id += 1;
            let t = cmd.time(*next_id)?;
            if round >= WARMUP_ROUNDS {
                times[i].push(t);
            }
        }
    }
    Ok(times.into_iter().map(median).collect())
}

/// Runs each of `argvs` (each a `codecage run --json --timings`) once per round, in turn,
/// `rounds` times; the median of each phase, per argv, in [`PHASES`]' order.
fn phase_medians(argvs: &[Vec<String>], rounds: usize) -> Result<Vec<Vec<f64>>> {
    let mut samples: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); PHASES.len()]; argvs.len()];
    for _ in 0..rounds {
        for (argv, samples) in argvs.iter().zip(samples.iter_mut()) {
            let out = Command::new(&argv[0])
                .args(&argv[1..])
                .env_clear()
                .output()
                .with_context(|| format!("running {}", argv[0]))?;
            let json: serde_json::Value = serde_json::from_slice(&out.stdout)
                .with_context(|| format!("{} printed no JSON outcome", argv[0]))?;
            for (i, (name, _)) in PHASES.iter().enumerate() {
                if let Some(ms) = json["phases"][format!("{name}_ms")].as_f64() {
                    samples[i].push(ms);
                }
            }
        }
    }
    Ok(samples
        .into_iter()
        .map(|per_phase| {
            per_phase
                .into_iter()
                .map(|mut v| {
                    v.sort_by(f64::total_cmp);
                    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
                })
                .collect()
        })
        .collect())
}

/// `n` runs of `cmd` by `parallel` workers; returns runs per second.
fn throughput(cmd: &Cmd, n: usize, parallel: usize, next_id: &mut usize) -> Result<f64> {
    let base = *next_id;
    *next_id += n;
    let counter = std::sync::atomic::AtomicUsize::new(0);
    let start = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = (0..parallel)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    loop {
                        let i = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= n {
                            return Ok(());
                        }
                        cmd.time(base + i)?;
                    }
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("a worker panicked"))??;
        }
        Ok(())
    })?;
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// An argv of owned strings.
fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

/// `argv` in bubblewrap, set up like codecage's sandbox on the host rootfs.
fn bwrap(argv: &[String]) -> Vec<String> {
    let mut v: Vec<String> = BWRAP.split_whitespace().map(String::from).collect();
    v.extend(argv.iter().cloned());
    v
}

/// The OCI runtime to compare with: crun, or runc where crun cannot run. crun 1.8 (Debian
/// bookworm) refuses hybrid cgroup hosts ("cgroups in hybrid mode not supported"), even
/// with its cgroup manager disabled, and these are the hosts this project is built on.
fn oci_runtime(probe_bundle: &Path) -> Result<(&'static str, Option<String>)> {
    let out = Command::new("crun")
        .args(["run", "--bundle"])
        .arg(probe_bundle)
        .arg("bench-probe")
        .output()?;
    if out.status.success() {
        return Ok(("crun", None));
    }
    let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
    install_missing(&Runner::terminal(), &[("runc", "runc")], Recommends::Skip)?;
    Ok((
        "runc",
        Some(format!(
            "crun failed on this host ({why}), so the OCI runtime is runc"
        )),
    ))
}

fn oci_argv(runtime: &str, bundle: &Path) -> Vec<String> {
    vec![
        runtime.into(),
        "run".into(),
        "--bundle".into(),
        bundle.display().to_string(),
        "bench-{id}".into(),
    ]
}

/// The profiles of [`LAYERS`], written into `work`.
fn write_layer_profiles(work: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for (i, (label, cgroup, landlock, seccomp)) in LAYERS.iter().enumerate() {
        let path = work.join(format!("layers-{i}.toml"));
        let text = format!(
            "language = \"bash\"\nrootfs = \"host\"\n[hardening]\ncgroup = \"{cgroup}\"\nlandlock = \"{landlock}\"\nseccomp = \"{seccomp}\"\n"
        );
        std::fs::write(&path, text)?;
        out.push((label.to_string(), path));
    }
    Ok(out)
}

/// An OCI bundle running `argv` on the host's /usr (read-only), with limits like codecage's.
fn crun_bundle(work: &Path, n: usize, argv: &[String]) -> Result<PathBuf> {
    let bundle = work.join(format!("bundle-{n}"));
    let rootfs = bundle.join("rootfs");
    for dir in ["usr", "proc", "dev", "tmp", "etc", "work"] {
        std::fs::create_dir_all(rootfs.join(dir))?;
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        std::os::unix::fs::symlink(target, rootfs.join(link))?;
    }
    std::fs::write(rootfs.join("etc/ld.so.cache"), b"")?;
    std::fs::create_dir_all(rootfs.join("etc/alternatives"))?;
    let args: Vec<String> = argv.iter().map(|a| format!("{a:?}")).collect();
    let config = format!(
        r#"{{
  "ociVersion": "1.0.2",
  "process": {{ "terminal": false, "user": {{ "uid": 1000, "gid": 1000 }}, "args": [{args}],
    "env": ["PATH=/usr/bin:/bin"], "cwd": "/work", "noNewPrivileges": true,
    "capabilities": {{ "bounding": [], "effective": [], "permitted": [] }} }},
  "root": {{ "path": "rootfs", "readonly": true }},
  "hostname": "bench",
  "mounts": [
    {{ "destination": "/proc", "type": "proc", "source": "proc" }},
    {{ "destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755", "size=64k"] }},
    {{ "destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "size=64m"] }},
    {{ "destination": "/work", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "size=64m", "uid=1000"] }},
    {{ "destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro", "nosuid", "nodev"] }},
    {{ "destination": "/etc/ld.so.cache", "type": "bind", "source": "/etc/ld.so.cache", "options": ["bind", "ro"] }},
    {{ "destination": "/etc/alternatives", "type": "bind", "source": "/etc/alternatives", "options": ["bind", "ro"] }}
  ],
  "linux": {{
    "namespaces": [ {{ "type": "pid" }}, {{ "type": "network" }}, {{ "type": "ipc" }}, {{ "type": "uts" }},
                    {{ "type": "mount" }}, {{ "type": "cgroup" }} ],
    "resources": {{ "memory": {{ "limit": 268435456 }}, "pids": {{ "limit": 64 }},
                    "cpu": {{ "quota": 50000, "period": 100000 }} }}
  }}
}}
"#,
        args = args.join(", ")
    );
    std::fs::write(bundle.join("config.json"), config)?;
    Ok(bundle)
}

fn machine() -> Result<String> {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")?
        .trim()
        .to_string();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    // 2026-11-26T00:12:00Z, shown as 2026-11-26 00:12 UTC.
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let layout = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "cgroup v2"
    } else if Path::new("/sys/fs/cgroup/unified").exists() {
        "hybrid cgroups (v1 controllers, controller-less cgroup2)"
    } else {
        "cgroup v1"
    };
    Ok(format!(
        "{} {} UTC (kernel {kernel}, {cores} cores, {layout})",
        &now[..10],
        &now[11..16]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{tests::parse, Task};

    #[test]
    fn command_lines() {
        let work = TempTree::create_in(&std::env::temp_dir(), "xtask-bench-test-").unwrap();
        let bench = Bench {
            rounds: 7,
            throughput_runs: 2,
            codecage: "/x/codecage".to_string(),
            work: work.path(),
            profiles: write_layer_profiles(work.path()).unwrap(),
            runtime: "crun",
            runtime_note: None,
            next_id: 0,
            before: None,
        };
        assert_eq!(bench.half_rounds(), 3);
        let every_layer = work.path().join("layers-3.toml");
        assert_eq!(
            bench.codecage_all_layers(&argv(PYTHON)).join(" "),
            format!(
                "/x/codecage run --rootfs host --profile {} -- /usr/bin/python3 -c pass",
                every_layer.display()
            )
        );
        let profile = std::fs::read_to_string(&every_layer).unwrap();
        assert!(profile.contains(
            "[hardening]\ncgroup = \"required\"\nlandlock = \"required\"\nseccomp = \"required\"\n"
        ));
        let b = bwrap(&argv(TRUE));
        assert_eq!(b.first().map(String::as_str), Some("bwrap"));
        assert_eq!(b.last().map(String::as_str), Some("/bin/true"));
        assert!(b.windows(3).any(|w| w == ["--ro-bind", "/usr", "/usr"]));

        let bundle = crun_bundle(work.path(), 1, &argv(PYTHON)).unwrap();
        let config = std::fs::read_to_string(bundle.join("config.json")).unwrap();
        let config: serde_json::Value = serde_json::from_str(&config).unwrap();
        assert_eq!(config["process"]["args"], serde_json::json!(PYTHON));
        assert_eq!(
            oci_argv("crun", &bundle)[..3],
            ["crun", "run", "--bundle"].map(String::from)
        );
    }

    #[test]
    fn the_targets_table() {
        // The rows name the burst of 50 against pools of 50 and 4: what bench_burst runs.
        assert_eq!(crate::bench_burst::CLIENTS, 50);
        assert_eq!(crate::bench_burst::POOLS, [50, 4]);
        let mut out = String::new();
        write_targets(&Figures::default(), &mut out).unwrap();
        let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("| ")).collect();
        // The head, then issue 27's nine figures and the idle session's memory.
        assert_eq!(rows.len(), 11, "{out}");
        assert!(
            rows[1..].iter().all(|r| r.contains("| not measured |")),
            "{out}"
        );

        let burst = |pool, ms| {
            crate::bench_burst::Burst::of(
                pool,
                vec![(
                    vec![Duration::from_millis(ms); 50],
                    Duration::from_millis(1700),
                )],
            )
        };
        let f = Figures {
            true_ms: Some(3.46),
            true_bwrap_ratio: Some(1.234),
            python_ratio: Some(1.104),
            throughput_pct: Some(81.4),
            pool_pass: Some((8.0, 16.0)),
            pool_pandas: Some((12.0, 400.0)),
            session_cold_ms: Some(42.04),
            burst_pool_full: Some(burst(50, 7)),
            burst_pool_small: Some(burst(4, 900)),
            idle_python_mib: Some(9.96),
        };
        let mut out = String::new();
        write_targets(&f, &mut out).unwrap();
        for row in [
            "| cold `codecage run --lang python -c pass` / bare `python3 -c pass` | 1.10x | ≤ 1.2x |",
            "| cold `codecage run -- /bin/true` | 3.5 ms | ≤ 4 ms |",
            "| cold `codecage run -- /bin/true` / bubblewrap's (the start-up table) | 1.23x | ≤ 1.4x |",
            "| 2-parallel python runs/s, as % of bare | 81 % | ≥ 70 % |",
            "| 0.50x (8.0 ms / 16.0 ms) | ≤ 0.8x |",
            "| 0.03x (12.0 ms / 400.0 ms) | ≤ 0.1x |",
            "| 42.0 ms | ≤ 50 ms |",
            "`--session-pool python=50`: p99 | 7.0 ms (p50 7.0 ms, 1 bursts; the median burst 1.70 s) | ≤ 20 ms |",
            "`--session-pool python=4`: p99 | 900.0 ms (p50 900.0 ms, 1 bursts; the median burst 1.70 s) | ≤ 1 s |",
            "| idle Python session, memory | 10.0 MiB | ≤ 12 MiB |",
        ] {
            assert!(out.contains(row), "{row} in\n{out}");
        }
        assert!(!out.contains("not measured"), "{out}");
    }

    #[test]
    fn part_times_read_as_seconds_or_minutes() {
        assert_eq!(seconds(Duration::from_millis(400)), "0 s");
        assert_eq!(seconds(Duration::from_millis(59_400)), "59 s");
        assert_eq!(seconds(Duration::from_secs(754)), "12 min 34 s");
    }

    #[test]
    fn the_machine_line_starts_with_the_date() {
        let line = machine().unwrap();
        // 2026-11-26 00:12 UTC (kernel ...
        assert_eq!(&line[4..5], "-");
        assert_eq!(&line[10..11], " ");
        assert_eq!(&line[16..28], " UTC (kernel");
    }

    #[test]
    fn parses_arguments() {
        let Ok(Task::Bench(a)) = parse(&["bench"]) else {
            panic!()
        };
        assert_eq!((a.rounds, a.throughput, a.no_write), (60, 500, false));
        let Ok(Task::Bench(a)) = parse(&["bench", "--rounds", "7", "--throughput=9", "--no-write"])
        else {
            panic!()
        };
        assert_eq!((a.rounds, a.throughput, a.no_write), (7, 9, true));
        assert_eq!(
            (a.pool_rate, a.pool_rate_requests, a.codecage),
            (false, 200, None)
        );
        let Ok(Task::Bench(a)) = parse(&[
            "bench",
            "--pool-rate",
            "--pool-rate-requests",
            "20",
            "--codecage",
            "target/debug/codecage",
        ]) else {
            panic!()
        };
        assert!(a.pool_rate && !a.pool_only && !a.sessions_only && !a.session_burst);
        assert_eq!(a.pool_rate_requests, 20);
        assert_eq!(a.codecage, Some(PathBuf::from("target/debug/codecage")));
        let Ok(Task::Bench(a)) = parse(&["bench", "--session-burst"]) else {
            panic!()
        };
        assert!(a.session_burst && !a.pool_rate && !a.pool_only && !a.sessions_only);
        for bad in [
            &["bench", "--rounds"][..],
            &["bench", "--rounds", "x"],
            &["bench", "x"],
            &["bench", "--pool-rate-requests", "1"],
            &["bench", "--pool-rate-requests", "x"],
            &["bench", "--pool-rate=yes"],
            &["bench", "--codecage"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
