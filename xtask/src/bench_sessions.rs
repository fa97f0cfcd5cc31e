//! The sessions table of `cargo xtask bench`: a `codecage serve` of the binary measured
//! (the release one unless `--codecage`) on a socket of its own, no pool; a session made
//! cold ready (its create and its first `1+1` answered); round trips of a warm call through the CLI and through the API
//! (curl's own transfer time, without its process start), next to bare `python3 -c pass`;
//! the memory of idle sessions (their cgroups' usage); and how many idle Python sessions
//! the machine holds.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::host::status;

/// Calls per round-trip figure.
const CALLS: usize = 200;
/// Sessions made cold, each created, sent `1+1` and closed, for the cold-start figure.
const COLD_SESSIONS: usize = 25;
/// The density measurement stops when the host has this little memory available.
const KEEP_AVAILABLE: u64 = 3 << 30;

pub(crate) struct Server {
    child: Child,
    pub(crate) socket: PathBuf,
}

impl Server {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

fn start_server(codecage: &str, work: &Path, max_sessions: usize) -> Result<Server> {
    // No warm pool: these figures are of sessions started on request.
    start_server_with(
        codecage,
        work,
        max_sessions,
        "[pool]\nruns = {}\nsessions = {}\n",
    )
}

/// A server of `codecage` (the release binary, or `--codecage`) on a socket in `work`, with `extra` config (TOML tables).
pub(crate) fn start_server_with(
    codecage: &str,
    work: &Path,
    max_sessions: usize,
    extra: &str,
) -> Result<Server> {
    let socket = work.join("bench.sock");
    let config = work.join("bench-server.toml");
    std::fs::write(
        &config,
        format!(
            "[limits]\nmax_sandboxes = {0}\nmax_sessions = {0}\nqueue_timeout = \"60s\"\n\
             [audit]\npath = {1:?}\n{extra}",
            max_sessions + 8,
            work.join("audit").join("audit.db"),
        ),
    )?;
    // A socket left by the server before: the wait below is for this one's.
    let _ = std::fs::remove_file(&socket);
    let child = Command::new(codecage)
        .args(["serve", "--config"])
        .arg(&config)
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .context("starting codecage serve")?;
    let server = Server { child, socket };
    let end = Instant::now() + Duration::from_secs(10);
    while !server.socket.exists() {
        if Instant::now() > end {
            bail!("codecage serve did not come up");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(server)
}

/// curl over the socket: the body and curl's own transfer time.
pub(crate) fn curl(
    server: &Server,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(String, Duration)> {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-w", "\n%{time_total}", "--unix-socket"])
        .arg(&server.socket)
        .args(["-X", method, &format!("http://codecage{path}")]);
    if let Some(body) = body {
        cmd.args(["-H", "Content-Type: application/json", "-d", body]);
    }
    let out = cmd.output().context("running curl")?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, time) = text.rsplit_once('\n').unwrap_or(("", "0"));
    let seconds: f64 = time.trim().parse().unwrap_or(0.0);
    Ok((body.to_string(), Duration::from_secs_f64(seconds)))
}

fn create(server: &Server, lang: &str) -> Result<String> {
    Ok(create_timed(server, lang)?.0)
}

/// A new session of `lang`: its id and curl's own time of the create.
pub(crate) fn create_timed(server: &Server, lang: &str) -> Result<(String, Duration)> {
    let (body, time) = curl(
        server,
        "POST",
        "/v1/sessions",
        Some(&format!("{{\"language\":\"{lang}\"}}")),
    )?;
    let value: serde_json::Value = serde_json::from_str(&body).with_context(|| body.clone())?;
    let id = value["id"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("no session: {body}"))?;
    Ok((id, time))
}

/// The default image, whose Python the pooled and burst tables run.
pub(crate) const IMAGE: &str = "/var/lib/codecage/rootfs/default";

/// Fails unless the default image is installed; `table` names the table that needs it.
pub(crate) fn require_image(table: &str) -> Result<()> {
    if !Path::new(IMAGE).join("usr/bin/python3").exists() {
        bail!("{table} needs the default image: run `cargo xtask rootfs` first");
    }
    Ok(())
}

pub(crate) fn median_ms(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1000.0
}

/// Memory of each run cgroup under codecage's parent, in bytes (v1 or v2), by directory.
pub(crate) fn session_cgroups_memory() -> std::collections::BTreeMap<std::path::PathBuf, u64> {
    let mut out = std::collections::BTreeMap::new();
    for parent in ["/sys/fs/cgroup/memory/codecage", "/sys/fs/cgroup/codecage"] {
        let Ok(entries) = std::fs::read_dir(parent) else {
            continue;
        };
        for entry in entries.flatten() {
            for file in ["memory.usage_in_bytes", "memory.current"] {
                if let Ok(text) = std::fs::read_to_string(entry.path().join(file)) {
                    if let Ok(n) = text.trim().parse() {
                        out.insert(entry.path(), n);
                    }
                }
            }
        }
    }
    out
}

/// The CPU time of every live thread of process `pid`, in ns (the scheduler's own sum,
/// /proc/PID/task/TID/schedstat: /proc/PID/stat counts in 10 ms ticks).
pub(crate) fn process_cpu_ns(pid: u32) -> Result<u64> {
    let tasks = format!("/proc/{pid}/task");
    let mut total = 0;
    for task in std::fs::read_dir(&tasks).with_context(|| format!("reading {tasks}"))? {
        // A thread that ended meanwhile has no file any more.
        let Ok(text) = std::fs::read_to_string(task?.path().join("schedstat")) else {
            continue;
        };
        total += text
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .with_context(|| format!("{tasks}/*/schedstat: {text:?}"))?;
    }
    Ok(total)
}

fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// Times one whole process, `n` times.
pub(crate) fn time_process(argv: &[String], n: usize) -> Result<Vec<Duration>> {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let status = Command::new(&argv[0])
            .args(&argv[1..])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        times.push(start.elapsed());
        if !status.success() {
            bail!("{argv:?} failed: {status}");
        }
    }
    Ok(times)
}

/// Writes the sessions table into `out`; a cold session's start and the idle Python
/// session's memory go into `figures`. `binary` names the codecage measured.
pub fn table(
    codecage: &str,
    binary: &str,
    work: &Path,
    density: usize,
    figures: &mut crate::bench::Figures,
    out: &mut String,
) -> Result<()> {
    status("Measuring", "sessions: round trips, memory, density");
    let server = start_server(codecage, work, density)?;
    let python = create(&server, "python")?;
    let bash = create(&server, "bash")?;
    let node = create(&server, "node")?;
    let exec = |id: &str, code: &str| {
        curl(
            &server,
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(&serde_json::json!({ "code": code }).to_string()),
        )
    };
    for _ in 0..5 {
        exec(&python, "1+1")?;
        exec(&bash, "true")?;
    }
    // The median round trip, and the server's CPU a call (all its threads, the audit
    // writer's included; the session's own processes are not the server's).
    let api = |id: &str, code: &str| -> Result<(f64, f64)> {
        let cpu_before = process_cpu_ns(server.pid())?;
        let times: Result<Vec<Duration>> =
            (0..CALLS).map(|_| exec(id, code).map(|(_, t)| t)).collect();
        let cpu = process_cpu_ns(server.pid())?.saturating_sub(cpu_before);
        Ok((median_ms(times?), cpu as f64 / 1e6 / CALLS as f64))
    };
    // A session made cold (no session pool): its create, then its first `1+1` answered,
    // curl's own times; closed before the next.
    let mut cold = Vec::with_capacity(COLD_SESSIONS);
    for _ in 0..COLD_SESSIONS {
        let (id, create) = create_timed(&server, "python")?;
        let (answer, first) = exec(&id, "1+1")?;
        curl(&server, "DELETE", &format!("/v1/sessions/{id}"), None)?;
        if !answer.contains('2') {
            bail!("`1+1` in a new session was not answered 2: {answer}");
        }
        cold.push(create + first);
    }
    let cold = median_ms(cold);
    figures.session_cold_ms = Some(cold);
    let (api_python, server_python) = api(&python, "1+1")?;
    let (api_bash, server_bash) = api(&bash, "true")?;
    let cli = |id: &str, code: &str| -> Result<f64> {
        let argv: Vec<String> = [
            codecage,
            "session",
            "--server",
            &format!("unix:{}", server.socket.display()),
            "exec",
            id,
            "-c",
            code,
        ]
        .map(String::from)
        .to_vec();
        Ok(median_ms(time_process(&argv, CALLS / 2)?))
    };
    let cli_python = cli(&python, "1+1")?;
    let cli_bash = cli(&bash, "true")?;
    let bare = median_ms(time_process(
        &["/usr/bin/python3", "-c", "pass"].map(String::from),
        CALLS / 2,
    )?);
    // An idle session's memory: its own cgroup's, the one new after its creation (a sum
    // over all of them, after minus before, lost what the session closed before it
    // released meanwhile: bash read 0.0 MiB).
    let idle_of = |lang: &str| -> Result<u64> {
        let before = session_cgroups_memory();
        let id = create(&server, lang)?;
        std::thread::sleep(Duration::from_millis(500));
        let after = session_cgroups_memory();
        curl(&server, "DELETE", &format!("/v1/sessions/{id}"), None)?;
        Ok(after
            .iter()
            .filter(|(dir, _)| !before.contains_key(*dir))
            .map(|(_, bytes)| bytes)
            .sum())
    };
    let idle_python = idle_of("python")?;
    figures.idle_python_mib = Some(idle_python as f64 / (1 << 20) as f64);
    let idle_node = idle_of("node")?;
    let idle_bash = idle_of("bash")?;
    for id in [&python, &bash, &node] {
        curl(&server, "DELETE", &format!("/v1/sessions/{id}"), None)?;
    }
    // Density: idle Python sessions until the cap or until memory runs short.
    status(
        "Measuring",
        format!("density: up to {density} idle Python sessions"),
    );
    let start = Instant::now();
    let available_before = mem_available();
    let mut held = Vec::new();
    let stop_reason = loop {
        if held.len() >= density {
            break format!("the cap of {density} asked for");
        }
        if mem_available() < KEEP_AVAILABLE {
            break format!("MemAvailable fell below {} GiB", KEEP_AVAILABLE >> 30);
        }
        match create(&server, "python") {
            Ok(id) => held.push(id),
            Err(e) => break format!("a create failed: {e}"),
        }
    };
    let per_session = available_before.saturating_sub(mem_available()) / held.len().max(1) as u64;
    let took = start.elapsed();
    for id in &held {
        let _ = curl(&server, "DELETE", &format!("/v1/sessions/{id}"), None);
    }
    drop(server);

    writeln!(out, "\n## Sessions\n")?;
    writeln!(
        out,
        "A `codecage serve` of {binary} on a unix socket, no pool, its sessions on the default image. API round trips are curl's own transfer \
         time of `POST /v1/sessions/{{id}}/execute` (its process start excluded); CLI round trips are whole \
         `codecage session exec` processes. Medians of {CALLS} API calls and {} CLI calls on warm sessions. \
         The server's CPU is all its threads' (the audit writer's included, not the session's own processes) \
         over the {CALLS} API calls, divided by them.\n",
        CALLS / 2
    )?;
    writeln!(
        out,
        "| call | through the API | the server's CPU a call | through the CLI | bare `python3 -c pass`, for scale |"
    )?;
    writeln!(out, "|---|---|---|---|---|")?;
    writeln!(
        out,
        "| Python `1+1` | {api_python:.2} ms | {server_python:.3} ms | {cli_python:.2} ms | {bare:.2} ms |"
    )?;
    writeln!(
        out,
        "| bash `true` | {api_bash:.2} ms | {server_bash:.3} ms | {cli_bash:.2} ms | |"
    )?;
    writeln!(
        out,
        "\nA Python session made cold (no session pool): its create, then its first `1+1` answered, {cold:.1} ms \
         (curl's own times of the two requests; median of {COLD_SESSIONS}, each closed before the next).\n"
    )?;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    writeln!(
        out,
        "| idle session | memory (its cgroup's usage) |\n|---|---|"
    )?;
    writeln!(out, "| Python | {:.1} MiB |", mib(idle_python))?;
    writeln!(out, "| Node.js | {:.1} MiB |", mib(idle_node))?;
    writeln!(out, "| bash | {:.1} MiB |", mib(idle_bash))?;
    writeln!(
        out,
        "\nDensity: {} idle Python sessions were created in {:.0} s before the measurement stopped ({stop_reason}); \
         the host's MemAvailable fell by {:.1} MiB per session (the sandbox, its interpreter, and the kernel's \
         share: namespaces, page tables, the session's cgroups).\n",
        held.len(),
        took.as_secs_f64(),
        mib(per_session)
    )?;
    Ok(())
}
