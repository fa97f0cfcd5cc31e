//! The audit log, through real servers and the CLI: every run recorded and complete, a
//! crash leaves the run in flight `incomplete` and the rest intact, retention, the API for
//! administrators only, `log_code = false` keeping every byte of the code out of the
//! database, and a full disk meeting `on_full`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use super::common::*;
use super::server::{split_status, Server, TOKEN};

const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef";

/// `codecage audit --db DB ARGS...`: (status, stdout, stderr).
fn audit_cli(db: &Path, args: &[&str]) -> (i32, String, String) {
    audit_cli_with(codecage(), db, args)
}

/// [`audit_cli`] with `cmd` as the codecage binary.
fn audit_cli_with(mut cmd: Command, db: &Path, args: &[&str]) -> (i32, String, String) {
    let out = cmd
        .arg("audit")
        .arg("--db")
        .arg(db)
        .args(args)
        .launch_output();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Every record the filters select, whole (`codecage audit export`).
fn export(db: &Path, filters: &[&str]) -> Vec<Value> {
    export_with(codecage(), db, filters)
}

/// [`export`] with `cmd` as the codecage binary.
fn export_with(cmd: Command, db: &Path, filters: &[&str]) -> Vec<Value> {
    let mut args = vec!["export", "--format", "jsonl"];
    args.extend_from_slice(filters);
    let (status, out, err) = audit_cli_with(cmd, db, &args);
    assert_eq!(status, 0, "{err}");
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Waits until the filters select `n` records (the writer is behind the request path by
/// a queue).
fn wait_for_records(db: &Path, filters: &[&str], n: usize) -> Vec<Value> {
    let mut records = Vec::new();
    let settled = wait_for(Duration::from_secs(10 * slowdown()), || {
        records = export(db, filters);
        records.len() >= n
    });
    assert!(settled, "{} records, not {n}: {records:?}", records.len());
    records
}

#[test]
fn a_thousand_runs_through_the_api_give_a_thousand_complete_records() {
    as_root(|| {
        let server = Server::start("", false);
        let body = json!({"argv": ["true"], "timeout": secs(30)}).to_string();
        // Four clients, 250 requests each on one connection.
        let clients: Vec<_> = (0..4)
            .map(|_| {
                let mut cmd = Command::new("curl");
                cmd.args(["-s", "--unix-socket"])
                    .arg(server.socket_path())
                    .args(["-H", "Content-Type: application/json", "-d", &body])
                    // After each answer its status, or what curl met instead.
                    .args(["-w", "\n@@%{http_code} %{errormsg}\n"]);
                for _ in 0..250 {
                    cmd.arg("http://codecage/v1/run");
                }
                cmd.stdout(Stdio::piped()).spawn().unwrap()
            })
            .collect();
        let mut answered = 0;
        let mut others = Vec::new();
        for client in clients {
            let out = client.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            answered += text.matches("\"exit_code\":0").count();
            let mut answer = String::new();
            for line in text.lines() {
                match line.strip_prefix("@@") {
                    Some(status)
                        if !(status.starts_with("200") && answer.contains("\"exit_code\":0")) =>
                    {
                        others.push(format!("{status}: {answer}"));
                        answer.clear();
                    }
                    Some(_) => answer.clear(),
                    None => answer.push_str(line),
                }
            }
        }
        assert_eq!(answered, 1000, "the other answers: {others:?}");
        let runs = wait_for_records(
            &server.audit_db(),
            &["--kind", "run", "--status", "complete"],
            1000,
        );
        assert_eq!(runs.len(), 1000);
        for r in &runs {
            assert_eq!(r["exit_code"], 0, "{r}");
            assert_eq!(r["via"], "api");
            assert_eq!(r["caller"], "uid:0");
            assert_eq!(r["argv"], json!(["true"]));
            assert!(
                r["ended_at"].is_string() && r["duration_ms"].is_number(),
                "{r}"
            );
        }
        let mut ids: Vec<&str> = runs.iter().map(|r| r["id"].as_str().unwrap()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 1000);
        // Nothing else: no run left running or incomplete, no refusal.
        assert_eq!(export(&server.audit_db(), &[]).len(), 1000);
        // The API answers the same, to root on the socket.
        let (status, list) = server.request("GET", "/v1/audit?kind=run&limit=10000", None);
        assert_eq!(status, 200, "{list}");
        assert_eq!(list["records"].as_array().unwrap().len(), 1000);
        server.stop();
    });
}

#[test]
fn kill_9_during_a_run_leaves_finished_records_complete_and_the_one_in_flight_incomplete() {
    as_root(|| {
        let dir = TempDir::new("audit-crash");
        let db = dir.path().join("audit.db");
        let config = format!("[audit]\npath = {:?}\n", db.to_str().unwrap());
        let server = Server::start(&config, false);
        for i in 0..3 {
            let (status, out) = server.request(
                "POST",
                "/v1/run",
                Some(json!({"language": "bash", "code": format!("echo done {i}")})),
            );
            assert_eq!(status, 200, "{out}");
        }
        let (status, created) =
            server.request("POST", "/v1/sessions", Some(json!({"language": "bash"})));
        assert_eq!(status, 201, "{created}");
        let session = created["id"].as_str().unwrap().to_string();
        let mark = marker("crash");
        let socket = server.socket_path();
        let code = format!("(exec -a {mark} sleep 60)");
        let in_flight = std::thread::spawn(move || {
            Command::new("curl")
                .args(["-s", "--unix-socket"])
                .arg(&socket)
                .args(["-X", "POST", "http://codecage/v1/run", "-d"])
                .arg(json!({"language": "bash", "code": code, "timeout": "60s"}).to_string())
                .output()
                .unwrap()
        });
        assert!(wait_for(Duration::from_secs(10 * slowdown()), || {
            !host_pids_with(&mark).is_empty()
        }));
        wait_for_records(&db, &["--status", "running"], 2);
        // The finished ones are complete (their ends follow their answers by moments).
        wait_for_records(&db, &["--kind", "run", "--status", "complete"], 3);
        server.kill9();
        let _ = in_flight.join();
        assert!(
            wait_for(Duration::from_secs(5), || host_pids_with(&mark).is_empty()),
            "the sandbox outlived its server"
        );
        // Before a restart the record says what the dead server last wrote.
        assert_eq!(export(&db, &["--status", "running"]).len(), 2);
        let server = Server::start(&config, false);
        let incomplete = export(&db, &["--status", "incomplete"]);
        assert_eq!(incomplete.len(), 2, "{incomplete:?}");
        let run = incomplete.iter().find(|r| r["kind"] == "run").unwrap();
        assert!(run["code"].as_str().unwrap().contains(&mark), "{run}");
        assert!(run["ended_at"].is_null());
        assert!(run["message"].as_str().unwrap().contains("ended"), "{run}");
        let live = incomplete.iter().find(|r| r["kind"] == "session").unwrap();
        assert_eq!(live["session"], session.as_str());
        let done = export(&db, &["--kind", "run", "--status", "complete"]);
        assert_eq!(done.len(), 3, "{done:?}");
        for (i, r) in done.iter().enumerate() {
            assert_eq!(r["stdout"], format!("done {i}\n"), "{r}");
            assert_eq!(r["exit_code"], 0);
        }
        // The new server's first run sweeps the dead one's cgroups (the harness checks).
        let (status, _) = server.request("POST", "/v1/run", Some(json!({"argv": ["true"]})));
        assert_eq!(status, 200);
        server.stop();
        assert_eq!(export(&db, &["--status", "running"]).len(), 0);
    });
}

/// Moves records `days` into the past, as if they were that old.
fn age(db: &Path, ids: &[&str], days: i64) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    for id in ids {
        let changed = conn
            .execute(
                "UPDATE records SET started_at = started_at - ?1 * 86400000 WHERE id = ?2",
                rusqlite::params![days, id],
            )
            .unwrap();
        assert_eq!(changed, 1);
    }
}

#[test]
fn retention_removes_old_records_and_keeps_new_ones() {
    as_root(|| {
        let dir = TempDir::new("audit-retention");
        let db = dir.path().join("audit.db");
        let config = format!(
            "[audit]\npath = {:?}\nretention_days = 30\n",
            db.to_str().unwrap()
        );
        let server = Server::start(&config, false);
        for i in 0..6 {
            let (status, _) = server.request(
                "POST",
                "/v1/run",
                Some(json!({"language": "bash", "code": format!("echo {i}")})),
            );
            assert_eq!(status, 200);
        }
        server.stop();
        let all = export(&db, &[]);
        assert_eq!(all.len(), 6);
        let ids: Vec<&str> = all.iter().map(|r| r["id"].as_str().unwrap()).collect();
        // Two are 40 days old, one 29: the server prunes at start (then daily).
        age(&db, &ids[..2], 40);
        age(&db, &ids[2..3], 29);
        let server = Server::start(&config, false);
        let kept = wait_until_count(&db, 4);
        let kept_ids: Vec<&str> = kept.iter().map(|r| r["id"].as_str().unwrap()).collect();
        assert_eq!(kept_ids, ids[2..].to_vec());
        server.stop();
        // `codecage audit prune`: the retention of the config it reads, or --before.
        age(&db, &ids[3..4], 31);
        let (status, _, err) = audit_cli(&db, &["prune"]);
        assert_eq!(status, 0, "{err}");
        assert!(err.contains("deleted 1 "), "{err}");
        let kept: Vec<String> = export(&db, &[])
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(kept, [ids[2], ids[4], ids[5]]);
        let (status, _, err) = audit_cli(&db, &["prune", "--before", "20d"]);
        assert_eq!(status, 0, "{err}");
        assert_eq!(export(&db, &[]).len(), 2);
    });
}

fn wait_until_count(db: &Path, n: usize) -> Vec<Value> {
    let mut records = Vec::new();
    assert!(
        wait_for(Duration::from_secs(10 * slowdown()), || {
            records = export(db, &[]);
            records.len() == n
        }),
        "{} records, not {n}",
        records.len()
    );
    records
}

fn curl_tcp(address: &str, token: Option<&str>, path: &str) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-o", "-", "-w", "\n%{http_code}"])
        .arg(format!("http://{address}{path}"));
    if let Some(token) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    split_status(&cmd.output().unwrap().stdout)
}

#[test]
fn a_normal_token_gets_403_on_the_audit_api() {
    as_root(|| {
        let server = Server::start(
            &format!("[[tokens]]\nname = \"ops\"\ntoken = \"{ADMIN_TOKEN}\"\nrole = \"admin\"\n"),
            true,
        );
        let tcp = server.tcp_address();
        let (status, out) = server.request("POST", "/v1/run", Some(json!({"argv": ["true"]})));
        assert_eq!(status, 200, "{out}");
        let (_, list) = server.request("GET", "/v1/audit", None);
        let id = list["records"][0]["id"].as_str().unwrap().to_string();
        for path in ["/v1/audit", &format!("/v1/audit/{id}"), "/v1/audit/export"] {
            let (status, body) = curl_tcp(&tcp, Some(TOKEN), path);
            assert_eq!(status, 403, "{path}: {body}");
            assert!(body.contains("administrators"), "{body}");
            assert_eq!(curl_tcp(&tcp, None, path).0, 401, "{path}");
            let (status, body) = curl_tcp(&tcp, Some(ADMIN_TOKEN), path);
            assert_eq!(status, 200, "{path}: {body}");
        }
        let (status, body) = curl_tcp(&tcp, Some(ADMIN_TOKEN), &format!("/v1/audit/{id}"));
        assert_eq!(status, 200);
        let record: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (record["kind"].as_str(), record["argv"].clone()),
            (Some("run"), json!(["true"]))
        );
        let (status, body) = curl_tcp(&tcp, Some(ADMIN_TOKEN), "/v1/audit/nothing-here");
        assert_eq!(status, 404, "{body}");
        let (status, body) = curl_tcp(&tcp, Some(ADMIN_TOKEN), "/v1/audit?since=someday");
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("since"), "{body}");
        // The refusals are records themselves: who tried, where, and why.
        let refused = wait_for_records(
            &server.audit_db(),
            &["--kind", "refused", "--caller", "token:tests"],
            3,
        );
        for r in &refused {
            assert_eq!(r["error"], "forbidden", "{r}");
            assert_eq!(r["details"]["status"], 403);
            assert!(
                r["details"]["endpoint"]
                    .as_str()
                    .unwrap()
                    .starts_with("GET /v1/audit"),
                "{r}"
            );
        }
        let unauthenticated = export(&server.audit_db(), &["--error", "unauthorized"]);
        assert_eq!(unauthenticated.len(), 3, "{unauthenticated:?}");
        assert_eq!(unauthenticated[0]["caller"], "unauthenticated");
        assert!(unauthenticated[0]["details"]["peer"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"));
        // Filters over HTTP.
        let (_, body) = curl_tcp(
            &tcp,
            Some(ADMIN_TOKEN),
            "/v1/audit?kind=run&since=1h&error=none",
        );
        let runs: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(runs["records"].as_array().unwrap().len(), 1, "{runs}");
        let (_, body) = curl_tcp(&tcp, Some(ADMIN_TOKEN), "/v1/audit?kind=run&until=1h");
        let none: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(none["records"].as_array().unwrap().len(), 0, "{none}");
        server.stop();
    });
}

/// Refusals past the audit's budget are counted, not recorded one by one, and an
/// endpoint is kept to a bound: a client without credentials cannot fill the log.
#[test]
fn a_flood_of_refusals_is_counted_and_cannot_fill_the_log() {
    as_root(|| {
        let server = Server::start("", true);
        let tcp = server.tcp_address();
        let (host, port) = tcp.rsplit_once(':').unwrap();
        let script = format!(
            r#"
import http.client, time
c = http.client.HTTPConnection("{host}", {port})
for i in range(400):
    c.request("GET", "/" + "a" * 60000)
    r = c.getresponse(); r.read()
    assert r.status == 401, r.status
time.sleep(0.3)
c.request("GET", "/after-the-flood")
r = c.getresponse(); r.read()
print("sent")
"#
        );
        let out = Command::new("/usr/bin/python3")
            .args(["-c", &script])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("sent"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut recorded = Vec::new();
        for _ in 0..100 {
            recorded = export(&server.audit_db(), &["--error", "unauthorized"]);
            if recorded
                .last()
                .is_some_and(|r| r["details"]["endpoint"] == "GET /after-the-flood")
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let counted: u64 = recorded
            .iter()
            .filter_map(|r| r["details"]["refusals_not_recorded_before"].as_u64())
            .sum();
        assert!(recorded.len() < 400, "{} records", recorded.len());
        assert!(counted > 0, "nothing was counted");
        assert_eq!(recorded.len() as u64 + counted, 401);
        for r in &recorded {
            let endpoint = r["details"]["endpoint"].as_str().unwrap();
            assert!(endpoint.len() <= 256 + '…'.len_utf8(), "{}", endpoint.len());
        }
        server.stop();
    });
}

/// Every occurrence of `needle` in the database's files.
fn files_containing(db: &Path, needle: &[u8]) -> Vec<PathBuf> {
    ["", "-wal", "-shm"]
        .iter()
        .map(|s| PathBuf::from(format!("{}{s}", db.display())))
        .filter(|p| {
            std::fs::read(p)
                .map(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
                .unwrap_or(false)
        })
        .collect()
}

#[test]
fn with_log_code_off_no_byte_of_the_code_reaches_the_database() {
    as_root(|| {
        let dir = TempDir::new("audit-nocode");
        let db = dir.path().join("audit.db");
        let config = format!(
            "[audit]\npath = {:?}\nlog_code = false\n",
            db.to_str().unwrap()
        );
        let server = Server::start(&config, false);
        let secret = marker("secret-code");
        // Code that prints nothing of itself (output is logged: log_output is on).
        let code = format!("x={secret}; test -n \"$x\"");
        let (status, out) = server.request(
            "POST",
            "/v1/run",
            Some(json!({"language": "bash", "code": code})),
        );
        assert_eq!((status, &out["exit_code"]), (200, &json!(0)), "{out}");
        let (status, out) =
            server.request("POST", "/v1/run", Some(json!({"argv": ["true", &secret]})));
        assert_eq!(status, 200, "{out}");
        // Refused requests whose error would quote the code: an argv sent as one string
        // (serde names the value it could not take), an argument with a NUL byte.
        let (status, out) = server.request(
            "POST",
            "/v1/run",
            Some(json!({"argv": format!("sh -c {secret}")})),
        );
        assert_eq!(status, 400, "{out}");
        let (status, out) = server.request(
            "POST",
            "/v1/run",
            Some(json!({"argv": ["sh", "-c", format!("{secret}\u{0}")]})),
        );
        assert_eq!(status, 400, "{out}");
        let (status, _) = server.request(
            "POST",
            "/v1/run",
            Some(json!({"language": "bash", "code": code, "memory": "64G"})),
        );
        assert_eq!(status, 403);
        let (_, created) =
            server.request("POST", "/v1/sessions", Some(json!({"language": "bash"})));
        let id = created["id"].as_str().unwrap().to_string();
        let (status, out) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"code": code})),
        );
        assert_eq!(status, 200, "{out}");
        server.request("DELETE", &format!("/v1/sessions/{id}"), None);
        let records = wait_for_records(&db, &["--status", "complete"], 7);
        // Every record but the session's and the body that did not parse (no code in it
        // was read) carries the code's hash.
        let hashed: Vec<&Value> = records
            .iter()
            .filter(|r| r["kind"] != "session" && r["details"]["endpoint"].is_null())
            .collect();
        assert_eq!(hashed.len(), 5, "{records:?}");
        for r in hashed {
            assert!(r["code"].is_null() && r["argv"].is_null(), "{r}");
            assert_eq!(r["code_sha256"].as_str().unwrap().len(), 64, "{r}");
        }
        assert_eq!(
            files_containing(&db, secret.as_bytes()),
            Vec::<PathBuf>::new()
        );
        server.stop();
        // After the last connection closed (the WAL folded into the file), still nowhere.
        assert_eq!(
            files_containing(&db, secret.as_bytes()),
            Vec::<PathBuf>::new()
        );
        // And with log_code on, the same scan finds it: the scan can see.
        let config = format!("[audit]\npath = {:?}\n", db.to_str().unwrap());
        let server = Server::start(&config, false);
        server.request(
            "POST",
            "/v1/run",
            Some(json!({"language": "bash", "code": code})),
        );
        server.stop();
        assert!(!files_containing(&db, secret.as_bytes()).is_empty());
    });
}

