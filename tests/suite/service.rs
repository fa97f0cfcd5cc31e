//! The server as its clients' attacker would try it (issue 21): sessions owned by their
//! caller, quotas and profiles per token, listeners that half-open connections cannot
//! exhaust, streams that end with their verdict, a client that goes stops its call. Each
//! test prints the server's peak RSS and open fds for the record.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::common::*;
use super::server::Server;

const USER1: &str = "user1-token-0123456789abcdef";
const USER2: &str = "user2-token-0123456789abcdef";
const ADMIN: &str = "admin-token-0123456789abcdef";

fn tokens(extra_user2: &str) -> String {
    format!(
        "[[tokens]]\nname = \"user1\"\ntoken = \"{USER1}\"\n\
         [[tokens]]\nname = \"user2\"\ntoken = \"{USER2}\"\n{extra_user2}\n\
         [[tokens]]\nname = \"ops\"\ntoken = \"{ADMIN}\"\nrole = \"admin\"\n"
    )
}

fn figures(server: &Server, test: &str) {
    let (rss, fds) = server.footprint();
    eprintln!("figures: {test}: server peak RSS {rss} KiB, {fds} fds open");
}

/// Finding 1: user2 neither sees nor touches user1's session (404 as for one that never
/// was); the admin sees and uses it; the audit records who did what to whose session.
#[test]
fn another_tokens_session_is_invisible_and_untouchable() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let (status, created) = server.tcp_request(
            USER1,
            "POST",
            "/v1/sessions",
            Some(json!({"language": "python"})),
        );
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        let execute = format!("/v1/sessions/{id}/execute");
        let (status, out) = server.tcp_request(
            USER1,
            "POST",
            &execute,
            Some(json!({"code": "secret = 'user1-secret-value'"})),
        );
        assert_eq!(status, 200, "{out}");

        // user2: nothing listed; every route of the session is 404 not_found.
        let (status, list) = server.tcp_request(USER2, "GET", "/v1/sessions", None);
        assert_eq!((status, list.clone()), (200, json!([])), "{list}");
        let session = format!("/v1/sessions/{id}");
        let tries: Vec<(&str, String, Option<Value>)> = vec![
            ("GET", session.clone(), None),
            (
                "POST",
                execute.clone(),
                Some(json!({"code": "print(secret)"})),
            ),
            ("POST", format!("{session}/reset"), None),
            ("POST", format!("{session}/interrupt"), None),
            ("GET", format!("{session}/files"), None),
            ("GET", format!("{session}/files/main.py"), None),
            ("DELETE", session.clone(), None),
        ];
        for (method, path, body) in tries {
            let (status, out) = server.tcp_request(USER2, method, &path, body);
            assert_eq!(status, 404, "{method} {path}: {out}");
            assert_eq!(out["error"], "not_found", "{method} {path}: {out}");
            assert!(!out.to_string().contains("user1-secret"), "{out}");
        }
        // An unknown id answers the same words: existence is not revealed.
        let (_, unknown) = server.tcp_request(USER2, "GET", "/v1/sessions/0123abcd", None);
        assert_eq!(
            unknown["message"]
                .as_str()
                .unwrap()
                .replace("0123abcd", &id),
            server.tcp_request(USER2, "GET", &session, None).1["message"]
        );

        // The owner still has it, whole.
        let (status, out) = server.tcp_request(
            USER1,
            "POST",
            &execute,
            Some(json!({"code": "print(secret)"})),
        );
        assert_eq!(
            (status, out["stdout"].as_str()),
            (200, Some("user1-secret-value\n"))
        );
        // The admin sees and uses every session.
        let (_, list) = server.tcp_request(ADMIN, "GET", "/v1/sessions", None);
        assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
        let (status, out) =
            server.tcp_request(ADMIN, "POST", &execute, Some(json!({"code": "1 + 1"})));
        assert_eq!(status, 200, "{out}");

        // The audit: user1's call, user2's refusals, the admin's call on user1's session.
        let (status, records) = server.tcp_request(
            ADMIN,
            "GET",
            &format!("/v1/audit?session={id}&limit=100"),
            None,
        );
        assert_eq!(status, 200, "{records}");
        let records = records["records"].as_array().unwrap().clone();
        let callers: Vec<&str> = records
            .iter()
            .filter_map(|r| r["caller"].as_str())
            .collect();
        assert!(callers.contains(&"token:user1"), "{callers:?}");
        assert!(
            records.iter().any(
                |r| r["caller"] == "token:ops(admin)" && r["details"]["owner"] == "token:user1"
            ),
            "{records:?}"
        );
        assert_eq!(server.tcp_request(USER1, "DELETE", &session, None).0, 204);
        figures(&server, "two tokens");
        server.stop();
    });
}

/// Finding 7 (profiles) and the token's quotas: a token names only its profiles (by
/// default the language ones, never `ci`), asks no more than its ceilings, and past its
/// `max_sessions` gets 429 with Retry-After.
#[test]
fn a_token_is_held_to_its_profiles_ceilings_and_quotas() {
    as_root(|| {
        let server = Server::start(
            &tokens(
                "max_sessions = 1\nmax_concurrent_runs = 1\n[tokens.limits]\nmemory = \"128M\"\n",
            ),
            true,
        );
        // The built-in ci profile (8G, 4096 pids, 1 h) is not a default token's.
        for token in [USER1, USER2] {
            ci_is_refused(
                &|m, p, b| server.tcp_request(token, m, p, b),
                "python, node",
            );
        }
        // The admin may.
        let (status, out) = server.tcp_request(
            ADMIN,
            "POST",
            "/v1/run",
            Some(json!({"profile": "ci", "argv": ["true"]})),
        );
        assert_eq!(status, 200, "{out}");
        memory_is_held_to_128m(&|m, p, b| server.tcp_request(USER2, m, p, b));
        // max_sessions = 1: the second is 429 with Retry-After; user1 is not held to it.
        let first = one_session_then_429(
            &|m, p, b| server.tcp_request(USER2, m, p, b),
            &|args| server.tcp_curl(USER2, args),
            &format!("http://{}/v1/sessions", server.tcp_address()),
        );
        let (status, other) = server.tcp_request(
            USER1,
            "POST",
            "/v1/sessions",
            Some(json!({"language": "bash"})),
        );
        assert_eq!(status, 201, "{other}");
        // Closing one gives the room back.
        let id = first["id"].as_str().unwrap();
        assert_eq!(
            server
                .tcp_request(USER2, "DELETE", &format!("/v1/sessions/{id}"), None)
                .0,
            204
        );
        let (status, again) = server.tcp_request(
            USER2,
            "POST",
            "/v1/sessions",
            Some(json!({"language": "bash"})),
        );
        assert_eq!(status, 201, "{again}");
        // max_concurrent_runs = 1: a second run while one runs is 429; user1 is not held.
        let (tcp, slow) = (
            server.tcp_address(),
            json!({"argv": ["sleep", "3"]}).to_string(),
        );
        let first = std::thread::spawn(move || {
            Command::new("curl")
                .args(["-s", "-H", &format!("Authorization: Bearer {USER2}")])
                .args(["-d", &slow, &format!("http://{tcp}/v1/run")])
                .output()
                .unwrap()
        });
        std::thread::sleep(Duration::from_millis(1000));
        let quick = json!({"argv": ["true"]});
        let (status, out) = server.tcp_request(USER2, "POST", "/v1/run", Some(quick.clone()));
        assert_eq!(
            (status, out["error"].as_str()),
            (429, Some("quota")),
            "{out}"
        );
        let (status, out) = server.tcp_request(USER1, "POST", "/v1/run", Some(quick.clone()));
        assert_eq!(status, 200, "{out}");
        let first = first.join().unwrap();
        assert!(String::from_utf8_lossy(&first.stdout).contains("\"exit_code\":0"));
        let (status, out) = server.tcp_request(USER2, "POST", "/v1/run", Some(quick));
        assert_eq!(status, 200, "{out}");
        figures(&server, "profiles and quotas");
        server.stop();
    });
}

/// A caller's requests: (method, path, JSON body) to (status, JSON answer).
type Requests<'a> = &'a dyn Fn(&str, &str, Option<Value>) -> (u16, Value);

/// `ci` is refused to a caller without it in its profiles (403 policy, for a run and a
/// session), and the words list the profiles it may use (`allowed`).
fn ci_is_refused(request: Requests, allowed: &str) {
    let (status, out) = request(
        "POST",
        "/v1/run",
        Some(json!({"profile": "ci", "argv": ["true"]})),
    );
    assert_eq!(
        (status, out["error"].as_str()),
        (403, Some("policy")),
        "{out}"
    );
    assert!(out["message"].as_str().unwrap().contains(allowed), "{out}");
    let (status, out) = request(
        "POST",
        "/v1/sessions",
        Some(json!({"language": "python", "profile": "ci"})),
    );
    assert_eq!(status, 403, "{out}");
}

/// A caller whose memory ceiling is 128M: asking above it is 403, and the profile's
/// default (above it) is lowered to it.
fn memory_is_held_to_128m(request: Requests) {
    let (status, out) = request(
        "POST",
        "/v1/run",
        Some(json!({"language": "bash", "code": "true", "memory": "512M"})),
    );
    assert_eq!(status, 403, "{out}");
    assert!(out["message"].as_str().unwrap().contains("memory"), "{out}");
    let (status, out) = request(
        "POST",
        "/v1/run",
        Some(json!({"language": "bash", "code": "grep MemTotal /proc/meminfo"})),
    );
    assert_eq!(status, 200, "{out}");
    // MemTotal is the sandbox's memory limit.
    assert!(
        out["stdout"].as_str().unwrap().contains(" 131072 kB"),
        "{out}"
    );
}

/// A caller with `max_sessions = 1` opens one session (returned), and its second is 429
/// with Retry-After (seen through `curl` with `-i` at `url`).
fn one_session_then_429(
    request: Requests,
    curl: &dyn Fn(&[&str]) -> (u16, String),
    url: &str,
) -> Value {
    let (status, first) = request("POST", "/v1/sessions", Some(json!({"language": "bash"})));
    assert_eq!(status, 201, "{first}");
    let (status, head) = curl(&[
        "-i",
        "-X",
        "POST",
        url,
        "-H",
        "Content-Type: application/json",
        "-d",
        r#"{"language":"bash"}"#,
    ]);
    assert_eq!(status, 429, "{head}");
    assert!(head.to_lowercase().contains("retry-after: 1"), "{head}");
    assert!(head.contains("\"quota\""), "{head}");
    first
}

/// Finding 3: 1 100 TCP connections that send half a request head and no token, against
/// a server whose fd limit is 1 024. Each listener holds at most its cap of them (the
/// rest wait in the kernel's backlog), each only until its header deadline; a client of
/// the unix socket is served meanwhile, and a TCP client with a token once they are gone.
#[test]
fn half_open_connections_without_a_token_do_not_starve_anyone() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    use std::io::{Read, Write};
    as_root(|| {
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        // The server starts under the common default soft limit of 1 024 fds.
        setrlimit(Resource::RLIMIT_NOFILE, 1024.min(hard), hard).unwrap();
        // The defaults: 512 connections per listener, a 10 s header deadline.
        let server = Server::start("", true);
        // This test holds the 1 100 connections: it needs more.
        setrlimit(Resource::RLIMIT_NOFILE, soft.max(hard.min(4096)), hard).unwrap();
        let tcp: std::net::SocketAddr = server.tcp_address().parse().unwrap();
        let mut held = Vec::new();
        for _ in 0..1100 {
            if let Ok(mut s) = std::net::TcpStream::connect_timeout(&tcp, Duration::from_secs(1)) {
                let _ = s.write_all(b"POST /v1/run HTTP/1.1\r\nHost: codecage\r\nContent-Le");
                held.push(s);
            }
        }
        assert!(held.len() >= 1000, "only {} connected", held.len());
        std::thread::sleep(Duration::from_millis(500));
        let (rss, fds) = server.footprint();
        // At most `max_connections` (512) per listener, whatever the flood.
        assert!(
            fds < 600,
            "the server holds {fds} fds for half-open connections"
        );
        // The unix socket's client is served while they are held.
        let started = Instant::now();
        let (status, out) = server.curl(&[
            "--max-time",
            "20",
            "-X",
            "POST",
            "http://codecage/v1/run",
            "-H",
            "Content-Type: application/json",
            "-d",
            r#"{"language": "bash", "code": "echo still-served"}"#,
        ]);
        assert_eq!(status, 200, "{out}");
        assert!(out.contains(r#""stdout":"still-served\n""#), "{out}");
        assert!(started.elapsed() < Duration::from_secs(10 * slowdown()));
        // The first ones accepted are closed at their header deadline.
        held[0]
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut buf = [0u8; 256];
        let closed = match held[0].read(&mut buf) {
            Ok(n) => n == 0 || String::from_utf8_lossy(&buf[..n]).contains(" 408 "),
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        assert!(
            closed,
            "a half-open connection outlived its header deadline"
        );
        // A TCP client with a token is served once the deadlines have freed room.
        let (status, out) = server.tcp_request(
            super::server::TOKEN,
            "POST",
            "/v1/run",
            Some(json!({"language": "bash", "code": "echo tcp-served"})),
        );
        assert_eq!(
            (status, out["stdout"].as_str()),
            (200, Some("tcp-served\n")),
            "{out}"
        );
        drop(held);
        eprintln!(
            "figures: 1100 half-open connections: server peak RSS {rss} KiB, {fds} fds open while they were held"
        );
        figures(&server, "half-open connections, after");
        server.stop();
    });
}

/// Whether a process whose command line contains `mark` is alive on the host.
fn alive(mark: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
        std::fs::read(p.path().join("cmdline"))
            .map(|c| String::from_utf8_lossy(&c).contains(mark))
            .unwrap_or(false)
    })
}

