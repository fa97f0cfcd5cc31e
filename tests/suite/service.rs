//! The server as its clients' attacker would try it (issue 21): sessions owned by their
//! caller, quotas and profiles per token, listeners that half-open connections cannot
//! exhaust, streams that end with their verdict, a client that goes stops its call. Each
//! test prints the server's peak RSS and open fds for the record.

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
            &tokens("max_sessions = 1\n[tokens.limits]\nmemory = \"128M\"\n"),
            true,
        );
        // The built-in ci profile (8G, 4096 pids, 1 h) is not a default token's.
        for token in [USER1, USER2] {
            let (status, out) = server.tcp_request(
                token,
                "POST",
                "/v1/run",
                Some(json!({"profile": "ci", "argv": ["true"]})),
            );
            assert_eq!(
                (status, out["error"].as_str()),
                (403, Some("policy")),
                "{out}"
            );
            assert!(
                out["message"].as_str().unwrap().contains("python, node"),
                "{out}"
            );
            let (status, out) = server.tcp_request(
                token,
                "POST",
                "/v1/sessions",
                Some(json!({"language": "python", "profile": "ci"})),
            );
            assert_eq!(status, 403, "{out}");
        }
        // The admin may.
        let (status, out) = server.tcp_request(
            ADMIN,
            "POST",
            "/v1/run",
            Some(json!({"profile": "ci", "argv": ["true"]})),
        );
        assert_eq!(status, 200, "{out}");
        // Ceilings: above is 403; the profile's default is lowered to the ceiling.
        let (status, out) = server.tcp_request(
            USER2,
            "POST",
            "/v1/run",
            Some(json!({"language": "bash", "code": "true", "memory": "512M"})),
        );
        assert_eq!(status, 403, "{out}");
        assert!(out["message"].as_str().unwrap().contains("memory"), "{out}");
        let (status, out) = server.tcp_request(
            USER2,
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
        // max_sessions = 1: the second is 429 with Retry-After; user1 is not held to it.
        let (status, first) = server.tcp_request(
            USER2,
            "POST",
            "/v1/sessions",
            Some(json!({"language": "bash"})),
        );
        assert_eq!(status, 201, "{first}");
        let url = format!("http://{}/v1/sessions", server.tcp_address());
        let (status, head) = server.tcp_curl(
            USER2,
            &[
                "-i",
                "-X",
                "POST",
                &url,
                "-H",
                "Content-Type: application/json",
                "-d",
                r#"{"language":"bash"}"#,
            ],
        );
        assert_eq!(status, 429, "{head}");
        assert!(head.to_lowercase().contains("retry-after: 1"), "{head}");
        assert!(head.contains("\"quota\""), "{head}");
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
        figures(&server, "profiles and quotas");
        server.stop();
    });
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
        let server = Server::start("[limits]\nheader_timeout = \"2s\"\n", true);
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
            .set_read_timeout(Some(Duration::from_secs(10)))
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
