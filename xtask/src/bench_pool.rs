//! The warm-pool table of `cargo xtask bench`: a `codecage serve` of the binary measured
//! (the release one unless `--codecage`) with a pool of one Python sandbox and one Python session (the default image, its
//! preload: numpy, pandas, matplotlib); `POST /v1/run` of `pass` and of `import pandas`
//! taken from the pool, next to bare cold `python3 -c ...` of the image's Python; a new
//! session ready (its create and its first `1+1` answered); and the memory of an idle
//! pooled sandbox. Before each timed request the pool is full again: the figures are of a
//! warm pool, not of its refill.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::bench::Figures;
use crate::bench_sessions::{
    create_timed, curl, median_ms, require_image, start_server_with, time_process, Server, IMAGE,
};
use crate::host::status;

/// Requests per pooled figure (each waits for the pool's refill first).
const REQUESTS: usize = 25;

/// Waits until the pool holds one run sandbox and one session.
fn wait_full(server: &Server) -> Result<()> {
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let (body, _) = curl(server, "GET", "/v1/pool", None)?;
        let pool: serde_json::Value = serde_json::from_str(&body).with_context(|| body.clone())?;
        if pool["runs"]["python"] == 1 && pool["sessions"]["python"] == 1 {
            return Ok(());
        }
        if Instant::now() > end {
            bail!("the pool did not fill in 2 minutes: {body}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `code` through `POST /v1/run`, REQUESTS times, each from a full pool; curl's own
/// transfer time.
fn pooled_runs(server: &Server, code: &str) -> Result<Vec<Duration>> {
    let body = serde_json::json!({"language": "python", "code": code}).to_string();
    let mut times = Vec::new();
    for _ in 0..REQUESTS {
        wait_full(server)?;
        // Let the refill's last work (its preload's end) settle.
        std::thread::sleep(Duration::from_millis(200));
        let (out, time) = curl(server, "POST", "/v1/run", Some(&body))?;
        let value: serde_json::Value = serde_json::from_str(&out).with_context(|| out.clone())?;
        if value["exit_code"] != 0 {
            bail!("a pooled run failed: {out}");
        }
        times.push(time);
    }
    Ok(times)
}

/// The memory of each run cgroup a launcher (`pid`) made, v1 or v2: its usage and the
/// anonymous part of it (memory.stat's `rss` on v1, `anon` on v2), in bytes.
fn run_cgroups_memory(pid: u32) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for parent in ["/sys/fs/cgroup/memory/codecage", "/sys/fs/cgroup/codecage"] {
        let Ok(entries) = std::fs::read_dir(parent) else {
            continue;
        };
        for entry in entries.flatten() {
            // run-<pid ns>-<pid>-<start>-<n>
            let name = entry.file_name().to_string_lossy().to_string();
            if name.split('-').nth(2) != Some(pid.to_string().as_str()) {
                continue;
            }
            let read = |file: &str| std::fs::read_to_string(entry.path().join(file)).ok();
            let usage = ["memory.usage_in_bytes", "memory.current"]
                .iter()
                .find_map(|f| read(f)?.trim().parse().ok());
            let anon = read("memory.stat").and_then(|stat| {
                stat.lines().find_map(|l| {
                    let (key, value) = l.split_once(' ')?;
                    matches!(key, "rss" | "anon").then(|| value.trim().parse().ok())?
                })
            });
            if let Some(usage) = usage {
                out.push((usage, anon.unwrap_or(0)));
            }
        }
    }
    out
}

/// Writes the warm-pool table into `out`, its pooled runs' figures into `figures`;
/// `binary` names the codecage measured.
pub fn table(
    codecage: &str,
    binary: &str,
    work: &Path,
    figures: &mut Figures,
    out: &mut String,
) -> Result<()> {
    require_image("the warm-pool table")?;
    status(
        "Measuring",
        "the warm pool: pooled runs, session start, memory",
    );
    let server = start_server_with(
        codecage,
        work,
        8,
        "[pool]\nruns = { python = 1 }\nsessions = { python = 1 }\n",
    )?;
    wait_full(&server)?;
    let pass = median_ms(pooled_runs(&server, "pass")?);
    // An idle pooled sandbox's memory, measured after the pool has served requests: the
    // first sandbox to import the preload is charged the page cache of the files it read
    // first, the ones after it share that cache. The largest of the server's run cgroups
    // (the other is the pooled session's; its figure is in the sessions table).
    wait_full(&server)?;
    std::thread::sleep(Duration::from_millis(500));
    let (pooled_memory, pooled_anon) = run_cgroups_memory(server.pid())
        .into_iter()
        .max()
        .unwrap_or((0, 0));
    let pandas = median_ms(pooled_runs(&server, "import pandas")?);
    // A new session: its create and its first call, from a full pool.
    let mut ready = Vec::new();
    for _ in 0..REQUESTS {
        wait_full(&server)?;
        std::thread::sleep(Duration::from_millis(200));
        let (id, create) = create_timed(&server, "python")?;
        let (_, first) = curl(
            &server,
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(r#"{"code":"1+1"}"#),
        )?;
        ready.push(create + first);
        curl(&server, "DELETE", &format!("/v1/sessions/{id}"), None)?;
    }
    let ready = median_ms(ready);
    drop(server);
    // Bare, cold: the image's own Python (chroot, nothing else).
    let bare = |code: &str| -> Result<f64> {
        let argv: Vec<String> = ["chroot", IMAGE, "/usr/bin/python3", "-c", code]
            .map(String::from)
            .to_vec();
        time_process(&argv, 3)?;
        Ok(median_ms(time_process(&argv, REQUESTS)?))
    };
    let bare_pass = bare("pass")?;
    let bare_pandas = bare("import pandas")?;
    figures.pool_pass = Some((pass, bare_pass));
    figures.pool_pandas = Some((pandas, bare_pandas));
    let mib = |b: u64| b as f64 / (1 << 20) as f64;

    writeln!(out, "\n## Warm pool\n")?;
    writeln!(
        out,
        "A `codecage serve` of {binary} with `[pool] runs = {{ python = 1 }}, sessions = {{ python = 1 }}` \
         on the default image (the python profile's preload: numpy, pandas, matplotlib). Each request is made from a \
         full pool (the refill of the one before done); times are curl's own (the request over the unix socket to \
         the whole answer). Bare is the image's Python, cold, `chroot`ed. Medians of {REQUESTS}.\n"
    )?;
    writeln!(
        out,
        "| request | through the pool | bare, cold | pool / bare |"
    )?;
    writeln!(out, "|---|---|---|---|")?;
    writeln!(
        out,
        "| `POST /v1/run` python `pass` | {pass:.1} ms | {bare_pass:.1} ms (`python3 -c pass`) | {:.2}x |",
        pass / bare_pass
    )?;
    writeln!(
        out,
        "| `POST /v1/run` python `import pandas` | {pandas:.1} ms | {bare_pandas:.1} ms (`python3 -c 'import pandas'`) | {:.2}x |",
        pandas / bare_pandas
    )?;
    writeln!(
        out,
        "| a new Python session ready (create, then `1+1` answered) | {ready:.1} ms | | |"
    )?;
    writeln!(
        out,
        "\nAn idle pooled Python sandbox holds {:.1} MiB (its cgroup's usage; {:.1} MiB of it anonymous memory: \
         the interpreter with its preload imported); that memory is added to the request's limit when it is \
         handed over.\n",
        mib(pooled_memory),
        mib(pooled_anon)
    )?;
    Ok(())
}
