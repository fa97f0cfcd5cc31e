//! The E2B-compatible front end (`[e2b]` on `codecage serve`) driven by E2B's real Python
//! SDK, `e2b-code-interpreter` (in the venv `cargo xtask test` makes), unmodified: only
//! `E2B_API_URL`, `E2B_SANDBOX_URL` and `E2B_API_KEY` point it at a server of the test's
//! own on loopback. Each test's program prints JSON lines the test reads; the host is
//! checked after each test.

use std::path::PathBuf;
use std::process::Command;

use base64::Engine as _;
use serde_json::Value;

use super::common::*;
use super::image::image_test;
use super::server::{free_port, Server, TOKEN};

/// Another caller's API key (tenancy).
const OTHER: &str = "other-token-0123456789abcdef";
/// A caller whose calls stop after 2 s (its ceiling lowers the profile's call timeout).
const BRIEF: &str = "brief-token-0123456789abcdef";

/// The venv's python with `e2b_code_interpreter`, or why there is none.
fn e2b_python() -> Result<PathBuf, String> {
    let path = std::env::var_os("CODECAGE_E2B_PYTHON").map_or_else(
        || PathBuf::from("/var/cache/codecage/e2b-client/bin/python"),
        PathBuf::from,
    );
    let ok = Command::new(&path)
        .args(["-c", "import e2b_code_interpreter"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Ok(path)
    } else {
        Err(format!(
            "E2B's Python SDK ({} with `e2b-code-interpreter`; `cargo xtask test` installs it)",
            path.display()
        ))
    }
}

/// A server with `[e2b]` on a loopback port, and the SDK's python.
struct E2bServer {
    server: Server,
    url: String,
    python: PathBuf,
}

fn e2b_test(test: impl FnOnce(&E2bServer)) {
    image_test(|_| match e2b_python() {
        Ok(python) => {
            let port = free_port();
            let config = format!(
                "[[tokens]]\nname = \"other\"\ntoken = \"{OTHER}\"\n\
                 [[tokens]]\nname = \"brief\"\ntoken = \"{BRIEF}\"\nlimits = {{ timeout = \"2s\" }}\n\
                 [e2b]\nlisten = \"127.0.0.1:{port}\"\n"
            );
            let server = Server::start(&config, true);
            test(&E2bServer {
                server,
                url: format!("http://127.0.0.1:{port}"),
                python,
            });
        }
        Err(why) => unavailable(&why),
    });
}

/// What every program starts with: the SDK pointed at the server, `out(**fields)` to
/// print a JSON line.
const PRELUDE: &str = r#"
import json, os, sys, time
os.environ.update(E2B_API_URL=sys.argv[1], E2B_SANDBOX_URL=sys.argv[1], E2B_API_KEY=sys.argv[2])
import e2b
from e2b_code_interpreter import Sandbox
def out(**fields):
    print(json.dumps(fields), flush=True)
"#;

impl E2bServer {
    /// Runs `program` with the SDK as the caller of `key`; its JSON lines.
    fn sdk(&self, key: &str, program: &str) -> Vec<Value> {
        let code = format!("{PRELUDE}\n{program}");
        let out = Command::new(&self.python)
            .args(["-c", &code, &self.url, key])
            .output()
            .expect("python");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "the SDK program failed: {stderr}\n{stdout}"
        );
        stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    /// The sessions the server holds (root on its socket sees every one).
    fn sessions(&self) -> Vec<Value> {
        let (status, body) = self.server.request("GET", "/v1/sessions", None);
        assert_eq!(status, 200, "{body}");
        body.as_array().cloned().unwrap_or_default()
    }
}

#[test]
fn state_carries_between_run_code_calls_and_42_is_the_main_result() {
    e2b_test(|s| {
        let lines = s.sdk(
            TOKEN,
            r#"
start = time.monotonic()
sbx = Sandbox.create()
first = sbx.run_code("x = 41")
elapsed = time.monotonic() - start
ex = sbx.run_code("x + 1")
out(elapsed=elapsed, first_error=str(first.error), text=ex.text, count=ex.execution_count,
    main=[r.is_main_result for r in ex.results], id=sbx.sandbox_id)
sbx.kill()
"#,
        );
        let l = &lines[0];
        assert_eq!(l["text"], "42", "{l}");
        assert_eq!(l["main"], serde_json::json!([true]), "{l}");
        assert_eq!(l["first_error"], "None", "{l}");
        assert_eq!(l["count"], 2, "{l}");
        eprintln!(
            "e2b: Sandbox.create() + first run_code: {:.0} ms",
            l["elapsed"].as_f64().unwrap() * 1000.0
        );
        assert!(s.sessions().is_empty(), "kill left a session");
    });
}

#[test]
fn a_matplotlib_chart_comes_back_as_a_png_result() {
    e2b_test(|s| {
        let lines = s.sdk(
            TOKEN,
            r#"
sbx = Sandbox.create()
ex = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.title('t')\nplt.show()")
out(error=str(ex.error), results=[{"formats": list(r.formats()), "png": r.png, "main": r.is_main_result} for r in ex.results])
sbx.kill()
"#,
        );
        let results = lines[0]["results"].as_array().unwrap();
        assert_eq!(lines[0]["error"], "None", "{}", lines[0]);
        let png = results
            .iter()
            .find_map(|r| r["png"].as_str())
            .unwrap_or_else(|| panic!("no PNG result: {}", lines[0]));
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png)
            .unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        assert!(results.iter().all(|r| r["main"] == false));
    });
}