/// A request over the unix socket whose answer is never read: the stalled reader.
fn stalled(server: &Server, path: &str, body: &Value) -> std::os::unix::net::UnixStream {
    use std::io::Write;
    let mut s = std::os::unix::net::UnixStream::connect(server.socket_path()).unwrap();
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: codecage\r\nAccept: application/x-ndjson\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

fn busy(server: &Server, id: &str) -> bool {
    server.request("GET", &format!("/v1/sessions/{id}"), None).1["busy"] == Value::Bool(true)
}

/// Finding 7: a streamed call's refusal is its status and its error, never an empty 200;
/// one refused after the stream began would end it with an `error` event.
#[test]
fn a_streamed_refusal_is_an_error_not_an_empty_200() {
    as_root(|| {
        let server = Server::start("", false);
        let (status, created) =
            server.request("POST", "/v1/sessions", Some(json!({"language": "python"})));
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        let execute = format!("http://codecage/v1/sessions/{id}/execute");
        let stream = |body: Value| {
            server.curl(&[
                "-X",
                "POST",
                &execute,
                "-H",
                "Accept: application/x-ndjson",
                "-d",
                &body.to_string(),
            ])
        };
        // A timeout over the profile's maximum.
        let (status, out) = stream(json!({"code": "1", "timeout": "10h"}));
        assert_eq!(status, 403, "{out}");
        assert!(out.contains("\"policy\""), "{out}");
        // Busy: another call runs.
        let socket = server.socket_path();
        let long = std::thread::spawn(move || {
            Command::new("curl")
                .args(["-s", "--unix-socket"])
                .arg(socket)
                .args([
                    "-X",
                    "POST",
                    &format!("http://codecage/v1/sessions/{id}/execute"),
                ])
                .args(["-d", r#"{"code": "import time; time.sleep(3)"}"#])
                .output()
                .unwrap()
        });
        assert!(wait_for(Duration::from_secs(5), || {
            let (_, list) = server.request("GET", "/v1/sessions", None);
            list[0]["busy"] == Value::Bool(true)
        }));
        let (status, out) = stream(json!({"code": "1"}));
        assert_eq!(status, 409, "{out}");
        assert!(out.contains("\"busy\""), "{out}");
        long.join().unwrap();
        // A call that runs streams and ends with its result.
        let (status, out) = stream(json!({"code": "print('hi')"}));
        assert_eq!(status, 200, "{out}");
        let last: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!(last["type"], "result", "{out}");
        // POST /v1/run streams too: its output, then its outcome; a refusal found once
        // the stream began is its final error event; a quiet run has heartbeats.
        let run = |body: Value| {
            server.curl(&[
                "-X",
                "POST",
                "http://codecage/v1/run",
                "-H",
                "Accept: application/x-ndjson",
                "-d",
                &body.to_string(),
            ])
        };
        let events = |out: &str| -> Vec<Value> {
            out.lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        };
        let (status, out) =
            run(json!({"language": "bash", "code": "echo one; sleep 11; echo two"}));
        assert_eq!(status, 200, "{out}");
        let got = events(&out);
        let types: Vec<&str> = got.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types.first(), Some(&"stdout"), "{out}");
        assert!(types.contains(&"heartbeat"), "{out}");
        assert_eq!(types.last(), Some(&"result"), "{out}");
        assert_eq!(got.last().unwrap()["exit_code"], 0, "{out}");
        let (status, out) = run(json!({"language": "bash", "code": "true", "profile": "no/such"}));
        assert_eq!(status, 200, "{out}");
        let last = events(&out).pop().unwrap();
        assert_eq!(
            (last["type"].as_str(), last["error"].as_str()),
            (Some("error"), Some("invalid_request")),
            "{out}"
        );
        figures(&server, "streamed refusals");
        server.stop();
    });
}

/// Finding 7: a client that goes away stops its run, and its session call, within a
/// second.
#[test]
fn a_client_that_disconnects_stops_its_run_and_its_call() {
    as_root(|| {
        let server = Server::start("", false);
        let mark = format!("{}.{}", 40 + std::process::id() % 50, std::process::id());
        let (status, _) = server.curl(&[
            "--max-time",
            "1",
            "-X",
            "POST",
            "http://codecage/v1/run",
            "-d",
            &json!({"argv": ["sleep", mark]}).to_string(),
        ]);
        assert_eq!(status, 0, "curl gave up after 1 s");
        let gone = Instant::now();
        assert!(
            wait_for(Duration::from_secs(10), || !alive(&mark)),
            "the run outlived its client"
        );
        let run_ended = gone.elapsed();
        // A session call, non-streamed and streamed.
        let (_, created) =
            server.request("POST", "/v1/sessions", Some(json!({"language": "python"})));
        let id = created["id"].as_str().unwrap().to_string();
        let mut call_ended = Vec::new();
        for accept in ["Accept: application/json", "Accept: application/x-ndjson"] {
            let (status, _) = server.curl(&[
                "--max-time",
                "1",
                "-X",
                "POST",
                &format!("http://codecage/v1/sessions/{id}/execute"),
                "-H",
                accept,
                "-d",
                r#"{"code": "import time; time.sleep(60)"}"#,
            ]);
            // Cut off at 1 s: no answer yet, or (streamed) the head and no result.
            assert!(status == 0 || accept.contains("ndjson"), "{status}");
            let gone = Instant::now();
            assert!(
                wait_for(Duration::from_secs(10), || !busy(&server, &id)),
                "the call outlived its client ({accept})"
            );
            call_ended.push(gone.elapsed());
        }
        eprintln!("figures: disconnect: the run ended {run_ended:?} after its client left, the calls {call_ended:?}");
        assert!(
            run_ended < Duration::from_millis(1000 * slowdown()),
            "{run_ended:?}"
        );
        for ended in call_ended {
            assert!(
                ended < Duration::from_millis(1500 * slowdown()),
                "{ended:?}"
            );
        }
        let (_, out) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"code": "2 + 2"})),
        );
        assert_eq!(out["result"]["text/plain"], "4", "{out}");
        figures(&server, "disconnects");
        server.stop();
    });
}

/// Finding 5: a streaming client that never reads does not suspend the call's limits:
/// its timeout ends it on time, an interrupt stops it, and DELETE answers at once.
#[test]
fn a_stalled_streaming_reader_does_not_suspend_the_calls_limits() {
    as_root(|| {
        let server = Server::start("", false);
        let (_, created) =
            server.request("POST", "/v1/sessions", Some(json!({"language": "python"})));
        let id = created["id"].as_str().unwrap().to_string();
        let path = format!("/v1/sessions/{id}/execute");
        // Many small events (more than any buffer between the call and a reader that
        // never reads), then a sleep that only the timeout ends.
        let flood = "import time\nfor i in range(20000): print(i, flush=True)\ntime.sleep(60)";
        let reader = stalled(&server, &path, &json!({"code": flood, "timeout": "5s"}));
        let started = Instant::now();
        assert!(wait_for(Duration::from_secs(3), || busy(&server, &id)));
        assert!(
            wait_for(Duration::from_secs(20), || !busy(&server, &id)),
            "the 5 s call still runs after 20 s with its reader stalled"
        );
        let timed_out = started.elapsed();
        assert!(
            timed_out < Duration::from_secs(5 + 3 * slowdown()),
            "{timed_out:?}"
        );
        // The interrupt acts.
        let second = stalled(&server, &path, &json!({"code": flood, "timeout": "60s"}));
        assert!(wait_for(Duration::from_secs(3), || busy(&server, &id)));
        std::thread::sleep(Duration::from_millis(500));
        let (status, _) = server.request("POST", &format!("/v1/sessions/{id}/interrupt"), None);
        assert_eq!(status, 204);
        let interrupted = Instant::now();
        assert!(
            wait_for(Duration::from_secs(10), || !busy(&server, &id)),
            "the interrupt did nothing"
        );
        let interrupted = interrupted.elapsed();
        // DELETE answers at once, with a third stalled call running.
        let third = stalled(&server, &path, &json!({"code": flood, "timeout": "60s"}));
        assert!(wait_for(Duration::from_secs(3), || busy(&server, &id)));
        std::thread::sleep(Duration::from_millis(500));
        let deleting = Instant::now();
        let (status, _) = server.curl(&[
            "--max-time",
            "10",
            "-X",
            "DELETE",
            &format!("http://codecage/v1/sessions/{id}"),
        ]);
        let deleted = deleting.elapsed();
        assert_eq!(status, 204);
        assert!(deleted < Duration::from_secs(3 * slowdown()), "{deleted:?}");
        eprintln!(
            "figures: stalled reader: the 5 s call ended at {timed_out:?}, the interrupted one {interrupted:?} after the interrupt, DELETE took {deleted:?}"
        );
        figures(&server, "stalled reader");
        drop((reader, second, third));
        server.stop();
    });
}

/// Findings 4 and 6: 31 MiB bodies of code (four at once) are refused past `max_code`
/// at the cost of one body in memory; the refusals' records keep 64 KiB of the code with
/// its whole size and sha256, the database stays small, and the export streams.
#[test]
fn big_refused_bodies_are_cheap_and_leave_the_audit_small() {
    use sha2::Digest;
    as_root(|| {
        let server = Server::start("", false);
        let dir = TempDir::new("bigbody");
        // Newlines: escapes in JSON, the parser's costly case; 31.6 MiB of body.
        let code = "print('x')\n".repeat((29 << 20) / 11);
        let body = dir.path().join("body.json");
        std::fs::write(
            &body,
            json!({"language": "python", "code": code}).to_string(),
        )
        .unwrap();
        let before = server.footprint().0;
        let socket = server.socket_path();
        let posts: Vec<_> = (0..4)
            .map(|_| {
                let (socket, body) = (socket.clone(), body.clone());
                std::thread::spawn(move || {
                    let out = Command::new("curl")
                        .args(["-s", "-o", "-", "-w", "\n%{http_code}", "--unix-socket"])
                        .arg(socket)
                        .args(["-X", "POST", "http://codecage/v1/run"])
                        .args(["-H", "Content-Type: application/json"])
                        .arg("--data-binary")
                        .arg(format!("@{}", body.display()))
                        .output()
                        .unwrap();
                    super::server::split_status(&out.stdout)
                })
            })
            .collect();
        let mut refused = 0;
        for post in posts {
            let (status, out) = post.join().unwrap();
            assert!(status == 413 || status == 503, "{status} {out}");
            if status == 413 {
                assert!(out.contains("max_code"), "{out}");
                refused += 1;
            }
        }
        assert!(refused >= 1);
        let (rss, fds) = server.footprint();
        eprintln!(
            "figures: four 31 MiB bodies: server peak RSS {rss} KiB (before: {before} KiB), {fds} fds"
        );
        assert!(rss < 100 << 10, "peak RSS {rss} KiB");
        // The records: the code's head, its whole size and sha256.
        let (_, list) = server.request("GET", "/v1/audit?kind=refused", None);
        let id = list["records"][0]["id"].as_str().unwrap().to_string();
        let (_, record) = server.request("GET", &format!("/v1/audit/{id}"), None);
        assert_eq!(record["code_size"], json!(code.len()), "{record:.300}");
        let sha = format!("{:x}", sha2::Sha256::digest(code.as_bytes()));
        assert_eq!(record["code_sha256"], json!(sha));
        assert_eq!(record["code"].as_str().map(str::len), Some(64 << 10));
        let db = server.audit_db();
        let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let wal = db.with_file_name("audit.db-wal");
        let total = size(&db) + size(&wal);
        assert!(total < 8 << 20, "the audit database is {total} bytes");
        // The export streams (chunked, no length) and each line is a record.
        let (status, out) = server.curl(&["-i", "http://codecage/v1/audit/export"]);
        assert_eq!(status, 200);
        let (head, lines) = out.split_once("\r\n\r\n").unwrap();
        assert!(
            head.to_lowercase().contains("transfer-encoding: chunked"),
            "{head}"
        );
        let records: Vec<Value> = lines
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(records.len() >= refused, "{}", records.len());
        eprintln!("figures: the audit database and WAL: {total} bytes after the refusals");
        figures(&server, "big bodies");
        server.stop();
    });
}

