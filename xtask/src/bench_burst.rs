//! The session burst, a table of `cargo xtask bench` (`--session-burst` alone): a
//! `codecage serve` with `[pool] sessions = { python = N }` (N = 50, then 4; the default
//! image), its pool full, takes [`CLIENTS`] clients at once, each creating a Python session
//! (`POST /v1/sessions`) and sending it `1+1` (`POST /v1/sessions/{id}/execute`). Each
//! client's time runs from the burst's start (all threads released together) to its `1+1`
//! answered; the burst's time until the last is answered. The sessions are closed after.
//!
//! The clients are threads of this process, each a plain HTTP/1.1 request over the unix
//! socket (the steady-rate table's client), so 50 curl processes' starts do not take the
//! CPU the server needs.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::bench::Figures;
use crate::bench_pool_rate::{percentile_ms, request, wait_pool};
use crate::bench_sessions::{require_image, start_server_with, Server};
use crate::host::status;

/// The clients of a burst, all at once.
pub const CLIENTS: usize = 50;
/// The session pools the burst is measured against: as large as the burst, and small.
pub const POOLS: [usize; 2] = [CLIENTS, 4];

/// What a burst gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Burst {
    /// The session pool it met (full).
    pub pool: usize,
    pub clients: usize,
    /// The median client's time.
    pub p50_ms: f64,
    /// The 99th percentile, nearest rank: of 50 clients, the slowest.
    pub p99_ms: f64,
    /// From the release of the clients until the last `1+1` is answered.
    pub wall_ms: f64,
}

impl Burst {
    /// The figures of each client's time (`times`) and the burst's `wall` time.
    pub fn of(pool: usize, mut times: Vec<Duration>, wall: Duration) -> Burst {
        times.sort();
        Burst {
            pool,
            clients: times.len(),
            p50_ms: percentile_ms(&times, 50),
            p99_ms: percentile_ms(&times, 99),
            wall_ms: wall.as_secs_f64() * 1000.0,
        }
    }
}

/// One client: a Python session created and `1+1` answered in it; its id and when the
/// answer came.
fn create_and_call(server: &Server) -> Result<(String, Instant)> {
    let (code, body, _) = request(
        server,
        "POST",
        "/v1/sessions",
        Some(r#"{"language":"python"}"#),
    )?;
    let value: serde_json::Value =
        serde_json::from_str(&body).with_context(|| format!("status {code}: {body}"))?;
    let id = value["id"]
        .as_str()
        .with_context(|| format!("POST /v1/sessions gave no session (status {code}): {body}"))?
        .to_string();
    let (code, body, _) = request(
        server,
        "POST",
        &format!("/v1/sessions/{id}/execute"),
        Some(r#"{"code":"1+1"}"#),
    )?;
    if code != 200 || !body.contains('2') {
        bail!("`1+1` in session {id} was not answered 2 (status {code}): {body}");
    }
    Ok((id, Instant::now()))
}

/// [`CLIENTS`] clients released at once against a server whose pool holds `pool` sessions.
fn burst(server: &Server, pool: usize) -> Result<Burst> {
    wait_pool(server, "sessions", pool)?;
    let gate = Barrier::new(CLIENTS + 1);
    let (start, results) = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                scope.spawn(|| {
                    gate.wait();
                    create_and_call(server)
                })
            })
            .collect();
        gate.wait();
        let start = Instant::now();
        let results: Vec<Result<(String, Instant)>> = clients
            .into_iter()
            .map(|c| {
                c.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client thread panicked")))
            })
            .collect();
        (start, results)
    });
    // Close every session made, failures or not, before reporting a failure.
    let mut times = Vec::new();
    let mut last = start;
    let mut failure = None;
    for result in results {
        match result {
            Ok((id, answered)) => {
                let _ = request(server, "DELETE", &format!("/v1/sessions/{id}"), None);
                times.push(answered.saturating_duration_since(start));
                last = last.max(answered);
            }
            Err(e) => failure = Some(e),
        }
    }
    if let Some(e) = failure {
        return Err(e.context(format!("a client of the burst against a pool of {pool}")));
    }
    Ok(Burst::of(pool, times, last - start))
}