#[test]
fn an_exception_has_its_name_value_and_traceback_and_the_code_before_it_ran() {
    e2b_test(|s| {
        let lines = s.sdk(
            TOKEN,
            r#"
sbx = Sandbox.create()
ex = sbx.run_code("print('before')\ndef f():\n    raise ValueError('bad value 7')\nf()")
out(name=ex.error.name, value=ex.error.value, traceback=ex.error.traceback, stdout="".join(ex.logs.stdout))
sbx.kill()
"#,
        );
        let l = &lines[0];
        assert_eq!(l["name"], "ValueError", "{l}");
        assert_eq!(l["value"], "bad value 7", "{l}");
        let tb = l["traceback"].as_str().unwrap();
        assert!(
            tb.starts_with("Traceback") && tb.contains("in f") && tb.contains("bad value 7"),
            "{tb}"
        );
        assert_eq!(l["stdout"], "before\n", "{l}");
    });
}

#[test]
fn on_stdout_sees_output_as_it_happens() {
    e2b_test(|s| {
        let lines = s.sdk(
            TOKEN,
            r#"
sbx = Sandbox.create()
seen = []
start = time.monotonic()
ex = sbx.run_code("import time, sys\nprint('first')\ntime.sleep(2)\nprint('second')\nprint('oops', file=sys.stderr)",
                  on_stdout=lambda m: seen.append([m.line, time.monotonic() - start, m.error]),
                  on_stderr=lambda m: seen.append([m.line, time.monotonic() - start, m.error]))
done = time.monotonic() - start
out(seen=seen, done=done, stdout="".join(ex.logs.stdout), stderr="".join(ex.logs.stderr))
sbx.kill()
"#,
        );
        let l = &lines[0];
        assert_eq!(l["stdout"], "first\nsecond\n", "{l}");
        assert_eq!(l["stderr"], "oops\n", "{l}");
        let seen = l["seen"].as_array().unwrap();
        let first = seen
            .iter()
            .find(|m| m[0].as_str().unwrap().contains("first"))
            .unwrap();
        let done = l["done"].as_f64().unwrap();
        // The code sleeps 2 s after the first line: its callback came before that.
        assert!(
            first[1].as_f64().unwrap() < done - 1.5,
            "the first line's callback came at the end: {l}"
        );
        assert!(seen
            .iter()
            .any(|m| m[0].as_str().unwrap().contains("oops") && m[2] == true));
    });
}

#[test]
fn a_javascript_and_a_python_context_see_the_same_files() {
    e2b_test(|s| {
        let lines = s.sdk(
            TOKEN,
            r#"
sbx = Sandbox.create()
js = sbx.create_code_context(language="javascript")
w = sbx.run_code("require('fs').writeFileSync('shared.txt', 'from js')", context=js)
r = sbx.run_code("open('shared.txt').read()")
contexts = sorted(c.id for c in sbx.list_code_contexts())
sbx.run_code("import os; os.makedirs('sub', exist_ok=True)")
sub = sbx.create_code_context(language="python", cwd="/home/user/sub")
cwd = sbx.run_code("import os; os.getcwd()", context=sub).text
out(js=js.language, write_error=str(w.error), text=r.text, contexts=contexts, sub=sub.cwd, cwd=cwd)
sbx.kill()
"#,
        );
        let l = &lines[0];
        assert_eq!(l["js"], "javascript", "{l}");
        assert_eq!(l["write_error"], "None", "{l}");
        assert_eq!(l["text"], "'from js'", "{l}");
        assert_eq!(l["contexts"], serde_json::json!(["javascript", "python"]));
        assert_eq!(l["sub"], "/home/user/sub", "{l}");
        assert_eq!(l["cwd"], "'/work/sub'", "{l}");
    });
}