/// Bodies in memory at once are bounded by `max_body` together, MCP's too: a client that
/// sends half of a body the size of the budget (to /mcp) makes another body wait, then get
/// 503 with Retry-After, instead of the server holding both.
#[test]
fn request_bodies_share_one_budget_mcp_included() {
    use std::io::Write;
    as_root(|| {
        let server = Server::start(
            "[limits]\nmax_body = \"64K\"\nqueue_timeout = \"1s\"\n",
            false,
        );
        let mut held = std::os::unix::net::UnixStream::connect(server.socket_path()).unwrap();
        write!(
            held,
            "POST /mcp HTTP/1.1\r\nHost: codecage\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 60000\r\n\r\n{{\"jsonrpc\":"
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let code = format!("# {}\nprint('ok')", "x".repeat(20_000));
        let body = json!({"language": "python", "code": code}).to_string();
        let url = "http://codecage/v1/run";
        let args = ["-i", "-X", "POST", url, "-d", body.as_str()];
        let (status, out) = server.curl(&args);
        assert_eq!(status, 503, "{out}");
        assert!(out.to_lowercase().contains("retry-after: 1"), "{out}");
        assert!(out.contains("request bodies"), "{out}");
        // With the held body gone, the budget is back.
        drop(held);
        std::thread::sleep(Duration::from_millis(300));
        let (status, out) = server.curl(&["-X", "POST", url, "-d", body.as_str()]);
        assert_eq!(status, 200, "{out}");
        figures(&server, "body budget");
        server.stop();
    });
}

/// curl over `server`'s socket as the unprivileged `uid` (through `setpriv`: its uid and
/// gid, no supplementary groups), with `args`; returns (HTTP status, body, or head and
/// body with `-i`).
fn curl_as(server: &Server, uid: u32, args: &[&str]) -> (u16, String) {
    let id = uid.to_string();
    let out = Command::new("setpriv")
        .args(["--reuid", &id, "--regid", &id, "--clear-groups", "--"])
        .args(["curl", "-q", "-s", "-o", "-", "-w", "\n%{http_code}"])
        .arg("--unix-socket")
        .arg(server.socket_path())
        .args(args)
        .output()
        .expect("setpriv curl");
    assert!(out.status.success(), "setpriv curl as uid {uid}: {out:?}");
    super::server::split_status(&out.stdout)
}

/// A JSON request over the socket as `uid`.
fn request_as(
    server: &Server,
    uid: u32,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let url = format!("http://codecage{path}");
    let text = body.map(|b| b.to_string());
    let mut args = vec!["-X", method, url.as_str()];
    if let Some(text) = &text {
        args.extend(["-H", "Content-Type: application/json", "-d", text.as_str()]);
    }
    let (status, out) = curl_as(server, uid, &args);
    (
        status,
        serde_json::from_str(&out).unwrap_or(Value::String(out)),
    )
}

/// Local users of the unix socket are held like tokens: uid 1000, listed with
/// `max_sessions = 1`, its own profiles and a memory ceiling, gets 429 on its second
/// session, 403 for `ci` and above its ceiling; an unlisted uid gets `[unix_peers_default]`
/// (the language profiles, its own session quota) and neither sees the other's sessions;
/// root sees and uses them all, and the audit names each owner `uid:N`.
#[test]
fn unix_peers_are_held_to_their_entry_or_the_default() {
    use std::os::unix::fs::PermissionsExt;
    const LISTED: u32 = 1000;
    const UNLISTED: u32 = 1001;
    as_root(|| {
        let server = Server::start(
            "[[unix_peers]]\nuid = 1000\nmax_sessions = 1\nprofiles = [\"bash\", \"python\"]\n\
             [unix_peers.limits]\nmemory = \"128M\"\n\
             [unix_peers_default]\nmax_sessions = 2\n",
            false,
        );
        // The socket is 0600 root's without a socket_group: open it to the test's uids.
        std::fs::set_permissions(server.socket_path(), std::fs::Permissions::from_mode(0o666))
            .unwrap();
        let bash = json!({"language": "bash"});

        // The listed uid: its first session, then 429 with Retry-After; not ci (nor any
        // profile outside its list); its memory ceiling.
        let as_listed = |m: &str, p: &str, b| request_as(&server, LISTED, m, p, b);
        let mine = one_session_then_429(
            &as_listed,
            &|args| curl_as(&server, LISTED, args),
            "http://codecage/v1/sessions",
        );
        let mine = mine["id"].as_str().unwrap().to_string();
        ci_is_refused(&as_listed, "bash, python");
        memory_is_held_to_128m(&as_listed);

        // An unlisted uid: the default's quota (2) and the built-in language profiles; it
        // neither sees nor touches the listed uid's session.
        let (status, list) = request_as(&server, UNLISTED, "GET", "/v1/sessions", None);
        assert_eq!((status, list.clone()), (200, json!([])), "{list}");
        let (status, out) = request_as(
            &server,
            UNLISTED,
            "GET",
            &format!("/v1/sessions/{mine}"),
            None,
        );
        assert_eq!(
            (status, out["error"].as_str()),
            (404, Some("not_found")),
            "{out}"
        );
        // Its quota (2): the third session is 429.
        let mut theirs = Vec::new();
        for n in 1..=3 {
            let (status, out) = request_as(
                &server,
                UNLISTED,
                "POST",
                "/v1/sessions",
                Some(bash.clone()),
            );
            if n <= 2 {
                assert_eq!(status, 201, "{out}");
                theirs.push(out["id"].as_str().unwrap().to_string());
            } else {
                assert_eq!(
                    (status, out["error"].as_str()),
                    (429, Some("quota")),
                    "{out}"
                );
            }
        }
        ci_is_refused(
            &|m, p, b| request_as(&server, UNLISTED, m, p, b),
            "python, node, typescript, bash",
        );

        // Root sees all three and uses the listed uid's.
        let (status, list) = server.request("GET", "/v1/sessions", None);
        assert_eq!(
            (status, list.as_array().map(Vec::len)),
            (200, Some(3)),
            "{list}"
        );
        let (status, out) = server.request(
            "POST",
            &format!("/v1/sessions/{mine}/execute"),
            Some(json!({"code": "echo root-was-here"})),
        );
        assert_eq!(status, 200, "{out}");
        // The audit: each uid's records under its owner, root's on uid 1000's session.
        let (status, records) = server.request("GET", "/v1/audit?limit=200", None);
        assert_eq!(status, 200, "{records}");
        let records = records["records"].as_array().unwrap().clone();
        for uid in [LISTED, UNLISTED] {
            let owner = format!("uid:{uid}");
            assert!(
                records.iter().any(|r| r["caller"] == owner),
                "{owner}: {records:?}"
            );
        }
        assert!(
            records.iter().any(|r| r["caller"] == "uid:0"
                && r["session"] == mine.as_str()
                && r["details"]["owner"] == "uid:1000"),
            "{records:?}"
        );
        // Each closes its own; the quota's room is given back.
        assert_eq!(
            request_as(
                &server,
                LISTED,
                "DELETE",
                &format!("/v1/sessions/{mine}"),
                None
            )
            .0,
            204
        );
        let (status, again) = request_as(&server, LISTED, "POST", "/v1/sessions", Some(bash));
        assert_eq!(status, 201, "{again}");
        theirs.push(again["id"].as_str().unwrap().to_string());
        for id in theirs {
            assert_eq!(
                server
                    .request("DELETE", &format!("/v1/sessions/{id}"), None)
                    .0,
                204
            );
        }
        figures(&server, "unix peers");
        server.stop();
    });
}

// Background processes in a session (issue 24, first slice).

/// Starts a process in session `id` as `token`; the answer.
fn start_process(server: &Server, token: &str, id: &str, body: Value) -> Value {
    let (status, out) = server.tcp_request(
        token,
        "POST",
        &format!("/v1/sessions/{id}/processes"),
        Some(body),
    );
    assert_eq!(status, 200, "{out}");
    out
}

/// Polls process `pid` from the cursors given.
fn poll_process(server: &Server, token: &str, id: &str, pid: u64, from: (u64, u64)) -> Value {
    let (status, out) = server.tcp_request(
        token,
        "GET",
        &format!(
            "/v1/sessions/{id}/processes/{pid}?stdout_from={}&stderr_from={}",
            from.0, from.1
        ),
        None,
    );
    assert_eq!(status, 200, "{out}");
    out
}

fn new_session(server: &Server, token: &str, language: &str) -> String {
    let (status, created) = server.tcp_request(
        token,
        "POST",
        "/v1/sessions",
        Some(json!({"language": language})),
    );
    assert_eq!(status, 201, "{created}");
    created["id"].as_str().unwrap().to_string()
}

/// A build-like command goes to the background after yield_ms and is polled to its end:
/// every line exactly once across the polls, and a poll repeated from an old cursor gives
/// the same bytes again (a client that reconnects resumes with no gap and no repeat).
#[test]
fn a_long_command_goes_to_the_background_and_is_polled_with_no_gap_and_no_repeat() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let id = new_session(&server, USER1, "bash");
        let started = Instant::now();
        let first = start_process(
            &server,
            USER1,
            &id,
            json!({"command": "for i in $(seq 30); do echo $i; sleep 0.2; done", "yield_ms": 1000}),
        );
        let answered = started.elapsed();
        assert_eq!(first["status"], "running", "{first}");
        assert!(
            answered < Duration::from_secs(4 * slowdown()),
            "{answered:?}"
        );
        let pid = first["process_id"].as_u64().unwrap();
        let mut text = first["stdout"].as_str().unwrap().to_string();
        let mut cursor = first["stdout_cursor"].as_u64().unwrap();
        assert_eq!(cursor, text.len() as u64);
        let mut polls = 0;
        let mut last = first.clone();
        let mut old = None;
        while last["status"] == "running" {
            assert!(polls < 60, "the command did not end: {last}");
            std::thread::sleep(Duration::from_millis(1800));
            let before = cursor;
            last = poll_process(&server, USER1, &id, pid, (cursor, 0));
            polls += 1;
            assert_eq!(last["stdout_from"].as_u64(), Some(before), "{last}");
            assert_eq!(last["stdout_dropped"], 0, "{last}");
            let chunk = last["stdout"].as_str().unwrap().to_string();
            old.get_or_insert((before, chunk.clone()));
            text.push_str(&chunk);
            cursor = last["stdout_cursor"].as_u64().unwrap();
        }
        let expected: String = (1..=30).map(|i| format!("{i}\n")).collect();
        assert_eq!(text, expected);
        assert!(polls >= 2, "{polls} polls");
        assert_eq!(
            (last["exit_code"].as_i64(), &last["signal"]),
            (Some(0), &Value::Null),
            "{last}"
        );
        // The reconnecting client: the same cursor gives the same bytes.
        let (from, chunk) = old.unwrap();
        let again = poll_process(&server, USER1, &id, pid, (from, 0));
        assert!(
            again["stdout"].as_str().unwrap().starts_with(&chunk),
            "{again}"
        );
        // From the end: nothing new (and the round trip of a poll, curl included).
        let timed = Instant::now();
        for _ in 0..10 {
            let end = poll_process(&server, USER1, &id, pid, (cursor, 0));
            assert_eq!(end["stdout"], "", "{end}");
        }
        let poll_ms = timed.elapsed().as_secs_f64() * 100.0;
        // A short one is the whole result at once, with the session's layers and env.
        server.tcp_request(
            USER1,
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"code": "mkdir -p sub"})),
        );
        let done = start_process(
            &server,
            USER1,
            &id,
            json!({"command": "echo $CODECAGE_SHELL; pwd; id -u; grep CapEff /proc/self/status; \
                    grep Seccomp: /proc/self/status; echo oops >&2; exit 3", "cwd": "sub"}),
        );
        assert_eq!(done["status"], "exited", "{done}");
        assert_eq!(done["exit_code"], 3, "{done}");
        assert_eq!(
            done["stdout"], "exec\n/work/sub\n1000\nCapEff:\t0000000000000000\nSeccomp:\t2\n",
            "{done}"
        );
        assert_eq!(done["stderr"], "oops\n", "{done}");
        // A cwd that is not there: it never starts, and says why.
        let nowhere = start_process(
            &server,
            USER1,
            &id,
            json!({"command": "true", "cwd": "nope"}),
        );
        assert_eq!(
            (nowhere["status"].as_str(), nowhere["exit_code"].as_i64()),
            (Some("exited"), Some(125)),
            "{nowhere}"
        );
        assert!(
            nowhere["error"]
                .as_str()
                .unwrap_or("")
                .contains("chdir nope"),
            "{nowhere}"
        );
        // PATH and loader variables are refused, as for the session itself.
        let (status, out) = server.tcp_request(
            USER1,
            "POST",
            &format!("/v1/sessions/{id}/processes"),
            Some(json!({"command": "true", "env": {"LD_PRELOAD": "/x.so"}})),
        );
        assert_eq!(
            (status, out["error"].as_str()),
            (403, Some("policy")),
            "{out}"
        );
        let (_, list) =
            server.tcp_request(USER1, "GET", &format!("/v1/sessions/{id}/processes"), None);
        assert_eq!(list.as_array().map(Vec::len), Some(3), "{list}");
        eprintln!(
            "figures: {polls} polls, first answer in {answered:?}, a poll {poll_ms:.1} ms (curl)"
        );
        server.stop();
    });
}

/// A server started in the background answers a client started by a later call of the
/// same session; closing the session kills it and leaves no process and no cgroup.
#[test]
fn a_background_server_answers_a_later_call_and_dies_with_the_session() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let id = new_session(&server, USER1, "python");
        let port = 18000 + (std::process::id() % 1000);
        let argv = [
            "python3",
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ];
        let started = start_process(
            &server,
            USER1,
            &id,
            json!({"argv": argv, "background": true}),
        );
        assert_eq!(started["status"], "running", "{started}");
        let pid = started["process_id"].as_u64().unwrap();
        let code = format!(
            "import time, urllib.request\n\
             for _ in range(100):\n\
             \x20   try:\n\
             \x20       r = urllib.request.urlopen('http://127.0.0.1:{port}/'); break\n\
             \x20   except OSError:\n\
             \x20       time.sleep(0.1)\n\
             print(r.status, b'Directory listing' in r.read())"
        );
        let (status, out) = server.tcp_request(
            USER1,
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"code": code})),
        );
        assert_eq!(
            (status, out["stdout"].as_str()),
            (200, Some("200 True\n")),
            "{out}"
        );
        // The server logged the request, on its stderr, read while the call ran.
        assert!(wait_for(Duration::from_secs(5), || {
            let p = poll_process(&server, USER1, &id, pid, (0, 0));
            p["stderr"]
                .as_str()
                .unwrap()
                .contains("\"GET / HTTP/1.1\" 200")
        }));
        let needle = format!("python3\0-m\0http.server\0{port}");
        assert_eq!(
            host_pids_with(&needle).len(),
            1,
            "the server runs on the host"
        );
        let server_pid = server.pid();
        let mine = || {
            run_cgroups()
                .into_iter()
                .filter(|(pid, _)| *pid == server_pid)
                .count()
        };
        // One run cgroup per hierarchy (one on v2, one per controller on v1).
        assert!(mine() > 0);
        let (status, _) = server.tcp_request(USER1, "DELETE", &format!("/v1/sessions/{id}"), None);
        assert_eq!(status, 204);
        assert!(
            host_pids_with(&needle).is_empty(),
            "the process outlived its session"
        );
        assert_eq!(mine(), 0, "the session's cgroup was left");
        server.stop();
    });
}

/// 50 MB of output: the last 1 MiB is kept, and the poll says how much was dropped.
#[test]
fn fifty_megabytes_of_output_keep_the_last_mebibyte_and_count_the_rest() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let id = new_session(&server, USER1, "bash");
        let total: u64 = 50_000_000;
        let out = start_process(
            &server,
            USER1,
            &id,
            json!({"command": format!("yes 0123456789 | head -c {total}; printf END"), "yield_ms": 60000}),
        );
        assert_eq!(out["status"], "exited", "{}", out["status"]);
        let kept = 1u64 << 20;
        let stdout = out["stdout"].as_str().unwrap();
        assert_eq!(stdout.len() as u64, kept);
        assert!(
            stdout.ends_with("789\n012345END"),
            "{}",
            &stdout[stdout.len() - 20..]
        );
        assert_eq!(out["stdout_cursor"].as_u64(), Some(total + 3));
        assert_eq!(out["stdout_from"].as_u64(), Some(total + 3 - kept));
        assert_eq!(out["stdout_dropped"].as_u64(), Some(total + 3 - kept));
        figures(&server, "50 MB of process output");
        server.stop();
    });
}

/// Only the session's owner reaches its processes (404 to another token, as for a
/// session that never was); the owner feeds stdin, signals and kills them.
#[test]
fn a_sessions_processes_are_its_owners_and_take_stdin_and_signals() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let id = new_session(&server, USER1, "bash");
        let cat = start_process(
            &server,
            USER1,
            &id,
            json!({"argv": ["cat"], "stdin": true, "background": true}),
        );
        let cat_pid = cat["process_id"].as_u64().unwrap();
        let base = format!("/v1/sessions/{id}/processes");
        let one = format!("{base}/{cat_pid}");
        let tries: Vec<(&str, String, Option<Value>)> = vec![
            ("GET", base.clone(), None),
            ("POST", base.clone(), Some(json!({"command": "true"}))),
            ("GET", one.clone(), None),
            ("POST", format!("{one}/stdin"), Some(json!({"data": "x"}))),
            (
                "POST",
                format!("{one}/signal"),
                Some(json!({"signal": "TERM"})),
            ),
            ("DELETE", one.clone(), None),
        ];
        for (method, path, body) in tries {
            let (status, out) = server.tcp_request(USER2, method, &path, body);
            assert_eq!(
                (status, out["error"].as_str()),
                (404, Some("not_found")),
                "{method} {path}: {out}"
            );
        }
        // The owner's stdin, then EOF: cat echoes it and ends.
        let (status, out) = server.tcp_request(
            USER1,
            "POST",
            &format!("{one}/stdin"),
            Some(json!({"data": "hello\n", "close": true})),
        );
        assert_eq!((status, out["written"].as_u64()), (200, Some(6)), "{out}");
        let mut last = Value::Null;
        assert!(
            wait_for(Duration::from_secs(10), || {
                last = poll_process(&server, USER1, &id, cat_pid, (0, 0));
                last["status"] == "exited"
            }),
            "{last}"
        );
        assert_eq!(
            (last["stdout"].as_str(), last["exit_code"].as_i64()),
            (Some("hello\n"), Some(0))
        );
        // A signal by name, then a kill.
        let sleeper = |server: &Server| {
            start_process(
                server,
                USER1,
                &id,
                json!({"command": "sleep 100", "background": true}),
            )["process_id"]
                .as_u64()
                .unwrap()
        };
        let a = sleeper(&server);
        let (status, out) = server.tcp_request(
            USER1,
            "POST",
            &format!("{base}/{a}/signal"),
            Some(json!({"signal": "SIGTERM"})),
        );
        assert_eq!(status, 204, "{out}");
        let b = sleeper(&server);
        assert_eq!(
            server
                .tcp_request(USER1, "DELETE", &format!("{base}/{b}"), None)
                .0,
            204
        );
        for (pid, signal) in [(a, 15), (b, 9)] {
            let mut last = Value::Null;
            assert!(
                wait_for(Duration::from_secs(10), || {
                    last = poll_process(&server, USER1, &id, pid, (0, 0));
                    last["status"] == "exited"
                }),
                "{last}"
            );
            assert_eq!(last["signal"].as_i64(), Some(signal), "{last}");
        }
        let (status, out) = server.tcp_request(
            USER1,
            "POST",
            &format!("{base}/{a}/signal"),
            Some(json!({"signal": "BOGUS"})),
        );
        assert_eq!(status, 400, "{out}");
        let (status, _) = server.tcp_request(USER1, "GET", &format!("{base}/999"), None);
        assert_eq!(status, 404);
        // A process's own time limit kills it.
        let limited = start_process(
            &server,
            USER1,
            &id,
            json!({"command": "sleep 100", "timeout": "1s", "background": true}),
        )["process_id"]
            .as_u64()
            .unwrap();
        let mut last = Value::Null;
        assert!(
            wait_for(Duration::from_secs(10), || {
                last = poll_process(&server, USER1, &id, limited, (0, 0));
                last["status"] == "exited"
            }),
            "{last}"
        );
        assert_eq!(
            (last["timed_out"].as_bool(), last["signal"].as_i64()),
            (Some(true), Some(9)),
            "{last}"
        );
        // And no more than the profile allows.
        let (status, out) = server.tcp_request(
            USER1,
            "POST",
            &base,
            Some(json!({"command": "true", "timeout": "1h"})),
        );
        assert_eq!(
            (status, out["error"].as_str()),
            (403, Some("policy")),
            "{out}"
        );
        server.stop();
    });
}

/// A running background process keeps its session from idling out (the `brief` profile's
/// idle limit is 1 s); once it has ended, the session idles out as before.
#[test]
fn a_running_process_keeps_its_session_alive() {
    as_root(|| {
        let server = Server::start("", false);
        let (status, created) = server.request(
            "POST",
            "/v1/sessions",
            Some(json!({"language": "python", "profile": "brief"})),
        );
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        let (status, out) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/processes"),
            Some(json!({"command": "sleep 4", "background": true})),
        );
        assert_eq!(
            (status, out["status"].as_str()),
            (200, Some("running")),
            "{out}"
        );
        std::thread::sleep(Duration::from_secs(3));
        let (status, out) = server.request("GET", &format!("/v1/sessions/{id}"), None);
        assert_eq!(
            status, 200,
            "the session idled out under a running process: {out}"
        );
        assert!(
            wait_for(Duration::from_secs(15), || {
                server.request("GET", &format!("/v1/sessions/{id}"), None).1["error"]
                    == "session_expired"
            }),
            "the session did not idle out once its process ended"
        );
        server.stop();
    });
}

