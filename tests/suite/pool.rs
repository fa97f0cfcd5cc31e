//! The server's warm pool: sandboxes built ahead of runs (with Python pre-started, its
//! preload imported) and sessions started ahead of their creation. A pooled sandbox serves
//! one request and is destroyed after it; the pool refills; a crash leaves nothing. (The
//! run suite also runs through the pooled path: `CODECAGE_PREPARED=1`, see xtask test.)

use std::time::Duration;

use serde_json::{json, Value};

use super::common::*;
use super::image::image_test;
use super::server::Server;

fn pool_config(runs: usize, sessions: usize) -> String {
    format!("[pool]\nruns = {{ python = {runs} }}\nsessions = {{ python = {sessions} }}\n")
}

/// Waits until the pool holds `runs` run sandboxes and `sessions` sessions for python.
fn wait_ready(server: &Server, runs: u64, sessions: u64) {
    let ready = wait_for(Duration::from_secs(60 * slowdown()), || {
        let (_, pool) = server.request("GET", "/v1/pool", None);
        pool["runs"]["python"].as_u64().unwrap_or(0) == runs
            && pool["sessions"]["python"].as_u64().unwrap_or(0) == sessions
    });
    let (_, pool) = server.request("GET", "/v1/pool", None);
    assert!(ready, "the pool did not fill: {pool}");
}

fn run(server: &Server, body: Value) -> Value {
    let (status, out) = server.request("POST", "/v1/run", Some(body));
    assert_eq!(status, 200, "{out}");
    out
}

fn python(code: &str) -> Value {
    json!({"language": "python", "code": code})
}

#[test]
fn a_pooled_sandbox_serves_one_request_and_gives_a_cold_runs_outcome() {
    image_test(|_| {
        let server = Server::start(&pool_config(1, 0), false);
        wait_ready(&server, 1, 0);
        // Pooled (its interpreter has the profile's preload), and leaving traces behind.
        let first = run(
            &server,
            python(
                "import sys, builtins\nopen('/work/leak.txt', 'w').write('x')\nbuiltins.LEAK = 1\n\
                 print('numpy' in sys.modules, sys.argv, __name__, __file__)",
            ),
        );
        assert_eq!(
            first["stdout"], "True ['main.py'] __main__ /work/main.py\n",
            "{first}"
        );
        wait_ready(&server, 1, 0);
        // The next request gets a new sandbox: nothing of the first is there.
        let second = run(
            &server,
            python(
                "import os, sys, builtins\n\
                 print(os.path.exists('/work/leak.txt'), hasattr(builtins, 'LEAK'), 'numpy' in sys.modules)",
            ),
        );
        assert_eq!(second["stdout"], "False False True\n", "{second}");
        // The same code, pooled and cold (a request for less memory cannot take the
        // pooled sandbox): the same exit, error, output and traceback.
        let cases = [
            "def f():\n    return 1 / 0\nprint('before')\nf()",
            "import sys\nprint(sys.stdin.read() == '')\nsys.exit(3)",
            "raise SystemExit('bye')",
            "f = open('/work/out.txt', 'w'); f.write('kept')\nimport os; os.makedirs('out', exist_ok=True)\nopen('out/r.txt', 'w').write('r')",
            // The whole memory limit (256M) is the code's, as in a cold run, whatever the
            // preload holds.
            "x = bytearray(200 << 20)\nprint(len(x))",
        ];
        for code in cases {
            wait_ready(&server, 1, 0);
            let pooled = run(&server, python(code));
            let mut cold_request = python(code);
            cold_request["memory"] = json!("255M");
            let cold = run(&server, cold_request);
            // The result says which sandbox served it.
            assert_eq!(
                (&pooled["warm"], &cold["warm"]),
                (&json!(true), &json!(false))
            );
            for field in ["stdout", "stderr", "exit_code", "signal", "error", "files"] {
                assert_eq!(
                    pooled[field], cold[field],
                    "{field} of {code:?}: {pooled} vs {cold}"
                );
            }
        }
        server.stop();
    });
}

#[test]
fn the_pool_refills_after_a_burst() {
    image_test(|_| {
        let server = Server::start(&pool_config(2, 0), false);
        wait_ready(&server, 2, 0);
        std::thread::scope(|s| {
            let runs: Vec<_> = (0..5)
                .map(|i| {
                    let server = &server;
                    s.spawn(move || run(server, python(&format!("print({i} * 2)"))))
                })
                .collect();
            for (i, handle) in runs.into_iter().enumerate() {
                let out = handle.join().unwrap();
                assert_eq!(out["stdout"], format!("{}\n", i * 2), "{out}");
            }
        });
        wait_ready(&server, 2, 0);
        server.stop();
    });
}

