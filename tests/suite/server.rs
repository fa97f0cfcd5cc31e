//! `codecage serve` driven by real clients: curl over its unix socket and TCP, and the
//! `codecage session` CLI (a hyper client). Each test starts a server of its own on a
//! socket in a temp dir, and the host is checked after it (sessions and runs leave
//! nothing: no process, cgroup, mount, socket file).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::common::*;

pub(super) const TOKEN: &str = "test-token-0123456789abcdef";

/// A server of the test's own.
pub(super) struct Server {
    child: Option<Child>,
    /// Reads the server's log as it comes (a pipe left unread would stall the server after
    /// some 64 KiB of it), and gives it back at the end.
    log: Option<std::thread::JoinHandle<String>>,
    dir: TempDir,
    socket: PathBuf,
    tcp: Option<String>,
}

impl Server {
    /// Starts `codecage serve` with `config` (TOML, without listeners) on a socket in a
    /// temp dir, and on TCP when `tcp`. Its audit log is in the temp dir too
    /// ([`Server::audit_db`]) unless `config` has an `[audit]` section.
    pub(super) fn start(config: &str, tcp: bool) -> Server {
        Server::start_with(codecage(), config, tcp)
    }

    /// [`Server::start`] with `cmd` as the codecage binary (one started in a mount
    /// namespace of the test's own, [`MountNamespace::codecage`]).
    pub(super) fn start_with(mut cmd: Command, config: &str, tcp: bool) -> Server {
        let dir = TempDir::new("serve");
        let socket = dir.path().join("codecage.sock");
        let config_file = dir.path().join("server.toml");
        let profiles = dir.path().join("profiles");
        std::fs::create_dir_all(&profiles).unwrap();
        std::fs::write(
            profiles.join("brief.toml"),
            "language = \"python\"\n[session]\nidle_timeout = \"1s\"\n",
        )
        .unwrap();
        let mut text = format!("profiles_dir = {:?}\n{config}", profiles.to_str().unwrap());
        if !config.contains("[audit]") {
            let db = dir.path().join("audit").join("audit.db");
            text.push_str(&format!("\n[audit]\npath = {:?}\n", db.to_str().unwrap()));
        }
        // No warm pool unless the test asks for one: its sandboxes would cost every test.
        if !config.contains("[pool]") {
            text.push_str("\n[pool]\nruns = {}\nsessions = {}\n");
        }
        if tcp {
            text.push_str(&format!(
                "\n[[tokens]]\nname = \"tests\"\ntoken = \"{TOKEN}\"\n"
            ));
        }
        std::fs::write(&config_file, text).unwrap();
        cmd.args(["serve", "--config", config_file.to_str().unwrap()])
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()));
        let port = tcp.then(free_port);
        if let Some(port) = port {
            cmd.arg("--listen").arg(format!("127.0.0.1:{port}"));
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .launch();
        let mut stderr = child.stderr.take().unwrap();
        let log = std::thread::spawn(move || {
            let mut log = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut log);
            log
        });
        let server = Server {
            child: Some(child),
            log: Some(log),
            dir,
            socket,
            tcp: port.map(|p| format!("127.0.0.1:{p}")),
        };
        assert!(
            wait_for(Duration::from_secs(10 * slowdown()), || {
                server.curl(&["-s", "http://codecage/healthz"]).1 == "ok\n"
            }),
            "the server did not come up"
        );
        server
    }

    /// The server's profiles directory (`profiles_dir`): a profile written there is used
    /// by the next request that names it.
    pub(super) fn profiles_dir(&self) -> PathBuf {
        self.dir.path().join("profiles")
    }

    /// The unix socket.
    pub(super) fn socket_path(&self) -> PathBuf {
        self.socket.clone()
    }

    /// The audit database of a server whose config did not name one.
    pub(super) fn audit_db(&self) -> PathBuf {
        self.dir.path().join("audit").join("audit.db")
    }

    /// The TCP listener's HOST:PORT (a server started with `tcp`).
    pub(super) fn tcp_address(&self) -> String {
        self.tcp.clone().expect("a server with a TCP listener")
    }

    /// curl over the socket; returns (HTTP status, body).
    pub(super) fn curl(&self, args: &[&str]) -> (u16, String) {
        let out = Command::new("curl")
            .args(["-s", "-o", "-", "-w", "\n%{http_code}", "--unix-socket"])
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("curl");
        split_status(&out.stdout)
    }

    /// A JSON request over the socket.
    pub(super) fn request(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("http://codecage{path}");
        let mut args = vec!["-X", method, url.as_str()];
        let text = body.map(|b| b.to_string());
        if let Some(text) = &text {
            args.extend(["-H", "Content-Type: application/json", "-d", text.as_str()]);
        }
        let (status, body) = self.curl(&args);
        (
            status,
            serde_json::from_str(&body).unwrap_or(Value::String(body)),
        )
    }

    /// curl over the TCP listener with `token`; returns (HTTP status, body).
    pub(super) fn tcp_curl(&self, token: &str, args: &[&str]) -> (u16, String) {
        let out = Command::new("curl")
            .args(["-s", "-o", "-", "-w", "\n%{http_code}"])
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .args(args)
            .output()
            .expect("curl");
        split_status(&out.stdout)
    }

    /// A JSON request over TCP with `token`.
    pub(super) fn tcp_request(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let url = format!("http://{}{path}", self.tcp_address());
        let mut args = vec!["-X", method, url.as_str()];
        let text = body.map(|b| b.to_string());
        if let Some(text) = &text {
            args.extend(["-H", "Content-Type: application/json", "-d", text.as_str()]);
        }
        let (status, body) = self.tcp_curl(token, &args);
        (
            status,
            serde_json::from_str(&body).unwrap_or(Value::String(body)),
        )
    }

    /// The server's peak RSS (KiB, VmHWM) and open fds now, for the findings' figures.
    pub(super) fn footprint(&self) -> (u64, usize) {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        let hwm = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        let fds = std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0);
        (hwm, fds)
    }

    /// The server's fd count once it has not changed for 300 ms (at most 10 s).
    pub(super) fn settled_fds(&self) -> usize {
        let end = Instant::now() + Duration::from_secs(10);
        let mut last = self.footprint().1;
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = self.footprint().1;
            if now == last || Instant::now() > end {
                return now;
            }
            last = now;
        }
    }

    pub(super) fn session_cli(&self, args: &[&str]) -> (i32, String, String) {
        let out = codecage()
            .arg("session")
            .arg("--server")
            .arg(format!("unix:{}", self.socket.display()))
            .args(args)
            .launch_output();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    }

    /// The server's pid.
    pub(super) fn pid(&self) -> u32 {
        self.child.as_ref().expect("a running server").id()
    }

    /// SIGKILL, as a crash: nothing of the server runs its shutdown.
    pub(super) fn kill9(mut self) {
        let mut child = self.child.take().unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }

    /// SIGTERM, and the server must be gone with everything it made.
    pub(super) fn stop(mut self) -> String {
        let child = self.child.take().unwrap();
        terminate(child, &self.socket, self.log.take())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let _ = terminate(child, &self.socket, self.log.take());
        }
        let _ = &self.dir;
    }
}

fn terminate(
    mut child: Child,
    socket: &Path,
    log: Option<std::thread::JoinHandle<String>>,
) -> String {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let end = Instant::now() + Duration::from_secs(30 * slowdown());
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if Instant::now() > end {
            let _ = child.kill();
            break child.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = log.and_then(|l| l.join().ok()).unwrap_or_default();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "the server did not stop cleanly: {log}"
    );
    assert!(!socket.exists(), "the socket file was left");
    log
}

pub(super) fn split_status(out: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(out).to_string();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.trim().parse().unwrap_or(0), body.to_string())
}

/// A TCP port for a server under test that no other test takes meanwhile, by
/// construction: below the kernel's ephemeral range (32768 and up: no socket bound to port
/// 0, no client's source port gets it), held by this test process with a lock (flock on a
/// file per port, released when the process ends), and free when chosen.
pub(super) fn free_port() -> u16 {
    let locks = std::env::temp_dir().join("codecage-test-ports");
    std::fs::create_dir_all(&locks).unwrap();
    let start = std::process::id() as usize * 7919
        + std::time::SystemTime::UNIX_EPOCH
            .elapsed()
            .unwrap()
            .subsec_nanos() as usize;
    for i in 0..12000 {
        let port = 20000 + ((start + i) % 12000) as u16;
        let file = std::fs::File::create(locks.join(port.to_string())).unwrap();
        use nix::fcntl::{Flock, FlockArg};
        if let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                // Held until this test process ends.
                std::mem::forget(lock);
                return port;
            }
        }
    }
    panic!("no free TCP port in 20000-31999");
}

/// The server keeps connections under its fd limit by counting what each sandbox holds
/// (src/server/listen.rs `FDS_PER_SANDBOX`, 28): a session with all three language contexts
/// holds no more than that, and gives every one back when it is closed.
/// A server whose stderr has no reader any more (journald restarted, the pipe it logged
/// into closed) goes on serving, and stops cleanly on SIGTERM: each line it cannot log is
/// dropped. (tracing-subscriber reported such a line with `eprintln!`, which panicked on
/// the same broken stderr: the main thread died as it logged its shutdown, exit 101, and
/// left its socket.)
#[test]
fn a_server_whose_log_is_gone_serves_and_stops_cleanly() {
    as_root(|| {
        let dir = TempDir::new("nolog");
        let socket = dir.path().join("codecage.sock");
        let config = dir.path().join("server.toml");
        std::fs::write(
            &config,
            format!(
                "[audit]\npath = {:?}\n[pool]\nruns = {{}}\nsessions = {{}}\n",
                dir.path().join("audit.db")
            ),
        )
        .unwrap();
        let mut child = codecage()
            .args(["serve", "--config", config.to_str().unwrap(), "--listen"])
            .arg(format!("unix:{}", socket.display()))
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .launch();
        drop(child.stderr.take());
        assert!(
            wait_for(Duration::from_secs(10 * slowdown()), || socket.exists()),
            "the server did not come up"
        );
        let out = Command::new("curl")
            .args([
                "-s",
                "--unix-socket",
                socket.to_str().unwrap(),
                "-X",
                "POST",
            ])
            .args(["-H", "Content-Type: application/json", "-d"])
            .arg(json!({"language": "bash", "code": "echo hi"}).to_string())
            .arg("http://codecage/v1/run")
            .output()
            .unwrap();
        let body: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("no answer: {}", String::from_utf8_lossy(&out.stdout)));
        assert_eq!(body["stdout"], "hi\n", "{body}");
        let _ = terminate(child, &socket, None);
    });
}