/// While a call runs, a process is still polled (its output read all along), and a
/// signal reaches it (the call's supervision sends it).
#[test]
fn a_process_is_polled_and_signalled_while_a_call_runs() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let id = new_session(&server, USER1, "bash");
        let ticker = start_process(
            &server,
            USER1,
            &id,
            json!({"command": "while :; do echo tick; sleep 0.1; done", "background": true}),
        );
        let pid = ticker["process_id"].as_u64().unwrap();
        std::thread::scope(|scope| {
            let call = scope.spawn(|| {
                server.tcp_request(
                    USER1,
                    "POST",
                    &format!("/v1/sessions/{id}/execute"),
                    Some(json!({"code": "sleep 3; echo slept"})),
                )
            });
            std::thread::sleep(Duration::from_millis(1000));
            let during = poll_process(&server, USER1, &id, pid, (0, 0));
            assert_eq!(during["status"], "running", "{during}");
            let cursor = during["stdout_cursor"].as_u64().unwrap();
            assert!(cursor >= 5 * 5, "{during}");
            let (status, out) = server.tcp_request(
                USER1,
                "POST",
                &format!("/v1/sessions/{id}/processes/{pid}/signal"),
                Some(json!({"signal": "TERM"})),
            );
            assert_eq!(status, 204, "{out}");
            let mut last = Value::Null;
            assert!(
                wait_for(Duration::from_millis(1500), || {
                    last = poll_process(&server, USER1, &id, pid, (cursor, 0));
                    last["status"] == "exited"
                }),
                "the signal did not reach the process during the call: {last}"
            );
            assert_eq!(last["signal"].as_i64(), Some(15), "{last}");
            // A start claims the session as a call does: 409, and its audit record says so.
            let (status, out) = server.tcp_request(
                USER1,
                "POST",
                &format!("/v1/sessions/{id}/processes"),
                Some(json!({"command": "echo never", "background": true})),
            );
            assert_eq!(
                (status, out["error"].as_str()),
                (409, Some("busy")),
                "{out}"
            );
            let (call_status, call_out) = call.join().unwrap();
            let (_, list) = server.tcp_request(
                ADMIN,
                "GET",
                &format!("/v1/audit?kind=process&session={id}&limit=10"),
                None,
            );
            let records = list["records"].as_array().cloned().unwrap_or_default();
            let refused: Vec<&Value> = records.iter().filter(|r| r["error"] == "busy").collect();
            assert_eq!(refused.len(), 1, "{list}");
            assert_eq!(refused[0]["status"], "complete", "{list}");
            let (status, out) = (call_status, call_out);
            assert_eq!(
                (status, out["stdout"].as_str()),
                (200, Some("slept\n")),
                "{out}"
            );
        });
        server.stop();
    });
}

// Contexts: one session, a Python, a Node and a bash interpreter (issue 24, item 1).

/// Runs `code` in context `language` of session `id`; the outcome.
fn execute_in(server: &Server, id: &str, language: &str, code: &str, timeout: u64) -> Value {
    let (status, out) = server.tcp_request(
        USER1,
        "POST",
        &format!("/v1/sessions/{id}/execute"),
        Some(json!({"language": language, "code": code, "timeout": timeout})),
    );
    assert_eq!(status, 200, "{out}");
    out
}

/// The session's memory now: its cgroup's (memory.current, or v1's usage_in_bytes) and
/// the RSS of its processes, in KiB.
fn session_memory(cgroups: &[std::path::PathBuf]) -> (u64, u64) {
    let mut charged = 0;
    let mut rss = 0;
    for dir in cgroups {
        for file in ["memory.current", "memory.usage_in_bytes"] {
            if let Ok(text) = std::fs::read_to_string(dir.join(file)) {
                charged = charged.max(text.trim().parse::<u64>().unwrap_or(0) / 1024);
            }
        }
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        let sum: u64 = procs
            .lines()
            .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
            .filter_map(|status| {
                let line = status
                    .lines()
                    .find(|l| l.starts_with("VmRSS:"))?
                    .to_string();
                line.split_whitespace().nth(1)?.parse::<u64>().ok()
            })
            .sum();
        rss = rss.max(sum);
    }
    (charged, rss)
}

/// A python session's bash and Node contexts: each sees the others' /work files, keeps
/// its own variables, prints; a python cell that will not stop is killed with its context
/// only; a reset of one context keeps the others'; a bash `exit 3` restarts bash only;
/// a language that is not one is refused by name; closing leaves nothing.
#[test]
fn a_sessions_contexts_share_work_and_keep_their_own_state() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let id = new_session(&server, USER1, "python");
        let server_pid = server.pid();
        let cgroups = || -> Vec<std::path::PathBuf> {
            run_cgroups()
                .into_iter()
                .filter(|(pid, _)| *pid == server_pid)
                .map(|(_, path)| path)
                .collect()
        };
        let one = session_memory(&cgroups());
        // Files: written in one context, read in the other.
        let out = execute_in(
            &server,
            &id,
            "bash",
            "echo from-bash > shared.txt; x=bashvar",
            30,
        );
        assert_eq!(out["exit_code"], 0, "{out}");
        assert_eq!(out["state"]["restarted"], false, "{out}");
        let out = execute_in(
            &server,
            &id,
            "python",
            "x = 'pyvar'\nopen('py.txt', 'w').write('from-python')\nopen('shared.txt').read()",
            30,
        );
        assert_eq!(out["result"]["text/plain"], "'from-bash\\n'", "{out}");
        let out = execute_in(&server, &id, "bash", "cat py.txt; echo; echo $x", 30);
        assert_eq!(out["stdout"], "from-python\nbashvar\n", "{out}");
        // The session's own language is the default context.
        let (_, out) = server.tcp_request(
            USER1,
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"code": "x"})),
        );
        assert_eq!(out["result"]["text/plain"], "'pyvar'", "{out}");
        // Node (and TypeScript, the same context): console.log prints; no python `x` here.
        let out = execute_in(
            &server,
            &id,
            "node",
            "const fs = require('fs'); console.log('node sees', fs.readFileSync('py.txt', 'utf8'), typeof x); var n = 20;",
            30,
        );
        assert_eq!(out["stdout"], "node sees from-python undefined\n", "{out}");
        let out = execute_in(
            &server,
            &id,
            "typescript",
            "const m: number = n + 22; console.log(m)",
            30,
        );
        assert_eq!(out["stdout"], "42\n", "{out}");
        let (_, view) = server.tcp_request(USER1, "GET", &format!("/v1/sessions/{id}"), None);
        assert_eq!(view["language"], "python", "{view}");
        assert_eq!(
            view["contexts"],
            json!(["python", "node", "bash"]),
            "{view}"
        );
        std::thread::sleep(Duration::from_secs(1));
        let three = session_memory(&cgroups());
        eprintln!(
            "figures: an idle python session: cgroup {} KiB, RSS {} KiB; with node and bash contexts \
             too: cgroup {} KiB, RSS {} KiB",
            one.0, one.1, three.0, three.1
        );
        // A language that is not one: refused, naming it and the allowed ones.
        let (status, out) = server.tcp_request(
            USER1,
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"language": "ruby", "code": "1"})),
        );
        assert_eq!(status, 400, "{out}");
        let message = out["message"].as_str().unwrap_or("");
        assert!(
            message.contains("\"ruby\"") && message.contains("python, node, typescript or bash"),
            "{out}"
        );
        // A python cell that will not stop: its context is killed and restarted, bash's
        // state is kept (and a background job of bash's survives).
        let out = execute_in(
            &server,
            &id,
            "bash",
            "sleep 1000 & job=$!; echo started",
            30,
        );
        assert_eq!(out["stdout"], "started\n", "{out}");
        let out = execute_in(
            &server,
            &id,
            "python",
            "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)",
            1,
        );
        assert_eq!(out["error"], "timeout", "{out}");
        assert_eq!(out["state"]["restarted"], true, "{out}");
        let out = execute_in(
            &server,
            &id,
            "bash",
            "echo $x; kill -0 $job && echo alive",
            30,
        );
        assert_eq!(out["stdout"], "bashvar\nalive\n", "{out}");
        let out = execute_in(&server, &id, "python", "x", 30);
        assert_eq!(out["exception"]["name"], "NameError", "{out}");
        // An interrupted python cell that stops keeps both contexts' state.
        execute_in(&server, &id, "python", "y = 7", 30);
        let out = execute_in(&server, &id, "python", "while True: pass", 1);
        assert_eq!(
            (&out["error"], &out["state"]["preserved"]),
            (&json!("timeout"), &json!(true)),
            "{out}"
        );
        let out = execute_in(&server, &id, "bash", "echo $x", 30);
        assert_eq!(out["stdout"], "bashvar\n", "{out}");
        // A reset of one context keeps the others' variables.
        let (status, out) = server.tcp_request(
            USER1,
            "POST",
            &format!("/v1/sessions/{id}/reset?language=bash"),
            None,
        );
        assert_eq!(status, 204, "{out}");
        let out = execute_in(&server, &id, "bash", "echo \"[$x]\"", 30);
        assert_eq!(out["stdout"], "[]\n", "{out}");
        let out = execute_in(&server, &id, "python", "y", 30);
        assert_eq!(out["result"]["text/plain"], "7", "{out}");
        let (status, out) = server.tcp_request(
            USER1,
            "POST",
            &format!("/v1/sessions/{id}/reset?language=cobol"),
            None,
        );
        assert_eq!(status, 400, "{out}");
        assert!(
            out["message"].as_str().unwrap_or("").contains("\"cobol\""),
            "{out}"
        );
        // A driver's death (exit 3) restarts that context only.
        execute_in(&server, &id, "bash", "x=again; sleep 1001 &", 30);
        let sleeps =
            "import os\nprint(sum(open(f'/proc/{p}/cmdline').read() == 'sleep\\x001001\\x00' \
                      for p in os.listdir('/proc') if p.isdigit()))";
        let out = execute_in(&server, &id, "python", sleeps, 30);
        assert_eq!(out["stdout"], "1\n", "{out}");
        let out = execute_in(&server, &id, "bash", "exit 3", 30);
        assert_eq!(
            (&out["exit_code"], &out["state"]["restarted"]),
            (&json!(3), &json!(true)),
            "{out}"
        );
        // What the dead bash left in its process group went with its context.
        let out = execute_in(&server, &id, "python", &format!("{sleeps}\ny"), 30);
        assert_eq!(
            (&out["stdout"], &out["result"]["text/plain"]),
            (&json!("0\n"), &json!("7")),
            "{out}"
        );
        let out = execute_in(&server, &id, "node", "n", 30);
        assert_eq!(out["result"]["text/plain"], "20", "{out}");
        let out = execute_in(&server, &id, "node", "process.exit(4)", 30);
        assert_eq!(out["exit_code"], 4, "{out}");
        let out = execute_in(&server, &id, "python", "y", 30);
        assert_eq!(out["result"]["text/plain"], "7", "{out}");
        // The CLI names a context too (an admin over the unix socket).
        let (code, stdout, stderr) = server.session_cli(&[
            "exec",
            &id,
            "--lang",
            "bash",
            "-c",
            "x=fromcli; echo cli-$x",
        ]);
        assert_eq!((code, stdout.as_str()), (0, "cli-fromcli\n"), "{stderr}");
        let (code, _, stderr) = server.session_cli(&["reset", &id, "--lang", "bash"]);
        assert_eq!(code, 0, "{stderr}");
        let (_, stdout, stderr) =
            server.session_cli(&["exec", &id, "--lang", "bash", "-c", "echo \"[$x]\""]);
        assert_eq!(stdout, "[]\n", "{stderr}");
        // A reset with no language: every context.
        let (status, _) =
            server.tcp_request(USER1, "POST", &format!("/v1/sessions/{id}/reset"), None);
        assert_eq!(status, 204);
        let out = execute_in(&server, &id, "python", "'y' in dir()", 30);
        assert_eq!(out["result"]["text/plain"], "False", "{out}");
        let (_, view) = server.tcp_request(USER1, "GET", &format!("/v1/sessions/{id}"), None);
        assert_eq!(view["contexts"], json!(["python"]), "{view}");
        // Closing leaves no process and no cgroup.
        execute_in(&server, &id, "bash", "true", 30);
        execute_in(&server, &id, "node", "1", 30);
        let pids: Vec<String> = cgroups()
            .iter()
            .flat_map(|dir| {
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                procs.lines().map(str::to_string).collect::<Vec<_>>()
            })
            .collect();
        // The init and three drivers at least.
        assert!(pids.len() >= 4, "{pids:?}");
        let (status, _) = server.tcp_request(USER1, "DELETE", &format!("/v1/sessions/{id}"), None);
        assert_eq!(status, 204);
        assert!(cgroups().is_empty(), "the session's cgroup was left");
        let left: Vec<&String> = pids
            .iter()
            .filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
            .collect();
        assert!(
            left.is_empty(),
            "processes outlived their session: {left:?}"
        );
        figures(&server, "contexts");
        server.stop();
    });
}

/// A session whose image has no python3: its bash works, and the first python call says
/// which interpreter is missing; the bash context is left as it was.
#[test]
fn a_context_whose_interpreter_the_image_lacks_says_so() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let root = minimal_rootfs(true);
        std::fs::create_dir_all(root.path().join("run")).unwrap();
        std::fs::write(
            // The caller may use bash: this server's bash profile is one without python3.
            server.profiles_dir().join("bash.toml"),
            format!("language = \"bash\"\nrootfs = {:?}\n", root.path()),
        )
        .unwrap();
        let (status, created) = server.tcp_request(
            USER1,
            "POST",
            "/v1/sessions",
            Some(json!({"language": "bash", "profile": "bash"})),
        );
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        let out = execute_in(&server, &id, "bash", "v=kept; echo hi", 30);
        assert_eq!(out["stdout"], "hi\n", "{out}");
        let out = execute_in(&server, &id, "python", "1", 30);
        assert_eq!(out["error"], "setup", "{out}");
        let message = out["message"].as_str().unwrap_or("");
        eprintln!("the missing interpreter's message: {message}");
        assert!(
            message.contains("the python context could not be made")
                && message.contains("python3 interpreter"),
            "{out}"
        );
        let out = execute_in(&server, &id, "bash", "echo $v", 30);
        assert_eq!(out["stdout"], "kept\n", "{out}");
        let (_, view) = server.tcp_request(USER1, "GET", &format!("/v1/sessions/{id}"), None);
        assert_eq!(view["contexts"], json!(["bash"]), "{view}");
        let (status, _) = server.tcp_request(USER1, "DELETE", &format!("/v1/sessions/{id}"), None);
        assert_eq!(status, 204);
        server.stop();
    });
}

// Processes on a terminal (issue 24: ptys, the screen, keys).

/// Sends input (keys, data, paste, submit) to process `pid`; the answer.
fn send_input(server: &Server, id: &str, pid: u64, body: Value) -> (u16, Value) {
    server.tcp_request(
        USER1,
        "POST",
        &format!("/v1/sessions/{id}/processes/{pid}/stdin"),
        Some(body),
    )
}

/// Process `pid`'s screen.
fn screen(server: &Server, id: &str, pid: u64) -> Value {
    let (status, out) = server.tcp_request(
        USER1,
        "GET",
        &format!("/v1/sessions/{id}/processes/{pid}/screen"),
        None,
    );
    assert_eq!(status, 200, "{out}");
    out
}

/// The screen's rows, as strings.
fn rows(screen: &Value) -> Vec<String> {
    screen["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect()
}

/// Waits until the screen has a row for which `want` holds; the screen then (or the last
/// one seen, in the panic).
fn wait_screen(server: &Server, id: &str, pid: u64, want: impl Fn(&str) -> bool) -> Value {
    let mut last = Value::Null;
    let found = wait_for(Duration::from_secs(10 * slowdown()), || {
        last = screen(server, id, pid);
        rows(&last).iter().any(|r| want(r))
    });
    assert!(found, "the screen never showed it: {:#?}", rows(&last));
    last
}

/// Waits until process `pid` has exited; its last poll.
fn wait_exit(server: &Server, id: &str, pid: u64) -> Value {
    let mut last = Value::Null;
    assert!(
        wait_for(Duration::from_secs(10 * slowdown()), || {
            last = poll_process(server, USER1, id, pid, (0, 0));
            last["status"] == "exited"
        }),
        "{last}"
    );
    last
}

/// The launcher's open fds on a terminal's master (a devpts `ptmx`): the server's.
fn masters_held(server: &Server) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", server.pid()))
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .map(|l| l.to_string_lossy().ends_with("ptmx"))
                .unwrap_or(false)
        })
        .count()
}

