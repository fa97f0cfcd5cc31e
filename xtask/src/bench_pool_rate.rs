//! The warm pool at a steady rate, a table of `cargo xtask bench` (`--pool-rate` alone): a
//! `codecage serve` with `[pool] runs = { python = N }` (N = 0, 1, 4; the default image,
//! the python profile's preload) takes `POST /v1/run` of python `pass` and of
//! `import pandas` back to back, from one client and from two at once; a refill is timed on
//! the idle pool of 1; then, with a pool of 4, `pass` at a paced rate. Unlike the warm-pool table, nothing waits for the
//! refill between requests: the figures are of a pool under load, refills competing with
//! the requests for the CPU. Whether a request was served from the pool is its result's
//! own `warm` field.
//!
//! The client is a plain HTTP/1.1 request over the unix socket from a thread of this
//! process (no curl process per request, whose start would take CPU from the server).

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::bench_sessions::{require_image, start_server_with, Server};
use crate::host::status;

/// Requests per back-to-back figure unless `--pool-rate-requests` says otherwise.
pub const DEFAULT_REQUESTS: usize = 200;
/// Requests before each server's figures, not counted (page cache, the server's first
/// sandbox).
const WARMUP: usize = 5;
/// The pool sizes measured back to back.
const POOL_SIZES: [usize; 3] = [0, 1, 4];
/// The codes measured back to back.
const CODES: [&str; 2] = ["pass", "import pandas"];
/// The concurrent clients of each back-to-back figure.
const CLIENTS: [usize; 2] = [1, 2];
/// The pool of the paced series, its rates (requests/s) and how long each lasts.
const PACED_POOL: usize = 4;
const PACED_RATES: [usize; 4] = [1, 2, 4, 8];
const PACED_SECONDS: u64 = 15;
/// Refills timed on an idle server with a pool of 1.
const REFILLS: usize = 5;

/// One HTTP/1.1 request over the server's socket (`Connection: close`): the status, the
/// body (chunked transfer decoded) and the time from connecting to the answer's last byte.
pub(crate) fn request(
    server: &Server,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, String, Duration)> {
    let start = Instant::now();
    let mut stream = UnixStream::connect(&server.socket)
        .with_context(|| format!("connecting to {}", server.socket.display()))?;
    let body = body.unwrap_or("");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: codecage\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let time = start.elapsed();
    let (status, body) = parse_response(&raw)?;
    Ok((status, body, time))
}

/// An HTTP/1.1 response's status and body, its chunked transfer encoding undone.
fn parse_response(raw: &[u8]) -> Result<(u16, String)> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("not an HTTP response: {text:?}"))?;
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in the response's head: {head:?}"))?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .replace(' ', "")
            .starts_with("transfer-encoding:chunked")
    });
    if !chunked {
        return Ok((status, body.to_string()));
    }
    let mut out = String::new();
    let mut rest = body;
    loop {
        let (size, after) = rest
            .split_once("\r\n")
            .with_context(|| format!("a chunk without its size line: {rest:?}"))?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("a chunk's size is not hex: {size:?}"))?;
        if size == 0 {
            return Ok((status, out));
        }
        let chunk = after
            .get(..size)
            .with_context(|| format!("a chunk shorter than its size ({size}): {after:?}"))?;
        out.push_str(chunk);
        rest = after[size..].trim_start_matches("\r\n");
    }
}

/// `POST /v1/run` of python `code`: its time and whether the pool served it.
fn run(server: &Server, code: &str) -> Result<(Duration, bool)> {
    let body = serde_json::json!({"language": "python", "code": code}).to_string();
    let (status, out, time) = request(server, "POST", "/v1/run", Some(&body))?;
    let value: serde_json::Value =
        serde_json::from_str(&out).with_context(|| format!("status {status}: {out}"))?;
    if status != 200 || value["exit_code"] != 0 {
        bail!("POST /v1/run of python {code:?} failed (status {status}): {out}");
    }
    let warm = value["warm"]
        .as_bool()
        .with_context(|| format!("the run's result has no `warm`: {out}"))?;
    Ok((time, warm))
}