#[test]
fn a_pooled_session_is_ready_at_once_and_never_shared() {
    image_test(|_| {
        let server = Server::start(&pool_config(0, 1), false);
        wait_ready(&server, 0, 1);
        let mut ids = Vec::new();
        for round in 0..2 {
            // Started ahead, the session's sandbox has the lowest CPU weight (its start
            // took only CPU that requests left idle); handed over, the default.
            let pooled = cpu_weights(server.pid());
            assert!(
                pooled.len() == 1 && matches!(pooled[0].1, 1 | 2),
                "round {round}: the pooled session's cgroup is not in the background: {pooled:?}"
            );
            // And its CPU quota lifted (its start is none of a request's code); handed
            // over, the request's 0.5 CPU.
            let quota = cpu_quotas(server.pid());
            assert!(
                quota.len() == 1 && matches!(quota[0].1.as_str(), "-1" | "max 100000"),
                "round {round}: the pooled session's quota is not lifted: {quota:?}"
            );
            let (status, created) =
                server.request("POST", "/v1/sessions", Some(json!({"language": "python"})));
            assert_eq!(status, 201, "{created}");
            let handed = std::fs::read_to_string(&pooled[0].0).unwrap_or_default();
            assert!(
                matches!(handed.trim(), "1024" | "100"),
                "round {round}: {} is {handed:?} after the handover",
                pooled[0].0.display()
            );
            let handed = std::fs::read_to_string(&quota[0].0).unwrap_or_default();
            assert!(
                matches!(handed.trim(), "50000" | "50000 100000"),
                "round {round}: {} is {handed:?} after the handover",
                quota[0].0.display()
            );
            let id = created["id"].as_str().unwrap().to_string();
            let execute = format!("/v1/sessions/{id}/execute");
            let (_, out) = server.request(
                "POST",
                &execute,
                Some(json!({"code": "import os\n('x' in dir(), os.path.exists('/work/mark'))"})),
            );
            assert_eq!(
                out["result"]["text/plain"], "(False, False)",
                "round {round}: {out}"
            );
            server.request(
                "POST",
                &execute,
                Some(json!({"code": "x = 1\nopen('/work/mark', 'w').write('m')"})),
            );
            server.request("DELETE", &format!("/v1/sessions/{id}"), None);
            ids.push(id);
            wait_ready(&server, 0, 1);
        }
        assert_ne!(ids[0], ids[1]);
        server.stop();
    });
}

/// A pooled sandbox imports its preload with its CPU quota lifted (none of a request's code
/// runs then), and the request's code meets the request's quota: two processes spinning
/// for 2 s get at most half a CPU between them.
#[test]
fn a_pooled_run_is_held_to_the_requests_cpu_quota() {
    image_test(|_| {
        let server = Server::start(&pool_config(1, 0), false);
        wait_ready(&server, 1, 0);
        let quota = cpu_quotas(server.pid());
        assert!(
            quota.len() == 1 && matches!(quota[0].1.as_str(), "-1" | "max 100000"),
            "the pooled sandbox's quota is not lifted: {quota:?}"
        );
        let out = run(
            &server,
            python(
                "import os, time\nos.fork()\nend = time.time() + 2\n\
                 while time.time() < end: pass\nprint(os.getpid())",
            ),
        );
        assert_eq!(out["warm"], true, "{out}");
        assert_eq!(out["exit_code"], 0, "{out}");
        let cpu = out["cpu_ms"].as_f64().unwrap();
        let wall = out["duration_ms"].as_f64().unwrap();
        // A ceiling, with a period of slack for the run's edges (as the cold bomb test).
        assert!(cpu > 0.0, "{out}");
        assert!(
            cpu <= 0.5 * wall + 100.0,
            "cpu {cpu} ms over {wall} ms = {:.2} CPUs, over the request's 0.5: {out}",
            cpu / wall
        );
        server.stop();
    });
}