/// `python3 -i` on a terminal: its prompt on the screen, `print(6*7)` and Enter give 42,
/// it sees a terminal of the sandbox's own (TERM, a tty of its devpts, owned by the
/// sandbox user, the size asked), and C-d ends it. With the round trips of a send-keys
/// and of a screen GET (a client on a kept connection).
#[test]
fn python_on_a_terminal_takes_keys_and_shows_its_screen() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let id = new_session(&server, USER1, "bash");
        let started = start_process(
            &server,
            USER1,
            &id,
            json!({"argv": ["python3", "-i", "-q"], "pty": {"cols": 90, "rows": 20}, "background": true}),
        );
        assert_eq!(started["status"], "running", "{started}");
        assert_eq!(started["pty"], json!({"cols": 90, "rows": 20}), "{started}");
        let pid = started["process_id"].as_u64().unwrap();
        wait_screen(&server, &id, pid, |r| r.starts_with(">>>"));
        let (status, out) = send_input(&server, &id, pid, json!({"data": "print(6*7)"}));
        assert_eq!(status, 200, "{out}");
        let (status, out) = send_input(&server, &id, pid, json!({"keys": ["Enter"]}));
        assert_eq!((status, out["written"].as_u64()), (200, Some(1)), "{out}");
        let shown = wait_screen(&server, &id, pid, |r| r == "42");
        let lines = rows(&shown);
        assert_eq!(lines.len(), 20, "{lines:#?}");
        let at = lines.iter().position(|r| r == "42").unwrap();
        assert_eq!(lines[at - 1], ">>> print(6*7)", "{lines:#?}");
        assert_eq!(shown["size"], json!({"cols": 90, "rows": 20}), "{shown}");
        assert_eq!(shown["status"], "running", "{shown}");
        assert_eq!(shown["cursor"]["visible"], true, "{shown}");
        // The whole output is one stream, escape codes and all, in the log.
        let log = poll_process(&server, USER1, &id, pid, (0, 0));
        assert!(log["stdout"].as_str().unwrap().contains("42\r\n"), "{log}");
        assert_eq!(log["stderr"], "", "{log}");
        // What the program sees.
        let code = "import os; s = os.stat(os.ttyname(0)); \
                    print('tty', os.environ['TERM'], os.environ['CODECAGE_SHELL'], \
                    os.ttyname(0), s.st_uid, os.isatty(1), os.get_terminal_size(), \
                    os.getsid(0) == os.getpid() == os.tcgetpgrp(0))";
        send_input(&server, &id, pid, json!({"data": code, "submit": true}));
        let seen = wait_screen(&server, &id, pid, |r| r.starts_with("tty "));
        let line = rows(&seen)
            .into_iter()
            .find(|r| r.starts_with("tty "))
            .unwrap();
        assert_eq!(
            line,
            "tty xterm-256color exec /dev/pts/0 1000 True os.terminal_size(columns=90, lines=20) True"
        );
        // The round trips, on a kept connection (curl's start-up left out).
        let (host, port) = server
            .tcp_address()
            .rsplit_once(':')
            .map(|(h, p)| (h.to_string(), p.to_string()))
            .unwrap();
        let script = format!(
            "import http.client, json, statistics, sys, time\n\
             c = http.client.HTTPConnection('{host}', {port})\n\
             h = {{'Authorization': 'Bearer {USER1}', 'Content-Type': 'application/json'}}\n\
             def t(method, path, body=None):\n\
             \x20   s = time.perf_counter(); c.request(method, path, body, h); r = c.getresponse(); r.read()\n\
             \x20   assert r.status == 200, r.status\n\
             \x20   return time.perf_counter() - s\n\
             keys = json.dumps({{'keys': ['a', 'BSpace']}})\n\
             k = [t('POST', '/v1/sessions/{id}/processes/{pid}/stdin', keys) for _ in range(300)]\n\
             g = [t('GET', '/v1/sessions/{id}/processes/{pid}/screen') for _ in range(300)]\n\
             print('%.2f %.2f' % (statistics.median(k) * 1000, statistics.median(g) * 1000))\n"
        );
        let out = Command::new("python3")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let measured = String::from_utf8_lossy(&out.stdout).to_string();
        let (keys_ms, screen_ms) = measured.trim().split_once(' ').unwrap();
        // And with curl, a process and a connection per request, as the other figures.
        let median = |mut times: Vec<Duration>| {
            times.sort();
            times[times.len() / 2].as_secs_f64() * 1000.0
        };
        let timed = |f: &dyn Fn()| {
            (0..100)
                .map(|_| {
                    let start = Instant::now();
                    f();
                    start.elapsed()
                })
                .collect::<Vec<_>>()
        };
        let curl_keys = median(timed(&|| {
            let (status, _) = send_input(&server, &id, pid, json!({"keys": ["a", "BSpace"]}));
            assert_eq!(status, 200);
        }));
        let curl_screen = median(timed(&|| {
            screen(&server, &id, pid);
        }));
        eprintln!(
            "figures: round trip (median of 300, kept connection): send-keys {keys_ms} ms, \
             screen {screen_ms} ms; with curl (median of 100): send-keys {curl_keys:.2} ms, \
             screen {curl_screen:.2} ms"
        );
        // C-d at an empty prompt: end of file, and python exits 0.
        send_input(&server, &id, pid, json!({"keys": ["C-u", "C-d"]}));
        let end = wait_exit(&server, &id, pid);
        assert_eq!(end["exit_code"], 0, "{end}");
        // Its last screen stays, and its terminal is closed.
        assert_eq!(screen(&server, &id, pid)["status"], "exited");
        let (status, out) = send_input(&server, &id, pid, json!({"keys": ["Enter"]}));
        assert_eq!(status, 400, "{out}");
        assert!(out["message"].as_str().unwrap().contains("exited"), "{out}");
        figures(&server, "python on a terminal");
        server.stop();
    });
}

/// C-c on a terminal is SIGINT to its foreground process group (a person's ^C), sent as
/// soon as the start has answered; keys to a process without a terminal are bytes on its
/// stdin pipe; an unknown key is a 400 naming it and the forms allowed; a screen or a
/// resize of a process without a terminal, and a terminal out of range, are 400s too.
#[test]
fn c_c_stops_a_program_on_a_terminal_and_keys_are_checked() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let id = new_session(&server, USER1, "bash");
        // In the foreground, a short one is its whole result: one stream, the terminal's
        // line ends.
        let short = start_process(
            &server,
            USER1,
            &id,
            json!({"command": "tput cols; tty; echo oops >&2", "pty": {"cols": 77, "rows": 10}}),
        );
        assert_eq!(short["status"], "exited", "{short}");
        assert_eq!(short["exit_code"], 0, "{short}");
        assert_eq!(short["stdout"], "77\r\n/dev/pts/0\r\noops\r\n", "{short}");
        assert_eq!(short["stderr"], "", "{short}");
        let sleeper = start_process(
            &server,
            USER1,
            &id,
            json!({"command": "sleep 100", "pty": true, "background": true}),
        );
        let pid = sleeper["process_id"].as_u64().unwrap();
        let (status, out) = send_input(&server, &id, pid, json!({"keys": ["C-c"]}));
        assert_eq!(status, 200, "{out}");
        let end = wait_exit(&server, &id, pid);
        assert_eq!(
            (end["signal"].as_i64(), end["exit_code"].as_i64()),
            (Some(2), None),
            "{end}"
        );
        assert_eq!(end["timed_out"], false, "{end}");
        // An unknown key: named, with the forms, and nothing is written.
        let cat = start_process(
            &server,
            USER1,
            &id,
            json!({"argv": ["cat"], "stdin": true, "background": true}),
        );
        let cat_pid = cat["process_id"].as_u64().unwrap();
        assert_eq!(cat.get("pty"), None, "{cat}");
        let (status, out) = send_input(
            &server,
            &id,
            cat_pid,
            json!({"keys": ["a", "Bogus"], "data": "x"}),
        );
        assert_eq!(
            (status, out["error"].as_str()),
            (400, Some("invalid_request")),
            "{out}"
        );
        let message = out["message"].as_str().unwrap();
        assert!(message.contains("`Bogus`"), "{message}");
        assert!(message.contains("Enter, Escape, Tab"), "{message}");
        assert!(message.contains("C-c"), "{message}");
        // Keys on a pipe: the bytes, Enter a line feed; then EOF.
        let (status, out) = send_input(
            &server,
            &id,
            cat_pid,
            json!({"keys": ["a", "Space", "Tab", "b"], "data": "c", "paste": "d\ne", "submit": true, "close": true}),
        );
        assert_eq!((status, out["written"].as_u64()), (200, Some(9)), "{out}");
        let end = wait_exit(&server, &id, cat_pid);
        assert_eq!(end["stdout"], "a \tbcd\ne\n", "{end}");
        // A pipe has no screen and no size.
        let base = format!("/v1/sessions/{id}/processes/{cat_pid}");
        let (status, out) = server.tcp_request(USER1, "GET", &format!("{base}/screen"), None);
        assert_eq!(status, 400, "{out}");
        assert!(
            out["message"]
                .as_str()
                .unwrap()
                .contains("does not run on a terminal"),
            "{out}"
        );
        let (status, out) = server.tcp_request(
            USER1,
            "POST",
            &format!("{base}/resize"),
            Some(json!({"cols": 100, "rows": 30})),
        );
        assert_eq!(status, 400, "{out}");
        // A terminal out of range, and a terminal with `stdin`.
        for body in [
            json!({"command": "true", "pty": {"cols": 0, "rows": 24}}),
            json!({"command": "true", "pty": {"cols": 80, "rows": 5000}}),
            json!({"command": "true", "pty": {"cols": 80, "lines": 24}}),
            json!({"command": "true", "pty": "yes"}),
            json!({"command": "true", "pty": true, "stdin": true}),
        ] {
            let (status, out) = server.tcp_request(
                USER1,
                "POST",
                &format!("/v1/sessions/{id}/processes"),
                Some(body.clone()),
            );
            assert_eq!(status, 400, "{body}: {out}");
            assert!(
                out["message"].as_str().unwrap().contains("pty")
                    || out["message"].as_str().unwrap().contains("stdin"),
                "{body}: {out}"
            );
        }
        server.stop();
    });
}

/// A resize reaches the program: `stty size` says the new size, a SIGWINCH handler runs,
/// and the screen takes it.
#[test]
fn a_terminal_follows_a_resize() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let id = new_session(&server, USER1, "bash");
        let started = start_process(
            &server,
            USER1,
            &id,
            json!({"command": "trap 'echo winch' WINCH; stty size; read line; stty size; read line",
                   "pty": {"cols": 100, "rows": 30}, "background": true}),
        );
        let pid = started["process_id"].as_u64().unwrap();
        wait_screen(&server, &id, pid, |r| r == "30 100");
        let (status, out) = server.tcp_request(
            USER1,
            "POST",
            &format!("/v1/sessions/{id}/processes/{pid}/resize"),
            Some(json!({"cols": 120, "rows": 40})),
        );
        assert_eq!(status, 204, "{out}");
        send_input(&server, &id, pid, json!({"submit": true}));
        let shown = wait_screen(&server, &id, pid, |r| r == "40 120");
        assert_eq!(shown["size"], json!({"cols": 120, "rows": 40}), "{shown}");
        assert_eq!(rows(&shown).len(), 40);
        assert!(
            rows(&shown).iter().any(|r| r == "winch"),
            "{:#?}",
            rows(&shown)
        );
        let (status, out) = server.tcp_request(
            USER1,
            "POST",
            &format!("/v1/sessions/{id}/processes/{pid}/resize"),
            Some(json!({"cols": 120, "rows": 0})),
        );
        assert_eq!(status, 400, "{out}");
        send_input(&server, &id, pid, json!({"submit": true}));
        assert_eq!(wait_exit(&server, &id, pid)["exit_code"], 0);
        server.stop();
    });
}

/// Full-screen programs read as a person sees them: `more` shows a file's first page and
/// its prompt, and pages on; `less` pages to the end; vim edits the file on the alternate
/// screen and writes it; a
/// curses program takes the alternate screen and application cursor keys, and `Up` reaches
/// it as the key curses decodes; bash's readline asks for bracketed paste, and a paste of
/// two lines arrives as one edit.
#[test]
fn full_screen_programs_render_on_the_screen() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let id = new_session(&server, USER1, "bash");
        let (status, out) = server.tcp_request(
            USER1,
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"code": "seq 1 100 | sed 's/^/line /' > file.txt"})),
        );
        assert_eq!(status, 200, "{out}");
        let pager = start_process(
            &server,
            USER1,
            &id,
            json!({"argv": ["more", "file.txt"], "pty": {"cols": 80, "rows": 24}, "background": true}),
        );
        let pid = pager["process_id"].as_u64().unwrap();
        let page = wait_screen(&server, &id, pid, |r| r.contains("--More--"));
        let lines = rows(&page);
        assert_eq!(lines[0], "line 1", "{lines:#?}");
        assert_eq!(lines[22], "line 23", "{lines:#?}");
        assert!(
            lines[23].starts_with("--More--(") && lines[23].contains('%'),
            "{lines:#?}"
        );
        send_input(&server, &id, pid, json!({"keys": ["Space"]}));
        let next = wait_screen(&server, &id, pid, |r| r == "line 46");
        assert!(rows(&next)[23].contains("--More--"), "{:#?}", rows(&next));
        send_input(&server, &id, pid, json!({"keys": ["q"]}));
        assert_eq!(wait_exit(&server, &id, pid)["exit_code"], 0);

        // less, as a person pages a file: its first screen, `G` to the end, `q`.
        let less = start_process(
            &server,
            USER1,
            &id,
            json!({"argv": ["less", "file.txt"], "pty": {"cols": 80, "rows": 24}, "background": true}),
        );
        let pid = less["process_id"].as_u64().unwrap();
        let page = wait_screen(&server, &id, pid, |r| r == "line 23");
        assert_eq!(rows(&page)[0], "line 1", "{:#?}", rows(&page));
        send_input(&server, &id, pid, json!({"keys": ["G"]}));
        let end = wait_screen(&server, &id, pid, |r| r == "line 100");
        assert!(rows(&end)[23].contains("(END)"), "{:#?}", rows(&end));
        send_input(&server, &id, pid, json!({"keys": ["q"]}));
        assert_eq!(wait_exit(&server, &id, pid)["exit_code"], 0);

        // vim (the image's vim.tiny) on the alternate screen: the file, its status line, an
        // edit written back, :wq.
        let vim = start_process(
            &server,
            USER1,
            &id,
            json!({"argv": ["vim.tiny", "-i", "NONE", "file.txt"], "pty": {"cols": 80, "rows": 24}, "background": true}),
        );
        let pid = vim["process_id"].as_u64().unwrap();
        let opened = wait_screen(&server, &id, pid, |r| r.contains("\"file.txt\""));
        assert_eq!(rows(&opened)[0], "line 1", "{:#?}", rows(&opened));
        assert_eq!(opened["alternate_screen"], true, "{opened}");
        send_input(&server, &id, pid, json!({"data": "ccedited\u{1b}:wq\r"}));
        assert_eq!(wait_exit(&server, &id, pid)["exit_code"], 0);
        let (status, out) = server.tcp_request(
            USER1,
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"code": "head -2 file.txt"})),
        );
        assert_eq!(status, 200, "{out}");
        assert_eq!(out["stdout"], "edited\nline 2\n", "{out}");

        let curses = "import curses\n\
                      def main(s):\n\
                      \x20   s.addstr(2, 4, 'curses ready'); s.refresh()\n\
                      \x20   k = s.getkey()\n\
                      \x20   s.addstr(3, 4, 'got ' + k); s.move(5, 7); s.refresh(); s.getkey()\n\
                      curses.wrapper(main)\n";
        let tui = start_process(
            &server,
            USER1,
            &id,
            json!({"argv": ["python3", "-c", curses], "pty": {"cols": 60, "rows": 12}, "background": true}),
        );
        let pid = tui["process_id"].as_u64().unwrap();
        let ready = wait_screen(&server, &id, pid, |r| r == "    curses ready");
        assert_eq!(ready["alternate_screen"], true, "{ready}");
        assert_eq!(ready["application_cursor"], true, "{ready}");
        send_input(&server, &id, pid, json!({"keys": ["Up"]}));
        let got = wait_screen(&server, &id, pid, |r| r.starts_with("    got "));
        assert_eq!(rows(&got)[3], "    got KEY_UP", "{:#?}", rows(&got));
        assert_eq!(got["cursor"]["row"], 5, "{got}");
        assert_eq!(got["cursor"]["col"], 7, "{got}");
        send_input(&server, &id, pid, json!({"keys": ["q"]}));
        assert_eq!(wait_exit(&server, &id, pid)["exit_code"], 0);
        // Back from the alternate screen: curses restored the normal one.
        let after = screen(&server, &id, pid);
        assert_eq!(after["alternate_screen"], false, "{after}");

        let shell = start_process(
            &server,
            USER1,
            &id,
            json!({"argv": ["bash", "--norc", "-i"], "env": {"PS1": "$ "}, "pty": true, "background": true}),
        );
        let pid = shell["process_id"].as_u64().unwrap();
        let prompt = wait_screen(&server, &id, pid, |r| r.starts_with('$'));
        assert_eq!(prompt["bracketed_paste"], true, "{prompt}");
        // Pasted, the two lines are one edit: nothing runs until Enter.
        send_input(&server, &id, pid, json!({"paste": "echo one\necho two"}));
        std::thread::sleep(Duration::from_millis(300));
        let pasted = screen(&server, &id, pid);
        assert!(
            !rows(&pasted).iter().any(|r| r == "one"),
            "{:#?}",
            rows(&pasted)
        );
        send_input(&server, &id, pid, json!({"submit": true}));
        let ran = wait_screen(&server, &id, pid, |r| r == "two");
        assert!(rows(&ran).iter().any(|r| r == "one"), "{:#?}", rows(&ran));
        // A cursor position report, as a terminal answers it (line editors wait for one).
        send_input(
            &server,
            &id,
            pid,
            json!({"data": "printf '\\033[5;9H\\033[6n'; read -rs -d R pos; echo; echo \"at ${pos#*[}\"", "submit": true}),
        );
        wait_screen(&server, &id, pid, |r| r == "at 5;9");
        // A title the program sets.
        send_input(
            &server,
            &id,
            pid,
            json!({"data": "printf '\\033]2;my title\\007'", "submit": true}),
        );
        let mut last = Value::Null;
        assert!(
            wait_for(Duration::from_secs(10), || {
                last = screen(&server, &id, pid);
                last["title"] == "my title"
            }),
            "{last}"
        );
        send_input(&server, &id, pid, json!({"data": "exit 4", "submit": true}));
        assert_eq!(wait_exit(&server, &id, pid)["exit_code"], 4);
        server.stop();
    });
}

