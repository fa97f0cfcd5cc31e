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
/// Bursts against each pool, the pool full and the machine settled before each. Their
/// clients' times are pooled: one burst's p99 is its slowest client alone, which swung from
/// 29 to 41 ms between bursts of the same build on the build host.
pub const ROUNDS: usize = 5;

/// One burst: each client's time, and the burst's, from the release of the clients until
/// the last `1+1` is answered.
pub type Round = (Vec<Duration>, Duration);

/// What the bursts against one pool gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Burst {
    /// The session pool they met (full).
    pub pool: usize,
    /// Clients of each burst.
    pub clients: usize,
    pub rounds: usize,
    /// The median client's time, over every burst's clients.
    pub p50_ms: f64,
    /// The 99th percentile over every burst's clients, nearest rank (of 5 x 50, the third
    /// slowest).
    pub p99_ms: f64,
    /// Each burst's slowest client, fastest burst first.
    pub slowest_ms: Vec<f64>,
    /// The median burst's time.
    pub wall_ms: f64,
}

impl Burst {
    /// The figures of the `rounds` against `pool`.
    pub fn of(pool: usize, rounds: Vec<Round>) -> Burst {
        let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
        let mut times: Vec<Duration> = rounds.iter().flat_map(|(t, _)| t.clone()).collect();
        times.sort();
        let mut slowest: Vec<f64> = rounds
            .iter()
            .map(|(t, _)| t.iter().max().map_or(0.0, ms))
            .collect();
        slowest.sort_by(f64::total_cmp);
        let mut walls: Vec<Duration> = rounds.iter().map(|(_, wall)| *wall).collect();
        walls.sort();
        Burst {
            pool,
            clients: rounds.first().map_or(0, |(t, _)| t.len()),
            rounds: rounds.len(),
            p50_ms: percentile_ms(&times, 50),
            p99_ms: percentile_ms(&times, 99),
            slowest_ms: slowest,
            wall_ms: walls.get(walls.len() / 2).map_or(0.0, ms),
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
fn burst(server: &Server, pool: usize) -> Result<Round> {
    wait_pool(server, "sessions", pool)?;
    crate::bench::settle();
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
    Ok((times, last - start))
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
        let rounds = (0..ROUNDS)
            .map(|_| burst(&server, pool))
            .collect::<Result<Vec<_>>>()?;
        bursts.push(Burst::of(pool, rounds));
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
         unix socket, connecting included). {ROUNDS} bursts against each pool, the pool full again and the machine \
         settled before each; p50 and p99 are over all their clients (nearest rank: of {} the p99 is the third \
         slowest), and each burst's slowest client is listed too. The burst's time runs until its last answer \
         (the median burst). The sessions are closed after.\n",
        ROUNDS * CLIENTS
    )?;
    writeln!(
        out,
        "| session pool | clients | bursts | p50 | p99 | each burst's slowest | the burst |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|")?;
    for b in bursts {
        let slowest: Vec<String> = b.slowest_ms.iter().map(|t| format!("{t:.1}")).collect();
        writeln!(
            out,
            "| {} | {} | {} | {:.1} ms | {:.1} ms | {} ms | {:.2} s |",
            b.pool,
            b.clients,
            b.rounds,
            b.p50_ms,
            b.p99_ms,
            slowest.join(", "),
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
        // One burst of 50 clients, 1..=50 ms: the median is the 25th, the p99 the slowest.
        let times: Vec<Duration> = (1..=50).rev().map(Duration::from_millis).collect();
        let b = Burst::of(4, vec![(times, Duration::from_millis(1700))]);
        assert_eq!((b.clients, b.rounds), (50, 1));
        assert_eq!((b.p50_ms, b.p99_ms, b.wall_ms), (25.0, 50.0, 1700.0));
        // Four bursts of 50 (1..=200 ms in all): the p99 is the 198th of the 200, the
        // slowest of each burst listed, the burst's time the median one's.
        let rounds: Vec<Round> = (0..4u64)
            .map(|r| {
                let times = (1..=50)
                    .map(|i| Duration::from_millis(r * 50 + i))
                    .collect();
                (times, Duration::from_millis(100 * (4 - r)))
            })
            .collect();
        let b = Burst::of(50, rounds);
        assert_eq!((b.clients, b.rounds), (50, 4));
        assert_eq!((b.p50_ms, b.p99_ms), (100.0, 198.0));
        assert_eq!(b.slowest_ms, vec![50.0, 100.0, 150.0, 200.0]);
        assert_eq!(b.wall_ms, 300.0);
    }

    #[test]
    fn the_table_has_a_row_per_pool() {
        let mut out = String::new();
        let round = |ms, wall| {
            (
                vec![Duration::from_millis(ms); 50],
                Duration::from_millis(wall),
            )
        };
        let bursts = [
            Burst::of(50, vec![round(8, 40), round(9, 41)]),
            Burst::of(4, vec![round(900, 1700)]),
        ];
        write_table("`/x/codecage`", &bursts, &mut out).unwrap();
        assert!(out.contains("A `codecage serve` of `/x/codecage` with"));
        assert!(
            out.contains("| 50 | 50 | 2 | 8.0 ms | 9.0 ms | 8.0, 9.0 ms | 0.04 s |"),
            "{out}"
        );
        assert!(
            out.contains("| 4 | 50 | 1 | 900.0 ms | 900.0 ms | 900.0 ms | 1.70 s |"),
            "{out}"
        );
    }
}