/// Waits until the pool holds `n` of `kind` (`runs` or `sessions`) for the python profile,
/// then a moment more for the last one's start (its preload) to settle.
pub(crate) fn wait_pool(server: &Server, kind: &str, n: usize) -> Result<()> {
    let end = Instant::now() + Duration::from_secs(300);
    loop {
        let (_, body, _) = request(server, "GET", "/v1/pool", None)?;
        let pool: serde_json::Value = serde_json::from_str(&body).with_context(|| body.clone())?;
        if pool[kind]["python"].as_u64().unwrap_or(0) as usize >= n {
            std::thread::sleep(Duration::from_millis(500));
            return Ok(());
        }
        if Instant::now() > end {
            bail!("the {kind} pool did not fill to {n} in 5 minutes: {body}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The time a refill takes on an otherwise idle server with a pool of one: from a pooled
/// run's answer until `GET /v1/pool` shows a sandbox ready again, the median of
/// [`REFILLS`], ms.
fn refill_ms(server: &Server) -> Result<f64> {
    let mut times = Vec::new();
    for _ in 0..REFILLS {
        wait_pool(server, "runs", 1)?;
        let (_, warm) = run(server, "pass")?;
        let answered = Instant::now();
        if !warm {
            bail!("a run from a full pool of 1 was not served from the pool");
        }
        let end = answered + Duration::from_secs(180);
        loop {
            let (_, body, _) = request(server, "GET", "/v1/pool", None)?;
            let pool: serde_json::Value =
                serde_json::from_str(&body).with_context(|| body.clone())?;
            if pool["runs"]["python"] == 1 {
                break;
            }
            if Instant::now() > end {
                bail!("the pool of 1 did not refill in 3 minutes: {body}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        times.push(answered.elapsed());
    }
    times.sort();
    Ok(percentile_ms(&times, 50))
}

/// What a series of requests gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub requests: usize,
    pub pooled: usize,
    /// Requests answered per second of the series' wall time.
    pub per_second: f64,
    pub median_ms: f64,
    pub p90_ms: f64,
}

impl Series {
    /// The figures of `results` (time, served from the pool) over `wall`.
    fn of(results: &[(Duration, bool)], wall: Duration) -> Series {
        let mut times: Vec<Duration> = results.iter().map(|r| r.0).collect();
        times.sort();
        Series {
            requests: results.len(),
            pooled: results.iter().filter(|r| r.1).count(),
            per_second: results.len() as f64 / wall.as_secs_f64(),
            median_ms: percentile_ms(&times, 50),
            p90_ms: percentile_ms(&times, 90),
        }
    }
}

/// The `p`th percentile of sorted `times` (nearest rank), ms.
pub(crate) fn percentile_ms(sorted: &[Duration], p: usize) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank - 1].as_secs_f64() * 1000.0
}

/// `requests` runs of `code` back to back, split over `clients` threads each sending its
/// next as soon as its last is answered.
fn back_to_back(server: &Server, code: &str, requests: usize, clients: usize) -> Result<Series> {
    let start = Instant::now();
    let results = std::thread::scope(|scope| -> Result<Vec<(Duration, bool)>> {
        let workers: Vec<_> = (0..clients)
            .map(|c| {
                // Client c sends every clients-th request, so the counts add up.
                let mine = (c..requests).step_by(clients).count();
                scope.spawn(move || {
                    (0..mine)
                        .map(|_| run(server, code))
                        .collect::<Result<Vec<_>>>()
                })
            })
            .collect();
        let mut all = Vec::new();
        for worker in workers {
            all.extend(
                worker
                    .join()
                    .map_err(|_| anyhow::anyhow!("a client thread panicked"))??,
            );
        }
        Ok(all)
    })?;
    Ok(Series::of(&results, start.elapsed()))
}

/// `pass` at `rate` requests a second for `seconds`, each sent on time whether the ones
/// before are answered or not (an open loop, as independent callers would).
fn paced(server: &Server, rate: usize, seconds: u64) -> Result<Series> {
    let count = rate * seconds as usize;
    let start = Instant::now();
    let results = std::thread::scope(|scope| -> Result<Vec<(Duration, bool)>> {
        let mut sent = Vec::new();
        for i in 0..count {
            let due = start + Duration::from_secs_f64(i as f64 / rate as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            sent.push(scope.spawn(move || run(server, "pass")));
        }
        sent.into_iter()
            .map(|t| {
                t.join()
                    .map_err(|_| anyhow::anyhow!("a client thread panicked"))?
            })
            .collect()
    })?;
    Ok(Series::of(&results, start.elapsed()))
}

/// A server of `codecage` with a run pool of `n` python sandboxes (no sessions).
fn server_with_pool(codecage: &str, work: &Path, n: usize) -> Result<Server> {
    let runs = if n == 0 {
        "{}".to_string()
    } else {
        format!("{{ python = {n} }}")
    };
    let server = start_server_with(
        codecage,
        work,
        8,
        &format!("[pool]\nruns = {runs}\nsessions = {{}}\n"),
    )?;
    wait_pool(&server, "runs", n)?;
    for _ in 0..WARMUP {
        run(&server, "pass")?;
    }
    Ok(server)
}

/// Writes the steady-rate table into `out`; `binary` names the codecage measured.
pub fn table(
    codecage: &str,
    binary: &str,
    work: &Path,
    requests: usize,
    out: &mut String,
) -> Result<()> {
    require_image("the steady-rate pool table")?;
    let mut rows = Vec::new();
    let mut refill = None;
    for n in POOL_SIZES {
        status(
            "Measuring",
            format!("the pool at a steady rate: python = {n}, {requests} requests back to back"),
        );
        let server = server_with_pool(codecage, work, n)?;
        if n == 1 {
            refill = Some(refill_ms(&server)?);
        }
        for code in CODES {
            for clients in CLIENTS {
                wait_pool(&server, "runs", n)?;
                rows.push((
                    n,
                    code,
                    clients,
                    back_to_back(&server, code, requests, clients)?,
                ));
            }
        }
    }
    status(
        "Measuring",
        format!(
            "the pool at a steady rate: python = {PACED_POOL}, paced at {PACED_RATES:?} requests/s"
        ),
    );
    let server = server_with_pool(codecage, work, PACED_POOL)?;
    let mut paced_rows = Vec::new();
    for rate in PACED_RATES {
        wait_pool(&server, "runs", PACED_POOL)?;
        paced_rows.push((rate, paced(&server, rate, PACED_SECONDS)?));
    }
    drop(server);
    let refill = refill.context("no pool of 1 measured the refill")?;
    write_table(binary, requests, &rows, refill, &paced_rows, out)
}

fn write_table(
    binary: &str,
    requests: usize,
    rows: &[(usize, &str, usize, Series)],
    refill_ms: f64,
    paced_rows: &[(usize, Series)],
    out: &mut String,
) -> Result<()> {
    writeln!(out, "\n## Warm pool at a steady rate\n")?;
    writeln!(
        out,
        "A `codecage serve` of {binary} with `[pool] runs = {{ python = N }}` (no pooled sessions) on the default image (the \
         python profile's preload: numpy, pandas, matplotlib) takes {requests} `POST /v1/run` of python code back to \
         back, from one client and from two at once (each sends its next request when its last is answered), after \
         {WARMUP} not counted and from a full pool. Nothing waits for a refill: a request finds a pooled sandbox only \
         if the refill, which imports the preload again, kept up, and the refills compete with the requests for the \
         CPU. Served from the pool counts the results whose `warm` is true. Times are the client's, from connecting \
         to the socket to the answer's last byte; requests/s is the count over the series' wall time.\n"
    )?;
    writeln!(
        out,
        "| pool | code | clients | requests/s | median | p90 | served from the pool |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|")?;
    for (n, code, clients, s) in rows {
        writeln!(
            out,
            "| {n} | `{code}` | {clients} | {:.1} | {:.1} ms | {:.1} ms | {} / {} |",
            s.per_second, s.median_ms, s.p90_ms, s.pooled, s.requests
        )?;
    }
    writeln!(
        out,
        "\nA refill (one sandbox built and its preload imported) takes {refill_ms:.0} ms on an otherwise idle \
         server (from a pooled run's answer until the pool of 1 is full again; median of {REFILLS}). A profile's \
         refills run one at a time, so however large the pool, it serves every request only below about {:.1} \
         requests/s, less when the requests' own work takes the CPU the refill needs; a larger pool absorbs a \
         longer burst, not a faster stream.",
        1000.0 / refill_ms
    )?;
    writeln!(
        out,
        "\nA pool of {PACED_POOL} at a paced rate: `pass` sent at a fixed rate for {PACED_SECONDS} s each (every \
         request on time, answered or not), from a full pool.\n"
    )?;
    writeln!(
        out,
        "| offered rate | requests | served from the pool | median | p90 |"
    )?;
    writeln!(out, "|---|---|---|---|---|")?;
    for (rate, s) in paced_rows {
        writeln!(
            out,
            "| {rate} requests/s | {} | {} / {} | {:.1} ms | {:.1} ms |",
            s.requests, s.pooled, s.requests, s.median_ms, s.p90_ms
        )?;
    }
    writeln!(out, "\n{}\n", paced_verdict(paced_rows))?;
    Ok(())
}

/// Up to which paced rate a pool served every request.
fn paced_verdict(paced_rows: &[(usize, Series)]) -> String {
    let kept = paced_rows
        .iter()
        .take_while(|(_, s)| s.pooled == s.requests)
        .last();
    let first_miss = paced_rows.iter().find(|(_, s)| s.pooled < s.requests);
    match (kept, first_miss) {
        (_, None) => format!(
            "A pool of {PACED_POOL} served every request from the pool at each rate measured (up to {} requests/s).",
            paced_rows.last().map_or(0, |r| r.0)
        ),
        (None, Some((rate, s))) => format!(
            "A pool of {PACED_POOL} did not keep up at any rate measured: at {rate} requests/s {} of {} were cold.",
            s.requests - s.pooled,
            s.requests
        ),
        (Some((kept, _)), Some((rate, s))) => format!(
            "A pool of {PACED_POOL} served every request from the pool at {kept} requests/s; at {rate} requests/s \
             {} of {} were cold.",
            s.requests - s.pooled,
            s.requests
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_read_plain_and_chunked() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 13\r\n\r\n{\"warm\":true}";
        assert_eq!(
            parse_response(plain).unwrap(),
            (200, "{\"warm\":true}".to_string())
        );
        let chunked =
            b"HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n";
        assert_eq!(
            parse_response(chunked).unwrap(),
            (429, "{\"a\":1}".to_string())
        );
        assert!(parse_response(b"garbage").is_err());
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err()
        );
    }

    #[test]
    fn series_figures() {
        let ms = Duration::from_millis;
        let results: Vec<(Duration, bool)> = (1..=10).map(|i| (ms(i * 10), i <= 4)).collect();
        let s = Series::of(&results, Duration::from_secs(2));
        assert_eq!((s.requests, s.pooled), (10, 4));
        assert_eq!(s.per_second, 5.0);
        assert_eq!((s.median_ms, s.p90_ms), (50.0, 90.0));
        let series = |requests, pooled| Series {
            requests,
            pooled,
            per_second: 0.0,
            median_ms: 0.0,
            p90_ms: 0.0,
        };
        let verdict = paced_verdict(&[
            (2, series(30, 30)),
            (4, series(60, 52)),
            (8, series(120, 20)),
        ]);
        assert!(
            verdict.contains("at 2 requests/s; at 4 requests/s 8 of 60 were cold"),
            "{verdict}"
        );
        assert!(paced_verdict(&[(2, series(30, 29))]).contains("did not keep up at any rate"));
        assert!(paced_verdict(&[(2, series(30, 30))]).contains("up to 2 requests/s"));
    }
}