/// No leak: a terminal's master is let go when its program ends (the sandbox's devpts
/// gets the pty back), and closing the session kills what still runs on one and leaves
/// no process, no cgroup, and no fd of a terminal in the server.
#[test]
fn terminals_leave_nothing_behind() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let before = server.footprint().1;
        let id = new_session(&server, USER1, "bash");
        // A time no other test's sleep has.
        let seconds = format!("1000.{}", std::process::id());
        start_process(
            &server,
            USER1,
            &id,
            json!({"argv": ["sleep", seconds], "pty": true, "background": true}),
        );
        let short = start_process(
            &server,
            USER1,
            &id,
            json!({"command": "read x; echo got $x", "pty": true, "background": true}),
        );
        assert_eq!(
            masters_held(&server),
            4,
            "a reader's and a writer's fd for each"
        );
        let short_pid = short["process_id"].as_u64().unwrap();
        let start_sleep = || {
            server.tcp_request(
                USER1,
                "POST",
                &format!("/v1/sessions/{id}/processes"),
                Some(json!({"argv": ["sleep", seconds], "pty": true, "background": true})),
            )
        };
        // More terminals than a sandbox may hold: the 33rd is refused, by name.
        let mut more = 0;
        let refused = loop {
            let (status, out) = start_sleep();
            if status != 200 {
                assert_eq!(status, 400, "{out}");
                break out;
            }
            more += 1;
            assert!(more < 40, "no limit on terminals");
        };
        assert_eq!(more, 30, "{refused}");
        eprintln!("the 33rd terminal: {}", refused["message"]);
        assert!(
            refused["message"]
                .as_str()
                .unwrap()
                .contains("at most 32 terminals"),
            "{refused}"
        );
        // A program that ends gives its terminal back: the launcher lets the master go,
        // and (once the kernel has released it, which it does in the background) a new
        // one can be opened.
        send_input(
            &server,
            &id,
            short_pid,
            json!({"data": "it", "submit": true}),
        );
        let end = wait_exit(&server, &id, short_pid);
        assert!(end["stdout"].as_str().unwrap().contains("got it"), "{end}");
        assert!(
            wait_for(Duration::from_secs(5), || masters_held(&server) == 62),
            "the ended program's terminal is still held: {}",
            masters_held(&server)
        );
        let mut last = (0, Value::Null);
        assert!(
            wait_for(Duration::from_secs(5), || {
                last = start_sleep();
                last.0 == 200
            }),
            "no terminal came back: {:?}",
            last
        );
        let server_pid = server.pid();
        let mine = || {
            run_cgroups()
                .into_iter()
                .filter(|(pid, _)| *pid == server_pid)
                .count()
        };
        assert!(mine() > 0);
        let needle = format!("sleep\0{seconds}");
        // (A start answers once the process is hardened, just before its exec.)
        assert!(
            wait_for(Duration::from_secs(5), || host_pids_with(&needle).len()
                == 32),
            "they run on the host: {}",
            host_pids_with(&needle).len()
        );
        let (status, _) = server.tcp_request(USER1, "DELETE", &format!("/v1/sessions/{id}"), None);
        assert_eq!(status, 204);
        assert!(
            host_pids_with(&needle).is_empty(),
            "a process on a terminal outlived its session"
        );
        assert_eq!(mine(), 0, "the session's cgroup was left");
        assert!(
            wait_for(Duration::from_secs(5), || masters_held(&server) == 0),
            "the server still holds {} terminal fds",
            masters_held(&server)
        );
        let after = server.footprint().1;
        assert!(after <= before + 2, "fds: {before} before, {after} after");
        server.stop();
    });
}

/// A JSON request over TCP whose status and `error` are returned with the body.
fn fs_call(
    server: &Server,
    token: &str,
    method: &str,
    path: String,
    body: Option<Value>,
) -> (u16, Value) {
    server.tcp_request(token, method, &path, body)
}

/// `GET .../fs/{op}?path=P` with P percent-encoded.
fn fs_get(
    server: &Server,
    token: &str,
    id: &str,
    op: &str,
    path: &str,
    extra: &str,
) -> (u16, Value) {
    let encoded: String = path
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    fs_call(
        server,
        token,
        "GET",
        format!("/v1/sessions/{id}/fs/{op}?path={encoded}{extra}"),
        None,
    )
}

/// A host directory a sandbox's symlink points at: the file system operations run on the
/// host, so one that followed the link would reach it.
struct Canary(std::path::PathBuf);
impl Canary {
    fn new() -> Canary {
        let dir =
            std::path::PathBuf::from(format!("/tmp/codecage-fs-canary-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("keep"), "host secret").unwrap();
        Canary(dir)
    }
    fn intact(&self) {
        assert_eq!(
            std::fs::read_to_string(self.0.join("keep")).unwrap(),
            "host secret"
        );
        let names: Vec<_> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["keep"], "the host directory was written to");
    }
}
impl Drop for Canary {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// stat, list to a depth, mkdir, move and remove on a session's /work over HTTP: the
/// sandbox's code sees what they did and they see what it did; 404 for a missing path,
/// 409 for one in the way; every escape (`..`, a path outside /work, a symlink to /etc or
/// to a host directory, anywhere on the path) is 400 and touches nothing; another token
/// reaches nothing; they work while a call runs.
#[test]
fn a_sessions_work_is_a_file_system_over_the_api() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let canary = Canary::new();
        let id = new_session(&server, USER1, "bash");
        let execute = format!("/v1/sessions/{id}/execute");
        let run = |code: &str| {
            let (status, out) =
                server.tcp_request(USER1, "POST", &execute, Some(json!({"code": code})));
            assert_eq!(status, 200, "{out}");
            out["stdout"].as_str().unwrap_or_default().to_string()
        };
        run(&format!(
            "mkdir -p d/sub && printf hello > d/sub/f.txt && chmod 600 d/sub/f.txt && \
             ln -s /etc etc_link && ln -s .. up && ln -s {} canary && ln -s d dlink",
            canary.0.display()
        ));
        let get = |op: &str, path: &str, extra: &str| fs_get(&server, USER1, &id, op, path, extra);
        let post = |op: &str, body: Value| {
            fs_call(
                &server,
                USER1,
                "POST",
                format!("/v1/sessions/{id}/fs/{op}"),
                Some(body),
            )
        };

        // stat: every field of E2B's EntryInfo.
        let (status, f) = get("stat", "d/sub/f.txt", "");
        assert_eq!(status, 200, "{f}");
        assert_eq!(
            (
                &f["name"],
                &f["type"],
                &f["path"],
                &f["size"],
                &f["mode"],
                &f["permissions"]
            ),
            (
                &json!("f.txt"),
                &json!("file"),
                &json!("/work/d/sub/f.txt"),
                &json!(5),
                &json!(0o600),
                &json!("-rw-------")
            ),
            "{f}"
        );
        assert_eq!(
            (&f["owner"], &f["group"], &f["is_symlink"]),
            (&json!("sandbox"), &json!("sandbox"), &json!(false)),
            "{f}"
        );
        let modified = humantime::parse_rfc3339(f["modified_time"].as_str().unwrap()).unwrap();
        assert!(
            modified.elapsed().unwrap() < Duration::from_secs(120),
            "{f}"
        );
        let (_, link) = get("stat", "/work/etc_link", "");
        assert_eq!(
            (
                &link["type"],
                &link["symlink_target"],
                &link["is_symlink"],
                &link["permissions"]
            ),
            (
                &json!("symlink"),
                &json!("/etc"),
                &json!(true),
                &json!("lrwxrwxrwx")
            ),
            "{link}"
        );
        let (_, work) = get("stat", "", "");
        assert_eq!(
            (&work["path"], &work["type"], &work["owner"]),
            (&json!("/work"), &json!("dir"), &json!("sandbox")),
            "{work}"
        );