#[test]
fn files_write_and_read_through_envd() {
    e2b_test(|s| {
        let lines = s.sdk(
            TOKEN,
            r#"
sbx = Sandbox.create()
info = sbx.files.write("/home/user/notes/a.txt", "hello from the SDK")
sbx.files.write("b.bin", b"\x00\x01\xff", use_octet_stream=True)
seen = sbx.run_code("open('notes/a.txt').read() + '|' + open('/work/b.bin','rb').read().hex()").text
sbx.run_code("open('made.csv', 'w').write('a,b\\n1,2\\n')")
try:
    sbx.files.read("/home/user/missing.txt")
    missing = None
except Exception as e:
    missing = type(e).__name__
try:
    sbx.files.read("/etc/passwd")
    outside = None
except Exception as e:
    outside = type(e).__name__
out(path=info.path, name=info.name, seen=seen, read=sbx.files.read("made.csv"),
    binary=list(sbx.files.read("/home/user/b.bin", format="bytes")), missing=missing, outside=outside)
sbx.kill()
"#,
        );
        let l = &lines[0];
        assert_eq!(l["path"], "/home/user/notes/a.txt", "{l}");
        assert_eq!(l["name"], "a.txt", "{l}");
        assert_eq!(l["seen"], "'hello from the SDK|0001ff'", "{l}");
        assert_eq!(l["read"], "a,b\n1,2\n", "{l}");
        assert_eq!(l["binary"], serde_json::json!([0, 1, 255]), "{l}");
        assert_eq!(l["missing"], "FileNotFoundException", "{l}");
        assert_eq!(l["outside"], "InvalidArgumentException", "{l}");
    });
}

#[test]
fn set_timeout_moves_the_end_and_the_sandbox_is_closed_at_it() {
    e2b_test(|s| {
        let lines = s.sdk(
            TOKEN,
            r#"
sbx = Sandbox.create(timeout=2, metadata={"purpose": "timeout-test"})
sbx.set_timeout(60)
time.sleep(3)
alive = sbx.is_running() and sbx.run_code("1 + 1").text
end = sbx.get_info().end_at.timestamp() - time.time()
listed = [i.metadata for i in Sandbox.list(query=e2b.SandboxQuery(metadata={"purpose": "timeout-test"})).next_items()]
try:
    sbx.set_timeout(10 * 24 * 3600)
    too_long = None
except Exception as e:
    too_long = str(e)
sbx.set_timeout(1)
time.sleep(3)
try:
    sbx.run_code("1")
    after = None
except Exception as e:
    after = type(e).__name__
out(alive=alive, end=end, listed=listed, too_long=too_long, running=sbx.is_running(), after=after)
"#,
        );
        let l = &lines[0];
        assert_eq!(l["alive"], "2", "{l}");
        let end = l["end"].as_f64().unwrap();
        assert!((40.0..=60.0).contains(&end), "{l}");
        assert_eq!(
            l["listed"],
            serde_json::json!([{"purpose": "timeout-test"}]),
            "{l}"
        );
        assert!(
            l["too_long"].as_str().unwrap().contains("max_duration"),
            "{l}"
        );
        assert_eq!(l["running"], false, "{l}");
        assert_eq!(l["after"], "TimeoutException", "{l}");
        assert!(s.sessions().is_empty());
    });
}