#[test]
fn a_session_holds_at_most_its_share_of_the_servers_fds() {
    const FDS_PER_SANDBOX: usize = 28;
    as_root(|| {
        let server = Server::start("[pool]\nruns = {}\nsessions = {}\n", false);
        // The baseline once it holds still: the server's end of the readiness check's
        // connection may still be open for a moment (CI once counted it, 19 fds before
        // and 18 after).
        let before = server.settled_fds();
        let (status, body) =
            server.request("POST", "/v1/sessions", Some(json!({"language": "python"})));
        assert_eq!(status, 201, "{body}");
        let id = body["id"].as_str().unwrap().to_string();
        for (language, code) in [("python", "1 + 1"), ("bash", "true"), ("node", "1 + 1")] {
            let (status, out) = server.request(
                "POST",
                &format!("/v1/sessions/{id}/execute"),
                Some(json!({"language": language, "code": code})),
            );
            assert_eq!(
                (status, &out["error"]),
                (200, &Value::Null),
                "{language}: {out}"
            );
        }
        let (_, during) = server.footprint();
        assert!(
            during - before <= FDS_PER_SANDBOX,
            "a session with three contexts holds {} fds of the server, more than the {FDS_PER_SANDBOX} counted",
            during - before
        );
        let (status, _) = server.request("DELETE", &format!("/v1/sessions/{id}"), None);
        assert_eq!(status, 204);
        // The session's teardown may finish after the answer.
        wait_for(Duration::from_secs(10), || server.footprint().1 == before);
        let (_, after) = server.footprint();
        assert_eq!(after, before, "fds left by a closed session");
        eprintln!("figures: server fds {before}, with a session of three contexts {during}, after {after}");
    });
}

#[test]
fn a_run_through_the_api_is_the_same_object_as_run_json() {
    as_root(|| {
        let server = Server::start("", false);
        let (status, body) = server.request(
            "POST",
            "/v1/run",
            Some(json!({"language": "bash", "code": "echo hi; exit 3", "timeout": "10s", "memory": "64M"})),
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["stdout"], "hi\n");
        assert_eq!(body["exit_code"], 3);
        let cli = run_json(&["--lang", "bash", "-c", "echo hi; exit 3"]);
        let mut api_keys: Vec<&String> = body.as_object().unwrap().keys().collect();
        let mut cli_keys: Vec<&String> = cli.json.as_object().unwrap().keys().collect();
        api_keys.sort();
        cli_keys.sort();
        assert_eq!(api_keys, cli_keys);
        // A timeout is a verdict: 200, with the verdict in the body.
        let (status, body) = server.request(
            "POST",
            "/v1/run",
            Some(json!({"language": "bash", "code": "sleep 30", "timeout": secs(1)})),
        );
        assert_eq!(
            (status, body["error"].as_str()),
            (200, Some("timeout")),
            "{body}"
        );
        server.stop();
    });
}

#[test]
fn bad_requests_are_400_naming_the_field_and_policy_is_403() {
    as_root(|| {
        let server = Server::start("", false);
        for (body, needle) in [
            (json!({"language": "cobol", "code": "x"}), "language"),
            (json!({"language": "python", "code": 5}), "code"),
            (
                json!({"language": "python", "code": "1", "colour": 1}),
                "colour",
            ),
            (
                json!({"language": "python", "code": "1", "memory": "12Q"}),
                "memory",
            ),
            (
                json!({"language": "python", "code": "1", "profile": "/etc/x.toml"}),
                "profile",
            ),
            (
                json!({"language": "python", "code": "1", "rootfs": "/"}),
                "rootfs",
            ),
        ] {
            let (status, answer) = server.request("POST", "/v1/run", Some(body.clone()));
            assert_eq!(status, 400, "{body} -> {answer}");
            assert_eq!(answer["error"], "invalid_request");
            assert!(
                answer["message"].as_str().unwrap().contains(needle),
                "{body} -> {answer}"
            );
        }
        let (status, answer) =
            server.curl(&["-X", "POST", "http://codecage/v1/run", "-d", "{not json"]);
        assert_eq!(status, 400, "{answer}");
        let (status, answer) = server.request(
            "POST",
            "/v1/run",
            Some(json!({"language": "python", "code": "1", "memory": "8G"})),
        );
        assert_eq!(status, 403, "{answer}");
        assert_eq!(answer["error"], "policy");
        server.stop();
    });
}

#[test]
fn a_body_over_the_cap_is_413() {
    as_root(|| {
        let server = Server::start("[limits]\nmax_body = \"64K\"\n", false);
        let big = json!({"language": "python", "code": "#".repeat(100_000)});
        let (status, answer) = server.request("POST", "/v1/run", Some(big));
        assert_eq!(status, 413, "{answer}");
        server.stop();
    });
}

#[test]
fn tcp_needs_the_token() {
    as_root(|| {
        let server = Server::start("", true);
        let tcp = server.tcp.clone().unwrap();
        let curl = |extra: &[&str]| {
            let out = Command::new("curl")
                .args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", "POST"])
                .arg(format!("http://{tcp}/v1/run"))
                .args(["-H", "Content-Type: application/json"])
                .args(["-d", r#"{"language":"bash","code":"echo tcp"}"#])
                .args(extra)
                .output()
                .unwrap();
            split_status(&out.stdout)
        };
        assert_eq!(curl(&[]).0, 401);
        assert_eq!(
            curl(&["-H", "Authorization: Bearer wrong-token-0123456789"]).0,
            401
        );
        let (status, body) = curl(&["-H", &format!("Authorization: Bearer {TOKEN}")]);
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("\"stdout\":\"tcp\\n\""), "{body}");
        // A 401 names the scheme to use (RFC 6750), and says when the token given was bad.
        let head = |extra: &[&str]| {
            let out = Command::new("curl")
                .args(["-s", "-o", "/dev/null", "-D", "-"])
                .arg(format!("http://{tcp}/v1/sessions"))
                .args(extra)
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).to_lowercase()
        };
        let none = head(&[]);
        assert!(none.starts_with("http/1.1 401"), "{none}");
        assert!(
            none.contains("\r\nwww-authenticate: bearer realm=\"codecage\"\r\n"),
            "{none}"
        );
        let wrong = head(&["-H", "Authorization: Bearer wrong-token-0123456789"]);
        assert!(
            wrong.contains(
                "\r\nwww-authenticate: bearer realm=\"codecage\", error=\"invalid_token\"\r\n"
            ),
            "{wrong}"
        );
        server.stop();
    });
}

/// One sandbox allowed: a second request waits the queue timeout, then gets 503 with
/// Retry-After; the first finishes normally; none is lost or hangs.
#[test]
fn past_the_cap_a_request_gets_503_with_retry_after() {
    as_root(|| {
        let server = Server::start(
            "[limits]\nmax_sandboxes = 1\nqueue_timeout = \"1s\"\n",
            false,
        );
        let socket = server.socket.clone();
        let long = std::thread::spawn(move || {
            Command::new("curl")
                .args([
                    "-s",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    "--unix-socket",
                ])
                .arg(&socket)
                .args(["-X", "POST", "http://codecage/v1/run", "-d"])
                .arg(
                    json!({"language": "bash", "code": "sleep 3", "timeout": secs(20)}).to_string(),
                )
                .output()
                .unwrap()
        });
        std::thread::sleep(Duration::from_millis(500 * slowdown()));
        let out = Command::new("curl")
            .args(["-s", "-D", "-", "-o", "/dev/null", "--unix-socket"])
            .arg(&server.socket)
            .args(["-X", "POST", "http://codecage/v1/run", "-d"])
            .arg(json!({"language": "bash", "code": "true"}).to_string())
            .output()
            .unwrap();
        let headers = String::from_utf8_lossy(&out.stdout).to_lowercase();
        assert!(headers.starts_with("http/1.1 503"), "{headers}");
        assert!(headers.contains("retry-after: 1"), "{headers}");
        let first = long.join().unwrap();
        assert_eq!(String::from_utf8_lossy(&first.stdout), "200");
        server.stop();
    });
}