/// A small tmpfs of the test's own, in a mount namespace of its own (the other tests' host
/// checks must not see it, see host.rs), gone with it on drop. The server and the audit
/// CLI that use it run in that namespace; the test reaches its files from the host.
struct SmallDisk {
    ns: MountNamespace,
    dir: TempDir,
}

impl SmallDisk {
    fn new(size: &str) -> SmallDisk {
        let dir = TempDir::new("audit-disk");
        let ns = MountNamespace::with_tmpfs(dir.path(), &format!("size={size},mode=0700"));
        SmallDisk { ns, dir }
    }

    /// The disk's directory, as the server (in the namespace) names it.
    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file until the disk is full.
    fn fill(&self) {
        use std::io::Write;
        let filler = self.ns.path(&self.path().join("filler"));
        let mut f = std::fs::File::create(filler).unwrap();
        let block = vec![0x5au8; 64 << 10];
        loop {
            if f.write_all(&block).and_then(|_| f.flush()).is_err() {
                break;
            }
        }
        let small = vec![0x5au8; 512];
        while f.write_all(&small).is_ok() {}
    }

    fn free(&self) {
        std::fs::remove_file(self.ns.path(&self.path().join("filler"))).unwrap();
    }

    /// [`export`], in the namespace.
    fn export(&self, db: &Path, filters: &[&str]) -> Vec<Value> {
        export_with(self.ns.codecage(), db, filters)
    }
}