/// Measures a burst against each of [`POOLS`]; writes the table into `out` and the bursts
/// into `figures`. `binary` names the codecage measured.
pub fn table(
    codecage: &str,
    binary: &str,
    work: &Path,
    figures: &mut Figures,
    out: &mut String,
) -> Result<()> {
    require_image("the session burst")?;
    let mut bursts = Vec::new();
    for pool in POOLS {
        status(
            "Measuring",
            format!("a burst of {CLIENTS} session creations against a session pool of {pool}"),
        );
        // Room for the burst's sessions and the pool's refill beside them.
        let server = start_server_with(
            codecage,
            work,
            CLIENTS + pool,
            &format!("[pool]\nruns = {{}}\nsessions = {{ python = {pool} }}\n"),
        )?;
        bursts.push(burst(&server, pool)?);
    }
    write_table(binary, &bursts, out)?;
    figures.burst_pool_full = bursts.iter().find(|b| b.pool == CLIENTS).cloned();
    figures.burst_pool_small = bursts.iter().find(|b| b.pool < CLIENTS).cloned();
    Ok(())
}

fn write_table(binary: &str, bursts: &[Burst], out: &mut String) -> Result<()> {
    writeln!(out, "\n### A burst of session creations\n")?;
    writeln!(
        out,
        "A `codecage serve` of {binary} with `[pool] sessions = {{ python = N }}` on the default image, its pool \
         full, takes {CLIENTS} clients at once (threads released together), each creating a Python session and \
         sending it `1+1`. A client's time runs from the release to its `1+1` answered (plain HTTP/1.1 over the \
         unix socket, connecting included); p99 is the nearest rank, so of {CLIENTS} it is the slowest. The burst's \
         time runs until the last answer. The sessions are closed after.\n"
    )?;
    writeln!(
        out,
        "| session pool | clients | p50 | p99 (the slowest) | the burst |"
    )?;
    writeln!(out, "|---|---|---|---|---|")?;
    for b in bursts {
        writeln!(
            out,
            "| {} | {} | {:.1} ms | {:.1} ms | {:.2} s |",
            b.pool,
            b.clients,
            b.p50_ms,
            b.p99_ms,
            b.wall_ms / 1000.0
        )?;
    }
    writeln!(out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_s_percentiles() {
        // 50 clients, 1..=50 ms: the median is the 25th, the p99 the slowest.
        let times: Vec<Duration> = (1..=50).rev().map(Duration::from_millis).collect();
        let b = Burst::of(4, times, Duration::from_millis(1700));
        assert_eq!(b.clients, 50);
        assert_eq!((b.p50_ms, b.p99_ms, b.wall_ms), (25.0, 50.0, 1700.0));
        // Of 200, the p99 is the 198th.
        let times: Vec<Duration> = (1..=200).map(Duration::from_millis).collect();
        let b = Burst::of(50, times, Duration::from_secs(1));
        assert_eq!((b.p50_ms, b.p99_ms), (100.0, 198.0));
    }

    #[test]
    fn the_table_has_a_row_per_pool() {
        let mut out = String::new();
        let bursts = [
            Burst::of(
                50,
                vec![Duration::from_millis(8); 50],
                Duration::from_millis(40),
            ),
            Burst::of(
                4,
                vec![Duration::from_millis(900); 50],
                Duration::from_millis(1700),
            ),
        ];
        write_table("`/x/codecage`", &bursts, &mut out).unwrap();
        assert!(out.contains("A `codecage serve` of `/x/codecage` with"));
        assert!(
            out.contains("| 50 | 50 | 8.0 ms | 8.0 ms | 0.04 s |"),
            "{out}"
        );
        assert!(
            out.contains("| 4 | 50 | 900.0 ms | 900.0 ms | 1.70 s |"),
            "{out}"
        );
    }
}