#[test]
fn sessions_over_curl_keep_state_and_stream_events() {
    as_root(|| {
        let server = Server::start("", false);
        let (status, created) = server.request(
            "POST",
            "/v1/sessions",
            Some(json!({"language": "python", "memory": "512M"})),
        );
        assert_eq!(status, 201, "{created}");
        for key in [
            "id",
            "language",
            "created_at",
            "expires_at",
            "idle_timeout_s",
        ] {
            assert!(created.get(key).is_some(), "{created} lacks {key}");
        }
        let id = created["id"].as_str().unwrap().to_string();
        let execute = format!("/v1/sessions/{id}/execute");
        let (_, out) = server.request("POST", &execute, Some(json!({"code": "x = 41"})));
        assert_eq!(out["error"], Value::Null, "{out}");
        let (status, out) = server.request("POST", &execute, Some(json!({"code": "x + 1"})));
        assert_eq!(status, 200);
        assert_eq!(out["result"]["text/plain"], "42", "{out}");
        // Streaming: stdout events as they come, then the result.
        let body = json!({"code": "import time\nfor i in range(3): print(i, flush=True); time.sleep(0.05)\ni"});
        let (_, lines) = server.curl(&[
            "-X",
            "POST",
            &format!("http://codecage{execute}"),
            "-H",
            "Accept: application/x-ndjson",
            "-d",
            &body.to_string(),
        ]);
        let events: Vec<Value> = lines
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert!(
            types.iter().filter(|t| **t == "stdout").count() >= 1,
            "{types:?}"
        );
        assert_eq!(types.last(), Some(&"result"), "{types:?}");
        assert_eq!(events.last().unwrap()["result"]["text/plain"], "2");
        // Reset, interrupt, list, get, delete; then 404 for the closed id.
        assert_eq!(
            server
                .request("POST", &format!("/v1/sessions/{id}/reset"), None)
                .0,
            204
        );
        let (_, out) = server.request("POST", &execute, Some(json!({"code": "'x' in dir()"})));
        assert_eq!(out["result"]["text/plain"], "False", "{out}");
        assert_eq!(
            server
                .request("POST", &format!("/v1/sessions/{id}/interrupt"), None)
                .0,
            204
        );
        let (_, list) = server.request("GET", "/v1/sessions", None);
        assert_eq!(list.as_array().unwrap().len(), 1);
        assert_eq!(
            server.request("GET", &format!("/v1/sessions/{id}"), None).0,
            200
        );
        assert_eq!(
            server
                .request("DELETE", &format!("/v1/sessions/{id}"), None)
                .0,
            204
        );
        let (status, gone) = server.request("POST", &execute, Some(json!({"code": "1"})));
        assert_eq!(
            (status, gone["error"].as_str()),
            (404, Some("not_found")),
            "{gone}"
        );
        server.stop();
    });
}

#[test]
fn a_second_call_while_one_runs_is_409() {
    as_root(|| {
        let server = Server::start("", false);
        let (_, created) =
            server.request("POST", "/v1/sessions", Some(json!({"language": "bash"})));
        let id = created["id"].as_str().unwrap().to_string();
        let socket = server.socket.clone();
        let path = format!("http://codecage/v1/sessions/{id}/execute");
        let first = std::thread::spawn(move || {
            Command::new("curl")
                .args(["-s", "--unix-socket"])
                .arg(&socket)
                .args([
                    "-X",
                    "POST",
                    &path,
                    "-d",
                    r#"{"code":"sleep 2; echo done"}"#,
                ])
                .output()
                .unwrap()
        });
        std::thread::sleep(Duration::from_millis(500 * slowdown()));
        let (status, busy) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"code": "true"})),
        );
        assert_eq!(
            (status, busy["error"].as_str()),
            (409, Some("busy")),
            "{busy}"
        );
        let first: Value = serde_json::from_slice(&first.join().unwrap().stdout).unwrap();
        assert_eq!(first["stdout"], "done\n", "{first}");
        server.stop();
    });
}

#[test]
fn the_idle_timeout_reclaims_a_session_and_its_id_says_expired() {
    as_root(|| {
        let server = Server::start("", false);
        let (status, created) = server.request(
            "POST",
            "/v1/sessions",
            Some(json!({"language": "python", "profile": "brief"})),
        );
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        assert!(
            wait_for(Duration::from_secs(10 * slowdown()), || {
                server.request("GET", &format!("/v1/sessions/{id}"), None).0 == 404
            }),
            "the session was not reclaimed"
        );
        let (_, gone) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"code": "1"})),
        );
        assert_eq!(gone["error"], "session_expired", "{gone}");
        // Nothing of it is left (the harness checks cgroups after the test; processes here).
        assert!(host_pids_with("codecage __sandbox-init").len() < 64);
        server.stop();
    });
}

#[test]
fn sessions_from_the_shell() {
    as_root(|| {
        let server = Server::start("", false);
        let (status, out, err) = server.session_cli(&["create", "--lang", "python"]);
        assert_eq!(status, 0, "{err}");
        let id = out.lines().last().unwrap().to_string();
        assert_eq!(server.session_cli(&["exec", &id, "-c", "x = 41"]).0, 0);
        let (status, out, _) = server.session_cli(&["exec", &id, "-c", "x + 1"]);
        assert_eq!((status, out.as_str()), (0, "42\n"));
        let (status, _, err) = server.session_cli(&["exec", &id, "-c", "1/0"]);
        assert_eq!(status, 1, "{err}");
        assert!(err.contains("ZeroDivisionError"), "{err}");
        let (status, out, _) = server.session_cli(&["exec", &id, "--json", "-c", "print('j')"]);
        assert_eq!(status, 0);
        assert_eq!(
            serde_json::from_str::<Value>(&out).unwrap()["stdout"],
            "j\n"
        );
        assert_eq!(server.session_cli(&["reset", &id]).0, 0);
        assert_eq!(server.session_cli(&["interrupt", &id]).0, 0);
        let (_, list, _) = server.session_cli(&["list"]);
        assert!(list.contains(&id), "{list}");
        assert_eq!(server.session_cli(&["close", &id]).0, 0);
        let (status, _, err) = server.session_cli(&["exec", &id, "-c", "1"]);
        assert_eq!(status, 1, "{err}");
        server.stop();
        // No server: the message says how to start one.
        let out = codecage()
            .args([
                "session",
                "--server",
                "unix:/nonexistent/codecage.sock",
                "list",
            ])
            .launch_output();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("codecage serve"), "{err}");
    });
}

/// `codecage session stat|mkdir|mv|rm` and `ls --depth` on a session's /work; refusals
/// print the server's message and exit 1 (missing, in the way) or 125 (a bad path).
#[test]
fn a_sessions_work_from_the_shell() {
    as_root(|| {
        let server = Server::start("", false);
        let (status, out, err) = server.session_cli(&["create", "--lang", "bash"]);
        assert_eq!(status, 0, "{err}");
        let id = out.lines().last().unwrap().to_string();
        let cli = |args: &[&str]| {
            let mut all = vec![args[0], id.as_str()];
            all.extend(&args[1..]);
            server.session_cli(&all)
        };
        let (status, out, err) = cli(&["mkdir", "a/b"]);
        assert_eq!((status, out.as_str()), (0, "made /work/a/b\n"), "{err}");
        assert_eq!(cli(&["mkdir", "/work/a/b"]).1, "/work/a/b was there\n");
        assert_eq!(
            cli(&["exec", "-c", "printf 12345 > a/b/f; ln -s /etc a/etc"]).0,
            0
        );
        let (status, out, err) = cli(&["stat", "a/b/f"]);
        assert_eq!(status, 0, "{err}");
        assert!(
            out.starts_with("-rw-r--r-- sandbox  sandbox           5  "),
            "{out}"
        );
        assert!(out.ends_with("  /work/a/b/f\n"), "{out}");
        assert!(cli(&["stat", "a/etc"]).1.ends_with("/work/a/etc -> /etc\n"));
        let (_, out, _) = cli(&["ls", "a", "--depth", "2", "--json"]);
        let paths: Vec<String> = serde_json::from_str::<Vec<Value>>(&out)
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(paths, ["/work/a/b", "/work/a/b/f", "/work/a/etc"]);
        assert_eq!(cli(&["mv", "a/b/f", "g"]).0, 0);
        assert_eq!(cli(&["exec", "-c", "echo x > h"]).0, 0);
        let (status, _, err) = cli(&["mv", "g", "h"]);
        assert_eq!(status, 1, "{err}");
        assert!(
            err.contains("/work/h exists") && err.contains("HTTP 409"),
            "{err}"
        );
        assert_eq!(cli(&["mv", "--force", "g", "h"]).0, 0);
        let (status, _, err) = cli(&["rm", "a/etc/passwd"]);
        assert_eq!(status, 125, "{err}");
        assert!(
            err.contains("/work/a/etc is a symlink, which is not followed"),
            "{err}"
        );
        let (status, _, err) = cli(&["stat", "../etc"]);
        assert!(status == 125 && err.contains("`..`"), "{err}");
        assert_eq!(cli(&["rm", "a"]).0, 0);
        let (status, _, err) = cli(&["stat", "a"]);
        assert!(
            status == 1 && err.contains("/work/a does not exist"),
            "{err}"
        );
        assert_eq!(cli(&["exec", "-c", "ls; cat h"]).1, "h\n12345");
        // watch: the events as they come, until --count.
        std::thread::scope(|scope| {
            let watching = scope.spawn(|| cli(&["watch", "--count", "1", "--seconds", "20"]));
            std::thread::sleep(Duration::from_millis(1500));
            assert_eq!(cli(&["exec", "-c", "echo > z"]).0, 0);
            let (status, out, err) = watching.join().unwrap();
            assert_eq!((status, out.as_str()), (0, "create /work/z\n"), "{err}");
            assert!(err.contains("watching /work"), "{err}");
        });
        server.stop();
    });
}