#[test]
fn kill_ends_the_sandbox_and_leaves_nothing_on_the_host() {
    e2b_test(|s| {
        let mark = marker("e2b-kill");
        let program = format!(
            r#"
sbx = Sandbox.create()
sbx.run_code("import subprocess\nsubprocess.Popen(['bash', '-c', 'exec -a {mark} sleep 1000'])")
with open(sys.argv[3], "w") as f:
    f.write(sbx.sandbox_id)
while not os.path.exists(sys.argv[3] + ".seen"):
    time.sleep(0.05)
sbx.kill()
out(running=sbx.is_running(), killed_again=Sandbox.kill(sbx.sandbox_id))
"#
        );
        let dir = TempDir::new("e2b-kill");
        let signal = dir.path().join("id");
        let code = format!("{PRELUDE}\n{program}");
        let child = Command::new(&s.python)
            .args(["-c", &code, &s.url, TOKEN])
            .arg(&signal)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        assert!(
            wait_for(std::time::Duration::from_secs(60), || !host_pids_with(
                &mark
            )
            .is_empty()),
            "the sandbox's process did not start"
        );
        assert_eq!(s.sessions().len(), 1);
        std::fs::write(dir.path().join("id.seen"), "").unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let l: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(l["running"], false, "{l}");
        assert_eq!(l["killed_again"], false, "{l}");
        assert!(host_pids_with(&mark).is_empty(), "kill left a process");
        assert!(s.sessions().is_empty(), "kill left a session");
    });
}