        // list: one level, then three; symlinks listed, never entered.
        let paths = |depth: u32| -> Vec<String> {
            let (status, list) = get("list", "", &format!("&depth={depth}"));
            assert_eq!(status, 200, "{list}");
            list.as_array()
                .unwrap()
                .iter()
                .map(|e| e["path"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(
            paths(1),
            [
                "/work/canary",
                "/work/d",
                "/work/dlink",
                "/work/etc_link",
                "/work/up"
            ]
        );
        assert_eq!(
            paths(3),
            [
                "/work/canary",
                "/work/d",
                "/work/d/sub",
                "/work/d/sub/f.txt",
                "/work/dlink",
                "/work/etc_link",
                "/work/up"
            ]
        );
        assert_eq!(get("list", "", "&depth=0").0, 400);

        // Escapes: 400 naming the problem, and nothing touched.
        let refused = |(status, out): (u16, Value), what: &str| {
            assert_eq!(
                (status, out["error"].as_str()),
                (400, Some("invalid_request")),
                "{what}: {out}"
            );
            out["message"].as_str().unwrap().to_string()
        };
        assert!(refused(get("stat", "../etc/passwd", ""), "..").contains("`..`"));
        assert!(refused(get("stat", "d/../../etc/passwd", ""), "..").contains("`..`"));
        assert!(refused(get("stat", "/etc/passwd", ""), "outside").contains("outside /work"));
        for through in ["etc_link/passwd", "canary/keep", "up/work", "dlink/sub"] {
            assert!(
                refused(get("stat", through, ""), through).contains("symlink"),
                "{through}"
            );
            refused(get("list", through, ""), through);
        }
        for dir in ["etc_link", "canary", "up"] {
            let message = refused(get("list", dir, ""), dir);
            assert!(
                message.contains(&format!("/work/{dir} is a symlink, which is not followed")),
                "{message}"
            );
        }
        let message = refused(get("list", "d/sub/f.txt", ""), "a file");
        assert!(
            message.contains("/work/d/sub/f.txt is not a directory"),
            "{message}"
        );
        refused(
            post("mkdir", json!({"path": "canary/new"})),
            "mkdir through a link",
        );
        refused(
            post("remove", json!({"path": "canary/keep"})),
            "remove through a link",
        );
        refused(
            post("remove", json!({"path": "etc_link/passwd"})),
            "remove through a link",
        );
        refused(
            post(
                "move",
                json!({"source": "canary/keep", "destination": "stolen"}),
            ),
            "move out of a link",
        );
        refused(
            post(
                "move",
                json!({"source": "d/sub/f.txt", "destination": "canary/planted"}),
            ),
            "move into a link",
        );
        refused(
            post(
                "move",
                json!({"source": "d/sub/f.txt", "destination": "../planted"}),
            ),
            "move up",
        );
        refused(post("remove", json!({"path": ""})), "remove /work");
        canary.intact();

        // Missing: 404 naming the path.
        let (status, out) = get("stat", "nope/x", "");
        assert_eq!(
            (status, out["error"].as_str()),
            (404, Some("not_found")),
            "{out}"
        );
        assert!(
            out["message"]
                .as_str()
                .unwrap()
                .contains("/work/nope does not exist"),
            "{out}"
        );
        assert_eq!(post("remove", json!({"path": "nope"})).0, 404);
        assert_eq!(
            post("move", json!({"source": "nope", "destination": "x"})).0,
            404
        );

        // mkdir -p, then again; a file in the way is 409.
        let (status, made) = post("mkdir", json!({"path": "a/b/c"}));
        assert_eq!(
            (status, &made["created"], &made["entry"]["path"]),
            (201, &json!(true), &json!("/work/a/b/c")),
            "{made}"
        );
        let (status, again) = post("mkdir", json!({"path": "/work/a/b"}));
        assert_eq!((status, &again["created"]), (200, &json!(false)), "{again}");
        let (status, out) = post("mkdir", json!({"path": "d/sub/f.txt"}));
        assert_eq!(
            (status, out["error"].as_str()),
            (409, Some("exists")),
            "{out}"
        );

        // move: to a new name, refused onto an existing one unless overwrite.
        let (status, moved) = post(
            "move",
            json!({"source": "d/sub/f.txt", "destination": "a/b/c/g.txt"}),
        );
        assert_eq!(
            (status, &moved["path"], &moved["size"]),
            (200, &json!("/work/a/b/c/g.txt"), &json!(5)),
            "{moved}"
        );
        run("echo other > a/other");
        let (status, out) = post(
            "move",
            json!({"source": "a/other", "destination": "a/b/c/g.txt"}),
        );
        assert_eq!(
            (status, out["error"].as_str()),
            (409, Some("exists")),
            "{out}"
        );
        assert_eq!(
            post(
                "move",
                json!({"source": "a/other", "destination": "a/b/c/g.txt", "overwrite": true})
            )
            .0,
            200
        );

        // remove: a link removes the link only; a tree goes whole.
        assert_eq!(post("remove", json!({"path": "canary"})).0, 204);
        canary.intact();
        assert_eq!(post("remove", json!({"path": "d"})).0, 204);
        assert_eq!(get("stat", "d", "").0, 404);
        // The sandbox's code sees it all, and owns what was made for it.
        assert_eq!(
            run("ls; cat a/b/c/g.txt; stat -c '%U %a' a/b/c; echo x > a/b/c/mine && echo wrote"),
            "a\ndlink\netc_link\nup\nother\nsandbox 755\nwrote\n"
        );

        // While a call runs: no claim needed (a call's own 409 is for calls).
        let slow = {
            let url = format!("http://{}{execute}", server.tcp_address());
            std::thread::spawn(move || {
                Command::new("curl")
                    .args([
                        "-s",
                        "-H",
                        &format!("Authorization: Bearer {USER1}"),
                        "-X",
                        "POST",
                        &url,
                    ])
                    .args([
                        "-H",
                        "Content-Type: application/json",
                        "-d",
                        r#"{"code":"sleep 2; echo slow > during"}"#,
                    ])
                    .output()
                    .unwrap()
            })
        };
        std::thread::sleep(Duration::from_millis(700));
        let (status, busy) = server.tcp_request(USER1, "GET", &format!("/v1/sessions/{id}"), None);
        assert_eq!((status, &busy["busy"]), (200, &json!(true)), "{busy}");
        assert_eq!(get("stat", "a", "").0, 200);
        assert_eq!(post("mkdir", json!({"path": "during_call"})).0, 201);
        slow.join().unwrap();
        assert_eq!(get("stat", "during", "").1["size"], 5);

        // Another token: every route is 404, as for a session that never was.
        let tries: Vec<(&str, String, Option<Value>)> = vec![
            ("GET", format!("/v1/sessions/{id}/fs/stat?path=a"), None),
            ("GET", format!("/v1/sessions/{id}/fs/list?path="), None),
            (
                "POST",
                format!("/v1/sessions/{id}/fs/mkdir"),
                Some(json!({"path": "x"})),
            ),
            (
                "POST",
                format!("/v1/sessions/{id}/fs/move"),
                Some(json!({"source": "a", "destination": "b"})),
            ),
            (
                "POST",
                format!("/v1/sessions/{id}/fs/remove"),
                Some(json!({"path": "a"})),
            ),
        ];
        for (method, path, body) in tries {
            let (status, out) = server.tcp_request(USER2, method, &path, body);
            assert_eq!(
                (status, out["error"].as_str()),
                (404, Some("not_found")),
                "{method} {path}: {out}"
            );
        }
        assert_eq!(get("stat", "a", "").0, 200, "user2 removed nothing");
        figures(&server, "fs operations");
        server.stop();
    });
}

/// The sandbox's code swaps a directory and a symlink to a host directory as fast as it
/// can while the host lists, stats and removes under that name: nothing ever reaches the
/// host directory (openat2 refuses the link wherever the race lands).
#[test]
fn a_symlink_raced_under_a_path_never_leads_the_host_out_of_work() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let canary = Canary::new();
        let id = new_session(&server, USER1, "bash");
        let racer = start_process(
            &server,
            USER1,
            &id,
            json!({"command": format!(
                "while :; do rm -rf r; mkdir r; echo mine > r/keep; rm -rf r; ln -s {} r; done",
                canary.0.display()
            ), "background": true}),
        );
        // A recursive watcher follows each new `r` it can: never the link in its place.
        let (status, made) = server.tcp_request(
            USER1,
            "POST",
            &format!("/v1/sessions/{id}/fs/watchers"),
            Some(json!({"path": "", "recursive": true})),
        );
        assert_eq!(status, 201, "{made}");
        let watcher = format!(
            "/v1/sessions/{id}/fs/watchers/{}",
            made["watcher_id"].as_str().unwrap()
        );
        let (mut listed, mut refused) = (0, 0);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(6) {
            let (status, list) = fs_get(&server, USER1, &id, "list", "r", "");
            match status {
                200 => {
                    listed += 1;
                    for e in list.as_array().unwrap() {
                        assert_eq!(e["owner"], "sandbox", "{list}");
                    }
                }
                400 | 404 => refused += 1,
                _ => panic!("{status}: {list}"),
            }
            let (status, keep) = fs_get(&server, USER1, &id, "stat", "r/keep", "");
            // The sandbox's own file (empty or written), never the host's ("host secret").
            assert!(
                status != 200 || (keep["owner"] == "sandbox" && keep["size"] != 11),
                "{keep}"
            );
            let (status, out) = fs_call(
                &server,
                USER1,
                "POST",
                format!("/v1/sessions/{id}/fs/remove"),
                Some(json!({"path": "r/keep"})),
            );
            assert!(matches!(status, 204 | 400 | 404), "{status}: {out}");
            canary.intact();
        }
        eprintln!("figures: raced symlink: {listed} listings of the directory, {refused} refused or missing");
        // Both sides of the race were met: the directory, and the link in its place.
        assert!(
            listed > 0 && refused > 0,
            "{listed} listed, {refused} refused"
        );
        // The host writes into its directory: the watcher, which saw `r` come and go,
        // says nothing of it.
        std::fs::write(canary.0.join("host-write"), "x").unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let (status, polled) =
            server.tcp_request(USER1, "GET", &format!("{watcher}?after=0"), None);
        assert_eq!(status, 200, "{polled}");
        let events = polled["events"].as_array().unwrap();
        assert!(
            events.iter().any(|e| e["name"] == "r/keep"),
            "the watcher followed no r"
        );
        assert!(
            !events
                .iter()
                .any(|e| e["name"].as_str().unwrap().contains("host-write")),
            "{polled}"
        );
        std::fs::remove_file(canary.0.join("host-write")).unwrap();
        let pid = racer["process_id"].as_u64().unwrap();
        server.tcp_request(
            USER1,
            "DELETE",
            &format!("/v1/sessions/{id}/processes/{pid}"),
            None,
        );
        canary.intact();
        server.stop();
    });
}

/// `curl -N` on a watch stream: its lines as they come, on a channel.
struct WatchStream {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<Value>,
}

impl WatchStream {
    fn open(server: &Server, token: &str, path: &str) -> WatchStream {
        let mut child = Command::new("curl")
            .args(["-s", "-N", "-H", &format!("Authorization: Bearer {token}")])
            .arg(format!("http://{}{path}", server.tcp_address()))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let value = serde_json::from_str(&line).unwrap_or(Value::String(line));
                if send.send(value).is_err() {
                    return;
                }
            }
        });
        WatchStream { child, lines }
    }

    /// The next line within `limit`.
    fn next(&self, limit: Duration) -> Option<Value> {
        self.lines.recv_timeout(limit).ok()
    }

    /// Lines until one `until` accepts (included), within `limit`.
    fn until(&self, limit: Duration, until: impl Fn(&Value) -> bool) -> Vec<Value> {
        let end = Instant::now() + limit;
        let mut got = Vec::new();
        while let Some(line) = self.next(end.saturating_duration_since(Instant::now())) {
            let last = until(&line);
            got.push(line);
            if last {
                break;
            }
        }
        got
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A watch sees what the session's code does, as it happens: over an NDJSON stream
/// (recursive: a directory made meanwhile is followed) and polled from a cursor; a watch
/// through a symlink or `..` is 400, of a missing directory 404, of another token's
/// session 404; removing the directory or closing the session ends it.
#[test]
fn a_watch_sees_what_the_sessions_code_does() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let id = new_session(&server, USER1, "bash");
        let execute = format!("/v1/sessions/{id}/execute");
        let run = |code: &str| {
            let (status, out) =
                server.tcp_request(USER1, "POST", &execute, Some(json!({"code": code})));
            assert_eq!((status, &out["exit_code"]), (200, &json!(0)), "{out}");
        };
        run("mkdir w && ln -s /etc etc_link");
        let fs_url = format!("/v1/sessions/{id}/fs");

        // Streamed, recursive.
        let stream = WatchStream::open(
            &server,
            USER1,
            &format!("{fs_url}/watch?path=w&recursive=true"),
        );
        let start = stream
            .next(Duration::from_secs(10))
            .expect("the start line");
        assert_eq!(start, json!({"type": "start", "path": "/work/w"}));
        run(
            "echo hi > w/a.txt; mkdir w/sub; sleep 0.5; echo x > w/sub/b.txt; \
             mv w/a.txt w/c.txt; chmod 600 w/c.txt; rm w/c.txt",
        );
        let lines = stream.until(Duration::from_secs(10), |l| {
            l["type"] == "remove" && l["name"] == "c.txt"
        });
        let seen: Vec<(String, String)> = lines
            .iter()
            .map(|l| {
                (
                    l["type"].as_str().unwrap().to_string(),
                    l["name"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        for want in [
            ("create", "a.txt"),
            ("write", "a.txt"),
            ("create", "sub"),
            ("create", "sub/b.txt"),
            ("write", "sub/b.txt"),
            ("rename", "a.txt"),
            ("create", "c.txt"),
            ("chmod", "c.txt"),
            ("remove", "c.txt"),
        ] {
            assert!(
                seen.contains(&(want.0.to_string(), want.1.to_string())),
                "{want:?} not in {seen:?}"
            );
        }
        let b = lines.iter().find(|l| l["name"] == "sub/b.txt").unwrap();
        assert_eq!(b["path"], "/work/w/sub/b.txt");
        drop(stream);

        // Polled from a cursor.
        let (status, made) = server.tcp_request(
            USER1,
            "POST",
            &format!("{fs_url}/watchers"),
            Some(json!({"path": "/work/w"})),
        );
        assert_eq!(status, 201, "{made}");
        let watcher = format!("{fs_url}/watchers/{}", made["watcher_id"].as_str().unwrap());
        run("touch w/p1; echo z > w/p2");
        // The watcher reads as events come: they are there within moments.
        let mut polled = Value::Null;
        assert!(
            wait_for(Duration::from_secs(5), || {
                let (status, got) =
                    server.tcp_request(USER1, "GET", &format!("{watcher}?after=0"), None);
                assert_eq!(status, 200, "{got}");
                polled = got;
                polled["events"].as_array().unwrap().len() >= 4
            }),
            "{polled}"
        );
        let events: Vec<(&str, &str)> = polled["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["type"].as_str().unwrap(), e["name"].as_str().unwrap()))
            .collect();
        assert_eq!(
            &events[..2],
            [("create", "p1"), ("chmod", "p1")].as_slice(),
            "{polled}"
        );
        assert!(
            events.contains(&("create", "p2")) && events.contains(&("write", "p2")),
            "{polled}"
        );
        let cursor = polled["cursor"].as_u64().unwrap();
        assert_eq!(cursor, events.len() as u64, "{polled}");
        // The same cursor again: the events kept; past it: nothing new.
        let (_, again) = server.tcp_request(USER1, "GET", &format!("{watcher}?after=0"), None);
        assert_eq!(again["events"], polled["events"]);
        let (_, after) =
            server.tcp_request(USER1, "GET", &format!("{watcher}?after={cursor}"), None);
        assert_eq!(
            (after["events"].clone(), after["cursor"].as_u64()),
            (json!([]), Some(cursor)),
            "{after}"
        );

        // Refused: through a symlink, `..`, missing, a file; another token's.
        for (path, status) in [
            ("etc_link", 400),
            ("../etc", 400),
            ("nope", 404),
            ("w/p1", 400),
        ] {
            let (got, out) = server.tcp_request(
                USER1,
                "POST",
                &format!("{fs_url}/watchers"),
                Some(json!({"path": path})),
            );
            assert_eq!(got, status, "{path}: {out}");
            let (got, out) = server.tcp_curl(
                USER1,
                &[&format!(
                    "http://{}{fs_url}/watch?path={path}",
                    server.tcp_address()
                )],
            );
            assert_eq!(got, status, "{path}: {out}");
        }
        for (method, path, body) in [
            ("GET", format!("{fs_url}/watch?path=w"), None),
            (
                "POST",
                format!("{fs_url}/watchers"),
                Some(json!({"path": "w"})),
            ),
            ("GET", format!("{watcher}?after=0"), None),
            ("DELETE", watcher.clone(), None),
        ] {
            let (status, out) = server.tcp_request(USER2, method, &path, body);
            assert_eq!(
                (status, out["error"].as_str()),
                (404, Some("not_found")),
                "{method} {path}: {out}"
            );
        }

        // The directory removed: its last events, then `ended`.
        run("rm -r w");
        let mut last = Value::Null;
        assert!(
            wait_for(Duration::from_secs(5), || {
                last = server
                    .tcp_request(USER1, "GET", &format!("{watcher}?after={cursor}"), None)
                    .1;
                last["ended"].is_string()
            }),
            "{last}"
        );
        assert!(
            last["events"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["type"] == "remove" && e["name"] == "p1"),
            "{last}"
        );
        assert!(
            last["ended"]
                .as_str()
                .unwrap()
                .contains("/work/w was removed"),
            "{last}"
        );
        assert_eq!(server.tcp_request(USER1, "DELETE", &watcher, None).0, 204);
        assert_eq!(server.tcp_request(USER1, "GET", &watcher, None).0, 404);

        // The session closed under a stream: its last line says so.
        let stream = WatchStream::open(&server, USER1, &format!("{fs_url}/watch"));
        assert_eq!(
            stream.next(Duration::from_secs(10)).unwrap()["type"],
            "start"
        );
        assert_eq!(
            server
                .tcp_request(USER1, "DELETE", &format!("/v1/sessions/{id}"), None)
                .0,
            204
        );
        let lines = stream.until(Duration::from_secs(10), |l| l["type"] == "error");
        let last = lines.last().expect("a last line");
        assert_eq!(
            (&last["type"], &last["error"]),
            (&json!("error"), &json!("not_found")),
            "{lines:?}"
        );
        figures(&server, "watches");
        // The server stopping ends an open stream at once (not at the shutdown's grace).
        let id = new_session(&server, USER1, "bash");
        let stream = WatchStream::open(&server, USER1, &format!("/v1/sessions/{id}/fs/watch"));
        assert_eq!(
            stream.next(Duration::from_secs(10)).unwrap()["type"],
            "start"
        );
        let stopping = Instant::now();
        server.stop();
        assert!(
            stopping.elapsed() < Duration::from_secs(4),
            "{:?}",
            stopping.elapsed()
        );
        let lines = stream.until(Duration::from_secs(5), |l| l["type"] == "error");
        assert_eq!(
            lines.last().map(|l| l["error"].clone()),
            Some(json!("capacity")),
            "{lines:?}"
        );
    });
}

/// The lines of an NDJSON stream read by curl over TCP as they come (a thread per
/// stream), and the curl to kill or wait for.
struct Lines {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<Value>,
}

impl Lines {
    fn open(server: &Server, token: &str, path: &str) -> Lines {
        let mut child = Command::new("curl")
            .args(["-s", "-N", "-H", &format!("Authorization: Bearer {token}")])
            .arg(format!("http://{}{path}", server.tcp_address()))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("curl");
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
                if send.send(value).is_err() {
                    break;
                }
            }
        });
        Lines { child, lines }
    }

    /// The next line that is not a heartbeat, within 20 s.
    fn next(&self) -> Value {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(20 * slowdown()))
                .expect("a line within 20 s");
            if line["type"] != "heartbeat" {
                return line;
            }
        }
    }

    /// Disconnects (kills its curl, which this test started).
    fn close(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process's output stream (NDJSON) from cursors: cut off mid-way and resumed from the
/// last cursors, every line comes exactly once, stderr apart, and the stream ends with
/// the exit record; from the end it gives the exit only. The session's event stream
/// gives each start and exit in order (a process killed by the session's close too),
/// resumes after a `seq` with nothing twice, and ends with `closed`. The audit holds a
/// record of each process with its command, exit code or signal.
#[test]
fn a_process_streams_its_output_and_the_session_its_events() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let id = new_session(&server, USER1, "bash");
        let events = Lines::open(&server, USER1, &format!("/v1/sessions/{id}/events"));
        let first = start_process(
            &server,
            USER1,
            &id,
            json!({"command": "for i in $(seq 40); do echo $i; sleep 0.05; done; echo oops >&2; exit 4",
                   "background": true}),
        );
        let pid = first["process_id"].as_u64().unwrap();
        let path = |from: (u64, u64)| {
            format!(
                "/v1/sessions/{id}/processes/{pid}/stream?stdout_from={}&stderr_from={}",
                from.0, from.1
            )
        };
        // The first connection goes after three output lines.
        let cut = Lines::open(&server, USER1, &path((0, 0)));
        let mut text = String::new();
        let mut cursors = (0, 0);
        let mut given = 0;
        while given < 3 {
            let line = cut.next();
            assert_eq!(line["type"], "stdout", "{line}");
            assert_eq!(line["from"].as_u64(), Some(cursors.0), "{line}");
            assert_eq!(line["dropped"], 0, "{line}");
            text.push_str(line["data"].as_str().unwrap());
            cursors.0 = line["cursor"].as_u64().unwrap();
            given += 1;
        }
        cut.close();
        std::thread::sleep(Duration::from_millis(500));
        // The reconnect: from the cursors, to the exit.
        let resumed = Lines::open(&server, USER1, &path(cursors));
        let mut errors = String::new();
        let exit = loop {
            let line = resumed.next();
            match line["type"].as_str() {
                Some("stdout") => {
                    assert_eq!(line["from"].as_u64(), Some(cursors.0), "{line}");
                    text.push_str(line["data"].as_str().unwrap());
                    cursors.0 = line["cursor"].as_u64().unwrap();
                }
                Some("stderr") => {
                    assert_eq!(line["from"].as_u64(), Some(cursors.1), "{line}");
                    errors.push_str(line["data"].as_str().unwrap());
                    cursors.1 = line["cursor"].as_u64().unwrap();
                }
                Some("exit") => break line,
                _ => panic!("an unexpected line: {line}"),
            }
        };
        let expected: String = (1..=40).map(|i| format!("{i}\n")).collect();
        assert_eq!(text, expected);
        assert_eq!(errors, "oops\n");
        assert_eq!(
            (exit["exit_code"].as_i64(), exit["status"].as_str()),
            (Some(4), Some("exited")),
            "{exit}"
        );
        assert_eq!(exit["stdout_cursor"].as_u64(), Some(cursors.0), "{exit}");
        assert!(exit.get("stdout").is_none(), "{exit}");
        // The curl ends with the stream.
        let status = resumed.child.wait_with_output().unwrap().status;
        assert!(status.success(), "{status}");
        // From the end: the exit line only.
        let end = Lines::open(&server, USER1, &path(cursors));
        assert_eq!(end.next()["type"], "exit");
        end.close();
        // From past the end (a client that means "from now"): what comes after.
        let later = start_process(
            &server,
            USER1,
            &id,
            json!({"command": "sleep 0.5; echo late", "background": true}),
        );
        let later = later["process_id"].as_u64().unwrap();
        let now = Lines::open(
            &server,
            USER1,
            &format!(
                "/v1/sessions/{id}/processes/{later}/stream?stdout_from={}&stderr_from={}",
                u64::MAX,
                u64::MAX
            ),
        );
        let line = now.next();
        assert_eq!(
            (line["type"].as_str(), line["data"].as_str()),
            (Some("stdout"), Some("late\n")),
            "{line}"
        );
        assert_eq!(now.next()["type"], "exit");
        now.close();
        // Someone else's session is not found, nor is a process that is not there.
        let (status, _) = server.tcp_curl(
            USER2,
            &[
                "-s",
                &format!("http://{}{}", server.tcp_address(), path((0, 0))),
            ],
        );
        assert_eq!(status, 404);
        let (status, _) = server.tcp_request(
            USER1,
            "GET",
            &format!("/v1/sessions/{id}/processes/999/stream"),
            None,
        );
        assert_eq!(status, 404);
        // The events so far: its start and its exit.
        let started = events.next();
        assert_eq!(
            (started["type"].as_str(), started["process_id"].as_u64()),
            (Some("started"), Some(pid)),
            "{started}"
        );
        let exited = events.next();
        assert_eq!(
            (exited["type"].as_str(), exited["exit_code"].as_i64()),
            (Some("exited"), Some(4)),
            "{exited}"
        );
        assert_eq!(
            started["seq"].as_u64(),
            Some(exited["seq"].as_u64().unwrap() - 1)
        );
        // The late one's, in order.
        let line = events.next();
        assert_eq!(
            (line["type"].as_str(), line["process_id"].as_u64()),
            (Some("started"), Some(later)),
            "{line}"
        );
        let line = events.next();
        assert_eq!(
            (line["type"].as_str(), line["process_id"].as_u64()),
            (Some("exited"), Some(later)),
            "{line}"
        );
        let seq = line["seq"].as_u64().unwrap();
        // A sleeper that the session's close kills.
        let sleeper = start_process(
            &server,
            USER1,
            &id,
            json!({"command": "sleep 1000", "background": true}),
        );
        let sleeper = sleeper["process_id"].as_u64().unwrap();
        let line = events.next();
        assert_eq!(
            (line["type"].as_str(), line["process_id"].as_u64()),
            (Some("started"), Some(sleeper)),
            "{line}"
        );
        // A reconnect after `seq`: the sleeper's start only.
        let again = Lines::open(
            &server,
            USER1,
            &format!("/v1/sessions/{id}/events?after={seq}"),
        );
        let line = again.next();
        assert_eq!(
            (line["type"].as_str(), line["seq"].as_u64()),
            (Some("started"), Some(seq + 1)),
            "{line}"
        );
        again.close();
        // A stream of the sleeper's output, open when the session closes: its exit.
        let sleeping = Lines::open(
            &server,
            USER1,
            &format!("/v1/sessions/{id}/processes/{sleeper}/stream"),
        );
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            server
                .tcp_request(USER1, "DELETE", &format!("/v1/sessions/{id}"), None)
                .0,
            204
        );
        let line = sleeping.next();
        assert_eq!(
            (line["type"].as_str(), line["signal"].as_i64()),
            (Some("exit"), Some(9)),
            "{line}"
        );
        sleeping.close();
        let line = events.next();
        assert_eq!(
            (
                line["type"].as_str(),
                line["process_id"].as_u64(),
                line["signal"].as_i64()
            ),
            (Some("exited"), Some(sleeper), Some(9)),
            "{line}"
        );
        assert_eq!(events.next()["type"], "closed");
        let status = events.child.wait_with_output().unwrap().status;
        assert!(status.success(), "{status}");
        // The audit: both processes, their commands and ends.
        let (status, list) = server.tcp_request(
            ADMIN,
            "GET",
            &format!("/v1/audit?kind=process&session={id}"),
            None,
        );
        assert_eq!(status, 200, "{list}");
        let records: Vec<Value> = list["records"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|r| {
                let path = format!("/v1/audit/{}", r["id"].as_str().unwrap());
                server.tcp_request(ADMIN, "GET", &path, None).1
            })
            .collect();
        assert_eq!(records.len(), 3, "{list}");
        let of = |needle: &str| {
            records
                .iter()
                .find(|r| r["code"].as_str().is_some_and(|c| c.contains(needle)))
                .unwrap_or_else(|| panic!("no record of {needle}: {list}"))
                .clone()
        };
        let looped = of("seq 40");
        assert_eq!(
            (
                looped["status"].as_str(),
                looped["exit_code"].as_i64(),
                looped["caller"].as_str()
            ),
            (Some("complete"), Some(4), Some("token:user1")),
            "{looped}"
        );
        assert_eq!(
            looped["details"]["process_id"].as_u64(),
            Some(pid),
            "{looped}"
        );
        assert_eq!(looped["stderr"].as_str(), Some("oops\n"), "{looped}");
        let slept = of("sleep 1000");
        assert_eq!(
            (
                slept["status"].as_str(),
                slept["signal"].as_i64(),
                slept["error"].as_str()
            ),
            (Some("complete"), Some(9), Some("session_closed")),
            "{slept}"
        );
        figures(&server, "process streams");
        server.stop();
    });
}