/// Behind a cluster's router (deploy/kubernetes/README.md, "Routing"): a session's id
/// carries the route its creator sent and this server's node; a create without the route
/// header is refused, naming it; an id of another node is `session_lost` (410) naming that
/// node, an unknown id of this node still `not_found`; the CLI sends the route itself.
#[test]
fn session_ids_carry_their_route_and_node_behind_a_router() {
    as_root(|| {
        let server = Server::start(
            "[cluster]\nroute_header = \"X-Codecage-Route\"\nnode = \"node-a\"\n",
            false,
        );
        let body = r#"{"language":"bash"}"#;
        let create = |route: Option<&str>| {
            let header = route.map(|r| format!("X-Codecage-Route: {r}"));
            let mut args = vec!["-X", "POST", "http://codecage/v1/sessions"];
            if let Some(h) = &header {
                args.extend(["-H", h.as_str()]);
            }
            args.extend(["-H", "Content-Type: application/json", "-d", body]);
            let (status, text) = server.curl(&args);
            (
                status,
                serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text)),
            )
        };
        let (status, v) = create(Some("00ff00ff00ff00ff"));
        assert_eq!(status, 201, "{v}");
        let id = v["id"].as_str().unwrap().to_string();
        let fields: Vec<&str> = id.split('.').collect();
        assert_eq!(fields.len(), 3, "{id}");
        assert_eq!(&fields[..2], ["00ff00ff00ff00ff", "node-a"], "{id}");
        assert_eq!(fields[2].len(), 32, "{id}");
        let (status, v) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(serde_json::json!({"code": "echo routed"})),
        );
        assert_eq!(
            (status, v["stdout"].as_str()),
            (200, Some("routed\n")),
            "{v}"
        );
        let (status, v) = create(None);
        assert_eq!(
            (status, v["error"].as_str()),
            (400, Some("invalid_request")),
            "{v}"
        );
        assert!(
            v["message"].as_str().unwrap().contains("X-Codecage-Route"),
            "{v}"
        );
        let (status, v) = create(Some("NOT-A-ROUTE"));
        assert_eq!(status, 400, "{v}");
        assert!(
            v["message"].as_str().unwrap().contains("16 lowercase hex"),
            "{v}"
        );
        let local = "0123456789abcdef0123456789abcdef";
        let (status, v) = server.request(
            "POST",
            &format!("/v1/sessions/00ff00ff00ff00ff.node-b.{local}/execute"),
            Some(serde_json::json!({"code": "true"})),
        );
        assert_eq!(
            (status, v["error"].as_str()),
            (410, Some("session_lost")),
            "{v}"
        );
        assert!(
            v["message"].as_str().unwrap().contains("node node-b"),
            "{v}"
        );
        let (status, v) = server.request(
            "GET",
            &format!("/v1/sessions/00ff00ff00ff00ff.node-a.{local}"),
            None,
        );
        assert_eq!(
            (status, v["error"].as_str()),
            (404, Some("not_found")),
            "{v}"
        );
        // The CLI draws a route for a create and takes it from the id afterwards.
        let (status, out, err) = server.session_cli(&["create", "--lang", "bash"]);
        assert_eq!(status, 0, "{err}");
        let cli_id = out.lines().last().unwrap().to_string();
        assert!(cli_id.split('.').nth(1) == Some("node-a"), "{cli_id}");
        let (status, out, err) = server.session_cli(&["exec", &cli_id, "-c", "echo from-cli"]);
        assert_eq!((status, out.as_str()), (0, "from-cli\n"), "{err}");
        for id in [&id, &cli_id] {
            assert_eq!(server.session_cli(&["close", id]).0, 0);
        }
        server.stop();
    });
}

/// A program on a terminal from the shell (issue 24): `exec --pty --background`, then
/// `send-keys` types into it and `screen` shows what a person would see; `C-d` ends it.
#[test]
fn a_terminal_from_the_shell() {
    as_root(|| {
        let server = Server::start("", false);
        let (status, out, err) = server.session_cli(&["create", "--lang", "bash"]);
        assert_eq!(status, 0, "{err}");
        let id = out.lines().last().unwrap().to_string();
        let (status, out, err) = server.session_cli(&[
            "exec",
            &id,
            "--pty",
            "60x10",
            "--background",
            "--",
            "python3",
            "-i",
            "-q",
        ]);
        assert_eq!((status, out.trim()), (0, "1"), "{err}");
        let screen_until = |what: &str| {
            let deadline = Instant::now() + Duration::from_secs(30 * slowdown());
            loop {
                let (status, screen, err) = server.session_cli(&["screen", &id, "1"]);
                assert_eq!(status, 0, "{err}");
                if screen.contains(what) || Instant::now() > deadline {
                    return screen;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        };
        assert!(screen_until(">>>").starts_with(">>>"));
        let (status, _, err) =
            server.session_cli(&["send-keys", &id, "1", "--text", "print(6*7)", "--submit"]);
        assert_eq!(status, 0, "{err}");
        let screen = screen_until("\n42\n");
        assert_eq!(screen, ">>> print(6*7)\n42\n>>>\n", "{screen}");
        let (status, json_screen, _) = server.session_cli(&["screen", &id, "1", "--json"]);
        assert_eq!(status, 0);
        let v: Value = serde_json::from_str(&json_screen).unwrap();
        assert_eq!(
            v["size"],
            serde_json::json!({"cols": 60, "rows": 10}),
            "{v}"
        );
        let (status, _, err) = server.session_cli(&["send-keys", &id, "1", "Nope"]);
        assert_eq!(status, 125, "{err}");
        assert!(err.contains("Nope"), "{err}");
        assert_eq!(server.session_cli(&["send-keys", &id, "1", "C-d"]).0, 0);
        let (status, _, err) = server.session_cli(&["logs", &id, "1", "--follow"]);
        assert_eq!(status, 0, "{err}");
        assert_eq!(server.session_cli(&["close", &id]).0, 0);
        server.stop();
    });
}

/// Commands beside a session's interpreter from the shell (issue 24): `exec --background`
/// then `logs --follow` gives a build-like command's every line exactly once and exits with
/// its status; `ps` lists it; a command that ends is its output and status; one that goes
/// on after --yield-ms says how to follow it; `kill` ends it, with or without --signal.
#[test]
fn commands_in_the_background_from_the_shell() {
    as_root(|| {
        let server = Server::start("", false);
        let (status, out, err) = server.session_cli(&["create", "--lang", "bash"]);
        assert_eq!(status, 0, "{err}");
        let id = out.lines().last().unwrap().to_string();
        let build = "for i in $(seq 30); do echo $i; sleep 0.2; done";
        let (status, out, err) = server.session_cli(&["exec", &id, "--background", "--", build]);
        assert_eq!((status, out.as_str()), (0, "1\n"), "{err}");
        assert!(
            err.contains(&format!("codecage session logs {id} 1 --follow")),
            "{err}"
        );
        let (status, ps, err) = server.session_cli(&["ps", &id]);
        assert_eq!(status, 0, "{err}");
        let row = ps.lines().nth(1).unwrap_or_default().to_string();
        assert!(row.contains("running") && row.contains("seq 30"), "{ps}");
        let started = Instant::now();
        let (status, out, err) = server.session_cli(&["logs", &id, "1", "--follow"]);
        let expected: String = (1..=30).map(|i| format!("{i}\n")).collect();
        assert_eq!((status, out.as_str()), (0, expected.as_str()), "{err}");
        assert!(started.elapsed() > Duration::from_secs(2), "it followed");
        let (_, ps, _) = server.session_cli(&["ps", &id]);
        assert!(ps.contains("exited 0"), "{ps}");
        // An argv that ends: its output and its status.
        let (status, out, err) = server.session_cli(&[
            "exec",
            &id,
            "--cwd",
            "/tmp",
            "--env",
            "WHO=me",
            "--",
            "sh",
            "-c",
            "pwd; echo $WHO; echo oops >&2; exit 3",
        ]);
        assert_eq!((status, out.as_str()), (3, "/tmp\nme\n"), "{err}");
        assert!(err.contains("oops"), "{err}");
        // One that goes on: its output so far, and where to follow it from.
        let (status, out, err) = server.session_cli(&[
            "exec",
            &id,
            "--yield-ms",
            "500",
            "--",
            "echo first; sleep 100",
        ]);
        assert_eq!((status, out.as_str()), (0, "first\n"), "{err}");
        assert!(
            err.contains(&format!("logs {id} 3 --follow --from 6:0")),
            "{err}"
        );
        assert_eq!(server.session_cli(&["kill", &id, "3"]).0, 0);
        let (status, out, _) = server.session_cli(&["logs", &id, "3", "--follow", "--from", "6:0"]);
        assert_eq!((status, out.as_str()), (128 + 9, ""));
        let (status, out, err) =
            server.session_cli(&["exec", &id, "--background", "--", "sleep 100"]);
        assert_eq!((status, out.as_str()), (0, "4\n"), "{err}");
        let (status, _, err) = server.session_cli(&["kill", &id, "4", "--signal", "TERM"]);
        assert_eq!(status, 0, "{err}");
        let (status, _, _) = server.session_cli(&["logs", &id, "4", "--follow"]);
        assert_eq!(status, 128 + 15);
        // What was wrong, said.
        let (status, _, err) = server.session_cli(&["kill", &id, "99"]);
        assert_eq!(status, 1, "{err}");
        assert!(err.contains("no process 99"), "{err}");
        let (status, _, err) = server.session_cli(&["kill", &id, "1", "--signal", "BOGUS"]);
        assert_eq!(status, 125, "{err}");
        assert!(err.contains("TERM"), "{err}");
        let (status, _, err) = server.session_cli(&["exec", &id, "--cwd", "nope", "--", "true"]);
        assert_eq!(status, 125, "{err}");
        assert!(err.contains("chdir nope"), "{err}");
        assert_eq!(server.session_cli(&["close", &id]).0, 0);
        server.stop();
    });
}

/// SIGTERM while a call and a run are in flight: both end, every session is closed, and
/// nothing is left (the harness checks processes, cgroups and mounts after the test).
#[test]
fn sigterm_during_a_long_call_leaves_nothing_behind() {
    as_root(|| {
        let server = Server::start("", false);
        let (_, created) =
            server.request("POST", "/v1/sessions", Some(json!({"language": "bash"})));
        let id = created["id"].as_str().unwrap().to_string();
        let mark = marker("sigterm");
        let socket = server.socket.clone();
        let path = format!("http://codecage/v1/sessions/{id}/execute");
        let code = format!("(exec -a {mark} sleep 300)");
        let call = std::thread::spawn(move || {
            Command::new("curl")
                .args(["-s", "--unix-socket"])
                .arg(&socket)
                .args(["-X", "POST", &path, "-d"])
                .arg(json!({ "code": code }).to_string())
                .output()
                .unwrap()
        });
        assert!(wait_for(Duration::from_secs(10 * slowdown()), || {
            !host_pids_with(&mark).is_empty()
        }));
        let log = server.stop();
        let _ = call.join();
        assert!(
            host_pids_with(&mark).is_empty(),
            "the call's process survived: {log}"
        );
    });
}

/// `codecage serve` is served by `codecage-full`, executed in place by `codecage` (the same
/// process, so a supervisor's pid stays the server's); the commands a run needs are
/// `codecage`'s own, and it runs them without `codecage-full` beside it. Without it the
/// server's commands are refused with a message naming it, and a `codecage-full` started
/// by a `codecage` of another build refuses to run.
#[test]
fn the_server_s_commands_run_in_codecage_full_and_a_run_does_not_need_it() {
    as_root(|| {
        let server = Server::start("", false);
        let exe = std::fs::read_link(format!("/proc/{}/exe", server.pid())).unwrap();
        assert_eq!(
            exe.file_name().unwrap(),
            "codecage-full",
            "the server's pid runs {}",
            exe.display()
        );
        let (status, body) = server.curl(&["http://codecage/healthz"]);
        assert_eq!((status, body.as_str()), (200, "ok\n"));
        drop(server);

        let alone = TempDir::new("codecage-alone");
        let codecage = alone.path().join("codecage");
        std::fs::copy(env!("CARGO_BIN_EXE_codecage"), &codecage).unwrap();
        for command in [&["openapi"][..], &["audit", "list"], &["serve"]] {
            let out = Command::new(&codecage).args(command).launch_output();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(125), "{command:?}: {out:?}");
            assert!(
                stderr.contains(&format!("`{}` is in codecage-full", command[0]))
                    && stderr.contains(&alone.path().display().to_string()),
                "{command:?}: {stderr}"
            );
        }
        // The run's own commands: `codecage` alone is its own sandbox init too.
        let out = Command::new(&codecage)
            .args(["run", "--rootfs", "host", "--", "/bin/echo", "alone"])
            .launch_output();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(out.stdout, b"alone\n");
        let out = Command::new(&codecage)
            .args(["profiles", "--json"])
            .launch_output();
        assert!(out.status.success(), "{out:?}");

        let full = PathBuf::from(env!("CARGO_BIN_EXE_codecage")).with_file_name("codecage-full");
        let out = Command::new(&full)
            .arg("openapi")
            .env("CODECAGE_FRONT_BUILD", "0000000000000000")
            .launch_output();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{out:?}");
        assert!(
            stderr.contains("another build") && out.stdout.is_empty(),
            "{stderr}"
        );
        // Started directly, it runs every command.
        let out = Command::new(&full).arg("openapi").launch_output();
        assert!(
            out.status.success() && out.stdout.starts_with(b"{"),
            "{out:?}"
        );
    });
}

/// Every endpoint the server answers is in the document, and the document's paths answer.
#[test]
fn the_openapi_document_describes_every_endpoint() {
    as_root(|| {
        let server = Server::start("", false);
        let (status, doc) = server.request("GET", "/openapi.json", None);
        assert_eq!(status, 200);
        let paths: Vec<&String> = doc["paths"].as_object().unwrap().keys().collect();
        for path in [
            "/v1/run",
            "/v1/sessions",
            "/v1/sessions/{id}",
            "/v1/sessions/{id}/execute",
            "/v1/sessions/{id}/reset",
            "/v1/sessions/{id}/interrupt",
            "/healthz",
            "/openapi.json",
            "/v1/audit",
            "/v1/audit/{id}",
            "/v1/audit/export",
        ] {
            assert!(
                paths.iter().any(|p| *p == path),
                "{path} is missing from {paths:?}"
            );
        }
        let run = &doc["components"]["schemas"]["RunRequest"]["properties"];
        for field in ["language", "code", "timeout", "memory", "cpus", "pids"] {
            assert!(run.get(field).is_some(), "RunRequest lacks {field}: {run}");
        }
        // An endpoint the document does not list does not exist.
        assert_eq!(server.request("GET", "/v1/nothing", None).0, 404);
        server.stop();
    });
}

/// The venv's python with openapi-python-client, or why there is none.
fn openapi_python() -> Result<PathBuf, String> {
    let path = std::env::var_os("CODECAGE_OPENAPI_PYTHON").map_or_else(
        || PathBuf::from("/var/cache/codecage/openapi-client/bin/python"),
        PathBuf::from,
    );
    let ok = Command::new(&path)
        .args(["-c", "import openapi_python_client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Ok(path)
    } else {
        Err(format!(
            "openapi-python-client ({} with the package; `cargo xtask test` installs it)",
            path.display()
        ))
    }
}

/// A client generated from the served document (openapi-python-client, without a
/// warning) runs code, opens a session, keeps its state across two calls and closes it,
/// over TCP with the bearer token; its models parse every answer, errors included.
#[test]
fn a_client_generated_from_the_openapi_document_works() {
    as_root(|| {
        let python = match openapi_python() {
            Ok(python) => python,
            Err(why) => return unavailable(&why),
        };
        let server = Server::start("", true);
        let (status, doc) = server.request("GET", "/openapi.json", None);
        assert_eq!(status, 200, "{doc}");
        let dir = TempDir::new("openapi-client");
        let spec = dir.path().join("openapi.json");
        std::fs::write(&spec, doc.to_string()).unwrap();
        // The generator reads no NDJSON: the streamed answers are bytes to this client.
        let config = dir.path().join("config.yaml");
        std::fs::write(
            &config,
            "content_type_overrides:\n  application/x-ndjson: application/octet-stream\n",
        )
        .unwrap();
        let bin = python.parent().unwrap();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let generated = Command::new(&python)
            .args(["-m", "openapi_python_client", "generate", "--meta", "none"])
            .arg("--path")
            .arg(&spec)
            .arg("--config")
            .arg(&config)
            .arg("--output-path")
            .arg(dir.path().join("codecage_client"))
            .env("PATH", &path)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&generated.stdout),
            String::from_utf8_lossy(&generated.stderr)
        );
        assert!(generated.status.success(), "{said}");
        assert!(
            !said.to_lowercase().contains("warning") && !said.contains("Unable to"),
            "the generator warned: {said}"
        );
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/suite/scripts/openapi_client.py"
        );
        let out = Command::new(&python)
            .arg(script)
            .arg(format!("http://{}", server.tcp_address()))
            .arg(TOKEN)
            .env("PYTHONPATH", dir.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "the generated client failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(
            seen["run"],
            json!({"stdout": "42\n", "exit_code": 0, "encoding": "utf-8", "files": []}),
            "{seen}"
        );
        assert_eq!(
            seen["created"],
            json!({"status": 201, "language": "python"}),
            "{seen}"
        );
        assert_eq!(seen["listed"], true, "{seen}");
        let calls = seen["calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2, "{seen}");
        assert_eq!(calls[0]["stdout"], "set\n", "{seen}");
        assert_eq!(calls[1]["stdout"], "42\n", "{seen}");
        for call in calls {
            assert_eq!(call["error"], Value::Null, "{seen}");
            assert_eq!(call["preserved"], true, "{seen}");
        }
        assert_eq!(seen["executions"], 2, "{seen}");
        assert_eq!(seen["closed"], 204, "{seen}");
        assert_eq!(
            seen["gone"],
            json!({"status": 404, "error": "not_found"}),
            "{seen}"
        );
        assert_eq!(
            seen["unauthorized"],
            json!({"status": 401, "error": "unauthorized",
                   "challenge": "Bearer realm=\"codecage\", error=\"invalid_token\""}),
            "{seen}"
        );
        server.stop();
    });
}