#[test]
fn a_wrong_api_key_is_refused_and_one_caller_cannot_reach_anothers_sandbox() {
    e2b_test(|s| {
        let lines = s.sdk(
            TOKEN,
            &format!(
                r#"
import httpx
try:
    Sandbox.create(api_key="not-a-key")
    wrong = None
except Exception as e:
    wrong = [type(e).__name__, str(e)]
sbx = Sandbox.create()
other = "{OTHER}"
try:
    Sandbox.connect(sbx.sandbox_id, api_key=other)
    connect = None
except Exception as e:
    connect = type(e).__name__
listed = [i.sandbox_id for i in Sandbox.list(api_key=other).next_items()]
killed = Sandbox.kill(sbx.sandbox_id, api_key=other)
headers = {{"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999"}}
no_token = httpx.post(sys.argv[1] + "/execute", headers=headers, json={{"code": "1"}}).status_code
bad_token = httpx.post(sys.argv[1] + "/execute", headers={{**headers, "X-Access-Token": "guess"}}, json={{"code": "1"}}).status_code
# Another key's sandbox token does not open this sandbox's files (envd's filesystem service).
theirs = Sandbox.create(api_key=other)
envd = {{"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}}
stat = lambda token: httpx.post(sys.argv[1] + "/filesystem.Filesystem/Stat", json={{"path": "/home/user"}},
    headers={{**envd, "X-Access-Token": token}}).status_code
cross_files = [stat(theirs._envd_access_token), stat(sbx._envd_access_token)]
theirs.kill()
out(wrong=wrong, connect=connect, listed=listed, killed=killed, no_token=no_token, bad_token=bad_token,
    still=sbx.run_code("'still here'").text, cross_files=cross_files)
sbx.kill()
"#
            ),
        );
        let l = &lines[0];
        assert_eq!(l["wrong"][0], "AuthenticationException", "{l}");
        assert_eq!(l["connect"], "SandboxNotFoundException", "{l}");
        assert_eq!(l["listed"], serde_json::json!([]), "{l}");
        assert_eq!(l["killed"], false, "{l}");
        assert_eq!(l["no_token"], 401, "{l}");
        assert_eq!(l["bad_token"], 401, "{l}");
        assert_eq!(l["still"], "'still here'", "{l}");
        assert_eq!(l["cross_files"], serde_json::json!([401, 200]), "{l}");
        // The refusals are in the audit log, through the E2B front end, with their callers.
        let (status, list) = s
            .server
            .request("GET", "/v1/audit?kind=refused&limit=100", None);
        assert_eq!(status, 200, "{list}");
        let refused = list["records"].as_array().unwrap();
        assert!(
            refused
                .iter()
                .any(|r| r["via"] == "e2b" && r["caller"] == "unauthenticated"),
            "{list}"
        );
        assert!(
            refused
                .iter()
                .any(|r| r["via"] == "e2b" && r["caller"] == "token:other"),
            "{list}"
        );
        let (_, sessions) = s
            .server
            .request("GET", "/v1/audit?kind=session&limit=100", None);
        // Each sandbox's session is its own key's: the test's, and the one `other` made.
        let records = sessions["records"].as_array().unwrap();
        assert!(records.iter().all(|r| r["via"] == "e2b"), "{sessions}");
        let callers: Vec<&str> = records
            .iter()
            .map(|r| r["caller"].as_str().unwrap())
            .collect();
        assert_eq!(callers.len(), 2, "{sessions}");
        assert!(callers.contains(&"token:tests"), "{sessions}");
        assert!(callers.contains(&"token:other"), "{sessions}");
    });
}

#[test]
fn codecage_verdicts_reach_the_sdk_as_an_error_and_a_stderr_line() {
    e2b_test(|s| {
        let lines = s.sdk(
            BRIEF,
            r#"
sbx = Sandbox.create()
ex = sbx.run_code("import time\nprint('started')\ntime.sleep(30)")
after = sbx.run_code("'alive'")
out(error=[ex.error.name, ex.error.value] if ex.error else None, stderr="".join(ex.logs.stderr),
    stdout="".join(ex.logs.stdout), after=after.text)
sbx.kill()
"#,
        );
        let l = &lines[0];
        assert!(
            l["stderr"].as_str().unwrap().contains("codecage: timeout:"),
            "{l}"
        );
        assert!(l["error"].is_array(), "{l}");
        assert_eq!(l["stdout"], "started\n", "{l}");
        assert_eq!(l["after"], "'alive'", "{l}");
    });
}

#[test]
fn commands_run_in_the_foreground_and_the_background_with_stdin_and_kill() {
    e2b_test(|s| {
        let lines = s.sdk(
            TOKEN,
            r#"
from e2b import CommandExitException
sbx = Sandbox.create()
r = sbx.commands.run("echo hi; echo err >&2; pwd", cwd="/home/user")
try:
    sbx.commands.run("exit 3")
    exit3 = None
except CommandExitException as e:
    exit3 = e.exit_code
cat = sbx.commands.run("cat", background=True, stdin=True)
listed = [p.pid for p in sbx.commands.list()]
sbx.commands.send_stdin(cat.pid, "hello stdin\n")
sbx.commands.close_stdin(cat.pid)
cat_out = cat.wait().stdout
sleeper = sbx.commands.run("sleep 1000", background=True)
joined = sbx.commands.connect(sleeper.pid)
killed = sbx.commands.kill(sleeper.pid)
try:
    joined.wait()
    after_kill = None
except CommandExitException as e:
    after_kill = e.exit_code
try:
    sbx.commands.run("id -u", user="root")
    as_root = None
except Exception as e:
    as_root = type(e).__name__
uid = sbx.commands.run("id -u", user="user").stdout
out(stdout=r.stdout, stderr=r.stderr, code=r.exit_code, exit3=exit3, cat_in_list=cat.pid in listed,
    as_root=as_root, uid=uid,
    cat=cat_out, killed=killed, after_kill=after_kill, still=[p.pid for p in sbx.commands.list()])
sbx.kill()
"#,
        );
        let l = &lines[0];
        assert_eq!(l["stdout"], "hi\n/work\n", "{l}");
        assert_eq!(l["stderr"], "err\n", "{l}");
        assert_eq!(l["code"], 0, "{l}");
        assert_eq!(l["exit3"], 3, "{l}");
        assert_eq!(l["cat_in_list"], true, "{l}");
        assert_eq!(l["cat"], "hello stdin\n", "{l}");
        assert_eq!(l["killed"], true, "{l}");
        assert!(l["after_kill"].is_number(), "{l}");
        assert_eq!(l["still"], serde_json::json!([]), "{l}");
        assert!(l["as_root"].is_string(), "{l}");
        assert_eq!(l["uid"], "1000\n", "{l}");
    });
}

#[test]
fn a_pty_is_created_written_to_and_resized() {
    e2b_test(|s| {
        let lines = s.sdk(
            TOKEN,
            r#"
from e2b import PtySize
sbx = Sandbox.create()
term = sbx.pty.create(PtySize(rows=24, cols=80))
sbx.pty.resize(term.pid, PtySize(rows=30, cols=100))
sbx.pty.send_stdin(term.pid, b"stty size; exit\n")
seen = []
result = term.wait(on_pty=lambda data: seen.append(bytes(data)))
out(code=result.exit_code, screen=b"".join(seen).decode(errors="replace"))
sbx.kill()
"#,
        );
        let l = &lines[0];
        assert_eq!(l["code"], 0, "{l}");
        assert!(l["screen"].as_str().unwrap().contains("30 100"), "{l}");
    });
}

#[test]
fn files_list_stat_mkdir_rename_remove_and_watch_through_envds_filesystem_service() {
    e2b_test(|s| {
        let lines = s.sdk(
            TOKEN,
            r#"
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType
sbx = Sandbox.create()
def err(f):
    try:
        f()
        return None
    except Exception as e:
        return type(e).__name__ + ": " + str(e)
made = sbx.files.make_dir("/home/user/a/b")
again = sbx.files.make_dir("/home/user/a/b")
sbx.files.write("/home/user/a/b/c.txt", "hello")
sbx.commands.run("ln -s /etc/passwd /work/link")
one = sorted((e.path, e.type.value) for e in sbx.files.list("/home/user/a"))
two = sorted(e.path for e in sbx.files.list("/home/user/a", depth=2))
info = sbx.files.get_info("/home/user/a/b/c.txt")
link = sbx.files.get_info("link")
exists = [sbx.files.exists(p) for p in ["/home/user/a/b/c.txt", "/home/user/nope"]]
moved = sbx.files.rename("/home/user/a/b/c.txt", "/home/user/a/d.txt")
after_move = sbx.files.exists("/home/user/a/b/c.txt")
handle = sbx.files.watch_dir("/home/user/a", recursive=True)
sbx.run_code("open('/work/a/from_code.txt', 'w').write('x')")
sbx.commands.run("echo y > /work/a/b/from_command.txt")
events, deadline = [], time.monotonic() + 10
while time.monotonic() < deadline:
    events += [(e.name, e.type.value) for e in handle.get_new_events()]
    names = {n for n, _ in events}
    if {"from_code.txt", "b/from_command.txt"} <= names:
        break
    time.sleep(0.1)
handle.stop()
sbx.files.remove("/home/user/a")
gone = sbx.files.exists("/home/user/a")
out(made=made, again=again, one=one, two=two,
    info=dict(name=info.name, type=info.type.value, path=info.path, size=info.size,
              mode=info.mode, permissions=info.permissions, owner=info.owner,
              modified=info.modified_time.year, target=info.symlink_target),
    link=dict(type=link.type.value, target=link.symlink_target),
    exists=exists, moved=moved.path, after_move=after_move, events=events, gone=gone,
    missing=err(lambda: sbx.files.get_info("/home/user/nope")),
    remove_missing=err(lambda: sbx.files.remove("/home/user/nope")),
    outside=err(lambda: sbx.files.list("/etc")),
    dotdot=err(lambda: sbx.files.get_info("/home/user/../../etc/passwd")),
    through_link=err(lambda: sbx.files.list("/home/user/link")),
    watch_outside=err(lambda: sbx.files.watch_dir("/tmp")),
    root=err(lambda: sbx.files.list("/home/user", user="root")))
sbx.kill()
"#,
        );
        let l = &lines[0];
        assert_eq!(l["made"], true, "{l}");
        assert_eq!(l["again"], false, "{l}");
        assert_eq!(
            l["one"],
            serde_json::json!([["/home/user/a/b", "dir"]]),
            "{l}"
        );
        assert_eq!(
            l["two"],
            serde_json::json!(["/home/user/a/b", "/home/user/a/b/c.txt"]),
            "{l}"
        );
        let info = &l["info"];
        assert_eq!(info["name"], "c.txt", "{l}");
        assert_eq!(info["type"], "file", "{l}");
        assert_eq!(info["path"], "/home/user/a/b/c.txt", "{l}");
        assert_eq!(info["size"], 5, "{l}");
        assert_eq!(info["permissions"], "-rw-r--r--", "{l}");
        assert_eq!(info["mode"], 0o644, "{l}");
        assert_eq!(info["owner"], "user", "{l}");
        assert!(info["modified"].as_u64().unwrap() >= 2024, "{l}");
        assert_eq!(info["target"], Value::Null, "{l}");
        assert_eq!(
            l["link"],
            serde_json::json!({"type": "symlink", "target": "/etc/passwd"}),
            "{l}"
        );
        assert_eq!(l["exists"], serde_json::json!([true, false]), "{l}");
        assert_eq!(l["moved"], "/home/user/a/d.txt", "{l}");
        assert_eq!(l["after_move"], false, "{l}");
        let events = l["events"].as_array().unwrap();
        for name in ["from_code.txt", "b/from_command.txt"] {
            assert!(
                events.contains(&serde_json::json!([name, "create"])),
                "no create of {name}: {l}"
            );
        }
        assert_eq!(l["gone"], false, "{l}");
        let refused = |field: &str, class: &str, says: &str| {
            let e = l[field].as_str().unwrap_or_else(|| panic!("{field}: {l}"));
            assert!(e.starts_with(class), "{field}: {e}");
            assert!(e.contains(says), "{field}: {e}");
        };
        refused("missing", "FileNotFoundException", "nope");
        refused("remove_missing", "FileNotFoundException", "nope");
        refused("outside", "InvalidArgumentException", "/home/user");
        refused("dotdot", "InvalidArgumentException", "..");
        refused("through_link", "InvalidArgumentException", "symlink");
        refused("watch_outside", "InvalidArgumentException", "/tmp");
        refused("root", "SandboxException", "one user");
        assert!(s.sessions().is_empty(), "kill left a session");
    });
}

#[test]
fn a_watcher_polled_too_late_says_how_many_events_were_lost_then_answers_those_kept() {
    e2b_test(|s| {
        let lines = s.sdk(
            TOKEN,
            r#"
sbx = Sandbox.create()
sbx.files.make_dir("/home/user/w")
handle = sbx.files.watch_dir("/home/user/w")
sbx.run_code("for i in range(10500): open(f'/work/w/{i}', 'w').close()")
time.sleep(1)
try:
    handle.get_new_events()
    first = None
except Exception as e:
    first = type(e).__name__ + ": " + str(e)
kept = handle.get_new_events()
after = handle.get_new_events()
handle.stop()
out(first=first, kept=len(kept), last=kept[-1].name if kept else None, after=len(after))
sbx.kill()
"#,
        );
        let l = &lines[0];
        let first = l["first"].as_str().unwrap_or_else(|| panic!("{l}"));
        assert!(
            first.contains("500 events were dropped") && first.contains("10000"),
            "{l}"
        );
        assert_eq!(l["kept"], 10_000, "{l}");
        assert_eq!(l["last"], "10499", "{l}");
        assert_eq!(l["after"], 0, "{l}");
    });
}

/// The directory whose node_modules hold E2B's JavaScript SDK, or why there is none.
fn e2b_js() -> Result<PathBuf, String> {
    let dir = std::env::var_os("CODECAGE_E2B_JS").map_or_else(
        || PathBuf::from("/var/cache/codecage/e2b-js-client"),
        PathBuf::from,
    );
    if dir
        .join("node_modules/@e2b/code-interpreter/package.json")
        .exists()
    {
        Ok(dir)
    } else {
        Err(format!(
            "E2B's JavaScript SDK (@e2b/code-interpreter in {}; `cargo xtask test` installs it)",
            dir.display()
        ))
    }
}

#[test]
fn the_javascript_sdk_runs_code_and_reads_files_too() {
    e2b_test(|s| {
        let dir = match e2b_js() {
            Ok(dir) => dir,
            Err(why) => return unavailable(&why),
        };
        let program = format!(
            r#"
import {{ createRequire }} from 'module';
const require = createRequire({dir:?} + '/');
const {{ Sandbox }} = require('@e2b/code-interpreter');
const [url, key] = process.argv.slice(1);
Object.assign(process.env, {{ E2B_API_URL: url, E2B_SANDBOX_URL: url, E2B_API_KEY: key }});
const sbx = await Sandbox.create();
await sbx.runCode('x = 41');
const text = (await sbx.runCode('x + 1')).text;
const chart = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()');
const error = (await sbx.runCode('1/0')).error;
await sbx.files.write('/home/user/j.txt', 'from the js sdk');
const read = await sbx.files.read('/home/user/j.txt');
const command = (await sbx.commands.run('echo hi')).stdout;
await sbx.kill();
let badKey = null;
try {{ await Sandbox.create({{ apiKey: 'not-a-key' }}); }} catch (e) {{ badKey = e.constructor.name; }}
console.log(JSON.stringify({{ text, png: chart.results.some(r => !!r.png), name: error.name,
  read, command, running: await sbx.isRunning(), badKey }}));
"#,
            dir = dir.display().to_string()
        );
        let out = Command::new("node")
            .args(["--input-type=module", "-e", &program, &s.url, TOKEN])
            .output()
            .expect("node");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "the JS SDK program failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        let l: Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(l["text"], "42", "{l}");
        assert_eq!(l["png"], true, "{l}");
        assert_eq!(l["name"], "ZeroDivisionError", "{l}");
        assert_eq!(l["read"], "from the js sdk", "{l}");
        assert_eq!(l["command"], "hi\n", "{l}");
        assert_eq!(l["running"], false, "{l}");
        assert_eq!(l["badKey"], "AuthenticationError", "{l}");
        assert!(s.sessions().is_empty());
    });
}

#[test]
fn the_javascript_sdk_lists_renames_and_watches_files_through_the_streaming_watch() {
    e2b_test(|s| {
        let dir = match e2b_js() {
            Ok(dir) => dir,
            Err(why) => return unavailable(&why),
        };
        let program = format!(
            r#"
import {{ createRequire }} from 'module';
const require = createRequire({dir:?} + '/');
const {{ Sandbox }} = require('@e2b/code-interpreter');
const [url, key] = process.argv.slice(1);
Object.assign(process.env, {{ E2B_API_URL: url, E2B_SANDBOX_URL: url, E2B_API_KEY: key }});
const err = async (f) => {{ try {{ await f(); return null; }} catch (e) {{ return e.constructor.name + ': ' + e.message; }} }};
const sbx = await Sandbox.create();
const made = await sbx.files.makeDir('/home/user/j/k');
const again = await sbx.files.makeDir('/home/user/j/k');
await sbx.files.write('/home/user/j/k/f.txt', 'abc');
const listed = (await sbx.files.list('/home/user/j', {{ depth: 2 }})).map(e => [e.path, e.type]).sort();
const info = await sbx.files.getInfo('/home/user/j/k/f.txt');
const moved = (await sbx.files.rename('/home/user/j/k/f.txt', '/home/user/j/g.txt')).path;
const exists = [await sbx.files.exists('/home/user/j/g.txt'), await sbx.files.exists('/home/user/j/k/f.txt')];
const events = [];
const handle = await sbx.files.watchDir('/home/user/j', (e) => {{ events.push([e.name, e.type, e.entry ? e.entry.size : null]); }},
  {{ recursive: true, includeEntry: true }});
await sbx.runCode("open('/work/j/k/from_code.txt', 'w').write('12345')");
// Until its write is seen: the create comes first, and a watch stopped at it missed the write.
for (let i = 0; i < 100 && !events.some(e => e[0] === 'k/from_code.txt' && e[1] === 'write'); i++) await new Promise(r => setTimeout(r, 100));
await handle.stop();
await sbx.files.remove('/home/user/j');
const gone = await sbx.files.exists('/home/user/j');
const missing = await err(() => sbx.files.getInfo('/home/user/nope'));
const outside = await err(() => sbx.files.list('/etc'));
const watchOutside = await err(() => sbx.files.watchDir('/home/user/../../tmp', () => {{}}));
await sbx.kill();
console.log(JSON.stringify({{ made, again, listed, info: [info.name, info.type, info.size, info.owner], moved, exists,
  events, gone, missing, outside, watchOutside }}));
"#,
            dir = dir.display().to_string()
        );
        let out = Command::new("node")
            .args(["--input-type=module", "-e", &program, &s.url, TOKEN])
            .output()
            .expect("node");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "the JS SDK program failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        let l: Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(l["made"], true, "{l}");
        assert_eq!(l["again"], false, "{l}");
        assert_eq!(
            l["listed"],
            serde_json::json!([["/home/user/j/k", "dir"], ["/home/user/j/k/f.txt", "file"]]),
            "{l}"
        );
        assert_eq!(
            l["info"],
            serde_json::json!(["f.txt", "file", 3, "user"]),
            "{l}"
        );
        assert_eq!(l["moved"], "/home/user/j/g.txt", "{l}");
        assert_eq!(l["exists"], serde_json::json!([true, false]), "{l}");
        let events = l["events"].as_array().unwrap();
        assert!(
            events
                .iter()
                .any(|e| e[0] == "k/from_code.txt" && e[1] == "create"),
            "{l}"
        );
        assert!(
            events
                .iter()
                .any(|e| e[0] == "k/from_code.txt" && e[1] == "write" && e[2] == 5),
            "a write with its entry (5 bytes): {l}"
        );
        assert_eq!(l["gone"], false, "{l}");
        for (field, class, says) in [
            ("missing", "NotFound", "nope"),
            ("outside", "InvalidArgument", "/home/user"),
            ("watchOutside", "InvalidArgument", ".."),
        ] {
            let e = l[field].as_str().unwrap_or_else(|| panic!("{field}: {l}"));
            assert!(e.contains(class) && e.contains(says), "{field}: {e}");
        }
        assert!(s.sessions().is_empty());
    });
}