fn run_once(server: &Server, max_time: Option<u64>) -> (u16, String) {
    let mut args = vec![
        "-X".to_string(),
        "POST".into(),
        "http://codecage/v1/run".into(),
        "-d".into(),
    ];
    args.push(json!({"language": "bash", "code": "echo ran"}).to_string());
    if let Some(s) = max_time {
        args.extend(["--max-time".into(), s.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    server.curl(&args)
}

#[test]
fn with_the_disk_full_refuse_answers_503_and_the_server_stays_up() {
    as_root(|| {
        let disk = SmallDisk::new("2m");
        let db = disk.path().join("audit").join("audit.db");
        let config = format!(
            "[audit]\npath = {:?}\non_full = \"refuse\"\n",
            db.to_str().unwrap()
        );
        let server = Server::start_with(disk.ns.codecage(), &config, false);
        assert_eq!(run_once(&server, None).0, 200);
        disk.fill();
        // The writer learns of the full disk at its next write: from then on, 503.
        let mut answers = Vec::new();
        let refused = wait_for(Duration::from_secs(20 * slowdown()), || {
            let (status, body) = run_once(&server, None);
            answers.push(status);
            status == 503 && body.contains("audit_unavailable") && body.contains("audit log")
        });
        assert!(refused, "no 503 on a full disk: {answers:?}");
        assert_eq!(
            server.curl(&["http://codecage/healthz"]),
            (200, "ok\n".into())
        );
        let (status, body) = run_once(&server, None);
        assert_eq!(status, 503, "{body}");
        disk.free();
        assert!(
            wait_for(Duration::from_secs(10 * slowdown()), || run_once(
                &server, None
            )
            .0 == 200),
            "the server did not recover"
        );
        let ran = 2 + answers.iter().filter(|s| **s == 200).count();
        server.stop();
        // Every request that ran has its record, complete; none was lost.
        let runs = disk.export(&db, &["--kind", "run"]);
        assert_eq!(runs.len(), ran, "{runs:?}");
        assert!(runs
            .iter()
            .all(|r| r["status"] == "complete" && r["stdout"] == "ran\n"));
    });
}

#[test]
fn with_the_disk_full_block_waits_and_the_server_stays_up() {
    as_root(|| {
        let disk = SmallDisk::new("2m");
        let db = disk.path().join("audit").join("audit.db");
        let config = format!(
            "[audit]\npath = {:?}\non_full = \"block\"\n",
            db.to_str().unwrap()
        );
        let server = Server::start_with(disk.ns.codecage(), &config, false);
        assert_eq!(run_once(&server, None).0, 200);
        disk.fill();
        // Once the writer has failed, a request waits (curl gives up: 0).
        let mut answers = Vec::new();
        let waited = wait_for(Duration::from_secs(30 * slowdown()), || {
            let (status, _) = run_once(&server, Some(2));
            answers.push(status);
            status == 0
        });
        assert!(waited, "no request waited on a full disk: {answers:?}");
        assert_eq!(
            server.curl(&["http://codecage/healthz"]),
            (200, "ok\n".into())
        );
        let socket = server.socket_path();
        let waiting = std::thread::spawn(move || {
            let out = Command::new("curl")
                .args(["-s", "-o", "-", "-w", "\n%{http_code}", "--unix-socket"])
                .arg(&socket)
                .args(["-X", "POST", "http://codecage/v1/run", "-d"])
                .arg(json!({"language": "bash", "code": "echo ran"}).to_string())
                .output()
                .unwrap();
            split_status(&out.stdout)
        });
        std::thread::sleep(Duration::from_secs(1));
        assert!(!waiting.is_finished(), "the request did not wait");
        disk.free();
        // It ran once the disk had room (how soon is the machine's, not asserted).
        let (status, body) = waiting.join().unwrap();
        assert_eq!(status, 200, "{body}");
        let ran = 2 + answers.iter().filter(|s| **s == 200).count();
        server.stop();
        let runs = disk.export(&db, &["--kind", "run"]);
        assert_eq!(runs.len(), ran, "{runs:?}");
        assert!(runs.iter().all(|r| r["status"] == "complete"));
    });
}

#[test]
fn the_cli_records_its_runs_when_the_host_config_says_so() {
    as_root(|| {
        let dir = TempDir::new("audit-cli");
        let db = dir.path().join("db").join("audit.db");
        let host_config = dir.path().join("config.toml");
        std::fs::write(
            &host_config,
            format!("[audit]\npath = {:?}\n", db.to_str().unwrap()),
        )
        .unwrap();
        let run = |args: &[&str]| {
            codecage()
                .env("CODECAGE_CONFIG", &host_config)
                .args(["run", "--rootfs", "host"])
                .args(args)
                .launch_output()
        };
        let out = run(&["--lang", "bash", "-c", "echo cli; exit 4"]);
        assert_eq!(out.status.code(), Some(4));
        let out = run(&["--memory", "64G", "--", "true"]);
        assert_eq!(out.status.code(), Some(125));
        let out = run(&["--timeout", "1s", "--", "sleep", "5"]);
        assert_eq!(out.status.code(), Some(124));
        let records = export(&db, &[]);
        assert_eq!(records.len(), 3, "{records:?}");
        let (first, refused, timeout) = (&records[0], &records[1], &records[2]);
        assert_eq!(
            (first["kind"].as_str(), first["via"].as_str()),
            (Some("run"), Some("cli"))
        );
        assert_eq!(first["caller"], "uid:0");
        assert_eq!(
            (first["exit_code"].clone(), first["stdout"].clone()),
            (json!(4), json!("cli\n"))
        );
        assert_eq!(first["code"], "echo cli; exit 4");
        assert_eq!(first["profile"], "bash");
        assert_eq!(
            (refused["kind"].as_str(), refused["error"].as_str()),
            (Some("refused"), Some("policy"))
        );
        assert_eq!(refused["argv"], json!(["true"]));
        assert_eq!(timeout["error"], "timeout");
        assert_eq!(timeout["limits_hit"], json!(["timeout"]));
        assert_eq!(timeout["limits"]["timeout_ms"], 1000);
        // Files and directory for root alone.
        use std::os::unix::fs::MetadataExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(db.parent().unwrap()), 0o700);
        assert_eq!(mode(&db), 0o600);
        // The commands: list (filters), show, export.
        let (status, list, err) = audit_cli(&db, &["list", "--error", "timeout"]);
        assert_eq!(status, 0, "{err}");
        assert_eq!(list.lines().count(), 2, "{list}");
        assert!(list.contains(timeout["id"].as_str().unwrap()));
        let (_, list, _) = audit_cli(
            &db,
            &["list", "--profile", "bash", "--since", "1h", "--json"],
        );
        assert_eq!(list.lines().count(), 3, "{list}");
        let (_, list, _) = audit_cli(&db, &["list", "--until", "2000-01-01"]);
        assert_eq!(list.lines().count(), 1, "only the header: {list}");
        let (status, shown, _) = audit_cli(&db, &["show", first["id"].as_str().unwrap()]);
        assert_eq!(status, 0);
        let shown: Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(shown["code"], "echo cli; exit 4");
        let (status, _, err) = audit_cli(&db, &["show", "nope"]);
        assert_eq!(status, 1);
        assert!(err.contains("no audit record nope"), "{err}");
        let (status, _, err) = audit_cli(&db, &["list", "--since", "soon"]);
        assert_eq!(status, 1);
        assert!(err.contains("--since"), "{err}");
        // Without the section, the CLI records nothing.
        std::fs::write(&host_config, "").unwrap();
        assert_eq!(run(&["--", "true"]).status.code(), Some(0));
        assert_eq!(export(&db, &[]).len(), 3);
    });
}

#[test]
fn a_sessions_life_its_calls_files_and_output_are_recorded() {
    as_root(|| {
        let dir = TempDir::new("audit-session");
        let db = dir.path().join("audit.db");
        let config = format!(
            "[audit]\npath = {:?}\noutput_cap = \"16\"\n",
            db.to_str().unwrap()
        );
        let server = Server::start(&config, false);
        let (status, created) =
            server.request("POST", "/v1/sessions", Some(json!({"language": "bash"})));
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        let execute = format!("/v1/sessions/{id}/execute");
        let code = "cat in.txt; printf 'x%.0s' $(seq 40); mkdir -p out; echo r > out/r.txt";
        let (status, out) = server.request(
            "POST",
            &execute,
            Some(json!({"code": code, "files": [{"path": "in.txt", "data": "aGVsbG8K"}], "stdin": "typed"})),
        );
        assert_eq!(status, 200, "{out}");
        assert_eq!(
            server
                .request("POST", &format!("/v1/sessions/{id}/reset"), None)
                .0,
            204
        );
        assert_eq!(
            server
                .request("DELETE", &format!("/v1/sessions/{id}"), None)
                .0,
            204
        );
        let records = wait_for_records(&db, &["--session", &id, "--status", "complete"], 3);
        let kinds: Vec<&str> = records
            .iter()
            .map(|r| r["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["session", "call", "reset"]);
        let (session, call) = (&records[0], &records[1]);
        assert_eq!(session["message"], "closed by uid:0 (api)");
        assert_eq!(session["details"]["executions"], 1);
        assert_eq!(session["limits"]["memory"], 256 << 20);
        assert_eq!(call["code"], code);
        assert_eq!(
            call["input_files"],
            json!([{"path": "in.txt", "size": 6, "sha256": "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"}])
        );
        assert_eq!(call["output_files"][0]["path"], "r.txt");
        assert_eq!(call["output_files"][0]["size"], 2);
        assert_eq!(call["stdin_size"], 5);
        // Output up to the cap, its whole size and hash beside it.
        assert_eq!(call["stdout"], "hello\nxxxxxxxxxx");
        assert_eq!(
            (call["stdout_size"].as_u64(), call["stdout_cut"].as_bool()),
            (Some(46), Some(true))
        );
        assert_eq!(call["details"]["state"]["preserved"], true);
        server.stop();
    });
}

#[test]
fn a_runs_record_names_the_host_directories_it_could_read() {
    as_root(|| {
        let dir = TempDir::new("auditvol");
        let db = dir.path().join("audit.db");
        let project = dir.path().join("project");
        std::fs::create_dir_all(&project).unwrap();
        std::fs::write(project.join("a.txt"), "a\n").unwrap();
        let config = format!(
            "volume_roots = [{:?}]\n[audit]\npath = {:?}\n",
            dir.path(),
            db.to_str().unwrap()
        );
        let server = Server::start(&config, false);
        let volume = format!("{}:/work/src:copy", project.display());
        let (status, out) = server.request(
            "POST",
            "/v1/run",
            Some(json!({"language": "bash", "code": "cat /work/src/a.txt", "volumes": [volume]})),
        );
        assert_eq!(
            (status, out["stdout"].as_str()),
            (200, Some("a\n")),
            "{out}"
        );
        let records = wait_for_records(&db, &[], 1);
        let volumes = records[0]
            .as_object()
            .unwrap()
            .values()
            .find_map(|v| v.get("volumes"))
            .unwrap_or_else(|| panic!("no volumes in {}", records[0]));
        assert_eq!(
            volumes,
            &json!([{"source": project, "target": "/work/src", "mode": "copy"}]),
            "{}",
            records[0]
        );
        server.stop();
    });
}