#[test]
fn volumes_come_only_from_under_the_configured_roots() {
    as_root(|| {
        let roots = TempDir::new("volroots");
        let project = roots.path().join("project");
        std::fs::create_dir_all(&project).unwrap();
        std::fs::write(project.join("hello.txt"), "from the host\n").unwrap();
        let outside = TempDir::new("voloutside");
        let run = |server: &Server, volume: String, code: &str| {
            server.request(
                "POST",
                "/v1/run",
                Some(json!({"language": "bash", "code": code, "timeout": "20s", "volumes": [volume]})),
            )
        };
        // Without volume_roots, no volume at all.
        let server = Server::start("", false);
        let (status, answer) = run(&server, format!("{}:/work/src", project.display()), "true");
        assert_eq!(
            (status, answer["error"].as_str()),
            (403, Some("policy")),
            "{answer}"
        );
        server.stop();
        let server = Server::start(&format!("volume_roots = [{:?}]\n", roots.path()), false);
        // Under a root: read-only by default, a copy the code may change with :copy.
        let (status, answer) = run(
            &server,
            format!("{}:/work/src", project.display()),
            "cat /work/src/hello.txt; echo x > /work/src/new 2>/dev/null || echo EROFS",
        );
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["stdout"], "from the host\nEROFS\n", "{answer}");
        let (status, answer) = run(
            &server,
            format!("{}:/work/src:copy", project.display()),
            "echo changed > /work/src/hello.txt && cat /work/src/hello.txt",
        );
        assert_eq!(
            (status, answer["stdout"].as_str()),
            (200, Some("changed\n")),
            "{answer}"
        );
        assert_eq!(
            std::fs::read_to_string(project.join("hello.txt")).unwrap(),
            "from the host\n"
        );
        assert!(!project.join("new").exists());
        // Outside the roots (directly, or through a symlink under them): 403. Malformed or
        // relative: 400.
        let link = roots.path().join("link");
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        for dir in [outside.path().to_path_buf(), link, PathBuf::from("/")] {
            let (status, answer) = run(&server, format!("{}:/work/src", dir.display()), "true");
            assert_eq!(
                (status, answer["error"].as_str()),
                (403, Some("policy")),
                "{} -> {answer}",
                dir.display()
            );
        }
        for volume in [
            format!("{}:/etc", project.display()),
            format!("{}:/work/src:rw", project.display()),
            "project:/work/src".to_string(),
        ] {
            let (status, answer) = run(&server, volume.clone(), "true");
            assert_eq!(
                (status, answer["error"].as_str()),
                (400, Some("invalid_request")),
                "{volume} -> {answer}"
            );
            assert!(
                answer["message"].as_str().unwrap().contains("volumes"),
                "{answer}"
            );
        }
        server.stop();
    });
}