/// The profile's `session.process_buffer` sets what a process keeps per stream: 64K here,
/// so a poll past it counts what it missed (from 0, and from a cursor in the middle), and
/// a poll within it misses nothing; a value out of range is refused by name.
#[test]
fn the_process_buffer_is_the_profiles_and_a_poll_counts_what_it_dropped() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let dir = server.profiles_dir();
        // The caller may use the profile `bash`: this server's is written here.
        std::fs::write(
            dir.join("bash.toml"),
            "language = \"bash\"\n[session]\nprocess_buffer = \"1K\"\n",
        )
        .unwrap();
        let (status, refused) = server.tcp_request(
            USER1,
            "POST",
            "/v1/sessions",
            Some(json!({"language": "bash", "profile": "bash"})),
        );
        assert!(
            status >= 400 && refused.to_string().contains("process_buffer"),
            "{status} {refused}"
        );
        std::fs::write(
            dir.join("bash.toml"),
            "language = \"bash\"\n[session]\nprocess_buffer = \"64K\"\n",
        )
        .unwrap();
        let (status, created) = server.tcp_request(
            USER1,
            "POST",
            "/v1/sessions",
            Some(json!({"language": "bash", "profile": "bash"})),
        );
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        let total: u64 = 1_000_000;
        let out = start_process(
            &server,
            USER1,
            &id,
            json!({"command": format!("yes 0123456789 | head -c {total}; printf END; echo e >&2"),
                   "yield_ms": 30000}),
        );
        assert_eq!(out["status"], "exited", "{}", out["status"]);
        let pid = out["process_id"].as_u64().unwrap();
        let kept = 64u64 << 10;
        let end = total + 3;
        assert_eq!(out["stdout"].as_str().unwrap().len() as u64, kept);
        assert_eq!(
            out["stdout_dropped"].as_u64(),
            Some(end - kept),
            "{}",
            out["stdout_dropped"]
        );
        assert_eq!(out["stderr"], "e\n");
        // From a cursor the buffer no longer holds: the oldest kept, and the count.
        let middle = poll_process(&server, USER1, &id, pid, (500_000, 0));
        assert_eq!(middle["stdout_from"].as_u64(), Some(end - kept));
        assert_eq!(
            middle["stdout_dropped"].as_u64(),
            Some(end - kept - 500_000)
        );
        assert_eq!(middle["stdout_cursor"].as_u64(), Some(end));
        // Within it: every byte since, nothing dropped.
        let near = poll_process(&server, USER1, &id, pid, (end - 1000, 0));
        assert_eq!(near["stdout_dropped"], 0);
        assert_eq!(near["stdout"].as_str().unwrap().len(), 1000);
        assert!(near["stdout"].as_str().unwrap().ends_with("END"));
        figures(&server, "process buffer");
        server.stop();
    });
}

/// `codecage session attach` from a pipe: `cat` (stdin open) gets the lines the CLI
/// reads, echoes them, ends at the end of input (the CLI closes its stdin), and the CLI
/// exits with its status; `--from 0:0` prints what came before too. From a terminal
/// (`script` gives the CLI one) on a process with a pty: raw mode, the keys typed reach
/// Python's REPL, its answer is printed, and C-p C-q detaches, leaving it running.
#[test]
fn session_attach_follows_a_process_and_forwards_its_input() {
    as_root(|| {
        let server = Server::start("", false);
        let (_, created) =
            server.request("POST", "/v1/sessions", Some(json!({"language": "bash"})));
        let id = created["id"].as_str().unwrap().to_string();
        let (_, cat) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/processes"),
            Some(json!({"command": "echo before; cat; exit 5", "stdin": true, "background": true})),
        );
        let pid = cat["process_id"].as_u64().unwrap().to_string();
        let attach = |from: bool, input: &str| {
            let mut cmd = codecage();
            cmd.arg("session")
                .arg("--server")
                .arg(format!("unix:{}", server.socket_path().display()))
                .args(["attach", &id, &pid]);
            if from {
                cmd.args(["--from", "0:0"]);
            }
            let mut child = cmd
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut stdin = child.stdin.take().unwrap();
            std::io::Write::write_all(&mut stdin, input.as_bytes()).unwrap();
            drop(stdin);
            let out = child.wait_with_output().unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).to_string(),
                String::from_utf8_lossy(&out.stderr).to_string(),
            )
        };
        let (code, stdout, stderr) = attach(true, "hello\nbye\n");
        assert_eq!(
            (code, stdout.as_str()),
            (Some(5), "before\nhello\nbye\n"),
            "{stderr}"
        );
        // A process that has ended: nothing new from now, its status.
        let (code, stdout, _) = attach(false, "");
        assert_eq!((code, stdout.as_str()), (Some(5), ""));
        // On a terminal.
        let (_, repl) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/processes"),
            Some(json!({"argv": ["python3", "-i", "-q"], "pty": true, "background": true})),
        );
        let repl = repl["process_id"].as_u64().unwrap();
        let cli = format!(
            "{} session --server unix:{} attach {id} {repl}",
            env!("CARGO_BIN_EXE_codecage"),
            server.socket_path().display()
        );
        let mut child = Command::new("script")
            .args(["-qefc", &cli, "/dev/null"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        std::thread::sleep(Duration::from_millis(1500 * slowdown()));
        std::io::Write::write_all(&mut stdin, b"print(6*7)\r").unwrap();
        std::thread::sleep(Duration::from_millis(1500 * slowdown()));
        std::io::Write::write_all(&mut stdin, &[0x10, 0x11]).unwrap();
        let started = Instant::now();
        let out = loop {
            if let Some(_status) = child.try_wait().unwrap() {
                break child.wait_with_output().unwrap();
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "attach did not detach"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        drop(stdin);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{:?} {stdout}", out.status);
        assert!(stdout.contains("42"), "{stdout:?}");
        assert!(stdout.contains("detached"), "{stdout:?}");
        // The REPL goes on.
        let (_, still) =
            server.request("GET", &format!("/v1/sessions/{id}/processes/{repl}"), None);
        assert_eq!(still["status"], "running", "{still}");
        server.request("DELETE", &format!("/v1/sessions/{id}"), None);
        server.stop();
    });
}

/// The memory a session holds with its three contexts and ten idle background processes
/// (`sleep 1000`), as its cgroup counts it, for the figures; each sleep costs little (a
/// bash and a sleep, their pages mostly shared), and closing the session leaves nothing.
#[test]
fn ten_idle_background_processes_cost_little_memory() {
    as_root(|| {
        let server = Server::start(&tokens(""), true);
        let id = new_session(&server, USER1, "python");
        let server_pid = server.pid();
        let cgroups = || -> Vec<std::path::PathBuf> {
            run_cgroups()
                .into_iter()
                .filter(|(pid, _)| *pid == server_pid)
                .map(|(_, path)| path)
                .collect()
        };
        for (language, code) in [("python", "1"), ("node", "1"), ("bash", "true")] {
            let out = execute_in(&server, &id, language, code, 60);
            assert!(out["error"].is_null(), "{language}: {out}");
        }
        std::thread::sleep(Duration::from_secs(1));
        let three = session_memory(&cgroups());
        for _ in 0..10 {
            let started = start_process(
                &server,
                USER1,
                &id,
                json!({"command": "sleep 1000", "background": true}),
            );
            assert_eq!(started["status"], "running", "{started}");
        }
        std::thread::sleep(Duration::from_secs(1));
        let (_, list) =
            server.tcp_request(USER1, "GET", &format!("/v1/sessions/{id}/processes"), None);
        let running = list
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["status"] == "running")
            .count();
        assert_eq!(running, 10, "{list}");
        let ten = session_memory(&cgroups());
        let each = ten.0.saturating_sub(three.0) / 10;
        eprintln!(
            "figures: a python session with its three contexts: cgroup {} KiB, RSS {} KiB; with ten \
             idle `sleep 1000` processes too: cgroup {} KiB, RSS {} KiB ({} KiB of cgroup each)",
            three.0, three.1, ten.0, ten.1, each
        );
        assert!(three.0 > 0, "no cgroup of the session was found");
        assert!(each < 4096, "{each} KiB a sleeping process");
        assert_eq!(
            server
                .tcp_request(USER1, "DELETE", &format!("/v1/sessions/{id}"), None)
                .0,
            204
        );
        assert!(
            wait_for(Duration::from_secs(10), || cgroups().is_empty()),
            "the session's cgroup was left"
        );
        server.stop();
    });
}