/// The pooled interpreters the server `pid` holds (their init is its child).
fn pooled_interpreters(pid: u32) -> Vec<u32> {
    let parent = |p: u32| -> Option<u32> {
        let status = std::fs::read_to_string(format!("/proc/{p}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse().ok())
    };
    host_pids_with("python3\0-c\0# codecage's pre-started Python")
        .into_iter()
        .filter(|p| parent(*p).and_then(parent) == Some(pid))
        .collect()
}

#[test]
fn sigkill_of_the_server_leaves_no_pooled_sandbox_behind() {
    image_test(|_| {
        let server = Server::start(&pool_config(2, 1), false);
        wait_ready(&server, 2, 1);
        let pid = server.pid();
        let pooled = pooled_interpreters(pid);
        assert_eq!(pooled.len(), 2, "{pooled:?}");
        server.kill9();
        // Their inits die with the server (the parent-death signal), and every process of
        // their namespaces with them.
        let gone = wait_for(Duration::from_secs(10 * slowdown()), || {
            pooled
                .iter()
                .all(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        });
        assert!(gone, "pooled interpreters outlived the server: {pooled:?}");
        // The next server sweeps the cgroups the killed one left (the check after the
        // test finds none named after it).
        let next = Server::start("", false);
        next.stop();
    });
}

/// A pooled run is answered as soon as its payload's end is known, and its sandbox is torn
/// down after the answer: the answer is exact all the same (the cgroup's figures are read
/// once every process of the sandbox is killed and reaped), and the sandbox is gone soon
/// after it (the check after the test finds none of its processes or cgroups either).
#[test]
fn a_pooled_run_is_answered_exactly_and_its_sandbox_torn_down_after() {
    image_test(|_| {
        let server = Server::start(&pool_config(1, 0), false);
        wait_ready(&server, 1, 0);
        let pid = server.pid();
        let pooled = pooled_interpreters(pid);
        assert_eq!(pooled.len(), 1, "{pooled:?}");
        let cgroups: Vec<_> = run_cgroups()
            .into_iter()
            .filter(|(launcher, _)| *launcher == pid)
            .map(|(_, dir)| dir)
            .collect();
        assert!(!cgroups.is_empty(), "no cgroup of the pooled sandbox");
        // The code holds 64 MiB, writes an output file, and leaves a child behind that
        // would sleep on: it is killed and reaped before the figures are read.
        let mark = marker("pool-leftover");
        let code = format!(
            "import subprocess, sys\n\
             x = bytearray(64 << 20)\n\
             for i in range(0, len(x), 4096): x[i] = 1\n\
             import os; os.makedirs('/work/out')\n\
             open('/work/out/result.txt', 'w').write('forty-two')\n\
             subprocess.Popen(['bash', '-c', 'exec -a {mark} sleep 600'])\n\
             print('done')\n\
             sys.exit(3)"
        );
        let out = run(&server, python(&code));
        let left = running_pids_with(&mark);
        assert_eq!(out["warm"], json!(true), "{out}");
        assert_eq!(out["stdout"], "done\n", "{out}");
        assert_eq!(out["exit_code"], json!(3), "{out}");
        assert_eq!(out["error"], Value::Null, "{out}");
        let peak = out["peak_memory_bytes"].as_u64().unwrap_or(0);
        assert!(
            peak >= 64 << 20,
            "peak memory {peak} below the 64 MiB held: {out}"
        );
        assert!(out["cpu_ms"].as_f64().unwrap_or(0.0) > 0.0, "{out}");
        let file = out["files"]
            .as_array()
            .and_then(|files| files.iter().find(|f| f["path"] == "result.txt"))
            .unwrap_or_else(|| panic!("no result.txt among the output files: {out}"));
        assert_eq!(file["size"], json!(9), "{out}");
        // The payload's child ran no more when the answer was made (killed, and past its
        // last system call; the kernel may still be freeing what it held).
        assert!(
            left.is_empty(),
            "the payload's child outlived the answer: {left:?}"
        );
        // The rest of the sandbox (its init, its cgroup) is gone shortly after.
        let gone = wait_for(Duration::from_secs(10 * slowdown()), || {
            cgroups.iter().all(|dir| !dir.exists())
                && pooled
                    .iter()
                    .all(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        });
        assert!(
            gone,
            "the pooled sandbox outlived its answer: {cgroups:?} {pooled:?}"
        );
        // A second request still runs (on the refilled pool, or cold).
        let next = run(&server, python("print(6 * 7)"));
        assert_eq!(next["stdout"], "42\n", "{next}");
        server.stop();
    });
}

#[test]
fn a_pooled_run_ends_at_its_interpreters_word_and_only_the_init_hears_it() {
    image_test(|_| {
        let server = Server::start(&pool_config(1, 0), false);
        wait_ready(&server, 1, 0);
        // The pre-started interpreter says its status to the init on fd 4 once the script
        // has finished, and the run ends there, before the interpreter's exit. A script
        // that says it itself ends its own run only: it and what it started are killed,
        // and the status it said is the run's.
        let mark = marker("pool-word");
        let code = format!(
            "import os, subprocess, time\n\
             print('before', flush=True)\n\
             subprocess.Popen(['bash', '-c', 'exec -a {mark} sleep 600'])\n\
             os.write(4, b'5\\n')\n\
             time.sleep(600)"
        );
        let out = run(&server, python(&code));
        let left = running_pids_with(&mark);
        assert_eq!(out["warm"], json!(true), "{out}");
        assert_eq!(out["exit_code"], json!(5), "{out}");
        assert_eq!(out["error"], Value::Null, "{out}");
        assert_eq!(out["stdout"], "before\n", "{out}");
        assert!(left.is_empty(), "a process outlived the word: {left:?}");
        // A script that puts a file of its own on fd 4 gets nothing written into it: the
        // interpreter says its end only on the pipe it was given, else the run ends at
        // its exit as a cold run's.
        wait_ready(&server, 1, 0);
        let out = run(
            &server,
            python(
                "import os\n\
                 os.makedirs('/work/out', exist_ok=True)\n\
                 f = open('/work/out/mine.txt', 'w')\n\
                 f.write('mine')\n\
                 f.flush()\n\
                 os.dup2(f.fileno(), 4)\n\
                 print('ok')",
            ),
        );
        assert_eq!(out["warm"], json!(true), "{out}");
        assert_eq!(out["exit_code"], json!(0), "{out}");
        assert_eq!(out["stdout"], "ok\n", "{out}");
        let file = out["files"]
            .as_array()
            .and_then(|files| files.iter().find(|f| f["path"] == "mine.txt"))
            .unwrap_or_else(|| panic!("no mine.txt among the output files: {out}"));
        assert_eq!(file["size"], json!(4), "{out}");
        server.stop();
    });
}