/// The exec policy over the API (issue 25): a profile that says `deny` refuses bash
/// sessions, runs of bash or of a program, and a session's processes (403 `policy`); one
/// with an allowlist runs only its programs in a session's cells and processes.
#[test]
fn exec_policy_deny_and_allowlist_over_the_api() {
    as_root(|| {
        let server = Server::start("", false);
        let dir = server.profiles_dir();
        std::fs::write(
            dir.join("nosh.toml"),
            "language = \"python\"\nrootfs = \"host\"\n[exec]\nsecurity = \"deny\"\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("lsgrep.toml"),
            "language = \"bash\"\nrootfs = \"host\"\n[exec]\nsecurity = \"allowlist\"\n\
             allowed = [\"bash\", \"ls\", \"grep\"]\n",
        )
        .unwrap();
        let refused = |status: u16, out: &Value| {
            assert_eq!(status, 403, "{out}");
            assert_eq!(out["error"], "policy", "{out}");
            assert!(out["message"].as_str().unwrap().contains("deny"), "{out}");
        };
        let (status, out) = server.request(
            "POST",
            "/v1/sessions",
            Some(json!({"language": "bash", "profile": "nosh"})),
        );
        refused(status, &out);
        for body in [
            json!({"language": "bash", "code": "ls", "profile": "nosh"}),
            json!({"argv": ["ls"], "profile": "nosh"}),
        ] {
            let (status, out) = server.request("POST", "/v1/run", Some(body));
            refused(status, &out);
        }
        let (status, out) = server.request(
            "POST",
            "/v1/run",
            Some(json!({"language": "python", "code": "print(6 * 7)", "profile": "nosh"})),
        );
        assert_eq!(
            (status, out["stdout"].as_str()),
            (200, Some("42\n")),
            "{out}"
        );
        let (status, created) = server.request(
            "POST",
            "/v1/sessions",
            Some(json!({"language": "python", "profile": "nosh"})),
        );
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap();
        let (status, out) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/processes"),
            Some(json!({"command": "ls"})),
        );
        refused(status, &out);
        // Nor a bash context of it (issue 24's contexts), while its python context runs.
        let (status, out) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"code": "ls", "language": "bash"})),
        );
        refused(status, &out);
        let (status, out) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"code": "print(6 * 7)"})),
        );
        assert_eq!(
            (status, out["stdout"].as_str()),
            (200, Some("42\n")),
            "{out}"
        );
        // An allowlist: cells and processes run only its programs.
        let (status, created) = server.request(
            "POST",
            "/v1/sessions",
            Some(json!({"language": "bash", "profile": "lsgrep"})),
        );
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap();
        let (_, out) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"code": "ls / | grep -x usr; rm -f x; echo \"rm $?\""})),
        );
        assert_eq!(out["stdout"], "usr\nrm 126\n", "{out}");
        let (status, out) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/processes"),
            Some(json!({"command": "ls -d /work && cat /etc/hostname"})),
        );
        assert_eq!(status, 200, "{out}");
        assert_eq!(out["exit_code"], 126, "{out}");
        assert_eq!(out["stdout"], "/work\n", "{out}");
        assert!(
            out["stderr"]
                .as_str()
                .unwrap()
                .contains("cat: Permission denied"),
            "{out}"
        );
        // A python session under it: its interpreter is not allowed.
        let (status, out) = server.request(
            "POST",
            "/v1/sessions",
            Some(json!({"language": "python", "profile": "lsgrep"})),
        );
        assert_eq!(status, 400, "{out}");
        assert!(
            out["message"].as_str().unwrap().contains("python3"),
            "{out}"
        );
    });
}

/// `[exec] interpreter = "context"` (issue 25): the language's interpreter, not in the
/// allowlist, runs for its own context only. A python session's cells (and what they
/// start) run python3; the session's processes and its bash context cannot, not by
/// `execve` and not through the loader (the interpreter's exec bind lives in the python
/// driver's own mount namespace); a profile that says nothing refuses the session and
/// names both ways to allow it; a one-shot run gets the same.
#[test]
fn the_interpreter_runs_for_its_own_context_only() {
    as_root(|| {
        let server = Server::start("", false);
        let dir = server.profiles_dir();
        let allowed = "allowed = [\"bash\", \"ls\", \"cat\", \"head\"]\n";
        std::fs::write(
            dir.join("ctx.toml"),
            format!(
                "language = \"python\"\nrootfs = \"host\"\n[exec]\nsecurity = \"allowlist\"\n{allowed}\
                 interpreter = \"context\"\n"
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join("listed.toml"),
            format!("language = \"python\"\nrootfs = \"host\"\n[exec]\nsecurity = \"allowlist\"\n{allowed}"),
        )
        .unwrap();
        let (status, out) = server.request(
            "POST",
            "/v1/sessions",
            Some(json!({"language": "python", "profile": "listed"})),
        );
        assert_eq!(status, 400, "{out}");
        let message = out["message"].as_str().unwrap();
        assert!(
            message.contains("python3") && message.contains("exec.interpreter = \"context\""),
            "{out}"
        );
        let (status, created) = server.request(
            "POST",
            "/v1/sessions",
            Some(json!({"language": "python", "profile": "ctx"})),
        );
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap();
        let cell = |code: &str, lang: &str| {
            let (status, out) = server.request(
                "POST",
                &format!("/v1/sessions/{id}/execute"),
                Some(json!({"code": code, "language": lang})),
            );
            assert_eq!(status, 200, "{out}");
            out
        };
        // The python context: its interpreter, again from a child; an allowed program;
        // one the allowlist lacks is refused.
        let out = cell(
            "import subprocess, sys\n\
             r = subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True)\n\
             print(r.stdout.strip(), subprocess.run(['ls', '-d', '/work']).returncode)\n\
             try:\n    subprocess.run(['rm', '-f', 'x'])\nexcept PermissionError as e:\n    print('rm', e.errno)",
            "python",
        );
        assert_eq!(out["stdout"], "/work\n42 0\nrm 13\n", "{out}");
        // A process of the session: python3 is refused at exec, and the loader cannot map
        // it (its exec bind is not in this process's mount namespace).
        let (status, out) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/processes"),
            Some(
                json!({"command": "python3 -c 'print(1)'; echo \"exec $?\"; \
                ld=$(ls /lib64/ld-linux-*.so.* /lib/ld-linux-*.so.* 2>/dev/null | head -n 1); \
                $ld $(ls /usr/bin/python3.* | head -n 1) -c 'print(1)'; echo \"loader $?\""}),
            ),
        );
        assert_eq!(status, 200, "{out}");
        assert_eq!(out["stdout"], "exec 126\nloader 127\n", "{out}");
        assert!(
            out["stderr"]
                .as_str()
                .unwrap()
                .contains("failed to map segment"),
            "{out}"
        );
        // The bash context of the same session: bash is allowed, python3 is not its.
        let out = cell("python3 -c 'print(1)'; echo \"exec $?\"", "bash");
        assert_eq!(out["stdout"], "exec 126\n", "{out}");
        // The python context still runs it after the others were refused.
        let out = cell(
            "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'print(7)'])",
            "python",
        );
        assert_eq!(out["stdout"], "7\n", "{out}");
        let (status, _) = server.request("DELETE", &format!("/v1/sessions/{id}"), None);
        assert_eq!(status, 204);
        // A one-shot run: the payload is the context.
        let (status, out) = server.request(
            "POST",
            "/v1/run",
            Some(json!({"language": "python", "profile": "ctx", "code":
                "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'print(6 * 7)'])\n\
                 try:\n    subprocess.run(['rm', '-f', 'x'])\nexcept PermissionError as e:\n    print('rm', e.errno)"})),
        );
        assert_eq!(
            (status, out["stdout"].as_str()),
            (200, Some("42\nrm 13\n")),
            "{out}"
        );
        let (status, out) = server.request(
            "POST",
            "/v1/run",
            Some(json!({"language": "bash", "profile": "ctx", "code": "python3 -c 1; echo \"exec $?\""})),
        );
        assert_eq!(
            (status, out["stdout"].as_str()),
            (200, Some("exec 126\n")),
            "{out}"
        );
        server.stop();
    });
}

/// `[exec] ask = "on-miss"` over HTTP (issue 25): commands whose programs are all allowed
/// run; any other, and every bypass of a string match (a chain, `$(...)`, an alias,
/// `bash -c "$(echo rm) f"`), waits for a person (202 `approval_pending`) and does not
/// run; only an administrator other than the asker decides; allow-once runs it once,
/// allow-always adds a rule that a revocation removes for the very next command; a bash
/// cell runs when sent again once approved; every question and decision is audited.
#[test]
fn exec_ask_on_miss_approvals_over_http() {
    as_root(|| {
        const AGENT: &str = "agent-token-0123456789abcdef";
        const BOSS: &str = "boss-token-0123456789abcdef";
        let server = Server::start(
            &format!(
                "[[tokens]]\nname = \"agent\"\ntoken = \"{AGENT}\"\nprofiles = [\"askme\"]\n\
                 [[tokens]]\nname = \"boss\"\ntoken = \"{BOSS}\"\nrole = \"admin\"\n"
            ),
            true,
        );
        std::fs::write(
            server.profiles_dir().join("askme.toml"),
            "language = \"bash\"\nrootfs = \"host\"\n[exec]\nask = \"on-miss\"\n\
             allowed = [\"bash\", \"ls\", \"grep\", \"cat\"]\n",
        )
        .unwrap();
        let agent = |method: &str, path: &str, body: Option<Value>| {
            server.tcp_request(AGENT, method, path, body)
        };
        let (status, created) = agent(
            "POST",
            "/v1/sessions",
            Some(json!({"language": "bash", "profile": "askme"})),
        );
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        let procs = format!("/v1/sessions/{id}/processes");
        let start = |command: &str| agent("POST", &procs, Some(json!({"command": command})));
        // Allowed programs only: it runs.
        let (status, out) = start("ls / | grep -x usr");
        assert_eq!((status, out["exit_code"].as_i64()), (200, Some(0)), "{out}");
        assert_eq!(out["stdout"], "usr\n", "{out}");
        // Each of these names a program not allowed, or what a parse cannot judge.
        for (command, named) in [
            ("ls /work && touch /work/chained", "touch"),
            ("ls $(touch /work/substituted)", "touch"),
            ("alias l=touch; l /work/aliased", "alias"),
            ("bash -c \"$(echo touch) /work/computed\"", "bash -c"),
            ("`echo touch` /work/backticks", "variable, a substitution"),
        ] {
            let (status, out) = start(command);
            assert_eq!(status, 202, "{command}: {out}");
            assert_eq!(out["status"], "approval_pending", "{out}");
            assert!(
                out["approval_id"].as_str().is_some_and(|a| a.len() == 32),
                "{out}"
            );
            assert!(
                out["reason"].as_str().unwrap().contains(named),
                "{command}: {out}"
            );
        }
        let (_, out) = start("ls -A /work");
        assert_eq!(
            out["stdout"], "",
            "nothing of the pending commands ran: {out}"
        );
        // The agent sees its questions and cannot decide them.
        let (status, pending) = agent("GET", "/v1/approvals", None);
        assert_eq!(status, 200, "{pending}");
        assert_eq!(pending.as_array().unwrap().len(), 5, "{pending}");
        let touch = pending[0]["approval_id"].as_str().unwrap().to_string();
        assert_eq!(pending[0]["programs"], json!(["ls", "touch"]), "{pending}");
        let decide = |token: Option<&str>, approval: &str, body: Value| match token {
            Some(token) => server.tcp_request(
                token,
                "POST",
                &format!("/v1/approvals/{approval}"),
                Some(body),
            ),
            None => server.request("POST", &format!("/v1/approvals/{approval}"), Some(body)),
        };
        let (status, out) = decide(Some(AGENT), &touch, json!({"decision": "allow-once"}));
        assert_eq!(
            (status, out["error"].as_str()),
            (403, Some("forbidden")),
            "{out}"
        );
        // Root on the socket approves once: it starts, and the agent polls it.
        let (status, out) = decide(None, &touch, json!({"decision": "allow-once"}));
        assert_eq!(status, 200, "{out}");
        assert_eq!(out["status"], "started", "{out}");
        let process = out["process_id"].as_u64().unwrap();
        let mut polled = Value::Null;
        assert!(wait_for(Duration::from_secs(10), || {
            polled = agent("GET", &format!("{procs}/{process}"), None).1;
            polled["status"] == "exited"
        }));
        assert_eq!(polled["exit_code"], 0, "{polled}");
        let (_, out) = start("ls /work");
        assert_eq!(out["stdout"], "chained\n", "{out}");
        let (status, out) = decide(None, &touch, json!({"decision": "deny"}));
        assert_eq!(status, 403, "decided once: {out}");
        // Asked again next time; denied, it never runs.
        let (status, out) = start("touch /work/again");
        assert_eq!(status, 202, "{out}");
        let again = out["approval_id"].as_str().unwrap().to_string();
        // From the shell: the list names it, and root denies it.
        let approvals_cli = |args: &[&str]| {
            let out = codecage()
                .arg("approvals")
                .arg("--server")
                .arg(format!("unix:{}", server.socket_path().display()))
                .args(args)
                .launch_output();
            (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).to_string(),
                String::from_utf8_lossy(&out.stderr).to_string(),
            )
        };
        let (code, listed, err) = approvals_cli(&["list"]);
        assert_eq!(code, 0, "{err}");
        assert!(
            listed.contains(&again) && listed.contains("touch /work/again"),
            "{listed}"
        );
        let (code, shown, err) = approvals_cli(&["deny", &again]);
        assert_eq!(code, 0, "{err}");
        assert!(shown.contains("\"denied\""), "{shown}");
        let (code, _, err) = approvals_cli(&["deny", &again]);
        assert_eq!(code, 125, "decided already: {err}");
        // The session's event stream told the agent of both decisions, in order with the
        // approved process's start and exit.
        let events = Command::new("curl")
            .args(["-s", "-N", "--max-time", "3", "-H"])
            .arg(format!("Authorization: Bearer {AGENT}"))
            .arg(format!(
                "http://{}/v1/sessions/{id}/events?after=0",
                server.tcp_address()
            ))
            .output()
            .expect("curl");
        let events: Vec<Value> = String::from_utf8_lossy(&events.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        let of = |kind: &str, approval: &str| {
            events
                .iter()
                .position(|e| e["type"] == kind && e["approval_id"] == approval)
                .unwrap_or_else(|| panic!("no {kind} of {approval} in {events:#?}"))
        };
        let finished = of("approval_finished", &touch);
        let e = &events[finished];
        assert_eq!(
            (&e["decision"], &e["status"], e["process_id"].as_u64()),
            (&json!("allow-once"), &json!("started"), Some(process)),
            "{e}"
        );
        let started = events
            .iter()
            .position(|e| e["type"] == "started" && e["process_id"] == process)
            .unwrap_or_else(|| panic!("{events:#?}"));
        assert!(started < finished, "{events:#?}");
        let denied = &events[of("exec_denied", &again)];
        assert_eq!(denied["command"], "touch /work/again", "{denied}");
        assert!(
            denied["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("denied by")),
            "{denied}"
        );
        // The session CLI says that a command waits, and exits 3.
        let (code, _, err) = server.session_cli(&["exec", &id, "--", "touch", "/work/cli"]);
        assert_eq!(code, 3, "{err}");
        assert!(
            err.contains("waiting for approval") && err.contains("codecage approvals allow"),
            "{err}"
        );
        // allow-always for the session: touch runs without asking, until revoked.
        let (_, out) = start("touch /work/always");
        let always = out["approval_id"].as_str().unwrap().to_string();
        let (status, out) = decide(
            None,
            &always,
            json!({"decision": "allow-always", "scope": "session"}),
        );
        assert_eq!(
            (status, out["status"].as_str()),
            (200, Some("started")),
            "{out}"
        );
        let (status, out) = start("touch /work/ruled && ls /work");
        assert_eq!(status, 200, "{out}");
        let (status, rules) = server.request("GET", "/v1/approvals/rules", None);
        assert_eq!(status, 200, "{rules}");
        let rule = rules
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["approval_id"] == always.as_str())
            .unwrap_or_else(|| panic!("{rules}"));
        assert!(
            rule["program"].as_str().unwrap().ends_with("/touch"),
            "{rule}"
        );
        assert_eq!(
            (rule["scope"].as_str(), rule["applies_to"].as_str()),
            (Some("session"), Some(id.as_str()))
        );
        let (status, _) = agent("GET", "/v1/approvals/rules", None);
        assert_eq!(status, 403);
        let rule_id = rule["rule_id"].as_str().unwrap();
        let (status, out) = agent("DELETE", &format!("/v1/approvals/rules/{rule_id}"), None);
        assert_eq!(status, 403, "{out}");
        let (code, rules_text, err) = approvals_cli(&["rules"]);
        assert_eq!(code, 0, "{err}");
        assert!(
            rules_text.contains(rule_id) && rules_text.contains("/touch"),
            "{rules_text}"
        );
        let (code, revoked, err) = approvals_cli(&["revoke", rule_id]);
        assert_eq!(
            (code, revoked.trim()),
            (0, format!("revoked {rule_id}").as_str()),
            "{err}"
        );
        let (status, out) = start("touch /work/revoked");
        assert_eq!(status, 202, "revoked: the next command asks: {out}");
        // A bash cell: approved once, it runs when sent again, and only that once.
        let execute = |code: &str| {
            agent(
                "POST",
                &format!("/v1/sessions/{id}/execute"),
                Some(json!({"code": code})),
            )
        };
        let (status, out) = execute("touch /work/cell && echo made");
        assert_eq!(status, 202, "{out}");
        let (status, _) = decide(
            None,
            out["approval_id"].as_str().unwrap(),
            json!({"decision": "allow-once"}),
        );
        assert_eq!(status, 200);
        let (status, out) = execute("touch /work/cell && echo made");
        assert_eq!(
            (status, out["stdout"].as_str()),
            (200, Some("made\n")),
            "{out}"
        );
        let (status, _) = execute("touch /work/cell && echo made");
        assert_eq!(status, 202);
        // An administrator token cannot approve what it asked itself.
        let (status, created) = server.tcp_request(
            BOSS,
            "POST",
            "/v1/sessions",
            Some(json!({"language": "bash", "profile": "askme"})),
        );
        assert_eq!(status, 201, "{created}");
        let boss_session = created["id"].as_str().unwrap();
        let (status, out) = server.tcp_request(
            BOSS,
            "POST",
            &format!("/v1/sessions/{boss_session}/processes"),
            Some(json!({"command": "rm -f /work/x"})),
        );
        assert_eq!(status, 202, "{out}");
        let (status, out) = decide(
            Some(BOSS),
            out["approval_id"].as_str().unwrap(),
            json!({"decision": "allow-once"}),
        );
        assert_eq!(status, 403, "{out}");
        assert!(
            out["message"]
                .as_str()
                .unwrap()
                .contains("cannot approve its own"),
            "{out}"
        );
        // A one-shot run cannot wait for a person: what would ask is refused, naming why
        // and where it could be approved; what would not ask runs.
        let run = |body: Value| agent("POST", "/v1/run", Some(body));
        let (status, out) = run(json!({"profile": "askme", "code": "ls / | grep -x usr"}));
        assert_eq!(
            (status, out["stdout"].as_str()),
            (200, Some("usr\n")),
            "{out}"
        );
        for body in [
            json!({"profile": "askme", "code": "ls && touch /work/run"}),
            json!({"profile": "askme", "language": "bash", "code": "$(echo rm) -f x"}),
            json!({"profile": "askme", "argv": ["touch", "/work/run"]}),
        ] {
            let (status, out) = run(body.clone());
            assert_eq!(
                (status, out["error"].as_str()),
                (403, Some("policy")),
                "{body}: {out}"
            );
            let message = out["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("one-shot run cannot wait") && message.contains("/v1/sessions"),
                "{out}"
            );
        }
        // An approved command still running after 10 s is said on the event stream.
        let (status, out) = start("sleep 30");
        assert_eq!(status, 202, "{out}");
        let slow = out["approval_id"].as_str().unwrap().to_string();
        let (status, out) = decide(None, &slow, json!({"decision": "allow-once"}));
        assert_eq!(
            (status, out["status"].as_str()),
            (200, Some("started")),
            "{out}"
        );
        let sleeper = out["process_id"].as_u64().unwrap();
        let mut stream = Command::new("curl")
            .args([
                "-s",
                "-N",
                "--max-time",
                &(25 * slowdown()).to_string(),
                "-H",
            ])
            .arg(format!("Authorization: Bearer {AGENT}"))
            .arg(format!(
                "http://{}/v1/sessions/{id}/events?after=0",
                server.tcp_address()
            ))
            .stdout(Stdio::piped())
            .spawn()
            .expect("curl");
        let lines = stream.stdout.take().unwrap();
        let running = std::io::BufRead::lines(std::io::BufReader::new(lines))
            .map_while(Result::ok)
            .map(|l| serde_json::from_str::<Value>(&l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .find(|e| e["type"] == "approval_running" && e["approval_id"] == slow.as_str())
            .expect("approval_running within 25 s");
        let _ = stream.kill();
        let _ = stream.wait();
        assert_eq!(running["process_id"].as_u64(), Some(sleeper), "{running}");
        assert_eq!(running["running_for_ms"], 10_000, "{running}");
        let (status, out) = agent("DELETE", &format!("{procs}/{sleeper}"), None);
        assert!(status < 300, "{status} {out}");
        // The audit log: every question, decision and revocation.
        let (status, records) = server.request("GET", "/v1/audit?kind=approval&limit=100", None);
        assert_eq!(status, 200, "{records}");
        let events: Vec<String> = records["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["details"]["event"].as_str().unwrap_or("?").to_string())
            .collect();
        for event in [
            "asked",
            "allow-once",
            "allow-always",
            "deny",
            "revoke",
            "rule",
        ] {
            assert!(events.iter().any(|e| e == event), "{event}: {events:?}");
        }
        // A command a standing rule let through names the rule that matched.
        let ruled = records["records"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["details"]["event"] == "rule")
            .unwrap();
        assert_eq!(ruled["caller"], "token:agent", "{ruled}");
        assert!(
            ruled["details"]["rules"]
                .as_array()
                .is_some_and(|r| !r.is_empty()),
            "{ruled}"
        );
        let decision = records["records"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["details"]["event"] == "allow-always")
            .unwrap();
        assert_eq!(decision["caller"], "uid:0", "{decision}");
        assert_eq!(decision["details"]["asked_by"], "token:agent", "{decision}");
        assert_eq!(decision["details"]["scope"], "session", "{decision}");
        assert!(decision["details"]["waited_ms"].is_u64(), "{decision}");
        server.stop();
    });
}

/// `ask` over a kernel allowlist (issue 25): an approved process gets a ruleset of its
/// own, the allowlist plus what was approved, so the program the kernel refused to the
/// sandbox runs in it; the REPL that asked keeps its ruleset (an approved cell still meets
/// EACCES); an allow-always rule gives the next process the same, until it is revoked.
#[test]
fn an_approved_process_gets_its_own_exec_ruleset() {
    as_root(|| {
        const AGENT: &str = "agent-token-0123456789abcdef";
        let server = Server::start(
            &format!(
                "[[tokens]]\nname = \"agent\"\ntoken = \"{AGENT}\"\nprofiles = [\"strict\"]\n"
            ),
            true,
        );
        std::fs::write(
            server.profiles_dir().join("strict.toml"),
            "language = \"bash\"\nrootfs = \"host\"\n[exec]\nsecurity = \"allowlist\"\nask = \"on-miss\"\n\
             allowed = [\"bash\", \"ls\", \"grep\"]\n",
        )
        .unwrap();
        let agent = |method: &str, path: &str, body: Option<Value>| {
            server.tcp_request(AGENT, method, path, body)
        };
        let (status, created) = agent(
            "POST",
            "/v1/sessions",
            Some(json!({"language": "bash", "profile": "strict"})),
        );
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        let procs = format!("/v1/sessions/{id}/processes");
        let start = |command: &str| agent("POST", &procs, Some(json!({"command": command})));
        let approve = |approval: &Value, body: Value| {
            let approval = approval.as_str().unwrap();
            server.request("POST", &format!("/v1/approvals/{approval}"), Some(body))
        };
        let finished = |process: u64| {
            let mut polled = Value::Null;
            assert!(wait_for(Duration::from_secs(10), || {
                polled = agent("GET", &format!("{procs}/{process}"), None).1;
                polled["status"] == "exited"
            }));
            polled
        };
        // touch is not in the allowlist: asked, approved once, it runs in its own ruleset.
        let (status, out) = start("touch /work/t && ls /work");
        assert_eq!(status, 202, "{out}");
        let (status, out) = approve(&out["approval_id"], json!({"decision": "allow-once"}));
        assert_eq!(
            (status, out["status"].as_str()),
            (200, Some("started")),
            "{out}"
        );
        let polled = finished(out["process_id"].as_u64().unwrap());
        assert_eq!(
            (polled["exit_code"].as_i64(), polled["stdout"].as_str()),
            (Some(0), Some("t\n")),
            "{polled}"
        );
        // A cell the parse cannot judge, approved: the REPL's ruleset is the allowlist's.
        let execute = |code: &str| {
            agent(
                "POST",
                &format!("/v1/sessions/{id}/execute"),
                Some(json!({"code": code})),
            )
        };
        let cell = "t=touch; $t /work/c; echo $?";
        let (status, out) = execute(cell);
        assert_eq!(status, 202, "{out}");
        let (status, _) = approve(&out["approval_id"], json!({"decision": "allow-once"}));
        assert_eq!(status, 200);
        let (status, out) = execute(cell);
        assert_eq!(status, 200, "{out}");
        assert_eq!(
            out["stdout"], "126\n",
            "the kernel still refuses touch to the REPL: {out}"
        );
        // allow-always for the profile: the next touch runs at once, in its own ruleset.
        let (status, out) = start("touch /work/r");
        assert_eq!(status, 202, "{out}");
        let (status, out) = approve(
            &out["approval_id"],
            json!({"decision": "allow-always", "scope": "profile"}),
        );
        assert_eq!(
            (status, out["status"].as_str()),
            (200, Some("started")),
            "{out}"
        );
        let rule = out["rules"][0].as_str().unwrap().to_string();
        let (status, out) = start("touch /work/s && ls /work");
        assert_eq!(status, 200, "{out}");
        let polled = finished(out["process_id"].as_u64().unwrap());
        assert_eq!(polled["exit_code"], 0, "{polled}");
        assert_eq!(polled["stdout"], "r\ns\nt\n", "{polled}");
        // Revoked: the next one is asked again.
        let (status, _) = server.request("DELETE", &format!("/v1/approvals/rules/{rule}"), None);
        assert_eq!(status, 200);
        let (status, out) = start("touch /work/u");
        assert_eq!(status, 202, "{out}");
        // A command the parse cannot judge, allowed always: the same command runs at once
        // with the programs it names in its ruleset.
        let judged = "touch /work/v; eval true";
        let (status, out) = start(judged);
        assert_eq!(status, 202, "{out}");
        let (status, out) = approve(&out["approval_id"], json!({"decision": "allow-always"}));
        assert_eq!(
            (status, out["status"].as_str()),
            (200, Some("started")),
            "{out}"
        );
        assert_eq!(
            out["rules"].as_array().unwrap().len(),
            2,
            "touch and the command: {out}"
        );
        let (status, out) = start(judged);
        assert_eq!(status, 200, "{out}");
        assert_eq!(
            finished(out["process_id"].as_u64().unwrap())["exit_code"],
            0
        );
        server.stop();
    });
}

/// `[exec.args]` (issue 25, seed 004's safe-bin profiles): git runs without asking for
/// `git status`, not for `git push`, nor for a push hidden in `bash -c`.
#[test]
fn argument_rules_let_git_status_run_and_ask_for_git_push() {
    as_root(|| {
        let server = Server::start("", false);
        std::fs::write(
            server.profiles_dir().join("gitro.toml"),
            "language = \"bash\"\nrootfs = \"host\"\n[exec]\nask = \"on-miss\"\n\
             allowed = [\"bash\", \"git\"]\n[exec.args.git]\nfirst = [\"status\", \"log\"]\n\
             denied_flags = [\"-c\", \"--exec-path\"]\n",
        )
        .unwrap();
        let (status, created) = server.request(
            "POST",
            "/v1/sessions",
            Some(json!({"language": "bash", "profile": "gitro"})),
        );
        assert_eq!(status, 201, "{created}");
        let procs = format!("/v1/sessions/{}/processes", created["id"].as_str().unwrap());
        let start =
            |command: &str| server.request("POST", &procs, Some(json!({"command": command})));
        let (status, out) = start("git status");
        assert_eq!(status, 200, "{out}");
        // /work is no repository: git ran and said so.
        assert!(
            out["stderr"]
                .as_str()
                .unwrap()
                .contains("not a git repository"),
            "{out}"
        );
        for (command, why) in [
            (
                "git push origin main",
                "first argument must be one of status, log",
            ),
            ("bash -c 'git push'", "first argument"),
            ("git -c core.pager=x status", "the flag -c is denied"),
            ("git status $REF", "run time"),
        ] {
            let (status, out) = start(command);
            assert_eq!(status, 202, "{command}: {out}");
            assert!(
                out["reason"].as_str().unwrap().contains(why),
                "{command}: {out}"
            );
        }
        server.stop();
    });
}
